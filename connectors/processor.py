"""The daemon's logic without Kafka: one polled batch of records in, outputs and dead letters
out, the model and the cache of unlabelled features updated on the way.

It is deterministic given the sequence of records, so the same stream gives the same model
whatever the batching of IncrementalSVC, and its whole state (next offsets, cache, counters)
goes into checkpoints with the model.

>>> from stream_svm import IncrementalSVC                       # doctest: +SKIP
>>> processor = Processor(IncrementalSVC(C=1.0, gamma=0.5))       # doctest: +SKIP
>>> record = Record("in", 0, 0, b'{"id": 1, "x": {"a": 1.0}, "y": true}', 0)  # doctest: +SKIP
>>> result = processor.process([record])                         # doctest: +SKIP
>>> result.outputs[0][1]["learned"]                              # doctest: +SKIP
True
"""

from __future__ import annotations

import logging
import math
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from connectors.messages import (
    Forget,
    Id,
    Label,
    Malformed,
    Observe,
    Operation,
    Relabel,
    Source,
    dead_letter,
    encode_key,
    parse_label,
    parse_message,
)
from connectors.metrics import Metrics
from stream_svm import proba_from_decision

__all__ = ["BatchResult", "Processor", "Record"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Record:
    """One consumed message (kafka-python's ConsumerRecord has the same attributes)."""

    topic: str
    partition: int
    offset: int
    value: bytes | None
    timestamp: int  # milliseconds since the epoch, as Kafka stamps it


@dataclass
class BatchResult:
    """What a batch produced, in input order: ``(key, record)`` pairs for each topic, and the
    Kafka timestamps (ms) of the inputs that gave the outputs (for latency)."""

    outputs: list[tuple[bytes | None, dict[str, Any]]] = field(default_factory=list)
    dead_letters: list[tuple[bytes | None, dict[str, Any]]] = field(default_factory=list)
    input_timestamps: list[int] = field(default_factory=list)
    skipped: int = 0


@dataclass
class _Entry:
    """One record of the batch on its way through."""

    index: int
    record: Record
    source: Source
    op: Operation | None = None
    x: dict[str, float] | None = None
    y: bool | None = None
    score: float | None = None
    proba: float | None = None
    prediction: bool | None = None
    updates_before: int = 0
    output: dict[str, Any] | None = None
    error: str | None = None
    error_kind: str = ""


def _is_sliding(model: Any) -> bool:
    return hasattr(model, "window_size")


class Processor:
    """Applies batches of input and label records to a model.

    ``label_topic`` names the topic whose messages are late labels (``{"id", "y"}``); every
    other topic is read as the input topic. Predictions of a batch are made with one vectorized
    call before anything of the batch is learned. A sliding-window model learns each run of
    consecutive labelled points of a batch in one multiple update; IncrementalSVC learns them
    one by one, in order.
    """

    def __init__(
        self,
        model: Any,
        *,
        label_topic: str | None = None,
        cache_max_size: int = 100_000,
        cache_max_age_seconds: float = 3600.0,
        max_message_bytes: int = 1_000_000,
        metrics: Metrics | None = None,
    ) -> None:
        self.model = model
        self.label_topic = label_topic
        self.cache_max_size = cache_max_size
        self.cache_max_age_ms = int(cache_max_age_seconds * 1000)
        self.max_message_bytes = max_message_bytes
        self.metrics = metrics
        self.sliding = _is_sliding(model)
        #: next offset to process per "topic:partition"
        self.offsets: dict[str, int] = {}
        #: id -> (features, Kafka timestamp ms, prediction) of unlabelled points, oldest first
        self.cache: OrderedDict[Id, tuple[dict[str, float], int, bool]] = OrderedDict()
        self.updates = 0
        self.scored = 0
        self.correct = 0
        self.newest_timestamp = 0

    # -- state -----------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """The JSON-serializable state to checkpoint with the model."""
        return {
            "offsets": dict(self.offsets),
            "cache": [[key, x, ts, pred] for key, (x, ts, pred) in self.cache.items()],
            "updates": self.updates,
            "scored": self.scored,
            "correct": self.correct,
            "newest_timestamp": self.newest_timestamp,
        }

    def load_state(self, state: dict[str, Any]) -> None:
        self.offsets = {str(k): int(v) for k, v in state.get("offsets", {}).items()}
        self.cache = OrderedDict(
            (key, (dict(x), int(ts), bool(pred))) for key, x, ts, pred in state.get("cache", [])
        )
        self.updates = int(state.get("updates", 0))
        self.scored = int(state.get("scored", 0))
        self.correct = int(state.get("correct", 0))
        self.newest_timestamp = int(state.get("newest_timestamp", 0))

    @property
    def accuracy(self) -> float:
        return self.correct / self.scored if self.scored else math.nan

    # -- one batch -------------------------------------------------------------------------

    def process(self, records: Sequence[Any]) -> BatchResult:
        """Process the records of one poll (in order within each partition)."""
        result = BatchResult()
        entries: list[_Entry] = []
        for record in records:
            name = f"{record.topic}:{record.partition}"
            if record.offset < self.offsets.get(name, 0):
                result.skipped += 1  # already in the model: learned before the checkpoint
                continue
            self.offsets[name] = record.offset + 1
            self.newest_timestamp = max(self.newest_timestamp, int(record.timestamp or 0))
            entry = _Entry(
                len(entries), record, Source(record.topic, record.partition, record.offset)
            )
            try:
                if record.topic == self.label_topic:
                    entry.op = parse_label(record.value, self.max_message_bytes)
                else:
                    entry.op = parse_message(record.value, self.max_message_bytes)
            except Malformed as exc:
                entry.error, entry.error_kind = str(exc), "malformed"
            entries.append(entry)

        self._predict([e for e in entries if isinstance(e.op, Observe)])
        self._apply(entries)
        self._expire_cache()

        for entry in entries:
            if entry.error is not None:
                result.dead_letters.append(
                    (
                        f"{entry.source.topic}:{entry.source.partition}:{entry.source.offset}"
                        .encode(),
                        dead_letter(
                            entry.error, entry.record.value, entry.source, self.max_message_bytes
                        ),
                    )
                )
                self._count("dead_lettered")
                if self.metrics is not None:
                    self.metrics.dead_letters.labels(reason=entry.error_kind).inc()
            elif entry.output is not None:
                result.outputs.append((encode_key(entry.output["id"]), entry.output))
                result.input_timestamps.append(int(entry.record.timestamp or 0))
        if self.metrics is not None:
            self._gauges()
        return result

    def _predict(self, entries: list[_Entry]) -> None:
        if not entries:
            return
        frame = pd.DataFrame.from_records([e.op.x for e in entries])  # type: ignore[union-attr]
        started = time.perf_counter()
        scores = np.asarray(self.model.decision_function_many(frame), dtype=float)
        # The model's probability is a monotone squashing of the decision value: one kernel
        # evaluation serves both.
        probas = np.asarray(proba_from_decision(scores), dtype=float)
        if self.metrics is not None:
            self.metrics.predict_seconds.observe(time.perf_counter() - started)
        for entry, score, proba in zip(entries, scores, probas, strict=True):
            entry.score = float(score)
            entry.proba = float(proba)
            entry.prediction = bool(score > 0)
            entry.updates_before = self.updates

    def _apply(self, entries: list[_Entry]) -> None:
        pending: list[_Entry] = []  # labelled points waiting to be learned together
        pending_ids: set[Id] = set()
        for entry in entries:
            op = entry.op
            if op is None:
                continue
            if isinstance(op, Observe):
                self._observe(entry, op, pending, pending_ids)
            elif isinstance(op, Label):
                cached = self.cache.get(op.id)
                if cached is None:
                    self._reject(
                        entry,
                        f"no unlabelled features cached for id {op.id!r} (never seen, expired, "
                        "or already labelled)",
                        "unknown_id",
                    )
                    continue
                if op.id in pending_ids or op.id in self.model:
                    self._reject(entry, self._duplicate(op.id), "duplicate_id")
                    continue
                x, _, prediction = self.cache.pop(op.id)
                entry.x, entry.y, entry.prediction = x, op.y, prediction
                self._score(prediction, op.y)
                entry.output = {"id": op.id, "op": "label", "ok": True}
                pending.append(entry)
                pending_ids.add(op.id)
            else:
                self._learn(pending)
                pending_ids.clear()
                if isinstance(op, Forget):
                    self._forget(entry, op)
                else:
                    self._relabel(entry, op)
        self._learn(pending)

    def _observe(
        self, entry: _Entry, op: Observe, pending: list[_Entry], pending_ids: set[Id]
    ) -> None:
        entry.output = {
            "id": op.id,
            "prediction": entry.prediction,
            "score": entry.score,
            "proba": entry.proba,
            "learned": False,
            "model_updates": entry.updates_before,
            "source": entry.source.as_dict(),
        }
        if op.y is None:
            self.cache.pop(op.id, None)
            self.cache[op.id] = (op.x, int(entry.record.timestamp or 0), bool(entry.prediction))
            self._count("predicted")
            return
        if op.id in pending_ids or op.id in self.model:
            self._reject(entry, self._duplicate(op.id), "duplicate_id")
            return
        self.cache.pop(op.id, None)
        entry.x, entry.y = op.x, op.y
        self._score(bool(entry.prediction), op.y)
        pending.append(entry)
        pending_ids.add(op.id)

    @staticmethod
    def _duplicate(identifier: Id) -> str:
        return (
            f"id {identifier!r} is already learned: send a relabel to change its label, or "
            "forget it first"
        )

    def _reject(self, entry: _Entry, reason: str, kind: str) -> None:
        entry.output = None
        entry.error, entry.error_kind = reason, kind

    def _learn(self, pending: list[_Entry]) -> None:
        if not pending:
            return
        batch = list(pending)
        pending.clear()
        # A run of labelled points is learned in one multiple update (Karasuyama & Takeuchi):
        # the exact solution does not depend on the order within the run, so the model equals
        # learning them one by one, along a shorter path. A window's run shorter than its step
        # goes to its buffer (learn_one), so that a trickle of labels slides the window every
        # `step` arrivals rather than at every message.
        minimum = max(2, int(getattr(self.model, "step", 1))) if self.sliding else 2
        if len(batch) >= minimum and hasattr(self.model, "learn_many"):
            keys = [e.op.id for e in batch]  # type: ignore[union-attr]
            frame = pd.DataFrame.from_records([e.x for e in batch])
            labels = pd.Series([e.y for e in batch])
            try:
                self._timed(lambda: self.model.learn_many(frame, labels, keys=keys))
            except Exception as exc:  # the model is unchanged: learn point by point instead
                log.warning("multiple update refused (%s); learning the batch point by point", exc)
            else:
                for entry in batch:
                    self._learned(entry)
                return
        for entry in batch:
            try:
                self._timed(
                    lambda e=entry: self.model.learn_one(e.x, e.y, key=e.op.id)  # type: ignore
                )
            except Exception as exc:  # bad input leaves the model unchanged
                self._reject(entry, f"the model refused the point: {exc}", "refused")
            else:
                self._learned(entry)

    def _learned(self, entry: _Entry) -> None:
        self.updates += 1
        if entry.output is not None and "learned" in entry.output:
            entry.output["learned"] = True
        self._count("labelled" if isinstance(entry.op, Label) else "learned")

    def _forget(self, entry: _Entry, op: Forget) -> None:
        if op.id not in self.model:
            self._reject(entry, f"forget of unknown id {op.id!r} (not in the model)", "unknown_id")
            return
        try:
            self._timed(lambda: self.model.forget_one(key=op.id))
        except KeyError:
            self._reject(entry, f"forget of unknown id {op.id!r} (not in the model)", "unknown_id")
            return
        self.updates += 1
        entry.output = {"id": op.id, "op": "forget", "ok": True}
        self._count("forgotten")

    def _relabel(self, entry: _Entry, op: Relabel) -> None:
        if op.id not in self.model:
            self._reject(entry, f"relabel of unknown id {op.id!r} (not in the model)", "unknown_id")
            return
        # The model keeps the point's features: relabel is its exact forget + learn.
        x, _ = self.model.stored_point(op.id)
        self._timed(lambda: self.model.forget_one(key=op.id))
        self.updates += 1
        try:
            self._timed(lambda: self.model.learn_one(x, op.y, key=op.id))
        except Exception as exc:  # pragma: no cover - x was learned before
            self._reject(entry, f"the model refused the relabelled point: {exc}", "refused")
            return
        self.updates += 1
        entry.output = {"id": op.id, "op": "relabel", "ok": True}
        self._count("relabeled")

    # -- bookkeeping -----------------------------------------------------------------------

    def _timed(self, update: Any) -> None:
        before = int(getattr(self.model, "breakpoints_total", 0))
        started = time.perf_counter()
        update()
        elapsed = time.perf_counter() - started
        if self.metrics is None:
            return
        # A buffered learn_one makes no update: count breakpoints by the model's total.
        breakpoints = int(getattr(self.model, "breakpoints_total", 0)) - before
        self.metrics.update_seconds.observe(elapsed)
        self.metrics.breakpoints.inc(breakpoints)
        self.metrics.update_breakpoints.observe(breakpoints)

    def _score(self, prediction: bool, label: bool) -> None:
        self.scored += 1
        correct = prediction == label
        self.correct += int(correct)
        if self.metrics is not None:
            self.metrics.scored.labels(correct=str(correct).lower()).inc()
            self.metrics.accuracy.set(self.accuracy)

    def _count(self, outcome: str) -> None:
        if self.metrics is not None:
            self.metrics.messages.labels(outcome=outcome).inc()

    def _expire_cache(self) -> None:
        horizon = self.newest_timestamp - self.cache_max_age_ms
        while self.cache:
            key, (_, timestamp, _) = next(iter(self.cache.items()))
            if timestamp >= horizon and len(self.cache) <= self.cache_max_size:
                break
            # Re-inserted ids move to the end, so the first entry is the oldest one.
            del self.cache[key]

    def _gauges(self) -> None:
        metrics = self.metrics
        assert metrics is not None
        for gauge, attribute in (
            (metrics.margin, "n_margin"),
            (metrics.error, "n_error"),
            (metrics.reserve, "n_reserve"),
        ):
            value = getattr(self.model, attribute, None)
            if value is not None:
                gauge.set(value)
        window = getattr(self.model, "n_window", None)
        if window is None:
            window = getattr(self.model, "n_stored", None)
        if window is not None:
            metrics.window.set(window)
        metrics.cached.set(len(self.cache))
