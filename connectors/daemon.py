"""The Kafka consumer daemon: input (and label) topics in, predictions, acknowledgements and
dead letters out, the model checkpointed with the offsets it has learned.

Guarantees
    - The model never learns a message twice: a checkpoint holds the model together with the
      next offset of every partition, the daemon resumes reading at those offsets, and skips
      anything below them.
    - No output is lost: a checkpoint is written, and offsets are committed, only after the
      outputs up to them are flushed to the broker. After a crash some outputs may repeat.
    - With ``model.scope = "global"`` (the default) one daemon owns the model and reads every
      partition of its topics (partitions are assigned, not balanced in a consumer group:
      several daemons on one group would split the stream between several models). The
      checkpoint directory is locked against a second daemon.
    - With ``model.scope = "partition"`` or ``"key"`` there is one model per input partition
      or per message key (connectors.scoped), and the daemons of one ``kafka.group_id`` share
      the partitions as a consumer group: each owns the models of its partitions, publishes
      their states on ``kafka.state_topic`` and commits a partition's offsets once its models
      are published; when partitions move (a rebalance, a killed daemon), the new owner
      restores their models from the state topic and resumes at the committed offsets.
    - Nothing resets the model silently: a checkpoint made with other model settings, checkpoints
      that cannot be restored, a consumer group that served a model whose checkpoints are gone,
      and a partition that no longer holds the offsets the model resumes from (a recreated
      topic, a broker that lost its data) each stop the daemon with a message saying what to
      do, unless the operator chose a policy (``checkpoint.start_fresh``,
      ``kafka.on_partition_reset``).
    - With ``daemon.role = "predictor"`` it is a prediction replica instead: it serves the
      newest model a learner published on ``kafka.state_topic`` (connectors.replica), swapped
      in between two polls, never changes it, writes no checkpoint and commits its own group's
      offsets. Until it has a model it consumes nothing.
    - Every message gets an output or a dead letter; a failure while handling one message
      dead-letters it. A batch that fails as a whole (a bug) stops the daemon without
      checkpointing or committing anything of that batch.

>>> from connectors.config import load_config
>>> config = load_config("my-settings.toml")            # doctest: +SKIP
>>> Daemon(config).run()                                 # doctest: +SKIP
0
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import math
import os
import signal
import socket
import struct
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from connectors._signals import stop_signals
from connectors.broker import EmbeddedBroker
from connectors.checkpoint import (
    Checkpoint,
    CheckpointError,
    CheckpointLockLost,
    CheckpointMismatch,
    CheckpointStore,
    DirectoryLock,
)
from connectors.config import Config, kafka_client_settings, tls_context
from connectors.inflate import limit_inflation
from connectors.messages import UnreadableRecord
from connectors.metrics import Metrics
from connectors.models import (
    build_model,
    build_scaler,
    checkpoint_bounds,
    checkpointed_settings,
    limit_settings,
    restore_model,
    settings_mismatch,
)
from connectors.pacing import InputPositions, LabelPacer
from connectors.processor import Processor
from connectors.replica import (
    GLOBAL_MODEL_ID,
    StateFollower,
    generation,
    state_of,
    state_store_for,
)
from connectors.scoped import ScopedModels, ScopedStateRefused, served_without_a_record
from connectors.state_store import (
    StaleEpochError,
    StateFromNewerVersion,
    StateStore,
    StateStoreError,
)
from connectors.state_store import topic_id_of as _topic_id
from stream_svm.engine import OPTIONAL_STATE_ARRAYS

__all__ = ["Daemon", "DaemonError", "RunSummary", "StartRefused", "ensure_topics"]

log = logging.getLogger(__name__)



def _freeze_start() -> None:
    """Keep what the start allocated (modules, the restored model, the clients: about 130,000
    objects under River and kafka-python) out of the collector's full passes. They live as long
    as the daemon, and each full pass walked them all: a pause of 65-70 ms here, taken by the
    messages being handled, every few thousand messages. Garbage is collected
    first, so that nothing unreachable is kept."""
    gc.collect()
    gc.freeze()


def _only_partition(producer: Any, topic: str) -> int | None:
    """The partition of a topic that has one, else None (the producer's partitioner picks).
    Naming it skips the partitioner, which hashes every key in Python (murmur2, about a fifth
    of a send); a topic of one partition gets every record there anyway. A topic whose
    metadata the broker refuses (e.g. not authorized) is left to ``send``, which reports that
    on each of its records' futures, so that the batch's other topics are delivered."""
    from kafka.errors import BrokerResponseError

    try:
        partitions = producer.partitions_for(topic)
    except BrokerResponseError:
        return None
    if partitions is not None and len(partitions) == 1:
        return next(iter(partitions))
    return None


#: A join of the consumer group under way longer than this (or six session timeouts) is
#: warned of.
GROUP_STUCK_SECONDS = 60.0


def _producer_limit(max_message_bytes: int) -> int:
    """The producer's ``max_request_size``: room for an output twice the largest input."""
    return max(1_048_576, 2 * max_message_bytes)


#: Bytes of a record's framing that the producer counts beside its key and value.
_RECORD_OVERHEAD = 1024


def _oversized_as_dead_letters(sends: list[tuple[str, bytes | None, bytes]], limit: int,
                               dead_letter_topic: str) -> list[tuple[str, bytes | None, bytes]]:
    """``sends``, with any record the producer would refuse as too large (over ``limit``
    bytes) replaced by an ``internal`` dead letter that says so and keeps its start: such a
    record fails at every retry, and the stream stalled behind it. No record of the daemon
    should come near the limit (dead letters are cut to it, ids are bounded): this is the
    guard against a bug, which the dead letter names.

    >>> sends = [("out", b"k", b'{"id":1}'), ("out", b"k", b'{"source":{}, "x":"' + b"a" * 90)]
    >>> sent = _oversized_as_dead_letters(sends, 1100, "dead")
    >>> [topic for topic, _, _ in sent], json.loads(sent[1][2])["error"][:60]
    (['out', 'dead'], 'an output of 109 bytes for topic out (about 1134 as a record')
    """
    from connectors.messages import Source, dead_letter, encode

    fitting = []
    for topic, key, value in sends:
        size = len(value) + len(key or b"") + _RECORD_OVERHEAD
        if size <= limit:
            fitting.append((topic, key, value))
            continue
        source = Source("", -1, -1)
        with contextlib.suppress(ValueError, TypeError, KeyError, AttributeError):
            where = json.loads(value)["source"]
            source = Source(where["topic"], where["partition"], where["offset"])
        log.error("an output of %d bytes for %s (about %d as a record, with its key and "
                  "framing) is over the producer's limit of %d bytes: sent as an internal dead "
                  "letter instead", len(value), topic, size, limit)
        letter = dead_letter(
            f"an output of {len(value)} bytes for topic {topic} (about {size} as a record, with "
            f"its key and framing) was over the producer's limit of {limit} bytes (a bug of "
            "stream-svm: please report it); raw holds its start",
            value, source, max(256, limit // 2), reason="internal")
        fitting.append((dead_letter_topic, key, encode(letter)))
    return fitting


#: How often a global daemon reads its group's committed offsets for another consumer's
#: commits (two daemons serving one group): at its first commit, then at most this often.
GROUP_CHECK_SECONDS = 30.0
#: The same signal again within this time is the same stop request, not a second one.
REPEATED_SIGNAL_SECONDS = 0.5


class DaemonError(RuntimeError):
    """The daemon cannot start (e.g. the checkpoint directory is used by another daemon)."""


class StartRefused(DaemonError):
    """Starting would reset or skip part of the model without the operator's say: the message
    says what happened and which setting decides (no retry helps)."""


@dataclass
class RunSummary:
    """Counts of one run of the daemon."""

    messages: int = 0
    outputs: int = 0
    dead_letters: int = 0
    skipped: int = 0
    batches: int = 0
    checkpoints: int = 0
    checkpoint_failures: int = 0
    seconds: float = 0.0
    accuracy: float = float("nan")
    mae: float = float("nan")  # regressors
    rmse: float = float("nan")
    breakpoints: int = 0
    exit_code: int = 0


def backoff_delay(initial: float, maximum: float, failures: int) -> float:
    """initial * 2^(failures - 1), at most ``maximum``. The exponent is capped: 2^1024 is beyond
    a float, and an outage of some hours at a small initial delay reached it (OverflowError)."""
    return min(maximum, initial * 2.0 ** min(failures - 1, 64))


#: Seconds a start waits for a topic it did not create to show in the broker's metadata.
MISSING_TOPIC_SECONDS = 5.0

#: How the commit metadata of this daemon's offset commits begins (then host, pid and a tag):
#: a tool that resets a group's offsets writes its own (Kafka's writes none).
COMMIT_METADATA_PREFIX = "stream-svm "


def _committable(processor: Processor) -> dict[str, int]:
    """The next offsets of a processor's partitions as its group may commit them. Messages held
    for the scaler's warm-up have no output yet and only a checkpoint holds them: their
    partitions are committed up to the first of them, so a model started anew from the
    committed offsets (start_fresh) still answers them."""
    next_offsets = dict(processor.offsets)
    for record in processor.held:
        name = f"{record.topic}:{record.partition}"
        if name in next_offsets:
            next_offsets[name] = min(next_offsets[name], record.offset)
    return next_offsets


class _Backoff:
    def __init__(self, initial: float, maximum: float, attempts: int) -> None:
        self.initial, self.maximum, self.attempts = initial, maximum, attempts
        self.failures = 0

    def wait(self, stop: threading.Event, what: str, error: BaseException) -> None:
        self.failures += 1
        if self.attempts and self.failures >= self.attempts:
            attempts = "1 attempt" if self.failures == 1 else f"{self.failures} attempts"
            raise DaemonError(f"{what}: giving up after {attempts}: {error}")
        delay = backoff_delay(self.initial, self.maximum, self.failures)
        log.warning(  # (a MemoryError's text is empty: its name then)
            "%s (attempt %d): %s; retrying in %.1f s", what, self.failures,
            error if str(error) else type(error).__name__, delay
        )
        stop.wait(delay)

    def reset(self) -> None:
        self.failures = 0


def _bootstrap_hosts(servers: list[str]) -> list[tuple[str, int, int]]:
    """(host, port, address family) of each bootstrap server, parsed as kafka-python does."""
    try:
        from kafka.cluster import collect_hosts  # kafka-python 3
    except ImportError:  # pragma: no cover - kafka-python 2
        from kafka.conn import collect_hosts
    return collect_hosts(servers, randomize=False)


#: The request the connection probe sends: ApiVersions (key 18), version 0, which every
#: Kafka broker since 0.10 answers before any authentication; correlation id "SVM1", client
#: id "stream-svm" (a null one failed on brokers before KAFKA-13385). Its answer starts with
#: a length and the same correlation id.
_PROBE_CORRELATION = 0x53564D31
_PROBE_CLIENT = b"stream-svm"
_PROBE_REQUEST = struct.pack(f">ihhih{len(_PROBE_CLIENT)}s", 10 + len(_PROBE_CLIENT), 18, 0,
                             _PROBE_CORRELATION, len(_PROBE_CLIENT), _PROBE_CLIENT)
_PROBE_ANSWER_MAX = 1 << 20  # an ApiVersions answer is a few hundred bytes
#: A probe connection's state while its TLS handshake is under way.
_HANDSHAKING = object()


def _kafka_answer_problem(head: bytes) -> str | None:
    """What is wrong with the first 8 bytes of an answer to the probe (None: a Kafka answer)."""
    size, correlation = struct.unpack(">ii", head)
    if 4 <= size <= _PROBE_ANSWER_MAX and correlation == _PROBE_CORRELATION:
        return None
    return (f"answered a Kafka request with {head!r}, which is no Kafka answer: is it a Kafka "
            "broker's address? (kafka.bootstrap_servers)")


def _unreachable(servers: list[str], stop: threading.Event, timeout: float,
                 kafka_request: bool = False, tls: Any = None) -> str | None:
    """Why no bootstrap server accepts a TCP connection within ``timeout`` seconds (each
    server's cause), or None when one does or ``stop`` is set meanwhile. With
    ``kafka_request``, a server must also answer a Kafka request (ApiVersions) as a broker
    does: only for plaintext listeners, whose first bytes are Kafka's. With ``tls`` (an
    ``ssl.SSLContext``: TLS listeners), a server must complete a TLS handshake with it.

    kafka-python keeps retrying a refused connection until its bootstrap timeout (the
    connection attempt's kafka.request_timeout_ms, 30 s by default) and cannot be interrupted
    meanwhile: a mistyped address or a broker not yet started showed nothing for 30 s, and a
    SIGTERM waited as long. The connections tried here all at once answer at once, and the
    wait for them ends with a stop. A server that is no Kafka broker (an HTTP server on the
    port) had kafka-python log an error for every attempt for 30 s ("Invalid frame length")
    before the daemon said anything, and a stop waited as long. kafka-python 3.0 waits for a
    TLS handshake without any timeout: at a plaintext or silent listener the daemon hung
    with no message, a stop included, until killed."""
    import errno
    import selectors
    import socket
    import ssl

    named: dict[str, tuple[str, int, int]] = {}  # each server once, in the given order
    servers = [server for server in servers if server.strip()]  # (a trailing comma)
    try:
        parsed = _bootstrap_hosts(servers)
    except ValueError as exc:  # (refused with the settings already: load_config checks them)
        return f"{','.join(servers)}: not host:port ({exc})"
    for host, port, family in parsed:
        named.setdefault(f"[{host}]:{port}" if ":" in host else f"{host}:{port}",
                         (host, port, family))
    if not named:
        return None
    labels, hosts = list(named), list(named.values())
    causes: dict[str, str] = dict.fromkeys(labels, "")
    deadline = time.monotonic() + timeout
    # Names are resolved on threads of their own: a resolver that does not answer must not
    # hold a stop up (an abandoned lookup ends with the resolver's own timeout).
    resolved: dict[str, Any] = {}
    done = threading.Event()

    def resolve(label: str, host: str, port: int, family: int) -> None:
        try:
            resolved[label] = socket.getaddrinfo(host, port, family, socket.SOCK_STREAM)
        except (OSError, UnicodeError, ValueError) as exc:
            resolved[label] = exc
        if len(resolved) == len(hosts):
            done.set()

    for label, (host, port, family) in zip(labels, hosts, strict=True):
        threading.Thread(target=resolve, args=(label, host, port, family), daemon=True,
                         name="stream-svm-resolve").start()
    while not done.wait(min(0.2, max(0.0, deadline - time.monotonic()))):
        if stop.is_set():
            return None
        if time.monotonic() >= deadline:
            break
    selector = selectors.DefaultSelector()
    try:
        for label in labels:
            addresses = resolved.get(label)
            if addresses is None:
                causes[label] = f"the name did not resolve within {timeout:g} s"
                continue
            if isinstance(addresses, BaseException):
                causes[label] = f"the name does not resolve ({addresses})"
                continue
            for address_family, kind, protocol, _, address in addresses:
                try:
                    connection = socket.socket(address_family, kind, protocol)
                except OSError as exc:
                    causes[label] = causes[label] or str(exc)
                    continue
                connection.setblocking(False)
                code = connection.connect_ex(address)
                if code not in (0, errno.EINPROGRESS, errno.EWOULDBLOCK, errno.EAGAIN):
                    connection.close()
                    causes[label] = causes[label] or os.strerror(code)
                    continue
                # (Connected at once, it is writable at once: the loop below goes on.)
                selector.register(connection, selectors.EVENT_WRITE, (label, None))
        while selector.get_map():
            if stop.is_set():
                return None
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                for key in selector.get_map().values():
                    label, answer = key.data
                    causes[label] = causes[label] or (
                        f"no answer within {timeout:g} s" if answer is None else
                        f"accepted the connection, but did not complete a TLS handshake within "
                        f"{timeout:g} s: is it a Kafka broker's TLS listener? "
                        "(kafka.bootstrap_servers, kafka.security_protocol)"
                        if answer is _HANDSHAKING else
                        f"accepted the connection, but did not answer a Kafka request within "
                        f"{timeout:g} s: a broker still starting, or no Kafka broker's address? "
                        "(kafka.bootstrap_servers)")
                break
            for key, _ in selector.select(min(0.2, remaining)):
                connection, (label, answer) = key.fileobj, key.data
                if answer is None and tls is not None:  # connecting, then the handshake
                    code = connection.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                    selector.unregister(connection)
                    if code != 0:
                        connection.close()
                        causes[label] = causes[label] or os.strerror(code)
                        continue
                    try:
                        connection = tls.wrap_socket(
                            connection, server_hostname=named[label][0].rstrip("."),
                            do_handshake_on_connect=False)
                    except (ssl.SSLError, OSError, ValueError) as exc:
                        connection.close()
                        causes[label] = causes[label] or f"TLS could not start ({exc})"
                        continue
                    selector.register(connection, selectors.EVENT_WRITE, (label, _HANDSHAKING))
                    answer = _HANDSHAKING
                if answer is _HANDSHAKING:
                    try:
                        connection.do_handshake()
                    except ssl.SSLWantReadError:
                        selector.modify(connection, selectors.EVENT_READ, (label, answer))
                        continue
                    except ssl.SSLWantWriteError:
                        selector.modify(connection, selectors.EVENT_WRITE, (label, answer))
                        continue
                    except (ssl.SSLError, OSError) as exc:
                        selector.unregister(connection)
                        connection.close()
                        reason = getattr(exc, "verify_message", None) or exc
                        causes[label] = causes[label] or (
                            f"the TLS handshake failed ({reason}): is it a Kafka broker's TLS "
                            "listener, and does its certificate verify against kafka.ssl_cafile "
                            "(or the system's certificate authorities)? "
                            "(kafka.bootstrap_servers, kafka.security_protocol)")
                        continue
                    selector.unregister(connection)
                    connection.close()
                    return None
                if answer is None:  # connecting
                    code = connection.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                    if code == 0 and kafka_request:
                        try:
                            connection.send(_PROBE_REQUEST)  # (24 bytes: the buffer is empty)
                            selector.modify(connection, selectors.EVENT_READ, (label, b""))
                            continue
                        except OSError as exc:
                            code = exc.errno or errno.ECONNRESET
                    selector.unregister(connection)
                    connection.close()
                    if code == 0:
                        return None
                    causes[label] = causes[label] or os.strerror(code)
                    continue
                try:  # reading the answer's first 8 bytes: its length and correlation id
                    received = connection.recv(8 - len(answer))
                except OSError as exc:
                    received, problem = b"", f"closed the connection at a Kafka request ({exc})"
                else:
                    problem = ("closed the connection without answering a Kafka request: is "
                               "it a Kafka broker's plaintext listener? "
                               "(kafka.bootstrap_servers, kafka.security_protocol)")
                answer += received
                if received and len(answer) < 8:
                    selector.modify(connection, selectors.EVENT_READ, (label, answer))
                    continue
                selector.unregister(connection)
                connection.close()
                if len(answer) == 8:
                    problem = _kafka_answer_problem(answer)
                    if problem is None:
                        return None
                causes[label] = causes[label] or problem
    finally:
        for key in list(selector.get_map().values()):
            key.fileobj.close()
        selector.close()
    return "; ".join(f"{label}: {cause}" for label, cause in causes.items() if cause) or None


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[DirectoryLock]:
    lock = DirectoryLock(directory)
    try:
        lock.acquire()
    except CheckpointError as exc:
        raise DaemonError(str(exc)) from None
    try:
        yield lock
    finally:
        lock.release()


def _kafka_frame(exc: BaseException, function: str) -> dict[str, Any] | None:
    """The local variables of kafka-python's ``function`` where ``exc`` (or its cause) was
    raised through it, or None."""
    seen: set[int] = set()
    error: BaseException | None = exc
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        trace = error.__traceback__
        while trace is not None:
            code = trace.tb_frame.f_code
            if code.co_name == function and "kafka" in code.co_filename:
                return trace.tb_frame.f_locals
            trace = trace.tb_next
        error = error.__cause__ or error.__context__
    return None


def _records_being_read(exc: BaseException) -> tuple[Any, Any, Any] | None:
    """The TopicPartition whose fetched records kafka-python was reading when ``exc`` was
    raised, its reader of them (a ``PartitionRecords``) and the record batch it was at (None
    before the first), all found in the traceback of ``exc`` or of its cause; None when it was
    raised elsewhere."""
    local = _kafka_frame(exc, "_unpack_records")
    tp = None if local is None else local.get("tp")
    if not (hasattr(tp, "topic") and hasattr(tp, "partition")):
        return None
    return tp, local.get("self"), local.get("batch")


def _set_aside(reader: Any) -> None:
    """Drop kafka-python's reader of a fetched batch whose reading raised: left in place, it
    yielded nothing at every later poll, which never returned once the reader's offset was the
    partition's position."""
    drain = getattr(reader, "drain", None)
    if callable(drain):
        drain()


def _last_offset_of(batch: Any, offset: int, high: Any) -> int:
    """The last offset of the record batch the client failed in, when its header can be
    trusted (a batch of the current format whose checksum holds: a codec it lacks, bytes that
    do not decompress, a header name that is not UTF-8), below the partition's high watermark;
    otherwise ``offset`` alone (a damaged header may name any range). The client reads a batch
    from its start, so none of its records from ``offset`` on can be read: met one poll per
    offset, each poll fetching and checking the whole batch again, a batch of 10,000 records
    took 15 minutes."""
    last = offset
    try:
        if batch is not None and batch.magic == 2 and batch.validate_crc():
            last = max(offset, int(batch.last_offset))
    except Exception:  # (a header that cannot even be read)
        return offset
    if isinstance(high, int):
        last = min(last, high - 1)
    return max(last, offset)


#: Times a batch the client ran out of memory reading is read again before its records are
#: dead-lettered as unreadable (a batch may inflate a thousandfold: 12.8 KB of zstd to 400 MB).
MEMORY_ATTEMPTS = 3


def _unreadable_records(exc: BaseException, consumer: Any,
                        memory_failures: dict[tuple[str, int, int], int]
                        ) -> list[UnreadableRecord] | None:
    """The records a poll raised ``exc`` on, when it was raised reading the records of a
    fetched batch (its checksum does not match, its bytes do not decompress, its codec is not
    installed, a header's name is not UTF-8...), or None for any other exception. The client
    stops at such a record: every later poll raised again, or never returned (its reader of
    the batch, stopped by the error, matched the partition's position and yielded nothing, for
    good), and no partition was read any more. The reader is set aside here, so that the next
    fetch reads anew. Running out of memory is not taken for damaged bytes until it happened
    MEMORY_ATTEMPTS times at the same offset (``memory_failures`` counts them): before, the
    batch is read again after the poll's back-off (None)."""
    found = _records_being_read(exc)
    if found is None:
        return None
    tp, reader, batch = found
    try:
        position = consumer.position(tp)  # the first offset the client has not handed out
    except Exception:
        return None
    if not isinstance(position, int):
        return None
    # The reader may be past the position: it passes a transaction's marker (or an aborted
    # transaction's batch) without handing out a record. It may also be behind it: a batch is
    # read from its start, and the record the error came from may lie before the position.
    reached = getattr(reader, "next_fetch_offset", None)
    offset = max(position, reached) if isinstance(reached, int) else position
    _set_aside(reader)
    where = (tp.topic, tp.partition, offset)
    if isinstance(exc, MemoryError):
        failures = memory_failures.get(where, 0) + 1
        memory_failures.clear()
        memory_failures[where] = failures
        if failures < MEMORY_ATTEMPTS:
            consumer.seek(tp, position)
            log.warning("ran out of memory reading the messages at %s:%d:%d (attempt %d of "
                        "%d): reading them again", *where, failures, MEMORY_ATTEMPTS)
            return None
    try:
        high = consumer.highwater(tp)
    except Exception:
        high = None
    last = _last_offset_of(batch, offset, high)
    cause = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return [UnreadableRecord(
        tp.topic, tp.partition, at,
        f"the Kafka client cannot read the message at {tp.topic}:{tp.partition}:{at} "
        f"({cause}): it, or a record before it in its record batch, is damaged, or the batch "
        "is compressed with a codec this installation lacks (or does not fit in memory "
        "decompressed). It was neither answered nor learned; the partition reads on after it")
        for at in range(offset, last + 1)]


#: Fetches in a row of one offset that must bring the broker's CORRUPT_MESSAGE, or bytes holding
#: no complete record batch, over at least UNFETCHABLE_SECONDS, before the offset is
#: dead-lettered as unreadable: a response cut short by a fault on the way, or a broker's
#: passing error, reads whole at a later fetch.
UNFETCHABLE_ATTEMPTS = 3
UNFETCHABLE_SECONDS = 30.0


@dataclass(frozen=True)
class _FailedFetch:
    """A fetch response that cannot give its partition's record at the position."""

    tp: Any
    offset: int
    what: str  # what the broker sent
    base: int | None  # the base offset of the batch the response starts with, if readable
    high: int | None  # the partition's high watermark the response tells, if it does


def _unfetchable_offset(exc: BaseException) -> _FailedFetch | None:
    """What kafka-python was handling when it raised ``exc`` on a fetch response that cannot
    give the partition's record at its position: the broker answered CORRUPT_MESSAGE (its log
    is damaged there), or sent bytes holding no complete record batch (a batch whose length
    field is damaged claims more bytes than there are). The client raises again at every fetch
    of that offset, for good: it does not move past a record by itself. None for any other
    exception."""
    from kafka.errors import CorruptRecordError

    local = _kafka_frame(exc, "_parse_fetched_data")
    if local is None:
        return None
    tp, offset = local.get("tp"), local.get("fetch_offset")
    if not (hasattr(tp, "topic") and hasattr(tp, "partition") and isinstance(offset, int)):
        return None
    high = local.get("highwater")
    # (raised before the client keeps it: its own high watermark is the last good fetch's)
    high = high if isinstance(high, int) and high >= 0 else None
    if local.get("error_type") is CorruptRecordError:
        return _FailedFetch(tp, offset, "the broker answered CORRUPT_MESSAGE: its log is "
                            "damaged there", None, high)
    records = local.get("records")
    try:
        incomplete = (records is not None and records.size_in_bytes() > 0
                      and not records.has_next())
        raw = bytes(local["completed_fetch"].partition_data.records or b"")
        base = struct.unpack_from(">q", raw)[0] if len(raw) >= 8 else None
    except Exception:
        incomplete, base = False, None
    if incomplete:
        return _FailedFetch(tp, offset, "the broker sent bytes holding no complete record "
                            "batch: the batch's length field is damaged", base, high)
    return None


def _end_offset(consumer: Any, tp: Any) -> int | None:
    """The partition's end offset (the last stable one with read_committed) asked of the
    broker now, or None if it cannot be had."""
    try:
        end = consumer.end_offsets([tp]).get(tp)
    except Exception:
        return None
    return end if isinstance(end, int) else None


def _on_metadata(consumer: Any, listener: Callable[[Any], None]) -> None:
    """Have ``listener`` called at every update of the consumer's cluster metadata (kafka-python
    keeps listeners on its client's cluster object; nothing happens with a client without)."""
    cluster = getattr(getattr(consumer, "_client", None), "cluster", None)
    add = getattr(cluster, "add_listener", None)
    if add is not None:
        add(listener)


def _connection_counter(consumer: Any, sensor: str) -> Callable[[], float] | None:
    """A function giving how many of the consumer's connections have been made
    (``connections-created``) or have closed (``connections-closed``) so far, or None when
    this kafka-python keeps no such sensor (its metrics give only rates over a window: a total
    is added to the sensor those rates are taken from)."""
    try:
        from kafka.metrics.stats import Total

        metrics = consumer._metrics
        found = metrics.get_sensor(sensor)
        if found is None:
            return None
        name = metrics.metric_name(f"stream-svm-{sensor}-total", "stream-svm",
                                   f"{sensor} since the consumer started")
        found.add(name, Total())
        return metrics.metrics[name].value
    except Exception:  # pragma: no cover - another kafka-python
        return None


def _known_partitions(consumer: Any, topic: str) -> set[int] | None:
    """The topic's partitions in the consumer's cached cluster metadata (no request; kafka-python
    refreshes it every metadata_max_age_ms and after errors), or None if unknown."""
    cluster = getattr(getattr(consumer, "_client", None), "cluster", None)
    try:
        found = cluster.partitions_for_topic(topic) if cluster is not None else None
    except Exception:  # pragma: no cover - another kafka-python
        return None
    return None if found is None else set(found)


def _forbid_auto_creation(consumer: Any) -> None:
    """Make the consumer's metadata requests ask the broker not to create missing topics.
    kafka-python 3.0 takes allow_auto_create_topics=False but does not hand it to the cluster
    metadata that builds those requests: the setting is applied there too."""
    cluster = getattr(getattr(consumer, "_client", None), "cluster", None)
    config = getattr(cluster, "config", None)
    if isinstance(config, dict):
        config["allow_auto_create_topics"] = False


def _position(consumer: Any, tp: Any, timeout_ms: int) -> int | None:
    """The consumer's position on ``tp``, or None while it is not known. kafka-python's
    ``position()`` completes a pending seek to the beginning or end first, and raises when that
    fails (the topic is missing: the broker restarted empty and nobody recreated it yet)."""
    from kafka.errors import KafkaError

    try:
        return consumer.position(tp, timeout_ms=timeout_ms)
    except KafkaError as exc:
        log.debug("the position on %s:%d is not known yet: %s", tp.topic, tp.partition, exc)
        return None


def _resume(consumer: Any, tp: Any) -> None:
    """Resume fetching a paused partition the daemon has just positioned (every resume here
    follows a seek). kafka-python 3 parks the records it had fetched for a partition when it
    is paused, and gives them back on resume only while no other partition's records are in
    line, which after a first poll is never: the partition then was not fetched again, for
    good (a label partition held back, or a partition given back by a rebalance, read nothing
    more). Records parked there were fetched before the seek and would be ignored anyway."""
    fetcher = getattr(consumer, "_fetcher", None)
    parked = getattr(fetcher, "_paused_partition_records", None)
    if isinstance(parked, dict):
        records = parked.pop(tp, None)
        if records is not None:
            records.drain()
    completed = getattr(fetcher, "_paused_completed_fetches", None)
    if isinstance(completed, dict):
        completed.pop(tp, None)
    consumer.resume(tp)


def _request_metadata(consumer: Any) -> None:
    """Ask the consumer for a metadata refresh soon (does not wait for it)."""
    cluster = getattr(getattr(consumer, "_client", None), "cluster", None)
    with contextlib.suppress(Exception):
        if cluster is not None:
            cluster.request_update()


def ensure_topics(client: dict[str, Any], topics: list[str], partitions: int = 1) -> list[str]:
    """Create the missing ones of ``topics`` (replication factor 1); returns those created.
    ``client`` holds kafka-python client settings (at least ``bootstrap_servers``)."""
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic
    from kafka.errors import TopicAlreadyExistsError

    admin = KafkaAdminClient(**client)
    try:
        existing = set(admin.list_topics())
        missing = [t for t in dict.fromkeys(topics) if t not in existing]
        if missing:
            try:
                admin.create_topics([NewTopic(t, partitions, 1) for t in missing])
                log.info("created topics %s", ", ".join(missing))
            except TopicAlreadyExistsError:
                pass
        return missing
    finally:
        admin.close()


class SignalSafeEvent(threading.Event):
    """A threading.Event that a signal handler may set. The handler runs on the main thread
    between two bytecodes, possibly while that thread holds the event's lock inside wait():
    with threading.Event's plain lock, set() then waited for it forever (seen once in 20
    SIGTERMs of the broker command). The lock here is reentrant; such a wait ends at its
    timeout at the latest (every wait on it here has one)."""

    def __init__(self) -> None:
        super().__init__()
        self._cond = threading.Condition(threading.RLock())


class Daemon:
    """Runs the consume-predict-learn-produce loop until stopped.

    ``stop()`` (or SIGTERM/SIGINT when ``install_signal_handlers``) finishes the current batch,
    flushes, checkpoints, commits and returns. While the broker is unreachable, flushing waits
    for it; a second ``stop()`` gives the undelivered outputs up instead: then nothing more is
    checkpointed or committed, the exit code is 1 and the restart repeats the stream from the
    last checkpoint. ``until_drained`` stops once every partition has been read up to its high
    watermark and a poll came back empty (demo, tests, batch jobs).
    """

    LATENCIES_KEPT = 100_000

    def __init__(
        self,
        config: Config,
        *,
        metrics: Metrics | None = None,
        until_drained: bool = False,
        install_signal_handlers: bool = False,
        on_batch: Callable[[Daemon], None] | None = None,
    ) -> None:
        self.config = config
        per_model = config.model.scope != "global"
        self.metrics = metrics or Metrics(per_model=per_model)
        if self.metrics.per_model != per_model:
            raise ValueError(f"model.scope = {config.model.scope!r} needs Metrics(per_model="
                             f"{per_model})")
        self.until_drained = until_drained
        self.install_signal_handlers = install_signal_handlers
        self.on_batch = on_batch
        self.stop_event: threading.Event = SignalSafeEvent()
        self.summary = RunSummary()
        #: Seconds from input timestamp to flushed output, of the latest LATENCIES_KEPT outputs
        #: (for the demo's and the benchmarks' percentiles; a list of all of them grew by 32
        #: bytes per output for the daemon's life).
        self.latencies: deque[float] = deque(maxlen=self.LATENCIES_KEPT)
        self.metrics_port: int | None = None
        self.broker: EmbeddedBroker | None = None
        self.processor: Processor | None = None
        self._consumer: Any = None
        self._producer: Any = None
        self._store: CheckpointStore | None = None
        self._since_checkpoint = 0
        self._last_checkpoint = time.monotonic()
        self._checkpoint_retry_at = 0.0  # after a failed checkpoint, not before this
        self._last_commit = 0.0
        self._committed: dict[str, int] = {}
        # The group's committed offset and commit metadata per partition as this daemon last
        # knew them (read at start, then its own commits, which carry ``_instance``): a value
        # that changed otherwise is another consumer committing in this group (see _commit).
        self._instance = f"{COMMIT_METADATA_PREFIX}{socket.gethostname()} pid {os.getpid()} " \
                         f"{uuid.uuid4().hex[:8]}"
        self._group_known: dict[str, tuple[int, str] | None] = {}
        # Commits that raised since the last one made (each may have been made nonetheless).
        self._attempted: dict[str, set[int]] = {}
        self._twin = False  # another daemon serves this group: stop, commit nothing more
        self._group_checked = 0.0  # when the group's commits were last read (_foreign_commit)
        # A partition lost the offsets the model resumes from and the daemon stops: the
        # broker's group now belongs to another topic (or an empty broker), where the old
        # offsets would make a restart skip that many new messages.
        self._stopped_on_reset = False
        #: (model.scope partition or key) topic name -> id when this daemon first saw it
        self._scoped_topic_ids: dict[str, str] = {}
        # What a learner with one model commits: the next offsets its newest checkpoint (or
        # the one it was restored from) covers, None before there is one. Committing what was
        # processed instead let a daemon killed before its first checkpoint leave a commit
        # without a checkpoint: the restart refused to start, and --start-fresh skipped what
        # the lost model had learned.
        self._covered: dict[str, int] | None = None
        self._started = time.monotonic()
        self._stop_requests = 0
        self._first_stop: tuple[int | None, float] | None = None  # (signal, when)
        # Set by the second stop request: what a delivery retry waits on once the first stop
        # has set stop_event (waiting on that returned at once: retries ran back to back).
        self._second_stop: threading.Event = SignalSafeEvent()
        # Set while the processor's state runs ahead of what was delivered: from the start of
        # each batch until its outputs are acknowledged, and for good when a second stop gave
        # them up or a batch failed half-way. The state must then be neither checkpointed nor
        # published nor committed (an exception of any kind leaving a batch half-way, even
        # KeyboardInterrupt in an embedding program, leaves it set for the shutdown).
        self._undelivered = False
        self._restored = False  # whether the model came from a checkpoint
        self._warned_order = False  # (a window read from several partitions: said once)
        self._connected: bool | None = None
        self._connection_metric: Any = None
        self._last_topic_check = 0.0
        # After a reset, the topics are checked on every poll until then (monotonic time): the
        # metadata refresh it asked for brings the new topic id and partitions within moments.
        self._recheck_until = 0.0
        self._resumed: set[str] = set()  # partitions resumed in spite of a reset
        #: scoped partitions just settled: kafka-python's high watermark when they were sought
        self._highwater_at_seek: dict[str, int | None] = {}
        # Counted by the consumer's metadata updates (a reconnect after a broker restart brings
        # one), on the client's IO thread, the only writer: the topics are checked at once
        # when it moved, not at the next TOPIC_CHECK_SECONDS. A counter, not a flag that the
        # loop clears: an update landing between a read and a clear cannot be lost.
        self._metadata_updates = 0
        self._metadata_checked = 0
        # After a lost connection (the broker may have restarted empty, and its topics been
        # recreated with other messages at the same offsets), what a poll returns is held back
        # until the metadata fetched since has been checked (monotonic deadline; 0: none; inf:
        # counted from the reconnect, once it is seen).
        self._verify_until = 0.0
        self._stop_reasons_logged: set[str] = set()  # partitions a reset stops the daemon for
        # Per partition "topic:partition": its position and since when it has not moved
        # (monotonic), and those reported stalled (_watch_progress).
        self._progress: dict[str, tuple[int, float, int]] = {}
        self._stalled: set[str] = set()
        # (topic, partition) of the consumer-lag series exported: a partition this process no
        # longer owns must not keep its last lag beside its new owner's.
        self._lag_series: set[tuple[str, str]] = set()
        # Partitions sought back to read again (a model the state topic did not give back),
        # and when: their position stays while their records come back every poll, no stall.
        self._read_again_at: dict[str, float] = {}
        #: per "topic:partition", the offset of its latest unreadable record
        self._last_unreadable: dict[str, int] = {}
        #: (topic, partition, offset) -> times the client ran out of memory reading there
        self._memory_failures: dict[tuple[str, int, int], int] = {}
        #: per "topic:partition", the offset its fetches failed at (_unfetchable), how many
        #: times in a row, and since when (monotonic)
        self._unfetchable_tries: dict[str, tuple[int, int, float]] = {}
        #: partitions paused after a failed fetch (_hold_back): TopicPartition, resume time
        self._held_back: dict[str, tuple[Any, float]] = {}
        #: per "topic:partition", the offset last passed by _unfetchable, while its partition
        #: has delivered nothing since (a run of damage)
        self._unfetchable_run: dict[str, int] = {}
        #: per "topic:partition", the high watermark its failed fetches told (_unfetchable),
        #: while it has delivered nothing since: the client's is its last good fetch's
        self._told_end: dict[str, int] = {}
        # Polls that drained the client's fetched records (returned fewer than kafka.max_batch:
        # the next fetch asks every partition again), since the start.
        self._drained_polls = 0
        self._closed_connections: Callable[[], float] | None = None
        self._closes_seen = 0.0
        # Connections made as of the previous look (_watch_connection), and as of the look
        # before the latest close was noticed; metadata updates counted when it was noticed.
        # The client connects on its own IO thread, at any time: records polled while no
        # connection was made since the close were fetched before it (the client's buffer),
        # from the topic the model was reading; only an update after it ends the hold.
        self._made_connections: Callable[[], float] | None = None
        self._made_seen = 0.0
        self._made_at_close = 0.0
        self._updates_at_close = 0
        # Partitions reset (re-positioned or stopped) after the current poll returned: what it
        # returned of them was read at the lost position (the topic as it was, or a recreated
        # topic at the old offsets), and is dropped rather than learned.
        self._reset_since_poll: set[str] = set()
        # Partitions positioned in the topic as it is now, by a reset (beyond_end, out_of_range)
        # or because they are new, with the monotonic time of it: the new topic id the metadata
        # shows afterwards is that same loss, and must not re-position (and re-read) them.
        self._repositioned: dict[str, float] = {}
        self._missing_topics: set[str] = set()  # input topics the metadata lacks, once warned
        # When records of a missing topic were first held (see _hold_missing_topics); -inf once
        # the hold gave up on the metadata.
        self._held_since: dict[str, float] = {}
        self.role: str = config.daemon.role
        # A learner that publishes its model for predictors (connectors.replica).
        self._publishes = self.role == "learner" and config.kafka.publish_state
        self._state_store: StateStore | None = None
        self._epoch: int | None = None  # claimed at connection
        self._sequence = 0  # of the last state published in this epoch
        #: what the last state published held: the offsets and the model's updates (a topic
        #: read again from 0 after a reset can bring the offsets back to the same numbers)
        self._published: tuple[dict[str, int], int] | None = None
        self._last_publish = time.monotonic()  # of the last attempt
        #: the state topic lacks the model as it is (nothing published in this epoch yet, or
        #: the last attempt failed): published on an idle stream too
        self._state_behind = False
        self._fenced = False  # another learner took the model over: publish nothing more
        #: a newer state of this model than the one restored, found on the state topic at the
        #: start (local checkpoints that fell behind its publishes): its offsets where they are
        #: ahead, which the model reads past before it publishes (predictors keep that state)
        self._publish_from: dict[str, int] | None = None
        self._checkpointed_epoch = -1  # the epoch the restored checkpoint published under
        # What the daemon that wrote the restored checkpoint had committed before it.
        self._committed_before: dict[str, set[int]] = {}
        self._lock_lost = False  # another daemon locked the checkpoint directory: stop
        self._lock_checked_at = 0.0  # (_check_the_lock)
        self._created_topics: set[str] = set()  # topics this daemon created (create_topics)
        #: run() has returned or is returning (its signal handlers are no longer the daemon's)
        self.stopped = False
        # A predictor's reader of the state topic, and its own stop (it also stops when the
        # daemon returns without a stop request, e.g. until_drained).
        self._follower: StateFollower | None = None
        self._follower_stop = threading.Event()
        # model.scope partition or key: the models of this process's partitions.
        self.scope: str = config.model.scope
        self.models: ScopedModels | None = None
        self._rebalancing = False  # between a revocation and the next assignment
        self._joined_once = False  # the group has completed a join of this member
        self._joining_since: float | None = None  # a join under way since then
        self._group_warned = -math.inf
        # Late labels wait for their features (connectors.pacing); a predictor reads none.
        kafka = config.kafka
        self._pacer: LabelPacer | None = (
            LabelPacer(kafka.input_topic, kafka.label_topic, per_partition=per_model)
            if kafka.label_topic and self.role != "predictor" else None)
        self._labels_waiting_said = -math.inf
        #: per assigned partition, (position, high watermark) as _update_lag found them
        self._positions: dict[Any, tuple[int | None, int | None]] = {}

    # -- lifecycle -------------------------------------------------------------------------

    def stop(self, signum: int | None = None, *_: object) -> None:
        now = time.monotonic()
        if (signum is not None and self._first_stop is not None
                and self._first_stop[0] == signum
                and now - self._first_stop[1] < REPEATED_SIGNAL_SECONDS):
            # GNU timeout (and some supervisors) signal the daemon, then its process group:
            # one request, not a second one that gives outputs up.
            return
        # The request first, the log lines after: a signal that interrupts the main thread's
        # own write to stderr makes the handler's write raise (a reentrant call), which lost
        # the request when the log line came first.
        self._stop_requests += 1
        if self._stop_requests == 1:
            self._first_stop = (signum, now)
        elif self._stop_requests == 2:
            self._second_stop.set()
        self.stop_event.set()
        with contextlib.suppress(RuntimeError):
            if signum == signal.SIGHUP and self._stop_requests == 1:
                # Its default action killed the daemon on the spot (no checkpoint, and the
                # embedded broker left running): it stops as for SIGTERM instead.
                log.warning("SIGHUP: stopping (the daemon does not reload its configuration: "
                            "start it again to apply a changed one)")
            if self._stop_requests == 1:
                log.info("stopping: finishing the batch, flushing, checkpointing, committing")
            elif self._stop_requests == 2:
                log.warning(
                    "stop requested again: outputs that cannot be delivered now are given up "
                    "(not checkpointed: they are repeated from the last checkpoint on restart)"
                )

    def run(self) -> int:
        """Run until stopped; returns the exit code (0 on a clean stop)."""
        started = self._started = time.monotonic()
        previous_handlers = {}
        if self.install_signal_handlers:
            for signum in stop_signals():
                previous_handlers[signum] = signal.signal(signum, self.stop)
        try:
            config = self.config
            if config.kafka.bootstrap_servers:
                # The client's settings first (TLS files, SASL credentials): refused before
                # a checkpoint is read or a port is taken.
                kafka_client_settings(config)
            if config.metrics.enabled and self.metrics_port is None:
                self.metrics_port = self.metrics.serve(config.metrics.host, config.metrics.port)
            if self.role == "predictor":
                # A replica writes no checkpoint: checkpoint.dir is neither locked nor read.
                self.processor = self._first_state()
                if self.processor is not None:
                    self._serve()
            elif self.scope != "global":
                # Models live on the state topic. An explicit checkpoint.dir keeps evicted
                # models on local disk too (one directory per daemon: it is locked).
                self._start_embedded_broker()
                if self._model_cache_dir() is None:
                    self._serve()
                else:
                    with _locked(Path(config.checkpoint.dir)):
                        self._serve()
            else:
                directory = Path(config.checkpoint.dir)
                with _locked(directory) as lock:
                    self._store = CheckpointStore(directory, keep=config.checkpoint.keep,
                                                  lock=lock)
                    self.processor = self._restore()
                    self._start_embedded_broker()
                    self._serve()
        finally:
            self.stopped = True  # (before the caller's signal handlers are back)
            self._follower_stop.set()
            if self._follower is not None:
                self._follower.join(timeout=self.config.kafka.request_timeout_ms / 1000 + 5)
            for signum, handler in previous_handlers.items():
                signal.signal(signum, handler)
            if self.broker is not None:
                self.broker.stop()
            self.metrics.close()
            self.metrics_port = None
            self.summary.seconds = time.monotonic() - started
        return self.summary.exit_code

    def _serve(self) -> None:
        try:
            if self._connect():
                _freeze_start()
                self._loop()
        except DaemonError:
            self.summary.exit_code = 1  # said so in the stop line too
            raise
        finally:
            gc.unfreeze()  # what the start allocated is collectable again once stopped
            self._shutdown()

    # -- start -----------------------------------------------------------------------------

    def _start_embedded_broker(self) -> None:
        config = self.config
        if config.kafka.bootstrap_servers:
            return
        self.broker = EmbeddedBroker().start()
        config.kafka.bootstrap_servers = self.broker.bootstrap_servers
        if config.model.scope == "global" and config.sources.get(
                "kafka.on_partition_reset") == "default":
            # Its topics are new at every start: a checkpoint's offsets cannot be theirs, and
            # every restart refused to start ("no longer holds the offsets") until told to.
            config.kafka.on_partition_reset = "earliest"
            config.sources["kafka.on_partition_reset"] = "the embedded broker"
            then = ("a restart keeps the model it restores and reads the new topics from "
                    "their start (kafka.on_partition_reset = 'earliest' here, unless set)")
        elif config.model.scope == "global":
            policy = config.kafka.on_partition_reset
            then = ("a restart that restores a checkpoint finds its offsets gone and " + (
                "stops (kafka.on_partition_reset = 'stop'; unset, it is 'earliest' here)"
                if policy == "stop" else f"does as kafka.on_partition_reset = {policy!r} says"))
        else:
            then = f"so does its state topic {config.kafka.state_topic}, which holds the models"
        log.warning(
            "no kafka.bootstrap_servers configured: started the embedded broker at %s (memory "
            "only: its topics vanish when the daemon stops; %s)",
            self.broker.bootstrap_servers, then,
        )

    def _new_processor(self, model: Any, metrics: Any = None) -> Processor:
        config = self.config
        return Processor(
            model,
            scaler=build_scaler(config),
            label_topic=config.kafka.label_topic,
            cache_max_size=config.cache.max_size,
            cache_max_bytes=config.cache.max_bytes,
            cache_max_age_seconds=config.cache.max_age_seconds,
            max_message_bytes=config.kafka.max_message_bytes,
            predict_per_poll=config.kafka.predict_per_poll,
            metrics=self.metrics if metrics is None else metrics,
        )

    def _new_replica_processor(self, model: Any) -> Processor:
        """A processor that serves ``model`` and never changes it (daemon.role = predictor)."""
        config = self.config
        return Processor(
            model,
            scaler=build_scaler(config),
            max_message_bytes=config.kafka.max_message_bytes,
            metrics=self.metrics,
            learns=False,
        )

    #: Seconds between two log lines of a predictor still waiting for its first state.
    WAIT_LOG_SECONDS = 30.0

    def _first_state(self) -> Processor | None:
        """A predictor's start: follow the state topic and wait for a state to serve, consuming
        nothing meanwhile (the input waits in Kafka); None when stopped meanwhile. Raises
        DaemonError after predictor.max_wait_seconds without one."""
        config = self.config
        gauge = self.metrics.replica[0]
        gauge.set(0)
        self._follower = StateFollower(
            config, self._new_replica_processor, self.metrics, self._follower_stop
        )
        self._follower.start()
        limit = config.predictor.max_wait_seconds
        started = last_log = time.monotonic()
        log.info("predictor: waiting for a state of model %s on %s (consuming nothing until "
                 "then)", list(GLOBAL_MODEL_ID), config.kafka.state_topic)
        while not self.stop_event.is_set():
            processor = self._follower.take()
            if processor is not None:
                self._serving(processor)
                return processor
            now = time.monotonic()
            if limit and now - started >= limit:
                raise DaemonError(
                    f"predictor: no state of model {list(GLOBAL_MODEL_ID)} to serve on "
                    f"{config.kafka.state_topic} after {limit:g} s (predictor.max_wait_seconds):"
                    " is a learner with kafka.publish_state = true publishing to that topic, "
                    "with the same [model] and [scaler] settings?"
                )
            if now - last_log >= self.WAIT_LOG_SECONDS:
                last_log = now
                log.warning("predictor: still no state to serve on %s after %.0f s",
                            config.kafka.state_topic, now - started)
            self.stop_event.wait(0.05)
        return None

    def _serving(self, processor: Processor) -> None:
        assert self._follower is not None and self._follower.taken is not None
        self.metrics.replica[0].set(self._follower.taken[1])
        log.info("predictor: serving model generation %s (%d model updates)",
                 processor.generation, processor.model_updates)

    def _swap_model(self) -> None:
        """Between two polls: serve the newest state the follower built, if any."""
        assert self._follower is not None and self.processor is not None
        fresh = self._follower.take()
        if fresh is None:
            return
        if fresh.model_updates < self.processor.model_updates:
            # Served all the same (a learner's state is the model of record), but not without
            # a word: its learner went back to an older model or a new one (--start-fresh).
            log.warning("model generation %s has %d model updates, fewer than the %d of "
                        "generation %s it replaces: its learner restarted from an older model "
                        "or a new one", fresh.generation, fresh.model_updates,
                        self.processor.model_updates, self.processor.generation)
        # The predictor's own progress through the input stays.
        fresh.offsets, fresh.topic_ids = self.processor.offsets, self.processor.topic_ids
        self.processor = fresh
        self._serving(fresh)

    def _restore(self) -> Processor:
        config = self.config
        store = self._store
        assert store is not None
        settings = checkpointed_settings(config)
        # Only the arrays this model restores from are read, each within the model's bounds;
        # the solver's own state where the checkpoint has it (one written before lacks it).
        needed = set(build_model(config).to_checkpoint()[0]) - OPTIONAL_STATE_ARRAYS
        bounds = checkpoint_bounds(config)

        def accept(model_meta: dict[str, Any], state: dict[str, Any]) -> None:
            changed = settings_mismatch(state.get("model_settings"), settings)
            if changed is not None:
                raise CheckpointMismatch(
                    f"the checkpoints in {config.checkpoint.dir} hold a model made with other "
                    f"settings ({changed}). Nothing was changed. Start with the settings the "
                    "model was made with, or use another checkpoint.dir for a new model."
                )
            offsets = state.get("processor", {}).get("offsets", {})
            read_before = sorted({str(name).rpartition(":")[0] for name in offsets})
            recorded = state.get("input_topic")
            if isinstance(recorded, str):
                other = recorded != config.kafka.input_topic
            else:  # (written before checkpoints named their input topic)
                other = (config.kafka.input_topic not in read_before
                         and bool(set(read_before) - set(self._topics())))
            if read_before and other:
                # Made on another input topic: this one would be read from its beginning into
                # another stream's model (the two merged silently, or every message a
                # duplicate_id). A label topic both streams share is no tie: it let the other
                # stream through.
                made_on = (f"made on the input topic {recorded}" if isinstance(recorded, str)
                           else "made on another input topic")
                raise CheckpointMismatch(
                    f"the checkpoints in {config.checkpoint.dir} hold a model {made_on} (it "
                    f"read {', '.join(read_before) or 'nothing'}), not on "
                    f"{config.kafka.input_topic}: this stream would be learned into another "
                    "stream's model. Nothing was changed. Use another checkpoint.dir for this "
                    "stream's model, or read the input topic the model was made on."
                )

        def read(path: Path) -> Checkpoint:
            return store.read(path, members=needed, check=bounds, accept=accept,
                              optional=OPTIONAL_STATE_ARRAYS)

        def restore(checkpoint: Checkpoint) -> Processor:
            model = restore_model(config, checkpoint.arrays, checkpoint.model_meta)
            processor = self._new_processor(model)
            processor.load_state(checkpoint.state["processor"], checkpoint.cache_arrays)
            epoch = checkpoint.state.get("state_epoch", -1)
            self._checkpointed_epoch = epoch if isinstance(epoch, int) else -1
            before = checkpoint.state.get("committed_before")
            self._committed_before = ({str(name): {v for v in offsets if isinstance(v, int)}
                                       for name, offsets in before.items()
                                       if isinstance(offsets, list)}
                                      if isinstance(before, dict) else {})
            return processor

        start_fresh = config.checkpoint.start_fresh
        try:
            checkpoint = store.load_latest(restore, read=read)
        except CheckpointMismatch as exc:
            raise StartRefused(str(exc)) from None
        except CheckpointError as exc:
            if not start_fresh:
                raise StartRefused(
                    f"{exc}. Nothing was changed. To start a new, empty model anyway (the "
                    "unusable checkpoints are then set aside), run with --start-fresh "
                    "(checkpoint.start_fresh = true)."
                ) from None
            for _, path in store.paths():
                store.set_aside(path, f"start_fresh: checkpoint {path} is not restored")
            checkpoint = None
        if checkpoint is not None:
            processor = checkpoint.restored
            self._restored = True
            self._covered = _committable(processor)
            log.info(
                "restored checkpoint %s: %d model updates, next offsets %s",
                checkpoint.path,
                processor.model_updates,
                processor.offsets,
            )
            return processor
        aside = store.set_aside_paths()
        if aside and not start_fresh:
            raise StartRefused(
                f"{config.checkpoint.dir} holds no checkpoint, but {len(aside)} were set aside "
                f"as unusable ({', '.join(p.name for p in aside[:3])}"
                f"{', ...' if len(aside) > 3 else ''}): a new model would silently replace the "
                "one they held. Nothing was changed. Restore a usable checkpoint, or run with "
                "--start-fresh (checkpoint.start_fresh = true) to start a new, empty model."
            )
        log.info("no checkpoint in %s: a new %s (input limits %s)",
                 config.checkpoint.dir, settings, limit_settings(config))
        return self._new_processor(build_model(config))

    def _topics(self) -> list[str]:
        kafka = self.config.kafka
        if self.role == "predictor":
            return [kafka.input_topic]  # late labels are for the learner
        return [kafka.input_topic] + ([kafka.label_topic] if kafka.label_topic else [])

    def _connect(self) -> bool:
        """Create the clients (retrying with backoff); False when stopped meanwhile."""
        from kafka import KafkaConsumer, KafkaProducer
        from kafka.errors import KafkaConfigurationError, KafkaError

        config = self.config
        retry = config.retry
        backoff = _Backoff(
            retry.initial_backoff_seconds, retry.max_backoff_seconds, retry.max_attempts
        )
        client = kafka_client_settings(config)
        # kafka-python 3 blocks each client's construction for its own bootstrap_timeout_ms
        # (default 30 s, whatever request_timeout_ms says), reconnecting with its own backoff
        # up to 30 s: the retry.* settings, the retry log lines and a SIGTERM all waited for
        # that. One attempt now lasts request_timeout_ms, and no client backoff exceeds ours.
        client.update(
            bootstrap_timeout_ms=config.kafka.request_timeout_ms,
            reconnect_backoff_max_ms=max(50, int(retry.max_backoff_seconds * 1000)),
        )
        tls = tls_context(config)  # (the probe's handshake is the client's)
        servers = ",".join(client["bootstrap_servers"])
        log.info("connecting to %s", servers)
        while not self.stop_event.is_set():
            try:
                cause = _unreachable(client["bootstrap_servers"], self.stop_event,
                                     config.kafka.request_timeout_ms / 1000,
                                     kafka_request=config.kafka.security_protocol == "PLAINTEXT",
                                     tls=tls)
                if self.stop_event.is_set():
                    break
                if cause is not None:
                    raise OSError(cause)
                limit_inflation(config.kafka.max_inflated_batch_bytes)
                consumer = KafkaConsumer(
                    **client,
                    **self._group_settings(),
                    group_id=config.kafka.group_id,
                    enable_auto_commit=False,
                    # Every position is set explicitly (_seek); an offset out of range must
                    # raise rather than be reset silently (kafka.on_partition_reset decides).
                    auto_offset_reset="none",
                    # Its metadata requests must not create a missing input topic (brokers with
                    # auto-creation, Tansu and Kafka's default, do): after a broker restarted
                    # empty, the daemon recreated its input topic with the broker's default
                    # partition count before the operator could, and the messages sent to the
                    # partitions it did not read were never read. Topics are created only by
                    # kafka.create_topics, with kafka.topic_partitions.
                    allow_auto_create_topics=False,
                    max_partition_fetch_bytes=max(1_048_576, config.kafka.max_message_bytes),
                    fetch_max_wait_ms=config.kafka.fetch_max_wait_ms,
                    isolation_level=config.kafka.isolation_level,
                )
                _forbid_auto_creation(consumer)
                if not config.kafka.create_topics:
                    self._check_output_topics(consumer)
                # Missing topics are created (kafka.create_topics) only once every check
                # that may refuse the start has passed: a refused start left topics behind,
                # a label topic of another partition count than the input's for good.
                if self.scope != "global":
                    partitions = []
                    self._subscribe(consumer, client)
                else:
                    self._refuse_scoped_group(consumer)
                    self._refuse_a_lost_model(consumer, self._existing_partitions(consumer))
                    self._create_topics(client, self._topics())
                    partitions = self._partitions(consumer)
                    self._warn_of_a_window_over_partitions(partitions)
                    self._hint_at_the_order(partitions)
                    consumer.assign(partitions)
                    self._seek(consumer, partitions)
                    self._check_topic_ids(consumer)
                    if self._publishes and self._epoch is None:
                        # Only once every check that may refuse the start has passed: a
                        # claim fences the learner that runs, and a refused second learner
                        # (an empty checkpoint directory, by mistake) stopped it.
                        self._claim()
                    self._create_topics(client, self._written_topics())
                # (A scoped daemon too: a topic recreated under it stops it, see
                # _check_scoped_topic_ids, and a reconnect is verified as for one model.)
                _on_metadata(consumer, self._note_metadata)
                self._closed_connections = _connection_counter(consumer, "connections-closed")
                self._made_connections = _connection_counter(consumer, "connections-created")
                producer = KafkaProducer(
                    **client,
                    acks="all",
                    linger_ms=config.kafka.linger_ms,
                    max_request_size=_producer_limit(config.kafka.max_message_bytes),
                    retries=2_147_483_647,
                    max_in_flight_requests_per_connection=1,
                    # One request in flight waits for each acknowledgement in turn: a poll's
                    # outputs (500 answers, ~150 KB) in 16 KB batches (the client's default)
                    # took ten round trips per flush. 512 KB stays under the brokers' default
                    # limit on a record batch (message.max.bytes, 1 MB).
                    batch_size=512 << 10,
                    # Outputs are at-least-once (a restart may repeat some) and one request in
                    # flight keeps them in order; an idempotent producer adds nothing to that,
                    # and its producer id does not survive a broker that lost its state (a
                    # restarted embedded broker): every later send then failed for good.
                    enable_idempotence=False,
                )
            except StartRefused:
                with contextlib.suppress(Exception):
                    consumer.close()  # type: ignore[possibly-undefined]
                raise
            except StateFromNewerVersion as exc:  # (no retry reads it)
                with contextlib.suppress(Exception):
                    consumer.close()  # type: ignore[possibly-undefined]
                raise StartRefused(f"{exc}. Nothing was changed.") from None
            except KafkaConfigurationError as exc:
                # Settings the client refuses are refused again at every attempt: retrying
                # them as an unreachable broker went on for ever.
                with contextlib.suppress(Exception):
                    consumer.close()  # type: ignore[possibly-undefined]
                raise StartRefused(f"the Kafka client refuses the settings: {exc}") from None
            except (KafkaError, OSError, DaemonError, StateStoreError) as exc:
                self.metrics.broker_errors.inc()
                self.metrics.connected.set(0)
                with contextlib.suppress(Exception):
                    consumer.close()  # type: ignore[possibly-undefined]
                # A missing topic or a state topic that does not read back is no unreachable
                # broker: the broker answered (the message said otherwise, for minutes).
                what = (f"starting on the broker at {servers} failed"
                        if isinstance(exc, (DaemonError, StateStoreError))
                        else f"broker at {servers} unreachable")
                backoff.wait(self.stop_event, what, exc)
                continue
            self._consumer, self._producer = consumer, producer
            self._connected = True
            self.metrics.connected.set(1)
            log.info(
                "connected to %s: reading %s, writing %s and %s",
                servers,
                ", ".join(f"{tp.topic}[{tp.partition}]" for tp in partitions) or
                f"the partitions consumer group {config.kafka.group_id!r} assigns of "
                f"{', '.join(self._topics())} (one model per {self.scope})",
                config.kafka.output_topic,
                config.kafka.dead_letter_topic,
            )
            return True
        return False

    def _refuse_scoped_group(self, consumer: Any) -> None:
        """A global learner must not take over a consumer group whose models are per
        partition or key (its group record is on the group's state topic): it would read on
        from their committed offsets, and what it learned no per-key model would ever learn."""
        if self.role != "learner":
            return
        from connectors.scoped import GROUP_RECORD_ID

        topic = self.config.kafka.state_topic
        if topic not in consumer.topics():
            return
        store = state_store_for(self.config)
        try:
            found = store.restore([GROUP_RECORD_ID], log_level=logging.DEBUG)
        finally:
            store.close()
        record = found.get(GROUP_RECORD_ID)
        group = self.config.kafka.group_id
        owner = None if record is None else record.metadata.get("group_id", group)
        if owner is not None and owner != group:
            if not self._publishes:
                return  # (another group's topic, which this daemon neither reads nor writes)
            raise StartRefused(
                f"the state topic {topic} (kafka.state_topic) holds the record of consumer "
                f"group {owner!r}, whose models are per {record.metadata.get('scope')}: this "
                f"daemon of group {group!r} would publish its global model's state among "
                "them. Nothing was changed. Give it its own kafka.state_topic (by default "
                "\"<kafka.group_id>.state\").")
        if record is not None:
            raise StartRefused(
                f"consumer group {self.config.kafka.group_id!r} serves one model per "
                f"{record.metadata.get('scope')} (its record on {topic} says so), but this "
                "daemon has model.scope = \"global\". Nothing was changed. Start it with the "
                "group's model.scope, or use another kafka.group_id for a global model.")

    def _model_cache_dir(self) -> Path | None:
        """With model.scope partition or key and checkpoint.dir set: where evicted models are
        kept on local disk (read back without the broker while still the newest state)."""
        config = self.config
        if self.scope == "global" or config.sources["checkpoint.dir"] == "default":
            return None
        return Path(config.checkpoint.dir) / "models"

    def _group_settings(self) -> dict[str, Any]:
        """Consumer settings of a member of the consumer group (model.scope partition or key):
        the range assignor gives partition i of the input and label topics to the same
        member, so that a label reaches the process that owns its message's model."""
        if self.scope == "global":
            return {}
        from kafka.coordinator.assignors.range import RangePartitionAssignor

        kafka = self.config.kafka
        return {
            "session_timeout_ms": kafka.session_timeout_ms,
            "heartbeat_interval_ms": kafka.heartbeat_interval_ms,
            "partition_assignment_strategy": [RangePartitionAssignor],
        }

    def _subscribe(self, consumer: Any, client: dict[str, Any]) -> None:
        """Join the consumer group (model.scope partition or key); partitions arrive through
        the rebalance listener at the next polls. Missing topics are created (with
        kafka.create_topics) once the checks of what served the group before have passed,
        and counted before the group's record is checked or written."""
        from kafka import ConsumerRebalanceListener

        config = self.config
        kafka = config.kafka
        partitions = (self._existing_partitions(consumer) if kafka.create_topics
                      else self._partitions(consumer))  # (raises if missing)
        counts = self._partition_counts(partitions)
        missing = [topic for topic, count in counts.items() if count == 0]
        for topic in missing:
            counts[topic] = kafka.topic_partitions
        self._refuse_unequal_counts(counts, missing)
        if self._state_store is None:
            self._state_store = state_store_for(config)
        # The group's committed offsets, read before anything is written: a group that has
        # them and no record on the state topic was served by a daemon without one (global).
        served = {} if self.models is not None else {
            f"{tp.topic}:{tp.partition}": offset for tp in partitions
            if (offset := consumer.committed(tp)) is not None}
        if served and not config.checkpoint.start_fresh and not self._state_store.topic_exists():
            raise StartRefused(served_without_a_record(config, served,
                                                       self._state_store.topic))
        self._state_store.ensure_topic(partitions=1)
        self._create_topics(client, self._topics() + self._written_topics())
        if missing:
            # Counted as they are now: a producer may have created one meanwhile, with
            # another count than the one assumed (which the group's record would keep).
            counts = self._partition_counts(self._partitions(consumer))
            self._refuse_unequal_counts(counts, [])
        if self.models is None:
            self.models = ScopedModels(config, self._state_store, self._new_processor,
                                       lambda: build_model(config), self.metrics,
                                       cache_dir=self._model_cache_dir())
            try:
                self.models.check_group(counts[config.kafka.input_topic], served)
            except ScopedStateRefused as exc:
                self.models = None
                raise StartRefused(str(exc)) from None
            except BaseException:  # (a state topic that did not answer: checked again)
                self.models = None
                raise
        daemon = self

        # kafka-python calls these on its IO thread, possibly while the main thread handles a
        # batch (a join that outlived a poll): they take the models' lock, and block on
        # nothing of this consumer (a blocking commit there fails: it commits asynchronously).
        class Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]
            def on_partitions_revoked(self, revoked: Any) -> None:
                daemon._revoked(revoked)

            def on_partitions_assigned(self, assigned: Any) -> None:
                daemon._assigned(assigned)

            def on_partitions_lost(self, lost: Any) -> None:
                daemon._lost(lost)

        consumer.subscribe(self._topics(), listener=Rebalance())

    def _partition_counts(self, partitions: list[Any]) -> dict[str, int]:
        counts = {topic: 0 for topic in self._topics()}
        for tp in partitions:
            counts[tp.topic] += 1
        return counts

    def _refuse_unequal_counts(self, counts: dict[str, int], missing: list[str]) -> None:
        """StartRefused unless the input and label topics have as many partitions (those
        ``missing`` counted as they would be created)."""
        if len(set(counts.values())) <= 1:
            return
        kafka = self.config.kafka
        made = (f" ({' and '.join(missing)} missing: it would be created with "
                f"kafka.topic_partitions = {kafka.topic_partitions}; set that to the other "
                "topic's count, or create the topic so)" if missing else "")
        raise StartRefused(
            f"the label topic must have as many partitions as the input topic with "
            f"model.scope = {self.scope!r} (a label reaches the model of its own partition "
            f"and key), but they have {counts}{made}. Nothing was changed.")

    def _revoked(self, revoked: Any) -> None:
        """The group takes partitions away (called inside poll, between two batches: every
        output of this process is flushed): publish their models and commit their offsets."""
        models = self.models
        partitions = {tp.partition for tp in revoked}
        if self._pacer is not None:
            self._pacer.forget(partitions)
        if models is None or not partitions:
            return
        self._rebalancing = True
        closed = self._closed_connections
        if (self._stopped_on_reset or self._verify_until
                or (closed is not None and closed() > self._closes_seen)
                or (self._consumer is not None
                    and not self._scoped_topics_as_started(self._consumer))):
            # After a lost connection, until the topics are checked (the broker may have
            # restarted empty), or once they were found recreated: their states would carry
            # offsets that the partitions may no longer hold. Their next owner resumes from the
            # last commit, as for lost partitions.
            with models.lock:
                models.lose(partitions)
            log.warning("partitions %s revoked while the topics are unchecked since a lost "
                        "connection to the broker, or found recreated: their models are dropped "
                        "unpublished (their next owner makes their latest changes again from "
                        "the last commit)", sorted(partitions))
            return
        log.info("partitions %s revoked: publishing their models and committing",
                 sorted(partitions))
        try:
            with models.lock:
                if self._undelivered:
                    log.error("the models of the revoked partitions are neither published nor "
                              "committed (the last batch was not delivered whole): their next "
                              "owner resumes from the last commit")
                models.revoke(partitions, self._commit_async, hand_over=not self._undelivered)
        except Exception:
            # kafka-python swallows a listener's exceptions: say what happened here.
            log.exception("handing over partitions %s failed; their next owner resumes from "
                          "the last commit", sorted(partitions))

    def _lost(self, lost: Any) -> None:
        """The group gave partitions to others while this process missed its session (paused,
        overloaded): their models are dropped unpublished, since the new owner resumed from
        the last commit and its states win over any this process would still write."""
        models = self.models
        partitions = {tp.partition for tp in lost}
        if self._pacer is not None:
            self._pacer.forget(partitions)
        if models is None or not partitions:
            return
        self._rebalancing = True
        with models.lock:
            dropped = sum(m[0] in partitions and v.dirty for m, v in models.live.items())
            models.lose(partitions)
        log.warning("partitions %s were lost (the group heard nothing from this process within "
                    "kafka.session_timeout_ms, %d ms: it paused, or the broker or the network "
                    "stalled): their models are dropped (%d with changes, which their new owner "
                    "makes again)",
                    sorted(partitions), self.config.kafka.session_timeout_ms, dropped)

    def _assigned(self, assigned: Any) -> None:
        """The group gives partitions: pause them until their models' states are indexed
        (:meth:`_settle`, after the poll)."""
        self._rebalancing = False
        self._joined_once = True
        # (The failures counted at an offset are kept: a group rebalancing more often than
        # UNFETCHABLE_SECONDS would otherwise never pass a damaged record. They count only at
        # the offset they were met at.)
        self._held_back.clear()  # (positioned and paused anew below when scoped)
        self._told_end.clear()
        if self._pacer is not None:  # (read anew from the committed offsets: see _settle)
            self._pacer.forget({tp.partition for tp in assigned})
        if self.models is None or not assigned:
            return
        kafka = self.config.kafka
        inputs = {tp.partition for tp in assigned if tp.topic == kafka.input_topic}
        with self.models.lock:
            # (Partition p of the label topic labels the models of input partition p: only
            # with it, see _unpaired_labels.)
            self.models.assign(inputs)
        # Positions for now (no committed offset must not raise); _settle seeks for real.
        self._consumer.pause(*assigned)
        self._consumer.seek_to_beginning(*assigned)
        if kafka.label_topic:
            self._unpaired_labels(inputs, {tp.partition for tp in assigned
                                           if tp.topic == kafka.label_topic})

    def _unpaired_labels(self, inputs: set[int], labels: set[int]) -> None:
        """Say (ERROR) where the group paired the input and label topics' partitions
        otherwise than partition by partition: members of the group that read different
        label topics (a rolling change of kafka.label_topic). A label partition without its
        input partition stays paused here (its labels belong to another member's models,
        which would have them dead-lettered unknown_id here); an input partition without its
        label partition has its labels read by nobody while it lasts."""
        kafka = self.config.kafka
        group = kafka.group_id
        alone = sorted(labels - inputs)
        if alone:
            log.error("partitions %s of the label topic %s were assigned here without the "
                      "same partitions of %s, which another member of group %r holds: the "
                      "group's members read different label topics (kafka.label_topic). They "
                      "are not read here (their labels belong to that member's models); give "
                      "every member the same kafka.label_topic", alone, kafka.label_topic,
                      kafka.input_topic, group)
        unlabelled = sorted(inputs - labels)
        if unlabelled:
            log.error("partitions %s of %s were assigned here without the same partitions of "
                      "the label topic %s: a member of group %r reads no label topic, or "
                      "another one (kafka.label_topic). Their labels are read by no one until "
                      "every member reads the same label topic (their unlabelled points wait "
                      "in the cache meanwhile)", unlabelled, kafka.input_topic,
                      kafka.label_topic, group)

    def _settle(self) -> bool:
        """Make the pending partitions ready: index their models' states, seek to the
        committed offsets, resume fetching. False when the state topic could not be read (the
        partitions stay paused; retried after a pause)."""
        from kafka import TopicPartition
        from kafka.errors import KafkaError

        models = self.models
        assert models is not None
        try:
            # Outside the lock: committed() waits for the consumer's IO thread, which may be
            # waiting for the lock in a listener.
            committed = {
                partition: {f"{topic}:{partition}": self._consumer.committed(
                    TopicPartition(topic, partition)) for topic in self._topics()}
                for partition in set(models.pending)
            }
            with models.lock:
                resume = models.settle(committed, self.config.checkpoint.start_fresh)
        except ScopedStateRefused as exc:
            raise StartRefused(str(exc)) from None
        except StateFromNewerVersion as exc:  # (no retry reads it)
            raise StartRefused(f"{exc}. Nothing was changed.") from None
        except (StateStoreError, KafkaError) as exc:
            self.metrics.broker_errors.inc()
            log.warning("partitions %s wait: %s", sorted(models.pending), exc)
            return False
        for name, offset in resume.items():
            topic, _, partition = name.rpartition(":")
            tp = TopicPartition(topic, int(partition))
            try:
                if offset is None:
                    self._consumer.seek_to_beginning(tp)
                else:
                    self._consumer.seek(tp, offset)
                # A partition this process read before keeps kafka-python's high watermark
                # from then (a seek leaves it): 30 against a resume at 60 read as lost offsets
                # and stopped the daemon. It is judged once a fetch has told a new one.
                self._highwater_at_seek[name] = self._consumer.highwater(tp)
                _resume(self._consumer, tp)
            except Exception as exc:  # revoked meanwhile by a join that outlived a poll
                log.debug("partition %s moved on before it was resumed: %s", name, exc)
        return True

    def _commit_retry(self) -> str:
        """What follows a failed offset commit, for its log line (a stop makes no next
        batch: the checkpoint or the published states hold the offsets instead)."""
        if self.stop_event.is_set():
            return ("not retried, the daemon is stopping: its next start resumes from the "
                    "checkpoint's offsets" if self.models is None else
                    "not retried, the daemon is stopping: the next owner resumes from the last "
                    "commit and the published states")
        return "retrying with the next batch"

    @staticmethod
    def _offsets_of(offsets: dict[str, int]) -> dict[Any, Any]:
        from kafka import OffsetAndMetadata, TopicPartition

        return {
            TopicPartition(name.rpartition(":")[0], int(name.rpartition(":")[2])):
                OffsetAndMetadata(offset, "", -1)
            for name, offset in offsets.items()
        }

    def _commit_async(self, offsets: dict[str, int]) -> None:
        """Commit from a rebalance listener (on the consumer's IO thread, where a blocking
        commit fails); a failure only means the next owner reads a little more again."""

        def done(committed: Any, result: Any) -> None:
            if isinstance(result, Exception):
                log.warning("committing the offsets of revoked partitions failed (%s): their "
                            "next owner resumes from the previous commit", result)

        self._consumer.commit_async(self._offsets_of(offsets), callback=done)

    def _claim(self) -> None:
        """A publishing learner's start: create the state topic if missing and claim the next
        epoch of the model, so that predictors prefer its states to any older learner's."""
        if self._state_store is None:
            self._state_store = state_store_for(self.config)
        store = self._state_store
        store.ensure_topic(partitions=1)  # one model: one partition holds all its records
        published = self._published_state(store)
        self._refuse_another_models_state(store, published)
        try:
            # Above the epoch its checkpoint published under: a state topic recreated since
            # starts again at 0, below what the predictors already serve.
            epoch = store.claim_epoch(GLOBAL_MODEL_ID, at_least=self._checkpointed_epoch + 1)
        except StaleEpochError as exc:
            raise StartRefused(
                f"{exc}: another learner of this model started at the same moment; two "
                "learners of one model must not both publish. Stop one of them."
            ) from None
        self._epoch, self._sequence = epoch, 0
        self._state_behind = True
        assert self.processor is not None
        self.processor.generation = generation(epoch, 0)
        self.metrics.replica[0].set(0)
        log.info("publishing the model's state on %s as model %s, epoch %d",
                 store.topic, list(GLOBAL_MODEL_ID), epoch)
        self._publish_from = self._newer_published_offsets(store, published)

    def _read_to_the_end(self, names: Mapping[str, int]) -> bool:
        """Whether the model has read every partition of ``names`` to the end its last fetch
        showed (the high watermark; not known before a fetch returned: False)."""
        from kafka import TopicPartition
        from kafka.errors import IllegalStateError

        assert self.processor is not None
        if self._consumer is None:
            return False
        for name in names:
            topic, _, partition = name.rpartition(":")
            try:
                high = self._consumer.highwater(TopicPartition(topic, int(partition)))
            except (ValueError, AssertionError, IllegalStateError):  # (no longer assigned)
                return False
            if high is None or self.processor.offsets.get(name, 0) < high:
                return False
        return True

    @staticmethod
    def _published_state(store: StateStore) -> Any:
        """The newest state of the model on the state topic, its arrays not decoded (None
        when there is none, or it cannot be read: then publishing goes on as usual)."""
        try:
            return store.restore([GLOBAL_MODEL_ID], decode=False,
                                 log_level=logging.DEBUG).get(GLOBAL_MODEL_ID)
        except StateStoreError as exc:
            log.warning("reading the newest state of the model on %s failed (%s): publishing "
                        "as usual", store.topic, exc)
            return None

    def _refuse_another_models_state(self, store: StateStore, state: Any) -> None:
        """StartRefused when the state topic's newest state is another model's: made with
        other settings, or on another input topic. Claimed and published over, it was
        replaced in every predictor (those of the other model refused the new states), and
        its offsets, of partitions this learner does not read, stopped the learner at its
        first checkpoint ("Partition is not assigned"), at every restart."""
        if state is None:
            return
        metadata = state.metadata
        changed = settings_mismatch(metadata.get("model_settings"),
                                    checkpointed_settings(self.config))
        read = metadata.get("input_topic")
        if changed is None and read in (None, self.config.kafka.input_topic):
            return
        what = (f"made with other settings ({changed})" if changed is not None else
                f"made on the input topic {read}, not {self.config.kafka.input_topic}")
        raise StartRefused(
            f"the state topic {store.topic} holds another model's state (generation "
            f"{generation(state.epoch, state.sequence)}, group {metadata.get('group_id')!r}, "
            f"{what}): publishing here would replace that model in every predictor. Nothing "
            "was changed. Give this learner its own kafka.state_topic, or the settings and "
            "input topic of the model it continues.")

    def _newer_published_offsets(self, store: StateStore, state: Any) -> dict[str, int] | None:
        """The offsets of the model's newest ``state`` on the state topic where they are ahead
        of the restored model's (None when none is): its local checkpoints fell behind what
        it published (a disk that could not be written, a checkpoint directory restored from
        a backup). Published at once under the new epoch, the older model would have replaced
        the newer one in every predictor, without a word, until the replay caught up."""
        assert self.processor is not None
        offsets = None if state is None else state.metadata.get("offsets")
        if not isinstance(offsets, dict):
            return None
        ahead = {name: offset for name, offset in offsets.items()
                 if isinstance(name, str) and isinstance(offset, int)
                 and offset > self.processor.offsets.get(name, 0)}
        if not ahead:
            return None
        assert state is not None
        log.warning(
            "the state topic %s holds a newer state of this model (generation %s, %s model "
            "updates, offsets %s) than the one restored here (%d model updates, offsets %s): "
            "the local checkpoints fell behind what was published (could they not be "
            "written?). Predictors keep serving that state: this learner publishes once it has "
            "read past those offsets", store.topic, generation(state.epoch, state.sequence),
            state.metadata.get("model_updates"), offsets, self.processor.model_updates,
            dict(self.processor.offsets))
        return ahead

    def _written_topics(self) -> list[str]:
        kafka = self.config.kafka
        return [kafka.output_topic, kafka.dead_letter_topic]

    def _create_topics(self, client: dict[str, Any], topics: list[str]) -> None:
        """With kafka.create_topics: create those of ``topics`` that are missing, with
        kafka.topic_partitions partitions."""
        kafka = self.config.kafka
        if kafka.create_topics:
            self._created_topics.update(ensure_topics(client, topics, kafka.topic_partitions))

    def _check_output_topics(self, consumer: Any) -> None:
        """DaemonError for a missing output or dead-letter topic (``kafka.create_topics``
        false): the producer's first send had the broker create it with the broker's own
        partition count, or lost every output on a broker that creates none."""
        kafka = self.config.kafka
        deadline = time.monotonic() + self._missing_topic_wait([])
        wanted = {kafka.output_topic: "kafka.output_topic",
                  kafka.dead_letter_topic: "kafka.dead_letter_topic"}
        while True:
            missing = [topic for topic in wanted if topic not in consumer.topics()]
            if not missing or time.monotonic() >= deadline or self.stop_event.is_set():
                break
            self.stop_event.wait(0.2)
        if self.stop_event.is_set():
            return  # (stopping: the start goes no further)
        if missing:
            raise DaemonError(", ".join(
                f"topic {topic} ({wanted[topic]}) does not exist" for topic in missing)
                + " (create it, or set kafka.create_topics = true to have it created)")

    def _warn_of_a_window_over_partitions(self, partitions: list[Any]) -> None:
        """A window or batches (one model over the inputs' partitions) depend on the order the
        messages arrive in, which Kafka keeps only within a partition: said once at start."""
        inputs = [tp for tp in partitions if tp.topic == self.config.kafka.input_topic]
        model_type = self.config.model.type
        if len(inputs) > 1 and model_type in ("SlidingWindowSVC", "SlidingWindowSVR",
                                              "AlphaISVC") and not self._warned_order:
            self._warned_order = True
            log.warning(
                "this daemon reads %d partitions of %s into one %s, which depends on the order "
                "of the messages: Kafka keeps it only within a partition, and the partitions' "
                "messages interleave differently from run to run. Keep the topic to one "
                "partition, key its messages alike, or use model.scope = \"partition\"",
                len(inputs), self.config.kafka.input_topic, model_type)

    def _hint_at_the_order(self, partitions: list[Any]) -> None:
        """An input topic of several partitions is read in order only within each: an
        unknown_id dead letter then says that the id's learn may not have been read yet."""
        inputs = sum(tp.topic == self.config.kafka.input_topic for tp in partitions)
        if self.processor is not None and inputs > 1:
            self.processor.unknown_id_hint = (
                f"; this daemon reads {inputs} partitions of {self.config.kafka.input_topic}, "
                "in order only within each: the id's learning message may be on another "
                "partition, not read yet. Send every message of an id with the same Kafka key "
                "(the id), which keeps them on one partition, in order")

    def _partitions(self, consumer: Any) -> list[Any]:
        from kafka import TopicPartition

        kafka = self.config.kafka
        partitions = []
        for topic in self._topics():
            found = None
            deadline = time.monotonic() + self._missing_topic_wait([topic])
            # (kafka-python gives None or an empty set for a topic it does not know)
            while (not found and time.monotonic() < deadline
                   and not self.stop_event.is_set()):  # (a stop ends the wait at once)
                consumer.topics()  # refreshes the metadata
                found = consumer.partitions_for_topic(topic)
                if not found:
                    self.stop_event.wait(0.2)
            if not found:
                setting = "kafka.input_topic" if topic == kafka.input_topic else "kafka.label_topic"
                raise DaemonError(
                    f"topic {topic} ({setting}) does not exist"
                    + (": it was created, but the broker does not list it"
                       if topic in self._created_topics else
                       " (create it, or set kafka.create_topics = true to have it created)"))
            partitions += [TopicPartition(topic, p) for p in sorted(found)]
        return partitions

    def _missing_topic_wait(self, topics: list[str]) -> float:
        """Seconds to wait for a topic the broker does not list yet: a topic this daemon has
        just created may take up to a request's timeout to show in the metadata; one it did
        not create, a few seconds (another tool's creation spreading over the brokers). A
        missing topic took 30 s per attempt to be named."""
        timeout = self.config.kafka.request_timeout_ms / 1000
        if any(topic in self._created_topics for topic in topics):
            return timeout
        return min(timeout, MISSING_TOPIC_SECONDS)

    def _lost_model(self, name: str, committed: int) -> StartRefused:
        return StartRefused(
            f"{self.config.checkpoint.dir} holds no checkpoint, but the consumer group "
            f"{self.config.kafka.group_id!r} has committed offset {committed} for {name}: a "
            "model served this stream before, and a new one would silently replace it. "
            "Nothing was changed. Restore the checkpoint directory, or run with --start-fresh "
            "(checkpoint.start_fresh = true) to start a new, empty model from the committed "
            "offsets.")

    def _refuse_a_lost_model(self, consumer: Any, partitions: list[Any]) -> None:
        """StartRefused, before anything is created or read, when a learner restored no
        checkpoint (and start_fresh is not set) but its group committed offsets on one of
        ``partitions``: see _seek, which seeks there with start_fresh."""
        assert self.processor is not None
        if self.role != "learner" or self._restored or self.config.checkpoint.start_fresh:
            return
        for tp in partitions:
            name = f"{tp.topic}:{tp.partition}"
            if name not in self.processor.offsets:
                found = consumer.committed(tp)
                if found is not None:
                    raise self._lost_model(name, found)

    def _existing_partitions(self, consumer: Any) -> list[Any]:
        """The partitions of the topics read that exist now (no wait for missing ones)."""
        from kafka import TopicPartition

        existing = consumer.topics()  # (refreshes the metadata)
        return [TopicPartition(topic, p) for topic in self._topics() if topic in existing
                for p in sorted(consumer.partitions_for_topic(topic) or ())]

    def _seek(self, consumer: Any, partitions: list[Any]) -> None:
        assert self.processor is not None
        fresh: list[str] = []
        ignored: list[str] = []
        uncommitted: list[str] = []
        missed: list[Any] = []
        # (what this model's checkpoint had committed: held warm-up messages commit short)
        expected = _committable(self.processor)
        for tp in partitions:
            name = f"{tp.topic}:{tp.partition}"
            found = consumer.committed(tp, metadata=True)
            committed = None if found is None else found.offset
            self._group_known[name] = None if found is None else (found.offset,
                                                                  found.metadata or "")
            if name in self.processor.offsets:
                resume = self.processor.offsets[name]
                if (committed is not None and committed != expected.get(name, resume)
                        and self.role != "predictor"):
                    difference = f"{name} committed {committed}, the model {resume}"
                    if committed < expected.get(name, resume) and (
                            (found.metadata or "").startswith(COMMIT_METADATA_PREFIX)
                            or (found.metadata is None
                                and committed in self._committed_before.get(name, ()))):
                        # A daemon's own commit (its metadata), behind its newest checkpoint:
                        # it stopped between writing a checkpoint and committing its offsets.
                        # A broker that keeps no commit metadata (None; the embedded one):
                        # the group's offsets as that checkpoint recorded them, which an
                        # operator's reset to those very offsets would read alike. (Kafka
                        # keeps it: a tool's reset writes "".)
                        uncommitted.append(difference)
                    else:
                        ignored.append(difference)
                consumer.seek(tp, resume)
                continue
            if self.role == "predictor":
                # A predictor's progress is its group's committed offsets (it writes no
                # checkpoint); a new group answers the topic from its beginning.
                if committed is None:
                    consumer.seek_to_beginning(tp)
                else:
                    consumer.seek(tp, committed)
                    self.processor.offsets[name] = committed
                continue
            if committed is not None and not self._restored:
                # The group committed offsets: a model served this stream, and its checkpoints
                # are gone (or were never written here).
                if not self.config.checkpoint.start_fresh:
                    raise self._lost_model(name, committed)
                fresh.append(f"{name}@{committed}")
                consumer.seek(tp, committed)
                self.processor.offsets[name] = committed
            else:
                consumer.seek_to_beginning(tp)
                if not self._restored:
                    missed.append(tp)
        if missed:
            self._warn_of_missed_messages(consumer, missed)
        if fresh:
            log.warning(
                "start_fresh: a new, empty model starts at the committed offsets %s",
                ", ".join(fresh),
            )
        if uncommitted:
            log.info(
                "the group's committed offsets are behind the model's (%s): the daemon that "
                "committed them stopped after its last checkpoint and before committing it (a "
                "crash, a kill). The model reads on from its own offsets",
                "; ".join(uncommitted))
        if ignored:
            # (An operator's reset of the group's offsets was otherwise dropped without a word.)
            log.warning(
                "the group's committed offsets differ from the model's (%s): a tool reset them, "
                "the last commit did not complete, or an older checkpoint was restored. The "
                "model reads on from its own offsets, each message learned once and in order; "
                "a committed offset does not move it",
                "; ".join(ignored))

    def _warn_of_missed_messages(self, consumer: Any, partitions: list[Any]) -> None:
        """A new, empty model reads ``partitions`` from their beginnings: a WARNING for those
        that no longer begin at offset 0 (retention removed their first messages, which the
        model will never learn). Told only by an INFO line, a start with a checkpoint.dir
        resolved elsewhere, once the group's committed offsets were gone (deleted, or expired
        a week after its last member left), passed for a first start."""
        try:
            first = consumer.beginning_offsets(partitions)
        except Exception as exc:  # (a hint only: the start goes on)
            log.debug("reading the partitions' first offsets failed (%s)", exc)
            return
        later = {f"{tp.topic}:{tp.partition}": offset for tp, offset in first.items()
                 if isinstance(offset, int) and offset > 0}
        if later:
            log.warning(
                "a new, empty model (no checkpoint in %s, no committed offsets) reads from "
                "the first offsets left in its partitions (%s): the messages before them are "
                "gone from the topic and will not be learned. If this stream had a model, its "
                "checkpoint.dir is another (a relative path is taken from the working "
                "directory)",
                self.config.checkpoint.dir,
                ", ".join(f"{name} from {offset}" for name, offset in sorted(later.items())))

    # -- partitions that lost the offsets the model resumes from ---------------------------

    #: Seconds between two checks of the topics' ids and partitions in the consumer's metadata.
    TOPIC_CHECK_SECONDS = 10.0

    def _check_topic_ids(self, consumer: Any) -> None:
        """Compare the topics' ids with those the checkpoint recorded: a new id means the topic
        was deleted and recreated, so the offsets the model resumes from mean nothing there."""
        assert self.processor is not None
        # A reset's mark lasts until the metadata surely shows the topic as it was then.
        horizon = time.monotonic() - (
            getattr(consumer, "config", {}).get("metadata_max_age_ms", 300_000) / 1000 + 60.0
        )
        for name, when in list(self._repositioned.items()):
            if when < horizon:
                del self._repositioned[name]
        for topic in self._topics():
            current = _topic_id(consumer, topic)
            saved = self.processor.topic_ids.get(topic)
            if current is None:
                continue
            if saved is not None and saved != current:
                for tp in consumer.assignment():
                    if tp.topic != topic:
                        continue
                    name = f"{tp.topic}:{tp.partition}"
                    if self._repositioned.pop(name, None) is not None:
                        log.info(
                            "topic %s has the id %s, the model read %s: the loss already "
                            "noticed at %s, which is read from offset %d on",
                            topic, current, saved, name, self.processor.offsets.get(name, 0),
                        )
                        continue
                    self._partition_reset(
                        consumer, tp, "topic_recreated",
                        f"topic {topic} has the id {current}, the model read {saved}",
                    )
            self.processor.topic_ids[topic] = current

    def _check_scoped_topic_ids(self, consumer: Any) -> None:
        """With model.scope partition or key: stop (exit 1, publishing and committing nothing)
        when an input topic gets a new id, which means the broker lost its data or the topic
        was deleted: the models' states hold offsets of the old topic."""
        # (The input topics only: the consumer's metadata holds the topics it subscribed to,
        # and a state topic recreated on a broker that kept the others is met as a new group,
        # with a warning, see ScopedModels.check_group.)
        for topic in self._topics():
            current = _topic_id(consumer, topic)
            if current is None:
                continue
            saved = self._scoped_topic_ids.setdefault(topic, current)
            if saved == current or self._stopped_on_reset:
                continue
            self.metrics.partition_resets.labels(
                topic=topic, partition="all", cause="topic_recreated").inc()
            log.error(
                "topic %s has the id %s, it had %s when this daemon started: it was deleted "
                "and recreated, or the broker lost its data (the embedded broker keeps topics "
                "in memory only). Stopping, publishing and committing nothing: with "
                "model.scope = %r the models' states on %s hold offsets of the old topics, or "
                "were lost with them. Restore the topics, or start new models with a new "
                "kafka.group_id and kafka.state_topic.",
                topic, current, saved, self.config.model.scope, self.config.kafka.state_topic)
            self.summary.exit_code = 1
            self._stopped_on_reset = True
            self.stop_event.set()
            return

    def _scoped_topics_as_started(self, consumer: Any) -> bool:
        """Whether the client's metadata shows every topic of a scoped daemon with the id it
        had at start (a missing topic does not: the broker may have lost it)."""
        return all(
            _topic_id(consumer, topic) == saved
            for topic, saved in self._scoped_topic_ids.items()
        )

    def _check_new_partitions(self, consumer: Any) -> None:
        """Read the partitions an input topic gained (added, or the topic was recreated with
        more): partitions are assigned, not balanced, so without this the messages sent to them
        were never read, silently. A partition the model never read is read from its beginning
        (as at start); one it read before resumes at the model's offset (a partition that
        lost it is then noticed as any other)."""
        from kafka import TopicPartition

        assert self.processor is not None
        for topic in self._topics():
            missing = _known_partitions(consumer, topic) is None
            if missing and topic not in self._missing_topics:
                log.warning(
                    "topic %s does not exist on the broker (any more): nothing of it is read "
                    "until it is created again (the daemon creates topics only when it starts, "
                    "with kafka.create_topics)", topic,
                )
                self._missing_topics.add(topic)
            elif not missing and topic in self._missing_topics:
                log.info("topic %s exists again", topic)
                self._missing_topics.discard(topic)
                self._held_since.pop(topic, None)
        assigned = list(consumer.assignment())
        added = [
            TopicPartition(topic, partition)
            for topic in self._topics()
            for partition in sorted(_known_partitions(consumer, topic) or ())
            if TopicPartition(topic, partition) not in assigned
        ]
        if not added:
            return
        consumer.assign(assigned + added)
        for tp in added:
            name = f"{tp.topic}:{tp.partition}"
            if name in self.processor.offsets:
                consumer.seek(tp, self.processor.offsets[name])
            else:
                consumer.seek_to_beginning(tp)
            # Known from the current metadata: a new topic id seen later is not news for it.
            self._repositioned[name] = time.monotonic()
            self.metrics.partitions_added.labels(topic=tp.topic).inc()
        log.warning(
            "new partitions %s: reading them (from the model's offset, or from their beginning "
            "if the model never read them)",
            ", ".join(f"{tp.topic}:{tp.partition}" for tp in added),
        )

    def _check_positions(self) -> None:
        """A position beyond the high watermark cannot happen while the partition keeps its
        data: it lost the offsets the model resumes from (the broker restarted empty, or the
        topic was recreated and holds fewer messages)."""
        consumer = self._consumer
        for tp in consumer.assignment():
            if self._verify_until or _known_partitions(consumer, tp.topic) is None:
                # Not before the metadata is checked after a lost connection, nor for a topic
                # it lacks: a broker that restarted empty answers fetches of a topic it no
                # longer has with a high watermark of 0, which stopped the daemon for lost
                # offsets where it waits for the topic (see _check_new_partitions); a topic
                # recreated since is noticed by its new id.
                continue
            high = consumer.highwater(tp)
            if high is None:
                continue
            name = f"{tp.topic}:{tp.partition}"
            if name in self._highwater_at_seek:
                if high == self._highwater_at_seek[name]:
                    continue  # no fetch has answered since the seek (see _settle)
                del self._highwater_at_seek[name]
            position = _position(consumer, tp, self.config.kafka.poll_timeout_ms)
            if position is not None and position > high and name not in self._resumed:
                self._partition_reset(
                    consumer, tp, "beyond_end",
                    f"the model resumes at offset {position}, the partition ends at {high}",
                )
        now = time.monotonic()
        if self.models is not None:
            # The consumer group assigns new partitions; a lost offset stops (above), and so
            # does a topic recreated under the daemon, which a rejoin after a lost session
            # would otherwise meet as a new group: new, empty models, silently.
            updates = self._metadata_updates
            if now - self._last_topic_check >= self.TOPIC_CHECK_SECONDS or (
                    updates != self._metadata_checked):
                self._metadata_checked = updates
                self._last_topic_check = now
                self._check_scoped_topic_ids(consumer)
                if (self._verify_until and updates > self._updates_at_close
                        and self._scoped_topics_as_started(consumer)):
                    self._verify_until = 0.0
                    log.info("topics checked after the reconnect: reading on")
            return
        updates = self._metadata_updates  # read once: the IO thread may count on meanwhile
        if (now - self._last_topic_check >= self.TOPIC_CHECK_SECONDS or now < self._recheck_until
                or updates != self._metadata_checked):
            self._metadata_checked = updates
            self._last_topic_check = now
            self._check_topic_ids(consumer)
            if not self._stopped_on_reset:  # (no "reading them" while it stops)
                self._check_new_partitions(consumer)
            if self._verify_until and updates > self._updates_at_close:
                # Metadata fetched after the lost connection, checked: what the partitions
                # return from now on is the topic the model read (or a reset was decided).
                self._verify_until = 0.0
                if not self._stopped_on_reset:  # (said after "stopping" it read as a resume)
                    log.info("topics checked after the reconnect: reading on")

    def _note_metadata(self, _cluster: Any) -> None:
        self._metadata_updates += 1  # on the client's IO thread, its only writer

    def _notice_reconnect(self) -> None:
        """After a connection closed, hold what the polls return until metadata fetched since
        has been checked (a broker that restarted empty may hold a recreated topic with other
        messages at the model's offsets: one poll of them was learned and answered before
        the check of the topic's id noticed)."""
        if self._consumer is None:
            return
        if not self._verify_until:
            log.info("a connection to the broker closed: once reconnected, holding what is "
                     "read until the topics' metadata is checked again")
        # A topic this daemon created may be another one after this (a broker that
        # restarted empty, whose producers created it again): its reset no longer says so.
        self._created_topics.clear()
        # As of the look before this close could have been followed by a reconnect.
        self._made_at_close = self._made_seen
        self._updates_at_close = self._metadata_updates
        # No deadline yet: it counts from the reconnect (_hold_until_verified). Counted from
        # the close, an outage longer than the wait had used it up, and the first records
        # after the reconnect, of a topic recreated on a broker that restarted empty, were
        # learned and checkpointed unchecked.
        self._verify_until = math.inf
        _request_metadata(self._consumer)

    def _verify_seconds(self) -> float:
        return max(5.0, self.config.kafka.request_timeout_ms / 1000)

    def _hold_until_verified(self, records: list[Any]) -> list[Any]:
        """Records polled while a reconnect is unverified: none is handled; each partition is
        read again from the model's offset once the check has passed. Past the deadline (no
        metadata came) they are handled, with a warning: the stream must not stop for it."""
        reconnected = (self._made_connections() > self._made_at_close
                       if self._made_connections is not None else self._connected)
        if not reconnected:
            # No connection made since the close: fetched before it (the client's buffer),
            # from the topic the model was reading.
            return records
        if self._verify_until == math.inf:  # the first records since the reconnect
            self._verify_until = time.monotonic() + self._verify_seconds()
            _request_metadata(self._consumer)  # (the request at the close may have failed)
        if time.monotonic() >= self._verify_until:
            self._verify_until = 0.0
            log.warning("no metadata came within %.0f s of the reconnect: reading on without "
                        "the check of the topics", self._verify_seconds())
            return records
        self._seek_back(records)
        return []

    def _hold_missing_topics(self, records: list[Any]) -> list[Any]:
        """Records of a topic the last metadata check found missing are not handled: the
        client fetched them with the partition leaders it knew before (seen when a broker
        restarted empty and the topic was created again with other messages). Their partitions
        are read again from the model's offsets once metadata showing the topic has been
        checked (a new id: its offsets mean nothing to the model). If the metadata still lacks
        the topic after max(5 s, request_timeout_ms) while its messages keep coming, they are
        handled, with a warning: the stream must not stop for it."""
        now = time.monotonic()
        holding = set()
        for topic in {record.topic for record in records} & self._missing_topics:
            since = self._held_since.setdefault(topic, now)
            if now - since < self._verify_seconds():
                if since == now:
                    log.info("holding the messages of %s until the metadata shows the topic "
                             "again", topic)
                holding.add(topic)
            elif since != -math.inf:
                log.warning("messages of %s keep coming while the metadata has lacked the "
                            "topic for %.0f s: reading on without the check of its id",
                            topic, now - since)
                self._held_since[topic] = -math.inf
        if not holding:
            return records
        self._seek_back([record for record in records if record.topic in holding])
        return [record for record in records if record.topic not in holding]

    def _seek_back(self, records: list[Any]) -> None:
        """Read the partitions of these records again from the model's offsets (or from the
        first of them, for a partition the model never read), and ask for metadata."""
        from kafka import TopicPartition

        first: dict[tuple[str, int], int] = {}
        for record in records:
            key = (record.topic, record.partition)
            first[key] = min(first.get(key, record.offset), record.offset)
        for (topic, partition), offset in first.items():
            name = f"{topic}:{partition}"
            if name in self._reset_since_poll:
                continue  # positioned by its reset just now (e.g. to its end)
            resume = offset if self.processor is None else self.processor.offsets.get(name, offset)
            try:
                self._consumer.seek(TopicPartition(topic, partition), resume)
            except ValueError:  # (a scoped daemon's partition, moved on by a rebalance since)
                log.debug("partition %s moved on before it was read again", name)
        _request_metadata(self._consumer)

    def _partition_reset(self, consumer: Any, tp: Any, cause: str, detail: str) -> None:
        name = f"{tp.topic}:{tp.partition}"
        policy = self.config.kafka.on_partition_reset  # always "stop" with model.scope != global
        if policy != "resume":
            self._reset_since_poll.add(name)
        self.metrics.partition_resets.labels(
            topic=tp.topic, partition=str(tp.partition), cause=cause
        ).inc()
        try:
            partitions = consumer.partitions_for_topic(tp.topic)
        except Exception:  # (the metadata is only a hint here)
            partitions = None
        problem = (
            f"partition {name} no longer holds the offsets this model resumes from ({detail}): "
            "the topic was deleted and recreated, or the broker lost its data (the embedded "
            "broker keeps topics in memory only)" + (
                f"; {tp.topic} was missing at this start, and this daemon created it anew "
                "(kafka.create_topics)" if tp.topic in self._created_topics else "") + (
                f"; {tp.topic} has {len(partitions)} partition(s) now" if partitions else "")
        )
        if policy != "stop":
            assert self.processor is not None
            if self._publish_from is not None and policy != "resume":
                # (read anew, it never reaches a state's offsets in the partition it lost)
                self._publish_from.pop(name, None)
        if policy == "resume":
            # The operator vouches that the partition holds the same messages at the same
            # offsets (restored from a backup): keep reading at the model's offsets.
            if name not in self._resumed:
                self._resumed.add(name)
                log.warning(
                    "%s. kafka.on_partition_reset = 'resume': the model keeps reading %s at "
                    "offset %d", problem, name, self.processor.offsets.get(name, 0),
                )
            return
        if policy == "stop":
            if name in self._stop_reasons_logged:
                return  # stopping already for this partition (one ERROR line, not two)
            self._stop_reasons_logged.add(name)
            if self.models is not None:
                message = (
                    f"{problem}. Stopping, nothing of it was read and no offset is committed. "
                    f"With model.scope = {self.config.model.scope!r} the models' states on "
                    f"{self.config.kafka.state_topic} hold their offsets in the old partition: "
                    "restore the topics, or start new models with a new kafka.group_id and "
                    "kafka.state_topic."
                )
            else:
                message = (
                    f"{problem}. kafka.on_partition_reset = 'stop': stopping, nothing of it "
                    "was read. Set it to 'earliest' to keep the model and read the partition "
                    "from its beginning, 'latest' to keep the model and read only new "
                    "messages, or 'resume' if the partition was restored with the same "
                    "messages at the same offsets (--on-partition-reset)."
                )
            if self._consumer is None:  # still starting: refuse to start
                raise StartRefused(message)
            log.error("%s", message)
            self.summary.exit_code = 1
            self._stopped_on_reset = True
            self.stop_event.set()
            return
        if policy == "earliest":
            consumer.seek_to_beginning(tp)
        else:
            consumer.seek_to_end(tp)
        position = _position(consumer, tp, self.config.kafka.request_timeout_ms)
        # Until then the partition is not fetched; once the topic is back, what it reads from
        # where the seek lands is new to the model: nothing of it may be skipped.
        self.processor.offsets[name] = 0 if position is None else position
        if cause != "topic_recreated":
            self._repositioned[name] = time.monotonic()
        # The topic may have a new id and other partitions: learn them now, not in minutes.
        _request_metadata(consumer)
        self._recheck_until = time.monotonic() + 30.0
        where = (
            f"offset {position}" if position is not None else
            f"its {'beginning' if policy == 'earliest' else 'end'} once the broker has it again"
        )
        log.warning(
            "%s. kafka.on_partition_reset = %r: the model is kept and %s is read from %s",
            problem, policy, name, where,
        )

    def _watch_connection(self) -> None:
        """Count lost connections and export whether the consumer is connected (kafka-python
        reconnects by itself and reports neither)."""
        if self._connection_metric is None:
            metrics = self._consumer.metrics(raw=True) or {}
            self._connection_metric = next(
                (metric for key, metric in metrics.items()
                 if key.name == "connection-count" and key.group == "consumer-metrics"),
                False,
            )
        if self._connection_metric is False:  # pragma: no cover - another kafka-python
            return
        connected = self._connection_metric.value() > 0
        # Connections made first, closes second: a close counted here whose reconnect came
        # before the first read is still compared with the count of the previous look.
        made = self._made_connections() if self._made_connections is not None else 0.0
        closes = self._closed_connections() if self._closed_connections is not None else 0.0
        if closes > self._closes_seen or (self._connected and not connected):
            self._closes_seen = closes
            self._notice_reconnect()
        self._made_seen = made
        if self._connected and not connected:
            self.metrics.broker_errors.inc()
            log.warning("lost the connection to the broker; reconnecting")
        elif self._connected is False and connected:
            log.info("connected to the broker again")
        self._connected = connected
        self.metrics.connected.set(int(connected))

    # -- the loop --------------------------------------------------------------------------

    def _loop(self) -> None:
        from kafka.errors import KafkaError, OffsetOutOfRangeError

        assert self.processor is not None or self.models is not None
        config = self.config
        retry = config.retry
        backoff = _Backoff(retry.initial_backoff_seconds, retry.max_backoff_seconds, 0)
        settle_backoff = _Backoff(retry.initial_backoff_seconds, retry.max_backoff_seconds, 0)
        while not self.stop_event.is_set():
            if self._follower is not None:
                self._swap_model()
            if self.models is not None and self.models.fenced:
                self._rejoin_for_fenced()
            if self.models is not None and self.models.pending:
                if self._settle():
                    settle_backoff.reset()
                else:
                    settle_backoff.failures += 1
                    self.stop_event.wait(backoff_delay(retry.initial_backoff_seconds,
                                                       retry.max_backoff_seconds,
                                                       settle_backoff.failures))
            self._release_labels()
            self._release_held_back()
            # Only a reset noticed after this poll returned makes its records stale (one
            # before it re-positioned the partition, and the poll read from there).
            self._reset_since_poll.clear()
            try:
                polled = self._consumer.poll(
                    timeout_ms=self._poll_timeout_ms(), max_records=config.kafka.max_batch
                )
            except OffsetOutOfRangeError as exc:
                lost = exc.args[0] if exc.args and isinstance(exc.args[0], dict) else {}
                for tp, offset in lost.items():
                    self._partition_reset(
                        self._consumer, tp, "out_of_range",
                        f"the broker has no offset {offset} there any more",
                    )
                if not lost:
                    self.metrics.broker_errors.inc()
                    backoff.wait(self.stop_event, "poll failed", exc)
                continue
            except Exception as exc:
                unreadable = _unreadable_records(exc, self._consumer, self._memory_failures)
                if unreadable is None:
                    unreadable = self._unfetchable(exc)
                if unreadable == []:  # its partition held back; the others read on at once
                    continue
                if unreadable is None:
                    if not isinstance(exc, (KafkaError, MemoryError)):
                        raise
                    self.metrics.broker_errors.inc()
                    backoff.wait(self.stop_event, "poll failed", exc)
                    continue
                polled = {None: self._pass_unreadable(unreadable)}
            if self._unfetchable_tries or self._unfetchable_run or self._told_end:
                for tp in polled:  # (a partition that delivered is past its failures)
                    if tp is not None:
                        for kept in (self._unfetchable_tries, self._unfetchable_run,
                                     self._told_end):
                            kept.pop(f"{tp.topic}:{tp.partition}", None)
            records = [record for batch in polled.values() for record in batch]
            self._note_poll(records)
            self._watch_group()
            self._watch_connection()
            self._update_lag()
            self._check_positions()
            if self._verify_until and records:
                records = self._hold_until_verified(records)
            if self._missing_topics and records and self.processor is not None:
                records = self._hold_missing_topics(records)
            if self._reset_since_poll:
                reset, self._reset_since_poll = self._reset_since_poll, set()
                dropped = [r for r in records if f"{r.topic}:{r.partition}" in reset]
                if dropped:
                    log.warning("dropped %d messages polled from %s before its reset was "
                                "noticed: they are not learned or answered now (the partition "
                                "is read again as kafka.on_partition_reset says)",
                                len(dropped), ", ".join(sorted(reset)))
                    records = [r for r in records if f"{r.topic}:{r.partition}" not in reset]
                if self.stop_event.is_set():
                    break
            if records and self._pacer is not None:
                records = self._pace_labels(records)
            if not records:
                if self.until_drained and self._drained():
                    log.info("every partition is read up to its high watermark: stopping")
                    break
                (self.models or self.processor).expire_cache()  # type: ignore[union-attr]
                self._maybe_checkpoint()
                continue
            again = self._handle(records)
            if self._pacer is not None:
                self._pacer.delivered(records, again)
            backoff.reset()
            if self.on_batch is not None:
                self.on_batch(self)

    def _unfetchable(self, exc: BaseException) -> list[UnreadableRecord] | None:
        """The record a fetch of its partition cannot give (_unfetchable_offset), once its
        fetch failed UNFETCHABLE_ATTEMPTS times in a row over UNFETCHABLE_SECONDS at least;
        right after an offset passed so, over the attempts alone (the damage goes on: a log
        damaged over 500 records took 4 hours); at once when the response starts with the
        damaged batch of the offset just passed (a broker sends it again for each of its
        offsets); and only below the partition's end (a record must be there). Before that,
        [], with a WARNING naming the offset: its partition is held back for a while
        (_hold_back) and fetched again, the others read on. A response to a fetch from before
        the latest seek is not counted ([]: the others read on at once)."""
        failed = _unfetchable_offset(exc)
        if failed is None:
            return None
        tp, offset = failed.tp, failed.offset
        name = f"{tp.topic}:{tp.partition}"
        try:
            position = self._consumer.position(tp)
        except Exception:
            position = None
        if position != offset:
            return []  # (a response to a fetch from before a seek: nothing to count or wait)
        if failed.high is not None:  # (the client keeps it from good fetches only)
            self._told_end[name] = max(failed.high, self._told_end.get(name, 0))
        now = time.monotonic()
        at, tries, since = self._unfetchable_tries.get(name, (offset, 0, now))
        tries, since = (tries + 1, since) if at == offset else (1, now)
        self._unfetchable_tries[name] = (offset, tries, since)
        previous = self._last_unreadable.get(name)
        same_batch = (previous == offset - 1 and failed.base is not None
                      and 0 <= failed.base <= previous)
        window = 0.0 if self._unfetchable_run.get(name) == offset - 1 else UNFETCHABLE_SECONDS
        if not same_batch and (tries < UNFETCHABLE_ATTEMPTS or now - since < window):
            log.warning("cannot fetch the message at %s:%d (attempt %d, for %.0f s): %s; "
                        "fetching it again (it is dead-lettered as unreadable once %d "
                        "attempts over %.0f s failed)", name, offset, tries, now - since,
                        failed.what, UNFETCHABLE_ATTEMPTS, window)
            return self._hold_back(tp, tries)
        end = self._end_beyond(tp, offset, failed.high)
        if end is None:
            log.warning("cannot fetch at %s:%d (attempt %d): %s; no message is known to be "
                        "there (the partition's end is not beyond it): fetching again", name,
                        offset, tries, failed.what)
            return self._hold_back(tp, tries)
        self._unfetchable_tries.pop(name, None)
        self._unfetchable_run[name] = offset
        # The client keeps the high watermark of its last good fetch, which may be this
        # offset: the position past it must not read as offsets lost (_check_positions).
        self._highwater_at_seek[name] = self._consumer.highwater(tp)
        cause = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        return [UnreadableRecord(
            tp.topic, tp.partition, offset,
            f"the Kafka client cannot read the message at {name}:{offset}: {failed.what} "
            f"({cause}). It was neither answered nor learned; the partition reads on after it")]

    def _end_beyond(self, tp: Any, offset: int, told: int | None) -> int | None:
        """An end of the partition beyond ``offset`` (a record is there), or None: the high
        watermark the failed response told, the client's own (its last good fetch's), or the
        end offset asked of the broker (the embedded broker tells the last batch's first
        offset + 1 there, and 0 under read_committed while any transaction is open: asked
        last)."""
        for end in (told, self._consumer.highwater(tp)):
            if isinstance(end, int) and end > offset:
                return end
        end = _end_offset(self._consumer, tp)
        return end if end is not None and end > offset else None

    def _hold_back(self, tp: Any, tries: int) -> list[UnreadableRecord]:
        """Pause a partition whose fetch failed (_unfetchable) for the back-off of its
        ``tries``-th failure, and no other: the poll loop's own back-off after a failed poll
        held up every partition, up to the 30 s that pass before a record is dead-lettered
        (and retry.max_attempts, meant for an unreachable broker, stopped the daemon). The
        partition is resumed by _release_held_back. [] (nothing to hand on)."""
        retry = self.config.retry
        delay = backoff_delay(retry.initial_backoff_seconds, retry.max_backoff_seconds, tries)
        try:
            self._consumer.pause(tp)
        except Exception as exc:  # (revoked meanwhile: nothing to hold back)
            log.debug("could not hold back %s:%d: %s", tp.topic, tp.partition, exc)
            return []
        self._held_back[f"{tp.topic}:{tp.partition}"] = (tp, time.monotonic() + delay)
        return []

    def _release_held_back(self) -> None:
        """Resume the partitions held back by _hold_back whose time has come (not while the
        group rebalances: a partition given up then, fenced, must stay paused; the next
        assignment settles every partition it gives anew)."""
        if not self._held_back or self._rebalancing:
            return
        now = time.monotonic()
        for name, (tp, until) in list(self._held_back.items()):
            if until <= now:
                del self._held_back[name]
                if tp in self._consumer.assignment():
                    _resume(self._consumer, tp)

    def _pass_unreadable(self, records: list[UnreadableRecord]) -> list[UnreadableRecord]:
        """Move the client past records it cannot read (a run of one partition's offsets);
        ``records`` then stand for them in the batch (dead-lettered as ``unreadable``, their
        offsets committed with the others). The first of a run is an ERROR, a run going on
        (met at the next poll) DEBUG: the dead letters name every offset."""
        from kafka import TopicPartition

        first, last = records[0], records[-1]
        name = f"{first.topic}:{first.partition}"
        following = self._last_unreadable.get(name) == first.offset - 1
        self._last_unreadable[name] = last.offset
        span = "" if last is first else f" (and the {len(records) - 1} after it in its batch)"
        log.log(logging.DEBUG if following else logging.ERROR,
                "%s%s; dead-lettered as unreadable", first.error, span)
        self._consumer.seek(TopicPartition(first.topic, first.partition), last.offset + 1)
        return records

    def _watch_group(self) -> None:
        """With model.scope partition or key: warn when a join of the consumer group has not
        completed for long. A broker can keep a group rebalancing for good (the embedded one
        did, after its members left within a second of each other: every join named a leader
        that was gone); the process then reads nothing, and said only "connected"."""
        if self.models is None:
            return
        now = time.monotonic()
        if not (self._rebalancing or self._rejoin_needed() or not self._joined_once):
            self._joining_since = None
            return
        if self._joining_since is None:
            self._joining_since = now
            return
        limit = max(GROUP_STUCK_SECONDS, 6 * self.config.kafka.session_timeout_ms / 1000)
        waited = now - self._joining_since
        if waited >= limit and now - self._group_warned >= limit:
            self._group_warned = now
            log.warning("the consumer group %r has not completed a rebalance in %.0f s: this "
                        "process reads nothing meanwhile. The broker's group coordinator may "
                        "be stuck (kafka-python's log, at --log-level DEBUG, shows each "
                        "join); restarting the group's members, or the broker, or another "
                        "kafka.group_id (whose models start anew) ends it",
                        self.config.kafka.group_id, waited)

    def _rejoin_for_fenced(self) -> None:
        """Partitions given up after another process claimed one of their models first
        (ScopedModels._fence): stop fetching them and rejoin the consumer group, whose new
        assignment names their owner (this process again, when the other one was the zombie:
        it then settles them anew from the state topic and the last commit)."""
        assert self.models is not None
        with self.models.lock:
            fenced, self.models.fenced = self.models.fenced, set()
        consumer = self._consumer
        given_up = [tp for tp in consumer.assignment() if tp.partition in fenced]
        if given_up:
            consumer.pause(*given_up)
        self._rebalancing = True  # the next polls wait for the join (see _poll_timeout_ms)
        coordinator = getattr(consumer, "_coordinator", None)
        request = getattr(coordinator, "request_rejoin", None)
        if callable(request):
            request()
        else:  # pragma: no cover - a kafka-python without it: leave and join again
            consumer.unsubscribe()
            self._subscribe(consumer)
        log.warning("partitions %s given up (another process claimed a model of theirs): "
                    "rejoining the consumer group", sorted(fenced))

    def _poll_timeout_ms(self) -> int:
        """kafka.poll_timeout_ms, except while joining the consumer group: kafka-python 3.0
        throws away a join that completes while no poll waits for it and starts another one
        (the broker holds each join for up to half the session timeout), so a short poll then
        stretched a rebalance from ~2 s to 12 s."""
        timeout = self.config.kafka.poll_timeout_ms
        if self.models is not None and (self._rebalancing or self._rejoin_needed() or not (
                self.models.owned or self.models.pending)):
            return max(timeout, self.config.kafka.session_timeout_ms)
        return timeout

    def _rejoin_needed(self) -> bool:
        """Whether the consumer's heartbeat learned of a rebalance: its next poll joins."""
        coordinator = getattr(self._consumer, "_coordinator", None)
        try:
            return bool(coordinator is not None and coordinator.need_rejoin())
        except Exception:  # pragma: no cover - another kafka-python
            return False

    def _handle(self, records: list[Any]) -> dict[str, int]:
        """Handle a poll's records; returns the offsets read again (see _handle_batch)."""
        if self.models is None:
            return self._handle_batch(records)
        # The lock keeps a listener from publishing the models between learning a batch and
        # delivering its outputs (nothing published may run ahead of what was delivered).
        with self.models.lock:
            again = self._handle_batch(records)
        self._read_again(again)
        if time.monotonic() - self._last_commit >= 1.0:
            self._commit()
        return again

    # -- late labels wait for their features (connectors.pacing) ---------------------------

    def _input_positions(self) -> InputPositions:
        """Position and high watermark of every input partition being read, as the last
        :meth:`_update_lag` found them (kafka-python 3 looks at every assigned partition for
        each position asked for: asking again per poll cost 19 ms at 64 input partitions)."""
        topic = self.config.kafka.input_topic
        # (A scoped partition not settled yet is left out: it is paused, with its labels.)
        owned = None if self.models is None else self.models.owned
        return {tp.partition: found for tp, found in self._positions.items()
                if tp.topic == topic and (owned is None or tp.partition in owned)}

    def _end_offsets(self, partitions: list[int]) -> dict[int, int | None]:
        """The broker's end offsets of these input partitions (the pacer asks for those the
        client's high watermark says are read to their end: the client updates it only as it
        hands out what it fetched, so a burst fetched behind the labels went unseen)."""
        from kafka import TopicPartition

        tps = [TopicPartition(self.config.kafka.input_topic, p) for p in partitions]
        # Within about a poll: a partition whose leader is gone made it wait the whole
        # request timeout (30 s by default) at every poll with labels. Unanswered, the labels
        # go as if the input were read (the stream must not stop for it).
        kafka = self.config.kafka
        timeout_ms = min(kafka.request_timeout_ms, max(1000, kafka.poll_timeout_ms))
        try:
            ends = self._consumer.end_offsets(tps, timeout_ms=timeout_ms)
        except TypeError:  # (kafka-python 2 takes no timeout)
            ends = self._consumer.end_offsets(tps)
        return {tp.partition: end for tp, end in ends.items()}

    def _pace_labels(self, records: list[Any]) -> list[Any]:
        """The records to handle now: a label not older than what was read of the input
        partitions its features may be in, while they have messages left to read, waits (its
        partition is read again from it once they caught up, and paused until then)."""
        from kafka import TopicPartition

        pacer = self._pacer
        assert pacer is not None
        label_topic = self.config.kafka.label_topic
        if not any(record.topic == label_topic for record in records):
            return records
        ready, held = pacer.split(records, self._input_positions(), self._end_offsets)
        for partition, offset in held.items():
            tp = TopicPartition(label_topic, partition)
            try:
                self._consumer.seek(tp, offset)
                self._consumer.pause(tp)
            except Exception as exc:  # (revoked meanwhile by a join that outlived a poll)
                pacer.forget([partition])
                log.debug("label partition %s:%d moved on before it was held: %s",
                          label_topic, partition, exc)
        if held:
            log.debug("late labels wait for their features from %s",
                      {f"{label_topic}:{p}": o for p, o in held.items()})
            now = time.monotonic()
            if now - self._labels_waiting_said >= 60:
                self._labels_waiting_said = now
                log.info("late labels of %s wait until %s is read up to their timestamps "
                         "(it has messages left to read): their features come first",
                         ", ".join(f"{label_topic}:{p}" for p in sorted(pacer.held)),
                         self.config.kafka.input_topic)
        self.metrics.labels_waiting.set(len(pacer.held))
        return ready

    def _release_labels(self) -> None:
        """Resume the label partitions whose first held label need not wait any more."""
        from kafka import TopicPartition

        pacer = self._pacer
        if pacer is None or not pacer.held:
            return
        label_topic = self.config.kafka.label_topic
        assigned = self._consumer.assignment()
        owned = None if self.models is None else self.models.owned
        gone = [p for p in pacer.held if TopicPartition(label_topic, p) not in assigned
                or (owned is not None and p not in owned)]
        pacer.forget(gone)  # (taken away or given up; a new assignment resumes them anew)
        for partition in pacer.releasable(self._input_positions(), self._end_offsets):
            try:
                _resume(self._consumer, TopicPartition(label_topic, partition))
            except Exception as exc:  # (revoked meanwhile)
                log.debug("label partition %s:%d moved on before it was resumed: %s",
                          label_topic, partition, exc)
        self.metrics.labels_waiting.set(len(pacer.held))

    def _handle_batch(self, records: list[Any]) -> dict[str, int]:
        """Process, deliver, count; returns the offsets to read again (models that could not
        be fetched)."""
        started = time.perf_counter()
        again: dict[str, int] = {}
        self._undelivered = True  # until _deliver returns True
        try:
            if self.models is not None:
                result, again = self.models.process(records)
            else:
                assert self.processor is not None
                result = self.processor.process(records)
        except ScopedStateRefused as exc:
            # A model's state cannot be used (other settings): a new model in its place would
            # replace it silently. Nothing of the batch is published or committed.
            log.error("%s: stopping without publishing or committing this batch", exc)
            self.summary.exit_code = 1
            self.stop_event.set()
            return again  # _undelivered stays set: nothing of the batch is published
        except Exception:
            # Every message is guarded inside the processor, so this is a bug. Part of the batch
            # may be in the model without its outcome written: checkpointing or committing now
            # would lose those messages. Stop; the restart resumes from the last checkpoint.
            log.exception(
                "processing a batch of %d messages failed as a whole: stopping without "
                "checkpointing or committing it (the restart resumes from the last checkpoint)",
                len(records),
            )
            self.metrics.batch_failures.inc()
            self.stop_event.set()
            return again  # _undelivered stays set: nothing of the batch is checkpointed
        kafka = self.config.kafka
        sends = _oversized_as_dead_letters(
            [(kafka.output_topic, o.key, o.value) for o in result.outputs]
            + [(kafka.dead_letter_topic, d.key, d.value) for d in result.dead_letters],
            _producer_limit(kafka.max_message_bytes), kafka.dead_letter_topic)
        if len(records) > result.skipped and self.role != "predictor":
            # Learned, not saved, from now on: while a stalled broker holds the outputs too
            # (stream_svm_seconds_unsaved read 0 through a stall of minutes).
            self.metrics.processed_unsaved()
        if not self._deliver(sends):
            return again  # given up on a second stop: this batch must not be checkpointed
        self._undelivered = False
        if self.models is not None:
            self.models.delivered()  # its models may now be published (and evicted)
        now_ms = time.time() * 1000
        for timestamp in result.input_timestamps:
            if timestamp > 0:
                latency = max(0.0, (now_ms - timestamp) / 1000)
                self.latencies.append(latency)
                self.metrics.latency.observe(latency)
        summary = self.summary
        summary.messages += len(records) - result.skipped
        summary.outputs += len(result.outputs)
        summary.dead_letters += len(result.dead_letters)
        summary.skipped += result.skipped
        summary.batches += 1
        self._since_checkpoint += len(records) - result.skipped
        self.metrics.batch_size.observe(len(records))
        self.metrics.batch_seconds.observe(time.perf_counter() - started)
        if self.models is not None:
            self._maybe_publish()
            return again
        self._maybe_checkpoint()
        if time.monotonic() - self._last_commit >= 1.0:
            self._commit()
        return again

    def _read_again(self, offsets: dict[str, int]) -> None:
        """Seek back to messages whose model could not be fetched from the state topic (the
        models that handled later ones skip them, being past them)."""
        from kafka import TopicPartition

        for name, offset in offsets.items():
            self._consumer.seek(TopicPartition(name.rpartition(":")[0],
                                               int(name.rpartition(":")[2])), offset)
            self._read_again_at[name] = time.monotonic()
        if offsets:
            self.metrics.broker_errors.inc()
            self.stop_event.wait(self.config.retry.initial_backoff_seconds)

    def _deliver(self, sends: list[tuple[str, bytes | None, bytes]]) -> bool:
        """Send and flush, retrying failed sends until every one is acknowledged (or stop is
        requested twice: outputs are then repeated from the last checkpoint on restart);
        returns whether every output was delivered.

        A send the broker has not answered yet stays with the producer, which retries it
        until ``delivery_timeout_ms``: it is waited for, never sent again (after a flush that
        timed out, sending the unanswered ones again wrote every output two or three times
        once the broker answered). Only sends that failed are sent again."""
        from kafka.errors import KafkaError

        retry = self.config.retry
        backoff = _Backoff(retry.initial_backoff_seconds, retry.max_backoff_seconds, 0)
        waiting: list[tuple[tuple[str, bytes | None, bytes], Any]] = []
        while sends or waiting:
            # Without this, a broker that stays away kept the daemon retrying forever, deaf
            # to any number of SIGTERMs (the documented second stop was never honoured).
            if backoff.failures and self._stop_requests >= 2:
                self._undelivered = True
                log.error(
                    "gave up delivering %d outputs on the second stop request: the last "
                    "checkpoint stays, the stream is repeated from it on restart",
                    len(sends) + len(waiting),
                )
                return False
            # Once stop is requested, a retry waits for the second request, not for stop_event
            # (already set: the retries would run back to back).
            wake = self._second_stop if self.stop_event.is_set() else self.stop_event
            error: BaseException | None = None
            sent = 0
            try:
                only: dict[str, int | None] = {}
                for send in sends:
                    topic, key, value = send
                    if topic not in only:  # (in the records' order, as send waits for metadata)
                        only[topic] = _only_partition(self._producer, topic)
                    waiting.append((send, self._producer.send(topic, key=key, value=value,
                                                              partition=only[topic])))
                    sent += 1
                self._flush()
            except KafkaError as exc:
                self.metrics.broker_errors.inc()
                error = exc
                # A send that raised (e.g. a record too large) leaves the ones before it in
                # the producer's buffer: deliver them before telling which failed, or they
                # were sent again with the retry (and written twice).
                with contextlib.suppress(KafkaError):
                    self._flush()
            unsent = sends[sent:]
            failed = [send for send, future in waiting if future.is_done and future.failed()]
            waiting = [(send, future) for send, future in waiting if not future.is_done]
            sends = failed + unsent
            if sends or waiting:
                backoff.wait(
                    wake,
                    f"could not deliver {len(sends) + len(waiting)} outputs",
                    error or RuntimeError("not acknowledged"),
                )
        return True

    def _flush(self) -> None:
        """The producer's flush within ``kafka.request_timeout_ms`` (KafkaTimeoutError after),
        in slices of a second, so that a second stop request ends the wait at once (a broker
        that stalls held the second SIGTERM for two request timeouts)."""
        from kafka.errors import KafkaTimeoutError

        deadline = time.monotonic() + self.config.kafka.request_timeout_ms / 1000
        while True:
            remaining = deadline - time.monotonic()
            try:
                self._producer.flush(timeout=max(0.001, min(1.0, remaining)))
                return
            except KafkaTimeoutError:
                if remaining <= 1.0 or self._stop_requests >= 2:
                    raise

    def _update_lag(self) -> None:
        now = time.monotonic()
        assigned = self._consumer.assignment()
        paused = self._consumer.paused()
        self._positions = {}
        for tp in assigned:
            high = self._consumer.highwater(tp)
            if high is None:
                self._positions[tp] = (None, None)
                continue
            position = _position(self._consumer, tp, self.config.kafka.poll_timeout_ms)
            self._positions[tp] = (position, high)
            if position is None:
                continue
            lag = max(0, high - position)
            self.metrics.lag.labels(topic=tp.topic, partition=str(tp.partition)).set(lag)
            self._lag_series.add((tp.topic, str(tp.partition)))
            # (Records held back after a reconnect, or for a missing topic, are read again
            # from the same position: no stall.)
            held = bool(self._verify_until) or bool(self._missing_topics) or (
                now - self._read_again_at.get(f"{tp.topic}:{tp.partition}", -math.inf)
                < self.STALL_SECONDS)
            self._watch_progress(tp, position, lag, tp in paused or held, now)
        for series in self._lag_series - {(tp.topic, str(tp.partition)) for tp in assigned}:
            self.metrics.lag.remove(*series)
            self._lag_series.discard(series)
        for name in set(self._progress) - {f"{tp.topic}:{tp.partition}" for tp in assigned}:
            del self._progress[name]
            self._stalled.discard(name)
            self._read_again_at.pop(name, None)
        self.metrics.stalled.set(len(self._stalled))

    #: A partition with messages to read whose position has not moved for this long, while
    #: at least STALL_DRAINED_POLLS polls drained the client's fetched records, is reported as
    #: stalled. Full polls are no sign of it: kafka-python hands out one partition's fetched
    #: records before the next's, so a backlog elsewhere can keep a partition waiting.
    STALL_SECONDS = 60.0
    STALL_DRAINED_POLLS = 20

    def _note_poll(self, records: list[Any]) -> None:
        """Count a poll that returned fewer records than it may (``kafka.max_batch``): the
        client had no fetched records left, so its next fetch asked every partition, a stalled
        one included, whether other partitions' messages came back or none did."""
        self._drained_polls += len(records) < self.config.kafka.max_batch

    def _watch_progress(self, tp: Any, position: int, lag: int, paused: bool,
                        now: float) -> None:
        """Warn once when a partition has messages to read but no poll returns any of them.
        The embedded broker answers every fetch empty once a partition holds many small record
        batches (more than about 60,000 at a fetch wait of 50 ms): the daemon stopped reading
        for good, with nothing but the lag metric to show it."""
        name = f"{tp.topic}:{tp.partition}"
        seen = self._progress.get(name)
        if seen is None or seen[0] != position or lag == 0 or paused:
            if name in self._stalled:
                self._stalled.discard(name)
                log.info("partition %s is read again", name)
            self._progress[name] = (position, now, self._drained_polls)
            return
        if (now - seen[1] >= self.STALL_SECONDS
                and self._drained_polls - seen[2] >= self.STALL_DRAINED_POLLS
                and name not in self._stalled):
            self._stalled.add(name)
            log.warning(
                "partition %s has %d messages to read, but no fetch has returned any for %.0f s "
                "(position %d): the broker answers the fetches for it empty. The embedded "
                "broker does so once a partition holds many small batches: raise "
                "kafka.fetch_max_wait_ms (%d ms now), e.g. to 500; on a cluster, look at the "
                "partition's leader", name, lag, now - seen[1], position,
                self.config.kafka.fetch_max_wait_ms)

    def _drained(self) -> bool:
        if self.models is not None and (self.models.pending or not self.models.owned):
            return False  # not a member with its partitions yet
        if self._held_back:
            return False  # (a partition waits to fetch a record again: see _hold_back)
        for tp in self._consumer.assignment():
            high = self._consumer.highwater(tp)
            told = self._told_end.get(f"{tp.topic}:{tp.partition}")
            if told is not None and (high is None or told > high):
                high = told  # (a failed fetch told more than the last good one)
            position = _position(self._consumer, tp, self.config.kafka.poll_timeout_ms)
            if high is None or position is None or position < high:
                return False
        return True

    # -- checkpoints and commits -----------------------------------------------------------

    def _stop_for_the_lock(self, exc: CheckpointLockLost) -> None:
        """Another daemon runs on this checkpoint directory now: this one writes, publishes
        and commits nothing more (the other resumes from its own checkpoints, or from the
        committed offsets)."""
        self._lock_lost = True
        self.metrics.checkpoint_failures.inc()
        self.summary.checkpoint_failures += 1
        self.summary.exit_code = 1
        self.stop_event.set()
        log.error("%s: stopping, without a checkpoint or a commit past the last one", exc)

    #: Seconds between two checks that the checkpoint directory's lock is still held.
    LOCK_CHECK_SECONDS = 1.0

    def _check_the_lock(self) -> None:
        """Take the checkpoint directory's lock again at once when its lock file was removed
        or replaced: checked only before a checkpoint, it let another daemon start on the
        directory, and both answered the stream, until the next one."""
        lock = getattr(self._store, "lock", None)  # (None: no store, or one without a lock)
        now = time.monotonic()
        if lock is None or now < self._lock_checked_at + self.LOCK_CHECK_SECONDS:
            return
        self._lock_checked_at = now
        if lock.held():
            lock.catch_up_pid()  # (a directory read-only at start, writable again)
            return
        if not lock.directory.is_dir():
            return  # (a directory removed: the next checkpoint says so, and makes it again)
        try:
            lock.verify()
        except CheckpointLockLost as exc:
            self._stop_for_the_lock(exc)
        except CheckpointError as exc:  # (the next checkpoint tries again, and says so)
            log.debug("locking the checkpoint directory again failed: %s", exc)

    def _maybe_checkpoint(self) -> None:
        if self.models is not None:
            with self.models.lock:
                self._maybe_publish()
            if time.monotonic() - self._last_commit >= 1.0:
                self._commit()
            return
        if self._store is None:
            return  # a predictor writes no checkpoint
        self._check_the_lock()
        if self._lock_lost:
            return
        due_messages = self._since_checkpoint >= self.config.checkpoint.every_messages
        due_time = time.monotonic() - self._last_checkpoint >= self.config.checkpoint.every_seconds
        retry_due = time.monotonic() >= self._checkpoint_retry_at
        if self._since_checkpoint and (due_messages or due_time) and retry_due:
            self.checkpoint()
        elif self._state_behind and (
                (self._sequence == 0 and self._restored)
                or time.monotonic() - self._last_publish >= self.config.checkpoint.every_seconds):
            # Nothing published in this epoch yet (a learner restored from its checkpoint
            # with nothing new to read published nothing: predictors waited for ever), or a
            # publish failed and the stream went idle: no checkpoint is due, but predictors
            # should not go without the model, or serve an older one, while it stays idle.
            self._publish()

    def _known_commits(self) -> dict[str, list[int]]:
        """Per partition, the group's committed offset as this daemon knows it, and those of
        its commits that raised (each may have been made)."""
        known: dict[str, set[int]] = {name: set(offsets)
                                      for name, offsets in self._attempted.items()}
        for name, found in self._group_known.items():
            if found is not None:
                known.setdefault(name, set()).add(found[0])
        return {name: sorted(offsets) for name, offsets in known.items()}

    def checkpoint(self) -> None:
        """Write a checkpoint of the model and the processed offsets (outputs are flushed);
        with model.scope partition or key, publish every changed model's state and commit
        the offsets of the partitions whose models are all published."""
        if self.models is not None:
            self._checkpoint_models()
            return
        assert self.processor is not None and self._store is not None
        started = time.perf_counter()
        arrays, meta = self.processor.model.to_checkpoint()
        state = {
            "model_settings": checkpointed_settings(self.config),
            # (which of the topics read was the input: a model may have read only labels)
            "input_topic": self.config.kafka.input_topic,
            "processor": self.processor.state(),
            # The group's offsets as this daemon knows them when it writes this checkpoint
            # (with those of commits that failed, which may have been made): found at a
            # restart, the daemon stopped between this checkpoint and its commit (the commit's
            # metadata would say so, but not every broker keeps it).
            "committed_before": self._known_commits(),
        }
        if self._epoch is not None:
            state["state_epoch"] = self._epoch
        try:
            path = self._store.save(arrays, meta, state, self.processor.cache_arrays())
        except CheckpointLockLost as exc:
            self._stop_for_the_lock(exc)
            return
        except CheckpointError as exc:
            self.metrics.checkpoint_failures.inc()
            self.summary.checkpoint_failures += 1
            # Not again at every poll: a failure that persists (a full disk) is retried on the
            # checkpoint's own clock, a second at least.
            self._checkpoint_retry_at = time.monotonic() + max(
                1.0, min(self.config.checkpoint.every_seconds, 30.0))
            try:  # (the directory may be what failed: replaced by a file)
                written: bool | None = self._store is None or bool(self._store.paths())
            except OSError:
                written = None
            log.error("%s (%s)", exc, {
                True: "the previous checkpoint stays in use",
                False: "no checkpoint is written yet, and nothing is committed before one: a "
                       "restart reads again all that this run has read",
                None: "the checkpoint directory cannot be read either, so the checkpoints "
                      "written before may be gone: nothing is committed past the last one "
                      "written, and a restart without them is refused by the committed "
                      "offsets"}[written])
            self._publish()  # predictors need not wait for the disk
            return
        self._covered = _committable(self.processor)
        self._publish()
        self.metrics.checkpointed(time.perf_counter() - started)
        self._since_checkpoint = 0
        self._last_checkpoint = time.monotonic()
        self.summary.checkpoints += 1
        log.debug("checkpoint %s written", path)

    def _maybe_publish(self) -> bool:
        """With model.scope partition or key, inside the models' lock: publish the changed
        models when a checkpoint is due; True when all are published."""
        assert self.models is not None
        if self._verify_until:
            return False  # not into topics unchecked since a lost connection (_revoked)
        config = self.config.checkpoint
        now = time.monotonic()
        due = (self._since_checkpoint >= config.every_messages
               or now - self._last_checkpoint >= config.every_seconds)
        if not (self._since_checkpoint and due and now >= self._checkpoint_retry_at):
            return False
        started = time.perf_counter()
        if not self.models.publish():
            self.metrics.checkpoint_failures.inc()
            self.summary.checkpoint_failures += 1
            self._checkpoint_retry_at = now + max(1.0, min(config.every_seconds, 30.0))
            return False
        self.metrics.checkpointed(time.perf_counter() - started)
        self._since_checkpoint = 0
        self._last_checkpoint = time.monotonic()
        self.summary.checkpoints += 1
        self._last_commit = 0.0  # commit right after (outside the lock)
        return True

    def _checkpoint_models(self) -> None:
        assert self.models is not None
        if self._verify_until:
            return  # not into topics unchecked since a lost connection (_revoked)
        started = time.perf_counter()
        with self.models.lock:
            # (A second stop request ends the publishing: see ScopedModels.publish.)
            published = self.models.publish(give_up=self._second_stop.is_set)
        self._commit()
        if not published:
            self.metrics.checkpoint_failures.inc()
            self.summary.checkpoint_failures += 1
            self._checkpoint_retry_at = time.monotonic() + max(
                1.0, min(self.config.checkpoint.every_seconds, 30.0))
            return
        self.metrics.checkpointed(time.perf_counter() - started)
        self._since_checkpoint = 0
        self._last_checkpoint = time.monotonic()
        self.summary.checkpoints += 1

    def _publish(self) -> None:
        """Publish the model on the state topic (a learner with kafka.publish_state), at the
        moments it is checkpointed. A failure is logged and counted, and the next checkpoint
        publishes again; another learner's newer epoch stops this one (exit 1)."""
        processor = self.processor
        store = self._state_store
        if not self._publishes or self._fenced or store is None or self._epoch is None:
            return
        assert processor is not None
        if (processor.offsets, processor.model_updates) == self._published:
            return  # nothing new since the last state (a checkpoint retried after a failure)
        if processor.scaler is not None and not processor.scaler.frozen:
            log.debug("the scaler is warming up: no state to publish yet")
            return
        if self._publish_from is not None:
            behind = {name: offset for name, offset in self._publish_from.items()
                      if processor.offsets.get(name, 0) < offset}
            if not behind:
                log.info("read past the offsets of the newer state on the state topic: "
                         "publishing this model")
            elif self._read_to_the_end(behind):
                # The input ends before those offsets (lost, or recreated shorter): this
                # model, which has read all of it, is the newest there is.
                log.warning("read all the input holds without reaching %s, the offsets of the "
                            "newer state on the state topic: publishing this model",
                            behind)
            else:
                self._state_behind = True  # (tried again on an idle stream too)
                return
            self._publish_from = None
        _, outcomes, _, _ = self.metrics.replica
        self._last_publish = time.monotonic()
        arrays, metadata, next_offset = state_of(processor, self.config)
        epoch, sequence = self._epoch, self._sequence + 1
        try:
            last: int | None = store.publish(GLOBAL_MODEL_ID, arrays, metadata, next_offset,
                                             epoch, sequence)
        except StaleEpochError as exc:
            self._fence(exc)
            return
        except (StateStoreError, ValueError) as exc:
            written = store.last_sequence(GLOBAL_MODEL_ID, epoch)
            if isinstance(exc, ValueError) or written < sequence:
                # (A ValueError comes before anything is sent: a sequence the topic has
                # already is not taken again by the next publish.)
                self._sequence = max(self._sequence, written)
                self._state_behind = True
                outcomes.labels(outcome="failed").inc()
                log.error("publishing the model's state failed (%s); the stream goes on and "
                          "the next checkpoint publishes again", exc)
                self._recreate_state_topic()
                return
            # The state was written whole: what failed came after it. It is published, and
            # the next publish takes the next sequence (reusing this one, every later publish
            # was refused and predictors served this state for good).
            log.warning("model generation %s is published, but tidying the state topic after "
                        "it failed: %s", generation(epoch, sequence), exc)
            last = None
        if last is not None:
            try:
                # Reading on to that offset shows a newer learner's claim, if any.
                newest = store.newest_epoch(GLOBAL_MODEL_ID, last)
            except StateStoreError as exc:
                newest = epoch  # (the next publish reads on over this one's records too)
                log.warning("model generation %s is published, but reading the state topic on "
                            "to it, which shows another learner's newer claim, failed (%s): "
                            "read at the next publish", generation(epoch, sequence), exc)
            if newest > epoch:
                self._fence(StaleEpochError(
                    f"state topic {store.topic}: model {list(GLOBAL_MODEL_ID)} has epoch "
                    f"{newest}, claimed by another learner; this one has epoch {epoch}"))
                return
        self._state_behind = False
        outcomes.labels(outcome="published").inc()
        self._sequence = sequence
        self._published = (dict(processor.offsets), processor.model_updates)
        processor.generation = generation(epoch, sequence)
        self.metrics.replica[0].set(sequence)
        log.debug("published model generation %s", processor.generation)

    def _fence(self, exc: StaleEpochError) -> None:
        """Another learner's newer epoch: this one stops (exit 1), publishing nothing more."""
        self.metrics.replica[1].labels(outcome="stale").inc()
        self._fenced = True
        self.summary.exit_code = 1
        self.stop_event.set()
        log.error("%s. Another learner took this model over (predictors follow its newer "
                  "epoch): stopping, since two learners of one model must not both publish. "
                  "The local checkpoint is kept.", exc)

    def _recreate_state_topic(self) -> None:
        """After a failed publish: a state topic that no longer exists (a broker that lost its
        data, or deleted) is created again and a new epoch claimed there, else every later
        publish failed for good while the learner ran on."""
        store = self._state_store
        assert store is not None and self._epoch is not None
        try:
            if not store.ensure_topic(partitions=1):
                return
            epoch = store.claim_epoch(GLOBAL_MODEL_ID, at_least=self._epoch + 1)
        except StaleEpochError:
            return  # another learner claimed it first: the next publish is fenced
        except StateStoreError as exc:
            log.debug("state topic %s: not checked after the failed publish: %s", store.topic,
                      exc)
            return
        log.warning("the state topic %s did not exist any more (the broker lost its data, or it "
                    "was deleted): created it again, publishing there as epoch %d",
                    store.topic, epoch)
        self._epoch, self._sequence = epoch, 0
        self._last_publish = -math.inf  # published at the next idle poll or checkpoint

    def _summarize_models(self) -> None:
        """Progressive figures over the live models (pooled), breakpoints of them."""
        assert self.models is not None
        processors = self.models.processors()
        scored = sum(p.scored for p in processors)
        if scored and processors[0].regression:
            self.summary.mae = sum(p.absolute_error for p in processors) / scored
            self.summary.rmse = math.sqrt(sum(p.squared_error for p in processors) / scored)
        elif scored:
            self.summary.accuracy = sum(p.correct for p in processors) / scored
        self.summary.breakpoints = sum(
            int(getattr(p.model, "breakpoints_total", 0)) for p in processors)

    def _commit(self) -> None:
        from kafka import OffsetAndMetadata, TopicPartition
        from kafka.errors import KafkaError

        if self._stopped_on_reset:
            return

        if self.models is not None:
            self._last_commit = time.monotonic()
            if self._verify_until:
                return  # not into a group unchecked since a lost connection (_revoked)
            if self._undelivered:
                # Outputs given up on a second stop: their partitions' positions moved past
                # them, and a partition whose batch left no model to publish (its messages
                # dead-lettered before any model, e.g. keys too long) would be committed.
                return
            with self.models.lock:
                offsets = self.models.committable()
            if not offsets:
                return
            try:
                # Outside the lock: commit() waits for the consumer's IO thread.
                self._consumer.commit(self._offsets_of(offsets))
                with self.models.lock:
                    self.models.mark_committed(offsets)
            except KafkaError as exc:
                # A commit of a process the group dropped (a zombie) is refused: its next poll
                # rejoins the group, and the new owner resumed from the last commit anyway.
                log.warning("offset commit failed (%s: %s); %s", type(exc).__name__, exc,
                            self._commit_retry())
            return
        assert self.processor is not None
        # A predictor's progress is what it answered (it writes no checkpoint); a learner's is
        # what its newest checkpoint covers.
        next_offsets = (_committable(self.processor) if self.role == "predictor"
                        else self._covered)
        if next_offsets is None:
            return
        offsets = {
            TopicPartition(name.rpartition(":")[0], int(name.rpartition(":")[2])): (
                OffsetAndMetadata(offset, self._instance, -1)
            )
            for name, offset in next_offsets.items()
            if self._committed.get(name) != offset
        }
        self._last_commit = time.monotonic()
        if not offsets:
            return
        foreign = None
        if time.monotonic() - self._group_checked >= GROUP_CHECK_SECONDS:
            # One read per partition: at most every GROUP_CHECK_SECONDS (a topic of many
            # partitions made every commit wait for as many round trips).
            self._group_checked = time.monotonic()
            foreign = self._foreign_commit(list(offsets))
        if foreign is not None:
            # One model per group: two global daemons in one group both answer and learn every
            # message, and each commit overwrites the other's. This one stops (the other, which
            # committed last, goes on) and commits nothing more.
            self._twin = True
            self.summary.exit_code = 1
            self.stop_event.set()
            log.error(
                "another consumer commits offsets in consumer group %r (%s): two daemons serve "
                "this group, and both would answer and learn every message (or a tool reset "
                "the group's offsets under this daemon). Stopping this one, without committing; "
                "the other goes on. Give each daemon its own kafka.group_id, or share a topic's "
                "partitions with model.scope = \"partition\" or \"key\"",
                self.config.kafka.group_id, foreign)
            return
        try:
            self._consumer.commit(offsets)
        except KafkaError as exc:
            log.warning("offset commit failed (%s); %s", exc, self._commit_retry())
            for tp, meta in offsets.items():  # (each may have been made nonetheless)
                self._attempted.setdefault(f"{tp.topic}:{tp.partition}", set()).add(meta.offset)
            return
        self._committed.update(
            {f"{tp.topic}:{tp.partition}": meta.offset for tp, meta in offsets.items()}
        )
        self._group_known.update({f"{tp.topic}:{tp.partition}": (meta.offset, self._instance)
                                  for tp, meta in offsets.items()})
        for tp in offsets:
            self._attempted.pop(f"{tp.topic}:{tp.partition}", None)

    def _foreign_commit(self, partitions: list[Any]) -> str | None:
        """What another consumer committed in this group since this daemon last knew its
        offsets (None: nothing, or the offsets could not be read now)."""
        from kafka.errors import KafkaError

        for tp in partitions:
            name = f"{tp.topic}:{tp.partition}"
            if name not in self._group_known:
                continue
            try:
                found = self._consumer.committed(
                    tp, metadata=True, timeout_ms=self.config.kafka.request_timeout_ms)
            except KafkaError as exc:
                log.debug("reading the committed offset of %s failed (%s)", name, exc)
                return None
            if found is None:
                continue  # deleted (a tool, an empty broker): nobody else commits here
            metadata = found.metadata or ""
            known = self._group_known[name]
            if (found.offset, metadata) == known or metadata == self._instance:
                continue
            if not metadata and (found.offset in self._attempted.get(name, ())
                                 or (known is not None and found.offset == known[0])):
                continue  # a broker that keeps no commit metadata: the offsets say it all
            who = f"by {metadata!r}" if metadata else "by a client that names no instance"
            was = "none" if known is None else known[0]
            return (f"{name} has committed offset {found.offset} {who}; this daemon's last "
                    f"known commit there: {was}")
        return None

    def _shutdown(self) -> None:
        if self._undelivered:
            self.summary.exit_code = 1  # an unclean stop: outputs are repeated on restart
        elif self.models is not None and self._consumer is not None and self._stopped_on_reset:
            self.summary.exit_code = 1  # nothing published or committed (see _partition_reset)
        elif self.models is not None and self._consumer is not None:
            failures = self.summary.checkpoint_failures
            self._checkpoint_models()
            if self.summary.checkpoint_failures > failures or self.models.committable():
                # Some model's latest updates are not on the state topic, or its partition's
                # offsets not committed: the next owner repeats them. Not a clean stop.
                log.error("stopping with %d models unpublished or offsets uncommitted: their "
                          "partitions' next owner learns their latest messages again",
                          self.models.dirty())
                self.summary.exit_code = 1
        elif (self.processor is not None and self._store is not None and self._since_checkpoint
              and not self._lock_lost):
            failures = self.summary.checkpoint_failures
            self.checkpoint()
            if self.summary.checkpoint_failures > failures:
                # The model's latest updates are not on disk: a restart repeats them from the
                # last checkpoint. Not a clean stop.
                self.summary.exit_code = 1
        if (self._state_behind and self.models is None and self.processor is not None
                and (self._restored or self._sequence or self.processor.offsets)
                and not self._undelivered and not self._lock_lost and not self._fenced):
            # The state topic lacks the model as it stops (a publish failed, or a restored
            # model had nothing new to read): published at its stop, as the README says, or
            # predictors would serve an older one (or wait for one) until the next run.
            self._publish()
            if self._state_behind and self._publish_from is not None:
                log.info("stopping before this learner read past the offsets of the newer "
                         "state on the state topic: predictors keep serving that state")
            elif self._state_behind:
                log.error("stopping with the model's latest state unpublished: predictors "
                          "serve an older one until the next run of this learner publishes")
                self.summary.exit_code = 1
        if self.models is not None:
            self._summarize_models()  # before closing: the close revokes their partitions
        if self._consumer is not None:
            if (not self._undelivered and self.models is None and not self._lock_lost
                    and not self._twin):
                self._commit()
            with contextlib.suppress(Exception):
                self._consumer.close(autocommit=False)
        if self._producer is not None:
            # Outputs given up on a second stop are not waited for again (the restart repeats
            # them): the close drops them at once.
            given_up = self._undelivered and self._stop_requests >= 2
            with contextlib.suppress(Exception):
                self._producer.close(
                    timeout=0 if given_up else self.config.kafka.request_timeout_ms / 1000)
        if self._state_store is not None:
            self._state_store.close()
        self.summary.seconds = time.monotonic() - self._started
        if self.processor is not None:
            self.summary.accuracy = self.processor.accuracy
            self.summary.mae = self.processor.mae
            self.summary.rmse = self.processor.rmse
            self.summary.breakpoints = int(getattr(self.processor.model, "breakpoints_total", 0))
        if self.processor is not None and self.processor.held:
            scaler = self.processor.scaler
            assert scaler is not None
            log.warning(
                "%d messages are held for the scaler's warm-up (%d of %d feature messages "
                "measured): they are in the checkpoint and are answered once the warm-up is "
                "complete", len(self.processor.held), scaler.seen, scaler.target)
        log.info("stopped: %s", json.dumps(
            {name: None if isinstance(value, float) and not math.isfinite(value) else value
             for name, value in self.summary.__dict__.items()}, default=str))
