"""Late labels wait for their features: a label on ``kafka.label_topic`` newer than what was
read of the input topic is held back while the input topic has messages left to read.

Without it, a daemon with a backlog read the small label messages much faster than the
features they label, and dead-lettered them ``unknown_id``."""

from __future__ import annotations

import doctest
import logging
import threading

import numpy as np
import pytest

import connectors.pacing
from connectors.config import load_config
from connectors.daemon import Daemon, ensure_topics
from connectors.pacing import LabelPacer
from connectors.processor import Record
from tests.connectors_helpers import broker, produce, read_all, unique, wait_for  # noqa: F401


def _input(partition: int, offset: int, timestamp: int) -> Record:
    return Record("in", partition, offset, b"{}", timestamp)


def _label(partition: int, offset: int, timestamp: int) -> Record:
    return Record("labels", partition, offset, b"{}", timestamp)


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_module_example_runs():
    assert doctest.testmod(connectors.pacing).failed == 0


def test_a_label_newer_than_the_input_read_waits_with_every_later_label_of_its_partition():
    pacer = LabelPacer("in", "labels", per_partition=False, clock=_Clock())
    records = [_input(0, 10, 100), _label(0, 3, 90), _label(0, 4, 150), _label(0, 5, 95),
               _label(1, 7, 105), _input(0, 11, 110), _label(1, 8, 120)]
    # Input partition 0 has 50 messages left: labels up to timestamp 110 (the newest input
    # of this poll) may go; the label at 150 waits, and so does the one behind it at 95.
    # A global model's labels of every partition wait for it.
    ready, held = pacer.split(records, {0: (12, 62)})
    assert ready == [records[0], records[1], records[4], records[5]]
    assert held == {0: 4, 1: 8}
    assert pacer.held == {0: 150, 1: 120}
    pacer.delivered(ready, {})  # (the daemon handles the ready records)
    assert pacer.releasable({0: (40, 62)}) == []  # still reading, nothing newer read
    pacer.delivered([_input(0, 40, 149)], {})
    assert pacer.releasable({0: (41, 62)}) == [1]  # 120 <= 149; 150 waits
    pacer.delivered([_input(0, 41, 150)], {})
    # Read up to the label's millisecond: another message of it may follow.
    assert pacer.releasable({0: (42, 62)}) == []
    pacer.delivered([_input(0, 42, 151)], {})
    assert pacer.releasable({0: (43, 62)}) == [0]
    assert pacer.held == {}


def test_a_global_model_waits_for_every_input_partition_a_scoped_one_for_its_own():
    polled = [_input(0, 0, 500), _label(1, 0, 300)]
    inputs = {0: (1, 1), 1: (0, 20)}  # partition 0 read to its end, partition 1 not begun
    pacer = LabelPacer("in", "labels", per_partition=False, clock=_Clock())
    assert pacer.split(polled, inputs) == ([polled[0]], {1: 0})
    scoped = LabelPacer("in", "labels", per_partition=True, clock=_Clock())
    assert scoped.split([_input(0, 0, 500), _label(0, 0, 300)], inputs)[1] == {}
    assert scoped.split(polled, inputs)[1] == {1: 0}  # its own partition 1 has a backlog
    # A partition whose input partition is not read here (not settled): nothing to wait for.
    assert scoped.split([_label(2, 0, 300)], inputs)[1] == {}


@pytest.mark.parametrize("inputs, timestamp", [
    ({0: (20, 20)}, 10**12),      # the input is read to its end
    ({0: (5, 20)}, -1),           # a label without a timestamp
    ({}, 10**12),                 # no input partition
])
def test_a_label_does_not_wait_when_nothing_it_waits_for_can_come(inputs, timestamp):
    pacer = LabelPacer("in", "labels", per_partition=False, clock=_Clock())
    assert pacer.split([_label(0, 0, timestamp)], inputs)[1] == {}


def test_an_unknown_high_watermark_counts_as_messages_left_to_read():
    pacer = LabelPacer("in", "labels", per_partition=False, clock=_Clock())
    assert pacer.split([_label(0, 0, 50)], {0: (0, None)})[1] == {0: 0}
    assert pacer.releasable({0: (0, None)}) == []
    assert pacer.releasable({0: (7, 7)}) == [0]


