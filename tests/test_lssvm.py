"""Exactness, state size, guards and River conventions of the incremental/decremental LS-SVM."""

from __future__ import annotations

import doctest
import json
import math
import pickle
import re
import warnings
from fractions import Fraction

import numpy as np
import pandas as pd
import pytest
from river import checks

import stream_svm.lssvm
from stream_svm import AlphaISVC, IncrementalLSSVC, IncrementalLSSVR, IncrementalSVC, IncrementalSVR

# ------------------------------------------------------------------------------------ oracle


def closed_form(design: np.ndarray, targets: np.ndarray, rho: float, fit_intercept: bool):
    """argmin rho ||w||^2 + ||design w + b - y||^2 (b unregularized), by a stable lstsq.

    Least squares on the stacked system [1 Phi; 0 sqrt(rho) I] is much better conditioned
    than the normal equations the model solves, so it is an independent reference.
    """
    n, width = design.shape
    bias = np.ones((n, 1)) if fit_intercept else np.zeros((n, 0))
    top = np.hstack([bias, design])
    bottom = np.hstack([np.zeros((width, bias.shape[1])), math.sqrt(rho) * np.eye(width)])
    stacked = np.vstack([top, bottom])
    rhs = np.concatenate([targets, np.zeros(width)])
    solution = np.linalg.lstsq(stacked, rhs, rcond=None)[0]
    return solution  # (b, w) or w, the model's column order


def fourier(model, rows: np.ndarray) -> np.ndarray:
    """The model's random Fourier map, recomputed from its frequencies and phases."""
    return math.sqrt(2.0 / model.n_components) * np.cos(rows @ model._omega + model._phase)


def model_solution(model) -> np.ndarray:
    if model.fit_intercept:
        return np.concatenate([[model.intercept_], model.coef_])
    return model.coef_


def relative_error(model, rows: np.ndarray, targets: np.ndarray) -> float:
    design = fourier(model, rows) if model.features == "rff" else rows
    reference = closed_form(design, targets, model.rho, model.fit_intercept)
    return float(np.linalg.norm(model_solution(model) - reference) / np.linalg.norm(reference))


NAMES = [f"f{i}" for i in range(6)]


def as_dict(row: np.ndarray) -> dict:
    return {name: float(v) for name, v in zip(NAMES, row, strict=True)}


def as_frame(rows: np.ndarray) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=NAMES[: rows.shape[1]])


def make_data(rng, n=400, kind="well"):
    X = rng.normal(size=(n, len(NAMES)))
    if kind in ("ill", "offset"):
        # Nearly collinear and badly scaled features; with rho = 1e-6 below, cond(A) ~ 5e6
        # ("ill"), and ~1e8 once every feature is offset by 3 ("offset").
        X[:, 1] = X[:, 0] + 1e-3 * rng.normal(size=n)
        X[:, 3] *= 0.01
        if kind == "offset":
            X += 3.0
    y = X[:, 0] - X[:, 2] + 0.3 * rng.normal(size=n) > X[:, 0].mean() - X[:, 2].mean()
    return X, y


# ------------------------------------------------------------------------------- exactness


@pytest.mark.parametrize("fit_intercept", [True, False])
@pytest.mark.parametrize("features", ["linear", "rff"])
def test_single_sample_sequence_matches_closed_form(features, fit_intercept):
    rng = np.random.default_rng(0)
    X, y = make_data(rng)
    model = IncrementalLSSVC(
        rho=0.3, features=features, n_components=30, gamma=0.2, fit_intercept=fit_intercept,
        seed=1,
    )
    held: list[int] = []
    for _ in range(600):
        if held and rng.random() < 0.4:
            i = held.pop(int(rng.integers(len(held))))
            model.forget_one(as_dict(X[i]), bool(y[i]))
        else:
            i = int(rng.integers(len(X)))  # repeats allowed: the training set is a multiset
            held.append(i)
            model.learn_one(as_dict(X[i]), bool(y[i]))
    assert model.n_samples_ == len(held)
    targets = np.where(y[held], 1.0, -1.0)
    assert relative_error(model, X[held], targets) < 1e-10


@pytest.mark.parametrize("features", ["linear", "rff"])
def test_batches_and_simultaneous_updates_match_closed_form(features):
    rng = np.random.default_rng(1)
    X, y = make_data(rng)
    model = IncrementalLSSVC(rho=0.05, features=features, n_components=40, gamma=0.1, seed=2)
    held: list[int] = []
    for step in range(60):
        add = list(rng.integers(len(X), size=int(rng.integers(0, 12))))
        n_remove = int(rng.integers(0, min(len(held), 10) + 1))
        remove = [held.pop(int(rng.integers(len(held)))) for _ in range(n_remove)]
        if step % 3 == 0:
            model.learn_many(as_frame(X[add]), pd.Series(y[add]))
            model.forget_many(as_frame(X[remove]), pd.Series(y[remove]))
        else:
            model.update_many(
                as_frame(X[add]), pd.Series(y[add]), as_frame(X[remove]), pd.Series(y[remove])
            )
        held.extend(int(i) for i in add)
    targets = np.where(y[held], 1.0, -1.0)
    assert len(held) > 50
    assert relative_error(model, X[held], targets) < 1e-10


