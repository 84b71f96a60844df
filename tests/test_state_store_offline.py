"""The state store's reading rules without a broker: records built as the store writes them
are handed to what its read of the topic runs (connectors.state_store)."""

from __future__ import annotations

import hashlib
import io
import logging
import time
from typing import Any

import numpy as np
import pytest

from connectors.state_store import (
    StaleEpochError,
    StateStore,
    StateStoreError,
    _decode_value,
    _encode_payload,
    _encode_value,
    _parse_key,
    _Record,
    chunk_key,
    claim_key,
    decode_state,
)


def offline_store() -> StateStore:
    return StateStore("127.0.0.1:9", "state", timeout=1.0)  # never connects


def state_records(store: StateStore, model: Any, epoch: int, sequence: int, first_offset: int,
                  arrays: dict[str, np.ndarray], metadata: dict[str, Any]) -> list[_Record]:
    payload = _encode_payload(arrays, metadata)
    chunks = store._chunks(model, payload, epoch=epoch, sequence=sequence,
                           next_offset=sequence)
    return [_Record(0, first_offset + i, key, value) for i, (key, value) in enumerate(chunks)]


def restored(store: StateStore, records: list[_Record]) -> dict[Any, Any]:
    return store._newest_states(records, {}, None, None, True, logging.DEBUG, time.monotonic())


def test_a_state_record_is_never_unpickled():
    # A record of the state topic is data anyone who can write the topic controls: an object
    # array in it (np.save pickles those) must be refused, never unpickled (which runs code).
    buffer = io.BytesIO()
    np.savez(buffer, x=np.array([{"a": 1}], dtype=object),
             __meta__=np.frombuffer(b"{}", dtype=np.uint8))
    with pytest.raises(ValueError, match="pickle"):
        decode_state(buffer.getvalue())
    store = offline_store()
    payload = buffer.getvalue()
    header = {"kind": "chunk", "model": "m", "epoch": 0, "sequence": 1, "slot": 1, "chunk": 0,
              "chunks": 1, "size": len(payload), "sha256": hashlib.sha256(payload).hexdigest(),
              "next_offset": 0}
    record = _Record(0, 0, chunk_key("m", 0, 1, 0), _encode_value(header, payload))
    assert restored(store, [record]) == {}
    assert store.last_report.corrupt == 1


def test_a_key_not_written_canonically_is_not_taken_for_one_of_ours():
    # Compaction keeps one record per key *bytes*: a key with the same fields spelled
    # otherwise is another key to the broker, and read as the same one it could stand in for
    # (or hide) the record compaction keeps.
    canonical = chunk_key("m", 1, 1, 0)
    assert _parse_key(canonical) is not None
    for spelled_otherwise in (b'{"chunk": 0, "epoch": 1, "model": "m", "slot": 1}',
                              b'{"slot":1,"model":"m","epoch":1,"chunk":0}'):
        assert _parse_key(spelled_otherwise) is None
    store = offline_store()
    records = state_records(store, "m", 1, 1, 0, {"w": np.ones(2)}, {"s": 1})
    [value] = [r.value for r in records]
    other = _Record(0, 5, b'{"chunk": 0, "epoch": 1, "model": "m", "slot": 1}', value)
    assert restored(store, [other]) == {}


def _rekeyed(record: _Record, key: bytes, **header_changes: Any) -> _Record:
    header, data = _decode_value(record.value)
    header.update(header_changes)
    return _Record(record.partition, record.offset, key, _encode_value(header, data))


@pytest.mark.parametrize("forgery", ["epoch", "sequence"])
def test_a_chunk_whose_header_contradicts_its_key_is_skipped(forgery):
    # The key decides which epoch and slot a chunk counts for (the newest epoch wins, the
    # slots alternate with the sequence): a header that says otherwise is a damaged or
    # foreign record, never a state of the key's epoch or slot.
    store = offline_store()
    good = state_records(store, "m", 1, 1, 0, {"w": np.zeros(2)}, {"s": "good"})
    [forged] = state_records(store, "m", 1, 2, 10, {"w": np.ones(2)}, {"s": "forged"})
    if forgery == "epoch":  # key of epoch 7, header of epoch 1
        forged = _rekeyed(forged, chunk_key("m", 7, 2, 0))
    else:  # key and header of slot 0, header of the odd sequence 3 (whose slot is 1)
        forged = _rekeyed(forged, chunk_key("m", 1, 2, 0), sequence=3)
    states = restored(store, [*good, forged])
    assert (states["m"].epoch, states["m"].metadata) == (1, {"s": "good"})
    assert store.last_report.corrupt == 1