def test_records_read_again_do_not_count_as_read():
    pacer = LabelPacer("in", "labels", per_partition=True, clock=_Clock())
    pacer.delivered([_input(0, 5, 100), _input(0, 6, 200), _label(0, 9, 900)],
                    {"in:0": 6})
    assert pacer.split([_label(0, 0, 99)], {0: (6, 30)})[1] == {}
    assert pacer.split([_label(0, 1, 101)], {0: (6, 30)})[1] == {0: 1}


def test_an_input_partition_that_does_not_move_stops_holding_labels_back(caplog):
    clock = _Clock()
    pacer = LabelPacer("in", "labels", per_partition=False, clock=clock)
    assert pacer.split([_label(0, 0, 50)], {0: (3, 9)})[1] == {0: 0}
    clock.now = pacer.wait_seconds - 1
    assert pacer.releasable({0: (3, 9)}) == []
    clock.now = pacer.wait_seconds / 2 * 3  # moved meanwhile: another wait_seconds from now
    assert pacer.releasable({0: (4, 9)}) == []
    clock.now += pacer.wait_seconds - 1
    assert pacer.releasable({0: (4, 9)}) == []
    with caplog.at_level(logging.WARNING, logger="connectors.pacing"):
        clock.now += 1
        assert pacer.releasable({0: (4, 9)}) == [0]
    assert "in:0 has messages to read but has not moved for 60 s" in caplog.text
    assert "unknown_id" in caplog.text


def test_a_partition_the_client_thinks_read_to_its_end_is_asked_of_the_broker():
    # kafka-python updates a partition's high watermark only as it hands out what it
    # fetched: a burst fetched behind the labels left the input "read to its end".
    pacer = LabelPacer("in", "labels", per_partition=False, clock=_Clock())
    asked: list[list[int]] = []

    def ends(partitions):
        asked.append(partitions)
        return {0: 3000, 1: 7}

    inputs = {0: (301, 301), 1: (7, 7)}
    assert pacer.split([_label(0, 0, 50)], inputs, ends)[1] == {0: 0}
    assert asked == [[0, 1]]
    assert pacer.releasable(inputs, lambda partitions: {0: 301, 1: 7}) == [0]
    # Nothing to ask when what was read is past the label, or without a way to ask.
    pacer.delivered([_input(0, 300, 60), _input(1, 6, 60)], {})
    assert pacer.split([_label(0, 1, 55)], inputs, ends)[1] == {} and len(asked) == 1
    assert pacer.split([_label(0, 2, 70)], inputs)[1] == {}

    def unreachable(partitions):
        raise TimeoutError("no answer")

    # A broker that does not answer: as read to its end (the stream must not stop for it).
    assert pacer.split([_label(0, 3, 70)], inputs, unreachable)[1] == {}


def test_a_label_stamped_ahead_of_this_clock_does_not_wait():
    # A producer whose clock runs an hour ahead held its label partition until the input
    # caught up with that clock.
    import time

    pacer = LabelPacer("in", "labels", per_partition=False, clock=_Clock())
    now = int(time.time() * 1000)
    inputs = {0: (5, 50)}
    assert pacer.split([_label(0, 0, now + 3_600_000)], inputs)[1] == {}
    assert pacer.split([_label(0, 1, now + 1000)], inputs)[1] == {0: 1}


def test_a_label_of_the_millisecond_read_last_waits_for_the_rest_of_it():
    pacer = LabelPacer("in", "labels", per_partition=True, clock=_Clock())
    records = [_input(0, 0, 100), _label(0, 0, 100)]
    assert pacer.split(records, {0: (1, 2)})[1] == {0: 0}  # one message left, maybe of 100
    assert pacer.split(records, {0: (1, 1)})[1] == {}      # none left


