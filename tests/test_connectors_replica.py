"""Prediction replicas: a learner publishes its model on the state topic at every checkpoint, a
predictor in its own consumer group answers the input topic with the newest published model,
swaps in newer ones while it runs, and never changes the model.

The broker tests run the daemons in threads on the embedded broker; the decision values of a
predictor are compared with the model rebuilt in this process from the state it served."""

from __future__ import annotations

import itertools
import logging
import shutil
import threading
import time
from typing import Any

import numpy as np
import pandas as pd
import pytest

from connectors.cli import _config as config_of_flags
from connectors.cli import build_parser, main
from connectors.config import ConfigError, load_config
from connectors.daemon import Daemon, DaemonError, StartRefused, ensure_topics
from connectors.metrics import Metrics
from connectors.models import build_model, restore_model
from connectors.processor import Processor, Record
from connectors.replica import GLOBAL_MODEL_ID, generation, state_of
from connectors.sources import iter_source
from connectors.state_store import StaleEpochError, StateStore, StateStoreError
from tests.connectors_helpers import broker, produce, read_all, unique, wait_for  # noqa: F401

MODEL = {"model.C": 1.0, "model.gamma": 0.5}
#: Bananas (River's, shipped in its wheel): the demo's data.
BANANAS = list(itertools.islice(iter_source("bananas"), 200))


def _labelled(first: int, count: int) -> list[dict[str, Any]]:
    return [{"id": i, "x": x, "y": y} for i, (x, y) in enumerate(BANANAS[first:first + count],
                                                                  start=first)]


def _probes(count: int, prefix: str) -> list[dict[str, Any]]:
    """Unlabelled points (the last ones of the sample): predicted, never learned."""
    return [{"id": f"{prefix}{i}", "x": x} for i, (x, _) in enumerate(BANANAS[-count:])]


# -- settings (no broker) ----------------------------------------------------------------------


def test_defaults_leave_a_learner_as_it_was():
    config = load_config(None, environ={})
    assert config.daemon.role == "learner" and config.kafka.publish_state is False
    assert config.kafka.state_topic == "stream-svm.state"  # "<group_id>.state"
    assert load_config(None, {"kafka.group_id": "g7"}, {}).kafka.state_topic == "g7.state"


def test_a_predictor_needs_its_learners_state_topic_set_explicitly(capsys):
    assert main(["serve", "--role", "predictor", "--bootstrap-servers", "k:9092"]) == 2
    assert "kafka.state_topic set explicitly" in capsys.readouterr().err
    settings = {"daemon.role": "predictor", "kafka.bootstrap_servers": "k:9092",
                "kafka.group_id": "replica-1"}
    with pytest.raises(ConfigError, match=r"kafka\.state_topic set explicitly"):
        load_config(None, settings, {})
    config = load_config(None, settings, {"STREAM_SVM_KAFKA_STATE_TOPIC": "learner.state"})
    assert config.kafka.state_topic == "learner.state"
    args = build_parser().parse_args(["serve", "--role", "predictor", "--bootstrap-servers",
                                      "k:9092", "--state-topic", "learner.state"])
    assert config_of_flags(args).daemon.role == "predictor"
    # The learner's group under the predictor: its default state topic gives it away.
    with pytest.raises(ConfigError, match=r"give the predictor a group_id of its own"):
        load_config(None, {**settings, "kafka.group_id": "learner"},
                    {"STREAM_SVM_KAFKA_STATE_TOPIC": "learner.state"})


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"daemon.role": "replica"}, r"daemon\.role.*must be one of learner, predictor"),
        ({"daemon.role": "predictor", "kafka.bootstrap_servers": "k:1",
          "kafka.state_topic": "s", "predictor.refresh_seconds": "0"},
         r"predictor\.refresh_seconds.*must be > 0"),
        ({"daemon.role": "predictor", "kafka.bootstrap_servers": "k:1",
          "kafka.state_topic": "s", "predictor.refresh_seconds": "-1"},
         r"predictor\.refresh_seconds.*must be > 0"),
        ({"daemon.role": "predictor", "kafka.bootstrap_servers": "k:1",
          "kafka.state_topic": "s", "predictor.refresh_seconds": "soon"},
         r"predictor\.refresh_seconds.*not a valid float"),
        ({"predictor.refresh_seconds": "2"}, r"predictor\.refresh_seconds needs daemon\.role"),
        ({"daemon.role": "predictor", "kafka.bootstrap_servers": "k:1",
          "kafka.state_topic": "s", "kafka.publish_state": "true"}, r"kafka\.publish_state"),
        ({"daemon.role": "predictor", "kafka.state_topic": "s"}, r"kafka\.bootstrap_servers"),
        ({"kafka.publish_state": "true", "kafka.state_topic": "stream-svm.input"},
         r"kafka\.state_topic: topic 'stream-svm\.input' is already used"),
        ({"kafka.publish_state": "true", "kafka.group_id": "a group"},
         r"kafka\.state_topic \(default"),
        ({"kafka.publish_state": "maybe"}, r"kafka\.publish_state"),
    ],
)
def test_invalid_replica_settings_fail_naming_the_setting(settings, named):
    with pytest.raises(ConfigError, match=named):
        load_config(None, settings, {})


