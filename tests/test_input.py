import math

import numpy as np
import pytest

from stream_svm._input import FeatureSpace, check_findable_keys, parse_binary_label


@pytest.mark.parametrize("y,expected", [(True, 1.0), (1, 1.0), (1.0, 1.0), (np.True_, 1.0),
                                        (False, -1.0), (0, -1.0), (-1, -1.0), (np.int64(-1), -1.0)])
def test_binary_labels(y, expected):
    assert parse_binary_label(y) == expected


@pytest.mark.parametrize("y", [2, "1", None, 0.5, "yes"])
def test_bad_labels_are_named(y):
    with pytest.raises(ValueError, match=repr(y).replace("(", r"\(").replace(".", r"\.")):
        parse_binary_label(y)


def test_feature_space_grows_and_orders():
    space = FeatureSpace()
    _row, new = space.vectorize({"b": 2.0, "a": 1.0, "z": 0.0})
    assert new == ["b", "a"]
    assert space.names == []  # nothing committed yet
    space.add(new)
    row2, new2 = space.vectorize({"a": 3.0, "c": 4.0, "b": math.nan})
    assert row2.tolist() == [0.0, 3.0, 4.0] and new2 == ["c"]


def test_bad_values_named():
    space = FeatureSpace(["a"])
    with pytest.raises(TypeError, match="'a'"):
        space.vectorize({"a": "text"})
    with pytest.raises(ValueError, match="'q' is infinite"):
        space.vectorize({"q": math.inf})
    assert space.names == ["a"]


def test_a_zero_dimensional_array_is_its_number_and_a_vector_is_told_to_split():
    # (A 0-d array was told to go through a OneHotEncoder, and a vector under one name too.)
    space = FeatureSpace(["a"])
    assert space.vectorize({"a": np.array(2.5), "b": np.array(-3, dtype=np.int8)})[0].tolist() \
        == [2.5, -3.0]
    for vector in (np.array([1.0, 2.0]), [1.0, 2.0], (1, 2)):
        with pytest.raises(TypeError, match=r"feature 'v' has the value .*a sequence under one "
                                            r"name, but a feature is one number: give each "
                                            r"element a name of its own \(e.g. "
                                            r"\{'v_0': v\[0\], 'v_1': v\[1\], ...\}\)"):
            space.vectorize({"v": vector})
    with pytest.raises(TypeError, match="non-numeric value array\\('x'"):
        space.vectorize({"a": np.array("x")})
    with pytest.raises(TypeError, match="non-numeric value"):  # (not its masked number)
        space.vectorize({"a": np.ma.masked_array(3.0, mask=True)})
    assert space.names == ["a"]


def test_vectorize_many():
    space = FeatureSpace(["a"])
    matrix, new = space.vectorize_many([{"a": 1, "b": 2}, {"c": 3}])
    assert new == ["b", "c"]
    assert matrix.tolist() == [[1, 2, 0], [0, 0, 3]]


def test_a_numeric_frame_vectorizes_as_its_rows_do():
    """The fast path for DataFrames gives the matrix and the new names (in first-seen order)
    that vectorizing the rows one by one gives; frames it cannot take fall back."""
    import pandas as pd

    rng = np.random.default_rng(0)
    for trial in range(200):
        known = [f"k{i}" for i in range(int(rng.integers(0, 4)))]
        columns = list(rng.permutation(known + [f"n{i}" for i in range(int(rng.integers(0, 4)))]))
        values = rng.standard_normal((int(rng.integers(1, 6)), len(columns)))
        values[rng.random(values.shape) < 0.4] = 0.0
        values[rng.random(values.shape) < 0.1] = np.nan
        frame = pd.DataFrame(values, columns=columns)
        if trial % 3 == 0 and columns:
            frame[columns[0]] = rng.integers(-3, 3, len(frame))  # an int column
        space = FeatureSpace(known)
        fast = space.vectorize_frame(frame)
        slow = space.vectorize_many(frame.to_dict(orient="records"))
        assert fast is not None
        np.testing.assert_array_equal(fast[0], slow[0])
        assert fast[1] == slow[1]
    space = FeatureSpace(["a"])
    assert space.vectorize_frame(pd.DataFrame({"a": [1.0], "b": [True]})) is None
    assert space.vectorize_frame(pd.DataFrame({"a": ["x"]})) is None
    assert space.vectorize_frame(pd.DataFrame({"a": [np.inf]})) is None


