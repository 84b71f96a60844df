"""End to end on the embedded broker: labelled, unlabelled, forget, relabel, late labels and
malformed messages through the daemon; every output and dead letter checked, the model compared
with the same operations applied to the library directly, /metrics scraped during the run."""

from __future__ import annotations

import gc
import json
import math
import re
import threading
import urllib.request

import numpy as np
import pandas as pd
import pytest

from connectors.checkpoint import CheckpointStore
from connectors.config import load_config
from connectors.daemon import Daemon, ensure_topics
from stream_svm import IncrementalSVC, SlidingWindowSVC
from stream_svm._engine_model import texts_from_arrays
from tests.connectors_helpers import broker, produce, read_all, unique, wait_for  # noqa: F401

pytestmark = pytest.mark.broker

MODEL = {"C": 2.0, "gamma": 0.7}


def _points(n: int, seed: int) -> list[tuple[dict[str, float], bool]]:
    rng = np.random.default_rng(seed)
    X = rng.uniform(-2, 2, size=(n, 2))
    y = (X[:, 0] * X[:, 1] > 0) ^ (rng.uniform(size=n) < 0.1)  # noisy XOR: needs a kernel
    return [({"a": float(a), "b": float(b)}, bool(t)) for (a, b), t in zip(X, y, strict=True)]