def test_an_input_partition_found_stuck_stays_so_while_it_does_not_move():
    clock = _Clock()
    pacer = LabelPacer("in", "labels", per_partition=False, clock=clock)
    inputs = {0: (3, 9)}
    assert pacer.split([_label(0, 0, 50)], inputs)[1] == {0: 0}
    clock.now = pacer.wait_seconds
    assert pacer.releasable(inputs) == [0]
    clock.now += 1  # still not moving: the next labels do not wait a minute again
    assert pacer.split([_label(0, 1, 50)], inputs)[1] == {}
    assert pacer.split([_label(0, 2, 50)], {0: (4, 9)})[1] == {0: 2}  # it moves: they wait


def test_forgotten_partitions_hold_nothing_and_start_unread():
    pacer = LabelPacer("in", "labels", per_partition=True, clock=_Clock())
    pacer.delivered([_input(0, 0, 100), _input(1, 0, 100)], {})
    assert pacer.split([_label(0, 0, 500), _label(1, 0, 500)], {0: (1, 5), 1: (1, 5)})[1] \
        == {0: 0, 1: 0}
    pacer.forget([1])
    assert pacer.held == {0: 500}
    # Read anew (a new owner resumes at the committed offset): nothing of partition 1 counts
    # as read, and a label older than what was read of it before waits.
    assert pacer.split([_label(1, 0, 90)], {0: (1, 5), 1: (1, 5)})[1] == {1: 0}
    pacer.delivered([_input(0, 1, 501)], {})  # partition 0 keeps what was read of it
    assert pacer.releasable({0: (2, 5), 1: (1, 5)}) == [0]


# -- on the broker -----------------------------------------------------------------------------

#: Enough bytes of features that the input topic takes several fetches (1 MB per partition)
#: while its labels fit in one: without pacing, most labels were read before their features.
FEATURES = 40
MESSAGES = 2400


def _features(rng: np.random.Generator, n: int) -> list[dict[str, float]]:
    return [{f"f{j:02d}": round(float(v), 12) for j, v in enumerate(row)}
            for row in rng.normal(size=(n, FEATURES))]


@pytest.mark.broker
@pytest.mark.parametrize("scope", ["global", "key"])
def test_labels_sent_after_a_backlog_of_features_all_find_them(broker, tmp_path,  # noqa: F811
                                                               scope):
    rng = np.random.default_rng(7)
    xs = _features(rng, MESSAGES)
    names = {k: unique(f"pace-{k}") for k in ("input", "labels", "output", "dead")}
    # Two partitions each: the client fetches them in turns, and the labels of one were read
    # while the features of the other still waited (one partition each, the embedded broker
    # answered a fetch with every feature at once).
    ensure_topics({"bootstrap_servers": broker.bootstrap_servers},
                  [names["input"], names["labels"]], partitions=2)
    keys = [f"k{i % 4}".encode() for i in range(MESSAGES)]
    features = [{"id": i, "x": x} for i, x in enumerate(xs)]
    labelled = list(range(0, MESSAGES, 3))  # a label for every third point
    labels = [{"id": i, "y": bool(xs[i]["f00"] > 0)} for i in labelled]
    produce(broker.bootstrap_servers, names["input"], features, key_of=lambda m: keys[m["id"]])
    produce(broker.bootstrap_servers, names["labels"], labels, key_of=lambda m: keys[m["id"]])
    settings = {
        "kafka.bootstrap_servers": broker.bootstrap_servers,
        "kafka.input_topic": names["input"], "kafka.label_topic": names["labels"],
        "kafka.output_topic": names["output"], "kafka.dead_letter_topic": names["dead"],
        "kafka.group_id": unique("pace-group"), "kafka.max_batch": 100,
        "kafka.request_timeout_ms": 10000, "model.C": 1.0, "model.gamma": 0.01,
        "checkpoint.dir": str(tmp_path / "checkpoints"), "metrics.enabled": "false",
    }
    if scope != "global":
        settings.update({"model.scope": scope, "kafka.state_topic": unique("pace-state"),
                         "kafka.session_timeout_ms": 3000, "kafka.heartbeat_interval_ms": 300})
    daemon = Daemon(load_config(None, settings, environ={}), until_drained=True)
    thread = threading.Thread(target=daemon.run, daemon=True)
    thread.start()
    thread.join(timeout=300)
    assert not thread.is_alive()
    assert daemon.summary.exit_code == 0
    assert daemon.summary.messages == MESSAGES + len(labels)
    dead = read_all(broker.bootstrap_servers, names["dead"], idle=0.5)
    assert dead == []
    outputs = read_all(broker.bootstrap_servers, names["output"], MESSAGES + len(labels))
    acknowledged = sorted(o["id"] for o in outputs if o.get("op") == "label")
    assert acknowledged == labelled


