"""One model per input partition or per message key (``model.scope``), owned by this process
while the consumer group assigns it their partitions, with their states on the state topic.

Model ids
    A model is named ``(partition, key)``: ``(3, None)`` with ``model.scope = "partition"``,
    ``(3, "gauge-17")`` with ``"key"`` (the Kafka key as UTF-8 text; a key that is not UTF-8
    is written ``0x`` and its bytes in hex; messages without a key share ``(3, None)``). A
    label on ``kafka.label_topic`` reaches the model of its own partition and key, so the
    label topic must be co-partitioned with the input topic (same partition count, labels
    produced with the key of their message), as for any Kafka join. A ``forget`` or
    ``relabel`` must carry the key of the message that taught the id, for the same reason.

Effectively once
    Every model's processor skips the records below its own next offsets, so a partition can
    be read again from any earlier offset without learning anything twice. Offsets are
    committed per partition only once every model of that partition that changed since has
    published its state (:meth:`ScopedModels.publish`): after a crash, the new owner resumes at
    the committed offset, restores each model's newest state, and what the states do not cover
    is learned again, once. No model is published before the outputs of the batch that
    changed it are delivered (a crash in between would otherwise skip them). A model evicted
    to stay within ``model.max_models`` is published first and fetched back from the state
    topic on its next message; the models of the batch being handled stay live until then.

Fencing
    A model's first publish in an ownership claims a new epoch of it (its states then win over
    any earlier owner's); a process that lost its partitions (a zombie) can still publish with
    its older epoch, which readers ignore, and its offset commits are refused by the group
    coordinator (the group's generation moved on). A process whose claim finds another
    claim of the model before its own cannot tell which of the two is the zombie: it gives
    the partition up unpublished and rejoins the group (:attr:`ScopedModels.fenced`), and
    the owner the group then names resumes from the last commit.

>>> model_id_of("key", 3, b"gauge-17"), model_id_of("partition", 3, b"gauge-17")
((3, 'gauge-17'), (3, None))
>>> model_label((3, "gauge-17")), model_label((3, None))
('3/gauge-17', '3')
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import threading
import time
import zipfile
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from connectors.config import Config
from connectors.messages import Source, dead_letter, encode
from connectors.metrics import Metrics
from connectors.models import (
    checkpoint_bounds,
    checkpointed_settings,
    restore_model,
    settings_mismatch,
)
from connectors.processor import BatchResult, Processor, Produced
from connectors.replica import GLOBAL_MODEL_ID
from connectors.state_store import (
    StaleEpochError,
    StateStore,
    StateStoreError,
    StoredState,
    decode_state,
    encode_state,
)

__all__ = [
    "ModelId",
    "ScopedModels",
    "ScopedStateRefused",
    "model_id_of",
    "model_label",
]

log = logging.getLogger(__name__)

ModelId = tuple[int, str | None]
#: The id of the group's own record on the state topic (its scope, settings, partitions).
GROUP_RECORD_ID = ("group", None)
#: Prefix of the id of a partition's record on the state topic, ``("partition", p)``: written
#: when the partition's offsets are to be committed before any model of it exists (all its
#: messages so far dead-lettered), with those offsets, so that its next owner knows that
#: commits up to them lost no model (and that a commit beyond them without a model did).
PARTITION_RECORD = "partition"
#: Version of the layout of a scoped model's state.
SCOPED_STATE_FORMAT = 1
#: Prefix of the unlabelled cache's arrays among a state's arrays.
_CACHE = "cache."



def _unlink(path: Path) -> bool:
    """Remove a model's copy on disk, best effort (as keeping it is): a directory made
    read-only must not stop the stream. A copy left behind is read only while it is the
    state topic's newest state of its model. Returns whether it is gone."""
    try:
        path.unlink(missing_ok=True)
    except OSError as exc:
        log.warning("removing %s failed (%s)", path, exc)
        return False
    return True

class ScopedStateRefused(RuntimeError):
    """A model's state on the state topic cannot be used (made with other settings, another
    format, or it does not load): starting a new model instead would silently replace it."""


#: The longest Kafka key that names a model (model.scope = "key"): a model's state carries
#: its key in every record, and one of 600 KB made states no broker accepts, which held its
#: partition's commits back for good.
MAX_MODEL_KEY_BYTES = 1024
#: Evicted models kept on local disk (checkpoint.dir): at most this many per model.max_models,
#: and at least DISK_MODELS_MIN; the least recently evicted go first (their states are on the
#: state topic, read from there if they come back).
DISK_MODELS_PER_LIVE = 10
DISK_MODELS_MIN = 1000


def model_id_of(scope: str, partition: int, key: bytes | None) -> ModelId:
    """The model a record of ``partition`` with Kafka ``key`` belongs to."""
    if scope != "key" or not key:  # no key, or an empty one
        return (partition, None)
    try:
        return (partition, bytes(key).decode("utf-8"))
    except UnicodeDecodeError:
        return (partition, "0x" + bytes(key).hex())


def _partition_record_id(partition: int) -> tuple[str, int]:
    return (PARTITION_RECORD, partition)


def _is_partition_record(model_id: Any) -> bool:
    return (isinstance(model_id, tuple) and len(model_id) == 2
            and model_id[0] == PARTITION_RECORD)


def _partition_of(model_id: Any) -> int:
    """The input partition of a model, or of a partition's record."""
    return model_id[1] if _is_partition_record(model_id) else model_id[0]


def _record_of(partition: int, state: Any) -> dict[str, int]:
    """The offsets a partition's record read from the state topic covers (none, when they do
    not read as offsets of this partition)."""
    offsets = state.metadata.get("offsets")
    try:
        readable = isinstance(offsets, dict) and all(
            isinstance(name, str) and type(offset) is int and offset >= 0
            and _topic_partition(name)[1] == partition for name, offset in offsets.items())
    except ValueError:  # (a name without a partition number)
        readable = False
    return offsets if readable else {}


def model_label(model_id: ModelId) -> str:
    """The ``model`` label of a model's metrics: ``partition`` or ``partition/key``."""
    partition, key = model_id
    return str(partition) if key is None else f"{partition}/{key}"


def _topic_partition(name: str) -> tuple[str, int]:
    topic, _, partition = name.rpartition(":")
    return topic, int(partition)


@dataclass
class _Live:
    processor: Processor
    #: changed since its last published state
    dirty: bool = False
    #: changed by the batch being handled, whose outputs are not delivered yet: publishing
    #: it now would let a crash lose them (its next owner skips what the state covers)
    undelivered: bool = False