def test_an_own_claim_is_not_taken_for_won_when_another_owner_has_states_in_its_epoch():
    # Claim keys of earlier versions named no owner: compaction can keep this store's later,
    # losing claim of epoch 1 in place of the winner's. The winner's states of epoch 1 show
    # that the epoch is not this store's: claiming it again would put two owners in one
    # epoch, writing over each other's slots.
    store = offline_store()
    header = {"kind": "claim", "model": "m", "epoch": 1, "owner": store.owner_token}
    claim = _Record(0, 3, claim_key("m", 1), _encode_value(header))
    winner = offline_store()
    states = state_records(winner, "m", 1, 1, 4, {"w": np.ones(2)}, {})
    store._apply([claim, *states], rebuild=True)
    store._read_until = {0: 10}
    assert not store._claimed_here("m", 1)
    assert store.next_epoch("m") == 2


def test_a_publish_with_an_epoch_below_one_this_store_published_is_refused(monkeypatch):
    # A store that published epoch 5 of a model has seen epoch 5: a later publish with epoch
    # 3 comes from an owner that lost the model, and would be read as older than nothing.
    store = offline_store()

    class Written:
        def __init__(self, offset: int) -> None:
            self.offset = offset

    sent: list[bytes] = []

    def send_all(records, partition, deadline, doing):
        records = list(records)
        sent.extend(key for key, _ in records)
        return [Written(len(sent) + i) for i in range(len(records))]

    monkeypatch.setattr(store, "_send_all", send_all)
    monkeypatch.setattr(store, "_partitions", lambda deadline: 1)
    store.publish("m", {"w": np.zeros(2)}, {}, next_offset=1, epoch=5, sequence=1)
    before = len(sent)
    with pytest.raises(StaleEpochError):
        store.publish("m", {"w": np.ones(2)}, {}, next_offset=2, epoch=3, sequence=1)
    assert len(sent) == before  # nothing produced
    assert store.epochs(lambda model: True) == {"m": 5}


@pytest.mark.parametrize("outcome", ["not acknowledged", "failed"])
def test_a_publish_the_broker_did_not_acknowledge_is_an_error_and_not_counted_written(
        monkeypatch, outcome):
    # acks=all is the store's promise: a send still pending after the flush (the broker did
    # not answer in time) or one the broker refused must raise StateStoreError (the daemon
    # then holds its partition's commits back), and the state must not count as written.
    from kafka.errors import KafkaError

    store = offline_store()

    class Future:
        is_done = outcome == "failed"
        value = None
        exception = KafkaError("NotLeaderForPartitionError")

        def failed(self) -> bool:
            return outcome == "failed"

    class Producer:
        def flush(self, timeout: float | None = None) -> None:
            pass

    monkeypatch.setattr(store, "_producer_for", lambda deadline: Producer())
    monkeypatch.setattr(store, "_partitions", lambda deadline: 1)
    monkeypatch.setattr(store, "_send", lambda key, value, partition: Future())
    with pytest.raises(StateStoreError, match=r"not acknowledged|NotLeader"):
        store.publish("m", {"w": np.zeros(2)}, {}, next_offset=1, epoch=0, sequence=1)
    assert store.last_sequence("m", 0) == -1
    assert store.newest("m") is None


def test_a_slot_whose_chunk_0_is_gone_is_skipped_and_the_other_slot_restored():
    # Chunks 1.. of a write whose chunk 0 is not there (tombstoned, or compacted away under a
    # newer write that died after it) are left-overs: the model's other slot is its newest
    # whole state, and the read goes on (it must not fail on the slot that is not whole).
    store = StateStore("127.0.0.1:9", "state", timeout=1.0, max_record_bytes=4096)
    whole = state_records(store, "m", 0, 1, 0, {"w": np.arange(3000.0)}, {"s": 1})
    newer = state_records(store, "m", 0, 2, 100, {"w": np.arange(3000.0) + 1}, {"s": 2})
    assert len(newer) > 2
    states = restored(store, whole + newer[1:])
    assert (states["m"].sequence, states["m"].metadata) == (1, {"s": 1})
    assert states["m"].arrays["w"].tobytes() == np.arange(3000.0).tobytes()
    assert store.last_report.incomplete == 1


