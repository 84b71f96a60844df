"""Bounded features: the models store points as dense rows over feature names, so the names
are capped (``max_features``, ``max_new_features``), names no stored point uses are dropped,
unknown names in a query cost one column, and a refused learn changes nothing."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from stream_svm import (
    AlphaISVC,
    IncrementalSVC,
    IncrementalSVR,
    SlidingWindowSVC,
    SlidingWindowSVR,
)
from stream_svm.engine import ConvergenceError, PathEngine


def _snapshot(model) -> tuple[dict, dict]:
    arrays, meta = model.to_checkpoint()
    return {name: array.copy() for name, array in arrays.items()}, meta


def _assert_unchanged(model, before) -> None:
    arrays, meta = _snapshot(model)
    assert meta == before[1]
    assert arrays.keys() == before[0].keys()
    for name, array in before[0].items():
        np.testing.assert_array_equal(arrays[name], array, err_msg=name)


def _point(rng, names: list[str]) -> dict[str, float]:
    return {name: float(rng.normal()) for name in names}


def test_too_many_new_features_in_one_call_is_refused_unchanged():
    rng = np.random.default_rng(0)
    model = IncrementalSVC(max_new_features=100)
    model.learn_one({"a": 1.0}, True, key=0)
    model.learn_one({"a": -1.0}, False, key=1)
    before = _snapshot(model)
    wide = _point(rng, [f"f{i}" for i in range(1000)])
    with pytest.raises(ValueError, match="1000 features the model does not know; "
                                         "max_new_features=100"):
        model.learn_one(wide, True, key=2)
    _assert_unchanged(model, before)
    with pytest.raises(ValueError, match="max_new_features=100"):
        model.learn_many(pd.DataFrame([wide]), pd.Series([True]))
    _assert_unchanged(model, before)
    # Predictions accept them, and do not grow the model.
    assert isinstance(model.predict_one(wide), bool)
    _assert_unchanged(model, before)


@pytest.mark.parametrize("cls", [IncrementalSVC, SlidingWindowSVC])
def test_the_feature_limits_take_exactly_as_many_names_as_they_say(cls):
    # Off by one, max_new_features=2 would let three new names in, and max_features=3 a
    # fourth name beside three in use.
    params = {"window_size": 10, "step": 1} if cls is SlidingWindowSVC else {}
    model = cls(max_new_features=2, **params)
    model.learn_one({"a": 1.0, "b": 1.0}, True, key=0)  # exactly the limit: taken
    before = _snapshot(model)
    with pytest.raises(ValueError, match="3 features the model does not know; "
                                         "max_new_features=2"):
        model.learn_one({"c": 1.0, "d": 1.0, "e": 1.0}, False, key=1)
    _assert_unchanged(model, before)
    model = cls(max_features=3, **params)
    for key, name in enumerate("abc"):  # the third name fills the limit exactly
        model.learn_one({name: 1.0}, bool(key % 2), key=key)
    before = _snapshot(model)
    with pytest.raises(ValueError, match=r"4 features \(3 used by its stored points and 1 "
                                         r"new\); max_features=3"):
        model.learn_one({"d": 1.0}, True, key=3)
    _assert_unchanged(model, before)
    assert model.n_features == 3


@pytest.mark.parametrize("make", [
    lambda limit: IncrementalSVC(C=2.0, gamma=0.5, max_features=limit),
    lambda limit: SlidingWindowSVC(window_size=1000, step=1, C=2.0, gamma=0.5,
                                   max_features=limit),
])
def test_max_features_counts_only_names_in_use(make):
    """90 points with a feature of their own, 80 of them forgotten: the next point's 20 new
    names fit in max_features=100 only because the forgotten points' names are dropped."""
    rng = np.random.default_rng(1)
    model = make(100)
    for i in range(90):
        model.learn_one({"a": float(rng.normal()), f"own{i}": 1.0}, bool(i % 2), key=i)
    assert model.n_features == 91
    before = _snapshot(model)
    with pytest.raises(ValueError, match=r"111 features .* max_features=100"):
        model.learn_one(_point(rng, [f"n{i}" for i in range(20)]), True, key="new")
    _assert_unchanged(model, before)
    for i in range(80):
        model.forget_one(key=i)
    probes = pd.DataFrame([{"a": float(v), "own85": 1.0} for v in rng.normal(size=10)])
    decisions = model.decision_function_many(probes)
    model.learn_one(_point(rng, [f"n{i}" for i in range(20)]), True, key="new")
    assert model.n_features == 1 + 10 + 20  # "a", the ten kept points' own, the new ones
    reference = make(None)
    for i in range(80, 90):
        reference.learn_one(model.stored_point(i)[0], model.stored_point(i)[1], key=i)
    reference.learn_one(*model.stored_point("new"), key="new")
    np.testing.assert_allclose(model.decision_function_many(probes),
                               reference.decision_function_many(probes), atol=1e-10)
    assert not np.allclose(decisions, model.decision_function_many(probes))


