"""Inputs every estimator must refuse by name, leaving the model as it was, and a user's kernel
that the all-or-nothing updates must keep as it is (never copied)."""

from __future__ import annotations

import re
import threading
import warnings

import numpy as np
import pandas as pd
import pytest

from stream_svm import (
    AlphaISVC,
    IncrementalLSSVC,
    IncrementalLSSVR,
    IncrementalSVC,
    IncrementalSVR,
    SlidingWindowSVC,
    SlidingWindowSVR,
)
from stream_svm.engine import ConvergenceError, PathEngine
from stream_svm.kernels import make_kernel

FRAME = pd.DataFrame({"a": [0.1, -0.4, 0.9, -1.2], "b": [1.0, 0.3, -0.5, 0.2]},
                     index=["p", "q", "r", "s"])
LABELS = pd.Series([True, False, True, False], index=FRAME.index)
TARGETS = pd.Series([0.5, -0.1, 1.2, 0.0], index=FRAME.index)
PROBES = pd.DataFrame({"a": [0.0, 0.5, -0.7], "b": [0.2, -0.9, 0.4]})

ESTIMATORS = {
    "IncrementalSVC": (lambda: IncrementalSVC(gamma=0.5), LABELS),
    "SlidingWindowSVC": (lambda: SlidingWindowSVC(window_size=10, step=2, gamma=0.5), LABELS),
    "AlphaISVC": (lambda: AlphaISVC(batch_size=2, gamma=0.5), LABELS),
    "IncrementalSVR": (lambda: IncrementalSVR(gamma=0.5), TARGETS),
    "SlidingWindowSVR": (lambda: SlidingWindowSVR(window_size=10, step=2, gamma=0.5), TARGETS),
}


def _trained(name):
    make, y = ESTIMATORS[name]
    model = make()
    model.learn_many(FRAME, y)
    return model, y


def _view(model):
    return (model.n_stored, getattr(model, "n_buffered", 0),
            model.decision_function_many(PROBES).tolist())


@pytest.mark.parametrize("name", ESTIMATORS)
def test_repeated_column_names_are_refused_not_collapsed(name):
    # pandas gives the last of two columns named "a": one feature's values vanished silently.
    model, y = _trained(name)
    before = _view(model)
    twice = pd.DataFrame([[1.0, 100.0], [2.0, 200.0]], columns=["a", "a"], index=["t", "u"])
    with pytest.raises(ValueError, match=r"repeated column names \['a'\]"):
        model.learn_many(twice, y.iloc[:2].set_axis(["t", "u"]))
    with pytest.raises(ValueError, match=r"repeated column names \['a'\]"):
        model.predict_many(twice)
    assert _view(model) == before


@pytest.mark.parametrize("name", ESTIMATORS)
def test_labels_given_as_a_data_frame_are_refused(name):
    # Iterating a frame gives its column names: they were learned as the labels.
    model, y = _trained(name)
    before = _view(model)
    rows = FRAME.set_axis(["t", "u", "v", "w"])
    with pytest.raises(TypeError, match=r"must be a Series .* got a DataFrame"):
        model.learn_many(rows, pd.DataFrame({"label": y.to_numpy()}, index=rows.index))
    assert _view(model) == before


@pytest.mark.parametrize("name", ESTIMATORS)
def test_labels_concatenated_from_pieces_numbered_from_0_pair_by_position(name):
    # Their index (0, 1, 0) holds only numbers of X's numbering 0, 1, 2: it must not be
    # refused as X's rows in another order, since no order of X's rows gives it.
    model, y = _trained(name)
    rows = FRAME.reset_index(drop=True).iloc[:3]
    pieces = pd.concat([y.iloc[:2].reset_index(drop=True), y.iloc[2:3].reset_index(drop=True)])
    assert pieces.index.tolist() == [0, 1, 0]
    model.learn_many(rows, pieces)
    expected, _ = _trained(name)
    expected.learn_many(rows, pieces.to_numpy())
    assert _view(model) == _view(expected)


@pytest.mark.parametrize("name", ["SlidingWindowSVC", "SlidingWindowSVR"])
def test_a_window_checks_labels_of_an_empty_batch_too(name):
    model, _ = _trained(name)
    with pytest.raises(ValueError, match=r"3 (labels|targets) for 0 rows"):
        model.learn_many(FRAME.iloc[:0], pd.Series([True, "garbage", None]))


@pytest.mark.parametrize("name", ["IncrementalSVC", "IncrementalSVR"])
def test_a_single_string_is_not_taken_as_keys_character_by_character(name):
    model, y = _trained(name)
    model.learn_many(PROBES.set_axis(["x", "y", "z"]), y.iloc[:3].set_axis(["x", "y", "z"]))
    before = _view(model)
    with pytest.raises(TypeError, match=r"not the single key 'xy': pass \['xy'\]"):
        model.forget_many("xy")
    with pytest.raises(TypeError, match="forget_keys must be a collection of keys"):
        model.update_many(None, None, "xy")
    with pytest.raises(TypeError, match="keys must be a collection of keys"):
        model.learn_many(FRAME.reset_index(drop=True).iloc[:2], y.iloc[:2].reset_index(drop=True),
                         keys="mn")
    # Bytes too: b"mn" must not be taken as the keys 109 and 110, its characters' codes.
    with pytest.raises(TypeError, match=r"not the single key b'mn': pass \[b'mn'\]"):
        model.learn_many(FRAME.reset_index(drop=True).iloc[:2], y.iloc[:2].reset_index(drop=True),
                         keys=b"mn")
    with pytest.raises(TypeError, match="not the single key b'xy'"):
        model.forget_many(b"xy")
    assert _view(model) == before and {"x", "y", "z"} <= set(model.stored_keys())


