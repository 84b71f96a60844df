"""Degenerate corners found by random testing: one-class leftovers, empty margin sets with
round-off imbalance, linear kernels in 1-D near the origin, duplicates, C up to 1e5.

Each seed draws a kernel, C, data (rounded coordinates give many duplicates) and 60 random
additions and removals of up to 10 points; every update must finish and keep the KKT
conditions. The seeds listed all failed (cycled, found no point for an empty margin set, or
left a KKT violation) before the engine's noise-aware thresholds.
"""

from __future__ import annotations

import os
import pickle

import numpy as np
import pandas as pd
import pytest

from stream_svm.engine import ConvergenceError, PathEngine
from stream_svm.kernels import make_kernel
from tests.oracle import kkt_violation, net_relative_kkt_violation, relative_kkt_violation

FORMERLY_FAILING = [827702593, 27559113, 804443189, 549593687, 160652008, 882692652,
                    406542397, 378101240, 780121198, 476936658, 83555117, 409199136,
                    788428703, 873345941, 524319450, 784528208]


def random_scenario(seed: int):
    rng = np.random.default_rng(seed)
    name = rng.choice(["rbf", "linear", "poly"])
    C = float(10 ** rng.uniform(-2, 5))
    d = int(rng.integers(1, 6))
    gamma = float(10 ** rng.uniform(-3, 1))
    kernel = make_kernel(str(name), gamma=gamma, degree=int(rng.integers(1, 4)), coef0=1.0)
    n = int(rng.integers(20, 150))
    X = rng.standard_normal((n, d))
    if rng.random() < 0.3:
        X = np.round(X, 1)
    y = np.where(rng.random(n) < 0.5, 1.0, -1.0)
    if rng.random() < 0.5:
        y = np.where(X[:, 0] + 0.3 * rng.standard_normal(n) > 0, 1.0, -1.0)
    return rng, kernel, C, X, y


def random_updates(rng, engine: PathEngine, X, y, calls: int = 60):
    """Arguments of ``calls`` random updates: remove up to 10 stored points or add up to 11
    (removed points may come back later)."""
    pending = list(range(len(y)))
    rng.shuffle(pending)
    for _ in range(calls):
        stored = engine.keys
        if len(stored) > 3 and (not pending or rng.random() < 0.4):
            count = int(rng.integers(1, min(10, len(stored)) + 1))
            removed = [stored[i] for i in rng.choice(len(stored), count, replace=False)]
            pending += removed
            yield {"remove": removed}
        else:
            count = int(rng.integers(1, 12))
            taken, pending = pending[:count], pending[count:]
            # A refused removal left its points stored although they were queued again.
            taken = [index for index in dict.fromkeys(taken) if index not in engine]
            if taken:
                yield {"X_add": X[taken], "y_add": y[taken], "keys": taken}


@pytest.mark.parametrize("seed", FORMERLY_FAILING)
def test_random_degenerate_scenarios_stay_exact(seed):
    rng, kernel, C, X, y = random_scenario(seed)
    engine = PathEngine(kernel, C)
    for arguments in random_updates(rng, engine, X, y):
        engine.update(**arguments)
        assert kkt_violation(engine) < 1e-7 * max(1.0, C)


NUMERICALLY_SINGULAR = [303032426, 409352936, 305551685, 488605772, 734536342]


@pytest.mark.parametrize("seed", NUMERICALLY_SINGULAR)
def test_numerically_singular_updates_are_exact_or_refused_unchanged(seed):
    """1-D data with a nearly flat RBF kernel at large C: the kernel matrix is singular to
    working precision. Every update must either stay exact or raise ConvergenceError and leave
    the engine exactly as it was (checked after the multiple path and its single-point retry),
    never return a wrong solution."""
    rng, kernel, C, X, y = random_scenario(seed)
    engine = PathEngine(kernel, C)
    for arguments in random_updates(rng, engine, X, y):
        before = engine.get_state()
        try:
            engine.update(**arguments)
        except ConvergenceError:
            after = engine.get_state()
            for name in before:
                np.testing.assert_array_equal(before[name], after[name])
            return
        assert kkt_violation(engine) < 1e-7 * max(1.0, C)


