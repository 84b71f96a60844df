"""Model state on a compacted Kafka topic: the changelog half of a state store.

Several daemon processes in one consumer group share a topic's partitions and each owns one
model per partition (or per message key). When partitions move, the new owner restores each
model from a compacted *state topic* (the design of Kafka Streams' changelogs): it reads the
topic to its end, takes the newest complete state of every model, and from then on publishes
its own states there.

A *state* is a model's arrays (an ``.npz`` written by ``np.savez``; no object arrays, so nothing
is ever pickled or unpickled) together with a JSON-able ``metadata`` dict (stored as the member
``__meta__`` of the archive) and the ``next_offset`` the model resumes reading from. It is cut
into chunks of at most ``max_record_bytes`` (header included), one record each.

Keys, and why no crash can leave a model without a state
    Compaction keeps only the newest record of each key. A chunk's key is the canonical JSON of
    ``{"chunk": i, "epoch": e, "model": model_id, "slot": sequence % 2}`` (sorted keys, no
    spaces, ASCII: every writer produces the same bytes for the same key). Consecutive
    sequences of one epoch use different slots (double buffering): a publish of sequence s that
    dies half-way can only damage the keys of slot s % 2, and sequence s - 1 stays whole in the
    other slot. Each epoch has keys of its own, so two owners never overwrite each other.
    A new owner also writes a *claim* record, key
    ``{"claim": true, "epoch": e, "model": model_id, "owner": "<token>.<count>"}`` (see
    :meth:`StateStore.claim_epoch`), so that its epoch is taken even before its first state.
    ``token`` names the store that wrote it (random per store, :attr:`StateStore.owner_token`),
    so that a store recognizes its own claim when a claim's acknowledgement was lost and it
    claims again; ``count`` numbers that store's claims. Every claim record thus has a key
    of its own, and compaction removes none: the first claim of an epoch, which won it,
    stays the first one read, also when another owner's losing claim or a retry of the
    winner's own came after it. Claim keys without ``owner``, as earlier versions of this
    module wrote them, are still read (their value names the owner); those versions do not
    read the new keys, so every process sharing a state topic must run a version that
    writes them.

Values
    ``b"SSVS"``, one byte format version, a 4-byte big-endian header length, the header (UTF-8
    JSON: kind, model, epoch, sequence, slot, chunk, chunks, size, sha256 of the whole payload,
    next_offset), then the chunk's bytes. A claim's header has kind ``claim`` and no bytes.

Reading
    :meth:`StateStore.restore` reads every partition from its beginning to the end offsets
    taken when the call starts, in whole record batches (Tansu 0.6.0 reports as end offset the
    last batch's base offset + 1, short of the batch's other records). It keeps the newest
    record of each key (what compaction would leave, so the answer is the same before and after
    the broker compacts), assembles each (model, epoch, slot) from its chunks, checks count,
    size and sha256, and returns per model the complete state with the highest epoch, then the
    highest sequence. Incomplete or corrupt states are skipped, counted in
    :attr:`StateStore.last_report` and logged; never returned.

Fencing of zombies
    A process that lost its partitions (paused, session timeout, reassignment) may wake up and
    publish again with its old epoch. The new owner took a higher epoch (:meth:`claim_epoch`, or
    :meth:`next_epoch` after :meth:`restore`), and readers take the highest epoch first, so the
    zombie's states are ignored; since each epoch has its own keys, the zombie cannot overwrite
    the new owner's records either. Besides, :meth:`publish` raises :class:`StaleEpochError`,
    producing nothing, when this store has already seen a higher epoch of that model; an owner
    learns of one by :meth:`newest_epoch`, reading on to its own publish. After each
    complete state, an owner tombstones the keys of older epochs it has seen (and chunks left
    over in the slot it wrote), so that once compacted the topic holds one epoch's two slots
    and claims per model (its owner's, and any that lost the race for it); a zombie's writes
    after that stay until an owner reads them.

    Kafka transactions were considered and are not used. Tested with kafka-python 3.0.12 on
    the embedded broker (Tansu 0.6.0): ``init_transactions`` with a ``transactional_id`` works
    and fences the older producer of the same id (its next send fails with
    ProducerFencedError), but a ``read_committed`` consumer still receives the records of an
    aborted transaction, so transactions would not make a chunked publish atomic there; the
    checksums and double buffering are needed anyway. Broker-side fencing would also need one
    transactional producer per model (thousands with per-key models, each with its own
    ``init_transactions`` round trips), and the memory-only broker forgets producer ids when it
    restarts (the daemon disables idempotence for that reason). Epochs in the keys cost nothing,
    work on any broker and survive a broker that lost its state.

Compaction on the embedded broker
    Tansu 0.6.0 accepts ``cleanup.policy=compact`` when the topic is created and reports it back
    (DescribeConfigs), but does not compact: every record stays (tested: 2,000 records on 3 keys,
    created with segment.ms=100 and min.cleanable.dirty.ratio=0.01, were all still there 5 s
    later). Nothing here depends on compaction having run; on a real Kafka
    cluster it bounds the topic's size.

Limits
    All records of a model go to one partition (a hash of its id), so the partition count of the
    state topic must not change once states are written (as for Kafka Streams' changelogs).
    :meth:`next_epoch` is only as fresh as this store's last read of the topic.

>>> store = StateStore("127.0.0.1:9092", "svm-state", timeout=10)   # doctest: +SKIP
>>> store.ensure_topic(partitions=3)                                 # doctest: +SKIP
>>> states = store.restore()                                         # doctest: +SKIP
>>> epoch = store.claim_epoch([3, None])                             # doctest: +SKIP
>>> store.publish([3, None], {"alpha": np.zeros(4)}, {"C": 1.0},     # doctest: +SKIP
...               next_offset=1200, epoch=epoch, sequence=1)
>>> store.restore([[3, None]])[(3, None)].next_offset                # doctest: +SKIP
1200
>>> store.close()                                                    # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import logging
import struct
import time
import uuid
import zipfile
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = [
    "FORMAT_VERSION",
    "RestoreReport",
    "StaleEpochError",
    "StateFromNewerVersion",
    "StateStore",
    "StateStoreError",
    "StoredState",
    "chunk_key",
    "claim_key",
    "decode_state",
    "encode_state",
    "normalize_model_id",
]

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
_MAGIC = b"SSVS"
#: magic, format version, length of the JSON header that follows
_PREFIX = struct.Struct(">4sBI")
_META = "__meta__"
#: ``np.savez`` takes these as its own arguments: arrays may not be named like them.
_RESERVED = frozenset({_META, "file", "allow_pickle"})
#: Array kinds a state may hold: booleans, integers, floats, complex numbers and text.
_KINDS = "biufcSU"
#: Values are chunked below this (a 1 MiB broker limit minus key and batch overhead).
DEFAULT_MAX_RECORD_BYTES = 900_000
_MIN_RECORD_BYTES = 4096
#: Fields every chunk of one state carries with the same value.
_STATE_FIELDS = ("sequence", "chunks", "size", "sha256", "next_offset")


class StateStoreError(RuntimeError):
    """The state topic could not be read or written (the message names the topic)."""


class StateFromNewerVersion(StateStoreError):
    """The state topic holds a model's record in a format newer than this stream-svm reads
    (written after an upgrade that was then rolled back). Nothing of the model is read rather
    than the record skipped: its older state, or none, would have taken its place."""


class _NotWhole(StateStoreError):
    """A state's records are no longer whole where this store indexed them."""


class StaleEpochError(StateStoreError):
    """A publish with an epoch older than one this store has seen for the model: another
    process owns the model now. Nothing was produced."""


@dataclass(frozen=True)
class StoredState:
    """One model's state as restored: its arrays, metadata and the offset it resumes from.

    ``location`` is ``(partition, first offset, last offset)`` of its chunks in the topic; a
    state restored with ``decode=False`` has its metadata but empty ``arrays`` until
    :meth:`StateStore.fetch` reads them from there."""

    arrays: dict[str, np.ndarray]
    metadata: dict[str, Any]
    next_offset: int
    epoch: int
    sequence: int
    location: tuple[int, int, int] | None = None


@dataclass
class RestoreReport:
    """What the last read of the topic found (for logs and metrics)."""

    records: int = 0
    tombstones: int = 0
    #: complete states found (every slot of every epoch; older ones included)
    complete: int = 0
    #: states with chunks missing or with chunks of different writes (a publish that died)
    incomplete: int = 0
    #: records or states that do not parse, fail the checksum, or do not load
    corrupt: int = 0
    models: int = 0
    seconds: float = 0.0


def normalize_model_id(model_id: Any) -> Hashable:
    """The hashable form of a model id: JSON arrays become tuples (``[3, "a"]`` ->
    ``(3, "a")``). Ids are None, int, str, or lists/tuples of those (nested allowed); floats and
    booleans are refused because ``1.0``, ``True`` and ``1`` are equal in Python but not in
    JSON, so they would map one model to several keys.

    >>> normalize_model_id([3, "gauge-17"]), normalize_model_id([3, None])
    ((3, 'gauge-17'), (3, None))
    """
    if model_id is None or isinstance(model_id, str):
        return model_id
    if isinstance(model_id, int) and not isinstance(model_id, bool):
        return model_id
    if isinstance(model_id, (list, tuple)):
        return tuple(normalize_model_id(part) for part in model_id)
    raise TypeError(
        f"a model id is None, an int, a str or a list of those, not {type(model_id).__name__}: "
        f"{model_id!r}"
    )


def _jsonable_id(model_id: Hashable) -> Any:
    return [_jsonable_id(p) for p in model_id] if isinstance(model_id, tuple) else model_id


