"""Hardening through a real daemon on the embedded broker: every poison message gets its dead
letter while the messages around it (in the same poll) get their outputs and are learned, and
offsets are committed for all of them; a restart never starts a new model or skips a partition
without the operator's say, whether the checkpoints are gone or the (memory-only) broker
restarted empty, before the daemon started or under it."""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from connectors.broker import EmbeddedBroker, free_loopback_port
from connectors.checkpoint import CheckpointStore
from connectors.config import load_config
from connectors.daemon import Daemon, DaemonError, StartRefused, ensure_topics
from stream_svm import ConvergenceError, IncrementalSVC
from tests.connectors_helpers import (  # noqa: F401
    broker,
    committed,
    produce,
    read_all,
    unique,
    wait_for,
)

pytestmark = pytest.mark.broker

HUGE = "1" + "0" * 400
MODEL = {"C": 2.0, "gamma": 0.7}


def _config(servers: str, tmp_path, **extra: Any):
    names = {k: unique(f"hard-{k}") for k in ("input", "output", "dead")}
    settings = {
        "kafka.bootstrap_servers": servers,
        "kafka.input_topic": names["input"],
        "kafka.output_topic": names["output"],
        "kafka.dead_letter_topic": names["dead"],
        "kafka.group_id": unique("hard-group"),
        "kafka.request_timeout_ms": 5000,
        "model.C": MODEL["C"],
        "model.gamma": MODEL["gamma"],
        "checkpoint.dir": str(tmp_path / "checkpoints"),
        "metrics.enabled": False,
        "retry.initial_backoff_seconds": 0.1,
        "retry.max_backoff_seconds": 0.5,
        **extra,
    }
    return load_config(None, settings, environ={})


def _valid(i: int) -> dict[str, Any]:
    rng = np.random.default_rng(i)
    a, b = rng.uniform(-2, 2, size=2)
    return {"id": f"v{i}", "x": {"a": float(a), "b": float(b)}, "y": bool(a * b > 0)}


def _strict(value: Any) -> Any:
    """Every record written must be JSON without NaN or Infinity."""
    json.loads(json.dumps(value), parse_constant=lambda name: pytest.fail(f"{name} written"))
    return value


# -- poison messages --------------------------------------------------------------------------

POISON = {
    "integer feature too large for a float": (
        f'{{"id": "p", "x": {{"a": {HUGE}}}, "y": true}}'.encode(), ("malformed",),
        "too large for a float", {}),
    "integer label too large": (
        f'{{"id": "p", "x": {{"a": 1.0}}, "y": {HUGE}}}'.encode(), ("malformed",),
        "not one of the two classes", {}),
    "string id with a lone surrogate": (
        b'{"id": "\\ud800", "x": {"a": 1.0}, "y": true}', ("malformed",), "not valid Unicode",
        {}),
    # Scored by a model that has points, it is refused at prediction (non_finite); an empty
    # model scores everything with its bias, and the engine refuses the point (refused).
    "finite input whose score is not finite": (
        b'{"id": "p", "x": {"a": 1e300}, "y": true}', ("non_finite", "refused"), "not finite",
        {"model.kernel": "poly", "model.gamma": 1.0, "model.coef0": 1.0}),
}


def _run(config, stream: list[Any]) -> tuple[Daemon, list[Any], list[Any]]:
    servers = config.kafka.bootstrap_servers
    kafka = config.kafka
    ensure_topics({"bootstrap_servers": servers},
                  [kafka.input_topic, kafka.output_topic, kafka.dead_letter_topic])
    produce(servers, kafka.input_topic, stream)  # all of it before the daemon: one poll
    daemon = Daemon(config, until_drained=True)
    assert daemon.run() == 0
    outputs = read_all(servers, kafka.output_topic, daemon.summary.outputs)
    dead = read_all(servers, kafka.dead_letter_topic, daemon.summary.dead_letters)
    return daemon, outputs, dead


def _assert_the_rest_went_on(config, daemon: Daemon, outputs, stream, valid_ids) -> None:
    assert daemon.summary.messages == len(stream) and daemon.summary.batches == 1
    assert [o["id"] for o in outputs if "prediction" in o] == valid_ids
    for output in outputs:
        _strict(output)
    model = daemon.processor.model
    settings = config.model
    reference = IncrementalSVC(C=settings.C, kernel=settings.kernel, gamma=settings.gamma,
                               degree=settings.degree, coef0=settings.coef0)
    for message in stream:
        if isinstance(message, dict) and "x" in message and message["id"] in valid_ids:
            reference.learn_one(message["x"], message["y"], key=message["id"])
    assert sorted(model.stored_keys()) == sorted(valid_ids)
    grid = pd.DataFrame([_valid(100 + i)["x"] for i in range(30)])
    np.testing.assert_allclose(model.decision_function_many(grid),
                               reference.decision_function_many(grid), atol=1e-9)
    input_topic = config.kafka.input_topic
    servers = config.kafka.bootstrap_servers
    assert committed(servers, config.kafka.group_id, input_topic) == len(stream)
    checkpoint = CheckpointStore(config.checkpoint.dir).load_latest()
    assert checkpoint.state["processor"]["offsets"] == {f"{input_topic}:0": len(stream)}


@pytest.mark.parametrize("case", list(POISON))
def test_a_poison_message_is_dead_lettered_and_the_stream_goes_on(broker, tmp_path,  # noqa: F811
                                                                   case):
    raw, reason, text, model = POISON[case]
    config = _config(broker.bootstrap_servers, tmp_path, **model)
    stream = [_valid(0), _valid(1), raw, _valid(2), _valid(3)]
    daemon, outputs, dead = _run(config, stream)
    (letter,) = dead
    assert _strict(letter)["reason"] in reason and text in letter["error"]
    assert letter["source"]["offset"] == 2
    _assert_the_rest_went_on(config, daemon, outputs, stream, ["v0", "v1", "v2", "v3"])


@pytest.mark.parametrize("op", ["forget", "relabel"])
def test_a_refused_forget_or_relabel_changes_nothing(broker, tmp_path, monkeypatch,  # noqa: F811
                                                     op):
    """The model refuses the update (ConvergenceError, as on a numerically singular kernel):
    the point stays as it was, with its label; a relabel is all or nothing."""
    if op == "forget":
        def refuse(self, x=None, y=None, key=None):
            raise ConvergenceError("update stopped after 9 steps; the model is unchanged")

        monkeypatch.setattr(IncrementalSVC, "forget_one", refuse)
    else:  # the forget half of the relabel goes through, its learn half is refused
        learn_one = IncrementalSVC.learn_one

        def refuse_new_label(self, x, y, key=None):
            if key == "v1" and y is not True:
                raise ConvergenceError("update stopped after 9 steps; the model is unchanged")
            return learn_one(self, x, y, key=key)

        monkeypatch.setattr(IncrementalSVC, "learn_one", refuse_new_label)
    config = _config(broker.bootstrap_servers, tmp_path)
    first = _valid(1)
    first["y"] = True
    stream = [_valid(0), first, _valid(2), {"op": op, "id": "v1", "y": False}, _valid(3)]
    if op == "forget":
        del stream[3]["y"]
    daemon, outputs, dead = _run(config, stream)
    (letter,) = dead
    assert letter["reason"] == "refused" and "ConvergenceError" in letter["error"]
    assert daemon.processor.model.stored_point("v1") == (first["x"], True)
    _assert_the_rest_went_on(config, daemon, outputs, stream, ["v0", "v1", "v2", "v3"])


