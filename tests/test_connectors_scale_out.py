"""Scale-out on Kafka: daemons of one consumer group share a topic's partitions with one model
per message key (``model.scope = "key"``), their models' states on the state topic.

The broker tests start daemon processes (``stream-svm serve``) on the embedded broker with
short session timeouts, kill or pause some of them mid-stream, and compare every model left on
the state topic with the model built in this process from exactly that key's messages, in
order, each once."""

from __future__ import annotations

import itertools
import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from connectors.config import ConfigError, load_config
from connectors.daemon import ensure_topics
from connectors.metrics import Metrics
from connectors.models import restore_model
from connectors.processor import Processor, Record
from connectors.scoped import ScopedModels, ScopedStateRefused, model_id_of, model_label
from connectors.sources import iter_source
from connectors.state_store import StateStore
from stream_svm import IncrementalSVC
from tests.connectors_helpers import broker, read_all, unique, wait_for  # noqa: F401

ROOT = Path(__file__).resolve().parents[1]
MODEL = {"C": 1.0, "gamma": 0.5}
#: Bananas (River's, shipped in its wheel), split among the keys.
BANANAS = list(itertools.islice(iter_source("bananas"), 1200))


# -- settings and routing (no broker) ----------------------------------------------------------


def test_model_ids_and_labels_follow_the_scope():
    assert model_id_of("key", 2, b"gauge-7") == (2, "gauge-7")
    assert model_id_of("key", 2, None) == (2, None)  # unkeyed messages share one model
    assert model_id_of("key", 2, b"\xff\x00") == (2, "0xff00")  # not UTF-8: hex
    assert model_id_of("partition", 2, b"gauge-7") == (2, None)
    assert model_label((2, "gauge-7")) == "2/gauge-7" and model_label((2, None)) == "2"


@pytest.mark.parametrize("settings, named", [
    ({"model.scope": "everything"}, "model.scope"),
    ({"model.max_models": "5"}, "model.max_models"),  # a global model is one model
    ({"model.scope": "key", "model.max_models": "0"}, "model.max_models"),
    ({"model.scope": "key", "daemon.role": "predictor", "kafka.state_topic": "s",
      "kafka.bootstrap_servers": "127.0.0.1:1", "kafka.group_id": "p"}, "daemon.role"),
    ({"model.scope": "partition", "kafka.publish_state": "true"}, "kafka.publish_state"),
    ({"model.scope": "key", "kafka.on_partition_reset": "earliest"}, "on_partition_reset"),
    ({"model.scope": "key", "kafka.session_timeout_ms": "40000"}, "request_timeout_ms"),
    ({"model.scope": "key", "kafka.heartbeat_interval_ms": "20000"}, "heartbeat_interval_ms"),
])
def test_invalid_scope_settings_fail_naming_the_setting(settings, named):
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        load_config(None, overrides=settings, environ={})


def test_scope_settings_are_not_model_settings():
    config = load_config(None, overrides={"model.scope": "key", "model.max_models": "7"},
                         environ={})
    assert (config.model.scope, config.model.max_models) == ("key", 7)
    from connectors.models import checkpointed_settings

    assert "scope" not in checkpointed_settings(config)  # the models are the same models


def test_per_model_gauges_carry_the_model_label_and_go_with_the_model():
    metrics = Metrics(per_model=True)
    one, two = metrics.for_model("0/a"), metrics.for_model("1/b")
    one.margin.set(3)
    two.margin.set(5)
    one.accuracy.set(0.75)
    one.messages.labels(outcome="learned").inc()  # counters are shared, unlabelled by model
    text = metrics.render().decode()
    assert 'stream_svm_margin_vectors{model="0/a"} 3.0' in text
    assert 'stream_svm_margin_vectors{model="1/b"} 5.0' in text
    assert 'stream_svm_progressive_accuracy{model="0/a"} 0.75' in text
    metrics.forget_model("0/a")
    text = metrics.render().decode()
    assert 'model="0/a"' not in text and 'model="1/b"' in text
    plain = Metrics()
    assert plain.for_model("0/a") is plain  # one global model: no label


# -- ScopedModels against a store in memory ----------------------------------------------------


class _MemoryStore:
    """The part of StateStore that ScopedModels uses, in memory (payloads really encoded)."""

    topic = "memory.state"

    def __init__(self) -> None:
        from connectors import state_store

        self._codec = state_store
        self.records: dict[Any, tuple[bytes, int, int, int]] = {}
        self.claimed: dict[Any, int] = {}
        self.publishes = 0

    def restore(self, model_ids=None, *, select=None, decode=True, log_level=None):
        from connectors.state_store import StoredState

        return {m: StoredState(*self._codec._decode_payload(p, arrays=decode), n, e, s,
                               (0, 0, 0))
                for m, (p, n, e, s) in self.records.items()
                if (select is None or select(m)) and (model_ids is None or m in model_ids)}

    def newest(self, model_id):
        from connectors.state_store import StoredState

        found = self.records.get(model_id)
        return None if found is None else StoredState({}, {}, found[1], found[2], found[3],
                                                      (0, 0, 0))

    def fetch(self, model_id):
        from connectors.state_store import StoredState

        payload, next_offset, epoch, sequence = self.records[model_id]
        arrays, metadata = self._codec._decode_payload(payload)
        return StoredState(arrays, metadata, next_offset, epoch, sequence, (0, 0, 0))

    def claim_epoch(self, model_id, *, newest_known=None):
        from connectors.state_store import StaleEpochError

        if newest_known is not None and self.claimed.get(model_id, -1) > newest_known:
            raise StaleEpochError("another owner took the model since")
        self.claimed[model_id] = self.claimed.get(model_id, -1) + 1
        return self.claimed[model_id]

    def index(self, select, log_level=None):
        return self.restore(select=select, decode=False, log_level=log_level)

    def epochs(self, select):
        return {m: e for m, e in self.claimed.items() if select(m)}

    def newest_epoch(self, model_id, through_offset):
        return self.claimed.get(model_id, -1)


    def publish(self, model_id, arrays, metadata, next_offset, epoch, sequence):
        self.publishes += 1
        self.records[model_id] = (self._codec._encode_payload(arrays, metadata), next_offset,
                                  epoch, sequence)
        return 0


def _scoped(max_models: int, store: _MemoryStore | None = None,
            cache_dir: Path | None = None) -> tuple[ScopedModels, Any]:
    config = load_config(None, overrides={"model.scope": "key",
                                          "model.max_models": str(max_models),
                                          **{f"model.{k}": str(v) for k, v in MODEL.items()}},
                         environ={})
    metrics = Metrics(per_model=True)

    def new_processor(model: Any, model_metrics: Any) -> Processor:
        return Processor(model, metrics=model_metrics)

    models = ScopedModels(config, store or _MemoryStore(), new_processor,
                          lambda: IncrementalSVC(**MODEL), metrics, cache_dir=cache_dir)
    return models, metrics


def _handled(models: ScopedModels, records: list[Any]) -> Any:
    """Process a batch as the daemon does: its outputs delivered before anything else."""
    result = models.process(records)
    models.delivered()
    return result


def _record(partition: int, offset: int, key: str, message: dict[str, Any]) -> Any:
    record = Record("stream-svm.input", partition, offset, json.dumps(message).encode(), 0)
    object.__setattr__(record, "key", key.encode())  # a ConsumerRecord has its key
    return record


def _keyed_stream(keys: int, per_key: int, partitions: int) -> list[tuple[int, str, dict]]:
    """(partition, key, message) of labelled Bananas points, a late label and a forget per
    key; key k goes to partition k % partitions."""
    rows = []
    for i, (x, y) in enumerate(BANANAS[: keys * per_key]):
        k = i % keys
        rows.append((k % partitions, f"k{k}", {"id": f"{k}-{i}", "x": x, "y": y}))
    for k in range(keys):
        x, y = BANANAS[-1 - k]
        rows.append((k % partitions, f"k{k}", {"id": f"late-{k}", "x": x}))
        rows.append((k % partitions, f"k{k}", {"op": "forget", "id": f"{k}-{k}"}))
        rows.append((k % partitions, f"k{k}", {"id": f"late-{k}", "y": y}))
    return rows


def _reference(messages: list[dict[str, Any]]) -> IncrementalSVC:
    """The model of one key's messages, in order, each once."""
    model = IncrementalSVC(**MODEL)
    cache: dict[Any, dict] = {}
    for message in messages:
        if message.get("op") == "forget":
            model.forget_one(key=message["id"])
        elif "x" not in message:
            model.learn_one(cache.pop(message["id"]), message["y"], key=message["id"])
        elif "y" in message:
            model.learn_one(message["x"], message["y"], key=message["id"])
        else:
            cache[message["id"]] = message["x"]
    return model


GRID = pd.DataFrame(np.random.default_rng(5).uniform(-3, 3, size=(200, 2)), columns=["1", "2"])


def _assert_same_model(model: Any, reference: IncrementalSVC, where: str) -> None:
    assert sorted(map(str, model.stored_keys())) == sorted(map(str, reference.stored_keys())), \
        where
    np.testing.assert_allclose(model.decision_function_many(GRID),
                               reference.decision_function_many(GRID), rtol=0, atol=1e-9,
                               err_msg=where)


def test_a_forget_sent_with_another_key_names_the_model_it_reached_and_the_fix():
    """Per-key models: a forget sent with another Kafka key than its point's learning message
    reaches another model; its dead letter says which model answered, and why it holds
    nothing of the id."""
    models, _ = _scoped(max_models=10)
    models.assign({0, 1})
    models.settle({p: {f"stream-svm.input:{p}": None} for p in (0, 1)}, start_fresh=False)
    _handled(models, [_record(0, 0, "k0", {"id": "p", "x": {"a": 1.0}, "y": True})])
    result, again = _handled(models, [_record(1, 0, "k1", {"op": "forget", "id": "p"})])
    assert not again
    (letter,) = [letter.record for letter in result.dead_letters]
    assert letter["reason"] == "unknown_id" and letter["model"] == "1/k1"
    assert letter["error"] == (
        "forget of unknown id 'p' (not in the model); model 1/k1 holds the points of partition "
        "1 sent with this Kafka key: a forget, relabel or label reaches the model of its id "
        "only when sent with the Kafka key of the id's learning message")


@pytest.mark.parametrize("on_disk", [False, True])
def test_models_evicted_to_stay_within_max_models_come_back_exactly(on_disk, tmp_path):
    rows = _keyed_stream(keys=5, per_key=12, partitions=2)
    models, metrics = _scoped(max_models=2, cache_dir=tmp_path / "models" if on_disk else None)
    models.assign({0, 1})
    models.settle({p: {f"stream-svm.input:{p}": None} for p in (0, 1)}, start_fresh=False)
    offsets = {0: 0, 1: 0}
    for start in range(0, len(rows), 7):  # polls of 7 records
        batch = []
        for partition, key, message in rows[start:start + 7]:
            batch.append(_record(partition, offsets[partition], key, message))
            offsets[partition] += 1
        result, again = models.process(batch)
        assert not again and not result.dead_letters
        models.delivered()  # as the daemon does once the batch's outputs are acknowledged
        assert len(models.live) <= 2
    assert models.evictions > 0 and models.restores > 0
    fetches = {source: metrics.scale_out[3].labels(source=source)._value.get()
               for source in ("topic", "disk")}
    # With a directory, every evicted model comes back from local disk, not the topic.
    assert fetches == ({"topic": 0, "disk": models.restores} if on_disk else
                       {"topic": models.restores, "disk": 0})
    assert metrics.scale_out[0]._value.get() == len(models.live) == 2
    # A model read back answers with the generation of the state it was read from.
    assert all(live.processor.generation for live in models.live.values())
    text = metrics.render().decode()
    assert text.count("stream_svm_margin_vectors{") == 2  # only live models have series
    models.publish()
    store = models.store
    for k in range(5):
        model_id = (k % 2, f"k{k}")
        mine = [m for p, key, m in rows if key == f"k{k}"]
        restored = models._processor_from(model_id, store.fetch(model_id))
        _assert_same_model(restored.model, _reference(mine), f"key k{k}")