def test_removing_what_was_added_restores_the_model():
    rng = np.random.default_rng(2)
    X, y = make_data(rng, n=100)
    model = IncrementalLSSVC(rho=0.5)
    model.learn_many(as_frame(X[:60]), pd.Series(y[:60]))
    before = model_solution(model)
    model.learn_many(as_frame(X[60:]), pd.Series(y[60:]))
    assert not np.allclose(model_solution(model), before)
    model.forget_many(as_frame(X[60:]), pd.Series(y[60:]))
    np.testing.assert_allclose(model_solution(model), before, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("kind,rho", [("well", 1.0), ("ill", 1e-6)])
def test_ten_thousand_mixed_updates_stay_within_1e8(kind, rho):
    rng = np.random.default_rng(3)
    X, y = make_data(rng, n=3000, kind=kind)
    model = IncrementalLSSVC(rho=rho)
    model.learn_many(as_frame(X[:500]), pd.Series(y[:500]))
    held = list(range(500))
    outside = list(range(500, len(X)))
    for _ in range(10_000):
        if (rng.random() < 0.5 or len(held) < 200) and len(held) < 2000:
            i = outside.pop(int(rng.integers(len(outside))))
            held.append(i)
            model.learn_one(as_dict(X[i]), bool(y[i]))
        else:
            i = held.pop(int(rng.integers(len(held))))
            outside.append(i)
            model.forget_one(as_dict(X[i]), bool(y[i]))
    targets = np.where(y[held], 1.0, -1.0)
    assert relative_error(model, X[held], targets) < 1e-8


def test_ten_thousand_updates_add_no_error_to_the_normal_equations():
    # With cond(A) ~ 1e8 the normal equations themselves are only good to ~1e-8 against a QR
    # solve; the updates must not add to that: compare with a fresh solve on the same multiset.
    rng = np.random.default_rng(3)
    X, y = make_data(rng, n=3000, kind="offset")
    model = IncrementalLSSVC(rho=1e-6)
    held: list[int] = []
    for i in range(10_000):
        if held and rng.random() < 0.45:
            j = held.pop(int(rng.integers(len(held))))
            model.forget_one(as_dict(X[j]), bool(y[j]))
        else:
            j = i % len(X)
            held.append(j)
            model.learn_one(as_dict(X[j]), bool(y[j]))
    fresh = IncrementalLSSVC(rho=1e-6)
    fresh.learn_many(as_frame(X[held]), pd.Series(y[held]))
    difference = np.linalg.norm(model_solution(model) - model_solution(fresh))
    assert difference / np.linalg.norm(model_solution(fresh)) < 1e-8


def test_rff_with_tiny_rho_after_many_updates():
    rng = np.random.default_rng(4)
    X = rng.normal(size=(800, 3))
    y = X[:, 0] * X[:, 1] > 0
    frame = pd.DataFrame(X, columns=["a", "b", "c"])
    model = IncrementalLSSVC(rho=1e-8, features="rff", n_components=40, gamma=0.3, seed=0)
    held = np.zeros(len(X), dtype=bool)
    for _ in range(300):
        add = rng.choice(np.flatnonzero(~held), size=5, replace=False)
        remove = rng.choice(np.flatnonzero(held), size=min(3, held.sum()), replace=False)
        model.update_many(frame.iloc[add], pd.Series(y[add]), frame.iloc[remove],
                          pd.Series(y[remove]))
        held[add] = True
        held[remove] = False
    targets = np.where(y[held], 1.0, -1.0)
    assert relative_error(model, X[held], targets) < 1e-8


def test_regressor_is_exact_with_real_targets():
    rng = np.random.default_rng(5)
    X = rng.normal(size=(200, 4))
    t = X @ np.array([1.0, -2.0, 0.5, 0.0]) + 7.0 + 0.1 * rng.normal(size=200)
    frame = pd.DataFrame(X, columns=NAMES[:4])
    model = IncrementalLSSVR(rho=0.2)
    model.learn_many(frame, pd.Series(t))
    for i in range(50):
        model.forget_one(frame.iloc[i].to_dict(), float(t[i]))
    reference = closed_form(X[50:], t[50:], 0.2, True)
    np.testing.assert_allclose(model_solution(model), reference, rtol=1e-10)
    assert model.predict_one(frame.iloc[60].to_dict()) == pytest.approx(
        reference[0] + X[60] @ reference[1:]
    )
    # b under the SVMs' name too, so that code reading model.intercept works for every model.
    assert model.intercept == model.intercept_ == pytest.approx(reference[0], rel=1e-10)


def test_learn_many_equals_learn_one_sequence_and_predict_many():
    rng = np.random.default_rng(6)
    X, y = make_data(rng, n=80)
    one, many = IncrementalLSSVC(rho=0.1), IncrementalLSSVC(rho=0.1)
    for row, label in zip(X, y, strict=True):
        one.learn_one(as_dict(row), bool(label))
    many.learn_many(as_frame(X), pd.Series(y))
    np.testing.assert_allclose(model_solution(one), model_solution(many), rtol=1e-12)
    frame = as_frame(X[:10])
    decisions = many.decision_function_many(frame)
    assert decisions.tolist() == pytest.approx(
        [many.decision_function_one(as_dict(r)) for r in X[:10]], rel=1e-12
    )
    assert many.predict_many(frame).tolist() == [bool(d > 0) for d in decisions]
    proba = many.predict_proba_many(frame)
    assert list(proba.columns) == [False, True]
    assert proba[True].tolist() == pytest.approx(
        [many.predict_proba_one(as_dict(r))[True] for r in X[:10]]
    )


def test_linear_new_features_extend_w_with_zeros():
    model = IncrementalLSSVR(rho=1.0, fit_intercept=False)
    model.learn_one({"a": 1.0}, 2.0)
    assert model.coef_.tolist() == pytest.approx([1.0])  # 2 / (1 + 1)
    model.learn_one({"b": 2.0, "a": 0.0}, 1.0)
    assert model.feature_names_ == ["a", "b"]
    reference = closed_form(np.array([[1.0, 0.0], [0.0, 2.0]]), np.array([2.0, 1.0]), 1.0, False)
    np.testing.assert_allclose(model.coef_, reference)
    # An unseen feature at prediction time has weight 0.
    assert model.predict_one({"a": 1.0, "zzz": 5.0}) == pytest.approx(model.coef_[0])


def test_feature_order_does_not_matter_for_rff():
    a = IncrementalLSSVC(features="rff", n_components=10, seed=7)
    b = IncrementalLSSVC(features="rff", n_components=10, seed=7)
    a.learn_one({"x": 1.0, "y": 2.0, "z": 0.0}, True)
    b.learn_one({"z": 0.0, "y": 2.0, "x": 1.0}, True)
    a.learn_one({"x": -1.0, "y": 0.5}, False)
    b.learn_one({"y": 0.5, "x": -1.0}, False)
    np.testing.assert_array_equal(model_solution(a), model_solution(b))
    # The zero-valued "z" of the first sample belongs to the map: it may carry values later.
    a.learn_one({"z": 3.0}, True)


def test_rff_is_reproducible_from_seed():
    first = IncrementalLSSVC(features="rff", n_components=8, seed=11)
    second = IncrementalLSSVC(features="rff", n_components=8, seed=11)
    other = IncrementalLSSVC(features="rff", n_components=8, seed=12)
    for model in (first, second, other):
        model.learn_one({"u": 0.3, "v": -1.0}, True)
    np.testing.assert_array_equal(first._omega, second._omega)
    assert not np.array_equal(first._omega, other._omega)


# ------------------------------------------------------------------------------ state size


def array_sizes(model) -> dict[str, int]:
    # (the kernel-scale check's statistics come and go with its periods: checked apart)
    return {k: v.size for k, v in vars(model).items()
            if isinstance(v, np.ndarray) and not k.startswith("_scale_")}


@pytest.mark.parametrize("features", ["linear", "rff"])
def test_state_does_not_grow_with_samples(features):
    rng = np.random.default_rng(8)
    X, y = make_data(rng, n=10_000)
    model = IncrementalLSSVC(features=features, n_components=25, seed=0)
    model.learn_many(as_frame(X[:100]), pd.Series(y[:100]))
    sizes_100, pickled_100 = array_sizes(model), len(pickle.dumps(model))
    for start in range(100, 10_000, 500):
        model.learn_many(as_frame(X[start : start + 500]), pd.Series(y[start : start + 500]))
    assert model.n_samples_ == 10_000
    assert array_sizes(model) == sizes_100
    assert max(sizes_100.values()) <= (len(NAMES) + 26) ** 2  # J x J at most
    # Larger counts, nothing else (but the kernel-scale check's statistics, one mean and one
    # sum of squares per feature, there now, not at the end of the first check's period):
    statistics = 2 * len(pickle.dumps(np.zeros(len(NAMES)))) if features == "rff" else 0
    assert abs(len(pickle.dumps(model)) - pickled_100) < 64 + statistics
    assert all(model.__dict__.get(name) is None or model.__dict__[name].size == len(NAMES)
               for name in ("_scale_mean", "_scale_m2"))
    for value in vars(model).values():
        assert not isinstance(value, (list, dict, tuple)) or len(value) < 100


# ---------------------------------------------------------------------------------- guards


def snapshot(model) -> bytes:
    return pickle.dumps(model)


@pytest.mark.parametrize("cls", [IncrementalLSSVC, IncrementalLSSVR])
def test_a_parameter_another_estimator_has_is_refused_naming_this_one(cls):
    # (IncrementalLSSVR's constructor was its private base's: "_IncrementalLSSVM.__init__()
    # got an unexpected keyword argument 'C'".)
    with pytest.raises(TypeError, match=rf"^{cls.__name__}\.__init__\(\) got an unexpected "
                                        r"keyword argument 'C'"):
        cls(rho=2.0).clone({"C": 1.0})
    assert cls(rho=2.0, seed=4).clone()._get_params() == cls(rho=2.0, seed=4)._get_params()


def test_forgetting_from_an_empty_model_is_an_error():
    model = IncrementalLSSVC()
    with pytest.raises(ValueError, match="holds 0"):
        model.forget_one({"a": 1.0}, True)
    assert model.n_samples_ == 0


def test_forgetting_more_than_held_is_an_error():
    model = IncrementalLSSVC()
    model.learn_one({"a": 1.0}, True)
    before = snapshot(model)
    frame = pd.DataFrame({"a": [1.0, 1.0]})
    with pytest.raises(ValueError, match="cannot forget 2 samples: the model holds 1"):
        model.forget_many(frame, pd.Series([True, True]))
    assert snapshot(model) == before


def test_forgetting_a_never_learned_feature_is_an_error():
    model = IncrementalLSSVC()
    model.learn_one({"a": 1.0}, True)
    model.learn_one({"a": 2.0}, False)
    before = snapshot(model)
    with pytest.raises(ValueError, match=r"features \['b'\].*never learned"):
        model.forget_one({"a": 1.0, "b": 1.0}, True)
    assert snapshot(model) == before


def test_forgetting_an_impossible_sample_is_detected_and_harmless():
    model = IncrementalLSSVR(rho=1.0)
    for v in (1.0, 2.0, -1.0):
        model.learn_one({"a": v}, v)
    before = snapshot(model)
    # Sum of squares of "a" is 6; a sample with a = 10 cannot have been among them.
    with pytest.raises(ValueError, match="'a' exceed what the model holds"):
        model.forget_one({"a": 10.0}, 0.0)
    assert snapshot(model) == before
    # Removing everything must leave nothing: a wrong target is caught then.
    with pytest.raises(ValueError, match="residue"):
        model.forget_many(pd.DataFrame({"a": [1.0, 2.0, -1.0]}), pd.Series([1.0, 2.0, 5.0]))
    assert snapshot(model) == before
    model.forget_many(pd.DataFrame({"a": [1.0, 2.0, -1.0]}), pd.Series([1.0, 2.0, -1.0]))
    assert model.n_samples_ == 0 and model.predict_one({"a": 3.0}) == 0.0


def test_indefinite_downdate_is_detected():
    # Diagonal entries stay positive but the 2 x 2 system becomes indefinite.
    model = IncrementalLSSVR(rho=0.01, fit_intercept=False)
    model.learn_many(pd.DataFrame({"a": [1.0, 1.0], "b": [1.0, -1.0]}), pd.Series([0.0, 0.0]))
    model.learn_one({"a": 0.0, "b": 0.0}, 0.0)
    before = snapshot(model)
    with pytest.raises(ValueError, match="not positive definite"):
        model.forget_many(pd.DataFrame({"a": [1.4], "b": [1.4]}), pd.Series([0.0]))
    assert snapshot(model) == before


@pytest.mark.parametrize("label", [2, "yes", None, 0.5])
def test_bad_labels_are_named_and_change_nothing(label):
    model = IncrementalLSSVC()
    model.learn_one({"a": 1.0}, True)
    before = snapshot(model)
    with pytest.raises(ValueError, match="not binary"):
        model.learn_one({"a": 2.0}, label)
    assert snapshot(model) == before


def test_bad_feature_values_are_named_and_change_nothing():
    model = IncrementalLSSVC()
    model.learn_one({"a": 1.0}, True)
    before = snapshot(model)
    with pytest.raises(TypeError, match="'a'"):
        model.learn_one({"a": "text"}, True)
    with pytest.raises(ValueError, match="'b' is infinite"):
        model.learn_many(pd.DataFrame({"a": [1.0], "b": [math.inf]}), pd.Series([True]))
    with pytest.raises(ValueError, match="target must be finite"):
        IncrementalLSSVR().learn_one({"a": 1.0}, math.nan)
    with pytest.raises(ValueError, match="2 samples to add but 1 targets"):
        model.learn_many(pd.DataFrame({"a": [1.0, 2.0]}), pd.Series([True]))
    assert snapshot(model) == before


def test_rff_features_may_appear_at_any_time_and_learning_stays_exact():
    # The map was fixed on the first sample's features: a later one stopped a River
    # pipeline whose one-hot encoder met a new category (and dead-lettered it in the daemon).
    rng = np.random.default_rng(4)
    X, _ = make_data(rng, n=120)
    X[:40, 3:] = 0.0  # f3 to f5 first come at sample 40, f5 at sample 80
    X[:80, 5] = 0.0
    targets = X[:, 0] - X[:, 4] + 0.1 * X[:, 5]
    model = IncrementalLSSVR(features="rff", n_components=30, gamma=0.2, rho=0.5, seed=2)
    for row, target in zip(X[:40], targets[:40], strict=True):
        model.learn_one({k: v for k, v in as_dict(row).items() if v != 0.0}, target)
    before = snapshot(model)
    query = as_dict(X[50])
    known = {name: query[name] for name in ("f0", "f1", "f2")}
    # A feature never learned has no frequencies yet: it is ignored, and nothing changes.
    assert model.predict_one(query) == model.predict_one(known)
    assert snapshot(model) == before
    for row, target in zip(X[40:], targets[40:], strict=True):
        model.learn_one({k: v for k, v in as_dict(row).items() if v != 0.0}, target)
    assert sorted(model.feature_names_) == NAMES and model._omega.shape == (6, 30)
    order = [NAMES.index(name) for name in model.feature_names_]
    assert relative_error(model, X[:, order], targets) < 1e-10
    assert model.predict_one(query) != model.predict_one(known)


def test_forgetting_after_the_map_grew_subtracts_what_learning_added():
    # A sample's angles came from a BLAS product whose rounding depends on the map's width:
    # once new feature names had grown it, forgetting a sample learned before subtracted
    # terms a few ulps off what learning it had added. With angles of 1e5 (features of 1e4:
    # gamma too large for them, as the model warns) that left 2e-11 to 7e-11 in
    # predictions of 1 where learning only the samples kept leaves 0.
    worst = 0.0
    for trial in range(8):
        rng = np.random.default_rng(trial)
        width, new_width = int(rng.integers(8, 20)), int(rng.integers(20, 40))
        params = dict(features="rff", n_components=100, gamma=1.0, rho=0.1, seed=1)
        old = [({f"f{j}": v for j, v in enumerate(rng.normal(scale=1e4, size=width))},
                float(rng.normal())) for _ in range(30)]
        new = [({f"g{j}": v for j, v in enumerate(rng.normal(scale=1e4, size=new_width))},
                0.3) for _ in range(2)]
        forgetting, kept_only = IncrementalLSSVR(**params), IncrementalLSSVR(**params)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # gamma against the features' scale
            for key, (x, target) in enumerate(old + new):
                forgetting.learn_one(x, target, key=key)
            for key in range(15):
                forgetting.forget_one(key=key)
            for x, target in old[15:] + new:
                kept_only.learn_one(x, target)
        queries = [{f"f{j}": v for j, v in enumerate(rng.normal(scale=1e4, size=width))}
                   for _ in range(20)]
        for query in queries:
            worst = max(worst, abs(forgetting.predict_one(query) - kept_only.predict_one(query)))
    assert worst <= 1e-13


@pytest.mark.parametrize(("features", "held"), [
    ("rff", "the random Fourier map holds n_components frequencies per feature name, which "
            "it keeps for good"),
    ("linear", "the state is a J x J matrix over them")])
def test_the_feature_bound_names_what_each_map_keeps_per_feature(features, held):
    # The rff map was refused past max_features "because the state is a J x J matrix", which
    # it is not (n_components wide whatever J): the message sent users to the wrong remedy.
    model = IncrementalLSSVC(features=features, max_features=2, seed=0)
    model.learn_one({"a": 1.0, "b": 1.0}, True)
    before = snapshot(model)
    with pytest.raises(ValueError, match=f"3 feature names, more than max_features=2 .{held}.; "
                                         "the model is unchanged .raise max_features"):
        model.learn_one({"c": 1.0}, False)
    assert snapshot(model) == before


def test_a_features_fourier_row_does_not_depend_on_when_it_first_came():
    late = IncrementalLSSVC(features="rff", n_components=8, seed=5)
    late.learn_one({"a": 1.0}, True)
    late.learn_one({"b": 2.0, "a": -1.0}, False)
    early = IncrementalLSSVC(features="rff", n_components=8, seed=5)
    early.learn_many(pd.DataFrame({"b": [0.0, 2.0], "a": [1.0, -1.0]}),
                     pd.Series([True, False]))
    assert late.feature_names_ == ["a", "b"] and early.feature_names_ == ["b", "a"]
    np.testing.assert_array_equal(late._omega, early._omega[[1, 0]])
    np.testing.assert_array_equal(late._phase, early._phase)
    for x in ({"a": 0.3, "b": -0.7}, {"b": 1.5}):
        assert late.decision_function_one(x) == pytest.approx(early.decision_function_one(x),
                                                              rel=1e-12, abs=1e-12)
    other = IncrementalLSSVC(features="rff", n_components=8, seed=6)
    other.learn_one({"a": 1.0}, True)
    assert not np.array_equal(other._omega, late._omega[:1])
    # Names equal as dict keys, of different types, get one row (numpy's 0.5 drew another
    # row than 0.5: two models learning the same samples in another order differed).
    rows = []
    for name in (0.5, np.float64(0.5), 3, 3.0, np.int64(3), 1, np.int64(1), 1.0):
        model = IncrementalLSSVC(features="rff", n_components=8, seed=5)
        model.learn_one({name: 1.0}, True)
        rows.append(model._omega[0])
    assert all(np.array_equal(rows[0], row) for row in rows[1:2])
    assert all(np.array_equal(rows[2], row) for row in rows[3:5])
    assert all(np.array_equal(rows[5], row) for row in rows[6:])
    assert not np.array_equal(rows[0], rows[2]) and not np.array_equal(rows[2], rows[5])


@pytest.mark.parametrize("copy_of", ["pickle", "checkpoint", "deepcopy"])
def test_a_copy_taken_before_the_first_update_learns_the_same_map(copy_of):
    # Without a seed, each copy drew a map of its own at its first update: the original, a
    # restored checkpoint and a pickled copy predicted 0.698, 0.631 and 0.689 after the same
    # two samples.
    import copy

    original = IncrementalLSSVR(features="rff", n_components=30, gamma=0.5)
    if copy_of == "pickle":
        twin = pickle.loads(pickle.dumps(original))
    elif copy_of == "deepcopy":
        twin = copy.deepcopy(original)
    else:
        twin = IncrementalLSSVR.from_checkpoint(*original.to_checkpoint())
    for model in (original, twin):
        model.learn_one({"a": 0.3, "b": -1.0}, 0.7)
        model.learn_one({"a": -0.5, "c": 2.0}, -0.2)
    query = {"a": 0.1, "b": 0.4, "c": -0.3}
    assert twin.predict_one(query) == original.predict_one(query)
    # A new model (clone()) is another draw: seed=None asks for one.
    assert original.clone()._fourier_seed != original._fourier_seed


def test_a_restored_rff_model_draws_a_new_features_row_as_the_original_does():
    # With no seed given, the map's seed is drawn at the first update and checkpointed: a
    # daemon restarted from a checkpoint learns a new feature as it would have without the
    # restart.
    model = IncrementalLSSVR(features="rff", n_components=50, rho=0.5)
    empty = snapshot(model)
    with pytest.raises(ValueError, match="too large for the random Fourier map"):
        model.learn_one({"a": 1.7e308}, 1.0)  # (a refused first update draws no seed)
    assert snapshot(model) == empty
    model.learn_one({"a": 1.0}, 1.0)
    arrays, meta = model.to_checkpoint()
    restored = IncrementalLSSVR.from_checkpoint(arrays, meta)
    fresh = IncrementalLSSVR(features="rff", n_components=50, rho=0.5)
    fresh.learn_one({"a": 1.0}, 1.0)
    for each in (model, restored, fresh):
        each.learn_one({"a": 0.5, "b": 2.0}, -1.0)
    np.testing.assert_array_equal(restored._omega, model._omega)
    assert restored.predict_one({"a": 0.2, "b": 1.0}) == model.predict_one({"a": 0.2, "b": 1.0})
    assert not np.array_equal(fresh._omega, model._omega)  # (another model, another seed)


@pytest.mark.parametrize(
    "params",
    [{"rho": 0.0}, {"rho": -1.0}, {"rho": math.inf}, {"features": "poly"},
     {"n_components": 0}, {"gamma": 0.0}, {"seed": "x"}, {"seed": 1.5}, {"seed": -1},
     {"seed": True},
     # A seed a checkpoint cannot keep: the model learned, and its checkpoint was refused on
     # restore (after a crash, say).
     {"features": "rff", "seed": 2**64},
     # Too many to allocate: it spent 20 s and 16 GB before failing in numpy's words.
     {"features": "rff", "n_components": 10**6},
     # Too large for a float: OverflowError, naming nothing.
     {"rho": 10**400}, {"gamma": 10**400},
     {"features": ["rff"]}],
)
def test_bad_parameters(params):
    name = "seed" if "seed" in params else next(reversed(params))
    with pytest.raises(ValueError, match=name):
        IncrementalLSSVC(**params)


@pytest.mark.parametrize("value", ["False", None, math.nan, [0]])
def test_fit_intercept_must_be_a_boolean(value):
    # Read by truth value, the text "False" from a configuration file fitted an intercept.
    with pytest.raises(TypeError, match="fit_intercept must be True or False"):
        IncrementalLSSVC(fit_intercept=value)


@pytest.mark.parametrize("value", [0, 1, np.bool_(True), np.int64(0)])
def test_fit_intercept_takes_0_and_1(value):
    # (Checkpoints were written with what was given: 1 among them.)
    model = IncrementalLSSVC(fit_intercept=value)
    model.learn_one({"a": 1.0}, True)
    model.learn_one({"a": -1.0}, False)
    arrays, meta = model.to_checkpoint()
    assert IncrementalLSSVC.from_checkpoint(arrays, meta).intercept == model.intercept


@pytest.mark.parametrize("make", [
    lambda: IncrementalSVC(C=Fraction(1, 3)),
    lambda: IncrementalLSSVC(rho=Fraction(1, 2), gamma=Fraction(1, 2), features="rff", seed=1),
    lambda: AlphaISVC(discard_ratio=Fraction(1, 2), batch_size=1),
    lambda: IncrementalSVR(epsilon=Fraction(1, 10)),
])
def test_fractions_make_checkpoints_json_keeps(make):
    # Taken as numbers, they made metadata json.dumps refused ("Fraction is not JSON
    # serializable"), in a checkpoint the README calls JSON-ready.
    model = make()
    label = 1.0 if isinstance(model, IncrementalSVR) else True
    model.learn_one({"a": 1.0}, label)
    model.learn_one({"a": -1.0}, -label if label is not True else False)
    arrays, meta = model.to_checkpoint()
    restored = type(model).from_checkpoint(arrays, json.loads(json.dumps(meta)))
    assert restored.predict_one({"a": 0.3}) == model.predict_one({"a": 0.3})


def test_probabilities_before_and_after_training():
    model = IncrementalLSSVC()
    assert model.predict_proba_one({"a": 1.0}) == {False: 0.5, True: 0.5}
    assert model.predict_one({"a": 1.0}) is False
    model.learn_many(pd.DataFrame({"a": [1.0, -1.0]}), pd.Series([True, False]))
    proba = model.predict_proba_one({"a": 1.0})
    # f = 2/3 for rho = 1, so p = (1 + f) / 2.
    assert proba[True] == pytest.approx(5 / 6) and sum(proba.values()) == pytest.approx(1.0)
    assert model.predict_proba_one({"a": 100.0}) == {False: 0.0, True: 1.0}


def test_docstring_examples():
    result = doctest.testmod(stream_svm.lssvm)
    assert result.attempted > 0 and result.failed == 0


# ----------------------------------------------------------------------------- River checks


def _river_checks():
    for cls in (IncrementalLSSVC, IncrementalLSSVR):
        for params in cls._unit_test_params():
            model = cls(**params)
            skips = model._unit_test_skips()
            for check in checks.yield_checks(model):
                if check.__name__ in skips:
                    continue
                label = f"{cls.__name__}({params.get('features', 'linear')})-{check.__name__}"
                yield pytest.param(model, check, id=label)


@pytest.mark.parametrize("model,check", list(_river_checks()))
def test_river_checks(model, check):
    check(model.clone())


@pytest.mark.parametrize("cls,label", [(IncrementalLSSVC, True), (IncrementalLSSVR, 1.0)])
def test_features_too_large_for_the_fourier_map_are_refused_and_change_nothing(cls, label):
    # (frequencies of 14 on average: 1e308 times any of them above 1.8 overflows)
    model = cls(features="rff", n_components=10, gamma=100.0, seed=1)
    model.learn_one({"a": 0.5}, label)
    model.learn_one({"a": -0.5}, -label if isinstance(label, float) else not label)
    arrays, _ = model.to_checkpoint()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a clear error, not numpy's overflow warnings
        with pytest.raises(ValueError, match="too large for the random Fourier map"):
            model.learn_one({"a": 1e308}, label)
        with pytest.raises(ValueError, match="too large for the random Fourier map"):
            model.predict_one({"a": -1e308})
    after, _ = model.to_checkpoint()
    assert all(np.array_equal(arrays[name], after[name]) for name in arrays)


@pytest.mark.parametrize("cls", [IncrementalLSSVC, IncrementalLSSVR])
def test_a_kept_sample_forgotten_by_value_is_not_kept_any_more(cls):
    rng = np.random.default_rng(11)
    xs = [{"a": float(rng.normal()), "b": float(rng.normal())} for _ in range(10)]
    ys = ([bool(v > 0) for v in rng.normal(size=10)] if cls is IncrementalLSSVC
          else [float(v) for v in rng.normal(size=10)])
    model, reference = cls(), cls()
    for i, (x, y) in enumerate(zip(xs, ys, strict=True)):
        model.learn_one(x, y, key=i)
        if i not in (0, 3, 4):
            reference.learn_one(x, y)
    # By value, with the features in another order and an explicit zero: the sample learned
    # under key 0 is the one forgotten, and its key goes with it (it forgot the sample a
    # second time before: a decision of -0.441 where the model of the other nine gave -0.585).
    model.forget_one({"zero": 0.0, "b": xs[0]["b"], "a": xs[0]["a"]}, ys[0])
    assert 0 not in model and model.n_stored == 9
    with pytest.raises(KeyError, match="no sample is learned under key 0"):
        model.forget_one(key=0)
    model.forget_many(X=pd.DataFrame([xs[3], xs[4]]), y=pd.Series([ys[3], ys[4]]))
    assert model.stored_keys() == [1, 2, 5, 6, 7, 8, 9]
    probes = pd.DataFrame([{"a": 0.3, "b": -0.2}, {"a": -1.0, "b": 0.5}])
    assert np.allclose(model.decision_function_many(probes),
                       reference.decision_function_many(probes), rtol=1e-12, atol=1e-12)
    # update_many's removals too (its key stayed: forgetting it subtracted the sample twice,
    # or was refused as a sample never learned)
    extra = {"a": 0.5, "b": 0.5}
    model.update_many(pd.DataFrame([extra]), pd.Series([ys[1]]), pd.DataFrame([xs[5]]),
                      pd.Series([ys[5]]))
    reference.update_many(pd.DataFrame([extra]), pd.Series([ys[1]]), pd.DataFrame([xs[5]]),
                          pd.Series([ys[5]]))
    assert 5 not in model and model.stored_keys() == [1, 2, 6, 7, 8, 9]
    with pytest.raises(KeyError, match="no sample is learned under key 5"):
        model.forget_one(key=5)
    assert np.allclose(model.decision_function_many(probes),
                       reference.decision_function_many(probes), rtol=1e-12, atol=1e-12)


def test_keys_repeated_in_a_batch_to_learn_are_named_and_change_nothing():
    model = IncrementalLSSVC()
    X = pd.DataFrame([{"a": 1.0}, {"a": -2.0}])
    y = pd.Series([True, False])
    with pytest.raises(KeyError, match="'z' repeats within the batch"):
        model.learn_many(X, y, keys=["z", "z"])
    assert model.n_samples_ == 0
    model.learn_many(X, y, keys=[1, 2])
    before = snapshot(model)
    with pytest.raises(KeyError, match="key 1 is listed twice for removal"):
        model.forget_many(keys=[1, 1])  # (as the SVMs refuse it; it was forgotten once)
    assert snapshot(model) == before
    model.forget_many(keys=[1])
    assert model.stored_keys() == [2] and model.n_samples_ == 1


@pytest.mark.parametrize("cls,target", [(IncrementalLSSVR, 1.0), (IncrementalLSSVC, True)])
def test_features_whose_products_overflow_are_refused_by_name(cls, target):
    # It said "a sample being forgotten was not learned by the model", after numpy warnings.
    model = cls()
    model.learn_one({"a": 1.0}, target)
    before = model.decision_function_one({"a": 0.5})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match="too large: their products overflow"):
            model.learn_one({"a": 1e200}, target)
    assert model.n_samples_ == 1 and model.decision_function_one({"a": 0.5}) == before