def served_without_a_record(config: Config, served: Mapping[str, int], state_topic: str,
                            global_state: bool = False, publisher: str | None = None) -> str:
    """The refusal of a daemon of model.scope partition or key in a consumer group that
    committed offsets (``served``), or whose state topic holds a global model's state
    (``global_state``; ``publisher``: the consumer group that state names, None for states
    written before they named it), without the group's record on that topic: writing the
    record would bind the group to this scope, and the daemon that served it would be
    refused from then on."""
    group = config.kafka.group_id
    other = global_state and publisher is not None and publisher != group
    state = ("" if not global_state else
             f"the state topic {state_topic} holds the global model's state of consumer group "
             f"{publisher!r} (a daemon of model.scope = \"global\" publishes it with "
             "kafka.publish_state)" if publisher is not None else
             f"the state topic {state_topic} holds a global model's state (which a daemon of "
             "model.scope = \"global\" publishes with kafka.publish_state)")
    found = " and ".join(filter(None, [
        f"consumer group {group!r} has committed offsets {dict(served)}" if served else "",
        state]))
    if other:
        cause = (f"consumer group {publisher!r} shares this state topic (it is the "
                 "kafka.state_topic of both groups)")
        advice = (f"Give group {group!r} its own kafka.state_topic (by default "
                  "\"<kafka.group_id>.state\")")
    else:
        cause = ("a daemon of model.scope = \"global\" (whose model is a checkpoint in its "
                 "checkpoint.dir) served this group" +
                 (", or another group shares the state topic" if global_state and
                  publisher is None else "") + ", or the state topic lost its data")
        advice = ("Start the group with the scope that served it, give this daemon another "
                  "kafka.group_id and its own kafka.state_topic, or run with --start-fresh "
                  "(checkpoint.start_fresh = true) to start new, empty models from the "
                  "committed offsets")
    return (f"{found}, but {state_topic} holds no record of consumer group {group!r}: {cause}. "
            f"A daemon of model.scope = {config.model.scope!r} would start new, empty models "
            f"from there and bind the group to its scope. Nothing was changed. {advice}.")


#: The metadata entry of a model's copy on local disk that names the model and state it holds.
_DISK_COPY = "disk_copy"


def _copy_identity(model_id: ModelId, state: StoredState) -> Any:
    """What a model's copy on disk records of itself (as JSON reads it back)."""
    return json.loads(json.dumps({"model": list(model_id), "epoch": state.epoch,
                                  "sequence": state.sequence, "next_offset": state.next_offset}))


