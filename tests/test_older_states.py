"""States written by an earlier stream-svm go on learning exactly after an upgrade.

A user's pickled estimator (or a River pipeline holding one) must, once loaded by a newer
version, learn and forget as if it had been learned by that version: an attribute added to the
engine since must get its value when an older state lacks it. Without one, the first update
after loading raised, and only after it had already changed the model.
"""

from __future__ import annotations

import gzip
import itertools
import pickle
from pathlib import Path

import numpy as np
import pytest
from river import compose, datasets, preprocessing

import stream_svm
from stream_svm.engine import PathEngine
from stream_svm.kernels import make_kernel

PICKLES = Path(__file__).parent / "data" / "pickles_0.1.0"

#: What a PathEngine pickled by the oldest supported version holds (revision f47f4e0, the
#: layout of the pickles in PICKLES). An attribute the engine gained since needs a value in
#: ``PathEngine.__setstate__`` for the states that lack it; test_every_newer_attribute_has_a_default
#: checks that for each attribute not named here.
OLDEST_ENGINE_STATE = frozenset({
    "C", "_R", "_X", "_XT", "_XT_of", "_alpha", "_columns", "_columns_stale", "_diag_scale",
    "_g", "_gap", "_h", "_h_abs", "_h_drift", "_keys", "_kkt_cache", "_margin", "_next_seq",
    "_p", "_pos", "_recent", "_recent_next", "_recent_of", "_seq", "_slot", "_status",
    "_store", "_sv_cache", "_t", "_terms_cache", "_undo", "_y", "b", "breakpoints_total",
    "degeneracy_tol", "dim", "kernel", "kkt_tol", "last_update", "max_breakpoints", "n",
    "refactorizations_total", "residual_tol", "ridge", "updates_total",
})

POINTS = list(itertools.islice(datasets.Bananas(), 160))
#: The pickles learned under keys (0 to 79), which the test forgets some of.
KEYED = ("incremental_svc", "incremental_svr", "incremental_lssvc")
PROBES = [x for x, _ in itertools.islice(datasets.Bananas(), 1000, 1100)]


def _fresh(name: str):
    """The estimator the pickle ``name`` was made from (see make_pickles.py there)."""
    return {
        "incremental_svc": lambda: stream_svm.IncrementalSVC(C=1.0, gamma=0.5),
        "sliding_window_svc": lambda: stream_svm.SlidingWindowSVC(window_size=50, C=1.0,
                                                                  gamma=0.5),
        "incremental_svr": lambda: stream_svm.IncrementalSVR(C=1.0, gamma=0.5, epsilon=0.1),
        "alpha_isvc": lambda: stream_svm.AlphaISVC(batch_size=20, C=1.0, gamma=0.5),
        "pipeline_svc": lambda: compose.Pipeline(preprocessing.StandardScaler(),
                                                 stream_svm.IncrementalSVC(C=1.0, gamma=0.5)),
        "sliding_window_svr": lambda: stream_svm.SlidingWindowSVR(window_size=50, C=1.0,
                                                                  gamma=0.5, epsilon=0.1),
    }[name]()


def _learn(name: str, model, start: int, stop: int) -> None:
    for i in range(start, stop):
        x, y = POINTS[i]
        target = x["1"] - 0.5 * x["2"] if name.endswith("svr") else y
        if name in KEYED:
            model.learn_one(x, target, key=i)
        else:
            model.learn_one(x, target)


def _decisions(name: str, model) -> np.ndarray:
    if name == "pipeline_svc":
        scaler, svc = model.steps.values()
        return np.array([svc.decision_function_one(scaler.transform_one(x)) for x in PROBES])
    if name.endswith("svr"):
        return np.array([model.predict_one(x) for x in PROBES])
    return np.array([model.decision_function_one(x) for x in PROBES])


@pytest.mark.parametrize("name", ["incremental_svc", "sliding_window_svc", "incremental_svr",
                                  "alpha_isvc", "pipeline_svc", "sliding_window_svr"])