def test_a_forget_by_key_refused_for_its_conditioning_is_not_blamed_on_the_sample():
    # The sample was learned under its key, yet the refusal said it "was not learned by the
    # model": the cause is rho = 1e-8 beside features near 1e4.
    model = IncrementalLSSVR(rho=1e-8)
    model.learn_one({"f0": -0.0005936751273756264, "f1": 8612.190556690688},
                    119.24864710821501, key="a")
    model.learn_many(pd.DataFrame({"f0": [0.001885], "f1": [-14481.993418]}),
                     pd.Series([-0.295968]), keys=["b"])
    before = snapshot(model)
    with pytest.raises(ValueError, match="too large next to rho") as refused:
        model.forget_one(key="a")
    assert "not learned" not in str(refused.value) and "raise rho" in str(refused.value)
    assert snapshot(model) == before and model.stored_keys() == ["a", "b"]


@pytest.mark.parametrize("target", ["3.0", None, True, [1.0]])
def test_a_target_that_is_not_a_number_is_a_type_error_as_for_the_svr(target):
    from stream_svm import IncrementalSVR

    model = IncrementalLSSVR()
    model.learn_one({"a": 1.0}, 2.0)
    before = snapshot(model)
    for regressor in (model, IncrementalSVR()):
        with pytest.raises(TypeError, match="the target must be a real number"):
            regressor.learn_one({"a": 2.0}, target)
        with pytest.raises(TypeError, match="the target must be a real number"):
            regressor.learn_many(pd.DataFrame({"a": [2.0]}), pd.Series([target], dtype=object))
    assert snapshot(model) == before