def test_a_models_cached_points_do_not_age_while_the_daemons_are_down():
    # Read back with the wall clock, a model restored 30 s after a crash (cache max age 20 s)
    # had lost its cached points: the labels its partition's replay brought again, which the
    # crashed daemon had acknowledged, were dead-lettered unknown_id and never learned.
    now = [0.0]
    config = load_config(None, overrides={
        "model.scope": "key", **{f"model.{k}": str(v) for k, v in MODEL.items()}}, environ={})

    def new_processor(model: Any, model_metrics: Any) -> Processor:
        return Processor(model, metrics=model_metrics, cache_max_age_seconds=20,
                         clock=lambda: now[0])

    store = _MemoryStore()
    models = ScopedModels(config, store, new_processor, lambda: IncrementalSVC(**MODEL),
                          Metrics(per_model=True))
    models.assign({0})
    models.settle({0: {"stream-svm.input:0": None}}, start_fresh=False)
    x, _ = BANANAS[0]
    models.process([_record(0, 0, "k0", {"id": "u", "x": x})])
    models.delivered()
    models.publish()
    # Read back while the daemon that wrote it runs (evicted, or handed over): the daemons
    # ran meanwhile, and its points aged as they would have in memory.
    now[0] += 30
    models.started_at = 0.0
    assert list(models._processor_from((0, "k0"), store.fetch((0, "k0"))).cache) == []
    # Read back by a daemon started after the state was written (the daemons were down for
    # longer than the max age): the downtime ages nothing.
    restarted = ScopedModels(config, store, new_processor, lambda: IncrementalSVC(**MODEL),
                             Metrics(per_model=True))
    restarted.started_at = now[0]
    processor = restarted._processor_from((0, "k0"), store.fetch((0, "k0")))
    assert list(processor.cache) == ["u"]
    result = processor.process([_record(0, 1, "k0", {"id": "u", "y": True})])
    assert not result.dead_letters and result.outputs[0].record["ok"] is True
    assert "u" in processor.model


def test_a_partition_whose_messages_made_no_model_is_committed_after_its_record():
    # Messages of over-long Kafka keys are dead-lettered without a model. Their partition's
    # offsets were committed all the same, and every later assignment refused it as one whose
    # models were lost ("committed offsets ... but the state topic holds no model of it"):
    # the group stopped at its next rebalance or restart. Then they were never committed:
    # every restart dead-lettered them again, and the partition's lag only grew.
    from connectors.scoped import MAX_MODEL_KEY_BYTES

    models, _ = _scoped(max_models=4)
    models.assign({0, 1})
    models.settle({0: {"stream-svm.input:0": None}, 1: {"stream-svm.input:1": None}},
                  start_fresh=False)
    x, y = BANANAS[0]
    long_key = "k" * (MAX_MODEL_KEY_BYTES + 1)
    result = _handled(models, [_record(0, 0, "k0", {"id": "a", "x": x, "y": y}),
                               _record(1, 0, long_key, {"id": "b", "x": x, "y": y}),
                               _record(1, 1, long_key, {"id": "c", "x": x, "y": y})])[0]
    assert [d.record["reason"] for d in result.dead_letters] == ["malformed", "malformed"]
    assert models.committable() == {}  # nothing published yet
    assert models.publish()
    # The state topic holds partition 1's record (no model of it): its offsets are committed.
    assert ("partition", 1) in models.store.records and ("partition", 0) not in \
        models.store.records
    offsets = models.committable()
    assert offsets == {"stream-svm.input:0": 1, "stream-svm.input:1": 2}
    models.mark_committed(offsets)
    publishes = models.store.publishes
    assert models.publish() and models.store.publishes == publishes  # written once
    # A restart (or the partitions' next owner) accepts both commits and resumes after the
    # dead letters, instead of refusing partition 1 or reading its messages again.
    again, _ = _scoped(max_models=4, store=models.store)
    again.assign({0, 1})
    resume = again.settle({0: {"stream-svm.input:0": 1}, 1: {"stream-svm.input:1": 2}},
                          start_fresh=False)
    assert resume == {"stream-svm.input:0": 1, "stream-svm.input:1": 2}
    assert set(again.live) == set()  # the record is no model
    # A model of it made later is published and committed as any partition's.
    _handled(again, [_record(1, 2, "k1", {"id": "d", "x": x, "y": y})])
    assert again.publish()
    assert again.committable()["stream-svm.input:1"] == 3
    # The record covers the commits up to its offsets, no further: once the model made
    # since is lost (the state topic lost its newest records), a commit past the record reads
    # as models lost again.
    del models.store.records[(1, "k1")]
    third, _ = _scoped(max_models=4, store=models.store)
    third.assign({1})
    with pytest.raises(ScopedStateRefused, match="holds no model of it"):
        third.settle({1: {"stream-svm.input:1": 3}}, start_fresh=False)
    assert third.settle({1: {"stream-svm.input:1": 2}}, start_fresh=False) == {
        "stream-svm.input:1": 2}


def test_a_partition_record_moves_on_with_the_dead_letters_and_covers_no_other_partition():
    from connectors.scoped import MAX_MODEL_KEY_BYTES

    long_key = "k" * (MAX_MODEL_KEY_BYTES + 1)
    message = {"id": "a", "x": {"1": 0.5}, "y": True}
    models, _ = _scoped(max_models=4)
    models.assign({1})
    models.settle({1: {"stream-svm.input:1": None}}, start_fresh=False)
    _handled(models, [_record(1, 0, long_key, message)])
    assert models.publish() and models.committable() == {"stream-svm.input:1": 1}
    models.mark_committed({"stream-svm.input:1": 1})
    _handled(models, [_record(1, 1, long_key, message), _record(1, 2, long_key, message)])
    assert models.committable() == {}  # beyond the record: written again first
    assert models.publish() and models.committable() == {"stream-svm.input:1": 3}
    record = models.store.restore([("partition", 1)])[("partition", 1)]
    assert (record.epoch, record.sequence) == (0, 2)  # (one claim per ownership)
    assert record.metadata["offsets"] == {"stream-svm.input:1": 3}
    # A partition's record says nothing of another partition's commits.
    again, _ = _scoped(max_models=4, store=models.store)
    again.assign({0, 1})
    with pytest.raises(ScopedStateRefused, match="for partition 0"):
        again.settle({0: {"stream-svm.input:0": 5}, 1: {"stream-svm.input:1": 3}},
                     start_fresh=False)


def _dead_letters_only(partition: int, first: int, count: int,
                       topic: str = "stream-svm.input") -> list[Any]:
    """Records that make no model: keys too long to name one."""
    from connectors.scoped import MAX_MODEL_KEY_BYTES

    records = []
    for offset in range(first, first + count):
        record = _record(partition, offset, "k" * (MAX_MODEL_KEY_BYTES + 1),
                         {"id": offset, "x": {"1": 0.5}, "y": True})
        records.append(Record(topic, partition, offset, record.value, 0))
        object.__setattr__(records[-1], "key", record.key)
    return records


def test_a_former_owner_does_not_write_a_partition_record_back_behind_the_next_owners():
    # A stalled former owner woke and rewrote the record with its own, older positions over
    # the next owner's: that owner's restart was refused ("holds no model of it"). Records
    # have epochs now, as models do.
    class NewestEpochStore(_MemoryStore):
        """Keeps what readers of the real state topic take: the newest epoch's state."""

        def publish(self, model_id, arrays, metadata, next_offset, epoch, sequence):
            found = self.records.get(model_id)
            if found is not None and found[2] > epoch:
                self.publishes += 1
                return 0
            return super().publish(model_id, arrays, metadata, next_offset, epoch, sequence)

    store = NewestEpochStore()
    former, _ = _scoped(max_models=4, store=store)
    former.assign({1})
    former.settle({1: {"stream-svm.input:1": None}}, start_fresh=False)
    _handled(former, _dead_letters_only(1, 0, 2))
    assert former.publish() and former.committable() == {"stream-svm.input:1": 2}
    _handled(former, _dead_letters_only(1, 2, 2))  # then it stalls, unpublished
    owner, _ = _scoped(max_models=4, store=store)
    owner.assign({1})
    owner.settle({1: {"stream-svm.input:1": 2}}, start_fresh=False)
    _handled(owner, _dead_letters_only(1, 2, 4))
    assert owner.publish() and owner.committable() == {"stream-svm.input:1": 6}
    # Woken, it writes its record (up to 4) under its older epoch, reads the newer one back,
    # and gives the partition up, committing nothing.
    assert not former.publish() and former.fenced == {1} and former.committable() == {}
    record = store.restore([("partition", 1)])[("partition", 1)]
    assert record.metadata["offsets"] == {"stream-svm.input:1": 6} and record.epoch == 1
    restarted, _ = _scoped(max_models=4, store=store)
    restarted.assign({1})
    assert restarted.settle({1: {"stream-svm.input:1": 6}}, start_fresh=False) == {
        "stream-svm.input:1": 6}


def test_partition_records_cover_the_label_topic_and_only_partitions_without_a_model():
    models, _ = _scoped(max_models=1)
    models.assign({0, 1, 2})
    models.settle({p: {f"stream-svm.input:{p}": None} for p in (0, 1, 2)}, start_fresh=False)
    x, y = BANANAS[0]
    # Partition 0's one model is evicted (published) by partition 2's, and dead letters
    # follow it; partition 1 has only dead letters, on both of its topics.
    _handled(models, [_record(0, 0, "a", {"id": "a", "x": x, "y": y}),
                      _record(2, 0, "c", {"id": "c", "x": x, "y": y})])
    _handled(models, _dead_letters_only(0, 1, 2) + _dead_letters_only(1, 0, 2)
             + _dead_letters_only(1, 0, 3, topic="stream-svm.labels"))
    assert models.evictions == 1 and list(models.live) == [(2, "c")] and models.publish()
    assert ("partition", 0) not in models.store.records  # its model covers its commits
    record = models.store.restore([("partition", 1)])[("partition", 1)]
    assert record.metadata["offsets"] == {"stream-svm.input:1": 2, "stream-svm.labels:1": 3}
    assert models.committable() == {"stream-svm.input:0": 3, "stream-svm.input:1": 2,
                                    "stream-svm.labels:1": 3, "stream-svm.input:2": 1}


def test_a_model_the_state_topic_does_not_take_holds_back_no_other_partitions_record():
    from connectors.state_store import StateStoreError

    class OneUnreachable(_MemoryStore):
        def publish(self, model_id, *args):
            if model_id == (0, "a"):
                raise StateStoreError("publishing was not acknowledged within 10 s")
            return super().publish(model_id, *args)

    models, _ = _scoped(max_models=4, store=OneUnreachable())
    models.assign({0, 1})
    models.settle({0: {"stream-svm.input:0": None}, 1: {"stream-svm.input:1": None}},
                  start_fresh=False)
    x, y = BANANAS[0]
    _handled(models, [_record(0, 0, "a", {"id": "a", "x": x, "y": y}),
                      *_dead_letters_only(1, 0, 2)])
    for _ in range(3):  # (a model left unpublished round after round: the record goes on)
        assert not models.publish()
        assert models.committable() == {"stream-svm.input:1": 2}
    # and so do other models' states, written and read back while it fails
    models.assign({2})
    models.settle({2: {"stream-svm.input:2": None}}, start_fresh=False)
    for offset in range(2):
        _handled(models, [_record(2, offset, "k", {"id": f"k{offset}", "x": x, "y": y})])
        assert not models.publish()
        assert models.committable()["stream-svm.input:2"] == offset + 1
        models.mark_committed(models.committable())
    # On a stop, once the state topic did not answer, nothing more is tried (one timeout,
    # not one per record and one more to read them back).
    attempts = models.store.publishes
    _handled(models, _dead_letters_only(1, 2, 1))
    assert not models.publish(give_up=lambda: False)
    assert models.store.publishes == attempts and models.committable() == {}


def test_a_partition_record_not_read_back_commits_nothing_and_a_returning_owner_claims_anew():
    from connectors.state_store import StateStoreError

    class Unreadable(_MemoryStore):
        readable = False

        def newest_epoch(self, model_id, through_offset):
            if not self.readable:
                raise StateStoreError("the state topic could not be read within 10 s")
            return super().newest_epoch(model_id, through_offset)

    store = Unreadable()
    first, _ = _scoped(max_models=4, store=store)
    first.assign({1})
    first.settle({1: {"stream-svm.input:1": None}}, start_fresh=False)
    _handled(first, _dead_letters_only(1, 0, 2))
    assert not first.publish() and first.committable() == {}  # written, not read back
    store.readable = True
    assert first.publish() and first.committable() == {"stream-svm.input:1": 2}
    first.revoke({1}, lambda offsets: None)
    # Another owner, then the first again: it claims an epoch above the other's (keeping its
    # old one, it was fenced at every publish, and the partition never moved on).
    second, _ = _scoped(max_models=4, store=store)
    for owner, start in ((second, 2), (first, 4)):
        owner.assign({1})
        owner.settle({1: {"stream-svm.input:1": start}}, start_fresh=False)
        _handled(owner, _dead_letters_only(1, start, 2))
        assert owner.publish() and owner.committable() == {"stream-svm.input:1": start + 2}
        owner.revoke({1}, lambda offsets: None)
    assert store.records[("partition", 1)][2] == 2  # (epochs 0, 1, 2)


