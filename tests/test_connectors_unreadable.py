"""Records the Kafka client cannot read: a record batch whose checksum does not match, whose
bytes do not decompress, whose codec is not installed, or a header whose name is not UTF-8.
The client stops at such a record at every poll; the daemon dead-letters each one as
``unreadable``, reads on after it, on that partition and the others, and commits past it."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import pytest

from connectors.config import load_config
from connectors.daemon import Daemon, ensure_topics
from stream_svm import IncrementalSVC
from tests.connectors_helpers import (  # noqa: F401
    broker,
    committed,
    read_all,
    unique,
    wait_for,
)

pytestmark = pytest.mark.broker


def _message(i: int) -> bytes:
    a = (i % 7) / 3.0 - 1.0
    return json.dumps({"id": f"m{i}", "x": {"a": a, "b": (i % 5) / 2.0 - 1.0},
                       "y": a > 0}).encode()


class _HeaderName(str):
    """A header name whose bytes on the wire are not UTF-8 (the protocol allows any)."""

    def encode(self, *args: Any, **kwargs: Any) -> bytes:
        return b"\xff\xfe"


@contextlib.contextmanager
def _damaged(kind: str) -> Iterator[dict[str, Any]]:
    """What the producer does to the batch of the damaged messages (the send's options)."""
    import kafka.record.default_records as records

    if kind == "checksum":
        build = records.DefaultRecordBatchBuilder.build

        def flipped(self: Any) -> Any:
            buffer = build(self)
            buffer[-3] ^= 1  # one bit of the last value, after the checksum was computed
            return buffer

        records.DefaultRecordBatchBuilder.build = flipped
        try:
            yield {}
        finally:
            records.DefaultRecordBatchBuilder.build = build
    elif kind == "gzip":
        encode = records.gzip_encode
        # A gzip header and then nothing gzip can inflate; the checksum covers these bytes.
        records.gzip_encode = lambda data: b"\x1f\x8b" + b"\x00" * 5 + b"not gzip at all"
        try:
            yield {"compression_type": "gzip"}
        finally:
            records.gzip_encode = encode
    elif kind == "header":
        yield {"headers": [(_HeaderName("trace"), b"1")]}
    else:
        raise AssertionError(kind)


def _produce(servers: str, topic: str, partition: int, first: int, count: int,
             kind: str | None = None, compression: str | None = None) -> None:
    """Messages ``first`` .. ``first + count - 1`` in one batch, damaged as ``kind`` says, or
    compressed with ``compression``."""
    from kafka import KafkaProducer

    with _damaged(kind) if kind else contextlib.nullcontext({}) as options:
        if compression is not None:
            options["compression_type"] = compression
        headers = options.pop("headers", None)
        # One batch: all sent within the linger, then flushed.
        producer = KafkaProducer(bootstrap_servers=servers, acks="all", linger_ms=200,
                                 **options)
        try:
            for i in range(first, first + count):
                producer.send(topic, value=_message(i), partition=partition, headers=headers)
            producer.flush(timeout=30)
        finally:
            producer.close(timeout=10)


def _around(servers: str, topic: str, before: int, middle: int, after: int,
            kind: str | None = None, compression: str | None = None) -> None:
    """On partition 0: ``before`` good messages, one batch of ``middle`` damaged as ``kind``
    says (or compressed with ``compression``), then ``after`` good ones; numbered on."""
    _produce(servers, topic, 0, 0, before)
    _produce(servers, topic, 0, before, middle, kind, compression)
    if after:
        _produce(servers, topic, 0, before + middle, after)


def _config(servers: str, tmp_path, partitions: int = 1, **extra: Any):
    names = {k: unique(f"unreadable-{k}") for k in ("input", "output", "dead")}
    config = load_config(None, {
        "kafka.bootstrap_servers": servers,
        "kafka.input_topic": names["input"],
        "kafka.output_topic": names["output"],
        "kafka.dead_letter_topic": names["dead"],
        "kafka.group_id": unique("unreadable-group"),
        "kafka.request_timeout_ms": 5000,
        "model.C": 1.0,
        "model.gamma": 0.5,
        "checkpoint.dir": str(tmp_path / "checkpoints"),
        "metrics.enabled": False,
        "retry.initial_backoff_seconds": 0.1,
        "retry.max_backoff_seconds": 0.5,
        **extra,
    }, environ={})
    ensure_topics({"bootstrap_servers": servers}, [names["input"]], partitions=partitions)
    ensure_topics({"bootstrap_servers": servers}, [names["output"], names["dead"]])
    return config


@pytest.mark.parametrize("kind, damaged", [("checksum", 3), ("gzip", 3), ("header", 1)])
def test_an_unreadable_batch_is_dead_lettered_and_the_partition_reads_on(
        broker, tmp_path, kind, damaged):  # noqa: F811
    servers = broker.bootstrap_servers
    config = _config(servers, tmp_path)
    topic = config.kafka.input_topic
    _around(servers, topic, 4, damaged, 4, kind)
    total = 8 + damaged

    daemon = Daemon(config, until_drained=True)
    assert daemon.run() == 0
    outputs = read_all(servers, config.kafka.output_topic, 8)
    dead = read_all(servers, config.kafka.dead_letter_topic, damaged)
    good = [f"m{i}" for i in range(total) if not 4 <= i < 4 + damaged]
    assert [o["id"] for o in outputs] == good
    assert [letter["reason"] for letter in dead] == ["unreadable"] * damaged
    assert [letter["source"] for letter in dead] == [
        {"topic": topic, "partition": 0, "offset": offset} for offset in range(4, 4 + damaged)]
    assert all("cannot read the message" in letter["error"] for letter in dead)
    assert daemon.summary.messages == total and daemon.summary.dead_letters == damaged
    assert committed(servers, config.kafka.group_id, topic) == total
    # The model learned the readable messages, and only them.
    reference = IncrementalSVC(C=1.0, gamma=0.5)
    for i in range(total):
        if not 4 <= i < 4 + damaged:
            message = json.loads(_message(i))
            reference.learn_one(message["x"], message["y"], key=message["id"])
    model = daemon.processor.model
    assert sorted(model.stored_keys()) == sorted(good)
    probe = {"a": 0.3, "b": -0.2}
    assert model.decision_function_one(probe) == pytest.approx(
        reference.decision_function_one(probe), abs=1e-9)

    # A restart reads on from the commit: the damaged records are not met again.
    again = Daemon(config, until_drained=True)
    assert again.run() == 0
    assert again.summary.dead_letters == 0 and again.summary.messages == 0


SCOPES = {"one model": {},
          "a model per key": {"model.scope": "key", "kafka.session_timeout_ms": 3000,
                              "kafka.heartbeat_interval_ms": 300}}


@pytest.mark.parametrize("scope", list(SCOPES))
def test_an_unreadable_batch_holds_up_no_other_partition(broker, tmp_path,  # noqa: F811
                                                         scope):
    servers = broker.bootstrap_servers
    config = _config(servers, tmp_path, partitions=2, **SCOPES[scope])
    topic = config.kafka.input_topic
    _produce(servers, topic, 1, 100, 2)
    _produce(servers, topic, 1, 102, 3, "gzip")
    _produce(servers, topic, 0, 0, 6)
    _produce(servers, topic, 1, 105, 2)

    daemon = Daemon(config, until_drained=True)
    assert daemon.run() == 0
    outputs = read_all(servers, config.kafka.output_topic, 10)
    dead = read_all(servers, config.kafka.dead_letter_topic, 3)
    assert sorted(o["id"] for o in outputs) == sorted(
        [f"m{i}" for i in range(6)] + ["m100", "m101", "m105", "m106"])
    assert [(d["reason"], d["source"]["partition"], d["source"]["offset"]) for d in dead] == [
        ("unreadable", 1, 2), ("unreadable", 1, 3), ("unreadable", 1, 4)]
    assert committed(servers, config.kafka.group_id, topic, 0) == 6
    assert committed(servers, config.kafka.group_id, topic, 1) == 7


def test_a_batch_of_a_codec_not_installed_is_dead_lettered(broker, tmp_path,  # noqa: F811
                                                           monkeypatch):
    import kafka.codec as codecs

    servers = broker.bootstrap_servers
    config = _config(servers, tmp_path)
    topic = config.kafka.input_topic
    _around(servers, topic, 2, 3, 2, compression="lz4")
    # The daemon's client as on a machine without the lz4 module.
    monkeypatch.setattr(codecs, "has_lz4", lambda: False)

    daemon = Daemon(config, until_drained=True)
    assert daemon.run() == 0
    dead = read_all(servers, config.kafka.dead_letter_topic, 3)
    assert [(d["reason"], d["source"]["offset"]) for d in dead] == [
        ("unreadable", 2), ("unreadable", 3), ("unreadable", 4)]
    assert "UnsupportedCodecError" in dead[0]["error"]
    outputs = read_all(servers, config.kafka.output_topic, 4)
    assert [o["id"] for o in outputs] == ["m0", "m1", "m5", "m6"]



@pytest.mark.parametrize("settings, level", [
    ({}, "read_committed"),
    ({"kafka.isolation_level": "read_uncommitted"}, "read_uncommitted"),
])
def test_the_consumer_reads_transactions_as_kafka_isolation_level_says(
        broker, tmp_path, settings, level):  # noqa: F811
    """By default only committed transactions' messages are read: an aborted transaction's
    messages must not be learned. (The embedded broker does not send a fetch the aborted
    transactions' list that lets a client leave their messages out: there a consumer reads them
    at either level, so what is checked here is the setting the client gets.)"""
    servers = broker.bootstrap_servers
    config = _config(servers, tmp_path, **settings)
    _produce(servers, config.kafka.input_topic, 0, 0, 2)
    daemon = Daemon(config, until_drained=True)
    assert daemon.run() == 0
    assert daemon.summary.messages == 2
    assert daemon._consumer.config["isolation_level"] == level


def _run_bounded(daemon: Daemon, seconds: float = 60.0) -> int:
    """The daemon's run in a thread: a stall inside the client fails the test, not the suite."""
    import threading

    result: dict[str, int] = {}
    thread = threading.Thread(target=lambda: result.setdefault("code", daemon.run()),
                              daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        daemon.stop_event.set()
        thread.join(10)
        pytest.fail(f"the daemon was still running after {seconds:.0f} s")
    return result["code"]


def test_a_damaged_batch_after_a_transactions_marker_is_the_one_dead_lettered(
        broker, tmp_path):  # noqa: F811
    # The client's reader passes the commit marker (offset 3) without handing out a record:
    # the partition's position stayed at the marker, the marker was dead-lettered in the
    # damaged record's place, and the next poll never returned.
    from kafka import KafkaProducer

    servers = broker.bootstrap_servers
    config = _config(servers, tmp_path, **{"kafka.max_batch": 3})
    topic = config.kafka.input_topic
    producer = KafkaProducer(bootstrap_servers=servers, transactional_id=unique("tx"),
                             acks="all")
    try:
        producer.init_transactions()
        producer.begin_transaction()
        for i in range(3):
            producer.send(topic, value=_message(i), partition=0)
        producer.commit_transaction()  # offsets 0-2, the marker at 3
    finally:
        producer.close(timeout=10)
    _produce(servers, topic, 0, 4, 2, "checksum")
    _produce(servers, topic, 0, 6, 2)

    daemon = Daemon(config, until_drained=True)
    assert _run_bounded(daemon) == 0
    dead = read_all(servers, config.kafka.dead_letter_topic, 2)
    assert [(d["reason"], d["source"]["offset"]) for d in dead] == [
        ("unreadable", 4), ("unreadable", 5)]
    outputs = read_all(servers, config.kafka.output_topic, 5)
    assert [o["id"] for o in outputs] == ["m0", "m1", "m2", "m6", "m7"]


def test_unreadable_records_are_dead_lettered_once_across_restarts_with_a_model_per_partition(
        broker, tmp_path):  # noqa: F811
    # Dead-lettered beside the partition's model, they were not in its offsets: every restart
    # resumed from the model's offsets before them and dead-lettered them again.
    servers = broker.bootstrap_servers
    config = _config(servers, tmp_path, **{"model.scope": "partition",
                                            "kafka.session_timeout_ms": 3000,
                                            "kafka.heartbeat_interval_ms": 300})
    topic = config.kafka.input_topic
    _around(servers, topic, 4, 3, 0, "checksum")
    for _ in range(3):
        assert _run_bounded(Daemon(config, until_drained=True)) == 0
    dead = read_all(servers, config.kafka.dead_letter_topic, 4, timeout=5)
    assert [d["source"]["offset"] for d in dead] == [4, 5, 6]


def _inflating_runs_out_of_memory(monkeypatch: Any, when: Any) -> None:
    """Inflating a compressed record batch raises MemoryError whenever ``when()`` says so."""
    import kafka.record.default_records as records

    inflate = records.DefaultRecordBatch._maybe_uncompress

    def maybe_out_of_memory(self: Any) -> None:
        if not self._decompressed and self.compression_type != self.CODEC_NONE and when():
            raise MemoryError
        inflate(self)

    monkeypatch.setattr(records.DefaultRecordBatch, "_maybe_uncompress", maybe_out_of_memory)


def test_running_out_of_memory_reading_a_batch_reads_it_again(broker, tmp_path,  # noqa: F811
                                                              monkeypatch):
    # Memory may be there at the next attempt: the batch is not dead-lettered for it.
    servers = broker.bootstrap_servers
    config = _config(servers, tmp_path)
    topic = config.kafka.input_topic
    _around(servers, topic, 3, 3, 0, compression="gzip")
    failures: list[int] = []

    def out_of_memory_once() -> bool:
        failures.append(1)
        return len(failures) == 1

    _inflating_runs_out_of_memory(monkeypatch, out_of_memory_once)
    daemon = Daemon(config, until_drained=True)
    assert _run_bounded(daemon) == 0
    assert failures and daemon.summary.dead_letters == 0
    outputs = read_all(servers, config.kafka.output_topic, 6)
    assert [o["id"] for o in outputs] == [f"m{i}" for i in range(6)]


def test_a_batch_that_never_fits_in_memory_is_dead_lettered_after_a_few_attempts(
        broker, tmp_path, monkeypatch, caplog):  # noqa: F811
    # Read again for good, its partition stuck and the log saying "poll failed: ;" (a
    # MemoryError's text is empty).
    from connectors.daemon import MEMORY_ATTEMPTS

    servers = broker.bootstrap_servers
    config = _config(servers, tmp_path)
    topic = config.kafka.input_topic
    _around(servers, topic, 2, 3, 2, compression="gzip")
    attempts: list[int] = []
    _inflating_runs_out_of_memory(monkeypatch, lambda: attempts.append(1) or True)
    daemon = Daemon(config, until_drained=True)
    with caplog.at_level("WARNING", logger="connectors.daemon"):
        assert _run_bounded(daemon) == 0
    assert len(attempts) == MEMORY_ATTEMPTS
    dead = read_all(servers, config.kafka.dead_letter_topic, 3)
    assert [(d["reason"], d["source"]["offset"]) for d in dead] == [
        ("unreadable", 2), ("unreadable", 3), ("unreadable", 4)]
    assert "(MemoryError)" in dead[0]["error"]
    assert f"ran out of memory reading the messages at {topic}:0:2 (attempt 1 of" in caplog.text
    outputs = read_all(servers, config.kafka.output_topic, 4)
    assert [o["id"] for o in outputs] == ["m0", "m1", "m5", "m6"]


def test_a_large_unreadable_batch_is_passed_at_once_when_its_header_holds(
        broker, tmp_path, monkeypatch):  # noqa: F811
    # Its checksum holds (a codec not installed): every offset of it is known unreadable. Met
    # one poll per offset, each fetching and checking the whole batch again, a batch of 10,000
    # records took 15 minutes.
    import kafka.codec as codecs

    servers = broker.bootstrap_servers
    config = _config(servers, tmp_path)
    topic = config.kafka.input_topic
    _around(servers, topic, 1, 1500, 1, compression="lz4")
    monkeypatch.setattr(codecs, "has_lz4", lambda: False)
    daemon = Daemon(config, until_drained=True)
    assert _run_bounded(daemon, 120) == 0
    assert daemon.summary.dead_letters == 1500 and daemon.summary.messages == 1502
    # One poll per record batch (the producer cut the 1,500 into a few), not one per offset.
    assert daemon.summary.batches <= 20
    assert committed(servers, config.kafka.group_id, topic) == 1502


class _Answer:
    """A partition's part of a fetch response as the broker might have sent it instead."""

    def __init__(self, data: Any, **changed: Any) -> None:
        self._data, self._changed = data, changed

    def __getattr__(self, name: str) -> Any:
        return self._changed[name] if name in self._changed else getattr(self._data, name)


def _first_batch_in(buffer: bytes, offsets: range) -> int | None:
    """Where in ``buffer`` the first record batch starting in ``offsets`` is, if one does."""
    import struct

    at = 0
    while at + 12 <= len(buffer):
        base, length = struct.unpack_from(">qi", buffer, at)
        if base in offsets:
            return at
        at += 12 + length
    return None


class _Stamped(list):
    """A list that also keeps when (time.monotonic()) each item was appended."""

    def __init__(self) -> None:
        super().__init__()
        self.times: list[float] = []

    def append(self, item: Any) -> None:
        import time

        self.times.append(time.monotonic())
        super().append(item)


@contextlib.contextmanager
def _fetches_damaged(topic: str, offsets: range, kind: str, times: int,
                     seconds: float | None = None) -> Iterator[list[int]]:
    """The first ``times`` fetch responses of ``topic`` that reach ``offsets`` (for ``seconds``
    from the first, if given) damaged as a broker whose log is damaged there sends them:
    ``length``, the length field of the batch claims more bytes than there are; ``corrupt``,
    the error CORRUPT_MESSAGE and no records (a fetch from an offset before them reads up to
    them). Yields the offsets of the fetches damaged so far."""
    import struct
    import time

    from kafka.consumer import fetcher

    parse, damaged, since = fetcher.Fetcher._parse_fetched_data, _Stamped(), []

    def answered(self: Any, completed: Any) -> Any:
        data = completed.partition_data
        over = seconds is not None and since and time.monotonic() > since[0] + seconds
        if completed.topic_partition.topic == topic and len(damaged) < times and not over:
            buffer = bytes(data.records or b"")
            at = _first_batch_in(buffer, offsets)
            if kind == "corrupt" and completed.fetched_offset in offsets:
                data = _Answer(data, error_code=2, records=b"")
                damaged.append(completed.fetched_offset)
                since[:] = since or [time.monotonic()]
            elif kind == "corrupt" and at is not None:  # what it reads up to the damage
                data = _Answer(data, records=buffer[:at])
            elif at is not None:
                damaged_length = buffer[:at + 8] + struct.pack(">i", 0x7FFFFFFF)
                data = _Answer(data, records=damaged_length + buffer[at + 12:])
                damaged.append(completed.fetched_offset)
            completed = completed._replace(partition_data=data)
        return parse(self, completed)

    fetcher.Fetcher._parse_fetched_data = answered
    try:
        yield damaged
    finally:
        fetcher.Fetcher._parse_fetched_data = parse


def _serve_damaged(config: Any, offsets: range, kind: str, times: int = 10**6,
                   seconds: float | None = None, window: float = 30.0
                   ) -> tuple[Daemon, list[int]]:
    """A daemon run to the end of its input, with its fetches damaged (_fetches_damaged) and
    UNFETCHABLE_SECONDS = ``window``; it and the offsets of the fetches damaged."""
    import connectors.daemon as daemon_module

    kept, daemon_module.UNFETCHABLE_SECONDS = daemon_module.UNFETCHABLE_SECONDS, window
    try:
        with _fetches_damaged(config.kafka.input_topic, offsets, kind, times,
                              seconds) as damaged:
            daemon = Daemon(config, until_drained=True)
            assert _run_bounded(daemon) == 0
    finally:
        daemon_module.UNFETCHABLE_SECONDS = kept
    return daemon, damaged


@pytest.mark.parametrize("kind, error", [
    ("length", "no complete record batch"), ("corrupt", "CORRUPT_MESSAGE")])
def test_a_batch_the_broker_cannot_send_whole_is_dead_lettered_after_a_few_fetches(
        broker, tmp_path, caplog, kind, error):  # noqa: F811
    # The client raised at every fetch of its first offset ("Failed to make progress reading
    # messages", or CorruptRecordError): the partition stayed there for good.
    from connectors.daemon import UNFETCHABLE_ATTEMPTS as attempts
    servers = broker.bootstrap_servers
    config = _config(servers, tmp_path)
    topic = config.kafka.input_topic
    _around(servers, topic, 4, 3, 4)
    with caplog.at_level("WARNING", logger="connectors.daemon"):
        _, damaged = _serve_damaged(config, range(4, 7), kind, window=2.0)
    # Its first offset fetched a few times; with a damaged length, the next ones, which the
    # broker answers with the same damaged batch, once. (A fetch from before it reads the
    # batches before it.)
    fetched = [at for at in damaged if at >= 4]
    assert fetched == sorted(fetched) and fetched.count(4) >= attempts
    if kind == "length":
        assert fetched.count(5) == fetched.count(6) == 1
    else:  # (nothing to tell the same batch by: the next offsets are tried, without the
        # window the first waited out: a log damaged over 500 records took 4 hours)
        assert fetched.count(5) == fetched.count(6) == attempts
    assert f"cannot fetch the message at {topic}:0:4 (attempt 1, for 0 s)" in caplog.text
    dead = read_all(servers, config.kafka.dead_letter_topic, 3)
    assert [(d["reason"], d["source"]["offset"]) for d in dead] == [
        ("unreadable", 4), ("unreadable", 5), ("unreadable", 6)]
    assert all(error in d["error"] for d in dead)
    outputs = read_all(servers, config.kafka.output_topic, 8)
    assert [o["id"] for o in outputs] == [f"m{i}" for i in (0, 1, 2, 3, 7, 8, 9, 10)]
    assert committed(servers, config.kafka.group_id, topic) == 11


@pytest.mark.parametrize("kind", ["length", "corrupt"])
def test_a_response_damaged_once_is_fetched_again(broker, tmp_path, kind):  # noqa: F811
    # A fault on the way, or a broker's passing error, must not cost a message.
    servers = broker.bootstrap_servers
    config = _config(servers, tmp_path)
    topic = config.kafka.input_topic
    _around(servers, topic, 0, 3, 2)
    daemon, damaged = _serve_damaged(config, range(0, 3), kind, times=1)
    assert damaged == [0] and daemon.summary.dead_letters == 0
    outputs = read_all(servers, config.kafka.output_topic, 5)
    assert [o["id"] for o in outputs] == [f"m{i}" for i in range(5)]


@pytest.mark.parametrize("codec", ["gzip", "lz4", "zstd", "snappy"])
def test_a_batch_inflating_beyond_the_bound_is_dead_lettered(broker, tmp_path,  # noqa: F811
                                                             codec):
    # kafka-python inflated a batch whole into memory: 12.8 KB of zstd took 400 MB, and a
    # batch made to inflate further had the daemon killed for its memory at every start.
    servers = broker.bootstrap_servers
    config = _config(servers, tmp_path, **{"kafka.max_message_bytes": 1000,
                                            "kafka.max_inflated_batch_bytes": 4000})
    topic = config.kafka.input_topic
    _produce(servers, topic, 0, 0, 4, compression=codec)  # about 300 bytes inflated
    _produce(servers, topic, 0, 4, 100, compression=codec)  # about 7,000
    _produce(servers, topic, 0, 104, 2)
    daemon = Daemon(config, until_drained=True)
    assert _run_bounded(daemon) == 0
    dead = read_all(servers, config.kafka.dead_letter_topic, 100)
    assert [(d["reason"], d["source"]["offset"]) for d in dead] == [
        ("unreadable", offset) for offset in range(4, 104)]
    assert (f"InflateLimitError: a {codec} record batch inflates beyond 4000 bytes "
            "(kafka.max_inflated_batch_bytes)") in dead[0]["error"]
    outputs = read_all(servers, config.kafka.output_topic, 6)
    assert [o["id"] for o in outputs] == ["m0", "m1", "m2", "m3", "m104", "m105"]


def test_errors_at_the_end_of_the_partition_pass_nothing(broker, tmp_path):  # noqa: F811
    # A consumer that has read everything fetches at the partition's end, where no message
    # is: three errors there dead-lettered that empty offset, the position one past the end
    # stopped the daemon ("no longer holds the offsets"), and the message then written there
    # would have been skipped.
    import threading

    import connectors.daemon as daemon_module

    servers = broker.bootstrap_servers
    config = _config(servers, tmp_path)
    topic = config.kafka.input_topic
    _produce(servers, topic, 0, 0, 4)
    kept, daemon_module.UNFETCHABLE_SECONDS = daemon_module.UNFETCHABLE_SECONDS, 0.0
    try:
        with _fetches_damaged(topic, range(4, 5), "corrupt", times=4) as damaged:
            daemon = Daemon(config)
            thread = threading.Thread(target=daemon.run, daemon=True)
            thread.start()
            try:
                assert wait_for(lambda: len(damaged) == 4, 30)
                _produce(servers, topic, 0, 4, 2)
                outputs = read_all(servers, config.kafka.output_topic, 6)
            finally:
                daemon.stop()
                thread.join(30)
    finally:
        daemon_module.UNFETCHABLE_SECONDS = kept
    assert [o["id"] for o in outputs] == [f"m{i}" for i in range(6)]
    assert daemon.summary.dead_letters == 0 and daemon.summary.exit_code == 0


def test_a_passing_fault_after_a_dead_letter_costs_no_message(broker, tmp_path):  # noqa: F811
    # The offset after one dead-lettered was passed at its first error, with no evidence of
    # the same damage: a broker's errors for 2 s past a damaged batch dead-lettered every
    # message it then met, 35 of 40. A fault must last UNFETCHABLE_SECONDS to cost one.
    servers = broker.bootstrap_servers
    config = _config(servers, tmp_path)
    topic = config.kafka.input_topic
    _around(servers, topic, 4, 3, 0, "checksum")
    for i in range(7, 27):
        _produce(servers, topic, 0, i, 1)
    daemon, damaged = _serve_damaged(config, range(7, 27), "corrupt", seconds=2.0, window=5.0)
    assert damaged
    dead = read_all(servers, config.kafka.dead_letter_topic, 3)
    assert [d["source"]["offset"] for d in dead] == [4, 5, 6]
    assert daemon.summary.dead_letters == 3
    outputs = read_all(servers, config.kafka.output_topic, 24)
    assert [o["id"] for o in outputs] == [f"m{i}" for i in (0, 1, 2, 3, *range(7, 27))]


def test_a_partition_that_cannot_be_fetched_holds_up_no_other(broker, tmp_path):  # noqa: F811
    # Each failed fetch made the whole poll loop back off, every partition with it, for up to
    # the 30 s before a record is passed; and retry.max_attempts, meant for an unreachable
    # broker, counted those failures and stopped the daemon (exit 1 at the second here).
    import threading
    import time

    servers = broker.bootstrap_servers
    config = _config(servers, tmp_path, partitions=2, **{
        "retry.max_attempts": 2, "retry.initial_backoff_seconds": 3.0,
        "retry.max_backoff_seconds": 3.0})
    topic = config.kafka.input_topic
    _produce(servers, topic, 1, 100, 2)
    _produce(servers, topic, 1, 102, 2)
    handled: list[tuple[float, int]] = []
    with _fetches_damaged(topic, range(2, 3), "corrupt", times=2) as damaged:
        daemon = Daemon(config, until_drained=True)
        daemon.on_batch = lambda d: handled.append((time.monotonic(), d.summary.messages))
        result: dict[str, int] = {}
        thread = threading.Thread(target=lambda: result.setdefault("code", daemon.run()),
                                  daemon=True)
        thread.start()
        try:
            assert wait_for(lambda: len(damaged) == 1, 30)
            for first in range(0, 6, 3):  # partition 0 goes on meanwhile
                _produce(servers, topic, 0, first, 3)
            assert wait_for(lambda: handled and handled[-1][1] == 8, 30)
            answered_at = handled[-1][0]
            assert wait_for(lambda: len(damaged) == 2, 30)
        finally:
            thread.join(60)
            daemon.stop()
    assert result.get("code") == 0 and daemon.summary.dead_letters == 0
    # Partition 1 was held back after its failure, not the loop: partition 0's messages were
    # answered within that back-off, before partition 1 was fetched again.
    assert answered_at < damaged.times[1]
    outputs = read_all(servers, config.kafka.output_topic, 10)
    assert sorted(o["id"] for o in outputs) == sorted(
        [f"m{i}" for i in range(6)] + [f"m{i}" for i in range(100, 104)])


@pytest.mark.parametrize("kind", ["length", "corrupt"])
@pytest.mark.parametrize("case", ["caught_up", "last_batch", "open_transaction"])
def test_a_damaged_batch_is_passed_wherever_the_partition_stands(broker, tmp_path,  # noqa: F811
                                                                 kind, case):
    # caught_up: the batch came after everything was read, and the client's high watermark
    # (its last good fetch's) said the partition ended at it: passed, its position read as
    # offsets lost, and the daemon stopped. last_batch and open_transaction: the embedded
    # broker's end offset (the last batch's first offset + 1; 0 under read_committed while a
    # transaction is open) said no message was there, and it was fetched again for good.
    import threading

    from kafka import KafkaProducer

    import connectors.daemon as daemon_module

    servers = broker.bootstrap_servers
    config = _config(servers, tmp_path)
    topic = config.kafka.input_topic
    _produce(servers, topic, 0, 0, 2)
    kept, daemon_module.UNFETCHABLE_SECONDS = daemon_module.UNFETCHABLE_SECONDS, 0.5
    daemon = Daemon(config)
    thread = threading.Thread(target=daemon.run, daemon=True)
    producer = None
    try:
        with _fetches_damaged(topic, range(2, 5), kind, times=10**6):
            if case == "caught_up":
                thread.start()
                assert wait_for(lambda: daemon.summary.messages == 2, 30)
            _produce(servers, topic, 0, 2, 3)  # damaged on the way to the daemon
            if case != "last_batch":
                _produce(servers, topic, 0, 5, 3)
            if case == "open_transaction":
                producer = KafkaProducer(bootstrap_servers=servers,
                                         transactional_id=unique("open"), acks="all")
                producer.init_transactions()
                producer.begin_transaction()
                producer.send(topic, value=_message(99), partition=0)
                producer.flush(timeout=30)  # and never committed
            if case != "caught_up":
                thread.start()
            dead = read_all(servers, config.kafka.dead_letter_topic, 3)
            good = 2 if case == "last_batch" else 5
            outputs = read_all(servers, config.kafka.output_topic, good)
    finally:
        daemon.stop()
        thread.join(30)
        daemon_module.UNFETCHABLE_SECONDS = kept
        if producer is not None:
            producer.close(timeout=5)
    assert [(d["reason"], d["source"]["offset"]) for d in dead] == [
        ("unreadable", offset) for offset in (2, 3, 4)]
    assert [o["id"] for o in outputs] == ["m0", "m1", "m5", "m6", "m7"][:good]
    assert daemon.summary.exit_code == 0


def test_a_run_to_the_end_of_the_input_waits_for_a_record_it_could_not_fetch(
        broker, tmp_path):  # noqa: F811
    # The client's high watermark is its last good fetch's: it said the partition was read to
    # its end while the record there waited to be fetched again (the failed response told 7),
    # and the run stopped with offsets 2-6 neither read nor dead-lettered.
    from kafka.consumer import fetcher

    import connectors.daemon as daemon_module

    servers = broker.bootstrap_servers
    config = _config(servers, tmp_path)
    topic = config.kafka.input_topic
    _produce(servers, topic, 0, 0, 2)
    _produce(servers, topic, 0, 2, 3)
    _produce(servers, topic, 0, 5, 2)
    parse = fetcher.Fetcher._parse_fetched_data

    def answered(self: Any, completed: Any) -> Any:
        data = completed.partition_data
        if completed.topic_partition.topic == topic:
            if completed.fetched_offset < 2:  # as if fetched before the rest was written
                buffer = bytes(data.records or b"")
                at = _first_batch_in(buffer, range(2, 10**6))
                if at is not None:
                    data = _Answer(data, records=buffer[:at], high_watermark=2)
            elif completed.fetched_offset in range(2, 5):
                data = _Answer(data, error_code=2, records=b"")
            completed = completed._replace(partition_data=data)
        return parse(self, completed)

    kept, daemon_module.UNFETCHABLE_SECONDS = daemon_module.UNFETCHABLE_SECONDS, 0.5
    fetcher.Fetcher._parse_fetched_data = answered
    try:
        daemon = Daemon(config, until_drained=True)
        assert _run_bounded(daemon) == 0
    finally:
        fetcher.Fetcher._parse_fetched_data = parse
        daemon_module.UNFETCHABLE_SECONDS = kept
    assert daemon.summary.dead_letters == 3 and daemon.summary.outputs == 4


def test_a_partition_held_back_is_not_resumed_while_the_group_rebalances(tmp_path):
    # A partition given up meanwhile (fenced: another process claimed one of its models) must
    # stay paused until the next assignment settles it.
    from kafka import TopicPartition

    class Consumer:
        def __init__(self) -> None:
            self.resumed: list[Any] = []

        def assignment(self) -> set:
            return {TopicPartition("in", 0)}

        def resume(self, tp: Any) -> None:
            self.resumed.append(tp)

    config = load_config(None, {"kafka.bootstrap_servers": "127.0.0.1:9",
                                "checkpoint.dir": str(tmp_path), "metrics.enabled": False},
                         environ={})
    daemon = Daemon(config)
    daemon._consumer = Consumer()
    daemon._held_back["in:0"] = (TopicPartition("in", 0), 0.0)  # due long ago
    daemon._rebalancing = True
    daemon._release_held_back()
    assert daemon._consumer.resumed == [] and "in:0" in daemon._held_back
    daemon._rebalancing = False
    daemon._release_held_back()
    assert daemon._consumer.resumed == [TopicPartition("in", 0)] and not daemon._held_back