def test_a_decimal_target_is_learned_as_its_float_as_decimal_features_are():
    """A database's NUMERIC column comes as Decimals: refused as targets while accepted as
    features, it made a regression stream from SQL fail on its first label."""
    from decimal import Decimal

    from stream_svm import IncrementalSVR

    for cls in (IncrementalLSSVR, IncrementalSVR):
        as_decimals, as_floats = cls(), cls()
        as_decimals.learn_one({"a": Decimal("1.5")}, Decimal("2.25"))
        as_decimals.learn_many(pd.DataFrame({"a": [0.5, -1.0]}),
                               pd.Series([Decimal("-1"), Decimal("0.5")], dtype=object))
        as_floats.learn_one({"a": 1.5}, 2.25)
        as_floats.learn_many(pd.DataFrame({"a": [0.5, -1.0]}), pd.Series([-1.0, 0.5]))
        assert as_decimals.predict_one({"a": 0.2}) == as_floats.predict_one({"a": 0.2})
        before = snapshot(as_decimals)
        for not_finite in (Decimal("NaN"), Decimal("sNaN"), Decimal("Infinity")):
            with pytest.raises(ValueError, match="the target must be finite"):
                as_decimals.learn_one({"a": 2.0}, not_finite)
        assert snapshot(as_decimals) == before