def test_an_unexpected_exception_is_an_internal_dead_letter(broker, tmp_path,  # noqa: F811
                                                           monkeypatch):
    learn_one, learn_many = IncrementalSVC.learn_one, IncrementalSVC.learn_many

    def broken_one(self, x, y, key=None):
        if key == "v2":
            raise ZeroDivisionError("division by zero in a bug")
        return learn_one(self, x, y, key=key)

    def broken_many(self, X, y, keys=None):
        if "v2" in list(keys or []):
            raise ZeroDivisionError("division by zero in a bug")
        return learn_many(self, X, y, keys=keys)

    monkeypatch.setattr(IncrementalSVC, "learn_one", broken_one)
    monkeypatch.setattr(IncrementalSVC, "learn_many", broken_many)
    config = _config(broker.bootstrap_servers, tmp_path)
    stream = [_valid(i) for i in range(5)]
    daemon, outputs, dead = _run(config, stream)
    (letter,) = dead
    assert letter["reason"] == "internal"
    assert "ZeroDivisionError: division by zero in a bug" in letter["error"]
    _assert_the_rest_went_on(config, daemon, outputs, stream, ["v0", "v1", "v3", "v4"])


# -- restarts -------------------------------------------------------------------------------


def test_committed_offsets_without_checkpoints_need_start_fresh(broker, tmp_path):  # noqa: F811
    config = _config(broker.bootstrap_servers, tmp_path)
    _run(config, [_valid(i) for i in range(6)])
    gone = tmp_path / "checkpoints"
    for path in gone.iterdir():
        path.unlink()
    produce(broker.bootstrap_servers, config.kafka.input_topic, [_valid(i) for i in range(6, 9)])
    with pytest.raises(StartRefused, match="committed offset 6") as caught:
        Daemon(config, until_drained=True).run()
    assert "--start-fresh" in str(caught.value)
    assert not list(gone.glob("checkpoint-*"))
    fresh = load_config(None, {**{f"{s}.{k}": v for s, t in config.as_dict().items()
                                  for k, v in t.items() if v is not None},
                               "checkpoint.start_fresh": True}, environ={})
    daemon = Daemon(fresh, until_drained=True)
    assert daemon.run() == 0
    # A new model, from the committed offsets on: only the messages after them.
    assert sorted(daemon.processor.model.stored_keys()) == ["v6", "v7", "v8"]


def test_of_two_daemons_serving_one_group_one_stops(broker, tmp_path,  # noqa: F811
                                                     monkeypatch):
    # Two global daemons started together in one group (two replicas of a deployment) both
    # answered and learned every message. The first to see the other's commit stops.
    import connectors.daemon

    monkeypatch.setattr(connectors.daemon, "GROUP_CHECK_SECONDS", 0.0)  # at every commit
    config = _config(broker.bootstrap_servers, tmp_path, **{"checkpoint.every_messages": 3})
    # The embedded broker keeps no commit metadata: there only the offsets tell the two
    # daemons' commits apart, and two daemons in lockstep commit the same ones. Both read the
    # same polls, so cadences of 3 and 7 messages both checkpoint after every poll of 10. The
    # twin checkpoints only every third poll: between two of its commits the first daemon
    # commits offsets the twin never did, whatever the polls hold.
    twin = load_config(None, {**{f"{s}.{k}": v for s, t in config.as_dict().items()
                                 for k, v in t.items() if v is not None},
                              "checkpoint.dir": str(tmp_path / "twin"),
                              "checkpoint.every_messages": 25}, environ={})
    kafka = config.kafka
    ensure_topics({"bootstrap_servers": broker.bootstrap_servers},
                  [kafka.input_topic, kafka.output_topic, kafka.dead_letter_topic])
    daemons = [Daemon(config), Daemon(twin)]
    codes: list[int] = []
    threads = [threading.Thread(target=lambda d=d: codes.append(d.run()), daemon=True)
               for d in daemons]
    for thread in threads:
        thread.start()
    try:
        for start in range(0, 100, 10):
            produce(broker.bootstrap_servers, kafka.input_topic,
                    [_valid(i) for i in range(start, start + 10)])
            if wait_for(lambda: codes, 2):
                break
        assert wait_for(lambda: codes, 30), "neither daemon saw the other's commits"
        assert codes == [1]
        stopped, going_on = daemons if daemons[0]._twin else daemons[::-1]
        assert stopped._twin and not going_on._twin and not going_on.stop_event.is_set()
    finally:
        for daemon in daemons:
            daemon.stop()
        for thread in threads:
            thread.join(timeout=60)
    assert len(codes) == 2 and not any(t.is_alive() for t in threads)


def _restart(embedded: EmbeddedBroker, while_down: Any = None) -> EmbeddedBroker:
    """The memory-only broker again, on the same port (after ``while_down()``, called while it
    is stopped): every topic and offset is gone."""
    port = int(embedded.bootstrap_servers.rpartition(":")[2])
    embedded.stop()
    if while_down is not None:
        while_down()
    return EmbeddedBroker(port=port, start_timeout=20).start()


def _serve_then_restart_the_broker(embedded: EmbeddedBroker, config: Any
                                   ) -> tuple[EmbeddedBroker, Daemon, threading.Thread]:
    """A daemon that has read 20 messages, then the broker restarted empty under it; the
    outage lasts until the daemon has shown it (it samples the connection once per poll,
    whatever the machine's load)."""
    kafka = config.kafka
    ensure_topics({"bootstrap_servers": embedded.bootstrap_servers},
                  [kafka.input_topic, kafka.output_topic, kafka.dead_letter_topic])
    produce(embedded.bootstrap_servers, kafka.input_topic, [_valid(i) for i in range(20)])
    daemon = Daemon(config)
    thread = threading.Thread(target=daemon.run, daemon=True)
    thread.start()
    restarted = None
    try:
        assert wait_for(lambda: daemon.summary.messages == 20, 30)
        seen: list[bool] = []
        restarted = _restart(embedded, lambda: seen.append(wait_for(
            lambda: b"stream_svm_connected 0.0" in daemon.metrics.render(), 20)))
        assert seen == [True]
    except BaseException:  # the caller gets nothing to stop: stop it all here
        daemon.stop()
        thread.join(timeout=60)
        if restarted is not None:
            restarted.stop()
        raise
    return restarted, daemon, thread


@pytest.mark.slow
def test_a_broker_restarted_empty_before_the_daemon_is_not_resumed_silently(tmp_path):
    embedded = EmbeddedBroker(port=free_loopback_port(), start_timeout=20).start()
    try:
        config = _config(embedded.bootstrap_servers, tmp_path)
        _run(config, [_valid(i) for i in range(20)])
        embedded = _restart(embedded)
        topic = config.kafka.input_topic
        # The recreated topic holds 5 new messages at offsets 0-4; the checkpoint resumes at 20.
        ensure_topics({"bootstrap_servers": embedded.bootstrap_servers},
                      [topic, config.kafka.output_topic, config.kafka.dead_letter_topic])
        produce(embedded.bootstrap_servers, topic, [_valid(i) for i in range(20, 25)])
        daemon = Daemon(config, until_drained=True)
        with pytest.raises(StartRefused, match=rf"partition {topic}:0 no longer holds"):
            daemon.run()
        assert re.search(r'stream_svm_partition_resets_total\{cause="topic_recreated",'
                         r'partition="0",topic="[^"]+"\} 1\.0', daemon.metrics.render().decode())
        assert read_all(embedded.bootstrap_servers, config.kafka.output_topic, idle=0.5) == []
        told = _config(embedded.bootstrap_servers, tmp_path,
                       **{"kafka.on_partition_reset": "earliest"})
        for section in ("input_topic", "output_topic", "dead_letter_topic", "group_id"):
            setattr(told.kafka, section, getattr(config.kafka, section))
        daemon = Daemon(told, until_drained=True)
        assert daemon.run() == 0
        # The model is kept, and the new topic is read from its beginning.
        assert sorted(daemon.processor.model.stored_keys()) == sorted(
            f"v{i}" for i in range(25))
        outputs = read_all(embedded.bootstrap_servers, config.kafka.output_topic, 5)
        assert sorted(o["id"] for o in outputs) == [f"v{i}" for i in range(20, 25)]
    finally:
        embedded.stop()