# -- a processor that never learns (no broker) -------------------------------------------------


def _records(messages: list[Any], topic: str = "in") -> list[Record]:
    import json

    return [Record(topic, 0, offset, json.dumps(m).encode(), 0)
            for offset, m in enumerate(messages)]


def test_a_predictor_processor_answers_everything_and_changes_nothing():
    trained = build_model(load_config(None, {"model.gamma": "0.5"}, {}))
    for i, (x, y) in enumerate(BANANAS[:30]):
        trained.learn_one(x, y, key=i)
    processor = Processor(trained, learns=False, metrics=Metrics())
    processor.updates, processor.generation = 30, "4.2"
    grid = pd.DataFrame([x for x, _ in BANANAS[100:150]])
    before = trained.decision_function_many(grid)
    messages = [
        *_labelled(30, 40),
        {"id": 3, "y": True}, {"op": "forget", "id": 3}, {"op": "relabel", "id": 5, "y": True},
        {"id": 0, "x": BANANAS[0][0], "y": BANANAS[0][1]},  # learned by the learner: no duplicate
        {"id": "bad", "x": {"1": "high"}},
    ]
    result = processor.process(_records(messages))
    assert len(result.outputs) + len(result.dead_letters) == len(messages)
    assert [o.record["id"] for o in result.outputs] == [*range(30, 70), 0]
    for output in result.outputs:
        assert output.record["learned"] is False and output.record["model_generation"] == "4.2"
        assert output.record["model_updates"] == 30
    reasons = [(d.record["source"]["offset"], d.record["reason"]) for d in result.dead_letters]
    assert reasons == [(40, "unsupported"), (41, "unsupported"), (42, "unsupported"),
                       (44, "malformed")]
    assert "predictor" in result.dead_letters[0].record["error"]
    np.testing.assert_array_equal(trained.decision_function_many(grid), before)
    assert trained.n_stored == 30 and processor.updates == 30 and len(processor.cache) == 0


def test_a_predictor_says_when_a_newer_state_holds_fewer_updates(caplog):
    # It swapped a model of 30 updates for one of 10 (a learner restarted from an older
    # checkpoint, or a new model) with one INFO line, "serving model generation ...".
    config = _predictor_settings()
    daemon = Daemon(config)
    serving = Processor(build_model(config), learns=False, metrics=Metrics())
    serving.updates, serving.generation = 30, "1.4"
    daemon.processor = serving
    fresh = Processor(build_model(config), learns=False, metrics=Metrics())
    fresh.updates, fresh.generation = 10, "2.1"

    class _Follower:
        taken = ((2, 1), 1)

        def take(self) -> Processor | None:
            return fresh

    daemon._follower = _Follower()
    with caplog.at_level(logging.WARNING, logger="connectors.daemon"):
        daemon._swap_model()
    assert daemon.processor is fresh
    assert ("model generation 2.1 has 10 model updates, fewer than the 30 of generation 1.4 "
            "it replaces: its learner restarted from an older model or a new one") in caplog.text
    caplog.clear()
    more = Processor(build_model(config), learns=False, metrics=Metrics())
    more.updates, more.generation = 12, "2.2"
    fresh = more
    with caplog.at_level(logging.WARNING, logger="connectors.daemon"):
        daemon._swap_model()
    assert daemon.processor is more and not caplog.text


def _predictor_settings():
    return load_config(None, {
        "daemon.role": "predictor", "kafka.bootstrap_servers": "127.0.0.1:9",
        "kafka.state_topic": "learner.state", "kafka.group_id": "predictor",
        "metrics.enabled": False}, environ={})


class _FailingStore:
    """Stands for the state store: every publish raises ``error``."""

    topic = "learner.state"

    def __init__(self, error: Exception) -> None:
        self.error = error

    def publish(self, *args: Any, **kwargs: Any) -> int:
        raise self.error

    def last_sequence(self, model_id: Any, epoch: int) -> int:
        return -1  # nothing was written whole

    def close(self) -> None:
        pass

    def ensure_topic(self, partitions: int = 1) -> bool:
        return False  # the topic is there: the failure is the broker's


class _AfterwardsFailingStore(_FailingStore):
    """Writes every state whole; then its first publish fails while tombstoning older records
    (``where="tidy"``) or its first read-back fails (``where="read"``)."""

    def __init__(self, where: str) -> None:
        super().__init__(StateStoreError("reading to the end did not finish within 5 s"))
        self.where, self.sequences, self.complete = where, [], -1

    def publish(self, model_id: Any, arrays: Any, metadata: Any, next_offset: int, epoch: int,
                sequence: int) -> int:
        if sequence <= self.complete:
            raise ValueError(f"epoch {epoch} already has sequence {self.complete}; sequences "
                             "must grow within an epoch")
        self.sequences.append(sequence)
        self.complete = sequence
        if self.where == "tidy" and len(self.sequences) == 1:
            raise self.error
        return 10 * sequence

    def last_sequence(self, model_id: Any, epoch: int) -> int:
        return self.complete

    def newest_epoch(self, model_id: Any, through_offset: int) -> int:
        if self.where == "read" and len(self.sequences) == 1:
            raise self.error
        return 2


