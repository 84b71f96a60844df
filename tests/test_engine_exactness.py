"""Exactness of the engine against an independent batch optimum, through random interleavings
of single and multiple additions and removals."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.io

from stream_svm.engine import ConvergenceError, PathEngine
from stream_svm.kernels import make_kernel
from tests.oracle import BatchOptimum, assert_matches_batch, kkt_violation


def two_rings(n: int, seed: int, noise: float = 0.1) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, 2))
    y = np.where(np.hypot(X[:, 0], X[:, 1]) > 1.1, 1.0, -1.0)
    y[rng.random(n) < noise] *= -1
    return X, y


def interleave(engine: PathEngine, X, y, seed: int, calls: int, probes, check_every: int = 10,
               batch: int = 1) -> None:
    """Random learn/forget calls; KKT after every call, the batch oracle every few calls."""
    rng = np.random.default_rng(seed)
    pending = list(range(len(y)))
    rng.shuffle(pending)
    for call in range(calls):
        stored = engine.keys
        forget = len(stored) > 5 and (not pending or rng.random() < 0.35)
        if forget:
            count = int(rng.integers(1, batch + 1))
            chosen = rng.choice(len(stored), size=min(count, len(stored)), replace=False)
            forgotten = [stored[i] for i in chosen]
            engine.update(remove=forgotten)
            pending.extend(forgotten)  # forgotten points may be learned again later
        else:
            count = int(rng.integers(1, batch + 1))
            taken, pending = pending[:count], pending[count:]
            if not taken:
                continue
            engine.update(X[taken], y[taken], keys=taken)
        assert kkt_violation(engine) < 1e-8 * max(1.0, engine.C), f"call {call}"
        if call % check_every == 0 or call == calls - 1:
            assert_matches_batch(engine, probes)


@pytest.mark.parametrize("C,gamma", [(1.0, 0.5), (10.0, 0.5), (1e5, 3.0)])
def test_two_rings_single_updates(C, gamma):
    # At C = 1e5 libsvm (the oracle) only converges on a well-conditioned kernel.
    X, y = two_rings(120, seed=1)
    probes = np.random.default_rng(2).standard_normal((40, 2)) * 1.5
    engine = PathEngine(make_kernel("rbf", gamma=gamma), C=C)
    interleave(engine, X, y, seed=3, calls=300, probes=probes)


def test_diehl_data(shared_data):
    path = shared_data / "diehl-nonlindata100" / "nonlindata100.mat"
    if not path.exists():
        pytest.skip(f"{path} not found")
    data = scipy.io.loadmat(path)
    X, y = data["X"].T.astype(float), data["y"].ravel().astype(float)
    probes = X + np.random.default_rng(0).normal(scale=0.3, size=X.shape)
    engine = PathEngine(make_kernel("rbf", gamma=0.25), C=10.0)
    interleave(engine, X, y, seed=4, calls=250, probes=probes)
    assert engine.n > 30


def test_linear_kernel_more_points_than_dimensions():
    from sklearn.datasets import load_breast_cancer

    data = load_breast_cancer()
    X = data.data[:, :4]
    X = (X - X.mean(axis=0)) / X.std(axis=0)
    y = np.where(data.target == 1, 1.0, -1.0)
    rng = np.random.default_rng(5)
    subset = rng.choice(len(y), 150, replace=False)
    X, y = X[subset], y[subset]
    engine = PathEngine(make_kernel("linear"), C=1.0)
    interleave(engine, X, y, seed=6, calls=250, probes=rng.standard_normal((30, 4)))


def test_duplicates_and_opposite_labels():
    X, y = two_rings(40, seed=7)
    # Every point twice with its label, and a third copy of some with the opposite label.
    X = np.vstack([X, X, X[:15]])
    y = np.concatenate([y, y, -y[:15]])
    probes = np.random.default_rng(8).standard_normal((30, 2))
    engine = PathEngine(make_kernel("rbf", gamma=0.5), C=5.0)
    interleave(engine, X, y, seed=9, calls=200, probes=probes)


def test_duplicates_with_ridge_match_oracle_with_same_ridge():
    X, y = two_rings(40, seed=10)
    X, y = np.vstack([X, X[:20]]), np.concatenate([y, -y[:20]])
    engine = PathEngine(make_kernel("rbf", gamma=1.0), C=3.0, ridge=1e-3)
    interleave(engine, X, y, seed=11, calls=120, probes=X[:30] + 0.05)


@pytest.mark.parametrize("batch", [5, 50])
def test_multiple_updates_match_oracle(batch):
    X, y = two_rings(300, seed=12)
    probes = np.random.default_rng(13).standard_normal((40, 2)) * 1.5
    engine = PathEngine(make_kernel("rbf", gamma=0.5), C=10.0)
    interleave(engine, X, y, seed=14, calls=40, probes=probes, check_every=1, batch=batch)


def test_simultaneous_add_and_remove_equals_repeated_single_updates():
    X, y = two_rings(200, seed=15)
    rng = np.random.default_rng(16)
    multiple = PathEngine(make_kernel("rbf", gamma=0.5), C=10.0)
    multiple.update(X[:120], y[:120], keys=list(range(120)))
    single = PathEngine(make_kernel("rbf", gamma=0.5), C=10.0)
    for i in range(120):
        single.update(X[i : i + 1], y[i : i + 1], keys=[i])
    probes = rng.standard_normal((50, 2))
    np.testing.assert_allclose(multiple.decision_function(probes),
                               single.decision_function(probes), atol=1e-8)
    for m, l in [(1, 0), (0, 1), (30, 0), (0, 30), (25, 25), (50, 50)]:
        added = [int(i) for i in rng.choice(np.arange(120, 200), size=m, replace=False)
                 if int(i) not in multiple]
        removed = [multiple.keys[int(i)] for i in rng.choice(multiple.n, size=l, replace=False)]
        multiple.update(X[added], y[added], keys=added, remove=removed)
        for key in removed:
            single.update(remove=[key])
        for key in added:
            single.update(X[key : key + 1], y[key : key + 1], keys=[key])
        assert sorted(multiple.keys) == sorted(single.keys)
        np.testing.assert_allclose(multiple.decision_function(probes),
                                   single.decision_function(probes), atol=1e-8)
        assert_matches_batch(multiple, probes)


def test_update_emptying_the_margin_set_and_back():
    X, y = two_rings(60, seed=17)
    engine = PathEngine(make_kernel("rbf", gamma=0.5), C=1.0)
    engine.update(X, y, keys=list(range(60)))
    engine.update(remove=engine.keys[:-2])  # keep two points
    assert kkt_violation(engine) < 1e-9
    engine.update(remove=engine.keys)  # nothing left
    assert engine.n == 0 and engine.n_margin == 0
    engine.update(X[:30], y[:30], keys=list(range(30)))
    assert_matches_batch(engine, X[30:])


def test_first_points_of_one_class_then_the_other():
    engine = PathEngine(make_kernel("rbf", gamma=1.0), C=2.0)
    engine.update(np.array([[0.0, 0.0]]), np.array([1.0]), keys=["a"])
    assert kkt_violation(engine) < 1e-12 and engine.decision_function(np.zeros((1, 2)))[0] > 0
    engine.update(np.array([[1.0, 0.0]]), np.array([1.0]), keys=["b"])
    engine.update(np.array([[3.0, 0.0]]), np.array([-1.0]), keys=["c"])
    assert_matches_batch(engine, np.array([[0.5, 0.0], [2.0, 0.0], [5.0, 1.0]]))


def test_breakpoint_bound_raises_and_leaves_engine_unchanged():
    X, y = two_rings(80, seed=18)
    engine = PathEngine(make_kernel("rbf", gamma=0.5), C=10.0, max_breakpoints=2)
    for i in range(10):
        try:
            engine.update(X[i : i + 1], y[i : i + 1], keys=[i])
        except ConvergenceError:
            pass
    before = engine.get_state()
    probes = X[40:]
    decisions = engine.decision_function(probes)
    with pytest.raises(ConvergenceError, match="max_breakpoints=2"):
        engine.update(X[10:70], y[10:70], keys=list(range(10, 70)))
    after = engine.get_state()
    for name in before:
        np.testing.assert_array_equal(before[name], after[name])
    np.testing.assert_array_equal(decisions, engine.decision_function(probes))
    # S's kernel columns (a snapshot does not copy them) are recomputed when next needed:
    # they are S's columns again, and the engine goes on to the exact optimum.
    engine._ensure_columns()
    k, n = engine.n_margin, engine.n
    if k:
        expected = engine.kernel(engine.X, engine.X[engine._margin]).T
        np.testing.assert_allclose(engine._columns[engine._store[:k], :n], expected,
                                   rtol=1e-14, atol=1e-15)
    engine.max_breakpoints = None
    engine.update(X[10:70], y[10:70], keys=list(range(10, 70)))
    assert_matches_batch(engine, probes)


def test_bad_updates_leave_engine_unchanged():
    X, y = two_rings(20, seed=19)
    engine = PathEngine(make_kernel("rbf", gamma=0.5), C=1.0)
    engine.update(X, y, keys=list(range(20)))
    state = engine.get_state()
    with pytest.raises(KeyError, match="already stored"):
        engine.update(X[:1], y[:1], keys=[3])
    with pytest.raises(KeyError, match="no stored point has key 99"):
        engine.update(remove=[99])
    with pytest.raises(ValueError, match="non-finite"):
        engine.update(np.array([[np.nan, 1.0]]), np.array([1.0]), keys=["x"])
    with pytest.raises(ValueError, match=r"\+1 or -1"):
        engine.update(np.array([[0.0, 1.0]]), np.array([2.0]), keys=["x"])
    # Each check looks at every point, not the first one only.
    with pytest.raises(ValueError, match="X_add contains non-finite"):
        engine.update(np.array([[0.0, 1.0], [1.0, -np.inf]]), [1.0, 1.0], keys=["x", "z"])
    with pytest.raises(ValueError, match=r"\+1 or -1"):
        engine.update(np.zeros((3, 2)), [1.0, -1.0, np.nan], keys=["x", "z", "w"])
    with pytest.raises(ValueError, match="linear contains non-finite"):
        engine.update(np.zeros((2, 2)), [1.0, -1.0], ["x", "z"], linear=[-1.0, np.inf])
    with pytest.raises(ValueError, match="gap must hold numbers >= 0"):
        engine.update(np.zeros((2, 2)), [1.0, -1.0], ["x", "z"], gap=[1.0, np.nan])
    with pytest.raises(ValueError, match="must be 2-D"):
        engine.update(np.zeros((1, 1, 2)), [1.0], keys=["x"])
    for name, array in engine.get_state().items():
        np.testing.assert_array_equal(state[name], array)


def test_points_given_as_strided_views_are_learned_as_copies_would_be():
    """Rows taken with a step, columns of a Fortran-ordered array and labels with a stride
    are stored as their values, the same as contiguous copies."""
    X, y = two_rings(40, seed=21)
    wide = np.asfortranarray(np.hstack([X, X]))
    views = PathEngine(make_kernel("rbf", gamma=0.5), C=1.0)
    views.update(wide[::2, :2], np.repeat(y[::2], 2)[::2], keys=list(range(20)))
    copies = PathEngine(make_kernel("rbf", gamma=0.5), C=1.0)
    copies.update(X[::2].copy(), y[::2].copy(), keys=list(range(20)))
    np.testing.assert_array_equal(views.X, copies.X)
    assert np.array_equal(views.decision_function(X), copies.decision_function(X))


def test_state_roundtrip_reproduces_decisions():
    X, y = two_rings(100, seed=20)
    engine = PathEngine(make_kernel("rbf", gamma=0.5), C=10.0)
    engine.update(X[:80], y[:80], keys=list(range(80)))
    copy = PathEngine(make_kernel("rbf", gamma=0.5), C=10.0)
    copy.set_state(engine.get_state(), engine.keys)
    np.testing.assert_array_equal(copy.decision_function(X), engine.decision_function(X))
    engine.update(X[80:], y[80:], keys=list(range(80, 100)), remove=[0, 1, 2])
    copy.update(X[80:], y[80:], keys=list(range(80, 100)), remove=[0, 1, 2])
    np.testing.assert_allclose(copy.decision_function(X), engine.decision_function(X), atol=1e-9)


def test_libsvm_oracle_polish_is_sharper_than_raw():
    X, y = two_rings(100, seed=21)
    engine = PathEngine(make_kernel("rbf", gamma=0.5), C=10.0)
    engine.update(X, y, keys=list(range(100)))
    oracle = BatchOptimum(engine)
    assert oracle.objective() <= float(
        0.5 * (oracle.raw_alpha * y) @ oracle.K @ (oracle.raw_alpha * y) - oracle.raw_alpha.sum()
    ) + 1e-9


def _slide_and_check_recent_columns(forget_between: bool) -> tuple[PathEngine, int]:
    """A window of two-rings points slid 10 at a time, with single removals and a refused
    update between; after every update, each kept column must be the kernel column of the
    point it is filed under. Returns the engine and how many columns were reused."""
    X, y = two_rings(300, seed=11)
    engine = PathEngine(make_kernel("rbf", gamma=0.7), C=10.0)
    rng = np.random.default_rng(13)
    window: list[int] = []
    reused = 0
    for step, start in enumerate(range(0, 300, 10)):
        if forget_between:
            engine._forget_recent()
        new = list(range(start, start + 10))
        old = window[:10] if len(window) >= 60 else []
        reused += engine.update(X[new], y[new], keys=new, remove=old).columns_reused
        window = [key for key in window if key not in old] + new
        if step == 12:  # a refused update leaves the engine (and what it keeps) as it was
            with pytest.raises(KeyError):
                engine.update(X[:1], y[:1], keys=[window[0]])
        if rng.random() < 0.3:  # a single removal moves the last stored points into the holes
            engine.update(remove=[window.pop(int(rng.integers(len(window))))])
        n = engine.n
        for row in np.flatnonzero(engine._recent_of >= 0):
            position = int(engine._recent_of[row])
            expected = engine.kernel(engine.X, engine.X[position : position + 1])[:, 0]
            np.testing.assert_allclose(engine._recent[row, :n], expected, rtol=1e-13,
                                       atol=1e-15, err_msg=f"step {step}, row {row}")
        assert kkt_violation(engine) < 1e-8 * engine.C
    return engine, reused


def test_recent_kernel_columns_follow_their_points_across_updates():
    """Columns of points that left S are kept for later updates (a returning point copies its
    column instead of computing it): through additions, removals (which move stored points),
    a refused update and growth of the storage, every kept column stays its point's, the
    model stays exact, and more columns are reused than when each update starts afresh."""
    engine, reused = _slide_and_check_recent_columns(forget_between=False)
    _, reused_afresh = _slide_and_check_recent_columns(forget_between=True)
    assert reused > reused_afresh
    probes = np.random.default_rng(12).standard_normal((30, 2)) * 1.5
    assert_matches_batch(engine, probes)


def test_a_rollback_evaluates_no_kernel_and_a_failing_kernel_leaves_the_engine_as_it_was(
        monkeypatch):
    """After a refused update S's kernel columns are recomputed when next needed, not by the
    rollback (which must not fail halfway): a kernel that raises then refuses that update
    too, the engine unchanged, and the next one goes through to the exact optimum. A user's
    kernel has the columns copied instead, so that one refusing big blocks (here more than one
    column) still learns one point at a time after a refused block."""
    X, y = two_rings(80, seed=21)
    probes = X[60:]
    engine = PathEngine(make_kernel("rbf", gamma=0.5), C=10.0)
    engine.update(X[:30], y[:30], keys=list(range(30)))
    engine.max_breakpoints = 1
    with pytest.raises(ConvergenceError):
        engine.update(X[30:50], y[30:50], keys=list(range(30, 50)))
    engine.max_breakpoints = None
    state, decisions = engine.get_state(), engine.decision_function(probes)
    original = PathEngine._kernel_columns

    def failing(self, positions, features=None):
        raise MemoryError("no room for the columns")

    monkeypatch.setattr(PathEngine, "_kernel_columns", failing)
    with pytest.raises(MemoryError):
        engine.update(X[30:31], y[30:31], keys=[30])
    for name, array in engine.get_state().items():
        np.testing.assert_array_equal(state[name], array, err_msg=name)
    np.testing.assert_array_equal(decisions, engine.decision_function(probes))
    monkeypatch.setattr(PathEngine, "_kernel_columns", original)
    engine.update(X[30:50], y[30:50], keys=list(range(30, 50)))
    assert_matches_batch(engine, probes)

    def one_column_at_a_time(A, B):
        if B.shape[0] > 1:
            raise MemoryError("block too large")
        return np.exp(-0.5 * ((A[:, None, :] - B[None, :, :]) ** 2).sum(-1))

    user = PathEngine(make_kernel(one_column_at_a_time), C=10.0)
    for i in range(30):
        user.update(X[i : i + 1], y[i : i + 1], keys=[i])
    with pytest.raises(MemoryError):
        user.update(X[30:32], y[30:32], keys=[30, 31])
    for i in range(30, 40):
        user.update(X[i : i + 1], y[i : i + 1], keys=[i])
    # The same optimum as the built-in kernel's on the same 40 points (compared through the
    # solution: this kernel cannot evaluate a block of support vectors).
    reference = PathEngine(make_kernel("rbf", gamma=0.5), C=10.0)
    reference.update(X[:40], y[:40], keys=list(range(40)))
    assert user.kkt_violation() < 1e-8 * user.C
    np.testing.assert_allclose(user.get_state()["alpha"], reference.get_state()["alpha"],
                               atol=1e-7 * user.C)
    assert abs(user.b - reference.b) < 1e-7


@pytest.mark.parametrize("C", [10.0, 1e-3])
def test_updates_adding_only_satisfied_points_extend_the_last_check(monkeypatch, C):
    """An update whose new points all go to the reserve set (alpha = 0), with nothing removed
    and b where it was, changes no stored point's g: only the new points are checked, and the
    last check's terms are extended. Mixed with paths, removals and refused updates, and at a
    C so small that no coefficient is free (b then moves with every point, which needs the full
    recomputation), g and the terms stay what a full recomputation gives, every point holds
    its KKT condition, and the model is the batch optimum."""
    X, y = two_rings(260, seed=31, noise=0.05)
    probes = np.random.default_rng(32).standard_normal((30, 2)) * 1.5
    engine = PathEngine(make_kernel("rbf", gamma=0.5), C=C)
    refreshes = []
    original = PathEngine._refresh_g

    def counted(self, g=None):
        if g is None:  # the engine's own g: a full recomputation within an update
            refreshes.append(self.n)
        return original(self, g)

    monkeypatch.setattr(PathEngine, "_refresh_g", counted)
    engine.update(X[:40], y[:40], keys=list(range(40)))
    without_refresh = with_b_free = 0
    rng = np.random.default_rng(33)
    for i in range(40, 260):
        before = len(refreshes)
        engine.update(X[i : i + 1], y[i : i + 1], keys=[i])
        if not engine.b_is_fixed():
            with_b_free += 1
            assert len(refreshes) > before, f"point {i}: b is centred, g must be recomputed"
        elif engine.last_update.breakpoints == 0 and len(refreshes) == before:
            without_refresh += 1
        if i % 25 == 0:
            engine.update(remove=[engine.keys[int(rng.integers(engine.n))]])
        if i == 150:
            with pytest.raises(ValueError):
                engine.update(np.array([[np.nan, 0.0]]), np.array([1.0]), keys=["bad"])
            with pytest.raises(KeyError):
                engine.update(X[:1], y[:1], keys=[engine.keys[0]])
        g_fresh = np.empty(engine.n)
        terms = original(engine, g_fresh)[0]
        if engine._terms_cache is not None:
            np.testing.assert_allclose(engine._terms_cache, terms, rtol=1e-12, err_msg=f"{i}")
        assert np.all(np.abs(engine.g - g_fresh) <= 1e-12 * terms), f"point {i}"
        assert kkt_violation(engine) < 1e-8 * max(1.0, C), f"point {i}"
    if C > 1:
        assert without_refresh > 100  # most points land in the reserve set here
    else:
        assert with_b_free > 50  # often no free coefficient: b moves with the points
    assert_matches_batch(engine, probes)


def test_the_features_kept_for_the_kernel_loops_follow_x_through_every_change():
    """The compiled kernel loops read the features from a feature-by-feature copy kept with
    X. Through additions, removals (which move points into the holes), a refused update (a
    rollback), a widening of the features, growth of the storage and a copy, it must hold
    every stored point's features: a stale copy would give wrong kernel values and a wrong
    optimum."""
    import copy

    rng = np.random.default_rng(31)
    X = rng.standard_normal((260, 3))
    y = np.where(X[:, 0] ** 2 + X[:, 1] ** 2 > 1.2, 1.0, -1.0)
    engine = PathEngine(make_kernel("rbf", gamma=0.8), C=5.0)

    def check(when: str) -> None:
        features = engine._features_by_column()
        np.testing.assert_array_equal(features[:, : engine.n], engine.X.T, err_msg=when)

    engine.update(X[:40], y[:40], keys=list(range(40)))
    check("after the first batch")
    for start in range(40, 200, 20):  # slides: removals fill holes with the last points
        engine.update(X[start : start + 20], y[start : start + 20],
                      keys=list(range(start, start + 20)), remove=list(range(start - 40,
                                                                             start - 20)))
        check(f"after the slide at {start}")
    engine.max_breakpoints = 1
    with pytest.raises(ConvergenceError):
        engine.update(X[200:230], y[200:230], keys=list(range(200, 230)),
                      remove=list(range(160, 175)))
    engine.max_breakpoints = None
    check("after a refused update")
    wider = np.hstack([X[230:240], rng.standard_normal((10, 1))])
    engine.update(wider, y[230:240], keys=list(range(230, 240)))
    check("after a widening")
    engine.update(np.hstack([X[240:260], np.zeros((20, 1))]), y[240:260],
                  keys=list(range(240, 260)), remove=list(range(160, 170)))
    check("after growth")
    twin = copy.deepcopy(engine)
    twin.update(np.hstack([X[:5] + 3.0, np.ones((5, 1))]), y[:5], keys=["a", "b", "c", "d", "e"],
                remove=list(range(170, 180)))
    np.testing.assert_array_equal(twin._features_by_column()[:, : twin.n], twin.X.T)
    assert_matches_batch(twin, rng.standard_normal((30, 4)))
    assert_matches_batch(engine, rng.standard_normal((30, 4)))


def _rbf_failing_on_demand(gamma: float):
    """A user-callable RBF kernel and its switch: with ``armed["calls_left"] = k`` it answers
    k more calls, then raises MemoryError (None: never)."""
    armed: dict = {"calls_left": None}

    def rbf(A, B):
        if armed["calls_left"] is not None:
            if armed["calls_left"] == 0:
                raise MemoryError("kernel failed")
            armed["calls_left"] -= 1
        return np.exp(-gamma * ((A[:, None, :] - B[None, :, :]) ** 2).sum(-1))

    return rbf, armed


def test_an_update_that_adds_points_rolls_back_from_wherever_it_fails():
    """An update that only adds points copies the stored state only when it first changes a
    stored point. A kernel failing before that (the new point's column) or after (a column
    the path asks for) leaves the engine exactly as it was, keys, order and counters
    included, and the same update then gives what an engine that never failed gives."""
    X, y = two_rings(90, seed=41)
    rbf, armed = _rbf_failing_on_demand(0.5)
    engine = PathEngine(make_kernel(rbf), C=10.0)
    reference = PathEngine(make_kernel("rbf", gamma=0.5), C=10.0)
    for i in range(30):
        engine.update(X[i : i + 1], y[i : i + 1], keys=[i])
        reference.update(X[i : i + 1], y[i : i + 1], keys=[i])
    failed_at = set()
    for i in range(30, 90):
        for calls_before_failure in (0, 1):
            state, keys = engine.get_state(), list(engine.keys)
            counters = (engine._next_seq, engine.updates_total, engine.breakpoints_total)
            armed["calls_left"] = calls_before_failure
            try:
                engine.update(X[i : i + 1], y[i : i + 1], keys=[i])
            except MemoryError:
                failed_at.add(calls_before_failure)
                for name, array in engine.get_state().items():
                    np.testing.assert_array_equal(state[name], array, err_msg=name)
                assert list(engine.keys) == keys and i not in engine
                assert (engine._next_seq, engine.updates_total,
                        engine.breakpoints_total) == counters
            else:
                break
            finally:
                armed["calls_left"] = None
        else:
            engine.update(X[i : i + 1], y[i : i + 1], keys=[i])
        reference.update(X[i : i + 1], y[i : i + 1], keys=[i])
        np.testing.assert_allclose(engine.decision_function(X), reference.decision_function(X),
                                   rtol=0, atol=1e-9)
    # Both kinds of failure happened: before any stored point changed, and along a path.
    assert failed_at == {0, 1}
    assert_matches_batch(engine, X[:10])


def test_a_rollback_after_an_add_only_update_moved_stored_points_restores_their_rows():
    """The snapshot of an update that only appends points leaves out the stored points'
    features, keys and sequence numbers (they stay in place). When that update moves stored
    points after all (the recovery path removes points and adds them back), their rows go
    into the snapshot first, and a rollback restores every row, key and position."""
    X, y = two_rings(40, seed=43)
    engine = PathEngine(make_kernel("rbf", gamma=0.5), C=1.0)
    engine.update(X[:30], y[:30], keys=list(range(30)))
    state, keys = engine.get_state(), list(engine.keys)
    sequence = engine._seq[: engine.n].copy()
    reserve = [p for p in range(engine.n) if engine._status[p] == 2][:3]  # RESERVE
    assert len(reserve) == 3, "the data should leave reserve points"
    engine._undo = engine._light_snapshot()  # what update() does for an add-only update
    engine._append(X[30:32], y[30:32], [30, 31], np.full(2, -1.0), np.full(2, np.inf))
    engine._before_change()
    assert engine._undo["X"] is None  # the rows are left out ...
    engine._delete_positions(reserve)
    assert engine._undo["X"] is not None  # ... until a stored point moves
    engine._roll_back()
    engine._undo = None
    for name, array in engine.get_state().items():
        np.testing.assert_array_equal(state[name], array, err_msg=name)
    assert list(engine.keys) == keys
    assert all(engine.position(key) == position for position, key in enumerate(keys))
    np.testing.assert_array_equal(engine._seq[: engine.n], sequence)
    engine.update(X[30:], y[30:], keys=list(range(30, 40)))
    assert_matches_batch(engine, X[:10])


def test_a_kernel_that_reuses_its_output_buffer_gives_the_exact_model():
    """A callable kernel may return a view of one buffer it overwrites on every call: the path
    asks it for more columns while it still uses the new point's, which must therefore be a
    copy. Learned one point at a time (every point driven), the model equals the built-in
    RBF's and the batch optimum."""
    pool = np.empty(10**5)

    def pooled_rbf(A, B):
        out = pool[: A.shape[0] * B.shape[0]].reshape(A.shape[0], B.shape[0])
        out[:] = np.exp(-0.5 * ((A[:, None, :] - B[None, :, :]) ** 2).sum(-1))
        return out

    rng = np.random.default_rng(1)
    X = rng.normal(size=(150, 2))
    y = np.where(X[:, 0] + rng.normal(size=150) > 0, 1.0, -1.0)
    pooled = PathEngine(make_kernel(pooled_rbf), C=1.0)
    built_in = PathEngine(make_kernel("rbf", gamma=0.5), C=1.0)
    retried = 0
    for i in range(150):
        retried += pooled.update(X[i : i + 1], y[i : i + 1], keys=[i]).retried
        built_in.update(X[i : i + 1], y[i : i + 1], keys=[i])
    assert retried == 0  # no update derailed into the one-at-a-time recovery
    np.testing.assert_allclose(pooled.decision_function(X), built_in.decision_function(X),
                               rtol=0, atol=1e-9)
    assert_matches_batch(pooled, X[:10])