@pytest.mark.slow
def test_a_topic_the_daemon_created_anew_at_its_start_is_named_so_in_the_refusal(tmp_path):
    # The broker lost its topics, and the daemon's start created the input topic anew
    # (kafka.create_topics): the refusal said only that the topic was deleted and recreated.
    embedded = EmbeddedBroker(port=free_loopback_port(), start_timeout=20).start()
    try:
        config = _config(embedded.bootstrap_servers, tmp_path)
        _run(config, [_valid(i) for i in range(20)])
        embedded = _restart(embedded)
        config.kafka.bootstrap_servers = embedded.bootstrap_servers
        topic = config.kafka.input_topic
        with pytest.raises(StartRefused, match=(
                rf"partition {topic}:0 no longer holds the offsets .*; {topic} was missing at "
                r"this start, and this daemon created it anew \(kafka.create_topics\)")):
            Daemon(config, until_drained=True).run()
    finally:
        embedded.stop()


@pytest.mark.slow
@pytest.mark.parametrize(("policy", "new"), [("stop", range(20, 25)), ("earliest", range(20, 25)),
                                             ("stop", range(100, 140)),
                                             ("earliest", range(100, 140))],
                         ids=["stop-fewer", "earliest-fewer", "stop-more", "earliest-more"])
def test_a_broker_restarted_under_the_daemon(tmp_path, policy, new):
    """The broker restarts empty while the daemon runs. Its lost connection is counted and
    shown, and the partition that lost the daemon's position is noticed: the daemon stops
    (exit 1), or with 'earliest' keeps its model and reads the new messages. With more new
    messages than the daemon had read (40 at offsets 0-39, the daemon at 20), nothing is read
    at the old position meanwhile: what the polls return after the reconnect is held until
    the topic's new id is seen (before, offsets 20-39 were learned and answered, and with
    'earliest' read again as duplicates)."""
    embedded = EmbeddedBroker(port=free_loopback_port(), start_timeout=20).start()
    daemon = None
    thread = None
    try:
        config = _config(embedded.bootstrap_servers, tmp_path,
                         **{"kafka.on_partition_reset": policy, "kafka.poll_timeout_ms": 50})
        kafka = config.kafka
        topics = [kafka.input_topic, kafka.output_topic, kafka.dead_letter_topic]
        embedded, daemon, thread = _serve_then_restart_the_broker(embedded, config)
        ensure_topics({"bootstrap_servers": embedded.bootstrap_servers}, topics)
        produce(embedded.bootstrap_servers, kafka.input_topic, [_valid(i) for i in new])
        text = daemon.metrics.render().decode()
        if policy == "stop":
            thread.join(timeout=60)
            assert not thread.is_alive() and daemon.summary.exit_code == 1
            assert daemon.summary.messages == 20
            assert sorted(daemon.processor.model.stored_keys()) == sorted(
                f"v{i}" for i in range(20))
            # Its old offset (20) committed into the new broker's group made the next daemon
            # of the group (a replica, or a --start-fresh) skip the first 20 new messages.
            assert committed(embedded.bootstrap_servers, kafka.group_id, kafka.input_topic) is None
        else:
            assert wait_for(lambda: daemon.summary.messages == 20 + len(new), 60)
            assert wait_for(lambda: b"stream_svm_connected 1.0" in daemon.metrics.render(), 20)
            assert sorted(daemon.processor.model.stored_keys()) == sorted(
                [f"v{i}" for i in range(20)] + [f"v{i}" for i in new])
            assert read_all(embedded.bootstrap_servers, kafka.dead_letter_topic, idle=0.5) == []
        text = daemon.metrics.render().decode()
        assert re.search(r"stream_svm_partition_resets_total\{cause=\"(beyond_end|"
                         r"topic_recreated)\",partition=\"0\"", text), text
        errors = float(re.search(r"^stream_svm_broker_errors_total (\S+)$", text, re.M)[1])
        assert errors >= 1.0
    finally:
        if daemon is not None:
            daemon.stop()
        if thread is not None:
            thread.join(timeout=60)
        embedded.stop()


@pytest.mark.slow
@pytest.mark.parametrize("scope", ["key", "partition"])
def test_a_broker_restarted_under_a_scoped_daemon_stops_it_by_name(tmp_path, scope, caplog):
    # The stop's message was built but neither logged nor acted on: the daemon went on to
    # reposition the partition and died on an AttributeError (no single model there).
    embedded = EmbeddedBroker(port=free_loopback_port(), start_timeout=20).start()
    daemon = None
    thread = None
    try:
        config = _config(embedded.bootstrap_servers, tmp_path, **{
            "model.scope": scope, "kafka.state_topic": unique("hard-state"),
            "kafka.request_timeout_ms": 10000, "kafka.session_timeout_ms": 3000,
            "kafka.heartbeat_interval_ms": 300, "kafka.poll_timeout_ms": 50})
        kafka = config.kafka
        embedded, daemon, thread = _serve_then_restart_the_broker(embedded, config)
        ensure_topics({"bootstrap_servers": embedded.bootstrap_servers},
                      [kafka.input_topic, kafka.output_topic, kafka.dead_letter_topic,
                       kafka.state_topic])
        produce(embedded.bootstrap_servers, kafka.input_topic,
                [_valid(i) for i in range(20, 25)])
        thread.join(timeout=60)
        assert not thread.is_alive() and daemon.summary.exit_code == 1
        # Noticed by the position beyond the partition's end, or by the topics' new ids
        # (after a rejoin, which would otherwise have begun new, empty models silently).
        assert re.search(rf"(partition {kafka.input_topic}:0 no longer holds the offsets|"
                         rf"topic \S+ has the id \S+, it had \S+ when this daemon started)",
                         caplog.text), caplog.text
        assert re.search("[Rr]estore the topics, or start new models", caplog.text)
        # (kafka-python's own tracebacks of closed sockets may name an AttributeError)
        assert not [r for r in caplog.records if r.name.startswith("connectors")
                    and ("AttributeError" in r.getMessage()
                         or (r.exc_info and r.exc_info[0] is AttributeError))]
        # Nothing committed or published into the new broker's group and state topic.
        assert committed(embedded.bootstrap_servers, kafka.group_id, kafka.input_topic) is None
        from kafka import KafkaConsumer, TopicPartition

        reader = KafkaConsumer(bootstrap_servers=embedded.bootstrap_servers,
                               auto_offset_reset="earliest", consumer_timeout_ms=500)
        try:
            reader.assign([TopicPartition(kafka.state_topic, 0)])
            published = [r.key for r in reader]
        finally:
            reader.close()
        assert published == []
    finally:
        if daemon is not None:
            daemon.stop()
        if thread is not None:
            thread.join(timeout=60)
        embedded.stop()