def test_the_ls_svm_and_the_engine_refuse_a_string_as_keys():
    model = IncrementalLSSVC()
    model.learn_many(FRAME, LABELS, keys=["p", "q", "r", "s"])
    with pytest.raises(TypeError, match="not the single key 'pq'"):
        model.forget_many(keys="pq")
    with pytest.raises(TypeError, match="not the single key 'pq'"):
        model.learn_many(FRAME.iloc[:2], LABELS.iloc[:2], keys="pq")
    assert model.n_samples_ == 4
    engine = PathEngine(make_kernel("rbf", gamma=0.5), 1.0)
    engine.update(FRAME.to_numpy(), np.array([1.0, -1.0, 1.0, -1.0]), ["a", "b", "ab", "c"])
    with pytest.raises(TypeError, match="remove must be a collection of keys"):
        engine.update(remove="ab")
    assert engine.keys == ["a", "b", "ab", "c"]


class LockedRBF:
    """A kernel holding what cannot be copied (a lock, as a kernel served by a pool would)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.failing = False

    def __call__(self, A: np.ndarray, B: np.ndarray) -> np.ndarray:
        if self.failing:
            raise RuntimeError("kernel unavailable")
        with self.lock:
            return np.exp(-0.5 * ((A[:, None, :] - B[None, :, :]) ** 2).sum(-1))


def test_a_kernel_that_cannot_be_copied_serves_every_all_or_nothing_update():
    rng = np.random.default_rng(3)
    X = pd.DataFrame(rng.standard_normal((12, 2)), columns=["a", "b"])
    y = pd.Series(X["a"] * X["b"] > 0)
    models = [IncrementalSVC(kernel=LockedRBF()), AlphaISVC(batch_size=4, kernel=LockedRBF()),
              SlidingWindowSVC(window_size=6, step=3, strategy="single", kernel=LockedRBF())]
    for model in models:
        for i in range(12):
            model.learn_one(X.iloc[i].to_dict(), bool(y[i]), **(
                {} if isinstance(model, AlphaISVC) else {"key": i}))
    svc, alpha, window = models
    svc.relabel_one(3, not y[3])
    assert alpha.increments_total == 3 and window.n_window == 6
    # A refused relabel keeps the very kernel the model was given.
    kernel = svc.kernel
    kernel.failing = True
    with pytest.raises(RuntimeError, match="kernel unavailable"):
        svc.relabel_one(4, not y[4])
    kernel.failing = False
    assert svc.kernel is kernel and svc._engine.kernel.function is kernel


def _checkpoint():
    import json

    rng = np.random.default_rng(0)
    model = IncrementalSVC(C=1.0, reserve_epsilon=0.5)
    for i in range(40):
        a, b = rng.normal(size=2)
        model.learn_one({"a": a, "b": b}, bool(a * b > 0), key=i)
    arrays, meta = model.to_checkpoint()
    return model, arrays, json.loads(json.dumps(meta))


@pytest.mark.parametrize("edit, message", [
    (lambda A, M: A["alpha"].__setitem__(slice(None), 5.0), r"coefficient 5.0 outside \[0, C"),
    (lambda A, M: A["alpha"].__setitem__(0, np.nan), "coefficient nan outside"),
    (lambda A, M: A["y"].__setitem__(0, 3.0), r"labels other than \+1 and -1 \(3.0\)"),
    (lambda A, M: M["params"].__setitem__("C", 0.01), "outside .0, C = 0.01."),
    (lambda A, M: M["params"].__setitem__("C", 10.0), "do not match their sets"),
    (lambda A, M: A.__setitem__("b", A["b"] + 0.5), "do not solve the SVM of its points"),
])
def test_a_checkpoint_whose_solution_is_no_svm_of_its_points_is_refused(edit, message):
    # Each restored without a word, and answered as a model nobody trained.
    _, arrays, meta = _checkpoint()
    arrays = {name: np.array(value, copy=True) for name, value in arrays.items()}
    edit(arrays, meta)
    with pytest.raises(ValueError, match=message):
        IncrementalSVC.from_checkpoint(arrays, meta)


def test_a_checkpoint_keeps_the_discard_count_and_numpy_parameters_as_numbers():
    import json

    model, arrays, meta = _checkpoint()
    assert model.reserve_discarded > 0
    restored = IncrementalSVC.from_checkpoint(arrays, meta)
    assert restored.reserve_discarded == model.reserve_discarded
    for made in (IncrementalSVC(gamma=np.float32(0.5)),
                 SlidingWindowSVC(window_size=np.int64(10))):
        made.learn_one({"a": 1.0}, True)
        stored = json.loads(json.dumps(made.to_checkpoint()[1]))
        assert type(made).from_checkpoint(made.to_checkpoint()[0], stored).predict_one(
            {"a": 1.0}) is True


def test_a_nan_feature_name_is_refused():
    # Every learn made it a new feature, and a pickled copy found none of them again.
    model = IncrementalSVC()
    model.learn_one({"a": 1.0}, True)
    before = _view(model)
    with pytest.raises(TypeError, match="feature name nan is not equal to itself"):
        model.learn_one({float("nan"): 1.0, "a": 0.5}, False)
    with pytest.raises(TypeError, match="feature name nan is not equal to itself"):
        model.learn_many(pd.DataFrame({float("nan"): [1.0], "a": [0.2]}, index=["k"]),
                         pd.Series([False], index=["k"]))
    assert _view(model) == before


@pytest.mark.parametrize("make", [IncrementalSVC, IncrementalSVR, IncrementalLSSVC])
def test_numpy_and_unhashable_keys_are_checked_as_keys(make):
    model = make()
    y = 1.0 if make is IncrementalSVR else True
    with pytest.raises(KeyError, match="does not fit in 64 bits"):
        model.learn_one({"a": 1.0}, y, key=np.uint64(2**64 - 1))
    with pytest.raises(TypeError, match=r"key \['x'\] is not hashable \(list\)"):
        model.learn_one({"a": 1.0}, y, key=["x"])
    model.learn_one({"a": 1.0}, y, key=np.int64(7))
    arrays, meta = model.to_checkpoint()  # the key is a checkpoint's
    assert 7 in type(model).from_checkpoint(arrays, meta)


def test_settings_assigned_after_construction_are_checked_as_the_constructor_checks_them():
    model = IncrementalSVC()
    for value in ("10", 0, -5, 2.5, True):
        with pytest.raises(ValueError, match="max_features must be None or an integer >= 1"):
            model.max_features = value
    model.max_new_features = 5  # still settable (River's mutate sets them)
    assert model.max_new_features == 5
    for name, value in (("ridge", "0"), ("ridge", None), ("ridge", True), ("ridge", -0.1),
                        ("ridge", float("inf")), ("max_breakpoints", True)):
        with pytest.raises(ValueError, match=f"{name} must be"):
            IncrementalSVC(**{name: value})


def test_alpha_isvc_reads_any_kept_sample_and_refuses_to_relabel():
    rng = np.random.default_rng(7)
    model = AlphaISVC(batch_size=10, C=1.0, gamma=0.5, discard_ratio=0.0)
    samples = []
    for _ in range(50):
        a, b = rng.normal(size=2)
        samples.append(({"a": float(a), "b": float(b)}, bool(a * b > 0)))
        model.learn_one(*samples[-1])
    outside = [key for key in model.stored_keys() if key not in model._engine]
    assert outside  # kept in the caching or backup set, not trained on now
    for key in outside:
        assert model.stored_point(key) == samples[key]
    with pytest.raises(KeyError, match="no kept sample has id 999"):
        model.stored_point(999)
    with pytest.raises(TypeError, match="AlphaISVC cannot relabel"):
        model.relabel_one(model.stored_keys()[0], True)


@pytest.mark.parametrize("make", [IncrementalSVC, lambda **kw: SlidingWindowSVC(
    window_size=50, **kw), IncrementalSVR])
def test_a_learn_refused_for_its_key_drops_no_unused_feature_name(make):
    # max_features made the learn drop the unused name "a" before the key was refused.
    model = make(max_features=4)
    value = (lambda i: float(i)) if make is IncrementalSVR else (lambda i: bool(i % 2))
    for i, x in enumerate([{"a": 1.0}, {"a": -1.0}, {"c": 1.0, "d": 2.0}, {"c": 3.0}]):
        model.learn_one(x, value(i), key=f"k{i}")
    model.forget_one(key="k0")
    model.forget_one(key="k1")  # "a" is unused now
    names = list(model._features.names)
    with pytest.raises(KeyError, match="'k2' is already stored"):
        model.learn_one({"e": 1.0, "f": 1.0}, value(1), key="k2")
    assert list(model._features.names) == names


@pytest.mark.parametrize("model", [IncrementalSVC(), IncrementalSVR(), SlidingWindowSVR(),
                                   IncrementalLSSVR()], ids=lambda m: type(m).__name__)
def test_a_key_given_in_xs_place_to_forget_one_is_named(model):
    # forget_one("k1") said "forget_one needs a key, or both x and y": the user had given one.
    model = model.clone()
    model.learn_one({"a": 1.0}, 1.0 if "SVR" in type(model).__name__ else True, key="k1")
    with pytest.raises(ValueError, match=r"forget_one got 'k1' as x.*forget_one\(key='k1'\)"):
        model.forget_one("k1")
    assert model.stored_keys() == ["k1"]
    model.forget_one(key="k1")
    assert model.stored_keys() == []


def _window_checkpoint():
    model = SlidingWindowSVC(window_size=4, step=3)
    for i in range(5):  # two samples buffered
        model.learn_one({"a": float(i)}, bool(i % 2), key=i)
    return SlidingWindowSVC, model


def _keyless_window_checkpoint():
    model = SlidingWindowSVC(window_size=4, step=3)
    for i in range(5):  # two samples buffered, under the automatic keys 4 and 5
        model.learn_one({"a": float(i)}, bool(i % 2))
    return SlidingWindowSVC, model


def _svr_checkpoint():
    model = IncrementalSVR(epsilon=0.1, C=10.0)
    for i in range(6):
        model.learn_one({"a": float(i)}, float(i % 3))
    return IncrementalSVR, model


def _alpha_checkpoint():
    model = AlphaISVC(batch_size=2)
    for i in range(5):
        model.learn_one({"a": float(i)}, bool(i % 2))
    return AlphaISVC, model


def _keyed_checkpoint():
    model = IncrementalSVC()
    model.learn_one({"a": 1.0}, True)  # the automatic key 1
    model.learn_one({"a": -1.0}, False, key="pq")
    model.learn_one({"a": 0.5}, True, key=2.5)
    return IncrementalSVC, model


def _edit_array(name: str, position: int, value: int):
    def edit(arrays, meta):
        arrays[name] = np.array(arrays[name], copy=True)
        arrays[name][position] = value
    return edit


def _edit(path: str, value):
    def edit(arrays, meta):
        *parents, last = path.split(".")
        place = meta
        for name in parents:
            place = place[name]
        place[last] = value(place[last]) if callable(value) else value
    return edit


@pytest.mark.parametrize(("make", "edit", "named"), [
    # each of these restored and then failed at every later learn, or answered with a
    # model nobody trained
    (_window_checkpoint, _edit("extra.buffer_labels", [5.0, 5.0]), "buffered labels"),
    (_window_checkpoint, _edit("extra.buffer_labels", [float("nan"), 1.0]), "buffered labels"),
    (_window_checkpoint, _edit("extra.buffer_rows", [[1.0, 2.0], [1.0]]), "buffered row"),
    (_window_checkpoint, _edit("extra.buffer_keys", [0, 99]), "buffered keys repeat"),
    (_window_checkpoint, _edit("extra.buffer_keys", [[{"zone": "UTC"}], 99]),
     "is not a key a checkpoint writes"),
    (_window_checkpoint, _edit("extra.buffer_auto", [False]), "differ in length"),
    (_window_checkpoint, _edit("extra.buffer_rows", [[float("inf")], [1.0]]), "buffered row"),
    (_keyless_window_checkpoint, _edit("extra.buffer_keys", ["s", 5]), "automatic buffered key"),
    (_keyless_window_checkpoint, _edit("extra.buffer_keys", [True, 5]),
     "automatic buffered key"),
    (_keyless_window_checkpoint, _edit("auto_keys", 4),
     "auto_keys 4 is below its automatic key 5"),
    (_svr_checkpoint, _edit("auto_keys", 0), "auto_keys 0 is below its automatic key 6"),
    (_keyed_checkpoint, _edit_array("key_int", 0, 0), "automatic key numbered below 1"),
    (_keyed_checkpoint, _edit_array("key_int", 2, np.float64("nan").view(np.int64)),
     "float key is NaN"),
    (_keyed_checkpoint, _edit_array("key_str_ends", 2, 3), "key_str_ends do not cut"),
    (_keyed_checkpoint, _edit_array("key_str_ends", 1, 3), "key_str_ends do not cut"),
    (_keyed_checkpoint, lambda arrays, meta: arrays.update(key_str_ends=np.array([0, 2])),
     "2 key texts for 3 keys"),
    (_svr_checkpoint, _edit("features", ["a", "a"]), "feature names repeat"),
    (_svr_checkpoint, _edit("features", []), "1 feature columns but it names 0"),
    (_svr_checkpoint, _edit("params.epsilon", 2.0), "tube of epsilon = 2.0"),
    (_alpha_checkpoint, _edit("extra.next_id", 0), "next_id"),
    (_alpha_checkpoint, _edit("extra.buffer_labels", [3.0]), "buffered samples"),
], ids=["window-label", "window-nan", "window-row", "window-key", "window-list-key",
        "window-lengths", "window-inf-row", "window-auto-text", "window-auto-bool",
        "window-auto-keys", "auto-keys", "auto-key-0", "nan-float-key", "key-texts-long",
        "key-texts-unordered", "key-texts-fewer", "features-repeat", "features-missing", "epsilon",
        "alpha-next-id", "alpha-buffer"])
def test_a_checkpoint_whose_parts_contradict_each_other_is_refused_by_name(make, edit, named):
    import copy

    cls, model = make()
    arrays, meta = model.to_checkpoint()
    restored = cls.from_checkpoint(arrays, meta)  # as written: restores, and learns on
    restored.learn_one({"a": 9.0}, model.predict_one({"a": 9.0}))
    meta = copy.deepcopy(meta)
    edit(arrays, meta)
    with pytest.raises((ValueError, TypeError), match=named):
        cls.from_checkpoint(arrays, meta)


@pytest.mark.parametrize("cls", [SlidingWindowSVC, SlidingWindowSVR, IncrementalSVC,
                                 IncrementalSVR, AlphaISVC])
def test_a_restored_model_learns_without_touching_the_checkpoint_it_came_from(cls):
    # The engine took the checkpoint's margin order without a copy and reordered it in place:
    # a second restore from the same arrays (a daemon's retry, a replica) was then refused.
    label = (lambda i: float(i % 3)) if cls.__name__.endswith("R") else (lambda i: i % 2 == 0)
    params = {"batch_size": 2} if cls is AlphaISVC else (
        {"window_size": 4} if cls.__name__.startswith("Sliding") else {})
    model = cls(**params)
    for i in range(7):
        model.learn_one({"a": float(i)}, label(i))
    arrays, meta = model.to_checkpoint()
    written = {name: np.array(value, copy=True) for name, value in arrays.items()}
    first = cls.from_checkpoint(arrays, meta)
    for i in range(7, 15):
        first.learn_one({"a": float(i), "b": 1.0}, label(i))
    for name, value in written.items():
        np.testing.assert_array_equal(arrays[name], value, err_msg=name)
    again = cls.from_checkpoint(arrays, meta)
    assert again.predict_one({"a": 3.5}) == model.predict_one({"a": 3.5})


def _lssvr_checkpoint():
    model = IncrementalLSSVR()
    for i in range(5):
        model.learn_one({"a": float(i), "b": 1.0}, 2.0 * i, key=i)
    return model.to_checkpoint()


def test_an_ls_svm_checkpoint_whose_parts_contradict_each_other_is_refused():
    import copy

    arrays, meta = _lssvr_checkpoint()
    assert IncrementalLSSVR.from_checkpoint(arrays, meta).predict_one({"a": 1.0}) == \
        pytest.approx(2.0, abs=0.2)
    edited = {**arrays, "solution": arrays["solution"] + 1.0}  # answered 4.18 instead of 2.18
    with pytest.raises(ValueError, match="solution does not solve its system"):
        IncrementalLSSVR.from_checkpoint(edited, meta)
    repeated = {name: np.array(value, copy=True) for name, value in arrays.items()}
    repeated["key_int"][1] = repeated["key_int"][0]  # one kept sample vanished silently
    with pytest.raises(ValueError, match="keys repeat"):
        IncrementalLSSVR.from_checkpoint(repeated, meta)
    renamed = copy.deepcopy(meta)
    renamed["features"] = ["a", "a"]  # predictions then failed in numpy
    with pytest.raises(ValueError, match="feature names or kept samples' keys repeat"):
        IncrementalLSSVR.from_checkpoint(arrays, renamed)


def test_an_ls_svm_refusing_huge_features_does_not_speak_of_forgetting():
    model = IncrementalLSSVR()
    with pytest.raises(ValueError, match="features are too large next to rho") as refused:
        model.learn_one({"a": 1e100, "b": -1e100}, 1.0)
    assert "forgotten" not in str(refused.value) and model.n_samples_ == 0


@pytest.mark.parametrize("model", [IncrementalSVC(), IncrementalSVR(), SlidingWindowSVR(),
                                   IncrementalLSSVR(), IncrementalLSSVC(), AlphaISVC()],
                         ids=lambda m: type(m).__name__)
def test_learn_many_names_a_single_value_given_as_y(model):
    # "object of type 'float' has no len()" or "'float' object is not iterable" before.
    X = pd.DataFrame({"a": [1.0, 2.0]})
    with pytest.raises(TypeError, match=r"y must be a Series \(one value per row of X\), got "):
        model.learn_many(X, 1.0)


def test_an_rff_ls_svm_refuses_a_nan_feature_name_as_the_linear_one_does():
    # The Fourier map was drawn on it: a later sample could never name it again, and the
    # checkpoint failed.
    for features in ("linear", "rff"):
        model = IncrementalLSSVR(features=features, seed=0, n_components=5)
        with pytest.raises(TypeError, match="not equal to itself"):
            model.learn_one({"a": 1.0, float("nan"): 2.0}, 1.0)
        assert model.n_samples_ == 0
        model.learn_one({"a": 1.0, "b": 2.0}, 1.0)  # and then learns


def test_an_ls_svm_of_subnormal_targets_restores():
    # The solution's residual, one subnormal ulp, was judged against 1e-8 of terms of 1e-319.
    model = IncrementalLSSVR()
    for a, target in ((1.0, 1e-320), (2.0, 3e-320), (-1.0, 2e-320)):
        model.learn_one({"a": a}, target)
    arrays, meta = model.to_checkpoint()
    restored = IncrementalLSSVR.from_checkpoint(arrays, meta)
    assert restored.predict_one({"a": 0.5}) == model.predict_one({"a": 0.5})


def test_a_window_restores_a_buffered_sample_learned_under_a_users_autokey():
    # The check took automatic keys for the library's own (numbered from 1): AutoKey(0),
    # given by a user, was refused while buffered (the old code restored it).
    from stream_svm._engine_model import AutoKey

    model = SlidingWindowSVC(window_size=4, step=3)
    model.learn_one({"a": 1.0}, True, key=AutoKey(0))  # waits in the buffer
    arrays, meta = model.to_checkpoint()
    restored = SlidingWindowSVC.from_checkpoint(arrays, meta)
    assert restored.stored_keys() == model.stored_keys() and AutoKey(0) in restored


def _svc_with_margin():
    model = IncrementalSVC(C=1.0, gamma=0.5)
    rng = np.random.default_rng(3)
    for i in range(30):
        a, b = rng.normal(size=2)
        model.learn_one({"a": a, "b": b}, bool(a + 0.3 * b > 0), key=f"k{i}")
    return IncrementalSVC, model


def _set(name, index, value):
    def edit(arrays, meta):
        arrays[name] = np.array(arrays[name], copy=True)
        where = index(arrays) if callable(index) else index
        arrays[name][where] = value
    return edit


def _replace(name, value):
    def edit(arrays, meta):
        arrays[name] = value(arrays[name])
    return edit


def _drop(name):
    return lambda arrays, meta: arrays.pop(name)


def _reserve_point(arrays):
    return int(np.flatnonzero(arrays["status"] == 2)[0])


@pytest.mark.parametrize(("make", "edit", "named"), [
    # A status outside the three sets went through to the compiled path, which indexed with
    # it: the sixth learn after the restore aborted the process (free(): invalid pointer).
    (_svc_with_margin, _set("status", _reserve_point, 3), "status 3: not margin"),
    (_svc_with_margin, _set("status", _reserve_point, -1), "status -1"),
    (_svc_with_margin, _set("margin", 0, -1), "margin order names points it does not hold"),
    (_svc_with_margin, _set("margin", 0, 10**6), "margin order names points it does not hold"),
    (_svc_with_margin, _replace("margin", lambda m: np.concatenate([m, m[:1]])),
     "margin order|statuses"),
    (_svc_with_margin, _set("sequence", 1, 0), "arrival sequence repeats"),
    (_svc_with_margin, _replace("next_sequence", lambda s: np.array(1)), "arrival sequence"),
    (_svc_with_margin, _replace("X", lambda X: X.astype(np.float32)), "'X' holds float32"),
    (_svc_with_margin, _replace("alpha", lambda a: a.astype("U32")), "'alpha' holds <U32"),
    (_svc_with_margin, _replace("status", lambda s: s.astype(float)), "'status' holds float64"),
    (_svc_with_margin, _replace("sequence", lambda s: s[:1].reshape(())), "'sequence' has 0"),
    (_svc_with_margin, _replace("b", lambda b: np.atleast_1d(b)), "'b' has 1 dimensions"),
    (_svc_with_margin, _set("X", (0, 0), np.inf), "features that are not finite"),
    (_svc_with_margin, _drop("X"), "lacks its 'X' array"),
    (_svc_with_margin, _drop("key_str_ends"), "lacks its 'key_str_ends' array"),
    (_svc_with_margin, _set("key_kind", 0, 7), "key_kind holds a kind other than"),
    (_svc_with_margin, _set("key_kind", 0, 5), "tuple key 'k.*' is not one a checkpoint"),
    (_svc_with_margin, _edit("breakpoints_total", -3), "'breakpoints_total' .* not a count"),
    (_svc_with_margin, lambda arrays, meta: meta.pop("auto_keys"), "lacks 'auto_keys'"),
    (_svc_with_margin, lambda arrays, meta: meta["params"].pop("gamma"),
     "params lack 'gamma'"),
    (_svr_checkpoint, _drop("gap"), "lacks its 'gap' array"),
    (_svr_checkpoint, _drop("target"), "lacks its 'target' array"),
    # A window without its buffer lost the buffered points; without its size it came back
    # with a window of 1000, and evicted other points than the saved one would have.
    (_window_checkpoint, lambda arrays, meta: meta.pop("extra"), "lacks 'buffer_labels'"),
    (_window_checkpoint, lambda arrays, meta: meta["extra"].pop("buffer_rows"),
     "lacks 'buffer_rows'"),
    (_window_checkpoint, lambda arrays, meta: meta["params"].pop("window_size"),
     "params lack 'window_size'"),
    # The next increments raised KeyError for a sample marked as trained on but not held.
    (_alpha_checkpoint, _set("aisvc_in_T", 0, False), "aisvc_in_T does not mark exactly"),
    (_alpha_checkpoint, _edit("extra.clock", 10**30), "clock or next_id is out of range"),
    (_alpha_checkpoint, _replace("aisvc_labels", lambda v: v.astype(bool)),
     "aisvc_labels holds bool"),
    (_alpha_checkpoint, _replace("aisvc_psi", lambda v: v.reshape(-1)[:1].reshape(())),
     "aisvc_\\* arrays differ in length"),
    (_alpha_checkpoint, lambda arrays, meta: meta["extra"].pop("last_increment"),
     "lacks 'last_increment'"),
    # Accepted: learning went on, every later checkpoint failed (auto_keys), or an increment
    # discarded other samples (weights, last uses), or the window refused with a KeyError.
    (_svc_with_margin, _edit("auto_keys", 2**63), "auto_keys .* is not a count"),
    (_svc_with_margin, _replace("key_str_ends", lambda ends: ends[:-1]),
     "key_str_ends do not cut|key texts for"),
    (_window_checkpoint, _edit("extra.buffer_keys", [0, 2**63]), "does not fit in 64 bits"),
    (_alpha_checkpoint, _set("aisvc_psi", 0, np.nan), "caching weights"),
    (_alpha_checkpoint, _set("aisvc_used", 0, -1), "last uses lie outside its clock"),
    (_alpha_checkpoint, _edit("extra.initialized", False), "says no increment has run"),
], ids=["status-3", "status-negative", "margin-negative", "margin-beyond", "margin-twice",
        "sequence-repeats", "sequence-above-next", "X-float32", "alpha-text", "status-float",
        "sequence-scalar", "b-vector", "X-infinite", "no-X", "no-key-ends", "key-kind",
        "key-not-a-tuple", "breakpoints-negative", "no-auto-keys", "no-gamma", "svr-no-gap",
        "svr-no-target", "window-no-extra", "window-no-rows", "window-no-size", "alpha-in-T",
        "alpha-clock", "alpha-labels-bool", "alpha-psi-scalar", "alpha-no-increment",
        "auto-keys-huge", "key-ends-short", "window-key-huge", "alpha-psi-nan",
        "alpha-used-negative", "alpha-not-initialized"])
def test_a_checkpoint_whose_layout_is_damaged_is_refused_by_name(make, edit, named):
    # Each was restored (a model answering as nobody trained it, a buffer or window size
    # silently replaced by a default), or refused by a bare KeyError or IndexError, or
    # corrupted the process's memory.
    cls, model = make()
    _refused_once_edited(cls, model, edit, named)


def _refused_once_edited(cls, model, edit, named):
    """The model's checkpoint, edited by ``edit(arrays, meta)``, is refused with ``named``."""
    import copy

    arrays, meta = model.to_checkpoint()
    arrays = {name: np.array(value, copy=True) for name, value in arrays.items()}
    meta = copy.deepcopy(meta)
    edit(arrays, meta)
    with pytest.raises(ValueError, match=named):
        cls.from_checkpoint(arrays, meta)