@pytest.mark.broker
def test_a_partition_paused_with_records_in_line_is_read_again_once_resumed(broker):  # noqa: F811
    # kafka-python 3 parks the records fetched for a partition when it is paused and gives
    # them back on resume only while no other partition's are in line: after a first poll,
    # never. The partition was then not fetched again, for good.
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    from connectors.daemon import _resume

    topic = unique("pace-park")
    ensure_topics({"bootstrap_servers": broker.bootstrap_servers}, [topic], partitions=2)
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap_servers, linger_ms=5)
    for _ in range(300):
        for partition in (0, 1):
            producer.send(topic, value=b"x" * 200, partition=partition)
    producer.flush(timeout=30)
    producer.close(timeout=10)
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap_servers,
                             enable_auto_commit=False, auto_offset_reset="earliest")
    try:
        tps = [TopicPartition(topic, 0), TopicPartition(topic, 1)]
        consumer.assign(tps)
        polled: dict = {}
        for _ in range(100):  # until one partition's records are in line, half read
            polled = consumer.poll(timeout_ms=200, max_records=10)
            if polled:
                break
        [tp] = list(polled)
        consumer.pause(tp)
        for _ in range(5):  # parks its records; the other partition's come in line
            consumer.poll(timeout_ms=100, max_records=10)
        consumer.seek(tp, 0)
        _resume(consumer, tp)
        offsets: list[int] = []
        for _ in range(100):
            offsets += [r.offset for r in consumer.poll(timeout_ms=100,
                                                        max_records=50).get(tp, [])]
            if offsets:
                break
        assert offsets[:1] == [0]
    finally:
        consumer.close()


@pytest.mark.broker
@pytest.mark.parametrize("scope", ["global", "key"])
def test_a_burst_reaching_a_daemon_that_had_caught_up_keeps_its_labels_behind_its_features(
        broker, tmp_path, scope):  # noqa: F811
    # The client's high watermark of the input was that of the daemon's last fetch handed
    # out: a burst of features fetched behind the labels looked like nothing left to read,
    # and every label of the burst was dead-lettered unknown_id.
    import time

    rng = np.random.default_rng(3)
    names = {k: unique(f"burst-{k}") for k in ("input", "labels", "output", "dead")}
    ensure_topics({"bootstrap_servers": broker.bootstrap_servers},
                  [names["input"], names["labels"]], partitions=1)
    servers = broker.bootstrap_servers
    key = (lambda m: b"k") if scope == "key" else None
    produce(servers, names["input"], [{"id": -1, "x": _features(rng, 1)[0]}], key_of=key)
    settings = {
        "kafka.bootstrap_servers": servers,
        "kafka.input_topic": names["input"], "kafka.label_topic": names["labels"],
        "kafka.output_topic": names["output"], "kafka.dead_letter_topic": names["dead"],
        "kafka.group_id": unique("burst-group"), "kafka.request_timeout_ms": 10000,
        "model.C": 1.0, "model.gamma": 0.01, "metrics.enabled": "false",
        "checkpoint.dir": str(tmp_path / "checkpoints"),
    }
    if scope != "global":
        settings.update({"model.scope": scope, "kafka.state_topic": unique("burst-state"),
                         "kafka.session_timeout_ms": 3000, "kafka.heartbeat_interval_ms": 300})
    busy, sleeping = threading.Event(), threading.Event()

    def on_batch(_daemon):
        if busy.is_set():  # busy with a batch while the burst arrives
            busy.clear()
            sleeping.set()
            time.sleep(3)

    daemon = Daemon(load_config(None, settings, environ={}), on_batch=on_batch)
    thread = threading.Thread(target=daemon.run, daemon=True)
    thread.start()
    try:
        assert wait_for(lambda: daemon.summary.messages >= 1, 60)
        time.sleep(1)  # caught up: its position is the high watermark it knows
        busy.set()
        produce(servers, names["input"], [{"id": -2, "x": _features(rng, 1)[0]}], key_of=key)
        assert sleeping.wait(30)
        features = [{"id": i, "x": x} for i, x in enumerate(_features(rng, MESSAGES))]
        produce(servers, names["input"], features, key_of=key)
        labels = [{"id": i, "y": bool(i % 2)} for i in range(0, MESSAGES, 3)]
        produce(servers, names["labels"], labels, key_of=key)
        total = 2 + MESSAGES + len(labels)
        assert wait_for(lambda: daemon.summary.messages >= total, 120)
    finally:
        daemon.stop()
        thread.join(timeout=60)
    assert not thread.is_alive() and daemon.summary.exit_code == 0
    assert read_all(servers, names["dead"], idle=0.5) == []