def test_a_batch_that_fails_as_a_whole_commits_and_checkpoints_nothing_of_it(
        broker, tmp_path, monkeypatch):  # noqa: F811
    """A failure outside the per-message guards (a bug): the daemon stops with exit 1 and
    neither checkpoints nor commits the batch, some of which may be in the model without its
    output; the restart answers every message of it."""
    from connectors.processor import Processor

    config = _config(broker.bootstrap_servers, tmp_path, **{"kafka.max_batch": 4})
    kafka = config.kafka
    ensure_topics({"bootstrap_servers": broker.bootstrap_servers},
                  [kafka.input_topic, kafka.output_topic, kafka.dead_letter_topic])
    produce(broker.bootstrap_servers, kafka.input_topic, [_valid(i) for i in range(4)])
    daemon = Daemon(config, until_drained=True)
    assert daemon.run() == 0  # a first batch, checkpointed and committed
    produce(broker.bootstrap_servers, kafka.input_topic, [_valid(i) for i in range(4, 8)])
    emit = Processor._emit

    def broken(self, entry, result):
        if entry.source.offset == 6:
            raise MemoryError("out of memory while encoding")
        return emit(self, entry, result)

    monkeypatch.setattr(Processor, "_emit", broken)
    daemon = Daemon(config, until_drained=True)
    assert daemon.run() == 1
    assert b"stream_svm_batch_failures_total 1.0" in daemon.metrics.render()
    assert committed(broker.bootstrap_servers, kafka.group_id, kafka.input_topic) == 4
    checkpoint = CheckpointStore(config.checkpoint.dir).load_latest()
    assert checkpoint.state["processor"]["offsets"] == {f"{kafka.input_topic}:0": 4}
    monkeypatch.undo()
    daemon = Daemon(config, until_drained=True)
    assert daemon.run() == 0
    outputs = read_all(broker.bootstrap_servers, kafka.output_topic, 8)
    assert sorted(o["id"] for o in outputs) == [f"v{i}" for i in range(8)]
    assert sorted(daemon.processor.model.stored_keys()) == [f"v{i}" for i in range(8)]


def _topics_on(servers: str) -> set[str]:
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=servers)
    try:
        return set(admin.list_topics())
    finally:
        admin.close()


def _produce_to(servers: str, topic: str, messages: list[tuple[int, dict[str, Any]]]) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=servers, acks="all", linger_ms=1)
    try:
        for partition, message in messages:
            producer.send(topic, value=json.dumps(message).encode(), partition=partition)
        producer.flush(timeout=30)
    finally:
        producer.close(timeout=10)


@pytest.mark.slow
def test_a_topic_recreated_with_more_partitions_under_the_daemon_is_read_whole(
        tmp_path, monkeypatch):
    """The broker restarts empty under the daemon, and the operator recreates the input topic
    with three partitions. The daemon must not have recreated the topic itself (its metadata
    requests once did, with the broker's default partition count, on a loaded machine), it
    reads the partitions it was never assigned (they were never read: a silent stall), and
    the new topic id, seen after the daemon had already re-positioned the partition that lost
    its offsets, does not make it read that partition a second time. The metadata's topic id
    is held at the old one until the new messages are read (as a lagging refresh would)."""
    import connectors.daemon as daemon_module

    real_topic_id = daemon_module._topic_id
    frozen: dict[str, str | None] = {}
    hold = threading.Event()
    hold.set()

    def lagging_topic_id(consumer, topic):
        current = real_topic_id(consumer, topic)
        return frozen.setdefault(topic, current) if hold.is_set() else current

    monkeypatch.setattr(daemon_module, "_topic_id", lagging_topic_id)
    monkeypatch.setattr(Daemon, "TOPIC_CHECK_SECONDS", 0.2)
    embedded = EmbeddedBroker(port=free_loopback_port(), start_timeout=20).start()
    daemon = None
    thread = None
    try:
        config = _config(embedded.bootstrap_servers, tmp_path,
                         **{"kafka.on_partition_reset": "earliest", "kafka.poll_timeout_ms": 50})
        kafka = config.kafka
        topic = kafka.input_topic
        others = [kafka.output_topic, kafka.dead_letter_topic]
        embedded, daemon, thread = _serve_then_restart_the_broker(embedded, config)
        servers = embedded.bootstrap_servers
        assert wait_for(lambda: b"stream_svm_connected 1.0" in daemon.metrics.render(), 20)
        # The reconnected consumer asks for the missing topic's metadata: the broker must not
        # create it for the daemon (it did so within a second).
        assert not wait_for(lambda: topic in _topics_on(servers), 3)
        ensure_topics({"bootstrap_servers": servers}, [topic], partitions=3)
        ensure_topics({"bootstrap_servers": servers}, others)
        new = [(p, _valid(20 + 2 * p + k)) for p in range(3) for k in range(2)]
        _produce_to(servers, topic, new)
        assert wait_for(lambda: daemon.summary.messages == 26, 60), daemon.summary
        assert sorted(daemon.processor.model.stored_keys()) == sorted(
            f"v{i}" for i in range(26))
        text = daemon.metrics.render().decode()
        assert re.search(rf'stream_svm_partitions_added_total\{{topic="{topic}"\}} 2\.0', text)
        assert re.search(r'stream_svm_partition_resets_total\{cause="beyond_end",'
                         r'partition="0",topic="[^"]+"\} 1\.0', text), text
        # The metadata catches up with the new topic id: partition 0 was read from the new
        # topic's beginning already, nothing is read twice.
        old_id = frozen[topic]
        hold.clear()
        assert wait_for(lambda: daemon.processor.topic_ids.get(topic) not in (None, old_id), 20)
        assert not wait_for(lambda: daemon.summary.messages > 26, 3), daemon.summary
        assert "topic_recreated" not in daemon.metrics.render().decode()
        assert daemon.processor.offsets == {f"{topic}:{p}": 2 for p in range(3)}
    finally:
        if daemon is not None:
            daemon.stop()
        if thread is not None:
            thread.join(timeout=60)
        embedded.stop()


def test_a_reset_whose_new_position_is_not_known_yet_does_not_end_the_daemon(tmp_path):
    """The partition lost its offsets while its topic is missing (the broker restarted empty,
    nobody recreated the topic yet): kafka-python's position() raises instead of answering. The
    reset once escaped the loop and ended the daemon's thread; now the partition waits for the
    topic, and whatever it then reads from its beginning is new to the model (nothing skipped)."""
    from kafka import TopicPartition
    from kafka.errors import UnknownTopicOrPartitionError

    config = _config("127.0.0.1:9", tmp_path, **{"kafka.on_partition_reset": "earliest"})
    tp = TopicPartition(config.kafka.input_topic, 0)
    name = f"{tp.topic}:0"

    class MissingTopicConsumer:
        def __init__(self) -> None:
            self.sought: list[Any] = []

        def assignment(self):
            return {tp}

        def highwater(self, partition):
            return 0

        def paused(self):
            return set()

        def seek_to_beginning(self, partition):
            self.sought.append(partition)

        def position(self, partition, timeout_ms=None):
            raise UnknownTopicOrPartitionError(partition.topic)

    daemon = Daemon(config)
    daemon._store = CheckpointStore(config.checkpoint.dir)
    daemon.processor = daemon._restore()
    daemon.processor.offsets[name] = 20
    daemon._consumer = consumer = MissingTopicConsumer()
    daemon._partition_reset(consumer, tp, "beyond_end", "the partition ends at 0")
    assert consumer.sought == [tp] and daemon.processor.offsets[name] == 0
    daemon._check_positions()
    daemon._update_lag()
    assert not daemon._drained()
    assert 'cause="beyond_end"' in daemon.metrics.render().decode()


def test_a_daemon_stopping_on_a_reset_does_not_say_it_reads_on(tmp_path, caplog):
    # After a reconnect to a broker that had lost its data, "partition ... no longer holds the
    # offsets ...: stopping" was followed by "topics checked after the reconnect: reading on".
    config = _config("127.0.0.1:9", tmp_path)

    class NoPartitions:
        def assignment(self):
            return set()

    for stopping in (True, False):
        daemon = Daemon(config)
        daemon._consumer = NoPartitions()
        daemon._check_topic_ids = lambda consumer: None
        daemon._check_new_partitions = lambda consumer: None
        daemon._stopped_on_reset = stopping
        daemon._verify_until, daemon._updates_at_close = time.monotonic() + 60, 0
        daemon._metadata_updates = 1  # metadata fetched since the lost connection
        caplog.clear()
        with caplog.at_level("INFO", logger="connectors.daemon"):
            daemon._check_positions()
        assert daemon._verify_until == 0.0
        assert ("reading on" in caplog.text) is not stopping


