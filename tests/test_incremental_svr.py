"""IncrementalSVR: River conventions, exactness against libsvm's SVR, exact LOO, forgetting,
checkpoints, bad input."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pandas as pd
import pytest

from stream_svm import AutoKey, ConvergenceError, IncrementalSVR, SlidingWindowSVR
from stream_svm.kernels import make_kernel
from tests.river_checks import run_river_checks
from tests.test_engine_regression import RegressionOptimum


def sinc_stream(n: int, seed: int) -> list[tuple[dict, float]]:
    rng = np.random.default_rng(seed)
    X = rng.uniform(-4, 4, (n, 2))
    t = np.sinc(X[:, 0]) + 0.3 * X[:, 1] + 0.05 * rng.standard_normal(n)
    return [({"u": float(a), "v": float(b)}, float(target))
            for (a, b), target in zip(X, t, strict=True)]


def assert_exact(model: IncrementalSVR, probes: list[dict], tol: float = 1e-8) -> None:
    """Predictions equal the batch epsilon-SVR optimum on exactly the stored samples."""
    keys = model.stored_keys()
    names = ["u", "v"]
    X = np.array([[model.stored_point(k)[0].get(name, 0.0) for name in names] for k in keys])
    t = np.array([model.stored_point(k)[1] for k in keys])
    kernel = make_kernel(model.kernel, gamma=model.gamma)
    oracle = RegressionOptimum(kernel, X, t, model.C, model.epsilon)
    Q = np.array([[p.get(name, 0.0) for name in names] for p in probes])
    ours = np.array([model.predict_one(p) for p in probes])
    theirs = oracle.decision(Q)
    if model.n_margin == 0 or not oracle.b_unique:
        ours, theirs = ours - model.intercept, theirs - oracle.b
    assert np.abs(ours - theirs).max() <= tol * (1 + np.abs(theirs).max())


@pytest.mark.parametrize("estimator", [
    pytest.param(IncrementalSVR(**params), id=f"IncrementalSVR({params})")
    for params in IncrementalSVR._unit_test_params()
])
def test_river_estimator_checks(estimator):
    run_river_checks(estimator, at_least=11)


def test_learning_and_forgetting_stay_the_batch_optimum():
    stream = sinc_stream(90, 1)
    probes = [x for x, _ in sinc_stream(25, 2)]
    model = IncrementalSVR(C=0.5, epsilon=0.05, gamma=0.5)
    for i, (x, t) in enumerate(stream[:40]):
        model.learn_one(x, t, key=i)
    assert_exact(model, probes)
    for i in range(0, 40, 3):
        model.forget_one(key=i)
    assert_exact(model, probes)
    # (A RangeIndex carries no identity: keys are given.)
    frame = pd.DataFrame([x for x, _ in stream[40:70]])
    model.learn_many(frame, pd.Series([t for _, t in stream[40:70]]), keys=range(40, 70))
    assert_exact(model, probes)
    frame = pd.DataFrame([x for x, _ in stream[70:]], index=pd.Index(list(range(70, 90))))
    model.update_many(frame, pd.Series([t for _, t in stream[70:]], index=frame.index),
                      forget_keys=list(range(40, 60)))
    assert 75 in model and 45 not in model
    assert_exact(model, probes)
    assert model.n_stored == 90 - 14 - 20
    assert model.n_margin + model.n_error + model.n_inside == model.n_stored
    assert model.n_margin > 0 and model.n_error > 0 and model.n_inside > 0


def test_learn_then_forget_gives_the_model_back():
    stream = sinc_stream(60, 3)
    model = IncrementalSVR(C=5.0, epsilon=0.1, gamma=0.3)
    for i, (x, t) in enumerate(stream[:50]):
        model.learn_one(x, t, key=i)
    probes = [x for x, _ in stream[50:]]
    before = [model.predict_one(x) for x in probes]
    for i, (x, t) in enumerate(stream[50:]):
        model.learn_one(x, t + 2.0, key=f"new{i}")
    assert max(abs(a - model.predict_one(x)) for a, x in zip(before, probes, strict=True)) > 1e-2
    for i in range(10):
        model.forget_one(key=f"new{i}")
    after = [model.predict_one(x) for x in probes]
    np.testing.assert_allclose(after, before, atol=1e-9)


def test_loo_error_equals_retraining_without_each_sample():
    stream = sinc_stream(30, 4)
    model = IncrementalSVR(C=10.0, epsilon=0.1, gamma=0.5)
    for i, (x, t) in enumerate(stream):
        model.learn_one(x, t, key=i)
    brute = []
    for i, (x, t) in enumerate(stream):
        other = IncrementalSVR(C=10.0, epsilon=0.1, gamma=0.5)
        for j, (x2, t2) in enumerate(stream):
            if j != i:
                other.learn_one(x2, t2, key=j)
        brute.append(abs(t - other.predict_one(x)))
    before = model.predict_one(stream[0][0])
    assert model.loo_error() == pytest.approx(float(np.mean(brute)), rel=1e-9)
    assert model.predict_one(stream[0][0]) == before  # restored exactly


def test_forget_by_value_takes_the_oldest_equal_sample():
    model = IncrementalSVR(C=1.0, epsilon=0.0, kernel="linear")
    model.learn_one({"a": 1.0}, 2.0, key="first")
    model.learn_one({"a": 1.0}, 2.0, key="second")
    model.learn_one({"a": 1.0}, 3.0, key="other target")
    model.forget_one({"a": 1.0}, 2.0)
    assert model.stored_keys() == ["second", "other target"] or set(model.stored_keys()) == {
        "second", "other target"}
    with pytest.raises(KeyError, match="no stored sample equals"):
        model.forget_one({"a": 1.0}, 5.0)


def test_bad_input_changes_nothing():
    model = IncrementalSVR(C=1.0)
    model.learn_one({"a": 1.0}, 1.0, key="k")
    state = model.to_checkpoint()[0]
    with pytest.raises(TypeError, match="real number"):
        model.learn_one({"a": 2.0}, "high")
    with pytest.raises(TypeError, match="real number"):
        model.learn_one({"a": 2.0}, True)
    with pytest.raises(ValueError, match="finite"):
        model.learn_one({"a": 2.0}, math.nan)
    with pytest.raises(ValueError, match=r"target must be finite, got 1000.*\(401 digits\)"):
        model.learn_one({"a": 2.0}, 10**400)
    with pytest.raises(KeyError, match="already stored"):
        model.learn_one({"a": 2.0}, 1.0, key="k")
    with pytest.raises(KeyError, match="no stored sample has key"):
        model.forget_one(key="missing")
    with pytest.raises(ValueError, match="epsilon must be a finite number >= 0"):
        IncrementalSVR(epsilon=-0.1)
    # (2 epsilon overflowed, and b, every target inside the tube, came out at -epsilon.)
    for cls in (IncrementalSVR, SlidingWindowSVR):
        with pytest.raises(ValueError, match="epsilon must be at most 1e"):
            cls(epsilon=9e307)
        with warnings.catch_warnings():  # (compared as a float32, the bound overflowed)
            warnings.simplefilter("error")
            cls(epsilon=np.float32(0.1))
    after = model.to_checkpoint()[0]
    assert state.keys() == after.keys()
    assert all(np.array_equal(state[name], after[name]) for name in state)


def test_checkpoint_round_trip_reproduces_predictions_bit_for_bit():
    stream = sinc_stream(40, 5)
    model = IncrementalSVR(C=3.0, epsilon=0.05, gamma=0.4)
    for i, (x, t) in enumerate(stream):
        model.learn_one(x, t, key=(f"s{i}" if i % 2 else None))
    model.forget_one(key="s3")
    arrays, meta = model.to_checkpoint()
    clone = IncrementalSVR.from_checkpoint(arrays, meta)
    probes = [x for x, _ in sinc_stream(20, 6)]
    assert [clone.predict_one(x) for x in probes] == [model.predict_one(x) for x in probes]
    assert clone.stored_keys() == model.stored_keys()
    assert any(isinstance(key, AutoKey) for key in clone.stored_keys())
    assert clone.stored_point("s5") == model.stored_point("s5")
    clone.learn_one(*stream[0], key="after")  # keeps learning
    broken = dict(arrays, target=arrays["target"][:-1])
    with pytest.raises(ValueError, match="targets do not match its keys"):
        IncrementalSVR.from_checkpoint(broken, meta)


def test_reserve_epsilon_forgets_only_samples_deep_inside_the_tube():
    stream = sinc_stream(80, 7)
    exact = IncrementalSVR(C=10.0, epsilon=0.3, gamma=0.5)
    bounded = IncrementalSVR(C=10.0, epsilon=0.3, gamma=0.5, reserve_epsilon=0.1)
    for i, (x, t) in enumerate(stream):
        exact.learn_one(x, t, key=i)
    for i, (x, t) in enumerate(stream):
        bounded.learn_one(x, t, key=i)
        # Each discard keeps the solution: the last update's predictions match exactly here.
    assert bounded.reserve_discarded > 0
    assert bounded.n_stored + bounded.reserve_discarded == 80
    # Every sample kept has its two points; dropped ones had both coefficients 0.
    assert set(bounded.dual_coef().index) <= set(bounded.stored_keys())
    probes = [x for x, _ in sinc_stream(10, 8)]
    # Not exact in general (a discarded sample may have re-entered later), but close here.
    assert max(abs(exact.predict_one(x) - bounded.predict_one(x)) for x in probes) < 0.5


def test_dual_coefficients_and_support_vectors():
    model = IncrementalSVR(C=2.0, epsilon=0.1, gamma=0.5)
    for i, (x, t) in enumerate(sinc_stream(30, 9)):
        model.learn_one(x, t, key=i)
    coef = model.dual_coef()
    assert list(coef.index) == list(model.support_vectors().index)
    assert np.all(np.abs(coef) <= 2.0 + 1e-12) and abs(coef.sum()) < 1e-9
    x = {"u": 0.3, "v": -1.0}
    kernel = make_kernel("rbf", gamma=0.5)
    support = model.support_vectors()[["u", "v"]].to_numpy()
    by_hand = kernel(np.array([[0.3, -1.0]]), support)[0] @ coef.to_numpy() + model.intercept
    assert model.predict_one(x) == pytest.approx(by_hand, abs=1e-12)


# ------------------------------------------------------------------------- SlidingWindowSVR
@pytest.mark.parametrize("estimator", [
    pytest.param(SlidingWindowSVR(**params), id=f"SlidingWindowSVR({params})")
    for params in SlidingWindowSVR._unit_test_params()
])
def test_window_river_estimator_checks(estimator):
    run_river_checks(estimator, at_least=11)


@pytest.mark.parametrize("step", [1, 7])
def test_window_is_the_batch_optimum_of_its_latest_samples(step):
    stream = sinc_stream(100, 10)
    model = SlidingWindowSVR(window_size=40, step=step, C=5.0, epsilon=0.05, gamma=0.5)
    single = SlidingWindowSVR(window_size=40, step=step, strategy="single", C=5.0,
                              epsilon=0.05, gamma=0.5)
    for i, (x, t) in enumerate(stream):
        model.learn_one(x, t, key=i)
        single.learn_one(x, t, key=i)
    in_window = 100 - model.n_buffered
    assert model.n_window == 40
    assert sorted(model.stored_keys()) == list(range(in_window - 40, in_window))
    probes = [x for x, _ in sinc_stream(20, 11)]
    assert_exact(model, probes)
    np.testing.assert_allclose([single.predict_one(x) for x in probes],
                               [model.predict_one(x) for x in probes], atol=1e-9)


@pytest.mark.parametrize(("far_points", "window"), [("warn", 8), ("warn", 20)])
def test_a_buffered_sample_that_jams_every_slide_is_left_out_and_the_window_goes_on(
        far_points, window):
    # A sample the engine cannot learn (a feature of 1e6 among unit-scale ones under a linear
    # kernel) went into the buffer of a window of step 3 ("warn" lets it in; "refuse" refuses
    # it now, see test_refusals): every later slide failed with it, and the window refused
    # everything that came after it, for good.
    model = SlidingWindowSVR(window_size=window, step=3, kernel="linear", far_points=far_points)
    stream = sinc_stream(window + 34, 5)
    for i, (x, t) in enumerate(stream[: window + 4]):
        model.learn_one(x, t, key=i)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ("warn": the far point's own warning)
        model.learn_one({"u": 1e6}, 0.5, key="far")
    assert "far" in model and model.n_buffered == 1
    with pytest.warns(RuntimeWarning, match="the sample buffered under key 'far' is left out: the "
                                            "window's slide was refused with it"):
        for i, (x, t) in enumerate(stream[window + 4 :], start=window + 4):
            model.learn_one(x, t, key=i)
    assert "far" not in model and [key for key, _ in model.refused_from_buffer] == ["far"]
    # The window holds the latest samples but the one left out, exactly.
    in_window = len(stream) - model.n_buffered
    assert sorted(model.stored_keys()) == list(range(in_window - window, in_window))
    assert_exact(model, [x for x, _ in sinc_stream(20, 6)])


def test_the_buffered_sample_farthest_from_the_stored_ones_is_the_first_left_out():
    # Tried oldest first, a far point buffered after five others took six refused updates to
    # find (each slow: the engine learns its points afresh before refusing); only samples far
    # beyond the stored points' scale are tried, the farthest first.
    model = SlidingWindowSVR(window_size=10, step=8, kernel="linear", far_points="warn")
    stream = sinc_stream(40, 7)
    for i, (x, t) in enumerate(stream[:16]):
        model.learn_one(x, t, key=i)
    for i, (x, t) in enumerate(stream[16:21], start=16):
        model.learn_one(x, t, key=i)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.learn_one({"u": 1e6}, 0.5, key="far")
        model.learn_one(*stream[21], key=21)
        assert model.n_buffered == 7 and model.MAX_LEFT_OUT_TRIES < 6
        before = model._engine.updates_total
        model.learn_one(*stream[22], key=22)  # the slide
    assert [key for key, _ in model.refused_from_buffer] == ["far"]
    assert model._engine.updates_total - before == 1  # (refused updates are not counted)
    assert sorted(model.stored_keys()) == list(range(13, 23)) and model.n_buffered == 0


def test_an_arrival_that_makes_the_slide_fail_never_has_a_buffered_sample_left_out():
    # Tried without each sample buffered before, the slide went through without the good
    # sample 24 (and with the far arrival): 24 was left out in the far point's place, and the
    # far point, in the window, made it refuse 32 of the next 34 samples. The arrival that
    # makes the slide fail is refused, and the buffer stays.
    model = SlidingWindowSVR(window_size=20, step=3, kernel="linear", far_points="warn")
    stream = sinc_stream(60, 0)
    for i, (x, t) in enumerate(stream[:26]):
        model.learn_one(x, t, key=i)
    assert model._buffer_keys == [24, 25]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (the far point's own warning)
        with pytest.raises(ConvergenceError):
            model.learn_one({"u": 1e6}, 0.5, key="far")
    assert not model.refused_from_buffer and model._buffer_keys == [24, 25]
    for i, (x, t) in enumerate(stream[26:], start=26):
        model.learn_one(x, t, key=i)
    assert "far" not in model and model.n_window == 20


@pytest.mark.parametrize("limit", [1, 2])
def test_a_refused_slide_leaves_the_window_as_it_was_buffer_included(limit):
    # Refused, the call changes nothing: not even the samples buffered before, which a
    # refused slide first tries to slide by themselves.
    model = SlidingWindowSVR(window_size=12, step=3, C=5.0, gamma=0.5)
    stream = sinc_stream(40, 8)
    for i, (x, t) in enumerate(stream[:20]):
        model.learn_one(x, t, key=i)
    assert model.n_buffered == 2
    before = model.to_checkpoint()
    model._engine.max_breakpoints = limit
    frame = pd.DataFrame([x for x, _ in stream[20:30]])
    try:
        model.learn_many(frame, pd.Series([t for _, t in stream[20:30]]),
                         keys=list(range(20, 30)))
    except Exception:
        after = model.to_checkpoint()
        assert before[1] == after[1] and before[0].keys() == after[0].keys()
        for name in before[0]:
            np.testing.assert_array_equal(before[0][name], after[0][name])
    else:
        pytest.fail(f"ten samples slid within {limit} breakpoints")


def test_window_buffer_forget_stored_point_and_checkpoint():
    stream = sinc_stream(30, 12)
    model = SlidingWindowSVR(window_size=10, step=4, C=5.0, epsilon=0.05, gamma=0.5)
    for i, (x, t) in enumerate(stream[:26]):
        model.learn_one(x, t, key=f"k{i}")
    assert model.n_buffered == 2 and "k25" in model and "k24" in model
    assert model.stored_point("k25") == ({"u": stream[25][0]["u"], "v": stream[25][0]["v"]},
                                         stream[25][1])
    model.forget_one(key="k24")  # from the buffer
    assert "k24" not in model and model.n_buffered == 1
    model.forget_one(key="k20")  # from the window: one exact removal
    assert model.n_window == 9
    with pytest.raises(TypeError, match="real number"):
        model.learn_one(stream[26][0], "x", key="bad")
    assert model.n_buffered == 1 and "bad" not in model  # all or nothing
    arrays, meta = model.to_checkpoint()
    clone = SlidingWindowSVR.from_checkpoint(arrays, meta)
    assert clone.n_buffered == 1 and clone.stored_point("k25") == model.stored_point("k25")
    probes = [x for x, _ in sinc_stream(10, 13)]
    assert [clone.predict_one(x) for x in probes] == [model.predict_one(x) for x in probes]
    for i, (x, t) in enumerate(stream[26:]):
        model.learn_one(x, t, key=f"n{i}")
        clone.learn_one(x, t, key=f"n{i}")
    # The restored factor was computed afresh: later updates agree to round-off.
    np.testing.assert_allclose([clone.predict_one(x) for x in probes],
                               [model.predict_one(x) for x in probes], atol=1e-12)


def test_without_a_free_coefficient_b_is_the_middle_of_its_interval_whatever_the_order():
    """b is not unique when no coefficient is strictly inside (0, C): it is then centered in
    its feasible interval, as libsvm does, so the model does not depend on the order."""
    from sklearn.svm import SVR

    cases = [
        ("linear", 0.1, 0.1, [0.0, 1.0], [0.0, 10.0]),  # both samples at C
        ("rbf", 1.0, 0.5, [0.0, 1.0, 2.0, 3.0, 4.0], [7.0] * 5),  # every sample inside
        ("rbf", 1.0, 0.1, [1.0], [3.0]),  # one sample
        ("rbf", 1.0, 100.0, [0.0, 1.0, 2.0, 3.0, 4.0], [0.0, 1.0, 2.0, 3.0, 4.0]),
    ]
    for kernel, C, epsilon, xs, ts in cases:
        forward = IncrementalSVR(C=C, epsilon=epsilon, kernel=kernel)
        backward = IncrementalSVR(C=C, epsilon=epsilon, kernel=kernel)
        for i, (x, t) in enumerate(zip(xs, ts, strict=True)):
            forward.learn_one({"x": x}, t, key=i)
        for i, (x, t) in reversed(list(enumerate(zip(xs, ts, strict=True)))):
            backward.learn_one({"x": x}, t, key=i)
        reference = SVR(kernel=kernel, C=C, epsilon=epsilon, gamma=1.0, tol=1e-10).fit(
            np.array(xs)[:, None], ts)
        for probe in (0.5, 2.0):
            expected = float(reference.predict([[probe]])[0])
            assert forward.predict_one({"x": probe}) == pytest.approx(expected, abs=1e-6)
            assert backward.predict_one({"x": probe}) == pytest.approx(expected, abs=1e-6)


def test_forgetting_down_to_one_sample_centers_b_as_a_fresh_model_does():
    """Forgetting all samples but one leaves the last one's coefficient at 0 (sum(theta) = 0
    forces it), which the path reaches together with the end of its moves: that member must
    leave the margin set at exactly 0 and b be centred in the tube, as in a model that learned
    the one sample alone. (The round-off of that move, 3e-17 kept in the margin set, used to
    fix b at the edge of the tube: predictions 0.5 away in 1 case of 5 here.)"""
    settings = dict(C=0.5, kernel="poly", gamma=0.5, degree=2, coef0=1.0, epsilon=0.5)
    probe = {"a": 0.3, "b": -0.2}
    for seed in range(40):
        rng = np.random.default_rng(seed)
        count = int(rng.integers(2, 5))
        X, y = rng.standard_normal((count, 2)), rng.standard_normal(count)
        model = IncrementalSVR(**settings)
        for i in range(count):
            model.learn_one({"a": X[i, 0], "b": X[i, 1]}, float(y[i]), key=i)
        for i in range(count - 1):
            model.forget_one(key=i)
        alone = IncrementalSVR(**settings)
        alone.learn_one({"a": X[-1, 0], "b": X[-1, 1]}, float(y[-1]), key=count - 1)
        assert model.predict_one(probe) == pytest.approx(alone.predict_one(probe), abs=1e-9), seed


@pytest.mark.parametrize("regression", [True, False])
def test_a_window_forgets_a_buffered_sample_by_value(regression):
    from stream_svm import SlidingWindowSVC

    model = (SlidingWindowSVR(window_size=10, step=4) if regression
             else SlidingWindowSVC(window_size=10, step=4))
    first, second = (1.5, -2.0) if regression else (True, False)
    for i in range(4):  # one slide: these are in the window
        model.learn_one({"a": float(i)}, first if i % 2 else second, key=f"w{i}")
    model.learn_one({"a": 1.0, "b": 2.0}, first, key="buffered")
    model.learn_one({"a": 3.0}, first)  # also in the window, with this label: the window's
    assert model.n_buffered == 2 and model.n_window == 4
    # Features in another order, an explicit zero: the buffered sample (it was "no stored
    # point equals ..." before, although `"buffered" in model` was True).
    model.forget_one({"b": 2.0, "zero": 0.0, "a": 1.0}, first)
    assert "buffered" not in model and model.n_buffered == 1
    # The window's equal sample is older than the buffer's: it goes first.
    model.forget_one({"a": 3.0}, first)
    assert "w3" not in model and model.n_window == 3 and model.n_buffered == 1
    model.forget_one({"a": 3.0}, first)
    assert model.n_buffered == 0
    with pytest.raises(KeyError, match="equals"):
        model.forget_one({"a": 3.0}, first)


def test_a_target_at_the_edge_of_the_float_range_is_learned():
    # b was centered as (low + high) / 2, which overflowed: ConvergenceError blaming the kernel.
    model = IncrementalSVR(C=1.0, epsilon=0.0)
    model.learn_one({"a": 1.0}, 1e308)
    assert model.predict_one({"a": 1.0}) == 1e308


def test_c_far_above_the_targets_scale_is_warned_of_once(recwarn):
    # Unscaled features under a linear kernel and targets of scale 1e-6 at C = 40: updates
    # were accepted whose answers were 2,000 times the targets' scale off, without a word.
    import warnings

    from stream_svm import _engine_model

    _engine_model._SCALE_WARNED.clear()
    rng = np.random.default_rng(0)
    Z = rng.standard_normal((120, 4))
    X = pd.DataFrame(Z * [1e-3, 1.0, 1e3, 10.0], columns=list("abcd"))
    targets = pd.Series(np.sin(Z @ [1.0, -2.0, 0.5, 1.0]) * 1e-6)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # standardized: nothing to say
        fine = IncrementalSVR(C=40.0, epsilon=0.0, kernel="linear")
        fine.learn_many(pd.DataFrame(Z[:60], columns=list("abcd")), targets[:60] * 1e6)
        fine.learn_many(pd.DataFrame(Z[60:], columns=list("abcd")), targets[60:] * 1e6)
    model = IncrementalSVR(C=40.0, epsilon=0.0, kernel="linear")
    model.learn_many(X.iloc[:40], targets[:40])
    assert not recwarn.list  # (fewer than SCALE_CHECK_POINTS learned so far)
    with pytest.warns(UserWarning, match=r"C is large for the targets' scale: C \* K\(x, x\) = "
                                         r".* times the targets' spread .*TargetStandardScaler"):
        model.learn_many(X.iloc[40:90], targets[40:90])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once
        model.learn_many(X.iloc[90:], targets[90:])
    # A model fit by one learn_many is warned of before it learns (the kernel's scale of the
    # rows arriving counts: the model holds none yet).
    _engine_model._SCALE_WARNED.clear()
    with pytest.warns(UserWarning, match=r"C is large for the targets' scale: C \* K\(x, x\) = "
                                         r"\d\.\d+e\+08 "):
        IncrementalSVR(C=40.0, epsilon=0.0, kernel="linear").learn_many(X.iloc[:90],
                                                                        targets[:90])


# Eleven samples of 4 features, one repeated (rows 3 and 6), targets of scale 1e-6: at
# epsilon 0 and C = 3455.6 the copies end on either side of the tube at C.
_COPIES_X = [
    [1.7767222797750437, 0.5885946965609655, 0.16138677515680916, -0.08635466379689741],
    [-0.213910367544398, 2.3287784575038026, 0.13167965940983073, -0.7048009284137461],
    [-0.1871640895603303, 0.24533483739241388, -0.43602573778106474, 1.5524515535834256],
    [-0.4478292173035343, 1.1345870753364415, 1.159723060592865, 0.5992721916366337],
    [-0.17890737566891354, -0.5599340977603349, 0.6490746436362437, -0.24112029251061326],
    [-0.8372412738215639, 0.19230573984621888, -1.4442545780287543, 0.9548340229722726],
    [-0.4478292173035343, 1.1345870753364415, 1.159723060592865, 0.5992721916366337],
    [-0.1880080396724079, -1.7947877366248584, -0.07553096158456295, -1.75260250886374],
    [-0.6083672108844985, 0.30463291854624824, -1.2268019818185996, 1.717485167343623],
    [-0.7591561777947465, 1.0150074064803132, -0.5284146786629956, 0.1894689814882675],
    [0.7105589077925101, -0.10293201876435402, -0.4487874575857295, -0.8905158629822192]]
_COPIES_T = [-1.506667200386408e-07, -1.070758429216339e-06, 4.4776304391371277e-07,
             3.4864041204389207e-07, -4.3575205931818287e-07, 5.653439099291227e-07,
             3.4864041204389207e-07, -7.901238578409973e-07, -2.619823277482404e-07,
             1.7828034809127518e-07, -7.57877771757913e-07]


@pytest.mark.parametrize("how", ["learn_one", "learn_many", "window"])
def test_copies_at_c_on_either_side_of_the_tube_do_not_block_learning(how):
    # Every way of learning these was refused ("the kernel matrix is numerically singular",
    # of a kernel of condition number 3.4), and a window stayed blocked slide after slide:
    # the round-off the copies' cancelling coefficients leave in b reaches every sample,
    # and a sample far from them was held to its own far smaller terms.
    gamma, C = 1.2138853178309579, 3455.625470917336
    xs = [dict(zip("abcd", row, strict=True)) for row in _COPIES_X]
    if how == "window":
        model = SlidingWindowSVR(window_size=100, step=1, C=C, epsilon=0.0, gamma=gamma)
    else:
        model = IncrementalSVR(C=C, epsilon=0.0, gamma=gamma)
    if how == "learn_many":
        model.learn_many(pd.DataFrame(xs), pd.Series(_COPIES_T))
    else:
        for x, t in zip(xs, _COPIES_T, strict=True):
            model.learn_one(x, t)
    keys = model.stored_keys()
    assert len(keys) == 11 and model._engine.last_update.relaxed
    # The KKT conditions in float64, from the kernel computed here: to the round-off of
    # coefficients of size C (eps C, absolute), whatever the targets' scale.
    theta = model.dual_coef().reindex(keys).fillna(0.0).to_numpy()
    X = np.array([[model.stored_point(k)[0].get(c, 0.0) for c in "abcd"] for k in keys])
    t = np.array([model.stored_point(k)[1] for k in keys])
    K = np.exp(-gamma * ((X[:, None, :] - X[None, :, :]) ** 2).sum(-1))
    residual = t - (K @ theta + model.intercept)
    at_bound = np.abs(theta) >= C * (1 - 1e-12)
    violation = np.where(at_bound, np.maximum(0.0, -np.sign(theta) * residual),
                         np.abs(residual))
    assert violation.max() <= 100 * np.finfo(float).eps * C
    assert abs(theta.sum()) <= 100 * np.finfo(float).eps * np.abs(theta).sum()


def test_the_target_scale_check_takes_targets_near_the_float_range():
    # Targets of 1e160 made the check's variance overflow: a RuntimeWarning, and under
    # warnings-as-errors the 50th point refused.
    import warnings

    from stream_svm.regressors import target_scale_warning

    rng = np.random.default_rng(1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model = IncrementalSVR(C=1.0, epsilon=0.0)
        for value, target in zip(rng.normal(size=60), rng.normal(size=60) * 1e160,
                                 strict=True):
            model.learn_one({"a": float(value)}, float(target))
        assert model.n_stored == 60
        assert target_scale_warning(1.0, 1.0, np.array([1e300, -1e300])) is None
        assert target_scale_warning(1.0, 1.0, np.array([0.0, 0.0])) is None
        assert "C * K(x, x) = 1e+10" in target_scale_warning(1e10, 1.0, np.array([0.5, 0.5]))


def test_a_checkpoint_keeps_the_counters_and_refuses_damaged_ones():
    model = IncrementalSVR(C=1.0, gamma=0.5)
    rng = np.random.default_rng(4)
    for i in range(60):
        x = {"a": float(rng.normal()), "b": float(rng.normal())}
        model.learn_one(x, x["a"] - x["b"], key=i)
    model._engine.retries_total, model._engine.relearns_total = 3, 1  # (as if it had had to)
    arrays, meta = model.to_checkpoint()
    restored = IncrementalSVR.from_checkpoint(arrays, meta)
    assert (restored.retries_total, restored.relearns_total) == (3, 1)
    assert restored._next_scale_check == model._next_scale_check
    # Written before the counters were kept: restored with them at 0.
    older = {name: value for name, value in meta.items() if name != "counters"}
    assert IncrementalSVR.from_checkpoint(arrays, older).retries_total == 0
    damaged = {**meta, "counters": {**meta["counters"], "retries_total": -1}}
    with pytest.raises(ValueError, match=r"'retries_total' in the checkpoint's counters is -1"):
        IncrementalSVR.from_checkpoint(arrays, damaged)