# -- each rule of the pacer, and the daemon's use of it --------------------------------------


def test_a_global_label_waits_for_the_input_partition_read_least():
    pacer = LabelPacer("in", "labels", per_partition=False, clock=_Clock())
    pacer.delivered([_input(0, 0, 100), _input(1, 0, 200)], {})
    # Partition 0 is read up to 100 only: the label at 150 may label features still in it.
    ready, held = pacer.split([_label(0, 0, 150), _label(1, 0, 250)], {0: (1, 9), 1: (1, 9)})
    assert held == {0: 0, 1: 0} and ready == []


def test_labels_without_a_timestamp_or_ahead_of_the_clock_never_wait_beside_others():
    import time

    pacer = LabelPacer("in", "labels", per_partition=False, clock=_Clock())
    ahead = int(time.time() * 1000) + 3_600_000
    records = [_label(0, 0, 50), _label(1, 0, -1), _label(2, 0, ahead)]
    ready, held = pacer.split(records, {0: (0, 9)})  # nothing read yet of a backlog
    assert held == {0: 0} and ready == records[1:]


def test_a_broker_end_offset_holds_labels_from_what_was_read_not_from_the_start():
    pacer = LabelPacer("in", "labels", per_partition=True, clock=_Clock())
    pacer.delivered([_input(0, 4, 100)], {})
    records = [_label(0, 0, 90), _label(0, 1, 150)]
    # The client thinks the input read to its end; the broker says 45 more messages.
    ready, held = pacer.split(records, {0: (5, 5)}, lambda partitions: {0: 50})
    assert ready == records[:1] and held == {0: 1}


def test_only_time_labels_waited_counts_towards_an_input_partition_not_moving():
    clock = _Clock()
    pacer = LabelPacer("in", "labels", per_partition=True, clock=clock)
    # A label ahead of the clock never waits: it starts no wait either.
    import time
    assert pacer.split([_label(0, 0, int(time.time() * 1000) + 3_600_000)],
                       {0: (3, 9)})[1] == {}
    clock.now = pacer.wait_seconds
    assert pacer.split([_label(0, 1, 50)], {0: (3, 9)})[1] == {0: 1}  # waits from now
    # Released as read to its end; more messages come later, the position unchanged.
    clock.now += 1
    assert pacer.releasable({0: (3, 3)}) == [0]
    clock.now += pacer.wait_seconds
    assert pacer.split([_label(0, 2, 60)], {0: (3, 20)})[1] == {0: 2}


@pytest.mark.parametrize("per_partition", [True, False])
def test_labels_of_other_partitions_flowing_do_not_restart_a_held_labels_minute(per_partition):
    # Each poll's labels alone were judged: an input partition that only a held (paused)
    # label partition waited for was no longer watched, and its minute began again at
    # every poll, so the held labels waited for ever.
    clock = _Clock()
    pacer = LabelPacer("in", "labels", per_partition=per_partition, clock=clock)
    pacer.delivered([_input(0, 9, 200), _input(1, 2, 40)], {})
    inputs = {0: (10, 10), 1: (3, 9)}  # input 1 has messages left and never moves
    assert pacer.split([_label(1, 0, 50)], inputs)[1] == {1: 0}
    released: list[int] = []
    for step in range(9):
        clock.now += 10
        released += pacer.releasable(inputs)
        assert pacer.split([_label(0, step, 150 if per_partition else 30)], inputs)[1] == {}
    assert released == [1] and clock.now < 2 * pacer.wait_seconds