def test_a_window_of_ever_new_names_stays_bounded_and_exact():
    """4,000 arrivals with three names of their own each through a window of 50: the window
    solution equals a fresh model on its 50 points, with a bounded number of columns."""
    rng = np.random.default_rng(2)
    window = SlidingWindowSVC(window_size=50, step=5, C=5.0, gamma=0.3)
    widest = 0
    stream = []
    for i in range(4000):
        x = {"a": float(rng.normal()), **_point(rng, [f"p{i}_{j}" for j in range(3)])}
        stream.append((x, x["a"] > 0))
        window.learn_one(x, x["a"] > 0, key=i)
        widest = max(widest, window.n_features, window._engine.dim)
    used = 1 + 3 * 55  # "a" and the names of the window and the buffer
    assert widest <= 2 * used + 64
    reference = IncrementalSVC(C=5.0, gamma=0.3, max_features=None)
    for key in window._engine.keys:
        reference.learn_one(*stream[key], key=key)
    probes = pd.DataFrame([x for x, _ in stream[-60:]])
    np.testing.assert_allclose(window.decision_function_many(probes),
                               reference.decision_function_many(probes), atol=1e-10)


def test_reserve_truncation_and_alpha_isvc_discards_drop_their_names():
    rng = np.random.default_rng(3)
    truncated = IncrementalSVC(C=1.0, gamma=0.5, reserve_epsilon=0.2)
    alpha = AlphaISVC(batch_size=20, discard_ratio=0.9, C=1.0, gamma=0.5)
    for i in range(1500):
        a = float(rng.normal())
        x = {"a": a, f"own{i}": 0.1}
        truncated.learn_one(x, a > 0, key=i)
        alpha.learn_one(x, a > 0)
        for model in (truncated, alpha):
            assert model.n_features <= 2 * (1 + model._used_columns().sum() + 20) + 64
    assert truncated.n_stored < 700 and truncated.n_features < 1500 / 2


@pytest.mark.parametrize("kernel", ["linear", "rbf", "poly"])
def test_unknown_query_features_fold_into_one_column_with_the_same_decision(kernel):
    rng = np.random.default_rng(4)
    model = IncrementalSVC(C=1.0, kernel=kernel, gamma=0.5, coef0=1.0)
    for i in range(40):
        model.learn_one(_point(rng, ["a", "b"]), bool(i % 2), key=i)
    query = {"a": 0.3, "b": -0.2, **{f"u{i}": float(v)
                                     for i, v in enumerate(0.01 * rng.normal(size=50_000))}}
    padded = np.zeros((1, 2 + 50_000))
    padded[0, :2] = [0.3, -0.2]
    padded[0, 2:] = [query[f"u{i}"] for i in range(50_000)]
    full = model._engine.decision_function(padded)[0]  # support rows padded with zeros
    engine = model._engine
    widths = []
    original = type(engine).decision_function

    def recording(self, X):
        widths.append(np.atleast_2d(X).shape[1])  # the width the kernel is evaluated at
        return original(self, X)

    type(engine).decision_function = recording
    try:
        folded = model.decision_function_one(query)
    finally:
        type(engine).decision_function = original
    assert folded == pytest.approx(full, rel=1e-12, abs=1e-12)
    assert widths == [3]  # the two known features and one for the 50,000 unknown ones
    assert model.n_features == 2 and model._engine.dim == 2