def _paired_models():
    import stream_svm as s

    return [
        (s.IncrementalSVC(), False), (s.SlidingWindowSVC(window_size=10, step=1), False),
        (s.AlphaISVC(), False), (s.IncrementalLSSVC(), False),
        (s.IncrementalSVR(), True), (s.SlidingWindowSVR(window_size=10, step=1), True),
        (s.IncrementalLSSVR(), True),
    ]


@pytest.mark.parametrize("model,regression", _paired_models(),
                         ids=lambda v: type(v).__name__ if not isinstance(v, bool) else "")
def test_learn_many_refuses_labels_indexed_in_another_order(model, regression):
    """y pairs with X's rows by position: when both are indexed by labels of their own, a y in
    another order would teach each row another row's label. Every estimator refuses it, naming
    the index, and learns nothing; the same index in the same order, or a y numbered 0, 1, ...
    (pandas' default), is learned."""
    import pandas as pd

    X = pd.DataFrame({"a": [0.0, 1.0, 2.0, 3.0]}, index=["p", "q", "r", "s"])
    values = [0.5, 1.5, 2.5, 3.5] if regression else [True, True, False, False]
    shuffled = pd.Series(values, index=["p", "q", "r", "s"]).loc[["s", "r", "q", "p"]]
    probe = {"a": 0.5}
    before = model.predict_one(probe)
    with pytest.raises(ValueError, match="index is not X's"):
        model.learn_many(X, shuffled)
    assert model.predict_one(probe) == before
    model.learn_many(X, shuffled.loc[X.index])
    after_labelled = model.predict_one(probe)
    numbered = model.clone()
    numbered.learn_many(X, pd.Series(values))
    assert numbered.predict_one(probe) == after_labelled


@pytest.mark.parametrize("model,regression", _paired_models(),
                         ids=lambda v: type(v).__name__ if not isinstance(v, bool) else "")
def test_learn_many_pairs_by_position_where_one_side_is_numbered(model, regression):
    """Workflows whose y pairs with X's rows by position though their indexes differ, all
    learned: mini-batches of a frame indexed by date against a y numbered 0, 1, ... (its iloc
    slices keep ranges 25, 26, ...), and a shuffled frame against labels computed from it."""
    import pandas as pd

    rng = np.random.default_rng(4)
    X = pd.DataFrame(rng.normal(size=(50, 2)), columns=["a", "b"],
                     index=pd.date_range("2026-01-01", periods=50, freq="D"))
    values = X["a"].to_numpy() * 2.0 if regression else (X["a"] > 0).to_numpy()
    y = pd.Series(values)
    for start in range(0, 50, 25):
        model.learn_many(X.iloc[start : start + 25], y.iloc[start : start + 25])
    shuffled = X.reset_index(drop=True).sample(frac=1, random_state=0)
    labels = shuffled["a"] * 2.0 if regression else shuffled["a"] > 0
    model.clone().learn_many(shuffled, labels)
    model.clone().learn_many(shuffled, labels.to_numpy())
    # A fresh numbering beside a slice of another (a Series built from a list of values
    # computed for the slice): by position.
    model.clone().learn_many(X.reset_index(drop=True).iloc[10:20], pd.Series(list(values[10:20])))
    # A MultiIndex beside a numbering: by position.
    multi = X.reset_index(drop=True).iloc[:4]
    multi.index = pd.MultiIndex.from_tuples([("s", i) for i in range(4)])
    model.clone().learn_many(multi, pd.Series(list(values[:4])))


