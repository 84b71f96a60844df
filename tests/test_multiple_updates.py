"""Karasuyama & Takeuchi's multiple incremental/decremental update: every kind of update equals
the batch optimum and the repeated single updates; the Fisher sliding window stays exact."""

from __future__ import annotations

import copy

import numpy as np
import pandas as pd
import pytest

from stream_svm import IncrementalSVC, IncrementalSVR, SlidingWindowSVC, SlidingWindowSVR
from stream_svm.datasets import load_river_flow
from stream_svm.engine import PathEngine
from stream_svm.kernels import make_kernel
from tests.oracle import assert_matches_batch, kkt_violation


def gaussian_mixture(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Karasuyama's artificial set: +1 from a mixture of two Gaussians, -1 from one."""
    rng = np.random.default_rng(seed)
    positive = rng.random(n) < 0.5
    centers = np.where(rng.random(n)[:, None] < 0.5, [[-1.5, 1.0]], [[1.5, 1.0]])
    X = np.where(positive[:, None], centers + rng.standard_normal((n, 2)) * 0.8,
                 rng.standard_normal((n, 2)) * 1.0)
    return X, np.where(positive, 1.0, -1.0)


def single_updates(engine: PathEngine, X, y, added, removed) -> None:
    for key in removed:
        engine.update(remove=[key])
    for key in added:
        engine.update(X[key : key + 1], y[key : key + 1], keys=[key])


@pytest.mark.parametrize("kind", ["add", "remove", "both"])
@pytest.mark.parametrize("size", [1, 2, 5, 13, 30, 50])
def test_every_kind_of_multiple_update(kind, size):
    X, y = gaussian_mixture(400, seed=size)
    rng = np.random.default_rng(100 + size)
    base = PathEngine(make_kernel("rbf", gamma=1.0), C=10.0)
    base.update(X[:250], y[:250], keys=list(range(250)))
    m = size if kind in ("add", "both") else 0
    l = size if kind in ("remove", "both") else 0
    added = [int(i) for i in rng.choice(np.arange(250, 400), size=m, replace=False)]
    removed = [int(i) for i in rng.choice(250, size=l, replace=False)]
    multiple, single = base, copy.deepcopy(base)
    multiple.update(X[added], y[added], keys=added, remove=removed)
    assert not multiple.last_update.retried  # the multiple path itself held
    mid_breakpoints = multiple.last_update.breakpoints
    sid_before = single.breakpoints_total
    single_updates(single, X, y, added, removed)
    probes = np.random.default_rng(7).standard_normal((60, 2)) * 2
    assert_matches_batch(multiple, probes)
    np.testing.assert_allclose(multiple.decision_function(probes),
                               single.decision_function(probes), atol=1e-8)
    assert sorted(multiple.keys) == sorted(single.keys)
    if size >= 30:
        assert mid_breakpoints < single.breakpoints_total - sid_before


@pytest.mark.parametrize("seed", [1, 3])
def test_a_margin_set_that_outgrows_its_room_within_one_path_stays_exact(seed):
    """The loop asks Python for more room when S fills what it was given (|S| + 16): the
    factor and the work arrays are reallocated in the middle of the path, and what the loop
    kept up to date in them must be recomputed. Windows of 300 points sliding by 50 at
    C = 1000 grow S past that room with stored points entering it; every path must hold on
    its own (no fallback to single updates) and reach the batch optimum."""
    X, y = gaussian_mixture(600, seed=seed)
    engine = PathEngine(make_kernel("rbf", gamma=4.0), C=1000.0)
    engine.update(X[:300], y[:300], keys=list(range(300)))
    probes = np.random.default_rng(3).standard_normal((60, 2)) * 2
    for step in range(6):
        new = list(range(300 + 50 * step, 350 + 50 * step))
        engine.update(X[new], y[new], keys=new, remove=list(range(50 * step, 50 * step + 50)))
        assert not engine.last_update.retried, f"step {step}"
    assert_matches_batch(engine, probes)


def test_added_points_end_in_every_set_and_margin_empties():
    X, y = gaussian_mixture(300, seed=1)
    seen: dict[str, int] = {}
    engine = PathEngine(make_kernel("rbf", gamma=1.0), C=1.0)
    engine.update(X[:100], y[:100], keys=list(range(100)))
    for name, count in engine.last_update.migrations.items():
        seen[name] = seen.get(name, 0) + count
    engine.update(X[100:200], y[100:200], keys=list(range(100, 200)), remove=list(range(50)))
    for name, count in engine.last_update.migrations.items():
        seen[name] = seen.get(name, 0) + count
    assert_matches_batch(engine, X[200:])
    # Added points ended at C (error), in the margin set, and settled at once (reserve).
    assert seen.get("added->error", 0) and seen.get("added->margin", 0)
    assert seen.get("added->reserve", 0)
    # Remove everything but one point of each class: the margin set empties on the way.
    positives = [k for k in engine.keys if y[k] > 0]
    negatives = [k for k in engine.keys if y[k] < 0]
    engine.update(X[200:205], y[200:205], keys=list(range(200, 205)),
                  remove=positives[1:] + negatives[1:])
    assert kkt_violation(engine) < 1e-9
    assert_matches_batch(engine, X[250:])
    engine.update(remove=engine.keys)
    assert engine.n == 0 and engine.n_margin == 0 and engine.b == engine.b
    engine.update(X[:50], y[:50], keys=list(range(50)))  # starting again from empty
    assert_matches_batch(engine, X[250:])


def test_multiple_update_needs_fewer_breakpoints_than_single():
    """At m = 50 added points the path is shorter than 50 single paths (Karasuyama sec 3.4)."""
    X, y = gaussian_mixture(600, seed=3)
    base = PathEngine(make_kernel("rbf", gamma=1.0), C=10.0)
    base.update(X[:500], y[:500], keys=list(range(500)))
    single = copy.deepcopy(base)
    added = list(range(500, 550))
    base.update(X[added], y[added], keys=added)
    before = single.breakpoints_total
    single_updates(single, X, y, added, [])
    assert base.last_update.breakpoints < 0.8 * (single.breakpoints_total - before)


@pytest.mark.parametrize("window_size,C,gamma", [
    (400, 1.0, 0.1),
    (400, 100.0, 1.0),
    pytest.param(1423, 10.0, 0.1, marks=pytest.mark.slow),  # the paper's window
])
def test_fisher_sliding_window_is_exact_at_every_step(shared_data, window_size, C, gamma):
    directory = shared_data / "fisher-river"
    if not directory.is_dir():
        pytest.skip(f"{directory} not found")
    X, y, names = load_river_flow(directory)
    window = SlidingWindowSVC(window_size=window_size, step=30, C=C, gamma=gamma)
    rows = [dict(zip(names, row, strict=True)) for row in X]
    steps = 0
    for i, (x, label) in enumerate(zip(rows, y, strict=True)):
        window.learn_one(x, bool(label > 0), key=i)
        if window.n_buffered == 0:
            engine = window._engine
            assert kkt_violation(engine) < 1e-8 * max(1.0, C), f"after sample {i}"
            # ... on the multiple path itself, not after falling back to single updates
            assert not engine.last_update.retried, f"after sample {i}"
            assert sorted(engine.keys) == list(range(max(0, i + 1 - window_size), i + 1))
            if i >= window_size:
                steps += 1
                if steps % 8 == 1:
                    probes = X[i + 1 : i + 41] if i + 41 <= len(X) else X[:40]
                    assert_matches_batch(engine, probes)
    assert steps == (len(X) - window_size) // 30
    assert_matches_batch(window._engine, X[:40])


@pytest.mark.slow
def test_flat_kernel_one_shot_window_stays_exact(shared_data):
    """gamma = 1e-3 on [0, 1]^21 puts every kernel value in [0.979, 1]: K_SS is nearly singular.
    The round-off of each direction must be told apart from real sensitivities, or the path
    cycles (it did, at this very update, before the noise-aware threshold)."""
    directory = shared_data / "fisher-river"
    if not directory.is_dir():
        pytest.skip(f"{directory} not found")
    X, y, _ = load_river_flow(directory)
    engine = PathEngine(make_kernel("rbf", gamma=1e-3), C=0.1)
    engine.update(X[:1393], y[:1393], keys=list(range(1393)))
    assert kkt_violation(engine) < 1e-9
    engine.update(X[1393:1423], y[1393:1423], keys=list(range(1393, 1423)),
                  remove=list(range(30)))
    assert kkt_violation(engine) < 1e-9
    assert_matches_batch(engine, X[1423:])


@pytest.mark.parametrize("C", [1e10, 1e12, 1e15])
def test_a_slide_keeps_the_equality_where_C_dwarfs_the_coefficients(C):
    # An RBF this narrow makes the kernel the identity on these points, and the solutions are
    # known: SVR with epsilon = 0 interpolates, theta = t - b with sum(theta) = 0, so b is
    # the mean target; SVC on two points of opposite labels has alpha = 1 and b = 0. The
    # coefficients are about 1 while the added points are driven towards C: a path that
    # judged the removals left at its end against C's round-off (2e-4 at C = 1e12) dropped
    # them whole, and the window's sum(y alpha) was 0.75 instead of 0.
    from stream_svm import SlidingWindowSVR

    targets = [0.3, -0.2, 0.5, 0.1, 0.7]
    regressor = SlidingWindowSVR(window_size=2, C=C, epsilon=0.0, gamma=1e6)
    classifier = SlidingWindowSVC(window_size=2, C=C, gamma=1e6)
    for i, target in enumerate(targets):
        regressor.learn_one({"a": float(i)}, target, key=i)
        classifier.learn_one({"a": float(i)}, i % 2 == 0, key=i)
    assert abs(regressor.dual_coef().sum()) < 1e-12
    assert regressor.predict_one({"a": 100.0}) == pytest.approx(0.4, abs=1e-12)
    assert regressor.predict_one({"a": 3.0}) == pytest.approx(0.1, abs=1e-12)
    engine = classifier._engine
    n = engine.n
    assert abs(float(engine._y[:n] @ engine._alpha[:n])) < 1e-12
    assert engine._alpha[:n] == pytest.approx([1.0, 1.0], abs=1e-12)
    assert classifier.decision_function_one({"a": 100.0}) == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("regression", [False, True])
def test_a_window_forgets_many_samples_at_once_window_and_buffer_alike(regression):
    from stream_svm import IncrementalSVC, IncrementalSVR, SlidingWindowSVR

    window_class, batch_class = ((SlidingWindowSVR, IncrementalSVR) if regression
                                 else (SlidingWindowSVC, IncrementalSVC))
    rng = np.random.default_rng(3)
    points = rng.normal(size=(14, 2))
    labels = [float(a + b) if regression else bool(a * b > 0) for a, b in points]
    model = window_class(window_size=10, step=4, C=2.0, gamma=0.5)
    for i, (a, b) in enumerate(points):
        model.learn_one({"a": a, "b": b}, labels[i], key=i)
    # Slides after 4, 8 and 12 samples: the window holds 2..11, the buffer 12 and 13.
    assert sorted(model.stored_keys()) == list(range(2, 12)) and model.n_buffered == 2
    before = model.to_checkpoint()[1]
    with pytest.raises(KeyError, match="no sample in the window has key 99"):
        model.forget_many([5, 99])  # all or nothing
    assert model.to_checkpoint()[1] == before and 5 in model
    model.forget_many([5, 8, 13])  # 13 waits in the buffer
    frame = pd.DataFrame([{"a": points[6][0], "b": points[6][1]}])
    model.forget_many(X=frame, y=pd.Series([labels[6]]))  # by value
    kept = [2, 3, 4, 7, 9, 10, 11]
    assert sorted(model.stored_keys()) == kept and model.n_buffered == 1
    assert 13 not in model and 12 in model
    # The window is the model of what it holds.
    batch = batch_class(C=2.0, gamma=0.5)
    for i in kept:
        batch.learn_one({"a": points[i][0], "b": points[i][1]}, labels[i], key=i)
    for a, b in rng.normal(size=(20, 2)):
        probe = {"a": a, "b": b}
        if regression:
            assert model.predict_one(probe) == pytest.approx(batch.predict_one(probe), abs=1e-9)
        else:
            assert model.decision_function_one(probe) == pytest.approx(
                batch.decision_function_one(probe), abs=1e-9)


@pytest.mark.parametrize("window", [SlidingWindowSVC, SlidingWindowSVR])
def test_a_key_waiting_in_the_buffer_is_already_stored(window):
    # With step > 1 a key waiting for the next slide (or repeated within a batch) must be
    # refused: two samples sharing it would make every later slide refused.
    label = (lambda v: float(v)) if window is SlidingWindowSVR else (lambda v: v > 0)
    model = window(window_size=6, step=3)
    model.learn_one({"a": 1.0}, label(1), key="k")
    before = model.to_checkpoint()[1]
    with pytest.raises(KeyError, match="key 'k' is already stored"):
        model.learn_one({"a": -1.0}, label(-1), key="k")
    with pytest.raises(KeyError, match="key 'k' is already stored"):
        model.learn_many(pd.DataFrame({"a": [2.0, -2.0]}), pd.Series([label(2), label(-2)]),
                         keys=["j", "k"])
    with pytest.raises(KeyError, match="keys repeat within the batch"):
        model.learn_many(pd.DataFrame({"a": [2.0, -2.0]}), pd.Series([label(2), label(-2)]),
                         keys=["j", "j"])
    assert model.to_checkpoint()[1] == before and model.n_buffered == 1


@pytest.mark.parametrize("window", [SlidingWindowSVC, SlidingWindowSVR])
def test_forgetting_by_value_in_the_buffer_matches_the_label_and_every_feature(window):
    # Each of these must forget the sample given, not the buffered one with the other label,
    # the older one equal on its fewer features only, or one sample twice over.
    label = (lambda v: float(v)) if window is SlidingWindowSVR else (lambda v: v > 0)
    model = window(window_size=8, step=8)  # everything below waits in the buffer
    model.learn_one({"a": 1.0}, label(1), key="short")
    model.learn_one({"a": 1.0, "b": 1.0}, label(1), key="long")
    for key in ("twin1", "twin2", "other"):
        model.learn_one({"c": 1.0}, label(1 if key != "other" else -1), key=key)
    assert model.n_buffered == 5
    with pytest.raises(KeyError, match=r"no stored (point|sample) equals x=\{.a.: 1.0\}"):
        model.forget_one({"a": 1.0}, label(-1))
    assert "short" in model
    model.forget_one({"a": 1.0, "b": 1.0}, label(1))
    assert "long" not in model and "short" in model
    model.forget_many(X=pd.DataFrame({"c": [1.0, 1.0]}), y=pd.Series([label(1), label(1)]))
    assert "twin1" not in model and "twin2" not in model and "other" in model
    assert model.n_buffered == 2


@pytest.mark.parametrize("make", [
    lambda: IncrementalSVC(C=3.0),
    lambda: IncrementalSVR(C=3.0, epsilon=0.1),
    lambda: SlidingWindowSVC(window_size=5),
    lambda: SlidingWindowSVR(window_size=5),
])
@pytest.mark.parametrize("all_at_once", [False, True])
def test_a_model_that_forgot_every_point_is_the_model_of_no_point(make, all_at_once):
    # b kept its last value: an emptied SVR answered the erased target for every input, an
    # emptied SVC the erased point's class, and the checkpoint kept it.
    fresh, model = make(), make()
    regression = "SVR" in type(model).__name__
    points = [({"a": 1.0, "b": 0.5}, 123456.0 if regression else True),
              ({"a": -1.0, "b": 0.2}, 123000.0 if regression else False),
              ({"a": 0.3, "b": -1.0}, 123999.0 if regression else True)]
    for key, (x, y) in enumerate(points):
        model.learn_one(x, y, key=key)
    assert model.decision_function_one({"a": 0.0}) != 0.0
    if all_at_once:
        model.forget_many(keys=[0, 1, 2])
    else:
        for key in range(3):
            model.forget_one(key=key)
    assert model.n_stored == 0 and model.intercept == 0.0
    query = {"a": 0.7, "b": -0.1}
    assert model.decision_function_one(query) == fresh.decision_function_one(query) == 0.0
    assert model.predict_one(query) == fresh.predict_one(query)
    arrays, _ = model.to_checkpoint()
    assert float(arrays["b"]) == 0.0
    for x, y in points[:2]:  # and learning again is learning from nothing
        model.learn_one(x, y)
        fresh.learn_one(x, y)
    assert model.decision_function_one(query) == pytest.approx(
        fresh.decision_function_one(query), rel=1e-12, abs=1e-9)


@pytest.mark.parametrize("make", [
    lambda: IncrementalSVC(kernel="linear"),
    lambda: IncrementalSVR(kernel="linear", epsilon=0.1),
    lambda: SlidingWindowSVC(window_size=10, kernel="linear"),
    lambda: SlidingWindowSVR(window_size=10, step=2, kernel="linear"),
])
@pytest.mark.parametrize("many", [False, True])
def test_forgetting_a_point_drops_the_feature_names_only_it_had(make, many):
    # A forgotten text's tokens are feature names: an erased e-mail address stayed in the
    # checkpoint and in support_vectors() until an amortized drop, maybe never.
    model, never = make(), make()
    regression = "SVR" in type(model).__name__
    points = [({"hello": 1.0, "world": 1.0}, 1.0 if regression else True),
              ({"spam": 1.0, "offer": 1.0}, -1.0 if regression else False),
              ({"hello": 1.0, "alice@example.com": 1.0}, 0.5 if regression else True)]
    for key, (x, y) in enumerate(points):
        model.learn_one(x, y, key=key)
    for x, y in points[:2]:
        never.learn_one(x, y)
    if many:
        model.forget_many(keys=[2])
    else:
        model.forget_one(key=2)
    _, meta = model.to_checkpoint()
    assert "alice@example.com" not in meta["features"]
    assert "alice@example.com" not in model.support_vectors().columns
    assert sorted(meta["features"]) == ["hello", "offer", "spam", "world"]
    query = {"hello": 1.0, "alice@example.com": 3.0, "spam": 0.5}
    assert model.decision_function_one(query) == pytest.approx(
        never.decision_function_one(query), rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("make", [IncrementalSVC, IncrementalSVR, SlidingWindowSVC])
def test_an_empty_batch_is_no_update(make):
    """An empty learn_many or forget_many changes nothing: the update counters and the last
    update's statistics, which the daemon's metrics export, are those of the last real one."""
    X = pd.DataFrame({"a": [0.0, 1.0, 0.2, 0.9]})
    y = X["a"] if make is IncrementalSVR else pd.Series([False, True, False, True])
    model = make()
    model.learn_many(X, y, keys=["p", "q", "r", "s"])
    model.forget_one(key="q")
    before = (model.updates_total, model.last_update, model.to_checkpoint()[1])
    model.learn_many(X.iloc[:0], y.iloc[:0])
    model.forget_many([])
    assert (model.updates_total, model.last_update, model.to_checkpoint()[1]) == before
    assert model.last_update.removed == 1