def copies_under_both_labels(seed: int):
    """An RBF, polynomial (degree 2 or 3) or linear kernel at C from 1e2 to 1e8 on 1-3 rounded
    features, with three points in ten copying another's features under the opposite label."""
    rng = np.random.default_rng(seed)
    name = str(rng.choice(["rbf", "poly", "linear"]))
    C = float(10 ** rng.uniform(2, 8))
    d = int(rng.integers(1, 4))
    kernel = make_kernel(name, gamma=float(10 ** rng.uniform(-1, 0.5)) / d,
                         degree=int(rng.integers(2, 4)), coef0=1.0)
    n = int(rng.integers(20, 60))
    X = np.round(rng.standard_normal((n, d)), 1)
    y = np.where(X[:, 0] + 0.5 * rng.standard_normal(n) > 0, 1.0, -1.0)
    copies = rng.random(n) < 0.3
    sources = rng.integers(0, n, n)
    X[copies] = X[sources[copies]]
    y[copies] = -y[sources[copies]]
    return rng, kernel, C, X, y


@pytest.mark.parametrize("seed", [84, 330])
def test_copies_under_both_labels_do_not_loosen_the_kkt_check(seed):
    """Copies of one x under both labels, each at C, add nothing to f but 2 C K to the terms
    the KKT tolerances are relative to: at C K ~ 1e10 (polynomial kernels at C 2e7 to 3e7)
    paths ended 2e-8 to 2e-6 off relative to the terms net of them (decision values 3e-5 off
    for seed 84), within the gross terms' tolerance, so nothing was redone. Judged on the net
    terms, such a path is solved afresh from its sets or retried: every update holds its
    conditions to 1e-8 of the net terms (not below 100 eps of the gross ones), or is refused
    unchanged."""
    rng, kernel, C, X, y = copies_under_both_labels(seed)
    engine = PathEngine(kernel, C)
    for position in rng.permutation(len(y)):
        before = engine.get_state()
        try:
            engine.update(X[position : position + 1], y[position : position + 1],
                          [int(position)])
        except ConvergenceError:
            after = engine.get_state()
            for name in before:
                np.testing.assert_array_equal(before[name], after[name])
            continue
        assert net_relative_kkt_violation(engine, spread_margin=0.0) < 1e-8
        assert relative_kkt_violation(engine) < 1e-8


# Nineteen points at C = 7.7e7 under an RBF kernel on features of size 1e-6 (gamma * scale^2 =
# 4.6), two x's stored under both labels; in a sliding window of 92 points they refused 30 of 40
# slides.
FAR_FROM_COPIES_X = np.array([
    [1.6688060445313774e-07, -4.770426674557032e-08],
    [2.348101109616106e-07, -1.0400305006414859e-06],
    [5.56858685099645e-07, -1.947589544034628e-06],
    [-6.170352664197516e-07, -1.7840472000019434e-06],
    [-6.95027727780753e-07, -1.7576960687457492e-06],
    [2.2420884158652283e-07, 1.1796119314050778e-07],
    [1.6867687557158997e-06, 9.497098511482239e-07],
    [1.1028453012657678e-06, 1.1124907310361409e-06],
    [2.496386187475054e-07, 2.5250500857530306e-07],
    [-8.342729671558101e-07, 1.1867074757994357e-06],
    [-6.95027727780753e-07, -1.7576960687457492e-06],
    [-4.3659349614275295e-07, -9.05924654213098e-08],
    [4.975995256538231e-07, -1.537379001718247e-07],
    [-1.3662989546741846e-06, -1.3499104582675877e-06],
    [2.890394251108789e-07, 2.404946504003476e-06],
    [-3.045483810162879e-06, 1.6869926784685469e-06],
    [-1.6580478254458216e-06, -9.462988046336057e-07],
    [1.6688060445313774e-07, -4.770426674557032e-08],
    [-1.353019045695815e-07, 5.82194749382184e-07],
])
FAR_FROM_COPIES_Y = np.array([-1.0, 1.0, -1.0, -1.0, -1.0, -1.0, -1.0, 1.0, 1.0,
                              -1.0, 1.0, 1.0, 1.0, -1.0, 1.0, -1.0, 1.0, 1.0, -1.0])


def test_copies_far_from_a_margin_point_leave_it_their_round_off():
    """The copies' net coefficients, and through sum(y alpha) = 0 b, carry eps times the
    coefficients that cancel, which moves f at points far from the copies too, whose own net
    terms are small: held to those alone, the 19th point was refused ("learning its 19 points
    afresh failed too") though its solution is exact to that round-off."""
    engine = PathEngine(make_kernel("rbf", gamma=4581928752910.544), 76626479.78372905)
    for position in range(FAR_FROM_COPIES_Y.size):
        engine.update(FAR_FROM_COPIES_X[position : position + 1],
                      FAR_FROM_COPIES_Y[position : position + 1], [position])
        assert net_relative_kkt_violation(engine) < 2e-8
        assert relative_kkt_violation(engine) < 1e-8