@pytest.mark.parametrize("model,regression", _paired_models(),
                         ids=lambda v: type(v).__name__ if not isinstance(v, bool) else "")
def test_learn_many_refuses_numbered_rows_that_would_pair_wrongly(model, regression):
    """pandas' numbering pairs by position except where its numbers are rows' labels that
    disagree: a shuffled frame against the column it was shuffled from (paired by position,
    54 of 100 rows learned another row's label), a slice against the same slice sorted, two
    slices of different ranges. Each is refused, naming the index, and learns nothing."""
    import pandas as pd

    rng = np.random.default_rng(5)
    frame = pd.DataFrame(rng.normal(size=(300, 2)), columns=["a", "b"])
    frame["y"] = frame["a"] * 2.0 if regression else frame["a"] * frame["b"] > 0
    X, y = frame[["a", "b"]], frame["y"]
    probe = {"a": 0.3, "b": -0.2}

    def answer() -> object:
        return model.predict_one(probe) if regression else model.predict_proba_one(probe)

    before = answer()
    shuffled = X.sample(frac=1, random_state=1)
    reversed_ = frame.sort_values("a", ascending=False).reset_index(drop=True)
    reversed_ = reversed_.sort_values("a")  # (a RangeIndex 299, 298, ..., 0)
    wrong = [(shuffled, y), (X.iloc[100:200], y.iloc[100:200].sort_values()),
             (X.iloc[100:200], y.iloc[200:300]), (X.iloc[1::2], y.iloc[::2]),
             (reversed_[["a", "b"]], reversed_["y"].reset_index(drop=True)),
             (X, y.sample(frac=1, random_state=2))]
    assert isinstance(reversed_.index, pd.RangeIndex) and reversed_.index.step == -1
    for rows, labels in wrong:
        with pytest.raises(ValueError, match=r"y's index (is not X's|holds the same numbers as "
                                             r"X's in another order)"):
            model.learn_many(rows, labels)
        assert answer() == before
    # A frame rebuilt from an array (numbered afresh) against a shuffled column pairs right
    # by position, a shuffled frame against its original column does not: which one is meant
    # cannot be told, and the message gives both.
    with pytest.raises(ValueError, match=r"If X's rows are in y's order \(X built from an "
                                         r"array, say\), pass y\.to_numpy\(\)"):
        model.learn_many(pd.DataFrame(shuffled.to_numpy(), columns=["a", "b"]),
                         y.loc[shuffled.index])
    assert answer() == before
    model.learn_many(shuffled, y.loc[shuffled.index])
    assert answer() != before


@pytest.mark.parametrize("window", [False, True])
def test_keys_taken_from_an_index_name_it_when_they_repeat(window):
    """Without keys=, a frame's own index (a filtered frame keeps its rows' labels) gives the
    keys: a second batch whose index repeats the first's is refused with a message that says
    where the keys came from and what to do, and changes nothing."""
    import pandas as pd

    from stream_svm import IncrementalSVC, SlidingWindowSVC

    model = SlidingWindowSVC(window_size=30, step=5) if window else IncrementalSVC()
    rng = np.random.default_rng(0)
    frame = pd.DataFrame(rng.normal(size=(20, 2)), columns=["a", "b"])
    first = frame[frame.a > -1]
    model.learn_many(first, first.a * first.b > 0)
    probe = {"a": 0.3, "b": -0.2}
    before = (model.predict_proba_one(probe), len(model.stored_keys()))
    again = frame[frame.b > -1]
    with pytest.raises(KeyError, match=r"of X's index is already in the model.*"
                                       r"reset_index\(drop=True\)"):
        model.learn_many(again, again.a * again.b > 0)
    assert (model.predict_proba_one(probe), len(model.stored_keys())) == before
    repeated = pd.concat([first.iloc[:2], first.iloc[:1]])
    with pytest.raises(KeyError, match="repeats in X's index"):
        model.clone().learn_many(repeated, repeated.a > 0)
    model.learn_many(again.reset_index(drop=True), again.a * again.b > 0)


