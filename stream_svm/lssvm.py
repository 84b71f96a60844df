"""Exact incremental and decremental least-squares SVMs that keep no training sample.

The least-squares SVM in a finite feature space phi (the identity, or random Fourier features
approximating the RBF kernel) has the closed-form solution

    w = argmin  rho ||w||^2 + sum_n (w^T phi(x_n) + b - y_n)^2
      = (rho I + Phi Phi^T)^{-1} Phi y                            (Lee et al., eq. 2)

(with an unregularized bias b when ``fit_intercept``). Lee et al. ("Exact incremental and
decremental learning for LS-SVM") show that adding and removing any batch of samples only
touches the J x J matrix rho I + Phi Phi^T and the vector Phi y, never the old samples
(their eq. 7): A_new = A + Phi_c Phi_c'^T and Phi_new y_new = Phi y + Phi_c y_c with
Phi_c = (Phi_a, Phi_r), Phi_c' = (Phi_a, -Phi_r), y_c = (y_a, -y_r). Their Theorem 1 then
propagates w and C = I - rho A^{-1} with the Woodbury identity.

Design choice, measured (see benchmarks/BENCHMARKS_lssvm.md): the Woodbury recursion of
Theorem 1 (and of Corollaries 1-2) drifts. After 10^4 mixed single-sample additions and
removals its w was 4e-13 (rho = 1), 2e-5 (rho = 1e-6, badly scaled and nearly collinear
features) and 7e-7 (random Fourier features, rho = 1e-8) away, relatively, from the closed form
on the current multiset, so it fails the 1e-8 target. This module therefore keeps, in place of
C, the matrix A = D + Phi Phi^T itself (D = rho I, with a 0 for the bias) and the vector Phi y,
both accumulated with compensated (two-sum) summation, and solves A w = Phi y with a fresh
Cholesky factorization after each update. The state is two J x J and two J arrays whatever
the number of samples; the accumulated A is as accurate as one built from scratch, so the
error after any number of updates stays at the level of a direct closed-form solve (1e-15 /
1e-11 / 1e-13 relative on the three problems above). A rank-one Cholesky update would be
O(J^2) instead of O(J^3 / 3) per update, but a vectorized NumPy rank-one update measured
slower than LAPACK's refactorization for J = 50 ... 1000 here, and the refactorization is also
what detects an impossible removal (A no longer positive definite).

Removing a sample that was never added cannot be detected in general: the model holds no
data to compare against. What is guarded: removing more samples than the model holds,
removing a sample with a feature the model never learned, removals that leave a sum of squares
(a diagonal entry of Phi Phi^T) negative or A indefinite, and removing everything while a
residue stays in Phi Phi^T or Phi y. Each guard raises ValueError and leaves the model as it was.
"""

from __future__ import annotations

import contextlib
import decimal
import hashlib
import math
import numbers
import warnings
from collections.abc import Hashable, Iterable, Mapping
from typing import Any

import numpy as np
import pandas as pd
from river import base
from scipy.linalg import LinAlgError, cho_factor, cho_solve
from scipy.linalg.lapack import dpocon

from stream_svm import _pathcore
from stream_svm._engine_model import (
    JSON_COUNT,
    JSON_FLAG,
    JSON_LIST,
    JSON_TABLE,
    JSON_TEXT,
    SCALE_CHECK_EVERY,
    SCALE_CHECK_POINTS,
    FixedParameters,
    _check_feature_limit,
    check_checkpoint_members,
    check_checkpoint_meta,
    check_feature_names,
    check_keys,
    checkpoint_names,
    checkpoint_params,
    forget_without_key_error,
    gamma_scale_message,
    keys_from_arrays,
    keys_to_arrays,
    note_warning,
    refuse_key_with_value,
    restored_names,
    restored_params,
    warn_kernel_scale,
    warn_of_unused_parameters,
)
from stream_svm._input import (
    FeatureSpace,
    caller_level,
    check_classes,
    check_paired,
    class_of,
    classes_of,
    finite_score,
    finite_scores,
    label_signs,
    real_target,
    real_to_float,
)
from stream_svm._input import (
    key_list as keys_as_list,
)
from stream_svm.kernels import GAMMA_TEXT_HINT

__all__ = ["IncrementalLSSVC", "IncrementalLSSVR"]

_FEATURE_MAPS = ("linear", "rff")
# A removal may make a diagonal entry of Phi Phi^T (a sum of squares) slightly negative
# through rounding only; anything below this fraction of the entries involved is a sample that
# was not in the model.
_ROUNDING_SLACK = 1e-9

# A sum of rounded products is off by a few eps of its terms: 64 eps allows for many.
_ROUNDING_TERMS = 64 * float(np.finfo(float).eps)


def _rounding_of(terms: float) -> float:
    """The rounding that sums of products of total size ``terms`` may carry (0 when that size
    is not known: past the largest float, or a model saved before it was kept)."""
    return _ROUNDING_TERMS * terms if math.isfinite(terms) else 0.0