def test_the_count_of_copies_follows_additions_removals_and_rollbacks():
    """The engine counts stored copies as points come and go (the check above skips its
    search when there are none): the count must match the stored rows after multiple
    updates, removals, leave-one-out runs (which roll every removal back), a width change
    and a pickle round trip (Python's hashes are salted per process: never saved)."""
    rng, kernel, C, X, y = copies_under_both_labels(84)
    engine = PathEngine(kernel, C)

    def assert_counted() -> None:
        if engine._row_counts is None:
            engine._count_rows()
        assert engine._copies == engine.n - len(np.unique(engine.X, axis=0))

    for arguments in random_updates(rng, engine, X, y, calls=40):
        engine.update(**arguments)
        assert_counted()
    left_out = engine.leave_one_out_positions()
    engine.leave_one_out_decisions()
    assert_counted()
    # Copies of the rows left out in turn, under the other label: each must be counted.
    engine.update(engine.X[left_out].copy(), -engine.y[left_out],
                  [f"copy-{i}" for i in range(left_out.size)])
    assert_counted()
    engine.ensure_dim(engine.dim + 1)
    engine.update(np.hstack([X[:2], np.zeros((2, 1))]), y[:2], ["again-0", "again-1"])
    assert_counted()
    assert pickle.loads(pickle.dumps(engine))._row_counts is None


def test_copies_are_found_in_rows_without_features_and_with_negative_zeros():
    # Rows of no features are all one x (a model of constant or absent features).
    engine = PathEngine(make_kernel("linear"), 1.0)
    for key, label in enumerate([1.0, -1.0, 1.0]):
        engine.update(np.zeros((1, 0)), np.array([label]), [key])
    assert relative_kkt_violation(engine) < 1e-8
    # -0.0 is 0.0: the two rows are copies, and their cancelling coefficients leave the terms.
    engine = PathEngine(make_kernel("rbf", gamma=1.0), 100.0)
    engine.update(np.array([[1.0, 0.0], [1.0, -0.0], [2.0, 1.0]]), np.array([1.0, -1.0, 1.0]),
                  ["a", "b", "c"])
    assert engine._copies == 1
    gross = engine.g_terms()
    assert np.all(engine._net_of_copies(gross) < gross)


# ---------------------------------------------------------------------------- adversarial
# Scenarios at any scale: C from 1e-3 to 1e6, features from 1e-8 to 1e8, duplicates and the same
# x under both labels, one-class streams. CI runs STREAM_SVM_ADVERSARIAL_SCENARIOS of them (40 by
# default); ``python -m tests.test_engine_degenerate N`` runs N by hand and prints the rate.
ADVERSARIAL_SCENARIOS = int(os.environ.get("STREAM_SVM_ADVERSARIAL_SCENARIOS", "40"))
# Refusals (ConvergenceError) per update over seeds 0..3999, run by hand
# (``python -m tests.test_engine_degenerate 4000 0``, about a minute): 1 of 195,921 updates
# (0.0005 %, seed 494: a linear kernel at C * K ~ 1.6e14, where the margin equations fix b only
# to ~1e-16 of terms that large). Every accepted update within 1e-8 relative KKT violation but
# those of seeds 1695 (a linear kernel at C * K = 7e10 on one feature, 61 of 98 points copies,
# many under the opposite label: 9.7e-7, the copies' regime the README describes) and 3388
# (the same at C * K = 1.1e20, beyond float64: the copies leave ~1e4 of round-off in b, more
# than the margin, and points at x = 0 end on its wrong side: 1). Seed 2783 (a linear kernel
# at C * K = 2e10) reached 2.1e-8 while the linear kernel's columns of several points came
# from BLAS, 4e-15 since they come from the compiled loop, which seed 3388's luck reversed.
# The 40 CI scenarios refuse 0 of 1,935 updates; the bound is the product target, 0.1 %.
MAX_REFUSAL_RATE = 1e-3