@pytest.mark.broker
def test_the_broker_removes_its_temporary_log_after_a_clean_stop_and_keeps_a_given_one(
        tmp_path):
    embedded = EmbeddedBroker(port=free_loopback_port(), start_timeout=20).start()
    temporary = embedded._log_path
    assert temporary is not None and temporary.exists()
    embedded.stop()
    assert not temporary.exists()  # runs of the demo and the tests leave nothing in $TMPDIR
    given = tmp_path / "broker.log"
    with EmbeddedBroker(port=free_loopback_port(), start_timeout=20, log_file=given):
        pass
    assert given.exists()  # a log the caller named is the caller's


@pytest.mark.broker
def test_a_broker_stopped_with_a_client_connected_is_killed_and_its_log_removed():
    """Tansu waits for its clients before it exits on SIGTERM: one stopped under a connected
    client is killed after stop_timeout, having run until stopped, and leaves no log."""
    from kafka import KafkaConsumer

    embedded = EmbeddedBroker(port=free_loopback_port(), start_timeout=20,
                              stop_timeout=1.0).start()
    temporary = embedded._log_path
    client = KafkaConsumer(bootstrap_servers=embedded.bootstrap_servers,
                           request_timeout_ms=5000)
    try:
        client.topics()  # connected
        embedded.stop()
    finally:
        client.close(autocommit=False)
    assert not temporary.exists()


@pytest.mark.broker
def test_the_broker_keeps_its_log_when_it_exited_by_itself():
    embedded = EmbeddedBroker(port=free_loopback_port(), start_timeout=20).start()
    temporary = embedded._log_path
    embedded.process.kill()  # it dies under its owner: the log is what tells why
    embedded.process.wait(timeout=10)
    embedded.stop()
    try:
        assert temporary.exists()
    finally:
        temporary.unlink()


@pytest.mark.broker
def test_a_missing_topic_is_not_reported_as_an_unreachable_broker(broker, tmp_path,  # noqa: F811
                                                                  caplog):
    config = _config(broker.bootstrap_servers, tmp_path, **{
        "kafka.create_topics": False, "kafka.request_timeout_ms": 1000,
        "retry.max_attempts": 2})
    with caplog.at_level("WARNING", logger="connectors.daemon"), \
            pytest.raises(DaemonError, match=r"starting on the broker at .* failed: giving up "
                                             r"after 2 attempts: topic .* \(kafka\.output_topic\) "
                                             r"does not exist, .* \(create it, or set kafka\."
                                             r"create_topics = true"):
        Daemon(config).run()
    assert "unreachable" not in caplog.text


def test_a_topic_the_daemon_did_not_create_is_waited_for_seconds_not_a_request_timeout(
        tmp_path):
    # A missing topic (kafka.create_topics = false) was named after request_timeout_ms, 30 s
    # per attempt by default; one the daemon has just created may take that long to show.
    from connectors.daemon import MISSING_TOPIC_SECONDS

    daemon = Daemon(_config("127.0.0.1:1", tmp_path, **{"kafka.create_topics": False,
                                                         "kafka.request_timeout_ms": 30_000}))
    assert daemon._missing_topic_wait(["in"]) == MISSING_TOPIC_SECONDS == 5.0
    daemon._created_topics.add("in")
    assert daemon._missing_topic_wait(["in"]) == 30.0


def test_a_missing_input_topic_is_waited_for_though_kafka_python_knows_it_as_empty(
        tmp_path, monkeypatch):
    # kafka-python 3 gives an empty set, not None, for a topic it does not know: the wait
    # ended at once, and a topic created by another tool a moment before was called missing.
    import connectors.daemon

    monkeypatch.setattr(connectors.daemon, "MISSING_TOPIC_SECONDS", 0.6)
    daemon = Daemon(_config("127.0.0.1:1", tmp_path, **{"kafka.create_topics": False}))

    class Consumer:
        asked = 0

        def topics(self):
            return set()

        def partitions_for_topic(self, topic):
            Consumer.asked += 1
            return {0} if Consumer.asked >= 3 else set()  # listed at the third look

    partitions = daemon._partitions(Consumer())
    assert [tp.partition for tp in partitions] == [0] and Consumer.asked == 3


@pytest.mark.broker
@pytest.mark.parametrize("missing", ["input_topic", "output_topic"])
def test_a_missing_topic_is_named_with_its_setting_when_the_daemon_creates_none(
        broker, tmp_path, missing):  # noqa: F811
    # Only the input was checked: the outputs went to a topic the broker created on the first
    # send, with its own partition count (or were lost on a broker that creates none). A
    # missing input named no setting.
    from kafka import KafkaConsumer

    config = _config(broker.bootstrap_servers, tmp_path, **{
        "kafka.create_topics": False, "kafka.request_timeout_ms": 1000,
        "retry.max_attempts": 1})
    topics = {"input_topic": config.kafka.input_topic,
              "output_topic": config.kafka.output_topic}
    ensure_topics({"bootstrap_servers": [broker.bootstrap_servers]},
                  [topic for name, topic in topics.items() if name != missing]
                  + [config.kafka.dead_letter_topic])
    with pytest.raises(DaemonError, match=rf"topic {topics[missing]} \(kafka\.{missing}\) "
                                          r"does not exist \(create it, or set "
                                          r"kafka\.create_topics = true"):
        Daemon(config, until_drained=True).run()
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap_servers)
    try:
        assert topics[missing] not in consumer.topics()  # (not created meanwhile)
    finally:
        consumer.close()


@pytest.mark.broker
def test_a_stop_ends_the_wait_for_a_missing_topic_at_once(broker, tmp_path):  # noqa: F811
    # The wait went on to kafka.request_timeout_ms, asking the broker for its metadata every
    # few milliseconds once the stop was set (166 requests in 17 s).
    config = _config(broker.bootstrap_servers, tmp_path, **{
        "kafka.create_topics": False, "kafka.request_timeout_ms": 20000})
    ensure_topics({"bootstrap_servers": [broker.bootstrap_servers]},
                  [config.kafka.input_topic, config.kafka.dead_letter_topic])
    daemon = Daemon(config)
    stopper = threading.Timer(2.0, daemon.stop)
    stopper.start()
    started = time.monotonic()
    try:
        daemon.run()
    except DaemonError:
        pass  # (the missing topic, named: the start was under way)
    finally:
        stopper.cancel()
    assert time.monotonic() - started < 10


@pytest.mark.broker
def test_a_window_read_from_several_partitions_is_warned_of(broker, tmp_path, caplog):  # noqa: F811
    config = _config(broker.bootstrap_servers, tmp_path, **{
        "model.type": "SlidingWindowSVC", "model.window_size": 50})
    ensure_topics({"bootstrap_servers": [broker.bootstrap_servers]},
                  [config.kafka.input_topic], partitions=3)
    with caplog.at_level("WARNING", logger="connectors.daemon"):
        Daemon(config, until_drained=True).run()
    assert (f"this daemon reads 3 partitions of {config.kafka.input_topic} into one "
            "SlidingWindowSVC, which depends on the order") in caplog.text


