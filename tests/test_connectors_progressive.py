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


def _message(offset: int, message: dict, topic: str = "in") -> Record:
    return Record(topic, 0, offset, json.dumps(message).encode(), 0)


def _processor_of(stream, per_poll: bool = False) -> Processor:
    """A processor that has read ``stream`` (ids: the offsets), in one poll."""
    processor = Processor(IncrementalSVC(C=2.0, gamma=0.5), predict_per_poll=per_poll)
    processor.process(_records(stream))
    return processor


def _learned(stream) -> IncrementalSVC:
    """The library's model of ``stream``, each point under its offset as key (as the
    processor learns messages whose id is their offset)."""
    model = IncrementalSVC(C=2.0, gamma=0.5)
    for offset, (x, y) in enumerate(stream):
        model.learn_one(x, y, key=offset)
    return model


@pytest.mark.parametrize("per_poll", [False, True])
def test_a_forget_and_a_relearn_in_one_poll_are_applied_in_their_order(per_poll):
    # Per poll, the labelled messages before a forget must be learned before it: else the
    # forget is dead-lettered as an unknown id and the point learned anyway (an erasure
    # request lost), and learning the id again after the forget is refused as a duplicate.
    stream = _stream(30)
    processor = _processor_of(stream[:20], per_poll)
    (xa, ya), (xb, yb) = stream[20], stream[21]
    result = processor.process([
        _message(20, {"id": "a", "x": xa, "y": ya}),
        _message(21, {"op": "forget", "id": "a"}),
        _message(22, {"id": "a", "x": xb, "y": yb}),
        _message(23, {"op": "forget", "id": 3}),
    ])
    assert not result.dead_letters
    assert [o.record.get("op") for o in result.outputs][1::2] == ["forget", "forget"]
    reference = _learned(stream[:20])
    reference.learn_one(xb, yb, key="a")
    reference.forget_one(key=3)
    assert sorted(map(str, processor.model._engine.keys)) == sorted(
        map(str, reference._engine.keys))
    probe = [x for x, _ in _stream(20, seed=9)]
    np.testing.assert_allclose([processor.model.decision_function_one(x) for x in probe],
                               [reference.decision_function_one(x) for x in probe],
                               rtol=1e-9, atol=1e-9)
    assert processor.updates == 20 + 1 + 1 + 1 + 1  # learned, forgotten, learned, forgotten


def test_a_prediction_after_a_relabel_in_the_same_poll_comes_from_the_relabelled_model():
    # The relabel must end the poll's segment: else the message after it is predicted by the
    # model before the relabel, which is not progressive validation.
    stream = _stream(40)
    processor = _processor_of(stream[:30])
    _, y5 = stream[5]
    probe = stream[31][0]
    result = processor.process([_message(30, {"op": "relabel", "id": 5, "y": not y5}),
                                _message(31, {"id": "q", "x": probe})])
    assert not result.dead_letters
    reference = _learned(stream[:30])
    before = reference.decision_function_one(probe)
    reference.relabel_one(5, not y5)
    after = reference.decision_function_one(probe)
    assert abs(after - before) > 1e-6  # (the relabel moves this prediction)
    assert result.outputs[1].record["score"] == pytest.approx(after, abs=1e-9)
    assert processor.updates == 30 + 2  # a relabel is a forget and a learn


def test_a_late_label_is_scored_and_its_cached_features_are_released():
    # A late label's prediction (made when its features came) counts towards the progressive
    # accuracy, and its features leave the cache (and the checkpoints) once learned.
    stream = _stream(30)
    processor = _processor_of(stream[:20])
    x, y = stream[20]
    reference = _learned(stream[:20])
    predicted = reference.decision_function_one(x) > 0
    scored, correct = processor.scored, processor.correct
    processor.process([_message(20, {"id": "late", "x": x})])
    assert len(processor.cache) == 1 and processor.scored == scored  # not labelled yet
    result = processor.process([_message(21, {"id": "late", "y": y})])
    assert not result.dead_letters and result.outputs[0].record["ok"] is True
    assert len(processor.cache) == 0
    assert processor.scored == scored + 1
    assert processor.correct == correct + (predicted == y)
    # Sent unlabelled, then again whole with its label: learned, and no longer cached.
    x2, y2 = stream[22]
    processor.process([_message(22, {"id": "again", "x": x2})])
    result = processor.process([_message(23, {"id": "again", "x": x2, "y": y2})])
    assert not result.dead_letters and len(processor.cache) == 0


@pytest.mark.parametrize("per_poll", [False, True])
def test_an_id_repeated_before_it_is_learned_is_a_duplicate_and_not_scored(per_poll):
    # A second labelled message of an id (learned, or waiting in the poll to be learned) is
    # a duplicate_id, not scored; learning it would fail and be dead-lettered "refused".
    stream = _stream(30)
    processor = _processor_of(stream[:20], per_poll)
    (xa, ya), (xb, _) = stream[20], stream[21]
    processor.process([_message(20, {"id": "u", "x": xb})])  # cached, waiting for its label
    scored = processor.scored
    result = processor.process([
        _message(21, {"id": "a", "x": xa, "y": ya}),
        _message(22, {"id": "a", "x": xa, "y": ya}),
        _message(23, {"id": "u", "y": True}),
        _message(24, {"id": "u", "y": True}),
    ])
    # (the second label of "u" finds its features gone with the first: already labelled)
    assert [letter.record["reason"] for letter in result.dead_letters] == [
        "duplicate_id", "unknown_id"]
    assert processor.scored == scored + 2  # "a" once, the late label of "u" once
    assert processor.model.n_stored == 22