def adversarial_scenario(seed: int):
    rng = np.random.default_rng(seed)
    name = str(rng.choice(["rbf", "linear", "poly"]))
    C = float(10 ** rng.uniform(-3, 6))
    scale = float(10 ** rng.uniform(-8, 8))
    d = int(rng.integers(1, 6))
    # Mostly a gamma on the features' scale (an ordinary kernel), sometimes, for RBF, one that
    # ignores it (a kernel that is nearly the identity or nearly all ones). A polynomial kernel
    # off the features' scale would reach (1e16)^3: beyond what float64 can solve.
    gamma = float(10 ** rng.uniform(-2, 1))
    if name != "rbf" or rng.random() < 0.8:
        gamma /= d * scale**2
    kernel = make_kernel(name, gamma=gamma, degree=int(rng.integers(1, 4)), coef0=1.0)
    n = int(rng.integers(20, 120))
    X = rng.standard_normal((n, d))
    if rng.random() < 0.3:
        X = np.round(X, 1)
    y = np.where(X[:, 0] + 0.3 * rng.standard_normal(n) > 0, 1.0, -1.0)
    if rng.random() < 0.5:
        y = np.where(rng.random(n) < 0.5, 1.0, -1.0)
    # A quarter of the points repeat another point, under its label or the opposite one.
    copies = rng.random(n) < 0.25
    sources = rng.integers(0, n, size=n)
    X[copies] = X[sources[copies]]
    flip = rng.random(n) < 0.5
    y[copies] = np.where(flip[copies], -y[sources[copies]], y[sources[copies]])
    if rng.random() < 0.1:
        y[:] = 1.0 if rng.random() < 0.5 else -1.0
    return rng, kernel, C, X * scale, y


def run_adversarial(seed: int) -> tuple[int, int, float]:
    """(updates, refusals, worst relative KKT violation of an accepted update) of one scenario;
    asserts an unchanged engine after every refusal."""
    rng, kernel, C, X, y = adversarial_scenario(seed)
    engine = PathEngine(kernel, C)
    operations = refusals = 0
    worst = 0.0
    for arguments in random_updates(rng, engine, X, y, calls=int(rng.integers(20, 80))):
        before = engine._snapshot()
        operations += 1
        try:
            engine.update(**arguments)
        except ConvergenceError:
            refusals += 1
            after = engine._snapshot()
            assert after.keys() == before.keys()
            for name, value in before.items():
                if isinstance(value, np.ndarray):
                    np.testing.assert_array_equal(after[name], value, err_msg=f"seed {seed}")
                else:
                    assert after[name] == value, f"seed {seed}: {name} changed"
            continue
        worst = max(worst, relative_kkt_violation(engine))
    return operations, refusals, worst


# Scenarios whose removals of large coefficients (linear kernel, C * K ~ 1e13..1e18) left reserve
# or error points on the wrong side at the new, smaller scale, and were refused until the engine
# repaired such violators by removing and adding them back.
FORMERLY_REFUSED = [28, 36, 40, 76, 84]


@pytest.mark.parametrize("seed", FORMERLY_REFUSED)
def test_shrinking_solutions_are_repaired_not_refused(seed):
    _, refused, worst = run_adversarial(seed)
    assert refused == 0
    assert worst < 1e-8, f"relative KKT violation {worst:.3g}"


def test_adversarial_scenarios_are_exact_and_rarely_refused():
    operations = refusals = 0
    for seed in range(ADVERSARIAL_SCENARIOS):
        done, refused, worst = run_adversarial(seed)
        assert worst < 1e-8, f"seed {seed}: relative KKT violation {worst:.3g}"
        operations += done
        refusals += refused
    assert refusals <= MAX_REFUSAL_RATE * operations, (refusals, operations)


if __name__ == "__main__":
    import sys
    import time

    count = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    first = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    started = time.perf_counter()
    operations = refusals = inexact = 0
    for seed in range(first, first + count):
        done, refused, worst = run_adversarial(seed)
        operations += done
        refusals += refused
        inexact += worst >= 1e-8
        if refused or worst >= 1e-8:
            print(f"seed {seed}: {refused} of {done} updates refused, worst relative KKT "
                  f"violation {worst:.3g}", flush=True)
    print(f"{count} scenarios, {operations} updates, {refusals} refused "
          f"({100 * refusals / max(operations, 1):.3f} %), {inexact} scenarios with a relative "
          f"KKT violation >= 1e-8, {time.perf_counter() - started:.0f} s")