@pytest.mark.parametrize("cls,targets", [(IncrementalLSSVC, [1, 0, np.int64(1)]),
                                         (IncrementalLSSVR, [3, np.float32(1.5), -2])])
def test_stored_points_are_the_same_before_and_after_a_checkpoint(cls, targets):
    model = cls()
    model.learn_one({"a": 1, "b": None, "c": 0.0}, targets[0], key="one")
    model.learn_many(pd.DataFrame({"a": [-1.0, 0.5], "b": [np.nan, 2.0]}),
                     pd.Series(targets[1:], dtype=object), keys=["two", "three"])
    model.relabel_one("three", targets[0])
    restored = cls.from_checkpoint(*model.to_checkpoint())
    for key in ("one", "two", "three"):
        assert restored.stored_point(key) == model.stored_point(key)
        assert repr(restored.stored_point(key)) == repr(model.stored_point(key))
    assert model.stored_point("one") == ({"a": 1.0}, 3.0 if cls is IncrementalLSSVR else True)
    assert model.stored_point("two") == ({"a": -1.0},
                                         1.5 if cls is IncrementalLSSVR else False)


@pytest.mark.parametrize("model_class, labels", [(IncrementalLSSVC, (True, False)),
                                                 (IncrementalLSSVR, (1.0, -2.0))])
