"""Named classes (``classes=[negative, positive]``) on every classifier, and the LS-SVMs'
keyed samples (forget and relabel by key, checkpoints, feature bounds)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from river import compose, preprocessing

from stream_svm import (
    AlphaISVC,
    IncrementalLSSVC,
    IncrementalLSSVR,
    IncrementalSVC,
    IncrementalSVR,
    SlidingWindowSVC,
    SlidingWindowSVR,
)
from stream_svm._input import check_classes


def _points(n: int = 40, seed: int = 0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, 2))
    y = X[:, 0] + 0.3 * X[:, 1] > 0
    return [{"a": float(r[0]), "b": float(r[1])} for r in X], [bool(v) for v in y]


CLASSIFIERS = [
    lambda **kw: IncrementalSVC(C=1.0, gamma=0.5, **kw),
    lambda **kw: SlidingWindowSVC(window_size=25, step=1, C=1.0, gamma=0.5, **kw),
    lambda **kw: AlphaISVC(batch_size=10, C=1.0, gamma=0.5, **kw),
    lambda **kw: IncrementalLSSVC(rho=0.5, **kw),
]
NAMES = ["IncrementalSVC", "SlidingWindowSVC", "AlphaISVC", "IncrementalLSSVC"]


@pytest.mark.parametrize("make", CLASSIFIERS, ids=NAMES)
def test_named_classes_give_the_boolean_model_with_the_names(make):
    xs, ys = _points()
    named = make(classes=["ham", "spam"])
    plain = make()
    for x, y in zip(xs, ys, strict=True):
        named.learn_one(x, "spam" if y else "ham")
        plain.learn_one(x, y)
    for x in xs[:10]:
        assert named.decision_function_one(x) == plain.decision_function_one(x)
        assert named.predict_one(x) == ("spam" if plain.predict_one(x) else "ham")
        proba = named.predict_proba_one(x)
        assert set(proba) == {"ham", "spam"}
        assert proba["spam"] == pytest.approx(plain.predict_proba_one(x)[True], abs=0)
    frame = pd.DataFrame(xs[:10])
    assert list(named.predict_many(frame)) == [named.predict_one(x) for x in xs[:10]]
    assert list(named.predict_proba_many(frame).columns) == ["ham", "spam"]


@pytest.mark.parametrize("make", CLASSIFIERS, ids=NAMES)
def test_a_label_outside_the_classes_is_refused_and_changes_nothing(make):
    xs, ys = _points(12)
    model = make(classes=["ham", "spam"])
    for x, y in zip(xs, ys, strict=True):
        model.learn_one(x, "spam" if y else "ham")
    before = model.decision_function_one(xs[0])
    for bad in (True, 1, "Spam", None):
        with pytest.raises(ValueError, match="not one of the classes"):
            model.learn_one(xs[0], bad)
    assert model.decision_function_one(xs[0]) == before


@pytest.mark.parametrize("make", CLASSIFIERS, ids=NAMES)
def test_a_boolean_label_is_not_a_numeric_class(make):
    # With classes [1, 2], True (== 1) was learned as the negative class, which the daemon
    # refuses (JSON's true is not 1); and with classes [False, True], 0 as False.
    xs, ys = _points(12)
    for classes, labels, wrong in (([1, 2], (2, 1), (True, np.True_)),
                                   ([False, True], (True, False), (0, 1, 1.0))):
        model = make(classes=classes)
        for x, y in zip(xs, ys, strict=True):
            model.learn_one(x, labels[0] if y else labels[1])
        before = model.decision_function_one(xs[0])
        for bad in wrong:
            with pytest.raises(ValueError, match=r"not one of the classes .*; a boolean label "
                                                 r"matches only a boolean class"):
                model.learn_one(xs[0], bad)
        assert model.decision_function_one(xs[0]) == before
    model = make(classes=[0, 1])
    model.learn_many(pd.DataFrame(xs), pd.Series([int(y) for y in ys], dtype="int64"))
    assert model.predict_one(xs[0]) in (0, 1)


def test_classes_are_checked():
    assert check_classes(None) is None
    assert check_classes((0, 1)) == (0, 1)
    for bad in ("ab", ["a"], ["a", "b", "c"], ["a", "a"], [1.0, float("nan")], [[1], [2]]):
        with pytest.raises(ValueError, match="class"):
            check_classes(bad)
    with pytest.raises(ValueError):
        IncrementalSVC(classes=["x", "x"])
    # Equal though not the same object: taken as two classes, every label 1 would be learned
    # as the positive class, and the negative one never.
    for same in ([1, 1.0], [np.int64(1), 1], [2.5, np.float64(2.5)]):
        with pytest.raises(ValueError, match="classes must be two distinct labels"):
            check_classes(same)


def test_a_minus_one_label_learned_alone_warns_as_in_a_batch(monkeypatch):
    # learn_one(x, -1) must warn as learn_many does: predictions False/True never equal the -1
    # labels, and River's metrics would count every negative prediction as a miss.
    import warnings

    from stream_svm import _input

    monkeypatch.setattr(_input, "_minus_one_warned", False)
    model = IncrementalSVC()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.learn_one({"a": 1.0}, 1)
        model.learn_one({"a": 0.5}, 0)
    with pytest.warns(UserWarning, match=r"classes=\[-1, 1\]") as caught:
        model.learn_one({"a": -1.0}, -1)
    assert len(caught) == 1 and caught[0].filename == __file__
    assert model.predict_one({"a": -1.0}) is False


def test_named_classes_survive_clone_checkpoint_stored_point_and_relabel():
    xs, ys = _points(20)
    model = IncrementalSVC(C=1.0, gamma=0.5, classes=["ham", "spam"])
    for i, (x, y) in enumerate(zip(xs, ys, strict=True)):
        model.learn_one(x, "spam" if y else "ham", key=i)
    assert model.stored_point(0)[1] == ("spam" if ys[0] else "ham")
    assert model.clone().classes == ["ham", "spam"]
    arrays, meta = model.to_checkpoint()
    restored = IncrementalSVC.from_checkpoint(arrays, meta)
    assert restored.predict_one(xs[3]) == model.predict_one(xs[3])
    flipped = "ham" if ys[5] else "spam"
    restored.relabel_one(5, flipped)
    assert restored.stored_point(5)[1] == flipped
    with pytest.raises(ValueError, match="not one of the classes"):
        restored.relabel_one(5, True)
    assert restored.stored_point(5)[1] == flipped


def test_string_labels_in_a_river_pipeline():
    xs, ys = _points(60, seed=3)
    model = compose.Pipeline(
        preprocessing.StandardScaler(), IncrementalSVC(C=1.0, gamma=0.5, classes=["no", "yes"])
    )
    correct = 0
    for x, y in zip(xs, ys, strict=True):
        label = "yes" if y else "no"
        correct += model.predict_one(x) == label
        model.learn_one(x, label)
    assert correct >= 45


# ------------------------------------------------------------------------------ LS-SVM keys


def _lssvm_close(a, b, xs):
    return max(abs(a.decision_function_one(x) - b.decision_function_one(x)) for x in xs)


@pytest.mark.parametrize("features", ["linear", "rff"])
def test_lssvm_forget_and_relabel_by_key_equal_the_model_without_the_sample(features):
    xs, ys = _points(30, seed=1)
    params = {"rho": 0.3, "features": features, "n_components": 30, "gamma": 0.5, "seed": 2}
    keyed = IncrementalLSSVC(**params)
    for i, (x, y) in enumerate(zip(xs, ys, strict=True)):
        keyed.learn_one(x, y, key=f"k{i}")
    keyed.forget_one(key="k4")
    keyed.relabel_one("k7", not ys[7])
    reference = IncrementalLSSVC(**params)
    for i, (x, y) in enumerate(zip(xs, ys, strict=True)):
        if i != 4:
            reference.learn_one(x, (not y) if i == 7 else y)
    assert _lssvm_close(keyed, reference, xs) < 1e-10
    assert "k4" not in keyed and "k7" in keyed
    assert keyed.stored_point("k7") == (xs[7], not ys[7])
    assert keyed.n_samples_ == 29


def test_lssvm_key_errors_change_nothing():
    model = IncrementalLSSVR(rho=0.5)
    model.learn_one({"a": 1.0}, 2.0, key="p")
    before = model.to_checkpoint()[0]["solution"].copy()
    with pytest.raises(KeyError, match="already learned"):
        model.learn_one({"a": 3.0}, 1.0, key="p")
    with pytest.raises(KeyError, match="no sample"):
        model.forget_one(key="q")
    with pytest.raises(ValueError, match="not both"):
        model.forget_one({"a": 1.0}, 2.0, key="p")
    with pytest.raises(ValueError, match="must be finite"):
        model.relabel_one("p", float("nan"))
    np.testing.assert_array_equal(model.to_checkpoint()[0]["solution"], before)
    assert model.stored_point("p") == ({"a": 1.0}, 2.0) and model.n_samples_ == 1


def test_lssvm_learn_many_and_forget_many_by_keys():
    xs, _ = _points(20, seed=4)
    targets = [float(x["a"] - x["b"]) for x in xs]
    model = IncrementalLSSVR(rho=0.2)
    model.learn_many(pd.DataFrame(xs), pd.Series(targets), keys=range(20))
    with pytest.raises(KeyError, match="key 3 is listed twice for removal"):
        model.forget_many(keys=[3, 5, 3])  # (as the SVMs refuse it)
    model.forget_many(keys=[3, 5])
    reference = IncrementalLSSVR(rho=0.2)
    keep = [i for i in range(20) if i not in (3, 5)]
    reference.learn_many(pd.DataFrame([xs[i] for i in keep]), pd.Series([targets[i] for i in keep]))
    assert _lssvm_close(model, reference, xs) < 1e-10
    assert model.stored_keys() == keep
    with pytest.raises(ValueError, match="keys for"):
        model.learn_many(pd.DataFrame(xs[:2]), pd.Series(targets[:2]), keys=[100])


@pytest.mark.parametrize("cls", [IncrementalLSSVC, IncrementalLSSVR])
@pytest.mark.parametrize("features", ["linear", "rff"])
def test_lssvm_checkpoint_round_trip(cls, features):
    xs, ys = _points(25, seed=5)
    targets = ys if cls is IncrementalLSSVC else [float(x["a"]) for x in xs]
    params = {"rho": 0.4, "features": features, "n_components": 16, "seed": 1}
    if cls is IncrementalLSSVC:
        params["classes"] = ["down", "up"]
        targets = ["up" if t else "down" for t in targets]
    model = cls(**params)
    for i, (x, y) in enumerate(zip(xs, targets, strict=True)):
        model.learn_one(x, y, key=i if i % 2 else None)
    arrays, meta = model.to_checkpoint()
    assert all(a.dtype != object for a in arrays.values())
    restored = cls.from_checkpoint(arrays, meta)
    for x in xs:
        assert restored.decision_function_one(x) == model.decision_function_one(x)
    assert restored.stored_keys() == model.stored_keys()
    assert restored.n_samples_ == model.n_samples_
    restored.forget_one(key=3)
    model.forget_one(key=3)
    assert _lssvm_close(restored, model, xs) == 0.0
    broken = dict(arrays, gram_hi=arrays["gram_hi"][:-1])
    with pytest.raises(ValueError, match="gram_hi"):
        cls.from_checkpoint(broken, meta)


def test_lssvm_feature_bounds():
    model = IncrementalLSSVC(max_features=3, max_new_features=2)
    model.learn_one({"a": 1.0, "b": 1.0}, True)
    with pytest.raises(ValueError, match="max_new_features=2"):
        model.learn_one({"c": 1.0, "d": 1.0, "e": 1.0}, False)
    with pytest.raises(ValueError, match="max_features=3"):
        model.learn_one({"c": 1.0, "d": 1.0}, False)
    assert model.feature_names_ == ["a", "b"] and model.n_samples_ == 1
    model.learn_one({"c": 1.0}, False)
    assert model.feature_names_ == ["a", "b", "c"]
    # Predictions take any number of unknown names.
    model.predict_one({f"z{i}": 1.0 for i in range(100)})
    rff = IncrementalLSSVC(features="rff", max_features=2)
    with pytest.raises(ValueError, match="max_features=2"):
        rff.learn_one({"a": 1.0, "b": 1.0, "c": 1.0}, True)


@pytest.mark.parametrize("window", ["SlidingWindowSVC", "SlidingWindowSVR"])
def test_a_windows_buffered_keys_obey_the_checkpoint_rule_for_keys(window):
    """A key waiting in a window's buffer is checkpointed as a stored one is: an int of numpy's
    comes back as an int through JSON, a tuple as a tuple (JSON would give an unhashable list),
    and a key a checkpoint cannot keep is refused before it is buffered, naming it. A tuple key
    arriving while a numpy int waits in the buffer is compared with it safely."""
    import json

    import stream_svm

    cls = getattr(stream_svm, window)
    label = True if window.endswith("SVC") else 1.0
    model = cls(window_size=5, step=4)
    model.learn_one({"a": 1.0}, label, key="p")
    model.learn_one({"a": 2.0}, label, key=np.int64(7))
    arrays, meta = model.to_checkpoint()
    restored = cls.from_checkpoint(arrays, json.loads(json.dumps(meta)))
    frame = pd.DataFrame({"a": [3.0]}, index=["q"])
    restored.learn_many(frame, pd.Series([label], index=frame.index))  # slides the buffer in
    assert sorted(map(str, restored.stored_keys())) == ["7", "p", "q"]
    assert 7 in restored and np.int64(7) in restored
    model.learn_one({"a": 2.5}, label, key=("r", 1))  # waits in the buffer (step 4)
    assert ("r", 1) in model and model.stored_keys() == []
    arrays, meta = model.to_checkpoint()
    restored = cls.from_checkpoint(arrays, json.loads(json.dumps(meta)))
    assert ("r", 1) in restored and ["r", 1] not in restored.stored_keys()
    restored.learn_one({"a": 3.5}, label, key="s")  # slides the buffer in
    assert ("r", 1) in restored.stored_keys()
    restored.forget_one(key=("r", 1))
    assert ("r", 1) not in restored
    with pytest.raises(TypeError, match=r"key frozenset\(\{'t'\}\) \(a frozenset\) cannot be "
                                        r"checkpointed"):  # (refused before it is buffered)
        model.learn_one({"a": 2.7}, label, key=frozenset({"t"}))
    assert json.loads(json.dumps(model.to_checkpoint()[1]))


@pytest.mark.parametrize("make", ["IncrementalSVC", "SlidingWindowSVC", "IncrementalSVR",
                                  "IncrementalLSSVC"])
def test_keys_from_a_datetime_or_float_index_survive_a_checkpoint(make):
    # learn_many takes its keys from X's index: a DatetimeIndex's Timestamps (and a float
    # index's floats) were learned, then refused by the first to_checkpoint, hours later.
    import datetime
    import json

    import stream_svm

    cls = getattr(stream_svm, make)
    model = cls(window_size=6, step=4) if make.startswith("Sliding") else cls()
    regression = make.endswith("SVR")
    times = pd.date_range("2024-03-30 22:00", periods=5, freq="h", tz="Europe/Paris")
    frame = pd.DataFrame({"a": [1.0, -1.0, 0.5, -0.5, 2.0]}, index=times)
    values = [1.0, -1.0, 0.5, -0.5, 2.0] if regression else [True, False, True, False, True]
    keyed = {"keys": list(times)} if make.endswith("LSSVC") else {}
    model.learn_many(frame, pd.Series(values, index=frame.index), **keyed)
    others = [2.5, float("inf"), pd.Timestamp("2024-01-01 00:00:00.000000001"),
              datetime.datetime(2024, 5, 1, tzinfo=datetime.timezone(datetime.timedelta(hours=-5)))]
    for i, key in enumerate(others):
        model.learn_one({"a": 0.1 * i}, values[i % 2], key=key)  # (a window buffers some)
    arrays, meta = model.to_checkpoint()
    restored = cls.from_checkpoint(arrays, json.loads(json.dumps(meta)))
    probe = {"a": 0.3}
    assert restored.predict_one(probe) == model.predict_one(probe)
    for key in [*times[-2:], *others]:
        assert (key in restored) == (key in model), key
    forgettable = [key for key in [times[-1], 2.5, others[2]] if key in model]
    assert forgettable
    for each in (model, restored):
        each.forget_many(keys=forgettable)
    assert restored.predict_one(probe) == model.predict_one(probe)


@pytest.mark.parametrize("make", ["IncrementalSVC", "SlidingWindowSVR"])
def test_keys_from_a_multiindex_survive_a_checkpoint(make):
    # learn_many takes its keys from X's index: a MultiIndex's tuples (a gauge and a time,
    # say) were learned, then refused by the first to_checkpoint.
    import json

    import stream_svm

    cls = getattr(stream_svm, make)
    model = cls(window_size=5, step=2) if make.startswith("Sliding") else cls()
    stamps = pd.date_range("2024-03-31 01:00", periods=3, freq="h", tz="Europe/Paris")
    index = pd.MultiIndex.from_tuples([("g1", stamps[0]), ("g2", stamps[1]), ("g1", stamps[2])])
    frame = pd.DataFrame({"a": [1.0, -1.0, 0.5]}, index=index)
    labels = [1.0, -1.0, 0.5] if make.endswith("SVR") else [True, False, True]
    model.learn_many(frame, pd.Series(labels, index=index))
    nested = ("g3", (2, 2.5), float("inf"))
    model.learn_one({"a": 0.1}, labels[0], key=nested)
    arrays, meta = model.to_checkpoint()
    restored = cls.from_checkpoint(arrays, json.loads(json.dumps(meta)))
    assert set(restored.stored_keys()) == set(model.stored_keys())
    assert all(type(key) is tuple for key in restored.stored_keys())
    for key in [*index, nested]:
        assert (key in restored) == (key in model), key
    for each in (model, restored):
        each.forget_one(key=index[1])
    probe = {"a": 0.3}
    assert restored.predict_one(probe) == model.predict_one(probe)


@pytest.mark.parametrize("make", [IncrementalSVC, IncrementalSVR,
                                  lambda: SlidingWindowSVC(window_size=5),
                                  lambda: SlidingWindowSVC(window_size=5, step=3)],
                         ids=["svc", "svr", "window", "window step 3"])
@pytest.mark.parametrize("many", [False, True])
def test_a_time_key_that_would_come_back_as_another_key_is_refused_as_it_is_learned(make,
                                                                                     many):
    # A numpy datetime64 to the nanosecond equals the Timestamp a checkpoint gives back, but
    # hashes otherwise: learned, it would not be found again in the restored model. learn_many
    # took it, and every checkpoint then failed; a window took it as an int (the number of
    # nanoseconds it holds), another key.
    model = make()
    label = 1.0 if isinstance(model, IncrementalSVR) else True
    model.learn_one({"a": 1.0}, label, key="p")
    before = model.to_checkpoint()
    key = np.datetime64("2024-01-01T00:00:00.000000001", "ns")
    with pytest.raises(TypeError, match=r"a numpy datetime64 finer than microseconds does not "
                                        r"read back as the same key; pass pd.Timestamp\(key\)"):
        if many:
            model.learn_many(pd.DataFrame({"a": [2.0]}), pd.Series([label]), keys=[key])
        else:
            model.learn_one({"a": 2.0}, label, key=key)
    after = model.to_checkpoint()
    assert after[1] == before[1] and after[0].keys() == before[0].keys()


@pytest.mark.parametrize("key", [np.datetime64("1500-01-01", "s"),
                                 np.datetime64("3000-01-01", "D")])
def test_a_time_key_beyond_what_a_checkpoint_keeps_says_so(key):
    """Not the advice for a nanosecond datetime64 (pd.Timestamp(key) is refused as well)."""
    model = IncrementalSVC()
    with pytest.raises(TypeError, match=r"a checkpoint keeps times from 1677-09-21 .* to "
                                        r"2262-04-11 .*; use str keys"):
        model.learn_one({"a": 1.0}, True, key=key)
    assert model.n_stored == 0


def test_a_time_key_in_a_time_zone_without_a_name_is_refused_as_any_other_key():
    # A dateutil time zone's str (tzfile('/usr/share/zoneinfo/Europe/Paris')) is no name a
    # checkpoint can give back: zoneinfo's KeyError escaped the key check, where the docs say
    # TypeError, the advice with it.
    tz = pytest.importorskip("dateutil.tz")
    zone = tz.gettz("Europe/Paris")
    if zone is None:
        pytest.skip("no time zone database for dateutil here")
    model = IncrementalSVC()
    key = pd.Timestamp("2024-01-01 10:00", tz=zone)
    with pytest.raises(TypeError, match=r"does not read back as the same key; use a time zone "
                                        r"by name \(e.g. 'UTC', 'Europe/Paris'\)"):
        model.learn_one({"a": 1.0}, True, key=key)
    assert model.n_stored == 0
    model.learn_one({"a": 1.0}, True, key=key.tz_convert("Europe/Paris"))  # (the advice)
    assert key in IncrementalSVC.from_checkpoint(*model.to_checkpoint())


def test_a_key_a_checkpoint_cannot_keep_is_named_with_its_type_and_the_fix():
    model = IncrementalSVC()
    with pytest.raises(TypeError, match=r"\(a frozenset\).*keeps str, int, float and timestamp "
                                        r"keys, and tuples of them.*keys=\[str\(key\) for key in "
                                        r"X\.index\]"):
        model.learn_one({"a": 1.0}, True, key=frozenset({"p"}))
    with pytest.raises(TypeError, match=r"key \('q', True\) cannot be checkpointed: key True "
                                        r"\(a bool\)"):
        model.learn_one({"a": -1.0}, False, key=("q", True))
    assert model.n_stored == 0
    fixed = IncrementalSVC()
    frame = pd.DataFrame({"a": [1.0, -1.0]}, index=[frozenset({"p"}), ("q", True)])
    with pytest.raises(TypeError, match=r"\(a frozenset\)"):
        fixed.learn_many(frame, pd.Series([True, False], index=frame.index))
    keys = [str(key) for key in frame.index]  # (the fix the message gives, as written)
    fixed.learn_many(frame, pd.Series([True, False], index=frame.index), keys=keys)
    restored = IncrementalSVC.from_checkpoint(*fixed.to_checkpoint())
    assert restored.stored_keys() == ["frozenset({'p'})", "('q', True)"]


@pytest.mark.parametrize("make", [IncrementalSVC, IncrementalSVR, IncrementalLSSVC])
def test_forget_many_with_its_arguments_in_the_other_estimators_order_says_so(make):
    """The kernel SVMs take forget_many(keys, X, y), the LS-SVMs forget_many(X, y, keys): a
    call written for the other kind names the argument to pass by name, and changes nothing."""
    X = pd.DataFrame({"a": [0.0, 1.0, 2.0]})
    y = pd.Series([1.0, 0.0, 1.0]) if make is IncrementalSVR else pd.Series([True, False, True])
    model = make()
    model.learn_many(X, y, keys=["k0", "k1", "k2"])
    before = [model.decision_function_one({"a": v}) if make is not IncrementalSVR
              else model.predict_one({"a": v}) for v in (0.0, 1.5)]
    if make is IncrementalLSSVC:
        with pytest.raises(TypeError, match=r"first argument is X, a DataFrame \(got list\)"):
            model.forget_many(["k0", "k1"])
    else:
        with pytest.raises(TypeError, match=r"first argument is keys.*forget_many\(X=X, y=y\)"):
            model.forget_many(X.iloc[:2], y.iloc[:2])
    after = [model.decision_function_one({"a": v}) if make is not IncrementalSVR
             else model.predict_one({"a": v}) for v in (0.0, 1.5)]
    assert after == before
    model.forget_many(keys=["k0", "k1"])  # by name, both kinds take keys
    assert "k2" in model and "k0" not in model


@pytest.mark.parametrize("make", [IncrementalSVC, IncrementalSVR, SlidingWindowSVC,
                                  SlidingWindowSVR, IncrementalLSSVC, IncrementalLSSVR])
def test_a_forget_given_a_key_and_a_value_is_refused_and_forgets_nothing(make):
    """The key and the value may name different points: forgetting the keyed one and keeping
    the other would leave a point the caller asked to erase in the model."""
    regressor = make in (IncrementalSVR, SlidingWindowSVR, IncrementalLSSVR)
    X = pd.DataFrame({"a": [0.0, 1.0, 2.0, 3.0]})
    y = pd.Series([1.0, 0.0, 1.0, 2.0] if regressor else [True, False, True, False])
    model = make(window_size=10) if make in (SlidingWindowSVC, SlidingWindowSVR) else make()
    for i in range(4):
        model.learn_one({"a": X.a[i]}, y[i], key=f"k{i}")
    probes = [{"a": v} for v in (0.5, 2.5)]
    before = [model.predict_one(x) if regressor else model.decision_function_one(x)
              for x in probes]
    with pytest.raises(ValueError, match="forget_one takes a key, or x and y, not both"):
        model.forget_one({"a": 3.0}, y[3], key="k1")
    with pytest.raises(ValueError, match="forget_many takes keys, or X and y, not both"):
        model.forget_many(keys=["k1"], X=X.iloc[[3]], y=y.iloc[[3]])
    after = [model.predict_one(x) if regressor else model.decision_function_one(x)
             for x in probes]
    assert after == before
    assert all(f"k{i}" in model for i in range(4))


@pytest.mark.parametrize("make", [IncrementalSVC, IncrementalSVR, SlidingWindowSVC,
                                  IncrementalLSSVC])
def test_a_nan_key_is_refused_and_changes_nothing(make):
    """An id column with missing values gives NaN keys, which equal nothing, themselves
    included: repeats would go unseen and no forget could find the point again."""
    y = [1.0, 0.0, 1.0] if make is IncrementalSVR else [True, False, True]
    model = make()
    model.learn_one({"a": 5.0}, y[0], key="kept")
    indexed = pd.DataFrame({"a": [0.1, 0.5, 0.9]}, index=pd.Index([1.0, np.nan, np.nan]))
    attempts = [lambda: model.learn_one({"a": 1.0}, y[0], key=float("nan")),
                lambda: model.learn_many(indexed.reset_index(drop=True), pd.Series(y),
                                         keys=[1, ("t", np.nan), 2])]
    if make is not IncrementalLSSVC:  # the LS-SVM keeps samples by keys= only
        attempts.append(lambda: model.learn_many(indexed, pd.Series(y, index=indexed.index)))
    for attempt in attempts:
        with pytest.raises(KeyError, match="not equal to itself"):
            attempt()
    stored = model.n_samples_ if make is IncrementalLSSVC else len(model._engine.keys)
    assert stored == 1 and "kept" in model


@pytest.mark.parametrize("make", [IncrementalSVC, IncrementalSVR, SlidingWindowSVC, AlphaISVC,
                                  IncrementalLSSVC, IncrementalLSSVR])
def test_a_parameter_set_after_construction_is_refused_not_ignored(make):
    """The model is set up from its parameters when constructed: assigning one later used to
    change what repr and clone() show while the model went on with the old value."""
    import pickle

    name, value = ("rho", 5.0) if make in (IncrementalLSSVC, IncrementalLSSVR) else ("C", 5.0)
    model = make()
    original = getattr(model, name)
    with pytest.raises(AttributeError, match=rf"{make.__name__}\.{name} is fixed.*clone"):
        setattr(model, name, value)
    assert getattr(model, name) == original
    assert getattr(model.clone({name: value}), name) == value
    assert getattr(pickle.loads(pickle.dumps(model)), name) == original
    model.max_features = 7  # read at every learn: stays settable, as River's mutate says
    model.mutate({"max_new_features": 3})
    assert (model.max_features, model.max_new_features) == (7, 3)
    model.note = "a user's own attribute"


@pytest.mark.parametrize("cls", [IncrementalSVC, SlidingWindowSVC, IncrementalLSSVC])
def test_a_key_with_a_nul_character_is_refused_before_a_checkpoint_loses_it(cls):
    # A checkpoint brought "k\x00" back as "k": another point's key, or a state that no
    # longer restores once both were stored.
    class Text(str):
        pass

    model = cls()
    for key in ("k\x00", Text("k\x00")):
        with pytest.raises(KeyError, match="NUL character"):
            model.learn_one({"a": 1.0}, True, key=key)
    assert "k" not in model and "k\x00" not in model
    model.learn_one({"a": 1.0}, True, key="k")
    assert model.stored_keys() == ["k"]


def test_an_int_key_beyond_64_bits_is_refused_before_a_checkpoint_fails_on_it():
    model = IncrementalSVC()
    with pytest.raises(KeyError, match="does not fit in 64 bits"):
        model.learn_one({"a": 1.0}, True, key=2**70)
    model.learn_one({"a": 1.0}, True, key=-(2**63))
    model.learn_one({"a": -1.0}, False, key=2**63 - 1)
    restored = IncrementalSVC.from_checkpoint(*model.to_checkpoint())
    assert restored.stored_keys() == [-(2**63), 2**63 - 1]


@pytest.mark.parametrize("make,changed", [
    (lambda: IncrementalSVC(C=0.1, gamma=1.0), {"C": 100.0, "gamma": 50.0}),
    (lambda: IncrementalSVC(C=0.1), {"classes": ["ham", "spam"]}),
    (lambda: SlidingWindowSVC(window_size=4), {"window_size": 8}),
    (lambda: IncrementalLSSVC(rho=1.0), {"rho": 3.0}),
])
def test_a_clone_with_what_was_learned_cannot_take_other_fixed_parameters(make, changed):
    # It showed the new parameters and went on learning with the old ones (and wrote a
    # checkpoint it could not read back).
    model = make()
    model.learn_one({"a": 1.0}, True)
    model.learn_one({"a": -1.0}, False)
    with pytest.raises(ValueError, match=f"{sorted(changed)[0]}.* cannot change with it"):
        model.clone(changed, include_attributes=True)
    fresh = model.clone(changed)  # a new, untrained model takes them
    assert all(getattr(fresh, name) == value for name, value in changed.items())
    same = model.clone({**model._get_params(), "max_features": 50}, include_attributes=True)
    assert same.max_features == 50
    assert same.decision_function_one({"a": 0.3}) == model.decision_function_one({"a": 0.3})


@pytest.mark.parametrize("cls", [IncrementalSVC, SlidingWindowSVC, AlphaISVC, IncrementalLSSVC])
@pytest.mark.parametrize("labels", [np.array([0, 1]), np.array([False, True]),
                                    np.array(["ham", "spam"])])
def test_classes_given_as_numpy_scalars_make_json_ready_checkpoints(cls, labels):
    classes = list(np.unique(labels))  # numpy scalars: the everyday idiom
    model = cls(classes=classes)
    _check_json_ready(cls, model, labels)


@pytest.mark.parametrize("cls", [IncrementalSVC, SlidingWindowSVC, AlphaISVC, IncrementalLSSVC])
@pytest.mark.parametrize("labels", [np.array([0, 1]), np.array(["ham", "spam"])])
@pytest.mark.parametrize("kind", ["numpy", "pandas"])
def test_classes_given_as_an_array_are_taken(cls, labels, kind):
    # classes=np.array([...]) (or a column's unique values) raised ValueError where a tuple of
    # the same labels was taken.
    import pandas as pd

    classes = np.unique(labels) if kind == "numpy" else pd.Series(labels).unique()
    model = cls(classes=classes)
    assert model._classes == tuple(labels.tolist())
    _check_json_ready(cls, model, labels)
    assert cls(classes=classes).clone()._classes == model._classes


def _check_json_ready(cls, model, labels) -> None:
    import json

    for value, label in zip([-1.0, 1.0, 2.0, -2.0], labels[[0, 1, 1, 0]], strict=True):
        model.learn_one({"a": value}, label)
    arrays, meta = model.to_checkpoint()
    restored = cls.from_checkpoint(arrays, json.loads(json.dumps(meta)))
    for value in (-1.5, 0.2, 1.5):
        assert restored.predict_one({"a": value}) == model.predict_one({"a": value})


@pytest.mark.parametrize("regression", [False, True])
def test_update_many_names_keys_it_would_forget_and_learn_again(regression):
    # Its refusal said to pass keys=, which failed the same way: one path holds each key once.
    import pandas as pd

    from stream_svm import IncrementalSVC, IncrementalSVR

    rng = np.random.default_rng(0)
    X = pd.DataFrame(rng.normal(size=(12, 2)), columns=["a", "b"],
                     index=[f"id{i}" for i in range(12)])
    y = (X["a"] - X["b"]) if regression else (X["a"] > 0)
    model = IncrementalSVR() if regression else IncrementalSVC()
    model.learn_many(X, y)
    before = model.decision_function_many(X)
    changed = (y.iloc[:3] + 1.0) if regression else ~y.iloc[:3]
    for keys in (None, list(X.index[:3])):
        with pytest.raises(ValueError, match=r"would forget and learn again the key\(s\) 'id0', "
                                             r"'id1', 'id2' in one path"):
            model.update_many(X.iloc[:3], changed, forget_keys=list(X.index[:3]), keys=keys)
    pd.testing.assert_series_equal(model.decision_function_many(X), before)


@pytest.mark.parametrize("make", ["IncrementalSVC", "SlidingWindowSVR", "AlphaISVC",
                                  "IncrementalLSSVC"])
def test_feature_names_a_checkpoint_keeps_are_learned_and_others_refused_at_learn(make):
    # A frame's float column labels, a MultiIndex's tuples or a time were learned, then
    # refused by every to_checkpoint ("use str or int"), hours later; other names (a bool)
    # were learned too, and are now refused when learned, the model unchanged.
    import json

    import stream_svm

    cls = getattr(stream_svm, make)
    model = (cls(window_size=8) if make.startswith("Sliding") else
             cls(batch_size=4) if make == "AlphaISVC" else cls())
    regression = make.endswith("SVR")
    names = [0.5, ("price", "mean"), pd.Timestamp("2024-01-01", tz="UTC"), np.float64(2.5)]
    rng = np.random.default_rng(0)
    frame = pd.DataFrame(rng.normal(size=(8, 4)), columns=names)
    labels = frame[0.5] > 0
    model.learn_many(frame, labels.astype(float) if regression else labels)
    arrays, meta = model.to_checkpoint()
    restored = cls.from_checkpoint(arrays, json.loads(json.dumps(meta)))
    probe = {0.5: 0.3, ("price", "mean"): -0.2, 2.5: 1.0}
    assert restored.predict_one(probe) == model.predict_one(probe)
    with pytest.raises(TypeError, match=r"feature name True \(a bool\) cannot be kept in a "
                                        r"checkpoint"):
        model.learn_one({True: 1.0, 0.5: 1.0}, 1.0 if regression else True)
    # numpy's nanosecond datetime64 holds an int, and came back as one: another name.
    with pytest.raises(TypeError, match=r"\(a datetime64\) cannot be kept in a checkpoint"):
        model.learn_one({np.datetime64("2020-01-01T00:00:00.000000001", "ns"): 1.0},
                        1.0 if regression else True)
    assert model.predict_one(probe) == restored.predict_one(probe)
    assert json.dumps(model.to_checkpoint()[1]) == json.dumps(meta)


KEYED = [
    lambda: IncrementalSVC(C=1.0, gamma=0.5),
    lambda: SlidingWindowSVC(window_size=25, step=1, C=1.0, gamma=0.5),
    lambda: IncrementalSVR(C=1.0, gamma=0.5),
    lambda: IncrementalLSSVR(rho=0.5),
]


@pytest.mark.parametrize("make", KEYED, ids=["IncrementalSVC", "SlidingWindowSVC",
                                            "IncrementalSVR", "IncrementalLSSVR"])
def test_keys_a_checkpoint_cannot_keep_are_refused_as_they_are_learned(make):
    # A key True was learned as 1's twin ("key True is already stored" beside 1, and
    # forget_one(key=True) forgot the point of 1), and a key of bytes or a frozenset was
    # learned, after which every checkpoint of the model failed.
    xs, ys = _points(6)
    model = make()
    label = (lambda y: y) if "SVC" in type(model).__name__ else float
    for i, (x, y) in enumerate(zip(xs[:4], ys[:4], strict=True)):
        model.learn_one(x, label(y), key=i)
    before = (model.to_checkpoint()[1], model.stored_keys())
    for bad, error in ((True, KeyError), (np.False_, KeyError), (b"k", TypeError),
                       (frozenset({7}), TypeError), (("p", b"k"), TypeError)):
        with pytest.raises(error, match=r"boolean|cannot be checkpointed"):
            model.learn_one(xs[4], label(ys[4]), key=bad)
        with pytest.raises(error, match=r"boolean|cannot be checkpointed"):
            model.learn_many(pd.DataFrame(xs[4:6]), pd.Series([label(y) for y in ys[4:6]]),
                             keys=[bad, "fine"])
    for forget in (lambda: model.forget_one(key=True), lambda: model.forget_many(keys=[False]),
                   lambda: model.relabel_one(True, label(ys[0])),
                   lambda: model.stored_point(True)):
        with pytest.raises(KeyError, match=r"True|False"):
            forget()
    assert True not in model and 1 in model
    assert (model.to_checkpoint()[1], model.stored_keys()) == before
    if isinstance(model, IncrementalLSSVR):
        return  # (its learn_many takes no keys from X's index)
    frame = pd.DataFrame(xs[4:6], index=pd.Index([b"a", b"b"], dtype=object))
    with pytest.raises(TypeError, match="cannot be checkpointed"):
        model.learn_many(frame, pd.Series([label(y) for y in ys[4:6]], index=frame.index))
    assert (model.to_checkpoint()[1], model.stored_keys()) == before


@pytest.mark.parametrize("step", [1, 2])
def test_a_boolean_names_no_arrival_waiting_in_a_windows_buffer(step):
    # True == 1: forget_one(key=True) removed the arrival waiting under key 1 (the window's
    # own points, and learn_one(key=True), refuse a boolean as a key).
    window = SlidingWindowSVC(window_size=5, step=step, kernel="linear")
    window.learn_one({"a": 1.0}, True, key=1)
    assert window.n_buffered == (step - 1)
    for call in (lambda: window.forget_one(key=True), lambda: window.forget_many([True]),
                 lambda: window.stored_point(np.True_), lambda: window.relabel_one(True, False)):
        with pytest.raises(KeyError, match="key True"):
            call()
    assert True not in window and 1 in window
    assert window.stored_point(1) == ({"a": 1.0}, True)


@pytest.mark.parametrize("make", [lambda: IncrementalSVC(C=10.0),
                                  lambda: SlidingWindowSVC(window_size=50, step=3),
                                  lambda: __import__("stream_svm").IncrementalSVR(C=10.0),
                                  lambda: __import__("stream_svm").SlidingWindowSVR(
                                      window_size=50, step=3)],
                         ids=["IncrementalSVC", "SlidingWindowSVC", "IncrementalSVR",
                              "SlidingWindowSVR"])
def test_stored_keys_are_oldest_first(make):
    # They came in the engine's storage order, which removals shuffle: a window of 50 listed
    # [99, 100, 102, ..., 119, 70, ..., 98, 101]; the LS-SVMs and AlphaISVC list oldest first.
    model = make()
    regression = "SVR" in type(model).__name__
    for i in range(120):
        value = (i * 7919 % 100) / 50 - 1
        model.learn_one({"a": value}, value if regression else value > 0, key=i)
    keys = model.stored_keys()
    if hasattr(model, "window_size"):
        assert keys == list(range(120 - model.n_buffered - 50, 120 - model.n_buffered))
    else:
        for key in (3, 50, 7):
            model.forget_one(key=key)
        model.relabel_one(5, 0.5 if regression else True)  # counts as new
        keys = model.stored_keys()
        assert keys == [k for k in range(120) if k not in (3, 50, 7, 5)] + [5]


#: A model of each kind that takes keys from a frame's index, with its labels from a frame
#: (windows of 500: they keep every row these tests learn).
FRAME_KEYED = pytest.mark.parametrize("make, y_of", [
    (lambda: IncrementalSVC(C=1.0, gamma=0.5), lambda X: X["a"] > 0),
    (lambda: SlidingWindowSVC(window_size=500, C=1.0, gamma=0.5), lambda X: X["a"] > 0),
    (lambda: IncrementalSVR(C=1.0, gamma=0.5), lambda X: X["b"]),
    (lambda: SlidingWindowSVR(window_size=500, C=1.0, gamma=0.5), lambda X: X["b"]),
], ids=["IncrementalSVC", "SlidingWindowSVC", "IncrementalSVR", "SlidingWindowSVR"])


@FRAME_KEYED
def test_forgetting_a_row_number_of_a_default_index_says_where_the_keys_are(make, y_of):
    # Rows of pandas' default numbering get automatic keys: forget_many(range(100, 110))
    # after learning rows 100-199 said only "no stored point has key 100".
    rows = pd.DataFrame(np.random.default_rng(1).normal(size=(200, 2)), columns=["a", "b"])
    model = make()
    model.learn_many(rows.iloc[100:].reset_index(drop=True), y_of(rows.iloc[100:]).reset_index(
        drop=True))
    stored = model.stored_keys()
    with pytest.raises(KeyError, match=r"has key 100; the points learned without a key .* "
                       r"automatic keys, such as AutoKey\(number=\d+\): stored_keys\(\) lists"):
        model.forget_many(list(range(100, 110)))
    assert model.stored_keys() == stored
    # Learned under keys of its own, the model has nothing to explain.
    named = make()
    named.learn_one({"a": 1.0, "b": 0.5}, y_of(pd.DataFrame({"a": [1.0], "b": [0.5]}))[0],
                    key="k")
    with pytest.raises(KeyError) as refused:
        named.forget_one(key="z")
    assert "automatic" not in str(refused.value) and "has key 'z'" in str(refused.value)


def test_an_lssvm_asked_for_a_key_it_never_kept_says_how_to_forget_keyless_samples():
    rows = pd.DataFrame(np.random.default_rng(2).normal(size=(20, 2)), columns=["a", "b"])
    model = IncrementalLSSVC()
    model.learn_many(rows, rows["a"] > 0)
    before = model.decision_function_one({"a": 0.3, "b": -0.1})
    with pytest.raises(KeyError, match=r"no sample is learned under key 0; 20 sample\(s\) were "
                       r"learned without keys .* forget them by value, forget_one\(x, y\)"):
        model.forget_one(key=0)
    assert model.decision_function_one({"a": 0.3, "b": -0.1}) == before


@FRAME_KEYED
def test_a_named_index_of_consecutive_ids_names_the_rows(make, y_of):
    # pandas 3 stores a column of consecutive integers made the index as a RangeIndex, which
    # was taken for pandas' own numbering: the ids were dropped for automatic keys, and
    # forgetting by id failed ("no stored point has key 5000").
    frame = pd.DataFrame(np.random.default_rng(2).normal(size=(200, 2)), columns=["a", "b"])
    frame["id"] = range(5000, 5200)
    rows = frame.set_index("id")
    assert rows.index.name == "id"  # (a RangeIndex in pandas 3, an Index in pandas 2)
    model = make()
    model.learn_many(rows, y_of(rows))
    assert model.stored_keys() == list(range(5000, 5200))
    model.forget_many(rows.index[100:110])
    twin = make()
    kept = rows.drop(index=rows.index[100:110])
    twin.learn_many(kept, y_of(kept))
    probe = {"a": 0.2, "b": -0.1}
    assert model.stored_keys() == twin.stored_keys()
    decision = getattr(model, "decision_function_one", model.predict_one)(probe)
    assert decision == pytest.approx(
        getattr(twin, "decision_function_one", twin.predict_one)(probe), abs=1e-9)
    # An unnamed slice of pandas' own numbering still gives automatic keys.
    numbered = make()
    numbered.learn_many(frame[["a", "b"]].iloc[100:], y_of(frame.iloc[100:]))
    assert 100 not in numbered.stored_keys() and len(numbered.stored_keys()) == 100
