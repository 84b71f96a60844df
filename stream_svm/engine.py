"""The exact path-following engine shared by every SVM estimator of the package.

The engine keeps the dual solution of the soft-margin SVM

    min_alpha  1/2 sum_ij alpha_i alpha_j y_i y_j K_ij - sum_i alpha_i
    s.t.       0 <= alpha_i <= C,  sum_i y_i alpha_i = 0

optimal (Kuhn-Tucker conditions satisfied to round-off) through any sequence of updates, where one
update adds a set A of new points and removes a set R of stored points at once. Following
Karasuyama & Takeuchi (2009), the coefficients of A move towards C and those of R towards 0 along
one direction, ``alpha_A += eta (C - alpha_A)``, ``alpha_R -= eta alpha_R``, while the margin
set S keeps ``g_S = 0`` and ``sum y alpha = 0``; ``eta`` runs from 0 to 1 and the direction is
re-established at every breakpoint, where a point changes set. With ``|A| + |R| = 1`` this is the
single-point algorithm of Cauwenberghs & Poggio (2000): one code path for both.

Sets: margin S (g = 0, 0 <= alpha <= C), error E (alpha = C, g <= 0), reserve R (alpha = 0,
g >= 0), where ``g_i = y_i f(x_i) - 1``.

Formulations. More generally the engine solves ``min 1/2 a'Ka + p'alpha`` with a = y * alpha,
under the same constraints, for per-point linear terms p given with the points (``linear`` in
:meth:`PathEngine.update`), so that ``g_i = y_i f(x_i) + p_i``. Classification is p = -1. A
point may also have a finite *gap* (``gap``): it then has two sides, the second with sign -y
and linear term gap - p, whose g is gap - g. That is epsilon-insensitive regression (SVR): a
sample (x, t) is one point with y = +1, p = epsilon - t (the upper edge of the tube, its
coefficient alpha) and gap 2 epsilon, whose other side is y = -1, p = epsilon + t (the lower
edge, alpha*); f(x) = sum theta_i K(x_i, x) + b with theta = y alpha in [-C, C]. A reserve
point holds 0 <= g <= gap (inside the tube); when its g reaches the gap along the path it
changes side (y, p and g flip) and enters S there, its coefficient passing through 0. The
path, the sets, the factor and every check are otherwise the same.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.linalg import cholesky
from scipy.linalg.lapack import dpotrs

from stream_svm import _pathcore
from stream_svm._input import check_findable_keys, key_list
from stream_svm.kernels import CallableKernel, Kernel, LinearKernel, PolynomialKernel, RBFKernel

__all__ = ["ConvergenceError", "PathEngine", "UpdateStats"]

MARGIN, ERROR, RESERVE, ADDING, REMOVING = 0, 1, 2, 3, 4
# Kernel columns of points that left S, kept for their return (on this path or a later update):
# at most 16 columns and this many bytes per engine (a daemon may hold a thousand models; 64
# columns reused more of them on the river windows, at the same step time).
RECENT_COLUMN_BYTES = 512 << 10
RECENT_COLUMNS_MAX = 16
_NO_ROWS = np.zeros((0, 0))  # a 2-D array argument that is not there
_NO_POSITIONS = np.zeros(0, dtype=np.int64)  # a list of positions that is not there
# Every recent-column slot, for each number of slots there can be (made once: read-only).
_ALL_SLOTS = tuple(np.arange(count) for count in range(RECENT_COLUMNS_MAX + 1))
for _slots in _ALL_SLOTS:
    _slots.flags.writeable = False
_EPS = float(np.finfo(float).eps)  # (np.finfo costs microseconds per call)


# The defaults of one classification point (a stream's common update), made once: read-only,
# as the points' arrays an update is given are only read.
_ONE_LINEAR = np.full(1, -1.0)
_ONE_GAP = np.full(1, np.inf)
_ONE_LINEAR.flags.writeable = _ONE_GAP.flags.writeable = False


def check_self_similarity(own: np.ndarray, features: np.ndarray,
                          values_scale: np.ndarray | None = None) -> None:
    """Refuse points at which a user's kernel gives K(x, x) < 0 (``own``, without any ridge;
    ``features``: the points as rows): such a kernel is not positive semi-definite, the
    path's factor would meet negative pivots, and the model would learn noise or fail later
    with a less telling error. Only a value below 0 beyond round-off counts: of the kernel's
    values (``values_scale``, by default |K(x, x)|) or of x's squared norm, which a kernel
    computed by expanding squares cancels (-8.9e-16 for a value of 1.8e-18).

    >>> check_self_similarity(np.array([-1e-17, 2.0]), np.ones((2, 1)))
    >>> try:
    ...     check_self_similarity(np.array([-0.5]), np.ones((1, 1)))
    ... except ValueError as refused:
    ...     print(str(refused)[:53])
    the kernel gives K(x, x) = -0.5 < 0 for the new point
    """
    with np.errstate(over="ignore", invalid="ignore"):
        scale = np.einsum("ij,ij->i", features, features)
        scale = np.fmax(scale, np.abs(own) if values_scale is None else values_scale)
        below = np.flatnonzero(own < -8.0 * _EPS * scale)
    if below.size:
        first = int(below[0])
        which = ("the new point" if own.size == 1 else
                 f"{below.size} of the {own.size} new points (the first is number "
                 f"{first + 1} in the order given)")
        raise ValueError(
            f"the kernel gives K(x, x) = {own[first]:.6g} < 0 for {which}: a kernel must be "
            "positive semi-definite (K(x, x) >= 0 for every x); the model is unchanged"
        )


def _check_kernel_finite(block: np.ndarray) -> None:
    # inf or nan would propagate silently into f, g and the factor (a nan compares False with
    # every threshold): refuse the points instead.
    if not np.isfinite(block).all():
        raise ValueError(
            "a kernel value of a new or stored point is not finite (features too large for "
            "this kernel); the model is unchanged"
        )


# RBF blocks of more columns than RBF_CHUNK are computed and exponentiated RBF_CHUNK columns at
# a time when a column has at most RBF_CHUNK_MAX_POINTS values: a piece then stays in the core's
# L2 cache between the distances and their exp, instead of going to memory and back (measured
# on 500 columns: 10-12 % less time at n = 1000 to 5000, none at 20,000).
RBF_CHUNK = 32
RBF_CHUNK_MAX_POINTS = 8192
# Points predicted per kernel block (PREDICT_CHUNK x support vectors values at a time).
PREDICT_CHUNK = 1024


def _compiled_block(kind: int, gamma: float, degree: int, coef0: float, features: np.ndarray,
                    n: int, positions: np.ndarray, out: np.ndarray | None = None,
                    queries: np.ndarray | None = None) -> np.ndarray:
    """K(x_i, x_p) for i < n and the given positions p (columns of ``features``, stored feature
    by feature, or of ``queries``, stored alike), by the compiled kernel loop; an RBF's exp by
    the same vectorized loop as the columns the breakpoint loop computes (a point's column has
    the same bits wherever it was computed). Returned n x m, a view of the m x n rows it
    fills: ``out`` when given."""
    block = np.empty((positions.size, n)) if out is None else out
    chunk = RBF_CHUNK if kind == _pathcore.KERNEL_RBF and n <= RBF_CHUNK_MAX_POINTS else 0
    if positions.size <= chunk or not chunk:
        _pathcore.kernel_columns(kind, features, n, positions, gamma, degree, coef0, block,
                                 QT=queries)
        return block.T
    # A many-column RBF block goes RBF_CHUNK columns at a time, each exponentiated while it is
    # still in the core's cache.
    for start in range(0, positions.size, chunk):
        _pathcore.kernel_columns(kind, features, n, positions[start : start + chunk], gamma,
                                 degree, coef0, block[start : start + chunk], QT=queries)
    return block.T


def _row_hashes(rows: np.ndarray) -> list[int]:
    """The hashes of the rows' bytes (equal features, equal hashes; -0.0 counts as 0.0).
    Python salts them per process: they are never saved."""
    return [hash(row.tobytes()) for row in rows + 0.0]


def _equal_rows(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Group numbers of the rows (equal rows, equal numbers; -0.0 equals 0.0) and each
    group's first row: by their projections on a fixed vector (vectorized; equal rows project
    equally), checked row by row against each group's first, and by the rows themselves where
    two differ (a collision)."""
    if rows.shape[1] == 0:  # (rows of no features are all equal)
        return np.zeros(rows.shape[0], dtype=np.int64), np.zeros(min(rows.shape[0], 1),
                                                                 dtype=np.int64)
    weights = np.sqrt(np.arange(2.0, rows.shape[1] + 2.0))
    with np.errstate(over="ignore", invalid="ignore"):
        projection = rows @ weights
    _, first, group = np.unique(projection, return_index=True, return_inverse=True)
    group = group.ravel()
    if not np.array_equal(rows, rows[first[group]]):
        _, first, group = np.unique(rows + 0.0, axis=0, return_index=True,
                                    return_inverse=True)
        group = group.ravel()
    return group, first


