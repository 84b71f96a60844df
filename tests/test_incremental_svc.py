"""IncrementalSVC: River conventions, exact unlearning, LOO, reserve truncation, bad input."""

from __future__ import annotations

import datetime
import itertools
import math
import pickle
from decimal import Decimal

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from river import datasets, evaluate, metrics, multiclass, preprocessing
from sklearn.svm import SVC

import stream_svm
from stream_svm import AlphaISVC, ConvergenceError, IncrementalSVC, SlidingWindowSVC
from tests.oracle import assert_matches_batch, kkt_violation
from tests.river_checks import run_river_checks


def ring_stream(n: int, seed: int) -> list[tuple[dict, bool]]:
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, 2))
    y = np.hypot(X[:, 0], X[:, 1]) > 1.1
    y[rng.random(n) < 0.1] ^= True
    return [({"u": float(a), "v": float(b)}, bool(label)) for (a, b), label in zip(X, y,
                                                                                   strict=True)]


def _check_id(check) -> str:
    return f"{check.__name__}"


@pytest.mark.parametrize("estimator", [
    pytest.param(model, id=f"{type(model).__name__}({params})")
    for cls in (IncrementalSVC, SlidingWindowSVC)
    for params in cls._unit_test_params()
    for model in [cls(**params)]
])
def test_river_estimator_checks(estimator):
    run_river_checks(estimator, at_least=21)


def test_learn_then_forget_restores_decisions():
    stream = ring_stream(80, seed=1)
    model = IncrementalSVC(C=10.0, gamma=0.5)
    for i, (x, y) in enumerate(stream[:60]):
        model.learn_one(x, y, key=i)
    probes = [x for x, _ in stream[60:]]
    before = [model.decision_function_one(x) for x in probes]
    for i, (x, y) in enumerate(stream[60:]):
        model.learn_one(x, y, key=f"new{i}")
    changed = [model.decision_function_one(x) for x in probes]
    assert max(abs(a - b) for a, b in zip(before, changed, strict=True)) > 1e-3
    for i in range(20):
        model.forget_one(key=f"new{i}")
    after = [model.decision_function_one(x) for x in probes]
    np.testing.assert_allclose(after, before, atol=1e-9)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), C=st.sampled_from([0.5, 5.0, 100.0]),
       count=st.integers(1, 15))
def test_property_learn_then_forget_is_identity(seed, C, count):
    stream = ring_stream(40 + count, seed=seed)
    model = IncrementalSVC(C=C, gamma=0.7)
    for x, y in stream[:40]:
        model.learn_one(x, y)
    probes = [{"u": u, "v": v} for u, v in np.random.default_rng(seed).standard_normal((10, 2))]
    before = np.array([model.decision_function_one(x) for x in probes])
    for x, y in stream[40:]:
        model.learn_one(x, y)
    for x, y in reversed(stream[40:]):
        model.forget_one(x, y)  # by value
    after = np.array([model.decision_function_one(x) for x in probes])
    np.testing.assert_allclose(after, before, atol=1e-8 * max(1.0, C))
    assert model.n_stored == 40


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000), permutation_seed=st.integers(0, 10_000))
def test_property_learning_order_does_not_matter(seed, permutation_seed):
    stream = ring_stream(35, seed=seed)
    first, second = IncrementalSVC(C=5.0, gamma=0.5), IncrementalSVC(C=5.0, gamma=0.5)
    for x, y in stream:
        first.learn_one(x, y)
    for i in np.random.default_rng(permutation_seed).permutation(len(stream)):
        second.learn_one(*stream[i])
    probes = [{"u": u, "v": v} for u, v in np.random.default_rng(seed + 1).standard_normal((15, 2))]
    a = np.array([first.decision_function_one(x) for x in probes])
    b = np.array([second.decision_function_one(x) for x in probes])
    if first.n_margin and second.n_margin:
        np.testing.assert_allclose(a, b, atol=1e-8)
    else:  # b is not unique without margin vectors: compare the kernel parts
        np.testing.assert_allclose(a - first.intercept, b - second.intercept, atol=1e-8)
    assert math.isclose(first._engine.dual_objective(), second._engine.dual_objective(),
                        rel_tol=1e-9, abs_tol=1e-9)


def brute_force_loo(model: IncrementalSVC) -> float:
    engine = model._engine
    X, y = engine.X, engine.y
    K = engine.kernel(X, X)
    errors = 0
    for i in range(len(y)):
        keep = np.arange(len(y)) != i
        svc = SVC(kernel="precomputed", C=engine.C, tol=1e-10).fit(K[np.ix_(keep, keep)], y[keep])
        f = svc.decision_function(K[i : i + 1, keep])[0]
        errors += (1.0 if f > 0 else -1.0) != y[i]
    return errors / len(y)