def test_b_does_not_depend_on_a_member_of_s_an_ulp_below_c():
    # A path that ends exactly where a margin point reaches C left it in S at C - 1e-16; b
    # then stayed where that point put it, while the same points learned after a checkpoint
    # round trip centred b in its interval: two models 7.5e-3 apart on Bananas. b is now
    # centred in both (the member counts as at its bound).
    import itertools

    import pandas as pd
    from river import datasets

    from stream_svm import IncrementalSVC

    bananas = list(itertools.islice(datasets.Bananas(), 1200))
    # Twelve points, one more, then the first one forgotten.
    stream: list = [("learn", i, *bananas[i]) for i in range(0, 60, 5)]
    stream += [("learn", "late", *bananas[1199]), ("forget", 0, None, None)]

    def apply(model: IncrementalSVC, steps: list) -> None:
        for op, key, x, y in steps:
            if op == "learn":
                model.learn_one(x, y, key=key)
            else:
                model.forget_one(key=key)

    whole = IncrementalSVC(C=1.0, gamma=0.5)
    apply(whole, stream)
    grid = pd.DataFrame(np.random.default_rng(0).uniform(-3, 3, (100, 2)), columns=["1", "2"])
    for cut in range(1, len(stream)):
        first = IncrementalSVC(C=1.0, gamma=0.5)
        apply(first, stream[:cut])
        resumed = IncrementalSVC.from_checkpoint(*first.to_checkpoint())
        apply(resumed, stream[cut:])
        np.testing.assert_allclose(resumed.decision_function_many(grid),
                                   whole.decision_function_many(grid), rtol=0, atol=1e-12,
                                   err_msg=f"checkpoint after {cut} points")


@pytest.mark.parametrize("C", [1.0, 1e8, 1e12])
def test_b_of_a_model_forgotten_down_to_one_class_is_the_fresh_models(C):
    # With one class left, b's interval is half-open: the path's leftover stayed in b
    # (1.000366 at C = 1e12 where a model that learned the point afresh has 1.0). It is now
    # the interval's finite end, as the fresh model's.
    from stream_svm import IncrementalSVC

    x, other = {"f0": -0.9356}, {"f0": 0.4}
    for labels in ((False, True), (True, False)):
        model = IncrementalSVC(C=C)
        model.learn_one(x, labels[0], key=1)
        model.learn_one(x, labels[1], key=2)
        model.learn_one(other, labels[1], key=3)
        model.forget_one(key=1)
        fresh = IncrementalSVC(C=C)
        fresh.learn_one(x, labels[1], key=2)
        fresh.learn_one(other, labels[1], key=3)
        assert model.intercept == pytest.approx(fresh.intercept, rel=1e-14, abs=1e-14)
        assert model.decision_function_one(other) == pytest.approx(
            fresh.decision_function_one(other), rel=1e-14, abs=1e-14)


@pytest.mark.parametrize("seed", range(12))
def test_b_forgotten_down_to_one_point_after_large_C_K_terms_is_the_fresh_models(seed):
    # 60 points on 4 distinct values, mixed labels, C K up to 1e6, forgotten in batches down to
    # one: b was computed from the path's g and h, which held the round-off of the large
    # terms since removed, and ended up to 1e-7 from the fresh model's +-1 (in 158 of 400
    # such streams on the wrong side of it, the kept point's g below 0).
    from stream_svm import IncrementalSVC

    rng = np.random.default_rng(seed)
    C, kernel = float(10.0 ** rng.integers(3, 7)), ("rbf", "linear", "poly")[seed % 3]
    model = IncrementalSVC(C=C, kernel=kernel, gamma=0.7, degree=2, coef0=1.0)
    values = rng.normal(size=4)[rng.integers(0, 4, 60)]
    labels = rng.random(60) < 0.5
    model.learn_many(pd.DataFrame({"a": values}), pd.Series(labels), keys=list(range(60)))
    kept = int(rng.integers(0, 60))
    others = np.array([key for key in range(60) if key != kept])[rng.permutation(59)]
    for batch in np.array_split(others, int(rng.integers(1, 4))):
        model.forget_many([int(key) for key in batch])
    fresh = IncrementalSVC(C=C, kernel=kernel, gamma=0.7, degree=2, coef0=1.0)
    fresh.learn_one({"a": values[kept]}, bool(labels[kept]))
    assert fresh.intercept == (1.0 if labels[kept] else -1.0)
    assert model.intercept == fresh.intercept