@pytest.mark.parametrize("where", ["tidy", "read"])
def test_a_publish_whose_state_was_written_whole_counts_even_if_what_follows_fails(where):
    # The store had the sequence written whole, the learner took the publish for failed and
    # reused its sequence: every later publish was refused ("sequences must grow within an
    # epoch") and the predictors served that state for the rest of the run.
    config = load_config(None, {"kafka.publish_state": "true", "metrics.enabled": "false"}, {})
    daemon = Daemon(config)
    daemon.processor = Processor(build_model(config), metrics=daemon.metrics)
    store = _AfterwardsFailingStore(where)
    daemon._state_store, daemon._epoch, daemon._sequence = store, 2, 0  # type: ignore[assignment]
    publish = daemon.metrics.replica[1]
    for offset in (5, 9, 14):
        daemon.processor.offsets = {"in:0": offset}
        daemon._publish()
    assert store.sequences == [1, 2, 3] and daemon._sequence == 3
    assert publish.labels(outcome="published")._value.get() == 3
    assert publish.labels(outcome="failed")._value.get() == 0
    assert daemon.processor.generation == "2.3" and not daemon.stop_event.is_set()
    # A sequence the topic has already (refused before anything is sent) is not taken again.
    store.complete = 7
    for offset in (20, 25):
        daemon.processor.offsets = {"in:0": offset}
        daemon._publish()
    assert publish.labels(outcome="failed")._value.get() == 1
    assert store.sequences == [1, 2, 3, 8] and daemon.processor.generation == "2.8"


@pytest.mark.parametrize(
    ("error", "outcome", "exit_code"),
    [(StateStoreError("broker gone"), "failed", 0),
     (StaleEpochError("model has epoch 3"), "stale", 1)],
)
def test_a_failed_publish_goes_on_and_a_newer_learner_stops_this_one(error, outcome, exit_code):
    config = load_config(None, {"kafka.publish_state": "true", "metrics.enabled": "false"}, {})
    daemon = Daemon(config)
    daemon.processor = Processor(build_model(config), metrics=daemon.metrics)
    daemon.processor.offsets = {"in:0": 5}
    daemon._state_store, daemon._epoch = _FailingStore(error), 2  # type: ignore[assignment]
    daemon._publish()
    publish = daemon.metrics.replica[1]
    assert publish.labels(outcome=outcome)._value.get() == 1
    assert publish.labels(outcome="published")._value.get() == 0
    assert daemon.summary.exit_code == exit_code
    assert daemon.stop_event.is_set() == bool(exit_code)
    # Nothing more arrives: a failed publish is tried again after checkpoint.every_seconds all
    # the same; a stopped learner publishes nothing more.
    daemon._store = object()  # type: ignore[assignment]  # a learner has its checkpoints
    daemon._maybe_checkpoint()
    assert publish.labels(outcome=outcome)._value.get() == 1  # not due yet
    daemon._last_publish -= config.checkpoint.every_seconds
    daemon._maybe_checkpoint()
    assert publish.labels(outcome=outcome)._value.get() == (1 if exit_code else 2)
    # A stop tries once more; still failing, it is not a clean stop (it was exit 0, and the
    # predictors served an older model until the next run).
    daemon._started = time.monotonic()
    daemon._shutdown()
    assert publish.labels(outcome=outcome)._value.get() == (1 if exit_code else 3)
    assert daemon.summary.exit_code == 1


# -- on the broker -----------------------------------------------------------------------------


def _topics() -> dict[str, str]:
    return {name: unique(f"replica-{name}") for name in
            ("input", "learner-out", "learner-dead", "predictor-out", "predictor-dead", "state")}


def _learner(broker, tmp_path, topics, **extra):  # noqa: F811
    # (Made before the tests produce to it: the producer's first send has the broker create a
    # missing topic with its own partition count, while the daemon starting beside it would.)
    ensure_topics({"bootstrap_servers": broker.bootstrap_servers}, [topics["input"]])
    return load_config(None, {
        "kafka.bootstrap_servers": broker.bootstrap_servers,
        "kafka.input_topic": topics["input"],
        "kafka.output_topic": topics["learner-out"],
        "kafka.dead_letter_topic": topics["learner-dead"],
        "kafka.group_id": unique("learner"),
        "kafka.state_topic": topics["state"],
        "kafka.publish_state": True,
        "kafka.max_batch": 16,
        "kafka.request_timeout_ms": 10000,
        "checkpoint.dir": str(tmp_path / "learner"),
        "checkpoint.every_seconds": 3600.0,
        "metrics.enabled": False,
        **MODEL,
        **extra,
    }, environ={})


def _predictor(broker, topics, **extra):  # noqa: F811
    return load_config(None, {
        "daemon.role": "predictor",
        "kafka.bootstrap_servers": broker.bootstrap_servers,
        "kafka.input_topic": topics["input"],
        "kafka.output_topic": topics["predictor-out"],
        "kafka.dead_letter_topic": topics["predictor-dead"],
        "kafka.group_id": unique("predictor"),
        "kafka.state_topic": topics["state"],
        "kafka.request_timeout_ms": 10000,
        "predictor.refresh_seconds": 0.25,
        "predictor.max_wait_seconds": 30.0,
        "metrics.enabled": False,
        **MODEL,
        **extra,
    }, environ={})