@pytest.mark.parametrize("C,gamma", [(1.0, 0.5), (20.0, 2.0)])
def test_exact_loo_equals_brute_force(C, gamma):
    model = IncrementalSVC(C=C, gamma=gamma)
    for x, y in ring_stream(70, seed=3):
        model.learn_one(x, y)
    decisions_before = model.decision_function_many(pd.DataFrame([{"u": 0.1, "v": 0.2}]))
    loo = model.loo_error()
    assert loo == pytest.approx(brute_force_loo(model))
    assert 0 < loo < 0.5
    # The model is restored after every leave-out.
    np.testing.assert_array_equal(
        decisions_before, model.decision_function_many(pd.DataFrame([{"u": 0.1, "v": 0.2}]))
    )
    assert kkt_violation(model._engine) < 1e-9 * C


def test_reserve_truncation_shrinks_memory_and_reports_drift():
    stream = ring_stream(600, seed=4)
    exact = IncrementalSVC(C=1.0, gamma=0.5)
    truncated = IncrementalSVC(C=1.0, gamma=0.5, reserve_epsilon=0.5)
    stored = []
    for x, y in stream:
        exact.learn_one(x, y)
        truncated.learn_one(x, y)
        stored.append(truncated.n_reserve)
        assert kkt_violation(truncated._engine) < 1e-9
    assert exact.n_stored == 600
    assert truncated.reserve_discarded > 0
    assert truncated.n_stored < 0.75 * exact.n_stored
    # Truncation keeps only the reserve vectors in the band 0 <= g < eps: a fixed fraction of
    # the stream, far fewer than the exact model's (margin and error vectors are the solution).
    assert truncated.n_reserve < 0.4 * exact.n_reserve  # measured: 105 of 321 at eps = 0.5
    assert max(stored) < 0.4 * exact.n_reserve
    probes = pd.DataFrame(np.random.default_rng(5).standard_normal((200, 2)), columns=["u", "v"])
    drift = np.abs(exact.decision_function_many(probes) - truncated.decision_function_many(probes))
    # Truncation trades exactness for memory: decisions move, but little.
    print(f"reserve truncation eps=0.5: stored {truncated.n_stored}/600, "
          f"max |decision drift| {drift.max():.2e}, mean {drift.mean():.2e}")
    assert drift.max() < 0.5
    agreement = np.mean((exact.decision_function_many(probes) > 0)
                        == (truncated.decision_function_many(probes) > 0))
    assert agreement > 0.95


def test_a_relabel_discards_reserve_points_once_after_its_forget_and_learn():
    # The relabel's forget discarded k9, deep inside its side without k8; k8's learn would
    # have brought it back to the margin: a relabel to the same label moved f(k9) from 1 to
    # -22.5.
    X = pd.DataFrame([{"a": 0.018, "b": -0.031}, {"b": 0.099}, {"a": 0.267, "b": 1.694},
                      {"a": 0.452, "b": 0.238}, {"a": 0.018, "b": -0.031}])
    model = IncrementalSVC(C=20945.0, kernel="linear", reserve_epsilon=0.0)
    model.learn_many(X, pd.Series([True, True, False, True, False]),
                     keys=["k6", "k7", "k8", "k9", "k10"])
    k9 = X.iloc[3].to_dict()
    before = model.decision_function_one(k9)
    assert abs(before - 1.0) < 1e-9 and "k9" in model
    model.relabel_one("k8", False)  # the label it has
    assert "k9" in model
    assert abs(model.decision_function_one(k9) - before) < 1e-9
    assert not model._holding_discards
    held, counted = set(model.stored_keys()), model.reserve_discarded
    model.relabel_one("k8", True)  # another label: the discard after it runs as after a learn
    discarded = held - set(model.stored_keys())
    assert model.reserve_discarded - counted == len(discarded) > 0
    assert not model._holding_discards


@pytest.mark.parametrize("regression", [False, True])
def test_forgetting_a_key_reserve_truncation_discarded_says_so_and_forgets_nothing(regression):
    # forget_many refused a batch naming one discarded key with "no stored point has key 1"
    # alone: the user could not tell the model had dropped it by design.
    from stream_svm import IncrementalSVR

    model = (IncrementalSVR(C=1.0, gamma=0.5, epsilon=0.1, reserve_epsilon=0.0) if regression
             else IncrementalSVC(C=1.0, gamma=0.5, reserve_epsilon=0.0))
    for i, (x, y) in enumerate(ring_stream(200, seed=4)):
        model.learn_one(x, float(y) if regression else y, key=i)
    stored = set(model.stored_keys())
    gone = next(k for k in range(200) if k not in stored)
    kept = next(iter(stored))
    probe = {"u": 0.3, "v": -0.2}
    before = model.predict_one(probe)
    for forget in (lambda: model.forget_many(keys=[kept, gone]),
                   lambda: model.forget_one(key=gone)):
        with pytest.raises(KeyError, match=f"has key {gone} .reserve truncation may have "
                                           "discarded it; forget only the keys in stored_keys"):
            forget()
        assert set(model.stored_keys()) == stored and model.predict_one(probe) == before
    model.forget_many(keys=[k for k in (kept, gone) if k in stored])
    assert kept not in model.stored_keys()  # (and the points the update then truncated)
    plain = IncrementalSVC()  # (no truncation: nothing more to say)
    plain.learn_one(probe, True, key="a")
    with pytest.raises(KeyError, match=r"^.no stored point has key 'b'.$"):
        plain.forget_many(keys=["b"])


