"""The daemon's cache of unlabelled features: points that were predicted and wait for a late
label (``{"id", "y"}``), which joins them by id.

Bounded three ways: at most ``max_entries`` points, at most ``max_bytes`` of estimated memory
(the points, and the feature names they use), and for at most ``max_age_seconds`` of the
daemon's own processing time (the wall clock while the daemon runs, without the time it was
down between a checkpoint and its restore; not the producer's timestamp, which a client can
set to anything). The oldest entries go first whichever
bound is hit. Names no cached point uses any more are reclaimed in bulk once they weigh as much
as everything else, so the cache may briefly hold up to about twice ``max_bytes``.

The features are stored column-wise in flat arrays (a feature-name table, then name indexes and
values per entry) rather than as a dict per entry: it takes about a tenth of the memory, and a
checkpoint copies a few numpy arrays instead of serializing every entry (100,000 entries of 10
features: milliseconds instead of the ~0.9 s of JSON encoding it took on the daemon's thread).

>>> cache = UnlabelledCache(max_entries=2, max_bytes=1 << 20, max_age_seconds=60)
>>> cache.put("a", {"f": 1.0}, prediction=True, now=0.0)
>>> cache.put("b", {"f": 2.0, "g": 3.0}, prediction=False, now=1.0)
>>> cache.put("c", {"g": 4.0}, prediction=True, now=2.0)      # over max_entries: "a" goes
>>> list(cache), cache.evictions
(['b', 'c'], {'entries': 1})
>>> cache.pop("b")
CachedPoint(x={'f': 2.0, 'g': 3.0}, prediction=0.0, cached_at=1.0)
>>> cache.expire(now=100.0)                                    # "c" is older than 60 s
{'age': 1}
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from stream_svm._engine_model import texts_from_arrays, texts_to_arrays

__all__ = ["CachedPoint", "UnlabelledCache"]

Id = str | int

#: Estimated bytes of one entry besides its features (slot arrays, the id and its dict entry).
ENTRY_BYTES = 160
#: Bytes of one stored feature (a 4-byte name index and an 8-byte value).
FEATURE_BYTES = 12
#: Estimated bytes of one name in the feature-name table, besides its characters.
NAME_BYTES = 100


@dataclass(frozen=True)
class CachedPoint:
    """An unlabelled point: its features, the prediction made for it and when it was cached
    (seconds of the daemon's processing time)."""

    x: dict[str, float]
    prediction: float  # a classifier's 1.0 / 0.0 (positive or not), a regressor's value
    cached_at: float


class UnlabelledCache:
    """Unlabelled feature vectors by id, oldest first, bounded in entries, bytes and age.

    ``put`` of an id already cached replaces it (as the newest entry). ``evictions`` counts the
    entries dropped by each bound (``entries``, ``bytes``, ``age``) and those replaced by a
    newer entry of their id (``replaced``) since the cache was made.
    """

    def __init__(self, max_entries: int, max_bytes: int, max_age_seconds: float) -> None:
        if max_entries < 0 or max_bytes < 0 or not max_age_seconds > 0:
            raise ValueError("cache bounds must be >= 0 (max_age_seconds > 0)")
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.max_age_seconds = max_age_seconds
        self.evictions: dict[str, int] = {}
        self._clear()

    def _clear(self) -> None:
        self._names: list[str] = []
        self._name_index: dict[str, int] = {}
        self._name_uses = array("q")  # cached features per name; 0: reclaimable
        # Per slot (one per put, in insertion order; a popped or replaced entry leaves a dead
        # slot behind until the next compaction).
        self._ids: list[Id | None] = []
        # The ids again, typed for checkpoints: integer ids, and the text of string ids.
        self._id_int = array("q")
        self._id_text: list[str] = []
        self._times = array("d")
        self._predictions = array("d")
        self._alive = bytearray()
        self._starts = array("q")
        # Per stored feature, all slots end to end.
        self._feature_names = array("i")
        self._feature_values = array("d")
        self._slot_of: dict[Id, int] = {}
        self._head = 0  # no live slot before this one
        self._bytes = 0  # entries and their features
        self._names_bytes = 0  # names some cached point uses
        self._dead_names_bytes = 0  # names no cached point uses, until the next compaction

    # -- reading ---------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._slot_of)

    def __contains__(self, identifier: object) -> bool:
        try:
            return identifier in self._slot_of
        except TypeError:
            return False

    def __iter__(self) -> Iterator[Id]:
        """Ids, oldest first."""
        return (self._ids[slot] for slot in sorted(self._slot_of.values()))  # type: ignore[misc]

    @property
    def bytes(self) -> int:
        """Estimated memory of the cached points and the feature names they use."""
        return self._bytes + self._names_bytes

    def _stop(self, slot: int) -> int:
        if slot + 1 < len(self._starts):
            return self._starts[slot + 1]
        return len(self._feature_values)

    def _point(self, slot: int) -> CachedPoint:
        start, stop = self._starts[slot], self._stop(slot)
        names = self._names
        x = {
            names[index]: value
            for index, value in zip(
                self._feature_names[start:stop], self._feature_values[start:stop], strict=True
            )
        }
        return CachedPoint(x, self._predictions[slot], self._times[slot])

    def get(self, identifier: Id) -> CachedPoint | None:
        slot = self._slot_of.get(identifier)
        return None if slot is None else self._point(slot)

    # -- writing ---------------------------------------------------------------------------

    def _use_name(self, name: str) -> int:
        index = self._name_index.get(name)
        if index is None:
            index = self._name_index[name] = len(self._names)
            self._names.append(name)
            self._name_uses.append(0)
        elif self._name_uses[index] == 0:
            self._dead_names_bytes -= NAME_BYTES + len(name)  # in use again
        if self._name_uses[index] == 0:
            self._names_bytes += NAME_BYTES + len(name)
        self._name_uses[index] += 1
        return index

    def put(self, identifier: Id, x: Mapping[str, float], prediction: float, now: float
            ) -> None:
        """Cache ``x`` under ``identifier`` (replacing an older entry of the same id) and apply
        the entry and byte bounds."""
        if identifier in self._slot_of:  # (counted: features dropped for the newer ones)
            self.evictions["replaced"] = self.evictions.get("replaced", 0) + 1
        self._kill(identifier)
        slot = len(self._ids)
        self._ids.append(identifier)
        is_int = isinstance(identifier, int)
        self._id_int.append(identifier if is_int else 0)  # type: ignore[arg-type]
        self._id_text.append("" if is_int else identifier)  # type: ignore[arg-type]
        self._times.append(now)
        self._predictions.append(float(prediction))
        self._alive.append(1)
        self._starts.append(len(self._feature_values))
        self._feature_names.extend(map(self._use_name, x))
        self._feature_values.extend(x.values())
        self._slot_of[identifier] = slot
        # A text id counts with its characters (up to 1,024 each: a tenth of the bound's
        # worth of entries uncounted otherwise).
        self._bytes += ENTRY_BYTES + len(self._id_text[slot]) + FEATURE_BYTES * len(x)
        self._evict(now, by_age=False)

    def pop(self, identifier: Id) -> CachedPoint | None:
        """Remove and return the entry of ``identifier`` (None when it is not cached)."""
        slot = self._slot_of.get(identifier)
        if slot is None:
            return None
        point = self._point(slot)
        self._kill(identifier)
        return point

    def expire(self, now: float) -> dict[str, int]:
        """Drop entries older than ``max_age_seconds`` at ``now`` (and over the other bounds);
        returns how many were dropped by each bound."""
        return self._evict(now, by_age=True)

    def _kill(self, identifier: Id) -> None:
        slot = self._slot_of.pop(identifier, None)
        if slot is None:
            return
        self._ids[slot] = None
        self._alive[slot] = 0
        start, stop = self._starts[slot], self._stop(slot)
        self._bytes -= ENTRY_BYTES + len(self._id_text[slot]) + FEATURE_BYTES * (stop - start)
        uses = self._name_uses
        for index in self._feature_names[start:stop]:
            uses[index] -= 1
            if uses[index] == 0:
                cost = NAME_BYTES + len(self._names[index])
                self._names_bytes -= cost
                self._dead_names_bytes += cost
        dead = len(self._ids) - len(self._slot_of)
        # Compacting costs O(live entries): only once the dead weigh as much as the living.
        if (dead > 1024 and dead > len(self._slot_of)) or (
            self._dead_names_bytes > 64 * NAME_BYTES + self.bytes
        ):
            self._compact()

    def _evict(self, now: float, by_age: bool) -> dict[str, int]:
        dropped: dict[str, int] = {}
        horizon = now - self.max_age_seconds
        while self._slot_of:
            while self._ids[self._head] is None:  # popped or replaced
                self._head += 1
            if len(self._slot_of) > self.max_entries:
                reason = "entries"
            elif self.bytes > self.max_bytes:
                reason = "bytes"
            elif by_age and self._times[self._head] < horizon:
                reason = "age"
            else:
                break
            self._kill(self._ids[self._head])  # type: ignore[arg-type]
            dropped[reason] = dropped.get(reason, 0) + 1
        if not self._slot_of and self._ids:
            self._clear()  # nothing live: forget the dead slots and names at once
        for reason, count in dropped.items():
            self.evictions[reason] = self.evictions.get(reason, 0) + count
        return dropped

    def _compact(self) -> None:
        """Rebuild the arrays from the live entries and the names they use, oldest first."""
        self._load_arrays(self.to_arrays(), drop_unused_names=True)

    # -- checkpoints -----------------------------------------------------------------------

    def to_arrays(self) -> dict[str, np.ndarray]:
        """The cache as numpy arrays (no object dtype), oldest entry first."""
        slots = np.flatnonzero(np.frombuffer(self._alive, dtype=np.uint8))
        starts = np.frombuffer(self._starts, dtype=np.int64)
        stops = np.append(starts[1:], len(self._feature_values)).astype(np.int64)
        lengths = (stops - starts)[slots]
        total = int(lengths.sum())
        # Positions of the live entries' features in the flat arrays, in entry order.
        picked = np.repeat(starts[slots] - np.cumsum(lengths) + lengths, lengths) + np.arange(
            total
        )
        features = np.frombuffer(self._feature_names, dtype=np.int32)
        values = np.frombuffer(self._feature_values, dtype=np.float64)
        texts = [self._id_text[slot] for slot in slots.tolist()]
        return {
            "id_is_int": np.array([text == "" for text in texts], dtype=bool),
            "id_int": np.frombuffer(self._id_int, dtype=np.int64)[slots],
            # Variable-width UTF-8, not fixed-width text arrays, which give every string the
            # width of the longest (a 300,000-character name asked for 67 GiB).
            **texts_to_arrays(texts, "id_str"),
            "cached_at": np.frombuffer(self._times, dtype=np.float64)[slots],
            "prediction": np.frombuffer(self._predictions, dtype=np.float64)[slots],
            "indptr": np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
            "feature": features[picked],
            "value": values[picked],
            # Names no entry uses any more are dropped by the next compaction.
            **texts_to_arrays(self._names, "names"),
        }

    def load_arrays(self, arrays: Mapping[str, Any], now: float) -> None:
        """Replace the content with :meth:`to_arrays` output (checked; ValueError naming the
        problem), then apply the bounds at ``now``."""
        self._load_arrays(arrays, drop_unused_names=True)
        self._evict(now, by_age=True)

    def _load_arrays(self, arrays: Mapping[str, Any], drop_unused_names: bool) -> None:
        is_int = np.asarray(arrays["id_is_int"], dtype=bool)
        id_int = np.asarray(arrays["id_int"], dtype=np.int64)
        id_str = np.array(texts_from_arrays(arrays, "id_str"), dtype=object)
        cached_at = np.asarray(arrays["cached_at"], dtype=np.float64)
        # Checkpoints before regressors held booleans: they read as 1.0 / 0.0.
        prediction = np.asarray(arrays["prediction"], dtype=np.float64)
        indptr = np.asarray(arrays["indptr"], dtype=np.int64)
        feature = np.asarray(arrays["feature"], dtype=np.int64)
        value = np.asarray(arrays["value"], dtype=np.float64)
        names = np.array(texts_from_arrays(arrays, "names"), dtype=object)
        n = is_int.size
        if not (id_int.size == id_str.size == cached_at.size == prediction.size == n
                and indptr.size == n + 1 and indptr[0] == 0 and np.all(np.diff(indptr) >= 0)
                and indptr[-1] == feature.size == value.size):
            raise ValueError("cache arrays have inconsistent lengths")
        if feature.size and (feature.min() < 0 or feature.max() >= names.size):
            raise ValueError("cache arrays name features that are not in the name table")
        if not (np.all(np.isfinite(value)) and np.all(np.isfinite(cached_at))
                and np.all(np.isfinite(prediction))):
            raise ValueError("cache arrays hold non-finite numbers")
        if drop_unused_names:
            used, feature = np.unique(feature, return_inverse=True)
            names = names[used]
        texts = id_str.tolist()
        if np.any(is_int == (id_str != "")):
            raise ValueError("cache arrays give an id both as an integer and as text")
        ids: list[Id | None] = [text if text else number for text, number in zip(
            texts, id_int.tolist(), strict=True)]
        if len(set(ids)) != n:
            raise ValueError("cache arrays repeat an id")
        self._clear()
        self._names = [str(name) for name in names.tolist()]
        self._name_index = {name: i for i, name in enumerate(self._names)}
        if len(self._name_index) != len(self._names):
            raise ValueError("cache arrays repeat a feature name")
        uses = np.bincount(feature, minlength=len(self._names)) if self._names else np.zeros(0)
        self._name_uses = array("q", uses.astype(np.int64).tolist())
        for name, count in zip(self._names, uses.tolist(), strict=True):
            if count:
                self._names_bytes += NAME_BYTES + len(name)
            else:
                self._dead_names_bytes += NAME_BYTES + len(name)
        self._ids = ids
        self._id_int = array("q", np.where(is_int, id_int, 0).tolist())
        self._id_text = [text if not flag else "" for text, flag in zip(
            texts, is_int.tolist(), strict=True)]
        self._alive = bytearray(b"\x01" * n)
        self._times = array("d", cached_at.tolist())
        self._predictions = array("d", prediction.tolist())
        self._starts = array("q", indptr[:-1].tolist())
        self._feature_names = array("i", feature.astype(np.int32).tolist())
        self._feature_values = array("d", value.tolist())
        self._slot_of = {identifier: slot for slot, identifier in enumerate(ids)}
        self._bytes = (n * ENTRY_BYTES + sum(map(len, self._id_text))
                       + FEATURE_BYTES * feature.size)