class _Running:
    """A daemon in a thread, stopped and joined on exit."""

    def __init__(self, config) -> None:
        self.daemon = Daemon(config)
        self.thread = threading.Thread(target=self.daemon.run, daemon=True)

    def __enter__(self) -> Daemon:
        self.thread.start()
        return self.daemon

    def __exit__(self, *exc_info: object) -> None:
        self.daemon.stop()
        self.thread.join(timeout=60)
        assert not self.thread.is_alive()


def _published(servers: str, config) -> tuple[Any, Any]:
    """(the newest state on the state topic, its model rebuilt here)."""
    with StateStore(servers, config.kafka.state_topic, timeout=10) as store:
        state = store.restore([GLOBAL_MODEL_ID])[GLOBAL_MODEL_ID]
    return state, restore_model(config, state.arrays, state.metadata["model_meta"])


def _scores(outputs: list[dict[str, Any]]) -> np.ndarray:
    return np.array([o["score"] for o in outputs])


def _frame(messages: list[dict[str, Any]]) -> pd.DataFrame:
    return pd.DataFrame([m["x"] for m in messages])


@pytest.mark.broker
def test_a_predictor_serves_the_published_model_and_follows_newer_ones(
        broker, tmp_path):  # noqa: F811
    servers = broker.bootstrap_servers
    topics = _topics()
    # A checkpoint, and so a state, every 60 messages: after the first 60 and the next 60.
    learner_config = _learner(broker, tmp_path, topics, **{"checkpoint.every_messages": 60})
    first, second = _labelled(0, 60), _labelled(60, 60)
    with _Running(learner_config) as learner:
        produce(servers, topics["input"], first)
        assert wait_for(lambda: learner._sequence == 1, 30)
        epoch = learner._epoch
        state, model = _published(servers, learner_config)
        assert (state.epoch, state.sequence) == (epoch, 1)
        assert state.metadata["updates"] == 60 and model.n_stored == 60
        assert state.next_offset == 60

        with _Running(_predictor(broker, topics)) as predictor:
            # It answers the whole topic from its beginning with the state's model.
            answers = read_all(servers, topics["predictor-out"], 60)
            assert [a["id"] for a in answers] == list(range(60))
            assert {a["model_generation"] for a in answers} == {generation(epoch, 1)}
            assert {a["model_updates"] for a in answers} == {60}
            assert not any(a["learned"] for a in answers)
            np.testing.assert_allclose(_scores(answers), model.decision_function_many(
                _frame(first)), rtol=0, atol=1e-12)

            # The learner learns 60 more and publishes again: the predictor follows, without a
            # restart (at its next refresh; how soon is not asserted: the machine is shared).
            produce(servers, topics["input"], second)
            assert wait_for(lambda: learner._sequence == 2, 30)
            assert wait_for(lambda: predictor.processor.generation == generation(epoch, 2), 30)
            newer_state, newer = _published(servers, learner_config)
            assert (newer_state.epoch, newer_state.sequence) == (epoch, 2)
            assert newer.n_stored == 120

            probes = _probes(20, "p")
            produce(servers, topics["input"], probes)
            answers = read_all(servers, topics["predictor-out"], 140)
            assert len(answers) == 140  # every input answered once
            last = answers[-20:]
            assert [a["id"] for a in last] == [p["id"] for p in probes]
            assert {a["model_generation"] for a in last} == {generation(epoch, 2)}
            np.testing.assert_allclose(_scores(last), newer.decision_function_many(
                _frame(probes)), rtol=0, atol=1e-12)
            assert predictor.metrics.replica[0]._value.get() == 2
    # The learner answered the probes with the same model (nothing learned since state 2), and
    # said so.
    learned = read_all(servers, topics["learner-out"], 140)
    mine = learned[-20:]
    assert {a["model_generation"] for a in mine} == {generation(epoch, 2)}
    assert {a["model_updates"] for a in mine} == {120}
    np.testing.assert_allclose(_scores(mine), _scores(last), rtol=0, atol=1e-12)
    assert learner.summary.exit_code == 0 and predictor.summary.exit_code == 0


