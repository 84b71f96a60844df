"""The Kafka state store (connectors.state_store): keys, round trips, chunking, newest complete
state, crashes half-way through a publish, corrupt chunks, zombies, claims, tombstones and
bounded failures. Broker tests run on the embedded broker, each on a topic of its own."""

from __future__ import annotations

import hashlib
import logging
import time
from typing import Any

import numpy as np
import pytest

from connectors.broker import free_loopback_port
from connectors.state_store import (
    _PREFIX,
    FORMAT_VERSION,
    StaleEpochError,
    StateFromNewerVersion,
    StateStore,
    StateStoreError,
    _decode_value,
    _encode_payload,
    _encode_value,
    _parse_key,
    _Record,
    chunk_key,
    claim_key,
    normalize_model_id,
)
from tests.connectors_helpers import broker, unique  # noqa: F401

TIMEOUT = 15.0  # per store operation; the broker answers in well under a second


def make_store(servers: str, topic: str, **options: Any) -> StateStore:
    options.setdefault("timeout", TIMEOUT)
    return StateStore(servers, topic, **options)


@pytest.fixture
def store_of(broker):  # noqa: F811 - the fixture imported above
    """``store_of(topic, **options)``: a StateStore on the embedded broker, closed at the end."""
    stores: list[StateStore] = []

    def open_store(topic: str, **options: Any) -> StateStore:
        store = make_store(broker.bootstrap_servers, topic, **options)
        stores.append(store)
        return store

    yield open_store
    for store in stores:
        store.close()