def test_the_broker_is_not_asked_again_of_an_input_partition_found_stuck():
    # Its leader gone, each question waited out a timeout, at every poll with labels.
    clock = _Clock()
    pacer = LabelPacer("in", "labels", per_partition=True, clock=clock)
    asked: list[list[int]] = []

    def ends(partitions):
        asked.append(partitions)
        return {0: 90}

    inputs = {0: (30, 30)}  # the client thinks it read; the broker says 60 more
    assert pacer.split([_label(0, 0, 50)], inputs, ends)[1] == {0: 0}
    clock.now = pacer.wait_seconds
    assert pacer.releasable(inputs, ends) == [0]  # stuck for a minute: labels go
    count = len(asked)
    assert pacer.split([_label(0, 1, 51)], inputs, ends)[1] == {}
    assert len(asked) == count
    assert pacer.split([_label(0, 2, 52)], {0: (31, 31)}, ends)[1] == {0: 2}  # it moved
    assert len(asked) == count + 1


def test_a_partition_given_anew_is_timed_anew():
    clock = _Clock()
    pacer = LabelPacer("in", "labels", per_partition=True, clock=clock)
    assert pacer.split([_label(0, 0, 50)], {0: (3, 9)})[1] == {0: 0}
    pacer.forget([0])  # taken away; given back later, read again from offset 3
    clock.now = pacer.wait_seconds
    assert pacer.split([_label(0, 0, 50)], {0: (3, 9)})[1] == {0: 0}


def test_a_stuck_partition_stays_stuck_through_polls_whose_labels_do_not_wait():
    clock = _Clock()
    pacer = LabelPacer("in", "labels", per_partition=False, clock=clock)
    inputs = {0: (3, 9)}
    assert pacer.split([_label(0, 0, 50)], inputs)[1] == {0: 0}
    clock.now = pacer.wait_seconds
    assert pacer.releasable(inputs) == [0]
    clock.now += 1
    assert pacer.split([_label(0, 1, -1)], inputs)[1] == {}  # waits for nothing
    clock.now += 1
    assert pacer.split([_label(0, 2, 50)], inputs)[1] == {}  # still stuck: no new minute


def test_a_held_label_partition_is_paused_at_its_first_held_label_and_resumed_once_free(
        tmp_path):
    from kafka import TopicPartition

    class Consumer:  # records what the daemon asks of it
        def __init__(self):
            self.calls = []
            self.end = 60
            self.assigned = {TopicPartition("labels", 0), TopicPartition("in", 0)}

        def seek(self, tp, offset):
            self.calls.append(("seek", tp.partition, offset))

        def pause(self, *tps):
            self.calls += [("pause", tp.partition) for tp in tps]

        def resume(self, *tps):
            self.calls += [("resume", tp.partition) for tp in tps]

        def assignment(self):
            return self.assigned

        def end_offsets(self, tps, timeout_ms=None):
            return {tp: self.end for tp in tps}

    settings = {"kafka.bootstrap_servers": "127.0.0.1:9", "kafka.input_topic": "in",
                "kafka.label_topic": "labels", "kafka.output_topic": "out",
                "kafka.group_id": "g", "metrics.enabled": "false",
                "checkpoint.dir": str(tmp_path)}
    daemon = Daemon(load_config(None, settings, environ={}))
    daemon._consumer = consumer = Consumer()
    # The client thinks the input read to its end; the broker has 20 messages more.
    daemon._positions = {TopicPartition("in", 0): (40, 40)}
    records = [_input(0, 39, 1000), _label(0, 7, 5000), _label(0, 8, 5001)]
    assert daemon._pace_labels(records) == records[:1]
    assert consumer.calls == [("seek", 0, 7), ("pause", 0)]
    daemon._pacer.delivered(records[:1], {})
    consumer.calls.clear()
    daemon._release_labels()  # still 20 messages to read
    assert consumer.calls == [] and daemon._pacer.held == {0: 5000}
    daemon._positions = {TopicPartition("in", 0): (60, 60)}  # read to its end
    daemon._release_labels()
    assert consumer.calls == [("resume", 0)] and daemon._pacer.held == {}
    # A held label partition taken away is forgotten, not resumed.
    daemon._positions = {TopicPartition("in", 0): (60, 70)}
    consumer.end = 70
    daemon._pace_labels([_label(0, 9, 6000)])
    consumer.assigned = {TopicPartition("in", 0)}
    consumer.calls.clear()
    daemon._release_labels()
    assert consumer.calls == [] and daemon._pacer.held == {}


