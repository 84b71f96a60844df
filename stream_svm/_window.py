"""The sliding window shared by the windowed models: arrivals are buffered and, every ``step``
of them, the window slides in one update that adds them and removes the oldest samples (one
multiple path, or one sample at a time), all or nothing."""

from __future__ import annotations

import itertools
import numbers
from collections.abc import Hashable, Iterable, Mapping
from typing import Any

import numpy as np
import pandas as pd

from stream_svm._engine_model import (
    JSON_LIST,
    AutoKey,
    check_checkpoint_meta,
    check_keys,
    forget_without_key_error,
    key_from_json,
    key_to_json,
    plain_key,
    refuse_key_with_value,
    refused_unchanged,
    unknown_key,
)
from stream_svm._input import check_findable_keys, check_paired
from stream_svm.engine import BreakpointLimit, ConvergenceError, UpdateStats


class _SlidingWindow:
    """Window logic over an engine-backed model (a mixin before it in the bases). The model
    supplies ``_value`` / ``_values`` (a label or target as the float it learns),
    ``_value_out`` (back to what the user gave), ``_in_engine(key)``, ``_oldest(count)`` (the
    keys of the oldest samples in the window) and ``_engine_update(rows, values, keys,
    remove)``; ``_n_window()`` counts the samples in the window."""

    _noun: str  # what the values are called in messages: "labels" or "targets"

    def _init_window(self) -> None:
        for name, value in (("window_size", self.window_size), ("step", self.step)):
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if self.step > self.window_size:
            raise ValueError(
                f"step ({self.step}) must be at most window_size ({self.window_size}): each slide "
                "keeps the newest window_size of the step arrivals, so the others would never "
                "be learned"
            )
        if not isinstance(self.strategy, str) or self.strategy not in ("multiple", "single"):
            raise ValueError(f"strategy must be 'multiple' or 'single', got {self.strategy!r}")
        self._buffer_rows: list[np.ndarray] = []
        self._buffer_values: list[float] = []
        self._buffer_keys: list[Hashable] = []
        #: (key, why) of each buffered sample left out because the slide was refused with it (see
        #: ``_buffer``), in the order they were left out; the caller may clear it once read.
        self.refused_from_buffer: list[tuple[Hashable, str]] = []

    @property
    def n_window(self) -> int:
        """Samples in the current window solution."""
        return self._n_window()

    @property
    def n_buffered(self) -> int:
        """Arrivals waiting for the next slide."""
        return len(self._buffer_keys)

    def __contains__(self, key: object) -> bool:
        # Buffered keys are plain Python values (see plain_key), compared safely with any key.
        key = plain_key(key)  # type: ignore[arg-type]
        return self._in_engine(key) or self._buffered_at(key) is not None

    def _buffered_at(self, key: Hashable) -> int | None:
        """The position of ``key`` in the buffer, or None. A boolean is no key (True == 1:
        forget_one(key=True) removed the arrival waiting under key 1)."""
        if isinstance(key, (bool, np.bool_)) or key not in self._buffer_keys:
            return None
        return self._buffer_keys.index(key)

    def _first_held(self, keys: list[Hashable]) -> Hashable | None:
        if (self._engine.first_stored(keys) is None
                and set(self._buffer_keys).isdisjoint(keys)):
            return None
        return next((key for key in keys if key in self), None)

    def stored_point(self, key: Hashable) -> tuple[dict[Hashable, float], Any]:
        """The features and the label (or target) of a sample in the window or waiting in the
        buffer."""
        key = plain_key(key)
        index = self._buffered_at(key)
        if index is not None:
            row, names = self._buffer_rows[index], self._features.names
            x = {names[i]: float(row[i]) for i in np.flatnonzero(row)}
            return x, self._value_out(self._buffer_values[index])
        return super().stored_point(key)

    def _find_by_value(self, x: Mapping, y: object, taken: frozenset | set = frozenset()
                       ) -> Hashable:
        """Key of the oldest sample equal to x with y (skipping ``taken``): in the window,
        else among the arrivals waiting in the buffer (newer than the window's)."""
        try:
            return super()._find_by_value(x, y, taken)  # type: ignore[misc]
        except KeyError as missing:
            row, new = self._row(x)
            if not new:
                value = self._value(y)
                for key, buffered, buffered_value in zip(
                        self._buffer_keys, self._buffer_rows, self._buffer_values, strict=True):
                    width = min(row.size, buffered.size)
                    if (key not in taken and buffered_value == value
                            and np.array_equal(row[:width], buffered[:width])
                            and not row[width:].any() and not buffered[width:].any()):
                        return key
            raise missing

    @refused_unchanged
    def learn_one(self, x: Mapping, y: object, key: Hashable | None = None) -> None:
        """Buffer one sample; slide the window when ``step`` samples are buffered.

        All or nothing: a sample refused by the slide's update is not buffered either."""
        value = self._value(y)
        key = None if key is None else plain_key(key)
        if key is not None:
            check_keys([key])
        if key is not None and key in self:
            raise KeyError(f"key {key!r} is already stored; keys must be unique")
        row, new = self._admitted(lambda: self._row(x), values=value)
        self._check_kernel_values(row)
        point_key = key if key is not None else AutoKey(self._auto_keys + 1)
        self._buffer([row], [value], [point_key], new, slide=None)

    @refused_unchanged
    def learn_many(
        self, X: pd.DataFrame, y: pd.Series, keys: Iterable[Hashable] | None = None
    ) -> None:
        """Slide the window by the whole batch (plus anything buffered) in one update."""
        check_paired(X, y, noun=self._noun)
        if len(X) == 0:
            return
        values = self._values(y)
        rows, new = self._admitted(lambda: self._frame(X), slides=True, values=values)
        batch_keys = [plain_key(key) for key in self._keys_for(X, keys)]
        check_keys(batch_keys)
        if len(set(batch_keys)) != len(batch_keys):
            raise KeyError("keys repeat within the batch")
        if (self._engine.first_stored(batch_keys) is not None
                or not set(self._buffer_keys).isdisjoint(batch_keys)):
            for key in batch_keys:  # the first one in the batch's order is named
                if key in self:
                    where = " (from X's index)" if keys is None else ""
                    raise KeyError(f"key {key!r}{where} is already stored; keys must be unique")
        self._check_kernel_values(rows)
        self._buffer(list(rows), values.tolist(), batch_keys, new, slide=True)

    def _buffer(self, rows: list[np.ndarray], values: list[float], keys: list[Hashable],
                new: list[Hashable], slide: bool | None) -> None:
        """Buffer arrivals and slide (``slide`` None: once ``step`` samples are buffered), all
        or nothing for the arrivals.

        A slide the engine refuses may fail for a sample an earlier call buffered (a point far
        beyond the others' scale, taken into the buffer unchecked): every later slide would
        fail with it, and the window would refuse all that comes after it, for good. So a
        refused slide (not one stopped by ``max_breakpoints``) with such samples in the buffer,
        far beyond the stored points' scale (``_far_suspects``), is tried again without them,
        the farthest first, one more each time: those it goes through without are left out
        (listed in :attr:`refused_from_buffer`, with a warning). Otherwise the arrivals are
        refused, and the model is as it was, buffer included."""
        try:
            self._buffer_arrivals(rows, values, keys, new, slide)
        except BreakpointLimit:
            raise
        except ConvergenceError:
            suspects = self._far_suspects(self._buffer_rows)
            if not suspects or not (
                    slide or (slide is None and len(self._buffer_keys) + len(keys) >= self.step)):
                raise
            waiting = list(zip(self._buffer_rows, self._buffer_values, self._buffer_keys,
                               strict=True))
            with self._all_or_nothing():
                for count in range(1, len(suspects) + 1):
                    left = set(suspects[:count])
                    kept = [sample for i, sample in enumerate(waiting) if i not in left]
                    self._buffer_rows = [row for row, _, _ in kept]
                    self._buffer_values = [value for _, value, _ in kept]
                    self._buffer_keys = [key for _, _, key in kept]
                    try:
                        self._buffer_arrivals(rows, values, keys, new, True)
                    except ConvergenceError:
                        continue
                    break
                else:
                    raise
            for index in suspects[:count]:
                self._note_left_out(waiting[index][2], "the window's slide was refused with it "
                                                       "and went through without it")

    def _buffer_arrivals(self, rows: list[np.ndarray], values: list[float],
                         keys: list[Hashable], new: list[Hashable], slide: bool | None) -> None:
        """Buffer arrivals (and slide), all or nothing."""
        if slide is None:
            slide = len(self._buffer_keys) + len(keys) >= self.step
        names, auto_keys, buffered = len(self._features), self._auto_keys, len(self._buffer_keys)
        try:
            self._features.add(new)
            self._commit_keys(keys)
            self._buffer_rows.extend(rows)
            self._buffer_values.extend(values)
            self._buffer_keys.extend(keys)
            if slide:
                self._slide()  # the engine is unchanged when its update fails
        except BaseException:
            if slide and keys and self._in_engine(keys[-1]):
                # The engine took the slide (an interrupt, Ctrl-C, right after it): the
                # buffer went into the window, and the names and keys stay recorded.
                self._buffer_rows, self._buffer_values, self._buffer_keys = [], [], []
                raise
            # (each list cut back on its own: an interrupt may land between two extends)
            del self._buffer_rows[buffered:]
            del self._buffer_values[buffered:]
            del self._buffer_keys[buffered:]
            self._features.truncate(names)
            self._auto_keys = auto_keys
            raise
        if slide:
            self._after_learning()

    def _unknown(self, key: Hashable) -> KeyError:
        return unknown_key("sample in the window", key,
                           itertools.chain(self._buffer_keys, self._engine._pos))

    def forget_one(
        self, x: Mapping | None = None, y: object = None, key: Hashable | None = None
    ) -> None:
        """Remove one sample from the window (or the buffer), by key or else by value (the
        oldest equal sample of the window, else of the buffer)."""
        refuse_key_with_value("forget_one", key, x, y)
        if key is None:
            if x is None or y is None:
                raise forget_without_key_error(x)
            key = self._find_by_value(x, y)
        key = plain_key(key)
        index = self._buffered_at(key)
        if index is not None:
            del self._buffer_rows[index], self._buffer_values[index], self._buffer_keys[index]
        elif self._in_engine(key):
            self._engine_update(np.zeros((0, self._engine.dim)), np.zeros(0), [], [key])
        else:
            raise self._unknown(key)
        self._forgotten()

    def _leaving_positions(self, arriving: int, slides: bool) -> np.ndarray:
        # The oldest points leave in the slide that learns these arrivals: a stream whose
        # feature names drift would otherwise count the names of points on their way out and
        # be refused at max_features for good (the names of a buffered point and of those
        # points are held together until that slide).
        learned = len(self._buffer_keys) + arriving
        if not slides:
            learned = max(learned, self.step)  # learn_one slides when the buffer is full
        overflow = self._n_window() + min(learned, self.window_size) - self.window_size
        if overflow <= 0:
            return np.zeros(0, dtype=np.int64)
        return np.array([self._engine.position(key) for key in self._oldest(overflow)],
                        dtype=np.int64)

    def forget_many(
        self,
        keys: Iterable[Hashable] | None = None,
        X: pd.DataFrame | None = None,
        y: pd.Series | None = None,
    ) -> None:
        """Remove several samples from the window (or the buffer) in one update, by keys or
        else by value (X, y: for each row, the oldest equal sample not taken by an earlier
        row). All or nothing: an unknown key or value raises KeyError and changes nothing.

        >>> from stream_svm import SlidingWindowSVR
        >>> model = SlidingWindowSVR(window_size=3, kernel="linear")
        >>> for i in range(3):
        ...     model.learn_one({"a": float(i)}, float(i), key=f"k{i}")
        >>> model.forget_many(["k0", "k2"])
        >>> model.stored_keys()
        ['k1']
        """
        found = self._keys_to_forget(keys, X, y, self._noun)
        if keys is not None:
            found = [plain_key(key) for key in found]
            if len(set(found)) != len(found):
                raise KeyError("keys repeat: each sample is forgotten once")
            for key in found:
                if self._buffered_at(key) is None and not self._in_engine(key):
                    raise self._unknown(key)
        buffered = set(self._buffer_keys).intersection(found)
        stored = [key for key in found if key not in buffered]
        if stored:  # (raises with the engine unchanged, before the buffer changes)
            self._engine_update(np.zeros((0, self._engine.dim)), np.zeros(0), [], stored)
        for index in range(len(self._buffer_keys) - 1, -1, -1):
            if self._buffer_keys[index] in buffered:
                del self._buffer_rows[index], self._buffer_values[index]
                del self._buffer_keys[index]
        self._forgotten()

    def _slide(self) -> None:
        if not self._buffer_keys:
            return
        # As wide as the names known (the engine widens itself inside its all-or-nothing update).
        rows = np.zeros((len(self._buffer_rows), max(len(self._features), self._engine.dim)))
        for i, row in enumerate(self._buffer_rows):
            rows[i, : row.size] = row
        values = np.array(self._buffer_values)
        keys = list(self._buffer_keys)
        # Arrivals that would leave the window in the same slide are never learned.
        rows, values, keys = rows[-self.window_size :], values[-self.window_size :], \
            keys[-self.window_size :]
        overflow = self._n_window() + len(keys) - self.window_size
        oldest = self._oldest(overflow) if overflow > 0 else []
        if self.strategy == "multiple":
            self._engine_update(rows, values, keys, oldest)
        else:
            self._slide_single(rows, values, keys, oldest)
        self._buffer_rows, self._buffer_values, self._buffer_keys = [], [], []

    def _slide_single(self, rows, values, keys, oldest) -> None:
        engine = self._engine
        started = engine.breakpoints_total
        seconds = 0.0
        steps = 0
        migrations: dict[str, int] = {}
        updates = [(np.zeros((0, engine.dim)), np.zeros(0), [], [key]) for key in oldest]
        updates += [(row[None, :], np.array([value]), [key], [])
                    for row, value, key in zip(rows, values, keys, strict=True)]
        # All or nothing, as a multiple update is: a slide refused part-way (a limit, a
        # user's kernel raising) must not leave its first points learned or forgotten.
        with self._all_or_nothing(deep=False):  # (the engine and the SVR's targets change)
            for update in updates:
                self._engine_update(*update)
                stats = engine.last_update
                seconds += stats.seconds
                steps += stats.steps
                for name, count in stats.migrations.items():
                    migrations[name] = migrations.get(name, 0) + count
        # Report the slide as one update so both strategies can be compared per slide.
        engine.last_update = UpdateStats(
            added=len(keys), removed=len(oldest), breakpoints=engine.breakpoints_total - started,
            steps=steps, migrations=migrations, seconds=seconds,
        )

    def _extra_rows(self) -> list[np.ndarray]:
        return list(self._buffer_rows)

    _extra_row_attributes = ("_buffer_rows",)

    def _keep_extra_columns(self, columns: np.ndarray) -> None:
        self._buffer_rows = [row[columns[columns < row.size]] for row in self._buffer_rows]

    def _checkpoint_extra(self) -> dict[str, Any]:
        # Buffered keys obey the stored keys' rule (a tuple would come back from JSON as an
        # unhashable list, and break the restored model at its next slide).
        return {"buffer_labels": list(self._buffer_values),
                "buffer_keys": [k.number if isinstance(k, AutoKey) else key_to_json(k)
                                for k in self._buffer_keys],
                "buffer_auto": [isinstance(k, AutoKey) for k in self._buffer_keys],
                "buffer_rows": [row.tolist() for row in self._buffer_rows]}

    def _restore_extra(self, extra: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        # Checked here: a buffered sample is learned at the next slide, and one the model
        # cannot take would make every later slide fail.
        # (Every window's checkpoint has had them: one without them lost its buffer.)
        check_checkpoint_meta(extra, {"buffer_labels": JSON_LIST, "buffer_rows": JSON_LIST,
                                      "buffer_keys": JSON_LIST, "buffer_auto": JSON_LIST},
                              where="checkpoint's extra")
        labels, rows = extra["buffer_labels"], extra["buffer_rows"]
        keys, auto = extra["buffer_keys"], extra["buffer_auto"]
        if not len(labels) == len(rows) == len(keys) == len(auto):
            raise ValueError("the checkpoint's buffer_labels, buffer_rows, buffer_keys and "
                             "buffer_auto differ in length")
        try:
            values = np.array(labels, dtype=float).reshape(len(labels))
            buffered = [np.array(row, dtype=float) for row in rows]
        except (TypeError, ValueError):
            raise ValueError("the checkpoint's buffered labels or rows are not numbers") from None
        if not self._valid_buffered(values):
            raise ValueError("the checkpoint's buffered labels are not values the model learns")
        width = len(self._features)
        if any(row.ndim != 1 or row.size > width or not np.isfinite(row).all()
               for row in buffered):
            raise ValueError("a buffered row of the checkpoint is not a finite vector over its "
                             f"{width} feature names")
        if any(flag and not (isinstance(k, int) and not isinstance(k, bool))
               for k, flag in zip(keys, auto, strict=True)):
            raise ValueError("an automatic buffered key of the checkpoint is not a number")
        try:
            buffer_keys = [AutoKey(k) if flag else key_from_json(k)
                           for k, flag in zip(keys, auto, strict=True)]
        except ValueError as exc:
            raise ValueError(f"the checkpoint's buffered keys: {exc}") from None
        try:
            check_findable_keys(buffer_keys)
        except KeyError as exc:  # (a KeyError's text is its repr)
            raise ValueError(f"the checkpoint's buffered keys: {exc.args[0]}") from None
        if (len(set(buffer_keys)) != len(buffer_keys)
                or self._engine.first_stored(buffer_keys) is not None):
            raise ValueError("the checkpoint's buffered keys repeat, or repeat a stored key")
        self._buffer_values = values.tolist()
        self._buffer_rows = buffered
        self._buffer_keys = buffer_keys

    def _held_keys(self) -> list[Hashable]:
        return [*self._engine.keys, *self._buffer_keys]