def test_a_checkpoint_of_the_first_versions_without_the_later_parameters_still_restores():
    # max_features, max_new_features and classes came after the first checkpoints: those
    # take their defaults, which is what the models were then.
    _, model = _svc_with_margin()
    arrays, meta = model.to_checkpoint()
    for name in ("max_features", "max_new_features", "classes"):
        del meta["params"][name]
    restored = IncrementalSVC.from_checkpoint(arrays, meta)
    assert restored.decision_function_one({"a": 0.3, "b": -0.2}) == \
        model.decision_function_one({"a": 0.3, "b": -0.2})


@pytest.mark.parametrize(("edit", "named"), [
    # A solution of 1e308 made the check's scale overflow, and the model predicted 1e308.
    (lambda A, M: A["solution"].__setitem__(0, 1e308), "solution does not solve its system"),
    (lambda A, M: A.__setitem__("phase", A["phase"].astype("U24")), "'phase' must be finite"),
    (lambda A, M: A.__setitem__("omega", A["omega"].astype(np.float32)), "'omega' must be"),
    # A falsy has_space dropped the model's features: it answered 0.5 / 0.5 for everything.
    (lambda A, M: M.__setitem__("has_space", []), "'has_space' .* not a flag"),
    (lambda A, M: M.__setitem__("n_samples", -5), "'n_samples' .* not a count"),
    (lambda A, M: M.__setitem__("n_samples", 1), "keeps 5 samples but has learned 1"),
    (lambda A, M: A.pop("rhs_lo"), "lacks its 'rhs_lo' array"),
    # A kept row of NaN (read as 0) made forget_one remove another sample than the learned one.
    (lambda A, M: A["X"].__setitem__((0, 0), np.nan), "kept samples hold values that are not"),
    (lambda A, M: M.__setitem__("fourier_seed", "-3"), "'fourier_seed' must be the text of"),
    (lambda A, M: M.__setitem__("fourier_seed", 7), "'fourier_seed' must be the text of"),
], ids=["solution-huge", "phase-text", "omega-float32", "has-space-list", "n-samples-negative",
        "fewer-learned-than-kept", "no-rhs-lo", "kept-row-nan", "seed-negative", "seed-number"])