@pytest.mark.broker
def test_labels_are_released_once_the_input_is_read_past_them_not_at_its_end(
        broker, tmp_path):  # noqa: F811
    # Labels sent between two backlogs of features: once the daemon has read past them in
    # the input topic they go, while thousands of features are still to be read.
    rng = np.random.default_rng(5)
    names = {k: unique(f"past-{k}") for k in ("input", "labels", "output", "dead")}
    servers = broker.bootstrap_servers
    ensure_topics({"bootstrap_servers": servers}, [names["input"], names["labels"]],
                  partitions=1)
    first, second = 600, 3 * MESSAGES
    xs = _features(rng, first + second)
    produce(servers, names["input"], [{"id": i, "x": xs[i]} for i in range(first)])
    labels = [{"id": i, "y": bool(xs[i]["f00"] > 0)} for i in range(0, first, 3)]
    produce(servers, names["labels"], labels)
    produce(servers, names["input"], [{"id": i, "x": xs[i]} for i in range(first, first + second)])
    settings = {
        "kafka.bootstrap_servers": servers,
        "kafka.input_topic": names["input"], "kafka.label_topic": names["labels"],
        "kafka.output_topic": names["output"], "kafka.dead_letter_topic": names["dead"],
        "kafka.group_id": unique("past-group"), "kafka.max_batch": 100,
        "kafka.request_timeout_ms": 10000, "model.C": 1.0, "model.gamma": 0.01,
        "checkpoint.dir": str(tmp_path / "checkpoints"), "metrics.enabled": "false",
    }
    daemon = Daemon(load_config(None, settings, environ={}), until_drained=True)
    thread = threading.Thread(target=daemon.run, daemon=True)
    thread.start()
    thread.join(timeout=300)
    assert not thread.is_alive() and daemon.summary.exit_code == 0
    outputs = read_all(servers, names["output"], first + second + len(labels))
    assert read_all(servers, names["dead"], idle=0.5) == []
    acknowledged = [n for n, o in enumerate(outputs) if o.get("op") == "label"]
    assert len(acknowledged) == len(labels)
    # (The output topic has one partition: its order is the order of handling.)
    features_after = len(outputs) - 1 - acknowledged[-1]
    assert features_after >= 1000, features_after  # (0: the labels waited for the end)


def test_the_daemon_asks_the_end_offsets_within_about_a_poll(tmp_path):
    # A partition whose leader is gone made each question wait the request timeout (30 s).
    asked = []

    class Consumer:
        def end_offsets(self, tps, timeout_ms=None):
            asked.append(timeout_ms)
            return {tp: 7 for tp in tps}

    settings = {"kafka.bootstrap_servers": "127.0.0.1:9", "kafka.input_topic": "in",
                "kafka.label_topic": "labels", "kafka.group_id": "g",
                "metrics.enabled": "false", "checkpoint.dir": str(tmp_path),
                "kafka.request_timeout_ms": 30000, "kafka.poll_timeout_ms": 200}
    daemon = Daemon(load_config(None, settings, environ={}))
    daemon._consumer = Consumer()
    assert daemon._end_offsets([0, 1]) == {0: 7, 1: 7}
    assert asked == [1000]