def test_the_rounding_left_in_a_column_no_sample_uses_does_not_refuse_later_forgets(
        model_class, labels):
    # A relabel's product rounds differently with and without a fused multiply-add: once the
    # relabelled sample was forgotten, its column held -3e-16 below rho, and the removal check
    # blamed that column for every later forget or relabel of any sample (40 % of two-decimal
    # values of d between 0.01 and 9.99 did it).
    refused = 0
    for d in np.round(np.arange(0.01, 10.0, 0.07), 2):
        model = model_class()
        model.learn_one({"d": float(d)}, labels[0], key="p")
        model.relabel_one("p", labels[1])
        model.learn_one({"e": 1.0}, labels[0], key="q")
        model.learn_one({"e": 2.0, "f": 0.5}, labels[1], key="r")
        model.forget_one(key="p")
        try:
            model.forget_one(key="q")
        except ValueError:
            refused += 1
            continue
        target = -1.0 if labels[1] is False else labels[1]
        reference = closed_form(np.array([[2.0, 0.5]]), np.array([target]), model.rho, True)
        np.testing.assert_allclose(model_solution(model)[[0, 2, 3]], reference, atol=1e-12)
    assert refused == 0
    # A sample that was never learned is still refused by the columns it uses.
    with pytest.raises(ValueError, match="cannot forget these samples"):
        model.forget_one({"e": 5.0}, labels[0])