@pytest.mark.broker
def test_a_predictor_waits_for_a_state_and_never_changes_the_model(
        broker, tmp_path):  # noqa: F811
    servers = broker.bootstrap_servers
    topics = _topics()
    learner_config = _learner(broker, tmp_path, topics, **{"checkpoint.every_messages": 1000})
    trained = _labelled(0, 40)
    # One partition each (the broker would make more for a topic that a producer creates).
    ensure_topics({"bootstrap_servers": servers}, [topics["input"], topics["predictor-out"]])
    produce(servers, topics["input"], trained)
    probes = _probes(10, "q")
    extra = [
        *_labelled(40, 30),
        {"id": 41, "y": True},  # a late label
        {"op": "forget", "id": 3},
        {"op": "relabel", "id": 5, "y": not BANANAS[5][1]},
        *probes,
    ]
    predictor_config = _predictor(broker, topics, **{
        "checkpoint.dir": str(tmp_path / "predictor")})
    with _Running(predictor_config) as predictor:
        # No state yet: it answers nothing (the input waits in Kafka) and says so.
        assert wait_for(lambda: predictor._follower is not None, 10)
        time.sleep(1.0)  # four refresh periods
        assert predictor.processor is None and predictor._consumer is None
        assert predictor.metrics.replica[0]._value.get() == 0
        assert read_all(servers, topics["predictor-out"], idle=0.5) == []

        learner = Daemon(learner_config, until_drained=True)
        assert learner.run() == 0  # publishes once, at its stop
        state, model = _published(servers, learner_config)
        assert state.sequence == 1 and model.n_stored == 40
        served = generation(state.epoch, 1)
        answers = read_all(servers, topics["predictor-out"], 40)
        assert [a["id"] for a in answers] == list(range(40))

        # Labels, forgets and relabels while the learner is away: the predictor changes
        # nothing (and publishes nothing).
        produce(servers, topics["input"], extra)
        answers = read_all(servers, topics["predictor-out"], 40 + 30 + 10)
        dead = read_all(servers, topics["predictor-dead"], 3)
    # Every input has exactly one outcome.
    offsets = sorted([a["source"]["offset"] for a in answers]
                     + [d["source"]["offset"] for d in dead])
    assert offsets == list(range(len(trained) + len(extra)))
    assert {a["model_generation"] for a in answers} == {served}
    assert not any(a["learned"] for a in answers)
    assert [d["reason"] for d in dead] == ["unsupported"] * 3
    # The labels it saw changed nothing: the probes get the published model's answers.
    np.testing.assert_allclose(_scores(answers[-10:]), model.decision_function_many(
        _frame(probes)), rtol=0, atol=1e-12)
    assert predictor.processor.model.n_stored == 40 and predictor.processor.updates == 40
    assert predictor.summary.exit_code == 0
    assert not (tmp_path / "predictor").exists()  # it writes no checkpoint
    again, _ = _published(servers, learner_config)
    assert (again.epoch, again.sequence) == (state.epoch, 1)


@pytest.mark.broker
def test_a_predictor_without_any_state_stops_after_max_wait(broker):  # noqa: F811
    topics = _topics()
    config = _predictor(broker, topics, **{"predictor.max_wait_seconds": 1.0})
    daemon = Daemon(config)
    started = time.monotonic()
    with pytest.raises(DaemonError, match=r"no state .* after 1 s"):
        daemon.run()
    assert time.monotonic() - started < 10
    assert daemon._consumer is None  # it consumed nothing


@pytest.mark.broker
def test_a_learner_stops_when_another_learner_takes_the_model_over(
        broker, tmp_path):  # noqa: F811
    servers = broker.bootstrap_servers
    topics = _topics()
    config = _learner(broker, tmp_path, topics, **{"checkpoint.every_messages": 20})
    learner = Daemon(config)
    thread = threading.Thread(target=learner.run, daemon=True)
    thread.start()
    try:
        produce(servers, topics["input"], _labelled(0, 20))
        assert wait_for(lambda: learner._sequence == 1, 30)
        # A second learner of the model starts: it claims the next epoch.
        with StateStore(servers, topics["state"], timeout=10) as other:
            assert other.claim_epoch(GLOBAL_MODEL_ID) == learner._epoch + 1
        produce(servers, topics["input"], _labelled(20, 20))
        thread.join(timeout=30)
        assert not thread.is_alive()
    finally:
        learner.stop()
        thread.join(timeout=30)
    assert learner.summary.exit_code == 1
    assert learner.metrics.replica[1].labels(outcome="stale")._value.get() == 1
    # Its local checkpoint has every message it answered.
    from connectors.checkpoint import CheckpointStore

    saved = CheckpointStore(config.checkpoint.dir).load_latest()
    assert saved.state["processor"]["offsets"] == {f"{topics['input']}:0": 40}


@pytest.mark.broker
def test_a_predictor_does_not_serve_a_model_that_has_learned_nothing(broker, tmp_path):  # noqa: F811
    # A learner that had learned nothing yet published its empty model at its checkpoints
    # (an idle one every 30 s by default): the predictor served it, and answered every input
    # with score 0 and model_updates 0.
    from connectors.replica import StateFollower

    servers = broker.bootstrap_servers
    topics = _topics()
    produce(servers, topics["input"], [{"id": "p0", "x": BANANAS[0][0]}])  # unlabelled
    learner = _learner(broker, tmp_path, topics)
    assert Daemon(learner, until_drained=True).run() == 0
    empty, _ = _published(servers, learner)
    assert empty.metadata["updates"] == 0
    follower = StateFollower(_predictor(broker, topics), lambda model: Processor(model),
                             Metrics(), threading.Event())
    store = StateStore(servers, topics["state"], timeout=10)
    try:
        assert follower.refresh(store) == "none" and follower.take() is None
        assert follower.refresh(store) == "none" and store.last_report.records == 0
        produce(servers, topics["input"], _labelled(0, 10))
        assert Daemon(learner, until_drained=True).run() == 0
        assert follower.refresh(store) == "newer"
        assert follower.take().model_updates == 10
    finally:
        store.close()