def test_a_damaged_ls_svm_checkpoint_is_refused_by_name(edit, named):
    model = IncrementalLSSVC(features="rff", n_components=20, seed=1)
    for i in range(5):
        model.learn_one({"a": float(i), "b": 1.0 - i}, i % 2 == 0, key=i)
    _refused_once_edited(IncrementalLSSVC, model, edit, named)


@pytest.mark.parametrize("make", [
    lambda: IncrementalSVC(classes=[False, "yes"]), lambda: IncrementalSVC(classes=[0, "spam"]),
    lambda: SlidingWindowSVC(window_size=8, classes=["none", 3]),
    lambda: IncrementalLSSVC(classes=[False, "yes"]), lambda: IncrementalLSSVC(classes=[0, "b"]),
], ids=["bool-text", "int-text", "window-text-int", "ls-bool-text", "ls-int-text"])
def test_predict_many_returns_the_labels_predict_one_returns(make):
    # np.where promoted [False, "yes"] to the text "False" (which River's metrics count as a
    # miss against False), and refused [0, "spam"] with numpy's DTypePromotionError.
    model = make()
    negative, positive = model.classes
    X = pd.DataFrame({"a": [-2.0, -1.0, 1.0, 2.0]})
    model.learn_many(X, pd.Series([negative, negative, positive, positive]))
    many = model.predict_many(X)
    one = [model.predict_one(row) for row in X.to_dict(orient="records")]
    assert many.tolist() == one == [negative, negative, positive, positive]
    assert [type(label) for label in many] == [type(label) for label in one]


