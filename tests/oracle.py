"""Independent checks of an SVM solution: KKT conditions from a freshly computed kernel, and the
batch optimum of scikit-learn's libsvm, polished in float64.

libsvm caches Q in float32, so its raw decision values sit ~1e-6 from the optimum whatever its
tol; re-solving the equalities on the sets libsvm identified gives the optimum to round-off.
"""

from __future__ import annotations

import warnings

import numpy as np
from sklearn.exceptions import ConvergenceWarning
from sklearn.svm import SVC

from stream_svm.engine import ERROR, MARGIN, RESERVE, PathEngine


def gram(engine: PathEngine, A: np.ndarray, B: np.ndarray) -> np.ndarray:
    width = max(A.shape[1], B.shape[1])
    A = np.hstack([A, np.zeros((A.shape[0], width - A.shape[1]))])
    B = np.hstack([B, np.zeros((B.shape[0], width - B.shape[1]))])
    return engine.kernel(A, B)


def kkt_violation(engine: PathEngine) -> float:
    """Largest KKT violation of the engine's solution, with g recomputed from scratch."""
    if engine.n == 0:
        return 0.0
    X, y, alpha, status = engine.X, engine.y, engine.alpha, engine.status
    K = gram(engine, X, X) + engine.ridge * np.eye(engine.n)
    g = y * (K @ (alpha * y) + engine.b) - 1.0
    C = engine.C
    total = float(alpha.sum())
    worst = abs(float(alpha @ y)) / total if total > 0 else 0.0
    worst = max(worst, float(np.max(-alpha, initial=0.0)) / C, float(np.max(alpha - C)) / C)
    margin, error, reserve = status == MARGIN, status == ERROR, status == RESERVE
    assert np.all(margin | error | reserve), "a point is left in a transient state"
    worst = max(worst, float(np.max(np.abs(g[margin]), initial=0.0)))
    worst = max(worst, float(np.max(g[error], initial=0.0)))
    worst = max(worst, float(np.max(-g[reserve], initial=0.0)))
    assert np.all(alpha[error] == C) and np.all(alpha[reserve] == 0.0)
    return worst


def dual_objective(K: np.ndarray, y: np.ndarray, alpha: np.ndarray) -> float:
    a = alpha * y
    return float(0.5 * a @ K @ a - alpha.sum())


class BatchOptimum:
    """The batch SVM optimum on (X, y) under the engine's kernel, C and ridge."""

    def __init__(self, engine: PathEngine) -> None:
        self.engine = engine
        X, y, C = engine.X.copy(), engine.y.copy(), engine.C
        self.X, self.y = X, y
        K = gram(engine, X, X) + engine.ridge * np.eye(len(y))
        self.K = K
        if len(np.unique(y)) < 2:
            self.alpha = np.zeros(len(y))
            self.b = None
            return
        svc = SVC(kernel="precomputed", C=C, tol=1e-10, shrinking=False, max_iter=10**7)
        with warnings.catch_warnings():
            # An oracle that did not converge proves nothing: fail loudly instead.
            warnings.simplefilter("error", ConvergenceWarning)
            svc.fit(K, y)
        alpha = np.zeros(len(y))
        alpha[svc.support_] = np.abs(svc.dual_coef_[0])
        self.raw_alpha, self.raw_b = alpha.copy(), float(svc.intercept_[0])
        self.alpha, self.b = self._polish(alpha, C)

    def _polish(self, alpha: np.ndarray, C: float) -> tuple[np.ndarray, float]:
        """Refine libsvm's sets by a plain active-set iteration in float64.

        Start from libsvm's free / at-C / zero sets, solve the equalities of the free set, and
        move the worst violator between sets until the KKT conditions hold to round-off.
        """
        y, K = self.y, self.K
        n = len(y)
        state = np.where(alpha >= C * (1 - 1e-9), 1, np.where(alpha > 1e-9 * C, 0, 2))
        for _ in range(10 * n + 50):
            F = np.flatnonzero(state == 0)
            a_bound = np.where(state == 1, C * y, 0.0)
            if F.size == 0:
                self.b_unique = False
                return alpha, self.raw_b
            M = np.zeros((F.size + 1, F.size + 1))
            M[0, 1:] = 1.0
            M[1:, 0] = 1.0
            M[1:, 1:] = K[np.ix_(F, F)]
            rhs = np.concatenate([[-a_bound.sum()], y[F] - K[F] @ a_bound])
            solution = np.linalg.lstsq(M, rhs, rcond=1e-13)[0]
            candidate = np.where(state == 1, C, 0.0)
            candidate[F] = y[F] * solution[1:]
            b = float(solution[0])
            low, high = candidate[F] < -1e-10 * C, candidate[F] > C * (1 + 1e-10)
            if low.any() or high.any():
                worst = np.argmax(np.maximum(-candidate[F], candidate[F] - C))
                state[F[worst]] = 2 if candidate[F[worst]] < 0 else 1
                continue
            g = y * (K @ (np.clip(candidate, 0, C) * y) + b) - 1.0
            violation = np.where(state == 2, -g, np.where(state == 1, g, 0.0))
            worst = int(np.argmax(violation))
            if violation[worst] <= 1e-10 * max(1.0, C):
                self.b_unique = True
                return np.clip(candidate, 0.0, C), b
            state[worst] = 0
        raise AssertionError("the oracle's active-set refinement did not converge")

    def objective(self) -> float:
        return dual_objective(self.K, self.y, self.alpha)

    def decision(self, Q: np.ndarray) -> np.ndarray:
        return gram(self.engine, Q, self.X) @ (self.alpha * self.y) + self.b


