"""The daemon's logic without Kafka: one polled batch of records in, outputs and dead letters
out, the model and the cache of unlabelled features updated on the way.

It is deterministic given the sequence of records, so the same stream gives the same model
whatever the batching of IncrementalSVC, and its whole state (next offsets, cache, counters)
goes into checkpoints with the model.

Every message gets exactly one outcome, an output or a dead letter, whatever it holds: a failure
while handling one message (even an unexpected exception) dead-letters that message and the
batch goes on, and the next offsets advance only once the batch's outcomes are all known.

>>> from stream_svm import IncrementalSVC                       # doctest: +SKIP
>>> processor = Processor(IncrementalSVC(C=1.0, gamma=0.5))       # doctest: +SKIP
>>> record = Record("in", 0, 0, b'{"id": 1, "x": {"a": 1.0}, "y": true}', 0)  # doctest: +SKIP
>>> result = processor.process([record])                         # doctest: +SKIP
>>> result.outputs[0].record["learned"]                          # doctest: +SKIP
True
"""

from __future__ import annotations

import base64
import inspect
import json
import logging
import math
import time
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from connectors.cache import UnlabelledCache
from connectors.messages import (
    MAX_INT_ID,
    Forget,
    Id,
    Label,
    Malformed,
    Observe,
    Operation,
    Relabel,
    Source,
    UnreadableRecord,
    dead_letter,
    encode,
    encode_key,
    parse_label,
    parse_message,
    targets_of,
)
from connectors.metrics import Metrics
from connectors.scaling import FeatureScaler, unknown_features_error
from stream_svm import ConvergenceError, proba_from_decision