@pytest.mark.parametrize("model", ["IncrementalSVC", "IncrementalLSSVC"])
def test_minus_one_labels_without_classes_warn_once_at_the_callers_line(model, monkeypatch):
    """-1 learns as the negative class, but predictions are False/True: River's metrics would
    count each negative prediction as a miss. The first -1 warns, pointing to classes=[-1, 1],
    at the user's line; with classes=[-1, 1] predictions are -1 and 1 and nothing warns."""
    import warnings

    import pandas as pd

    import stream_svm
    from stream_svm import _input

    monkeypatch.setattr(_input, "_minus_one_warned", False)
    cls = getattr(stream_svm, model)
    learner = cls()
    with pytest.warns(UserWarning, match=r"classes=\[-1, 1\]") as caught:
        learner.learn_many(pd.DataFrame({"a": [0.0, 1.0, 2.0]}), pd.Series([-1, 1, -1]))
    assert len(caught) == 1 and caught[0].filename == __file__
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        learner.learn_one({"a": 3.0}, -1)  # once per process
        monkeypatch.setattr(_input, "_minus_one_warned", False)
        learner.learn_one({"a": 4.0}, 0)  # 0 equals False: nothing to warn about
        explicit = cls(classes=[-1, 1])
        for x, y in [(0.0, -1), (1.0, 1), (2.0, -1), (3.0, 1)]:
            explicit.learn_one({"a": x}, y)
        assert {explicit.predict_one({"a": 0.0}), explicit.predict_one({"a": 3.0})} <= {-1, 1}


@pytest.mark.parametrize("key", [math.nan, ("t", math.nan), ("t", ("u", math.nan)),
                                 (1, np.float64("nan")), ("t", (2, (3, float("nan"))))])
def test_a_key_holding_nan_anywhere_is_refused(key):
    with pytest.raises(KeyError, match="not equal to itself"):
        check_findable_keys([1, key])


@pytest.mark.parametrize("key", [(1, "a", b"b", True), (), ("t", (1, 2)), (np.int64(3), "x"),
                                 1.5])
def test_keys_equal_to_themselves_pass(key):
    check_findable_keys(["a", key])


def test_pandas_missing_values_are_missing_one_row_at_a_time_as_in_a_batch():
    # A nullable column's rows hold pd.NA (pd.NaT for times): learn_many read them as
    # missing, learn_one refused them as non-numeric, with a hint to encode them.
    import pandas as pd
    from river import stream

    from stream_svm import IncrementalSVC

    X = pd.DataFrame({"a": [1.0, None, -1.0, 0.5] * 5, "b": [1, 2, 3, 4] * 5}).convert_dtypes()
    y = pd.Series([True, False, False, True] * 5)
    batch, single = IncrementalSVC(), IncrementalSVC()
    batch.learn_many(X, y)
    rows = list(stream.iter_pandas(X, y))
    assert rows[1][0]["a"] is pd.NA
    for x, label in rows:
        single.learn_one(x, label)
    probe = {"a": pd.NA, "b": 2}
    assert single.decision_function_one(probe) == pytest.approx(
        batch.decision_function_one({"b": 2}), abs=1e-9)
    assert single.decision_function_one({"a": pd.NaT, "b": 2}) == \
        single.decision_function_one({"b": 2})


@pytest.mark.parametrize("name", ["IncrementalSVC", "IncrementalLSSVC", "IncrementalSVR",
                                  "IncrementalLSSVR"])
