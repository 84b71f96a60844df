"""A refused update and a leave-one-out computation leave no trace: the model's later results
equal, bit for bit, those of a twin that never saw them, and its counters are unchanged. A
model restored from its checkpoint goes on bit for bit as the one that saved it."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from stream_svm import (
    AlphaISVC,
    IncrementalSVC,
    IncrementalSVR,
    SlidingWindowSVC,
    SlidingWindowSVR,
)
from stream_svm.engine import OPTIONAL_STATE_ARRAYS, ConvergenceError

KERNELS = {
    "poly": {"kernel": "poly", "degree": 3, "gamma": 0.5, "coef0": 1.0},
    "rbf": {"kernel": "rbf", "gamma": 0.5},
    "linear": {"kernel": "linear"},
}
PROBES = [{"a": 0.1 * j, "b": -0.2, "c": 0.3} for j in range(5)]


def _stream(seed: int, size: int):
    rng = np.random.default_rng(seed)
    for i in range(size):
        v = rng.normal(size=3)
        yield i, dict(zip("abc", map(float, v), strict=True)), bool(v[0] + 0.5 * v[1] > 0)


def _same_bits(model, twin) -> None:
    state, twin_state = model._engine.get_state(), twin._engine.get_state()
    for name, values in state.items():
        np.testing.assert_array_equal(values, twin_state[name], err_msg=name)
    assert model.intercept == twin.intercept
    assert ([model.decision_function_one(x) for x in PROBES]
            == [twin.decision_function_one(x) for x in PROBES])


@pytest.mark.parametrize("kernel", list(KERNELS))
def test_updates_after_a_refused_one_equal_a_twins_that_never_saw_it(kernel):
    # max_breakpoints=3 refuses (BreakpointLimit) the updates whose paths are longer; the
    # model skips those points and so does its twin, which never tries them. Before, a
    # rollback dropped the last KKT check and left S's kernel columns to be recomputed
    # (through BLAS, for polynomial kernels), and the next updates differed in the last bits.
    def make():
        return IncrementalSVC(C=5.0, max_breakpoints=3, **KERNELS[kernel])

    model, twin = make(), make()
    refused = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i, x, y in _stream(4, 60):
            before = [model.decision_function_one(p) for p in PROBES]
            updates = model.updates_total
            try:
                model.learn_one(x, y, key=i)
            except ConvergenceError:
                refused += 1
                assert [model.decision_function_one(p) for p in PROBES] == before
                assert model.updates_total == updates
                continue
            twin.learn_one(x, y, key=i)
            _same_bits(model, twin)
    assert refused >= 1  # (the scenario must refuse something to test anything)


@pytest.mark.parametrize("kernel", list(KERNELS))
def test_leave_one_out_changes_no_later_update_nor_counter(kernel):
    model, twin = IncrementalSVC(C=5.0, **KERNELS[kernel]), IncrementalSVC(C=5.0,
                                                                           **KERNELS[kernel])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i, x, y in _stream(7, 40):
            model.learn_one(x, y, key=i)
            twin.learn_one(x, y, key=i)
            if i >= 5 and i % 3 == 0:
                counters = (model.last_update, model.breakpoints_total, model.updates_total,
                            model.retries_total, model.relearns_total,
                            model._engine.refactorizations_total)
                model.loo_error()
                assert (model.last_update, model.breakpoints_total, model.updates_total,
                        model.retries_total, model.relearns_total,
                        model._engine.refactorizations_total) == counters
            _same_bits(model, twin)


@pytest.mark.parametrize("make", [
    lambda: IncrementalSVC(kernel="poly", degree=3, gamma=0.5, coef0=1.0, C=5.0,
                           max_breakpoints=3),
    lambda: IncrementalSVR(kernel="rbf", gamma=0.5, C=5.0, epsilon=0.05, max_breakpoints=2),
], ids=["IncrementalSVC", "IncrementalSVR"])
def test_a_refused_leave_one_out_changes_no_counter(make):
    model = make()
    regression = isinstance(model, IncrementalSVR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i, x, y in _stream(3, 40):
            try:
                model.learn_one(x, x["a"] - x["b"] if regression else y, key=i)
            except ConvergenceError:
                continue
        counters = (model.last_update, model.breakpoints_total, model.updates_total,
                    model.retries_total, model.relearns_total, model._engine.refactorizations_total)
        before = [model.predict_one(p) for p in PROBES]
        with pytest.raises(ConvergenceError, match="max_breakpoints"):
            model.loo_error()
    assert (model.last_update, model.breakpoints_total, model.updates_total,
            model.retries_total, model.relearns_total,
            model._engine.refactorizations_total) == counters
    assert [model.predict_one(p) for p in PROBES] == before


RESTORED = {
    "IncrementalSVC poly": lambda: IncrementalSVC(C=5.0, **KERNELS["poly"]),
    "IncrementalSVC linear": lambda: IncrementalSVC(C=5.0, **KERNELS["linear"]),
    "IncrementalSVC rbf": lambda: IncrementalSVC(C=5.0, **KERNELS["rbf"]),
    "SlidingWindowSVC rbf": lambda: SlidingWindowSVC(window_size=60, step=3, C=5.0,
                                                     **KERNELS["rbf"]),
    "AlphaISVC poly": lambda: AlphaISVC(batch_size=10, C=5.0, **KERNELS["poly"]),
    "IncrementalSVR linear": lambda: IncrementalSVR(C=5.0, **KERNELS["linear"]),
    "SlidingWindowSVR rbf": lambda: SlidingWindowSVR(window_size=60, step=3, C=5.0,
                                                     **KERNELS["rbf"]),
}


@pytest.mark.filterwarnings("ignore:C is large for the targets' scale")
@pytest.mark.parametrize("name", list(RESTORED))
def test_a_model_restored_from_its_checkpoint_goes_on_bit_for_bit(name):
    # Restored with its factor computed afresh (other bits than the one its updates had
    # maintained, and another shift t), a polynomial model's decision values were 1.2e-4
    # (relative) from its original's after 100 more points of River's TrumpApproval.
    from river import datasets

    regression = "SVR" in name
    points = [({k: v / 50 for k, v in x.items()}, y / 40 if regression else y > 40)
              for x, y in datasets.TrumpApproval().take(170)]
    model = RESTORED[name]()
    keyed = not name.startswith("AlphaISVC")

    def learn(target, i, x, y):
        if keyed:
            target.learn_one(x, y, key=i)
        else:
            target.learn_one(x, y)

    def step(target, i, x, y):
        learn(target, i, x, y)
        if keyed and i % 7 == 0 and i >= 30 and not name.startswith("Sliding"):
            target.forget_one(key=i - 30)

    for i, (x, y) in enumerate(points[:60]):
        step(model, i, x, y)
    arrays, meta = model.to_checkpoint()
    # (Removals rotate the factor, which can leave negative entries on its diagonal: a
    # restore that wanted them positive computed the factor afresh, with other bits.)
    restored = type(model).from_checkpoint(arrays, meta)
    for i, (x, y) in enumerate(points[60:160], start=60):
        for target in (model, restored):
            step(target, i, x, y)
    state, restored_state = model._engine.get_state(), restored._engine.get_state()
    for array, values in state.items():
        np.testing.assert_array_equal(values, restored_state[array], err_msg=array)
    answer = "predict_one" if regression else "decision_function_one"
    assert ([getattr(model, answer)(x) for x, _ in points[160:]]
            == [getattr(restored, answer)(x) for x, _ in points[160:]])
    assert model.breakpoints_total == restored.breakpoints_total


def test_a_saved_factor_or_sums_that_disagree_with_the_points_are_computed_afresh():
    # The saved solver state is taken only when it fits the points: a damaged one is no
    # reason to refuse the checkpoint (the solution is checked on its own), nor to use it.
    model = IncrementalSVC(C=5.0, **KERNELS["rbf"])
    for i, x, y in _stream(3, 80):
        model.learn_one(x, y, key=i)
    arrays, meta = model.to_checkpoint()
    assert arrays["factor"].shape[0] == model.n_margin > 2 and model.n_error
    damaged = {**arrays, "factor": arrays["factor"] * 1.001, "h": arrays["h"] + 1e-3}
    restored = IncrementalSVC.from_checkpoint(damaged, meta)
    engine = restored._engine
    k = engine.n_margin
    fresh = np.linalg.cholesky(
        engine._columns[engine._store[:k]][:, engine._margin].T + engine._t).T
    np.testing.assert_allclose(np.triu(engine._R[:k, :k]), fresh, rtol=1e-12, atol=1e-12)
    assert not np.array_equal(engine._R[:k, :k], damaged["factor"])
    assert np.abs(engine._h[: engine.n] - arrays["h"]).max() < 1e-12
    assert ([restored.decision_function_one(x) for x in PROBES]
            == [model.decision_function_one(x) for x in PROBES])
    # Written before the solver state was kept: restored as before, from the points alone.
    older = {name: value for name, value in arrays.items()
             if name not in OPTIONAL_STATE_ARRAYS}
    assert ([IncrementalSVC.from_checkpoint(older, meta).decision_function_one(x)
             for x in PROBES] == [model.decision_function_one(x) for x in PROBES])


def test_a_factor_left_with_negative_pivots_by_removals_restores_bit_for_bit():
    # Removals rotate the factor, which leaves negative entries on its diagonal (R'R is still
    # the matrix): a restore that wanted them positive computed the factor afresh, and the
    # daemon's repeated outputs after a kill differed in their last digits.
    model = IncrementalSVC(C=10.0, **KERNELS["rbf"])
    points = list(_stream(0, 200))
    for i, x, y in points[:150]:
        model.learn_one(x, y, key=i)
        if i % 5 == 0 and i >= 20:
            model.forget_one(key=i - 20)
    arrays, meta = model.to_checkpoint()
    assert (np.diag(arrays["factor"]) < 0).any()
    restored = IncrementalSVC.from_checkpoint(arrays, meta)
    for i, x, y in points[150:]:
        for target in (model, restored):
            target.learn_one(x, y, key=i)
            if (i - 149) % 5:  # (multiples of 5 were forgotten above)
                target.forget_one(key=i - 149)
    _same_bits(model, restored)


def test_a_regressor_restored_between_reserve_points_goes_on_bit_for_bit():
    # Its next point landing in the reserve set extends the last check's terms and keeps g
    # (no refresh) in the original; restored without g and those terms, the twin refreshed g,
    # whose last bits differ, and its later paths drifted (predictions 1e-14 apart).
    rng = np.random.default_rng(12)
    X = rng.normal(size=(120, 3))
    y = np.sin(X[:, 0]) + 0.3 * X[:, 1] + 0.1 * rng.normal(size=120)
    points = [dict(zip("abc", map(float, row), strict=True)) for row in X]
    model = IncrementalSVR(C=10.0, epsilon=0.05, kernel="rbf", gamma=0.5)
    for i in range(25):
        model.learn_one(points[i], float(y[i]), key=i)
    twin = IncrementalSVR.from_checkpoint(*model.to_checkpoint())
    assert twin._engine._kkt_cache is model._engine._kkt_cache is True
    for i in range(25, 120):
        for target in (model, twin):
            target.learn_one(points[i], float(y[i]), key=i)
    state, twin_state = model._engine.get_state(linear=True), twin._engine.get_state(linear=True)
    for name, values in state.items():
        np.testing.assert_array_equal(values, twin_state[name], err_msg=name)


def test_a_linear_models_scale_an_ulp_below_numpys_is_restored_as_saved():
    # The engine takes K(x, x) from its compiled kernel, an ulp below numpy's here: restored
    # with numpy's, the shift and tolerances differed, and so did the coefficients later.
    rng = np.random.default_rng(96)
    X = rng.normal(size=(80, 3))
    y = X[:, 0] + 0.5 * X[:, 1] + 0.3 * rng.normal(size=80) > 0
    points = [dict(zip("abc", map(float, row), strict=True)) for row in X]
    model = IncrementalSVC(C=5.0, kernel="linear")
    for i in range(2):
        model.learn_one(points[i], bool(y[i]), key=i)
    engine = model._engine
    assert engine._diag_scale < engine._diagonal_scale(engine._X[: engine.n])
    twin = IncrementalSVC.from_checkpoint(*model.to_checkpoint())
    for i in range(2, 80):
        for target in (model, twin):
            target.learn_one(points[i], bool(y[i]), key=i)
    _same_bits(model, twin)


def test_saved_sums_or_scale_out_of_their_bounds_are_not_taken():
    # h was taken when within its round-off bound's sizes (not eps times them): a damaged h
    # was used, and the valid checkpoint then refused. A saved kernel scale far above the
    # points' loosened the checks for copies enough to serve an edited b, and let a far
    # point be learned despite far_points = "refuse".
    rng = np.random.default_rng(1)
    model = IncrementalSVC(C=100.0, kernel="linear", far_points="refuse")
    points = []
    for i in range(60):
        v = np.round(rng.normal(size=3), 1)
        x = dict(zip("abc", map(float, v), strict=True))
        label = bool(v[0] + 0.5 * v[1] + 0.5 * rng.normal() > 0)
        points.append((x, label))
        model.learn_one(x, label, key=i)
    for j in range(5):  # copies of stored points under the other label
        x, label = points[j + 30]
        model.learn_one(x, not label, key=1000 + j)
    arrays, meta = model.to_checkpoint()
    assert model.n_error and arrays["h_drift"].max() > 0
    damaged = {**arrays, "h": arrays["h"] + 0.5 * arrays["h_drift"]}
    restored = IncrementalSVC.from_checkpoint(damaged, meta)
    assert ([restored.decision_function_one(x) for x, _ in points[:5]]
            == [model.decision_function_one(x) for x, _ in points[:5]])
    for scale in (float(arrays["diag_scale"]) * 9.9e7, 1e20, 1e300):
        edited = {**arrays, "b": arrays["b"] + 10.0, "diag_scale": np.array(scale)}
        with pytest.raises(ValueError, match="do not solve the SVM of its points"):
            IncrementalSVC.from_checkpoint(edited, meta)
        inflated = IncrementalSVC.from_checkpoint({**arrays, "diag_scale": np.array(scale)},
                                                  meta)
        with pytest.raises(ValueError, match="far beyond the kernel scale"):
            inflated.learn_one({"a": 1e6, "b": 0.0, "c": 0.0}, True, key="far")