@pytest.mark.broker
def test_a_refused_state_is_not_read_again_at_every_refresh(broker, tmp_path):  # noqa: F811
    # A state a predictor refuses (another format, other settings) was assembled and decoded
    # again at every refresh (each second) while it stayed the newest.
    from connectors.replica import StateFollower

    servers = broker.bootstrap_servers
    topics = _topics()
    with StateStore(servers, topics["state"], timeout=10) as writer:
        writer.ensure_topic(partitions=1)
        writer.publish(GLOBAL_MODEL_ID, {"a": np.ones(1000)}, {"format": 99, "updates": 5},
                       next_offset=1, epoch=0, sequence=1)
    follower = StateFollower(_predictor(broker, topics), lambda model: Processor(model),
                             Metrics(), threading.Event())
    store = StateStore(servers, topics["state"], timeout=10)
    try:
        assert follower.refresh(store) == "refused" and store.last_report.complete == 1
        assert follower.refresh(store) == "refused" and store.last_report.complete == 0
        assert follower.take() is None
    finally:
        store.close()


def _recreate(servers: str, topic: str) -> None:
    """Delete the topic and create it again, empty (as a broker that lost its data has it)."""
    from kafka.admin import KafkaAdminClient, NewTopic

    admin = KafkaAdminClient(bootstrap_servers=servers, request_timeout_ms=10000)
    try:
        admin.delete_topics([topic])
        wait_for(lambda: topic not in admin.list_topics(), 20)
        admin.create_topics([NewTopic(topic, 1, 1)])
    finally:
        admin.close()


def _state_with(config, updates: int):
    """A state as a learner publishes it, of a model that has made ``updates`` updates."""
    processor = Processor(build_model(config))
    for i in range(updates):
        processor.model.learn_one({"a": float(i), "b": float(-i)}, bool(i % 2))
    processor.updates = updates
    processor.offsets = {"in:0": updates}
    return state_of(processor, config)


@pytest.mark.broker
@pytest.mark.parametrize("first", ["refused", "empty"])
def test_a_predictor_that_served_nothing_yet_follows_a_recreated_state_topic(
        broker, first):  # noqa: F811
    # Only a predictor serving a model forgot the old topic's states: one whose newest state
    # seen was refused or of a model that had learned nothing (at epoch 2) took the new
    # topic's first state, then skipped every later one as older, until epoch 3.
    from connectors.replica import StateFollower

    servers = broker.bootstrap_servers
    topics = _topics()
    config = _predictor(broker, topics)
    follower = StateFollower(config, lambda model: Processor(model), Metrics(),
                             threading.Event())
    store = StateStore(servers, topics["state"], timeout=10)
    try:
        with StateStore(servers, topics["state"], timeout=10) as writer:
            writer.ensure_topic(partitions=1)
            arrays, metadata, next_offset = _state_with(config, 0)
            if first == "refused":
                metadata = {**metadata, "format": 99, "updates": 5, "model_updates": 5}
            writer.publish(GLOBAL_MODEL_ID, arrays, metadata, next_offset, 2, 1)
        assert follower.refresh(store) == ("refused" if first == "refused" else "none")
        _recreate(servers, topics["state"])
        with StateStore(servers, topics["state"], timeout=10) as writer:
            for sequence in (1, 2):
                writer.publish(GLOBAL_MODEL_ID, *_state_with(config, 10 * sequence), 0,
                               sequence)
                assert follower.refresh(store) == "newer"
                assert follower.newest == (0, sequence)
                assert follower.take().model_updates == 10 * sequence
    finally:
        store.close()


@pytest.mark.broker
def test_a_second_learner_refused_at_start_leaves_the_running_one_serving(
        broker, tmp_path):  # noqa: F811
    # A second learner of the model, started by mistake on the group with an empty checkpoint
    # directory, was refused (committed offsets and no checkpoint) after it had claimed the
    # next epoch: the learner that ran saw it and stopped (exit 1), and the stream with it.
    servers = broker.bootstrap_servers
    topics = _topics()
    config = _learner(broker, tmp_path, topics, **{"checkpoint.every_messages": 20})
    running = _Running(config)
    with running as learner:
        produce(servers, topics["input"], _labelled(0, 20))
        assert wait_for(lambda: learner._sequence == 1, 30)
        epoch = learner._epoch
        second = _learner(broker, tmp_path / "second", topics, **{
            "kafka.group_id": config.kafka.group_id, "model.C": 2.0})
        with pytest.raises(StartRefused, match=r"holds no checkpoint.*Nothing was changed"):
            Daemon(second).run()
        with StateStore(servers, topics["state"], timeout=10) as store:
            assert store.next_epoch(GLOBAL_MODEL_ID) == epoch + 1  # nothing claimed
        produce(servers, topics["input"], _labelled(20, 20))
        assert wait_for(lambda: learner._sequence == 2, 30)
        assert running.thread.is_alive() and not learner._fenced