def raw_records(servers: str, topic: str, timeout: float = 20.0) -> list[Any]:
    """Every record of ``topic`` (all partitions), read to the fetch high watermark (Tansu's
    end offsets stop at the last batch's base offset)."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=servers, enable_auto_commit=False,
                             request_timeout_ms=5000, fetch_max_wait_ms=100)
    try:
        tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic))]
        consumer.assign(tps)
        consumer.seek_to_beginning()
        found: list[Any] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for batch in consumer.poll(timeout_ms=200).values():
                found += batch
            if all(consumer.highwater(tp) is not None
                   and consumer.position(tp) >= consumer.highwater(tp) for tp in tps):
                return sorted(found, key=lambda r: (r.partition, r.offset))
        raise AssertionError(f"could not read {topic} to its end within {timeout} s")
    finally:
        consumer.close()


def send_raw(servers: str, topic: str, records: list[tuple[bytes, bytes | None]],
             partition: int = 0) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=servers, acks="all", enable_idempotence=False)
    try:
        for key, value in records:
            producer.send(topic, key=key, value=value, partition=partition)
        producer.flush(timeout=10)
    finally:
        producer.close(timeout=5)


def compacted_copy(servers: str, source: str, target: str) -> None:
    """What compaction leaves of ``source`` (the newest record of each key, tombstones gone),
    written to the new topic ``target``: Tansu never compacts, so this is how a test sees
    the topic after compaction."""
    latest: dict[tuple[int, bytes], Any] = {}
    for record in raw_records(servers, source):
        latest.pop((record.partition, record.key), None)  # keep the newest's position
        latest[(record.partition, record.key)] = record
    kept = [r for r in latest.values() if r.value is not None]
    with make_store(servers, target) as store:
        store.ensure_topic()
    send_raw(servers, target, [(r.key, r.value) for r in kept])


def arrays_of(seed: int, size: int = 5_000) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"alpha": rng.standard_normal(size), "index": np.arange(size, dtype=np.int64) * seed}


def assert_same_arrays(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert sorted(got) == sorted(want)
    for name, array in want.items():
        array = np.asarray(array)
        assert got[name].dtype == array.dtype, name
        assert got[name].shape == array.shape, name
        assert got[name].tobytes() == array.tobytes(), name  # bit for bit, NaN and -0.0 too


def chunk_headers(servers: str, topic: str) -> list[dict[str, Any]]:
    return [_decode_value(r.value)[0] for r in raw_records(servers, topic)
            if r.value is not None and b'"chunk"' in r.key]


# -- keys (no broker) ---------------------------------------------------------------------------


def test_consecutive_sequences_use_different_keys_and_epochs_never_share_one():
    model = [3, "gauge-17"]
    for epoch in range(4):
        for sequence in range(20):
            for chunk in range(3):
                key = chunk_key(model, epoch, sequence, chunk)
                # double buffering: a write of sequence s never touches sequence s - 1's keys
                assert key != chunk_key(model, epoch, sequence + 1, chunk)
                assert key != chunk_key(model, epoch, sequence + 1, chunk + 1)
                # the two slots are reused, so a model holds a bounded number of keys
                assert key == chunk_key(model, epoch, sequence + 2, chunk)
    keys_by_epoch = {
        epoch: {chunk_key(model, epoch, s, c) for s in range(4) for c in range(5)}
        | {claim_key(model, epoch)}
        for epoch in range(6)
    }
    for a in keys_by_epoch:
        for b in keys_by_epoch:
            if a != b:
                assert not keys_by_epoch[a] & keys_by_epoch[b], (a, b)
    # models never share keys, and one model id always gives the same bytes
    assert chunk_key([3, "a"], 0, 0, 0) != chunk_key([3, "b"], 0, 0, 0)
    assert chunk_key([3, None], 0, 0, 0) != chunk_key([4, None], 0, 0, 0)
    assert chunk_key((3, None), 1, 2, 0) == chunk_key([3, None], 1, 2, 0)
    assert chunk_key([3, None], 1, 2, 0) == b'{"chunk":0,"epoch":1,"model":[3,null],"slot":0}'


def test_claims_of_one_epoch_by_two_owners_have_different_keys_and_old_claim_keys_still_parse():
    model = [3, None]
    assert claim_key(model, 1, "a1") != claim_key(model, 1, "b2")
    assert _parse_key(claim_key(model, 1, "a1")).owner == "a1"
    # a claim key written without its owner (earlier versions) is still a claim of the epoch
    legacy = _parse_key(b'{"claim":true,"epoch":1,"model":[3,null]}')
    assert (legacy.model, legacy.epoch, legacy.slot, legacy.owner) == ((3, None), 1, None, None)
    for bad_owner in ("", 7):
        with pytest.raises(ValueError, match="owner"):
            claim_key(model, 1, bad_owner)
        assert _parse_key(b'{"claim":true,"epoch":1,"model":[3,null],"owner":%s}'
                          % (b'""' if bad_owner == "" else b"7")) is None


def _claim_record(store: StateStore, offset: int, model: Any, epoch: int) -> _Record:
    header = {"kind": "claim", "model": model, "epoch": epoch, "owner": store.owner_token}
    key = claim_key(model, epoch, f"{store.owner_token}.{offset}")
    return _Record(0, offset, key, _encode_value(header))


def _compacted(records: list[_Record]) -> list[_Record]:
    """What log compaction leaves: the newest record of each key, in offset order."""
    newest = {record.key: record for record in records}
    return sorted(newest.values(), key=lambda record: record.offset)


def test_compaction_keeps_the_winning_claim_so_the_loser_never_takes_it_for_its_own():
    # Two owners claim epoch 1 of a model at once: the winner's claim lands first, the loser's
    # second (the loser's claim_epoch raised StaleEpochError, or lost its acknowledgement).
    # Compaction runs before the winner's first state. Had both claims one key, compaction
    # would keep the loser's alone: reading the topic again, the loser would find its own
    # claim first, and a retried claim_epoch would hand it epoch 1 beside the winner.
    winner = StateStore("127.0.0.1:9", "state", timeout=1.0)  # never connects
    loser = StateStore("127.0.0.1:9", "state", timeout=1.0)
    records = [_claim_record(winner, 10, "m", 1), _claim_record(loser, 11, "m", 1)]
    for store in (winner, loser):
        store._apply(_compacted(records), rebuild=True)  # as its read of the topic does
        store._read_until = {0: 12}
    assert winner._claimed_here("m", 1)
    assert not loser._claimed_here("m", 1)
    assert loser.next_epoch("m") == 2  # claiming again goes above the winner


def test_model_ids_are_normalized_and_ambiguous_ones_refused():
    assert normalize_model_id([3, "gauge-17"]) == (3, "gauge-17")
    assert normalize_model_id([3, None]) == (3, None)
    assert normalize_model_id("m") == "m"
    for bad in (1.0, True, [3, 1.5], {"p": 3}, b"x"):
        with pytest.raises(TypeError):
            normalize_model_id(bad)


def test_refused_states_raise_before_anything_is_sent():
    # Port 1 on loopback: nothing listens, so a send would fail; these must fail earlier.
    store = StateStore("127.0.0.1:1", "never-used", timeout=1)
    with pytest.raises(ValueError, match="dtype object"):
        store.publish(1, {"x": np.array([{}], dtype=object)}, {}, 0, 0, 0)
    with pytest.raises(ValueError, match="may not be named"):
        store.publish(1, {"__meta__": np.zeros(1)}, {}, 0, 0, 0)
    with pytest.raises(ValueError, match="JSON"):
        store.publish(1, {"x": np.zeros(1)}, {"nan": float("nan")}, 0, 0, 0)
    with pytest.raises(ValueError, match="epoch"):
        store.publish(1, {"x": np.zeros(1)}, {}, 0, -1, 0)
    with pytest.raises(ValueError, match="client_options"):
        StateStore("127.0.0.1:1", "t", client_options={"no_such_setting": 1})
    with pytest.raises(ValueError, match="acks"):
        StateStore("127.0.0.1:1", "t", client_options={"acks": 1})
    store.close()
    with pytest.raises(StateStoreError, match="closed"):
        store.restore()


# -- on the broker --------------------------------------------------------------------------------


@pytest.mark.broker
def test_round_trip_is_bit_for_bit(broker, store_of):  # noqa: F811
    topic = unique("state-roundtrip")
    arrays = {
        "f64": np.array([1.5, -0.0, np.nan, np.inf, 1e-310]),
        "i64": np.array([[1, -2], [2**62, -(2**63)]], dtype=np.int64),
        "i8": np.array([-128, 0, 127], dtype=np.int8),
        "zero_d": np.array(3.25),
        "empty": np.zeros((0, 4)),
        "fortran": np.asfortranarray(np.arange(12.0).reshape(3, 4)),
        "flags": np.array([True, False]),
        "names": np.array(["a", "gauge-17"]),
    }
    metadata = {"C": 1.0, "kernel": "rbf", "gamma": 0.5, "classes": [False, True], "n": 7}
    writer = store_of(topic)
    writer.ensure_topic()
    writer.publish([3, "gauge-17"], arrays, metadata, next_offset=1234, epoch=0, sequence=1)
    restored = store_of(topic).restore()  # a store that never wrote: everything from the broker
    assert list(restored) == [(3, "gauge-17")]
    state = restored[(3, "gauge-17")]
    assert_same_arrays(state.arrays, arrays)
    assert state.metadata == metadata
    assert (state.next_offset, state.epoch, state.sequence) == (1234, 0, 1)


@pytest.mark.broker
def test_a_large_state_is_chunked_and_restored_whole(broker, store_of):  # noqa: F811
    topic = unique("state-chunks")
    arrays = {"kernel_columns": np.random.default_rng(1).standard_normal(375_000)}  # 3 MB
    store = store_of(topic, max_record_bytes=200_000)
    store.ensure_topic()
    store.publish("big", arrays, {"rows": 375_000}, next_offset=9, epoch=0, sequence=1)
    records = raw_records(broker.bootstrap_servers, topic)
    assert len(records) >= 15
    assert max(len(r.value) for r in records) <= 200_000
    state = store_of(topic).restore()["big"]
    assert_same_arrays(state.arrays, arrays)
    assert state.metadata == {"rows": 375_000}


@pytest.mark.broker
def test_the_newest_state_wins_and_models_are_kept_apart(broker, store_of):  # noqa: F811
    topic = unique("state-newest")
    store = store_of(topic, max_record_bytes=8192)
    store.ensure_topic(partitions=3)
    models = [[0, "a"], [0, "b"], [1, None], "plain"]
    published: dict[Any, dict[str, np.ndarray]] = {}
    for sequence in range(1, 6):
        for number, model in enumerate(models):
            if sequence > 5 - number:  # model i stops at sequence 5 - i
                continue
            arrays = arrays_of(100 * number + sequence, size=1500 + 100 * number)
            store.publish(model, arrays, {"sequence": sequence}, next_offset=10 * sequence,
                          epoch=0, sequence=sequence)
            published[normalize_model_id(model)] = arrays
    with pytest.raises(ValueError, match="sequences must grow"):
        store.publish("plain", arrays_of(0), {}, next_offset=0, epoch=0, sequence=2)
    restored = store_of(topic).restore()
    assert set(restored) == set(published)
    for number, model in enumerate(models):
        state = restored[normalize_model_id(model)]
        assert state.sequence == 5 - number
        assert state.metadata == {"sequence": 5 - number}
        assert state.next_offset == 10 * (5 - number)
        assert_same_arrays(state.arrays, published[normalize_model_id(model)])
    only = store_of(topic).restore([[0, "b"], "absent"])
    assert list(only) == [(0, "b")]


@pytest.mark.broker
def test_follow_reads_only_what_was_written_since_and_decodes_only_newer_states(
        broker, store_of, monkeypatch):  # noqa: F811
    # A predictor read every state ever published at every refresh (each second): a topic
    # compacts only its closed segments (an hour of states), and Tansu never compacts.
    servers = broker.bootstrap_servers
    topic = unique("state-follow")
    writer = store_of(topic, max_record_bytes=8192)
    writer.ensure_topic()
    for sequence in range(1, 4):
        writer.publish("m", arrays_of(sequence), {"s": sequence}, next_offset=sequence,
                       epoch=0, sequence=sequence)
        writer.publish("other", arrays_of(50 + sequence), {}, next_offset=0, epoch=0,
                       sequence=sequence)
    everything = len(raw_records(servers, topic))
    reader = store_of(topic)
    state = reader.follow("m")
    assert (state.sequence, state.metadata) == (3, {"s": 3})
    assert_same_arrays(state.arrays, arrays_of(3))
    assert reader.last_report.records == everything
    assert reader.follow("m", newer_than=(0, 3)) is None
    assert reader.last_report.records == 0
    # A state whose chunks are written across two reads is whole at the second.
    real_send_all = writer._send_all
    held = []

    def first_two_chunks(records, partition, deadline, doing):
        records = list(records)
        held.append((records[2:], partition))
        return real_send_all(records[:2], partition, deadline, doing)

    monkeypatch.setattr(writer, "_send_all", first_two_chunks)
    writer.publish("m", arrays_of(4), {"s": 4}, next_offset=4, epoch=0, sequence=4)
    monkeypatch.undo()
    assert reader.follow("m", newer_than=(0, 3)) is None
    assert reader.last_report.records == 2 and reader.last_report.incomplete == 1
    rest, partition = held[0]
    assert len(rest) >= 2
    real_send_all(rest, partition, time.monotonic() + TIMEOUT, "the rest")
    state = reader.follow("m", newer_than=(0, 3))
    assert (state.sequence, state.metadata) == (4, {"s": 4})
    assert_same_arrays(state.arrays, arrays_of(4))
    assert reader.last_report.records == len(rest)
    # Without newer_than, the newest state again, from what the reader keeps.
    assert reader.follow("m").sequence == 4 and reader.last_report.records == 0


@pytest.mark.broker
def test_index_reads_on_from_its_last_read_and_finds_what_restore_finds(
        broker, store_of, monkeypatch):  # noqa: F811
    # A consumer group's member read the whole state topic at every partition assignment:
    # under churn on the embedded broker (which never compacts) that grew to 22-29 s.
    servers = broker.bootstrap_servers
    topic = unique("state-index")
    writer = store_of(topic, max_record_bytes=8192)
    writer.ensure_topic()
    for sequence in range(1, 4):
        for model in ((0, "a"), (1, "b")):
            writer.publish(model, arrays_of(sequence), {"s": sequence}, next_offset=sequence,
                           epoch=0, sequence=sequence)
    reader = store_of(topic)
    everything = len(raw_records(servers, topic))
    found = reader.index(lambda m: m[0] == 0)
    assert list(found) == [(0, "a")] and found[(0, "a")].metadata == {"s": 3}
    assert reader.last_report.records == everything
    assert_same_arrays(reader.fetch((0, "a")).arrays, arrays_of(3))
    # Nothing new: nothing read, the same answer (of any partition's models).
    assert reader.index(lambda m: m[0] == 1)[(1, "b")].sequence == 3
    assert reader.last_report.records == 0
    # A state whose chunks come in two reads is found at the second.
    real_send_all = writer._send_all
    held = []

    def first_chunk_only(records, partition, deadline, doing):
        records = list(records)
        held.append((records[1:], partition))
        return real_send_all(records[:1], partition, deadline, doing)

    monkeypatch.setattr(writer, "_send_all", first_chunk_only)
    writer.publish((1, "b"), arrays_of(4), {"s": 4}, next_offset=4, epoch=0, sequence=4)
    monkeypatch.undo()
    assert reader.index(lambda m: True)[(1, "b")].sequence == 3
    assert reader.last_report.records == 1 and reader.last_report.incomplete == 1
    rest, partition = held[0]
    real_send_all(rest, partition, time.monotonic() + TIMEOUT, "the rest")
    writer.delete((0, "a"))
    found = reader.index(lambda m: True)
    assert (1, "b") in found and found[(1, "b")].metadata == {"s": 4}
    assert (0, "a") not in found  # deleted
    assert_same_arrays(reader.fetch((1, "b")).arrays, arrays_of(4))
    assert {m: (s.sequence, s.metadata) for m, s in found.items()} == {
        m: (s.sequence, s.metadata) for m, s in store_of(topic).restore(decode=False).items()}
    # Past INDEX_KEEPS_BYTES of unfinished writes, the next call reads the whole topic.
    monkeypatch.setattr(reader, "INDEX_KEEPS_BYTES", -1)
    reader.index(lambda m: True)
    reader.index(lambda m: True)
    assert reader.last_report.records == len(raw_records(servers, topic))


@pytest.mark.broker
def test_a_publish_that_dies_half_way_leaves_the_previous_state(
    broker, store_of, monkeypatch, caplog  # noqa: F811
):
    servers = broker.bootstrap_servers
    topic = unique("state-crash")
    store = store_of(topic, max_record_bytes=8192)
    store.ensure_topic()
    for sequence in range(1, 6):
        store.publish("m", arrays_of(sequence), {"s": sequence}, next_offset=sequence,
                      epoch=0, sequence=sequence)
    store.publish("n", arrays_of(11), {"s": 1}, next_offset=1, epoch=0, sequence=1)
    real_send = store._send

    def crash_after(chunks: int) -> None:
        sent = 0

        def dying_send(key: bytes, value: bytes | None, partition: int) -> Any:
            nonlocal sent
            if sent == chunks:
                raise KeyboardInterrupt("the process dies here")
            sent += 1
            return real_send(key, value, partition)

        monkeypatch.setattr(store, "_send", dying_send)

    crash_after(3)
    with pytest.raises(KeyboardInterrupt):
        store.publish("m", arrays_of(6), {"s": 6}, next_offset=6, epoch=0, sequence=6)
    crash_after(2)
    with pytest.raises(KeyboardInterrupt):
        store.publish("n", arrays_of(12), {"s": 2}, next_offset=2, epoch=0, sequence=2)
    store._producer.flush(timeout=10)  # what the dead process had handed over reaches the broker
    headers = chunk_headers(servers, topic)
    sixth = [h for h in headers if h["model"] == "m" and h["sequence"] == 6]
    assert [h["chunk"] for h in sixth] == [0, 1, 2] and sixth[0]["chunks"] > 3
    second = [h for h in headers if h["model"] == "n" and h["sequence"] == 2]
    assert [h["chunk"] for h in second] == [0, 1] and second[0]["chunks"] > 2
    # Sequence 6 of m overwrote the first chunks of sequence 4 (same slot): chunks of two
    # writes. Sequence 2 of n went to an empty slot: chunks missing. Both are incomplete.
    caplog.set_level(logging.WARNING, logger="connectors.state_store")
    reader = store_of(topic)
    restored = reader.restore()
    state = restored["m"]
    assert (state.sequence, state.metadata, state.next_offset) == (5, {"s": 5}, 5)
    assert_same_arrays(state.arrays, arrays_of(5))
    assert restored["n"].sequence == 1
    assert_same_arrays(restored["n"].arrays, arrays_of(11))
    assert reader.last_report.incomplete == 2 and reader.last_report.corrupt == 0
    assert "sequence 6: chunk 3" in caplog.text and "sequence 2: chunk 2" in caplog.text
    # A reader that polls (a predictor) says it at its own level: it warned at every publish
    # of a chunked state, whose chunks it read while they were being written.
    caplog.clear()
    reader.restore(log_level=logging.DEBUG)
    assert reader.last_report.incomplete == 2 and "chunk" not in caplog.text
    # the same after compaction: only the newest record of each key is left
    compacted = unique("state-crash-compacted")
    compacted_copy(servers, topic, compacted)
    assert len(raw_records(servers, compacted)) < len(raw_records(servers, topic))
    restored = store_of(compacted).restore()
    assert (restored["m"].sequence, restored["n"].sequence) == (5, 1)
    assert_same_arrays(restored["m"].arrays, arrays_of(5))


@pytest.mark.broker
def test_a_corrupt_chunk_is_skipped(broker, store_of):  # noqa: F811
    servers = broker.bootstrap_servers
    topic = unique("state-corrupt")
    store = store_of(topic, max_record_bytes=8192)
    store.ensure_topic()
    for sequence in (5, 6):
        store.publish("m", arrays_of(sequence), {"s": sequence}, next_offset=sequence,
                      epoch=0, sequence=sequence)
    # chunk 1 of sequence 6 again, with its header intact and one bit of its data flipped
    record = next(r for r in raw_records(servers, topic)
                  if r.key == chunk_key("m", 0, 6, 1))
    header, data = _decode_value(record.value)
    damaged = bytes([data[0] ^ 1]) + data[1:]
    assert hashlib.sha256(damaged).hexdigest() != header["sha256"]
    send_raw(servers, topic, [(record.key, _encode_value(header, damaged))],
             partition=record.partition)
    # Model "p": sequence 2 (one chunk) replaced by a payload that loads (a valid .npz of
    # other arrays) but is not the one its header's sha256 names: only the checksum tells.
    store.publish("p", {"w": np.ones(3)}, {"s": 1}, next_offset=1, epoch=0, sequence=1)
    store.publish("p", {"w": np.zeros(3)}, {"s": 2}, next_offset=2, epoch=0, sequence=2)
    record = next(r for r in raw_records(servers, topic) if r.key == chunk_key("p", 0, 2, 0))
    header, data = _decode_value(record.value)
    forged = _encode_payload({"w": np.full(3, 7.0)}, {"s": 2})
    assert len(forged) == len(data) and header["chunks"] == 1
    send_raw(servers, topic, [(record.key, _encode_value(header, forged))],
             partition=record.partition)
    # and a record this store never wrote (a stray producer): skipped, not fatal
    send_raw(servers, topic, [(b"not-ours", b"hello")])
    reader = store_of(topic)
    restored = reader.restore()
    state = restored["m"]
    assert (state.sequence, state.metadata) == (5, {"s": 5})
    assert_same_arrays(state.arrays, arrays_of(5))
    assert restored["p"].sequence == 1
    assert_same_arrays(restored["p"].arrays, {"w": np.ones(3)})
    assert reader.last_report.corrupt == 3 and reader.last_report.incomplete == 0


@pytest.mark.broker
def test_a_newer_formats_state_stops_the_restore_instead_of_an_older_one_standing_in(
        broker, store_of):  # noqa: F811
    # Skipped as corrupt, the newer stream-svm's state left the one before the upgrade (or
    # none: a new model) to be served and learned on, after an upgrade was rolled back.
    servers = broker.bootstrap_servers
    topic = unique("state-newer")
    store = store_of(topic)
    store.ensure_topic()
    for sequence in (1, 2):
        store.publish("m", arrays_of(sequence), {"s": sequence}, next_offset=sequence,
                      epoch=0, sequence=sequence)
    record = next(r for r in raw_records(servers, topic) if r.key == chunk_key("m", 0, 2, 0))
    magic, _, length = _PREFIX.unpack_from(record.value)
    newer = _PREFIX.pack(magic, FORMAT_VERSION + 1, length) + record.value[_PREFIX.size:]
    send_raw(servers, topic, [(record.key, newer)], partition=record.partition)
    with pytest.raises(StateFromNewerVersion,
                       match=rf"model m epoch 0\) has format version {FORMAT_VERSION + 1}, "
                             "written by a newer stream-svm"):
        store_of(topic).restore()


@pytest.mark.broker
def test_chunks_a_smaller_state_leaves_behind_in_its_slot_are_tombstoned(broker, store_of):  # noqa: F811
    # Without tombstones, a state of many chunks would leave its later chunks on the
    # compacted topic for good, under keys the next, smaller state of its slot never writes.
    servers = broker.bootstrap_servers
    topic = unique("state-leftovers")
    store = store_of(topic, max_record_bytes=8192)
    store.ensure_topic()
    store.publish("m", arrays_of(1), {"s": 1}, next_offset=1, epoch=0, sequence=1)
    chunks = chunk_headers(servers, topic)[0]["chunks"]
    assert chunks > 3
    store.publish("m", {"w": np.ones(3)}, {"s": 3}, next_offset=3, epoch=0, sequence=3)
    newest = {}
    for record in raw_records(servers, topic):
        newest[bytes(record.key)] = record.value
    assert newest[chunk_key("m", 0, 3, 0)] is not None
    assert all(newest[chunk_key("m", 0, 3, chunk)] is None for chunk in range(1, chunks))
    assert store_of(topic).restore()["m"].sequence == 3


@pytest.mark.broker
def test_a_claim_on_an_emptied_topic_starts_above_the_epochs_published_before(
        broker, store_of):  # noqa: F811
    # A state topic recreated empty must not start the epochs again at 0: predictors, which
    # take a state only from a newer epoch, would keep serving the old model.
    topic = unique("state-at-least")
    store = store_of(topic)
    store.ensure_topic()
    assert store.claim_epoch("m", at_least=7) == 7
    # A later ownership (it knew of epoch 7 when it was given the model) claims above it.
    assert store.claim_epoch("m", newest_known=7, at_least=2) == 8


@pytest.mark.broker
def test_a_zombie_cannot_replace_the_new_owners_state(broker, store_of):  # noqa: F811
    servers = broker.bootstrap_servers
    topic = unique("state-zombie")
    owner_a = store_of(topic, max_record_bytes=8192)
    owner_a.ensure_topic()
    assert owner_a.claim_epoch([3, None]) == 0
    for sequence in (1, 2, 3):
        owner_a.publish([3, None], arrays_of(sequence), {"owner": "A"}, next_offset=sequence,
                        epoch=0, sequence=sequence)
    # the partition moves to B, which restores A's state and takes the next epoch
    owner_b = store_of(topic, max_record_bytes=8192)
    assert owner_b.restore()[(3, None)].sequence == 3
    epoch = owner_b.claim_epoch([3, None])
    assert epoch == 1
    owner_b.publish([3, None], arrays_of(40), {"owner": "B"}, next_offset=40, epoch=1,
                    sequence=4)
    # B's first state tombstoned the epoch-0 keys (and A's claim) it had seen
    tombstoned = {r.key for r in raw_records(servers, topic) if r.value is None}
    assert {chunk_key([3, None], 0, s, 0) for s in (2, 3)} \
        | {claim_key([3, None], 0, f"{owner_a.owner_token}.1")} <= tombstoned
    # A wakes up, never having re-read the topic, and publishes with its old epoch
    owner_a.publish([3, None], arrays_of(99), {"owner": "A"}, next_offset=99, epoch=0,
                    sequence=99)
    state = store_of(topic).restore()[(3, None)]
    assert (state.epoch, state.sequence, state.metadata) == (1, 4, {"owner": "B"})
    assert_same_arrays(state.arrays, arrays_of(40))
    # a store that has seen epoch 1 refuses epoch 0, and produces nothing
    before = len(raw_records(servers, topic))
    owner_a.restore()
    with pytest.raises(StaleEpochError, match="epoch 1"):
        owner_a.publish([3, None], arrays_of(100), {}, next_offset=100, epoch=0, sequence=100)
    with pytest.raises(StaleEpochError):
        owner_b.publish([3, None], arrays_of(5), {}, next_offset=5, epoch=0, sequence=5)
    assert len(raw_records(servers, topic)) == before


@pytest.mark.broker
def test_claims_keep_an_epoch_taken_and_a_concurrent_claim_loses(broker, store_of):  # noqa: F811
    topic = unique("state-claims")
    first = store_of(topic)
    first.ensure_topic()
    first.publish("m", arrays_of(1), {}, next_offset=1, epoch=0, sequence=1)
    # B claims epoch 1 and dies before its first state: the epoch stays taken
    assert store_of(topic).claim_epoch("m") == 1
    reader = store_of(topic)
    assert reader.restore()["m"].epoch == 0  # a claim is not a state
    assert reader.next_epoch("m") == 2
    # two owners that read the same topic both think epoch 2 is next: the first claim wins
    c, d = store_of(topic), store_of(topic)
    c.restore()
    d.restore()
    assert c.claim_epoch("m") == 2
    with pytest.raises(StaleEpochError, match="another owner"):
        d.claim_epoch("m")
    assert store_of(topic).next_epoch("m") == 3
    assert store_of(topic).next_epoch("never-published") == 0


@pytest.mark.broker
def test_a_claim_past_an_epoch_taken_since_the_owner_was_given_the_model_is_refused(
        broker, store_of):  # noqa: F811
    topic = unique("state-claim-known")
    former = store_of(topic)
    former.ensure_topic()
    assert former.claim_epoch(("m", 1)) == 0  # it dies before its first state
    owner = store_of(topic)
    owner.restore()
    # Claims count, not only states: the model with a claim alone is at epoch 0.
    assert owner.epochs(lambda m: m[0] == "m") == {("m", 1): 0}
    assert owner.epochs(lambda m: m[0] == "other") == {}
    assert owner.claim_epoch(("m", 1), newest_known=0) == 1
    # A process given the model when it knew of epoch 0 only, which has since read the claim
    # of epoch 1 (reading on to a claim of another model in the same partition): refused,
    # and nothing is written.
    zombie = store_of(topic)
    zombie.restore()
    before = len(raw_records(broker.bootstrap_servers, topic))
    with pytest.raises(StaleEpochError, match="since this owner was given it"):
        zombie.claim_epoch(("m", 1), newest_known=0)
    assert len(raw_records(broker.bootstrap_servers, topic)) == before
    assert store_of(topic).next_epoch(("m", 1)) == 2


def _model_at_epoch_0(store_of, name: str, readers: int = 2) -> tuple[str, list[StateStore]]:
    """A new state topic holding epoch 0 of model "m", and stores that have read it."""
    topic = unique(name)
    first = store_of(topic)
    first.ensure_topic()
    first.publish("m", arrays_of(1), {}, next_offset=1, epoch=0, sequence=1)
    stores = [store_of(topic) for _ in range(readers)]
    for store in stores:
        store.restore()
    return topic, stores


def _lose_acknowledgements(store: StateStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """The store's next send writes its records, then fails as if the acknowledgement were lost
    (a broker slower than the store's timeout)."""
    send_all = store._send_all

    def written_then_timed_out(*args: Any, **kwargs: Any) -> list[Any]:
        send_all(*args, **kwargs)
        monkeypatch.setattr(store, "_send_all", send_all)  # once
        raise StateStoreError("claiming: not acknowledged within the timeout (simulated)")

    monkeypatch.setattr(store, "_send_all", written_then_timed_out)


@pytest.mark.broker
@pytest.mark.parametrize("read_since", [False, True])
def test_a_claim_whose_acknowledgement_was_lost_does_not_fence_its_own_owner(
        broker, store_of, monkeypatch, read_since):  # noqa: F811
    topic = unique("state-claim-lost-ack")
    first = store_of(topic)
    first.ensure_topic()
    first.publish(("m", 0), arrays_of(1), {}, next_offset=1, epoch=0, sequence=1)
    owner = store_of(topic)
    owner.restore()
    _lose_acknowledgements(owner, monkeypatch)
    with pytest.raises(StateStoreError, match="simulated"):
        owner.claim_epoch(("m", 0), newest_known=0)
    assert [claim_key(("m", 0), 1, f"{owner.owner_token}.1")] == [
        r.key for r in raw_records(broker.bootstrap_servers, topic) if b"claim" in r.key]
    if read_since:  # the owner has read its own claim of epoch 1 (restore, or another model)
        owner.restore()
        assert owner.next_epoch(("m", 0)) == 2
    # Retried with what the owner knew when it was given the model: its own claim won epoch 1,
    # which is its epoch. Before, this raised StaleEpochError and the owner gave up its
    # partition until the next rebalance.
    epoch = owner.claim_epoch(("m", 0), newest_known=0)
    assert epoch == 1
    owner.publish(("m", 0), arrays_of(2), {}, next_offset=2, epoch=epoch, sequence=1)
    assert store_of(topic).restore()[("m", 0)].epoch == epoch
    # Another process given the model when it knew of epoch 0 only is still refused.
    other = store_of(topic)
    other.restore()
    with pytest.raises(StaleEpochError, match="since this owner was given it"):
        other.claim_epoch(("m", 0), newest_known=0)


@pytest.mark.broker
def test_a_former_owner_whose_claim_lost_its_acknowledgement_stays_below_the_new_owner(
        broker, store_of, monkeypatch):  # noqa: F811
    topic, (former,) = _model_at_epoch_0(store_of, "state-claim-lost-ack-zombie", readers=1)
    _lose_acknowledgements(former, monkeypatch)  # paused during its claim, past its session
    with pytest.raises(StateStoreError, match="simulated"):
        former.claim_epoch("m", newest_known=0)
    new_owner = store_of(topic)
    new_owner.restore()  # given the model since: it knows of the claim of epoch 1
    assert new_owner.epochs(lambda m: True) == {"m": 1}
    former.restore()
    # The former owner gets the epoch its claim won, not one above the new owner's...
    assert former.claim_epoch("m", newest_known=0) == 1
    # ...whose claim then goes above it, and whose state wins.
    assert new_owner.claim_epoch("m", newest_known=1) == 2
    new_owner.publish("m", arrays_of(3), {}, next_offset=3, epoch=2, sequence=1)
    former.publish("m", arrays_of(2), {}, next_offset=2, epoch=1, sequence=1)
    assert store_of(topic).restore()["m"].epoch == 2


@pytest.mark.broker
def test_an_own_claim_of_an_earlier_ownership_is_claimed_above_when_given_the_model_again(
        broker, store_of, monkeypatch):  # noqa: F811
    topic, (owner,) = _model_at_epoch_0(store_of, "state-claim-earlier-ownership", readers=1)
    _lose_acknowledgements(owner, monkeypatch)
    with pytest.raises(StateStoreError, match="simulated"):
        owner.claim_epoch("m", newest_known=0)
    # The owner loses the model before any state of epoch 1; another process is given it
    # (knowing of epoch 1) and stalls past its session unpublished; the model comes back.
    zombie = store_of(topic)
    zombie.restore()
    owner.restore()
    # Given the model again, the owner knew of its own claim of epoch 1: it claims above it,
    # not back into it...
    assert owner.claim_epoch("m", newest_known=1) == 2
    # ...so the process that stalled cannot claim past it.
    with pytest.raises(StaleEpochError, match="another owner took epoch 2"):
        zombie.claim_epoch("m", newest_known=1)


@pytest.mark.broker
def test_an_owner_whose_claim_came_first_keeps_its_epoch_over_a_later_claim_of_it(
        broker, store_of, monkeypatch):  # noqa: F811
    _, (owner, other) = _model_at_epoch_0(store_of, "state-claim-first-wins")
    _lose_acknowledgements(owner, monkeypatch)
    with pytest.raises(StateStoreError, match="simulated"):
        owner.claim_epoch("m", newest_known=0)
    # Another store's claim of epoch 1 after the owner's loses...
    with pytest.raises(StaleEpochError, match="before this claim of epoch 1"):
        other.claim_epoch("m", newest_known=0)
    # ...and does not fence the owner, which claims again without having read either.
    assert owner.claim_epoch("m", newest_known=0) == 1


@pytest.mark.broker
def test_a_claim_that_lost_the_race_for_an_epoch_is_not_taken_for_the_owners_own(
        broker, store_of, monkeypatch):  # noqa: F811
    _, (winner, loser) = _model_at_epoch_0(store_of, "state-claim-lost-race")
    assert winner.claim_epoch("m", newest_known=0) == 1
    # The loser's claim of epoch 1 comes second; its acknowledgement is lost, so it never
    # read that it lost. Claiming again it must see that epoch 1 is the winner's.
    _lose_acknowledgements(loser, monkeypatch)
    with pytest.raises(StateStoreError, match="simulated"):
        loser.claim_epoch("m", newest_known=0)
    loser.restore()
    with pytest.raises(StaleEpochError, match="another owner took epoch 1"):
        loser.claim_epoch("m", newest_known=0)


def _assert_the_loser_is_refused_after_compaction(servers: str, store_of: Any, topic: str,
                                                  loser: StateStore) -> None:
    """The loser's process, reading what compaction leaves of the topic, does not take the
    epoch it lost (epoch 1 of model "m") for its own."""
    copy = unique(f"{topic}-compacted")
    compacted_copy(servers, topic, copy)
    after = store_of(copy)
    after._owner_token = loser.owner_token
    after.restore()
    with pytest.raises(StaleEpochError, match="another owner took epoch 1"):
        after.claim_epoch("m", newest_known=0)


@pytest.mark.broker
def test_an_own_claim_that_compaction_kept_over_the_winners_does_not_count_as_won(
        broker, store_of, monkeypatch):  # noqa: F811
    topic, (winner, loser) = _model_at_epoch_0(store_of, "state-claim-compacted")
    assert winner.claim_epoch("m", newest_known=0) == 1
    _lose_acknowledgements(loser, monkeypatch)  # its claim of epoch 1 comes second
    with pytest.raises(StateStoreError, match="simulated"):
        loser.claim_epoch("m", newest_known=0)
    winner.publish("m", arrays_of(2), {}, next_offset=2, epoch=1, sequence=1)
    # Compaction keeps both claims of epoch 1 (each has a key of its own), the winner's first;
    # (had it kept the loser's alone, as with claims that share a key, the winner's state of
    # epoch 1 would still show that the epoch is not the loser's).
    _assert_the_loser_is_refused_after_compaction(broker.bootstrap_servers, store_of, topic,
                                                  loser)


@pytest.mark.broker
def test_an_epoch_whose_winner_claimed_it_twice_stays_the_winners_after_compaction(
        broker, store_of, monkeypatch):  # noqa: F811
    topic, (winner, loser) = _model_at_epoch_0(store_of, "state-claim-retried")
    _lose_acknowledgements(winner, monkeypatch)  # its claim of epoch 1 is written first
    with pytest.raises(StateStoreError, match="simulated"):
        winner.claim_epoch("m", newest_known=0)
    _lose_acknowledgements(loser, monkeypatch)  # the loser's second
    with pytest.raises(StateStoreError, match="simulated"):
        loser.claim_epoch("m", newest_known=0)
    # The winner claims again without having read either claim: it writes a second claim,
    # reads on to it and finds its first one first. Epoch 1 is its own.
    assert winner.claim_epoch("m", newest_known=0) == 1
    claims = [r.key for r in raw_records(broker.bootstrap_servers, topic) if b"claim" in r.key]
    assert len(claims) == len(set(claims)) == 3  # a key per claim record: compaction drops none
    # Before the winner's first state, compaction runs. Had the winner's two claims shared a
    # key, only its second would be left, after the loser's: the loser, reading the compacted
    # topic, would find its own claim first and take epoch 1 too.
    _assert_the_loser_is_refused_after_compaction(broker.bootstrap_servers, store_of, topic,
                                                  loser)


@pytest.mark.broker
def test_a_state_compacted_away_since_it_was_indexed_is_found_again_not_retried_forever(
        broker, store_of, monkeypatch):  # noqa: F811
    topic = unique("state-compacted")
    owner = store_of(topic)
    owner.ensure_topic()
    owner.publish("m", arrays_of(1), {"n": 1}, next_offset=1, epoch=0, sequence=1)
    reader = store_of(topic)
    reader.restore()
    indexed = reader.newest("m").location
    owner.publish("m", arrays_of(2), {"n": 2}, next_offset=2, epoch=0, sequence=2)
    owner.publish("m", arrays_of(3), {"n": 3}, next_offset=3, epoch=0, sequence=3)
    # Sequence 3 overwrote the keys of sequence 1 (the same slot); compaction on a real Kafka
    # then removes sequence 1's records, which the embedded broker keeps: drop them here.
    read = reader._read

    def compacted(*args: Any, **kwargs: Any) -> list[Any]:
        return [r for r in read(*args, **kwargs)
                if not indexed[1] <= r.offset <= indexed[2]]

    monkeypatch.setattr(reader, "_read", compacted)
    state = reader.fetch("m")
    assert (state.epoch, state.sequence, state.next_offset) == (0, 3, 3)
    assert state.metadata == {"n": 3}
    assert_same_arrays(state.arrays, arrays_of(3))
    # Never an older state than the one indexed: with sequences 2 and 3 gone and only
    # sequence 1 left, the store refuses (its caller reads the messages again later) rather
    # than give a state that lacks what sequence 3 learned.
    stale = store_of(topic)
    stale.restore()
    assert stale.newest("m").sequence == 3
    read_stale = stale._read

    def only_the_first(*args: Any, **kwargs: Any) -> list[Any]:
        return [r for r in read_stale(*args, **kwargs) if r.offset <= indexed[2]]

    monkeypatch.setattr(stale, "_read", only_the_first)
    with pytest.raises(StateStoreError, match="no newer whole state"):
        stale.fetch("m")
    assert stale.newest("m").sequence == 3
    # Each look reads the whole topic: the next one waits for REINDEX_INTERVAL.
    looks = []
    restore = stale.restore
    monkeypatch.setattr(stale, "restore", lambda *a, **k: looks.append(1) or restore(*a, **k))
    with pytest.raises(StateStoreError, match="read again for it later"):
        stale.fetch("m")
    assert looks == []
    monkeypatch.setattr(stale, "REINDEX_INTERVAL", 0.0)
    stale._reindex_after.clear()
    with pytest.raises(StateStoreError, match="no newer whole state"):
        stale.fetch("m")
    assert looks == [1]


@pytest.mark.broker
def test_an_owner_sees_a_newer_claim_by_reading_on_to_its_own_publish(
        broker, store_of):  # noqa: F811
    topic = unique("state-newest-epoch")
    owner = store_of(topic, max_record_bytes=8192)
    owner.ensure_topic()
    assert owner.claim_epoch("m") == 0
    # Chunked: the offset returned is that of the last chunk.
    last = owner.publish("m", arrays_of(60), {}, next_offset=1, epoch=0, sequence=1)
    assert last >= 2
    assert owner.newest_epoch("m", last) == 0
    assert store_of(topic).claim_epoch("m") == 1  # another owner takes the model over
    last = owner.publish("m", arrays_of(2), {}, next_offset=2, epoch=0, sequence=2)
    assert owner.newest_epoch("m", last) == 1
    with pytest.raises(StaleEpochError):
        owner.publish("m", arrays_of(3), {}, next_offset=3, epoch=0, sequence=3)


@pytest.mark.broker
def test_delete_tombstones_every_key_of_the_model(broker, store_of):  # noqa: F811
    servers = broker.bootstrap_servers
    topic = unique("state-delete")
    store = store_of(topic, max_record_bytes=8192)
    store.ensure_topic()
    store.claim_epoch("gone")
    for sequence in (1, 2, 3):
        store.publish("gone", arrays_of(sequence), {}, next_offset=sequence, epoch=0,
                      sequence=sequence)
        store.publish("kept", arrays_of(10 + sequence), {}, next_offset=sequence, epoch=0,
                      sequence=sequence)
    live_keys = {r.key for r in raw_records(servers, topic) if b'"gone"' in r.key}
    assert store_of(topic).delete("gone") == len(live_keys)
    tombstoned = {r.key for r in raw_records(servers, topic) if r.value is None}
    assert live_keys <= tombstoned
    restored = store_of(topic).restore()
    assert list(restored) == ["kept"]
    assert_same_arrays(restored["kept"].arrays, arrays_of(13))
    compacted = unique("state-delete-compacted")
    compacted_copy(servers, topic, compacted)
    assert list(store_of(compacted).restore()) == ["kept"]


@pytest.mark.broker
def test_ensure_topic_creates_a_compacted_topic_and_leaves_an_existing_one(
    broker, store_of, caplog  # noqa: F811
):
    from kafka import KafkaAdminClient
    from kafka.admin import ConfigResource, ConfigResourceType

    servers = broker.bootstrap_servers
    compacted, plain = unique("state-ensure"), unique("state-plain")
    store_of(compacted).ensure_topic(partitions=2)
    store_of(compacted).ensure_topic(partitions=5)  # exists: left as it is
    admin = KafkaAdminClient(bootstrap_servers=servers, request_timeout_ms=5000)
    try:
        admin.create_topics({plain: {"num_partitions": 1, "replication_factor": 1}})
        configs = admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, compacted)], config_filter="all"
        )
        assert configs["topic"][compacted]["cleanup.policy"]["value"] == "compact"
        assert configs["topic"][compacted]["segment.ms"]["value"] == "3600000"
        [described] = admin.describe_topics([compacted])
        assert len(described["partitions"]) == 2
    finally:
        admin.close()
    caplog.set_level(logging.WARNING, logger="connectors.state_store")
    store_of(plain).ensure_topic()
    assert f"state topic {plain} exists with cleanup.policy=" in caplog.text