def test_b_left_unfixed_by_removals_is_centered_on_members_exactly_at_their_bounds():
    # 60 points (4 distinct values), C = 1e5, forgotten down to two copies at C and one point
    # of class +1: a member of S left at alpha = 1.1e-8 instead of 0 and the path's g put b at
    # 1 - 1.07e-8 (a fresh model: 1), the +1 point's g below 0.
    from stream_svm import IncrementalSVC

    rng = np.random.default_rng(1141)
    C = float(10.0 ** rng.integers(3, 7))
    settings = dict(C=C, kernel="rbf", gamma=0.7)
    values = rng.normal(size=4)[rng.integers(0, 4, 60)]
    labels = rng.random(60) < 0.5
    model = IncrementalSVC(**settings)
    model.learn_many(pd.DataFrame({"a": values}), pd.Series(labels), keys=list(range(60)))
    kept = int(rng.integers(0, 60))
    others = np.array([key for key in range(60) if key != kept])[rng.permutation(59)]
    kept, others = [kept, *others[:2].tolist()], others[2:]
    for batch in np.array_split(others, int(rng.integers(1, 4))):
        model.forget_many([int(key) for key in batch])
    fresh = IncrementalSVC(**settings)
    for key in kept:
        fresh.learn_one({"a": values[key]}, bool(labels[key]))
    assert C == 1e5 and not model._engine.b_is_fixed()
    assert abs(model.intercept - fresh.intercept) <= 1e-14 * C
    assert kkt_violation(model._engine) <= 1e-14 * C


@pytest.mark.filterwarnings("ignore:a point far beyond")  # (its point is)
def test_a_derailed_linear_model_is_told_of_a_remedy_it_has():
    # A linear kernel has no gamma: the error names the ridge only (and the model is kept).
    from stream_svm import IncrementalSVC

    model = IncrementalSVC(kernel="linear")
    for i in range(10):
        model.learn_one({"a": float(i), "b": float(i % 3)}, i % 2 == 0, key=i)
    before = model.decision_function_one({"a": 1.0})
    with pytest.raises(ConvergenceError, match=r"try a ridge\)") as raised:
        model.learn_one({"a": 1e150}, True, key="huge")
    assert "gamma" not in str(raised.value)
    assert model.n_stored == 10 and model.decision_function_one({"a": 1.0}) == before


def test_a_derailed_polynomial_model_is_not_told_to_raise_gamma():
    # A polynomial kernel matrix made singular by features of 1e4 (gamma <x, x'> = 1e8): a
    # larger gamma, which the error advised, makes it worse.
    from stream_svm import IncrementalSVC

    rng = np.random.default_rng(0)
    model = IncrementalSVC(kernel="poly")
    for i in range(10):
        model.learn_one({"a": float(rng.normal()), "b": float(rng.normal())}, i % 2 == 0, key=i)
    before = model.decision_function_one({"a": 1.0})
    with pytest.raises(ConvergenceError, match=r"try a ridge, or features scaled so that "
                                               r"gamma <x, x'> is about 1\)") as raised:
        model.learn_one({"a": 1e4, "b": 1e4}, True, key="huge")
    assert "larger gamma" not in str(raised.value)
    assert model.n_stored == 10 and model.decision_function_one({"a": 1.0}) == before


# Four multiple updates at C = 5.7e6 (RBF, a small ridge, copies under both labels): the
# third leaves coefficients of 1e7 in all, the fourth removes them. A removal's last move
# ends at the round-off of the coefficients it started from; what that left in sum(y alpha)
# (2.3e-5) was judged relative to C and stayed, with decision values 4.7e-6 off the batch
# optimum. Relative to the solution's own coefficients (182 in all) it is re-solved.
BALANCE_UPDATES = [
    ([[-0.7, 1.3, 1.5], [1.3, -1.2, 0.3], [-0.7, 1.3, 1.5], [0.6, -0.9, 0.5], [0.3, 0.7, 0.2],
      [0.3, -0.1, -0.6], [1.8, 0.1, -1.3], [0.3, 1.3, -1.5]],
     [1, 1, 1, -1, 1, 1, 1, 1], [7, 13, 37, 11, 2, 0, 33, 20], []),
    ([[-1.0, -0.1, -0.7], [-1.0, -0.1, -0.7], [1.8, 0.1, -1.3], [0.9, 1.0, -2.4],
      [-0.3, 1.1, -1.1], [0.3, 2.2, -0.3], [0.0, 3.5, -0.9], [-1.5, 0.5, -1.0]],
     [1, -1, -1, 1, -1, 1, 1, -1], [28, 16, 25, 43, 24, 29, 42, 38], [33, 20, 11]),
    ([[0.3, -0.1, -0.6], [0.1, 1.7, -0.2]], [-1, -1], [8, 12], [2, 13, 38, 7, 42]),
    ([[-0.7, -0.9, 0.8], [0.8, 0.2, -0.7], [0.9, 1.0, -2.4]], [-1, 1, 1], [36, 1, 18],
     [43, 25, 28, 8, 37]),
]