def test_a_window_of_fewer_points_than_the_far_point_check_needs_is_checked_when_full():
    # The check waited for 10 stored points, which a window of 8 never holds: a unit slip went
    # in under far_points="refuse", and the window refused the samples after it.
    from stream_svm import SlidingWindowSVC

    rng = np.random.default_rng(3)
    window = SlidingWindowSVC(window_size=8, step=1, kernel="linear", far_points="refuse")
    for a, b in rng.uniform(-1, 1, size=(8, 2)):
        window.learn_one({"a": a, "b": b}, bool(a > b))
    with pytest.raises(ValueError, match=r"a point far beyond the kernel scale of the stored "
                                         r"points: .* the largest of the 8 points stored"):
        window.learn_one({"a": 1e6, "b": 0.0}, True)
    assert window.n_window == 8 and window.far_points_total == 1


@pytest.mark.parametrize("make, named", [
    (lambda: IncrementalSVC(kernel="linear", gamma=0.5),
     "IncrementalSVC: gamma=0.5 does not apply to kernel='linear' and is ignored"),
    (lambda: SlidingWindowSVR(kernel="rbf", coef0=1.0),
     "SlidingWindowSVR: coef0=1.0 does not apply to kernel='rbf'"),
    (lambda: IncrementalLSSVC(gamma=2.0, n_components=300),
     "n_components=300, gamma=2.0 do not apply to features='linear' and are ignored "
     "(features='rff' learns"),
])
def test_a_parameter_that_the_kernel_does_not_use_is_warned_of(make, named):
    # (The daemon refuses such settings; the library warns, as scikit-learn ignores them, so
    # that a grid over kernels and gammas still runs.)
    with pytest.warns(UserWarning, match=re.escape(named)):
        make()