def test_checkpoints_round_trip_after_names_were_dropped():
    rng = np.random.default_rng(5)
    window = SlidingWindowSVC(window_size=20, step=3, C=2.0, gamma=0.5)
    for i in range(400):
        window.learn_one({"a": float(rng.normal()), f"own{i}": 1.0}, bool(i % 3), key=i)
    assert window.n_features < 400  # names were dropped on the way
    restored = SlidingWindowSVC.from_checkpoint(*window.to_checkpoint())
    probes = pd.DataFrame([{"a": float(v), "own399": 1.0, "own398": 0.5}
                           for v in rng.normal(size=10)])
    np.testing.assert_array_equal(restored.decision_function_many(probes),
                                  window.decision_function_many(probes))
    assert restored.n_buffered == window.n_buffered


def _refuse_every_update(monkeypatch):
    def refuse(engine, *args, **kwargs):
        raise ConvergenceError("refused for the test; the model is unchanged")

    monkeypatch.setattr(PathEngine, "update", refuse)


def test_a_refused_slide_leaves_buffer_and_names_as_they_were(monkeypatch):
    window = SlidingWindowSVC(window_size=10, step=3)
    window.learn_one({"a": 1.0}, True, key="p")
    window.learn_one({"a": -1.0}, False, key="n")
    before = _snapshot(window)
    _refuse_every_update(monkeypatch)
    with pytest.raises(ConvergenceError):
        window.learn_one({"a": 0.5, "brand_new": 2.0}, True, key="third")
    with pytest.raises(ConvergenceError):
        window.learn_many(pd.DataFrame([{"c": 1.0}, {"c": 2.0}]), pd.Series([True, False]))
    _assert_unchanged(window, before)
    assert "third" not in window and window.n_buffered == 2 and window.n_features == 1


def test_a_refused_slide_puts_back_the_buffer_a_name_drop_rewrote(monkeypatch):
    # To make room under max_features the name "old" (slid out) is dropped and the buffered
    # row rewritten over the names left; when the slide is then refused, the names and the
    # row must both come back (the row alone left, the point would read back as {"a": 1.0}).
    window = SlidingWindowSVC(window_size=2, step=2, max_features=3)
    window.learn_one({"old": 1.0}, True, key="o1")
    window.learn_one({"old": -1.0}, False, key="o2")
    window.learn_one({"a": 1.0}, True, key="a1")
    window.learn_one({"a": -1.0}, False, key="a2")  # slides "o1" and "o2" out
    window.learn_one({"b": 1.0}, True, key="b1")  # waits in the buffer
    before = _snapshot(window)
    _refuse_every_update(monkeypatch)
    with pytest.raises(ConvergenceError):
        window.learn_one({"c": 1.0}, False, key="c1")  # fits once "old" is dropped
    _assert_unchanged(window, before)
    assert window.stored_point("b1") == ({"b": 1.0}, True)


def test_a_refused_learn_does_not_widen_the_model(monkeypatch):
    model = IncrementalSVC()
    model.learn_one({"a": 1.0}, True, key=0)
    before = _snapshot(model)
    _refuse_every_update(monkeypatch)
    with pytest.raises(ConvergenceError):
        model.learn_one({"a": 1.0, "b": 2.0, "c": 3.0}, False, key=1)
    with pytest.raises(ConvergenceError):
        model.learn_many(pd.DataFrame([{"d": 1.0}]), pd.Series([True]), keys=["x"])
    _assert_unchanged(model, before)
    assert model._engine.dim == 1 and model.n_features == 1


def test_a_point_the_kernel_overflows_is_refused_before_the_window_buffers_it():
    window = SlidingWindowSVC(window_size=10, step=4, kernel="poly", coef0=1.0)
    window.learn_one({"a": 1.0}, True, key="p")
    before = _snapshot(window)
    with pytest.raises(ValueError, match="not finite"):
        window.learn_one({"a": 1e300}, False, key="poison")
    _assert_unchanged(window, before)
    for i in range(3):  # the next slide is not blocked by it
        window.learn_one({"a": float(i) - 1.0}, bool(i % 2), key=i)
    assert window.n_window == 4 and window.n_buffered == 0


