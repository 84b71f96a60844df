"""alpha-ISVM: incremental SVM with a working, a caching and a backup set, and LRU discarding.

Xiao, Wang & Zhang ("An Approach to Incremental SVM Learning Algorithm", ICTAI 2000, sec 3.3)
keep three sets of samples between increments:

* the working set W: the support vectors of the latest classifier (boundary samples);
* the caching set C: samples that were support vectors before, weighted by how often and how
  recently (vice-boundary samples);
* the backup set B: everything else (intra-samples), from which a fraction alpha is discarded,
  least recently used first, after every increment.

Each increment runs an iterative search: validate the current classifier on a test set V, add
its errors E to the training set T = S(C) + W + E, train, update the sets and the weights, and
repeat until the validation has no errors. Every training here is one warm-started update of
the package's exact path-following engine (:class:`stream_svm.engine.PathEngine`): moving from
one T to the next adds and removes points in one multiple incremental-decremental path.
"""

from __future__ import annotations

import math
import numbers
import time
from collections.abc import Hashable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from stream_svm._engine_model import (
    JSON_COUNT,
    JSON_FLAG,
    JSON_LIST,
    JSON_TABLE,
    check_checkpoint_members,
    check_checkpoint_meta,
    refused_unchanged,
)
from stream_svm._input import check_paired, real_to_float
from stream_svm.classifiers import _EngineClassifier
from stream_svm.engine import MARGIN, BreakpointLimit, ConvergenceError

__all__ = ["AlphaISVC", "IncrementStats"]

# Codes of the three sets; every kept sample is in exactly one of them.
WORKING, CACHING, BACKUP = 0, 1, 2

# Slack on y f(x) >= validation_margin when the margin is positive: a sample exactly on the
# margin (y f = 1 up to round-off) satisfies the KKT conditions and must not count as an error,
# or the search would move it in and out of T forever.
_MARGIN_SLACK = 1e-9

#: The checkpoint arrays of the three sets (beside the classifier's own).
_SET_ARRAYS = ("aisvc_ids", "aisvc_rows", "aisvc_labels", "aisvc_psi", "aisvc_used",
               "aisvc_set", "aisvc_in_T")

#: The kinds of numbers each of those arrays holds (numpy's dtype kinds).
_SET_KINDS = {"aisvc_ids": "iu", "aisvc_rows": "f", "aisvc_labels": "f", "aisvc_psi": "f",
              "aisvc_used": "iu", "aisvc_set": "iu", "aisvc_in_T": "b"}

#: Clock ticks and sample ids stay far below int64's end.
_MAX_COUNT = 2**62


@dataclass
class IncrementStats:
    """What one increment (or the initializing procedure) did.

    ``rounds`` counts the trainings of the iterative search (1 for the initializing
    procedure); ``errors`` lists |E_j| for every validation, the last one being the final
    classifier's (0 when the search converged). ``converged`` is False when the search stopped
    at ``max_rounds`` with errors left. Set sizes are taken after the discard; ``n_training`` is
    |T|, the samples the final classifier was trained on (those held by the engine).
    ``breakpoints`` and ``seconds`` sum the engine's path breakpoints and the increment's wall
    time (search, bookkeeping and discard).
    """

    initial: bool = False
    arrived: int = 0
    rounds: int = 0
    converged: bool = True
    errors: list[int] = field(default_factory=list)
    n_working: int = 0
    n_caching: int = 0
    n_backup: int = 0
    n_training: int = 0
    discarded: int = 0
    breakpoints: int = 0
    seconds: float = 0.0

    @property
    def n_kept(self) -> int:
        return self.n_working + self.n_caching + self.n_backup


def _middle(low: float, high: float) -> float | None:
    """The middle of [low, high], its finite end where the other is infinite (None where
    both are)."""
    if math.isfinite(low) and math.isfinite(high):
        return 0.5 * low + 0.5 * high
    if math.isfinite(low):
        return low
    return high if math.isfinite(high) else None


def _check_ratio(name: str, symbol: str, value: object, low: float, high: float,
                 high_open: bool = False, low_open: bool = False) -> float:
    ok = (not isinstance(value, bool) and isinstance(value, numbers.Real)
          and math.isfinite(real_to_float(value)))
    if ok:
        v = float(value)
        ok = (low < v if low_open else low <= v) and (v < high if high_open else v <= high)
    if not ok:
        interval = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
        raise ValueError(f"{name} ({symbol}) must be a number in {interval}, got {value!r}")
    return float(value)