__all__ = ["BatchResult", "Processor", "Produced", "Record"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Record:
    """One consumed message (kafka-python's ConsumerRecord has the same attributes)."""

    topic: str
    partition: int
    offset: int
    value: bytes | None
    timestamp: int  # milliseconds since the epoch, as Kafka stamps it


@dataclass(frozen=True)
class Produced:
    """One record to write: its Kafka key, the record, and the record as the compact JSON that
    is sent (encoded, and so checked, while the batch is processed)."""

    key: bytes | None
    record: dict[str, Any]
    value: bytes


@dataclass
class BatchResult:
    """What a batch produced, in input order: outputs and dead letters, and the Kafka
    timestamps (ms) of the inputs that gave the outputs (for latency). ``skipped`` counts
    records below the next offsets (already in the model)."""

    outputs: list[Produced] = field(default_factory=list)
    dead_letters: list[Produced] = field(default_factory=list)
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
    prediction: bool | float | None = None
    updates_before: int = 0
    output: dict[str, Any] | None = None
    error: str | None = None
    error_kind: str = ""


#: Exceptions by which a model refuses an update and stays as it was (documented by the
#: library); anything else is an internal error.
_REFUSALS = (ValueError, KeyError, TypeError, ConvergenceError)


#: The model's running totals an update's metrics are read from (0 for a model without).
_UPDATE_TOTALS = ("breakpoints_total", "retries_total", "relearns_total", "far_points_total")

#: Fewer feature dicts than this are predicted or learned one by one: a DataFrame's round trip
#: (built here, turned back into dicts by the model) costs ~1.5 ms, some 40 single predictions.
_TABLE_MIN_ROWS = 32


def _tabular(xs: list[dict[str, float]]) -> bool:
    """Whether feature dicts are worth one DataFrame: enough of them, and its dense table at
    most 4 times their values (one wide message among narrow ones would otherwise make a table
    of rows x every name, e.g. 500 x 60,000)."""
    if len(xs) < _TABLE_MIN_ROWS:
        return False
    names: set[str] = set()
    values = 0
    for x in xs:
        names.update(x)
        values += len(x)
    return len(xs) * len(names) <= 4 * max(values, 1)


def _json_float(value: float) -> float | str:
    return value if math.isfinite(value) else repr(value)


def _is_sliding(model: Any) -> bool:
    return hasattr(model, "window_size")


def _keeps_points_by_key(model: Any) -> bool:
    """Whether the model learns under a key and can forget and relabel by it."""
    try:
        learns_by_key = "key" in inspect.signature(model.learn_one).parameters
    except (TypeError, ValueError):
        return False
    return learns_by_key and hasattr(model, "relabel_one") and hasattr(model, "forget_one")


def _keyed_model_types() -> list[str]:
    """The daemon's model types that keep points by key (model.type)."""
    import stream_svm
    from connectors.config import MODEL_TYPES

    return [name for name in MODEL_TYPES if _keeps_points_by_key(getattr(stream_svm, name))]


def _learn_many_is_exact(model: Any) -> bool:
    """Whether one ``learn_many`` of a run gives the model that learning it point by point
    gives: true of the exact models (the solution depends on the set of points only), not of
    alpha-ISVM, whose increments are its own batches (``batch_size``), so that its model does
    not depend on how the daemon's polls cut the stream."""
    return _keeps_points_by_key(model)


class Processor:
    """Applies batches of input and label records to a model.

    ``label_topic`` names the topic whose messages are late labels (``{"id", "y"}``); every
    other topic is read as the input topic.

    Every prediction comes from the model that has learned every earlier message of the stream
    (River's progressive validation, as ``stream-svm evaluate`` computes it): the messages up to
    the next one that changes the model are predicted with one vectorized call. A sliding
    window changes only when it slides, so the ``step`` arrivals of a slide are predicted
    together and learned in one multiple update. With ``predict_per_poll`` a whole poll is
    predicted before any of it is learned and each run of labelled points is learned in one
    multiple update: faster on a backlog, but a prediction then ignores its poll's earlier
    points and the accuracy is not River's progressive validation.

    With ``learns=False`` (a prediction replica, ``daemon.role = "predictor"``) the model is
    never changed: feature messages are predicted (their labels ignored, ``learned`` false,
    nothing cached), and label, forget and relabel messages are dead-lettered ``unsupported``.
    ``generation`` (None: none) is written into every output as ``model_generation``.

    The unlabelled cache is bounded by ``cache_max_size`` entries, ``cache_max_bytes`` of
    estimated memory and ``cache_max_age_seconds`` of processing time (``clock``, seconds).

    A ``scaler`` standardizes the features of every message before the model sees them. One
    still warming up holds every message (they are part of the state and its checkpoints; a
    global daemon commits its offsets only up to the first held one) until it has measured
    its ``warmup_messages`` feature messages; then the held
    messages are processed in order, as if they had just arrived, with the frozen statistics.
    """

    def __init__(
        self,
        model: Any,
        *,
        label_topic: str | None = None,
        cache_max_size: int = 100_000,
        cache_max_bytes: int = 256 * 2**20,
        cache_max_age_seconds: float = 3600.0,
        max_message_bytes: int = 1_000_000,
        predict_per_poll: bool = False,
        metrics: Metrics | None = None,
        clock: Callable[[], float] = time.time,
        scaler: FeatureScaler | None = None,
        learns: bool = True,
    ) -> None:
        self.model = model
        self.learns = learns
        #: the published state the model is (predictor) or was last published as (learner),
        #: "<epoch>.<sequence>", written into every output as "model_generation"
        self.generation: str | None = None
        #: fields written into every output and dead letter (with model.scope partition or
        #: key: the model)
        self.output_fields: dict[str, Any] = {}
        #: what an unknown_id dead letter adds when the id's other messages may have gone to
        #: another partition or model (set by the daemon: several partitions, or scoped)
        self.unknown_id_hint = ""
        self.scaler = scaler
        #: messages held while the scaler warms up, in arrival order
        self.held: list[Record] = []
        self.predict_per_poll = predict_per_poll
        self.label_topic = label_topic
        self.max_message_bytes = max_message_bytes
        self.metrics = metrics
        self.clock = clock
        # The cache's clock (``_now``): ``clock`` plus this shift, which a restore sets so that
        # it goes on from the checkpoint's time.
        self._clock_shift = 0.0
        self.sliding = _is_sliding(model)
        self.targets = targets_of(model)
        self.regression = self.targets.regression
        self.keyed = _keeps_points_by_key(model)
        self.batch_exact = _learn_many_is_exact(model)
        # Probabilities as the model's predict_proba_one computes them from a decision value.
        self._to_proba: Callable[[np.ndarray], np.ndarray] = getattr(
            model, "decision_to_proba", proba_from_decision)
        #: next offset to process per "topic:partition"
        self.offsets: dict[str, int] = {}
        #: topic name -> Kafka topic id (UUID text) of the topics read, when the broker has ids
        self.topic_ids: dict[str, str] = {}
        self.cache = UnlabelledCache(cache_max_size, cache_max_bytes, cache_max_age_seconds)
        self._evictions_reported: dict[str, int] = {}
        self.updates = 0
        #: points a model left out of its buffer, to dead-letter: (source, id or None, why)
        self._left_out: list[tuple[Source, Hashable | None, str]] = []
        self.scored = 0
        self.correct = 0
        self.absolute_error = 0.0  # regressors: sums over the scored predictions
        self.squared_error = 0.0
        self._publish_scores()

    @property
    def model_updates(self) -> int:
        """The updates the model's predictions reflect: ``updates`` but the samples still
        waiting in the model's buffer (a sliding window's arrivals until the next slide,
        alpha-ISVM's until its batch is full), counted once learned. Counting them as they
        arrived made the number depend on where polls cut a slide: the same model was
        reported as 48 updates by one run and 51 by a run restarted in between."""
        return self.updates - int(getattr(self.model, "n_buffered", 0))

    # -- state -----------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """The JSON-serializable state to checkpoint with the model (the cache goes apart, as
        arrays: :meth:`cache_arrays`)."""
        return {
            "offsets": dict(self.offsets),
            "topic_ids": dict(self.topic_ids),
            "updates": self.updates,
            "scored": self.scored,
            "correct": self.correct,
            # As text when not finite (JSON has no inf): float() reads it back.
            "absolute_error": _json_float(self.absolute_error),
            "squared_error": _json_float(self.squared_error),
            **({"scaler": self.scaler.state()} if self.scaler is not None else {}),
            "held": [[r.topic, r.partition, r.offset,
                      None if r.value is None else base64.b64encode(r.value).decode("ascii"),
                      r.timestamp] for r in self.held],
            "cache_clock": self._now(),
            # (``clock`` itself, not shifted: when the state was written, which a model of a
            # group read back compares with its daemon's start, see load_state)
            "saved_at": self.clock(),
        }

    def _now(self) -> float:
        """The cache's clock: the daemon's processing time, in seconds (``clock`` while it
        runs; a restored processor's goes on from its checkpoint's, without the downtime)."""
        return self.clock() + self._clock_shift

    def cache_arrays(self) -> dict[str, np.ndarray]:
        """The unlabelled cache as numpy arrays, for the checkpoint."""
        return self.cache.to_arrays()

    def load_state(
        self, state: dict[str, Any], cache_arrays: dict[str, np.ndarray] | None = None,
        resume_before: float | None = None,
    ) -> None:
        """Restore :meth:`state` and :meth:`cache_arrays` output (ValueError when malformed).

        The cache's clock goes on from the state's, so that the time the daemon was stopped
        ages no cached point; with ``resume_before`` (a model of a group read back from the
        state topic: its daemon's start, on ``clock``), only for a state written before then
        (``saved_at``; by a daemon that stopped or crashed since). A state written while this
        daemon ran (a model evicted, or handed over by another daemon) keeps ``clock``: the
        daemons ran meanwhile, and its points age as they did."""
        self.offsets = {str(k): int(v) for k, v in state.get("offsets", {}).items()}
        self.topic_ids = {str(k): str(v) for k, v in state.get("topic_ids", {}).items()}
        self.updates = int(state.get("updates", 0))
        self.scored = int(state.get("scored", 0))
        self.correct = int(state.get("correct", 0))
        self.absolute_error = float(state.get("absolute_error", 0.0))
        self.squared_error = float(state.get("squared_error", 0.0))
        self._publish_scores()
        if self.scaler is not None:
            if "scaler" not in state:
                raise ValueError("the checkpoint holds no scaler state, but a scaler is set")
            self.scaler.load_state(state["scaler"])
        try:
            self.held = [Record(str(topic), int(partition), int(offset),
                                None if value is None else base64.b64decode(value, validate=True),
                                int(timestamp))
                         for topic, partition, offset, value, timestamp in state.get("held", [])]
        except (TypeError, ValueError) as exc:
            raise ValueError(f"malformed held messages in the state: {exc}") from None
        saved_at = state.get("saved_at")
        if saved_at is not None and (isinstance(saved_at, bool) or not isinstance(
                saved_at, (int, float)) or not math.isfinite(saved_at)):
            raise ValueError(f"malformed saved_at in the state: {saved_at!r}")
        resume = resume_before is None or saved_at is None or saved_at < resume_before
        if resume and "cache_clock" in state:
            # The cache's clock goes on from where the checkpoint left it: the time the daemon
            # was down ages no cached point. Otherwise a label answered before a crash found its
            # point expired when the restart read it again (a restart slower than the cache's
            # max age), and was dead-lettered unknown_id: the acknowledged label was lost.
            saved = state["cache_clock"]
            if isinstance(saved, bool) or not isinstance(saved, (int, float)) or not \
                    math.isfinite(saved):
                raise ValueError(f"malformed cache_clock in the state: {saved!r}")
            self._clock_shift = float(saved) - self.clock()
        now = self._now()
        if cache_arrays is not None:
            self.cache.load_arrays(cache_arrays, now)
        else:
            # Checkpoints of format 1 held the cache as JSON, aged by producer timestamps:
            # their entries start their age again now.
            for key, x, _, prediction in state.get("cache", []):
                self.cache.put(key, {str(k): float(v) for k, v in x.items()}, bool(prediction),
                               now)

    @property
    def accuracy(self) -> float:
        """Progressive accuracy of a classifier (NaN before any label, and for a regressor)."""
        if self.regression or not self.scored:
            return math.nan
        return self.correct / self.scored

    @property
    def mae(self) -> float:
        """Progressive mean absolute error of a regressor (NaN otherwise)."""
        if not self.regression or not self.scored:
            return math.nan
        return self.absolute_error / self.scored

    @property
    def rmse(self) -> float:
        """Progressive root mean squared error of a regressor (NaN otherwise)."""
        if not self.regression or not self.scored:
            return math.nan
        return math.sqrt(self.squared_error / self.scored)

    # -- one batch -------------------------------------------------------------------------

    def process(self, records: Sequence[Any]) -> BatchResult:
        """Process the records of one poll (in order within each partition)."""
        result = BatchResult()
        entries: list[_Entry] = []
        advanced: dict[str, int] = {}
        fresh: list[Any] = []
        for record in records:
            name = f"{record.topic}:{record.partition}"
            if record.offset < self.offsets.get(name, 0):
                result.skipped += 1  # already in the model: learned before the checkpoint
                continue
            advanced[name] = record.offset + 1
            fresh.append(record)
        if self.label_topic is not None:
            # The two topics are not ordered against each other, and a poll lists their
            # records in whatever order the fetches completed: a label sent right after its
            # features often came first, found nothing cached and was dead-lettered. Within a
            # poll the features go first (each partition keeps its own order).
            fresh.sort(key=lambda record: record.topic == self.label_topic)
        if self.scaler is not None and not self.scaler.frozen:
            fresh = self._warm_up(fresh)
        for record in fresh:
            entry = _Entry(
                len(entries), record, Source(record.topic, record.partition, record.offset)
            )
            self._guarded(entry, self._parse, entry)
            entries.append(entry)

        for segment in self._segments(entries):
            self._predict([e for e in segment if isinstance(e.op, Observe) and e.error is None])
            self._apply(segment)
        self._expire_cache()
        for entry in entries:
            self._emit(entry, result)
        self._emit_left_out(result)
        self.offsets.update(advanced)
        if result.skipped:
            # (INFO: a consumer resumes from the last commit, which a model's state may be
            # past after a restart or a rebalance; counted in stream_svm_messages_total.)
            log.info(
                "skipped %d messages below the next offsets %s (already in the model)",
                result.skipped,
                self.offsets,
            )
            self._count("skipped", result.skipped)
        if self.metrics is not None:
            self._gauges()
        return result

    def _warm_up(self, records: list[Any]) -> list[Any]:
        """Hold the records while the scaler measures its warm-up messages; once it froze,
        the held records and the rest of this poll, in order, to process now."""
        scaler = self.scaler
        assert scaler is not None
        for index, record in enumerate(records):
            self.held.append(record)
            if record.topic == self.label_topic:
                continue
            try:
                op = parse_message(record.value, self.max_message_bytes, self.targets)
            except Exception:  # dead-lettered when processed after the warm-up
                continue
            if not isinstance(op, Observe):
                continue
            try:
                # (A labelled message's target counts; a late label's, whose arrival beside the
                # features' depends on timing, does not.)
                frozen = scaler.observe(op.x, None if op.y is None else float(op.y))
            except ValueError as exc:
                # Still held: processed after the warm-up like the others (a value the frozen
                # statistics cannot scale is dead-lettered then).
                log.warning("%s:%d:%d is left out of the scaler's warm-up: %s", record.topic,
                            record.partition, record.offset, exc)
                continue
            if frozen:
                held, rest = self.held, list(records[index + 1:])
                self.held = []
                # (The held messages count labels, forgets and unreadable messages too, and
                # the rest of this poll is released with them: two counts, named apart.)
                log.info("scaler frozen after %d feature messages (%d features); processing "
                         "the %d messages held meanwhile, then the %d after them in this poll",
                         scaler.seen, len(scaler.means), len(held), len(rest))
                return held + rest
        return []

    def _model_target(self, y: Any) -> Any:
        """What the model learns for a parsed label (a regressor's target standardized when
        scaler.targets is set)."""
        label = self.targets.model_label(y)
        if self.scaler is not None and self.regression:
            return self.scaler.target_to_model(label)
        return label

    def _segments(self, entries: list[_Entry]) -> Iterator[list[_Entry]]:
        """Cut the batch after every message that may change the model (lazily: a window's
        next slide depends on its buffer once the previous segment is learned)."""
        if self.predict_per_poll or not self.learns:
            yield entries
            return
        segment: list[_Entry] = []
        labelled = 0
        for entry in entries:
            segment.append(entry)
            op = entry.op
            if op is None or entry.error is not None:
                continue
            if isinstance(op, (Forget, Relabel)):
                changes = True
            elif isinstance(op, Label) or (isinstance(op, Observe) and op.y is not None):
                labelled += 1
                # A window learns when its buffer reaches `step`; any other model at once.
                step = int(getattr(self.model, "step", 1)) if self.sliding else 1
                buffered = int(getattr(self.model, "n_buffered", 0)) if self.sliding else 0
                changes = labelled + buffered >= step
            else:
                changes = False
            if changes:
                yield segment
                segment, labelled = [], 0
        if segment:
            yield segment

    def _guarded(self, entry: _Entry, action: Callable[..., None], *args: Any) -> None:
        try:
            action(*args)
        except Exception as exc:
            self._internal(entry, exc)

    def _internal(self, entry: _Entry, exc: BaseException) -> None:
        """Dead-letter a message whose handling failed unexpectedly; the batch goes on."""
        log.error(
            "internal error on %s:%d:%d (dead-lettered): %s: %s",
            entry.source.topic,
            entry.source.partition,
            entry.source.offset,
            type(exc).__name__,
            exc,
            exc_info=log.isEnabledFor(logging.DEBUG),
        )
        self._reject(
            entry,
            f"internal error while handling the message: {type(exc).__name__}: {exc}",
            "internal",
        )

    def _parse(self, entry: _Entry) -> None:
        if isinstance(entry.record, UnreadableRecord):
            entry.error, entry.error_kind = entry.record.error, "unreadable"
            return
        try:
            if entry.record.topic == self.label_topic:
                entry.op = parse_label(entry.record.value, self.max_message_bytes, self.targets)
            else:
                entry.op = parse_message(entry.record.value, self.max_message_bytes,
                                         self.targets)
                if self.scaler is not None and isinstance(entry.op, Observe):
                    op = entry.op
                    if self.scaler.refuse_unknown and (unknown := self.scaler.unknown(op.x)):
                        entry.error, entry.error_kind = unknown_features_error(unknown), \
                            "unknown_feature"
                        return
                    scaled = self.scaler.transform(op.x)
                    for name, value in scaled.items():
                        if not math.isfinite(value):
                            entry.error, entry.error_kind = (
                                f"feature {name!r} = {op.x[name]!r} is {value} once scaled "
                                "((x - mean) / scale overflows): the message is neither "
                                "answered nor learned", "non_finite")
                            return
                    entry.op = Observe(op.id, scaled, op.y)
        except Malformed as exc:
            entry.error, entry.error_kind = str(exc), "malformed"

    def _scores(self, xs: list[dict[str, float]]) -> np.ndarray:
        if not _tabular(xs):
            return np.array([self.model.decision_function_one(x) for x in xs], dtype=float)
        frame = pd.DataFrame.from_records(xs)
        return np.asarray(self.model.decision_function_many(frame), dtype=float).reshape(-1)

    def _predict(self, entries: list[_Entry]) -> None:
        if not entries:
            return
        started = time.perf_counter()
        try:
            scores = self._scores([e.op.x for e in entries])  # type: ignore[union-attr]
            if scores.shape != (len(entries),):
                raise ValueError(f"{scores.shape} scores for {len(entries)} messages")
        except Exception as exc:
            # One bad message must not cost the others their prediction: one at a time.
            log.warning("batch prediction failed (%s: %s); predicting one by one",
                        type(exc).__name__, exc)
            scores = np.full(len(entries), np.nan)
            for i, entry in enumerate(entries):
                try:
                    scores[i] = self._scores([entry.op.x])[0]  # type: ignore[union-attr]
                except _REFUSALS as single:
                    # The model refuses to score these features (an LS-SVM's Fourier map
                    # overflows on them): the producer's to fix.
                    self._reject(
                        entry,
                        f"the model cannot score these features: {type(single).__name__}: "
                        f"{single}; the message is neither answered nor learned",
                        "refused",
                    )
                except Exception as single:
                    self._internal(entry, single)
        # The model's probability is a monotone squashing of the decision value: one kernel
        # evaluation serves both. A regressor's decision value is its prediction.
        probas = (np.full(len(entries), np.nan) if self.regression
                  else np.asarray(self._to_proba(scores), dtype=float))
        if self.metrics is not None:
            self.metrics.predict_seconds.observe(time.perf_counter() - started)
        updates = self.model_updates  # (the model does not change within these predictions)
        for entry, score, proba in zip(entries, scores, probas, strict=True):
            if entry.error is not None:
                continue
            if not math.isfinite(score):
                # Finite features can still overflow the kernel (a polynomial kernel of 1e300):
                # such a point can be neither answered nor learned.
                self._reject(
                    entry,
                    f"the model's score for these features is {score} (not finite): they are "
                    "too large for the kernel; the message is neither learned nor cached",
                    "non_finite",
                )
                continue
            entry.score = float(score)
            if self.regression:
                # (In the targets' units: outputs, errors and the cache all use them.)
                entry.prediction = (float(score) if self.scaler is None
                                    else self.scaler.target_from_model(float(score)))
            else:
                entry.proba = float(proba)
                entry.prediction = bool(score > 0)
            entry.updates_before = updates

    def _apply(self, entries: list[_Entry]) -> None:
        pending: list[_Entry] = []  # labelled points waiting to be learned together
        pending_ids: set[Id] = set()
        for entry in entries:
            op = entry.op
            if op is None or entry.error is not None:
                continue
            try:
                if not self.learns:
                    self._serve_only(entry, op)
                elif isinstance(op, Observe):
                    self._observe(entry, op, pending, pending_ids)
                elif isinstance(op, Label):
                    self._label(entry, op, pending, pending_ids)
                else:
                    self._learn(pending)
                    pending_ids.clear()
                    if isinstance(op, Forget):
                        self._forget(entry, op)
                    else:
                        self._relabel(entry, op)
            except Exception as exc:
                self._internal(entry, exc)
        self._learn(pending)

    def _observe(
        self, entry: _Entry, op: Observe, pending: list[_Entry], pending_ids: set[Id]
    ) -> None:
        assert entry.prediction is not None
        entry.output = {"id": op.id, "prediction": self.targets.shown(entry.prediction)}
        if not self.regression:
            entry.output.update(score=entry.score, proba=entry.proba)
        entry.output.update(learned=False, model_updates=entry.updates_before,
                            source=entry.source.as_dict())
        if op.y is None:
            self.cache.put(op.id, op.x, entry.prediction, self._now())
            self._count("predicted")
            return
        if op.id in pending_ids or self._holds(op.id):
            self._reject(entry, self._duplicate(op.id), "duplicate_id")
            return
        self.cache.pop(op.id)
        entry.x, entry.y = op.x, op.y
        self._score(entry.prediction, op.y)
        pending.append(entry)
        pending_ids.add(op.id)

    def _serve_only(self, entry: _Entry, op: Operation) -> None:
        """A predictor's handling: answer feature messages, refuse anything that would change
        the model (the learner, reading the same input, applies it)."""
        if isinstance(op, Observe):
            assert entry.prediction is not None
            entry.output = {"id": op.id, "prediction": self.targets.shown(entry.prediction)}
            if not self.regression:
                entry.output.update(score=entry.score, proba=entry.proba)
            entry.output.update(learned=False, model_updates=entry.updates_before,
                                source=entry.source.as_dict())
            self._count("predicted")
            return
        what = {Label: "label", Forget: "forget", Relabel: "relabel"}[type(op)]
        self._reject(
            entry,
            f"this daemon is a predictor (daemon.role = \"predictor\"): it never changes the "
            f"model, so it does not {what}; the learner reading the same input applies it",
            "unsupported",
        )

    def _label(
        self, entry: _Entry, op: Label, pending: list[_Entry], pending_ids: set[Id]
    ) -> None:
        if op.id not in self.cache:
            near = _spelt_as_the_other_type(op.id)
            self._reject(
                entry,
                f"no unlabelled features cached for id {op.id!r}, but for the id {near!r}: "
                f"ids compare with their JSON type, send {json.dumps(near)}"
                if near is not None and near in self.cache else
                f"no unlabelled features cached for id {op.id!r} (never seen, expired, "
                f"or already labelled{self._read_ahead(entry)}){self.unknown_id_hint}"
                if self.cache.max_entries and self.cache.max_bytes else
                f"no unlabelled features cached for id {op.id!r}: with cache.max_size or "
                "cache.max_bytes 0 no unlabelled message is kept for a later label",
                "unknown_id",
            )
            return
        if op.id in pending_ids or self._holds(op.id):
            self._reject(entry, self._duplicate(op.id), "duplicate_id")
            return
        cached = self.cache.pop(op.id)
        assert cached is not None
        prediction = (float(cached.prediction) if self.regression
                      else bool(cached.prediction))
        entry.x, entry.y, entry.prediction = cached.x, op.y, prediction
        self._score(prediction, op.y)
        entry.output = {"id": op.id, "op": "label", "ok": True,
                        "source": entry.source.as_dict()}
        pending.append(entry)
        pending_ids.add(op.id)

    def _holds(self, identifier: Id) -> bool:
        """Whether the model holds a point learned under this id (a model that keeps no point
        by id cannot tell: its ids are not checked for repeats)."""
        return self.keyed and identifier in self.model

    @staticmethod
    def _duplicate(identifier: Id) -> str:
        return (
            f"id {identifier!r} is already learned: send a relabel to change its label, or "
            "forget it first"
        )

    def _read_ahead(self, entry: _Entry) -> str:
        """For a label of the label topic: the other cause of a label without features."""
        if self.label_topic is None or entry.record.topic != self.label_topic:
            return ""
        return ("; or not read yet: a label waits until the input topic is read up to its "
                "timestamp, so one stamped before its features (producers whose clocks "
                "differ) or whose input partition stopped moving for a minute can run ahead "
                "of them: send the label again from this dead letter")

    def _reject(self, entry: _Entry, reason: str, kind: str) -> None:
        entry.output = None
        entry.error, entry.error_kind = reason, kind

    def _refused(self, entry: _Entry, what: str, exc: BaseException) -> None:
        """The model refused an update (and is unchanged); unexpected exceptions are internal."""
        if not isinstance(exc, _REFUSALS):
            self._internal(entry, exc)
            return
        self._reject(
            entry,
            f"the model refused {what} and is unchanged: {type(exc).__name__}: {exc}",
            "refused",
        )

    def _learn(self, pending: list[_Entry]) -> None:
        batch = [entry for entry in pending if entry.error is None]
        pending.clear()
        if not batch:
            return
        # A run of labelled points is learned in one multiple update (Karasuyama & Takeuchi):
        # the exact solution does not depend on the order within the run, so the model equals
        # learning them one by one, along a shorter path. A window slides every `step`
        # arrivals, and its model is the exact one of what it then holds: the run's points up
        # to its last slide point are learned in one slide (learn_many slides by all it is
        # given), those after it go to the buffer one by one (learn_one), as they would have
        # one at a time. (Slid by the whole run, a window held other points than the same
        # stream learned one by one, or progressively.)
        minimum, head = 2, batch
        if self.sliding:
            step = max(1, int(getattr(self.model, "step", 1)))
            buffered = int(getattr(self.model, "n_buffered", 0))
            head = batch[: max(0, len(batch) - (buffered + len(batch)) % step)]
            minimum = 1
        label_of = self._model_target
        xs = [entry.x or {} for entry in head]
        if len(head) >= minimum and self.batch_exact and _tabular(xs):
            try:
                keys = [e.op.id for e in head]  # type: ignore[union-attr]
                frame = pd.DataFrame.from_records(xs)
                labels = pd.Series([label_of(e.y) for e in head], dtype=object)  # type: ignore[arg-type]
                self._timed(lambda: self.model.learn_many(frame, labels, keys=keys), head[-1])
            except Exception as exc:  # the model is unchanged: learn point by point instead
                log.warning("multiple update refused (%s); learning the batch point by point", exc)
            else:
                for entry in head:
                    self._learned(entry)
                batch = batch[len(head) :]
        for entry in batch:
            try:
                label = label_of(entry.y)  # type: ignore[arg-type]
                if self.keyed:
                    self._timed(lambda e=entry, y=label: self.model.learn_one(
                        e.x, y, key=e.op.id), entry)  # type: ignore[union-attr]
                else:
                    self._timed(lambda e=entry, y=label: self.model.learn_one(e.x, y), entry)
            except Exception as exc:  # a refused point leaves the model unchanged
                self._refused(entry, "the point", exc)
                if isinstance(entry.op, Label) and entry.error_kind == "refused":
                    # Keep its features for a corrected label (they came in another message).
                    self.cache.put(entry.op.id, entry.x or {}, entry.prediction or False,
                                   self._now())
            else:
                self._learned(entry)

    def _learned(self, entry: _Entry) -> None:
        self.updates += 1
        if entry.output is not None and "learned" in entry.output:
            entry.output["learned"] = True
        self._count("labelled" if isinstance(entry.op, Label) else "learned")

    def _unsupported(self, entry: _Entry, what: str) -> bool:
        if self.keyed:
            return False
        self._reject(
            entry,
            f"{type(self.model).__name__} keeps no point by id, so it cannot {what}; "
            f"{', '.join(_keyed_model_types())} can",
            "unsupported",
        )
        return True

    def _forget(self, entry: _Entry, op: Forget) -> None:
        if self.keyed and op.id in self.model:
            erased = False  # (after the point is forgotten: a refused forget changes nothing)
        else:
            erased = self.cache.pop(op.id) is not None
        if erased and self.keyed:
            # Features waiting for their label are erased too (an erasure request must not
            # leave them to be learned when the label comes, nor in the checkpoints).
            entry.output = {"id": op.id, "op": "forget", "ok": True, "was": "unlabelled",
                            "source": entry.source.as_dict()}
            self._count("forgotten")
            return
        if self._unsupported(entry, "forget"):
            if erased:  # (a model that keeps no point by id cannot say whether it learned it)
                entry.error = f"{entry.error}; its features waiting for a label were erased"
            return
        if op.id not in self.model:
            self._reject(entry, self._unknown("forget", op.id), "unknown_id")
            return
        try:
            self._timed(lambda: self.model.forget_one(key=op.id), entry)
        except KeyError:
            self._reject(entry, self._unknown("forget", op.id), "unknown_id")
            return
        except Exception as exc:
            self._refused(entry, f"to forget id {op.id!r}", exc)
            return
        self.updates += 1
        self.cache.pop(op.id)  # and any features of it waiting for a label
        entry.output = {"id": op.id, "op": "forget", "ok": True,
                        "source": entry.source.as_dict()}
        self._count("forgotten")

    def _unknown(self, what: str, identifier: Any) -> str:
        """The error of a forget or relabel of an id the model does not hold."""
        text = f"{what} of unknown id {identifier!r} (not in the model"
        if (near := _spelt_as_the_other_type(identifier)) is not None and near in self.model:
            return (f"{text}, which holds the id {near!r}: ids compare with their JSON type, "
                    f"send {json.dumps(near)})")
        if getattr(self.model, "reserve_epsilon", None) is not None:
            # An erasure request must tell "never learned" from "learned and no longer held":
            # both leave nothing to forget, and the model cannot say which it was.
            return (f"{text}: never learned, or learned and discarded since by reserve "
                    "truncation, model.reserve_epsilon, which keeps nothing of it)"
                    f"{self.unknown_id_hint}")
        return f"{text}){self.unknown_id_hint}"

    def _relabel(self, entry: _Entry, op: Relabel) -> None:
        if self._unsupported(entry, "relabel"):
            return
        if op.id not in self.model:
            self._reject(entry, self._unknown("relabel", op.id), "unknown_id")
            return
        # The model keeps the point's features: relabel is its exact forget + learn, all or
        # nothing (a refused learn puts the point back as it was).
        try:
            label = self._model_target(op.y)
            self._timed(lambda: self.model.relabel_one(op.id, label), entry)
        except Exception as exc:
            self._refused(entry, f"to relabel id {op.id!r}", exc)
            return
        self.updates += 2
        entry.output = {"id": op.id, "op": "relabel", "ok": True,
                        "source": entry.source.as_dict()}
        self._count("relabeled")

    def _take_left_out(self, trigger: _Entry) -> None:
        """Points a window or an alpha-ISVM had buffered (answered ``learned: true``) and then
        left out, because its update was refused with them and went through without them: no
        longer counted as learned, and each dead-lettered (``refused``) where the message whose
        arrival made the update was read."""
        left_out = getattr(self.model, "refused_from_buffer", None)
        if not left_out:
            return
        for key, why in left_out:
            self.updates -= 1
            self._left_out.append((trigger.source, key, why))
            log.warning("a point buffered by the model (id %r) was left out at %s:%d:%d: the "
                        "update was refused with it and went through without it (%s)", key,
                        trigger.source.topic, trigger.source.partition, trigger.source.offset,
                        why)
        left_out.clear()

    def _emit_left_out(self, result: BatchResult) -> None:
        for source, key, why in self._left_out:
            if key is None:  # (a model that keeps no id: its reason names the features)
                error = (f"a point buffered by the model (its message was answered "
                         f"\"learned\": true) was left out: {why}")
                fields = dict(self.output_fields)
            else:
                error = (f"the point {key!r}, buffered by the window (its message was answered "
                         "\"learned\": true), was left out: the window's slide was refused "
                         f"with it and went through without it ({why})")
                fields = {**self.output_fields, "id": key}
            record = dead_letter(error, None, source, self.max_message_bytes, reason="refused",
                                 fields=fields)
            result.dead_letters.append(Produced(source.letter_key(), record, encode(record)))
            if self.metrics is not None:  # (its message was counted when it was answered)
                self.metrics.dead_letters.labels(reason="refused").inc()
        self._left_out.clear()

    def _emit(self, entry: _Entry, result: BatchResult) -> None:
        """Encode the message's outcome into ``result``: its output, or else a dead letter."""
        if entry.error is None and entry.output is None:
            entry.error, entry.error_kind = "internal error: the message got no outcome", (
                "internal"
            )
        if entry.error is None:
            try:
                output = entry.output
                assert output is not None
                if self.generation is not None:
                    output["model_generation"] = self.generation
                output.update(self.output_fields)
                result.outputs.append(
                    Produced(encode_key(output["id"]), output, encode(output))
                )
            except Exception as exc:
                self._internal(entry, exc)
            else:
                result.input_timestamps.append(int(entry.record.timestamp or 0))
                return
        source = entry.source
        key = source.letter_key()
        record = dead_letter(
            entry.error or "", entry.record.value, source, self.max_message_bytes,
            reason=entry.error_kind, fields=self.output_fields,
        )
        try:
            value = encode(record)
        except Exception as exc:  # pragma: no cover - dead letters hold text and integers
            record = {"error": f"internal error: {type(exc).__name__}", "reason": "internal",
                      "source": source.as_dict()}
            value = encode(record)
        result.dead_letters.append(Produced(key, record, value))
        self._count("dead_lettered")
        if self.metrics is not None:
            self.metrics.dead_letters.labels(reason=entry.error_kind).inc()

    # -- bookkeeping -----------------------------------------------------------------------

    def _timed(self, update: Any, trigger: _Entry) -> None:
        model = self.model
        before = [int(getattr(model, name, 0)) for name in _UPDATE_TOTALS]
        started = time.perf_counter()
        try:
            update()
        finally:
            # (A far point's update is often refused: counted all the same.)
            far_points = int(getattr(model, "far_points_total", 0)) - before[-1]
            if far_points > 0 and self.metrics is not None:
                self.metrics.far_points.inc(far_points)
            self._take_left_out(trigger)
        elapsed = time.perf_counter() - started
        if self.metrics is None:
            return
        # A buffered learn_one makes no update: count by the model's totals.
        breakpoints, retries, relearns = (
            int(getattr(model, name, 0)) - was
            for name, was in zip(_UPDATE_TOTALS[:-1], before[:-1], strict=True))
        self.metrics.update_seconds.observe(elapsed)
        self.metrics.breakpoints.inc(breakpoints)
        self.metrics.update_breakpoints.observe(breakpoints)
        if retries - relearns > 0:
            self.metrics.update_retries.labels(how="one_at_a_time").inc(retries - relearns)
        if relearns > 0:
            self.metrics.update_retries.labels(how="afresh").inc(relearns)

    def _publish_scores(self) -> None:
        """Show the progressive figures (NaN before any score): the classifier's accuracy or
        the regressor's MAE and RMSE, restored ones included."""
        if self.metrics is None:
            return
        if self.regression:
            mae, rmse = self.metrics.regression_errors
            mae.set(self.mae)
            rmse.set(self.rmse)
        else:
            self.metrics.accuracy.set(self.accuracy)

    def _score(self, prediction: bool | float, label: bool | float) -> None:
        self.scored += 1
        if self.regression:
            error = float(label) - float(prediction)
            self.absolute_error += abs(error)
            self.squared_error += error * error
            if self.metrics is not None:
                self.metrics.count_scored("na")
                self._publish_scores()
            return
        correct = prediction == label
        self.correct += int(correct)
        if self.metrics is not None:
            self.metrics.count_scored("true" if correct else "false")
            self._publish_scores()

    def _count(self, outcome: str, times: int = 1) -> None:
        if self.metrics is not None:
            self.metrics.count_messages(outcome, times)

    def expire_cache(self) -> None:
        """Drop cached unlabelled points over the cache's bounds (and count them)."""
        self._expire_cache()
        if self.metrics is not None:
            self._gauges()

    def _expire_cache(self) -> None:
        self.cache.expire(self._now())
        if self.metrics is None:
            return
        # The cache also evicts while points are put (entry and byte bounds): report every
        # eviction since the last report.
        for reason, count in self.cache.evictions.items():
            new = count - self._evictions_reported.get(reason, 0)
            if new:
                self.metrics.cache_evictions.labels(reason=reason).inc(new)
        self._evictions_reported = dict(self.cache.evictions)

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
        stored = getattr(self.model, "n_stored", None)
        if stored is not None:
            metrics.stored.set(stored)
        names = getattr(self.model, "n_features", None)
        if names is None and hasattr(self.model, "feature_names_"):  # (the LS-SVMs)
            names = len(self.model.feature_names_)
        if names is not None:
            metrics.feature_names.set(names)
        if self.sliding:
            metrics.window.set(self.model.n_window)
        metrics.cached.set(len(self.cache))
        metrics.held.set(len(self.held))
        metrics.cached_bytes.set(self.cache.bytes)


def _spelt_as_the_other_type(identifier: Any) -> Id | None:
    """The id of the other JSON type written alike (``"7"`` for 7 and 7 for ``"7"``), or None:
    a near miss an unknown_id dead letter names.

    >>> _spelt_as_the_other_type(7), _spelt_as_the_other_type("-7"), _spelt_as_the_other_type("a")
    ('7', -7, None)
    >>> [_spelt_as_the_other_type(text) for text in ("--7", "07", "")]
    [None, None, None]
    """
    if isinstance(identifier, bool):
        return None
    if isinstance(identifier, int):
        return str(identifier)
    digits = identifier.removeprefix("-") if isinstance(identifier, str) else ""
    if (digits.isascii() and digits.isdigit() and str(int(identifier)) == identifier
            and -MAX_INT_ID - 1 <= int(identifier) <= MAX_INT_ID):
        return int(identifier)
    return None