def test_pipeline_and_progressive_validation():
    model = preprocessing.StandardScaler() | IncrementalSVC(C=10.0, gamma=0.2)
    metric = evaluate.progressive_val_score(datasets.Phishing(), model, metrics.Accuracy())
    assert metric.get() > 0.85
    assert model["IncrementalSVC"].n_stored == 1250


def test_minmax_scaler_nan_first_prediction_is_handled():
    model = preprocessing.MinMaxScaler() | IncrementalSVC()
    for x, y in itertools.islice(datasets.Phishing(), 30):
        proba = model.predict_proba_one(x)
        assert set(proba) == {False, True} and math.isclose(sum(proba.values()), 1.0)
        model.learn_one(x, y)


def test_one_vs_rest_multiclass():
    from sklearn.datasets import load_iris

    data = load_iris()
    rng = np.random.default_rng(6)
    order = rng.permutation(len(data.target))
    model = preprocessing.StandardScaler() | multiclass.OneVsRestClassifier(
        IncrementalSVC(C=10.0, gamma=0.5)
    )
    correct = 0
    for count, i in enumerate(order):
        x = dict(zip(data.feature_names, data.data[i], strict=True))
        if count >= 30:
            correct += model.predict_one(x) == data.target[i]
        model.learn_one(x, int(data.target[i]))
    assert correct / (len(order) - 30) > 0.85


def test_feature_dicts_new_missing_nan_and_order():
    model = IncrementalSVC(C=5.0, gamma=0.5)
    model.learn_one({"a": 1.0, "b": 0.0}, True)
    model.learn_one({"b": 1.0}, False)  # a missing
    model.learn_one({"a": 1.0, "c": 2.0}, True)  # c new
    model.learn_one({"c": math.nan, "b": 1.5}, False)  # NaN reads 0
    assert model.n_stored == 4
    x = {"c": 0.5, "a": 0.7, "b": 0.1}
    assert model.decision_function_one(x) == model.decision_function_one(dict(reversed(x.items())))
    # An unseen feature moves RBF distances (stored points read 0 there).
    assert model.decision_function_one({"a": 1.0, "zzz": 3.0}) != model.decision_function_one(
        {"a": 1.0})
    assert_matches_batch(model._engine, model._engine.X + 0.1)


def state_of(model):
    arrays, meta = model.to_checkpoint()
    return arrays, meta


@pytest.mark.parametrize("bad_x,error,match", [
    ({"a": "text"}, TypeError, "'a'"),
    ({"a": math.inf}, ValueError, "'a' is infinite"),
    ({"a": 10**400}, ValueError, r"'a' is infinite or too large for a float \(1000"),
    ({"a": -(10**5000)}, ValueError, "'a' is infinite or too large .* bits"),
    ({"a": [1, 2]}, TypeError, "'a'"),
    ("not a dict", TypeError, "dict"),
])
def test_bad_features_raise_and_leave_model_unchanged(bad_x, error, match):
    model = IncrementalSVC(C=2.0)
    for x, y in ring_stream(20, seed=7):
        model.learn_one(x, y)
    arrays, meta = state_of(model)
    with pytest.raises(error, match=match):
        model.learn_one(bad_x, True)
    arrays2, meta2 = state_of(model)
    assert meta == meta2
    for name in arrays:
        np.testing.assert_array_equal(arrays[name], arrays2[name])


def test_bad_labels_keys_and_parameters():
    model = IncrementalSVC()
    model.learn_one({"a": 1.0}, 1, key="k")
    with pytest.raises(ValueError, match="label 2"):
        model.learn_one({"a": 2.0}, 2)
    with pytest.raises(ValueError, match="'yes'") as text_label:
        model.learn_one({"a": 2.0}, "yes")
    # Text labels: the way to name them, and to go beyond two classes.
    assert "classes=[negative, positive]" in str(text_label.value)
    assert "multiclass.OneVsRestClassifier" in str(text_label.value)
    with pytest.raises(ValueError, match=r"label 1000.*\(401 digits\) is not binary"):
        model.learn_one({"a": 2.0}, 10**400)
    with pytest.raises(KeyError, match="already stored"):
        model.learn_one({"a": 2.0}, 0, key="k")
    with pytest.raises(KeyError, match="no stored point has key 'nope'"):
        model.forget_one(key="nope")
    with pytest.raises(KeyError, match="no stored point equals"):
        model.forget_one({"a": 1.0}, False)  # right x, wrong label
    assert model.n_stored == 1
    with pytest.raises(ValueError, match="C must be > 0"):
        IncrementalSVC(C=0)
    with pytest.raises(ValueError, match="C must be"):
        IncrementalSVC(C=-1.0)
    with pytest.raises(ValueError, match="unknown kernel 'sigmoid'"):
        IncrementalSVC(kernel="sigmoid")
    with pytest.raises(ValueError, match="gamma"):
        IncrementalSVC(gamma=0.0)
    with pytest.raises(ValueError, match="reserve_epsilon"):
        IncrementalSVC(reserve_epsilon=-1.0)
    # A step beyond the window would leave step - window_size of every step arrivals unlearned.
    with pytest.raises(ValueError, match=r"step \(250\) must be at most window_size \(100\)"):
        SlidingWindowSVC(window_size=100, step=250)
    assert SlidingWindowSVC(window_size=100, step=100).step == 100