def test_parameters_at_their_defaults_or_used_by_the_kernel_are_not_warned_of():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        IncrementalSVC(kernel="linear").clone()
        IncrementalSVC(kernel="poly", degree=2, coef0=1.0, gamma=0.5)
        SlidingWindowSVC(kernel="rbf", gamma=0.1, window_size=10)
        IncrementalLSSVC(features="rff", gamma=2.0, n_components=50, seed=1)
        IncrementalLSSVR()


@pytest.mark.parametrize("make, named", [
    (lambda: IncrementalSVC(C=1e-320), r"C must be from 1e-150 to 1e\+300, got 1e-320"),
    (lambda: SlidingWindowSVR(C=1e308), r"C must be from 1e-150 to 1e\+300, got 1e\+308"),
    (lambda: IncrementalSVC(classes=[None, 1]), r"classes: class None must be a string"),
    (lambda: AlphaISVC(classes=[float("nan"), 1]), r"classes: class nan must be finite"),
])
def test_a_parameter_out_of_its_range_is_named_at_construction(make, named):
    # C = 1e-320 and 1e308 were taken, and learning failed within a few points, blaming gamma
    # and the ridge; a class of the wrong type did not say it came from classes.
    with pytest.raises(ValueError, match=named):
        make()


@pytest.mark.parametrize("make", [IncrementalSVC, IncrementalLSSVC])
def test_a_column_named_none_is_named_as_pandas_holds_it(make):
    # The LS-SVM said "feature name nan (a float) cannot be kept in a checkpoint: use str,
    # int, float ...", refusing a float as if floats were refused.
    X = pd.DataFrame(np.ones((3, 2)), columns=["a", None])
    with pytest.raises(TypeError, match=r"feature name nan is not equal to itself \(NaN\).*"
                                        r"pandas holds a column named None as NaN"):
        make().learn_many(X, pd.Series([True, False, True]))