@pytest.mark.broker
def test_a_missing_topic_is_a_clear_error_and_is_not_created(broker, store_of):  # noqa: F811
    topic = unique("state-missing")
    store = store_of(topic, timeout=5)
    started = time.monotonic()
    with pytest.raises(StateStoreError, match=f"state topic {topic} does not exist"):
        store.restore()
    with pytest.raises(StateStoreError, match=f"state topic {topic} does not exist"):
        store.publish("m", arrays_of(1), {}, next_offset=0, epoch=0, sequence=0)
    assert time.monotonic() - started < 5
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap_servers)
    try:
        assert topic not in admin.list_topics()
    finally:
        admin.close()


@pytest.mark.broker
def test_a_restore_that_cannot_reach_the_end_times_out_clearly(
    broker, store_of, monkeypatch  # noqa: F811
):
    from kafka import KafkaConsumer

    topic = unique("state-stuck")
    store = store_of(topic, timeout=2)
    store.ensure_topic()
    store.publish("m", arrays_of(1), {}, next_offset=0, epoch=0, sequence=1)
    monkeypatch.setattr(KafkaConsumer, "poll", lambda self, *args, **kwargs: {})
    started = time.monotonic()
    with pytest.raises(StateStoreError, match=rf"state topic {topic} .*within 2 s"):
        store.restore()
    assert time.monotonic() - started < 6


