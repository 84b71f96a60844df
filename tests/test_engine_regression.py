"""The engine's regression formulation (epsilon-SVR) against an independent batch optimum.

A regression sample (x, t) is one engine point on one edge of the tube: sign +1 with linear
term epsilon - t (its coefficient is alpha) or sign -1 with epsilon + t (alpha*), and gap
2 epsilon, the sum of both: a point whose g reaches its gap moves to the other edge. The
decision function is f(x) = sum_i theta_i K(x_i, x) + b with theta = y alpha. The oracle is
libsvm's epsilon-SVR on the precomputed kernel, polished in float64 on the sets it found
(libsvm keeps its kernel cache in float32).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from sklearn.exceptions import ConvergenceWarning
from sklearn.svm import SVR

from stream_svm.engine import ERROR, MARGIN, RESERVE, ConvergenceError, PathEngine
from stream_svm.kernels import make_kernel


def learn(engine: PathEngine, X: np.ndarray, t: np.ndarray, keys: list, epsilon: float,
          forget: list = ()) -> None:
    """Add the samples (X, t) under ``keys`` and remove the samples ``forget``, in one path
    (each sample starts on the upper edge; the engine moves it to the edge it violates)."""
    m = len(keys)
    engine.update(np.atleast_2d(X), np.ones(m), list(keys), remove=list(forget),
                  linear=epsilon - np.asarray(t, dtype=float), gap=np.full(m, 2 * epsilon))


def samples(engine: PathEngine) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The stored samples: x, target and theta = y alpha."""
    y, p, gap = engine.y, engine.linear, engine.gap
    # p = gap / 2 - y t on either edge: t = y (gap / 2 - p).
    return engine.X.copy(), y * (gap / 2 - p), engine.alpha * y


class RegressionOptimum:
    """The batch epsilon-SVR optimum on (X, t): libsvm's sets, equalities re-solved in float64."""

    def __init__(self, kernel, X: np.ndarray, t: np.ndarray, C: float, epsilon: float) -> None:
        self.kernel, self.X, self.t, self.C, self.epsilon = kernel, X, t, C, epsilon
        K = self.K = kernel(X, X)
        svr = SVR(kernel="precomputed", C=C, epsilon=epsilon, tol=1e-8, shrinking=False,
                  max_iter=10**6)
        with warnings.catch_warnings():
            # At C = 1e5 libsvm may stop short of tol: its sets are only the polish's start,
            # and the polish verifies the KKT conditions in float64 (or fails the test).
            warnings.simplefilter("ignore", ConvergenceWarning)
            svr.fit(K, t)
        theta = np.zeros(len(t))
        theta[svr.support_] = svr.dual_coef_[0]
        self.theta, self.b = self._polish(theta, float(svr.intercept_[0]))

    def _polish(self, theta: np.ndarray, b: float) -> tuple[np.ndarray, float]:
        """Active-set refinement: state 0 inside the tube (theta = 0), +-1 on its upper/lower
        edge (f = t -+ epsilon, 0 < +-theta < C), +-2 outside (theta = +-C)."""
        K, t, C, eps = self.K, self.t, self.C, self.epsilon
        n = len(t)
        state = np.where(np.abs(theta) >= C * (1 - 1e-9), 2 * np.sign(theta),
                         np.where(np.abs(theta) > 1e-9 * C, np.sign(theta), 0)).astype(int)
        for _ in range(10 * n + 50):
            free = np.flatnonzero(np.abs(state) == 1)
            bound = np.where(np.abs(state) == 2, C * np.sign(state), 0.0)
            if free.size == 0:
                self.b_unique = False
                return bound, b
            M = np.zeros((free.size + 1, free.size + 1))
            M[0, 1:] = 1.0
            M[1:, 0] = 1.0
            M[1:, 1:] = K[np.ix_(free, free)]
            rhs = np.concatenate([[-bound.sum()],
                                  t[free] - eps * np.sign(state[free]) - K[free] @ bound])
            solution = np.linalg.lstsq(M, rhs, rcond=1e-13)[0]
            candidate = bound.copy()
            candidate[free] = solution[1:]
            b = float(solution[0])
            wrong = candidate[free] * np.sign(state[free])  # must lie in [0, C]
            if np.any(wrong < -1e-10 * C) or np.any(wrong > C * (1 + 1e-10)):
                worst = int(np.argmax(np.maximum(-wrong, wrong - C)))
                state[free[worst]] = 0 if wrong[worst] < 0 else 2 * state[free[worst]]
                continue
            residual = t - (K @ candidate + b)  # t - f
            # Inside the tube |t - f| <= eps; outside, (t - f) sign >= eps.
            violation = np.where(
                state == 0, np.abs(residual) - eps,
                np.where(np.abs(state) == 2, eps - residual * np.sign(state), 0.0))
            worst = int(np.argmax(violation))
            # Relative to the size of the terms summed into f (large and cancelling at large C).
            size = max(1.0, np.abs(t).max(), float((np.abs(K) @ np.abs(candidate)).max()))
            if violation[worst] <= 1e-11 * size:
                self.b_unique = True
                return candidate, b
            if abs(state[worst]) == 2:  # at +-C but back on the tube's edge: free, same side
                state[worst] //= 2
            else:  # inside the tube but outside it in fact: free on the side it lies
                state[worst] = 1 if residual[worst] > 0 else -1
        raise AssertionError("the oracle's active-set refinement did not converge")

    def objective(self, theta: np.ndarray) -> float:
        return float(0.5 * theta @ self.K @ theta + self.epsilon * np.abs(theta).sum()
                     - self.t @ theta)

    def decision(self, Q: np.ndarray) -> np.ndarray:
        return self.kernel(Q, self.X) @ self.theta + self.b


