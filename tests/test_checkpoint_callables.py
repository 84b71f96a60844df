"""A checkpoint holds no Python function: a model made with a user-callable kernel comes back
from one only with that kernel passed back, never silently with the default kernel."""

from __future__ import annotations

import numpy as np
import pytest

from stream_svm import (
    AlphaISVC,
    IncrementalLSSVR,
    IncrementalSVC,
    IncrementalSVR,
    SlidingWindowSVC,
    SlidingWindowSVR,
)


def quadratic(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """(a.b + 1)^2, a kernel the models only know as a Python function."""
    return (A @ B.T + 1.0) ** 2


MODELS = [
    (IncrementalSVC, {}, "class"),
    (SlidingWindowSVC, {"window_size": 30}, "class"),
    (AlphaISVC, {"batch_size": 10}, "class"),
    (IncrementalSVR, {}, "target"),
    (SlidingWindowSVR, {"window_size": 30}, "target"),
]


def _trained(cls, params, kind, kernel):
    model = cls(C=1.0, kernel=kernel, **params)
    rng = np.random.default_rng(5)
    for _ in range(40):
        x = {"a": float(rng.normal()), "b": float(rng.normal())}
        model.learn_one(x, x["a"] * x["b"] > 0 if kind == "class" else x["a"] * x["b"])
    return model


def _decision(model, x):
    if hasattr(model, "decision_function_one"):
        return model.decision_function_one(x)
    return model.predict_one(x)


@pytest.mark.parametrize("cls,params,kind", MODELS, ids=lambda v: getattr(v, "__name__", ""))
def test_a_callable_kernel_must_be_passed_back_and_then_restores_the_same_model(cls, params, kind):
    model = _trained(cls, params, kind, quadratic)
    arrays, meta = model.to_checkpoint()
    assert meta["callables"] == {"kernel": f"{__name__}.quadratic"}
    with pytest.raises(ValueError, match=r"user-callable kernel \(.*quadratic\).*kernel=\.\.\."):
        cls.from_checkpoint(arrays, meta)
    restored = cls.from_checkpoint(arrays, meta, kernel=quadratic)
    assert restored.kernel is quadratic
    for x in ({"a": 0.3, "b": -1.2}, {"a": 2.0, "b": 0.5}, {"a": -0.7}):
        assert _decision(restored, x) == _decision(model, x)


def test_a_checkpoint_that_did_not_name_its_callable_kernel_is_refused_without_it():
    # Checkpoints of earlier versions dropped a callable kernel from the parameters without
    # a word: restoring them took the default RBF kernel, another model.
    model = _trained(IncrementalSVC, {}, "class", quadratic)
    arrays, meta = model.to_checkpoint()
    del meta["callables"]
    with pytest.raises(ValueError, match="user-callable kernel"):
        IncrementalSVC.from_checkpoint(arrays, meta)
    restored = IncrementalSVC.from_checkpoint(arrays, meta, kernel=quadratic)
    assert restored.decision_function_one({"a": 1.0}) == model.decision_function_one({"a": 1.0})


def test_only_what_the_checkpoint_could_not_hold_is_passed_back():
    model = _trained(IncrementalSVC, {}, "class", "rbf")
    arrays, meta = model.to_checkpoint()
    assert meta["callables"] == {}
    with pytest.raises(ValueError, match=r"kernel is stored in the checkpoint \('rbf'\)"):
        IncrementalSVC.from_checkpoint(arrays, meta, kernel=quadratic)
    with pytest.raises(TypeError, match="no parameter 'kernal'"):
        IncrementalSVC.from_checkpoint(arrays, meta, kernal=quadratic)
    arrays, meta = _trained(IncrementalSVC, {}, "class", quadratic).to_checkpoint()
    with pytest.raises(ValueError, match="must be the callable"):
        IncrementalSVC.from_checkpoint(arrays, meta, kernel="rbf")


def test_a_model_without_callables_records_none():
    model = IncrementalLSSVR(rho=0.5)
    model.learn_one({"a": 1.0}, 2.0)
    arrays, meta = model.to_checkpoint()
    assert meta["callables"] == {}
    assert IncrementalLSSVR.from_checkpoint(arrays, meta).predict_one({"a": 1.0}) == \
        model.predict_one({"a": 1.0})


def expanded_rbf(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """RBF (gamma 0.5) through |a|^2 + |b|^2 - 2 a.b, as users write it: the product is blocked
    otherwise for other shapes, so a pair's value differs between calls in its last digits
    (1e-8 apart on features near 300)."""
    squared = (A * A).sum(1)[:, None] + (B * B).sum(1)[None, :] - 2 * A @ B.T
    return np.exp(-0.5 * np.maximum(squared, 0))


def test_a_callable_kernel_whose_values_move_in_their_last_digits_still_restores():
    # The restore's KKT check, against kernel values recomputed in other calls, refused 21 of
    # 80 checkpoints of such a model as "a damaged or edited state" (pickle restored them).
    from river import datasets

    model = IncrementalSVC(C=5.0, kernel=expanded_rbf)
    seen = []
    for i, (x, y) in enumerate(datasets.TrumpApproval().take(60)):
        x = {name: value / 50 for name, value in x.items()}
        seen.append(x)
        model.learn_one(x, y > 40, key=i)
        arrays, meta = model.to_checkpoint()
        restored = IncrementalSVC.from_checkpoint(arrays, meta, kernel=expanded_rbf)
        for probe in seen[-5:]:
            assert restored.decision_function_one(probe) == pytest.approx(
                model.decision_function_one(probe), abs=1e-5)
    # An edited state is still refused with such a kernel: re-solving would move its
    # decision values by far more than the kernel's own round-off.
    edited = dict(arrays)
    edited["b"] = arrays["b"] + 0.5
    with pytest.raises(ValueError, match="do not solve the SVM of its points"):
        IncrementalSVC.from_checkpoint(edited, meta, kernel=expanded_rbf)
