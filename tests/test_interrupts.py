"""A KeyboardInterrupt (Ctrl-C in a notebook) may land between any two lines of an update: the
model is then the one from before the call or from after it, never a mix that a later call
trips on (arrays of two capacities, which the compiled loops wrote past; points stored without
their feature names or targets; a window's slide learned while its buffer was restored).

The interrupt is raised by a line tracer at the n-th line run in the functions named, as
Python's SIGINT handler would raise it there, for every n until the call ends unhurt."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable

import numpy as np
import pandas as pd
import pytest

from stream_svm import IncrementalSVC, IncrementalSVR, SlidingWindowSVC
from stream_svm._engine_model import _EngineModel
from stream_svm.engine import PathEngine


def _interrupted(call: Callable[[], object], functions: Iterable[Callable], nth: int) -> bool:
    """Run ``call``, raising KeyboardInterrupt at the ``nth`` line run inside ``functions``;
    whether it was raised (False: the call ran to its end)."""
    codes = {getattr(function, "__wrapped__", function).__code__ for function in functions}
    seen = [0]

    def local(frame, event, arg):
        if event == "line":
            seen[0] += 1
            if seen[0] == nth:
                sys.settrace(None)
                raise KeyboardInterrupt
        return local

    def tracer(frame, event, arg):
        return local if frame.f_code in codes else None

    sys.settrace(tracer)
    try:
        call()
    except KeyboardInterrupt:
        return True
    finally:
        sys.settrace(None)
    return False


def _every_interrupt(make: Callable[[], object], call: Callable[[object], object],
                     functions: Iterable[Callable], check: Callable[[object], None]) -> int:
    """For each line of ``functions`` that ``call`` runs, a fresh model from ``make``
    interrupted there, then ``check``-ed; returns how many lines were tried."""
    functions = list(functions)
    for nth in range(1, 10_000):
        model = make()
        if not _interrupted(lambda model=model: call(model), functions, nth):
            return nth - 1
        check(model)
    raise AssertionError("the call never ended")


def _points(count: int, seed: int = 0) -> tuple[pd.DataFrame, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(count, 3))
    return pd.DataFrame(X, columns=["a", "b", "c"]), X[:, 0] + 0.3 * X[:, 1] > 0


def test_arrays_grown_during_an_interrupted_update_keep_one_capacity():
    X, y = _points(700)

    def make():
        model = IncrementalSVC(C=10.0, gamma=0.3)
        model.learn_many(X.iloc[:100], pd.Series(y[:100]), keys=range(100))
        return model

    def check(model):
        engine = model._engine
        per_point = {name: getattr(engine, name).shape[0] for name in (
            "_X", "_y", "_p", "_gap", "_alpha", "_g", "_h", "_h_abs", "_h_drift", "_status",
            "_seq", "_slot")}
        per_point["_columns"] = engine._columns.shape[1]
        assert len(set(per_point.values())) == 1, per_point
        model.learn_many(X.iloc[100:700], pd.Series(y[100:700]), keys=range(100, 700))
        reference = IncrementalSVC(C=10.0, gamma=0.3)
        reference.learn_many(X, pd.Series(y), keys=range(700))
        probes = X.iloc[::50].to_dict("records")
        assert np.allclose([model.decision_function_one(x) for x in probes],
                           [reference.decision_function_one(x) for x in probes], atol=1e-8)

    tried = _every_interrupt(
        make, lambda model: model.learn_many(X.iloc[100:700], pd.Series(y[100:700]),
                                             keys=range(100, 700)),
        [PathEngine._reserve_rows], check)
    assert tried >= 10


@pytest.mark.parametrize("make_model", [
    lambda: IncrementalSVC(C=10.0, gamma=0.5), lambda: IncrementalSVR(C=10.0, gamma=0.5)],
    ids=["IncrementalSVC", "IncrementalSVR"])
def test_a_point_learned_as_an_interrupt_lands_keeps_its_names_and_target(make_model):
    regression = isinstance(make_model(), IncrementalSVR)
    label = 2.5 if regression else True

    def make():
        model = make_model()
        for i in range(20):
            model.learn_one({"a": i / 10}, float(i % 3) if regression else i % 3 == 0, key=i)
        return model

    def check(model):
        if "p" in model:  # learned: with its feature names and its target
            assert model.stored_point("p") == ({"a": 0.5, "color": 4.0}, label)
        else:
            assert model._engine.dim <= 1 + len(model._features)
        model.to_checkpoint()
        model.learn_one({"a": 0.3, "size": 1.0}, label, key="q")
        assert model.stored_point("q") == ({"a": 0.3, "size": 1.0}, label)
        if "p" in model:
            assert model.stored_point("p") == ({"a": 0.5, "color": 4.0}, label)

    functions = [type(make_model()).learn_one, _EngineModel._learned_through,
                 PathEngine.update]
    if regression:
        functions += [IncrementalSVR._update, IncrementalSVR._apply]
    tried = _every_interrupt(make, lambda model: model.learn_one(
        {"a": 0.5, "color": 4.0}, label, key="p"), functions, check)
    assert tried >= 10


def test_a_slide_interrupted_after_the_engine_took_it_leaves_no_point_in_the_buffer_too():
    X, y = _points(60)
    rows = X.to_dict("records")

    def make():
        model = SlidingWindowSVC(window_size=50, step=5, C=1.0, gamma=0.3)
        for i in range(54):
            model.learn_one(rows[i], bool(y[i]), key=i)
        return model

    def check(model):
        buffered = set(model._buffer_keys)
        assert not buffered & set(model._engine.keys)
        assert model._engine.dim <= len(model._features)
        for i in range(55, 60):  # the window goes on
            model.learn_one(rows[i], bool(y[i]), key=i)
        assert all(i in model for i in range(55, 60)) and model.n_window == 50

    from stream_svm._window import _SlidingWindow

    tried = _every_interrupt(make, lambda model: model.learn_one({**rows[54], "new": 1.0},
                                                                 bool(y[54]), key=54),
                             [_SlidingWindow._buffer, _SlidingWindow._slide], check)
    assert tried >= 10