def _slow_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    """A slow broker: three records a poll, 0.1 s each."""
    from kafka import KafkaConsumer

    real_poll = KafkaConsumer.poll

    def slow_poll(self, *args, **kwargs):
        time.sleep(0.1)
        kwargs["max_records"] = 3
        return real_poll(self, *args, **kwargs)

    monkeypatch.setattr(KafkaConsumer, "poll", slow_poll)


@pytest.mark.broker
def test_a_topic_too_long_to_read_in_one_timeout_is_read_over_several_attempts(
    broker, store_of, monkeypatch  # noqa: F811
):
    # Each attempt read from offset 0 again: once the whole topic took longer than the
    # timeout, no attempt ever finished, and a daemon could never take its partitions.
    topic = unique("state-long")
    writer = store_of(topic, max_record_bytes=4096)
    writer.ensure_topic(partitions=2)
    published = {}
    for number in range(12):
        published[f"m{number}"] = arrays_of(number, size=600)  # a few records each
        writer.publish(f"m{number}", published[f"m{number}"], {}, next_offset=number, epoch=0,
                       sequence=1)
    _slow_polls(monkeypatch)
    reader = store_of(topic, timeout=1.0)
    failures = 0
    while True:
        try:
            restored = reader.restore()
            break
        except StateStoreError as exc:
            assert "the next read goes on from there" in str(exc)
            failures += 1
            assert failures < 12, "the reads make no progress"
            # A read of a range in between (a publish's read-back, a fetch) leaves the progress
            # of the full read to the next one (it had dropped it: each attempt began at 0).
            reader._read(reader._deadline(), {0: (0, 1)}, track=False)
    assert failures >= 1  # the topic does not fit in one attempt
    assert set(restored) == set(published)
    for model, arrays in published.items():
        assert_same_arrays(restored[model].arrays, arrays)