def test_breakpoint_bound_leaves_model_unchanged():
    model = IncrementalSVC(C=10.0, gamma=0.5, max_breakpoints=3)
    stream = ring_stream(60, seed=8)
    raised = 0
    for x, y in stream:
        arrays, meta = state_of(model)
        try:
            model.learn_one(x, y)
        except ConvergenceError:
            raised += 1
            arrays2, meta2 = state_of(model)
            assert meta == meta2
            for name in arrays:
                np.testing.assert_array_equal(arrays[name], arrays2[name])
    assert raised > 0


def test_counters_and_set_sizes():
    model = IncrementalSVC(C=10.0, gamma=0.5)
    total = 0
    for x, y in ring_stream(100, seed=9):
        model.learn_one(x, y)
        total += model.last_update.breakpoints
        assert model.last_update.seconds >= 0
        assert model.n_margin + model.n_error + model.n_reserve == model.n_stored
    assert model.breakpoints_total == total > 0
    assert model.n_margin > 0 and model.n_error > 0 and model.n_reserve > 0


def test_checkpoint_roundtrip_reproduces_and_continues():
    stream = ring_stream(120, seed=10)
    model = IncrementalSVC(C=10.0, gamma=0.5)
    for i, (x, y) in enumerate(stream[:80]):
        model.learn_one(x, y, key=f"id{i}" if i % 2 else i)
    model.learn_one(*stream[80])  # an automatic key
    arrays, meta = model.to_checkpoint()
    assert all(array.dtype != object for array in arrays.values())
    restored = IncrementalSVC.from_checkpoint(arrays, meta)
    probes = [x for x, _ in stream[81:]]
    for x in probes:
        assert restored.decision_function_one(x) == model.decision_function_one(x)
    assert restored.breakpoints_total == model.breakpoints_total
    for m in (model, restored):
        m.forget_one(key="id1")
        m.forget_one(key=4)
        m.forget_one(*stream[80])
        for x, y in stream[81:100]:
            m.learn_one(x, y)
    for x in probes:
        assert restored.decision_function_one(x) == pytest.approx(
            model.decision_function_one(x), abs=1e-9)


def test_learn_many_forget_many_update_many():
    stream = ring_stream(150, seed=11)
    X = pd.DataFrame([x for x, _ in stream])
    y = pd.Series([y for _, y in stream])
    X.index = [f"r{i}" for i in range(len(X))]
    y.index = X.index
    many = IncrementalSVC(C=10.0, gamma=0.5)
    many.learn_many(X.iloc[:100], y.iloc[:100])
    assert "r5" in many and many.n_stored == 100
    many.forget_many(["r1", "r2", "r3"])
    many.update_many(X.iloc[100:], y.iloc[100:], forget_keys=["r10", "r11"])
    one = IncrementalSVC(C=10.0, gamma=0.5)
    for key, (x, label) in zip(X.index, stream, strict=True):
        one.learn_one(x, label, key=key)
    for key in ["r1", "r2", "r3", "r10", "r11"]:
        one.forget_one(key=key)
    assert sorted(map(str, many.stored_keys())) == sorted(map(str, one.stored_keys()))
    np.testing.assert_allclose(many.decision_function_many(X), one.decision_function_many(X),
                               atol=1e-8)
    # by value
    many.forget_many(X=X.iloc[20:22], y=y.iloc[20:22])
    assert "r20" not in many and "r21" not in many
    assert_matches_batch(many._engine, many._engine.X[:20] + 0.05)


def test_sliding_window_keeps_latest_points_exactly():
    stream = ring_stream(260, seed=12)
    window = SlidingWindowSVC(window_size=100, step=7, C=10.0, gamma=0.5)
    single = SlidingWindowSVC(window_size=100, step=7, strategy="single", C=10.0, gamma=0.5)
    for i, (x, y) in enumerate(stream):
        window.learn_one(x, y, key=i)
        single.learn_one(x, y, key=i)
        if window.n_buffered == 0:
            assert window.n_window == min(100, i + 1)
            assert sorted(window.stored_keys()) == list(range(max(0, i + 1 - 100), i + 1))
            assert kkt_violation(window._engine) < 1e-8 * 10
    probes = pd.DataFrame(np.random.default_rng(13).standard_normal((30, 2)), columns=["u", "v"])
    np.testing.assert_allclose(window.decision_function_many(probes),
                               single.decision_function_many(probes), atol=1e-8)
    assert_matches_batch(window._engine, probes.to_numpy())
    assert window.last_update.removed == 7 and window.last_update.added == 7