def _scrape(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    values = {}
    for line in text.splitlines():
        match = re.match(r"^([a-z_]+(?:\{[^}]*\})?) ([0-9.eE+-]+|NaN)$", line)
        if match:
            values[match.group(1)] = float(match.group(2))
    return values


def _config(broker, tmp_path, **extra):  # noqa: F811
    names = {k: unique(k) for k in ("input", "labels", "output", "dead")}
    settings = {
        "kafka.bootstrap_servers": broker.bootstrap_servers,
        "kafka.input_topic": names["input"],
        "kafka.label_topic": names["labels"],
        "kafka.output_topic": names["output"],
        "kafka.dead_letter_topic": names["dead"],
        "kafka.group_id": unique("group"),
        "kafka.max_batch": 16,
        "kafka.max_message_bytes": 2000,
        "kafka.request_timeout_ms": 10000,
        "model.C": MODEL["C"],
        "model.gamma": MODEL["gamma"],
        "checkpoint.dir": str(tmp_path / "checkpoints"),
        "checkpoint.every_messages": 25,
        "metrics.port": 0,
        **extra,
    }
    # None removes a setting (e.g. model.C for a model type without it).
    settings = {name: value for name, value in settings.items() if value is not None}
    return load_config(None, settings, environ={})


def test_stream_with_every_kind_of_message(broker, tmp_path):  # noqa: F811
    config = _config(broker, tmp_path, **{"kafka.fetch_max_wait_ms": 20})
    kafka = config.kafka
    daemon = Daemon(config)
    thread = threading.Thread(target=daemon.run, daemon=True)
    thread.start()
    try:
        assert wait_for(lambda: daemon.metrics_port is not None and daemon._consumer, 30)
        assert daemon._consumer.config["fetch_max_wait_ms"] == 20  # the setting reaches it
        points = _points(40, seed=1)
        stream: list[object] = [{"id": i, "x": x, "y": y} for i, (x, y) in enumerate(points)]
        unlabelled = _points(8, seed=2)
        stream += [{"id": f"u{i}", "x": x} for i, (x, _) in enumerate(unlabelled)]
        stream += [
            {"op": "forget", "id": 3},
            {"op": "relabel", "id": 7, "y": not points[7][1]},
            {"op": "forget", "id": 5},
        ]
        bad = {
            "not-json": b"\xff\xfe{not json",
            "float-id": {"id": 1.5, "x": {"a": 1.0}, "y": True},
            "non-finite": b'{"id": "n", "x": {"a": NaN}, "y": true}',
            "overflow": b'{"id": "o", "x": {"a": 1e999}, "y": true}',
            "label-3": {"id": "l", "x": {"a": 1.0}, "y": 3},
            "string-feature": {"id": "s", "x": {"a": "high"}, "y": False},
            "forget-unknown": {"op": "forget", "id": "nope"},
            "forget-string-id": {"op": "forget", "id": "3"},  # "3" is not the id 3
            "relabel-unknown": {"op": "relabel", "id": 999, "y": True},
            "duplicate": {"id": 0, "x": {"a": 0.0, "b": 0.0}, "y": True},
            "oversize": {"id": "big", "x": {f"f{i}": 1.0 for i in range(300)}},
            "unknown-op": {"op": "explode", "id": 1},
            "array": [1, 2, 3],
        }
        reasons = {
            "not-json": "not UTF-8",
            "float-id": "'id' must be",
            "non-finite": "non-finite",
            "overflow": "too large for a float",
            "label-3": "not one of the two classes",
            "string-feature": "must be a finite number",
            "forget-unknown": "unknown id 'nope'",
            "forget-string-id": "unknown id '3'",
            "relabel-unknown": "unknown id 999",
            "duplicate": "already learned",
            "oversize": "over the size limit",
            "unknown-op": "unknown op",
            "array": "must be a JSON object",
        }
        # Bad messages in the middle of the stream: they must not disturb anything around them.
        stream = stream[:20] + list(bad.values()) + stream[20:]
        produce(broker.bootstrap_servers, kafka.input_topic, stream)
        n_valid = len(stream) - len(bad)

        assert wait_for(lambda: daemon.summary.messages >= len(stream), 60)
        first = _scrape(daemon.metrics_port)

        # Late labels for six of the eight unlabelled points, one for an unknown id.
        late = [{"id": f"u{i}", "y": unlabelled[i][1]} for i in range(6)]
        late.append({"id": "zzz", "y": True})
        produce(broker.bootstrap_servers, kafka.label_topic, late)
        assert wait_for(lambda: daemon.summary.messages >= len(stream) + len(late), 60)
        second = _scrape(daemon.metrics_port)
    finally:
        daemon.stop()
        thread.join(timeout=60)
    assert not thread.is_alive()
    assert daemon.summary.exit_code == 0

    outputs = read_all(broker.bootstrap_servers, kafka.output_topic, n_valid + 6)
    dead = read_all(broker.bootstrap_servers, kafka.dead_letter_topic, len(bad) + 1)

    # -- outputs: one per valid message, keyed by id, predictions then acks
    assert len(outputs) == n_valid + 6
    predictions = [o for o in outputs if "prediction" in o]
    acks = [o for o in outputs if "op" in o]
    assert [p["id"] for p in predictions] == [m["id"] for m in stream
                                              if isinstance(m, dict) and "x" in m
                                              and m not in bad.values()]
    for p in predictions:
        assert set(p) == {"id", "prediction", "score", "proba", "learned", "model_updates",
                          "source"}
        assert p["prediction"] == (p["score"] > 0)
        assert math.isclose(p["proba"], 1 / (1 + math.exp(-p["score"])), rel_tol=1e-9)
        assert p["learned"] == (isinstance(p["id"], int))
        assert p["source"]["topic"] == kafka.input_topic
    offsets = [p["source"]["offset"] for p in predictions]
    assert offsets == sorted(offsets)
    assert predictions[0]["model_updates"] == 0  # the first batch meets an empty model
    assert predictions[-1]["model_updates"] <= 40
    # Each acknowledgement names the message it answers (its topic, partition and offset).
    sources = [ack.pop("source") for ack in acks]
    assert acks == [
        {"id": 3, "op": "forget", "ok": True},
        {"id": 7, "op": "relabel", "ok": True},
        {"id": 5, "op": "forget", "ok": True},
    ] + [{"id": f"u{i}", "op": "label", "ok": True} for i in range(6)]
    assert len({(s["topic"], s["partition"], s["offset"]) for s in sources}) == len(acks)
    assert {s["topic"] for s in sources} <= {kafka.input_topic, kafka.label_topic}

    # -- dead letters: each bad message once, with its reason, raw bytes and source
    assert len(dead) == len(bad) + 1
    by_offset = {
        d["source"]["offset"]: d for d in dead if d["source"]["topic"] == kafka.input_topic
    }
    for index, name in enumerate(bad):
        letter = by_offset[20 + index]
        assert reasons[name] in letter["error"], (name, letter["error"])
        raw = bad[name] if isinstance(bad[name], bytes) else json.dumps(bad[name]).encode()
        if letter["raw_encoding"] == "base64":
            import base64

            assert base64.b64decode(letter["raw"]) == raw  # (only not-json: not UTF-8)
        elif name == "oversize":
            assert letter["truncated"] and raw.startswith(letter["raw"].encode())
        else:
            assert letter["raw"].encode() == raw
    label_letter = [d for d in dead if d["source"]["topic"] == kafka.label_topic]
    assert len(label_letter) == 1 and "no unlabelled features cached for id 'zzz'" in (
        label_letter[0]["error"]
    )

    # -- the model equals the library's after the same operations
    reference = IncrementalSVC(**MODEL)
    for i, (x, y) in enumerate(points):
        reference.learn_one(x, y, key=i)
    reference.forget_one(key=3)
    reference.forget_one(key=7)
    reference.learn_one(points[7][0], not points[7][1], key=7)
    reference.forget_one(key=5)
    for i in range(6):
        reference.learn_one(unlabelled[i][0], unlabelled[i][1], key=f"u{i}")
    grid = pd.DataFrame([x for x, _ in _points(200, seed=9)])
    model = daemon.processor.model
    assert model.n_stored == reference.n_stored == 40 - 2 + 6
    np.testing.assert_allclose(
        model.decision_function_many(grid), reference.decision_function_many(grid), atol=1e-9
    )
    assert 3 not in model and 5 not in model and 7 in model and "u6" not in model

    # -- the checkpoint written at shutdown restores the same model and the offsets
    checkpoint = CheckpointStore(config.checkpoint.dir).load_latest()
    restored = IncrementalSVC.from_checkpoint(checkpoint.arrays, checkpoint.model_meta)
    np.testing.assert_allclose(
        restored.decision_function_many(grid), reference.decision_function_many(grid), atol=1e-9
    )
    state = checkpoint.state["processor"]
    assert state["offsets"] == {f"{kafka.input_topic}:0": len(stream),
                                f"{kafka.label_topic}:0": len(late)}
    assert texts_from_arrays(checkpoint.cache_arrays, "id_str") == ["u6", "u7"]

    # -- metrics moved between two scrapes during the run
    learned = 'stream_svm_messages_total{outcome="learned"}'
    assert first[learned] == 40  # the duplicate of id 0 is dead-lettered, not learned
    assert first['stream_svm_messages_total{outcome="dead_lettered"}'] == len(bad)
    assert first['stream_svm_messages_total{outcome="forgotten"}'] == 2
    assert first['stream_svm_messages_total{outcome="relabeled"}'] == 1
    assert second['stream_svm_messages_total{outcome="labelled"}'] == 6
    assert second['stream_svm_messages_total{outcome="dead_lettered"}'] == len(bad) + 1
    assert second["stream_svm_breakpoints_total"] > first["stream_svm_breakpoints_total"] > 0
    assert second["stream_svm_update_seconds_count"] > first["stream_svm_update_seconds_count"]
    assert first["stream_svm_predict_seconds_count"] >= 1
    assert 0.0 <= second["stream_svm_progressive_accuracy"] <= 1.0
    assert second["stream_svm_margin_vectors"] + second["stream_svm_error_vectors"] + second[
        "stream_svm_reserve_vectors"
    ] == 44
    assert second["stream_svm_stored_points"] == 44
    assert "stream_svm_window_points" not in second  # an IncrementalSVC has no window
    assert second["stream_svm_cached_unlabelled"] == 2
    assert f'stream_svm_consumer_lag{{partition="0",topic="{kafka.input_topic}"}}' in second
    assert "stream_svm_seconds_since_checkpoint" in second


def test_sliding_window_daemon_matches_the_library(broker, tmp_path):  # noqa: F811
    """A window model learns each polled batch in one multiple update; the final window holds
    the same points as the library's and gives the same decision values."""
    config = _config(
        broker,
        tmp_path,
        **{"model.type": "SlidingWindowSVC", "model.window_size": 30, "model.step": 1},
    )
    points = _points(90, seed=4)
    stream = [{"id": i, "x": x, "y": y} for i, (x, y) in enumerate(points)]
    stream.insert(70, {"op": "forget", "id": 65})
    # One partition: a window depends on the order of arrivals.
    ensure_topics({"bootstrap_servers": broker.bootstrap_servers}, [config.kafka.input_topic])
    produce(broker.bootstrap_servers, config.kafka.input_topic, stream)
    daemon = Daemon(config, until_drained=True)
    # While it serves, what its start allocated is out of the collector's full passes (a pause
    # of tens of ms each); once stopped, collectable again.
    frozen_while_serving = []
    daemon.on_batch = lambda _: frozen_while_serving.append(gc.get_freeze_count())
    assert daemon.run() == 0
    assert frozen_while_serving and min(frozen_while_serving) > 10_000
    assert gc.get_freeze_count() == 0
    assert daemon.summary.messages == len(stream)
    reference = SlidingWindowSVC(window_size=30, step=1, **MODEL)
    for i, (x, y) in enumerate(points):
        reference.learn_one(x, y, key=i)
        if i == 69:
            reference.forget_one(key=65)
    model = daemon.processor.model
    assert model.n_window + model.n_buffered == 30
    grid = pd.DataFrame([x for x, _ in _points(100, seed=5)])
    assert model.n_buffered == 0
    assert sorted(model.stored_keys()) == sorted(reference.stored_keys())
    np.testing.assert_allclose(
        model.decision_function_many(grid), reference.decision_function_many(grid), atol=1e-7
    )


def _served_across_a_restart(broker, tmp_path, settings: dict,  # noqa: F811
                             messages: list[dict], restart_at: int) -> tuple[list[dict], Daemon]:
    """The outputs of ``messages`` served by a daemon stopped after the first ``restart_at``
    and one restarted from its checkpoint, which is returned."""
    config = _config(broker, tmp_path, **settings, **{"kafka.label_topic": None})
    kafka = config.kafka
    ensure_topics({"bootstrap_servers": broker.bootstrap_servers},
                  [kafka.input_topic, kafka.output_topic, kafka.dead_letter_topic])
    produce(broker.bootstrap_servers, kafka.input_topic, messages[:restart_at])
    first = Daemon(config, until_drained=True)
    assert first.run() == 0
    produce(broker.bootstrap_servers, kafka.input_topic, messages[restart_at:])
    second = Daemon(config, until_drained=True)
    assert second.run() == 0 and second._restored
    outputs = read_all(broker.bootstrap_servers, kafka.output_topic, len(messages))
    assert [o["id"] for o in outputs] == [m["id"] for m in messages]
    return outputs, second


def test_standardized_targets_across_a_restart(broker, tmp_path):  # noqa: F811
    """IncrementalSVR with scaler.targets: the warm-up measures the targets too, the model
    learns them standardized, the outputs, the MAE and the checkpoint read offline are in
    the targets' units, and a restart within the warm-up keeps its sums."""
    rng = np.random.default_rng(6)
    X = rng.standard_normal((40, 2))
    targets = [float(5e4 + 2e3 * (a - 0.5 * b)) for a, b in X]
    messages = [{"id": i, "x": {"a": float(a), "b": float(b)}, "y": t}
                for i, ((a, b), t) in enumerate(zip(X, targets, strict=True))]
    outputs, second = _served_across_a_restart(broker, tmp_path, {
        "model.type": "IncrementalSVR", "model.C": 10.0, "model.gamma": 0.5,
        "model.epsilon": 0.05, "scaler.mode": "warmup", "scaler.warmup_messages": 12,
        "scaler.targets": True}, messages, restart_at=6)  # (within the warm-up)
    # The library on the same stream, features and targets scaled with the warm-up's
    # statistics: the same answers, in the targets' units.
    means, scales = X[:12].mean(axis=0), X[:12].std(axis=0)
    mean, scale = np.mean(targets[:12]), np.std(targets[:12])
    from stream_svm import IncrementalSVR

    reference = IncrementalSVR(C=10.0, gamma=0.5, epsilon=0.05)
    for output, message in zip(outputs, messages, strict=True):
        x = message["x"]
        scaled = {"a": (x["a"] - means[0]) / scales[0], "b": (x["b"] - means[1]) / scales[1]}
        assert output["prediction"] == pytest.approx(
            mean + scale * reference.predict_one(scaled), rel=1e-12, abs=1e-7)
        reference.learn_one(scaled, (message["y"] - mean) / scale, key=message["id"])
    errors = [abs(o["prediction"] - t) for o, t in zip(outputs[30:], targets[30:], strict=True)]
    assert max(errors) < 500.0, errors  # (targets spread over 2,000 each way)
    # The daemon's checkpoint, read offline, answers in the targets' units too.
    from connectors.models import load_served_model

    served = load_served_model(second.config.checkpoint.dir)
    probe = {"a": 0.2, "b": -0.4}
    scaled = {"a": (0.2 - means[0]) / scales[0], "b": (-0.4 - means[1]) / scales[1]}
    assert served.predict_one(probe) == pytest.approx(
        mean + scale * reference.predict_one(scaled), rel=1e-12)
    # (progressive over the whole stream: the first daemon's sums are checkpointed)
    assert second.summary.mae == pytest.approx(
        np.mean([abs(o["prediction"] - t) for o, t in zip(outputs, targets, strict=True)]),
        rel=1e-9)


def test_a_regressor_with_a_warm_up_scaler_across_a_restart(broker, tmp_path):  # noqa: F811
    """IncrementalLSSVR behind a warm-up scaler: the held messages are answered once the
    statistics froze, outputs carry the predicted value, /metrics the MAE, and a restart from
    the checkpoint continues the same model."""
    rng = np.random.default_rng(5)
    X = rng.uniform(0, 1, size=(40, 2)) * [1e4, 1e-3]
    targets = [3.0 * a / 1e4 - 2.0 * b / 1e-3 + 1.0 for a, b in X]
    messages = [{"id": i, "x": {"a": float(a), "b": float(b)}, "y": t}
                for i, ((a, b), t) in enumerate(zip(X, targets, strict=True))]
    outputs, second = _served_across_a_restart(broker, tmp_path, {
        "model.type": "IncrementalLSSVR", "model.C": None, "model.gamma": None,
        "model.rho": 0.01, "scaler.mode": "warmup", "scaler.warmup_messages": 12},
        messages, restart_at=25)
    assert all("proba" not in o and isinstance(o["prediction"], float) for o in outputs)
    # The library on the same stream, scaled with the warm-up's statistics: the same answers.
    means, scales = X[:12].mean(axis=0), X[:12].std(axis=0)
    from stream_svm import IncrementalLSSVR

    reference = IncrementalLSSVR(rho=0.01)
    for output, message in zip(outputs, messages, strict=True):
        x = message["x"]
        scaled = {"a": (x["a"] - means[0]) / scales[0], "b": (x["b"] - means[1]) / scales[1]}
        assert output["prediction"] == pytest.approx(reference.predict_one(scaled), abs=1e-9)
        reference.learn_one(scaled, message["y"], key=message["id"])
    assert outputs[-1]["prediction"] == pytest.approx(targets[-1], abs=1e-3)
    assert math.isfinite(second.summary.mae) and second.summary.mae < 0.5
    assert b"stream_svm_progressive_mae" in second.metrics.render()