def test_an_unhashable_kernel_and_a_subclass_without_the_kernel_parameters_construct():
    # The check of parameters a kernel does not use looked the kernel up in a dict (a
    # callable class with __eq__ and no __hash__, as scikit-learn's kernels, raised
    # TypeError), and read every parameter from the constructor's signature (KeyError).
    from dataclasses import dataclass

    @dataclass
    class Gaussian:
        width: float = 1.0

        def __call__(self, A, B):
            squared = ((A[:, None, :] - B[None, :, :]) ** 2).sum(axis=2)
            return np.exp(-squared / self.width)

    model = IncrementalSVC(kernel=Gaussian())
    model.learn_one({"a": 1.0}, True)
    model.learn_one({"a": -1.0}, False)
    assert model.predict_one({"a": 0.9}) is True

    class LinearSVC(IncrementalSVC):
        def __init__(self, C: float = 1.0) -> None:
            super().__init__(C=C, kernel="linear")

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        LinearSVC(C=2.0).learn_one({"a": 1.0}, True)


def test_a_refusal_where_c_times_the_kernel_leaves_float64s_range_names_c():
    # C = 1e300 with features of 1e4 under a linear kernel: "the margin set is empty and no
    # point can enter it", naming no cause.
    from stream_svm import ConvergenceError

    rng = np.random.default_rng(0)
    X = rng.normal(size=(60, 2)) * 1e4
    y = rng.random(60) < 0.5
    model = IncrementalSVC(C=1e300, kernel="linear")
    with pytest.raises(ConvergenceError, match=r"C \* K\(x, x\) reaches .*e\+30\d: sums of "
                                               r"coefficients times kernel values leave "
                                               r"float64's range; lower C"):
        for row, label in zip(X, y, strict=True):
            model.learn_one({"a": float(row[0]), "b": float(row[1])}, bool(label))