def test_a_single_strategy_slide_refused_part_way_changes_nothing():
    # Each point of a "single" slide is its own update: a refusal at the third must undo the
    # first two, as a multiple update's does.
    def kernel(A, B):
        if A.shape[0] * B.shape[0] > 1 and (np.any(A[:, 0] == 7.0) or np.any(B[:, 0] == 7.0)):
            raise RuntimeError("kernel refuses u = 7")
        return np.exp(-0.5 * ((A[:, None, :] - B[None, :, :]) ** 2).sum(-1))

    stream = ring_stream(14, seed=15)
    model = SlidingWindowSVC(window_size=6, step=3, strategy="single", C=1.0, kernel=kernel)
    for i, (x, y) in enumerate(stream[:12]):
        model.learn_one(x, y, key=i)
    model.learn_one(*stream[12], key=12)
    model.learn_one(*stream[13], key=13)  # buffered: the next arrival slides
    probes = pd.DataFrame(np.random.default_rng(16).standard_normal((10, 2)), columns=["u", "v"])

    def view():
        return (model.stored_keys(), model.n_buffered, model.updates_total,
                model.breakpoints_total, model.decision_function_many(probes).tolist())

    before = view()
    with pytest.raises(RuntimeError, match="u = 7"):
        model.learn_one({"u": 7.0, "v": 0.0}, True, key=14)
    assert view() == before
    model.learn_one({"u": 0.5, "v": 0.0}, True, key=14)
    assert sorted(model.stored_keys()) == list(range(9, 15)) and model.n_buffered == 0
    assert_matches_batch(model._engine, probes.to_numpy())


def test_stored_point_and_relabel_one():
    stream = ring_stream(60, seed=14)
    model = IncrementalSVC(C=10.0, gamma=0.5)
    for i, (x, y) in enumerate(stream):
        model.learn_one(x, y, key=i)
    x, label = model.stored_point(7)
    assert x == {k: v for k, v in stream[7][0].items() if v != 0} and label == stream[7][1]
    reference = IncrementalSVC(C=10.0, gamma=0.5)
    for i, (x_i, y_i) in enumerate(stream):
        reference.learn_one(x_i, (not y_i) if i == 7 else y_i, key=i)
    model.relabel_one(7, not stream[7][1])
    assert model.stored_point(7)[1] == (not stream[7][1])
    probes = pd.DataFrame([x_i for x_i, _ in stream])
    np.testing.assert_allclose(model.decision_function_many(probes),
                               reference.decision_function_many(probes), atol=1e-8)
    with pytest.raises(KeyError, match="no stored point has key 99"):
        model.stored_point(99)
    with pytest.raises(ValueError, match="label 5"):
        model.relabel_one(7, 5)
    window = SlidingWindowSVC(window_size=10, step=4)
    window.learn_one({"a": 1.5}, True, key="buffered")
    assert window.stored_point("buffered") == ({"a": 1.5}, True)