@pytest.mark.broker
def test_a_forget_of_an_unknown_id_from_several_partitions_says_the_order_may_be_why(
        broker, tmp_path):  # noqa: F811
    """One model over several partitions reads them in order only within each: a forget
    whose learn went to another partition may come first. Its dead letter says so, and how
    to keep an id's messages in order."""
    config = _config(broker.bootstrap_servers, tmp_path)
    kafka = config.kafka
    ensure_topics({"bootstrap_servers": [broker.bootstrap_servers]},
                  [kafka.input_topic, kafka.output_topic, kafka.dead_letter_topic], partitions=3)
    _produce_to(broker.bootstrap_servers, kafka.input_topic,
                [(0, _valid(1)), (2, {"op": "forget", "id": "v2"})])
    assert Daemon(config, until_drained=True).run() == 0
    (letter,) = read_all(broker.bootstrap_servers, kafka.dead_letter_topic)
    assert letter["reason"] == "unknown_id" and "model" not in letter
    assert letter["error"] == (
        f"forget of unknown id 'v2' (not in the model); this daemon reads 3 partitions of "
        f"{kafka.input_topic}, in order only within each: the id's learning message may be on "
        "another partition, not read yet. Send every message of an id with the same Kafka key "
        "(the id), which keeps them on one partition, in order")


@pytest.mark.broker
def test_the_embedded_broker_stops_when_its_owner_is_killed_outright(tmp_path):
    # A daemon (or a test run) killed by SIGKILL left its broker running for good.
    import socket
    import subprocess
    import sys

    owner = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time\n"
         "from connectors.broker import EmbeddedBroker\n"
         f"broker = EmbeddedBroker(start_timeout=20, log_file={str(tmp_path / 'b.log')!r})\n"
         "print(broker.start().port, broker.process.pid, flush=True)\n"
         "time.sleep(120)\n"],
        stdout=subprocess.PIPE, text=True)
    try:
        port, pid = map(int, owner.stdout.readline().split())
        owner.kill()
        owner.wait(timeout=10)

        def gone() -> bool:
            with socket.socket() as probe:
                return probe.connect_ex(("127.0.0.1", port)) != 0

        assert wait_for(gone, 15), "the broker outlived its owner"
    finally:
        owner.kill()
        owner.stdout.close()
    status = Path(f"/proc/{pid}/status")

    def ended() -> bool:  # reparented: a zombie until whoever adopted it reaps it
        try:
            return "State:\tZ" in status.read_text()
        except FileNotFoundError:
            return True

    assert wait_for(ended, 15)


def test_a_state_topic_recreated_under_a_keyed_group_is_refused_not_met_as_a_new_group(
        broker, tmp_path, caplog):  # noqa: F811
    """The state topic deleted and recreated while the group ran, with the input topic and
    the group's offsets intact: a daemon publishing meanwhile put some models' states into
    the new topic, but not the group's record. A daemon starting then took the group for a
    new one, and every other model started empty, silently."""
    from kafka.admin import KafkaAdminClient, NewTopic

    from connectors.state_store import StateStore

    servers = broker.bootstrap_servers
    config = _config(servers, tmp_path, **{
        "model.scope": "key", "kafka.state_topic": unique("hard-state"),
        "kafka.request_timeout_ms": 10000, "kafka.session_timeout_ms": 3000,
        "kafka.heartbeat_interval_ms": 300, "kafka.poll_timeout_ms": 50})
    kafka = config.kafka
    ensure_topics({"bootstrap_servers": servers},
                  [kafka.input_topic, kafka.output_topic, kafka.dead_letter_topic])
    keyed = [(_valid(i), f"k{i % 2}".encode()) for i in range(12)]
    by_message = {id(message): key for message, key in keyed}
    produce(servers, kafka.input_topic, [m for m, _ in keyed], key_of=lambda m: by_message[id(m)])
    assert Daemon(config, until_drained=True).run() == 0
    with StateStore(servers, kafka.state_topic, timeout=20) as store:
        states = store.restore()
    kept = next(m for m in states if m != ("group", None))
    admin = KafkaAdminClient(bootstrap_servers=servers, request_timeout_ms=10000)
    try:
        admin.delete_topics([kafka.state_topic])
        wait_for(lambda: kafka.state_topic not in admin.list_topics(), timeout=20)
        admin.create_topics([NewTopic(kafka.state_topic, 1, 1)])
    finally:
        admin.close()
    with StateStore(servers, kafka.state_topic, timeout=20) as store:
        state = states[kept]
        store.publish(kept, state.arrays, state.metadata, state.next_offset, state.epoch,
                      state.sequence)
    daemon = Daemon(config, until_drained=True)
    with pytest.raises(StartRefused, match=r"holds 1 model states but not the record"):
        daemon.run()
    assert daemon.summary.exit_code == 1 and daemon.summary.messages == 0
    assert committed(servers, kafka.group_id, kafka.input_topic) == 12
    # With --start-fresh: the model found continues, the other starts empty, and both are
    # said in the log.
    more = [(_valid(i), f"k{i % 2}".encode()) for i in (100, 101)]
    by_message.update({id(message): key for message, key in more})
    produce(servers, kafka.input_topic, [m for m, _ in more], key_of=lambda m: by_message[id(m)])
    config.checkpoint.start_fresh = True
    with caplog.at_level("WARNING", logger="connectors.scoped"):
        assert Daemon(config, until_drained=True).run() == 0
    assert "the models found are kept" in caplog.text
    with StateStore(servers, kafka.state_topic, timeout=20) as store:
        after = store.restore()
    assert ("group", None) in after and len(after) == 3
    other = next(m for m in after if m not in (kept, ("group", None)))
    assert after[kept].metadata["processor"]["updates"] == 7
    assert after[other].metadata["processor"]["updates"] == 1


def test_a_group_check_the_state_topic_did_not_answer_is_made_again_on_the_retry(
        broker, tmp_path, monkeypatch):  # noqa: F811
    """The state topic did not answer the group's check at start: the retry checks the group
    again (it went on with the models made, unchecked, and wrote no group record)."""
    from connectors.scoped import GROUP_RECORD_ID, ScopedModels
    from connectors.state_store import StateStore, StateStoreError

    config = _config(broker.bootstrap_servers, tmp_path, **{
        "model.scope": "key", "kafka.state_topic": unique("hard-state"),
        "kafka.session_timeout_ms": 3000, "kafka.heartbeat_interval_ms": 300})
    kafka = config.kafka
    ensure_topics({"bootstrap_servers": broker.bootstrap_servers},
                  [kafka.input_topic, kafka.output_topic, kafka.dead_letter_topic])
    produce(broker.bootstrap_servers, kafka.input_topic, [_valid(i) for i in range(3)],
            key_of=lambda message: b"k")
    checks = []
    check_group = ScopedModels.check_group

    def flaky(self, *args, **kwargs):
        checks.append(args)
        if len(checks) == 1:
            raise StateStoreError("the state topic did not answer (as the test makes it)")
        return check_group(self, *args, **kwargs)

    monkeypatch.setattr(ScopedModels, "check_group", flaky)
    assert Daemon(config, until_drained=True).run() == 0
    assert len(checks) == 2
    with StateStore(broker.bootstrap_servers, kafka.state_topic, timeout=20) as store:
        assert GROUP_RECORD_ID in store.restore()


