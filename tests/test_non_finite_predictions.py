"""Finite features can overflow a kernel (a polynomial or linear kernel at 1e300): learning
such a point is refused, and so is predicting for it; no class or value follows from inf."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from stream_svm import IncrementalLSSVC, IncrementalLSSVR, IncrementalSVC, IncrementalSVR

HUGE = {"a": 1.7e308}


def _models():
    svc = IncrementalSVC(kernel="poly", degree=3, gamma=1.0)
    svr = IncrementalSVR(kernel="poly", degree=3, gamma=1.0)
    lssvc, lssvr = IncrementalLSSVC(rho=1e-3), IncrementalLSSVR(rho=1e-3)  # linear: w ~ 100
    for x, label, target in (({"a": 0.01}, True, 1.0), ({"a": -0.01}, False, -1.0)):
        svc.learn_one(x, label)
        svr.learn_one(x, target)
        lssvc.learn_one(x, label)
        lssvr.learn_one(x, target)
    return [svc, svr, lssvc, lssvr]


@pytest.mark.parametrize("model", _models(), ids=lambda m: type(m).__name__)
def test_a_prediction_whose_decision_value_is_not_finite_is_refused(model):
    # The raw decision value is what it is (the daemon dead-letters it as non_finite)...
    assert not math.isfinite(model.decision_function_one(HUGE))
    # ...but no prediction is made from it, one point or a batch.
    with pytest.raises(ValueError, match=r"decision value for these features is -?inf"):
        model.predict_one(HUGE)
    X = pd.DataFrame({"a": [0.005, 1.7e308, -1.7e308]}, index=["p", "q", "r"])
    with pytest.raises(ValueError, match=r"row 'q' is -?inf \(not finite; 2 such rows\)"):
        model.predict_many(X)
    if hasattr(model, "predict_proba_one"):
        with pytest.raises(ValueError, match="not finite"):
            model.predict_proba_one(HUGE)
        with pytest.raises(ValueError, match="row 'q'"):
            model.predict_proba_many(X)
    # Ordinary points are predicted as before.
    assert model.predict_many(X.iloc[:1]).iloc[0] == model.predict_one({"a": 0.005})