def my_rbf(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    squared = (A**2).sum(1)[:, None] + (B**2).sum(1)[None, :] - 2 * A @ B.T
    return np.exp(-0.5 * np.maximum(squared, 0.0))


def test_user_callable_kernel_matches_builtin():
    stream = ring_stream(80, seed=15)
    builtin = IncrementalSVC(C=10.0, kernel="rbf", gamma=0.5)
    custom = IncrementalSVC(C=10.0, kernel=my_rbf)
    for x, y in stream[:60]:
        builtin.learn_one(x, y)
        custom.learn_one(x, y)
    probes = pd.DataFrame([x for x, _ in stream[60:]])
    np.testing.assert_allclose(custom.decision_function_many(probes),
                               builtin.decision_function_many(probes), atol=1e-8)
    assert_matches_batch(custom._engine, custom._engine.X + 0.1)
    with pytest.raises(ValueError, match="returned shape"):
        IncrementalSVC(kernel=lambda A, B: np.ones(3)).learn_one({"a": 1.0}, True)


def test_a_callable_kernel_written_for_two_points_is_told_what_it_is_given():
    # It failed deep in numpy ("shapes (1,2) and (1,2) not aligned", or an IndexError for one
    # reading dicts), without a word of the contract.
    model = IncrementalSVC(C=10.0, kernel=lambda a, b: float(np.dot(a, b)))
    with pytest.raises(ValueError, match=r"kernel '<lambda>' raised ValueError: shapes .* "
                                         r"\(given A of shape \(1, 2\) and B of shape \(1, 2\): "
                                         "a kernel function takes two 2-D arrays whose rows"):
        model.learn_one({"a": 1.0, "b": 2.0}, True)
    assert model.n_stored == 0


def _normalizing_in_place(A, B):
    A /= np.linalg.norm(A, axis=1, keepdims=True)
    B /= np.linalg.norm(B, axis=1, keepdims=True)
    return A @ B.T


def test_a_callable_kernel_cannot_rewrite_the_points_it_is_given():
    # It turned the learned point {a: 3, b: 4} into the stored {a: 0.6, b: 0.8}, silently.
    model = IncrementalSVC(C=10.0, kernel=_normalizing_in_place)
    with pytest.raises(ValueError, match="read-only"):
        model.learn_one({"a": 3.0, "b": 4.0}, True, key="p")
    assert model.n_stored == 0


def _two_features_only(A, B):
    if A.shape[1] > 2:
        raise KeyError("c")
    return my_rbf(A, B)


def test_a_callable_kernel_that_fails_later_is_named_and_changes_nothing():
    model = IncrementalSVC(C=10.0, kernel=_two_features_only)
    model.learn_one({"a": 1.0, "b": 2.0}, True)
    model.learn_one({"a": -1.0, "b": 0.0}, False)
    before = model.decision_function_one({"a": 0.5, "b": 0.5}), model.n_stored
    with pytest.raises(ValueError, match=r"kernel '_two_features_only' raised KeyError: 'c' "
                                         r"\(given A of shape \(\d+, 3\)"):
        model.learn_one({"a": 1.0, "b": 2.0, "c": 1.0}, False)
    assert (model.decision_function_one({"a": 0.5, "b": 0.5}), model.n_stored) == before


def _shifted_linear(A, B):
    """Not positive semi-definite: K(x, x) = |x|^2 - 2 is negative near the origin."""
    return A @ B.T - 2.0


@pytest.mark.parametrize("make", [
    lambda: IncrementalSVC(C=10.0, kernel=_shifted_linear),
    lambda: SlidingWindowSVC(window_size=10, step=1, C=10.0, kernel=_shifted_linear),
])
def test_a_callable_kernel_negative_at_a_new_point_is_refused_and_changes_nothing(make):
    """A user's kernel with K(x, x) < 0 is no kernel: it was learned without a word (the
    factor's pivots then go negative and the model learns noise)."""
    model = make()
    model.learn_one({"a": 3.0, "b": 0.0}, True)
    model.learn_one({"a": 0.0, "b": -3.0}, False)
    before = (model.stored_keys(), model.decision_function_one({"a": 1.0, "b": 1.0}))
    with pytest.raises(ValueError, match=r"K\(x, x\) = -1\.75 < 0 for the new point: a kernel "
                                         "must be positive semi-definite"):
        model.learn_one({"a": 0.5, "b": 0.0}, True)
    frame = pd.DataFrame({"a": [4.0, 0.0, 1.0], "b": [1.0, 0.1, 0.0]})
    with pytest.raises(ValueError, match=r"-1\.99 < 0 for 2 of the 3 new points \(the first is "
                                         r"number 2 in the order given\)"):
        model.learn_many(frame, pd.Series([True, False, True]))
    assert (model.stored_keys(), model.decision_function_one({"a": 1.0, "b": 1.0})) == before
    model.learn_one({"a": 2.0, "b": 2.0}, True)  # K(x, x) = 6: learned
    assert len(model.stored_keys()) == 3


@pytest.mark.parametrize("make", [
    lambda: SlidingWindowSVC(window_size=4, step=2, C=10.0, kernel=_shifted_linear),
    lambda: AlphaISVC(batch_size=2, C=10.0, kernel=_shifted_linear),
])
def test_a_point_negative_under_the_kernel_is_refused_before_it_is_buffered(make):
    """A window sliding by 2 buffered the point and then refused every later slide for it
    (the stream stopped learning); alpha-ISVM kept it without a word."""
    model = make()
    model.learn_many(pd.DataFrame({"a": [3.0, -3.0], "b": [1.0, -1.0]}),
                     pd.Series([True, False]))
    with pytest.raises(ValueError, match=r"K\(x, x\) = -1\.74 < 0 for the new point"):
        model.learn_one({"a": 0.5, "b": 0.1}, True)
    with pytest.raises(ValueError, match=r"for 1 of the 2 new points \(the first is number 1"):
        model.learn_many(pd.DataFrame({"a": [0.5, 4.0], "b": [0.1, 1.0]}),
                         pd.Series([True, True]))
    for x, label in [({"a": 4.0, "b": 1.0}, True), ({"a": -4.0, "b": 0.0}, False)] * 2:
        model.learn_one(x, label)  # the stream goes on
    assert model.predict_one({"a": 5.0, "b": 0.0}) is True


def test_a_positive_semi_definite_kernel_with_round_off_below_0_is_not_refused():
    """<a - m, b - m> by expansion gives -8.9e-16 at a point 1e-9 from m (exactly 1.8e-18): a
    round-off of the squared norms it cancels, not a kernel below 0."""
    m = np.array([1.072, 1.906])

    def centered(A, B):
        return A @ B.T - (A @ m)[:, None] - (B @ m)[None, :] + m @ m

    x = {"a": 1.072000000330437, "b": 1.9059999986968428}
    assert centered(np.array([[x["a"], x["b"]]]), np.array([[x["a"], x["b"]]]))[0, 0] < 0
    for model in (IncrementalSVC(C=1.0, kernel=centered),
                  SlidingWindowSVC(window_size=4, step=2, C=1.0, kernel=centered)):
        model.learn_one(x, True)  # the first point: no other value gives a scale
        model.learn_one({"a": 3.0, "b": 1.5}, False)
    assert model.n_stored == 2


@pytest.mark.parametrize("make", [
    lambda: IncrementalSVC(C=10.0, gamma=0.5),
    lambda: IncrementalSVC(C=10.0, gamma=0.5, reserve_epsilon=0.5),
    lambda: SlidingWindowSVC(window_size=40, step=3, C=10.0, gamma=0.5),
])
def test_a_relabel_whose_learn_is_refused_changes_nothing(make, monkeypatch):
    """relabel_one forgets, then learns: if the learn fails, the forgotten point comes back and
    the whole model (engine, keys, buffer, counters) is exactly as before."""
    from stream_svm.engine import ConvergenceError, PathEngine

    stream = ring_stream(60, seed=21)
    model = make()
    for i, (x, y) in enumerate(stream):
        model.learn_one(x, y, key=i)
    key = model.stored_keys()[5]
    before_arrays, before_meta = model.to_checkpoint()
    probes = pd.DataFrame([x for x, _ in stream])
    before = model.decision_function_many(probes)
    update = PathEngine.update

    def refuse_learning(engine, X_add=None, y_add=None, keys=None, remove=()):
        if keys:
            raise ConvergenceError("refused for the test; the model is unchanged")
        return update(engine, X_add, y_add, keys, remove)

    monkeypatch.setattr(PathEngine, "update", refuse_learning)
    label = model.stored_point(key)[1]
    if isinstance(model, SlidingWindowSVC):
        # The relabelled point returns as the newest arrival; fill the buffer so it slides.
        model.learn_one({"a": 0.1, "b": 0.2}, True, key="a")
        model.learn_one({"a": 0.3, "b": 0.2}, False, key="b")
        before_arrays, before_meta = model.to_checkpoint()
    with pytest.raises(ConvergenceError):
        model.relabel_one(key, not label)
    monkeypatch.setattr(PathEngine, "update", update)
    after_arrays, after_meta = model.to_checkpoint()
    assert after_meta == before_meta
    for name, array in before_arrays.items():
        np.testing.assert_array_equal(after_arrays[name], array, err_msg=name)
    assert model.stored_point(key)[1] == label
    np.testing.assert_array_equal(model.decision_function_many(probes), before)


@pytest.mark.parametrize("kernel", ["rbf", "linear", "poly"])
def test_support_vectors_and_dual_coef_reproduce_the_decision_function(kernel):
    stream = ring_stream(80, seed=31)
    model = IncrementalSVC(C=5.0, kernel=kernel, gamma=0.5)
    for i, (x, y) in enumerate(stream):
        model.learn_one(x, y, key=f"k{i}")
    model.forget_one(key="k3")
    support = model.support_vectors()
    coef = model.dual_coef()
    assert list(support.index) == list(coef.index) and len(coef) == model.n_margin + model.n_error
    assert "k3" not in coef.index and all(abs(c) <= 5.0 for c in coef)
    assert sum(abs(coef) == 5.0) == model.n_error
    for key in coef.index:  # each row is the stored point, each sign its label
        x, label = model.stored_point(key)
        assert {k: v for k, v in support.loc[key].items() if v != 0} == x
        assert (coef[key] > 0) == label
    probes = pd.DataFrame([x for x, _ in ring_stream(20, seed=32)])[support.columns]
    gram = model._engine.kernel(probes.to_numpy(), support.to_numpy())
    np.testing.assert_allclose(gram @ coef.to_numpy() + model.intercept,
                               model.decision_function_many(probes), rtol=1e-12, atol=1e-12)
    assert model.n_error > 0 and model.n_margin > 0  # both kinds of support vector are checked


def test_a_window_refuses_a_batch_with_a_key_it_holds_in_the_window_or_its_buffer():
    """learn_many names the first key of the batch already held (slid into the window or
    waiting in the buffer) and changes nothing; the oldest points leave first."""
    model = SlidingWindowSVC(window_size=4, step=3, C=1.0, gamma=0.5)
    frame = pd.DataFrame({"a": [0.0, 1.0, 2.0]}, index=["p", "q", "r"])
    model.learn_many(frame, pd.Series([True, False, True], index=frame.index))
    model.learn_one({"a": 3.0}, False, key="s")  # buffered: the window slides every 3
    state = model.to_checkpoint()
    for keys, named in ((["t", "s", "q"], "'s'"), (["t", "q", "s"], "'q'")):
        batch = pd.DataFrame({"a": [4.0, 5.0, 6.0]}, index=keys)
        with pytest.raises(KeyError, match=named):
            model.learn_many(batch, pd.Series([True, False, True], index=keys))
        after = model.to_checkpoint()
        assert after[1] == state[1]
        for name in state[0]:
            np.testing.assert_array_equal(after[0][name], state[0][name])
    batch = pd.DataFrame({"a": [4.0, 5.0]}, index=["t", "u"])
    model.learn_many(batch, pd.Series([True, False], index=batch.index))
    # p, q, r, s, t, u learned in that order into a window of 4: p and q left first.
    assert sorted(model.stored_keys()) == ["r", "s", "t", "u"]


@pytest.mark.parametrize("name, make", [
    ("C", lambda: IncrementalSVC(C=10**400)),
    ("ridge", lambda: IncrementalSVC(ridge=10**400)),
    ("reserve_epsilon", lambda: IncrementalSVC(reserve_epsilon=10**400)),
    ("epsilon", lambda: stream_svm.IncrementalSVR(epsilon=10**400)),
    ("discard_ratio", lambda: stream_svm.AlphaISVC(discard_ratio=10**400)),
])
def test_a_parameter_too_large_for_a_float_is_refused_by_name(name, make):
    # It raised OverflowError: int too large to convert to float, naming no parameter.
    with pytest.raises(ValueError, match=name):
        make()


def _trained(cls, **params):
    model = cls(**params)
    regressor = cls in (stream_svm.IncrementalSVR, stream_svm.SlidingWindowSVR,
                        stream_svm.IncrementalLSSVR)
    for i, key in enumerate(["k", "j"]):
        model.learn_one({"a": float(i)}, float(i) if regressor else bool(i), key=key)
    return model


# What each call raised before: an error from inside numpy or float() that named nothing, or
# (update_many) nothing at all.
NAMED_REFUSALS = {
    "a timedelta64 feature": (
        lambda m: m.learn_one({"a": np.timedelta64(5, "s")}, True), TypeError,
        r"feature 'a' has the non-numeric value .*timedelta64"),
    "a timedelta64 feature to predict": (
        lambda m: m.predict_one({"a": np.timedelta64(5, "s")}), TypeError,
        r"feature 'a' has the non-numeric value"),
    "a timestamp feature": (  # (advised one-hot encoding: a feature per distinct time)
        lambda m: m.learn_one({"a": pd.Timestamp("2026-01-01 10:00")}, True), TypeError,
        r"feature 'a' has the non-numeric value Timestamp\(.*\(Timestamp\): a point in time "
        r"is no feature as it stands; derive numbers from it \(the hour of the day"),
    "a date feature in a frame": (
        lambda m: m.learn_many(pd.DataFrame({"a": [datetime.date(2026, 1, 1)] * 2}),
                               pd.Series([True, False])), TypeError,
        r"feature 'a' .*\(date\): a point in time is no feature as it stands"),
    "a signaling NaN label": (
        lambda m: m.learn_one({"a": 1.0}, Decimal("sNaN")), ValueError,
        r"label Decimal\('sNaN'\) is not binary"),
    "learn_many without a frame": (
        lambda m: m.learn_many(None, pd.Series([True, False])), TypeError,
        "X must be a pandas DataFrame, got NoneType"),
    "learn_many with a dict of columns": (
        lambda m: m.learn_many({"a": [1.0] * 6}, pd.Series([True, False] * 3)), TypeError,
        "X must be a pandas DataFrame, got dict"),
    "an unhashable key to forget": (
        lambda m: m.forget_many([["k"]]), TypeError, r"key \['k'\] in keys is not hashable"),
    "labels for no rows": (
        lambda m: m.update_many(None, pd.Series([True, False]), ["k"]), ValueError,
        "y_add has 2 labels for 0 rows of X_add"),
}


@pytest.mark.parametrize("case", list(NAMED_REFUSALS))
def test_bad_input_is_refused_naming_it_and_changes_nothing(case):
    call, error, message = NAMED_REFUSALS[case]
    model = _trained(IncrementalSVC, C=1.0)
    before = pickle.dumps(model)
    with pytest.raises(error, match=message):
        call(model)
    assert pickle.dumps(model) == before


@pytest.mark.parametrize("cls", [SlidingWindowSVC, stream_svm.SlidingWindowSVR,
                                 stream_svm.IncrementalLSSVR, stream_svm.IncrementalSVR])
def test_an_unhashable_key_to_forget_is_named_by_every_keyed_model(cls):
    model = _trained(cls, **({"window_size": 5} if "Window" in cls.__name__ else {}))
    before = pickle.dumps(model)
    forget = (lambda: model.forget_many(keys=[["k"]])) if "LSSV" in cls.__name__ else (
        lambda: model.forget_many([["k"]]))
    with pytest.raises(TypeError, match=r"key \['k'\] in keys is not hashable"):
        forget()
    assert pickle.dumps(model) == before


@pytest.mark.parametrize("name, make", [
    ("gamma", lambda: IncrementalSVC(kernel="poly", gamma=10**400)),
    ("coef0", lambda: IncrementalSVC(kernel="poly", coef0=10**400)),
    ("far_points", lambda: IncrementalSVC(far_points=np.array(["warn", "refuse"]))),
    ("strategy", lambda: SlidingWindowSVC(strategy=["single"])),
])
def test_a_parameter_of_the_wrong_kind_is_named(name, make):
    # (An OverflowError or TypeError from numpy, or "the truth value of an array is
    # ambiguous".)
    with pytest.raises(ValueError, match=name):
        make()