def check(engine: PathEngine, epsilon: float, probes: np.ndarray, tol: float = 1e-8) -> None:
    """KKT conditions from a fresh kernel, then decisions and dual objective vs the oracle."""
    X, t, theta = samples(engine)
    C = engine.C
    assert np.all(np.abs(theta) <= C * (1 + 1e-12))
    K = engine.kernel(engine.X, engine.X)
    g = engine.y * (K @ (engine.alpha * engine.y) + engine.b) + engine.linear
    terms = np.abs(engine.linear) + abs(engine.b) + np.abs(K) @ engine.alpha
    status = engine.status
    # A reserve sample is inside the tube on both edges: 0 <= g <= gap.
    violation = np.where(status == MARGIN, np.abs(g),
                         np.where(status == ERROR, np.maximum(g, 0.0),
                                  np.maximum(np.maximum(-g, 0.0), g - engine.gap)))
    assert np.all((status == MARGIN) | (status == ERROR) | (status == RESERVE))
    assert np.all(violation <= 1e-8 * terms), float((violation / terms).max())
    oracle = RegressionOptimum(engine.kernel, X, t, C, epsilon)
    ours, theirs = engine.decision_function(probes), oracle.decision(probes)
    if engine.n_margin == 0 or not oracle.b_unique:
        ours, theirs = ours - engine.b, theirs - oracle.b  # b is not unique then
    scale = 1.0 + np.abs(theirs).max()
    assert np.abs(ours - theirs).max() <= tol * scale, np.abs(ours - theirs).max()
    assert oracle.objective(theta) == pytest.approx(oracle.objective(oracle.theta),
                                                    rel=1e-9, abs=1e-9)
    assert engine.dual_objective() == pytest.approx(oracle.objective(theta), rel=1e-9,
                                                    abs=1e-9)