class AlphaISVC(_EngineClassifier):
    """alpha-ISVM (Xiao, Wang & Zhang, 2000) on the exact path-following engine.

    ``learn_many(X, y)`` processes one increment; ``learn_one`` buffers samples and runs an
    increment every ``batch_size`` of them. The first increment is the paper's initializing
    procedure: train on it, its support vectors form the working set W (weight Delta d), the
    rest the backup set B, the caching set C is empty. Every later increment runs the iterative
    search of sec 3.3 and then discards a fraction alpha of B. Predictions come from the latest
    classifier (buffered samples are not in it yet).

    One search round j, with V the test set (the new samples in the first round):

    1. validate the current classifier on V: errors E, passed O; stop if E is empty;
    2. select S(C) from C (see *cache selection* below) and train on T = S(C) + W + E: one
       warm-started engine update that adds T's new members and removes those that left;
    3. W <- support vectors of T; C <- (W_old + C_old) - W;
       eq (3): psi <- gamma psi on C, psi <- psi + Delta d on W;
       eqs (4-5): samples of C with psi <= delta leave C;
       eq (6): B <- every other kept sample;
    4. the next test set is every kept sample outside T (the paper's NS(C) + O + B; a sample
       being trained on does not validate its own classifier, else a training error would
       count as a validation error forever).

    The search stops when the validation has no errors, or after ``max_rounds`` trainings with
    the last classifier (``last_increment.converged`` is then False and ``bound_hits_total``
    counts it). Then floor(alpha |B|) samples of B are discarded for good, least recently used
    first. An increment whose first validation has no errors keeps the classifier and puts the
    new samples in B (they have never been support vectors).

    Choices where the paper is vague:

    * *support vectors* (the working set): the samples of T on or inside the margin,
      y f(x) <= 1 (to the round-off of f's terms), with every alpha > 0 among them. They are
      read off f, which the optimum fixes, not off the coefficients, which a degenerate
      optimum does not (with w = 0 a sample on the margin may hold alpha = 0 or C): so a
      model restored from a checkpoint goes on as the original does. A margin vector with
      alpha = 0 also occurs when T holds one class; it pins the bias b. Without it, a search
      whose errors are all of one class would train on them alone, get alpha = 0 and a b
      that misclassifies the other class, and alternate between the two classes until
      ``max_rounds``.

    * *cache selection*: S(C) is the ceil(beta |C|) samples of C with the largest weight psi
      (ties: most recently used first, then newest); beta = 0 trains on W + E only, beta = 1
      on all of C.
    * *used*, for LRU: a sample is used when it is a support vector of a trained classifier
      (when it "affected the classification"); a sample that never was one counts as used
      when it arrived. A clock ticks once per arrival batch and once per training round, so
      new samples are more recent than every earlier use and older than this increment's
      support vectors. Ties: older arrival first.
    * *error*: with ``validation_margin = 0`` (the paper) a sample is an error when the
      classifier predicts the wrong label (f(x) > 0 is the positive class). With
      ``validation_margin = m > 0`` it is an error when y f(x) < m. With m = 1 every error is
      a KKT violation, the search is Osuna's decomposition (the dual objective strictly
      improves every round, so it cannot cycle), and with alpha = 0 the final classifier is the
      exact SVM on every sample seen. With m > 0, where T's optimum leaves b free in an
      interval (no coefficient strictly between 0 and C), b is the point of that interval that
      serves the samples being validated (inside what they allow where possible, else nearest
      to it), not its middle: a middle b let two samples take turns in T until
      ``max_rounds``.

    Parameters
    ----------
    discard_ratio
        alpha in [0, 1]: fraction of the backup set discarded after each increment.
    cache_ratio
        beta in [0, 1]: fraction of the caching set selected into the training set.
    weight_decay
        gamma in [0.5, 1): factor on the weights of the caching set every round (eq 3).
    weight_increment
        Delta d > 0: added to the weight of every working-set sample every round (eq 3), and
        the initial weight of the first support vectors.
    weight_threshold
        delta in (0, Delta d): caching samples whose weight falls to delta or below move to
        the backup set (eqs 4-5).
    max_rounds
        Bound on trainings per increment (>= 1).
    batch_size
        Samples ``learn_one`` buffers per increment (>= 1).
    validation_margin
        m in [0, 1]: a validation sample is an error when y f(x) < m (m = 0: when it is
        misclassified, the paper's rule); see above.
    C, kernel, gamma, degree, coef0, ridge, max_breakpoints, max_features, max_new_features,
    classes, far_points
        As in :class:`stream_svm.IncrementalSVC` (``max_breakpoints`` bounds each engine
        update).

    Examples
    --------
    >>> import pandas as pd
    >>> from stream_svm import AlphaISVC
    >>> X = pd.DataFrame({"a": [0.0, 0.1, 0.2, 0.8, 0.9, 1.0, 0.05, 0.95, 0.15, 0.85]})
    >>> y = pd.Series([False, False, False, True, True, True, False, True, False, True])
    >>> model = AlphaISVC(discard_ratio=0.5, C=10.0, gamma=2.0)
    >>> model.learn_many(X.iloc[:6], y.iloc[:6])      # initializing procedure
    >>> model.learn_many(X.iloc[6:], y.iloc[6:])      # one increment
    >>> model.predict_one({"a": 0.97}), model.predict_one({"a": 0.03})
    (True, False)
    >>> stats = model.last_increment
    >>> stats.n_kept == model.n_stored == 10 - stats.discarded
    True
    """

    def __init__(
        self,
        discard_ratio: float = 0.5,
        cache_ratio: float = 0.5,
        weight_decay: float = 0.9,
        weight_increment: float = 1.0,
        weight_threshold: float = 0.5,
        max_rounds: int = 50,
        batch_size: int = 100,
        validation_margin: float = 0.0,
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
        self.discard_ratio = discard_ratio
        self.cache_ratio = cache_ratio
        self.weight_decay = weight_decay
        self.weight_increment = weight_increment
        self.weight_threshold = weight_threshold
        self.max_rounds = max_rounds
        self.batch_size = batch_size
        self.validation_margin = validation_margin
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
        self._ratio_alpha = _check_ratio("discard_ratio", "alpha", discard_ratio, 0.0, 1.0)
        self._ratio_beta = _check_ratio("cache_ratio", "beta", cache_ratio, 0.0, 1.0)
        self._decay = _check_ratio("weight_decay", "gamma", weight_decay, 0.5, 1.0,
                                     high_open=True)
        self._increment_w = _check_ratio("weight_increment", "Delta d", weight_increment, 0.0,
                                     math.inf, low_open=True, high_open=True)
        self._threshold = _check_ratio("weight_threshold", "delta", weight_threshold, 0.0,
                                   self._increment_w, low_open=True, high_open=True)
        self._margin = _check_ratio("validation_margin", "m", validation_margin, 0.0, 1.0)
        for name, value in (("max_rounds", max_rounds), ("batch_size", batch_size)):
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        self._init_engine()
        self._reset_sets(0)
        self._buffer_rows: list[np.ndarray] = []
        self._buffer_labels: list[float] = []
        #: (None, why) for each buffered sample left out because the increment was refused
        #: with it and went through without it (see ``_increment_with_buffer``), in that order;
        #: the caller may clear it once read. (None: this model keeps no key.)
        self.refused_from_buffer: list[tuple[None, str]] = []
        self._clock = 0
        self._next_id = 0
        self._initialized = False
        self.last_increment = IncrementStats()
        self.increments_total = 0
        self.discarded_total = 0
        self.rounds_total = 0
        self.bound_hits_total = 0

    def _reset_sets(self, width: int) -> None:
        # Bookkeeping of every kept sample, ordered by id (ids only grow, so the order is the
        # arrival order and positions are found by binary search).
        self._ids = np.zeros(0, dtype=np.int64)
        self._rows = np.zeros((0, width))
        self._labels = np.zeros(0)
        self._psi = np.zeros(0)
        self._used = np.zeros(0, dtype=np.int64)
        self._set = np.zeros(0, dtype=np.int8)
        self._in_T = np.zeros(0, dtype=bool)

    @classmethod
    def _unit_test_params(cls) -> Iterator[dict[str, Any]]:
        # Exact search without discarding: learn_one and learn_many reach the same SVM.
        yield {"discard_ratio": 0.0, "validation_margin": 1.0, "batch_size": 1, "C": 1.0,
               "gamma": 0.1}
        # The paper's rule with discarding; River's learn_many check feeds batches of 12, so
        # learn_one with batch_size 12 runs the very same increments.
        yield {"discard_ratio": 0.9, "batch_size": 12, "kernel": "linear", "C": 10.0}

    # ---------------------------------------------------------------- views
    @property
    def n_stored(self) -> int:
        """Samples kept in all sets (W + C + B); buffered samples are not counted."""
        return int(self._ids.size)

    @property
    def n_working(self) -> int:
        return int(np.count_nonzero(self._set == WORKING))

    @property
    def n_caching(self) -> int:
        return int(np.count_nonzero(self._set == CACHING))

    @property
    def n_backup(self) -> int:
        return int(np.count_nonzero(self._set == BACKUP))

    @property
    def n_training(self) -> int:
        """|T|: samples the current classifier was trained on (held by the engine)."""
        return self._engine.n

    @property
    def n_buffered(self) -> int:
        return len(self._buffer_labels)

    @property
    def weights(self) -> dict[int, float]:
        """psi of every kept sample, by sample id (ids count arrivals from 0)."""
        return dict(zip(self._ids.tolist(), self._psi.tolist(), strict=True))

    @property
    def last_used(self) -> dict[int, int]:
        """LRU stamp of every kept sample, by id: the clock when it was last a support vector,
        or when it arrived if it never was one (larger = more recent)."""
        return dict(zip(self._ids.tolist(), self._used.tolist(), strict=True))

    def sets(self) -> dict[str, list[int]]:
        """Ids of the samples in the working, caching and backup sets, and in T."""
        return {
            "working": self._ids[self._set == WORKING].tolist(),
            "caching": self._ids[self._set == CACHING].tolist(),
            "backup": self._ids[self._set == BACKUP].tolist(),
            "training": self._ids[self._in_T].tolist(),
        }

    def stored_keys(self) -> list[Hashable]:
        """Ids of the kept samples (in arrival order)."""
        return self._ids.tolist()

    def __contains__(self, key: object) -> bool:
        if isinstance(key, bool) or not isinstance(key, numbers.Integral):
            return False
        i = int(np.searchsorted(self._ids, int(key)))
        return i < self._ids.size and self._ids[i] == key

    def stored_point(self, key: Hashable) -> tuple[dict[Hashable, float], object]:
        """The features (non-zero ones) and the label of a kept sample, by its id (in any of
        the three sets, not only those the classifier was trained on). Unknown id: KeyError."""
        if key not in self:
            raise KeyError(f"no kept sample has id {key!r}")
        row = self._rows[int(np.searchsorted(self._ids, int(key)))]  # type: ignore[arg-type]
        names = self._features.names
        x = {names[i]: float(row[i]) for i in np.flatnonzero(row[: len(names)])}
        return x, self._class(self._labels[int(np.searchsorted(self._ids, int(key)))] > 0)

    def relabel_one(self, key: Hashable, y: object) -> None:
        """Not supported: alpha-ISVM keeps and discards its samples on its own (TypeError)."""
        raise TypeError("AlphaISVC cannot relabel a sample: alpha-ISVM keeps and discards "
                        "samples on its own and forgets none on request; IncrementalSVC and "
                        "SlidingWindowSVC can")

    # ---------------------------------------------------------------- learning
    @refused_unchanged
    def learn_one(self, x: Mapping, y: object) -> None:
        """Buffer one sample; run an increment once ``batch_size`` samples are buffered."""
        label = self._sign(y)
        row, new = self._admitted(lambda: self._row(x))
        self._check_kernel_values(row)
        if len(self._buffer_labels) + 1 < self.batch_size:
            self._features.add(new)
            self._buffer_rows.append(row)
            self._buffer_labels.append(label)
            return
        self._increment_with_buffer([row], [label], new)

    @refused_unchanged
    def learn_many(self, X: pd.DataFrame, y: pd.Series) -> None:
        """Run one increment on the rows of X (and whatever ``learn_one`` buffered)."""
        check_paired(X, y)
        labels = self._signs(y)
        if len(X) == 0:
            rows, new = np.zeros((0, len(self._features))), []
        else:
            rows, new = self._admitted(lambda: self._frame(X))
            self._check_kernel_values(rows)
        if len(X) == 0 and not self._buffer_labels:
            return
        self._increment_with_buffer(list(rows), labels.tolist(), new)

    def _increment_with_buffer(self, rows: list[np.ndarray], labels: list[float],
                               new_features: list) -> None:
        """One increment on the buffered samples and the arrivals.

        A sample an earlier call buffered (unchecked) may be what the engine refuses: a point
        far beyond the others' scale, with which every later increment would fail, refusing
        all that comes after it, for good. So a refused increment (not one stopped by
        ``max_breakpoints``) with such samples in the buffer (``_far_suspects``) is tried again
        without them, the farthest first, one more each time: those it goes through without
        are left out (listed in :attr:`refused_from_buffer`, with a warning naming their
        features and labels). Otherwise the arrivals are refused, and the model is as it was,
        buffer included."""
        try:
            self._increment(self._buffer_rows + rows, self._buffer_labels + labels, new_features)
            return
        except BreakpointLimit:
            raise
        except ConvergenceError as refused:
            suspects = self._far_suspects(self._buffer_rows)
            if not suspects:
                raise
            failure = refused
        names = self._features.names
        described = [
            ({names[i]: float(row[i]) for i in np.flatnonzero(row[: len(names)])},
             self._class(label > 0))
            for row, label in zip(self._buffer_rows, self._buffer_labels, strict=True)]
        for count in range(1, len(suspects) + 1):
            left = set(suspects[:count])
            kept = [i for i in range(len(self._buffer_labels)) if i not in left]
            try:
                self._increment([self._buffer_rows[i] for i in kept] + rows,
                                [self._buffer_labels[i] for i in kept] + labels, new_features)
            except ConvergenceError:
                continue
            break
        else:
            raise failure
        # (_increment emptied the buffer: the samples left out are gone with it)
        for index in suspects[:count]:
            x, label = described[index]
            self._note_left_out(None, f"the sample with features {x!r} and label {label!r} "
                                      "was refused with it and the increment went through "
                                      f"without it ({failure})")

    def _increment(self, rows: list[np.ndarray], labels: list[float], new_features: list
                   ) -> None:
        """One increment, all or nothing: on any error the model is left as it was (restored
        without evaluating the kernel, which may be what failed)."""
        with self._all_or_nothing():
            self._run_increment(rows, np.array(labels, dtype=float),
                                len(self._features) + len(new_features))
        self._features.add(new_features)
        self._buffer_rows, self._buffer_labels = [], []
        self._after_learning()

    def _extra_rows(self) -> list[np.ndarray]:
        return [self._rows, *self._buffer_rows]

    _extra_row_attributes = ("_rows", "_buffer_rows")

    def _keep_extra_columns(self, columns: np.ndarray) -> None:
        self._rows = self._rows[:, columns[columns < self._rows.shape[1]]]
        self._buffer_rows = [row[columns[columns < row.size]] for row in self._buffer_rows]

    def _append(self, rows: list[np.ndarray], labels: np.ndarray, width: int) -> np.ndarray:
        """Store the arrival batch (weight 0, used now, in B until the search places it)."""
        m = len(rows)
        block = np.zeros((m, width))
        for i, row in enumerate(rows):
            block[i, : row.size] = row
        if self._rows.shape[1] < width:
            self._rows = np.hstack([self._rows,
                                    np.zeros((self._rows.shape[0], width - self._rows.shape[1]))])
        self._clock += 1
        ids = np.arange(self._next_id, self._next_id + m, dtype=np.int64)
        self._next_id += m
        self._ids = np.concatenate([self._ids, ids])
        self._rows = np.vstack([self._rows, block])
        self._labels = np.concatenate([self._labels, labels])
        self._psi = np.concatenate([self._psi, np.zeros(m)])
        self._used = np.concatenate([self._used, np.full(m, self._clock, dtype=np.int64)])
        self._set = np.concatenate([self._set, np.full(m, BACKUP, dtype=np.int8)])
        self._in_T = np.concatenate([self._in_T, np.zeros(m, dtype=bool)])
        new = np.zeros(self._ids.size, dtype=bool)
        new[-m:] = True
        return new

    def _run_increment(self, rows: list[np.ndarray], labels: np.ndarray, width: int) -> None:
        started = time.perf_counter()
        breakpoints_before = self._engine.breakpoints_total
        self._engine.ensure_dim(width)
        new = self._append(rows, labels, width)
        stats = IncrementStats(initial=not self._initialized, arrived=int(new.sum()))
        if not self._initialized:
            # Initializing procedure: train on X^0; its SVs are W^0 with weight Delta d.
            self._train(new)
            self._place(new, np.zeros_like(new), np.zeros_like(new))
            stats.rounds = 1
            self._initialized = True
        else:
            self._search(new, stats)
            stats.discarded = self._discard()
        stats.n_working, stats.n_caching, stats.n_backup = (
            self.n_working, self.n_caching, self.n_backup)
        stats.n_training = self._engine.n
        stats.breakpoints = self._engine.breakpoints_total - breakpoints_before
        stats.seconds = time.perf_counter() - started
        self.last_increment = stats
        self.increments_total += 1
        self.discarded_total += stats.discarded
        self.rounds_total += stats.rounds
        self.bound_hits_total += not stats.converged

    def _errors(self, test: np.ndarray) -> np.ndarray:
        """Mask of the samples of ``test`` the current classifier gets wrong."""
        errors = np.zeros(test.size, dtype=bool)
        if not test.any():
            return errors
        f = self._engine.decision_function(self._rows[test])
        if not np.isfinite(f).all():
            # A NaN compares False with every threshold: it would count as no error and end
            # the search early, silently.
            raise ValueError("the decision value of a sample being validated is not finite "
                             "(the kernel returned inf or NaN for it); the model is unchanged")
        y = self._labels[test]
        if self._margin == 0.0:
            wrong = np.where(y > 0, f <= 0, f > 0)  # predict_one's rule: True when f > 0
        else:
            wrong = y * f < self._margin - _MARGIN_SLACK
        errors[test] = wrong
        return errors

    def _search(self, test: np.ndarray, stats: IncrementStats) -> None:
        if self._fit_b():
            # What earlier increments validated held at the former b: validated again.
            test = ~self._in_T
        while True:
            errors = self._errors(test)
            stats.errors.append(int(errors.sum()))
            if not errors.any():
                return
            if stats.rounds >= self.max_rounds:
                stats.converged = False
                return
            stats.rounds += 1
            working = self._set == WORKING
            caching = self._set == CACHING
            training = self._select_cache(caching) | working | errors
            self._train(training)
            test = ~training
            self._fit_b()
            self._place(training, working, caching)

    def _fit_b(self) -> bool:
        """With ``validation_margin`` > 0, where T's optimum leaves b free in an interval (no
        coefficient strictly between 0 and C), take the b of that interval that serves the
        kept samples outside T: inside what they allow, where that meets the interval (none is
        then an error, and the classifier is the SVM of T and of them), else the nearest
        point to it. Returns whether b moved. At an end of the interval, what pins it is on
        the margin, a support vector kept in the next T, so that the errors added next cannot
        be met by the same coefficients with another b, and the next training improves the
        dual objective strictly. (With b in the interval's middle, two samples took turns in
        T, each met by the b of the T without it, until max_rounds.)"""
        engine = self._engine
        test = ~self._in_T
        if self._margin == 0.0 or not test.any():
            return False
        interval = engine.b_interval()
        if interval is None:
            return False
        low, high = interval
        kernel_part = engine.decision_function(self._rows[test]) - engine.b
        if not np.isfinite(kernel_part).all():
            return False  # (_errors names a decision value that is not finite)
        y = self._labels[test]
        need = self._margin - _MARGIN_SLACK  # y (kernel part + b) >= need
        test_low = float((need - kernel_part[y > 0]).max(initial=-np.inf))
        test_high = float((-need - kernel_part[y < 0]).min(initial=np.inf))
        start, end = max(low, test_low), min(high, test_high)
        if start <= end:
            target = _middle(start, end)
        elif test_low > high:
            target = high
        elif test_high < low:
            target = low
        else:  # the samples conflict among themselves, inside the interval
            target = min(max(_middle(test_high, test_low), low), high)
        if target is None or not math.isfinite(target) or target == engine.b:
            return False
        engine.move_b(target)
        return True

    def _select_cache(self, caching: np.ndarray) -> np.ndarray:
        """S(C): the ceil(beta |C|) heaviest caching samples (ties: recently used, newest)."""
        members = np.flatnonzero(caching)
        # round() first so that beta |C| = 3.0000000000000004 selects 3, not 4.
        count = math.ceil(round(self._ratio_beta * members.size, 9))
        selected = np.zeros(caching.size, dtype=bool)
        if count:
            order = np.lexsort((-self._ids[members], -self._used[members],
                                -self._psi[members]))
            selected[members[order[:count]]] = True
        return selected

    def _train(self, training: np.ndarray) -> None:
        """Move the engine from the current T to ``training`` in one warm-started update."""
        add = training & ~self._in_T
        remove = self._in_T & ~training
        if add.any() or remove.any():
            self._engine.update(self._rows[add], self._labels[add], self._ids[add].tolist(),
                                remove=self._ids[remove].tolist())
        self._in_T = training.copy()

    def _support(self) -> np.ndarray:
        """Mask of the support vectors of the current classifier (see the class docstring)."""
        engine = self._engine
        support = np.zeros(self._ids.size, dtype=bool)
        if engine.n:
            positions = np.searchsorted(self._ids, np.array(engine.keys, dtype=np.int64))
            # Read off f, which the optimum fixes, rather than off the coefficients, which it
            # may not: on the margin (y f = 1 to round-off of its terms) or inside it. Where the
            # optimum is degenerate (w = 0: f is the constant b), a sample on the margin can
            # hold alpha = 0 or alpha = C depending on the path's round-off, and a model
            # restored from a checkpoint or a pickle (whose factor is rebuilt) then kept
            # other samples and learned another classifier from there on.
            within = engine.g <= _MARGIN_SLACK * engine.g_terms()
            support[positions] = within | (engine.alpha > 0) | (engine.status == MARGIN)
        return support

    def _place(self, training: np.ndarray, working: np.ndarray, caching: np.ndarray) -> None:
        """Set transitions and weights after training on T (eqs 3-6)."""
        self._clock += 1
        support = self._support() & training
        cache = (working | caching) & ~support
        self._psi[cache] *= self._decay
        self._psi[support] += self._increment_w
        self._used[support] = self._clock
        cache &= self._psi > self._threshold
        self._set = np.where(support, WORKING, np.where(cache, CACHING, BACKUP)).astype(np.int8)

    def _discard(self) -> int:
        """Forget floor(alpha |B|) backup samples, least recently used (then oldest) first."""
        backup = np.flatnonzero(self._set == BACKUP)
        count = math.floor(round(self._ratio_alpha * backup.size, 9))
        if count == 0:
            return 0
        order = np.lexsort((self._ids[backup], self._used[backup]))
        gone = np.zeros(self._ids.size, dtype=bool)
        gone[backup[order[:count]]] = True
        in_engine = gone & self._in_T
        if in_engine.any():
            # Backup samples in T are not support vectors (alpha = 0): removing them leaves the
            # classifier as it is and costs no breakpoint.
            self._engine.update(remove=self._ids[in_engine].tolist())
        keep = ~gone
        self._ids, self._rows, self._labels = self._ids[keep], self._rows[keep], self._labels[keep]
        self._psi, self._used, self._set = self._psi[keep], self._used[keep], self._set[keep]
        self._in_T = self._in_T[keep]
        return count

    # ---------------------------------------------------------------- persistence
    def to_checkpoint(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """The classifier, the three sets with their rows and weights, and the buffer.

        >>> model = AlphaISVC(batch_size=2, C=1.0)
        >>> model.learn_one({"a": 0.0}, False)
        >>> model.learn_one({"a": 1.0}, True)
        >>> arrays, meta = model.to_checkpoint()
        >>> restored = AlphaISVC.from_checkpoint(arrays, meta)
        >>> restored.n_stored, restored.decision_function_one({"a": 1.0}) == \\
        ...     model.decision_function_one({"a": 1.0})
        (2, True)
        """
        arrays, meta = super().to_checkpoint()
        arrays.update({
            "aisvc_ids": self._ids.copy(), "aisvc_rows": self._rows.copy(),
            "aisvc_labels": self._labels.copy(), "aisvc_psi": self._psi.copy(),
            "aisvc_used": self._used.copy(), "aisvc_set": self._set.copy(),
            "aisvc_in_T": self._in_T.copy(),
        })
        return arrays, meta

    def _checkpoint_extra(self) -> dict[str, Any]:
        return {
            "clock": self._clock, "next_id": self._next_id, "initialized": self._initialized,
            "increments_total": self.increments_total, "discarded_total": self.discarded_total,
            "rounds_total": self.rounds_total, "bound_hits_total": self.bound_hits_total,
            "last_increment": asdict(self.last_increment),
            "buffer_rows": [row.tolist() for row in self._buffer_rows],
            "buffer_labels": list(self._buffer_labels),
        }

    def _restore_extra(self, extra: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        check_checkpoint_members(arrays, _SET_ARRAYS)
        check_checkpoint_meta(extra, {
            "clock": JSON_COUNT, "next_id": JSON_COUNT, "initialized": JSON_FLAG,
            "increments_total": JSON_COUNT, "discarded_total": JSON_COUNT,
            "rounds_total": JSON_COUNT, "bound_hits_total": JSON_COUNT,
            "last_increment": JSON_TABLE, "buffer_rows": JSON_LIST, "buffer_labels": JSON_LIST,
        }, where="checkpoint's extra")
        if max(extra["clock"], extra["next_id"]) >= _MAX_COUNT:
            raise ValueError("the checkpoint's clock or next_id is out of range")
        for name, kinds in _SET_KINDS.items():
            # (As written: labels turned to booleans, or weights to integers, restore as
            # other values the checks below cannot tell from real ones.)
            kind = np.asarray(arrays[name]).dtype.kind
            if kind not in kinds:
                raise ValueError(f"the checkpoint's {name} holds {np.asarray(arrays[name]).dtype}"
                                 " values, not the kind it writes")
        try:
            last_increment = IncrementStats(**extra["last_increment"])
            buffer_rows = [np.array(row, dtype=float) for row in extra["buffer_rows"]]
            buffer_labels = [float(v) for v in extra["buffer_labels"]]
        except (TypeError, ValueError):
            raise ValueError("the checkpoint's last_increment or buffered samples are not what "
                             "an AlphaISVC writes") from None
        self._ids = np.asarray(arrays["aisvc_ids"], dtype=np.int64)
        self._rows = np.asarray(arrays["aisvc_rows"], dtype=float)
        self._labels = np.asarray(arrays["aisvc_labels"], dtype=float)
        self._psi = np.asarray(arrays["aisvc_psi"], dtype=float)
        self._used = np.asarray(arrays["aisvc_used"], dtype=np.int64)
        self._set = np.asarray(arrays["aisvc_set"], dtype=np.int8)
        self._in_T = np.asarray(arrays["aisvc_in_T"], dtype=bool)
        self._clock = int(extra["clock"])
        self._next_id = int(extra["next_id"])
        self._initialized = bool(extra["initialized"])
        self.increments_total = int(extra["increments_total"])
        self.discarded_total = int(extra["discarded_total"])
        self.rounds_total = int(extra["rounds_total"])
        self.bound_hits_total = int(extra["bound_hits_total"])
        self.last_increment = last_increment
        self._buffer_rows = buffer_rows
        self._buffer_labels = buffer_labels
        self._check_restored_sets()

    def _check_restored_sets(self) -> None:
        """ValueError naming what of a restored checkpoint's kept samples contradicts the rest:
        an increment would otherwise fail on it, at every later learn."""
        m = self._ids.size
        if (self._ids.ndim != 1 or self._rows.ndim != 2
                or any(a.shape != (m,) for a in (self._labels, self._psi, self._used, self._set,
                                                 self._in_T))
                or self._rows.shape[0] != m):
            raise ValueError("the checkpoint's aisvc_* arrays differ in length, or are not one "
                             "entry (a row of features for aisvc_rows) per kept sample")
        if self._rows.ndim != 2 or self._rows.shape[1] > len(self._features):
            raise ValueError("the checkpoint's aisvc_rows are not rows over its feature names")
        if np.unique(self._ids).size != m or (m and self._next_id <= int(self._ids.max())):
            raise ValueError("the checkpoint's sample ids repeat, or its next_id is not above "
                             "them: the next increment would reuse an id")
        if not (np.isin(self._labels, (-1.0, 1.0)).all()
                and np.isin(self._set, (WORKING, CACHING, BACKUP)).all()
                and np.isfinite(self._rows).all()):
            raise ValueError("the checkpoint's kept samples hold labels other than +1/-1, "
                             "sets other than working/caching/backup, or non-finite features")
        if not (np.isfinite(self._psi).all() and np.all(self._psi >= 0)
                and np.all((self._used >= 0) & (self._used <= self._clock))):
            # (They decide which samples an increment discards.)
            raise ValueError("the checkpoint's caching weights are not finite numbers >= 0, or "
                             "its last uses lie outside its clock")
        if not self._initialized and (m or self._engine.n):
            raise ValueError("the checkpoint keeps samples but says no increment has run")
        if not set(self._engine.keys) <= set(self._ids.tolist()):
            raise ValueError("the checkpoint trains on samples it does not keep")
        if sorted(self._ids[self._in_T].tolist()) != sorted(self._engine.keys):
            # The next increment would add what the classifier holds, or remove what it lacks.
            raise ValueError("the checkpoint's aisvc_in_T does not mark exactly the samples its "
                             "classifier trains on")
        width = len(self._features)
        if (len(self._buffer_rows) != len(self._buffer_labels)
                or not all(value in (-1.0, 1.0) for value in self._buffer_labels)
                or any(row.ndim != 1 or row.size > width or not np.isfinite(row).all()
                       for row in self._buffer_rows)):
            raise ValueError("the checkpoint's buffered samples are not finite rows over its "
                             "feature names with labels +1/-1")