def _empty_recent(capacity: int) -> tuple[np.ndarray, np.ndarray]:
    """Room for recent kernel columns of ``capacity`` stored points, none held yet."""
    count = min(RECENT_COLUMNS_MAX, max(4, RECENT_COLUMN_BYTES // (8 * max(capacity, 1))))
    return np.zeros((count, capacity)), np.full(count, -1, dtype=np.int64)


class ConvergenceError(RuntimeError):
    """An update could not be completed exactly (too many breakpoints, or a path that round-off
    derailed on a numerically singular kernel); the model was left as it was before."""


class BreakpointLimit(ConvergenceError):
    """An update stopped at ``max_breakpoints``: its size, not any one of its points, is why."""


class _Derailed(ConvergenceError):
    """Round-off derailed an update even one point at a time."""


# An update that derails even one point at a time is completed by learning the points it leaves
# stored afresh when they are at most this many: a path from an empty model grows faster than
# linearly with them (measured on 2-D RBF data: 0.03 s for 1,000 points, 0.5 s for 3,000,
# 2.6 s for 6,000), and the update holds its caller meanwhile.
RELEARN_MAX_POINTS = 5_000
# How many times eps times the terms summed into g the KKT check allows at least, where copies
# cancel (``PathEngine._net_of_copies``): what the sums computing g lose to round-off. 10 refused
# updates that 100 accepts exactly; at 1000 a path 2e-6 (relative) off passed again.
ROUNDOFF_MARGIN = 100.0
# The same for the round-off the cancelling copies leave in b and their net coefficients (eps
# times the coefficients that cancel, times the kernel's scale), after the solution was computed
# afresh from its sets (see ``PathEngine._run_update``).
SPREAD_MARGIN = 10.0


@dataclass
class UpdateStats:
    """What one update did.

    ``breakpoints`` counts the set changes on the path (each one costs a new direction);
    ``steps`` counts the linear solves, including the final segment that ends at eta = 1.
    ``migrations`` maps transitions such as ``"reserve->margin"`` to their counts.
    ``retried`` tells that the KKT check after the multiple path failed (round-off on a
    numerically singular kernel) and the update was redone one point at a time (repairing a
    derailed point's violators by removing and adding them back, see ``_repair``).
    ``columns_reused`` counts points that re-entered the margin set with the kernel column
    they had left it with, instead of computing it again. ``relearned`` tells that even that
    failed and the points the update leaves stored were learned afresh, from an empty model,
    by the same engine (see ``PathEngine.update``). ``relaxed`` tells that every one of
    those failed the KKT check, and the update passed it only judged to the round-off that
    stored copies with cancelling coefficients leave everywhere (``PathEngine.update``).
    """

    added: int = 0
    removed: int = 0
    breakpoints: int = 0
    steps: int = 0
    migrations: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    refactorized: bool = False
    retried: bool = False
    columns_reused: int = 0
    relearned: bool = False
    relaxed: bool = False

    def count(self, migration: str, times: int = 1) -> None:
        if times:
            self.migrations[migration] = self.migrations.get(migration, 0) + times

    def absorb(self, part: UpdateStats) -> None:
        """Add the path work of a part of this update (a retried point, a repair)."""
        self.breakpoints += part.breakpoints
        self.steps += part.steps
        self.columns_reused += part.columns_reused
        self.refactorized |= part.refactorized
        for name, times in part.migrations.items():
            self.count(name, times)


def _compiled_kernel(kernel: Kernel) -> tuple[int, float, int, float]:
    """The compiled loop's code and parameters of a built-in kernel (-1: a user-callable
    kernel, whose columns the loop asks Python for)."""
    if isinstance(kernel, RBFKernel):
        return _pathcore.KERNEL_RBF, kernel.gamma, 0, 0.0
    if isinstance(kernel, PolynomialKernel):
        return _pathcore.KERNEL_POLY, kernel.gamma, kernel.degree, kernel.coef0
    if isinstance(kernel, LinearKernel):
        return _pathcore.KERNEL_LINEAR, 0.0, 0, 0.0
    return -1, 0.0, 0, 0.0


#: What each array of a state (``PathEngine.get_state``) is: its dimensions per point ("n":
#: one entry per stored point) and its kind of numbers. "linear" and "gap" are optional.
_STATE_LAYOUT: dict[str, tuple[tuple[str, ...], str]] = {
    "X": (("n", "d"), "float"), "y": (("n",), "float"), "alpha": (("n",), "float"),
    "status": (("n",), "integer"), "sequence": (("n",), "integer"),
    "margin": (("k",), "integer"), "b": ((), "float"), "next_sequence": ((), "integer"),
    "linear": (("n",), "float"), "gap": (("n",), "float"),
    # The solver's own state, optional (states written before it lack it), taken when it
    # agrees with what the points give (see set_state): a restored engine then goes on with
    # the same bits as the one that saved it.
    "factor": (("k", "k"), "float"), "shift": ((), "float"), "store": (("k",), "integer"),
    "h": (("n",), "float"), "h_abs": (("n",), "float"), "h_drift": (("n",), "float"),
    "diag_scale": ((), "float"), "g": (("n",), "float"),
    # (the last KKT check's terms where it passed and they are kept, else empty)
    "checked_terms": (("m",), "float"),
}

#: The arrays of a state that may be absent: the solver's own state, which states written
#: before it was kept lack (a reader asks for them only where a state has them).
OPTIONAL_STATE_ARRAYS = frozenset({"factor", "shift", "store", "h", "h_abs", "h_drift",
                                   "diag_scale", "g", "checked_terms"})
_OPTIONAL_STATE = OPTIONAL_STATE_ARRAYS | {"linear", "gap"}

#: How far a saved factor R of P = K_SS + t 11' may be from factoring it (max |R'R - P|, to
#: max |P|) for a restore to take it: a maintained factor's is about eps (2e-15 measured at
#: |S| = 24 after 2,000 updates); one beyond is computed afresh.
FACTOR_BACKWARD_ERROR = 1e-10


def _state_arrays(state: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """The arrays of a state as the engine reads them, once their layout is checked:
    ValueError naming the first array missing, of other dimensions, or of other numbers
    (float64 where ``get_state`` wrote float64: a float32 copy has lost digits of the
    solution; integers where it wrote integers).

    Checked before anything indexes with them: a status outside the three sets, or a margin
    index out of range, would send the compiled path out of its arrays.
    """
    arrays: dict[str, np.ndarray] = {}
    n = None
    for name, (dims, kind) in _STATE_LAYOUT.items():
        if name not in state:
            if name in _OPTIONAL_STATE:
                continue
            raise ValueError(f"the state lacks its {name!r} array")
        value = np.asarray(state[name])
        if kind == "float" and value.dtype != np.float64:
            raise ValueError(f"the state's {name!r} holds {value.dtype} values, not float64")
        if kind == "integer" and value.dtype.kind not in "iu":
            raise ValueError(f"the state's {name!r} holds {value.dtype} values, not integers")
        if value.ndim != len(dims):
            raise ValueError(f"the state's {name!r} has {value.ndim} dimensions, not "
                             f"{len(dims)}")
        if dims[:1] == ("n",):
            if n is None:
                n = value.shape[0]
            elif value.shape[0] != n:
                raise ValueError(f"the state's {name!r} has {value.shape[0]} entries, but its "
                                 f"points are {n}")
        arrays[name] = value
    X, status, margin = arrays["X"], arrays["status"], arrays["margin"]
    if not np.all(np.isfinite(X)):
        raise ValueError("the state's points hold features that are not finite")
    if not np.all((status == MARGIN) | (status == ERROR) | (status == RESERVE)):
        bad = status[(status != MARGIN) & (status != ERROR) & (status != RESERVE)][0]
        raise ValueError(f"the state holds a point of status {int(bad)}: not margin ({MARGIN}), "
                         f"error ({ERROR}) or reserve ({RESERVE})")
    if margin.size and (margin.min() < 0 or margin.max() >= X.shape[0]
                        or np.unique(margin).size != margin.size):
        raise ValueError("the state's margin order names points it does not hold, or one twice")
    sequence, next_sequence = arrays["sequence"], int(arrays["next_sequence"])
    if sequence.size and (sequence.min() < 0 or sequence.max() >= next_sequence
                          or np.unique(sequence).size != sequence.size):
        raise ValueError("the state's arrival sequence repeats a number, or is not below its "
                         f"next_sequence ({next_sequence}): the order of its points is lost")
    if next_sequence < 0 or next_sequence > _MAX_SEQUENCE:
        raise ValueError(f"the state's next_sequence {next_sequence} is out of range")
    return arrays


#: How far (relative to each point's terms, ``g_terms``) re-solving a restored state with a
#: user-callable kernel may move its decision values: a kernel function whose values for a
#: pair differ from call to call by 1e-8 (products blocked otherwise) moved them by 3e-7.
CALLABLE_RESTORE_MOVE = 1e-4

#: A state's saved kernel scale above this many times what its points give (with a user's
#: kernel, a point far beyond them since removed) is not taken: the scale the points give is
#: used instead. With a built-in kernel, one more than an ulp or so above it is not taken.
SAVED_SCALE_RATIO = 1e8

#: Arrival numbers stay far below int64's end, so that adding a slide's points cannot wrap.
_MAX_SEQUENCE = 2**62


def _check_state_values(state: Mapping[str, Any], status: np.ndarray, C: float) -> None:
    """ValueError naming the first value of a state (``PathEngine.get_state``) that no update
    can have left: labels other than +-1, coefficients outside [0, C] or not finite, a
    coefficient that does not match its set, a b or linear terms that are not finite, gaps
    below 0 or NaN."""
    y = np.asarray(state["y"], dtype=float)
    alpha = np.asarray(state["alpha"], dtype=float)
    if y.shape != status.shape or alpha.shape != status.shape:
        raise ValueError("the state's labels, coefficients and statuses differ in length")
    if not np.all(np.abs(y) == 1.0):
        raise ValueError(f"the state holds labels other than +1 and -1 "
                         f"({float(y[np.abs(y) != 1.0][0])!r})")
    if not np.all(np.isfinite(alpha)) or np.any(alpha < 0) or np.any(alpha > C):
        bad = alpha[~(np.isfinite(alpha) & (alpha >= 0) & (alpha <= C))][0]
        raise ValueError(f"the state holds a coefficient {float(bad)!r} outside [0, C = {C:g}]")
    if np.any(alpha[status == RESERVE] != 0) or np.any(alpha[status == ERROR] != C):
        raise ValueError("the state's coefficients do not match their sets (a reserve point's "
                         "must be 0, an error point's C)")
    if not math.isfinite(float(state["b"])):
        raise ValueError(f"the state's b is {float(state['b'])!r}")
    if "linear" in state and not np.all(np.isfinite(np.asarray(state["linear"], dtype=float))):
        raise ValueError("the state holds linear terms that are not finite")
    if "gap" in state and not np.all(np.asarray(state["gap"], dtype=float) >= 0):
        raise ValueError("the state holds gaps below 0 or NaN")


class PathEngine:
    """Exact incremental/decremental SVM solution, updated by adding and removing points.

    Points are dense rows (the caller vectorizes), labels are +1/-1, and each point has a
    hashable key, unique among the stored points.

    >>> import numpy as np
    >>> from stream_svm.kernels import make_kernel
    >>> engine = PathEngine(make_kernel("rbf", gamma=0.5), C=10.0)
    >>> X = np.array([[0.0, 0.0], [1.0, 1.0], [0.0, 1.0], [1.0, 0.0]])
    >>> stats = engine.update(X, np.array([1.0, 1.0, -1.0, -1.0]), keys=[0, 1, 2, 3])
    >>> [bool(v > 0) for v in engine.decision_function(X)]
    [True, True, False, False]
    >>> _ = engine.update(remove=[3])  # forget one point exactly
    >>> engine.n
    3
    """

    #: After an update, S's largest |g| relative to its terms (or sum y alpha's imbalance)
    #: above this is round-off the path accumulated, and S's coefficients and b are solved
    #: afresh from its sets. A path's own round-off is about |S| eps (1e-13 at |S| = 400); at
    #: 1e-9 a drift of 1.2e-10 was kept, and at C = 1e9 it moved decision values by 2.8e-7
    #: (relative) from the optimum, where a model that learned the same points afresh was
    #: within 2e-12.
    REFINE_TOL = 1e-11

    #: Set (on the instance) only while an update is retried as the last resort, judged to
    #: the round-off that copies with cancelling coefficients leave in b everywhere, not to a
    #: far point's own terms: see ``update`` and ``_net_of_copies``.
    _loose_kkt = False

    def __init__(
        self,
        kernel: Kernel,
        C: float,
        ridge: float = 0.0,
        max_breakpoints: int | None = None,
        degeneracy_tol: float = 1e-11,
        residual_tol: float = 1e-9,
        kkt_tol: float = 1e-8,
    ) -> None:
        self.kernel = kernel
        self.C = float(C)
        self.ridge = float(ridge)
        self.max_breakpoints = max_breakpoints
        self.degeneracy_tol = degeneracy_tol
        self.residual_tol = residual_tol
        self.kkt_tol = kkt_tol
        self.n = 0
        self.dim = 0
        self.b = 0.0
        self._X = np.zeros((0, 0))
        # The features feature by feature (dim x capacity), for the compiled kernel loops; kept
        # up to date in place while it belongs to this very X array (a new X drops it).
        self._XT: np.ndarray | None = None
        self._XT_of: np.ndarray | None = None
        self._y = np.zeros(0)
        # The dual's linear term of each point (see the module docstring): -1 for
        # classification, epsilon -+ the target for the two points of a regression sample.
        self._p = np.zeros(0)
        # A point's gap: the sum of the linear terms of its two sides (2 epsilon for a
        # regression sample, which is one point whose side flips; inf for classification).
        self._gap = np.zeros(0)
        self._alpha = np.zeros(0)
        self._g = np.zeros(0)
        # E's contribution to f at every stored point: sum_{j in E} C y_j K(x_i, x_j).
        self._h = np.zeros(0)
        # The size of h's terms, sum_{j in E} C |K(x_i, x_j)|, and a bound on its accumulated
        # round-off over eps: the size of every error column added to or subtracted from h since
        # it was computed afresh (columns that cancel leave their round-off behind).
        self._h_abs = np.zeros(0)
        self._h_drift = np.zeros(0)
        self._terms_cache: np.ndarray | None = None  # g_terms at the end of the last update
        self._kkt_cache: bool | None = None  # whether g then held every KKT condition
        self._status = np.zeros(0, dtype=np.int8)
        self._seq = np.zeros(0, dtype=np.int64)
        self._slot = np.zeros(0, dtype=np.int64)  # column of the point in S, or -1
        self._keys: list[Hashable] = []
        self._pos: dict[Hashable, int] = {}
        self._next_seq = 0
        # How many stored points have each row of features (by the hash of its bytes), and how
        # many repeat one stored before them: None when not known (after a rollback or a
        # change of width), counted again when next needed (``_net_of_copies``).
        self._row_counts: dict[int, int] | None = {}
        self._copies = 0
        self._margin = np.zeros(0, dtype=np.int64)  # positions of S, in factor order
        # Upper Cholesky factor of P = K_SS + t 11' in R[:k, :k], k = |S|, with room to grow.
        self._R = np.zeros((0, 0))
        self._t = 1.0
        # S's kernel columns, one contiguous row per member: _columns[store[s], i] is
        # K(x_i, x_margin[s]) for every stored point i. The rows are packed ([0, k)); a member
        # leaving S hands its row to the last one, so no other column moves.
        self._columns = np.zeros((0, 0))
        self._store = np.zeros(0, dtype=np.int64)  # row of _columns of each factor slot
        # After a rollback S's columns are recomputed when next needed (``_ensure_columns``),
        # not by the rollback itself, which must not fail halfway (a kernel can raise).
        self._columns_stale = False
        # Kernel columns of points that left S (a ring, oldest overwritten first):
        # _recent[j, i] = K(x_i, x_recent_of[j]) for every stored i, or recent_of[j] = -1.
        # Windows and streams move the same points across S's edge update after update;
        # a returning point's column is then a copy instead of n kernel evaluations.
        self._recent, self._recent_of = _empty_recent(0)
        self._recent_next = 0
        self._undo: dict | None = None  # the running update's snapshot (see update)
        self._loop_arrays: _pathcore.LoopArrays | None = None  # see _follow_path
        # Largest K(x, x) seen: the scale of kernel values. No floor: every tolerance must scale
        # with the data (features times s and C / s^2 is the same problem for a linear kernel).
        self._diag_scale = 0.0
        self._sv_cache: tuple[np.ndarray, np.ndarray] | None = None
        # A linear kernel's primal weights, with the support-vector cache they came from.
        self._weights_cache: tuple[np.ndarray, np.ndarray] | None = None
        self._rows_cache: tuple[np.ndarray, np.ndarray] | None = None  # (_support_rows)
        self.last_update = UpdateStats()
        self.breakpoints_total = 0
        self.updates_total = 0
        self.refactorizations_total = 0
        # Updates that round-off derailed and that were completed point by point, or by
        # learning their points afresh (UpdateStats.retried / .relearned): a count that grows
        # tells that the kernel matrix is near singular (standardize the features, or a ridge).
        self.retries_total = 0
        self.relearns_total = 0

    # ------------------------------------------------------------------ read-only views
    @property
    def n_margin(self) -> int:
        return int(self._margin.size)

    @property
    def n_error(self) -> int:
        return int(np.count_nonzero(self._status[: self.n] == ERROR))

    @property
    def n_reserve(self) -> int:
        return int(np.count_nonzero(self._status[: self.n] == RESERVE))

    @property
    def X(self) -> np.ndarray:
        return self._X[: self.n]

    @property
    def y(self) -> np.ndarray:
        return self._y[: self.n]

    @property
    def alpha(self) -> np.ndarray:
        return self._alpha[: self.n]

    @property
    def linear(self) -> np.ndarray:
        """The dual's linear terms p of the stored points (-1 for classification)."""
        return self._p[: self.n]

    @property
    def gap(self) -> np.ndarray:
        """The gaps of the stored points (inf for classification, see the module docstring)."""
        return self._gap[: self.n]

    @property
    def g(self) -> np.ndarray:
        """Margin values y_i f(x_i) - 1 of the stored points, as maintained by the engine."""
        return self._g[: self.n]

    @property
    def status(self) -> np.ndarray:
        return self._status[: self.n]

    @property
    def keys(self) -> list[Hashable]:
        return list(self._keys)

    @property
    def sequence(self) -> np.ndarray:
        """Insertion order of the stored points (larger = newer)."""
        return self._seq[: self.n]

    def position(self, key: Hashable) -> int:
        return self._pos[key]

    def __contains__(self, key: object) -> bool:
        if isinstance(key, (bool, np.bool_)):
            return False  # (True == 1: the point stored under 1 is not True's, which is none)
        try:
            return key in self._pos
        except TypeError:
            return False

    def first_stored(self, keys: Iterable[Hashable]) -> Hashable | None:
        """The first of ``keys`` that names a stored point, or None (one pass in C when none
        does)."""
        keys = list(keys)
        try:
            if self._pos.keys().isdisjoint(keys):
                return None
        except TypeError:  # an unhashable key names no stored point; find the others
            pass
        return next((key for key in keys if key in self), None)

    def oldest_keys(self, count: int) -> list[Hashable]:
        """Keys of the ``count`` points stored longest, oldest first (all of them when fewer
        are stored).

        >>> from stream_svm.kernels import make_kernel
        >>> engine = PathEngine(make_kernel("rbf", gamma=1.0), C=1.0)
        >>> _ = engine.update(np.array([[0.0], [1.0], [2.0]]), np.array([1.0, -1.0, 1.0]),
        ...                   keys=["a", "b", "c"])
        >>> engine.oldest_keys(2)
        ['a', 'b']
        >>> engine.update(remove=["a"]).removed, engine.oldest_keys(1)
        (1, ['b'])
        """
        n = self.n
        count = min(int(count), n)
        if count <= 0:
            return []
        sequence = self._seq[:n]
        if count == 1:  # a window sliding by one point
            return [self._keys[int(np.argmin(sequence))]]
        if count < n:  # the oldest few without sorting every point
            oldest = np.argpartition(sequence, count - 1)[:count]
            order = oldest[np.argsort(sequence[oldest], kind="stable")]
        else:
            order = np.argsort(sequence, kind="stable")
        return [self._keys[position] for position in order.tolist()]

    # ------------------------------------------------------------------ predictions
    def _support(self) -> tuple[np.ndarray, np.ndarray]:
        """The support vectors' features (|SV| x dim, a view) and coefficients alpha y."""
        features, coef = self._support_columns()
        return features[: self.dim].T, coef

    def _support_columns(self) -> tuple[np.ndarray, np.ndarray]:
        """The support vectors stored feature by feature, (dim + 1) x |SV| with a last
        feature of zeros (where a prediction folds the features no stored point has), as the
        compiled kernel loop reads them; kept until the support vectors change."""
        if self._sv_cache is None:
            sv = np.flatnonzero(self._alpha[: self.n] > 0)
            features = np.zeros((self.dim + 1, sv.size))
            features[: self.dim] = self._X[sv].T
            self._sv_cache = (features, self._alpha[sv] * self._y[sv])
        return self._sv_cache

    def _support_rows(self, features: np.ndarray) -> np.ndarray:
        """The support vectors of ``features`` (from _support_columns) row by row, contiguous,
        as a user's kernel function may expect them: kept while they are the support
        vectors (copied for every call, they cost such a prediction several times over)."""
        cached = self._rows_cache
        if cached is None or cached[0] is not features:
            rows = np.ascontiguousarray(features[:-1].T)  # (the last feature: the zeros)
            cached = self._rows_cache = (features, rows)
        return cached[1]

    def _primal_weights(self, features: np.ndarray, coef: np.ndarray) -> np.ndarray:
        """w = sum_s coef_s x_s over the support vectors (``features`` and ``coef`` from
        _support_columns), for a linear kernel (kept while they are the support vectors)."""
        cached = self._weights_cache
        if cached is None or cached[0] is not features:
            weights = np.empty(features.shape[0] - 1)
            _pathcore.rows_times(features[:-1], coef, 0.0, weights)
            cached = self._weights_cache = (features, weights)
        return cached[1]

    def decision_function(self, X: np.ndarray) -> np.ndarray:
        """f(x) for each row of X; columns beyond ``dim`` are features no stored point has."""
        X = np.atleast_2d(np.asarray(X, dtype=float))
        features, coef = self._support_columns()  # (one state's pair; not thread-safe: README)
        if coef.size == 0:
            return np.full(X.shape[0], self.b)
        kind, gamma, degree, coef0 = _compiled_kernel(self.kernel)
        if kind == _pathcore.KERNEL_LINEAR:
            # f(x) = <w, x> + b: O(dim) per point, not O(|SV| dim), by a compiled loop on this
            # thread (a threaded BLAS would leave its threads spinning beside the caller's
            # after every prediction). Features no stored point has weigh 0; missing ones read 0.
            weights = self._primal_weights(features, coef)
            width = min(X.shape[1], weights.size)
            values = np.empty(X.shape[0])
            _pathcore.rows_times(np.ascontiguousarray(X[:, :width]), weights[:width], self.b,
                                 values)
            return values
        if kind < 0:
            # A user's kernel, on rows as wide as the stored points' (a feature absent from one
            # side reads 0). Features too large for it give inf or nan here; callers check the
            # values, so numpy's overflow warnings would only be noise on every prediction.
            support = self._support_rows(features)
            if X.shape[1] > support.shape[1]:
                padding = np.zeros((support.shape[0], X.shape[1] - support.shape[1]))
                support = np.hstack([support, padding])
            if X.shape[1] < support.shape[1]:
                X = np.hstack([X, np.zeros((X.shape[0], support.shape[1] - X.shape[1]))])
            with np.errstate(over="ignore", invalid="ignore"):
                return self.kernel(X, support) @ coef + self.b
        # RBF and polynomial: the compiled kernel loop, as in training (for RBF the same
        # squared distances as SciPy's cdist, and the loop's exp), against the support vectors
        # as _support_columns keeps them (copied for every call, they cost a wide model more
        # than the kernel itself), PREDICT_CHUNK points at a time (bounded memory), on this
        # thread. Each point's sum runs over as many features as the wider side has, the other
        # side's missing ones reading 0: the same bits as on rows padded alike.
        width = max(X.shape[1], self.dim)
        if width > features.shape[0]:  # (wider than the rows predictions give: not kept)
            features = np.concatenate([features, np.zeros((width - features.shape[0],
                                                           features.shape[1]))])
        features = features[:width]
        stored = coef.size
        values = np.empty(X.shape[0])
        for start in range(0, X.shape[0], PREDICT_CHUNK):
            part = X[start : start + PREDICT_CHUNK]
            queries = np.zeros((width, part.shape[0]))
            queries[: part.shape[1]] = part.T
            at = np.arange(part.shape[0])
            block = _compiled_block(kind, gamma, degree, coef0, features, stored, at,
                                    queries=queries)
            _pathcore.rows_times(block.T, coef, self.b, values[start : start + part.shape[0]])
        return values

    def dual_objective(self) -> float:
        """1/2 a'Ka + p'alpha with a = y * alpha (the quantity the dual minimizes; p = -1 for
        classification: 1/2 a'Ka - sum(alpha))."""
        sv = np.flatnonzero(self._alpha[: self.n] > 0)
        a = self._alpha[sv] * self._y[sv]
        K = self.kernel(self._X[sv], self._X[sv]) + self.ridge * np.eye(sv.size)
        return float(0.5 * a @ K @ a + self._p[sv] @ self._alpha[sv])

    # ------------------------------------------------------------------ storage helpers
    def ensure_dim(self, dim: int) -> None:
        """Widen stored vectors to ``dim`` features (new features read 0 for old points)."""
        if dim > self.dim:
            self._X = np.hstack([self._X, np.zeros((self._X.shape[0], dim - self.dim))])
            self.dim = dim
            self._sv_cache = None
            self._row_counts = None  # (the rows' bytes changed)
            if not getattr(self.kernel, "folds_absent_features", False):
                # A user's kernel may see the new zeros (the built-in ones do not): its
                # values, and with them the last check, may no longer hold.
                self._forget_recent()
                self._terms_cache = self._kkt_cache = None

    def keep_columns(self, columns: np.ndarray) -> None:
        """Keep only the given (increasing) feature columns of the stored points.

        The columns dropped must be 0 in every stored point (ValueError otherwise, engine
        unchanged): a kernel that depends on its arguments only through dot products and
        distances (every built-in one) then gives the same values, so the solution stands.
        """
        columns = np.asarray(columns, dtype=np.int64)
        dropped = np.setdiff1d(np.arange(self.dim), columns)
        if columns.size and (columns.min() < 0 or columns.max() >= self.dim):
            raise ValueError(f"columns must lie in [0, {self.dim})")
        if dropped.size and np.any(self._X[: self.n, dropped]):
            raise ValueError("only columns that are 0 in every stored point can be dropped")
        self._X = np.ascontiguousarray(self._X[:, columns])
        self.dim = int(columns.size)
        self._columns_changed()

    def widen_columns(self, columns: np.ndarray, dim: int) -> None:
        """Undo :meth:`keep_columns` ``(columns)`` of a layout ``dim`` wide: the dropped
        columns come back as zeros (the solution stands, as it did when they were dropped)."""
        columns = np.asarray(columns, dtype=np.int64)
        if columns.size != self.dim or (columns.size and columns.max() >= dim):
            raise ValueError(f"{columns.size} columns kept of {dim} do not describe the "
                             f"{self.dim} stored")
        X = np.zeros((self._X.shape[0], dim))
        X[:, columns] = self._X[:, : self.dim]
        self._X = X
        self.dim = int(dim)
        self._columns_changed()

    def _columns_changed(self) -> None:
        """After the stored points' feature columns changed (all-zero ones dropped or put
        back): the caches of the rows go. The last KKT check's stands for the built-in
        kernels, whose values do not see such columns (kept, a refused call that dropped and
        put them back leaves no trace); a user's kernel may see them."""
        self._sv_cache = None
        self._row_counts = None
        self._forget_recent()
        if not getattr(self.kernel, "folds_absent_features", False):
            self._terms_cache = self._kkt_cache = None

    def _reserve_rows(self, rows: int) -> None:
        capacity = self._X.shape[0]
        if rows <= capacity:
            return
        # An eighth more than asked: a model trained on a batch, then slid by a few points
        # (a window's first step), does not copy every array again at once.
        new_cap = max(rows + rows // 8, 2 * capacity, 16)

        def grow(array: np.ndarray, fill: float = 0.0) -> np.ndarray:
            shape = (new_cap, *array.shape[1:])
            out = np.full(shape, fill, dtype=array.dtype)
            out[: array.shape[0]] = array
            return out

        # Every array is made first and swapped in by one dict update: an interrupt (Ctrl-C)
        # between two assignments left arrays of two capacities, which the compiled loops
        # (without bounds checks) then wrote past.
        grown: dict[str, Any] = {name: grow(getattr(self, name)) for name in (
            "_X", "_y", "_p", "_gap", "_alpha", "_g", "_h", "_h_abs", "_h_drift", "_status",
            "_seq")}
        grown["_slot"] = grow(self._slot, -1)
        columns = np.zeros((self._columns.shape[0], new_cap))
        columns[:, : self._columns.shape[1]] = self._columns
        grown["_columns"] = columns
        # The newest recent columns that fit the new capacity's budget are kept.
        recent, recent_of = _empty_recent(new_cap)
        count, old = recent_of.size, self._recent_of.size
        oldest_first = [(self._recent_next + j) % old for j in range(old)][-count:]
        kept = len(oldest_first)
        width = min(new_cap, self._recent.shape[1])  # a restored snapshot's X can be narrower
        recent[:kept, :width] = self._recent[oldest_first, :width]
        recent_of[:kept] = self._recent_of[oldest_first]
        grown.update(_recent=recent, _recent_of=recent_of, _recent_next=kept % count)
        self.__dict__.update(grown)

    def __getstate__(self) -> dict:
        # Copies and pickles leave the recent columns behind (a cache, up to 512 KB).
        state = self.__dict__.copy()
        state["_recent"] = state["_recent_of"] = None
        state["_XT"] = state["_XT_of"] = None  # rebuilt from X when next needed
        state["_undo"] = state["_loop_arrays"] = state["_weights_cache"] = None
        state["_sv_cache"] = state["_rows_cache"] = None  # (taken again from X when needed)
        state["_row_counts"] = None  # (hashes are salted per process: counted afresh)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.__dict__.setdefault("_columns_stale", False)
        self.__dict__.setdefault("_XT", None)
        self.__dict__.setdefault("_XT_of", None)
        self.__dict__.setdefault("_undo", None)
        self.__dict__.pop("_scratch", None)  # (scratch of older versions)
        self.__dict__.setdefault("_loop_arrays", None)
        self.__dict__.setdefault("_weights_cache", None)
        # Older versions pickled the support vectors row by row: taken again from X.
        self._sv_cache = self._rows_cache = None
        self.__dict__.setdefault("_row_counts", None)  # (states of older versions)
        self.__dict__.setdefault("_copies", 0)
        # Counters added after the first release: an older pickle counts from its loading on.
        self.__dict__.setdefault("retries_total", 0)
        self.__dict__.setdefault("relearns_total", 0)
        if self.__dict__.get("_recent") is None:
            self._recent, self._recent_of = _empty_recent(self._X.shape[0])
            self._recent_next = 0

    def _ensure_columns(self) -> None:
        """S's kernel columns, recomputed if a rollback left them stale (the engine stays
        stale, and correct, if the kernel raises here)."""
        if self._columns_stale:
            k = self._margin.size
            self._columns[self._store[:k], : self.n] = self._kernel_columns(self._margin).T
            self._columns_stale = False

    def _forget_recent(self) -> None:
        """Drop the recent columns (after the points' positions or features changed)."""
        self._recent_of[:] = -1

    def _reserve_margin(self, members: int) -> None:
        """Room for ``members`` points in S: the factor, the kernel columns and the row map,
        grown geometrically (never per entry)."""
        capacity = self._R.shape[0]
        if members <= capacity:
            return
        new_cap = max(members, 2 * capacity, 8)
        R = np.zeros((new_cap, new_cap))
        R[:capacity, :capacity] = self._R
        columns = np.zeros((new_cap, self._columns.shape[1]))
        columns[:capacity] = self._columns
        store = np.zeros(new_cap, dtype=np.int64)
        store[:capacity] = self._store
        self.__dict__.update(_R=R, _columns=columns, _store=store)  # (at once: see _reserve_rows)

    def _features_by_column(self) -> np.ndarray:
        """The stored points' features, one contiguous row per feature (the compiled kernel
        loops run over the points; positions and features stay fixed during an update): the
        copy kept with X, dim x capacity, whose columns from n on are unused. Transposing X
        anew cost 30-70 us per update."""
        if self._XT is None or self._XT_of is not self._X:
            self._XT = np.ascontiguousarray(self._X.T)
            self._XT_of = self._X
        return self._XT

    def _kernel_columns(self, positions: np.ndarray, features: np.ndarray | None = None,
                        out: np.ndarray | None = None) -> np.ndarray:
        """K(x_i, x_p) + ridge [i == p] for all stored i and the given positions p (``features``:
        ``_features_by_column()`` when the caller has it), n x m; with ``out`` (m x n, C order)
        the columns are its rows."""
        positions = np.asarray(positions, dtype=np.int64)
        starts = None
        if positions.size > 1 and _pathcore.has_repeats(self._X, positions):
            # A point equal to the one before it in the list (the two points of a regression
            # sample) has the same kernel column: each run of equal points is computed once.
            repeats = np.all(self._X[positions[1:]] == self._X[positions[:-1]], axis=1)
            starts = np.concatenate([[True], ~repeats])
        if starts is None:
            columns = self._kernel_block(positions, features, out)
        else:
            columns = self._kernel_block(positions[starts], features)[:, np.cumsum(starts) - 1]
            if out is not None:
                out[:] = columns.T
                columns = out.T
        if not self.kernel.finite_values:
            _check_kernel_finite(columns)
        if self.ridge:
            columns[positions, np.arange(positions.size)] += self.ridge
        return columns

    def _kernel_rows(self, rows: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """K(x_r, x_p) + ridge [r == p] for the given stored rows r and positions p (the same
        values as the full columns have at those rows)."""
        kind, gamma, degree, coef0 = _compiled_kernel(self.kernel)
        if kind >= 0:
            # The rows' and the positions' features only, the positions' after the rows'.
            features = np.ascontiguousarray(self._X[np.concatenate([rows, positions])].T)
            at = np.arange(rows.size, rows.size + positions.size)
            block = _compiled_block(kind, gamma, degree, coef0, features, rows.size, at)
        else:
            with np.errstate(over="ignore", invalid="ignore"):
                block = self.kernel(self._X[rows], self._X[positions])
        if not self.kernel.finite_values:
            _check_kernel_finite(block)
        if self.ridge:
            block[rows[:, None] == positions[None, :]] += self.ridge
        return block

    def _kernel_block(self, positions: np.ndarray, features: np.ndarray | None,
                      out: np.ndarray | None = None) -> np.ndarray:
        """K(x_i, x_p) for all stored i and the given positions p, without the ridge (n x m;
        with ``out``, m x n in C order, a view of it)."""
        n = self.n
        kind, gamma, degree, coef0 = _compiled_kernel(self.kernel)
        # Compiled, one contiguous column per position, for every kernel it knows: a point's
        # column then has the same bits however many are computed with it, so that S's
        # columns recomputed after a rollback are those the model had (BLAS's blocked sums
        # differ in the last bits, and the model's later updates would differ from those of
        # the model that never saw the refused update). The compiled loop is faster than
        # numpy for polynomial kernels (0.2x-0.9x the time, one BLAS thread) and within 1.4x
        # for linear ones, except large blocks of many features, which BLAS's blocking reads
        # far fewer times (3.9x at 1000 columns of 5000 points and 200 features): there, S's
        # columns recomputed after a rollback may differ in their last bits from those the
        # model had (as exact; a review saw alpha 1.4e-17 from the twin's at 80 features).
        if kind >= 0 and not (kind == _pathcore.KERNEL_LINEAR and positions.size >= 64
                              and self.dim >= 64):
            features = self._features_by_column() if features is None else features
            return _compiled_block(kind, gamma, degree, coef0, features, n, positions, out)
        with np.errstate(over="ignore", invalid="ignore"):
            block = self.kernel(self._X[:n], self._X[positions])
        if out is None:
            return block
        out[:] = block.T
        return out.T

    # ------------------------------------------------------------------ margin set
    def _shift(self, diag_max: float) -> float:
        """The t of P = K_SS + t 11': on the scale of the kernel values, never 0."""
        t = max(diag_max, self._diag_scale)
        # Only a kernel that is 0 on every point seen (linear, all points at the origin) has no
        # scale; then K_SS = 0 and any t factors P exactly.
        return t if t > 0 else 1.0

    def _factorize(self, own_scale: bool = False) -> None:
        """Factor P = K_SS + t 11' afresh from S's cached kernel columns; with ``own_scale``,
        t on the scale of K_SS alone (not of every stored point: see :meth:`set_state`)."""
        self._ensure_columns()
        k = self._margin.size
        # K_SS[a, b] = K(x_margin[a], x_margin[b]), read from member b's column.
        K_SS = self._columns[self._store[:k]][:, self._margin].T
        diag_max = float(np.max(np.diag(K_SS)))
        t = (diag_max if diag_max > 0 else 1.0) if own_scale else self._shift(diag_max)
        factor = cholesky(K_SS + t, lower=False, check_finite=False)
        self._t = t
        self._R[:k, :k] = factor

    def _margin_remove(self, slot: int, out: np.ndarray | None = None) -> np.ndarray:
        """Remove S's member at ``slot``; returns its kernel column (the compiled loop's own
        removal: Givens rotations on the factor, the last packed column takes its row), in
        ``out`` when given."""
        n = self.n
        column = np.empty(n) if out is None else out
        _pathcore.margin_remove(self._R, self._columns, self._margin, self._store, self._slot,
                                n, slot, column)
        self._margin = self._margin[:-1].copy()
        return column

    def _solve(self, r: np.ndarray, s: float) -> tuple[np.ndarray, float]:
        """Solve K_SS beta + db 1 = r, 1' beta = s through the factor of K_SS + t 11'."""
        k = self._margin.size
        R = self._R[:k, :k]
        u = dpotrs(R.T, np.ones(k), lower=1)[0]
        v = dpotrs(R.T, r, lower=1)[0]
        # A kernel of 1e-320 (features of 1e-160) overflows the solves: the result is not
        # finite, which the KKT check after it refuses; numpy's warning would only be noise.
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            shifted_db = (v.sum() - s) / u.sum()
            return v - u * shifted_db, shifted_db + self._t * s

    def refactorize(self) -> None:
        """Factorize the margin system afresh and re-solve alpha_S and b from it.

        The margin coefficients follow from S's equations given alpha_E = C; recomputing them
        removes whatever round-off the incremental updates accumulated.
        """
        self._terms_cache = None
        self._kkt_cache = None
        n, k = self.n, self._margin.size
        if k:
            margin = self._margin
            self._factorize()
            error = np.flatnonzero(self._status[:n] == ERROR)
            # S's equations y_s f(x_s) + p_s = 0, i.e. f(x_s) = -p_s y_s (y = +1 or -1).
            a_S, b = self._solve(
                -self._p[margin] * self._y[margin] - self._h[margin],
                -self.C * self._y[error].sum(),
            )
            self._alpha[margin] = np.clip(self._y[margin] * a_S, 0.0, self.C)
            self.b = b
        self._refresh_g()
        self.refactorizations_total += 1
        self._sv_cache = None

    def _refresh_g(self, g: np.ndarray | None = None
                   ) -> tuple[np.ndarray, float, bool, bool, float]:
        """Recompute g (into ``g``, by default the engine's own) from alpha, b and h, with the
        size of its terms, in one compiled pass over S's kernel columns; returns (terms, S's
        largest |g| relative to its terms, whether every KKT condition holds to kkt_tol
        relative to the terms, whether h's accumulated round-off may matter, |sum y alpha| relative
        to sum alpha, as ``_relative_imbalance``)."""
        self._ensure_columns()
        n = self.n
        terms = np.empty(n)
        if n == 0:  # nothing stored: nothing to refresh (and no buffer to view)
            return terms, 0.0, True, False, 0.0
        residual, kkt_ok, h_stale, balance = _pathcore.refresh_g(
            self._columns, self._store, n, self._margin, self._y, self._p, self._gap,
            self._alpha, self._status, self._h, self._h_abs, self._h_drift, self.b, self.kkt_tol,
            self._g if g is None else g, terms)
        return terms, residual, kkt_ok, h_stale, balance

    def recompute_error_contributions(self) -> None:
        """Recompute E's contribution to f from the kernel (clears accumulated round-off)."""
        n = self.n
        error = np.flatnonzero(self._status[:n] == ERROR)
        self._h[:n] = 0.0
        self._h_abs[:n] = 0.0
        for start in range(0, error.size, 512):
            chunk = error[start : start + 512]
            columns = self._kernel_columns(chunk)
            self._h[:n] += columns @ (self.C * self._y[chunk])
            self._h_abs[:n] += np.abs(columns).sum(axis=1) * self.C
        self._h_drift[:n] = 0.0
        self.refactorize()

    def _move_error_columns(self, columns: np.ndarray, labels: np.ndarray, joining: bool) -> None:
        """Add (points joining E) or subtract (points leaving E) their contributions
        C y_j K(., x_j) to h, keeping h's size and its round-off bound up to date (``columns``:
        the points' kernel columns, n x m or one of length n)."""
        n = self.n
        block = np.ascontiguousarray(columns.reshape(n, -1).T)  # no copy for _kernel_columns'
        _pathcore.move_error_columns(block, np.ascontiguousarray(labels, dtype=float), self.C,
                                     joining, n, self._h, self._h_abs, self._h_drift)

    def g_terms(self) -> np.ndarray:
        """For each stored point, the magnitude of the terms summed into g_i = y_i f(x_i) - 1:
        1 + |b| + sum_j alpha_j |K(x_i, x_j)|.

        g is dimensionless, but computing it loses eps times this (invariant when features scale
        by s and C by 1/s^2): with overlapping classes at a large C * K the terms of f are huge
        and cancel, and no absolute bound on g is attainable. Tolerances on g are relative to it.
        """
        return self._refresh_g(np.empty(self.n))[0]

    def _count_rows(self) -> None:
        """Count the stored rows afresh (``_row_counts``, ``_copies``)."""
        counts: dict[int, int] = {}
        for key in _row_hashes(self._X[: self.n, : self.dim]):
            counts[key] = counts.get(key, 0) + 1
        self._row_counts = counts
        self._copies = self.n - len(counts)

    def _has_copies(self) -> bool:
        """Whether two stored points share their features (counted afresh if not known)."""
        if self._row_counts is None:
            self._count_rows()
        return self._copies > 0

    def _net_of_copies(self, terms: np.ndarray, violation: np.ndarray | None = None,
                       spread: bool = True) -> np.ndarray:
        """``terms`` (``g_terms``) less what copies of one x cancel: the terms count
        alpha_j |K(x_i, x_j)| for every coefficient, but copies of one x whose y alpha have
        opposite signs (under both labels, or a regression sample's copies on both sides of
        the tube) add up to their net coefficient in every f. Two such copies held at C add
        2 C K to the terms and nothing to f: at C K ~ 1e10 a path 2e-6 off (decision values
        3e-5 off) passed a check relative to the gross terms.

        Not below |p| + |b|, nor below ROUNDOFF_MARGIN eps times the gross terms (what the
        sums computing g lose), nor, with ``spread``, below SPREAD_MARGIN eps times the
        cancelled coefficients times the kernel's scale (the round-off the copies leave in b
        and in their net coefficients, which reaches points far from them); never above the
        gross terms. ``_run_update`` solves a path that fails the check without the spread
        afresh from its sets; the update's KKT check then holds it to these terms.

        Returns ``terms`` itself when no coefficients cancel; at once when no two stored points
        share their features (the common case: the stored rows are counted as they come and
        go), or when the points' ``violation`` (``_violations``) hold their conditions to the
        smallest terms there can be (an exact solution's do: the copies cannot matter)."""
        n = self.n
        if not self._has_copies():
            return terms
        # Not below what the sums that compute g lose to round-off (eps times the gross terms,
        # times the margin the path's own noise floors allow), nor below |p| + |b|.
        floor = np.maximum(np.abs(self._p[:n]) + abs(self.b),
                           ROUNDOFF_MARGIN * _EPS / self.kkt_tol * terms)
        if violation is not None and np.all(violation <= self.kkt_tol * floor):
            return terms
        held = np.flatnonzero(self._alpha[:n] > 0.0)
        if held.size < 2:
            return terms
        stored, distinct = _equal_rows(self._X[:n, : self.dim])
        groups = distinct.size
        coefficients = self._alpha[held]
        gross = np.bincount(stored[held], coefficients, groups)
        net = np.abs(np.bincount(stored[held], coefficients * self._y[held], groups))
        cancelled = gross - net
        cancelling = np.flatnonzero(cancelled > 1e-12 * gross)
        if not cancelling.size:
            return terms
        representatives = distinct[cancelling]  # (any copy stands for its row)
        if 2 * groups <= n:
            # |K| at each distinct row, spread to its copies: the points repeat few rows
            # (integer or categorical features, where copies are common).
            block = self._kernel_rows(distinct, representatives)
            if self.ridge:  # (the ridge is each point's own: copies do not share it)
                block[distinct[:, None] == representatives[None, :]] -= self.ridge
            cancelled_terms = (np.abs(block) @ cancelled[cancelling])[stored]
        else:
            columns = self._kernel_columns(representatives).reshape(n, -1)
            if self.ridge:
                columns[representatives, np.arange(representatives.size)] -= self.ridge
            cancelled_terms = np.abs(columns) @ cancelled[cancelling]
        # Nor below what the copies' own round-off leaves everywhere: their net coefficients,
        # and through sum(y alpha) = 0 b, are known to eps times the coefficients that cancel,
        # which moves f by that times K even at points far from the copies (whose own terms
        # are small: held to them, windows over such copies refused update after update).
        spread_floor = SPREAD_MARGIN * _EPS / self.kkt_tol * float(
            cancelled[cancelling].sum()) * self._diag_scale
        net = np.maximum(terms - cancelled_terms, floor)
        if spread and self._loose_kkt:
            # The last resort (see update): the round-off the copies leave in b reaches every
            # g whatever its own terms, even above them.
            return np.maximum(np.minimum(net, terms), spread_floor)
        # (never above the terms themselves: no looser than counting every coefficient)
        return np.minimum(np.maximum(net, spread_floor), terms) if spread else net

    def residual(self, terms: np.ndarray | None = None) -> float:
        """Largest violation of S's equalities, relative: |g_S| to its terms (``g_terms``, or
        the ``terms`` given) and |sum y alpha| to C."""
        n = self.n
        margin = self._margin
        worst = abs(float(self._y[:n] @ self._alpha[:n])) / self.C
        if margin.size:
            terms = self.g_terms() if terms is None else terms
            relative = np.abs(self._g[margin]) / terms[margin]
            worst = max(worst, float(relative.max()))
        return worst

    # ------------------------------------------------------------------ snapshots
    def _snapshot(self, with_columns: bool = False, with_rows: bool = True) -> dict:
        """Everything an update changes, to roll it back. S's kernel columns (k x n, the
        largest part) are recomputed after a rollback unless ``with_columns``: updates rarely
        roll back, leave-one-out rolls back after every point. A user's kernel (which may
        raise, or be slow) has them copied too. Without ``with_rows`` the points' features,
        keys and sequence numbers are left out: an update that only appends points leaves
        them in place (``_delete_positions`` adds them before it moves any)."""
        with_columns = with_columns or _compiled_kernel(self.kernel)[0] < 0
        if with_columns:
            self._ensure_columns()
        n, k = self.n, self._margin.size
        return {
            "n": n,
            "dim": self.dim,
            "b": self.b,
            "X": self._X[:n].copy() if with_rows else None,
            "y": self._y[:n].copy(),
            "linear": self._p[:n].copy(),
            "gap": self._gap[:n].copy(),
            "alpha": self._alpha[:n].copy(),
            "g": self._g[:n].copy(),
            "h": self._h[:n].copy(),
            "h_abs": self._h_abs[:n].copy(),
            "h_drift": self._h_drift[:n].copy(),
            "status": self._status[:n].copy(),
            "seq": self._seq[:n].copy() if with_rows else None,
            "slot": self._slot[:n].copy(),
            # The key -> position map follows from the keys: rebuilt on restore (rare) rather
            # than copied on every update.
            "keys": self._keys[:n] if with_rows else None,
            "next_seq": self._next_seq,
            "margin": self._margin.copy(),
            "R": self._R[:k, :k].copy(),
            "t": self._t,
            "columns": self._columns[:k, :n].copy() if with_columns else None,
            "store": self._store[:k].copy(),
            "diag_scale": self._diag_scale,
            "caches": self._caches(),
        }

    def _restore(self, snap: dict) -> None:
        # Copies, so that the snapshot survives whatever is done after restoring it (an update
        # retried from it, or several leave-one-out runs). No kernel is evaluated here.
        # Positions may have moved since the snapshot: its recent columns no longer apply.
        self._forget_recent()
        n = snap["n"]
        per_point = [("_y", "y"), ("_p", "linear"), ("_gap", "gap"), ("_alpha", "alpha"),
                     ("_g", "g"), ("_h", "h"), ("_h_abs", "h_abs"), ("_h_drift", "h_drift"),
                     ("_status", "status"), ("_slot", "slot")]
        if snap["X"] is None:
            # The rows before n are in place (features, keys, sequence numbers, and the arrays'
            # room): drop the points appended since, copy the rest back into place.
            for key in self._keys[n:]:
                del self._pos[key]
            del self._keys[n:]
            for attribute, name in per_point:
                getattr(self, attribute)[:n] = snap[name]
        else:
            self._X = snap["X"].copy()
            self._seq = snap["seq"].copy()
            self._keys = list(snap["keys"])
            self._pos = {key: position for position, key in enumerate(self._keys)}
            for attribute, name in per_point:
                setattr(self, attribute, snap[name].copy())
        self.n = n
        self.dim = snap["dim"]
        self.b = snap["b"]
        self._next_seq = snap["next_seq"]
        self._margin = snap["margin"].copy()
        k, n = self._margin.size, self.n
        capacity = max(k, 8)
        self._R = np.zeros((capacity, capacity))
        self._R[:k, :k] = snap["R"]
        self._t = snap["t"]
        self._columns = np.zeros((capacity, self._X.shape[0]))
        self._store = np.zeros(capacity, dtype=np.int64)
        self._store[:k] = snap["store"]
        if snap["columns"] is not None:
            self._columns[:k, :n] = snap["columns"]
        self._columns_stale = snap["columns"] is None and k > 0
        self._diag_scale = snap["diag_scale"]
        self._terms_cache, self._kkt_cache, self._sv_cache = snap["caches"]
        self._row_counts = None  # (counted again when needed: the same counts)

    # ------------------------------------------------------------------ updates
    def update(
        self,
        X_add: np.ndarray | None = None,
        y_add: np.ndarray | None = None,
        keys: Sequence[Hashable] | None = None,
        remove: Sequence[Hashable] = (),
        linear: np.ndarray | None = None,
        gap: np.ndarray | None = None,
    ) -> UpdateStats:
        """Add the rows of ``X_add`` (labels ``y_add``, keys ``keys``) and remove the stored
        points named in ``remove``, in one exact path. Returns (and stores in
        ``last_update``) the update's statistics.

        ``linear`` gives the new points' linear terms p of the dual (default -1 each: the
        classification SVM) and ``gap`` their gaps (default inf; a regression sample is one
        point with gap 2 epsilon, see the module docstring).

        Raises KeyError for an unknown or duplicate key, ValueError for malformed arrays, and
        ConvergenceError when the path needs more than ``max_breakpoints`` breakpoints; in every
        case the engine is left exactly as it was, its counters included.
        """
        # (The refactorizations of the attempts a refused update made are no work of the
        # engine's: the state they went to is gone.)
        saved = self.counters()
        try:
            return self._update(X_add, y_add, keys, remove, linear, gap)
        except BaseException:
            self.set_counters(saved)
            raise

    def _update(self, X_add: np.ndarray | None, y_add: np.ndarray | None,
                keys: Sequence[Hashable] | None, remove: Sequence[Hashable],
                linear: np.ndarray | None, gap: np.ndarray | None) -> UpdateStats:
        """:meth:`update`, but for its counters when it is refused."""
        started = time.perf_counter()
        remove = key_list(remove, "remove")
        X_add, y_add, keys, linear, gap = self._check_update(X_add, y_add, keys, remove,
                                                             linear, gap)
        if not remove and not X_add.shape[0]:
            # Nothing to add or remove (an empty batch): no update, counted or timed; the
            # statistics of the last one stay.
            return UpdateStats()
        stored_before = self.n
        if remove or X_add.shape[1] > self.dim:
            self._undo = self._snapshot()
        else:
            # Points are only added: until a stored point changes (a path, b centered, g
            # refreshed), undoing is forgetting the new ones, and the copies of the whole
            # state (O(n) per update) are made only then (_before_change). Most updates of a
            # stream add one point that lands in the reserve set: they copy nothing.
            self._undo = self._light_snapshot()
        try:
            self.ensure_dim(X_add.shape[1])
            try:
                stats = self._run_update(X_add, y_add, keys, remove, linear, gap)
                derailed = not self._kkt_holds()
            except (ConvergenceError, np.linalg.LinAlgError):  # (a factor refused on round-off)
                derailed = True
            if derailed:
                # Round-off derailed the path (numerically singular kernels, degenerate data):
                # go again from the snapshot, its error contributions and factor computed
                # afresh (their accumulated round-off may be what derailed it), one point at a
                # time: the single-point path of the same engine.
                self._roll_back()
                self._before_change()  # the state is the one before the update again
                self.ensure_dim(X_add.shape[1])
                try:
                    if self.n:
                        self.recompute_error_contributions()
                    stats = self._one_at_a_time(X_add, y_add, keys, remove, linear, gap)
                except (_Derailed, np.linalg.LinAlgError) as exc:
                    if not stored_before:  # learning afresh is what failed
                        if isinstance(exc, _Derailed):
                            raise
                        raise _Derailed(
                            "round-off derailed the update (the margin set's kernel matrix is "
                            "not positive definite to working precision: try "
                            f"{self._remedy()}); the model is unchanged") from None
                    # The round-off of the state itself may be what derails every path from
                    # it: coefficients and g carry the round-off of terms far larger than
                    # theirs (a point at 1e5 under a linear kernel, since forgotten), and a
                    # window whose oldest point could not be removed stayed stuck on it.
                    # The points the update leaves stored, learned afresh, have no such past.
                    self._roll_back()
                    self._before_change()
                    self.ensure_dim(X_add.shape[1])
                    stats = self._relearn(X_add, y_add, keys, remove, linear, gap)
        except _Derailed as exc:
            self._roll_back()
            if "max_breakpoints" in str(exc):
                raise ConvergenceError(str(exc)) from None  # (the public class, by name too)
            if self._loose_kkt:
                raise ConvergenceError(str(exc) + self._range_hint()) from None
            derailed_by = str(exc) + self._range_hint()
        except ConvergenceError as exc:
            self._roll_back()
            hint = "" if "max_breakpoints" in str(exc) else self._range_hint()
            if hint and hint not in str(exc):
                raise type(exc)(str(exc) + hint) from None
            raise
        except BaseException:
            self._roll_back()
            raise
        else:
            derailed_by = None
        finally:
            self._undo = None
        if derailed_by is not None:
            return self._update_loosely(derailed_by, X_add, y_add, keys, remove, linear, gap)
        stats.seconds = time.perf_counter() - started
        self.last_update = stats
        self.breakpoints_total += stats.breakpoints
        self.updates_total += 1
        self.retries_total += stats.retried
        self.relearns_total += stats.relearned
        return stats

    def _update_loosely(self, derailed_by: str, X_add, y_add, keys, remove, linear,
                        gap) -> UpdateStats:
        """The last resort of an update that every path refused (the path, one point at a
        time, and learned afresh): the same update again (which fails again unless stored
        points share their features), each point's KKT condition judged to at least the
        round-off that copies with cancelling coefficients leave in b (``_net_of_copies``),
        which reaches points far from them whose own terms are far smaller. Regression
        samples repeated at epsilon 0 and a C far above the targets end on either side of
        the tube at C: learning them was refused every way ("the kernel matrix is
        numerically singular", of a kernel of condition number 3.4), and a window stayed
        blocked slide after slide. Raises the ConvergenceError of ``derailed_by`` when this
        fails too; the engine is unchanged."""
        self._loose_kkt = True
        try:
            stats = self.update(X_add, y_add, keys, remove, linear, gap)
        except ConvergenceError:
            raise ConvergenceError(derailed_by) from None
        finally:
            self.__dict__.pop("_loose_kkt", None)  # (a relearn copies the fresh engine's)
        stats.relaxed = True
        return stats

    def _relearn(self, X_add, y_add, keys, remove, linear, gap) -> UpdateStats:
        """The update's outcome learned afresh: the points it leaves stored (the stored ones
        but the removed, in their order, then the new ones) added to an empty engine of the
        same settings in one update, whose state then becomes this engine's, with the points'
        sequence numbers as an incremental update would have given them. Raises the derailed
        update's ConvergenceError again when that fails too, or when there are more than
        RELEARN_MAX_POINTS points."""
        n = self.n
        gone = np.array([self._pos[key] for key in remove], dtype=np.int64)
        keep = np.setdiff1d(np.arange(n), gone)
        keep = keep[np.argsort(self._seq[keep], kind="stable")]
        if keep.size + len(keys) > RELEARN_MAX_POINTS:
            raise _Derailed(
                f"round-off derailed the update, and its {keep.size + len(keys)} points are too "
                f"many to learn afresh (at most RELEARN_MAX_POINTS = {RELEARN_MAX_POINTS}); the "
                "model is unchanged"
            )
        new = np.zeros((len(keys), self.dim))
        new[:, : X_add.shape[1]] = X_add
        fresh = PathEngine(self.kernel, self.C, self.ridge, self.max_breakpoints,
                           self.degeneracy_tol, self.residual_tol, self.kkt_tol)
        if self._loose_kkt:
            fresh._loose_kkt = True
        try:
            stats = fresh.update(
                np.vstack([self._X[keep, : self.dim], new]),
                np.concatenate([self._y[keep], y_add]),
                [self._keys[i] for i in keep] + list(keys),
                linear=np.concatenate([self._p[keep], linear]),
                gap=np.concatenate([self._gap[keep], gap]),
            )
        except (ConvergenceError, np.linalg.LinAlgError) as exc:
            cause = f"the kernel matrix is numerically singular: try {self._remedy()}"
            if "max_breakpoints" in str(exc):  # the limit, not round-off, stopped it
                cause = str(exc).removesuffix("; the model is unchanged")
            raise _Derailed(
                f"round-off derailed the update, and learning its {keep.size + len(keys)} "
                f"points afresh failed too ({cause}); the model is unchanged"
            ) from None
        # The fresh engine numbered the points in the order given (its own retries keep the
        # numbers, though not always the positions): give them this engine's numbers.
        sequence = np.concatenate([self._seq[keep], self._next_seq + np.arange(len(keys))])
        fresh._seq[: fresh.n] = sequence[fresh._seq[: fresh.n]]
        fresh._next_seq = self._next_seq + len(keys)
        kept = {name: self.__dict__[name] for name in
                ("last_update", "breakpoints_total", "updates_total", "refactorizations_total",
                 "retries_total", "relearns_total", "_undo")}
        kept["refactorizations_total"] += fresh.refactorizations_total
        self.__dict__.update(fresh.__dict__)
        self.__dict__.update(kept)
        stats.added, stats.removed = len(keys), len(remove)
        stats.retried = stats.relearned = True
        stats.count("removed", len(remove))
        return stats

    def _one_at_a_time(self, X_add, y_add, keys, remove, linear, gap) -> UpdateStats:
        total = UpdateStats(added=len(keys), removed=len(remove), retried=True)
        steps = [([], [], [], [key], [], []) for key in remove]
        steps += [(X_add[i : i + 1], y_add[i : i + 1], [key], [], linear[i : i + 1],
                   gap[i : i + 1]) for i, key in enumerate(keys)]
        for X_one, y_one, key_one, remove_one, linear_one, gap_one in steps:
            if len(key_one):
                stats = self._run_update(X_one, y_one, key_one, remove_one, linear_one,
                                         gap_one)
            else:
                stats = self._run_update(np.zeros((0, self.dim)), np.zeros(0), [], remove_one)
            total.absorb(stats)
            if not self._kkt_holds() and not self._repair(total):
                violation = self.kkt_violation()
                raise _Derailed(
                    f"round-off derailed the update (KKT violation {violation:.3g}; the kernel "
                    f"matrix is numerically singular: try {self._remedy()}); the model is "
                    "unchanged"
                )
        return total

    def _range_hint(self) -> str:
        """What a refusal adds where C times the kernel's scale, summed over the stored points,
        leaves float64's sums no room (C = 1e300 on features of 1e4 under a linear kernel:
        "the margin set is empty", or a singular kernel matrix, named no cause)."""
        reach = self.C * self._diag_scale
        # (Sums over the stored points of up to C times the kernel's scale each: within a
        # factor of 1e8 of float64's largest, no cause of its own left. A large kernel value
        # at a moderate C is the features' scale, which the remedy names.)
        if not reach * max(self.n, 1) > 1e300:
            return ""
        return (f" (C * K(x, x) reaches {reach:.0e}: sums of coefficients times kernel "
                "values leave float64's range; lower C)")

    def _remedy(self) -> str:
        # (A larger gamma brings an RBF kernel matrix nearer the identity; a polynomial one
        # is singular through its finite rank or through the size of gamma <x, x'>, which a
        # larger gamma makes worse.)
        if isinstance(self.kernel, RBFKernel):
            return "a larger gamma or a ridge"
        if isinstance(self.kernel, PolynomialKernel):
            return "a ridge, or features scaled so that gamma <x, x'> is about 1"
        return "a ridge"

    def _violators(self) -> np.ndarray:
        """Positions whose KKT condition fails (relative to their terms, as in ``_kkt_holds``)."""
        violation = self._violations()
        terms = self._terms_cache
        if terms is None:
            terms = self._net_of_copies(self.g_terms())
        return np.flatnonzero(~(violation <= self.kkt_tol * terms))

    def _violations(self) -> np.ndarray:
        """Each point's violation of its KKT condition: |g| in S, g > 0 in E, g < 0 or (the
        other side) g > gap in the reserve set."""
        n = self.n
        g, status = self._g[:n], self._status[:n]
        violation = np.where(status == ERROR, np.maximum(g, 0.0),
                             np.maximum(np.maximum(-g, 0.0), g - self._gap[:n]))
        violation[self._margin] = np.abs(g[self._margin])
        return violation

    def _repair(self, total: UpdateStats, rounds: int = 3) -> bool:
        """Bring a complete but derailed solution back to the KKT conditions; True on success.

        A path whose coefficients shrank by orders of magnitude (a hard margin at C * K ~ 1e15
        losing its large coefficients) resolved its set changes only to the round-off of the
        terms it started with: at the end, with small terms, a few points sit on the wrong side
        (a reserve point with g < 0, an error point with g > 0, an empty margin set whose b
        left the feasible interval). Every other point holds its condition given the violators'
        coefficients, which is all the decremental path needs to move those to 0 exactly; the
        incremental path then adds them back, now at the solution's own scale, with their keys
        and insertion order. Recovery only: the common path never comes here.
        """
        for _ in range(rounds):
            self.recompute_error_contributions()
            if self._kkt_holds():
                return True
            violators = self._violators()
            if violators.size == 0:  # only sum(y alpha) = 0 fails: no point to move
                return False
            keys = [self._keys[position] for position in violators]
            X_back = self._X[violators].copy()
            y_back = self._y[violators].copy()
            p_back = self._p[violators].copy()
            gap_back = self._gap[violators].copy()
            sequence = self._seq[violators].copy()
            next_sequence = self._next_seq
            removal = self._run_update(np.zeros((0, self.dim)), np.zeros(0), [], keys)
            removal.migrations.pop("removed")  # the points are still stored: not a removal
            total.absorb(removal)
            total.absorb(self._run_update(X_back, y_back, keys, [], p_back, gap_back))
            self._seq[[self._pos[key] for key in keys]] = sequence
            self._next_seq = next_sequence
            if self._kkt_holds():
                return True
        return False

    def _kkt_holds(self) -> bool:
        """The maintained solution satisfies the KKT conditions to kkt_tol, each point's relative
        to the size of its own terms (``g_terms``), and sum(y alpha) = 0 to kkt_tol * sum(alpha)
        (``_relative_imbalance``; False for anything non-finite)."""
        n = self.n
        g = self._g[:n]
        if not math.isfinite(self.b):
            return False
        if self._terms_cache is not None and self._kkt_cache is not None:
            # Judged with g, its terms and sum(y alpha) at the end of the update.
            return self._kkt_cache
        if self._relative_imbalance(abs(float(self._y[:n] @ self._alpha[:n]))) > self.kkt_tol:
            return False
        if not np.all(np.isfinite(g)):
            return False
        violation = self._violations()
        terms = self._terms_cache
        if terms is None:
            terms = self._net_of_copies(self.g_terms(), violation)
        return bool(np.all(violation <= self.kkt_tol * terms))

    def _kkt_holds_loosely(self, points_scale: float | None = None) -> bool:
        """:meth:`_kkt_holds` to the last resort's terms (``_update_loosely``): the update
        that left this solution may have been accepted by them alone, and a state it saved
        must restore (its model checkpointed, then refused as damaged at every restart).
        Those terms grow with the kernel's scale: judged first at ``points_scale`` (what the
        stored points give), then at the engine's (a state's saved scale, larger)."""
        if not self._has_copies():
            return False  # (the loose terms differ only where copies cancel)
        scale = self._diag_scale
        self._loose_kkt = True
        try:
            for judged_at in dict.fromkeys((points_scale or scale, scale)):
                self._diag_scale = judged_at
                self._terms_cache = self._kkt_cache = None
                if self._kkt_holds():
                    return True
            return False
        finally:
            self._diag_scale = scale
            self.__dict__.pop("_loose_kkt", None)
            self._terms_cache = self._kkt_cache = None

    def _relative_imbalance(self, imbalance: float) -> float:
        """|sum(y alpha)| (``imbalance``) relative to the coefficients' own size, sum(alpha).

        Not relative to C: with C * K large the coefficients of a solution can be far below C
        (22 in all at C = 5.7e6, after removals of points at 1e7), and a C-relative check let
        an imbalance of 2.3e-5 left by those removals' round-off stand, with decision values
        4.7e-6 off the optimum. Round-off of the sum itself is eps times sum(alpha).
        """
        total = float(self._alpha[: self.n].sum())
        # (alpha >= 0: a zero total has no imbalance)
        return imbalance / total if total > 0.0 else 0.0

    def kkt_violation(self) -> float:
        """Largest violation of the KKT conditions by the maintained margin values g."""
        n = self.n
        g, status = self._g[:n], self._status[:n]
        worst = float(np.abs(g[self._margin]).max()) if self._margin.size else 0.0
        worst = max(worst, float(np.max(g, where=status == ERROR, initial=0.0)))
        worst = max(worst, float(np.max(g - self._gap[:n], where=status == RESERVE,
                                        initial=0.0)))
        return max(worst, float(-np.min(g, where=status == RESERVE, initial=0.0)))

    def _light_snapshot(self) -> dict:
        """What undoing an update that has only appended points needs: the count and the
        scalars (see ``_before_change``)."""
        return {"light": True, "n": self.n, "next_seq": self._next_seq, "b": self.b,
                "t": self._t, "diag_scale": self._diag_scale, "caches": self._caches()}

    def _caches(self) -> tuple:
        """The last KKT check's terms and verdict and the support vectors: a rollback puts
        them back with the state they describe. Dropped instead, the next update would
        refresh g (and maybe refactorize) where the model without the refused update would
        not, and its results would differ from that model's in their last bits."""
        return self._terms_cache, self._kkt_cache, self._sv_cache

    def _before_change(self) -> None:
        """Called before an update changes anything of the points stored before it (their
        coefficients, g, h, S, the factor, b): a light snapshot is made whole now, from the
        state that is still the one before the update but for the appended points and the
        scalars it recorded."""
        undo = self._undo
        if undo is None or "light" not in undo:
            return
        n = self.n
        scalars = (self._next_seq, self.b, self._t, self._diag_scale)
        self.n = undo["n"]
        self._next_seq, self.b, self._t = undo["next_seq"], undo["b"], undo["t"]
        self._diag_scale = undo["diag_scale"]
        try:
            whole = self._snapshot(with_rows=False)
        finally:
            self.n = n
            self._next_seq, self.b, self._t, self._diag_scale = scalars
        whole["caches"] = undo["caches"]  # (the update has cleared them since)
        self._undo = whole

    def _roll_back(self) -> None:
        """Return to the state before the current update: its snapshot, or, while that is
        light, the state without the appended points."""
        undo = self._undo
        if undo is None:
            raise RuntimeError("no update to roll back")
        if "light" not in undo:
            self._restore(undo)
            return
        n = undo["n"]
        for key in self._keys[n:]:
            del self._pos[key]
        del self._keys[n:]
        self.n = n
        self._next_seq, self.b, self._t = undo["next_seq"], undo["b"], undo["t"]
        self._diag_scale = undo["diag_scale"]
        # Their recent-column, feature-copy and kernel-column entries lie past n: unused.
        self._terms_cache, self._kkt_cache, self._sv_cache = undo["caches"]
        self._row_counts = None

    def _check_update(self, X_add, y_add, keys, remove, linear=None, gap=None):
        if X_add is None:
            X_add = np.zeros((0, self.dim))
            y_add = np.zeros(0)
            keys = []
            linear = gap = None
        X_add = np.asarray(X_add, dtype=float)
        if X_add.ndim != 2:
            X_add = np.atleast_2d(X_add)
            if X_add.ndim != 2:
                raise ValueError(f"X_add must be 2-D (points x features), got {X_add.ndim}-D")
        X_add = np.ascontiguousarray(X_add)
        y_add = np.ascontiguousarray(y_add, dtype=float).reshape(-1)
        keys = key_list(keys) if keys is not None else []
        m = X_add.shape[0]
        if y_add.size != m or len(keys) != m:
            raise ValueError(
                f"X_add has {m} rows but y_add has {y_add.size} labels and keys has {len(keys)}"
            )
        if linear is None:
            linear = _ONE_LINEAR if m == 1 else np.full(m, -1.0)
        else:
            linear = np.ascontiguousarray(linear, dtype=float).reshape(-1)
            if linear.size != m:
                raise ValueError(f"X_add has {m} rows but linear has {linear.size} terms")
        if gap is None:
            gap = _ONE_GAP if m == 1 else np.full(m, np.inf)
        else:
            gap = np.ascontiguousarray(gap, dtype=float).reshape(-1)
            if gap.size != m:
                raise ValueError(f"X_add has {m} rows but gap has {gap.size} values")
        problem = _pathcore.check_points(X_add, y_add, linear, gap)
        if problem != _pathcore.POINTS_VALID:
            raise ValueError({
                _pathcore.FEATURES_NOT_FINITE: "X_add contains non-finite values",
                _pathcore.LABEL_NOT_SIGN: "labels must be +1 or -1",
                _pathcore.LINEAR_NOT_FINITE: "linear contains non-finite values",
                _pathcore.GAP_NOT_NONNEGATIVE: "gap must hold numbers >= 0 (inf: no second side)",
            }[problem])
        if m and X_add.shape[1] < self.dim:
            X_add = np.hstack([X_add, np.zeros((m, self.dim - X_add.shape[1]))])
        check_findable_keys(keys)
        # Set operations first (one pass in C); the offending key is looked for only on failure.
        if len(set(keys)) != len(keys) or not self._pos.keys().isdisjoint(keys):
            seen: set = set()
            for key in keys:
                if key in self._pos:
                    raise KeyError(f"key {key!r} is already stored; keys must be unique")
                if key in seen:
                    raise KeyError(f"key {key!r} repeats among the points to add")
                seen.add(key)
        if remove and (len(set(remove)) != len(remove) or not self._pos.keys() >= set(remove)
                       or any(isinstance(key, (bool, np.bool_)) for key in remove)):
            removing: set = set()
            for key in remove:
                if key not in self:
                    raise self._unknown(key)
                if key in removing:
                    raise KeyError(f"key {key!r} is listed twice for removal")
                removing.add(key)
        return X_add, y_add, keys, linear, gap

    def _append(self, X_add: np.ndarray, y_add: np.ndarray, keys: list,
                linear: np.ndarray, gap: np.ndarray) -> np.ndarray:
        n, m = self.n, X_add.shape[0]
        self._reserve_rows(n + m)
        features = self._XT if self._XT is not None and self._XT_of is self._X else _NO_ROWS
        _pathcore.append_points(n, X_add, y_add, linear, gap, self._X, features, self._y,
                                self._p, self._gap, self._alpha, self._g, self._h,
                                self._status, self._slot, self._seq, self._next_seq)
        self._next_seq += m
        counts = self._row_counts
        if counts is not None:
            for key in (_row_hashes(self._X[n : n + m, : self.dim]) if m > 1
                        else (hash((self._X[n, : self.dim] + 0.0).tobytes()),)):
                seen = counts.get(key, 0)
                if seen:
                    self._copies += 1
                counts[key] = seen + 1
        if m == 1:  # a stream's one point: without zip's machinery
            self._pos[keys[0]] = n
        else:
            self._pos.update(zip(keys, range(n, n + m), strict=True))
        self._keys.extend(keys)
        self.n = n + m
        return np.arange(n, n + m)

    def _run_update(self, X_add, y_add, keys, remove, linear=None, gap=None) -> UpdateStats:
        self._ensure_columns()
        # The last check's terms, while they still describe every stored point and that
        # check passed: an update that only adds points already satisfied changes no stored
        # point's g, and then extends them instead of recomputing g everywhere.
        checked_terms = self._terms_cache
        if not (self._kkt_cache is True and checked_terms is not None
                and checked_terms.size == self.n):
            checked_terms = None
        support = self._sv_cache
        self._terms_cache = None
        self._kkt_cache = None
        stats = UpdateStats(added=len(keys), removed=len(remove))
        self._sv_cache = None
        C = self.C
        driven: list[int] = []
        # The driven points' kernel columns, rows of the one block the loop takes (new points
        # first, then members leaving S, then points leaving E), each computed or copied into
        # its row rather than gathered after: at most one row per point added or removed.
        driven_block = None
        settled_removals: list[int] = []
        features = None  # the points' features by column, fixed until the removals at the end

        # New points: their kernel columns, f at them, and those already satisfied.
        if keys:
            if linear is None:
                linear = np.full(len(keys), -1.0)
            if gap is None:
                gap = np.full(len(keys), np.inf)
            new = self._append(X_add, y_add, keys, linear, gap)
            n = self.n
            driven_block = np.empty((new.size + len(remove), n))
            features = self._features_by_column()
            margin = self._margin
            # f at the new points needs their kernel values at S and E only (and the recent
            # columns their entries); full columns only the points the path then drives.
            # Computed in two parts when S and E are a small part of the points (a wide SVR
            # tube); RBF only, whose values are finite wherever the features are.
            kind = _compiled_kernel(self.kernel)[0]
            k = margin.size
            # (Gathering the rows' features costs more than it saves for one to three points.)
            recent_slots = error = None
            if kind == _pathcore.KERNEL_RBF and new.size >= 4:
                recent_slots = np.flatnonzero(self._recent_of >= 0)
                error = np.flatnonzero(self._status[:n] == ERROR)
            if recent_slots is not None and 2 * (k + error.size + recent_slots.size
                                                 + new.size) < n:
                errors = error.size
                scan_error = -1
                K_new = None
                kept = recent_slots.size
                needed = np.concatenate([margin, error, self._recent_of[recent_slots], new])
                block = self._kernel_rows(needed, new).T
                rows = np.arange(needed.size)
                margin_rows, error_rows = rows[:k], rows[k : k + errors]
                recent_rows, new_rows = rows[k + errors : k + errors + kept], rows[-new.size :]
            else:
                K_new = self._kernel_columns(new, features, out=driven_block[: new.size])
                block = K_new.T
                margin_rows, new_rows = margin, new
                # E's members: found by the compiled pass, from their status.
                error = error_rows = _NO_POSITIONS
                scan_error = new[0]
                # Every slot, by position (-1: none held).
                slots = self._recent_of.size
                recent_slots = (_ALL_SLOTS[slots] if slots <= RECENT_COLUMNS_MAX
                                else np.arange(slots))
                recent_rows = self._recent_of
            if isinstance(self.kernel, CallableKernel):
                check_self_similarity(block[np.arange(new.size), new_rows] - self.ridge,
                                      self._X[new], np.abs(block).max(axis=1))
            new_terms = np.empty(new.size)  # the size of the terms of the new points' g
            diagonal, reserved = _pathcore.admit_points(
                np.ascontiguousarray(block), new, new_rows, margin, margin_rows, self._store,
                error, error_rows, recent_slots, recent_rows, self._columns, self._recent,
                self._y, self._p, self._gap, self._alpha, self._g, self._h, self._h_abs,
                self._h_drift, self._status, C, self.b, new_terms, scan_error)
            self._diag_scale = max(self._diag_scale, diagonal)
            self._fit_shift_to_scale()
            # admit_points put each new point on the side nearer to its violation (a finite
            # gap) and those already satisfied in the reserve set; the others are driven.
            stats.count("added->reserve", reserved)
            if reserved < new.size:
                unsatisfied = self._status[new] == ADDING
                driven.extend(new[unsatisfied].tolist())
                if K_new is None:
                    self._kernel_columns(new[unsatisfied], features,
                                         out=driven_block[: len(driven)])
                elif reserved:  # the driven ones' rows move up over the others'
                    _pathcore.keep_rows(driven_block, unsatisfied.view(np.uint8))

        # Points to remove leave their sets; those with alpha = 0 cost nothing.
        n = self.n
        error_removed: list[int] = []
        if remove:
            self._before_change()
            removed = np.array([self._pos[key] for key in remove], dtype=np.int64)
            # S's members leave it one at a time, in the order given, each with its column
            # (kept in the block if the point is driven); E's are driven too, with theirs.
            if driven_block is None:
                driven_block = np.empty((removed.size, n))
            taken = len(driven)
            order = np.empty(removed.size, dtype=np.int64)
            k, members, errors = _pathcore.leave_sets(
                removed, self._status, self._alpha, self._R, self._columns, self._margin,
                self._store, self._slot, self._margin.size, n, driven_block[taken:], order)
            self._margin = self._margin[:k].copy()
            driven.extend(order[:members].tolist())
            error_removed = order[members : members + errors].tolist()
            settled_removals.extend(order[members + errors :].tolist())
        if error_removed:
            positions = np.array(error_removed)
            if features is None:
                features = self._features_by_column()
            taken = len(driven)
            columns = self._kernel_columns(positions, features,
                                           out=driven_block[taken : taken + positions.size])
            self._move_error_columns(columns, self._y[positions], joining=False)
            driven.extend(error_removed)

        driven_positions = np.array(driven, dtype=np.int64)
        if driven:
            self._before_change()
            if features is None:
                features = self._features_by_column()
            self._follow_path(driven_positions, driven_block[: len(driven)], features, stats)
        if remove:
            stats.count("removed", len(remove))
            unlearned = driven_positions[self._status[driven_positions] == REMOVING]
            self._delete_positions(settled_removals + unlearned.tolist())
        # (g is refreshed for it only where a path moved it: removals of points at 0 move
        # nothing.)
        centered = self._center_b(refresh=bool(driven))
        if keys and not driven and not remove and not centered and checked_terms is not None:
            # Every new point went to the reserve set (alpha = 0) and nothing else moved: the
            # stored points' g and sum(y alpha), already checked, are unchanged, and the new
            # points hold their conditions by construction (0 <= g <= gap - g). Their terms
            # extend the check's.
            self._terms_cache = np.concatenate([checked_terms, new_terms])
            self._kkt_cache = True
            self._sv_cache = support  # no coefficient changed, no point moved
            return stats

        # g, the size of its terms, S's residual, the points' KKT conditions and h's staleness
        # in one compiled pass over S's kernel columns.
        self._before_change()
        n = self.n
        terms, margin_residual, kkt_ok, h_stale, balance = self._refresh_g()
        if h_stale:
            self.recompute_error_contributions()
            stats.refactorized = True
        elif max(margin_residual, balance) > self.REFINE_TOL:
            self.refactorize()
            stats.refactorized = True
        else:
            # Nothing moved since: the KKT check that follows every update reuses them.
            net = terms
            if kkt_ok and self._has_copies():  # (the violations only then: O(n) each)
                violation = self._violations()
                net = self._net_of_copies(terms, violation, spread=False)
                if net is not terms and not np.all(violation <= self.kkt_tol * net):
                    # Held to the terms net of cancelling copies, the path's drift can show
                    # where the gross terms hid it: solved afresh from its sets (E's
                    # contributions, S's equations), the KKT check then judges the solution.
                    self.recompute_error_contributions()
                    stats.refactorized = True
                    self._sv_cache = None
                    return stats
            elif not kkt_ok:  # (the net terms tell the repair which points to move)
                net = self._net_of_copies(terms)
                if self._loose_kkt and net is not terms:  # (judged to those, see update)
                    kkt_ok = bool(np.all(self._violations() <= self.kkt_tol * net))
            self._terms_cache = net
            self._kkt_cache = kkt_ok and balance <= self.kkt_tol
        self._sv_cache = None
        return stats

    def b_is_fixed(self) -> bool:
        """Whether coefficients lie strictly between 0 and C, whose margin equations fix b;
        otherwise b is only bounded by the other points (and centered between them).

        It takes two: with one coefficient between the bounds, sum y alpha = 0 makes it
        |sum over E of y| C, a multiple of C, so it is a bound in exact arithmetic. What a path
        leaves there is round-off (1e-18 after a step of 1e-18 at a tie at eta = 0), and
        letting it fix b made the model depend on the order the points came in."""
        margin = self._margin
        if margin.size < 2:
            return False
        return _pathcore.count_free(margin, self._alpha, self._upper_bound()) >= 2

    def b_interval(self) -> tuple[float, float] | None:
        """Where b is not unique (no coefficient strictly between 0 and C), the interval of b
        that keeps every stored point's condition (an end is infinite when one class bounds
        b from one side only); None where b is fixed (by round-off too: ends that cross), or
        nothing is stored."""
        n = self.n
        if n == 0 or self._margin.size:
            # (an update leaves S empty where b is not fixed: _center_b empties it)
            return None
        low, high = self._b_interval(self._g[:n], self._status[:n])
        # (ends crossed by round-off, where points on both sides pin b: fixed but for it)
        return (low, high) if low <= high else None

    def move_b(self, b: float) -> None:
        """Move b to ``b``, within :meth:`b_interval`: the coefficients stay, and the model
        stays an optimum of the stored points. ValueError where b is fixed or ``b`` is outside
        the interval."""
        interval = self.b_interval()
        if interval is None or not (interval[0] <= b <= interval[1]):
            raise ValueError(f"b = {b!r} is not in the interval of optimal b ({interval})")
        if b == self.b:
            return
        self._before_change()
        self._shift_b(float(b))

    def _shift_b(self, b: float) -> None:
        """b becomes ``b``, and every point's g follows (g = y (f - b) + ... + y b)."""
        n = self.n
        self._g[:n] += self._y[:n] * (b - self.b)
        self.b = b

    def _upper_bound(self) -> float:
        """Where a coefficient of S is at C: a path that ends exactly where a member reaches C
        can leave it an ulp or two below (C - 1e-16), which must not decide b (the model would
        then depend on the order the points came in). No such band at 0: a free coefficient
        can be legitimately tiny (1e-15 with kernel values of 1e14)."""
        return self.C * (1.0 - 64.0 * _EPS)

    def _center_b(self, refresh: bool = True) -> bool:
        """When no coefficient is strictly between 0 and C (S empty, or its members all at a
        bound), b is not unique: every b in an interval keeps the KKT conditions. Take its
        middle, as libsvm does, so that the model does not depend on the order in which the
        points came. Members of S at a bound then leave it for the set of their bound (their
        g is no longer 0); g follows in the refresh after the update. Returns whether b or
        S changed."""
        n = self.n
        if n == 0:
            # No point left: the model is the one trained on nothing, f = 0, as a new one
            # (the last b kept the forgotten points' answer, e.g. an erased target).
            if self.b == 0.0:
                return False
            self._before_change()
            self.b = 0.0
            return True
        if self.b_is_fixed():
            if not self._free_by_round_off():
                return False
            refresh = True  # the members' coefficients move to their bounds: g follows
        self._before_change()
        self._ensure_columns()  # members leaving for E hand their columns to h
        margin = self._margin
        alpha = self._alpha[:n]
        g = self._g[:n]
        status = self._status[:n].copy()
        # Each member is at a bound in exact arithmetic (at most one lies between them, see
        # b_is_fixed): the nearer one.
        at_upper = alpha[margin] > 0.5 * self.C
        status[margin] = np.where(at_upper, ERROR, RESERVE)
        if refresh:
            # b's interval from g computed afresh: a path's g carries the round-off of its
            # steps (1e-8 where C K = 1e6), and so do h and a member's coefficient left at
            # 1e-8 instead of 0; an interval computed with them put b that far from a fresh
            # model's (1 - 8.5e-9 for one point of class +1, whose g then fell below 0 in the
            # refresh after the update).
            self._alpha[margin] = np.where(at_upper, self.C, 0.0)
            if not np.any(status == ERROR):
                # Without error points h is exactly 0: what it holds is the round-off of
                # contributions since removed.
                self._h[:n] = 0.0
                self._h_abs[:n] = 0.0
                self._h_drift[:n] = 0.0
            if self._refresh_g()[3]:  # h's drift may matter next to the KKT tolerance
                self.recompute_error_contributions()
                self._refresh_g()
        low, high = self._b_interval(g, status)
        if not (low <= high) or not (np.isfinite(low) or np.isfinite(high)):
            return refresh  # nothing else changed
        if not (np.isfinite(low) and np.isfinite(high)):
            return self._b_to_finite_end(low if np.isfinite(low) else high) or refresh
        # Exactly at their bound, as members of E and R are.
        self._alpha[margin] = np.where(at_upper, self.C, 0.0)
        middle = 0.5 * low + 0.5 * high  # (the same bits as (low + high) / 2, which overflows)
        for slot in range(margin.size - 1, -1, -1):  # S empties, last member first
            position = int(self._margin[slot])
            column = self._margin_remove(slot)
            self._status[position] = status[position]
            if status[position] == ERROR:
                self._move_error_columns(column, self._y[position : position + 1],
                                         joining=True)
        self._shift_b(middle)
        return True

    def _b_interval(self, g: np.ndarray, status: np.ndarray) -> tuple[float, float]:
        """The interval of b that keeps every point's condition, each in its set of
        ``status`` (none in S), from its ``g`` at the current b."""
        n = self.n
        y, gap = self._y[:n], self._gap[:n]
        c = g - y * self.b  # g = y (f - b) + p + y b
        reserve, error = status == RESERVE, status == ERROR
        up, down = y > 0, y < 0
        # Reserve: 0 <= c + y b <= gap; error: c + y b <= 0.
        lows = np.concatenate([-c[reserve & up], c[reserve & down] - gap[reserve & down],
                               c[error & down]])
        highs = np.concatenate([gap[reserve & up] - c[reserve & up], c[reserve & down],
                                -c[error & up]])
        return lows.max(initial=-np.inf), highs.min(initial=np.inf)

    #: How far below C (or above 0), relative to C, a member of S may be left by round-off
    #: and still count as at its bound for b (see _free_by_round_off).
    ROUND_OFF_BAND = 1e-9

    def _free_by_round_off(self) -> bool:
        """Whether the members of S that seem free (so that b looks fixed) are at their
        bounds but for round-off: copies of a point share one coefficient, and a path that
        takes them all to C at its end can leave some of them 3e-12 C below it (three
        copies, C K ~ 2e3), which fixed b at one end of its interval, by the order the points
        came in (f(0) = -0.95 or +0.015 for the same eight points). They are taken as at
        their bounds when every one lies within ROUND_OFF_BAND C of it, sum(y alpha) = 0
        holds with them there to ``residual_tol``, and so does every point's condition, each
        member as a point of its bound, for some b: the coefficients are then an optimum of
        the problem to round-off, whose b is not unique."""
        n, C = self.n, self.C
        margin = self._margin
        band = self.ROUND_OFF_BAND * C
        if _pathcore.count_free(margin, self._alpha, C - band, band):
            return False  # (a member well inside: b is fixed, the common case, decided here)
        alpha = self._alpha[margin]
        snapped = np.where(alpha > 0.5 * C, C, 0.0)
        moved = snapped - alpha
        y = self._y[:n]
        total = float(self._alpha[:n].sum())
        if abs(float(y[margin] @ moved)) > self.residual_tol * total:
            return False
        self._ensure_columns()
        k = margin.size
        # g with the members at their bounds (their columns' contribution moved)
        g = self._g[:n] + y * (self._columns[self._store[:k], :n].T @ (y[margin] * moved))
        status = self._status[:n].copy()
        status[margin] = np.where(snapped > 0.0, ERROR, RESERVE)
        low, high = self._b_interval(g, status)
        return bool(low <= high)

    def _b_to_finite_end(self, end: float) -> bool:
        """One class only: b's interval is half-open, and its finite end, where the point
        nearest the margin has g = 0, is the b of a model that learned these points afresh
        (the path's leftover depended on history: 1.000366 at C = 1e12 where a fresh model
        has 1.0). The members of S stay: they are the points at that end, whose g was 0 to
        round-off before the move and is after it; if one is not, nothing changes."""
        n = self.n
        shift = end - self.b
        if shift == 0.0:
            return False
        y = self._y[:n]
        moved = self._g[:n] + y * shift
        margin = self._margin
        if margin.size:
            terms = self.g_terms()
            if np.any(np.abs(moved[margin]) > self.kkt_tol * terms[margin]):
                return False
        self._g[:n] = moved
        self.b = end
        return True

    def _follow_path(self, D: np.ndarray, K_D: np.ndarray, features: np.ndarray,
                     stats: UpdateStats) -> None:
        """Move driven coefficients to their targets, migrating points at breakpoints (``K_D``:
        the driven points' kernel columns as rows, ``K_D[j, i] = K(x_i, x_D[j])``; ``features``:
        ``_features_by_column()``).

        Along the path every driven coefficient's remaining move shrinks by the same factor
        (1 - eta) at each step, so the driven points' contribution to f, ``K_D beta_D``, is kept
        up to date by scaling, and by subtracting a column when a driven point joins S: O(n) per
        breakpoint instead of O(n |D|).

        The loop itself is compiled (:meth:`stream_svm._pathcore.LoopArrays.follow`, without the
        GIL): at every breakpoint it solves the margin system through the factor, computes the
        sensitivities, takes the smallest step to an event and migrates the point, with these
        rules, which make the path exact at any scale:

        - every threshold is relative: g's sensitivities to the magnitude of the terms summed
          into them (kernel values times coefficients, plus db; for a bias-only step, db), and
          at least 10 times what the solve left at the margin points, where they are 0 by
          construction; coefficients' rates likewise;
        - an imbalance sum(y dalpha_D) at the round-off of the moves (``arrived``) is none;
          an empty margin set with a real imbalance moves b alone to where a point can enter S
          (Karasuyama sec 3.3), and one that no point can absorb but lies far inside the KKT
          check's tolerance is finished with b fixed, the check judging the result;
        - ties are judged on eta's own scale (the eta that moves some g by 1 or the
          coefficients by their own size, at most 1): largest sensitivity, then lowest
          position;
        - a point whose Schur complement is numerically zero is refused entry to S (blocked)
          until S shrinks; the driven contribution is recomputed every 64 steps.

        The loop returns to Python only to get more capacity for S or a user-callable
        kernel's column.
        """
        n = self.n
        if D.size == n and not np.any(self._status[D] == ADDING):
            # Every stored point leaves: no condition remains to be kept. Following the path
            # would only chase the round-off left in the last coefficients (an imbalance of
            # 1e-31 that no point remains to absorb).
            self._alpha[D] = 0.0
            return
        limit = self.max_breakpoints
        if limit is None:
            limit = 1000 + 10 * (n + D.size)
        # The factor, kernel columns and row map have room to grow (the loop asks for more
        # when S fills them); the loop's own scratch gets the same room.
        members = min(n, self._margin.size + 16)
        if members > self._R.shape[0]:
            self._reserve_margin(members)
        arrays = self._loop_arrays
        if arrays is None:
            arrays = self._loop_arrays = _pathcore.LoopArrays()
        D = np.ascontiguousarray(D, dtype=np.int64)
        K_D = np.ascontiguousarray(K_D)
        kind, gamma, degree, coef0 = _compiled_kernel(self.kernel)
        arrays.bind(features, self._y, self._p, self._gap, self._alpha, self._g, self._status,
                    self._slot, self._h, self._h_abs, self._h_drift, self._columns, self._R,
                    self._store, self._recent, self._recent_of)
        arrays.reserve(self._X.shape[0], self._R.shape[0])
        # The driven moves beta_D, their contribution to f (K_D beta_D), the threshold below
        # which a move is round-off and the points refused entry to S (none) are set up by the
        # loop when it starts.
        arrays.begin(D, self._margin, self.b, self._t, self._diag_scale, limit,
                     self._recent_next)
        try:
            while True:
                code = arrays.follow(kind, gamma, degree, coef0, self.ridge, n, self.C,
                                     self.kkt_tol, self.degeneracy_tol, D, K_D)
                if code == _pathcore.DONE:
                    break
                if code == _pathcore.NEED_CAPACITY:
                    self._reserve_margin(min(n, 2 * self._R.shape[0]))
                    arrays.bind(features, self._y, self._p, self._gap, self._alpha, self._g,
                                self._status, self._slot, self._h, self._h_abs,
                                self._h_drift, self._columns, self._R, self._store,
                                self._recent, self._recent_of)
                    arrays.reserve(self._X.shape[0], self._R.shape[0])
                elif code == _pathcore.NEED_COLUMN:
                    arrays.supply_column(self._kernel_columns(np.array([arrays.pending]))[:, 0])
                elif code == _pathcore.NON_FINITE:
                    raise ValueError(
                        "a kernel value of a new or stored point is not finite (features too "
                        "large for this kernel); the model is unchanged"
                    )
                elif code == _pathcore.LIMIT:
                    raise BreakpointLimit(
                        f"update stopped after {arrays.steps} steps "
                        f"(max_breakpoints={limit}); the model is unchanged"
                    )
                else:
                    raise ConvergenceError(
                        "the margin set is empty and no point can enter it; the model is "
                        "unchanged"
                    )
        finally:
            (self._margin, self.b, self._t, self._recent_next, steps, breakpoints, reused,
             migrations) = arrays.outcome()
            stats.steps += steps
            stats.breakpoints += breakpoints
            stats.columns_reused += reused
            for name, times in migrations:
                stats.count(name, times)

    def _delete_positions(self, positions: list[int]) -> None:
        """Swap-remove stored points (none of them may be in S): the points after the new end
        that stay fill the holes the removed points leave below it, both taken in descending
        order (what removing them one at a time, highest position first, would do)."""
        if not positions:
            return
        # The kernel's scale is that of the points stored, not of every point ever seen: one
        # extreme point, once forgotten, left tolerances and t on its scale for good (a
        # linear model then refused ordinary points), and a restored model, whose scale is
        # taken from its points, learned differently from the original.
        rescale = False
        # (RBF's diagonal is 1 everywhere; a user's kernel would be called back once per point:
        # its scale stays the largest seen.)
        if isinstance(self.kernel, (LinearKernel, PolynomialKernel)):
            leaving = self._diagonal_scale(self._X[np.asarray(positions)])
            # (within round-off: the scale was taken from the compiled kernel's values)
            rescale = not leaving < self._diag_scale * (1 - 1e-9)
        undo = self._undo
        if undo is not None and undo.get("X") is None and "light" not in undo:
            # The snapshot left the rows out, which stand before n as they were until now.
            rows = undo["n"]
            undo["X"], undo["seq"] = self._X[:rows].copy(), self._seq[:rows].copy()
            undo["keys"] = self._keys[:rows]
        self._terms_cache = self._kkt_cache = None  # they were per point
        n = self.n
        removed = np.array(positions, dtype=np.int64)
        counts = self._row_counts
        if counts is not None:
            for key in _row_hashes(self._X[removed, : self.dim]):
                left = counts.pop(key, 0) - 1
                if left > 0:
                    counts[key] = left
                    self._copies -= 1
                elif left < 0:  # (never expected: counted afresh when next needed)
                    self._row_counts = None
                    break
        holes = np.empty(removed.size, dtype=np.int64)
        movers = np.empty(removed.size, dtype=np.int64)
        features = self._XT if self._XT is not None and self._XT_of is self._X else _NO_ROWS
        moves = _pathcore.swap_remove(
            removed, n, self._X, self._y, self._p, self._gap, self._alpha, self._g, self._h,
            self._h_abs, self._h_drift, self._status, self._seq, self._slot, features,
            self._columns, self._margin, self._recent, self._recent_of, holes, movers)
        keys, pos = self._keys, self._pos
        for position in positions:
            del pos[keys[position]]
        for hole, mover in zip(holes[:moves].tolist(), movers[:moves].tolist(), strict=True):
            key = keys[mover]
            keys[hole] = key
            pos[key] = hole
        end = n - removed.size
        del keys[end:]
        self.n = end
        if rescale:
            self._diag_scale = self._diagonal_scale(self._X[:end]) if end else 0.0
            self._fit_shift_to_scale()

    def _diagonal_scale(self, X: np.ndarray) -> float:
        """The largest K(x, x) + ridge over the rows of X: the kernel's scale, which the
        tolerances and t are relative to."""
        with np.errstate(over="ignore", invalid="ignore"):
            return float(np.max(np.abs(self.kernel.diagonal(X)))) + self.ridge

    def _fit_shift_to_scale(self) -> None:
        """Refactor P = K_SS + t 11' when t is off the kernel's scale by more than 16x: with
        t far below it P loses the shift to the kernel values' round-off, with t far above
        it the kernel values to the shift's. The solution does not depend on t."""
        scale = self._diag_scale
        if not self._margin.size or not scale > 0 or scale / 16 <= self._t <= 16 * scale:
            return
        self._before_change()
        saved = (self._R, self._t)
        try:
            self._factorize()
        except np.linalg.LinAlgError:
            # K_SS is singular to working precision on the new scale: the old factor still
            # represents it exactly enough to go on.
            self._R, self._t = saved

    # ------------------------------------------------------------------ maintenance
    def discard_reserve(self, epsilon: float) -> int:
        """Forget reserve points with g >= epsilon (C&P sec 2.6), none on the margin by the KKT
        check's tolerance; returns how many (:meth:`far_reserve` says which).

        They have alpha = 0, so the current solution does not change; a discarded point can no
        longer re-enter the solution later, which is the price of the bounded memory.
        """
        far = self.far_reserve(epsilon)
        self._delete_positions(far.tolist())
        if far.size:
            self._sv_cache = None
        return int(far.size)

    def far_reserve(self, epsilon: float) -> np.ndarray:
        """Positions of the reserve points inside by ``epsilon`` on both sides (g >= epsilon
        and gap - g >= epsilon), leaving out those on the margin by the KKT check's tolerance
        (g or gap - g below ``kkt_tol`` times the point's terms, ``g_terms``); none while b is
        not fixed (b is then centered between the points: discarding some would move it).

        A point that has just left the margin lies at g = 0 up to the round-off of the path:
        at epsilon = 0 the sign of that round-off discarded or kept it, and a model restored
        from a checkpoint (its factor computed afresh, so its g differs in the last bits) kept
        a point the original discarded; the two learned different models from then on
        (decision values 0.9 apart a few updates later).
        """
        n = self.n
        if not n or not self.b_is_fixed():
            return _NO_POSITIONS
        g = self._g[:n]
        terms = self._terms_cache
        if terms is None or terms.size != n:
            terms = self.g_terms()
        least = np.maximum(epsilon, self.kkt_tol * terms)  # (the other side's g: gap - g)
        return np.flatnonzero((self._status[:n] == RESERVE) & (g >= least)
                              & (self._gap[:n] - g >= least))

    def _unknown(self, key: Hashable) -> KeyError:
        from stream_svm._engine_model import unknown_key  # (it imports this module)

        return unknown_key("stored point", key, self._pos)

    def discard(self, keys: Sequence[Hashable]) -> None:
        """Forget stored reserve points (alpha = 0) without a path: the coefficients do not
        change; where b is not unique it is centered again among the points that remain (as a
        batch solution on them would center it). KeyError for an unknown key, ValueError for
        a point not in the reserve set; nothing is changed then."""
        positions = []
        for key in keys:
            if key not in self:
                raise self._unknown(key)
            positions.append(self._pos[key])
        if len(set(positions)) != len(positions):
            raise KeyError("a key is listed twice")
        if positions and np.any(self._status[positions] != RESERVE):
            raise ValueError("only reserve points (alpha = 0) can be discarded without a path")
        self._delete_positions(positions)
        if positions:
            self._sv_cache = None
            # The discarded points may have bounded b's interval (g did not move).
            self._center_b(refresh=False)

    def leave_one_out_decisions(self) -> np.ndarray:
        """f_{-i}(x_i) for every stored point: the decision at x_i of the exact solution
        trained without it, obtained by decremental unlearning and restoring (C&P sec 3).

        Points with alpha = 0 keep the current solution when left out, unless b is not fixed
        by a free coefficient: b is then the middle of an interval that such a point may bound
        (``_center_b``), and every point is left out in turn.
        """
        n = self.n
        decisions = self.decision_function(self._X[:n])
        if self._row_counts is None:
            self._count_rows()
        rows = (dict(self._row_counts), self._copies)  # (the removals count theirs off)
        with self.counters_kept():
            for position in self.leave_one_out_positions():
                key = self._keys[position]
                x = self._X[position].copy()
                snapshot = self._snapshot(with_columns=True)
                try:
                    self.update(remove=[key])
                    decisions[position] = self.decision_function(x[None, :])[0]
                finally:
                    self._restore(snapshot)
                    # (a copy each time: the next removal counts its row off in place)
                    self._row_counts, self._copies = dict(rows[0]), rows[1]
        return decisions

    @contextlib.contextmanager
    def counters_kept(self) -> Iterator[None]:
        """Put the update counters (``last_update`` and the ``*_total`` counts) back as they
        were when the block ends, however it ends: for computations that update and roll
        back (leave-one-out), which are no updates of the model, failed or not."""
        saved = self.counters()
        try:
            yield
        finally:
            self.set_counters(saved)

    _COUNTERS = ("last_update", "breakpoints_total", "updates_total", "retries_total",
                 "relearns_total", "refactorizations_total")

    def counters(self) -> tuple:
        """The update counters, for :meth:`set_counters` to put back."""
        return tuple(getattr(self, name) for name in self._COUNTERS)

    def set_counters(self, saved: tuple) -> None:
        for name, value in zip(self._COUNTERS, saved, strict=True):
            setattr(self, name, value)

    def leave_one_out_positions(self) -> np.ndarray:
        """The stored points whose leaving changes the solution: those with alpha > 0, or all
        of them when b is not fixed (see ``leave_one_out_decisions``)."""
        n = self.n
        if not self.b_is_fixed():
            return np.arange(n)
        return np.flatnonzero(self._alpha[:n] > 0)

    # ------------------------------------------------------------------ persistence
    def get_state(self, linear: bool = False) -> dict[str, np.ndarray]:
        """The solution as plain arrays (enough to rebuild every cache exactly), and the
        solver's own state (the factor and the error vectors' sums, which a restore takes
        when they agree with the points: the restored engine then goes on bit for bit as this
        one); with ``linear``, the points' linear terms too (without it they are -1:
        classification)."""
        n, k = self.n, self._margin.size
        return {
            "X": self._X[:n].copy(),
            "y": self._y[:n].copy(),
            **({"linear": self._p[:n].copy(), "gap": self._gap[:n].copy()} if linear else {}),
            "alpha": self._alpha[:n].copy(),
            "status": self._status[:n].copy(),
            "sequence": self._seq[:n].copy(),
            "margin": self._margin.copy(),
            "b": np.array(self.b),
            "next_sequence": np.array(self._next_seq),
            "factor": self._R[:k, :k].copy(),
            "shift": np.array(self._t),
            "store": self._store[:k].copy(),
            "h": self._h[:n].copy(),
            "h_abs": self._h_abs[:n].copy(),
            "h_drift": self._h_drift[:n].copy(),
            "diag_scale": np.array(self._diag_scale),
            "g": self._g[:n].copy(),
            "checked_terms": (self._terms_cache.copy() if self._kkt_cache is True
                              and self._terms_cache is not None
                              and self._terms_cache.size == n else np.zeros(0)),
        }

    def _take_saved_checks(self, state: Mapping[str, np.ndarray]) -> None:
        """Once the restored solution passed its check: take the state's saved g (where it
        agrees with the g just computed to its round-off) and the last check's terms (where
        it passed and kept them: an update that only adds reserve points then extends them
        rather than computing g afresh, as the saving engine would, and with the same bits;
        never above the terms of g, which would loosen later checks)."""
        n = self.n
        g, checked = state.get("g"), state.get("checked_terms")
        if g is None or checked is None or g.shape != (n,):
            return
        terms = self.g_terms()
        if not (np.all(np.isfinite(g))
                and np.all(np.abs(g - self._g[:n]) <= 16.0 * _EPS * terms)):
            return
        self._g[:n] = g
        if checked.size == 0:
            self._terms_cache = self._kkt_cache = None
            return
        if not (checked.shape == (n,) and np.all(np.isfinite(checked))
                and np.all(checked >= 0.0)):
            return
        bound = terms
        if not np.all(checked <= terms * (1 + 1e-9)):
            # (A check passed by the last resort's terms, which the copies' round-off in b
            # raises above the terms of g: no higher than those, computed now.)
            self._loose_kkt = True
            try:
                bound = np.maximum(terms, self._net_of_copies(terms))
            finally:
                self.__dict__.pop("_loose_kkt", None)
        if np.all(checked <= bound * (1 + 1e-9)):
            self._terms_cache, self._kkt_cache = checked.copy(), True

    def _take_saved_sums(self, state: Mapping[str, np.ndarray], error_count: int) -> None:
        """Take a state's saved sums of E's contributions (h, h_abs and the sizes h_drift
        whose eps-multiple bounds h's round-off) in place of those just computed, when they
        agree to that round-off plus what the fresh sums lose (the incremental sums differ
        from fresh ones in their last bits, and a restored engine would go on from other
        bits)."""
        n = self.n
        if not all(name in state for name in ("h", "h_abs", "h_drift")):
            return
        h, h_abs, drift = state["h"], state["h_abs"], state["h_drift"]
        fresh_h, fresh_abs = self._h[:n], self._h_abs[:n]
        if not (np.all(np.isfinite(h)) and np.all(np.isfinite(h_abs))
                and np.all(np.isfinite(drift)) and np.all(drift >= 0.0)
                and np.all(drift <= (error_count + 1) * 1e6 * (fresh_abs + 1.0))):
            return
        bound = 4.0 * _EPS * (drift + (error_count + 1) * fresh_abs)
        if (np.all(np.abs(h - fresh_h) <= bound)
                and np.all(np.abs(h_abs - fresh_abs) <= bound)):
            self._h[:n], self._h_abs[:n], self._h_drift[:n] = h, h_abs, drift

    def _take_saved_factor(self, state: Mapping[str, np.ndarray]) -> bool:
        """Take a state's saved factor of P = K_SS + t 11' (and its t) when it factors P as
        computed now to FACTOR_BACKWARD_ERROR; whether it did. (A factor computed afresh has
        other bits than the one the saving engine maintained through its updates.)"""
        k = self._margin.size
        factor, shift = state.get("factor"), state.get("shift")
        if factor is None or shift is None or factor.shape != (k, k):
            return False
        t = float(shift)
        # (The solves read the upper triangle alone: below it, the Givens rotations' leftovers
        # may be anything, NaN included, and are kept as they are.)
        upper = np.triu(factor)
        # (Its diagonal may hold negative entries, which rotations leave: R'R is what counts.)
        if not (math.isfinite(t) and t > 0.0 and np.all(np.isfinite(upper))
                and np.all(np.diag(upper) != 0.0)):
            return False
        K_SS = self._columns[self._store[:k]][:, self._margin].T
        P = K_SS + t
        with np.errstate(over="ignore", invalid="ignore"):
            error = float(np.abs(upper.T @ upper - P).max())
        if not error <= FACTOR_BACKWARD_ERROR * float(np.abs(P).max()):
            return False
        self._R[:k, :k] = factor
        self._t = t
        return True

    def set_state(self, state: dict[str, np.ndarray], keys: Sequence[Hashable]) -> None:
        """Load a state from :meth:`get_state` (with the keys in stored order).

        alpha and b are taken as they are (not re-solved), so decisions are reproduced
        bit for bit; the kernel caches are rebuilt from the stored points, and the factor and
        E's sums taken from the state when it holds them and they agree with the points
        (otherwise computed afresh), so that the engine goes on as the one that saved it.
        """
        state = _state_arrays(state)
        X = state["X"]
        n = X.shape[0]
        status = state["status"].astype(np.int8)
        # A copy: the engine changes its margin order in place, and the caller's state (a
        # checkpoint read once, restored twice) must stay as it was.
        margin = np.array(state["margin"], dtype=np.int64)
        if len(keys) != n or len(set(keys)) != n:
            raise ValueError("the state needs one unique key per stored point")
        margin_ok = np.all(status[margin] == MARGIN)
        if not margin_ok or np.count_nonzero(status == MARGIN) != margin.size:
            raise ValueError("the state's margin order does not match its statuses")
        _check_state_values(state, status, self.C)
        fresh = PathEngine(self.kernel, self.C, self.ridge, self.max_breakpoints,
                           self.degeneracy_tol, self.residual_tol, self.kkt_tol)
        fresh.dim = X.shape[1]
        fresh._X = np.zeros((0, fresh.dim))
        fresh._reserve_rows(n)
        fresh.n = n
        fresh._X[:n] = X
        fresh._y[:n] = state["y"]
        # States written before regression existed hold classification points only.
        fresh._p[:n] = state["linear"] if "linear" in state else -1.0
        fresh._gap[:n] = state["gap"] if "gap" in state else np.inf
        fresh._alpha[:n] = state["alpha"]
        fresh._status[:n] = status
        fresh._seq[:n] = state["sequence"]
        fresh._slot[:n] = -1
        fresh._next_seq = int(state["next_sequence"])
        fresh.b = float(state["b"])
        fresh._keys = list(keys)
        fresh._pos = {key: i for i, key in enumerate(fresh._keys)}
        fresh._row_counts = None
        points_scale: float | None = None  # (the scale the points give, if a saved one is taken)
        if n:
            fresh._diag_scale = fresh._diagonal_scale(X)
            if not np.isfinite(fresh._diag_scale):
                raise ValueError("a kernel value of the state's points is not finite")
            saved_scale = float(state.get("diag_scale", np.nan))
            # (The engine that saved it may hold the scale of a point since removed: its
            # tolerances were relative to that. Never below what the points give, but for
            # round-off: the compiled kernel's K(x, x), which the engine took as points came,
            # can be an ulp below numpy's; nor above SAVED_SCALE_RATIO times it, a scale that
            # would loosen the checks below for copies, and the far points' refusal.)
            # (A built-in kernel's scale follows its points, removals included: only a user's
            # kernel keeps the largest seen.)
            ratio = (SAVED_SCALE_RATIO if isinstance(fresh.kernel, CallableKernel)
                     else 1 + 1e-9)
            if (math.isfinite(saved_scale)
                    and fresh._diag_scale * (1 - 1e-12) <= saved_scale
                    <= fresh._diag_scale * ratio):
                points_scale, fresh._diag_scale = fresh._diag_scale, saved_scale
        elif math.isfinite(saved_scale := float(state.get("diag_scale", np.nan))) and (
                saved_scale > 0.0):
            fresh._diag_scale = saved_scale  # (an empty engine's, from its points since gone)
        error = np.flatnonzero(status == ERROR)
        for start in range(0, error.size, 512):
            chunk = error[start : start + 512]
            columns = fresh._kernel_columns(chunk)
            fresh._h[:n] += columns @ (fresh.C * fresh._y[chunk])
            fresh._h_abs[:n] += np.abs(columns).sum(axis=1) * fresh.C
        fresh._take_saved_sums(state, error.size)
        shift = float(state.get("shift", np.nan))
        if not margin.size and math.isfinite(shift) and shift > 0.0:
            fresh._t = shift  # (no factor to check it against: the next S's first shift)
        if margin.size:
            k = margin.size
            fresh._reserve_margin(k)
            # S's columns in the rows the saving engine kept them in (its products sum them
            # in that order), when the state says so.
            store = state.get("store")
            if store is None or not np.array_equal(np.sort(store), np.arange(k)):
                store = np.arange(k)
            fresh._columns[store, :n] = fresh._kernel_columns(margin).T
            fresh._store[:k] = store
            fresh._margin = margin
            fresh._slot[margin] = np.arange(k)
            try:
                if not fresh._take_saved_factor(state):
                    fresh._factorize()
            except np.linalg.LinAlgError:
                # t on the scale of every stored point can swamp S's own kernel values (S
                # near the origin, a point at 1e12 elsewhere under a linear kernel: K_SS + t
                # rounds to t 11'), where the engine that saved the state kept its earlier t
                # (_fit_shift_to_scale): t on S's own scale factors it.
                try:
                    fresh._factorize(own_scale=True)
                except np.linalg.LinAlgError:
                    raise ValueError(
                        "the kernel matrix of the state's margin points is not positive "
                        "definite to working precision: a damaged or edited state, or one "
                        "saved with another kernel") from None
        _, _, kkt_ok, _, balance = fresh._refresh_g()
        if (kkt_ok and balance > fresh.kkt_tol
                and abs(float(fresh._y[:n] @ fresh._alpha[:n])) <= fresh.kkt_tol * fresh.C):
            # Only sum(y alpha) = 0 fails, to a degree the check let stand when it was judged
            # relative to C (states saved then): re-solved from its sets, as an update now
            # is, the check below then judges it.
            fresh.refactorize()
        holds = fresh._kkt_holds() or fresh._kkt_holds_loosely(points_scale)
        if not holds and isinstance(fresh.kernel, CallableKernel) and margin.size:
            # A user's function need not give a pair of points the same bits in another call
            # (its products blocked otherwise for other shapes: 1e-8 apart, where the state's
            # coefficients are held to 1e-8): the state's coefficients re-solved from its sets
            # with the kernel values as computed now, which the check below then judges, as
            # long as that moves no decision value by more than CALLABLE_RESTORE_MOVE of its
            # terms (an edited b or coefficient moves them by far more, and stays refused).
            before, terms = fresh._g[:n].copy(), fresh.g_terms()
            try:
                fresh.refactorize()
            except np.linalg.LinAlgError:
                pass
            else:
                moved = np.abs(fresh._g[:n] - before)
                holds = bool(np.all(moved <= CALLABLE_RESTORE_MOVE * terms)) and (
                    fresh._kkt_holds() or fresh._kkt_holds_loosely(points_scale))
        if not holds:
            # Each value in range, but not an SVM of these points (edited, or saved with
            # another C): serving it would answer with a model nobody trained.
            imbalance = fresh._relative_imbalance(abs(float(fresh._y[:n] @ fresh._alpha[:n])))
            raise ValueError(
                "the state's coefficients do not solve the SVM of its points with C = "
                f"{self.C:g} (KKT violation {fresh.kkt_violation():.3g}, sum(y alpha) "
                f"{imbalance:.3g} of sum(alpha)): a damaged or edited state, or one saved with "
                "other settings")
        fresh._take_saved_checks(state)
        self.__dict__.update(fresh.__dict__)