@pytest.mark.broker
def test_a_learner_restored_over_an_empty_state_topic_claims_above_its_old_epoch(
        broker, tmp_path):  # noqa: F811
    # The state topic recreated empty (the broker lost it, an operator deleted it): the
    # restarted learner started again at epoch 0, and predictors serving its epoch-2 state
    # never took a state of epoch 0 again: they answered with the old model for good.
    servers = broker.bootstrap_servers
    topics = _topics()
    config = _learner(broker, tmp_path, topics)
    for run in range(3):  # three runs publishing under epochs 0, 1 and 2
        produce(servers, topics["input"], _labelled(10 * run, 10))
        daemon = Daemon(config, until_drained=True)
        assert daemon.run() == 0 and daemon._epoch == run
    served, _ = _published(servers, config)
    recreated = _learner(broker, tmp_path, {**topics, "state": unique("replica-state")})
    produce(servers, topics["input"], _labelled(30, 10))
    daemon = Daemon(recreated, until_drained=True)
    assert daemon.run() == 0
    assert daemon._epoch == 3
    newer, _ = _published(servers, recreated)
    assert (newer.epoch, newer.sequence) > (served.epoch, served.sequence)  # a predictor takes it


@pytest.mark.broker
def test_a_learner_on_a_state_topic_of_another_model_is_refused_and_claims_nothing(
        broker, tmp_path):  # noqa: F811
    # It took the other model's offsets for its own checkpoints fallen behind, claimed the
    # next epoch, and stopped at its first checkpoint ("Partition is not assigned": the
    # offsets named a topic it does not read), at every restart; with the same input but other
    # settings, it published over the other model.
    servers = broker.bootstrap_servers
    topics = _topics()
    produce(servers, topics["input"], _labelled(0, 10))
    assert Daemon(_learner(broker, tmp_path / "first", topics), until_drained=True).run() == 0
    served, _ = _published(servers, _learner(broker, tmp_path / "first", topics))
    other_input = {**topics, "input": unique("replica-other-input")}
    for other, why in ((_learner(broker, tmp_path / "other", other_input),
                        rf"made on the input topic {topics['input']}, not "
                        rf"{other_input['input']}"),
                       (_learner(broker, tmp_path / "settings", topics, **{"model.C": 2.0}),
                        r"made with other settings \(.*C")):
        with pytest.raises(StartRefused, match=(
                rf"the state topic {topics['state']} holds another model's state .*{why}.*"
                r"Nothing was changed")):
            Daemon(other, until_drained=True).run()
    with StateStore(servers, topics["state"], timeout=10) as store:
        assert store.next_epoch(GLOBAL_MODEL_ID) == served.epoch + 1  # nothing claimed


@pytest.mark.broker
def test_a_learner_restored_behind_its_published_state_publishes_once_it_has_caught_up(
        broker, tmp_path, caplog):  # noqa: F811
    # Local checkpoints that fell behind the publishes (a full disk: the learner publishes
    # when its checkpoint fails): restarted, the learner restored its older checkpoint and
    # published it at once under a new epoch, and every predictor swapped the newer model
    # for it, without a word above INFO, until the replay caught up.
    servers = broker.bootstrap_servers
    topics = _topics()
    config = _learner(broker, tmp_path, topics, **{"checkpoint.every_messages": 5})
    produce(servers, topics["input"], _labelled(0, 10))
    assert Daemon(config, until_drained=True).run() == 0
    older = tmp_path / "older-checkpoints"
    shutil.copytree(config.checkpoint.dir, older, ignore=shutil.ignore_patterns(".lock"))
    produce(servers, topics["input"], _labelled(10, 20))
    assert Daemon(config, until_drained=True).run() == 0
    served, _ = _published(servers, config)
    assert (served.epoch, served.next_offset) == (1, 30)
    shutil.rmtree(config.checkpoint.dir)
    shutil.copytree(older, config.checkpoint.dir)
    caplog.set_level(logging.INFO, logger="connectors.daemon")
    daemon = Daemon(config, until_drained=True)
    assert daemon.run() == 0
    assert "holds a newer state of this model (generation 1." in caplog.text
    # Its replay checkpointed at 15, 20 and 25 without publishing: the first state of its
    # epoch is the model that has read past what the predictors served.
    state, model = _published(servers, config)
    assert (state.epoch, state.sequence, state.next_offset) == (2, 1, 30)
    assert model.n_stored == 30


@pytest.mark.broker
@pytest.mark.parametrize("stopped", [False, True])
def test_a_learner_restored_with_nothing_new_to_read_publishes_its_model(
        broker, tmp_path, stopped):  # noqa: F811
    # kafka.publish_state turned on for a learner whose checkpoint is at the end of the
    # stream: it claimed an epoch and published nothing, not even at its stop, and its
    # predictors waited for a state that never came.
    servers = broker.bootstrap_servers
    topics = _topics()
    produce(servers, topics["input"], _labelled(0, 30))
    assert Daemon(_learner(broker, tmp_path, topics, **{"kafka.publish_state": False}),
                  until_drained=True).run() == 0
    config = _learner(broker, tmp_path, topics)
    if stopped:
        assert Daemon(config, until_drained=True).run() == 0
    else:
        with _Running(config) as learner:
            assert wait_for(lambda: learner._sequence == 1, 30)
    state, model = _published(servers, config)
    assert state.sequence == 1 and state.next_offset == 30 and model.n_stored == 30