def _canonical(document: Mapping[str, Any]) -> bytes:
    # Compaction compares key bytes: one key must always serialize to the same bytes.
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def chunk_key(model_id: Any, epoch: int, sequence: int, chunk: int) -> bytes:
    """The record key of chunk ``chunk`` of state ``(epoch, sequence)`` of a model.

    >>> chunk_key([3, "gauge-17"], 2, 7, 0)
    b'{"chunk":0,"epoch":2,"model":[3,"gauge-17"],"slot":1}'
    """
    model = _jsonable_id(normalize_model_id(model_id))
    return _canonical({"chunk": chunk, "epoch": epoch, "model": model, "slot": sequence % 2})


def claim_key(model_id: Any, epoch: int, owner: str | None = None) -> bytes:
    """The record key of a claim of ``epoch`` for a model (see :meth:`StateStore.claim_epoch`).
    ``owner`` is the writing store's :attr:`StateStore.owner_token`, a dot and the number of
    that store's claim (one key per claim record); without it, the key that earlier versions
    gave every claim of the epoch.

    >>> claim_key([3, None], 1, "9f0c.2")
    b'{"claim":true,"epoch":1,"model":[3,null],"owner":"9f0c.2"}'
    """
    model = _jsonable_id(normalize_model_id(model_id))
    document: dict[str, Any] = {"claim": True, "epoch": epoch, "model": model}
    if owner is not None:
        if not isinstance(owner, str) or not owner:
            raise ValueError(f"a claim's owner is a non-empty string, not {owner!r}")
        document["owner"] = owner
    return _canonical(document)


@dataclass(frozen=True)
class _Key:
    model: Hashable
    epoch: int
    slot: int | None  # None for a claim
    chunk: int | None
    owner: str | None = None  # a claim's owner token, when its key names it


def _parse_key(raw: bytes | None) -> _Key | None:
    """The parsed key, or None for a key this module did not write."""
    if raw is None:
        return None
    try:
        document = json.loads(raw)
        if not isinstance(document, dict) or _canonical(document) != bytes(raw):
            return None
        model = normalize_model_id(document["model"])
        epoch = document["epoch"]
        if not _is_count(epoch):
            return None
        if set(document) == {"claim", "epoch", "model"} and document["claim"] is True:
            return _Key(model, epoch, None, None)
        if set(document) == {"claim", "epoch", "model", "owner"} and document["claim"] is True:
            owner = document["owner"]
            if not isinstance(owner, str) or not owner:
                return None
            return _Key(model, epoch, None, None, owner)
        if set(document) != {"chunk", "epoch", "model", "slot"}:
            return None
        slot, chunk = document["slot"], document["chunk"]
        if slot not in (0, 1) or not _is_count(chunk):
            return None
        return _Key(model, epoch, slot, chunk)
    except (ValueError, TypeError, KeyError):
        return None


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _encode_value(header: Mapping[str, Any], data: bytes = b"") -> bytes:
    head = _canonical(header)
    return _PREFIX.pack(_MAGIC, FORMAT_VERSION, len(head)) + head + data


def _decode_value(raw: bytes) -> tuple[dict[str, Any], bytes]:
    """``(header, data)`` of a record value; raises ValueError when it is not one of ours."""
    if len(raw) < _PREFIX.size:
        raise ValueError("shorter than the value prefix")
    magic, version, length = _PREFIX.unpack_from(raw)
    if magic != _MAGIC:
        raise ValueError("no state-store magic")
    if version > FORMAT_VERSION:
        raise StateFromNewerVersion(
            f"format version {version}, written by a newer stream-svm; this one reads "
            f"{FORMAT_VERSION}: run the stream-svm that wrote it")
    if version != FORMAT_VERSION:
        raise ValueError(f"format version {version}; this stream-svm reads {FORMAT_VERSION}")
    end = _PREFIX.size + length
    if end > len(raw):
        raise ValueError("header runs past the end of the record")
    header = json.loads(raw[_PREFIX.size : end].decode("utf-8"))
    if not isinstance(header, dict):
        raise ValueError("header is not a JSON object")
    return header, bytes(raw[end:])


def _encode_payload(arrays: Mapping[str, np.ndarray], metadata: Mapping[str, Any]) -> bytes:
    if not isinstance(metadata, Mapping):
        raise TypeError(f"metadata must be a dict, not {type(metadata).__name__}")
    members: dict[str, np.ndarray] = {}
    for name, array in arrays.items():
        if not isinstance(name, str) or not name or name in _RESERVED:
            raise ValueError(f"an array may not be named {name!r}")
        array = np.asarray(array)
        dtype = array.dtype
        # np.savez pickles object arrays: refusing them here means nothing is ever pickled.
        if dtype.hasobject or dtype.fields is not None or dtype.kind not in _KINDS:
            raise ValueError(f"array {name!r} has dtype {dtype}, not a plain number or text type")
        members[name] = array
    try:
        meta = json.dumps(dict(metadata), allow_nan=False, sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"metadata is not JSON-serializable: {exc}") from None
    members[_META] = np.frombuffer(meta.encode("utf-8"), dtype=np.uint8)
    buffer = io.BytesIO()
    np.savez(buffer, **members)
    return buffer.getvalue()