def test_a_partition_record_not_written_commits_nothing():
    from connectors.scoped import MAX_MODEL_KEY_BYTES
    from connectors.state_store import StateStoreError

    class FailingRecords(_MemoryStore):
        failing = True

        def publish(self, model_id, *args):
            if self.failing and model_id == ("partition", 1):
                raise StateStoreError("the state topic is not answering")
            return super().publish(model_id, *args)

    models, _ = _scoped(max_models=4, store=FailingRecords())
    models.assign({1})
    models.settle({1: {"stream-svm.input:1": None}}, start_fresh=False)
    _handled(models, [_record(1, 0, "k" * (MAX_MODEL_KEY_BYTES + 1),
                              {"id": "a", "x": {"1": 0.5}, "y": True})])
    assert not models.publish()
    assert models.committable() == {}
    models.store.failing = False
    assert models.publish() and models.committable() == {"stream-svm.input:1": 1}


def test_the_models_kept_on_disk_are_bounded_and_the_others_come_from_the_topic(tmp_path):
    # Keys seen once filled the directory (7 KB each, for as long as the partition stayed),
    # and every read back scanned it.
    from connectors.scoped import DISK_MODELS_MIN, DISK_MODELS_PER_LIVE

    order = [0, 1, 2, 3, 4, 5, 6, 7, 6, 0, 5, 1, 4, 7]  # the keys, one message each
    rows = [(0, f"k{k}", {"id": f"{k}-{i}", "x": x, "y": y})
            for i, (k, (x, y)) in enumerate(zip(order, BANANAS, strict=False))]
    models, metrics = _scoped(max_models=1, cache_dir=tmp_path / "models")
    assert models.max_on_disk == max(DISK_MODELS_MIN, DISK_MODELS_PER_LIVE)
    models.max_on_disk = 3
    models.assign({0})
    models.settle({0: {"stream-svm.input:0": None}}, start_fresh=False)
    for offset, (partition, key, message) in enumerate(rows):
        result, again = models.process([_record(partition, offset, key, message)])
        models.delivered()
        assert not again and not result.dead_letters
        kept = tmp_path / "models"  # (made at the first eviction)
        assert not kept.exists() or len(list(kept.iterdir())) <= 3
    fetches = {source: metrics.scale_out[3].labels(source=source)._value.get()
               for source in ("topic", "disk")}
    # k6 and k5 come back from disk (among the last three evicted); k0, k1, k4 and k7, pushed
    # out by later evictions, from the topic
    assert fetches == {"topic": 4, "disk": 2}
    models.publish()
    for k in range(8):
        mine = [m for _, key, m in rows if key == f"k{k}"]
        restored = models._processor_from((0, f"k{k}"), models.store.fetch((0, f"k{k}")))
        _assert_same_model(restored.model, _reference(mine), f"key k{k}")


def test_no_model_is_published_before_its_batchs_outputs_are_delivered():
    # A batch of three keys with room for two live models: evicting the first key's model
    # while the third is fetched would publish a state covering records whose outputs are
    # not delivered yet; a crash then, and the next owner skipped them, answering none.
    rows = _keyed_stream(keys=3, per_key=4, partitions=1)[:12]
    store = _MemoryStore()
    models, _ = _scoped(max_models=2, store=store)
    models.assign({0})
    models.settle({0: {"stream-svm.input:0": None}}, start_fresh=False)
    batch = [_record(0, i, key, m) for i, (_, key, m) in enumerate(rows)]
    result, _ = models.process(batch)
    assert len(result.outputs) == len(batch) and store.publishes == 0
    assert len(models.live) == 3  # over the bound until the outputs are delivered

    # The process dies here. The next owner answers every message of the batch.
    successor, _ = _scoped(max_models=2, store=store)
    successor.assign({0})
    successor.settle({0: {"stream-svm.input:0": None}}, start_fresh=False)
    again, _ = successor.process(batch)
    assert len(again.outputs) == len(batch) and again.skipped == 0

    # Delivered: the least recently used model is published and evicted, then committable.
    models.delivered()
    assert store.publishes == 1 and len(models.live) == 2
    assert models.publish() and models.committable() == {"stream-svm.input:0": len(batch)}


class _RacedStore(_MemoryStore):
    """A state topic where another process's claim of a model lands just before this one's
    (a zombie of the former owner, or the rightful owner when this process is the zombie)."""

    def __init__(self) -> None:
        super().__init__()
        self.raced = False

    def claim_epoch(self, model_id, *, newest_known=None):
        from connectors.state_store import StaleEpochError

        if self.raced:
            self.raced = False
            raise StaleEpochError("another owner took epoch 1 of the model before this claim")
        return super().claim_epoch(model_id, newest_known=newest_known)


def test_a_lost_claim_gives_the_whole_partition_up_and_its_next_owner_learns_everything():
    rows = [row for row in _keyed_stream(keys=2, per_key=10, partitions=1)
            if "y" in row[2] and "x" in row[2]][:20]
    batch = [_record(0, i, key, m) for i, (_, key, m) in enumerate(rows)]
    store = _RacedStore()
    former, _ = _scoped(max_models=10, store=store)
    former.assign({0})
    former.settle({0: {"stream-svm.input:0": None}}, start_fresh=False)
    _handled(former, batch[:6])
    assert former.publish() and former.committable() == {"stream-svm.input:0": 6}
    former.mark_committed(former.committable())

    owner, _ = _scoped(max_models=10, store=store)
    owner.assign({0})
    owner.settle({0: {"stream-svm.input:0": 6}}, start_fresh=False)
    result, _ = _handled(owner, batch[6:12])
    assert len(result.outputs) == 6
    store.raced = True
    assert not owner.publish()
    # Given up whole, unpublished: neither handled nor committed here until the group says.
    assert owner.fenced == {0} and not owner.live and not owner.owned
    assert owner.committable() == {}
    later, _ = _handled(owner, batch[12:])
    assert not later.outputs and not owner.live and store.publishes == 2

    # Whoever the group names next resumes from the last commit and learns every record
    # since, once: the models equal those of the whole stream. (Rebuilding the model from
    # its last state and going on lost the records learned before the claim.)
    heir, _ = _scoped(max_models=10, store=store)
    heir.assign({0})
    heir.settle({0: {"stream-svm.input:0": 6}}, start_fresh=False)
    again, _ = _handled(heir, batch[6:])
    assert len(again.outputs) == len(batch) - 6 and again.skipped == 0
    for key in ("k0", "k1"):
        _assert_same_model(heir.live[(0, key)].processor.model,
                           _reference([m for _, k, m in rows if k == key]), f"model 0/{key}")

    # A group that names an owner, or takes the partition away, leaves nothing to rejoin for.
    owner.assign({0})
    assert owner.fenced == set() and owner.pending == {0}
    heir.store.raced = True
    handed: list[dict[str, int]] = []
    heir.revoke({0}, handed.append)
    assert heir.fenced == set() and handed == [] and not heir.live


def test_a_model_whose_former_owner_only_claimed_it_is_claimed_again_not_fenced():
    # The former owner claimed epoch 0 and died before its first state: the state topic holds
    # the claim and no state. The next owner knows of that epoch from its assignment on, and
    # claims the next one, instead of taking the claim for another process's since.
    rows = [row for row in _keyed_stream(keys=1, per_key=6, partitions=1)
            if "y" in row[2] and "x" in row[2]]
    store = _MemoryStore()
    assert store.claim_epoch((0, "k0")) == 0
    owner, _ = _scoped(max_models=10, store=store)
    owner.assign({0})
    owner.settle({0: {"stream-svm.input:0": None}}, start_fresh=False)
    _handled(owner, [_record(0, i, key, m) for i, (_, key, m) in enumerate(rows)])
    assert owner.publish() and not owner.fenced
    assert owner.epochs[(0, "k0")] == store.claimed[(0, "k0")] == 1


def _labelled_rows(count: int) -> list[tuple[int, str, dict]]:
    """``count`` labelled points of one key (no late labels or forgets)."""
    return [row for row in _keyed_stream(keys=1, per_key=count + 2, partitions=1)
            if "y" in row[2] and "x" in row[2]][:count]


def _owner_of_partition_0(store: _MemoryStore, rows: list) -> ScopedModels:
    """A member that owns partition 0, read from its beginning, and has handled ``rows``."""
    owner, _ = _scoped(max_models=10, store=store)
    owner.assign({0})
    owner.settle({0: {"stream-svm.input:0": None}}, start_fresh=False)
    _handled(owner, [_record(0, i, key, m) for i, (_, key, m) in enumerate(rows)])
    return owner


def test_an_owner_whose_model_a_woken_zombie_published_above_commits_nothing_past_it():
    # Assigned the partition, a process was paused before it read its models; woken after
    # the group gave the partition to another, it claimed the next epoch and published a
    # state at offset 6. The real owner went on publishing under its lower epoch and
    # committed 12: the next owner restored the zombie's state (the higher epoch) and resumed
    # at 12, and offsets 6-11 were never learned. Reading on after its publish, the real
    # owner now finds the higher epoch and gives the partition up, committing nothing.
    rows = _labelled_rows(12)
    store = _MemoryStore()
    owner = _owner_of_partition_0(store, rows[:6])
    assert owner.publish() and owner.epochs[(0, "k0")] == 0
    zombie, _ = _scoped(max_models=10, store=store)
    zombie.assign({0})
    zombie.settle({0: {"stream-svm.input:0": 6}}, start_fresh=False)  # knows epoch 0
    zombie._get((0, "k0")).dirty = True
    assert zombie.publish() and store.records[(0, "k0")][2] == 1  # epoch 1, offset 6
    _handled(owner, [_record(0, 6 + i, key, m) for i, (_, key, m) in enumerate(rows[6:])])
    assert not owner.publish()
    assert owner.fenced == {0} and not owner.live
    assert owner.committable() == {}


def test_a_publish_that_cannot_be_read_back_holds_its_partitions_commit_until_it_can():
    from connectors.state_store import StateStoreError

    rows = _labelled_rows(6)
    store = _MemoryStore()
    owner = _owner_of_partition_0(store, rows)
    read_back = store.newest_epoch

    def unreadable(model_id, through_offset):
        raise StateStoreError("the broker did not answer")

    store.newest_epoch = unreadable
    assert not owner.publish()
    assert owner.committable() == {}  # not past a state that may have been overtaken
    assert not owner.publish()  # tried again, still unreadable
    store.newest_epoch = read_back
    assert owner.publish() and owner.committable() == {"stream-svm.input:0": len(rows)}


def test_a_state_topic_that_does_not_answer_costs_one_publish_not_one_per_model(caplog):
    # With the broker stalled, every model's publish waited for a request timeout of its own:
    # a stop with 24 changed models took 140 s, and a second stop request did not end it.
    from connectors.state_store import StateStoreError

    rows = [row for row in _keyed_stream(keys=6, per_key=3, partitions=1)
            if "y" in row[2] and "x" in row[2]]
    store = _MemoryStore()
    owner = _owner_of_partition_0(store, rows)
    publish, attempts = store.publish, []

    def stalled(model_id, *args):
        attempts.append(model_id)
        if model_id in unreachable:
            raise StateStoreError("publishing was not acknowledged within 10 s")
        return publish(model_id, *args)

    store.publish = stalled
    unreachable = {(0, f"k{k}") for k in range(6)}
    assert not owner.publish()
    assert len(attempts) == 1 and owner.dirty() == 6 and owner.committable() == {}
    assert "5 more changed models are not published now, but at the next publish" in caplog.text
    # One model's partition of the state topic stays unreachable: it goes last, and the others
    # are published meanwhile (not held up behind it round after round).
    unreachable, attempts[:] = {attempts[0]}, []
    assert not owner.publish()
    assert attempts[-1] in unreachable and len(attempts) == 6 and owner.dirty() == 1
    assert not owner.publish(give_up=lambda: True)  # a second stop request: nothing tried
    assert len(attempts) == 6 and "publishing given up with 1 changed models" in caplog.text
    unreachable = set()
    assert owner.publish() and owner.dirty() == 0
    assert owner.committable() == {"stream-svm.input:0": len(rows)}


