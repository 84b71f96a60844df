"""The daemon serves every estimator of the library: each model type and its settings from the
configuration, named classes, regressors (numeric targets, MAE / RMSE), alpha-ISVM (which keeps
no point by id), and checkpoints of each that restore the model exactly."""

from __future__ import annotations

import io
import json
import math
import re

import numpy as np
import pytest

from connectors.config import MODEL_TYPES, ConfigError, load_config
from connectors.models import (
    applicable_settings,
    build_model,
    default_model_settings,
    model_settings,
    restore_model,
    settings_mismatch,
)
from connectors.processor import Processor, Record
from stream_svm import (
    AlphaISVC,
    ConvergenceError,
    IncrementalLSSVC,
    IncrementalLSSVR,
    IncrementalSVC,
    IncrementalSVR,
    SlidingWindowSVR,
)


def _points(count: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((count, 2))
    return [{"a": float(a), "b": float(b)} for a, b in X]


def _records(messages: list[dict], first_offset: int = 0) -> list[Record]:
    return [Record("in", 0, first_offset + i, json.dumps(m).encode(), 0)
            for i, m in enumerate(messages)]


def _config(**settings):
    return load_config(None, {f"model.{k}": v for k, v in settings.items()}, environ={})


# ------------------------------------------------------------------------------ settings


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_every_model_type_is_built_from_its_settings(model_type):
    config = _config(type=model_type)
    model = build_model(config)
    assert type(model).__name__ == model_type
    settings = model_settings(config)
    for name, value in settings.items():
        if name != "type":
            assert getattr(model, name) == value, name
    # Every constructor parameter is a setting, with the constructor's default (but for the
    # daemon's tighter max_new_features, and far_points: a point far beyond the stored points'
    # scale is dead-lettered by default, as a message the model cannot use).
    assert set(applicable_settings(model_type)) == set(model._get_params())
    defaults = type(model)().__dict__
    for name in applicable_settings(model_type):
        if name not in ("max_features", "max_new_features", "far_points"):
            assert getattr(model, name) == defaults[name], name
    if "far_points" in applicable_settings(model_type):
        assert (model.far_points, defaults["far_points"]) == ("refuse", "warn")


def test_settings_reach_the_model():
    model = build_model(_config(type="IncrementalSVC", reserve_epsilon=0.25, ridge=1e-6,
                                max_breakpoints=77, classes='["ham", "spam"]'))
    assert (model.reserve_epsilon, model.ridge, model.max_breakpoints) == (0.25, 1e-6, 77)
    assert model.classes == ["ham", "spam"]
    alpha = build_model(_config(type="AlphaISVC", batch_size=7, discard_ratio=0.25,
                                validation_margin=1.0))
    assert (alpha.batch_size, alpha.discard_ratio, alpha.validation_margin) == (7, 0.25, 1.0)
    lssvr = build_model(_config(type="IncrementalLSSVR", rho=0.1, features="rff",
                                n_components=12, seed=5))
    assert (lssvr.rho, lssvr.features, lssvr.n_components, lssvr.seed) == (0.1, "rff", 12, 5)
    assert lssvr.max_features == 1000  # the LS-SVM's own default, not the SVMs' 10,000
    assert build_model(_config(type="IncrementalLSSVC", max_features=0)).max_features is None


def test_a_setting_of_another_type_is_refused_naming_it():
    with pytest.raises(ConfigError, match=r"model\.window_size .*does not apply to model\.type "
                                          r"IncrementalSVC"):
        _config(type="IncrementalSVC", window_size=10)
    with pytest.raises(ConfigError, match=r"model\.C .*IncrementalLSSVR"):
        _config(type="IncrementalLSSVR", C=2.0)
    with pytest.raises(ConfigError, match=r"refused by AlphaISVC.*weight_threshold"):
        _config(type="AlphaISVC", weight_increment=1.0, weight_threshold=2.0)
    with pytest.raises(ConfigError, match=r"model\.classes.*two distinct"):
        _config(classes="spam,spam")
    assert _config(classes="ham, spam").model.classes == ["ham", "spam"]
    env = load_config(None, environ={"STREAM_SVM_MODEL_CLASSES": "[0, 1]"})
    assert env.model.classes == [0, 1]


def test_a_setting_of_a_type_not_chosen_is_refused_even_at_its_default_value():
    # window_size = 1000 without a type: an IncrementalSVC that grew with the stream, since
    # 1000 is the default window size and a default value was let pass.
    with pytest.raises(ConfigError, match=r"model\.window_size .*does not apply to model\.type "
                                          r"IncrementalSVC, the default, since model\.type is "
                                          r"not set: window_size is a setting of "
                                          r"SlidingWindowSVC, SlidingWindowSVR"):
        load_config(None, {"model.window_size": "1000"}, environ={})
    # With the type written out, a setting at its default stays allowed (a configuration
    # written out whole lists every setting).
    assert _config(type="IncrementalSVC", window_size=1000).model.type == "IncrementalSVC"
    assert load_config(None, {"model.C": "2"}, environ={}).model.C == 2.0


def test_a_parameter_of_another_kernel_is_refused_naming_the_kernel():
    with pytest.raises(ConfigError, match=r"model\.gamma .*does not apply to model\.kernel "
                                          "linear"):
        _config(kernel="linear", gamma=5.0)
    for name, value in (("degree", 5), ("coef0", 1.0)):
        with pytest.raises(ConfigError, match=rf"model\.{name} .*model\.kernel rbf"):
            _config(kernel="rbf", **{name: value})
    with pytest.raises(ConfigError, match=r"model\.n_components .*model\.features linear"):
        _config(type="IncrementalLSSVC", n_components=10)
    assert build_model(_config(kernel="poly", gamma=0.5, degree=2, coef0=1.0)).degree == 2
    assert build_model(_config(type="IncrementalLSSVR", features="rff", gamma=2.0,
                               seed=3)).gamma == 2.0
    assert _config(kernel="linear", gamma=1.0).model.kernel == "linear"  # (the default)
    # A checkpoint saved with such a setting, from before it was refused, is still restored
    # once the setting is taken out: it changed nothing of the model.
    saved = {**default_model_settings("IncrementalSVC"), "kernel": "linear", "gamma": 5.0}
    assert settings_mismatch(saved, model_settings(_config(kernel="linear"))) is None
    assert settings_mismatch(saved, model_settings(_config(kernel="rbf"))) == (
        "gamma 5.0 -> 1.0, kernel 'linear' -> 'rbf'")
    # A setting the other model type does not have reads as none ("step None -> 1" read as a
    # step of None).
    assert settings_mismatch({"type": "IncrementalSVC"},
                             default_model_settings("SlidingWindowSVC")) == (
        "step (none) -> 1, strategy (none) -> 'multiple', type 'IncrementalSVC' -> "
        "'SlidingWindowSVC', window_size (none) -> 1000")
    # ... and the model in it too (its own parameters say gamma 5.0).
    model = IncrementalSVC(kernel="linear", gamma=5.0)
    for i in range(20):
        model.learn_one({"a": float(i % 5), "b": float(i % 3)}, i % 2 == 0)
    arrays, meta = model.to_checkpoint()
    restored = restore_model(_config(kernel="linear"), arrays, meta)
    probe = {"a": 1.0, "b": 2.0}
    assert restored.decision_function_one(probe) == model.decision_function_one(probe)
    with pytest.raises(ValueError, match="kernel='linear'"):
        restore_model(_config(kernel="rbf", gamma=5.0), arrays, meta)


def test_checkpoints_written_before_a_setting_existed_match_its_default():
    config = _config()
    old = {"type": "IncrementalSVC", "C": 1.0, "kernel": "rbf", "gamma": 1.0, "degree": 3,
           "coef0": 0.0}
    assert {**default_model_settings("IncrementalSVC"), **old} == model_settings(config)
    assert {**default_model_settings("IncrementalSVC"), **old} != model_settings(
        _config(ridge=0.5))


# ------------------------------------------------------------------------------ regressor


REGRESSORS = [IncrementalLSSVR(rho=0.1), IncrementalSVR(C=10.0, epsilon=0.01, gamma=0.5),
              SlidingWindowSVR(window_size=100, step=5, C=10.0, epsilon=0.01, gamma=0.5)]


@pytest.mark.parametrize("regressor", REGRESSORS, ids=[type(r).__name__ for r in REGRESSORS])
def test_a_regressor_predicts_numbers_and_reports_mae_and_rmse(regressor):
    xs = _points(60, seed=1)
    targets = [2.0 * x["a"] - x["b"] + 0.5 for x in xs]
    processor = Processor(regressor.clone())
    messages = [{"id": i, "x": x, "y": t} for i, (x, t) in enumerate(zip(xs, targets,
                                                                       strict=True))]
    result = processor.process(_records(messages))
    assert not result.dead_letters
    reference = regressor.clone()
    errors = []
    for i, (output, x, t) in enumerate(zip(result.outputs, xs, targets, strict=True)):
        record = output.record
        assert "proba" not in record and "score" not in record
        assert record["prediction"] == pytest.approx(reference.predict_one(x), abs=1e-12)
        errors.append(t - record["prediction"])
        reference.learn_one(x, t, key=i)
    assert processor.mae == pytest.approx(np.mean(np.abs(errors)), rel=1e-12)
    assert processor.rmse == pytest.approx(math.sqrt(np.mean(np.square(errors))), rel=1e-12)
    assert math.isnan(processor.accuracy)
    # Forget and relabel by id, exactly.
    more = [{"op": "forget", "id": 3}, {"op": "relabel", "id": 4, "y": 100.0},
            {"id": 99, "x": xs[0], "y": "high"}, {"id": 98, "x": xs[0], "y": True}]
    result = processor.process(_records(more, 60))
    assert [o.record["op"] for o in result.outputs] == ["forget", "relabel"]
    assert [d.record["reason"] for d in result.dead_letters] == ["malformed", "malformed"]
    assert "not a number" in result.dead_letters[0].record["error"]
    reference.forget_one(key=3)
    reference.relabel_one(4, 100.0)
    for x in xs[:10]:
        assert processor.model.predict_one(x) == pytest.approx(reference.predict_one(x),
                                                               abs=1e-12)


# ------------------------------------------------------------------------------ classes


def test_named_classes_in_messages_and_outputs():
    xs = _points(40, seed=2)
    labels = ["spam" if x["a"] > 0 else "ham" for x in xs]
    processor = Processor(IncrementalLSSVC(rho=0.5, classes=["ham", "spam"]))
    messages = [{"id": i, "x": x, "y": y} for i, (x, y) in enumerate(zip(xs, labels,
                                                                       strict=True))]
    messages += [{"id": 100, "x": xs[0], "y": True}, {"id": 101, "x": xs[0], "y": "Spam"},
                 {"id": 102, "x": xs[1]}, {"id": 102, "y": "ham"}]
    result = processor.process(_records(messages))
    assert [d.record["reason"] for d in result.dead_letters] == ["malformed", "malformed"]
    assert 'not one of the classes ["ham", "spam"]' in result.dead_letters[0].record["error"]
    predictions = [o.record["prediction"] for o in result.outputs if "prediction" in o.record]
    assert set(predictions) <= {"ham", "spam"}
    assert processor.accuracy > 0.8
    last = next(o.record for o in result.outputs if o.record.get("id") == 102)
    assert processor.model.stored_point(102)[1] == "ham"
    # LS-SVM probabilities are its own (clipped), not the SVMs' sigmoid.
    score = last["score"]
    assert last["proba"] == pytest.approx(min(1.0, max(0.0, (1 + score) / 2)), abs=1e-12)


# ------------------------------------------------------------------------------ alpha-ISVM


def test_alpha_isvm_learns_in_its_own_increments_whatever_the_polls():
    xs = _points(90, seed=3)
    labels = [x["a"] * x["b"] > 0 for x in xs]
    messages = [{"id": f"m{i}", "x": x, "y": y} for i, (x, y) in enumerate(zip(xs, labels,
                                                                           strict=True))]
    models = []
    for poll in (90, 7, 1):
        processor = Processor(AlphaISVC(batch_size=20, C=2.0, gamma=0.5),
                              predict_per_poll=True)
        records = _records(messages)
        for start in range(0, len(records), poll):
            processor.process(records[start : start + poll])
        models.append(processor.model)
    reference = AlphaISVC(batch_size=20, C=2.0, gamma=0.5)
    for x, y in zip(xs, labels, strict=True):
        reference.learn_one(x, y)
    for model in models:
        for x in xs[:15]:
            assert model.decision_function_one(x) == reference.decision_function_one(x)


def test_alpha_isvm_dead_letters_forget_and_relabel():
    processor = Processor(AlphaISVC(batch_size=2))
    result = processor.process(_records([
        {"id": 1, "x": {"a": 1.0}, "y": True}, {"id": 2, "x": {"a": -1.0}, "y": False},
        {"op": "forget", "id": 1}, {"op": "relabel", "id": 2, "y": True},
        {"id": 1, "x": {"a": 2.0}, "y": True},  # ids are not checked for repeats
    ]))
    assert [d.record["reason"] for d in result.dead_letters] == ["unsupported", "unsupported"]
    assert "AlphaISVC keeps no point by id, so it cannot forget; IncrementalSVC, " \
        "SlidingWindowSVC, IncrementalLSSVC, IncrementalLSSVR, IncrementalSVR, " \
        "SlidingWindowSVR can" in result.dead_letters[0].record["error"]
    assert len(result.outputs) == 3


# ------------------------------------------------------------------------------ checkpoints


def _round_trip(arrays: dict) -> dict:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    buffer.seek(0)
    with np.load(buffer, allow_pickle=False) as loaded:
        return {name: loaded[name] for name in loaded.files}


CHECKPOINTED = [
    ("AlphaISVC", {"batch_size": 8, "C": 2.0, "gamma": 0.5}, False),
    ("IncrementalLSSVC", {"features": "rff", "n_components": 15, "seed": 1,
                          "classes": "no,yes"}, False),
    ("IncrementalLSSVR", {"rho": 0.2}, True),
    ("IncrementalSVC", {"reserve_epsilon": 0.5, "classes": "no,yes"}, False),
    ("IncrementalSVR", {"epsilon": 0.05, "C": 5.0, "gamma": 0.5}, True),
    ("SlidingWindowSVR", {"window_size": 30, "step": 4, "epsilon": 0.0}, True),
]


@pytest.mark.parametrize(("model_type", "settings", "regression"), CHECKPOINTED,
                         ids=[c[0] for c in CHECKPOINTED])
def test_a_restored_model_continues_exactly(model_type, settings, regression):
    config = _config(type=model_type, **settings)
    xs = _points(80, seed=4)
    if regression:
        labels = [x["a"] + 0.5 * x["b"] for x in xs]
    else:
        labels = ["yes" if x["a"] + x["b"] > 0 else "no" for x in xs]
        if model_type == "AlphaISVC":
            labels = [y == "yes" for y in labels]
    messages = [{"id": i, "x": x, "y": y} for i, (x, y) in enumerate(zip(xs, labels,
                                                                       strict=True))]
    records = _records(messages)
    straight = Processor(build_model(config))
    first = straight.process(records[:45]).outputs + straight.process(records[45:]).outputs

    interrupted = Processor(build_model(config))
    before = interrupted.process(records[:45]).outputs
    arrays, meta = interrupted.model.to_checkpoint()
    state = json.loads(json.dumps(interrupted.state()))
    restored = Processor(restore_model(config, _round_trip(arrays), json.loads(json.dumps(meta))))
    restored.load_state(state, _round_trip(interrupted.cache_arrays()))
    after = restored.process(records) .outputs  # offsets skip the first 45
    # The same outputs; a restored engine refactorizes, so scores may differ in the last bit.
    assert len(before + after) == len(first)
    for got, expected in zip(before + after, first, strict=True):
        for name, value in expected.record.items():
            if isinstance(value, float):
                assert got.record[name] == pytest.approx(value, rel=1e-12, abs=1e-12), name
            else:
                assert got.record[name] == value, name
    for x in xs[:10]:
        assert restored.model.decision_function_one(x) == pytest.approx(
            straight.model.decision_function_one(x), rel=1e-12, abs=1e-12)
    if regression:
        assert restored.mae == pytest.approx(straight.mae, rel=1e-12)
    else:
        assert restored.accuracy == straight.accuracy


def test_evaluate_reads_labels_by_the_daemons_rules(tmp_path):
    from connectors.cli import evaluate

    lines = [{"a": float(i % 7), "b": float(i % 3), "y": i % 2} for i in range(20)]
    data = tmp_path / "binary.jsonl"
    data.write_text("".join(json.dumps(line) + "\n" for line in lines))
    config = _config(classes="[0, 1]")
    assert evaluate(config, str(data))["points"] == 20
    lines[5]["y"] = True  # the daemon refuses true when the classes are [0, 1]
    data.write_text("".join(json.dumps(line) + "\n" for line in lines))
    # As the daemon dead-letters it and goes on, evaluate skips it and says so.
    summary = evaluate(config, str(data))
    assert summary["points"] == 19 and summary["skipped"] == 1
    assert re.search(r"binary.jsonl:6: .*not one of the classes", summary["skipped_first"][0])
    data.write_text("".join(json.dumps(line) + "\n" for line in lines[:3])
                    + '{"a": "x", "b": 1.0, "y": 0}\nnot json\n'
                    + "".join(json.dumps(line) + "\n" for line in lines[3:5]))
    summary = evaluate(config, str(data))
    assert summary["points"] == 5 and summary["skipped"] == 2
    assert [problem.split(": ", 1)[1][:24] for problem in summary["skipped_first"]] == [
        "feature 'a' is not a num", "not JSON: Expecting valu"]
    regression = tmp_path / "targets.csv"
    regression.write_text("a,y\n1.0,2.5\n2.0,4.5\n3.0,6.5\n")
    summary = evaluate(_config(type="IncrementalLSSVR", rho=1e-6), str(regression))
    assert summary["points"] == 3 and summary["mae"] is not None and "accuracy" not in summary


def test_progressive_gauges_start_at_nan_and_show_restored_values():
    from connectors.metrics import Metrics

    metrics = Metrics()
    processor = Processor(IncrementalLSSVC(), metrics=metrics)
    text = metrics.render().decode()
    assert "stream_svm_progressive_accuracy NaN" in text
    processor.load_state({"scored": 4, "correct": 3})
    assert "stream_svm_progressive_accuracy 0.75" in metrics.render().decode()
    regressor_metrics = Metrics()
    Processor(IncrementalLSSVR(), metrics=regressor_metrics)
    text = regressor_metrics.render().decode()
    assert "stream_svm_progressive_mae NaN" in text
    assert "stream_svm_progressive_accuracy" not in text
    keyed = IncrementalLSSVR()
    keyed.learn_one({"a": 1.0}, 2.0, key="k")
    keyed.learn_one({"a": 2.0}, 3.0)
    assert (keyed.n_stored, keyed.n_samples_) == (1, 2)


def test_an_id_column_is_the_messages_id_and_not_a_feature(tmp_path):
    from connectors.cli import evaluate
    from connectors.sources import SourceError, iter_records, raw_label

    data = tmp_path / "mail.csv"
    data.write_text("msg,a,b,label\nm-1,1.0,0.5,spam\n7,0.2,0.1,ham\n")
    records = list(iter_records(str(data), "label", None, raw_label, id_column="msg"))
    assert records == [("m-1", {"a": 1.0, "b": 0.5}, "spam"), (7, {"a": 0.2, "b": 0.1}, "ham")]
    lines = tmp_path / "mail.jsonl"
    lines.write_text('{"msg": "a", "t": 1.5, "y": 1}\n{"msg": 2, "t": 0.5, "y": 0}\n')
    assert [r[0] for r in iter_records(str(lines), id_column="msg")] == ["a", 2]
    # Without it, the id is a feature: "m-1" is no number (7 is).
    summary = evaluate(_config(classes="ham,spam"), str(data), target="label")
    assert summary["points"] == 1 and "'msg' is not a number" in summary["skipped_first"][0]
    summary = evaluate(_config(classes="ham,spam"), str(data), target="label", id_column="msg")
    assert summary["points"] == 2
    with pytest.raises(SourceError, match="no column 'id'"):
        list(iter_records(str(data), "label", id_column="id"))
    with pytest.raises(SourceError, match=r"for \.csv and \.jsonl files"):
        list(iter_records("bananas", id_column="id"))


def test_a_file_row_with_a_field_given_twice_is_refused_as_the_daemon_refuses_it(tmp_path):
    from connectors.sources import SourceError, iter_records

    for name, row in (("flat", '{"a": 1.0, "a": 2.0, "y": true}'),
                      ("message", '{"id": 1, "x": {"b": 1}, "y": 1, "y": 0}')):
        lines = tmp_path / f"{name}.jsonl"
        lines.write_text(row + "\n")
        with pytest.raises(SourceError, match=rf"{name}\.jsonl:1: field '[ay]' appears twice"):
            list(iter_records(str(lines)))


def test_file_rows_keep_their_numbers_and_unreadable_ones_are_named_not_raised(tmp_path):
    from connectors.sources import SourceError, iter_records, raw_label

    # Numbered ids survive skipped rows (replay numbered the rows it sent: after a skipped
    # row, every later id, and the labels sent for them by row number, shifted by one).
    table = tmp_path / "t.csv"
    table.write_text("a,y\n1,true\nx,false\n3,true\n4,\n")
    bad: list[str] = []
    rows = list(iter_records(str(table), "y", None, raw_label, bad_rows=bad, unlabelled=True,
                             number_rows=True))
    assert [(i, x["a"], y) for i, x, y in rows] == [(0, 1.0, True), (2, 3.0, True),
                                                   (3, 4.0, None)]
    assert len(bad) == 1 and "t.csv:3: feature 'a' is not a number" in bad[0]
    lines = tmp_path / "t.jsonl"
    lines.write_text('{"a": 1, "y": true}\n\n{"a": ' + "9" * 400 + ', "y": true}\n'
                     '{"a": ' + "9" * 5000 + ', "y": true}\n{"a": 2, "y": false}\n')
    bad = []
    rows = list(iter_records(str(lines), bad_rows=bad, number_rows=True))
    assert [(i, x["a"]) for i, x, _ in rows] == [(0, 1.0), (3, 2.0)]
    assert "t.jsonl:3: feature 'a' is not a number" in bad[0]  # 400 digits: overflows
    assert "t.jsonl:4: not usable JSON" in bad[1]  # 5,000 digits: beyond Python's limit
    # A column given twice: which value is meant is not clear.
    twice = tmp_path / "twice.csv"
    twice.write_text("a,y,y\n1,true,false\n")
    with pytest.raises(SourceError, match=r"twice\.csv: the header repeats the column\(s\) "
                                          r"\['y'\]"):
        list(iter_records(str(twice)))


def test_features_a_model_cannot_score_are_refused_not_internal_errors():
    # Features an LS-SVM's random Fourier map overflows on were dead-lettered as "internal"
    # and logged at ERROR. A feature name that first comes mid-stream (the producer's schema
    # grew) is learned: the map draws its frequencies then.
    model = IncrementalLSSVC(features="rff", n_components=20, gamma=0.1, seed=1)
    processor = Processor(model)
    messages = [{"id": i, "x": x, "y": i % 2 == 0} for i, x in enumerate(_points(6, seed=2))]
    messages.insert(3, {"id": "drift", "x": {"a": 0.5, "c": 1.0}, "y": True})
    messages.insert(4, {"id": "huge", "x": {"a": 1.7e308, "b": 1.7e308}, "y": True})
    result = processor.process(_records(messages))
    reasons = {json.loads(d.record["raw"])["id"]: d.record["reason"] for d in result.dead_letters}
    assert reasons == {"huge": "refused"}
    errors = {json.loads(d.record["raw"])["id"]: d.record["error"] for d in result.dead_letters}
    assert errors["huge"].startswith("the model cannot score these features: ValueError: the "
                                     "features are too large for the random Fourier map")
    assert len(result.outputs) == 7 and model.n_samples_ == 7 and "c" in model.feature_names_


def test_a_point_far_beyond_the_stored_scale_is_dead_lettered_by_default_and_counted():
    # One unit slip among standardized features poisoned a linear model while stored: later
    # valid messages were dead-lettered (ConvergenceError), at seconds each.
    from connectors.metrics import Metrics

    config = _config(type="IncrementalSVC", kernel="linear")
    model = build_model(config)
    metrics = Metrics()
    processor = Processor(model, metrics=metrics)
    rng = np.random.default_rng(4)
    messages = [{"id": i, "x": {"a": float(a), "b": float(b)}, "y": bool(a > 0)}
                for i, (a, b) in enumerate(rng.uniform(-2, 2, size=(40, 2)))]
    processor.process(_records(messages[:30]))
    before = model.decision_function_one({"a": 1.0, "b": 1.0})
    result = processor.process(_records(
        [{"id": "slip", "x": {"a": 0.5, "b": 2.5e9}, "y": True}], first_offset=30))
    [letter] = [d.record for d in result.dead_letters]
    assert letter["reason"] == "refused" and "slip" not in model
    assert re.search(r"far beyond the kernel scale .*feature 'b' = 2\.5e\+09.*refused "
                     r"\(far_points='refuse'\), the model is unchanged", letter["error"])
    assert model.decision_function_one({"a": 1.0, "b": 1.0}) == before
    result = processor.process(_records(messages[30:], first_offset=31))
    assert not result.dead_letters and len(result.outputs) == 10
    assert model.far_points_total == 1 and metrics.far_points._value.get() == 1.0


def test_far_points_may_change_between_restarts():
    # A bound on the input, as max_features: not a setting the model was made with.
    model = build_model(_config(type="IncrementalSVR", kernel="linear"))
    for i, x in enumerate(_points(30)):
        model.learn_one(x, x["a"], key=i)
    arrays, meta = model.to_checkpoint()
    learning = restore_model(_config(type="IncrementalSVR", kernel="linear",
                                     far_points="warn"), arrays, meta)
    assert learning.far_points == "warn"
    with pytest.warns(UserWarning, match="far beyond"):
        try:
            learning.learn_one({"a": 1e12, "b": 0.0}, 1.0, key="slip")
        except ConvergenceError:
            pass
    assert learning.far_points_total == 1
    # Checkpoints of earlier versions hold no far_points: the library's default ("warn").
    del meta["params"]["far_points"]
    assert IncrementalSVR.from_checkpoint(arrays, meta).far_points == "warn"
    with pytest.raises(ConfigError, match="far_points"):
        _config(type="IncrementalSVR", far_points="drop")
