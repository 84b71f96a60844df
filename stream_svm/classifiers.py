"""River classifiers on the exact path-following engine.

The estimator classes only translate River's dict/DataFrame world into the engine's rows and
keys; all learning and unlearning is :class:`stream_svm.engine.PathEngine`'s.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Hashable, Iterable, Iterator, Mapping
from typing import Any

import numpy as np
import pandas as pd
from river import base

from stream_svm._engine_model import (
    ENGINE_META,
    JSON_COUNT,
    JSON_TEXT,
    AutoKey,
    _EngineModel,
    check_checkpoint_meta,
    check_restored_auto_keys,
    check_restored_names,
    checkpoint_counters,
    checkpoint_names,
    checkpoint_params,
    forget_without_key_error,
    keys_from_arrays,
    keys_to_arrays,
    refuse_key_with_value,
    refused_unchanged,
    restore_counters,
    restored_names,
    restored_params,
    stored_rows_frame,
)
from stream_svm._input import (
    FeatureSpace,
    check_classes,
    check_paired,
    class_of,
    classes_of,
    finite_score,
    finite_scores,
    key_list,
    label_sign,
    label_signs,
    real_to_float,
)
from stream_svm._window import _SlidingWindow

__all__ = ["AutoKey", "IncrementalSVC", "SlidingWindowSVC", "proba_from_decision"]


def proba_from_decision(score: np.ndarray | float) -> np.ndarray | float:
    """The probability of the True class that ``predict_proba_*`` reports for a decision value:
    p = 1 / (1 + exp(-f)), a monotone squashing, not a calibration.

    >>> float(proba_from_decision(0.0))
    0.5
    """
    return 0.5 * (1.0 + np.tanh(0.5 * np.asarray(score, dtype=float)))


_sigmoid = proba_from_decision


class _EngineClassifier(_EngineModel, base.MiniBatchClassifier):
    """What every engine-backed binary classifier shares: vectorizing, predicting, counters."""

    def _init_engine(self) -> None:
        self._init_common()
        self._classes = check_classes(self.classes)

    @property
    def _multiclass(self) -> bool:
        return False

    # ---------------------------------------------------------------- labels
    def _sign(self, y: object) -> float:
        return label_sign(y, self._classes)

    def _signs(self, ys: Iterable[object]) -> np.ndarray:
        return label_signs(ys, self._classes)

    def _class(self, positive: bool) -> object:
        return class_of(positive, self._classes)

    @staticmethod
    def decision_to_proba(decisions: np.ndarray | float) -> np.ndarray:
        """The probability of the positive class for decision values f(x):
        1 / (1 + exp(-f(x))), as :meth:`predict_proba_one` gives it."""
        return np.asarray(_sigmoid(np.asarray(decisions, dtype=float)), dtype=float)

    def _support_positions(self) -> np.ndarray:
        engine = self._engine
        support = np.flatnonzero(engine.alpha > 0)
        return support[np.argsort(engine.sequence[support], kind="stable")]

    def support_vectors(self) -> pd.DataFrame:
        """The support vectors (stored points with alpha > 0, oldest first) as a DataFrame
        indexed by key, one column per feature name.

        >>> model = IncrementalSVC(C=1.0, kernel="linear")
        >>> model.learn_one({"a": 1.0}, True, key="p")
        >>> model.learn_one({"a": -1.0}, False, key="n")
        >>> model.support_vectors()
             a
        p  1.0
        n -1.0
        """
        positions = self._support_positions()
        keys = self._engine.keys
        return stored_rows_frame(self._engine.X, positions, [keys[i] for i in positions],
                                 list(self._features.names))

    def dual_coef(self) -> pd.Series:
        """alpha_i y_i of each support vector, indexed by key as in :meth:`support_vectors`:
        f(x) = sum_i dual_coef_i K(x_i, x) + intercept. Margin vectors have
        0 < alpha_i < C, error vectors alpha_i = C.

        >>> model = IncrementalSVC(C=1.0, kernel="linear")
        >>> model.learn_one({"a": 1.0}, True, key="p")
        >>> model.learn_one({"a": -1.0}, False, key="n")
        >>> model.dual_coef().round(6).to_dict()
        {'p': 0.5, 'n': -0.5}
        """
        positions = self._support_positions()
        engine = self._engine
        keys = engine.keys
        values = engine.alpha[positions] * engine.y[positions]
        return pd.Series(values, index=pd.Index([keys[i] for i in positions], dtype=object),
                         name="dual_coef")

    def __contains__(self, key: object) -> bool:
        return key in self._engine

    def stored_keys(self) -> list[Hashable]:
        """Keys of the stored points, oldest first (AutoKey for points learned without a
        key; a relabelled point counts as new)."""
        engine = self._engine
        keys = engine.keys
        return [keys[i] for i in np.argsort(engine.sequence, kind="stable")]

    def stored_point(self, key: Hashable) -> tuple[dict[Hashable, float], bool]:
        """The features (non-zero ones, as learned) and the label of a stored point.

        Unknown key: KeyError.

        >>> model = IncrementalSVC()
        >>> model.learn_one({"a": 2.0, "b": 0.0}, True, key="p")
        >>> model.stored_point("p")
        ({'a': 2.0}, True)
        """
        if key not in self._engine:
            raise self._unknown_key(key)
        position = self._engine.position(key)
        row = self._engine.X[position]
        names = self._features.names
        x = {names[i]: float(row[i]) for i in np.flatnonzero(row[: len(names)])}
        return x, self._class(self._engine.y[position] > 0)

    def relabel_one(self, key: Hashable, y: object) -> None:
        """Give a stored point a new label: exact forget, then exact learn under the same key.

        Unknown key: KeyError; a bad label: ValueError; the model is unchanged in both cases.
        In a :class:`SlidingWindowSVC` the point comes back as the newest arrival: with a
        ``step`` above 1 it waits in the buffer, out of the model, until the next slide.

        All or nothing: if the learn is refused (e.g. ``ConvergenceError``) after the forget, the
        point is put back and the model is exactly as before.
        """
        label = self._sign(y)
        x, _ = self.stored_point(key)
        with self._all_or_nothing(), self._discards_held():
            self.forget_one(key=key)
            self.learn_one(x, self._class(label > 0), key=key)

    def _find_by_value(self, x: Mapping, y: object, taken: frozenset | set = frozenset()
                       ) -> Hashable:
        """Key of the oldest stored point equal to x with label y (skipping ``taken``)."""
        row, new = self._row(x)
        label = self._sign(y)
        engine = self._engine
        stored = engine.X
        width = min(row.size, stored.shape[1])
        if not new and not row[width:].any():
            match = (engine.y == label) & np.all(stored[:, :width] == row[:width], axis=1)
            match &= ~np.any(stored[:, width:] != 0, axis=1)
            candidates = np.flatnonzero(match)
            stored_keys = engine.keys
            for position in candidates[np.argsort(engine.sequence[candidates])]:
                key = stored_keys[position]
                if key not in taken:
                    return key
        raise KeyError(f"no stored point equals x={dict(x)!r} with y={y!r}")

    # ---------------------------------------------------------------- predictions
    def predict_proba_one(self, x: Mapping, **kwargs: Any) -> dict[Any, float]:
        """``{False: 1 - p, True: p}`` with p = 1 / (1 + exp(-f(x))) (keyed by ``classes``
        when they are set).

        p is a monotone squashing of the decision value, not a calibrated probability: wrap the
        model in a calibrator if probabilities must be calibrated.
        """
        p = float(_sigmoid(finite_score(self.decision_function_one(x))))
        return {self._class(False): 1.0 - p, self._class(True): p}

    def predict_one(self, x: Mapping, **kwargs: Any) -> Any:
        """True (or the positive class of ``classes``) when f(x) > 0; ValueError when f(x) is
        not finite (features too large for the kernel)."""
        return self._class(finite_score(self.decision_function_one(x)) > 0)

    def predict_proba_many(self, X: pd.DataFrame) -> pd.DataFrame:
        p = _sigmoid(finite_scores(self._decisions(X), X.index))
        return pd.DataFrame({self._class(False): 1.0 - p, self._class(True): p}, index=X.index)

    def predict_many(self, X: pd.DataFrame) -> pd.Series:
        positive = finite_scores(self._decisions(X), X.index) > 0
        if self._classes is None:
            return pd.Series(positive, index=X.index)
        return pd.Series(classes_of(positive, self._classes), index=X.index,
                         dtype=object)

    # ---------------------------------------------------------------- persistence
    def to_checkpoint(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """The model as numpy arrays (no object dtype) and JSON-ready metadata.

        Keys and feature names are str, int, float, timestamps or tuples of those (the only
        ones learned: others are refused as they are learned); AutoKeys are kept as such.

        >>> model = IncrementalSVC(C=1.0)
        >>> model.learn_one({"a": 1.0}, True, key="p1")
        >>> arrays, meta = model.to_checkpoint()
        >>> IncrementalSVC.from_checkpoint(arrays, meta).decision_function_one({"a": 1.0})
        1.0
        """
        state = self._engine.get_state()
        arrays = dict(state)
        arrays.update(keys_to_arrays(self._engine.keys))
        params, callables = checkpoint_params(self)  # callables: given back on restore
        meta = {
            "class": type(self).__name__,
            "params": params,
            "callables": callables,
            "features": checkpoint_names(self._features.names),
            "auto_keys": self._auto_keys,
            "breakpoints_total": self._engine.breakpoints_total,
            "updates_total": self._engine.updates_total,
            "counters": checkpoint_counters(self),
            "extra": self._checkpoint_extra(),
        }
        return arrays, meta

    def _checkpoint_extra(self) -> dict[str, Any]:
        return {}

    def _restore_extra(self, extra: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        return None

    @classmethod
    def from_checkpoint(cls, arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any],
                        **callables: Any):
        """Rebuild a model saved by :meth:`to_checkpoint` (decisions reproduced exactly).

        A checkpoint holds no Python function: a model made with a user-callable ``kernel``
        is restored only when it is passed back (``from_checkpoint(arrays, meta,
        kernel=my_kernel)``); without it, ValueError naming the function the model had.
        """
        check_checkpoint_meta(meta, {"class": JSON_TEXT})
        if meta["class"] != cls.__name__:
            raise ValueError(
                f"checkpoint holds a model of class {meta['class']!r}, not {cls.__name__}")
        check_checkpoint_meta(meta, ENGINE_META)
        model = cls(**restored_params(cls, meta, callables))
        model._engine.set_state(dict(arrays), keys_from_arrays(arrays))
        names = restored_names(meta["features"])
        check_restored_names(names, model._engine.dim)
        model._features = FeatureSpace(names)
        model._compacted_at = len(model._features)
        model._engine.breakpoints_total = int(meta["breakpoints_total"])
        model._engine.updates_total = int(meta["updates_total"])
        restore_counters(model, meta)
        extra = meta.get("extra", {})
        check_checkpoint_meta(extra, {}, where="checkpoint's extra")
        model._restore_extra(extra, dict(arrays))
        model._auto_keys = check_restored_auto_keys(meta["auto_keys"], model._held_keys())
        return model


class IncrementalSVC(_EngineClassifier):
    """Exact incremental and decremental kernel SVM (Cauwenberghs & Poggio, 2000).

    Every ``learn_one`` adds a point and every ``forget_one`` removes one while keeping the
    Kuhn-Tucker conditions of the batch SVM optimum on the stored points, so the model equals
    an SVM retrained from scratch on exactly the points it holds. ``learn_many``,
    ``forget_many`` and ``update_many`` add and remove several points in one multi-parametric
    path (Karasuyama & Takeuchi, 2009).

    Parameters
    ----------
    C
        Soft-margin penalty (> 0).
    kernel
        ``"rbf"`` (exp(-gamma ||a-b||^2)), ``"linear"``, ``"poly"`` ((gamma <a,b> + coef0)^degree)
        or a callable ``f(A, B) -> Gram block`` on dense row matrices (must be PSD; a point
        at which it gives K(x, x) < 0 is refused with a ValueError).
    gamma, degree, coef0
        Kernel parameters.
    reserve_epsilon
        ``None`` keeps every point (exact). A number eps discards reserve points (alpha = 0)
        whose margin value g = y f(x) - 1 is >= eps after each update (C&P sec 2.6), but
        never one on the margin to the KKT check's tolerance (at eps = 0, a point that has just
        left it). Only the reserve vectors in the band 0 <= g < eps are kept, which cuts
        memory by a large factor (it does not cap it: the band holds a fixed fraction of a
        stationary stream), at the price of exactness for discarded points that would later
        have re-entered the solution. The model is then the exact SVM of the points it keeps,
        not of every point seen, and where the classes overlap the difference is not small:
        in 2-D streams of 300 points with label noise (eps = 0, gamma = 0.5), 39 to 85 of
        about 200 discarded points lay inside the final model's margin, and decision values
        differed from the SVM of all 300 by 0.6 to 1.0 (held-out accuracy within 2.5 points).
        For a hard bound use :class:`SlidingWindowSVC`.
    ridge
        Added to the kernel's diagonal on training points (default 0: the plain SVM).
    max_breakpoints
        Bound on path steps per update (default 1000 + 10 (n + m)); beyond it the update
        raises :class:`stream_svm.engine.ConvergenceError` and the model stays as it was.
    max_features
        Bound on the feature names the model holds (None: no bound). Points are stored as
        dense rows over them, so a stream of ever-new names would grow every row: a learn that
        would exceed the bound raises ValueError and changes nothing. Names that no stored
        point uses any more (forgotten, discarded or slid out) are dropped along the way.
        Predictions accept any number of unknown names.
    max_new_features
        Bound on the names one learn call may add (None: no bound), e.g. against one message
        with 40,000 keys.
    far_points
        What to do with a point whose K(x, x) is more than 1e8 times the largest of the points
        stored (linear and polynomial kernels; 10 points stored at least): ``"warn"``
        (default) learns it, with a warning once per process and model type; ``"refuse"``
        raises ValueError and changes nothing. Either way ``far_points_total`` counts it.
        Such a point (a unit slip, an unscaled feature) swamps the others' conditions while
        it is stored: later updates may be refused (ConvergenceError), slowly.
    classes
        ``None`` (default): labels are booleans, True/1 positive, False/0/-1 negative. Or two
        labels ``[negative, positive]`` (a list, a tuple or a one-dimensional numpy or pandas
        array), e.g. ``["ham", "spam"]``: learning takes exactly those
        values (anything else raises ValueError), predictions return them and
        ``predict_proba_one`` is keyed by them. Strings, numbers and booleans are allowed.

    ``predict_proba_one`` squashes the decision value with a sigmoid (not calibrated).

    Examples
    --------
    >>> from stream_svm import IncrementalSVC
    >>> model = IncrementalSVC(C=10.0, gamma=0.5)
    >>> for i, (x, y) in enumerate([({"a": 0.0}, False), ({"a": 1.0}, True),
    ...                             ({"a": 0.2}, False), ({"a": 0.9}, True)]):
    ...     model.learn_one(x, y, key=i)
    >>> model.predict_one({"a": 0.95}), model.predict_one({"a": 0.05})
    (True, False)
    >>> before = model.decision_function_one({"a": 0.5})
    >>> model.learn_one({"a": 0.5}, True, key="extra")
    >>> model.forget_one(key="extra")
    >>> abs(model.decision_function_one({"a": 0.5}) - before) < 1e-9
    True
    """

    def __init__(
        self,
        C: float = 1.0,
        kernel: str | Any = "rbf",
        gamma: float = 1.0,
        degree: int = 3,
        coef0: float = 0.0,
        reserve_epsilon: float | None = None,
        ridge: float = 0.0,
        max_breakpoints: int | None = None,
        max_features: int | None = 10_000,
        max_new_features: int | None = None,
        classes: list | tuple | None = None,
        far_points: str = "warn",
    ) -> None:
        self.C = C
        self.kernel = kernel
        self.gamma = gamma
        self.degree = degree
        self.coef0 = coef0
        self.reserve_epsilon = reserve_epsilon
        self.ridge = ridge
        self.max_breakpoints = max_breakpoints
        self.max_features = max_features
        self.max_new_features = max_new_features
        self.far_points = far_points
        self.classes = classes
        if reserve_epsilon is not None and (
            isinstance(reserve_epsilon, bool)
            or not isinstance(reserve_epsilon, numbers.Real)
            or not math.isfinite(real_to_float(reserve_epsilon))
            or reserve_epsilon < 0
        ):
            raise ValueError(
                f"reserve_epsilon must be None or a finite number >= 0, got {reserve_epsilon!r}"
            )
        self._init_engine()
        self.reserve_discarded = 0

    @classmethod
    def _unit_test_params(cls) -> Iterator[dict[str, Any]]:
        yield {"C": 1.0, "gamma": 0.1}
        yield {"C": 10.0, "kernel": "linear"}

    def _unit_test_skips(self) -> set[str]:
        # An exact SVM must keep its training points (forget_one and the exact path need them),
        # so memory grows with the stream unless a window or forgetting bounds it (reserve_epsilon
        # only slows the growth: error points stay).
        return {"check_bounded_memory_growth"}

    def _after_update(self) -> None:
        if not self._holding_discards:
            self._discard_reserve()
        self._after_learning()

    def _discard_reserve(self) -> None:
        if self.reserve_epsilon is not None:
            self.reserve_discarded += self._engine.discard_reserve(self.reserve_epsilon)

    def _checkpoint_extra(self) -> dict[str, Any]:
        return {"reserve_discarded": self.reserve_discarded}

    def _restore_extra(self, extra: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        if "reserve_discarded" in extra:  # (a counter of checkpoints since the first)
            check_checkpoint_meta(extra, {"reserve_discarded": JSON_COUNT},
                                  where="checkpoint's extra")
        self.reserve_discarded = int(extra.get("reserve_discarded", 0))

    # ---------------------------------------------------------------- learning
    @refused_unchanged
    def learn_one(self, x: Mapping, y: object, key: Hashable | None = None) -> None:
        """Learn one point exactly; ``key`` (hashable, unique) names it for ``forget_one``."""
        label = self._sign(y)
        self._check_new_key(key)
        row, new = self._admitted(lambda: self._row(x))
        point_key = key if key is not None else AutoKey(self._auto_keys + 1)
        self._learned_through(
            lambda: self._engine.update(row[None, :], np.array([label]), [point_key]),
            [point_key], [], new)
        self._after_update()

    def forget_one(
        self, x: Mapping | None = None, y: object = None, key: Hashable | None = None
    ) -> None:
        """Unlearn one stored point exactly, by ``key`` or else by value (x and y).

        Unknown key or value: KeyError, model unchanged. Forgetting by value removes the oldest
        stored point equal to x with label y.
        """
        refuse_key_with_value("forget_one", key, x, y)
        if key is None:
            if x is None or y is None:
                raise forget_without_key_error(x)
            key = self._find_by_value(x, y)
        elif key not in self._engine:
            raise self._unknown_key(key)
        self._engine.update(remove=[key])
        self._after_update()
        self._forgotten()

    @refused_unchanged
    def learn_many(
        self, X: pd.DataFrame, y: pd.Series, keys: Iterable[Hashable] | None = None
    ) -> None:
        """Add all rows in one multiple update (Karasuyama & Takeuchi).

        Keys come from ``keys`` or else from X's index; pandas' own numbering (a RangeIndex
        without a name) carries no identity, so its rows get automatic keys (still
        forgettable by value).
        """
        check_paired(X, y)  # (named y here, not y_add)
        self.update_many(X, y, (), keys=keys)

    def forget_many(
        self,
        keys: Iterable[Hashable] | None = None,
        X: pd.DataFrame | None = None,
        y: pd.Series | None = None,
    ) -> None:
        """Remove several stored points in one update, by keys or else by value (X, y)."""
        self.update_many(None, None, self._keys_to_forget(keys, X, y, "labels"))
        self._forgotten()

    @refused_unchanged
    def update_many(
        self,
        X_add: pd.DataFrame | None,
        y_add: pd.Series | None,
        forget_keys: Iterable[Hashable] = (),
        keys: Iterable[Hashable] | None = None,
    ) -> None:
        """Add the rows of X_add and remove the points named in ``forget_keys`` in ONE path."""
        forget_keys = key_list(forget_keys, "forget_keys")
        if X_add is not None and len(X_add):
            if y_add is None:
                raise ValueError("y_add must have one label per row of X_add")
            check_paired(X_add, y_add, "y_add", rows="X_add")
            labels = self._signs(y_add)
            rows, new = self._admitted(lambda: self._frame(X_add))
            add_keys = self._update_keys(X_add, keys, forget_keys)
        else:
            if y_add is not None:  # (labels for no rows: taken for nothing, silently)
                check_paired(pd.DataFrame() if X_add is None else X_add, y_add, "y_add",
                             rows="X_add")
            labels, rows, new, add_keys = np.zeros(0), np.zeros((0, 0)), [], []
        for key in forget_keys:
            if key not in self._engine:
                raise self._unknown_key(key)
        if rows.shape[0] == 0:
            rows = np.zeros((0, self._engine.dim))
        self._learned_through(
            lambda: self._engine.update(rows, labels, add_keys, remove=forget_keys),
            add_keys, forget_keys, new)
        self._after_update()

    # ---------------------------------------------------------------- leave-one-out
    def loo_error(self) -> float:
        """Exact leave-one-out error rate of the stored points (C&P sec 3).

        Each margin and error vector is unlearned exactly, its label predicted by the model
        without it (True when f > 0), and the model restored; reserve vectors (alpha = 0) do not
        change the solution when left out, unless no coefficient is strictly between 0 and C
        (b is then the middle of an interval that they bound, and every point is left out in
        turn). Equals retraining without each point in turn.
        """
        engine = self._engine
        if engine.n == 0:
            raise ValueError("loo_error needs at least one stored point")
        decisions = engine.leave_one_out_decisions()
        predicted = np.where(decisions > 0, 1.0, -1.0)
        return float(np.mean(predicted != engine.y))


class SlidingWindowSVC(_SlidingWindow, _EngineClassifier):
    """Exact SVM on the latest ``window_size`` points of a stream.

    ``learn_one`` buffers arrivals; every ``step`` arrivals the window slides in one update that
    adds the buffered points and removes the oldest ones (Karasuyama & Takeuchi's multiple
    incremental-decremental path with ``strategy="multiple"``, or one point at a time with
    ``strategy="single"``, which reaches the same solution along a longer path). ``learn_many``
    slides by a whole batch. Predictions come from the current window's exact solution
    (buffered points are not in it yet).

    Parameters
    ----------
    window_size
        Number of points in the window (>= 1).
    step
        Arrivals per slide (>= 1).
    strategy
        ``"multiple"`` or ``"single"``.
    C, kernel, gamma, degree, coef0, ridge, max_breakpoints, max_features, max_new_features,
    classes, far_points
        As in :class:`IncrementalSVC`.

    Examples
    --------
    >>> from stream_svm import SlidingWindowSVC
    >>> model = SlidingWindowSVC(window_size=3, step=2, C=10.0)
    >>> for i in range(6):
    ...     model.learn_one({"a": float(i % 2)}, bool(i % 2))
    >>> model.n_window, model.n_buffered
    (3, 0)
    >>> model.predict_one({"a": 1.0})
    True
    """

    def __init__(
        self,
        window_size: int = 1000,
        step: int = 1,
        strategy: str = "multiple",
        C: float = 1.0,
        kernel: str | Any = "rbf",
        gamma: float = 1.0,
        degree: int = 3,
        coef0: float = 0.0,
        ridge: float = 0.0,
        max_breakpoints: int | None = None,
        max_features: int | None = 10_000,
        max_new_features: int | None = None,
        classes: list | tuple | None = None,
        far_points: str = "warn",
    ) -> None:
        self.window_size = window_size
        self.step = step
        self.strategy = strategy
        self.C = C
        self.kernel = kernel
        self.gamma = gamma
        self.degree = degree
        self.coef0 = coef0
        self.ridge = ridge
        self.max_breakpoints = max_breakpoints
        self.max_features = max_features
        self.max_new_features = max_new_features
        self.far_points = far_points
        self.classes = classes
        self._init_engine()
        self._init_window()

    @classmethod
    def _unit_test_params(cls) -> Iterator[dict[str, Any]]:
        yield {"window_size": 50, "step": 1, "C": 1.0, "gamma": 0.1}
        yield {"window_size": 30, "step": 1, "strategy": "single", "kernel": "linear"}

    # ---------------------------------------------------------------- window hooks
    def _value(self, y: object) -> float:
        return self._sign(y)

    def _values(self, ys: Iterable[object]) -> np.ndarray:
        return self._signs(ys)

    def _value_out(self, value: float) -> object:
        return self._class(value > 0)

    _noun = "labels"

    def _valid_buffered(self, values: np.ndarray) -> bool:
        return bool(np.all((values == 1.0) | (values == -1.0)))

    def _in_engine(self, key: object) -> bool:
        return key in self._engine

    def _n_window(self) -> int:
        return self._engine.n

    def _oldest(self, count: int) -> list[Hashable]:
        return self._engine.oldest_keys(count)

    def _engine_update(self, rows: np.ndarray, values: np.ndarray, keys: list[Hashable],
                       remove: list[Hashable]) -> None:
        self._engine.update(rows, values, keys, remove=remove)
