"""A warning (once per process, model type and direction) when an RBF kernel's gamma does not
fit the features' scale: the default gamma = 1 on 10 standardized features made nearly every
point a support vector of its own (77 % accuracy in 137 s, where gamma = 0.01 gave 88 % in
1.2 s) without a word."""

from __future__ import annotations

import pickle
import warnings

import numpy as np
import pandas as pd
import pytest

import stream_svm._engine_model as engine_model
from stream_svm import (
    AlphaISVC,
    IncrementalLSSVC,
    IncrementalSVC,
    IncrementalSVR,
    SlidingWindowSVC,
)


@pytest.fixture(autouse=True)
def _no_warning_given_yet(monkeypatch):
    # (Each warning is given once per process, model type, gamma and direction.)
    monkeypatch.setattr(engine_model, "_SCALE_WARNED", set())


def _points(scale: float, count: int = 120, dim: int = 10, seed: int = 0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(count, dim)) * scale
    y = X[:, 0] + 0.3 * rng.normal(size=count) > 0
    return [({f"f{j}": float(v) for j, v in enumerate(row)}, bool(label))
            for row, label in zip(X, y, strict=True)]


def _learn(model, points, target=None):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for x, label in points:
            model.learn_one(x, label if target is None else target(x))
    return [str(w.message) for w in caught if "RBF gamma" in str(w.message)]


def test_a_narrow_kernel_is_reported_once_with_the_median_heuristic():
    points = _points(1.0)
    messages = _learn(IncrementalSVC(), points)
    assert len(messages) == 1  # once, at the 50th stored point, not at every update
    message = messages[0]
    assert message.startswith("RBF gamma=1 is large for these features: the median squared "
                              "distance between 50 points (spread over those learned so far) "
                              "is ")
    X = np.array([list(x.values()) for x, _ in points[:50]])
    squared = ((X[:, None, :] - X[None, :, :]) ** 2).sum(-1)[np.triu_indices(50, k=1)]
    assert f"the median heuristic gives gamma = {1 / np.median(squared):.3g}, " in message
    assert "nearly every point becomes a support vector of its own" in message


@pytest.mark.parametrize("gamma", ["scale", "auto"])
@pytest.mark.parametrize(("cls", "params", "error"), [
    (IncrementalSVC, {}, TypeError), (SlidingWindowSVC, {}, TypeError),
    (IncrementalLSSVC, {"features": "rff"}, ValueError)])
def test_scikit_learns_gamma_names_are_answered_with_what_to_give(cls, params, error, gamma):
    # "gamma must be a number, got 'scale'" and nothing more: the first thing a scikit-learn
    # user tries, with no word of the median heuristic the models already compute.
    with pytest.raises(error, match=f"got '{gamma}': a model that learns online keeps one "
                                    r"kernel .* 1 / median \|\|x - x'\|\|\^2 over a sample"):
        cls(gamma=gamma, **params)


def test_a_kernel_that_fits_the_scale_is_not_reported():
    # gamma near the median heuristic (1 / (2 * 10) for 10 standard normal features)
    assert _learn(IncrementalSVC(gamma=0.05), _points(1.0)) == []
    # ...and a linear kernel has no width to report
    assert _learn(IncrementalSVC(kernel="linear"), _points(1e-4)) == []


def test_a_nearly_constant_kernel_is_reported():
    (message,) = _learn(IncrementalSVC(), _points(1e-4))
    assert message.startswith("RBF gamma=1 is small for these features")
    assert "the kernel is nearly constant" in message


@pytest.mark.parametrize("model", [
    SlidingWindowSVC(window_size=80, step=10),
    AlphaISVC(batch_size=60),
    IncrementalSVR(),
], ids=lambda model: type(model).__name__)
def test_every_engine_model_reports_it(model):
    target = (lambda x: x["f0"]) if isinstance(model, IncrementalSVR) else None
    (message,) = _learn(model, _points(1.0), target)
    assert "is large for these features" in message