def test_sequences_read_whole_from_the_topic_count_as_taken():
    # last_sequence is "published whole or read whole": a learner that publishes into an
    # epoch the topic already holds must not reuse a sequence there (its state would land
    # in the slot of the newest whole state, and a publish dying half-way would leave none).
    store = offline_store()
    records = (state_records(store, "m", 1, 1, 0, {"w": np.zeros(2)}, {})
               + state_records(store, "m", 1, 2, 1, {"w": np.ones(2)}, {}))
    assert restored(store, records)["m"].sequence == 2
    assert store.last_sequence("m", 1) == 2
    with pytest.raises(ValueError, match="sequences must grow"):
        store.publish("m", {"w": np.ones(2)}, {}, next_offset=3, epoch=1, sequence=2)


# -- the index a consumer group's member reads on from ------------------------------------------


def _comparable(states: dict[Any, Any]) -> dict[Any, Any]:
    return {model: (s.epoch, s.sequence, s.next_offset, s.metadata, s.location)
            for model, s in states.items()}


@pytest.mark.parametrize("seed", range(12))
def test_the_index_read_on_batch_by_batch_finds_what_a_whole_read_finds(seed):
    # ScopedModels.settle read the whole state topic at every partition assignment: under
    # churn, 22-29 s on a topic that compaction had not reached. StateStore.index reads on
    # from its last read; what it makes of the records must be what a whole read makes.
    from connectors.state_store import RestoreReport, _Index

    rng = np.random.default_rng(seed)
    store = StateStore("127.0.0.1:9", "state", timeout=1.0, max_record_bytes=4096)
    records: list[_Record] = []
    written: list[_Record] = []  # every state record written, for duplicates
    sequences: dict[tuple[Any, int], int] = {}
    models = ["a", "b", (3, "k"), None]

    def append(key: bytes | None, value: bytes | None) -> None:
        records.append(_Record(0, len(records), key, value))

    index = _Index(None)
    read_up_to = 0
    for _ in range(60):
        kind = rng.choice(["publish", "publish", "publish", "partial", "tombstone",
                           "duplicate", "corrupt", "claim", "foreign"])
        model = models[rng.integers(len(models))]
        epoch = int(rng.integers(0, 3))
        if kind in ("publish", "partial"):
            sequence = sequences.get((model, epoch), 0) + 1
            sequences[(model, epoch)] = sequence
            size = int(rng.choice([10, 600, 1800]))  # 1 to 4 chunks of about 4 KB
            chunks = store._chunks(model, _encode_payload(
                {"w": rng.standard_normal(size)}, {"s": sequence, "seed": seed}),
                epoch=epoch, sequence=sequence, next_offset=sequence)
            if kind == "partial":  # a writer that died half-way (or is still writing)
                chunks = chunks[:int(rng.integers(0, len(chunks)))] if len(chunks) > 1 else []
            for key, value in chunks:
                append(key, value)
                written.append(records[-1])
        elif kind == "tombstone" and written:
            append(written[int(rng.integers(len(written)))].key, None)
        elif kind == "duplicate" and written:
            again = written[int(rng.integers(len(written)))]
            append(again.key, again.value)
        elif kind == "corrupt" and written:
            append(written[int(rng.integers(len(written)))].key, b"not a chunk")
        elif kind == "claim":
            append(claim_key(model, epoch, "owner"), b"{}")
        elif kind == "foreign":
            append(b"written by someone else", b"x")
        if rng.uniform() < 0.3 or len(records) - read_up_to > 12:
            index.apply(records[read_up_to:], store, RestoreReport())
            read_up_to = len(records)
            whole = StateStore("127.0.0.1:9", "state", timeout=1.0)
            want = whole._newest_states(records, {}, None, None, False, logging.DEBUG,
                                        time.monotonic())
            assert _comparable(index.newest(lambda m: True)) == _comparable(want)
            assert _comparable(index.newest(lambda m: m == "a")) == _comparable(
                {m: s for m, s in want.items() if m == "a"})
            # Only chunks of writes not whole yet keep their data.
            assert index.kept_bytes() <= sum(
                len(r.value) for r in records[-40:] if r.value is not None)


def test_the_index_hands_out_copies_of_the_metadata():
    from connectors.state_store import RestoreReport, _Index

    store = offline_store()
    index = _Index(None)
    index.apply(state_records(store, "m", 0, 1, 0, {"w": np.ones(2)}, {"s": {"n": 1}}),
                store, RestoreReport())
    index.newest(lambda m: True)["m"].metadata["s"]["n"] = 99
    assert index.newest(lambda m: True)["m"].metadata == {"s": {"n": 1}}