def test_decimal_features_are_numbers_and_numpy_names_are_checkpointed(name):
    # A Decimal (a database's NUMERIC column, as pd.read_sql gives it) was refused as
    # "non-numeric ... (e.g. OneHotEncoder)"; np.int64 names (columns from np.arange) were
    # learned, then refused by to_checkpoint.
    from decimal import Decimal

    import pandas as pd

    import stream_svm

    cls = getattr(stream_svm, name)
    label = (lambda v: v) if name.endswith("R") else (lambda v: v > 0)
    as_decimal, as_float = cls(), cls()
    for value in (1.5, -1.5, 0.25, -0.75):
        as_decimal.learn_one({"a": Decimal(str(value))}, label(value))
        as_float.learn_one({"a": value}, label(value))
    assert as_decimal.predict_one({"a": Decimal("0.5")}) == as_float.predict_one({"a": 0.5})
    with pytest.raises(ValueError, match="feature 'a' is infinite"):
        as_decimal.learn_one({"a": Decimal("Infinity")}, label(1.0))
    numbered = cls()
    X = pd.DataFrame(np.array([[1.0, 0.5], [-1.0, 0.2], [0.5, -0.3]]), columns=np.arange(2))
    numbered.learn_many(X, pd.Series([label(1.0), label(-1.0), label(0.5)]))
    arrays, meta = numbered.to_checkpoint()
    assert meta["features"] == [0, 1] and all(type(n) is int for n in meta["features"])
    restored = cls.from_checkpoint(arrays, meta)
    assert restored.predict_one({0: 0.7, 1: 0.1}) == numbered.predict_one({0: 0.7, 1: 0.1})


@pytest.mark.parametrize("name", ["IncrementalLSSVC", "IncrementalLSSVR"])
def test_an_ls_svm_names_a_list_given_to_its_many_methods(name):
    import stream_svm

    model = getattr(stream_svm, name)()
    methods = ["predict_many", "decision_function_many"] + (
        ["predict_proba_many"] if name.endswith("C") else [])
    for method in methods:  # a TypeError from inside pandas before
        with pytest.raises(TypeError, match="X must be a pandas DataFrame, got list"):
            getattr(model, method)([{"a": 1.0}])


def test_features_whose_kernel_underflows_leave_no_numpy_warning():
    # A linear kernel on features of 1e-160 (products of 1e-320) let "invalid value encountered
    # in scalar divide" out of the engine, for updates it then accepted or refused by name.
    import warnings

    from stream_svm import IncrementalSVC

    model = IncrementalSVC(kernel="linear")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for value, label in [(1e-160, True), (-1e-160, False), (2e-160, True),
                             (0.5e-160, False)]:
            try:
                model.learn_one({"a": value}, label)
            except ValueError:
                pass  # a refusal names its cause; what matters is no stray warning


@pytest.mark.parametrize("model,regression", _paired_models(),
                         ids=lambda v: type(v).__name__ if not isinstance(v, bool) else "")
def test_a_prediction_warns_of_a_feature_written_as_a_learned_one_but_another_key(model,
                                                                                  regression):
    """A frame built from an array names its columns 0, 1: predicting with "0", "1" read
    every feature as missing and gave one answer for every input, silently. It warns, naming
    both; a feature the model never learned under any spelling does not warn."""
    import warnings

    import pandas as pd

    rng = np.random.default_rng(3)
    values = rng.normal(size=(60, 2))
    labels = values[:, 0] * 2.0 if regression else values[:, 0] > 0
    model.learn_many(pd.DataFrame(values), pd.Series(labels))

    def answer(x):
        return model.predict_one(x) if regression else model.predict_proba_one(x)

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        unseen = answer({"unseen": 1.5, 1: 0.5})
        model.predict_many(pd.DataFrame({0: [1.5], 1: [0.5]}))
    with pytest.warns(UserWarning, match=r"feature '0' \(str\) is not one of those the model "
                                         r"learned, but 0 \(int\) is"):
        assert answer({"0": 1.5, 1: 0.5}) == unseen != answer({0: 1.5, 1: 0.5})
    with pytest.warns(UserWarning, match=r"feature '1' \(str\)"):
        model.predict_many(pd.DataFrame({"1": [0.5]}))