def test_an_rff_model_learns_a_first_sample_without_features_exactly():
    # The map was drawn on the first sample's features: drawn on none, it refused every later
    # sample with some. A sample without features maps to cos(phase), a sample like any other.
    model = IncrementalLSSVR(features="rff", n_components=12, gamma=0.5, seed=0)
    model.learn_one({}, 1.0)
    model.learn_one({"a": 1.0}, -1.0)
    model.learn_one({"a": -1.0, "b": 0.5}, 2.0)
    assert model.n_samples_ == 3
    rows = np.array([[0.0, 0.0], [1.0, 0.0], [-1.0, 0.5]])
    assert relative_error(model, rows, np.array([1.0, -1.0, 2.0])) < 1e-12


@pytest.mark.parametrize("round_trip", [False, True])
def test_forgetting_every_sample_is_not_refused_for_the_rounding_of_cancelled_terms(round_trip):
    # A batch's Phi y is a sum of rounded products; forgotten one by one, its samples leave a
    # residue of eps times those products. With copies under opposite labels left, Phi y
    # cancels to 0 and that residue (2.2e-16) was judged against nothing: forgetting the
    # last two samples was refused as "cannot be all the model learned".
    import pandas as pd

    from stream_svm import IncrementalLSSVC

    model = IncrementalLSSVC()
    model.learn_many(pd.DataFrame({"f0": [1.8955143609467267, -0.24013106478115234]}),
                     pd.Series([True, True]), keys=[0, 1])
    model.forget_one(key=0)
    model.learn_one({"f0": -0.24013106478115234}, False, key=2)
    if round_trip:
        model = IncrementalLSSVC.from_checkpoint(*model.to_checkpoint())
    model.forget_many(keys=[1, 2])
    assert model.n_samples_ == 0 and model.predict_proba_one({"f0": 1.0}) == {
        False: 0.5, True: 0.5}
    # A large sample forgotten leaves its products' rounding in the column beside a small
    # sample's square: forgetting the small one was refused as "not all learned".
    small = IncrementalLSSVC(rho=1.0)
    small.learn_many(pd.DataFrame([[42.0, 53.0], [-0.0012, 0.001]], columns=["a", "b"]),
                     pd.Series([False, True]), keys=[0, 1])
    if round_trip:
        small = IncrementalLSSVC.from_checkpoint(*small.to_checkpoint())
    small.forget_one(key=0)
    small.forget_one(key=1)
    assert small.n_samples_ == 0
    # What was never learned is still refused.
    model.learn_one({"f0": 1.0}, True, key="a")
    with pytest.raises(ValueError, match="cannot"):
        model.forget_one({"f0": 2.0}, True)


