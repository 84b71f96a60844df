"""The daemon's predictions are River's progressive validation: each labelled message is
predicted by the model that has learned every earlier message, however the messages were
polled, so the daemon's accuracy equals ``stream-svm evaluate``'s on the same stream."""

from __future__ import annotations

import json

import numpy as np
import pytest

from connectors.cli import evaluate
from connectors.config import load_config
from connectors.models import build_model
from connectors.processor import Processor, Record, _tabular
from stream_svm import IncrementalSVC, SlidingWindowSVC


def _stream(count: int, seed: int = 3) -> list[tuple[dict[str, float], bool]]:
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((count, 2))
    y = X[:, 0] * X[:, 1] + 0.3 * rng.standard_normal(count) > 0
    return [({"a": float(a), "b": float(b)}, bool(label)) for (a, b), label in zip(X, y,
                                                                                 strict=True)]


def _records(stream, unlabelled_every: int = 0) -> list[Record]:
    records = []
    for offset, (x, y) in enumerate(stream):
        message = {"id": offset, "x": x}
        if not (unlabelled_every and (offset + 1) % unlabelled_every == 0):
            message["y"] = y
        records.append(Record("in", 0, offset, json.dumps(message).encode(), 0))
    return records


def _reference(model, stream, unlabelled_every: int = 0) -> list[float]:
    """Scores of predict-then-learn, one message at a time, in order."""
    scores = []
    for offset, (x, y) in enumerate(stream):
        scores.append(model.decision_function_one(x))
        if not (unlabelled_every and (offset + 1) % unlabelled_every == 0):
            model.learn_one(x, y, key=offset)
    return scores


MODELS = {
    "incremental": lambda: IncrementalSVC(C=2.0, gamma=0.5),
    "window step 1": lambda: SlidingWindowSVC(window_size=40, step=1, C=2.0, gamma=0.5),
    "window step 7": lambda: SlidingWindowSVC(window_size=40, step=7, C=2.0, gamma=0.5),
}


@pytest.mark.parametrize("name", list(MODELS))
def test_every_prediction_comes_from_the_model_that_learned_everything_before_it(name):
    stream = _stream(300)
    processor = Processor(MODELS[name]())
    outputs = []
    for start in range(0, len(stream), 120):  # polls of 120 messages
        outputs += processor.process(_records(stream, 5)[start : start + 120]).outputs
    expected = _reference(MODELS[name](), stream, 5)
    np.testing.assert_allclose([o.record["score"] for o in outputs], expected,
                               rtol=1e-9, atol=1e-9)
    labelled = [i for i in range(len(stream)) if (i + 1) % 5]
    correct = sum((expected[i] > 0) == stream[i][1] for i in labelled)
    assert processor.scored == len(labelled) and processor.correct == correct


def test_predicting_per_poll_is_the_faster_documented_alternative():
    stream = _stream(200)
    sequential = Processor(IncrementalSVC(C=2.0, gamma=0.5))
    per_poll = Processor(IncrementalSVC(C=2.0, gamma=0.5), predict_per_poll=True)
    records = _records(stream)
    first = per_poll.process(records).outputs
    second = sequential.process(records).outputs
    # Per poll, every message of the first poll is scored by the empty model (bias 0) ...
    assert all(o.record["score"] == 0.0 and o.record["model_updates"] == 0 for o in first)
    # ... and in order, each by the model of all messages before it.
    assert [o.record["model_updates"] for o in second] == list(range(len(stream)))
    # Both learn the same exact model.
    probe = [x for x, _ in _stream(20, seed=9)]
    np.testing.assert_allclose([per_poll.model.decision_function_one(x) for x in probe],
                               [sequential.model.decision_function_one(x) for x in probe],
                               rtol=1e-9, atol=1e-9)


def test_the_daemon_accuracy_equals_evaluate_on_the_same_stream(tmp_path):
    stream = _stream(250, seed=5)
    data = tmp_path / "stream.jsonl"
    data.write_text("".join(json.dumps({"x": x, "y": y}) + "\n" for x, y in stream))
    config = load_config(None, {"model.type": "SlidingWindowSVC", "model.window_size": "60",
                                "model.step": "4", "model.gamma": "0.5"})
    summary = evaluate(config, str(data))
    processor = Processor(build_model(config))
    processor.process(_records(stream))
    assert processor.accuracy == pytest.approx(summary["accuracy"], abs=0)


def test_one_wide_message_does_not_make_its_poll_a_dense_table():
    """A 60,000-feature message among narrow ones is predicted on its own: a DataFrame of the
    poll would hold rows x 60,000 cells (seconds per poll)."""
    narrow = [{"a": float(i), "b": 1.0} for i in range(100)]
    wide = {f"f{j}": 1.0 for j in range(60_000)}
    assert _tabular(narrow)
    assert not _tabular([*narrow, wide])
    assert not _tabular(narrow[:5])  # too few rows to pay for a DataFrame


@pytest.mark.parametrize("poll", [90, 33, 5])
def test_a_window_per_poll_holds_what_it_holds_learned_one_by_one(poll):
    # A run of labels was learned by one learn_many, which slides by all it is given: the
    # window then held other points than the same stream learned in order (up to step - 1
    # newer ones, nothing buffered), and the two modes' models differed.
    stream = _stream(200, seed=4)
    sequential = Processor(SlidingWindowSVC(window_size=40, step=7, C=2.0, gamma=0.5))
    per_poll = Processor(SlidingWindowSVC(window_size=40, step=7, C=2.0, gamma=0.5),
                         predict_per_poll=True)
    records = _records(stream)
    sequential.process(records)
    for start in range(0, len(records), poll):
        per_poll.process(records[start : start + poll])
    assert per_poll.model.n_buffered == sequential.model.n_buffered == 200 % 7
    assert per_poll.model.n_window == sequential.model.n_window
    probe = [x for x, _ in _stream(20, seed=9)]
    np.testing.assert_allclose([per_poll.model.decision_function_one(x) for x in probe],
                               [sequential.model.decision_function_one(x) for x in probe],
                               rtol=1e-9, atol=1e-9)