def test_a_callable_kernel_keeps_every_name_and_pads_queries():
    """A user's kernel may depend on all-zero columns: nothing is dropped or folded, and
    max_features counts every name."""
    model = IncrementalSVC(kernel=lambda A, B: A @ B.T + 1.0, max_features=3)
    model.learn_one({"a": 1.0, "b": 1.0}, True, key=0)
    model.learn_one({"a": -1.0, "c": 1.0}, False, key=1)
    model.forget_one(key=1)
    # (It said "3 features (2 used by its stored points and 1 new)": against a cap of 3.)
    with pytest.raises(ValueError, match=r"would give the model 4 features \(3 it holds, 2 of "
                                         r"them used by its stored points, and 1 new\); "
                                         r"max_features=3. With a callable kernel the model "
                                         r"keeps every name it has learned"):
        model.learn_one({"d": 1.0}, False, key=2)
    assert model.n_features == 3
    assert model.decision_function_one({"a": 1.0, "z": 5.0}) == pytest.approx(
        model._engine.decision_function(np.array([[1.0, 0.0, 0.0, 5.0]]))[0])


def test_limits_are_validated_and_cloned():
    for bad in (0, -1, 2.5, True, "10"):
        with pytest.raises(ValueError, match="max_features"):
            IncrementalSVC(max_features=bad)
        with pytest.raises(ValueError, match="max_new_features"):
            SlidingWindowSVC(max_new_features=bad)
    clone = AlphaISVC(max_features=7, max_new_features=3).clone()
    assert (clone.max_features, clone.max_new_features) == (7, 3)


@pytest.mark.parametrize("window", [SlidingWindowSVC, SlidingWindowSVR])
def test_support_vectors_of_a_window_whose_buffer_brought_a_new_name(window):
    # The buffered point's name is known to the model before any stored point has it: its
    # column is 0 for the stored points (as an absent feature). This raised ValueError.
    label = (lambda i: float(i)) if window.__name__.endswith("R") else (lambda i: i % 2 == 0)
    model = window(window_size=4, step=2)
    for i in range(4):
        model.learn_one({"a": float(i)}, label(i), key=i)
    model.learn_one({"a": 1.0, "b": 2.0}, label(1), key="buffered")
    support = model.support_vectors()
    assert list(support.columns) == ["a", "b"]
    assert (support["b"] == 0.0).all() and "buffered" not in support.index
    assert list(support.index) == list(model.dual_coef().index)
    assert support["a"].to_dict() == {k: float(k) for k in support.index}


@pytest.mark.parametrize("window", [SlidingWindowSVC, SlidingWindowSVR])
@pytest.mark.parametrize("step", [1, 2])
def test_a_window_whose_names_drift_counts_only_the_names_its_slide_keeps(window, step):
    # Every point brings two new names, and a full window of three points uses six: the cap.
    # The names of the points a slide removes were counted, so the first point past a full
    # window was refused, and every later one too: the window never slid again.
    label = (lambda i: float(i)) if window is SlidingWindowSVR else (lambda i: i % 2 == 0)
    model = window(window_size=3, step=step, max_features=6)
    for i in range(12):
        model.learn_one({f"f{2 * i}": 1.0, f"f{2 * i + 1}": 0.5}, label(i), key=i)
        assert model.n_features <= 6 + 2 * (step - 1)
    assert sorted(model.stored_keys()) == [9, 10, 11]
    assert model.n_features == 6
    # A batch slides at once: it may bring the names of the points it pushes out.
    batch = pd.DataFrame([{"g0": 1.0, "g1": 1.0}, {"g2": 1.0, "g3": 1.0}], index=["p", "q"])
    model.learn_many(batch, pd.Series([label(0), label(1)], index=["p", "q"]))
    assert model.n_features == 6 and "p" in model and "q" in model
    # What no slide can make room for is still refused, the model unchanged.
    with pytest.raises(ValueError, match="max_features=6"):
        model.learn_one({f"h{j}": 1.0 for j in range(7)}, label(0), key="wide")
    assert "wide" not in model and model.n_features == 6