@pytest.mark.broker
def test_a_state_too_long_to_follow_in_one_timeout_is_read_over_several_calls(
    broker, store_of, monkeypatch  # noqa: F811
):
    # Each call of follow() read from where the last one that succeeded ended: a state that
    # took longer than the timeout to read was never read, and a predictor served its old
    # model for good.
    topic = unique("state-follow-long")
    writer = store_of(topic, max_record_bytes=4096)
    writer.ensure_topic()
    writer.publish("m", arrays_of(1, size=100), {}, next_offset=1, epoch=0, sequence=1)
    reader = store_of(topic, timeout=1.0)
    assert reader.follow("m").sequence == 1
    writer.publish("m", arrays_of(2, size=12000), {}, next_offset=2, epoch=0, sequence=2)
    # (Another model's state last: Tansu's end offset is its last record batch's first offset
    # + 1, and three records a poll would leave the rest of m's last batch unread.)
    writer.publish("n", arrays_of(3, size=10), {}, next_offset=0, epoch=0, sequence=1)
    _slow_polls(monkeypatch)
    failures = 0
    while True:
        try:
            state = reader.follow("m", newer_than=(0, 1))
            break
        except StateStoreError:
            failures += 1
            assert failures < 12, "the reads make no progress"
    assert failures >= 1  # the state does not fit in one attempt
    assert state.sequence == 2
    assert_same_arrays(state.arrays, arrays_of(2, size=12000))