# -- the index where chunks are written again -------------------------------------------------


def _index_and_whole(store: StateStore, records: list[_Record], batches: list[int]):
    from connectors.state_store import RestoreReport, _Index

    index, start = _Index(None), 0
    for end in [*batches, len(records)]:
        index.apply(records[start:end], store, RestoreReport())
        start = end
    whole = StateStore("127.0.0.1:9", "state", timeout=1.0)
    want = whole._newest_states(records, {}, None, None, False, logging.DEBUG, time.monotonic())
    return _comparable(index.newest(lambda m: True)), _comparable(want)


def test_the_index_finds_a_chunk_of_an_indexed_state_replaced_by_other_data():
    store = StateStore("127.0.0.1:9", "state", timeout=1.0, max_record_bytes=4096)
    rng = np.random.default_rng(0)
    records = state_records(store, "m", 0, 2, 0, {"w": rng.standard_normal(10)}, {"s": 2})
    records += state_records(store, "m", 0, 3, len(records),
                             {"w": rng.standard_normal(1800)}, {"s": 3})
    indexed = len(records)
    # Chunk 1 of sequence 3 written again with its header but other data (a bit flipped).
    key = chunk_key("m", 0, 3, 1)
    header, data = _decode_value(next(r.value for r in records if r.key == key))
    records.append(_Record(0, len(records), key,
                           _encode_value(header, bytes([data[0] ^ 1]) + data[1:])))
    got, want = _index_and_whole(store, records, [indexed])
    assert want["m"][1] == 2  # the checksum of sequence 3 fails: sequence 2
    assert got == want


def test_the_index_does_not_take_a_slots_chunks_of_two_writes_of_the_same_bytes():
    store = StateStore("127.0.0.1:9", "state", timeout=1.0, max_record_bytes=4096)
    payload = _encode_payload({"w": np.arange(1800.0)}, {"same": True})
    records: list[_Record] = []
    for sequence in (1, 3):  # the same bytes published again two sequences later
        chunks = store._chunks("m", payload, epoch=0, sequence=sequence, next_offset=sequence)
        if sequence == 3:
            chunks = chunks[:1]  # only chunk 0 arrived yet
        records += [_Record(0, len(records) + i, k, v) for i, (k, v) in enumerate(chunks)]
    first_write = len(store._chunks("m", payload, epoch=0, sequence=1, next_offset=1))
    got, want = _index_and_whole(store, records, [first_write])
    assert want == {}  # chunk 0 of sequence 3, chunk 1 of sequence 1: nothing whole
    assert got == want


def test_the_index_counts_a_key_it_did_not_write_as_corrupt():
    from connectors.state_store import RestoreReport, _Index

    report = RestoreReport()
    _Index(None).apply([_Record(0, 0, b"written by someone else", b"x")], offline_store(),
                       report)
    assert report.corrupt == 1


# -- the index against a topic in memory (a stand-in consumer, end offsets as Tansu's) ---------


class _Topic:
    """Partitions of record batches; end offsets as the embedded broker gives them (the last
    batch's base offset + 1); ``poll_seconds`` slows every poll down."""

    def __init__(self, topic_id: str | None = "id-1") -> None:
        self.batches: list[list[tuple[int, bytes, bytes | None]]] = []
        self.topic_id = topic_id
        self.poll_seconds = 0.0

    def write(self, records: list[tuple[bytes, bytes | None]]) -> None:
        base = sum(len(batch) for batch in self.batches)
        self.batches.append([(base + i, k, v) for i, (k, v) in enumerate(records)])

    def consumer(self) -> Any:
        topic = self

        class Cluster:
            def topic_id(self, _name: str) -> str | None:
                return topic.topic_id

        class Consumer:
            _client = type("Client", (), {"cluster": Cluster()})()

            def __init__(self) -> None:
                self.at: dict[Any, int] = {}

            def partitions_for_topic(self, _name: str) -> set[int]:
                return {0}

            def end_offsets(self, tps: list[Any], timeout_ms: int | None = None) -> dict:
                return {tp: topic.batches[-1][0][0] + 1 if topic.batches else 0 for tp in tps}

            def assign(self, tps: list[Any]) -> None:
                self.at = {tp: 0 for tp in tps}

            def seek(self, tp: Any, offset: int) -> None:
                self.at[tp] = offset

            def seek_to_beginning(self, tp: Any) -> None:
                self.at[tp] = 0

            def position(self, tp: Any, timeout_ms: int | None = None) -> int:
                return self.at[tp]

            def pause(self, tp: Any) -> None:
                pass

            def poll(self, timeout_ms: int | None = None) -> dict:
                time.sleep(topic.poll_seconds)
                for tp, at in self.at.items():
                    for batch in topic.batches:  # one batch per poll
                        if batch[-1][0] >= at:
                            self.at[tp] = batch[-1][0] + 1
                            return {tp: [type("R", (), {"offset": o, "key": k, "value": v})()
                                         for o, k, v in batch if o >= at]}
                return {}

            def close(self, **_: Any) -> None:
                pass

        return Consumer()