@pytest.mark.broker
def test_a_predictor_follows_a_new_learner_on_a_recreated_state_topic(
        broker, tmp_path, caplog):  # noqa: F811
    # After the state topic was recreated (a broker that lost its data), a new learner's
    # epochs start again at 0: the predictor took its states for older than the one it
    # served, silently, and answered with the lost model until the new sequence caught up.
    from connectors.replica import StateFollower

    servers = broker.bootstrap_servers
    topics = _topics()
    old = _learner(broker, tmp_path / "old", topics)
    for run in range(3):  # epochs 0, 1 and 2
        produce(servers, topics["input"], _labelled(10 * run, 10))
        assert Daemon(old, until_drained=True).run() == 0
    predictor = _predictor(broker, topics)
    follower = StateFollower(predictor, lambda model: Processor(model), Metrics(),
                             threading.Event())
    store = StateStore(servers, topics["state"], timeout=10)
    try:
        # A restored learner whose first poll finds nothing publishes there (sequence 1),
        # then at its stop (2): how many states epoch 2 has depends on the fetch's timing.
        assert follower.refresh(store) == "newer" and follower.newest[0] == 2
        assert follower.take().model_updates == 30
        # A refresh reads only what was written since the one before (all of it, each
        # second, before: a topic that is not compacted grew without bound).
        assert store.last_report.records > 0
        assert follower.refresh(store) == "unchanged" and store.last_report.records == 0
        _recreate(servers, topics["state"])
        # A refresh before the new learner's first state (it took the recreated topic's
        # states for older ones from then on, following the records written since).
        assert follower.refresh(store) == "unchanged" and follower.newest[0] == 2
        new = _learner(broker, tmp_path / "new", {**topics, "input": unique("replica-in")})
        produce(servers, new.kafka.input_topic, _labelled(100, 10))
        assert Daemon(new, until_drained=True).run() == 0
        with caplog.at_level("WARNING", logger="connectors.replica"):
            assert follower.refresh(store) == "newer"
        assert follower.newest == (0, 1)
        assert "it was recreated; following the states written there since" in caplog.text
        assert follower.take().model_updates == 10
    finally:
        store.close()


@pytest.mark.slow
def test_a_learner_whose_state_topic_vanished_creates_it_again_and_publishes_there(
        tmp_path, caplog):
    # After the broker lost its data under a running learner, every publish failed for good
    # ("failed to update metadata"): predictors served the old model while it ran on.
    from connectors.broker import EmbeddedBroker, free_loopback_port

    embedded = EmbeddedBroker(port=free_loopback_port(), start_timeout=20).start()
    topics = _topics()
    config = _learner(embedded, tmp_path, topics, **{
        "checkpoint.every_messages": 10, "kafka.request_timeout_ms": 3000,
        "kafka.on_partition_reset": "earliest"})
    try:
        with caplog.at_level("WARNING", logger="connectors.daemon"), \
                _Running(config) as learner:
            produce(embedded.bootstrap_servers, topics["input"], _labelled(0, 10))
            assert wait_for(lambda: learner._sequence == 1, 30)
            epoch = learner._epoch
            port = int(embedded.bootstrap_servers.rpartition(":")[2])
            embedded.stop()
            embedded = EmbeddedBroker(port=port, start_timeout=20).start()  # empty
            ensure_topics({"bootstrap_servers": embedded.bootstrap_servers},
                          [topics["input"], topics["learner-out"], topics["learner-dead"]])
            produce(embedded.bootstrap_servers, topics["input"], _labelled(10, 10))
            assert wait_for(lambda: learner._epoch == epoch + 1 and learner._sequence >= 1,
                            90), caplog.text
        assert "did not exist any more" in caplog.text
        state, model = _published(embedded.bootstrap_servers, config)
        assert state.epoch == epoch + 1 and model.n_stored == 20
    finally:
        embedded.stop()


@pytest.mark.broker
@pytest.mark.parametrize("model", [
    {"model.type": "SlidingWindowSVC", "model.window_size": 500, "model.step": 10},
    {"model.type": "AlphaISVC", "model.batch_size": 20},
])
def test_a_predictor_does_not_serve_a_model_whose_samples_all_wait_in_its_buffer(
        broker, tmp_path, model):  # noqa: F811
    # A sliding window before its first slide (or alpha-ISVM before its first batch) holds
    # its samples in a buffer, and its model is still empty; its state counted the buffered
    # samples as updates, so a predictor served it: score 0 for every input.
    from connectors.replica import StateFollower

    servers = broker.bootstrap_servers
    topics = _topics()
    produce(servers, topics["input"], _labelled(0, 5))
    learner = _learner(broker, tmp_path, topics, **model)
    assert Daemon(learner, until_drained=True).run() == 0
    follower = StateFollower(_predictor(broker, topics, **model),
                             lambda model: Processor(model), Metrics(), threading.Event())
    store = StateStore(servers, topics["state"], timeout=10)
    try:
        assert follower.refresh(store) == "none" and follower.take() is None
        buffered, _ = _published(servers, learner)
        assert buffered.metadata["updates"] == 5 and buffered.metadata["model_updates"] == 0
        produce(servers, topics["input"], _labelled(5, 25))
        assert Daemon(learner, until_drained=True).run() == 0
        assert follower.refresh(store) == "newer"
        served = follower.take()
        assert served.model_updates == 30 - served.model.n_buffered > 0
        assert served.model.predict_one(BANANAS[0][0]) is not None
    finally:
        store.close()