class ScopedModels:
    """The models of the partitions this process owns.

    ``new_processor(model, metrics)`` builds a processor for a model (with the configured
    scaler, cache bounds and label topic); ``commit(offsets)`` commits ``{"topic:partition":
    next offset}`` for the consumer group (raising on failure).
    """

    #: Seconds between two warnings that one model's state cannot be fetched (its messages
    #: come back every poll meanwhile).
    FETCH_WARNING_SECONDS = 30.0

    def __init__(
        self,
        config: Config,
        store: StateStore,
        new_processor: Callable[[Any, Any], Processor],
        build_model: Callable[[], Any],
        metrics: Metrics,
        cache_dir: Path | None = None,
    ) -> None:
        self.config = config
        #: when this daemon started (on the processors' clock, time.time): see _processor_from
        self.started_at = time.time()
        self.scope: str = config.model.scope
        self.max_models: int = config.model.max_models
        self.store = store
        self.new_processor = new_processor
        self.build_model = build_model
        self.metrics = metrics
        #: where evicted models' states are kept on local disk (None: not kept), read back
        #: instead of the state topic while they are still the newest there
        self.cache_dir = cache_dir
        #: the copies there, least recently evicted first; at most DISK_MODELS_PER_LIVE *
        #: max_models (keys seen once filled the directory, and every read back scanned it)
        self._on_disk: OrderedDict[ModelId, Path] = OrderedDict()
        self.max_on_disk = max(DISK_MODELS_MIN, DISK_MODELS_PER_LIVE * self.max_models)
        #: whether cache_dir was made ready (at the first eviction: a start refused before
        #: any left the disk as it was)
        self._disk_ready = False
        #: kafka-python calls the rebalance listener on its own IO thread: the daemon holds
        #: this lock around everything that reads or changes the models
        self.lock = threading.RLock()
        self.live: OrderedDict[ModelId, _Live] = OrderedDict()
        #: owned partitions of which the state topic holds a model: their offsets are
        #: committed (settle refuses a partition with commits but no model, as one whose
        #: models were lost)
        self._stated: set[int] = set()
        #: owned partitions without a model whose record is on the state topic (its messages so
        #: far all dead-lettered): the offsets up to which it covers commits
        self._recorded: dict[int, dict[str, int]] = {}
        #: input partitions owned and ready (their models' states indexed, positions set)
        self.owned: set[int] = set()
        #: partitions assigned by the group and not ready yet
        self.pending: set[int] = set()
        #: "topic:partition" -> next offset up to which every record was handled
        self.positions: dict[str, int] = {}
        #: "topic:partition" -> offset last committed
        self.committed: dict[str, int] = {}
        #: epochs claimed in the current ownership of each model, and their last sequence
        self.epochs: dict[ModelId, int] = {}
        #: the highest epoch of each model of the owned partitions when they were assigned:
        #: a higher one found at claim time was taken by another process since (see _fence)
        self.known_epochs: dict[ModelId, int] = {}
        self.sequences: dict[ModelId, int] = {}
        #: clean models of revoked partitions, kept in case the group gives them back
        self._retained: dict[ModelId, tuple[Processor, tuple[int, int] | None]] = {}
        #: partitions given up since another process claimed one of their models: the daemon
        #: rejoins the group, which says who owns them (see _fence)
        self.fenced: set[int] = set()
        #: models published but not read back yet (the state topic could not be read): the
        #: offset to read to; their partitions are not committed until it is
        self._unverified: dict[ModelId, int] = {}
        #: models whose last publish found the state topic unreachable: tried last next time,
        #: so that a partition of the state topic whose leader is down does not hold up the
        #: models of the others round after round
        self._unreached: set[ModelId] = set()
        #: models whose state could not be fetched: when that was last logged as a warning
        self._fetch_warned: dict[ModelId, float] = {}
        #: copies of evicted models that could not be written since the last warning of it,
        #: and when that warning came
        self._disk_failures = 0
        self._disk_warned_at: float | None = None
        self._settings = checkpointed_settings(config)
        #: the input topic's partition count the models were made with (check_group)
        self.partitions: int | None = None
        self._group_recorded = True  # check_group says otherwise for a new group
        self._bounds = checkpoint_bounds(config)
        # Totals over every model this process handled (for the stop summary).
        self.updates = 0
        self.restores = 0
        self.evictions = 0

    # -- state of one model ----------------------------------------------------------------

    def state_of(self, model_id: ModelId, processor: Processor
                 ) -> tuple[dict[str, np.ndarray], dict[str, Any], int]:
        """``(arrays, metadata, next_offset)`` of a model to publish: its checkpoint arrays,
        the unlabelled cache, the processor's state (offsets, counters, scaler, held
        messages) and the settings it was made with."""
        arrays, model_meta = processor.model.to_checkpoint()
        state = {name: np.asarray(value) for name, value in arrays.items()}
        for name, value in processor.cache_arrays().items():
            state[_CACHE + name] = np.asarray(value)
        metadata = {
            "format": SCOPED_STATE_FORMAT,
            "scope": self.scope,
            "model_meta": model_meta,
            "model_settings": self._settings,
            "processor": processor.state(),
        }
        topic = f"{self.config.kafka.input_topic}:{model_id[0]}"
        return state, metadata, processor.offsets.get(topic, 0)

    def check(self, what: str, metadata: dict[str, Any]) -> None:
        """ScopedStateRefused unless ``metadata`` (of a model's state, or of the group's
        record) was written with this daemon's format, scope and settings."""
        if metadata.get("format") != SCOPED_STATE_FORMAT:
            raise ScopedStateRefused(
                f"{what} on {self.store.topic} has format {metadata.get('format')!r}; this "
                f"stream-svm reads {SCOPED_STATE_FORMAT}")
        changed = settings_mismatch(metadata.get("model_settings"), self._settings)
        if metadata.get("scope") != self.scope:
            changed = ", ".join(filter(None, [f"scope {metadata.get('scope')!r} -> "
                                              f"{self.scope!r}", changed]))
        if changed:
            raise ScopedStateRefused(
                f"{what} on {self.store.topic} was made with other settings ({changed}). "
                "Nothing was changed. Start with the settings the models were made with, or "
                "use another kafka.group_id (and state topic) for new models.")

    def check_group(self, partitions: int, served: Mapping[str, int] | None = None) -> None:
        """At start: the group's record on the state topic (its scope, model settings and the
        input topic's partition count) must match this daemon's, so that a daemon with other
        settings is refused before it writes a model, even into partitions that have none
        yet; the first daemon of a group writes the record, unless the group has committed
        offsets (``served``: "topic:partition" -> offset), which only a daemon without the
        record can have left. ScopedStateRefused otherwise, StateStoreError when the topic
        cannot be read or written."""
        found = self.store.restore([GROUP_RECORD_ID], log_level=logging.DEBUG).get(
            GROUP_RECORD_ID)
        self.partitions = partitions
        if found is None and not self._kept_orphans(served or {}):
            # A new group: its record is written now, before any model is read or made, so
            # that a daemon of the group with other settings started later is refused at its
            # start (written with the first model state instead, it let a daemon started
            # before any message in: the group's models were mixed, and the next rebalance
            # stopped the daemon that inherited the others'). Read back: of daemons that
            # started at the same moment, all but the one whose record is the newest are
            # refused (what the topic keeps of one key).
            log.warning(
                "a new consumer group %r on %s: every %s starts a new, empty model (as "
                "expected at the group's first start; if this group served models before, "
                "they are gone: the state topic was deleted or the broker lost its data)",
                self.config.kafka.group_id, self.store.topic,
                self.scope)
            self.store.publish(GROUP_RECORD_ID, {}, self._group_metadata(partitions), 0, 0, 1)
        if found is None:
            self._group_recorded = True
            found = self.store.restore([GROUP_RECORD_ID], log_level=logging.DEBUG).get(
                GROUP_RECORD_ID)
            if found is None:
                return
        self._check_group_record(found.metadata, partitions)

    def _kept_orphans(self, served: Mapping[str, int]) -> bool:
        """For a state topic without the group's record: whether it holds model states, kept
        by checkpoint.start_fresh (the record written again). A group's record is written
        before any model state (since the group's start): states without it mean the topic
        lost it, deleted and recreated or emptied while daemons of the group ran, and with it
        every model not published since. A global model's state, or committed offsets
        (``served``) without any state, mean a global daemon served the group. Without
        start_fresh: ScopedStateRefused."""
        found = self.store.restore(
            select=lambda m: m != GROUP_RECORD_ID and not _is_partition_record(m),
            decode=False, log_level=logging.DEBUG)
        global_state = GLOBAL_MODEL_ID in found
        publisher = found[GLOBAL_MODEL_ID].metadata.get("group_id") if global_state else None
        if publisher is not None and publisher != self.config.kafka.group_id:
            # (start_fresh or not: another group's model is no model of this group to replace)
            raise ScopedStateRefused(served_without_a_record(
                self.config, served, self.store.topic, global_state, publisher))
        if (global_state or (served and not found)) and not self.config.checkpoint.start_fresh:
            raise ScopedStateRefused(served_without_a_record(
                self.config, served, self.store.topic, global_state, publisher))
        if global_state and len(found) == 1:  # (start_fresh: no model of this scope lost)
            log.warning("start_fresh: the state topic %s holds a global model's state, which "
                        "no model of model.scope = %r continues: every model starts new and "
                        "empty", self.store.topic, self.scope)
            if self.partitions is not None:
                self.store.publish(GROUP_RECORD_ID, {}, self._group_metadata(self.partitions),
                                   0, 0, 1)
            return True
        if found:
            self._record_lost(f"holds {len(found)} model states but not the record of their "
                              "consumer group, written before any model state",
                              "while daemons of the group ran", "Nothing was changed",
                              self.config.checkpoint.start_fresh)
        return bool(found)

    def _check_group_record(self, metadata: Mapping[str, Any], partitions: int) -> None:
        self.check(f"the record of consumer group {self.config.kafka.group_id!r}", metadata)
        kafka = self.config.kafka
        # Records written before these were kept agree with any group and topic.
        owner = (metadata.get("group_id", kafka.group_id),
                 metadata.get("input_topic", kafka.input_topic))
        if owner != (kafka.group_id, kafka.input_topic):
            raise ScopedStateRefused(
                f"the models on {self.store.topic} belong to consumer group {owner[0]!r} "
                f"reading {owner[1]}, not to group {kafka.group_id!r} reading "
                f"{kafka.input_topic}: a key of this stream would continue the other stream's "
                "model. Nothing was changed. Give each group its own kafka.state_topic.")
        recorded = metadata.get("partitions")
        if recorded != partitions:
            raise ScopedStateRefused(
                f"the input topic {self.config.kafka.input_topic} has {partitions} partitions, "
                f"but the models on {self.store.topic} were made when it had {recorded}: a "
                "key's messages now reach another partition, where a new, empty model would "
                "silently take its place. Nothing was changed. Give the topic its former "
                "partition count, or use another kafka.group_id for new models.")

    def _record_lost(self, found: str, when: str, changed: str, start_fresh: bool) -> None:
        """ScopedStateRefused, naming what the state topic lost, unless ``start_fresh`` keeps
        the models found and starts the others new and empty (the group's record written
        again, if this daemon knows the partition count)."""
        lost = (f"the state topic {self.store.topic} {found}: the topic was deleted and "
                f"recreated, or emptied, {when}, and every model not published since then is "
                "gone")
        if not start_fresh:
            raise ScopedStateRefused(
                f"{lost}; new, empty models would silently take their places. {changed}. "
                "Restore the state topic, or run with --start-fresh (checkpoint.start_fresh = "
                "true) to keep the models found and start the others new and empty.")
        log.warning("start_fresh: %s; the models found are kept, the others start new and "
                    "empty", lost)
        if self.partitions is not None:
            self.store.publish(GROUP_RECORD_ID, {}, self._group_metadata(self.partitions),
                               0, 0, 1)

    def _record_group(self) -> None:
        """Write the group's record before the first model state of a new group."""
        if self._group_recorded or self.partitions is None:
            return
        self.store.publish(GROUP_RECORD_ID, {}, self._group_metadata(self.partitions), 0, 0, 1)
        self._group_recorded = True

    def _group_metadata(self, partitions: int) -> dict[str, Any]:
        return {"format": SCOPED_STATE_FORMAT, "scope": self.scope,
                "model_settings": self._settings, "partitions": partitions,
                "group_id": self.config.kafka.group_id,
                "input_topic": self.config.kafka.input_topic}

    def _processor_from(self, model_id: ModelId, state: StoredState) -> Processor:
        metadata = state.metadata
        where = (f"the state of model {model_label(model_id)} (epoch {state.epoch}, sequence "
                 f"{state.sequence})")
        self.check(where, metadata)
        try:
            model_arrays = {name: array for name, array in state.arrays.items()
                            if not name.startswith(_CACHE)}
            cache = {name[len(_CACHE):]: array for name, array in state.arrays.items()
                     if name.startswith(_CACHE)}
            for name, array in model_arrays.items():
                self._bounds(name, array.dtype, array.shape)
            model = restore_model(self.config, model_arrays, metadata["model_meta"])
            processor = self.new_processor(model, self.metrics.for_model(model_label(model_id)))
            # (Its cache's clock goes on from a state written before this daemon started: a
            # crash's restart replays the labels the state did not cover, and a restart later
            # than the cache's max age found their points expired, dead-lettering labels
            # acknowledged before the crash. A state written since, of a model evicted or
            # handed over while the daemons ran, ages as it did.)
            processor.load_state(metadata["processor"], cache,
                                 resume_before=self.started_at)
        except Exception as exc:
            raise ScopedStateRefused(f"{where} does not load: {type(exc).__name__}: {exc}"
                                     ) from None
        return processor

    # -- the group's assignments -----------------------------------------------------------

    def revoke(self, partitions: Iterable[int], commit: Callable[[dict[str, int]], None],
               *, hand_over: bool = True) -> None:
        """The group takes ``partitions`` away: publish their changed models, hand the offsets
        of those published to ``commit`` (unless not ``hand_over``: the daemon gave outputs
        up, so its models are ahead of what was delivered), and let their models go (clean
        ones are kept aside in case the group gives the partitions back)."""
        partitions = set(partitions)
        self.metrics.scale_out[1].labels(kind="revoked").inc()
        try:
            if hand_over:
                self.publish(partitions)
                offsets = self.committable(partitions)
                if offsets:
                    commit(offsets)
        finally:
            self._let_go(partitions)
            self.fenced -= partitions  # the group is rebalancing already: no rejoin needed

    def lose(self, partitions: Iterable[int]) -> None:
        """The group gave ``partitions`` to another process already (this one missed its
        session): drop their models unpublished; the new owner resumed from the last commit."""
        partitions = set(partitions)
        self.metrics.scale_out[1].labels(kind="lost").inc()
        self._let_go(partitions, retain=False)
        self.fenced -= partitions  # the group is rebalancing already: no rejoin needed

    def _let_go(self, partitions: set[int], *, retain: bool = True) -> None:
        self._clear_disk(partitions)  # their next owner's states will be newer
        for model_id in [m for m in self._fetch_warned if m[0] in partitions]:
            del self._fetch_warned[model_id]
        for model_id in [m for m in self.live if m[0] in partitions]:
            live = self.live.pop(model_id)
            self.metrics.forget_model(model_label(model_id))
            if retain and not live.dirty:
                newest = self.store.newest(model_id)
                self._retained[model_id] = (
                    live.processor, None if newest is None else (newest.epoch, newest.sequence))
        for model_id in [m for m in self.known_epochs if _partition_of(m) in partitions]:
            del self.known_epochs[model_id]
        for model_id in [m for m in self._unverified if _partition_of(m) in partitions]:
            del self._unverified[model_id]
        self._unreached = {m for m in self._unreached if _partition_of(m) not in partitions}
        for model_id in [m for m in self.epochs if _partition_of(m) in partitions]:
            self.epochs.pop(model_id)
            self.sequences.pop(model_id, None)
        self.owned -= partitions
        self.pending -= partitions
        for offsets in (self.positions, self.committed):
            for name in [n for n in offsets if _topic_partition(n)[1] in partitions]:
                del offsets[name]
        self._gauge()

    def assign(self, partitions: Iterable[int]) -> None:
        """The group gives this process ``partitions``: they wait (paused by the daemon) until
        :meth:`settle` indexed their models' states."""
        partitions = set(partitions)
        self.metrics.scale_out[1].labels(kind="assigned").inc()
        self.pending |= partitions
        self.fenced -= partitions  # the group named this process their owner since

    def settle(self, committed: dict[int, dict[str, int | None]], start_fresh: bool
               ) -> dict[str, int | None]:
        """Index the newest state of every model of the pending partitions found in
        ``committed`` (one read of the state topic); returns per ``"topic:partition"`` the
        offset to resume from (the group's committed offset; None: from the beginning).
        ``committed[partition]`` holds the committed offsets of that partition's topics.
        Raises StateStoreError when the state topic cannot be read (retry),
        ScopedStateRefused when a partition was served before and none of its models has a
        state (they would start over, silently)."""
        pending = self.pending & set(committed)
        beyond = sorted(p for p in pending if self.partitions is not None
                        and p >= self.partitions)
        if beyond:
            raise ScopedStateRefused(
                f"the group assigned partitions {beyond} of {self.config.kafka.input_topic}, "
                f"which had {self.partitions} when its models were made: the topic gained "
                "partitions, so keys now reach other partitions, where new, empty models "
                "would silently take their places. Nothing of them was read. Give the topic "
                "its former partition count, or use another kafka.group_id for new models.")
        started = time.perf_counter()
        # (Read on from the last assignment's read: the whole topic each time took longer
        # and longer under churn, until compaction reached it.)
        states = self.store.index(
            select=lambda m: m == GROUP_RECORD_ID or (isinstance(m, tuple) and len(m) == 2 and (
                m[0] in pending or (m[0] == PARTITION_RECORD and m[1] in pending))),
            # (The "partitions ... ready: N models" line below says it: the store's own line
            # counted the group's record as a model, "restored 1 models", then "0 models".)
            log_level=logging.DEBUG)
        seconds = time.perf_counter() - started
        record = states.pop(GROUP_RECORD_ID, None)
        if record is None and self.partitions is not None:
            self._record_lost(
                f"no longer holds the record of consumer group {self.config.kafka.group_id!r}, "
                "written when the group started", "since",
                f"Nothing of partitions {sorted(pending)} was read", start_fresh)
        elif record is not None:
            self._check_group_record(record.metadata, self.partitions or record.metadata.get(
                "partitions"))
        self.metrics.replica[2].observe(seconds)
        self.known_epochs.update(self.store.epochs(
            lambda m: isinstance(m, tuple) and len(m) == 2 and _partition_of(m) in pending))
        records = {model_id[1]: states.pop(model_id) for model_id in list(states)
                   if _is_partition_record(model_id)}
        for model_id, state in states.items():  # every one before any is used
            self.check(f"the state of model {model_label(model_id)}", state.metadata)
        resume: dict[str, int | None] = {}
        with_state = {model_id[0] for model_id in states}  # type: ignore[index]
        self._stated = (self._stated - pending) | (with_state & pending)
        for partition in pending:
            self._recorded.pop(partition, None)
            if partition in records:
                self._recorded[partition] = _record_of(partition, records[partition])
        for partition in sorted(pending):
            offsets = committed[partition]
            served = {name: offset for name, offset in offsets.items() if offset is not None}
            # A partition without a model whose record covers its commits lost nothing.
            covered = partition in self._recorded and all(
                offset <= self._recorded[partition].get(name, -1)
                for name, offset in served.items())
            if served and partition not in with_state and not covered and not start_fresh:
                raise ScopedStateRefused(
                    f"the consumer group {self.config.kafka.group_id!r} has committed offsets "
                    f"{served} for partition {partition}, but the state topic "
                    f"{self.store.topic} holds no model of it: models served this partition "
                    "before, and new ones would silently replace them. Nothing was changed. "
                    "Restore the state topic, or run with --start-fresh (checkpoint.start_fresh"
                    " = true) to start new, empty models from the committed offsets. (For a "
                    "partition whose messages made no model, all of them dead-lettered for "
                    "over-long Kafka keys, which versions before the partitions' own records "
                    "committed without one, --start-fresh loses nothing.)")
            resume.update(offsets)
            state = states.get((partition, None)) if self.scope == "partition" else None
            if state is not None:
                # The partition's one model: never resume past what its newest state holds.
                # That state may be a woken zombie's, of a higher epoch than the real owner's
                # and behind its commits: resuming at the commit skipped the messages
                # between. Those the model holds already are skipped by their offsets.
                held = state.metadata.get("processor", {}).get("offsets", {})
                for name, offset in offsets.items():
                    next_offset = held.get(name)
                    if (isinstance(next_offset, int) and offset is not None
                            and next_offset < offset):
                        log.warning("model %s's newest state holds %s up to offset %d, "
                                    "behind the group's commit at %d: resuming at %d",
                                    model_label((partition, None)), name, next_offset,
                                    offset, next_offset)
                        resume[name] = next_offset
        for model_id, (processor, published) in self._retained.items():
            newest = states.get(model_id)
            if (model_id[0] in pending and newest is not None
                    and (newest.epoch, newest.sequence) == published
                    and len(self.live) < self.max_models):
                # Back to this process and nobody published it since: no need to fetch it.
                processor.metrics = self.metrics.for_model(model_label(model_id))
                self.live[model_id] = _Live(processor)
        self._retained.clear()
        for name, offset in resume.items():
            if offset is not None:  # else only records handled set a position to commit
                self.positions[name] = offset
        self.owned |= pending
        self.pending -= pending
        log.info("partitions %s ready: %d models on %s (read in %.3f s), resuming at %s",
                 sorted(pending), len(states), self.store.topic, seconds, resume)
        self._gauge()
        return resume

    # -- records ---------------------------------------------------------------------------

    def process(self, records: list[Any]) -> tuple[BatchResult, dict[str, int]]:
        """Hand each record to its model; returns the merged outcomes and, per
        ``"topic:partition"``, the offset to read again from when a model could not be
        fetched (its records are then not handled; the daemon seeks there)."""
        merged = BatchResult()
        groups: dict[ModelId, list[Any]] = {}
        for record in records:
            if record.partition in self.owned:
                key = getattr(record, "key", None)
                if self.scope == "key" and key is not None and len(key) > MAX_MODEL_KEY_BYTES:
                    merged.dead_letters.append(self._letter(
                        record, f"the message's Kafka key has {len(key)} bytes: with "
                        "model.scope = \"key\" it names a model, and may have at most "
                        f"{MAX_MODEL_KEY_BYTES}", "malformed"))
                    continue
                groups.setdefault(model_id_of(self.scope, record.partition, key),
                                  []).append(record)
        retry: dict[str, int] = {}
        for model_id, group in groups.items():
            if model_id[0] not in self.owned:
                continue  # fenced meanwhile (see _fence): its next owner handles the records
            try:
                live = self._get(model_id)
            except StateStoreError as exc:
                self.metrics.scale_out[4].inc()
                # Its messages come back every poll: a warning per model every
                # FETCH_WARNING_SECONDS, the attempts between them at debug level.
                now = time.monotonic()
                last = self._fetch_warned.get(model_id)
                level = logging.DEBUG
                if last is None or now - last >= self.FETCH_WARNING_SECONDS:
                    self._fetch_warned[model_id] = now
                    level = logging.WARNING
                log.log(level, "model %s cannot be fetched from the state topic (%s): its "
                        "messages wait and are read again", model_label(model_id), exc)
                for record in group:
                    name = f"{record.topic}:{record.partition}"
                    retry[name] = min(retry.get(name, record.offset), record.offset)
                continue
            if model_id[0] not in self.owned:  # fenced while room was made for this model
                self.live.pop(model_id, None)
                continue
            before = live.processor.updates
            result = live.processor.process(group)
            self.updates += live.processor.updates - before
            live.dirty = live.undelivered = True
            merged.outputs += result.outputs
            merged.dead_letters += result.dead_letters
            merged.input_timestamps += result.input_timestamps
            merged.skipped += result.skipped
        for record in records:
            name = f"{record.topic}:{record.partition}"
            if record.partition in self.owned and name not in retry:
                self.positions[name] = max(self.positions.get(name, 0), record.offset + 1)
        for name, offset in retry.items():
            self.positions[name] = min(self.positions.get(name, offset), offset)
        self._gauge()
        return merged, retry

    def _letter(self, record: Any, error: str, reason: str) -> Produced:
        """The dead letter of a record no model handles."""
        source = Source(record.topic, record.partition, record.offset)
        letter = dead_letter(error, record.value, source, self.config.kafka.max_message_bytes,
                             reason=reason)
        self.metrics.dead_letters.labels(reason=reason).inc()
        self.metrics.count_messages("dead_lettered")
        return Produced(source.letter_key(), letter, encode(letter))

    def _get(self, model_id: ModelId) -> _Live:
        live = self.live.get(model_id)
        if live is not None:
            self.live.move_to_end(model_id)
            return live
        stored = self.store.newest(model_id)
        if stored is not None:
            state = self._from_disk(model_id, stored)
            source = "disk"
            if state is None:
                state, source = self.store.fetch(model_id), "topic"
            processor = self._processor_from(model_id, state)
            processor.generation = f"{state.epoch}.{state.sequence}"
            if self._fetch_warned.pop(model_id, None) is not None:
                log.info("model %s fetched from the %s after all", model_label(model_id),
                         "state topic" if source == "topic" else "disk")
            self.restores += 1
            self.metrics.scale_out[3].labels(source=source).inc()
        else:
            processor = self.new_processor(self.build_model(),
                                           self.metrics.for_model(model_label(model_id)))
        processor.output_fields = {"model": model_label(model_id)}
        partition, key = model_id
        processor.unknown_id_hint = (
            f"; model {model_label(model_id)} holds the points of partition {partition}"
            + ("" if key is None else " sent with this Kafka key")
            + ": a forget, relabel or label reaches the model of its id only when sent with "
            "the Kafka key of the id's learning message")
        self._make_room()
        live = self.live[model_id] = _Live(processor)
        return live

    def delivered(self) -> None:
        """The outputs of the batch last handed to :meth:`process` are delivered: its models
        may be published, and those over ``max_models`` are evicted now."""
        for live in self.live.values():
            live.undelivered = False
        if len(self.live) > self.max_models:
            self._make_room(self.max_models)

    def _make_room(self, keep: int | None = None) -> None:
        """Evict least recently used models down to ``keep`` live ones (``max_models - 1``:
        room for one more), each published first. A model of the batch being handled is
        not evicted before its outputs are delivered (:meth:`delivered` evicts it then), nor
        one whose publish fails: those stay, over the bound, until they can go."""
        keep = self.max_models - 1 if keep is None else keep
        for model_id in list(self.live):
            if len(self.live) <= keep:
                return
            live = self.live.get(model_id)
            if live is None:  # let go meanwhile (its partition fenced)
                continue
            if live.undelivered or (live.dirty and not self._publish_one(model_id, live)):
                continue
            if model_id in self.live:
                self._to_disk(model_id, live.processor)
                del self.live[model_id]
                self.metrics.forget_model(model_label(model_id))
                self.evictions += 1
                self.metrics.scale_out[2].inc()

    # -- evicted models on local disk -------------------------------------------------------

    def _disk_path(self, model_id: ModelId, epoch: int, sequence: int) -> Path:
        assert self.cache_dir is not None
        digest = hashlib.sha256(json.dumps(list(model_id)).encode()).hexdigest()[:32]
        return self.cache_dir / f"{model_id[0]}-{digest}.{epoch}.{sequence}.npz"

    def _disk_prepared(self) -> bool:
        """Make cache_dir ready once (False: evicted models are not kept on disk this run)."""
        if self.cache_dir is not None and not self._disk_ready:
            self._disk_ready = True
            try:
                self.cache_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            except OSError as exc:
                log.warning("evicted models are not kept in %s this run: %s", self.cache_dir,
                            exc.strerror or exc)
                self.cache_dir = None
                return False
            # Copies a previous run left (killed before it cleared them) may be of another
            # group's or topic's model that happens to have the same epoch and sequence: this
            # run reads its models from the state topic, and keeps only what it evicts itself.
            for stale in [*self.cache_dir.glob("*.npz"), *self.cache_dir.glob("*.partial")]:
                if not _unlink(stale):
                    log.warning("evicted models are not kept in %s this run: an old copy "
                                "there cannot be removed", self.cache_dir)
                    self.cache_dir = None
                    break
        return self.cache_dir is not None

    def _to_disk(self, model_id: ModelId, processor: Processor) -> None:
        """Keep an evicted model's published state on local disk (best effort: a failure only
        means it is read from the state topic)."""
        newest = self.store.newest(model_id)
        if newest is None or not self._disk_prepared():
            return
        path = self._disk_path(model_id, newest.epoch, newest.sequence)
        arrays, metadata, _ = self.state_of(model_id, processor)
        metadata[_DISK_COPY] = _copy_identity(model_id, newest)
        partial = path.with_suffix(".partial")
        older = self._on_disk.pop(model_id, None)
        if older is not None and older != path:
            _unlink(older)
        try:
            descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(descriptor, "wb") as handle:
                handle.write(encode_state(arrays, metadata))
            os.replace(partial, path)
        except (OSError, ValueError) as exc:
            with contextlib.suppress(OSError):  # (what a full disk took of it)
                partial.unlink(missing_ok=True)
            # Once per FETCH_WARNING_SECONDS, with a count: a full disk failed every eviction,
            # hundreds of lines in seconds.
            now = time.monotonic()
            self._disk_failures += 1
            if self._disk_warned_at is None or now - self._disk_warned_at >= \
                    self.FETCH_WARNING_SECONDS:
                log.warning("keeping evicted model %s on disk failed (%s), %s since this "
                            "was last said (at most once per %g s): such models are read from "
                            "the state topic on their next message", model_label(model_id), exc,
                            "once" if self._disk_failures == 1 else
                            f"{self._disk_failures} times", self.FETCH_WARNING_SECONDS)
                self._disk_warned_at, self._disk_failures = now, 0
            return
        self._on_disk[model_id] = path
        while len(self._on_disk) > self.max_on_disk:
            # (published before it was evicted: read from the state topic if it comes back)
            _unlink(self._on_disk.popitem(last=False)[1])

    def _from_disk(self, model_id: ModelId, newest: StoredState) -> StoredState | None:
        """The model's state from local disk when the copy there is the newest state on the
        topic (the same epoch and sequence: nobody published it since), else None. The file
        goes either way: the model is live again."""
        if self.cache_dir is None:
            return None
        path = self._disk_path(model_id, newest.epoch, newest.sequence)
        kept = self._on_disk.pop(model_id, None)
        if kept is None:
            return None
        if kept != path:  # (published by another process since: not the newest)
            _unlink(kept)
            return None
        try:
            payload = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            log.warning("reading model %s from %s failed (%s): read from the state topic",
                        model_label(model_id), path, exc)
            return None
        finally:
            _unlink(path)
        try:
            arrays, metadata = decode_state(payload)
        except (ValueError, TypeError, KeyError, OSError, zipfile.BadZipFile) as exc:
            log.warning("model %s on disk (%s) does not load (%s): read from the state topic",
                        model_label(model_id), path, exc)
            return None
        # A copy says which model and state it is: a file put in its place (another model's
        # copy, by hand or by a tool) was taken for this model, which then answered with
        # another key's points, silently.
        if metadata.pop(_DISK_COPY, None) != _copy_identity(model_id, newest):
            log.warning("the file %s does not hold model %s's state %s: read from the state "
                        "topic", path, model_label(model_id),
                        f"{newest.epoch}.{newest.sequence}")
            return None
        return StoredState(arrays, metadata, newest.next_offset, newest.epoch, newest.sequence,
                           newest.location)

    def _clear_disk(self, partitions: set[int]) -> None:
        if self.cache_dir is None:
            return
        for model_id in [m for m in self._on_disk if m[0] in partitions]:
            del self._on_disk[model_id]
        for partition in partitions:
            for path in self.cache_dir.glob(f"{partition}-*"):
                _unlink(path)

    def expire_cache(self) -> None:
        for live in self.live.values():
            live.processor.expire_cache()

    # -- publishing and committing ---------------------------------------------------------

    def publish(self, partitions: set[int] | None = None,
                give_up: Callable[[], bool] | None = None) -> bool:
        """Publish every changed model (of ``partitions``); True when all succeeded.

        Once the state topic does not answer (a publish that timed out or failed in the
        client), the other changed models wait for the next publish instead of each waiting
        for a timeout of its own: with the broker stalled, a stop with 24 changed models took
        140 s, one request timeout per model. ``give_up`` (a second stop request) ends the
        round between two models. Models not published stay changed: their partitions' offsets
        are not committed, so nothing they learned is lost."""
        done = True
        # Read-backs that failed before are tried again with this publish's.
        written: dict[ModelId, int] = {model_id: offset for model_id, offset
                                       in self._unverified.items()
                                       if partitions is None
                                       or _partition_of(model_id) in partitions}
        changed = [model_id for model_id, live in self.live.items()
                   if live.dirty and (partitions is None or model_id[0] in partitions)]
        changed.sort(key=lambda model_id: model_id in self._unreached)  # (stable)
        unanswered = False  # the state topic did not answer in this round
        for index, model_id in enumerate(changed):
            live = self.live.get(model_id)
            if live is None or not live.dirty:
                continue  # dropped or published meanwhile (a fence drops its partition's)
            if give_up is not None and give_up():
                log.warning("publishing given up with %d changed models left unpublished "
                            "(their partitions' offsets are not committed)",
                            len(changed) - index)
                self._not_read_back(written)
                return False
            reached = self._publish_one(model_id, live, written)
            done = reached and done
            if reached is None:  # the state topic did not answer
                unanswered = True
                self._unreached.add(model_id)
                left = len(changed) - index - 1
                if left:
                    log.error("the state topic is not answering: %d more changed models are "
                              "not published now, but at the next publish (their partitions' "
                              "offsets are not committed until then)", left)
                done = False
                break
            self._unreached.discard(model_id)
        # Records go on when a model's state did not get through: one partition of the state
        # topic may be down (on a stop, whose time counts, not).
        if not (unanswered and give_up is not None):
            recorded = self._record_partitions(partitions, written, give_up)
            unanswered = unanswered or recorded is None
            done = bool(recorded) and done
        if give_up is not None and (unanswered or give_up()):
            # A stop: not one more timeout reading them back (their partitions are not
            # committed: their next owner resumes from the last commit).
            self._not_read_back(written)
            return False
        # One read of the state topic for the lot, not one per model.
        return self._still_newest(written) and done

    def _not_read_back(self, written: dict[Any, int]) -> None:
        """States written and not read back: their partitions are not committed until a later
        publish reads them (see _still_newest). (Not those of partitions given up meanwhile.)"""
        for model_id, offset in written.items():
            partition = _partition_of(model_id)
            if partition in self.owned and partition not in self.fenced:
                self._unverified[model_id] = max(offset,
                                                 self._unverified.get(model_id, offset))

    def _record_partitions(self, partitions: set[int] | None, written: dict[Any, int],
                           give_up: Callable[[], bool] | None = None) -> bool | None:
        """Write the record of each owned partition (of ``partitions``) that has records to
        commit beyond its record's offsets but no model (its messages so far all
        dead-lettered, e.g. for Kafka keys too long to name a model), with the offsets it
        covers; each record's offset goes to ``written``, to be read back. Without it the
        partition was never committed: every restart read and dead-lettered its messages
        again, and its lag grew for good. A record has epochs as a model has, claimed once per
        ownership: a former owner that has not learned it lost the partition cannot write it
        back behind the next owner's (whose restart would be refused), since readers take the
        newest epoch and its read-back finds that epoch. False when one was not written, None
        when that was because the state topic did not answer (one whose state-topic partition
        did not answer is tried last next time: the others are not held up behind it)."""
        _, outcomes, _, _ = self.metrics.replica
        with_models = {model_id[0] for model_id in self.live}
        done: bool | None = True
        for partition in sorted(
                {partition for name, offset in self.positions.items()
                 if (partition := _topic_partition(name)[1]) in self.owned
                 and partition not in self._stated and partition not in self.fenced
                 and partition not in with_models
                 and (partitions is None or partition in partitions)
                 and offset > self._recorded.get(partition, {}).get(name, -1)},
                key=lambda partition: (_partition_record_id(partition) in self._unreached,
                                       partition)):
            if give_up is not None and give_up():
                return False
            if partition in self.fenced:
                continue  # (given up meanwhile)
            model_id = _partition_record_id(partition)
            offsets = {name: offset for name, offset in self.positions.items()
                       if _topic_partition(name)[1] == partition}
            try:
                written[model_id], _, _ = self._write_state(
                    model_id, {}, {"format": SCOPED_STATE_FORMAT, "partition": partition,
                                   "offsets": offsets}, 0)
            except StaleEpochError as exc:
                outcomes.labels(outcome="stale").inc()
                self._fence(model_id, exc)
                done = False
                continue
            except (StateStoreError, ValueError) as exc:
                log.error("writing the record of partition %d to the state topic failed "
                          "(%s); its offsets are not committed until it succeeds",
                          partition, exc)
                if isinstance(exc, StateStoreError):
                    self._unreached.add(model_id)
                    return None  # (not one timeout per partition: see publish)
                done = False
                continue
            self._unreached.discard(model_id)
            self._recorded[partition] = offsets
        return done

    def _still_newest(self, written: dict[ModelId, int]) -> bool:
        """After publishing (``written``: each model's last offset), read the state topic on
        to those offsets: a model whose epoch another process has passed meanwhile fences its
        partition (nothing of it is committed). Without this, the real owner of a partition
        went on committing past a state that a woken zombie had published with a higher
        epoch: the next owner restored the zombie's state and resumed at the commit, and the
        messages between the two were never learned."""
        _, outcomes, _, _ = self.metrics.replica
        done = True
        unreadable = False
        for model_id, offset in written.items():
            if _partition_of(model_id) not in self.owned or _partition_of(model_id) in self.fenced:
                done = False  # fenced meanwhile by another model of its partition
                continue
            epoch = self.epochs.get(model_id, -1)
            if unreadable:  # (not one read timing out per model: see publish)
                self._unverified[model_id] = max(offset, self._unverified.get(model_id, offset))
                done = False
                continue
            try:
                newest = self.store.newest_epoch(model_id, offset)
            except StateStoreError as exc:
                self._unverified[model_id] = max(offset, self._unverified.get(model_id, offset))
                log.error("the state topic could not be read back after publishing model %s "
                          "(%s); its partition's offsets are not committed until it is",
                          model_label(model_id), exc)
                done = False
                unreadable = True
                continue
            self._unverified.pop(model_id, None)
            if newest > epoch:
                outcomes.labels(outcome="stale").inc()
                self._fence(model_id, StaleEpochError(
                    f"state topic {self.store.topic}: model {model_label(model_id)} has epoch "
                    f"{newest}, claimed by another process since; this one has epoch {epoch}"))
                done = False
        return done

    def _publish_one(self, model_id: ModelId, live: _Live,
                     written: dict[ModelId, int] | None = None) -> bool | None:
        """Publish one model's state; with ``written``, its offset is recorded there for the
        caller to read back (:meth:`_still_newest`), otherwise it is read back here. False
        when it is not published, None when that is because the state topic did not answer
        (both falsy)."""
        _, outcomes, _, _ = self.metrics.replica
        processor = live.processor
        if live.undelivered:
            # Its state would run ahead of the outputs delivered (see _Live.undelivered).
            return False
        try:
            offset, epoch, sequence = self._write_state(
                model_id, *self.state_of(model_id, processor))
        except StaleEpochError as exc:
            outcomes.labels(outcome="stale").inc()
            self._fence(model_id, exc)
            return False
        except (StateStoreError, ValueError) as exc:
            outcomes.labels(outcome="failed").inc()
            log.error("publishing the state of model %s failed (%s); its partition's offsets "
                      "are not committed until it succeeds", model_label(model_id), exc)
            return None if isinstance(exc, StateStoreError) else False
        outcomes.labels(outcome="published").inc()
        self._stated.add(model_id[0])
        processor.generation = f"{epoch}.{sequence}"
        live.dirty = False
        if written is not None:
            written[model_id] = offset
            return True
        return self._still_newest({model_id: offset})

    def _write_state(self, model_id: Any, arrays: dict[str, np.ndarray],
                     metadata: dict[str, Any], next_offset: int) -> tuple[int, int, int]:
        """Write the next state of a model, or of a partition's record, under this ownership's
        epoch (claimed at its first write): ``(offset, epoch, sequence)``. StaleEpochError
        when another process took a newer epoch since; the store's StateStoreError or
        ValueError otherwise."""
        self._record_group()
        epoch = self.epochs.get(model_id)
        if epoch is None:
            epoch = self.epochs[model_id] = self.store.claim_epoch(
                model_id, newest_known=self.known_epochs.get(model_id, -1))
            self.sequences[model_id] = 0
        sequence = self.sequences[model_id] + 1
        offset = self.store.publish(model_id, arrays, metadata, next_offset, epoch, sequence)
        self.sequences[model_id] = sequence
        return offset, epoch, sequence

    def _fence(self, model_id: ModelId, error: StaleEpochError) -> None:
        """Another process claimed the model first. Either this one lost its partition in a
        rebalance it has not seen yet, or that one did and claimed it still (a zombie): only
        the consumer group can tell. Meanwhile the whole partition is given up here, its
        models dropped unpublished and nothing of it handled or committed, so whichever
        process the group names resumes from the last commit with the models' published
        states, and learns again what they do not hold. (Rebuilding the model from its last
        state and going on would lose what it learned since: a process owning the partition
        would publish a state past records that state lacks.)"""
        partition = _partition_of(model_id)
        log.warning("%s: partition %d given up here (another process claimed its model %s); "
                    "rejoining the consumer group, whose assignment says who owns it",
                    error, partition, model_label(model_id))
        self._let_go({partition}, retain=False)
        self.fenced.add(partition)

    def committable(self, partitions: set[int] | None = None) -> dict[str, int]:
        """Next offsets safe to commit: those of the owned partitions whose models are all
        published, and of which the state topic holds a model (``_stated``) or, for a
        partition without one, a record that covers them."""
        blocked = {m[0] for m, live in self.live.items() if live.dirty}
        blocked |= {_partition_of(m) for m in self._unverified}
        return {
            name: offset for name, offset in self.positions.items()
            if (partition := _topic_partition(name)[1]) in self.owned
            and partition not in blocked
            and (partition in self._stated
                 or offset <= self._recorded.get(partition, {}).get(name, -1))
            and (partitions is None or partition in partitions)
            and self.committed.get(name) != offset
        }

    def mark_committed(self, offsets: dict[str, int]) -> None:
        """Record offsets the group accepted (of partitions still owned)."""
        self.committed.update({name: offset for name, offset in offsets.items()
                               if _topic_partition(name)[1] in self.owned})

    def dirty(self) -> int:
        return sum(live.dirty for live in self.live.values())

    def _gauge(self) -> None:
        self.metrics.scale_out[0].set(len(self.live))

    # -- summary ---------------------------------------------------------------------------

    def processors(self) -> list[Processor]:
        return [live.processor for live in self.live.values()]