def test_the_rounding_allowed_when_emptying_follows_the_products_not_every_sample_ever():
    # The rounding allowed grows with the products summed since the model was empty, by a few
    # eps of them: large samples that came and went do not let a never-learned one pass.
    import json

    import pandas as pd

    from stream_svm import IncrementalLSSVC, IncrementalLSSVR

    model = IncrementalLSSVC()
    model.learn_one({"f": 1.0}, True)
    rng = np.random.default_rng(0)
    big = pd.DataFrame({"f": rng.normal(size=1000) * 1e5})
    model.learn_many(big, pd.Series(rng.random(1000) > 0.5), keys=list(range(1000)))
    model.forget_many(keys=list(range(1000)))
    with pytest.raises(ValueError, match="cannot be all the model learned"):
        model.forget_one({"f": 0.5}, True)
    model.forget_one({"f": 1.0}, True)
    assert model.n_samples_ == 0
    # Products past the largest float: not written as inf (JSON has none), and not known after
    # a restore, where only the state's own size counts.
    huge = IncrementalLSSVR()
    huge.learn_one({"g": 1.0}, 1.0)
    for _ in range(2):
        huge.learn_one({"f": 9e153}, 1.0)
        huge.forget_one({"f": 9e153}, 1.0)
    arrays, meta = huge.to_checkpoint()
    restored = IncrementalLSSVR.from_checkpoint(arrays, json.loads(json.dumps(meta,
                                                                              allow_nan=False)))
    assert restored.predict_one({"g": 1.0}) == huge.predict_one({"g": 1.0})


def exact_decision(rows: list[list[float]], targets: list[float], probe: list[float],
                   rho: float = 1.0) -> float:
    """f(probe) of the LS-SVM with an unregularized bias, solved in rational arithmetic."""
    width = len(rows[0]) + 1
    A = [[Fraction(0)] * width for _ in range(width)]
    b = [Fraction(0)] * width
    for row, target in zip(rows, targets, strict=True):
        phi = [Fraction(1)] + [Fraction(v) for v in row]
        for i in range(width):
            b[i] += phi[i] * Fraction(target)
            for j in range(width):
                A[i][j] += phi[i] * phi[j]
    for i in range(1, width):
        A[i][i] += Fraction(rho)
    for column in range(width):  # Gauss-Jordan, exact
        for i in range(width):
            if i != column and A[i][column]:
                factor = A[i][column] / A[column][column]
                A[i] = [a - factor * c for a, c in zip(A[i], A[column], strict=True)]
                b[i] -= factor * b[column]
    w = [b[i] / A[i][i] for i in range(width)]
    return float(w[0] + sum(wi * Fraction(p) for wi, p in zip(w[1:], probe, strict=True)))


@pytest.mark.parametrize("cls", [IncrementalLSSVR, IncrementalLSSVC])
def test_normal_equations_too_ill_conditioned_for_float64_are_warned_of(cls, monkeypatch):
    # One sample of features +-1e7 among unit-scale ones left decision values 3e-4 from the
    # solution of rational arithmetic (1e8: 1e-2, 1e9: 0.1 to 1) without a word.
    monkeypatch.setattr(stream_svm.lssvm, "_CONDITIONING_WARNED", set())
    rng = np.random.default_rng(10)
    rows = [list(map(float, rng.normal(size=3))) for _ in range(11)] + [[1e7, -1e7, 0.1]]
    regression = cls is IncrementalLSSVR
    targets = [sum(row) for row in rows[:-1]] + [1.5]
    labels = targets if regression else [value > 0 for value in targets]
    model = cls()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for row, label in zip(rows[:-1], labels[:-1], strict=True):
            model.learn_one(dict(zip("abc", row, strict=True)), label)
    model.learn_one(dict(zip("abc", rows[-1], strict=True)), labels[-1])
    x = dict(zip("abc", [0.3, -0.2, 0.5], strict=True))
    decision = model.predict_one(x) if regression else model.decision_function_one(x)
    signed = targets if regression else [1.0 if value > 0 else -1.0 for value in targets]
    exact = exact_decision(rows, signed, [0.3, -0.2, 0.5])
    # (what the warning is about: float64 is off, at most by what it says)
    assert 1e-8 < abs(decision - exact) < 1e-2
    # Checked every CONDITIONING_CHECK_EVERY updates (the first one too): said within them,
    # and the update it is said at, made an error, refused and said again when retried.
    ordinary = {"a": 0.5, "b": 0.1, "c": 0.2}, 0.8 if regression else True
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(stream_svm.lssvm.CONDITIONING_CHECK_EVERY):
            try:
                model.learn_one(*ordinary)
            except UserWarning as warned:
                said = str(warned)
                break
        else:
            raise AssertionError("no conditioning warning")
    assert re.search(r"normal equations .* are so ill-conditioned \(condition number about "
                     r".* once scaled\) that their float64 solution.* may be off by about", said)
    with pytest.warns(UserWarning, match="so ill-conditioned"):
        model.learn_one(*ordinary)  # (the update refused by the error: said again)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per process and model type
        for _ in range(2 * stream_svm.lssvm.CONDITIONING_CHECK_EVERY):
            model.learn_one(*ordinary)


def test_nearly_dependent_features_whose_pivots_stay_large_are_warned_of(monkeypatch):
    # Kahan's triangular matrix as 30 samples of 30 features: their normal equations, scaled
    # to a unit diagonal, have a condition number of 2e10 (float64's solution may be off by
    # 4e-6), but their Cholesky pivots all stay above 1 / 60: the pivots alone said nothing.
    monkeypatch.setattr(stream_svm.lssvm, "_CONDITIONING_WARNED", set())
    size, theta = 30, 1.2
    kahan = np.diag(np.sin(theta) ** np.arange(size)) @ (
        np.eye(size) + np.triu(-np.cos(theta) * np.ones((size, size)), 1))
    rho = 1e-12
    gram = kahan.T @ kahan + rho * np.eye(size)
    scale = 1 / np.sqrt(np.diag(gram))
    scaled = gram * np.outer(scale, scale)
    assert np.linalg.cond(scaled) > 1e10  # (independently of the model's estimate)
    assert (np.diag(np.linalg.cholesky(scaled)) ** 2).min() > 1e-2
    names = [f"f{j:02d}" for j in range(size)]
    model = IncrementalLSSVR(rho=rho, fit_intercept=False)
    with pytest.warns(UserWarning, match=r"so ill-conditioned \(condition number about "
                                         r"[1-9]e\+1[0-2] once scaled\)"):
        model.learn_many(pd.DataFrame(kahan, columns=names),
                         pd.Series(np.arange(size) % 3, dtype=float))
    # A system as large and well conditioned is not warned of.
    monkeypatch.setattr(stream_svm.lssvm, "_CONDITIONING_WARNED", set())
    rows = np.random.default_rng(3).normal(size=(3 * size, size))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        IncrementalLSSVR(rho=rho, fit_intercept=False).learn_many(
            pd.DataFrame(rows, columns=names), pd.Series(rows.sum(axis=1)))