def test_a_partition_model_resumes_where_its_newest_state_ends_not_past_it(caplog):
    # The newest state (the highest epoch: a woken zombie's) ends at 6 while the real owner,
    # under its lower epoch, had the group commit 12 before it learned of that state: the
    # next owner resumed at 12 and never learned 6-11.
    rows = _labelled_rows(12)
    config = load_config(None, overrides={"model.scope": "partition",
                                          **{f"model.{k}": str(v) for k, v in MODEL.items()}},
                         environ={})
    store = _MemoryStore()

    def member() -> ScopedModels:
        return ScopedModels(config, store, lambda model, metrics: Processor(model),
                            lambda: IncrementalSVC(**MODEL), Metrics(per_model=True))

    zombie = member()
    zombie.assign({0})
    zombie.settle({0: {"stream-svm.input:0": None}}, start_fresh=False)
    _handled(zombie, [_record(0, i, key, m) for i, (_, key, m) in enumerate(rows[:6])])
    assert zombie.publish() and store.records[(0, None)][1] == 6
    heir = member()
    heir.assign({0})
    with caplog.at_level(logging.WARNING, logger="connectors.scoped"):
        resume = heir.settle({0: {"stream-svm.input:0": 12}}, start_fresh=False)
    assert resume == {"stream-svm.input:0": 6}
    assert "behind the group's commit at 12: resuming at 6" in caplog.text
    _handled(heir, [_record(0, i, key, m) for i, (_, key, m) in enumerate(rows)])
    _assert_same_model(heir._get((0, None)).processor.model,
                       _reference([m for _, _, m in rows]), "model 0")


def test_a_consumer_group_that_never_completes_a_join_is_warned_of(caplog):
    # A broker kept a group rebalancing for good (every join named a leader that was gone):
    # the daemon read nothing for half an hour and said only "connected".
    from connectors.daemon import GROUP_STUCK_SECONDS, Daemon

    class Coordinator:
        def need_rejoin(self) -> bool:
            return False

    class Consumer:
        _coordinator = Coordinator()

    daemon = Daemon(load_config(None, overrides={"model.scope": "key"}, environ={}))
    daemon.models, _ = _scoped(max_models=10)
    daemon._consumer = Consumer()
    with caplog.at_level(logging.WARNING, logger="connectors.daemon"):
        daemon._watch_group()  # no join completed yet: waiting from now
        daemon._joining_since -= GROUP_STUCK_SECONDS - 1
        daemon._watch_group()
        assert caplog.text == ""
        daemon._joining_since -= 2
        daemon._watch_group()
        daemon._watch_group()  # once per interval
        assert caplog.text.count("has not completed a rebalance in 61 s") == 1
        caplog.clear()
        daemon._assigned(set())  # a join completed (none of the partitions for this member)
        daemon._watch_group()
        assert daemon._joining_since is None
        daemon._watch_group()
        assert caplog.text == ""


def test_label_partitions_assigned_without_their_input_partitions_are_not_read(caplog):
    # Members of one group with different kafka.label_topic settings (a rolling change): the
    # group gave a member label partitions whose input partitions another member owned, and
    # it made models of them too (two owners of one model: fenced, labels dead-lettered
    # unknown_id), or gave label partitions to no one, silently.
    from kafka import TopicPartition

    from connectors.daemon import Daemon

    class Consumer:
        def __init__(self) -> None:
            self.paused: set[Any] = set()

        def pause(self, *partitions: Any) -> None:
            self.paused.update(partitions)

        def seek_to_beginning(self, *partitions: Any) -> None:
            pass

    daemon = Daemon(load_config(None, overrides={"model.scope": "key",
                                                 "kafka.label_topic": "labels"}, environ={}))
    daemon.models, _ = _scoped(max_models=10)
    daemon._consumer = Consumer()
    assigned = {TopicPartition("stream-svm.input", 0), TopicPartition("stream-svm.input", 1),
                TopicPartition("labels", 1), TopicPartition("labels", 2)}
    with caplog.at_level(logging.ERROR, logger="connectors.daemon"):
        daemon._assigned(assigned)
    assert daemon.models.pending == {0, 1}  # (not 2: its models are another member's)
    assert daemon._consumer.paused == assigned  # (label partition 2 is never resumed)
    assert re.search(r"partitions \[2\] of the label topic labels were assigned here without "
                     r"the same partitions of stream-svm.input", caplog.text)
    assert re.search(r"partitions \[0\] of stream-svm.input were assigned here without the "
                     r"same partitions of the label topic labels", caplog.text)
    daemon.models.settle({p: {f"stream-svm.input:{p}": None, f"labels:{p}": None}
                          for p in (0, 1)}, start_fresh=False)
    assert daemon.models.owned == {0, 1}


def test_a_partition_settled_again_is_not_judged_on_the_high_watermark_from_before():
    # Given back its partition after a rejoin, the process sought to 60 while kafka-python
    # still held the high watermark it had fetched before (30): "the partition ends at 30",
    # and the daemon stopped for lost offsets.
    from kafka import TopicPartition

    from connectors.daemon import Daemon

    tp = TopicPartition("stream-svm.input", 0)

    class Cluster:
        def partitions_for_topic(self, topic: str) -> set[int]:
            return {0}

    class Consumer:
        _client = type("Client", (), {"cluster": Cluster()})()
        high = 30

        def assignment(self) -> set[Any]:
            return {tp}

        def highwater(self, partition: Any) -> int:
            return self.high

        def position(self, partition: Any, timeout_ms: int | None = None) -> int:
            return 60

    daemon = Daemon(load_config(None, overrides={"model.scope": "key"}, environ={}))
    daemon.models, _ = _scoped(max_models=10)
    daemon._consumer = consumer = Consumer()
    daemon._last_topic_check = float("inf")  # (the topic-id checks are not this test's)
    resets: list[str] = []
    daemon._partition_reset = lambda consumer, tp, kind, why: resets.append(why)
    daemon._highwater_at_seek["stream-svm.input:0"] = 30  # as _settle records it
    daemon._check_positions()
    assert resets == []
    consumer.high = 12  # a fetch since: the partition really ends before the model's offset
    daemon._check_positions()
    assert resets == ["the model resumes at offset 60, the partition ends at 12"]


def test_the_daemon_stops_fetching_a_fenced_partition_and_rejoins_the_group(tmp_path):
    from kafka import TopicPartition

    from connectors.daemon import Daemon

    class Coordinator:
        rejoins = 0

        def request_rejoin(self) -> None:
            self.rejoins += 1

    class Consumer:
        def __init__(self) -> None:
            self._coordinator = Coordinator()
            self.paused: list[Any] = []

        def assignment(self) -> set[Any]:
            return {TopicPartition("stream-svm.input", p) for p in (0, 1)}

        def pause(self, *partitions: Any) -> None:
            self.paused += partitions

    daemon = Daemon(load_config(None, overrides={"model.scope": "key"}, environ={}))
    daemon.models, _ = _scoped(max_models=10)
    daemon.models.fenced = {1}
    daemon._consumer = consumer = Consumer()
    daemon._rejoin_for_fenced()
    assert consumer.paused == [TopicPartition("stream-svm.input", 1)]
    assert consumer._coordinator.rejoins == 1 and daemon.models.fenced == set()


def test_a_partition_served_before_without_any_model_state_is_refused():
    from connectors.scoped import ScopedStateRefused

    models, _ = _scoped(max_models=4)
    models.assign({3})
    with pytest.raises(ScopedStateRefused, match="start-fresh"):
        models.settle({3: {"stream-svm.input:3": 120}}, start_fresh=False)
    models.settle({3: {"stream-svm.input:3": 120}}, start_fresh=True)
    assert models.owned == {3} and models.positions == {"stream-svm.input:3": 120}


def test_offsets_are_committed_only_once_the_partitions_models_are_published():
    rows = _keyed_stream(keys=4, per_key=5, partitions=2)
    models, _ = _scoped(max_models=10)
    models.assign({0, 1})
    models.settle({p: {f"stream-svm.input:{p}": None} for p in (0, 1)}, start_fresh=False)
    batch = [_record(p, i, key, m) for i, (p, key, m) in enumerate(
        r for r in rows if r[0] == 0)]
    models.process(batch)
    assert models.committable() == {}  # its models are not published yet
    assert not models.publish({0})  # nor can they be, before the batch's outputs are delivered
    models.delivered()
    assert models.publish({0})
    assert models.committable() == {"stream-svm.input:0": len(batch)}
    models.mark_committed(models.committable())
    assert models.committable() == {}  # nothing new
    # A revocation publishes what changed and hands the offsets over.
    models.process([_record(0, len(batch), "k0", {"id": "extra", "x": {"1": 0.1, "2": 0.2},
                                                   "y": True})])
    models.delivered()
    handed: list[dict[str, int]] = []
    models.revoke({0}, handed.append)
    assert handed == [{"stream-svm.input:0": len(batch) + 1}]
    assert not models.live and models.owned == {1}


def test_a_model_given_up_with_changes_not_published_is_not_kept_for_the_partitions_return():
    # A model with unpublished changes (the daemon gave its outputs up) must not be kept
    # aside for the partition's return: served again, the records read again from the
    # commit would be refused as duplicates of what it had learned, never answered.
    store = _MemoryStore()
    models, _ = _scoped(max_models=4, store=store)
    models.assign({0})
    models.settle({0: {"stream-svm.input:0": None}}, start_fresh=False)
    _handled(models, [_record(0, 0, "a", {"id": 0, "x": {"1": 0.1}, "y": True})])
    assert models.publish({0})
    models.mark_committed(models.committable())
    again = _record(0, 1, "a", {"id": 1, "x": {"1": -0.4}, "y": False})
    models.process([again])  # learned; its output is never delivered
    models.revoke({0}, lambda offsets: None, hand_over=False)
    models.assign({0})
    models.settle({0: {"stream-svm.input:0": 1}}, start_fresh=False)
    result, retry = models.process([again])  # read again from the commit
    assert not retry and not result.dead_letters
    assert [o.record["id"] for o in result.outputs] == [1]
    assert models.live[(0, "a")].processor.model.n_stored == 2


# -- processes on the embedded broker ----------------------------------------------------------


def _config_file(path: Path, servers: str, topics: dict[str, str], group: str,
                 **extra: Any) -> Path:
    settings = {
        "kafka": {"bootstrap_servers": servers, "input_topic": topics["input"],
                  "output_topic": topics["output"], "dead_letter_topic": topics["dead"],
                  "group_id": group, "max_batch": 10, "request_timeout_ms": 10000,
                  "session_timeout_ms": 3000, "heartbeat_interval_ms": 300,
                  "poll_timeout_ms": 50},
        "model": {"scope": "key", "max_models": 3, **MODEL},
        "checkpoint": {"every_messages": 20, "every_seconds": 0.5},
        "metrics": {"enabled": False},
    }
    for name, value in extra.items():
        section, _, key = name.partition("__")
        settings[section][key] = value
    lines = []
    for section, values in settings.items():
        lines.append(f"[{section}]")
        lines += [f"{key} = {json.dumps(value)}" for key, value in values.items()]
    path.write_text("\n".join(lines).replace("= false", "= false").replace(
        "= true", "= true") + "\n", encoding="utf-8")
    return path


def _produce_keyed(servers: str, topic: str, rows: list[tuple[int, str, dict]]) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=servers, acks="all", linger_ms=1)
    try:
        for partition, key, message in rows:
            producer.send(topic, key=key.encode(), value=json.dumps(message).encode(),
                          partition=partition)
        producer.flush(timeout=30)
    finally:
        producer.close(timeout=10)


class _Answered:
    """Follows the output topic: which (partition, offset) feature messages have an output,
    and which (id, op) forgets and labels an acknowledgement."""

    def __init__(self, servers: str, topic: str, partitions: int) -> None:
        from kafka import KafkaConsumer, TopicPartition

        self.consumer = KafkaConsumer(bootstrap_servers=servers, enable_auto_commit=False)
        self.consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
        self.consumer.seek_to_beginning()
        self.seen: set[tuple[int, int]] = set()
        self.acks: set[tuple[Any, str]] = set()

    def count(self) -> int:
        for records in self.consumer.poll(timeout_ms=50).values():
            for record in records:
                output = json.loads(record.value)
                if "op" in output:
                    self.acks.add((output["id"], output["op"]))
                else:
                    self.seen.add((output["source"]["partition"], output["source"]["offset"]))
        return len(self.seen) + len(self.acks)

    def close(self) -> None:
        self.consumer.close()


def _start(config: Path, log_path: Path, *flags: str) -> subprocess.Popen:
    command = [sys.executable, "-m", "connectors.cli", "--log-level", "INFO", "serve",
               "--config", str(config), *flags]
    with open(log_path, "ab") as log:
        return subprocess.Popen(command, env={**os.environ, "PYTHONPATH": str(ROOT)},
                                stdout=log, stderr=log, cwd=ROOT)


def _stop(processes: list[subprocess.Popen], tails: Any) -> None:
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    for process in processes:
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
            pytest.fail(f"a daemon did not stop on SIGTERM:\n{tails()}")


def _models_on(servers: str, state_topic: str, config: Path) -> dict[Any, Any]:
    """Every model's newest state on the state topic, as models."""
    settings = load_config(config, environ={})
    with StateStore(servers, state_topic, timeout=20) as store:
        states = store.restore()
    from connectors.scoped import GROUP_RECORD_ID

    group = states.pop(GROUP_RECORD_ID)  # the group's own record: scope, settings, partitions
    for model_id in [m for m in states if m[0] == "partition"]:
        del states[model_id]  # (a partition's record, written when it had no model)
    assert group.metadata["scope"] == settings.model.scope
    models = {}
    for model_id, state in states.items():
        arrays = {k: v for k, v in state.arrays.items() if not k.startswith("cache.")}
        models[model_id] = (restore_model(settings, arrays, state.metadata["model_meta"]),
                            state)
    return models