@pytest.mark.parametrize("window", [SlidingWindowSVC, SlidingWindowSVR])
def test_the_first_point_of_a_buffer_counts_none_of_the_names_its_slide_removes(window):
    # With step 2 the first point buffered is learned in the slide that removes both stored
    # points: counting the names of the second would refuse a point bringing as many names
    # as max_features, though the slide leaves it room.
    label = (lambda i: float(i)) if window is SlidingWindowSVR else (lambda i: i % 2 == 0)
    model = window(window_size=2, step=2, max_features=2)
    model.learn_one({"a": 1.0}, label(0), key="a")
    model.learn_one({"b": 1.0}, label(1), key="b")
    model.learn_one({"c": 1.0, "d": 1.0}, label(2), key="cd")
    model.learn_one({"c": 2.0}, label(3), key="c")
    assert sorted(model.stored_keys()) == ["c", "cd"] and model.n_buffered == 0
    assert model.n_features == 2


def _checkpoint_view(model):
    arrays, meta = model.to_checkpoint()
    return {name: np.asarray(value).tolist() for name, value in arrays.items()}, meta


@pytest.mark.parametrize("cls", [IncrementalSVC, IncrementalSVR, SlidingWindowSVC,
                                 SlidingWindowSVR])
def test_a_refused_learn_keeps_the_feature_names_it_dropped_to_make_room(cls):
    # Unused names were dropped before the learn was refused: the checkpoint's features and
    # n_features changed although the call raised (the decisions did not).
    label = (lambda i: float(i)) if cls.__name__.endswith("R") else (lambda i: i % 2 == 0)
    params = {"kernel": "poly", "max_features": 3}
    if cls.__name__.startswith("Sliding"):
        params["window_size"] = 2
    model = cls(**params)
    if cls.__name__.startswith("Sliding"):
        model.learn_one({"old": 1.0}, label(0))  # slides out below
        for i in range(1, 4):
            model.learn_one({"a": float(i)}, label(i))
    else:
        model.learn_one({"old": 1.0}, label(0), key="o")
        model.learn_one({"a": 1.0}, label(1), key=0)
        # "old" unused now, and kept (as the names of points reserve_epsilon discards are,
        # until the next amortized drop; a forget drops them at once)
        model._forgotten = lambda: None
        model.forget_one(key="o")
        del model._forgotten
    before = _checkpoint_view(model)
    assert "old" in before[1]["features"]
    # Two new names need room; K(x, x) = (1e400 + 1)^3 is not finite: refused.
    with pytest.raises(ValueError, match="not finite"):
        model.learn_one({"b": 1e200, "c": 1.0}, label(1))
    assert _checkpoint_view(model) == before
    model.learn_one({"b": 1.0, "c": 1.0}, label(1))  # room is made for a learn that succeeds
    assert "old" not in model.to_checkpoint()[1]["features"]


def test_names_dropped_to_make_room_count_again_when_the_input_brings_them_back():
    # The input's names that no stored point used were dropped to make room, then came back
    # as new ones, uncounted: the model held 5 names with max_features = 3.
    model = IncrementalSVC(max_features=3)
    model.learn_one({"a": 1.0, "b": 1.0, "c": 1.0}, True, key="k")
    model._forgotten = lambda: None  # the names stay, unused (as reserve_epsilon leaves them)
    model.forget_one(key="k")
    del model._forgotten
    assert model.n_features == 3
    with pytest.raises(ValueError, match=r"5 features .* max_features=3"):
        model.learn_one({"a": 1.0, "b": 1.0, "c": 1.0, "d": 1.0, "e": 1.0}, True, key="k2")
    assert model.n_features == 3 and "k2" not in model
    model.learn_one({"c": 1.0, "d": 1.0, "e": 1.0}, True, key="k3")
    assert model.n_features == 3