def _two_sum(hi: np.ndarray, lo: np.ndarray, delta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Add ``delta`` to the compensated pair (hi, lo); returns new arrays, inputs untouched.

    Knuth's two-sum recovers the rounding error of hi + delta exactly, so additions and
    removals cancel without leaving a residue that would grow with the number of updates.
    """
    total = hi + delta
    delta_part = total - hi
    error = (hi - (total - delta_part)) + (delta - delta_part)
    return total, lo + error


#: eps times the normal equations' condition number (estimated from the factor: its pivots
#: and LAPACK's dpocon, the system scaled to a unit diagonal) above which a model warns that
#: its solution may be off by that much: float64 cannot solve them more closely.
CONDITIONING_WARNING = 1e-8
#: Updates between two checks of the conditioning (the first update is checked).
CONDITIONING_CHECK_EVERY = 32
#: The model types warned of their conditioning in this process (once each).
_CONDITIONING_WARNED: set[type] = set()


_EPS = float(np.finfo(float).eps)


def _nonzero_values(x: Mapping) -> dict[Hashable, float] | None:
    """A sample's features as learned (absent, None and 0 alike), to compare samples; None
    when a value is not a number."""
    try:
        numbers_ = {name: float(value) for name, value in x.items() if value is not None}
    except (TypeError, ValueError):
        return None
    # (NaN reads 0, as in a DataFrame)
    return {name: value for name, value in numbers_.items() if value != 0.0 and value == value}


def _frame_columns(X: pd.DataFrame) -> list[Hashable]:
    columns = list(_frame(X).columns)
    if len(set(columns)) != len(columns):
        duplicated = sorted({repr(c) for c in columns if columns.count(c) > 1})
        raise ValueError(f"X has duplicated columns: {', '.join(duplicated)}")
    return columns


def _frame(X: object) -> pd.DataFrame:
    """``X`` when it is a DataFrame; TypeError naming what it is otherwise (a list had failed
    inside pandas, naming nothing)."""
    if not isinstance(X, pd.DataFrame):
        raise TypeError(f"X must be a pandas DataFrame, got {type(X).__name__}")
    return X


def _check_index(X: pd.DataFrame, y: Iterable[object], what: str = "y") -> None:
    """Values indexed otherwise than X's rows are refused (see ``check_paired``); a length
    mismatch is named by the update itself."""
    if (isinstance(y, (pd.DataFrame, str, bytes)) or not hasattr(y, "__len__")
            or len(y) == len(X)):  # type: ignore[arg-type]
        check_paired(X, y, what)


def _frame_to_rows(
    space: FeatureSpace, X: pd.DataFrame
) -> tuple[np.ndarray, list[Hashable]]:
    """Vectorize a DataFrame like ``space.vectorize_many`` would its rows, but column-wise.

    Numeric and boolean columns are converted in one go (NaN reads 0, infinities are
    rejected by name); anything else goes through the per-row path for its error messages.
    """
    columns = _frame_columns(X)
    # One look at the dtypes: per-column access costs more than the update itself.
    numeric = all(getattr(dtype, "kind", "O") in "biuf" for dtype in X.dtypes)
    if not numeric:
        return space.vectorize_many(X.to_dict("records"))
    values = X.to_numpy(dtype=float, na_value=np.nan) if columns else np.zeros((len(X), 0))
    infinite = np.isinf(values).any(axis=0)
    if infinite.any():
        name = columns[int(np.argmax(infinite))]
        raise ValueError(f"feature {name!r} is infinite in X; only finite values are allowed")
    values = np.nan_to_num(values, nan=0.0)
    # Like FeatureSpace, a feature that is zero everywhere is not new: it changes nothing.
    # (By position: list.index compared a numpy scalar label with a tuple label, which gives
    # an array, not False.)
    fresh = [i for i, c in enumerate(columns) if c not in space.index and values[:, i].any()]
    rows = np.zeros((len(X), len(space) + len(fresh)))
    for i, column in enumerate(columns):
        if column in space.index:
            rows[:, space.index[column]] = values[:, i]
    for j, i in enumerate(fresh):
        rows[:, len(space) + j] = values[:, i]
    return rows, [columns[i] for i in fresh]


def _name_words(name: Hashable) -> list[int]:
    """Two 64-bit words from a feature name that seed the name's row of random Fourier
    frequencies, so that a name gets the same row whenever and in whatever order it first
    comes: the same for names equal as dict keys (1, 1.0, True, numpy's 1.0; a str and its
    subclasses), and in every process for str, bytes, numbers and tuples of them (for a name
    of another type they come from its repr)."""
    digest = hashlib.blake2b(_name_text(name).encode("utf-8", "surrogatepass"),
                             digest_size=16).digest()
    return [int.from_bytes(digest[:8], "little"), int.from_bytes(digest[8:], "little")]


def _name_text(name: Hashable) -> str:
    if isinstance(name, str):
        return "str:" + str(name)
    if isinstance(name, bytes):
        return "bytes:" + bytes(name).hex()
    if isinstance(name, tuple):
        return "tuple:(" + ",".join(_name_text(item) for item in name) + ")"
    if isinstance(name, (numbers.Number, decimal.Decimal)):
        # Numbers equal as dict keys hash equally whatever their type: one text for them all.
        with contextlib.suppress(TypeError, ValueError, ArithmeticError):
            if name == int(name):  # type: ignore[call-overload]
                return f"int:{int(name)}"  # type: ignore[call-overload]
        with contextlib.suppress(TypeError, ValueError, ArithmeticError):
            as_float = float(name)  # type: ignore[arg-type]
            if as_float == name:
                return f"float:{as_float!r}"
    return f"{type(name).__qualname__}:{name!r}"


# The streams of the random Fourier map, under its seed: one per feature name, one for phases.
_FREQUENCY_STREAM = 0
_PHASE_STREAM = 1

#: After the first check, one added sample in this many feeds the kernel-scale check.
SCALE_CHECK_STRIDE = 10


#: The most random Fourier features a model takes: it keeps two n_components x n_components
#: matrices (4.3 GB at this bound) and factorizes one at every update (O(n_components^3)).
MAX_COMPONENTS = 16_384


def _finite_positive(value: object) -> bool:
    """A real number (not a bool) that is finite and > 0 (not one too large for a float, an
    int of 400 digits, whose check raised OverflowError, naming no parameter)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return False
    return math.isfinite(real_to_float(value)) and value > 0


class _IncrementalLSSVM(FixedParameters):
    """Shared engine of :class:`IncrementalLSSVC` and :class:`IncrementalLSSVR`."""

    _built_by = "_solution"  # the constructor's last state: parameters are fixed from then on
    # (for a model pickled before they were kept: the state's own terms are the scale)
    _gram_terms = 0.0
    _rhs_terms = 0.0
    _fourier_seed = None  # (a model pickled before it was kept: drawn from ``seed`` on use)
    # The kernel-scale check's statistics ("rff"), for a model pickled before they were kept.
    _scale_mean: np.ndarray | None = None
    _scale_m2: np.ndarray | None = None
    _scale_count = 0
    _samples_added = 0
    _conditioning_countdown = 0  # updates until the next check of the conditioning
    _next_scale_check = SCALE_CHECK_POINTS

    def __init__(
        self,
        rho: float = 1.0,
        features: str = "linear",
        n_components: int = 100,
        gamma: float = 1.0,
        fit_intercept: bool = True,
        seed: int | None = None,
        max_features: int | None = 1000,
        max_new_features: int | None = None,
    ) -> None:
        if not _finite_positive(rho):
            raise ValueError(f"rho must be a finite number > 0, got {rho!r}")
        if not isinstance(features, str) or features not in _FEATURE_MAPS:
            raise ValueError(f"features must be one of {_FEATURE_MAPS}, got {features!r}")
        if isinstance(n_components, bool) or not isinstance(n_components, numbers.Integral) or (
            not 1 <= n_components <= MAX_COMPONENTS
        ):
            raise ValueError(f"n_components must be an integer from 1 to {MAX_COMPONENTS}, got "
                             f"{n_components!r} (the model keeps two n_components x "
                             "n_components matrices and factorizes one at every update)")
        if not _finite_positive(gamma):
            hint = f": {GAMMA_TEXT_HINT}" if isinstance(gamma, str) else ""
            raise ValueError(f"gamma must be a finite number > 0, got {gamma!r}{hint}")
        if not (isinstance(fit_intercept, (bool, np.bool_))
                or (isinstance(fit_intercept, numbers.Integral) and fit_intercept in (0, 1))):
            # (Read by truth value, the text "False" from a configuration file fitted one.)
            raise TypeError(f"fit_intercept must be True or False, got {fit_intercept!r}")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, numbers.Integral)
                                 or not 0 <= seed < 2**64):
            # (A checkpoint keeps the map's seed as a 64-bit integer.)
            raise ValueError(f"seed must be None or an integer from 0 to 2**64 - 1, got {seed!r}")
        _check_feature_limit("max_features", max_features)
        _check_feature_limit("max_new_features", max_new_features)
        self.rho = rho
        self.features = features
        self.n_components = n_components
        self.gamma = gamma
        self.fit_intercept = fit_intercept
        self.seed = seed
        self.max_features = max_features
        self.max_new_features = max_new_features
        if features == "linear":
            warn_of_unused_parameters(
                self, ("n_components", "gamma", "seed"), "features='linear'",
                "features='rff' learns on n_components random Fourier features of an RBF "
                "kernel of this gamma, drawn from seed")
        # Samples learned under a key, kept so that they can be forgotten by it: (x, y).
        self._kept: dict[Hashable, tuple[dict[Hashable, float], object]] = {}

        self._space: FeatureSpace | None = None  # the input features, once one is learned
        self._omega: np.ndarray | None = None  # rff frequencies, (n_inputs, n_components)
        self._phase: np.ndarray | None = None  # rff phases, (n_components,)
        # The map's seed (``_map_seed``). Without ``seed``, drawn now, not at the first
        # update: a copy, pickle or checkpoint taken before it would otherwise draw a map of
        # its own, and predict otherwise than the original after the same updates.
        self._fourier_seed: int | None = (
            int(np.random.SeedSequence().generate_state(1, np.uint64)[0])
            if features == "rff" and seed is None else None)
        # For the check of gamma against the features' scale ("rff"): each feature's mean and
        # sum of squared deviations over _scale_count of the samples added since the last
        # check (aggregates only: the model keeps no sample), the samples added in all, and
        # when the check is next due.
        self._scale_mean: np.ndarray | None = None
        self._scale_m2: np.ndarray | None = None
        self._scale_count = 0
        self._samples_added = 0
        self._next_scale_check = SCALE_CHECK_POINTS
        width = self._bias_width + (n_components if features == "rff" else 0)
        self._gram_hi = np.diag(self._regularization(width))  # A = D + Phi Phi^T
        self._gram_lo = np.zeros((width, width))
        self._rhs_hi = np.zeros(width)  # Phi y
        self._rhs_lo = np.zeros(width)
        # The largest product terms summed into Phi Phi^T and into Phi y by every update since
        # the model was last empty: the scale of the rounding those sums carry, which forgetting
        # every sample must leave, however small what remains (copies under opposite labels
        # cancel in Phi y; features learned and forgotten long ago leave theirs in Phi Phi^T).
        self._gram_terms = 0.0
        self._rhs_terms = 0.0
        self._solution = np.zeros(width)  # (b, w) or w
        self.n_samples_ = 0

    # ----------------------------------------------------------------------------- properties

    @property
    def _bias_width(self) -> int:
        return 1 if self.fit_intercept else 0

    def _regularization(self, width: int) -> np.ndarray:
        diagonal = np.full(width, float(self.rho))
        diagonal[: self._bias_width] = 0.0  # the bias is not shrunk
        return diagonal

    @property
    def coef_(self) -> np.ndarray:
        """w, over the input features ("linear", in ``feature_names_`` order) or components."""
        return self._solution[self._bias_width :].copy()

    @property
    def intercept_(self) -> float:
        """b (0 when ``fit_intercept`` is False)."""
        return float(self._solution[0]) if self.fit_intercept else 0.0

    @property
    def intercept(self) -> float:
        """b, under the name the SVMs give it: the same as ``intercept_``."""
        return self.intercept_

    @property
    def feature_names_(self) -> list[Hashable]:
        """Input feature names, in the order of the model's columns."""
        return list(self._space.names) if self._space is not None else []

    # ---------------------------------------------------------------------- feature handling

    def _parse_targets(self, ys: Iterable[object]) -> np.ndarray:
        raise NotImplementedError

    def _vectorize(
        self, space: FeatureSpace, data: list[Mapping[Hashable, object]] | pd.DataFrame
    ) -> tuple[np.ndarray, list[Hashable]]:
        if isinstance(data, pd.DataFrame):
            return _frame_to_rows(space, data)
        return space.vectorize_many(data)

    def _map_seed(self) -> int:
        """The seed of the random Fourier map: ``seed``, or the one drawn for the model when it
        was made (kept in its checkpoints, so that a restored model draws a new feature's row
        as the original would), or, for a model pickled before that was so, a new one (kept
        by the update that commits it)."""
        if self._fourier_seed is not None:
            return self._fourier_seed
        if self.seed is not None:
            return int(self.seed)
        return int(np.random.SeedSequence().generate_state(1, np.uint64)[0])

    def _check_kernel_scale(self, rows: np.ndarray) -> tuple[Any, ...]:
        """Before ``rows`` are learned (once nothing else can refuse them): gamma against the
        features' scale, as the engine's models check it against their stored points, once
        SCALE_CHECK_POINTS samples were added and again every SCALE_CHECK_EVERY. At 10
        standardized features (Phishing's, to degree 2) the default gamma = 1 left an "rff"
        classifier at 59 % accuracy, silently.

        The scale is the mean squared distance between samples, twice the features' summed
        variance, over the samples added since the last check: every one up to the first
        check, then one in SCALE_CHECK_STRIDE (its cost amortized); each feature's mean and
        sum of squared deviations are merged batch by batch (Chan et al.), so no sample is
        kept. Returns the statistics and schedule the update commits."""
        mean, m2, count = self._scale_mean, self._scale_m2, self._scale_count
        added = self._samples_added
        step = 1 if added < SCALE_CHECK_POINTS else SCALE_CHECK_STRIDE
        taken = rows[(-added) % step :: step]
        if taken.shape[0]:
            width = rows.shape[1]
            mean = _padded(mean, width)
            m2 = _padded(m2, width)
            # (A value past 1e154, finite, overflows the squares: the sums are then inf or
            # NaN until the next check starts them afresh, and that check says nothing.)
            with np.errstate(over="ignore", invalid="ignore"):
                batch_mean = taken.mean(axis=0)
                batch_m2 = ((taken - batch_mean) ** 2).sum(axis=0)
                total = count + taken.shape[0]
                delta = batch_mean - mean
                mean = mean + delta * (taken.shape[0] / total)
                m2 = m2 + batch_m2 + delta * delta * (count * taken.shape[0] / total)
            count = total
        added += rows.shape[0]
        due = self._next_scale_check
        if added >= due:
            if count >= 2:
                with np.errstate(over="ignore", invalid="ignore"):
                    distance = 2.0 * float(m2.sum()) / (count - 1)
            if count >= 2 and math.isfinite(distance):
                warn_kernel_scale(self, gamma_scale_message(
                    self.gamma, distance,
                    f"the mean squared distance between samples learned (over {count} of them)",
                    "mean", "the random features of samples even close together are unrelated: "
                    "the model learns next to nothing that carries to new samples"))
            mean = m2 = None
            count, due = 0, added + SCALE_CHECK_EVERY
        return mean, m2, count, added, due

    def _fourier_map(self, seed: int, names: list[Hashable], omega: np.ndarray | None,
                     phase: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """The map's frequencies over ``names`` (``omega`` holds the first rows, for the names
        already mapped) and its phases, drawing what is missing under ``seed``.

        exp(-gamma ||x - x'||^2) is the characteristic function of N(0, 2 gamma I) (Rahimi &
        Recht), hence the frequencies' scale. Each name's row comes from its own stream (the
        seed and the name), so a feature that first appears later gets the row it would have
        had from the start; the samples learned before it read 0 for it, so their image under
        the grown map is the one they were learned with, and learning stays exact."""
        if phase is None:
            phase = np.random.default_rng([seed, _PHASE_STREAM]).uniform(
                0.0, 2.0 * math.pi, size=self.n_components)
        known = 0 if omega is None else omega.shape[0]
        if known == len(names) and omega is not None:
            return omega, phase
        scale = math.sqrt(2.0 * self.gamma)
        rows = np.empty((len(names) - known, self.n_components))
        for i, name in enumerate(names[known:]):
            stream = np.random.default_rng([seed, _FREQUENCY_STREAM, *_name_words(name)])
            rows[i] = stream.normal(scale=scale, size=self.n_components)
        return (rows if omega is None else np.vstack([omega, rows])), phase

    def _design(
        self, rows: np.ndarray, omega: np.ndarray | None, phase: np.ndarray | None,
        learning: bool = True,
    ) -> np.ndarray:
        """Map input rows to the model's columns: (bias,) then phi(x). ``learning``: the
        angles summed in a fixed order (what forgetting a sample must subtract again, to the
        bit, whatever the map's width by then); a prediction takes the BLAS's product, up to
        6x faster on wide dense rows."""
        if self.features == "rff":
            assert omega is not None and phase is not None
            with np.errstate(over="ignore", invalid="ignore"):
                if learning:
                    angles = np.empty((len(rows), self.n_components))
                    _pathcore.fourier_angles(np.ascontiguousarray(rows, dtype=float),
                                             np.ascontiguousarray(omega), phase, angles)
                else:
                    angles = rows @ omega + phase
            if not np.isfinite(angles).all():
                raise ValueError(
                    "the features are too large for the random Fourier map (their products with "
                    "its frequencies overflow); nothing was learned or predicted"
                )
            mapped = math.sqrt(2.0 / self.n_components) * np.cos(angles)
        else:
            mapped = rows
        if self.fit_intercept:
            return np.hstack([np.ones((len(rows), 1)), mapped])
        return mapped

    def _prediction_design(
        self, data: list[Mapping[Hashable, object]] | pd.DataFrame
    ) -> np.ndarray | None:
        """Design matrix for prediction; None before the model has seen any feature."""
        if self._space is None:
            # Still validate, so that bad input is reported even before training.
            self._vectorize(FeatureSpace(), data)
            return None
        rows, unknown = self._vectorize(self._space, data)
        self._space.warn_misnamed(unknown)
        # A feature never learned has a linear weight of 0, and no row of Fourier frequencies
        # yet (it reads 0, as a missing one does): its columns are dropped.
        rows = rows[:, : len(self._space)]
        return self._design(rows, self._omega, self._phase, learning=False)

    def _decisions(self, data: list[Mapping[Hashable, object]] | pd.DataFrame) -> np.ndarray:
        design = self._prediction_design(data)
        count = len(data)
        if design is None:
            return np.zeros(count)
        # Features too large for the model overflow to inf here: the predictions refuse it
        # (finite_score), a decision function returns it; numpy's warning would be noise.
        with np.errstate(over="ignore", invalid="ignore"):
            return design @ self._solution

    # ------------------------------------------------------------------------------ updating

    def _update(
        self,
        add: list[Mapping[Hashable, object]] | pd.DataFrame,
        add_targets: Iterable[object],
        remove: list[Mapping[Hashable, object]] | pd.DataFrame,
        remove_targets: Iterable[object],
        removing_learned: bool = False,
    ) -> list[tuple[dict[Hashable, float], Any]]:
        """Add and remove samples in one exact step; validates everything before committing.
        Returns the added samples as learned (for those kept under a key): their non-zero
        features as floats and their labels or targets as parsed, as a checkpoint restores
        them. ``removing_learned``: the removed samples are ones kept under their keys, so a
        failed solve is blamed on the conditioning, not on a sample never learned."""
        y_add = self._parse_targets(add_targets)
        y_remove = self._parse_targets(remove_targets)
        if len(y_add) != len(add):
            raise ValueError(f"got {len(add)} samples to add but {len(y_add)} targets")
        if len(y_remove) != len(remove):
            raise ValueError(f"got {len(remove)} samples to forget but {len(y_remove)} targets")
        n_after = self.n_samples_ + len(add) - len(remove)
        if len(remove) and n_after < 0:
            raise ValueError(
                f"cannot forget {len(remove)} samples: the model holds "
                f"{self.n_samples_ + len(add)} (it cannot forget samples it never learned)"
            )
        if not len(add) and not len(remove):
            return []

        space, omega, phase = self._space, self._omega, self._phase
        if space is None:
            space = FeatureSpace()
        staged = FeatureSpace(space.names)
        rows_add, new = self._vectorize(staged, add)
        check_feature_names(new)
        self._check_feature_bounds(len(new), len(staged) + len(new))
        staged.add(new)
        rows_remove, unknown = self._vectorize(staged, remove)
        if unknown:
            raise ValueError(
                f"cannot forget a sample with the features {unknown!r}: the model never learned "
                "them, so this sample was never added"
            )
        seed = None
        if self.features == "rff":
            seed = self._map_seed()
            omega, phase = self._fourier_map(seed, staged.names, omega, phase)

        design = np.vstack(
            [
                self._design(rows_add, omega, phase),
                self._design(rows_remove[:, : len(staged)], omega, phase),
            ]
        ) if len(remove) else self._design(rows_add, omega, phase)
        signs = np.concatenate([np.ones(len(add)), -np.ones(len(remove))])
        targets = np.concatenate([y_add, y_remove])
        # Phi_c Phi_c'^T and Phi_c y_c of Lee et al.'s eq. (7), in one product each.
        signed = design * signs[:, None]
        with np.errstate(over="ignore", invalid="ignore"):
            gram_delta = design.T @ signed
            rhs_delta = signed.T @ targets
        if not (np.isfinite(gram_delta).all() and np.isfinite(rhs_delta).all()):
            # (a feature of 1e200: its square overflows; the error below would have blamed
            # a forget that was never learned)
            raise ValueError(
                "the samples' features or targets are too large: their products overflow "
                "(Phi Phi^T, Phi y); the model is unchanged"
            )

        width = design.shape[1]
        gram_hi, gram_lo, rhs_hi, rhs_lo = self._grown_state(width)
        regularization = self._regularization(width)
        new_gram_hi, new_gram_lo = _two_sum(gram_hi, gram_lo, gram_delta)
        new_rhs_hi, new_rhs_lo = _two_sum(rhs_hi, rhs_lo, rhs_delta)

        magnitudes = np.abs(design)
        gram_terms = self._gram_terms + float((magnitudes * magnitudes).sum(axis=0).max(
            initial=0.0))
        rhs_terms = self._rhs_terms + float((magnitudes * np.abs(targets)[:, None]).sum(
            axis=0).max(initial=0.0))
        if len(remove):
            self._check_removal(
                np.diag(gram_hi) + np.diag(gram_lo),
                np.diag(new_gram_hi) + np.diag(new_gram_lo),
                regularization,
                design,
                signs,
                _rounding_of(gram_terms),
            )
        countdown = self._conditioning_countdown - 1
        if n_after == 0:
            # What the samples held now leave is judged against their own size (1e-8 of it);
            # the rounding of every product summed since the model was empty, against those
            # products (64 eps of them: a rounded product's error, summed; any looser and a
            # sample never learned would pass once large ones had come and gone).
            residue = np.abs(new_gram_hi + new_gram_lo - np.diag(regularization)).max()
            scale = max(1e-8 * np.abs(gram_hi - np.diag(regularization)).max(),
                        _rounding_of(gram_terms))
            rhs_residue = np.abs(new_rhs_hi + new_rhs_lo).max()
            rhs_scale = max(1e-8 * (np.abs(rhs_hi).max() + np.abs(rhs_delta).max()),
                            _rounding_of(rhs_terms))
            if residue > scale or rhs_residue > rhs_scale:
                raise ValueError(
                    "these samples cannot be all the model learned: removing them leaves a "
                    f"residue of {max(residue, rhs_residue):.3g} in Phi Phi^T or Phi y"
                )
            # Exactly the empty model: drop the rounding residue.
            new_gram_hi, new_gram_lo = np.diag(regularization), np.zeros((width, width))
            new_rhs_hi, new_rhs_lo = np.zeros(width), np.zeros(width)
            solution = np.zeros(width)
        else:
            # Without a removal, only the size of the features can make the system singular
            # in floating point (products of 1e100 and -1e100 swamp rho).
            conditioning = ("the features are too large next to rho for a solve in floating "
                            "point; scale them, or raise rho")
            cause = ("a sample being forgotten was not learned by the model (or differs from "
                     f"the one learned), or {conditioning}"
                     if len(remove) and not removing_learned else conditioning)
            try:
                factor = cho_factor(new_gram_hi + new_gram_lo, lower=True, check_finite=False)
            except LinAlgError:
                raise ValueError(
                    f"this update leaves rho I + Phi Phi^T not positive definite: {cause}; "
                    "the model is unchanged") from None
            solution = cho_solve(factor, new_rhs_hi + new_rhs_lo, check_finite=False)
            if not np.isfinite(solution).all():
                raise ValueError(f"the updated system is numerically singular: {cause}; the "
                                 "model is unchanged")
            # (Every CONDITIONING_CHECK_EVERY updates: each check costs a few microseconds,
            # 3 us for the estimate alone at 10 features, a few % of an update.)
            if self._conditioning_countdown <= 0:
                self._warn_of_conditioning(factor[0], new_gram_hi)
                countdown = CONDITIONING_CHECK_EVERY - 1  # (this update is the first of them)

        if self.features == "rff" and len(add):
            (scale_mean, scale_m2, scale_count, samples_added,
             next_scale_check) = self._check_kernel_scale(rows_add)
        # Commit.
        self._space = staged
        self._omega, self._phase, self._fourier_seed = omega, phase, seed
        if self.features == "rff" and len(add):
            self._scale_mean, self._scale_m2, self._scale_count = (scale_mean, scale_m2,
                                                                   scale_count)
            self._samples_added, self._next_scale_check = samples_added, next_scale_check
        self._gram_hi, self._gram_lo = new_gram_hi, new_gram_lo
        self._rhs_hi, self._rhs_lo = new_rhs_hi, new_rhs_lo
        self._gram_terms, self._rhs_terms = (0.0, 0.0) if n_after == 0 else (gram_terms,
                                                                           rhs_terms)
        self._solution = solution
        self._conditioning_countdown = countdown
        self.n_samples_ = n_after
        names = staged.names
        return [({names[i]: float(row[i]) for i in np.flatnonzero(row)},
                 self._target_value(float(target)))
                for row, target in zip(rows_add, y_add, strict=True)]

    def _warn_of_conditioning(self, factor: np.ndarray, gram: np.ndarray) -> None:
        """Warn (once per process and model type; kept for each model's warnings_of) when the
        normal equations just solved are so ill-conditioned that float64's solution may be
        off by more than CONDITIONING_WARNING of its size: one sample of features 1e7 among
        11 unit-scale ones left decision values 3e-4 off (1e8: 1e-2), without a word.

        ``factor`` is the lower Cholesky factor of ``gram`` (rho I + Phi Phi^T)."""
        # The system scaled to a unit diagonal (its diagonal is positive: rho, or for the
        # bias the number of samples held), whose factor is the factor's rows scaled alike.
        scale = 1.0 / np.sqrt(np.diag(gram))
        scaled_factor = factor * scale[:, None]
        pivots = np.diag(scaled_factor)
        # Two estimates of the reciprocal condition number, the smaller taken: the smallest
        # squared pivot (at most 1), and LAPACK's estimate from the factor (dpocon, in the
        # 1-norm), which also sees nearly dependent features whose pivots all stay large
        # (a Kahan-type system of 30 features, condition number 2e10: pivots say 6e1).
        smallest = float((pivots * pivots).min(initial=1.0))
        if smallest > 0:
            norm = float((scale * (np.abs(gram) @ scale)).max())  # (gram is symmetric)
            reciprocal, info = dpocon(scaled_factor, norm, uplo="L")
            if info == 0 and np.isfinite(reciprocal):
                smallest = min(smallest, float(reciprocal))
        if not smallest > 0 or _EPS / smallest > CONDITIONING_WARNING:
            size = f"about {_EPS / smallest:.0e}" if smallest > 0 else "all"
            message = (
                f"{type(self).__name__}: its normal equations (rho I + Phi Phi^T) are so "
                f"ill-conditioned (condition number about {1 / smallest:.0e} once scaled) "
                f"that their float64 solution, and so its decision values, may be off by "
                f"{size} of their size: standardize the features (large raw values, or "
                f"features nearly equal to one another), or raise rho (now {self.rho!r})")
            note_warning(self, "ill-conditioned", message)  # (each model's, for its report)
            if type(self) not in _CONDITIONING_WARNED:
                warnings.warn(message, UserWarning, stacklevel=caller_level())
                # (Only once it is said: a warning made an error refuses the update, and the
                # same update again must raise it again.)
                _CONDITIONING_WARNED.add(type(self))

    def _check_feature_bounds(self, added: int, total: int) -> None:
        # A state over J feature names (J x J, or J x n_components frequencies for "rff"):
        # bounded before anything is built.
        if self.max_new_features is not None and added > self.max_new_features:
            raise ValueError(
                f"this update brings {added} new feature names, more than "
                f"max_new_features={self.max_new_features}; the model is unchanged"
            )
        if self.max_features is not None and total > self.max_features:
            held = ("the random Fourier map holds n_components frequencies per feature name, "
                    "which it keeps for good" if self.features == "rff"
                    else "the state is a J x J matrix over them")
            raise ValueError(
                f"this update would make {total} feature names, more than "
                f"max_features={self.max_features} ({held}); the model is unchanged (raise "
                "max_features, or pass None for no bound, if the features keep coming)"
            )

    def _grown_state(
        self, width: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The current A and Phi y, extended with zeros (and rho) for newly seen features."""
        old = self._rhs_hi.size
        if width == old:
            return self._gram_hi, self._gram_lo, self._rhs_hi, self._rhs_lo
        gram_hi = np.diag(self._regularization(width))
        gram_hi[:old, :old] = self._gram_hi
        gram_lo = np.zeros((width, width))
        gram_lo[:old, :old] = self._gram_lo
        rhs_hi = np.zeros(width)
        rhs_hi[:old] = self._rhs_hi
        rhs_lo = np.zeros(width)
        rhs_lo[:old] = self._rhs_lo
        return gram_hi, gram_lo, rhs_hi, rhs_lo

    def _check_removal(
        self,
        diagonal_before: np.ndarray,
        diagonal_after: np.ndarray,
        regularization: np.ndarray,
        design: np.ndarray,
        signs: np.ndarray,
        rounding: float = 0.0,
    ) -> None:
        # Each diagonal entry of Phi Phi^T is a sum of squares over the held samples: it cannot
        # go below zero by more than rounding if the removed samples were really held. That is
        # a fraction of what the column holds and removes, and what the sums since the model
        # was empty carry (``rounding``): a large sample forgotten leaves its products'
        # rounding beside small ones, and forgetting the last small one was refused.
        removed = design[signs < 0]
        squares_after = diagonal_after - regularization
        scale = diagonal_before - regularization + (removed * removed).sum(axis=0)
        # Only a column the removed samples use can tell: one they leave alone may hold the
        # rounding residue of samples gone before (a relabel's product, rounded with and
        # without a fused multiply-add, leaves -3e-16 where 0 was), and with nothing left to
        # measure it against, it refused every later forget for good.
        touched = (removed != 0).any(axis=0)
        bad = touched & (squares_after < -_ROUNDING_SLACK * scale - rounding
                         - np.finfo(float).tiny)
        if bad.any():
            column = int(np.argmax(bad))
            raise ValueError(
                "cannot forget these samples: their squared values in column "
                f"{self._column_name(column)} exceed what the model holds, so they were not "
                "all learned"
            )

    def _column_name(self, column: int) -> str:
        if self.fit_intercept and column == 0:
            return "intercept (more samples than held)"
        index = column - self._bias_width
        if self.features == "linear" and self._space is not None and index < len(self._space):
            return repr(self._space.names[index])
        return f"component {index}"

    # ----------------------------------------------------------------------- public helpers

    def decision_function_one(self, x: dict) -> float:
        """w^T phi(x) + b (0 before any learning)."""
        return float(self._decisions([x])[0])

    def decision_function_many(self, X: pd.DataFrame) -> pd.Series:
        """w^T phi(x) + b for every row of ``X``."""
        return pd.Series(self._decisions(_frame(X)), index=X.index, dtype=float)

    def learn_one(self, x: dict, y: Any, key: Hashable | None = None) -> None:
        """Add one sample to the training multiset and update the model exactly.

        With a ``key`` the sample is kept (the only case where the model keeps one), so that
        ``forget_one(key=...)`` and ``relabel_one`` can find it; a key already held raises
        KeyError and changes nothing.
        """
        if key is not None:
            self._check_new_keys([key])
        learned = self._update([x], [y], [], [])
        if key is not None:
            self._kept[key] = learned[0]

    def forget_one(self, x: dict | None = None, y: Any = None, key: Hashable | None = None
                   ) -> None:
        """Remove one learned sample: the one learned under ``key``, or the sample ``(x, y)``
        the caller supplies again (the model keeps no sample learned without a key).

        A sample given as ``(x, y)`` that equals one learned under a key is that one (the
        oldest such): its key is forgotten with it. Any other cannot be checked against what
        was learned, since nothing of it is kept: forgetting one that was never learned
        changes the model (only the guards of the module docstring catch some such
        removals). Learn under a ``key`` to have forgets checked."""
        refuse_key_with_value("forget_one", key, x, y)
        if key is not None:
            x, y = self.stored_point(key)
            self._update([], [], [x], [y], removing_learned=True)
            del self._kept[key]
            return
        if x is None or y is None:
            raise forget_without_key_error(
                x, "the key the sample was learned under, or x and y")
        kept = self._kept_by_value([x], [y])
        self._update([], [], [x], [y])
        # A sample learned under a key and forgotten by value is not kept any more: its key
        # would forget it a second time.
        for key in kept:
            del self._kept[key]

    def relabel_one(self, key: Hashable, y: Any) -> None:
        """Give the sample learned under ``key`` the target ``y``: its exact removal and
        re-addition in one update (unknown key: KeyError; the model is unchanged on error)."""
        x, old = self.stored_point(key)
        self._kept[key] = self._update([x], [y], [x], [old], removing_learned=True)[0]

    def learn_many(self, X: pd.DataFrame, y: pd.Series,
                   keys: Iterable[Hashable] | None = None) -> None:
        """Add a batch of samples (Corollary 3 of Lee et al.) in one exact update; with
        ``keys`` (one per row) the samples are kept for forgetting by key. Unlike the SVMs'
        ``learn_many``, X's index does not give keys: an LS-SVM keeps only the samples it is
        asked to (its memory does not grow with the stream otherwise)."""
        _frame_columns(X)
        key_list = None if keys is None else keys_as_list(keys)
        if key_list is not None:
            if len(key_list) != len(X):
                raise ValueError(f"got {len(key_list)} keys for {len(X)} rows of X")
            self._check_new_keys(key_list)
        _check_index(X, y)
        targets = list(y)
        learned = self._update(X, targets, X.iloc[:0], [])
        if key_list is not None:
            self._kept.update(zip(key_list, learned, strict=True))

    def forget_many(self, X: pd.DataFrame | None = None, y: pd.Series | None = None,
                    keys: Iterable[Hashable] | None = None) -> None:
        """Remove a batch of learned samples (Corollary 4) in one exact update: the rows of
        ``X`` with targets ``y``, or the samples learned under ``keys``. Rows given by value
        cannot be checked against what was learned (see :meth:`forget_one`)."""
        refuse_key_with_value("forget_many", keys, X, y)
        if keys is not None:
            key_list = keys_as_list(keys)
            seen: set[Hashable] = set()
            for key in key_list:
                # (as the SVMs refuse it: a key named twice is a caller's slip, which
                # forgetting it once would hide)
                if key in seen:
                    raise KeyError(f"key {key!r} is listed twice for removal; the model is "
                                   "unchanged")
                seen.add(key)
            points = [self.stored_point(key) for key in key_list]
            self._update([], [], [x for x, _ in points], [t for _, t in points],
                         removing_learned=True)
            for key in key_list:
                del self._kept[key]
            return
        if X is not None and y is None and not isinstance(X, pd.DataFrame):
            raise TypeError(
                f"forget_many's first argument is X, a DataFrame (got {type(X).__name__}); "
                "to forget the samples learned under keys pass keys= (forget_many(keys=...))"
            )
        if X is None or y is None:
            raise ValueError("forget_many needs keys, or X and y")
        _frame_columns(X)
        _check_index(X, y)
        targets = list(y)
        kept = self._kept_by_value(X.to_dict("records"), targets)
        self._update(X.iloc[:0], [], X, targets)
        for key in kept:
            del self._kept[key]

    # --------------------------------------------------------------------------- kept samples

    def _check_new_keys(self, keys: list[Hashable]) -> None:
        check_keys(keys)
        seen: set[Hashable] = set()
        for key in keys:
            if key in self._kept:
                raise KeyError(f"a sample is already learned under key {key!r}")
            if key in seen:
                raise KeyError(f"key {key!r} repeats within the batch; keys must be unique")
            seen.add(key)

    def _kept_by_value(self, xs: list[Mapping], ys: list[Any]) -> list[Hashable]:
        """The keys of the kept samples equal to the given ones, each the oldest not already
        taken (samples not kept have no key: none for them)."""
        if not self._kept:
            return []
        # One pass over the kept samples: (features, target) -> their keys, oldest first.
        index: dict[tuple, list[Hashable]] = {}
        targets = self._parse_targets([y for _, y in self._kept.values()])
        for (key, (kept_x, _)), target in zip(self._kept.items(), targets, strict=True):
            values = _nonzero_values(kept_x)
            if values is not None:
                index.setdefault((frozenset(values.items()), float(target)), []).append(key)
        found: list[Hashable] = []
        for x, target in zip(xs, self._parse_targets(ys), strict=True):
            values = _nonzero_values(x)
            keys = None if values is None else index.get((frozenset(values.items()),
                                                          float(target)))
            if keys:
                found.append(keys.pop(0))
        return found

    def __contains__(self, key: object) -> bool:
        if isinstance(key, (bool, np.bool_)):
            return False  # (True == 1: the sample kept under 1 is not True's, which is none)
        try:
            return key in self._kept
        except TypeError:  # unhashable
            return False

    @property
    def n_stored(self) -> int:
        """Samples kept because they were learned under a key (``n_samples_`` counts all)."""
        return len(self._kept)

    def stored_keys(self) -> list[Hashable]:
        """Keys of the samples learned under a key and not forgotten, oldest first."""
        return list(self._kept)

    def stored_point(self, key: Hashable) -> tuple[dict[Hashable, float], Any]:
        """The sample learned under ``key`` as the model learned it (KeyError if none): its
        non-zero features as floats, and its target as a float (regression) or its label as
        the class it stands for (classification), the same before and after a checkpoint.

        >>> model = IncrementalLSSVC()
        >>> model.learn_one({"a": 2, "b": 0, "c": None}, 1, key="p")
        >>> model.stored_point("p")
        ({'a': 2.0}, True)
        """
        if key not in self:
            unkeyed = self.n_samples_ - len(self._kept)
            raise KeyError(f"no sample is learned under key {key!r}" + (
                f"; {unkeyed} sample(s) were learned without keys (learn_one without key=, "
                "learn_many without keys=: an LS-SVM takes no keys from a DataFrame's index) "
                "and are not kept: forget them by value, forget_one(x, y)" if unkeyed > 0
                else ""))
        x, y = self._kept[key]
        return dict(x), y

    # ----------------------------------------------------------------------------- checkpoints

    def to_checkpoint(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """The model as numpy arrays (no object dtype) and JSON-ready metadata.

        >>> model = IncrementalLSSVR(rho=0.5)
        >>> model.learn_one({"a": 1.0}, 2.0, key="p")
        >>> arrays, meta = model.to_checkpoint()
        >>> restored = IncrementalLSSVR.from_checkpoint(arrays, meta)
        >>> restored.predict_one({"a": 1.0}) == model.predict_one({"a": 1.0})
        True
        """
        names = self.feature_names_
        plain_names = checkpoint_names(names)
        keys = list(self._kept)
        index = {name: i for i, name in enumerate(names)}
        rows = np.zeros((len(keys), len(names)))
        targets = np.zeros(len(keys))
        for i, key in enumerate(keys):
            x, y = self._kept[key]
            for name, value in x.items():
                if value is not None and name in index:
                    rows[i, index[name]] = float(value)
            targets[i] = self._parse_targets([y])[0]
        arrays = {
            "gram_hi": self._gram_hi, "gram_lo": self._gram_lo,
            "rhs_hi": self._rhs_hi, "rhs_lo": self._rhs_lo, "solution": self._solution,
            "X": rows, "y": targets, **keys_to_arrays(keys),
        }
        # Always written (empty before the map is drawn), so that every checkpoint of a model
        # has the same members.
        arrays["omega"] = (self._omega if self._omega is not None
                           else np.zeros((0, self.n_components)))
        arrays["phase"] = self._phase if self._phase is not None else np.zeros(0)
        params, callables = checkpoint_params(self)  # callables: given back on restore
        meta = {
            "class": type(self).__name__,
            "params": params,
            "callables": callables,
            "features": plain_names,
            "has_space": self._space is not None,
            # (the map's seed as text: JSON readers other than Python's lose digits past 2^53)
            "fourier_seed": None if self._fourier_seed is None else str(self._fourier_seed),
            "n_samples": self.n_samples_,
            # (None past the largest float: JSON has no inf, and the restore then falls back)
            "roundoff_terms": [t if math.isfinite(t) else None
                               for t in (self._gram_terms, self._rhs_terms)],
        }
        return arrays, meta

    @classmethod
    def from_checkpoint(cls, arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any],
                        **callables: Any):
        """Rebuild a model saved by :meth:`to_checkpoint`; ValueError if the arrays do not fit
        together (a damaged or foreign checkpoint), or if the model had a callable parameter
        that is not passed back (a checkpoint holds no Python function)."""
        check_checkpoint_meta(meta, {"class": JSON_TEXT})
        if meta["class"] != cls.__name__:
            raise ValueError(
                f"checkpoint holds a model of class {meta['class']!r}, not {cls.__name__}")
        check_checkpoint_meta(meta, {"params": JSON_TABLE, "features": JSON_LIST,
                                     "has_space": JSON_FLAG, "n_samples": JSON_COUNT})
        model = cls(**restored_params(cls, meta, callables))
        names = restored_names(meta["features"])
        has_space = meta["has_space"]
        width = model._bias_width + (model.n_components if model.features == "rff"
                                     else len(names))
        expected = {"gram_hi": (width, width), "gram_lo": (width, width), "rhs_hi": (width,),
                    "rhs_lo": (width,), "solution": (width,)}
        if model.features == "rff" and has_space:
            expected.update(omega=(len(names), model.n_components), phase=(model.n_components,))
        check_checkpoint_members(arrays, [*expected, "X", "y"])
        for name, shape in expected.items():
            value = np.asarray(arrays[name])
            # (float64 as written: a float32 or text copy has lost digits of the model)
            if (value.dtype != np.float64 or value.shape != shape
                    or not np.isfinite(value).all()):
                raise ValueError(f"checkpoint member {name!r} must be finite float64 values "
                                 f"with shape {shape}")
        rows = np.asarray(arrays["X"], dtype=float)
        targets = np.asarray(arrays["y"], dtype=float)
        keys = keys_from_arrays(arrays)
        if rows.shape != (len(keys), len(names)) or targets.shape != (len(keys),):
            raise ValueError("checkpoint members 'X', 'y' and the keys do not fit together")
        if not (np.isfinite(rows).all() and np.isfinite(targets).all()):
            # (A NaN read as 0 made forget_one remove another sample than the one learned.)
            raise ValueError("the checkpoint's kept samples hold values that are not finite")
        if len(set(names)) != len(names) or len(set(keys)) != len(keys):
            raise ValueError("the checkpoint's feature names or kept samples' keys repeat")
        if len(keys) > meta["n_samples"]:
            raise ValueError(f"the checkpoint keeps {len(keys)} samples but has learned "
                             f"{meta['n_samples']}")
        # The solution must solve the system it is stored with (as a backward-stable solve
        # does, whatever its conditioning): an edited one would answer until the next update
        # replaced it.
        gram = np.asarray(arrays["gram_hi"], dtype=float) + np.asarray(arrays["gram_lo"],
                                                                       dtype=float)
        rhs = np.asarray(arrays["rhs_hi"], dtype=float) + np.asarray(arrays["rhs_lo"],
                                                                     dtype=float)
        solution = np.asarray(arrays["solution"], dtype=float)
        with np.errstate(over="ignore", invalid="ignore"):
            residual = float(np.abs(gram @ solution - rhs).max(initial=0.0))
            scale = float(np.abs(gram).sum(axis=1).max(initial=0.0)
                          * np.abs(solution).max(initial=0.0) + np.abs(rhs).max(initial=0.0))
        # (Plus the underflow of subnormal terms: targets of 1e-320 are legitimate. Terms past
        # the largest float, as a solution of 1e308 gives, are no solution of a finite system.)
        if (not math.isfinite(scale) or not math.isfinite(residual)
                or residual > max(1e-8 * scale, 1e4 * np.finfo(float).tiny)):
            raise ValueError(f"the checkpoint's solution does not solve its system (residual "
                             f"{residual:.3g} for terms of {scale:.3g}): a damaged or edited "
                             "checkpoint")
        model._gram_hi = np.array(arrays["gram_hi"], dtype=float)
        model._gram_lo = np.array(arrays["gram_lo"], dtype=float)
        model._rhs_hi = np.array(arrays["rhs_hi"], dtype=float)
        model._rhs_lo = np.array(arrays["rhs_lo"], dtype=float)
        model._solution = np.array(arrays["solution"], dtype=float)
        if "omega" in expected:
            model._omega = np.array(arrays["omega"], dtype=float)
            model._phase = np.array(arrays["phase"], dtype=float)
        model._space = FeatureSpace(names) if has_space else None
        fourier_seed = meta.get("fourier_seed")
        if fourier_seed is not None:
            if not (isinstance(fourier_seed, str) and fourier_seed.isascii()
                    and fourier_seed.isdigit() and int(fourier_seed) < 2**64):
                raise ValueError("checkpoint metadata 'fourier_seed' must be the text of an "
                                 f"integer in [0, 2^64), got {fourier_seed!r}")
            model._fourier_seed = int(fourier_seed)
        model.n_samples_ = int(meta["n_samples"])
        terms = meta.get("roundoff_terms")
        if (isinstance(terms, list) and len(terms) == 2
                and all(isinstance(t, (int, float)) and 0 <= t < math.inf for t in terms)):
            model._gram_terms, model._rhs_terms = float(terms[0]), float(terms[1])
        elif model.n_samples_:
            # A checkpoint from before they were kept, or of terms past the largest float: not
            # known, so only the state's own size counts (as it did then).
            model._gram_terms, model._rhs_terms = math.inf, math.inf
        for key, row, target in zip(keys, rows, targets, strict=True):
            x = {names[i]: float(row[i]) for i in np.flatnonzero(row)}
            model._kept[key] = (x, model._target_value(float(target)))
        return model

    def _target_value(self, target: float) -> Any:
        """The label or target a parsed target stands for (the inverse of _parse_targets)."""
        return target

    def update_many(
        self,
        X_add: pd.DataFrame,
        y_add: pd.Series,
        X_remove: pd.DataFrame,
        y_remove: pd.Series,
    ) -> None:
        """Add ``X_add`` and remove ``X_remove`` in one exact step (Theorem 1, eqs. 5-6). A
        removed sample that equals one learned under a key is that one, as for
        :meth:`forget_many`: its key is forgotten with it."""
        _frame_columns(X_add)
        _frame_columns(X_remove)
        _check_index(X_add, y_add, "y_add")
        _check_index(X_remove, y_remove, "y_remove")
        removed = list(y_remove)
        kept = self._kept_by_value(X_remove.to_dict("records"), removed)
        self._update(X_add, list(y_add), X_remove, removed)
        for key in kept:  # (its key would forget it a second time)
            del self._kept[key]

    def _state_size(self) -> int:
        """Bytes held in arrays; depends on the feature dimension only, never on n_samples_."""
        arrays = [self._gram_hi, self._gram_lo, self._rhs_hi, self._rhs_lo, self._solution]
        arrays += [a for a in (self._omega, self._phase) if a is not None]
        return sum(a.nbytes for a in arrays)


_PARAMETERS_DOC = """
    Parameters
    ----------
    rho
        Regularization constant (> 0) of ``rho ||w||^2 + sum_n (w^T phi(x_n) + b - y_n)^2``.
    features
        ``"linear"``: phi is the identity over the input features, in first-seen order; a
        feature seen later extends w with a zero. ``"rff"``: random Fourier features
        approximating the RBF kernel exp(-gamma ||x - x'||^2), cos(omega' x + phase) over
        n_components frequencies; each input feature's row of omega is drawn from ``seed`` and
        the feature's name when the feature is first learned, so a feature may appear at any
        time (the samples before it read 0 for it: the update stays exact) and the order the
        features come in never matters. Missing features read 0 under both maps; a feature
        never learned is ignored in predictions.
    n_components
        Number of random Fourier features (``"rff"`` only).
    gamma
        RBF kernel width (``"rff"`` only).
    fit_intercept
        Learn an unregularized bias b (it is not shrunk by rho, as in Suykens' LS-SVM).
    seed
        Seed of the random Fourier map; the same seed gives the same map (None: one drawn when
        the model is made, and kept by its copies and checkpoints).
    max_features
        Bound on the input feature names (None: no bound); an update that would exceed it
        raises ValueError and changes nothing. With ``"linear"`` the state is a J x J matrix
        over them (two, with compensated sums: 16 J^2 bytes, 16 MB at the default 1000); with
        ``"rff"`` it is n_components wide whatever J, and the map keeps n_components
        frequencies per name (8 J n_components bytes: 0.8 MB per 1,000 names at 100
        components), so features that keep coming (one-hot encoded ids) can take a larger
        bound.
    max_new_features
        Bound on the feature names one update may add (None: no bound).

    Forgetting: ``forget_one(x, y)`` removes a sample the caller supplies again. A sample
    learned with ``learn_one(x, y, key=k)`` (or ``learn_many(X, y, keys=...)``) is kept, so
    that ``forget_one(key=k)`` and ``relabel_one(k, y)`` find it; only keyed samples are kept.
"""


class IncrementalLSSVC(_IncrementalLSSVM, base.MiniBatchClassifier):
    """Least-squares SVM classifier with exact learning and forgetting, keeping no sample.

    Binary labels: True/1 are the positive class (target +1), False/0/-1 the negative one
    (target -1); with ``classes=[negative, positive]`` (e.g. ``["ham", "spam"]``) exactly those
    two labels, which predictions then return. The model is always the closed-form LS-SVM of
    the multiset of samples learned and not forgotten (Lee et al., Theorem 1), whatever the
    order and batching of the updates. It keeps a (J + 1) x (J + 1) matrix (over the
    n_components random features with ``"rff"``, which also keeps their frequencies per input
    feature) and no sample learned without a key: to forget such a sample the caller supplies
    it again. A sample that was never learned cannot always be recognized; see the module
    documentation for what is guarded.

    ``predict_proba_one`` reads the decision value f as an estimate of E[y | x] = 2 p - 1,
    which is what least squares on +-1 targets estimates: p = clip((1 + f) / 2, 0, 1). It is
    not calibrated beyond that.
    {parameters}
    Examples
    --------
    >>> from stream_svm import IncrementalLSSVC
    >>> model = IncrementalLSSVC(rho=0.1)
    >>> for x, y in [({{"a": 1.0}}, True), ({{"a": -1.0}}, False), ({{"a": 3.0}}, False)]:
    ...     model.learn_one(x, y)
    >>> round(model.decision_function_one({{"a": 3.0}}), 4)
    -0.3333
    >>> model.forget_one({{"a": 3.0}}, False)  # as if it had never been learned
    >>> round(model.decision_function_one({{"a": 3.0}}), 4), model.predict_one({{"a": 3.0}})
    (2.8571, True)
    """

    def __init__(
        self,
        rho: float = 1.0,
        features: str = "linear",
        n_components: int = 100,
        gamma: float = 1.0,
        fit_intercept: bool = True,
        seed: int | None = None,
        max_features: int | None = 1000,
        max_new_features: int | None = None,
        classes: list | tuple | None = None,
    ) -> None:
        self._classes = check_classes(classes)
        self.classes = classes
        super().__init__(rho=rho, features=features, n_components=n_components, gamma=gamma,
                         fit_intercept=fit_intercept, seed=seed, max_features=max_features,
                         max_new_features=max_new_features)

    def _parse_targets(self, ys: Iterable[object]) -> np.ndarray:
        return label_signs(ys, self._classes)

    def _target_value(self, target: float) -> Any:
        return class_of(target > 0, self._classes)

    @classmethod
    def _unit_test_params(cls) -> Iterable[dict[str, Any]]:
        yield {}
        yield {"features": "rff", "n_components": 20, "gamma": 0.1, "rho": 0.5, "seed": 3}

    @staticmethod
    def decision_to_proba(decisions: np.ndarray | float) -> np.ndarray:
        """The probability of the positive class for decision values f: clip((1 + f) / 2),
        as :meth:`predict_proba_one` gives it."""
        return np.clip((1.0 + np.asarray(decisions, dtype=float)) / 2.0, 0.0, 1.0)

    def predict_proba_one(self, x: dict, **kwargs: Any) -> dict[Any, float]:
        p = _probability(finite_score(self.decision_function_one(x)))
        return {class_of(False, self._classes): 1.0 - p, class_of(True, self._classes): p}

    def predict_one(self, x: dict, **kwargs: Any) -> Any:
        return class_of(finite_score(self.decision_function_one(x)) > 0.0, self._classes)

    def predict_proba_many(self, X: pd.DataFrame) -> pd.DataFrame:
        p = self.decision_to_proba(finite_scores(self._decisions(_frame(X)), X.index))
        return pd.DataFrame({class_of(False, self._classes): 1.0 - p,
                             class_of(True, self._classes): p}, index=X.index)

    def predict_many(self, X: pd.DataFrame) -> pd.Series:
        positive = finite_scores(self._decisions(_frame(X)), X.index) > 0.0
        if self._classes is None:
            return pd.Series(positive, index=X.index, dtype=bool)
        return pd.Series(classes_of(positive, self._classes),
                         index=X.index, dtype=object)


class IncrementalLSSVR(_IncrementalLSSVM, base.MiniBatchRegressor):
    """Least-squares SVM regressor (kernel ridge regression in phi) with exact forgetting.

    The same engine as :class:`IncrementalLSSVC` with real-valued targets: the model is the
    closed-form solution on the multiset of samples learned and not forgotten, and it keeps no
    sample.
    {parameters}
    Examples
    --------
    >>> from stream_svm import IncrementalLSSVR
    >>> model = IncrementalLSSVR(rho=1e-6)
    >>> for t in range(5):
    ...     model.learn_one({{"t": float(t)}}, 2.0 * t + 1.0)
    >>> round(model.predict_one({{"t": 10.0}}), 4)
    21.0
    >>> model.forget_one({{"t": 4.0}}, 9.0)
    >>> model.n_samples_
    4
    """

    def __init__(
        self,
        rho: float = 1.0,
        features: str = "linear",
        n_components: int = 100,
        gamma: float = 1.0,
        fit_intercept: bool = True,
        seed: int | None = None,
        max_features: int | None = 1000,
        max_new_features: int | None = None,
    ) -> None:
        # (Its own, so that a wrong parameter, as in clone({"C": 1}), names this class.)
        super().__init__(rho=rho, features=features, n_components=n_components, gamma=gamma,
                         fit_intercept=fit_intercept, seed=seed, max_features=max_features,
                         max_new_features=max_new_features)

    def _parse_targets(self, ys: Iterable[object]) -> np.ndarray:
        return np.array([real_target(y) for y in ys], dtype=float)

    @classmethod
    def _unit_test_params(cls) -> Iterable[dict[str, Any]]:
        yield {}
        yield {"features": "rff", "n_components": 20, "gamma": 0.01, "rho": 0.5, "seed": 3}

    def predict_one(self, x: dict, **kwargs: Any) -> float:
        return finite_score(self.decision_function_one(x))

    def predict_many(self, X: pd.DataFrame) -> pd.Series:
        return pd.Series(finite_scores(self._decisions(_frame(X)), X.index), index=X.index,
                         dtype=float)


IncrementalLSSVC.__doc__ = (IncrementalLSSVC.__doc__ or "").format(parameters=_PARAMETERS_DOC)
IncrementalLSSVR.__doc__ = (IncrementalLSSVR.__doc__ or "").format(parameters=_PARAMETERS_DOC)


def _padded(values: np.ndarray | None, width: int) -> np.ndarray:
    """Per-feature statistics over ``width`` features, zeros for those not seen yet (a
    feature absent from the samples so far read 0 in each)."""
    if values is None:
        return np.zeros(width)
    if values.size == width:
        return values
    return np.concatenate([values, np.zeros(width - values.size)])


def _probability(decision: float) -> float:
    return min(1.0, max(0.0, (1.0 + decision) / 2.0))