def interleave(engine: PathEngine, X: np.ndarray, t: np.ndarray, epsilon: float, seed: int,
               probes: np.ndarray, checks: int = 4) -> None:
    """Random learn / forget / multiple updates, checked against the oracle along the way."""
    rng = np.random.default_rng(seed)
    stored: list[int] = []
    waiting = list(rng.permutation(len(t)))
    done = 0
    while waiting:
        m = int(rng.integers(1, 6))
        add, waiting = waiting[:m], waiting[m:]
        forget = (list(rng.choice(stored, size=min(len(stored), int(rng.integers(0, 4))),
                                  replace=False)) if stored and rng.random() < 0.5 else [])
        learn(engine, X[add], t[add], [int(i) for i in add], epsilon,
              forget=[int(i) for i in forget])
        stored = [i for i in stored if i not in forget] + [int(i) for i in add]
        done += 1
        if done % max(1, (len(t) // 3) // checks) == 0:
            check(engine, epsilon, probes)
    check(engine, epsilon, probes)


def sinc(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.uniform(-4, 4, (n, 1))
    return X, np.sinc(X[:, 0]) + 0.05 * rng.standard_normal(n)


@pytest.mark.parametrize(("C", "epsilon", "gamma"), [
    (1.0, 0.1, 0.5), (100.0, 0.05, 1.0), (10.0, 0.0, 0.5),
])
def test_sinc_through_interleaved_updates(C, epsilon, gamma):
    X, t = sinc(70, 1)
    engine = PathEngine(make_kernel("rbf", gamma=gamma), C=C)
    interleave(engine, X, t, epsilon, seed=2, probes=np.linspace(-4, 4, 40)[:, None])


@pytest.mark.parametrize(("C", "epsilon"), [(30.0, 0.0), (30.0, 0.2), (1e5, 0.01)])
def test_noisy_five_dimensional_set(C, epsilon):
    # (A 1-D set at C = 1e5 has a kernel matrix singular to working precision, where libsvm
    # cannot serve as the oracle: it stops far from the optimum.)
    rng = np.random.default_rng(3)
    X = rng.standard_normal((80, 5))
    t = X[:, 0] - 2 * X[:, 1] * X[:, 2] + 0.3 * rng.standard_normal(80)
    engine = PathEngine(make_kernel("rbf", gamma=0.2), C=C)
    interleave(engine, X, t, epsilon, seed=4, probes=rng.standard_normal((30, 5)))


def test_duplicates_and_identical_x_with_other_targets():
    rng = np.random.default_rng(5)
    X = rng.uniform(-2, 2, (25, 2))
    X = np.vstack([X, X[:8], X[:8]])  # each of 8 points three times
    t = np.concatenate([np.sin(X[:25, 0]), np.sin(X[:8, 0]), np.sin(X[:8, 0]) + 0.5])
    engine = PathEngine(make_kernel("rbf", gamma=0.7), C=20.0)
    interleave(engine, X, t, 0.05, seed=6, probes=rng.uniform(-2, 2, (20, 2)))


def test_a_tube_wide_enough_holds_every_sample_inside():
    """epsilon above the targets' spread: every coefficient 0, f constant inside the tube."""
    X, t = sinc(30, 7)
    epsilon = float(t.max() - t.min())
    engine = PathEngine(make_kernel("rbf", gamma=0.5), C=10.0)
    learn(engine, X, t, list(range(30)), epsilon)
    assert not engine.alpha.any()
    f = engine.decision_function(X)
    assert np.all(np.abs(t - f) <= epsilon * (1 + 1e-12))
    check(engine, epsilon, X)


def test_a_window_whose_samples_all_end_inside_the_tube_has_the_batch_models_b():
    """Small windows replaced whole: after some paths every sample ends inside the tube, b is
    then not unique and is centered, as a batch solution on the same samples centers it. A
    single coefficient left at round-off above 0 (1e-18, from a step of 1e-18 at a tie) must
    not fix b: the model would depend on the path that led to it (off by up to 5e-3 here)."""
    epsilon, C, ridge = 0.5, 0.5, 0.1
    kernel = make_kernel("rbf", gamma=0.5)
    centered = 0
    for seed in range(10):
        rng = np.random.default_rng(seed)
        engine = PathEngine(kernel, C=C, ridge=ridge)
        keys: list = []
        for step in range(30):
            X = rng.standard_normal((6, 2))
            t = np.sin(X[:, 0]) + 0.1 * rng.standard_normal(6)
            new = [(step, i) for i in range(6)]
            learn(engine, X, t, new, epsilon, forget=keys)
            keys = new
            batch = PathEngine(kernel, C=C, ridge=ridge)
            batch.update(engine.X, engine.y, keys=list(engine.keys), linear=engine.linear,
                         gap=engine.gap)
            np.testing.assert_allclose(engine.decision_function(X),
                                       batch.decision_function(X), rtol=0, atol=1e-9)
            centered += not engine.b_is_fixed()
    assert centered > 10  # the case arises


def test_discarding_samples_inside_the_tube_centers_b_among_those_that_remain():
    """Every sample inside the tube: b is not unique. Discarding the samples that bounded its
    interval gives the model a batch solution on the others has, b centered again."""
    X, t = sinc(30, 3)
    epsilon = float(t.max() - t.min())
    kernel = make_kernel("rbf", gamma=0.5)
    engine = PathEngine(kernel, C=10.0)
    learn(engine, X, t, list(range(30)), epsilon)
    assert not engine.b_is_fixed()
    bounding = [int(np.argmax(t)), int(np.argmin(t))]
    engine.discard(bounding)
    kept = [i for i in range(30) if i not in bounding]
    batch = PathEngine(kernel, C=10.0)
    learn(batch, X[kept], t[kept], kept, epsilon)
    assert engine.b == pytest.approx(batch.b, abs=1e-12)
    np.testing.assert_allclose(engine.decision_function(X), batch.decision_function(X),
                               rtol=0, atol=1e-12)
    assert engine.kkt_violation() < 1e-12


def test_forgetting_a_sample_equals_never_learning_it():
    X, t = sinc(50, 8)
    forgetting = PathEngine(make_kernel("rbf", gamma=0.5), C=50.0)
    learn(forgetting, X, t, list(range(50)), 0.05)
    learn(forgetting, X[:0], t[:0], [], 0.05, forget=[3, 17, 41])
    never = PathEngine(make_kernel("rbf", gamma=0.5), C=50.0)
    kept = [i for i in range(50) if i not in (3, 17, 41)]
    learn(never, X[kept], t[kept], kept, 0.05)
    probes = np.linspace(-4, 4, 60)[:, None]
    np.testing.assert_allclose(forgetting.decision_function(probes),
                               never.decision_function(probes), atol=1e-9)


def test_linear_terms_are_checked_and_kept_through_a_checkpoint():
    engine = PathEngine(make_kernel("rbf", gamma=0.5), C=1.0)
    with pytest.raises(ValueError, match="linear has 1 terms"):
        engine.update(np.zeros((2, 1)), [1.0, -1.0], ["a", "b"], linear=[0.1])
    with pytest.raises(ValueError, match="linear contains non-finite"):
        engine.update(np.zeros((2, 1)), [1.0, -1.0], ["a", "b"], linear=[0.1, np.nan])
    with pytest.raises(KeyError, match="repeats among the points to add"):
        engine.update(np.zeros((2, 1)), [1.0, -1.0], ["a", "a"])
    with pytest.raises(ValueError, match="gap must hold numbers >= 0"):
        engine.update(np.zeros((2, 1)), [1.0, -1.0], ["a", "b"], gap=[0.1, -1.0])
    assert engine.n == 0
    X, t = sinc(20, 9)
    learn(engine, X, t, list(range(20)), 0.1)
    restored = PathEngine(make_kernel("rbf", gamma=0.5), C=1.0)
    restored.set_state(engine.get_state(linear=True), engine.keys)
    probes = np.linspace(-4, 4, 30)[:, None]
    assert np.array_equal(restored.decision_function(probes), engine.decision_function(probes))
    np.testing.assert_array_equal(restored.linear, engine.linear)
    np.testing.assert_array_equal(restored.gap, engine.gap)
    # Without the linear terms a state is a classification state (every term -1, gap inf).
    assert "linear" not in engine.get_state() and "gap" not in engine.get_state()


def test_samples_cross_to_the_other_edge_of_the_tube():
    """Moving the targets across the model makes samples flip edges along the path (their
    coefficient passing through 0), and the result is still the batch optimum."""
    X, t = sinc(40, 10)
    engine = PathEngine(make_kernel("rbf", gamma=0.5), C=10.0)
    learn(engine, X, t, list(range(40)), 0.05)
    flips = 0
    for i in range(40):  # each sample's target mirrored around the model, one at a time
        mirrored = 2 * engine.decision_function(X[i : i + 1])[0] - t[i]
        learn(engine, X[i : i + 1], [mirrored], [f"m{i}"], 0.05, forget=[i])
        flips += engine.last_update.migrations.get("flipped", 0)
    assert flips > 0
    check(engine, 0.05, np.linspace(-4, 4, 30)[:, None])


def adversarial_scenario(seed: int) -> tuple[int, int, float]:
    """Random learns and forgets (1-5 samples, some repeating a stored x) under a linear, RBF
    or polynomial kernel, features scaled by 1e-4 to 1e4 (C or gamma scaled to match), C from
    1e-3 to 1e5, epsilon from 0 to 10: (updates, refused, worst relative KKT violation from a
    freshly computed kernel)."""
    rng = np.random.default_rng(seed)
    kind = ("rbf", "linear", "poly")[seed % 3]
    dim, scale = int(rng.integers(1, 5)), 10.0 ** rng.uniform(-4, 4)
    C, epsilon = 10.0 ** rng.uniform(-3, 5), (0.0, 0.01, 0.1, 1.0, 10.0)[seed % 5]
    kernel = make_kernel(kind, gamma=float(10 ** rng.uniform(-2, 1)) / scale**2, degree=2,
                         coef0=1.0)
    engine = PathEngine(kernel, C=C / scale**2 if kind == "linear" else C)
    stored: list[int] = []
    updates = refused = 0
    worst = 0.0
    for step in range(40):
        m = int(rng.integers(1, 6))
        X = rng.standard_normal((m, dim)) * scale
        if stored and rng.random() < 0.3:
            X[0] = engine.X[engine.position(stored[0])]
        t = 3 * np.sin(X[:, 0] / scale) + 0.3 * rng.standard_normal(m)
        keys = list(range(step * 5, step * 5 + m))
        forget = ([int(k) for k in rng.choice(stored, size=min(len(stored),
                                                                int(rng.integers(0, 3))),
                                               replace=False)]
                  if stored and rng.random() < 0.5 else [])
        try:
            learn(engine, X, t, keys, epsilon, forget=forget)
        except ConvergenceError:
            refused += 1
            continue
        stored = [k for k in stored if k not in forget] + keys
        updates += 1
        K = engine.kernel(engine.X, engine.X)
        g = engine.y * (K @ (engine.alpha * engine.y) + engine.b) + engine.linear
        terms = np.abs(engine.linear) + abs(engine.b) + np.abs(K) @ engine.alpha
        status = engine.status
        violation = np.where(status == MARGIN, np.abs(g),
                             np.where(status == ERROR, np.maximum(g, 0.0),
                                      np.maximum(np.maximum(-g, 0.0), g - engine.gap)))
        worst = max(worst, float(np.max(violation / terms, initial=0.0)))
    return updates, refused, worst


@pytest.mark.parametrize("seed", range(15))
def test_adversarial_regression_scenarios_hold_the_kkt_conditions(seed):
    updates, refused, worst = adversarial_scenario(seed)
    assert refused == 0 and updates == 40
    assert worst < 1e-8


if __name__ == "__main__":  # python -m tests.test_engine_regression SCENARIOS
    import sys

    totals = [adversarial_scenario(seed) for seed in range(int(sys.argv[1]))]
    print(f"{len(totals)} scenarios, {sum(t[0] for t in totals)} updates, "
          f"{sum(t[1] for t in totals)} refused, worst relative KKT "
          f"{max(t[2] for t in totals):.2e}")