def _decode_payload(payload: bytes, *, arrays: bool = True
                    ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Arrays (none unless ``arrays``) and metadata of a payload whose checksum was verified;
    raises on a bad one."""
    with np.load(io.BytesIO(payload), allow_pickle=False) as archive:
        if not isinstance(archive, np.lib.npyio.NpzFile) or _META not in archive.files:
            raise ValueError(f"the archive has no {_META} member")
        members = archive.files if arrays else []
        found = {name: archive[name] for name in members if name != _META}
        raw_meta = archive[_META]
    if raw_meta.dtype != np.uint8 or raw_meta.ndim != 1:
        raise ValueError(f"malformed {_META} member")
    metadata = json.loads(raw_meta.tobytes().decode("utf-8"))
    if not isinstance(metadata, dict):
        raise ValueError("the metadata is not a JSON object")
    return found, metadata


def encode_state(arrays: Mapping[str, np.ndarray], metadata: Mapping[str, Any]) -> bytes:
    """A state's payload as the store writes it (an ``.npz`` without object arrays), e.g. to
    keep a copy on local disk."""
    return _encode_payload(arrays, metadata)


def decode_state(payload: bytes) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Arrays and metadata of :func:`encode_state`'s payload (never unpickled); raises
    ValueError, OSError or zipfile.BadZipFile on a bad one."""
    return _decode_payload(payload)


@dataclass
class _ModelView:
    """What this store knows of one model's records in the topic."""

    max_epoch: int = -1
    #: keys whose newest record is not a tombstone
    live: dict[bytes, _Key] = field(default_factory=dict)
    #: epoch -> highest sequence with a complete state
    complete: dict[int, int] = field(default_factory=dict)
    #: the newest state this store published or restored (arrays not kept), for fetch()
    newest: StoredState | None = None
    #: the highest epoch a claim of the model was read for, and whether the first claim of it
    #: (the one that won it) is this store's own: all that claiming again needs to know
    claimed_epoch: int = -1
    claimed_here: bool = False


@dataclass(frozen=True)
class _Record:
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None


class StateStore:
    """Publishes and restores model states on one compacted Kafka topic.

    ``timeout`` (seconds) bounds every operation that waits for the broker: connecting,
    reading the topic to its end, and each flush. ``client_options`` are kafka-python settings
    (security, ``client_id``, ...) handed to each client that knows them; they may not weaken
    ``acks="all"``. Use it as a context manager, or call :meth:`close`. It is not thread-safe:
    one store per thread (or a lock around it).

    >>> with StateStore("127.0.0.1:9092", "svm-state") as store:   # doctest: +SKIP
    ...     store.ensure_topic()
    ...     store.publish("m", {"w": np.ones(3)}, {}, next_offset=0, epoch=0, sequence=1)
    ...     store.restore()["m"].sequence
    1
    """

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str,
        *,
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
        client_options: dict[str, Any] | None = None,
        timeout: float = 30.0,
    ) -> None:
        if not topic:
            raise ValueError("the state topic needs a name")
        if max_record_bytes < _MIN_RECORD_BYTES:
            raise ValueError(
                f"max_record_bytes must be at least {_MIN_RECORD_BYTES}, got {max_record_bytes}"
            )
        if not timeout > 0:
            raise ValueError(f"timeout must be positive, got {timeout}")
        options = dict(client_options or {})
        if options.get("acks", "all") not in ("all", -1):
            raise ValueError("a state store publishes with acks='all'; client_options may not "
                             f"set acks={options['acks']!r}")
        self.bootstrap_servers = bootstrap_servers
        self.topic = topic
        self.max_record_bytes = max_record_bytes
        self.timeout = float(timeout)
        self.client_options = options
        self.last_report = RestoreReport()
        #: the topic's id as of the last full read (None: unknown; the broker keeps none)
        self.topic_id: str | None = None
        self._views: dict[Hashable, _ModelView] = {}
        #: per partition, the offset up to which this store has read the topic
        self._read_until: dict[int, int] = {}
        #: a full read that ran out of time: the records read so far, per partition, and where
        #: its read stands (None: unknown), for the next full read to go on from. Each attempt
        #: had started again at offset 0: once the whole topic took longer to read than the
        #: timeout, no attempt ever finished, and a group could never take its partitions.
        self._partial_read: _PartialRead | None = None
        #: what :meth:`follow` read last: the model, where the read ended, its records
        self._followed: _Followed | None = None
        #: whether the last full read went on from ``start_at`` instead of offset 0
        self._read_went_on = False
        #: per partition, where the last read ended
        self._last_positions: dict[int, int] = {}
        #: what a read of :meth:`follow` that ran out of time had read, and where it stood
        self._late_follow: _OutOfTime | None = None
        #: models whose state was looked for in the whole topic in vain: when to look again
        self._reindex_after: dict[Hashable, float] = {}
        #: what :meth:`index` knows of the topic and where its last read ended
        self._index: _Index | None = None
        #: per partition, the end offset the last read of the whole topic was taken to
        self._last_ends: dict[int, int] = {}
        self._partition_count: int | None = None
        self._producer: Any = None
        self._closed = False
        #: written in this store's claims: its own claims are told from other owners' by it
        self._owner_token = uuid.uuid4().hex
        #: claim records this store has written (numbered in their keys)
        self._claims_written = 0
        self._check_options()

    @property
    def owner_token(self) -> str:
        """This store's random token (hex digits), written in the keys of its claims (see
        :func:`claim_key`): how it tells its own claims from other owners'."""
        return self._owner_token

    # ----------------------------------------------------------------- clients

    def _client_settings(self, client_class: Any, deadline: float) -> dict[str, Any]:
        remaining_ms = max(1, int(self._remaining(deadline) * 1000))
        timeout_ms = int(self.timeout * 1000)
        settings: dict[str, Any] = {
            "bootstrap_servers": self.bootstrap_servers.split(","),
            # kafka-python 3 blocks a client's construction for bootstrap_timeout_ms (30 s by
            # default, whatever request_timeout_ms says): bound it by this operation's time.
            "bootstrap_timeout_ms": remaining_ms,
            "request_timeout_ms": timeout_ms,
            # Its reconnect backoff grows to 30 s by default, longer than a bounded wait.
            "reconnect_backoff_max_ms": 1000,
        }
        settings.update(
            {k: v for k, v in self.client_options.items() if k in client_class.DEFAULT_CONFIG}
        )
        return settings

    def _check_options(self) -> None:
        from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer

        known = (
            set(KafkaProducer.DEFAULT_CONFIG)
            | set(KafkaConsumer.DEFAULT_CONFIG)
            | set(KafkaAdminClient.DEFAULT_CONFIG)
        )
        unknown = sorted(set(self.client_options) - known)
        if unknown:
            raise ValueError(f"client_options has settings no kafka-python client knows: {unknown}")

    def _remaining(self, deadline: float) -> float:
        return max(0.0, deadline - time.monotonic())

    def _deadline(self) -> float:
        if self._closed:
            raise StateStoreError(f"state topic {self.topic}: the store is closed")
        return time.monotonic() + self.timeout

    def _fail(self, doing: str, exc: BaseException) -> StateStoreError:
        return StateStoreError(
            f"state topic {self.topic} at {self.bootstrap_servers}: {doing} failed: "
            f"{type(exc).__name__}: {exc}"
        )

    def _producer_for(self, deadline: float) -> Any:
        if self._producer is None:
            from kafka import KafkaProducer
            from kafka.errors import KafkaError

            settings = self._client_settings(KafkaProducer, deadline)
            settings.update(
                acks="all",
                max_block_ms=int(self.timeout * 1000),
                delivery_timeout_ms=int(self.timeout * 1000) + 100,
                linger_ms=0,
                max_request_size=max(1_048_576, self.max_record_bytes + 65_536),
                # One request in flight keeps a model's records in the order they were sent.
                # An idempotent producer adds nothing to that, and its producer id does not
                # survive a memory-only broker's restart (every later send then fails).
                max_in_flight_requests_per_connection=1,
                enable_idempotence=False,
            )
            try:
                producer = KafkaProducer(**settings)
            except (KafkaError, OSError) as exc:
                raise self._fail(f"connecting within {self.timeout:g} s", exc) from exc
            _forbid_auto_creation(producer)
            self._producer = producer
        return self._producer

    def _consumer_for(self, deadline: float) -> Any:
        from kafka import KafkaConsumer
        from kafka.errors import KafkaError

        settings = self._client_settings(KafkaConsumer, deadline)
        settings.update(
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            allow_auto_create_topics=False,
            isolation_level="read_uncommitted",
            max_partition_fetch_bytes=max(1_048_576, self.max_record_bytes + 65_536),
            # kafka-python refuses a fetch wait that is not below the request timeout.
            fetch_max_wait_ms=max(1, min(100, settings["request_timeout_ms"] - 1)),
        )
        try:
            consumer = KafkaConsumer(**settings)
        except (KafkaError, OSError) as exc:
            raise self._fail(f"connecting within {self.timeout:g} s", exc) from exc
        _forbid_auto_creation(consumer)
        return consumer

    def close(self) -> None:
        """Close the producer (within ``timeout``). Further calls raise StateStoreError."""
        self._closed = True
        producer, self._producer = self._producer, None
        if producer is not None:
            try:
                producer.close(timeout=self.timeout)
            except Exception as exc:  # closing must not hide the caller's own error
                log.warning("state topic %s: closing the producer: %s", self.topic, exc)

    def __enter__(self) -> StateStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ------------------------------------------------------------------- topic

    def _admin_for(self, deadline: float) -> Any:
        """An admin client of the broker (StateStoreError when it cannot connect in time)."""
        from kafka import KafkaAdminClient
        from kafka.errors import KafkaError

        try:
            return KafkaAdminClient(**self._client_settings(KafkaAdminClient, deadline))
        except (KafkaError, OSError) as exc:
            raise self._fail(f"connecting within {self.timeout:g} s", exc) from exc

    def topic_exists(self) -> bool:
        """Whether the topic exists (StateStoreError when the broker cannot tell)."""
        from kafka.errors import KafkaError

        admin = self._admin_for(self._deadline())
        try:
            return self.topic in set(admin.list_topics())
        except KafkaError as exc:
            raise self._fail("listing the topics", exc) from exc
        finally:
            admin.close()

    def ensure_topic(self, partitions: int = 1, replication_factor: int = 1) -> bool:
        """Create the topic with ``cleanup.policy=compact`` (and ``segment.ms`` of an hour, so
        that compaction reaches all but the last hour's states) if it is missing (True then); an
        existing topic is left as it is (a warning is logged when it does not report
        ``compact``).

        Tansu 0.6.0 (the embedded broker) accepts the setting and reports it back, but never
        compacts: every record stays until the broker stops. Reading does not depend on it.
        """
        from kafka.admin import ConfigResource, ConfigResourceType
        from kafka.errors import KafkaError, TopicAlreadyExistsError

        deadline = self._deadline()
        admin = self._admin_for(deadline)
        try:
            if self.topic not in set(admin.list_topics()):
                spec = {
                    "num_partitions": partitions,
                    "replication_factor": replication_factor,
                    # Kafka compacts only closed segments, which roll after a week or a
                    # gigabyte by default: the states of a week would be read by every
                    # restore and rebalance. An hour bounds the uncompacted head.
                    "configs": {"cleanup.policy": "compact",
                                "segment.ms": str(STATE_SEGMENT_MS)},
                }
                try:
                    admin.create_topics(
                        {self.topic: spec},
                        timeout_ms=max(1, int(self._remaining(deadline) * 1000)),
                    )
                    # A created topic shows in the metadata a little later on a real cluster;
                    # the next publish or restore would take it for missing.
                    admin.wait_for_topics(
                        [self.topic], timeout_ms=max(1, int(self._remaining(deadline) * 1000))
                    )
                    log.info("created the state topic %s (%d partitions, compacted)",
                             self.topic, partitions)
                    return True
                except TopicAlreadyExistsError:
                    pass  # another process created it meanwhile: as for an existing topic
            try:
                # Name no config: Tansu 0.6.0 drops the connection when configs are named.
                described = admin.describe_configs(
                    [ConfigResource(ConfigResourceType.TOPIC, self.topic)], config_filter="all"
                )
                policy = described.get("topic", {}).get(self.topic, {}).get("cleanup.policy", {})
            except KafkaError as exc:
                log.debug("state topic %s: its configuration is unknown: %s", self.topic, exc)
                return False
            if "compact" not in str(policy.get("value", "")).split(","):
                log.warning(
                    "the state topic %s exists with cleanup.policy=%s, not compact: it keeps "
                    "every state ever published", self.topic, policy.get("value", "(unset)")
                )
            return False
        except KafkaError as exc:
            raise self._fail("creating the topic", exc) from exc
        finally:
            admin.close()

    def _partitions(self, deadline: float) -> int:
        """The topic's partition count (cached: it must not change, see the module's doc).
        A missing topic is an error at once: it is never created by a write (the clients ask
        the broker not to), since an auto-created topic would not be compacted."""
        if self._partition_count is None:
            from kafka.errors import KafkaError

            consumer = self._consumer_for(deadline)
            try:
                found = consumer.partitions_for_topic(self.topic)
            except KafkaError as exc:
                raise self._fail("reading the topic's metadata", exc) from exc
            finally:
                _close_consumer(consumer, self.topic)
            if not found:
                raise self._missing()
            self._partition_count = len(found)
        return self._partition_count

    def _missing(self) -> StateStoreError:
        return StateStoreError(
            f"state topic {self.topic} does not exist at {self.bootstrap_servers}; create it "
            "first (StateStore.ensure_topic creates it with compaction)"
        )

    def partition_of(self, model_id: Any, partitions: int) -> int:
        """The partition holding every record of a model (a stable hash of its id)."""
        model = _jsonable_id(normalize_model_id(model_id))
        digest = hashlib.sha256(_canonical({"model": model})).digest()
        return int.from_bytes(digest[:8], "big") % partitions

    # --------------------------------------------------------------- producing

    def _send(self, key: bytes, value: bytes | None, partition: int) -> Any:
        """Hand one record to the producer (one place to intercept in tests)."""
        return self._producer.send(self.topic, key=key, value=value, partition=partition)

    def _send_all(
        self, records: Iterable[tuple[bytes, bytes | None]], partition: int, deadline: float,
        doing: str,
    ) -> list[Any]:
        """Send and flush; returns the record metadata, or raises StateStoreError."""
        from kafka.errors import KafkaError

        producer = self._producer_for(deadline)
        try:
            futures = [self._send(key, value, partition) for key, value in records]
            producer.flush(timeout=self._remaining(deadline))
        except KafkaError as exc:
            raise self._fail(doing, exc) from exc
        results = []
        for future in futures:
            if not future.is_done:
                raise StateStoreError(
                    f"state topic {self.topic} at {self.bootstrap_servers}: {doing} was not "
                    f"acknowledged within {self.timeout:g} s"
                )
            if future.failed():
                raise self._fail(doing, future.exception)
            results.append(future.value)
        return results

    def _chunks(
        self, model: Hashable, payload: bytes, *, epoch: int, sequence: int, next_offset: int,
    ) -> list[tuple[bytes, bytes]]:
        """The ``(key, value)`` records of one state."""
        digest = hashlib.sha256(payload).hexdigest()
        size = len(payload)
        header: dict[str, Any] = {
            "kind": "chunk", "model": _jsonable_id(model), "epoch": epoch,
            "sequence": sequence, "slot": sequence % 2, "chunk": size, "chunks": size + 1,
            "size": size, "sha256": digest, "next_offset": next_offset,
        }
        # The header's length bounded with the largest chunk numbers the payload can need.
        room = self.max_record_bytes - len(_encode_value(header))
        if room < 1024:
            raise ValueError(
                f"max_record_bytes={self.max_record_bytes} leaves {room} bytes per chunk for "
                "this model id: raise it"
            )
        count = max(1, -(-size // room))
        records = []
        for index in range(count):
            header.update(chunk=index, chunks=count)
            data = payload[index * room : (index + 1) * room]
            records.append((chunk_key(model, epoch, sequence, index), _encode_value(header, data)))
        return records

    def publish(
        self,
        model_id: Any,
        arrays: Mapping[str, np.ndarray],
        metadata: Mapping[str, Any],
        next_offset: int,
        epoch: int,
        sequence: int,
    ) -> int:
        """Write one state of a model; returns once every chunk is acknowledged (acks=all),
        with the offset of its last chunk (for :meth:`newest_epoch`).

        ``sequence`` must grow within an epoch. Raises :class:`StaleEpochError` (nothing
        produced) when this store has seen a higher epoch of the model, StateStoreError when
        the broker does not acknowledge within ``timeout``: a publish that fails half-way
        leaves the previous state whole (the other slot). After success, tombstones the keys of
        older epochs (and chunks left over in this slot) that this store has seen.
        """
        model = normalize_model_id(model_id)
        for name, value in (("epoch", epoch), ("sequence", sequence), ("next_offset", next_offset)):
            if not _is_count(value):
                raise ValueError(f"{name} must be an int >= 0, got {value!r}")
        view = self._views.setdefault(model, _ModelView())
        if epoch < view.max_epoch:
            raise StaleEpochError(
                f"state topic {self.topic}: model {_jsonable_id(model)} has epoch "
                f"{view.max_epoch}; a publish with epoch {epoch} comes from a former owner"
            )
        if sequence <= view.complete.get(epoch, -1):
            raise ValueError(
                f"state topic {self.topic}: model {_jsonable_id(model)} epoch {epoch} already "
                f"has sequence {view.complete[epoch]}; sequences must grow within an epoch"
            )
        payload = _encode_payload(arrays, metadata)
        records = self._chunks(
            model, payload, epoch=epoch, sequence=sequence, next_offset=next_offset
        )
        deadline = self._deadline()
        partition = self.partition_of(model, self._partitions(deadline))
        written = self._send_all(
            records, partition, deadline,
            f"publishing model {_jsonable_id(model)} epoch {epoch} sequence {sequence}",
        )
        view.max_epoch = max(view.max_epoch, epoch)
        view.complete[epoch] = sequence
        offsets = [metadata.offset for metadata in written]
        view.newest = StoredState({}, {}, next_offset, epoch, sequence,
                                  (partition, min(offsets), max(offsets)))
        slot = sequence % 2
        for key, _ in records:
            parsed = _parse_key(key)
            assert parsed is not None
            view.live[key] = parsed
        stale = [
            key for key, parsed in view.live.items()
            if parsed.epoch < epoch
            or (parsed.epoch == epoch and parsed.slot == slot and parsed.chunk >= len(records))
        ]
        if stale:
            self._tombstone(model, stale, partition, deadline)
        return max(offsets)

    def last_sequence(self, model_id: Any, epoch: int) -> int:
        """The highest sequence of the model's ``epoch`` this store published whole or read
        whole (-1 for none): a publish that raised after its state was written whole (while
        tombstoning older records) has it."""
        view = self._views.get(normalize_model_id(model_id))
        return -1 if view is None else view.complete.get(epoch, -1)

    def newest_epoch(self, model_id: Any, through_offset: int) -> int:
        """The highest epoch of a model in its partition up to ``through_offset`` (inclusive;
        -1: none), reading on from where this store has read: how an owner learns after a
        publish (which returns that offset) that another owner claimed a newer epoch since.
        The end is an offset this store was acknowledged, never the broker's end offset
        (Tansu 0.6.0's falls short of a batch's last records). It reads the owner's own
        records again, once."""
        model = normalize_model_id(model_id)
        deadline = self._deadline()
        partition = self.partition_of(model, self._partitions(deadline))
        start = self._read_until.get(partition, 0)
        if start <= through_offset:
            self._read(deadline, {partition: (start, through_offset + 1)})
        view = self._views.get(model)
        return -1 if view is None else view.max_epoch

    def _tombstone(self, model: Hashable, keys: list[bytes], partition: int,
                   deadline: float) -> None:
        """Housekeeping after a complete publish: a failure is logged, the keys are retried
        after the next publish."""
        try:
            self._send_all([(key, None) for key in keys], partition, deadline,
                           f"tombstoning {len(keys)} old keys of model {_jsonable_id(model)}")
        except StateStoreError as exc:
            log.warning("%s (retried after the next publish)", exc)
            return
        view = self._views[model]
        for key in keys:
            view.live.pop(key, None)

    def claim_epoch(self, model_id: Any, *, newest_known: int | None = None,
                    at_least: int = 0) -> int:
        """Take the next epoch of a model for this owner and return it.

        Reads the topic first if this store has not read it yet, writes a claim record of
        ``next_epoch(model_id)`` (so that the epoch stays taken even if this owner dies before
        its first state: a later owner will not reuse it while this one may come back as a
        zombie), then reads the model's partition up to the claim: if another owner wrote a
        record of this model with that epoch or a higher one first, raises StaleEpochError.

        ``newest_known``: the highest epoch of the model (-1: none) the caller knew of when it
        was made the model's owner (a consumer group's assignment). An epoch above it, already
        read by this store, was taken by another owner since: the caller may be a former
        owner that has not learned yet that it lost the model, and a claim of the epoch after
        it would let its older state win over the new owner's. StaleEpochError, and nothing
        is written.

        ``at_least``: the lowest epoch to claim, above every epoch the caller published before
        (a state topic recreated empty would start the epochs again at 0, and the predictors,
        which take a state only from a newer epoch, would keep the old model).

        A claim is won by the first claim record of its epoch. After a claim whose
        acknowledgement was lost (StateStoreError, the record written or not), claiming again
        returns the epoch that claim won, when it was written and won it, no state has that
        epoch and it is above ``newest_known`` (made in this ownership; an owner that has since
        taken the model over knew of it and claims above it); a claim of that epoch by another
        owner that came after it lost, and does not count.
        """
        model = normalize_model_id(model_id)
        deadline = self._deadline()
        if not self._read_until:
            self._read(deadline)
        epoch = self.next_epoch(model)
        if ((newest_known is None or epoch - 1 > newest_known)
                and self._claimed_here(model, epoch - 1)):
            # This store's own claim, whose acknowledgement was lost, won the newest epoch,
            # since the caller was given the model. Taking the next one instead would put a
            # former owner that lost its claim's acknowledgement above the owner the group
            # has given the model since. (A claim the caller already knew of when it was
            # given the model again belongs to an earlier ownership: claim above it.)
            return epoch - 1
        if newest_known is not None and epoch - 1 > newest_known:
            raise StaleEpochError(
                f"state topic {self.topic}: another owner took epoch {epoch - 1} of model "
                f"{_jsonable_id(model)} since this owner was given it (it knew of epoch "
                f"{newest_known}); nothing was claimed"
            )
        epoch = max(epoch, at_least)
        partition = self.partition_of(model, self._partitions(deadline))
        header = {"kind": "claim", "model": _jsonable_id(model), "epoch": epoch,
                  "owner": self._owner_token}
        # A key of its own for every claim record, a retry's too: compaction must not replace
        # this store's first claim of the epoch (which may have won it) by a later one.
        self._claims_written += 1
        key = claim_key(model, epoch, f"{self._owner_token}.{self._claims_written}")
        [written] = self._send_all([(key, _encode_value(header))], partition, deadline,
                                   f"claiming epoch {epoch} of model {_jsonable_id(model)}")
        start = self._read_until.get(partition, 0)
        records = self._read(deadline, {partition: (start, written.offset + 1)})
        # The first claim of the epoch, this one or an earlier one of this store whose
        # acknowledgement was lost, wins it: other owners' claims of it after that lost.
        view = self._views.get(model)
        won = view is not None and view.claimed_epoch == epoch and view.claimed_here
        for record in records:
            parsed = _parse_key(record.key)
            if (parsed is not None and parsed.model == model and parsed.epoch >= epoch
                    and record.offset < written.offset
                    and not (won and parsed.slot is None and parsed.epoch == epoch)):
                raise StaleEpochError(
                    f"state topic {self.topic}: another owner took epoch {parsed.epoch} of "
                    f"model {_jsonable_id(model)} before this claim of epoch {epoch}"
                )
        return epoch

    def _claimed_here(self, model: Hashable, epoch: int) -> bool:
        """Whether the first claim of ``epoch`` this store has read is one it wrote itself, and
        no state of that epoch is known (this store publishes only after a claim it saw
        succeed; a state there is another owner's, whose claim keyed without its owner
        compaction may have replaced by a later losing one)."""
        view = self._views.get(model)
        if view is None or view.claimed_epoch != epoch or not view.claimed_here:
            return False
        return not any(key.epoch == epoch and key.slot is not None
                       for key in view.live.values())

    def epochs(self, select: Callable[[Hashable], bool]) -> dict[Hashable, int]:
        """The highest epoch (of states, claims and tombstones, as of this store's last read)
        of every model whose id ``select`` accepts, including models with a claim and no
        state yet."""
        return {model: view.max_epoch for model, view in self._views.items()
                if view.max_epoch >= 0 and select(model)}

    def next_epoch(self, model_id: Any) -> int:
        """1 + the highest epoch of the model in the topic (states, claims and tombstones, as of
        this store's last read; 0 when there is none). Reads the topic if this store has not."""
        if not self._read_until:
            self._read(self._deadline())
        view = self._views.get(normalize_model_id(model_id))
        return 0 if view is None else view.max_epoch + 1

    def delete(self, model_id: Any) -> int:
        """Tombstone every key of a model (read from the topic now); returns how many."""
        model = normalize_model_id(model_id)
        deadline = self._deadline()
        self._read(deadline)
        view = self._views.get(model)
        keys = list(view.live) if view is not None else []
        if keys:
            partition = self.partition_of(model, self._partitions(deadline))
            self._send_all([(key, None) for key in keys], partition, deadline,
                           f"deleting model {_jsonable_id(model)}")
            view.live.clear()  # type: ignore[union-attr]
        return len(keys)

    # ----------------------------------------------------------------- reading

    def _read(self, deadline: float, ranges: dict[int, tuple[int, int]] | None = None,
              *, track: bool = True, start_at: _Followed | None = None) -> list[_Record]:
        """Records of the topic in offset order per partition, and the views updated.

        Without ``ranges``: every partition from its beginning to its end offset as taken now,
        and the views rebuilt from what was read; with ``start_at`` too, from where that read
        ended, the records applied on top of the views, unless the topic is another one now
        (another id, or other partitions: recreated), which is read whole (``_read_went_on``
        says which). With ``ranges``
        (partition -> (start, end)): those records only, applied on top of the views.
        ``track=False`` reads without updating the views or the offsets read so far (a range
        in the middle of the topic: records before it are still unread). ``_last_positions``
        receives where each partition's read ended.
        """
        from kafka import TopicPartition
        from kafka.errors import KafkaError

        self._read_went_on = False
        consumer = self._consumer_for(deadline)
        resumed = None
        try:
            if ranges is None:
                found = consumer.partitions_for_topic(self.topic)
                if not found:
                    raise self._missing()
                self.topic_id = topic_id_of(consumer, self.topic)
                if self._partition_count is None:
                    self._partition_count = len(found)
                tps = [TopicPartition(self.topic, p) for p in sorted(found)]
                ends = consumer.end_offsets(
                    tps, timeout_ms=max(1, int(self._remaining(deadline) * 1000))
                )
                bounds = {tp.partition: (None, ends[tp]) for tp in tps}
                # (Where a read ended may lie past the end offset: Tansu's is the last record
                # batch's base offset + 1.)
                # Without topic ids (brokers before Kafka 2.8) a recreated topic is told by an
                # end offset that went down: on one topic they only grow.
                self._read_went_on = (start_at is not None and start_at.topic_id == self.topic_id
                                      and set(start_at.positions) == set(bounds)
                                      and all(end >= start_at.ends.get(p, 0)
                                              for p, (_, end) in bounds.items()))
                self._last_ends = {p: end for p, (_, end) in bounds.items()}
                if self._read_went_on:
                    assert start_at is not None
                    bounds = {p: (start_at.positions[p], end) for p, (_, end) in bounds.items()}
            else:
                bounds = {p: (start, end) for p, (start, end) in ranges.items()}
                tps = [TopicPartition(self.topic, p) for p in sorted(bounds)]
            if ranges is None and not self._read_went_on:
                # (Only a full read takes it over: the reads of ranges in between, a publish's
                # read-back, a fetch, a read that goes on, leave it for the next full read.)
                resumed, self._partial_read = self._partial_read, None
                if resumed is not None and (resumed.topic_id != self.topic_id
                                            or set(resumed.positions) != set(bounds)):
                    resumed = None  # another topic (recreated) or other partitions: start over
            consumer.assign(tps)
            read_before: dict[int, list[_Record]] = {}
            for tp in tps:
                start = bounds[tp.partition][0]
                if resumed is not None and resumed.positions[tp.partition] is not None:
                    consumer.seek(tp, resumed.positions[tp.partition])
                    read_before[tp.partition] = resumed.records[tp.partition]
                elif start is None:
                    consumer.seek_to_beginning(tp)
                else:
                    consumer.seek(tp, start)
            positions: dict[int, int] = {}
            try:
                records = self._poll_until(consumer, tps, bounds, deadline, positions,
                                           read_before)
            except _OutOfTime as late:
                if ranges is None and not self._read_went_on:
                    self._partial_read = _PartialRead(self.topic_id, late.positions,
                                                      late.records)
                elif self._read_went_on:
                    self._late_follow = late  # (for follow() to keep)
                raise late.error from None
        except KafkaError as exc:
            if resumed is not None and self._partial_read is None:
                self._partial_read = resumed  # (a failure of the broker keeps the progress)
            raise self._fail("reading the topic", exc) from exc
        finally:
            _close_consumer(consumer, self.topic)
        self._last_positions = positions
        if not track:
            return records
        self._apply(records, rebuild=ranges is None and not self._read_went_on)
        for partition, position in positions.items():
            self._read_until[partition] = max(self._read_until.get(partition, 0), position)
        return records

    def _poll_until(self, consumer: Any, tps: list[Any],
                    bounds: dict[int, tuple[int | None, int]], deadline: float,
                    positions: dict[int, int],
                    read_before: dict[int, list[_Record]] | None = None) -> list[_Record]:
        """Poll until every partition's position reached its end; ``positions`` receives the
        final positions. ``read_before`` holds the records an earlier read got, per partition,
        up to where this one was positioned. At the deadline, :class:`_OutOfTime` carries the
        records read and where each partition's read stands."""
        by_partition: dict[int, list[_Record]] = {
            tp.partition: list((read_before or {}).get(tp.partition, ())) for tp in tps}
        pending = set(tps)
        while True:
            for tp in list(pending):
                # The position, not the last record: compacted gaps and transaction markers
                # leave offsets that no record carries.
                position = consumer.position(
                    tp, timeout_ms=max(1, int(self._remaining(deadline) * 1000))
                )
                if position is not None and position >= bounds[tp.partition][1]:
                    pending.discard(tp)
                    positions[tp.partition] = position
                    consumer.pause(tp)  # so that nothing past this position is fetched
            if not pending:
                break
            remaining = self._remaining(deadline)
            if remaining <= 0:
                where = ", ".join(
                    f"partition {tp.partition} at offset {_position_or_unknown(consumer, tp)} "
                    f"of {bounds[tp.partition][1]}" for tp in sorted(pending, key=str)
                )
                error = StateStoreError(
                    f"state topic {self.topic} at {self.bootstrap_servers}: reading to the end "
                    f"did not finish within {self.timeout:g} s ({where}; the next read goes on "
                    "from there)"
                )
                stands: dict[int, int | None] = dict(positions)
                for tp in pending:
                    try:
                        stands[tp.partition] = consumer.position(tp, timeout_ms=100)
                    except Exception:  # (not known: that partition is read again)
                        stands[tp.partition] = None
                raise _OutOfTime(error, stands, by_partition)
            polled = consumer.poll(timeout_ms=max(1, int(min(0.2, remaining) * 1000)))
            for tp, batch in polled.items():
                # Every record fetched is kept, also those past the end offset: Tansu 0.6.0
                # reports as end offset the last record batch's base offset + 1, so the end
                # of the last batch lies beyond it. Records written after the call started
                # are newer states (or parts of one, skipped as incomplete): harmless.
                by_partition[tp.partition] += [
                    _Record(tp.partition, r.offset, r.key, r.value) for r in batch
                ]
        return [record for p in sorted(by_partition) for record in by_partition[p]]

    def _apply(self, records: list[_Record], rebuild: bool) -> None:
        """Update the views from records read in offset order."""
        live: dict[Hashable, dict[bytes, _Key]] = {}
        for record in records:
            parsed = _parse_key(record.key)
            if parsed is None:
                continue
            view = self._views.setdefault(parsed.model, _ModelView())
            view.max_epoch = max(view.max_epoch, parsed.epoch)
            if (parsed.slot is None and record.value is not None
                    and parsed.epoch > view.claimed_epoch):
                # (A claim whose owner cannot be read counts as another owner's.)
                view.claimed_epoch = parsed.epoch
                owner = (parsed.owner.split(".")[0] if parsed.owner is not None
                         else _claim_owner(record))
                view.claimed_here = owner == self._owner_token
            keys = live.setdefault(parsed.model, {}) if rebuild else view.live
            if record.value is None:
                keys.pop(bytes(record.key), None)
            else:
                keys[bytes(record.key)] = parsed
        if rebuild:
            for model, view in self._views.items():
                view.live = live.get(model, {})

    def restore(self, model_ids: Iterable[Any] | None = None, *,
                select: Callable[[Hashable], bool] | None = None, decode: bool = True,
                log_level: int = logging.INFO) -> dict[Hashable, StoredState]:
        """The newest complete state of each model (or of ``model_ids`` only, or of the models
        whose id ``select`` accepts) in the topic. ``log_level`` is that of the summary line
        (a reader that polls every second lowers it). With ``decode=False`` the states come
        with their metadata but without their arrays (checksums verified, nothing else
        unpacked), to be read one at a time with :meth:`fetch` (memory for one model, not for
        all of them).

        Reads every partition from its beginning to the end offsets taken when the call starts
        (whole record batches: records written meanwhile may come along with the last one,
        which is harmless), within ``timeout`` (else StateStoreError). Keys are the models' ids
        in hashable form (JSON arrays as tuples, see :func:`normalize_model_id`). Incomplete and
        corrupt states are skipped: counted in :attr:`last_report` and logged, never raised.
        """
        started = time.monotonic()
        wanted = None if model_ids is None else {normalize_model_id(m) for m in model_ids}
        records = self._read(self._deadline())
        return self._newest_states(records, {}, wanted, select, decode, log_level, started)

    def follow(self, model_id: Any, newer_than: tuple[int, int] | None = None, *,
               log_level: int = logging.DEBUG) -> StoredState | None:
        """The newest complete state of one model, as :meth:`restore` finds it, or None when
        there is none, or none newer (epoch, sequence) than ``newer_than``; for a reader that
        polls (a predictor). The first call reads the whole topic; each later one reads only
        the records written since the call before, and keeps the newest record of each of the
        model's keys in memory in between (its latest states and claims: a state written
        across two calls is whole at the second). A recreated topic (another id, or other
        partitions) is read whole again, and ``newer_than`` is not applied until a state of it
        is returned: its states start again at epoch 0.

        Without it a predictor read every state ever published at every refresh: the topic is
        compacted only in closed segments (an hour of states), and a broker that never compacts
        keeps them all.
        """
        started = time.monotonic()
        model = normalize_model_id(model_id)
        followed = self._followed if (self._followed is not None
                                      and self._followed.model == model) else None
        self._late_follow = None
        try:
            records = self._read(self._deadline(), start_at=followed)
        except StateStoreError:
            kept = self._keep_late_read() if followed is not None else None
            if kept is not None and followed is not None:
                read, positions = kept
                self._take_newest(read, followed.latest, {model}, None, RestoreReport())
                followed.positions.update(positions)
            raise
        went_on = self._read_went_on
        latest = followed.latest if followed is not None and went_on else {}
        # Recreated: newer_than is not applied until a state of the new topic is returned
        # (the first reads may find it empty, or a state half-written).
        recreated = followed is not None and (not went_on or followed.recreated)
        states = self._newest_states(records, latest, {model}, None, True, log_level, started,
                                     None if recreated else newer_than)
        state = states.get(model)
        self._followed = _Followed(model, self.topic_id, dict(self._last_positions), latest,
                                   recreated and state is None, dict(self._last_ends))
        return state

    #: Bytes of chunks of unfinished writes that :meth:`index` keeps between reads (a write
    #: read in part, or one its writer never finished); past it, the next call reads the whole
    #: topic again, which forgets them.
    INDEX_KEEPS_BYTES = 64 << 20

    def index(self, select: Callable[[Hashable], bool], *,
              log_level: int = logging.INFO) -> dict[Hashable, StoredState]:
        """The newest complete state of each model ``select`` accepts, as
        ``restore(select=select, decode=False)`` finds it (metadata, no arrays: :meth:`fetch`
        reads them), reading only what the topic gained since the last call.

        The first call reads the whole topic, as :meth:`restore` does; each later one reads on
        from where the last ended. What it keeps in between is small: per state its metadata
        and where its chunks lie, and the chunks of writes not read whole yet. A topic found
        recreated (another id or other partitions) is read whole again. A consumer group's
        member calls it at every partition assignment: a whole read each time took longer
        and longer under churn, as the topic grows until compaction reaches it (the embedded
        broker never compacts)."""
        started = time.monotonic()
        known = self._index
        start_at = None if known is None else _Followed(None, known.topic_id,
                                                        dict(known.positions), {},
                                                        ends=dict(known.ends))
        self._late_follow = None
        try:
            records = self._read(self._deadline(), start_at=start_at)
        except StateStoreError:
            kept = self._keep_late_read() if known is not None else None
            if kept is not None and known is not None:
                read, positions = kept
                known.apply(read, self, RestoreReport(records=len(read)))
                known.positions.update(positions)
            raise
        if known is None or not self._read_went_on:
            known = _Index(self.topic_id)
        report = RestoreReport(records=len(records))
        known.apply(records, self, report)
        known.topic_id = self.topic_id
        known.positions = dict(self._last_positions)
        known.ends = dict(self._last_ends)
        self._index = known
        if known.kept_bytes() > self.INDEX_KEEPS_BYTES:
            self._index = None
            log.warning("state topic %s: the index keeps %d bytes of states not read whole "
                        "(more than %d): the next assignment reads the whole topic again",
                        self.topic, known.kept_bytes(), self.INDEX_KEEPS_BYTES)
        for (model, epoch, _), slot in known.slots.items():
            if slot.state is not None and select(model):
                view = self._views.setdefault(model, _ModelView())
                view.complete[epoch] = max(view.complete.get(epoch, -1), slot.state.sequence)
        states = known.newest(select)
        self._found(states, report, started)
        log.log(log_level, "state topic %s: indexed %d models from %d records (%s) in %.3f s "
                "(%d incomplete, %d corrupt skipped)", self.topic, report.models,
                report.records, "read on" if start_at is not None and self._read_went_on
                else "the whole topic", report.seconds, report.incomplete, report.corrupt)
        return states

    def _keep_late_read(self) -> tuple[list[_Record], dict[int, int]] | None:
        """What a read that went on (:meth:`follow`, :meth:`index`) read before it ran out of
        time, applied to the views: its records of the partitions whose position is known,
        and those positions, for the caller to go on from (None: nothing to keep). Read
        again from the same place at every call, a topic that gains more than one timeout
        can read between two calls would never be read (a whole read goes on from where it
        ran out likewise, see ``_partial_read``)."""
        late, self._late_follow = self._late_follow, None
        if late is None:
            return None
        positions = {partition: position for partition, position in late.positions.items()
                     if position is not None}
        read = [record for partition in positions for record in late.records[partition]]
        self._apply(read, rebuild=False)
        for partition, position in positions.items():
            self._read_until[partition] = max(self._read_until.get(partition, 0), position)
        return read, positions

    def _take_newest(self, records: list[_Record], latest: dict[bytes, _Record],
                     wanted: set[Hashable] | None, select: Callable[[Hashable], bool] | None,
                     report: RestoreReport) -> None:
        """Records read in offset order into ``latest`` (the newest record of each key of the
        wanted models; a tombstone removes its key), counted in ``report``."""
        for record in records:
            if record.value is None:
                report.tombstones += 1
                if record.key is not None:
                    latest.pop(bytes(record.key), None)
                continue
            parsed = _parse_key(record.key)
            if parsed is None:
                report.corrupt += 1
                log.warning("state topic %s: partition %d offset %d has a key this store did "
                            "not write: skipped", self.topic, record.partition, record.offset)
                continue
            if ((wanted is None or parsed.model in wanted)
                    and (select is None or select(parsed.model))):
                latest[bytes(record.key)] = record

    def _newest_states(self, records: list[_Record], latest: dict[bytes, _Record],
                       wanted: set[Hashable] | None, select: Callable[[Hashable], bool] | None,
                       decode: bool, log_level: int, started: float,
                       newer_than: tuple[int, int] | None = None) -> dict[Hashable, StoredState]:
        """:meth:`restore` once the records are read: ``latest`` (the newest record of each
        key read before, updated in place) gets them, and the newest complete state of each
        model in it is taken, if newer than ``newer_than``."""
        report = RestoreReport(records=len(records))
        self._take_newest(records, latest, wanted, select, report)
        groups: dict[tuple[Hashable, int, int], dict[int, tuple[dict[str, Any], bytes]]] = {}
        # (model, epoch, slot) -> chunk -> (partition, offset) of its record
        places: dict[tuple[Hashable, int, int], dict[int, tuple[int, int]]] = {}
        for raw_key, record in latest.items():
            parsed = _parse_key(raw_key)
            assert parsed is not None
            if parsed.slot is None:
                continue  # a claim
            read = _read_chunk(record, parsed, self.topic, report)
            if read is None:
                continue
            header, data = read
            group = (parsed.model, parsed.epoch, parsed.slot)
            groups.setdefault(group, {})[parsed.chunk] = (header, data)
            places.setdefault(group, {})[parsed.chunk] = (record.partition, record.offset)
        candidates: dict[Hashable, list[tuple[int, int, dict[str, Any], bytes,
                                              tuple[int, int, int]]]] = {}
        for (model, epoch, slot), chunks in groups.items():
            if (newer_than is not None and 0 in chunks
                    and (epoch, chunks[0][0]["sequence"]) <= newer_than):
                continue  # (not newer than the state the caller has: not assembled again)
            where = f"model {_jsonable_id(model)} epoch {epoch} slot {slot}"
            problem, payload, first = _assemble(chunks)
            if problem is not None:
                corrupt = problem.startswith("checksum")
                if corrupt:
                    report.corrupt += 1
                else:
                    report.incomplete += 1
                # An incomplete state is mostly one being written while this reads, or one a
                # killed writer left: a reader that polls (a predictor, every second, which
                # warned at every publish of a chunked state) says it at its own level.
                log.log(logging.WARNING if corrupt or log_level >= logging.INFO else log_level,
                        "state topic %s: %s: %s; skipped", self.topic, where, problem)
                continue
            assert first is not None and payload is not None
            report.complete += 1
            where_chunks = [places[(model, epoch, slot)][i] for i in range(first["chunks"])]
            offsets = [offset for _, offset in where_chunks]
            location = (where_chunks[0][0], min(offsets), max(offsets))
            candidates.setdefault(model, []).append(
                (epoch, first["sequence"], first, payload, location)
            )
            view = self._views.setdefault(model, _ModelView())
            view.complete[epoch] = max(view.complete.get(epoch, -1), first["sequence"])
        states: dict[Hashable, StoredState] = {}
        for model, found in candidates.items():
            for epoch, sequence, first, payload, location in sorted(
                    found, key=lambda c: c[:2], reverse=True):
                if newer_than is not None and (epoch, sequence) <= newer_than:
                    break  # (no newer state: nothing decoded)
                if not decode:
                    try:
                        metadata = _decode_payload(payload, arrays=False)[1]
                    except (ValueError, TypeError, KeyError, OSError,
                            zipfile.BadZipFile) as exc:
                        report.corrupt += 1
                        log.warning("state topic %s: model %s epoch %d sequence %d does not "
                                    "load: %s; skipped", self.topic, _jsonable_id(model), epoch,
                                    sequence, exc)
                        continue
                    states[model] = StoredState({}, metadata, first["next_offset"], epoch,
                                                sequence, location)
                    break
                try:
                    arrays, metadata = _decode_payload(payload)
                except (ValueError, TypeError, KeyError, OSError, zipfile.BadZipFile) as exc:
                    report.corrupt += 1
                    log.warning("state topic %s: model %s epoch %d sequence %d does not load: "
                                "%s; skipped", self.topic, _jsonable_id(model), epoch, sequence,
                                exc)
                    continue
                states[model] = StoredState(arrays, metadata, first["next_offset"], epoch,
                                            sequence, location)
                break
        self._found(states, report, started)
        log.log(log_level, "state topic %s: restored %d models from %d records in %.3f s (%d "
                "incomplete, %d corrupt skipped)", self.topic, report.models, report.records,
                report.seconds, report.incomplete, report.corrupt)
        return states

    def _found(self, states: dict[Hashable, StoredState], report: RestoreReport,
               started: float) -> None:
        """Index the states found (for :meth:`fetch`) and complete the report."""
        for model, state in states.items():
            self._views.setdefault(model, _ModelView()).newest = StoredState(
                {}, {}, state.next_offset, state.epoch, state.sequence, state.location)
        report.models = len(states)
        report.seconds = time.monotonic() - started
        self.last_report = report

    def newest(self, model_id: Any) -> StoredState | None:
        """The newest state of a model this store published or restored (without arrays), or
        None: what :meth:`fetch` would read."""
        view = self._views.get(normalize_model_id(model_id))
        return None if view is None else view.newest

    #: Seconds before a model whose state a reading of the whole topic did not find whole is
    #: looked for there again (each look reads every record of the topic).
    REINDEX_INTERVAL = 30.0

    def fetch(self, model_id: Any) -> StoredState:
        """The arrays and metadata of :meth:`newest` state of a model, read from where its
        chunks lie (a few records, not the whole topic). Raises StateStoreError when there is
        none, or when it cannot be read within ``timeout``.

        When the state is no longer whole where this store indexed it (its owner published
        again since, and compaction removed the records its new state overwrote, or it
        tombstoned them), the model is indexed again from the whole topic (one more read,
        within its own ``timeout``) and its newest whole state read from there; never an
        older state than the one indexed. StateStoreError if none is found, and then the
        topic is read again for that model only after ``REINDEX_INTERVAL`` seconds."""
        model = normalize_model_id(model_id)
        try:
            return self._fetch_newest(model)
        except _NotWhole as exc:
            problem = str(exc)
            indexed = self.newest(model)
        assert indexed is not None  # a state that is not whole was indexed
        if time.monotonic() < self._reindex_after.get(model, 0.0):
            raise StateStoreError(f"{problem} (the topic is read again for it later)")
        log.info("%s; reading the state topic again for the model's newest state", problem)
        self.restore([model], decode=False, log_level=logging.DEBUG)
        found = self.newest(model)
        assert found is not None
        if (found.epoch, found.sequence) < (indexed.epoch, indexed.sequence):
            # Never an older state than the one indexed: the records it lacks may lie before
            # the offsets its owner committed, and would not be learned again.
            self._views[model].newest = indexed
            self._reindex_after[model] = time.monotonic() + self.REINDEX_INTERVAL
            raise StateStoreError(
                f"state topic {self.topic}: model {_jsonable_id(model)} epoch "
                f"{indexed.epoch} sequence {indexed.sequence} is no longer whole, and no newer "
                "whole state was found")
        try:
            state = self._fetch_newest(model)
        except _NotWhole as exc:
            self._reindex_after[model] = time.monotonic() + self.REINDEX_INTERVAL
            raise StateStoreError(f"{exc}, and no newer whole state was found") from None
        self._reindex_after.pop(model, None)
        return state

    def _fetch_newest(self, model: Hashable) -> StoredState:
        known = self.newest(model)
        if known is None or known.location is None:
            raise StateStoreError(
                f"state topic {self.topic}: no state of model {_jsonable_id(model)} is known "
                "to this store (restore or publish one first)")
        partition, first_offset, last_offset = known.location
        records = self._read(self._deadline(), {partition: (first_offset, last_offset + 1)},
                             track=False)
        chunks: dict[int, tuple[dict[str, Any], bytes]] = {}
        for record in records:
            parsed = _parse_key(record.key)
            if (record.value is None or parsed is None or parsed.model != model
                    or parsed.epoch != known.epoch or parsed.slot != known.sequence % 2
                    or not first_offset <= record.offset <= last_offset):
                continue
            try:
                header, data = _decode_value(record.value)
                _check_header(header, parsed)
            except StateFromNewerVersion as exc:
                raise StateFromNewerVersion(
                    f"state topic {self.topic}: partition {record.partition} offset "
                    f"{record.offset} (model {_jsonable_id(model)}) has {exc}") from None
            except (ValueError, TypeError, KeyError):
                continue
            if header["sequence"] == known.sequence:
                chunks[parsed.chunk] = (header, data)  # type: ignore[index]
        where = (f"state topic {self.topic}: model {_jsonable_id(model)} epoch {known.epoch} "
                 f"sequence {known.sequence} at offsets {first_offset}-{last_offset}")
        problem, payload, _ = _assemble(chunks)
        if problem is not None:
            raise _NotWhole(f"{where}: {problem}")
        assert payload is not None
        try:
            arrays, metadata = _decode_payload(payload)
        except (ValueError, TypeError, KeyError, OSError, zipfile.BadZipFile) as exc:
            raise _NotWhole(f"{where} does not load: {exc}") from None
        return StoredState(arrays, metadata, known.next_offset, known.epoch, known.sequence,
                           known.location)


def _claim_owner(record: _Record) -> str | None:
    """The owner token of a claim record, None if it has none (or is not one of ours)."""
    if record.value is None:
        return None
    try:
        header, _ = _decode_value(record.value)
    # (UnicodeDecodeError is a ValueError; a newer format's claim is another owner's too)
    except (ValueError, RecursionError, StateFromNewerVersion):
        return None
    owner = header.get("owner")
    return owner if isinstance(owner, str) else None


def _read_chunk(record: _Record, parsed: _Key, topic: str, report: RestoreReport
                ) -> tuple[dict[str, Any], bytes] | None:
    """``(header, data)`` of a chunk record, or None when it is not a valid chunk (counted
    and logged); StateFromNewerVersion, naming where, for a newer format."""
    try:
        header, data = _decode_value(record.value)  # type: ignore[arg-type]
        _check_header(header, parsed)
    except StateFromNewerVersion as exc:
        raise StateFromNewerVersion(
            f"state topic {topic}: partition {record.partition} offset {record.offset} "
            f"(model {_jsonable_id(parsed.model)} epoch {parsed.epoch}) has {exc}") from None
    except (ValueError, TypeError, KeyError) as exc:
        report.corrupt += 1
        log.warning("state topic %s: partition %d offset %d (model %s epoch %d) is not a valid "
                    "chunk: %s; skipped", topic, record.partition, record.offset,
                    _jsonable_id(parsed.model), parsed.epoch, exc)
        return None
    return header, data


def _check_header(header: dict[str, Any], key: _Key) -> None:
    """Raise ValueError when a chunk's header does not describe the record its key names."""
    if header.get("kind") != "chunk":
        raise ValueError(f"kind {header.get('kind')!r}, not a chunk")
    for name in ("epoch", "sequence", "slot", "chunk", "chunks", "size", "next_offset"):
        if not _is_count(header.get(name)):
            raise ValueError(f"header field {name} is {header.get(name)!r}")
    if normalize_model_id(header.get("model")) != key.model or header["epoch"] != key.epoch:
        raise ValueError("header and key name different models or epochs")
    if header["slot"] != key.slot or header["sequence"] % 2 != key.slot:
        raise ValueError("header and key name different slots")
    if header["chunk"] != key.chunk or header["chunk"] >= header["chunks"]:
        raise ValueError("header and key name different chunks")
    if not isinstance(header.get("sha256"), str) or len(header["sha256"]) != 64:
        raise ValueError("header has no sha256")


def _assemble(
    chunks: dict[int, tuple[dict[str, Any], bytes]],
) -> tuple[str | None, bytes | None, dict[str, Any] | None]:
    """``(problem, payload, first header)`` of one (model, epoch, slot): chunk 0 says which
    write the slot should hold; chunks of that write must all be there. Chunks with higher
    indexes from an older, longer write are left-overs, not a problem."""
    if 0 not in chunks:
        return f"chunk 0 missing ({len(chunks)} chunks of older writes)", None, None
    first = chunks[0][0]
    parts = []
    for index in range(first["chunks"]):
        found = chunks.get(index)
        if found is None:
            return (f"sequence {first['sequence']}: chunk {index} of {first['chunks']} missing",
                    None, None)
        header, data = found
        if any(header[name] != first[name] for name in _STATE_FIELDS):
            return (f"sequence {first['sequence']}: chunk {index} of {first['chunks']} belongs "
                    f"to sequence {header['sequence']}", None, None)
        parts.append(data)
    payload = b"".join(parts)
    if len(payload) != first["size"] or hashlib.sha256(payload).hexdigest() != first["sha256"]:
        return f"checksum: sequence {first['sequence']} does not match its sha256", None, None
    return None, payload, first


def topic_id_of(consumer: Any, topic: str) -> str | None:
    """The topic's id in the client's metadata (Kafka >= 2.8 and Tansu have ids), or None;
    kafka-python keeps it on its client's cluster object only."""
    cluster = getattr(getattr(consumer, "_client", None), "cluster", None)
    try:
        found = cluster.topic_id(topic) if cluster is not None else None
    except Exception:  # another kafka-python
        return None
    return None if found is None else str(found)


def _close_consumer(consumer: Any, topic: str) -> None:
    try:
        consumer.close(autocommit=False, timeout_ms=1000)
    except Exception as exc:  # closing must not hide the caller's result or error
        log.debug("state topic %s: closing a consumer: %s", topic, exc)


@dataclass
class _PartialRead:
    """A full read of the topic that ran out of time (see ``StateStore._partial_read``)."""

    topic_id: str | None
    positions: dict[int, int | None]
    records: dict[int, list[_Record]]


@dataclass
class _Followed:
    """Where :meth:`StateStore.follow` stands: its model, the topic's id and where each
    partition's read ended, the newest record of each of the model's keys, and whether the
    topic was found recreated since the last state returned."""

    model: Hashable
    topic_id: str | None
    positions: dict[int, int]
    latest: dict[bytes, _Record]
    #: the topic was found recreated and no state of it was returned yet
    recreated: bool = False
    #: the end offsets the last read was taken to (see ``StateStore._read``)
    ends: dict[int, int] = field(default_factory=dict)


@dataclass
class _Chunk:
    """The newest record of one chunk key, as :meth:`StateStore.index` keeps it."""

    partition: int
    offset: int
    header: dict[str, Any]
    #: None once a complete state it is part of was assembled (``digest`` stands for it then)
    data: bytes | None
    digest: bytes
    #: a record of a newer format: what reading the model raises (StateFromNewerVersion)
    newer: str | None = None


@dataclass
class _Write:
    """One complete state assembled from a slot's chunks: chunk 0's header, the metadata, and
    the digest of each chunk's data (a chunk whose data was dropped is told by it)."""

    first: dict[str, Any]
    #: as compact JSON (a third of the memory of the objects)
    metadata: bytes
    digests: list[bytes]


@dataclass
class _SlotIndex:
    """One (model, epoch, slot): the newest record of each of its chunk keys, the complete
    state they make up (metadata, no arrays) if they do, and the complete writes assembled
    from the chunks still there (by sha256)."""

    chunks: dict[int, _Chunk] = field(default_factory=dict)
    #: (its metadata as the write keeps it, compact JSON: :meth:`_Index.newest` decodes it)
    state: StoredState | None = None
    writes: dict[str, _Write] = field(default_factory=dict)


class _Index:
    """What :meth:`StateStore.index` knows of the topic: where its last read ended, and per
    (model, epoch, slot) what :meth:`StateStore.restore` makes of the newest records of its
    keys. Only chunks of writes never read whole keep their data."""

    def __init__(self, topic_id: str | None) -> None:
        self.topic_id = topic_id
        self.positions: dict[int, int] = {}
        self.ends: dict[int, int] = {}
        self.slots: dict[tuple[Hashable, int, int], _SlotIndex] = {}

    def newest(self, select: Callable[[Hashable], bool]) -> dict[Hashable, StoredState]:
        """The newest complete state of each model ``select`` accepts (metadata copied: the
        caller may change it)."""
        states: dict[Hashable, StoredState] = {}
        for (model, _, _), slot in self.slots.items():
            if not select(model):
                continue
            for chunk in slot.chunks.values():
                if chunk.newer is not None:  # (as a whole read raises for it)
                    raise StateFromNewerVersion(chunk.newer)
            if slot.state is None:
                continue
            found = states.get(model)
            if found is None or (slot.state.epoch, slot.state.sequence) > (found.epoch,
                                                                           found.sequence):
                states[model] = slot.state
        return {model: dataclasses.replace(state, metadata=json.loads(state.metadata))
                for model, state in states.items()}

    def kept_bytes(self) -> int:
        return sum(len(chunk.data) for slot in self.slots.values()
                   for chunk in slot.chunks.values() if chunk.data is not None)

    def apply(self, records: list[_Record], store: StateStore, report: RestoreReport) -> None:
        """Records read in offset order: each replaces its key's newest record (a tombstone
        or a record that is no valid chunk removes it); then every slot they touched is
        assembled again."""
        touched: set[tuple[Hashable, int, int]] = set()
        for record in records:
            parsed = _parse_key(record.key)
            if record.value is None:
                report.tombstones += 1
            elif parsed is None:
                report.corrupt += 1
                log.warning("state topic %s: partition %d offset %d has a key this store did "
                            "not write: skipped", store.topic, record.partition, record.offset)
                continue
            if parsed is None or parsed.slot is None:
                continue  # (claims: the store's views keep them)
            group = (parsed.model, parsed.epoch, parsed.slot)
            chunk = None
            try:
                read = None if record.value is None else _read_chunk(record, parsed,
                                                                     store.topic, report)
            except StateFromNewerVersion as exc:
                # Raised only for a model that is asked for and whose newest record of the
                # key this still is, as a whole read does: a newer writer's record of another
                # model, or one written over since, must not stop the reader.
                read = None
                chunk = _Chunk(record.partition, record.offset, {}, None, b"", str(exc))
            if read is not None:
                header, data = read
                # (Only what tells the write apart: the rest is in the key.)
                chunk = _Chunk(record.partition, record.offset,
                               {name: header[name] for name in _STATE_FIELDS}, data,
                               hashlib.sha256(data).digest())
            slot = self.slots.setdefault(group, _SlotIndex())
            if chunk is None:
                slot.chunks.pop(parsed.chunk, None)  # type: ignore[arg-type]
            else:
                slot.chunks[parsed.chunk] = chunk  # type: ignore[index]
            touched.add(group)
        for group in touched:
            self._assemble(group, store, report)

    def _assemble(self, group: tuple[Hashable, int, int], store: StateStore,
                  report: RestoreReport) -> None:
        """What a whole read makes of the slot's chunks (``_assemble``), from the digests of
        a write assembled before where the chunks are that write's."""
        slot = self.slots[group]
        slot.state = None
        chunks = {index: chunk for index, chunk in slot.chunks.items() if chunk.newer is None}
        first = chunks.get(0)
        if first is not None:
            slot.state = self._state_of(group, first.header, chunks, slot, store, report)
        # Writes no chunk refers to any more are forgotten.
        referred = {chunk.header["sha256"] for chunk in chunks.values()}
        slot.writes = {sha: write for sha, write in slot.writes.items() if sha in referred}
        if not slot.chunks:
            del self.slots[group]

    def _state_of(self, group: tuple[Hashable, int, int], first: dict[str, Any],
                  chunks: dict[int, _Chunk], slot: _SlotIndex, store: StateStore,
                  report: RestoreReport) -> StoredState | None:
        model, epoch, number = group
        where = f"model {_jsonable_id(model)} epoch {epoch} slot {number}"
        write = slot.writes.get(first["sha256"])
        if write is not None and all(
                (chunk := chunks.get(index)) is not None
                and all(chunk.header[name] == write.first[name] for name in _STATE_FIELDS)
                and chunk.digest == write.digests[index]
                for index in range(write.first["chunks"])):
            report.complete += 1
            return self._stored(write, chunks, epoch)
        if any(chunk.data is None for index, chunk in chunks.items()
               if index < first["chunks"]
               and all(chunk.header[name] == first[name] for name in _STATE_FIELDS)):
            # Chunks of an assembled write, one missing or of other data: nothing whole (a
            # whole read finds the same, as incomplete or as a failed checksum).
            report.incomplete += 1
            return None
        problem, payload, header = _assemble({
            index: (chunk.header, b"" if chunk.data is None else chunk.data)
            for index, chunk in chunks.items()})
        if problem is not None:
            corrupt = problem.startswith("checksum")
            if corrupt:
                report.corrupt += 1
            else:
                report.incomplete += 1
            log.log(logging.WARNING if corrupt else logging.DEBUG, "state topic %s: %s: %s; "
                    "skipped", store.topic, where, problem)
            return None
        assert payload is not None and header is not None
        report.complete += 1
        try:
            metadata = _decode_payload(payload, arrays=False)[1]
        except (ValueError, TypeError, KeyError, OSError, zipfile.BadZipFile) as exc:
            report.corrupt += 1
            log.warning("state topic %s: model %s epoch %d sequence %d does not load: %s; "
                        "skipped", store.topic, _jsonable_id(model), epoch,
                        header["sequence"], exc)
            return None
        write = _Write(header, json.dumps(metadata, separators=(",", ":")).encode(),
                       [chunks[index].digest for index in range(header["chunks"])])
        slot.writes[header["sha256"]] = write
        return self._stored(write, chunks, epoch)

    @staticmethod
    def _stored(write: _Write, chunks: dict[int, _Chunk], epoch: int) -> StoredState:
        """The write's state, located where its chunks now lie; their data is dropped."""
        places = [chunks[index] for index in range(write.first["chunks"])]
        for chunk in places:
            chunk.data = None
        offsets = [chunk.offset for chunk in places]
        return StoredState({}, write.metadata, write.first["next_offset"], epoch,
                           write.first["sequence"],
                           (places[0].partition, min(offsets), max(offsets)))


class _OutOfTime(Exception):
    """A read past its deadline: its error, and the records and positions it had reached."""

    def __init__(self, error: StateStoreError, positions: dict[int, int | None],
                 records: dict[int, list[_Record]]) -> None:
        super().__init__(str(error))
        self.error, self.positions, self.records = error, positions, records


#: segment.ms of a state topic this store creates (see ``StateStore.ensure_topic``).
STATE_SEGMENT_MS = 3_600_000


def _position_or_unknown(consumer: Any, tp: Any) -> Any:
    try:
        return consumer.position(tp, timeout_ms=100)
    except Exception:  # only for an error message
        return "unknown"


def _forbid_auto_creation(client: Any) -> None:
    """Make a client's metadata requests ask the broker not to create a missing topic (Tansu
    and Kafka's default create one, without compaction). kafka-python 3.0 takes
    allow_auto_create_topics but does not hand it to the cluster metadata that builds those
    requests (the daemon does the same for its consumer)."""
    for cluster in (getattr(getattr(client, "_client", None), "cluster", None),
                    getattr(client, "_metadata", None)):
        config = getattr(cluster, "config", None)
        if isinstance(config, dict):
            config["allow_auto_create_topics"] = False