def test_the_warning_changes_nothing():
    points = _points(1.0)
    reported, silent = IncrementalSVC(), IncrementalSVC()
    _learn(reported, points)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for x, label in points:
            silent.learn_one(x, label)
    queries = [x for x, _ in _points(1.0, count=20, seed=1)]
    assert [reported.decision_function_one(x) for x in queries] == \
           [silent.decision_function_one(x) for x in queries]


def test_a_scale_that_jumps_mid_stream_is_reported_from_the_newest_points(monkeypatch):
    # A feature whose unit changed upstream (x 1000) made every later point a support vector
    # of its own; the check at the 50th point had passed.
    monkeypatch.setattr(engine_model, "SCALE_CHECK_EVERY", 20)
    points = _points(1.0, count=300)
    jumped = [({**x, "f0": x["f0"] * 1000.0}, label) for x, label in points[150:]]
    model = IncrementalSVC(gamma=0.05)
    assert _learn(model, points[:150]) == []  # checked at 50, 70, ... on fitting points
    (message,) = _learn(model, jumped)  # once, though every later check finds it too
    assert message.startswith("RBF gamma=0.05 is large for these features")


@pytest.mark.parametrize("make", [IncrementalSVC, IncrementalSVR,
                                  lambda: SlidingWindowSVC(window_size=500, step=1)],
                         ids=["IncrementalSVC", "IncrementalSVR", "SlidingWindowSVC"])
def test_a_model_fit_by_one_learn_many_is_warned_of_before_it_learns(make):
    """A batch user who fits once and then only predicts never makes a second learn call: the
    check counts the rows arriving, and a warning made an error refuses the batch whole."""
    points = _points(1.0, count=300)
    X = pd.DataFrame([x for x, _ in points])
    y = pd.Series([x["f0"] if make is IncrementalSVR else label for x, label in points])
    model = make()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(UserWarning, match=r"RBF gamma=1 is large for these features: the "
                                              r"median squared distance between 200 points"):
            model.learn_many(X, y)
    assert model.n_stored == 0
    engine_model._SCALE_WARNED.clear()  # (said once per process otherwise)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.learn_many(X.iloc[:49], y.iloc[:49])  # 49 points say nothing yet
    with pytest.warns(UserWarning, match="RBF gamma=1 is large"):  # the refusal put off no check
        model.learn_many(X.iloc[49:51], y.iloc[49:51])


def test_said_once_per_process_model_type_and_direction():
    # Per-key models restored from the state topic one after another each said it again.
    points = _points(1.0)
    assert len(_learn(IncrementalSVC(), points)) == 1
    assert _learn(IncrementalSVC(), points) == []  # another model of the same type and gamma
    assert len(_learn(IncrementalSVC(gamma=2.0), points)) == 1


def test_a_warning_made_an_error_refuses_the_point_and_changes_nothing():
    # The check runs before the point is learned: with warnings as errors, the point that
    # met it is refused like any bad input, the model as it was.
    points = _points(1.0)
    model = IncrementalSVC()
    for x, label in points[:49]:
        model.learn_one(x, label)
    before = [model.decision_function_one(x) for x, _ in points[60:70]]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(UserWarning, match="RBF gamma=1 is large"):
            model.learn_one(*points[49])
    assert model.n_stored == 49
    assert [model.decision_function_one(x) for x, _ in points[60:70]] == before


def test_the_first_points_of_a_smooth_series_do_not_call_a_fitting_gamma_wide():
    # 50 consecutive points of slowly moving features are far closer together than the
    # stream's: gamma = 0.1 fits the series (median squared distance about 26; the first 50
    # points: 0.0014).
    t = np.arange(30000) / 30000.0
    series = np.stack([np.sin(2 * np.pi * (k + 1) * t + k) for k in range(5)], axis=1) * 2.2
    points = [({f"f{j}": float(v) for j, v in enumerate(row)}, bool(row[0] > 0))
              for row in series[:200]]
    assert _learn(IncrementalSVC(gamma=0.1), points) == []