def test_a_regression_update_rolls_back_its_new_points_sides_too():
    """With finite gaps (epsilon-SVR: a new point may take its other side on arrival) a kernel
    failing on the new point's column or along the path leaves the engine exactly as it was,
    and the stream then reaches what an engine that never failed reaches."""
    rng = np.random.default_rng(5)
    X = rng.normal(size=(60, 3))
    target = np.sin(X[:, 0]) + 0.1 * rng.normal(size=60)
    epsilon = 0.1
    rbf, armed = _rbf_failing_on_demand(0.7)
    engine = PathEngine(make_kernel(rbf), C=5.0)
    reference = PathEngine(make_kernel("rbf", gamma=0.7), C=5.0)
    failed_at = set()
    for i in range(60):
        # One sample: one point of the engine with y = +1, p = epsilon - target, gap 2 epsilon.
        sample = (X[i : i + 1], np.ones(1))
        terms = {"keys": [i], "linear": np.array([epsilon - target[i]]),
                 "gap": np.array([2 * epsilon])}
        for calls_before_failure in (0, 1, 2):
            state, keys, order = engine.get_state(), list(engine.keys), engine._next_seq
            armed["calls_left"] = calls_before_failure
            try:
                engine.update(*sample, **terms)
            except MemoryError:
                failed_at.add(calls_before_failure)
                for name, array in engine.get_state().items():
                    np.testing.assert_array_equal(state[name], array, err_msg=name)
                assert list(engine.keys) == keys and engine._next_seq == order
            else:
                break
            finally:
                armed["calls_left"] = None
        else:
            engine.update(*sample, **terms)
        reference.update(*sample, **terms)
    assert failed_at == {0, 1, 2}
    np.testing.assert_allclose(engine.decision_function(X), reference.decision_function(X),
                               rtol=0, atol=1e-9)
    assert engine.kkt_violation() < 1e-9