def test_a_refusal_for_the_features_scale_at_a_moderate_c_does_not_blame_c():
    # Its hint measured C times the kernel's scale alone: a polynomial kernel on features of
    # 1e38 at C = 1 was told to lower C, which did not help (C = 1e-100 was refused alike).
    from stream_svm import ConvergenceError

    model = IncrementalSVC(kernel="poly")
    with warnings.catch_warnings(), pytest.raises(ConvergenceError) as refused:
        warnings.simplefilter("ignore")  # (the far points' warnings)
        for i in range(10):
            model.learn_one({"a": i * 1e38, "b": (i % 3) * 1e38}, i % 2 == 0, key=i)
    assert "lower C" not in str(refused.value) and "features scaled" in str(refused.value)


def test_a_refused_update_leaves_the_scale_checks_schedule_the_targets_order_and_counters():
    # Each was moved by an update the model then refused: the kernel scale check's schedule
    # (a restored model skipped its next check), a regressor's targets (reordered) and the
    # engine's refactorization count (the attempts' work on a state that is gone).
    from river import datasets

    points = list(datasets.Bananas().take(80))
    model = IncrementalSVC(C=5.0, gamma=0.5)
    for i, (x, y) in enumerate(points[:60]):
        model.learn_one(x, y, key=i)
    model.__dict__.pop("_next_scale_check", None)  # (as a model restored from a checkpoint)
    with pytest.raises(ValueError, match="would forget and learn again"):
        model.update_many(pd.DataFrame([points[70][0]]), pd.Series([True]), [3], keys=[3])
    assert "_next_scale_check" not in model.__dict__

    regressor = IncrementalSVR(C=5.0, gamma=0.5)
    for i, (x, y) in enumerate(points[:10]):
        regressor.learn_one(x, float(y), key=i)
    order = list(regressor._targets)
    with pytest.raises(KeyError, match="key 2 is already stored"):
        regressor.learn_many(pd.DataFrame([points[70][0], points[71][0]]),
                             pd.Series([0.1, 0.2]), keys=["new", 2])
    assert list(regressor._targets) == order

    linear = IncrementalSVC(C=5.0, kernel="linear")
    stream = [({"a": float(i % 3), "b": float(i % 2)}, i % 5 < 2) for i in range(40)]
    stream[11] = ({"a": 1e6, "b": 0.0}, True)
    refused = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i, (x, y) in enumerate(stream):
            before = linear._engine.refactorizations_total
            try:
                linear.learn_one(x, y, key=i)
            except ConvergenceError:
                refused += 1
                assert linear._engine.refactorizations_total == before
    assert refused