def assert_matches_batch(engine: PathEngine, probes: np.ndarray, tol: float = 1e-6) -> None:
    """Decision values on ``probes`` and the dual objective equal the batch optimum's."""
    assert kkt_violation(engine) < 1e-8 * max(1.0, engine.C)
    oracle = BatchOptimum(engine)
    if oracle.b is None:
        return
    ours = engine.decision_function(probes)
    theirs = oracle.decision(probes)
    if engine.n_margin == 0 or not oracle.b_unique:
        # b is not unique without a free coefficient (any b in the KKT interval is optimal, and
        # kkt_violation checked ours is inside it): compare the kernel parts only.
        ours, theirs = ours - engine.b, theirs - oracle.b
    scale = 1.0 + np.abs(theirs).max()
    assert np.abs(ours - theirs).max() <= tol * scale, np.abs(ours - theirs).max()
    our_objective = dual_objective(oracle.K, engine.y, engine.alpha)
    assert abs(our_objective - oracle.objective()) <= 1e-7 * max(1.0, abs(oracle.objective()))


def relative_kkt_violation(engine: PathEngine) -> float:
    """Largest KKT violation from a freshly computed kernel, each condition relative to its
    natural scale, so that it is invariant to a common rescaling (features times s, C / s^2):

    - g_i = y_i f(x_i) - 1 is dimensionless, but its round-off is eps times the terms summed
      into it, 1 + |b| + sum_j alpha_j |K_ij| (large and cancelling with overlapping classes at
      a large C * K); each point's violation is divided by its own sum, which is at least 1;
    - the box 0 <= alpha <= C relative to C;
    - sum(y alpha) relative to sum(alpha), the coefficients' own size (with C * K large they
      can be far below C, and a C-relative balance hid an imbalance that moved decision values
      by 4.7e-6).
    """
    if engine.n == 0:
        return 0.0
    X, y, alpha, status = engine.X, engine.y, engine.alpha, engine.status
    K = gram(engine, X, X) + engine.ridge * np.eye(engine.n)
    assert np.all(np.isfinite(K))
    g = y * (K @ (alpha * y) + engine.b) - 1.0
    terms = 1.0 + abs(engine.b) + np.abs(K) @ alpha
    C = engine.C
    total = float(alpha.sum())
    worst = abs(float(alpha @ y)) / total if total > 0 else 0.0
    worst = max(worst, float(np.max(-alpha, initial=0.0)) / C, float(np.max(alpha - C)) / C)
    margin, error, reserve = status == MARGIN, status == ERROR, status == RESERVE
    assert np.all(margin | error | reserve), "a point is left in a transient state"
    assert np.all(alpha[error] == C) and np.all(alpha[reserve] == 0.0)
    violation = np.where(margin, np.abs(g), np.where(error, np.maximum(g, 0.0),
                                                     np.maximum(-g, 0.0)))
    if not np.all(np.isfinite(violation)):
        return np.inf
    return max(worst, float(np.max(violation / terms)))


def net_relative_kkt_violation(engine: PathEngine, roundoff_margin: float = 100.0,
                               spread_margin: float = 10.0) -> float:
    """The KKT violation of the engine's points from a freshly computed kernel, relative to the
    terms of g net of what copies of one x cancel: copies under both labels (or a regression
    sample's copies on both sides of the tube) add nothing to f, however large C K, and
    ``relative_kkt_violation``'s gross terms let such a model's g be off by 1e-8 C K. Not
    below ``roundoff_margin`` eps times the gross terms, which is what any float64 sum of them
    loses (the fresh computation here too), nor below ``spread_margin`` eps times the
    cancelled coefficients times the kernel's scale, nor above the gross terms: as the
    engine's own check."""
    if engine.n == 0:
        return 0.0
    X, y, alpha, status = engine.X, engine.y, engine.alpha, engine.status
    K = gram(engine, X, X) + engine.ridge * np.eye(engine.n)
    g = y * (K @ (alpha * y) + engine.b) + engine.linear  # (linear -1: classification)
    _, group = np.unique(X, axis=0, return_inverse=True)
    group = group.ravel()
    net = np.bincount(group, alpha * y)
    representatives = np.array([np.flatnonzero(group == u)[0] for u in range(net.size)])
    kernel_only = gram(engine, X, X)  # (the ridge is each point's own, not shared by copies)
    net_terms = np.abs(engine.linear) + abs(engine.b) + np.abs(
        kernel_only[:, representatives]) @ np.abs(net)
    gross_terms = np.abs(engine.linear) + abs(engine.b) + np.abs(K) @ alpha
    eps = float(np.finfo(float).eps)
    terms = np.maximum(net_terms, roundoff_margin * eps / 1e-8 * gross_terms)
    # The copies' own round-off moves b and their net coefficients by eps times the
    # coefficients that cancel, and f by that times K everywhere (spread_margin times it is
    # allowed), though never more than the gross terms would.
    cancelled = float((np.bincount(group, alpha) - np.abs(net)).sum())
    spread = spread_margin * eps / 1e-8 * cancelled * float(np.abs(np.diag(K)).max())
    terms = np.minimum(np.maximum(terms, spread), gross_terms)
    margin, error = status == MARGIN, status == ERROR
    gap = engine.gap
    violation = np.where(margin, np.abs(g), np.where(
        error, np.maximum(g, 0.0), np.maximum(np.maximum(-g, 0.0), g - gap)))
    return float((violation / terms).max())