def _store_on(topic: _Topic, timeout: float = 2.0) -> StateStore:
    store = StateStore("127.0.0.1:9", "state", timeout=timeout)
    store._consumer_for = lambda deadline: topic.consumer()  # type: ignore[method-assign]
    return store


def _publish(topic: _Topic, model: Any, epoch: int, sequence: int, newer: bool = False) -> list:
    from connectors.state_store import _PREFIX, FORMAT_VERSION

    records = offline_store()._chunks(model, _encode_payload({"w": np.ones(3)}, {"s": sequence}),
                                      epoch=epoch, sequence=sequence, next_offset=sequence)
    if newer:  # as a later stream-svm would write it
        records = [(k, _PREFIX.pack(*_PREFIX.unpack_from(v)[:1], FORMAT_VERSION + 1,
                                    _PREFIX.unpack_from(v)[2]) + v[_PREFIX.size:])
                   for k, v in records]
    topic.write(records)
    return records


def _found(states: dict[Any, Any]) -> dict[Any, tuple[int, int]]:
    return {model: (state.epoch, state.sequence) for model, state in states.items()}


def test_the_index_stops_for_a_newer_format_only_where_a_whole_read_does():
    # It decoded every record read: a record of a later stream-svm for a model of another
    # partition, or one written over since, refused the assignment (and every later one,
    # on a broker that never compacts).
    from connectors.state_store import StateFromNewerVersion

    topic = _Topic()
    _publish(topic, (0, "a"), 0, 1)
    _publish(topic, (1, "b"), 0, 1, newer=True)                # another partition's model
    overwritten = _publish(topic, (0, "a"), 1, 1, newer=True)
    _publish(topic, (0, "a"), 2, 1)
    topic.write([(key, None) for key, _ in overwritten])      # tombstoned by its next owner
    first = lambda m: m[0] == 0  # noqa: E731
    assert _found(_store_on(topic).index(first)) == _found(
        _store_on(topic).restore(select=first, decode=False)) == {(0, "a"): (2, 1)}
    # Asked for every model, both stop: the newest record of (1, "b") is a later version's.
    with pytest.raises(StateFromNewerVersion, match="format version"):
        _store_on(topic).index(lambda m: True)
    with pytest.raises(StateFromNewerVersion, match="format version"):
        _store_on(topic).restore(decode=False)


def test_an_index_read_that_runs_out_of_time_goes_on_from_where_it_stopped():
    # Each attempt began again where the last whole read had ended: once the topic gained
    # more between two assignments than one timeout reads, no assignment ever settled.
    from connectors.state_store import StateStoreError

    topic = _Topic()
    _publish(topic, (0, "a"), 0, 1)
    store = _store_on(topic, timeout=1.0)
    assert _found(store.index(lambda m: True)) == {(0, "a"): (0, 1)}
    for sequence in range(2, 14):
        _publish(topic, (0, "a"), 0, sequence)
    topic.poll_seconds = 0.15  # twelve batches: about 1.8 s to read
    with pytest.raises(StateStoreError, match="did not finish within 1 s"):
        store.index(lambda m: True)
    _publish(topic, (0, "a"), 0, 14)  # the topic goes on growing meanwhile
    assert _found(store.index(lambda m: True)) == {(0, "a"): (0, 14)}


def test_a_topic_recreated_on_a_broker_without_topic_ids_is_indexed_anew():
    topic = _Topic(topic_id=None)
    for sequence in range(1, 6):
        _publish(topic, "group", 0, sequence)
    store = _store_on(topic)
    assert _found(store.index(lambda m: True)) == {"group": (0, 5)}
    recreated = _Topic(topic_id=None)  # deleted and created again: its end offsets went down
    _publish(recreated, (0, "x"), 0, 1)
    store._consumer_for = lambda deadline: recreated.consumer()  # type: ignore[method-assign]
    assert _found(store.index(lambda m: True)) == {(0, "x"): (0, 1)}