def test_removals_of_large_coefficients_leave_no_imbalance():
    from tests.oracle import BatchOptimum, dual_objective

    engine = PathEngine(make_kernel("rbf", gamma=0.08129210275395675), C=5668544.823828762,
                        ridge=1.9885522113211818e-07)
    for X_add, y_add, keys, remove in BALANCE_UPDATES:
        engine.update(np.array(X_add), np.array(y_add, dtype=float), keys, remove)
    assert engine.alpha.sum() < 1e3  # (the large coefficients are gone)
    imbalance = abs(float(engine.alpha @ engine.y)) / float(engine.alpha.sum())
    assert imbalance < 1e-12, imbalance
    oracle = BatchOptimum(engine)
    probes = np.random.default_rng(3).standard_normal((20, 3))
    ours, theirs = engine.decision_function(probes), oracle.decision(probes)
    assert np.abs(ours - theirs).max() <= 1e-8 * (1.0 + np.abs(theirs).max())
    objective = oracle.objective()
    assert abs(dual_objective(oracle.K, engine.y, engine.alpha) - objective) <= 1e-12 * abs(
        objective)


def test_a_state_saved_when_the_balance_was_judged_relative_to_c_is_restored_re_solved(
        monkeypatch):
    # Checkpoints written before sum(y alpha) was held to sum(alpha) may hold an imbalance
    # the C-relative check let stand: they restore, re-solved from their sets, instead of
    # being refused as damaged.
    from tests.oracle import BatchOptimum

    def engine_of_then():
        engine = PathEngine(make_kernel("rbf", gamma=0.08129210275395675),
                            C=5668544.823828762, ridge=1.9885522113211818e-07)
        for X_add, y_add, keys, remove in BALANCE_UPDATES:
            engine.update(np.array(X_add), np.array(y_add, dtype=float), keys, remove)
        return engine

    with monkeypatch.context() as then:  # the rule of then: relative to C
        refresh = PathEngine._refresh_g

        def refresh_relative_to_c(self, g=None):
            terms, residual, kkt_ok, stale, balance = refresh(self, g)
            return terms, residual, kkt_ok, stale, balance * self.alpha.sum() / self.C

        then.setattr(PathEngine, "_refresh_g", refresh_relative_to_c)
        then.setattr(PathEngine, "_relative_imbalance", lambda self, imbalance: imbalance / self.C)
        then.setattr(PathEngine, "REFINE_TOL", 1e-9)  # (then: S re-solved from 1e-9 on)
        saved = engine_of_then()
        state, keys = saved.get_state(), saved.keys
    assert abs(float(state["alpha"] @ state["y"])) / state["alpha"].sum() > 1e-8
    restored = PathEngine(make_kernel("rbf", gamma=0.08129210275395675), C=5668544.823828762,
                          ridge=1.9885522113211818e-07)
    restored.set_state(state, keys)
    assert abs(float(restored.alpha @ restored.y)) < 1e-12 * restored.alpha.sum()
    probes = np.random.default_rng(3).standard_normal((20, 3))
    theirs = BatchOptimum(restored).decision(probes)
    assert np.abs(restored.decision_function(probes) - theirs).max() <= 1e-8 * (
        1.0 + np.abs(theirs).max())
    # An edited coefficient is still refused, and the message names the imbalance.
    state["alpha"][np.flatnonzero(state["status"] == 0)[0]] *= 1.01
    with pytest.raises(ValueError, match=r"sum\(y alpha\) .* of sum\(alpha\)\): a damaged"):
        restored.set_state(state, keys)


# Four negative points, then one positive, under a linear kernel (2-D, unit scale): the first
# four leave every point exactly on the margin (g = 0, w = 0), and the positive one's path
# took points in and out of S with steps of length 0, through eight sets again and again,
# until max_breakpoints (in 24 of the 120 orders of learning the five points, and in
# learn_many of them), at C = 1, 10 and 1000.
DEGENERATE_CYCLE = np.array([(-0.774852, 0.040974), (-0.657468, 0.71817),
                             (-0.893199, -0.72814), (0.78718, 2.221511),
                             (-0.928855, 0.619033)])