def test_an_rff_ls_svm_checks_gamma_against_the_samples_it_learns():
    # The LS-SVMs keep no sample, so they never checked: Phishing's degree-2 features at the
    # default gamma = 1 left an "rff" classifier at 59 % accuracy without a word. They check
    # the mean squared distance between samples (twice the features' summed variance).
    from stream_svm import IncrementalLSSVC

    points = _points(1.0)
    messages = _learn(IncrementalLSSVC(features="rff", seed=0), points)
    assert len(messages) == 1
    X = np.array([list(x.values()) for x, _ in points[:50]])
    distance = 2.0 * X.var(axis=0, ddof=1).sum()
    assert messages[0].startswith(
        "RBF gamma=1 is large for these features: the mean squared distance between samples "
        f"learned (over 50 of them) is {distance:.3g}, so a typical kernel value is "
        f"exp(-{distance:.3g})")
    assert f"the mean heuristic gives gamma = {1 / distance:.3g}, " in messages[0]
    assert "the random features of samples even close together are unrelated" in messages[0]
    assert _learn(IncrementalLSSVC(features="rff", gamma=0.05, seed=0), points) == []
    assert _learn(IncrementalLSSVC(features="linear"), points) == []  # (no kernel width)


def test_an_rff_ls_svms_check_changes_nothing_when_refused_nor_when_the_update_is():
    from stream_svm import IncrementalLSSVR

    points = _points(1.0)
    model = IncrementalLSSVR(features="rff", n_components=50, seed=0)
    for x, label in points[:49]:
        model.learn_one(x, float(label))
    before = pickle.dumps(model)
    # A sample the model refuses (its features overflow the map) is not counted, and does
    # not use up the warning given once per process.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match="too large for the random Fourier map"):
            model.learn_one({"f0": 1.7e308}, 1.0)
        assert pickle.dumps(model) == before
        # A warning made an error refuses the sample that made the check due.
        with pytest.raises(UserWarning, match="RBF gamma=1 is large"):
            model.learn_one(points[49][0], float(points[49][1]))
    assert pickle.dumps(model) == before
    assert len(_learn(model, points[49:50], target=lambda x: 1.0)) == 0  # (said once)
    assert model._samples_added == 50 and model._scale_count == 0


def test_an_rff_ls_svm_sees_a_scale_that_jumps_mid_stream():
    # After the first check, one sample in ten of each 1,000 feeds the next one: a feature's
    # unit changed upstream is seen at the next check.
    from stream_svm import IncrementalLSSVC

    model = IncrementalLSSVC(features="rff", gamma=0.05, seed=0)
    assert _learn(model, _points(1.0, count=1500)) == []
    assert model._samples_added == 1500 and model._next_scale_check == 2050
    assert model._scale_count == 45  # (samples 1050, 1060, ..., 1490)
    messages = _learn(model, _points(30.0, count=600, seed=1))
    assert len(messages) == 1 and "RBF gamma=0.05 is large" in messages[0]
    assert "(over 100 of them)" in messages[0]


def test_one_huge_value_learned_and_forgotten_does_not_derail_the_rff_check():
    # A glitch of 1e300 (finite, so learned) overflowed the running sums of squares: every
    # later learn until the next check warned "overflow encountered in multiply" (93 times in
    # 2,900), and the check then advised "the mean heuristic gives gamma = 0".
    from stream_svm import IncrementalLSSVC

    points = _points(1.0, count=1300, seed=2)
    model = IncrementalLSSVC(features="rff", gamma=0.05, seed=0)
    assert _learn(model, points[:100]) == []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.learn_one({"f0": 1e300, "f1": 0.0}, True, key="glitch")
        model.forget_one(key="glitch")
        for x, label in points[100:1200]:  # past the next check (at 1,050 samples)
            model.learn_one(x, label)
    assert model._samples_added == 1201 and model._next_scale_check == 2050
    # The check after it measures the samples learned since, and says what it would have.
    assert _learn(model, _points(30.0, count=1000, seed=3)) != []
