"""A refused update and a leave-one-out computation leave no trace: the model's later results
equal, bit for bit, those of a twin that never saw them, and its counters are unchanged."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from stream_svm import IncrementalSVC, IncrementalSVR
from stream_svm.engine import ConvergenceError

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