def test_an_older_pickle_goes_on_learning_exactly(name):
    """Loaded, the older model predicts as a model learned by this version on the same 80
    points; it then learns 80 more (and, keyed, forgets 20 it learned before the upgrade) and
    still agrees with that model, which went through the same operations."""
    with gzip.open(PICKLES / f"{name}.pkl.gz") as handle:
        older = pickle.load(handle)
    current = _fresh(name)
    _learn(name, current, 0, 80)
    np.testing.assert_allclose(_decisions(name, older), _decisions(name, current),
                               rtol=0, atol=1e-9)
    for model in (older, current):
        _learn(name, model, 80, 160)
        if name in KEYED:
            for key in range(20):
                model.forget_one(key=key)
    np.testing.assert_allclose(_decisions(name, older), _decisions(name, current),
                               rtol=0, atol=1e-9)
    engine = (older.steps["IncrementalSVC"] if name == "pipeline_svc" else older)._engine
    fresh_engine = (current.steps["IncrementalSVC"] if name == "pipeline_svc"
                    else current)._engine
    assert engine.n == fresh_engine.n
    # Counters the older state lacked start from 0 and count what came after.
    assert engine.retries_total == engine.relearns_total == 0


def test_an_older_ls_svm_pickle_learns_and_forgets_exactly():
    """Its random features were drawn by the older version (the same seed draws others now):
    loaded, it learns 80 points and forgets them, exactly back to what it was, and then
    forgets 20 of its own as a copy loaded afresh does."""
    with gzip.open(PICKLES / "incremental_lssvc.pkl.gz") as handle:
        older = pickle.load(handle)
    before = _decisions("incremental_lssvc", older)
    _learn("incremental_lssvc", older, 80, 160)
    assert older.n_samples_ == 160
    for key in range(80, 160):
        older.forget_one(key=key)
    np.testing.assert_allclose(_decisions("incremental_lssvc", older), before, rtol=0,
                               atol=1e-9)
    trimmed = pickle.loads(gzip.decompress((PICKLES / "incremental_lssvc.pkl.gz").read_bytes()))
    for key in range(20):
        older.forget_one(key=key)
        trimmed.forget_one(key=key)
    np.testing.assert_allclose(_decisions("incremental_lssvc", older),
                               _decisions("incremental_lssvc", trimmed), rtol=0, atol=1e-9)
    assert older.n_samples_ == 60


def _engine_state() -> tuple[PathEngine, dict]:
    rng = np.random.default_rng(3)
    X = rng.normal(size=(40, 2))
    y = np.where(X[:, 0] + 0.3 * rng.normal(size=40) > 0, 1.0, -1.0)
    engine = PathEngine(make_kernel("rbf", gamma=1.0), C=1.0)
    engine.update(X[:30], y[:30], keys=list(range(30)))
    return engine, engine.__getstate__()


def test_every_newer_attribute_has_a_default():
    """For every attribute a pickled engine holds that the oldest supported pickles lack, an
    engine restored without it learns and forgets as the intact one does. A new attribute
    without a default in ``__setstate__`` fails here, not in a user's upgrade."""
    engine, state = _engine_state()
    newer = sorted(set(state) - OLDEST_ENGINE_STATE)
    assert OLDEST_ENGINE_STATE <= set(state), "an attribute of older pickles is gone"
    rng = np.random.default_rng(4)
    X_more = rng.normal(size=(10, 2))
    y_more = np.where(X_more[:, 1] > 0, 1.0, -1.0)
    probes = rng.normal(size=(50, 2))
    expected = pickle.loads(pickle.dumps(engine))
    expected.update(X_more, y_more, keys=list(range(30, 40)), remove=[0, 1, 2])
    for name in newer:
        older_state = pickle.loads(pickle.dumps(state))
        del older_state[name]
        restored = PathEngine.__new__(PathEngine)
        restored.__setstate__(older_state)
        restored.update(X_more, y_more, keys=list(range(30, 40)), remove=[0, 1, 2])
        np.testing.assert_array_equal(restored.decision_function(probes),
                                      expected.decision_function(probes), err_msg=name)