@pytest.mark.parametrize("publish_state", [False, True])
def test_a_keyed_start_in_a_group_a_global_daemon_served_is_refused_and_writes_nothing(
        broker, tmp_path, caplog, publish_state):  # noqa: F811
    """A daemon of model.scope = "key" started by mistake in a group a global daemon serves:
    refused, and nothing written. Had it written the group's record on the state topic (as for
    a new group), the global daemon would have been refused at every start from then on."""
    servers = broker.bootstrap_servers
    config = _config(servers, tmp_path, **{
        "kafka.state_topic": unique("hard-state"), "kafka.publish_state": publish_state,
        "kafka.session_timeout_ms": 3000, "kafka.heartbeat_interval_ms": 300})
    kafka = config.kafka
    ensure_topics({"bootstrap_servers": servers},
                  [kafka.input_topic, kafka.output_topic, kafka.dead_letter_topic])
    produce(servers, kafka.input_topic, [_valid(i) for i in range(6)])
    assert Daemon(config, until_drained=True).run() == 0
    topics_before = _topics_on(servers)
    assert (kafka.state_topic in topics_before) == publish_state

    keyed = load_config(None, {"kafka.bootstrap_servers": servers,
                               "kafka.input_topic": kafka.input_topic,
                               "kafka.output_topic": kafka.output_topic,
                               "kafka.dead_letter_topic": kafka.dead_letter_topic,
                               "kafka.group_id": kafka.group_id,
                               "kafka.state_topic": kafka.state_topic,
                               "kafka.session_timeout_ms": 3000,
                               "kafka.heartbeat_interval_ms": 300,
                               "model.scope": "key", "model.C": MODEL["C"],
                               "model.gamma": MODEL["gamma"],
                               "checkpoint.dir": str(tmp_path / "keyed"),
                               "metrics.enabled": False}, environ={})
    mistaken = Daemon(keyed, until_drained=True)
    with pytest.raises(StartRefused, match=(
            rf"consumer group '{kafka.group_id}' has committed offsets .*holds no record of "
            rf"consumer group '{kafka.group_id}': a daemon of model.scope = \"global\".*Nothing "
            r"was changed\. Start the group with the scope that served it")):
        mistaken.run()
    assert mistaken.summary.messages == 0
    assert _topics_on(servers) == topics_before
    assert not (tmp_path / "keyed").exists()  # (its checkpoint.dir, made and removed)
    if publish_state:
        from connectors.scoped import GROUP_RECORD_ID
        from connectors.state_store import StateStore

        with StateStore(servers, kafka.state_topic, timeout=20) as store:
            assert GROUP_RECORD_ID not in store.restore()

    # The global daemon goes on from its checkpoint, as if nothing had happened.
    produce(servers, kafka.input_topic, [_valid(i) for i in range(6, 9)])
    assert Daemon(config, until_drained=True).run() == 0
    assert committed(servers, kafka.group_id, kafka.input_topic) == 9
    outputs = read_all(servers, kafka.output_topic)
    assert sorted(output["id"] for output in outputs) == [f"v{i}" for i in range(9)]
    if publish_state:  # asked for: new models from the committed offsets, said as it is
        keyed.checkpoint.start_fresh = True
        with caplog.at_level("WARNING", logger="connectors.scoped"):
            assert Daemon(keyed, until_drained=True).run() == 0
        assert "holds a global model's state, which no model of model.scope = 'key'" in \
            caplog.text
        assert "deleted and recreated" not in caplog.text


@pytest.mark.slow
def test_a_broker_restarted_empty_without_the_topic_is_waited_for_not_a_stop(tmp_path, caplog):
    # Tansu answers a fetch of a topic it no longer has with a high watermark of 0: the daemon
    # took that for lost offsets and stopped (exit 1), where the topic is missing and waited
    # for (the Operations table), and said "the partition ends at 0" of no partition at all.
    embedded = EmbeddedBroker(port=free_loopback_port(), start_timeout=20).start()
    daemon = None
    thread = None
    try:
        config = _config(embedded.bootstrap_servers, tmp_path, **{"kafka.poll_timeout_ms": 50})
        embedded, daemon, thread = _serve_then_restart_the_broker(embedded, config)
        with caplog.at_level("INFO", logger="connectors.daemon"):
            assert wait_for(lambda: "does not exist on the broker (any more)" in caplog.text,
                            60), caplog.text
            # It keeps waiting: polls for 5 s more after the reconnect, still running,
            # nothing reset (the stop came 4-7 s after the reconnect).
            assert wait_for(lambda: b"stream_svm_connected 1.0" in daemon.metrics.render(), 30)
            time.sleep(5.0)
        assert thread.is_alive() and daemon.summary.exit_code == 0
        assert "no longer holds the offsets" not in caplog.text
        assert b"stream_svm_partition_resets_total{" not in daemon.metrics.render()
    finally:
        if daemon is not None:
            daemon.stop()
        if thread is not None:
            thread.join(timeout=60)
        embedded.stop()


@pytest.mark.parametrize("mistake", ["checkpoints_gone", "global_on_a_keyed_group",
                                     "keyed_on_a_global_group"])
def test_a_refused_start_creates_no_topic(broker, tmp_path, mistake):  # noqa: F811
    """kafka.create_topics (the default) creates what is missing only once every check that
    may refuse the start has passed: a refused start had created its label, output and
    dead-letter topics first, and left them behind."""
    from connectors.scoped import GROUP_RECORD_ID
    from connectors.state_store import StateStore

    servers = broker.bootstrap_servers
    config = _config(servers, tmp_path, **{
        "kafka.state_topic": unique("hard-state"),
        "kafka.session_timeout_ms": 3000, "kafka.heartbeat_interval_ms": 300})
    kafka = config.kafka
    if mistake == "global_on_a_keyed_group":
        ensure_topics({"bootstrap_servers": servers}, [kafka.input_topic])
        with StateStore(servers, kafka.state_topic, timeout=20) as store:
            store.ensure_topic()
            store.publish(GROUP_RECORD_ID, {}, {"format": 1, "scope": "key", "partitions": 1},
                          0, 0, 1)
    else:  # a global daemon served the group and committed
        ensure_topics({"bootstrap_servers": servers}, [kafka.input_topic])
        produce(servers, kafka.input_topic, [_valid(i) for i in range(4)])
        assert Daemon(config, until_drained=True).run() == 0
    before = _topics_on(servers)

    settings = {"kafka.label_topic": unique("hard-labels"),
                "kafka.output_topic": unique("hard-output"),
                "kafka.dead_letter_topic": unique("hard-dead")}
    if mistake == "checkpoints_gone":
        settings["checkpoint.dir"] = str(tmp_path / "elsewhere")
    if mistake == "keyed_on_a_global_group":
        settings["model.scope"] = "key"
    mistaken = load_config(None, {
        **{name: getattr(kafka, name.split(".")[1]) for name in (
            "kafka.bootstrap_servers", "kafka.input_topic", "kafka.group_id",
            "kafka.state_topic", "kafka.session_timeout_ms", "kafka.heartbeat_interval_ms")},
        "model.C": MODEL["C"], "model.gamma": MODEL["gamma"], "metrics.enabled": False,
        "checkpoint.dir": config.checkpoint.dir, **settings}, environ={})
    refusal = {"checkpoints_gone": "holds no checkpoint, but the consumer group",
               "global_on_a_keyed_group": "serves one model per key",
               "keyed_on_a_global_group": "has committed offsets"}[mistake]
    with pytest.raises(StartRefused, match=refusal):
        Daemon(mistaken, until_drained=True).run()
    assert _topics_on(servers) == before