def test_an_unreachable_broker_is_a_clear_error_within_the_timeout():
    port = free_loopback_port()  # nothing listens there
    topic = unique("state-unreachable")
    for call in ("ensure_topic", "restore", "publish"):
        store = StateStore(f"127.0.0.1:{port}", topic, timeout=1.5)
        started = time.monotonic()
        with pytest.raises(StateStoreError) as raised:
            if call == "publish":
                store.publish("m", {"x": np.zeros(2)}, {}, next_offset=0, epoch=0, sequence=0)
            else:
                getattr(store, call)()
        elapsed = time.monotonic() - started
        store.close()
        assert f"state topic {topic} at 127.0.0.1:{port}" in str(raised.value)
        assert "connecting within 1.5 s failed" in str(raised.value)
        assert elapsed < 5, (call, elapsed)


# -- the index, and what a publish after it knows ------------------------------------------------


@pytest.mark.broker
def test_index_tells_the_sequences_it_found_to_publish(broker, store_of):  # noqa: F811
    topic = unique("state-index-seq")
    writer = store_of(topic, max_record_bytes=8192)
    writer.ensure_topic()
    for sequence in (1, 2, 3):
        writer.publish("m", arrays_of(sequence), {"s": sequence}, next_offset=sequence,
                       epoch=0, sequence=sequence)
    reader = store_of(topic)
    assert reader.index(lambda m: True)["m"].sequence == 3
    assert reader.last_sequence("m", 0) == 3
    with pytest.raises(ValueError, match="sequences must grow"):
        reader.publish("m", arrays_of(9), {}, next_offset=9, epoch=0, sequence=3)


@pytest.mark.broker
def test_index_of_a_recreated_topic_forgets_the_states_of_the_old_one(
        broker, store_of):  # noqa: F811
    from kafka.admin import KafkaAdminClient, NewTopic

    from tests.connectors_helpers import wait_for

    servers = broker.bootstrap_servers
    topic = unique("state-index-recreated")
    writer = store_of(topic)
    writer.ensure_topic()
    writer.publish("old", arrays_of(1), {}, next_offset=1, epoch=0, sequence=1)
    reader = store_of(topic)
    assert list(reader.index(lambda m: True)) == ["old"]
    admin = KafkaAdminClient(bootstrap_servers=servers, request_timeout_ms=10000)
    try:
        admin.delete_topics([topic])
        assert wait_for(lambda: topic not in admin.list_topics(), 20)
        admin.create_topics([NewTopic(topic, 1, 1)])
    finally:
        admin.close()
    store_of(topic).publish("new", arrays_of(2), {}, next_offset=2, epoch=0, sequence=1)
    assert list(reader.index(lambda m: True)) == ["new"]