@pytest.mark.parametrize("C", [1.0, 10.0, 1000.0])
def test_steps_of_length_zero_do_not_cycle(C):
    import itertools

    from tests.oracle import assert_matches_batch

    X, y = DEGENERATE_CYCLE, np.array([-1.0, -1.0, -1.0, -1.0, 1.0])
    probes = np.random.default_rng(0).normal(size=(30, 2))
    for order in itertools.permutations(range(5)):
        engine = PathEngine(make_kernel("linear"), C=C)
        for i in order:
            engine.update(X[i : i + 1], y[i : i + 1], [i])
        assert_matches_batch(engine, probes, tol=1e-10)
    engine = PathEngine(make_kernel("linear"), C=C)
    engine.update(X, y, list(range(5)))
    assert_matches_batch(engine, probes, tol=1e-10)


def test_b_is_centered_where_copies_leave_coefficients_a_round_off_below_c():
    # Eight points with every coefficient at C (b not unique): three copies of one point
    # shared their coefficient, and the path that took them to C left two of them 3e-12 C
    # below it, which fixed b at an end of its interval by the order of the points (f(0) =
    # -0.95 or +0.015); libsvm centers it (0.008512).
    from stream_svm import IncrementalSVC, IncrementalSVR

    copy = [-1.2954225535755381, -1.417001010604945, 0.9812034856641942]
    X = np.array([[1.2377184818690774, -1.6194597983467527, 0.3201050648772154], copy,
                  [-0.12989038619381682, -0.7010956402260364, 1.070104599488368], copy,
                  [-0.3924705891626993, -0.4572822875324344, -1.2436507009497069], copy,
                  [0.5912719019980882, -0.09719009154143551, 1.4532360292703597],
                  [0.6819532798790994, 0.7736464069196792, 1.8290531438736908]])
    y = [-1, -1, 1, -1, 1, -1, 1, 1]
    rng = np.random.default_rng(1)
    for order in [list(range(8))] + [list(rng.permutation(8)) for _ in range(8)]:
        model = IncrementalSVC(C=0.015298534950491504, gamma=1.0, ridge=0.001,
                               classes=[-1, 1])
        for i in order:
            model.learn_one(dict(zip("abc", X[i], strict=True)), y[i], key=int(i))
        assert model.intercept == pytest.approx(0.008512, abs=5e-7), order
    # The same with regression samples (three copies at C, the tube's interval).
    x = [-0.0148111279589886, -0.742102902101766, -0.0148111279589886, -1.2537742313698383,
         -1.3595116032656764, 0.42868195691204075, -0.0148111279589886, -1.3595116032656764,
         -1.2537742313698383, -0.32155967895408905]
    t = [-0.02882426771093134, -1.188535186647833, -0.02882426771093134, -0.3302574738400735,
         -0.07127370235951103, 0.812505210453857, -0.02882426771093134, -0.2324574736550023,
         -0.8159751255644884, -0.5928514998142533]
    for order in [list(range(10))] + [list(rng.permutation(10)) for _ in range(8)]:
        model = IncrementalSVR(C=0.014550514543841464, epsilon=0.001, ridge=0.001, gamma=1.0)
        for i in order:
            model.learn_one({"a": x[i]}, t[i], key=int(i))
        assert model.intercept == pytest.approx(-0.126440, abs=5e-7), order


def test_b_moves_only_within_the_interval_that_keeps_every_condition():
    # Two far-apart points of each class at C small enough that all four are at C: no free
    # coefficient, so b is any value of an interval, and the model is an optimum for each.
    engine = PathEngine(make_kernel("rbf", gamma=10.0), 0.1)
    X = np.array([[-2.0], [-1.0], [1.0], [2.0]])
    y = np.array([-1.0, -1.0, 1.0, 1.0])
    engine.update(X, y, [0, 1, 2, 3])
    low, high = engine.b_interval()
    assert low < engine.b < high and np.isfinite([low, high]).all()
    for b in (low, high, 0.25 * low + 0.75 * high):
        engine.move_b(b)
        assert engine.b == b and kkt_violation(engine) < 1e-12
    for outside in (low - 1e-3, high + 1e-3):
        with pytest.raises(ValueError, match="is not in the interval of optimal b"):
            engine.move_b(outside)
    assert engine.b == 0.25 * low + 0.75 * high
    engine.update(np.array([[0.0]]), np.array([1.0]), [4])  # free coefficients fix b
    assert engine.b_is_fixed() and engine.b_interval() is None
    with pytest.raises(ValueError, match="is not in the interval of optimal b"):
        engine.move_b(engine.b)