def test_a_label_topic_a_keyed_start_would_create_with_another_partition_count_is_not_made(
        broker, tmp_path):  # noqa: F811
    """model.scope = "key" needs the label topic to have the input topic's partition count:
    a missing one created with kafka.topic_partitions (1) beside a 2-partition input topic
    refused the start, and that label topic was there for good (refused at every start until
    someone deleted it). Now nothing is created; with the count set, the start goes on."""
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic

    servers = broker.bootstrap_servers
    config = _config(servers, tmp_path, **{
        "model.scope": "key", "kafka.label_topic": unique("hard-labels"),
        "kafka.state_topic": unique("hard-state"),
        "kafka.session_timeout_ms": 3000, "kafka.heartbeat_interval_ms": 300})
    kafka = config.kafka
    admin = KafkaAdminClient(bootstrap_servers=servers)
    try:
        admin.create_topics([NewTopic(kafka.input_topic, 2, 1)])
    finally:
        admin.close()
    before = _topics_on(servers)
    with pytest.raises(StartRefused, match=(
            rf"but they have \{{'{kafka.input_topic}': 2, '{kafka.label_topic}': 1\}} "
            rf"\({kafka.label_topic} missing: it would be created with "
            r"kafka.topic_partitions = 1; set that to the other topic's count, or create the "
            r"topic so\)\. Nothing was changed\.")):
        Daemon(config, until_drained=True).run()
    assert _topics_on(servers) == before

    config.kafka.topic_partitions = 2
    produce(servers, kafka.input_topic, [_valid(i) for i in range(3)],
            key_of=lambda message: message["id"].encode())
    assert Daemon(config, until_drained=True).run() == 0
    assert len(read_all(servers, kafka.output_topic, expected=3)) == 3
    admin = KafkaAdminClient(bootstrap_servers=servers)
    try:
        [label] = admin.describe_topics([kafka.label_topic])
    finally:
        admin.close()
    assert len(label["partitions"]) == 2


def _keyed_config(servers: str, tmp_path, group: str, state_topic: str, **extra: Any):
    names = {k: unique(f"hard-{k}") for k in ("input", "output", "dead")}
    return load_config(None, {
        "kafka.bootstrap_servers": servers, "kafka.input_topic": names["input"],
        "kafka.output_topic": names["output"], "kafka.dead_letter_topic": names["dead"],
        "kafka.group_id": group, "kafka.state_topic": state_topic,
        "kafka.session_timeout_ms": 3000, "kafka.heartbeat_interval_ms": 300,
        "model.scope": "key", "model.C": MODEL["C"], "model.gamma": MODEL["gamma"],
        "checkpoint.dir": str(tmp_path / group), "metrics.enabled": False, **extra},
        environ={})


@pytest.mark.parametrize("start_fresh", [False, True])
def test_a_keyed_group_on_a_state_topic_another_groups_global_model_publishes_to_is_refused(
        broker, tmp_path, start_fresh):  # noqa: F811
    """Two groups given one kafka.state_topic by mistake: a global learner of one publishes,
    and a keyed start of the other is refused naming the group that published (it was told
    a global daemon may have served its own group), with --start-fresh too (it went on, wrote
    its record beside the other group's model, and that group's learner was refused from
    then on), and nothing is written."""
    from connectors.scoped import GROUP_RECORD_ID
    from connectors.state_store import StateStore

    servers = broker.bootstrap_servers
    shared = unique("hard-shared-state")
    publisher = _config(servers, tmp_path, **{"kafka.state_topic": shared,
                                              "kafka.publish_state": True})
    ensure_topics({"bootstrap_servers": servers}, [publisher.kafka.input_topic])
    produce(servers, publisher.kafka.input_topic, [_valid(i) for i in range(4)])
    assert Daemon(publisher, until_drained=True).run() == 0

    keyed = _keyed_config(servers, tmp_path, unique("hard-keyed"), shared,
                          **{"checkpoint.start_fresh": start_fresh})
    ensure_topics({"bootstrap_servers": servers}, [keyed.kafka.input_topic])
    with pytest.raises(StartRefused, match=(
            rf"the state topic {shared} holds the global model's state of consumer group "
            rf"'{publisher.kafka.group_id}' .*: consumer group '{publisher.kafka.group_id}' "
            rf"shares this state topic .*Nothing was changed\. Give group "
            rf"'{keyed.kafka.group_id}' its own kafka.state_topic")):
        Daemon(keyed, until_drained=True).run()
    with StateStore(servers, shared, timeout=20) as store:
        assert GROUP_RECORD_ID not in store.restore()
    # The publishing learner goes on.
    produce(servers, publisher.kafka.input_topic, [_valid(i) for i in range(4, 6)])
    assert Daemon(publisher, until_drained=True).run() == 0
    assert committed(servers, publisher.kafka.group_id, publisher.kafka.input_topic) == 6


@pytest.mark.parametrize("publish_state", [False, True])
def test_a_global_learner_on_another_keyed_groups_state_topic(
        broker, tmp_path, publish_state):  # noqa: F811
    """The state topic holds the record of another group's per-key models: a global learner
    that publishes nothing there starts (it was refused as if its own group served per-key
    models); one that would publish among them is refused, naming that group."""
    servers = broker.bootstrap_servers
    shared = unique("hard-shared-state")
    keyed = _keyed_config(servers, tmp_path, unique("hard-keyed"), shared)
    ensure_topics({"bootstrap_servers": servers}, [keyed.kafka.input_topic])
    produce(servers, keyed.kafka.input_topic, [_valid(i) for i in range(3)],
            key_of=lambda message: message["id"].encode())
    assert Daemon(keyed, until_drained=True).run() == 0  # (writes its group's record)

    config = _config(servers, tmp_path, **{"kafka.state_topic": shared,
                                           "kafka.publish_state": publish_state})
    ensure_topics({"bootstrap_servers": servers}, [config.kafka.input_topic])
    produce(servers, config.kafka.input_topic, [_valid(i) for i in range(3)])
    if not publish_state:
        assert Daemon(config, until_drained=True).run() == 0
        assert len(read_all(servers, config.kafka.output_topic, expected=3)) == 3
        return
    with pytest.raises(StartRefused, match=(
            rf"the state topic {shared} \(kafka.state_topic\) holds the record of consumer "
            rf"group '{keyed.kafka.group_id}', whose models are per key: this daemon of group "
            rf"'{config.kafka.group_id}' would publish its global model's state among them\. "
            r"Nothing was changed\. Give it its own kafka.state_topic")):
        Daemon(config, until_drained=True).run()
    assert committed(servers, config.kafka.group_id, config.kafka.input_topic) is None


def test_a_keyed_start_counts_an_input_topic_a_producer_created_meanwhile(
        broker, tmp_path, monkeypatch):  # noqa: F811
    """The input topic is missing at the start, and a producer creates it (3 partitions)
    before the daemon does: the group's record gets the topic's real count. It was given
    kafka.topic_partitions (1), assumed before the topic existed, and every start of the
    group was refused from then on."""
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic

    from connectors.scoped import GROUP_RECORD_ID
    from connectors.state_store import StateStore

    servers = broker.bootstrap_servers
    config = _config(servers, tmp_path, **{
        "model.scope": "key", "kafka.state_topic": unique("hard-state"),
        "kafka.session_timeout_ms": 3000, "kafka.heartbeat_interval_ms": 300})
    kafka = config.kafka
    create_topics = Daemon._create_topics

    def a_producer_first(self, client, topics):
        if kafka.input_topic in topics:
            admin = KafkaAdminClient(bootstrap_servers=servers)
            try:
                admin.create_topics([NewTopic(kafka.input_topic, 3, 1)])
            finally:
                admin.close()
        return create_topics(self, client, topics)

    monkeypatch.setattr(Daemon, "_create_topics", a_producer_first)
    assert Daemon(config, until_drained=True).run() == 0
    with StateStore(servers, kafka.state_topic, timeout=20) as store:
        record = store.restore([GROUP_RECORD_ID])[GROUP_RECORD_ID]
    assert record.metadata["partitions"] == 3
    monkeypatch.undo()
    produce(servers, kafka.input_topic, [_valid(i) for i in range(4)],
            key_of=lambda message: message["id"].encode())
    assert Daemon(config, until_drained=True).run() == 0  # (refused for good, before)
    assert len(read_all(servers, kafka.output_topic, expected=4)) == 4