@pytest.mark.broker
@pytest.mark.slow
def test_three_daemons_share_the_partitions_and_survive_a_kill(broker, tmp_path):  # noqa: F811
    servers = broker.bootstrap_servers
    partitions, keys = 6, 12
    topics = {k: unique(f"scale-{k}") for k in ("input", "output", "dead")}
    ensure_topics({"bootstrap_servers": servers}, [topics["input"]], partitions=partitions)
    ensure_topics({"bootstrap_servers": servers}, [topics["output"], topics["dead"]])
    group = unique("scale-group")
    config = _config_file(tmp_path / "scale.toml", servers, topics, group)
    rows = _keyed_stream(keys=keys, per_key=60, partitions=partitions)
    half, three_quarters = len(rows) // 2, len(rows) * 3 // 4
    _produce_keyed(servers, topics["input"], rows[:half])
    answered = _Answered(servers, topics["output"], partitions)
    logs: list[Path] = []
    processes: list[subprocess.Popen] = []

    def start() -> None:
        # Each with a directory of its own, where evicted models are kept (3 live of ~4).
        logs.append(tmp_path / f"daemon-{len(logs)}.log")
        processes.append(_start(config, logs[-1], "--checkpoint-dir",
                                str(tmp_path / f"cache-{len(logs)}")))

    def tails() -> str:
        return "\n".join(f"--- {log.name}\n{log.read_text()[-1500:]}" for log in logs)

    def progress(target: int, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while answered.count() < target and time.monotonic() < deadline:
            for process in processes:
                if process.poll() is not None and process.returncode != -signal.SIGKILL:
                    pytest.fail(f"a daemon exited with {process.returncode}:\n{tails()}")
        assert answered.count() >= target, f"{answered.count()} of {target}:\n{tails()}"

    try:
        for _ in range(3):
            start()
        progress(half // 3, 90)
        victim = processes[1]
        victim.send_signal(signal.SIGKILL)  # mid-stream: its models have unpublished changes
        victim.wait(timeout=10)
        _produce_keyed(servers, topics["input"], rows[half:three_quarters])
        progress(half + (three_quarters - half) // 2, 90)
        start()  # the killed daemon comes back, and takes partitions again
        assert wait_for(lambda: "ready" in logs[-1].read_text(), 60), tails()
        _produce_keyed(servers, topics["input"], rows[three_quarters:])
        progress(len(rows), 120)
    finally:
        try:
            _stop(processes, tails)
        finally:
            answered.close()
    exits = [p.returncode for p in processes]
    assert exits[1] == -signal.SIGKILL and [e for i, e in enumerate(exits) if i != 1] == [0] * 3, (
        exits, tails())
    assert sum("partitions" in log.read_text() and "revoked" in log.read_text()
               for log in logs) >= 3  # the group rebalanced

    # Every input got at least one output, and valid input no dead letter.
    feature_offsets, acks = set(), set()
    next_offset = dict.fromkeys(range(partitions), 0)
    key_ends = {}  # the offset after each key's last message
    for partition, key, message in rows:
        if "x" in message:
            feature_offsets.add((partition, next_offset[partition]))
        else:
            acks.add((message["id"], message.get("op", "label")))
        next_offset[partition] += 1
        key_ends[key] = next_offset[partition]
    assert answered.seen == feature_offsets and answered.acks == acks
    assert read_all(servers, topics["dead"], idle=1.0) == []
    # Every key's model equals the one built here from that key's messages, in order, once.
    models = _models_on(servers, f"{group}.state", config)
    assert set(models) == {(k % partitions, f"k{k}") for k in range(keys)}
    for (partition, key), (model, state) in models.items():
        mine = [m for p, k, m in rows if k == key]
        _assert_same_model(model, _reference(mine), f"model {partition}/{key}")
        assert state.next_offset == key_ends[key]
    # The killed daemon's models moved: some models have states of more than one epoch.
    assert max(state.epoch for _, state in models.values()) >= 1


@pytest.mark.broker
def test_a_zombie_writer_does_not_overwrite_the_new_owners_state(broker):  # noqa: F811
    """Two owners of one model on the real state topic: the former owner publishes again
    with its older epoch after the new owner took over; every reader keeps the new owner's
    state, and a third owner restores that one."""
    servers = broker.bootstrap_servers
    topic = unique("zombie-state")
    rows = _keyed_stream(keys=2, per_key=30, partitions=1)
    first, second, third = rows[:20], rows[20:40], rows[40:]

    def owner() -> tuple[ScopedModels, Metrics]:
        store = StateStore(servers, topic, timeout=20)
        store.ensure_topic(partitions=1)
        models, metrics = _scoped(max_models=10, store=store)  # type: ignore[arg-type]
        models.assign({0})
        return models, metrics

    def feed(models: ScopedModels, part: list, start: int) -> None:
        _handled(models, [_record(0, start + i, key, m) for i, (_, key, m) in enumerate(part)])

    zombie, _ = owner()
    zombie.settle({0: {"stream-svm.input:0": None}}, start_fresh=False)
    feed(zombie, first, 0)
    assert zombie.publish()
    feed(zombie, second, 20)  # learned, not yet published: then it stalls
    successor, _ = owner()
    successor.settle({0: {"stream-svm.input:0": 20}}, start_fresh=False)
    feed(successor, second + third, 20)
    assert successor.publish()
    # It wakes up and publishes with its older epoch; reading on, it finds the newer one and
    # gives the partition up (nothing of it is committed).
    zombie_epochs = dict(zombie.epochs)
    assert not zombie.publish()
    assert zombie.fenced == {0} and not zombie.live
    try:
        with StateStore(servers, topic, timeout=20) as reader:
            states = reader.restore()
        for key in ("k0", "k1"):
            newest = states[(0, key)]
            assert newest.epoch == successor.epochs[(0, key)] > zombie_epochs[(0, key)]
            assert newest.next_offset == max(i + 1 for i, (_, k, _) in enumerate(rows)
                                             if k == key)
        heir, _ = owner()
        heir.settle({0: {"stream-svm.input:0": len(rows)}}, start_fresh=False)
        for key in ("k0", "k1"):
            restored = heir._get((0, key)).processor.model
            _assert_same_model(restored, _reference([m for _, k, m in rows if k == key]),
                               f"model 0/{key}")
        heir.store.close()
    finally:
        zombie.store.close()
        successor.store.close()


@pytest.mark.broker
def test_a_partition_record_on_the_real_state_topic_lets_its_next_owner_resume(
        broker):  # noqa: F811
    """A partition whose messages all were dead-lettered (keys too long to name a model) is
    recorded on the state topic; a second owner of it at the same time (one of the two is a
    former owner) finds the first's epoch and gives the partition up; the next owner resumes
    at the commit instead of refusing the partition, and goes on with the record's epochs."""
    from connectors.scoped import MAX_MODEL_KEY_BYTES

    servers = broker.bootstrap_servers
    topic = unique("partition-record-state")
    message = {"id": 1, "x": {"1": 0.5, "2": 0.1}, "y": True}
    long_key = "k" * (MAX_MODEL_KEY_BYTES + 1)
    stores = []

    def owner(committed: int | None) -> ScopedModels:
        store = StateStore(servers, topic, timeout=20)
        stores.append(store)
        store.ensure_topic(partitions=1)
        models, _ = _scoped(max_models=4, store=store)  # type: ignore[arg-type]
        models.check_group(1)
        models.assign({0})
        resume = models.settle({0: {"stream-svm.input:0": committed}}, start_fresh=False)
        assert resume == {"stream-svm.input:0": committed}
        return models

    try:
        first, second = owner(None), owner(None)  # both read the topic before any record
        for models in (first, second):
            result = _handled(models, [_record(0, 0, long_key, message)])[0]
            assert [d.record["reason"] for d in result.dead_letters] == ["malformed"]
        assert first.publish() and first.committable() == {"stream-svm.input:0": 1}
        assert not second.publish() and second.fenced == {0} and second.committable() == {}
        third = owner(1)  # (refused before the record: "holds no model of it")
        assert not third.live
        _handled(third, [_record(0, 1, long_key, {**message, "id": 2})])
        assert third.publish() and third.committable() == {"stream-svm.input:0": 2}
        with StateStore(servers, topic, timeout=20) as reader:
            record = reader.restore([("partition", 0)])[("partition", 0)]
        assert record.epoch == third.epochs[("partition", 0)] > first.epochs[("partition", 0)]
        assert record.metadata["offsets"] == {"stream-svm.input:0": 2}
        _handled(third, [_record(0, 2, "fine", {**message, "id": 3})])
        assert third.publish() and third.committable() == {"stream-svm.input:0": 3}
    finally:
        for store in stores:
            store.close()


@pytest.mark.broker
def test_a_zombie_that_has_read_the_new_owners_claim_does_not_claim_past_it(broker):  # noqa: F811
    """A former owner that has not learned it lost its partition first claims a model the new
    owner never had, and so reads the new owner's claims of the others: the epoch after those
    is free, but taking it would make the former owner's older states win. It gives the
    partition up instead, and every reader keeps the new owner's states."""
    servers = broker.bootstrap_servers
    topic = unique("zombie-view-state")
    rows = _keyed_stream(keys=3, per_key=10, partitions=1)
    only_zombie = [row for row in rows if row[1] == "k2"]
    shared = [row for row in rows if row[1] != "k2"]

    def owner() -> ScopedModels:
        store = StateStore(servers, topic, timeout=20)
        store.ensure_topic(partitions=1)
        models, _ = _scoped(max_models=10, store=store)  # type: ignore[arg-type]
        models.assign({0})
        models.settle({0: {"stream-svm.input:0": None}}, start_fresh=False)
        return models

    def feed(models: ScopedModels, part: list, start: int) -> None:
        _handled(models, [_record(0, start + i, key, m) for i, (_, key, m) in enumerate(part)])

    zombie = owner()
    successor = owner()
    try:
        feed(zombie, only_zombie, 0)  # first: its claim comes first, and reads the topic
        feed(zombie, shared[:20], len(only_zombie))
        feed(successor, shared, len(only_zombie))
        assert successor.publish()
        assert not zombie.publish()  # it claims k2, reads the others' claims, and stops
        assert zombie.fenced == {0} and not zombie.live and (0, "k0") not in zombie.epochs
        with StateStore(servers, topic, timeout=20) as reader:
            states = reader.restore()
        for key in ("k0", "k1"):
            assert states[(0, key)].epoch == successor.epochs[(0, key)] == 0
            assert states[(0, key)].next_offset == len(only_zombie) + max(
                i + 1 for i, (_, k, _) in enumerate(shared) if k == key)
    finally:
        zombie.store.close()
        successor.store.close()


@pytest.mark.broker
@pytest.mark.slow
def test_a_paused_daemon_loses_its_partitions_and_changes_nothing_when_it_wakes(
        broker, tmp_path):  # noqa: F811
    """SIGSTOP past the session timeout: the other daemon takes the partitions over; the
    paused one, woken up, drops its unpublished models (its commit is refused), rejoins, and
    every model still equals the reference at the end."""
    servers = broker.bootstrap_servers
    partitions = 2
    topics = {k: unique(f"pause-{k}") for k in ("input", "output", "dead")}
    ensure_topics({"bootstrap_servers": servers}, [topics["input"]], partitions=partitions)
    ensure_topics({"bootstrap_servers": servers}, [topics["output"], topics["dead"]])
    group = unique("pause-group")
    # A state every 40 messages of a daemon, none on the clock.
    config = _config_file(tmp_path / "pause.toml", servers, topics, group, model__max_models=10,
                          checkpoint__every_messages=40, checkpoint__every_seconds=3600)
    rows = _keyed_stream(keys=4, per_key=40, partitions=partitions)
    answered = _Answered(servers, topics["output"], partitions)
    logs = [tmp_path / "paused.log", tmp_path / "other.log"]
    processes: list[subprocess.Popen] = []

    def tails() -> str:
        return "\n".join(f"--- {log.name}\n{log.read_text()[-1500:]}" for log in logs
                         if log.exists())

    try:
        processes.append(_start(config, logs[0]))
        _produce_keyed(servers, topics["input"], rows[:60])  # one state (at 40), 20 unpublished
        assert wait_for(lambda: answered.count() >= 60, 60), tails()
        processes[0].send_signal(signal.SIGSTOP)
        processes.append(_start(config, logs[1]))
        assert wait_for(lambda: "ready" in logs[1].read_text(), 60), tails()
        _produce_keyed(servers, topics["input"], rows[60:120])
        assert wait_for(lambda: answered.count() >= 120, 60), tails()
        processes[0].send_signal(signal.SIGCONT)
        # Woken up, it may still handle a poll fetched before it noticed, and publish with
        # its old epoch (a zombie write), before its commit is refused and its partitions
        # are found lost, or before it reads the newer epoch back and gives them up.
        assert wait_for(lambda: "were lost" in logs[0].read_text()
                        or "given up here" in logs[0].read_text(), 60), tails()
        assert wait_for(lambda: logs[0].read_text().count("ready") >= 2, 60), tails()
        _produce_keyed(servers, topics["input"], rows[120:])
        assert wait_for(lambda: answered.count() >= len(rows), 60), tails()
    finally:
        for process in processes:
            process.send_signal(signal.SIGCONT)
        _stop(processes, tails)
        answered.close()
    assert [p.returncode for p in processes] == [0, 0], tails()
    assert read_all(servers, topics["dead"], idle=1.0) == []
    models = _models_on(servers, f"{group}.state", config)
    assert set(models) == {(k % partitions, f"k{k}") for k in range(4)}
    for (partition, key), (model, state) in models.items():
        _assert_same_model(model, _reference([m for _, k, m in rows if k == key]),
                           f"model {partition}/{key}")
        assert state.epoch >= 1  # the successor's (or later) epoch, never the zombie's


@pytest.mark.broker
@pytest.mark.slow
def test_one_sliding_window_per_river_gauge_across_a_kill(broker, tmp_path, shared_data):  # noqa: F811
    """The three rivers of ../shared/data as three keys (one sliding window each, window 1423,
    step 30) beside three Bananas keys, on a 3-partition topic served by two daemons; one is
    killed mid-stream and started again. Each gauge's window equals the window built here
    from that river's messages."""
    from stream_svm import SlidingWindowSVC

    servers = broker.bootstrap_servers
    partitions = 3
    sources = {
        "fisher": f"river-flow:{shared_data / 'fisher-river'}",
        "oldman": f"river-flow:{shared_data / 'more-rivers'}#oldman",
        "saugeen": f"river-flow:{shared_data / 'more-rivers'}#saugeen",
    }
    streams = {key: list(iter_source(source)) for key, source in sources.items()}
    for k in range(3):
        streams[f"bananas-{k}"] = [(x, y) for i, (x, y) in enumerate(BANANAS[:600]) if i % 3 == k]
    keys = list(streams)
    # Interleaved as they would arrive: one message of each gauge in turn.
    rows = []
    for i in range(max(len(s) for s in streams.values())):
        for index, key in enumerate(keys):
            if i < len(streams[key]):
                x, y = streams[key][i]
                rows.append((index % partitions, key, {"id": f"{key}-{i}", "x": x, "y": y}))
    topics = {k: unique(f"gauges-{k}") for k in ("input", "output", "dead")}
    ensure_topics({"bootstrap_servers": servers}, [topics["input"]], partitions=partitions)
    ensure_topics({"bootstrap_servers": servers}, [topics["output"], topics["dead"]])
    group = unique("gauges")
    window = {"window_size": 1423, "step": 30, "C": 1.0, "gamma": 1.0}
    config = _config_file(tmp_path / "gauges.toml", servers, topics, group,
                          model__type="SlidingWindowSVC", model__max_models=6,
                          **{f"model__{k}": v for k, v in window.items()},
                          kafka__max_batch=100, checkpoint__every_messages=300)
    answered = _Answered(servers, topics["output"], partitions)
    logs = [tmp_path / f"daemon-{i}.log" for i in range(3)]
    processes: list[subprocess.Popen] = []

    def tails() -> str:
        return "\n".join(f"--- {log.name}\n{log.read_text()[-1500:]}" for log in logs
                         if log.exists())

    two_thirds = len(rows) * 2 // 3
    try:
        _produce_keyed(servers, topics["input"], rows[:two_thirds])
        processes = [_start(config, logs[0]), _start(config, logs[1])]
        assert wait_for(lambda: answered.count() >= len(rows) // 3, 120), tails()
        processes[1].send_signal(signal.SIGKILL)
        processes[1].wait(timeout=10)
        # The survivor takes the killed daemon's partition over, then the restarted one
        # takes a share back.
        assert wait_for(lambda: "partitions [0, 1, 2] ready" in logs[0].read_text(), 60), \
            tails()
        assert wait_for(lambda: answered.count() >= two_thirds, 120), tails()
        processes.append(_start(config, logs[2]))
        assert wait_for(lambda: "ready" in logs[2].read_text(), 60), tails()
        _produce_keyed(servers, topics["input"], rows[two_thirds:])
        assert wait_for(lambda: answered.count() >= len(rows), 180), tails()
    finally:
        _stop(processes, tails)
        answered.close()
    assert [p.returncode for p in processes] == [0, -signal.SIGKILL, 0], tails()
    assert read_all(servers, topics["dead"], idle=1.0) == []
    models = _models_on(servers, f"{group}.state", config)
    assert set(models) == {(i % partitions, key) for i, key in enumerate(keys)}
    for (_, key), (model, _) in models.items():
        reference = SlidingWindowSVC(**window)
        for x, y in streams[key]:
            reference.learn_one(x, y)
        assert model.n_window == reference.n_window == min(1423, len(streams[key])
                                                           // 30 * 30), key
        frame = pd.DataFrame([x for x, _ in streams[key][-200:]])
        np.testing.assert_allclose(model.decision_function_many(frame),
                                   reference.decision_function_many(frame), rtol=0, atol=1e-9,
                                   err_msg=key)


def test_a_model_state_made_with_other_settings_is_refused_not_replaced():
    from connectors.scoped import ScopedStateRefused

    store = _MemoryStore()
    writer, _ = _scoped(max_models=4, store=store)
    writer.assign({0})
    writer.settle({0: {"stream-svm.input:0": None}}, start_fresh=False)
    _handled(writer, [_record(0, 0, "k0", {"id": 1, "x": {"1": 0.5, "2": 0.1}, "y": True})])
    assert writer.publish()
    reader, _ = _scoped(max_models=4, store=store)
    reader._settings = {**reader._settings, "C": 2.0}  # as if configured with C = 2
    reader.assign({0})
    # Refused when the partition is assigned, before any message of it is handled.
    with pytest.raises(ScopedStateRefused, match=r"C 1\.0 -> 2\.0"):
        reader.settle({0: {"stream-svm.input:0": 1}}, start_fresh=False)
    assert not reader.live and not reader.owned and store.publishes == 1  # nothing replaced
    # And when fetched (a state written since the partition was assigned).
    with pytest.raises(ScopedStateRefused, match=r"C 1\.0 -> 2\.0"):
        reader._processor_from((0, "k0"), store.fetch((0, "k0")))


def test_the_groups_record_refuses_another_scope_settings_or_partition_count():
    from connectors.scoped import ScopedStateRefused

    store = _MemoryStore()
    first, _ = _scoped(max_models=4, store=store)
    first.check_group(6)
    # A new group's record is written at once: a daemon of the group with other settings,
    # started before any message, was accepted while no model had been published (and the
    # group's models were mixed).
    assert store.publishes == 1
    early, _ = _scoped(max_models=4, store=store)
    early._settings = {**early._settings, "gamma": 2.0}
    with pytest.raises(ScopedStateRefused, match="gamma"):
        early.check_group(6)
    first.assign({0})
    first.settle({0: {"stream-svm.input:0": None}}, start_fresh=False)
    _handled(first, [_record(0, 0, "a", {"id": 1, "x": {"1": 0.5, "2": 0.1}, "y": True})])
    assert first.publish()
    assert store.publishes == 2  # the group's record, then the model's state
    first.check_group(6)  # the same settings pass
    other_scope, _ = _scoped(max_models=4, store=store)
    other_scope.scope = "partition"
    with pytest.raises(ScopedStateRefused, match="scope 'key' -> 'partition'"):
        other_scope.check_group(6)
    other_model, _ = _scoped(max_models=4, store=store)
    other_model._settings = {**other_model._settings, "gamma": 2.0}
    with pytest.raises(ScopedStateRefused, match="gamma"):
        other_model.check_group(6)
    more_partitions, _ = _scoped(max_models=4, store=store)
    with pytest.raises(ScopedStateRefused, match=r"has 8 partitions.*had 6"):
        more_partitions.check_group(8)
    # Another group (or input topic) given the same state topic: its keys continued this
    # group's models.
    for setting, value in (("group_id", "another-group"), ("input_topic", "another.input")):
        other_stream, _ = _scoped(max_models=4, store=store)
        setattr(other_stream.config.kafka, setting, value)
        with pytest.raises(ScopedStateRefused, match=r"belong to consumer group 'stream-svm' "
                                                     r"reading stream-svm\.input"):
            other_stream.check_group(6)
    # A partition beyond the recorded count, assigned while running, is refused too.
    first.assign({6})
    with pytest.raises(ScopedStateRefused, match=r"partitions \[6\]"):
        first.settle({6: {"stream-svm.input:6": None}}, start_fresh=False)
    assert store.publishes == 2


def test_of_two_daemons_starting_a_group_at_once_the_one_not_recorded_last_is_refused():
    from connectors.scoped import GROUP_RECORD_ID, ScopedStateRefused

    store = _MemoryStore()
    first, _ = _scoped(max_models=4, store=store)
    second, _ = _scoped(max_models=4, store=store)
    second._settings = {**second._settings, "gamma": 2.0}
    own_publish = store.publish

    def then_the_other(*args):  # both found no record; the second writes just after
        result = own_publish(*args)
        store.publish = own_publish
        own_publish(GROUP_RECORD_ID, {}, second._group_metadata(6), 0, 0, 1)
        return result

    store.publish = then_the_other
    with pytest.raises(ScopedStateRefused, match="gamma"):
        first.check_group(6)
    second.check_group(6)  # its record is the one the topic keeps


def test_an_evicted_model_on_disk_is_not_used_once_a_newer_state_exists(tmp_path):
    store = _MemoryStore()
    models, metrics = _scoped(max_models=1, store=store, cache_dir=tmp_path)
    models.assign({0})
    models.settle({0: {"stream-svm.input:0": None}}, start_fresh=False)
    point = {"1": 0.5, "2": 0.1}
    _handled(models, [_record(0, 0, "a", {"id": 1, "x": point, "y": True})])
    _handled(models, [_record(0, 1, "b", {"id": 2, "x": point, "y": False})])  # evicts "a"
    [stale] = tmp_path.glob("0-*.npz")
    # Another owner publishes a newer state of "a" (one more point) meanwhile.
    other, _ = _scoped(max_models=4, store=store)
    other.assign({0})
    other.settle({0: {"stream-svm.input:0": 1}}, start_fresh=False)
    _handled(other, [_record(0, 2, "a", {"id": 3, "x": {"1": -0.5, "2": 0.3}, "y": False})])
    assert other.publish()
    models.store.newest = store.newest  # what this process's store reads now
    _handled(models, [_record(0, 3, "a", {"id": 4, "x": {"1": 0.0, "2": 0.9}, "y": True})])
    assert metrics.scale_out[3].labels(source="topic")._value.get() == 1  # the newer state
    assert models.live[(0, "a")].processor.model.n_stored == 3
    assert not stale.exists()  # the stale copy is gone


def test_a_copy_on_disk_put_in_the_place_of_another_models_is_not_taken_for_it(tmp_path,
                                                                              caplog):
    # Copies of evicted models are files named by their model, epoch and sequence: one
    # model's copy put in another's place (by hand, or a tool) was loaded as that model, which
    # then held the other key's points and dead-lettered its own ids' forgets, silently.
    models, metrics = _scoped(max_models=1, cache_dir=tmp_path)
    models.assign({0})
    models.settle({0: {"stream-svm.input:0": None}}, start_fresh=False)
    _handled(models, [_record(0, 0, "a", {"id": 1, "x": {"1": 0.5, "2": 0.1}, "y": True})])
    _handled(models, [_record(0, 1, "b", {"id": 2, "x": {"1": -0.5, "2": 0.2}, "y": False})])
    _handled(models, [_record(0, 2, "c", {"id": 3, "x": {"1": 0.1, "2": 0.9}, "y": True})])
    copies = {model_id: path for model_id, path in models._on_disk.items()}
    assert set(copies) == {(0, "a"), (0, "b")}
    copies[(0, "a")].write_bytes(copies[(0, "b")].read_bytes())  # b's copy as a's file
    with caplog.at_level("WARNING", logger="connectors.scoped"):
        _handled(models, [_record(0, 3, "a", {"id": 4, "x": {"1": 0.0, "2": -0.4},
                                               "y": False})])
    assert f"the file {copies[(0, 'a')]} does not hold model" in caplog.text
    assert metrics.scale_out[3].labels(source="topic")._value.get() == 1
    model = models.live[(0, "a")].processor.model
    assert sorted(model.stored_keys()) == [1, 4]  # a's own points, not b's
    _handled(models, [_record(0, 4, "b", {"id": 5, "x": {"1": 0.3, "2": 0.3}, "y": True})])
    assert metrics.scale_out[3].labels(source="disk")._value.get() == 1  # b's own copy: used


def test_copies_a_full_disk_refuses_are_said_once_a_while_with_a_count(tmp_path, caplog,
                                                                      monkeypatch):
    # A full disk failed every eviction's copy, each with a warning of its own: hundreds of
    # lines in seconds with max_models = 2.
    import errno

    import connectors.scoped as scoped

    clock = [1000.0]
    monkeypatch.setattr("connectors.scoped.time.monotonic", lambda: clock[0])
    real_open = os.open

    def full(path, *args, **kwargs):
        if str(path).endswith(".partial"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(scoped.os, "open", full)
    models, _ = _scoped(max_models=1, cache_dir=tmp_path)
    models.assign({0})
    models.settle({0: {"stream-svm.input:0": None}}, start_fresh=False)
    with caplog.at_level("WARNING", logger="connectors.scoped"):
        for offset in range(6):  # each message a new key: an eviction each, from the second
            _handled(models, [_record(0, offset, f"k{offset}",
                                      {"id": offset, "x": {"1": 0.1 * offset}, "y": True})])
        clock[0] += models.FETCH_WARNING_SECONDS
        _handled(models, [_record(0, 6, "k6", {"id": 6, "x": {"1": 0.6}, "y": True})])
    said = [r.getMessage() for r in caplog.records if "on disk failed" in r.getMessage()]
    assert len(said) == 2, said
    assert "No space left on device), once since" in said[0]
    assert "), 5 times since this was last said (at most once per 30 s)" in said[1]


def _global_daemon_on_a_keyed_group(servers: str, tmp_path: Path, name: str,
                                    change: Callable[[str], None] | None = None) -> Any:
    """A global daemon (until drained) of a new consumer group whose state topic holds the
    group record of models per key; ``change(state_topic)`` runs before it is made."""
    from connectors.daemon import Daemon
    from connectors.scoped import GROUP_RECORD_ID

    group = unique(f"{name}-group")
    topics = {k: unique(f"{name}-{k}") for k in ("input", "output", "dead")}
    ensure_topics({"bootstrap_servers": servers}, list(topics.values()))
    with StateStore(servers, f"{group}.state", timeout=20) as store:
        store.ensure_topic()
        store.publish(GROUP_RECORD_ID, {}, {"format": 1, "scope": "key", "partitions": 1},
                      0, 0, 1)
    if change is not None:
        change(f"{group}.state")
    config = load_config(None, overrides={
        "kafka.bootstrap_servers": servers, "kafka.input_topic": topics["input"],
        "kafka.output_topic": topics["output"], "kafka.dead_letter_topic": topics["dead"],
        "kafka.group_id": group, "checkpoint.dir": str(tmp_path / "ck"),
        "metrics.enabled": "false", "kafka.request_timeout_ms": "10000"}, environ={})
    return Daemon(config, until_drained=True)


@pytest.mark.broker
def test_a_global_daemon_is_refused_on_a_group_of_per_key_models(broker, tmp_path):  # noqa: F811
    from connectors.daemon import StartRefused

    daemon = _global_daemon_on_a_keyed_group(broker.bootstrap_servers, tmp_path, "keyed")
    with pytest.raises(StartRefused, match="one model per key"):
        daemon.run()
    assert daemon.summary.exit_code == 1 and daemon.summary.messages == 0


@pytest.mark.broker
def test_a_state_topic_of_a_newer_stream_svm_refuses_the_start(broker, tmp_path):  # noqa: F811
    # Retried as a broker that did not answer, it went on for ever (no retry reads it).
    from connectors.daemon import StartRefused
    from connectors.state_store import _PREFIX, FORMAT_VERSION
    from tests.test_state_store import raw_records, send_raw

    servers = broker.bootstrap_servers

    def newer(topic: str) -> None:  # the group record in the next format
        [record] = [r for r in raw_records(servers, topic) if r.value is not None]
        magic, _, length = _PREFIX.unpack_from(record.value)
        send_raw(servers, topic, [(record.key, _PREFIX.pack(
            magic, FORMAT_VERSION + 1, length) + record.value[_PREFIX.size:])],
            partition=record.partition)

    daemon = _global_daemon_on_a_keyed_group(servers, tmp_path, "newer", newer)
    with pytest.raises(StartRefused, match=r"written by a newer stream-svm.*Nothing was changed"):
        daemon.run()
    assert daemon.summary.exit_code == 1 and daemon.summary.messages == 0


def test_a_model_that_cannot_be_fetched_holds_its_messages_and_warns_once_a_while(
        caplog, monkeypatch):
    """A model indexed on the state topic whose state cannot be read (the broker times out,
    or no whole state is left): its messages wait (read again from the first of them) and
    every attempt is counted, but the warning comes once per FETCH_WARNING_SECONDS, not at
    every poll; once the state can be read the model is restored and said so."""
    import logging

    from connectors.state_store import StateStoreError

    store = _MemoryStore()
    owner, _ = _scoped(max_models=4, store=store)
    owner.assign({0})
    owner.settle({0: {"stream-svm.input:0": None}}, start_fresh=False)
    point = {"1": 0.5, "2": 0.1}
    _handled(owner, [_record(0, 0, "a", {"id": 1, "x": point, "y": True})])
    assert owner.publish()
    models, metrics = _scoped(max_models=4, store=store)
    models.assign({0})
    models.settle({0: {"stream-svm.input:0": 1}}, start_fresh=False)
    readable = store.fetch

    def unreadable(model_id):
        raise StateStoreError("state topic memory.state: chunk 0 of 'a' is gone (simulated)")

    monkeypatch.setattr(store, "fetch", unreadable)
    clock = [1000.0]
    monkeypatch.setattr("connectors.scoped.time.monotonic", lambda: clock[0])
    caplog.set_level(logging.DEBUG, logger="connectors.scoped")
    message = {"id": 2, "x": {"1": -0.5, "2": 0.3}, "y": False}
    for _ in range(5):
        clock[0] += 1.0
        result, retry = models.process([_record(0, 1, "a", message)])
        models.delivered()
        assert retry == {"stream-svm.input:0": 1} and not result.outputs
    clock[0] += models.FETCH_WARNING_SECONDS
    models.process([_record(0, 1, "a", message)])
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING
                and "cannot be fetched" in r.getMessage()]
    assert len(warnings) == 2  # the first attempt, and one FETCH_WARNING_SECONDS later
    assert metrics.scale_out[4]._value.get() == 6
    assert (0, "a") not in models.live
    monkeypatch.setattr(store, "fetch", readable)
    result, retry = models.process([_record(0, 1, "a", message)])
    assert retry == {} and len(result.outputs) == 1
    assert models.live[(0, "a")].processor.model.n_stored == 2
    assert any("fetched from the state topic after all" in r.getMessage()
               for r in caplog.records)


def test_models_that_cannot_be_fetched_hold_their_partition_from_their_first_message(
        monkeypatch):
    # With two unfetchable models in one partition, the partition must be read again from
    # the first message of either: from the last model's, the other's earlier messages
    # would be skipped, never answered nor learned. Their messages interleave here, and a
    # readable model's messages after them are answered but not committed past.
    from connectors.state_store import StateStoreError

    store = _MemoryStore()
    owner, _ = _scoped(max_models=4, store=store)
    owner.assign({0})
    owner.settle({0: {"stream-svm.input:0": None}}, start_fresh=False)
    for offset, key in enumerate("abc"):
        _handled(owner, [_record(0, offset, key, {"id": offset, "x": {"1": offset / 3},
                                                  "y": offset % 2 == 0})])
    assert owner.publish()
    models, _ = _scoped(max_models=4, store=store)
    models.assign({0})
    models.settle({0: {"stream-svm.input:0": 3}}, start_fresh=False)
    readable = store.fetch

    def unreadable(model_id):
        if model_id[1] in ("a", "b"):
            raise StateStoreError(f"chunk 0 of {model_id[1]!r} is gone (simulated)")
        return readable(model_id)

    monkeypatch.setattr(store, "fetch", unreadable)
    batch = [_record(0, 3 + i, key, {"id": 10 + i, "x": {"1": i / 5}, "y": i % 2 == 0})
             for i, key in enumerate("abcab")]
    result, retry = models.process(batch)
    models.delivered()
    assert retry == {"stream-svm.input:0": 3}  # the first of a's and b's messages
    assert [o.record["id"] for o in result.outputs] == [12]  # c's message only
    assert models.positions.get("stream-svm.input:0", 3) <= 3


def test_the_first_eviction_clears_copies_a_previous_run_left_on_disk(tmp_path):
    # A daemon killed with evicted models on disk; the same directory then served another
    # group, whose model of the same key had the same epoch and sequence: the old copy, another
    # stream's model, was taken for the new one's.
    cache = tmp_path / "models"
    cache.mkdir()
    left = cache / "0-0123456789abcdef0123456789abcdef.0.20.npz"
    left.write_bytes(b"another stream's model")
    (cache / "1-x.0.3.partial").write_bytes(b"half written")
    models, _ = _scoped(max_models=1, cache_dir=cache)
    # Nothing is touched until the first eviction (a start refused after this changes
    # nothing on disk); then the old copies go before any copy of this run is written.
    assert sorted(path.name for path in cache.iterdir()) == ["0-0123456789abcdef0123456789abcdef"
                                                             ".0.20.npz", "1-x.0.3.partial"]
    models.assign({0})
    models.settle({0: {"stream-svm.input:0": None}}, start_fresh=False)
    rows = _keyed_stream(keys=2, per_key=3, partitions=1)
    for offset, (partition, key, message) in enumerate(rows):
        _handled(models, [_record(partition, offset, key, message)])
    assert models.evictions > 0
    assert not left.exists() and not (cache / "1-x.0.3.partial").exists()


def test_a_read_only_copy_directory_does_not_stop_the_stream(tmp_path, monkeypatch):
    rows = _keyed_stream(keys=3, per_key=6, partitions=1)
    models, _ = _scoped(max_models=1, cache_dir=tmp_path / "models")
    models.assign({0})
    models.settle({0: {"stream-svm.input:0": None}}, start_fresh=False)

    def refuse(self, missing_ok=False):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "unlink", refuse)
    for offset, (partition, key, message) in enumerate(rows):  # evictions and restores
        result, again = models.process([_record(partition, offset, key, message)])
        models.delivered()
        assert not again and not result.dead_letters and len(result.outputs) == 1
    assert models.evictions > 0 and models.restores > 0


def test_a_key_too_long_to_name_a_model_is_dead_lettered_and_the_partition_goes_on():
    # A 600 KB key made a state no broker accepts: the partition's commits stayed behind it.
    from connectors.scoped import MAX_MODEL_KEY_BYTES

    models, metrics = _scoped(max_models=4)
    models.assign({0})
    models.settle({0: {"stream-svm.input:0": None}}, start_fresh=False)
    message = {"id": 1, "x": {"1": 0.5, "2": 0.1}, "y": True}
    result, again = models.process([
        _record(0, 0, "k" * (MAX_MODEL_KEY_BYTES + 1), message),
        _record(0, 1, "fine", {**message, "id": 2}),
    ])
    # Counted as every other message is (stream_svm_messages_total fell short of the input).
    assert b'stream_svm_messages_total{outcome="dead_lettered"} 1.0' in metrics.render()
    assert b'stream_svm_messages_total{outcome="learned"} 1.0' in metrics.render()
    models.delivered()
    assert not again and [o.record["id"] for o in result.outputs] == [2]
    (letter,) = result.dead_letters
    assert letter.record["reason"] == "malformed" and "may have at most 1024" in \
        letter.record["error"]
    assert list(models.live) == [(0, "fine")]
    assert models.positions["stream-svm.input:0"] == 2


def test_a_new_group_says_that_its_models_start_empty(caplog):
    # Daemons restarted on a broker that lost its data meet a new group: that every model
    # started over was said at INFO only ("0 models on ...").
    store = _MemoryStore()
    first, _ = _scoped(max_models=4, store=store)
    with caplog.at_level(logging.WARNING, logger="connectors.scoped"):
        first.check_group(6)
        assert "a new consumer group 'stream-svm' on memory.state: every key starts a new, " \
            "empty model (as expected at the group's first start; if this group served " \
            "models before, they are gone" in caplog.text
        caplog.clear()
        again, _ = _scoped(max_models=4, store=store)
        again.check_group(6)  # the group exists now: nothing to say
        assert caplog.text == ""


def test_settling_partitions_reads_their_states_without_a_line_of_its_own():
    # The store's own summary line ("restored 1 models from 1 records", the group's record
    # counted as a model) came at INFO just before "partitions [0] ready: 0 models".
    store = _MemoryStore()
    levels = []
    real, real_index = store.restore, store.index

    def restore(*args, **kwargs):
        levels.append(kwargs.get("log_level"))
        return real(*args, **kwargs)

    def index(*args, **kwargs):
        levels.append(kwargs.get("log_level"))
        return real_index(*args, **kwargs)

    store.restore, store.index = restore, index
    models, _ = _scoped(max_models=4, store=store)
    models.check_group(6)
    models.assign({0})
    models.settle({0: {"stream-svm.input:0": None}}, start_fresh=False)
    assert levels and all(level == logging.DEBUG for level in levels)


def _served_group(store: _MemoryStore) -> ScopedModels:
    """A group that started on ``store`` and published the state of one model."""
    first, _ = _scoped(max_models=4, store=store)
    first.check_group(6)
    first.assign({0})
    first.settle({0: {"stream-svm.input:0": None}}, start_fresh=False)
    _handled(first, [_record(0, 0, "a", {"id": 1, "x": {"1": 0.5, "2": 0.1}, "y": True}),
                     _record(0, 1, "b", {"id": 2, "x": {"1": -0.5, "2": 0.3}, "y": False})])
    assert first.publish()
    return first


def test_model_states_without_their_groups_record_are_refused_at_start(caplog):
    # The state topic was recreated while the group ran: the states published since are
    # there, the group's record (written at the group's start) is not. A daemon starting
    # then took the group for a new one, and every model not published since started empty.
    from connectors.scoped import GROUP_RECORD_ID, ScopedStateRefused

    store = _MemoryStore()
    _served_group(store)
    del store.records[GROUP_RECORD_ID]
    publishes = store.publishes
    later, _ = _scoped(max_models=4, store=store)
    with pytest.raises(ScopedStateRefused, match=r"holds 2 model states but not the record "
                                                 r"of their consumer group.*--start-fresh"):
        later.check_group(6)
    assert store.publishes == publishes  # nothing written
    fresh, _ = _scoped(max_models=4, store=store)
    fresh.config.checkpoint.start_fresh = True
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="connectors.scoped"):
        fresh.check_group(6)
    assert "the models found are kept" in caplog.text
    assert "a new consumer group" not in caplog.text  # it is not one
    assert GROUP_RECORD_ID in store.records
    again, _ = _scoped(max_models=4, store=store)
    again.check_group(6)  # the group's record is back


def test_a_group_record_lost_while_running_stops_the_daemon_that_is_assigned_partitions():
    from connectors.scoped import GROUP_RECORD_ID, ScopedStateRefused

    store = _MemoryStore()
    first = _served_group(store)
    other, _ = _scoped(max_models=4, store=store)
    other.check_group(6)
    # Later the topic is recreated, and the first daemon publishes into the new one.
    store.records.clear()
    _handled(first, [_record(0, 2, "a", {"id": 3, "x": {"1": 0.4, "2": 0.2}, "y": True})])
    assert first.publish()
    # The partition with model "b" (never published since) moves to the other daemon.
    other.assign({0})
    with pytest.raises(ScopedStateRefused, match=r"no longer holds the record of consumer "
                                                 r"group 'stream-svm'.*partitions \[0\]"):
        other.settle({0: {"stream-svm.input:0": 3}}, start_fresh=False)
    assert not other.owned and not other.live
    assert GROUP_RECORD_ID not in store.records
    other.settle({0: {"stream-svm.input:0": 3}}, start_fresh=True)
    assert other.owned == {0} and GROUP_RECORD_ID in store.records


def test_a_group_record_rewritten_with_other_settings_is_refused_when_partitions_are_assigned():
    from connectors.scoped import GROUP_RECORD_ID, ScopedStateRefused

    store = _MemoryStore()
    first = _served_group(store)
    imposter, _ = _scoped(max_models=4, store=store)
    imposter._settings = {**imposter._settings, "gamma": 2.0}
    store.publish(GROUP_RECORD_ID, {}, imposter._group_metadata(6), 0, 0, 1)
    first.assign({1})
    with pytest.raises(ScopedStateRefused, match="gamma"):
        first.settle({1: {"stream-svm.input:1": None}}, start_fresh=False)


class _RefusingProducer:
    """Every output fails (the output topic is not authorized, say)."""

    def partitions_for(self, topic: str) -> set[int]:
        return {0}

    def send(self, topic: str, key: Any = None, value: bytes = b"", partition: Any = None
             ) -> Any:
        from kafka.errors import TopicAuthorizationFailedError

        class Failed:
            is_done = True

            def failed(self) -> bool:
                return True

            def succeeded(self) -> bool:
                return False
        Failed.error = TopicAuthorizationFailedError(topic)
        return Failed()

    def flush(self, timeout: float | None = None) -> None:
        pass


class _CommitsSeen:
    def __init__(self) -> None:
        self.commits: list[Any] = []

    def commit(self, offsets: Any) -> None:
        self.commits.append(offsets)


def test_no_offset_is_committed_past_outputs_given_up_on_a_second_stop():
    # A partition whose batch made no model to publish (only keys too long to name one, each
    # dead-lettered) was committed past dead letters that were never written.
    from connectors.daemon import Daemon
    from connectors.scoped import MAX_MODEL_KEY_BYTES

    models, metrics = _scoped(max_models=4)
    models.config.retry.initial_backoff_seconds = 0.001
    models.config.retry.max_backoff_seconds = 0.001
    daemon = Daemon(models.config, metrics=metrics)
    daemon.models = models
    daemon._producer = _RefusingProducer()
    daemon._consumer = consumer = _CommitsSeen()
    models.assign({0})
    models.settle({0: {"stream-svm.input:0": None}}, start_fresh=False)
    daemon.stop()
    daemon._second_stop.wait = lambda delay=None: daemon.stop()  # a second stop while retrying
    message = {"id": 1, "x": {"1": 0.5, "2": 0.1}, "y": True}
    daemon._last_commit = 0.0
    daemon._handle([_record(0, 0, "k" * (MAX_MODEL_KEY_BYTES + 1), message)])
    assert daemon._undelivered and models.positions["stream-svm.input:0"] == 1
    daemon._commit()
    assert consumer.commits == []


# Model states across owners, formats and limits, against the in-memory state store.

_INPUT0 = "stream-svm.input:0"  # (partition 0 of the default input topic)


def _scoped_point(offset: int, label: bool) -> dict:
    return {"id": offset, "x": {"1": 0.3 * offset - 1.0, "2": 0.1 * offset}, "y": label}


def _published_model(store: _MemoryStore, labels: tuple[bool, ...] = (True,)) -> ScopedModels:
    """The owner of partition 0 that learned model "a" from ``labels`` and published it."""
    writer, _ = _scoped(max_models=4, store=store)
    writer.assign({0})
    writer.settle({0: {_INPUT0: None}}, start_fresh=False)
    _handled(writer, [_record(0, offset, "a", _scoped_point(offset, label))
                      for offset, label in enumerate(labels)])
    assert writer.publish({0})
    return writer


def test_a_model_kept_for_its_partitions_return_is_not_used_once_another_owner_published_it():
    # A process gives partition 0 up (its clean models are kept aside, in case it comes
    # back); another process owns it meanwhile and publishes model "a" with what it learned.
    # Given the partition back, the first process must take that newer state: its own copy
    # lacks the other owner's points, and the records they came from lie before the commit,
    # never read again.
    store = _MemoryStore()
    first = _published_model(store)
    first.mark_committed(first.committable())
    first.revoke({0}, first.mark_committed)
    assert (0, "a") in first._retained  # kept aside: clean, published

    second, _ = _scoped(max_models=4, store=store)
    second.assign({0})
    second.settle({0: {_INPUT0: 1}}, start_fresh=False)
    _handled(second, [_record(0, 1, "a", _scoped_point(1, False))])
    assert second.publish({0})
    handed: list[dict[str, int]] = []
    second.revoke({0}, handed.append)
    assert handed == [{_INPUT0: 2}]

    first.assign({0})
    first.settle({0: {_INPUT0: 2}}, start_fresh=False)
    _handled(first, [_record(0, 2, "a", _scoped_point(2, True))])
    model = first.live[(0, "a")].processor.model
    assert model.n_stored == 3  # its own point, the other owner's, and the new one
    assert sorted(map(str, model.stored_keys())) == ["0", "1", "2"]


def test_a_model_state_of_another_format_is_refused_not_read_as_this_one():
    # The layout of a model's state has a version: a state written in another layout (by a
    # newer stream-svm, after an upgrade that was rolled back) must stop the partition,
    # never be read as this version's layout nor replaced by a new model.
    store = _MemoryStore()
    _published_model(store)
    payload, next_offset, epoch, sequence = store.records[(0, "a")]
    arrays, metadata = store._codec._decode_payload(payload)
    metadata["format"] = 2
    store.records[(0, "a")] = (store._codec._encode_payload(arrays, metadata), next_offset,
                               epoch, sequence)
    reader, _ = _scoped(max_models=4, store=store)
    reader.assign({0})
    with pytest.raises(ScopedStateRefused, match="format 2"):
        reader.settle({0: {_INPUT0: 1}}, start_fresh=False)
    assert not reader.live and not reader.owned
    with pytest.raises(ScopedStateRefused, match="format 2"):
        reader._processor_from((0, "a"), store.fetch((0, "a")))


def test_an_owner_that_finds_its_model_claimed_since_it_was_given_it_publishes_nothing():
    # Given partition 0 when model "a" had epoch 0, this process finds at its first publish
    # that another process claimed epoch 1 since (the group moved the partition on, and
    # this one has not seen the rebalance yet). Claiming epoch 2 would put its state above
    # the new owner's, whose learning would be lost: the partition is given up instead.
    store = _MemoryStore()
    _published_model(store)
    owner, _ = _scoped(max_models=4, store=store)
    owner.assign({0})
    owner.settle({0: {_INPUT0: 1}}, start_fresh=False)
    assert owner.known_epochs == {(0, "a"): 0}
    assert store.claim_epoch((0, "a"), newest_known=0) == 1  # the new owner's claim
    _handled(owner, [_record(0, 1, "a", _scoped_point(1, False))])
    publishes = store.publishes
    assert not owner.publish({0})
    assert store.publishes == publishes  # nothing written over the new owner's epoch
    assert owner.fenced == {0} and owner.committable() == {}


def test_a_model_sequence_grows_with_every_publish_of_its_epoch():
    # Within an epoch a model's states alternate between two slots by their sequence: a
    # publish that reused the last sequence is refused by the state topic ("sequences must
    # grow"), and the model, never published again, would hold its partition's commits back.
    store = _MemoryStore()
    models, _ = _scoped(max_models=4, store=store)
    models.assign({0})
    models.settle({0: {_INPUT0: None}}, start_fresh=False)
    sequences = []
    for offset in range(3):
        _handled(models, [_record(0, offset, "a", _scoped_point(offset, offset % 2 == 0))])
        assert models.publish({0})
        sequences.append(store.records[(0, "a")][3])
    assert sequences == [1, 2, 3]
    assert models.committable() == {_INPUT0: 3}


def test_a_committed_group_without_its_record_or_any_state_is_refused_before_writing_one():
    # Offsets committed by the group, and no record of the group nor any model state on the
    # state topic: a daemon of model.scope = "global" served the group. Writing the group's
    # record now would bind the group to this scope (the global daemon refused from then on)
    # and start new, empty models from the committed offsets.
    store = _MemoryStore()
    models, _ = _scoped(max_models=4, store=store)
    with pytest.raises(ScopedStateRefused, match="committed offsets"):
        models.check_group(2, served={_INPUT0: 120})
    assert store.publishes == 0 and store.records == {}


def test_a_model_state_beyond_the_configured_feature_limit_is_refused():
    # max_features bounds what a model may hold: a state holding more (the limit lowered
    # since, or a foreign state) is refused, not loaded past the bound.

    store = _MemoryStore()
    _published_model(store, (True, False))
    config = load_config(None, overrides={"model.scope": "key", "model.max_models": "4",
                                          "model.max_features": "1",
                                          **{f"model.{k}": str(v) for k, v in MODEL.items()}},
                         environ={})
    reader = ScopedModels(config, store, lambda model, metrics: Processor(model, metrics=metrics),
                          lambda: IncrementalSVC(**MODEL), Metrics(per_model=True))
    with pytest.raises(ScopedStateRefused, match="max_features"):
        reader._processor_from((0, "a"), store.fetch((0, "a")))
