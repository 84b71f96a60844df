"""The compiled pieces of the engine against their definitions."""

from __future__ import annotations

import platform

import numpy as np
import pytest
from scipy.linalg import cholesky
from scipy.spatial.distance import cdist

from stream_svm import _pathcore
from stream_svm.kernels import make_kernel


@pytest.mark.parametrize("k", [1, 2, 5, 40])
def test_deleting_a_factor_column_gives_the_factor_without_it(k):
    rng = np.random.default_rng(k)
    A = rng.standard_normal((k, k + 3))
    P = A @ A.T + 1e-3 * np.eye(k)
    R = np.ascontiguousarray(cholesky(P, lower=False))
    for j in range(k):
        buffer = np.full((k + 4, k + 6), np.nan)  # a factor with spare capacity
        buffer[:k, :k] = R
        _pathcore.delete_factor_column(buffer, k, j)
        kept = np.delete(np.delete(P, j, axis=0), j, axis=1)
        left = buffer[: k - 1, : k - 1]
        assert np.array_equal(np.triu(left), left)  # still upper triangular
        assert np.abs(left.T @ left - kept).max(initial=0.0) <= 1e-12 * np.abs(P).max()
    with pytest.raises(ValueError, match="not in a"):
        _pathcore.delete_factor_column(np.zeros((3, 3)), 3, 3)


@pytest.mark.parametrize(("name", "code"), [("linear", _pathcore.KERNEL_LINEAR),
                                            ("rbf", _pathcore.KERNEL_RBF),
                                            ("poly", _pathcore.KERNEL_POLY)])
def test_kernel_columns_equal_the_kernels(name, code):
    rng = np.random.default_rng(1)
    X = np.ascontiguousarray(rng.standard_normal((30, 4)))
    positions = np.array([0, 7, 29], dtype=np.int64)
    kernel = make_kernel(name, gamma=0.3, degree=3, coef0=1.5)
    out = np.zeros((3, 30))
    features = np.ascontiguousarray(X.T)
    _pathcore.kernel_columns(code, features, 30, positions, 0.3, 3, 1.5, out)
    np.testing.assert_allclose(out.T, kernel(X, X[positions]), rtol=1e-14, atol=1e-14)
    if name == "rbf":  # the same squared distances as SciPy's, to the last bit
        _pathcore.kernel_columns(code, features, 30, positions, 0.3, 3, 1.5, out, False)
        assert np.array_equal(out.T, -0.3 * cdist(X, X[positions], "sqeuclidean"))
    with pytest.raises(ValueError, match="position 30"):
        _pathcore.kernel_columns(code, features, 30, np.array([30], dtype=np.int64), 0.3, 3,
                                 1.5, out)


@pytest.mark.parametrize(("dim", "n"), [(1, 53), (2, 53), (3, 53), (4, 53), (5, 53), (7, 53),
                                      (8, 53), (21, 53), (21, 1000), (5, 1000), (100, 301)])
def test_kernel_columns_sum_each_points_features_in_order_at_any_width(dim, n):
    """Features are taken up to four per pass over the points, the last pass whatever is
    left, and the points a block at a time for several columns (several blocks and a partial
    last one at n = 1000 and 301): every point's sum still runs over the features in order,
    to the last bit (the order SciPy's cdist sums squared distances in), for every column of
    a block."""
    rng = np.random.default_rng(dim)
    X = rng.standard_normal((n, dim))
    features = np.ascontiguousarray(X.T)
    positions = np.array([0, 5, n - 1, 17], dtype=np.int64)
    out = np.zeros((4, n))
    distances = np.zeros((n, 4))
    products = np.zeros((n, 4))
    for f in range(dim):  # the reference: one feature at a time, in order
        distances = distances + (X[:, [f]] - X[positions, f]) ** 2
        products = products + X[:, [f]] * X[positions, f]
    _pathcore.kernel_columns(_pathcore.KERNEL_RBF, features, n, positions, 1.0, 0, 0.0, out,
                             False)
    assert np.array_equal(out.T, -distances)
    assert np.array_equal(out.T, -cdist(X, X[positions], "sqeuclidean"))
    _pathcore.kernel_columns(_pathcore.KERNEL_LINEAR, features, n, positions, 0.0, 0, 0.0,
                             out)
    assert np.array_equal(out.T, products)



@pytest.mark.parametrize("n", [40, 9000])
def test_a_many_column_rbf_block_has_the_bits_of_the_loops_own_columns(n):
    """A block of more columns than RBF_CHUNK is computed a piece at a time (when its columns
    are short enough): every value is still the breakpoint loop's exp (rbf_values) of
    -gamma |a - b|^2 as SciPy's cdist gives it, to the last bit, in every piece and the
    partial last one; and within one ulp of numpy's exp."""
    from stream_svm.engine import RBF_CHUNK, RBF_CHUNK_MAX_POINTS, _compiled_block

    rng = np.random.default_rng(n)
    X = rng.standard_normal((n, 3))
    positions = rng.integers(0, n, 2 * RBF_CHUNK + 5).astype(np.int64)
    assert (n <= RBF_CHUNK_MAX_POINTS) == (n == 40)
    block = _compiled_block(_pathcore.KERNEL_RBF, 0.7, 3, 0.0, np.ascontiguousarray(X.T), n,
                            positions)
    distances = np.ascontiguousarray(cdist(X, X[positions], "sqeuclidean").T)
    for column in distances:
        _pathcore.rbf_values(column, 0.7)
    assert np.array_equal(block, distances.T)
    np.testing.assert_array_max_ulp(block, np.exp(-0.7 * cdist(X, X[positions], "sqeuclidean")),
                                    maxulp=1)


def _cpu_flags() -> set[str]:
    """The processor's feature flags as Linux lists them (empty elsewhere)."""
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def test_the_exp_chosen_for_this_processor_gives_the_portable_loops_bits():
    """The AVX-512 exp (table read by gathers), where the processor has it, against the loop
    that runs everywhere: the same bits on arguments from 0 to past exp's underflow, around
    the thresholds where the scale is corrected (-704) and clamped (-746), and at every
    remainder of the eight-point blocks."""
    rng = np.random.default_rng(3)
    squared = np.concatenate([
        rng.uniform(0.0, 800.0, 20_001), np.linspace(700.0, 750.0, 10_007),
        rng.uniform(0.0, 1e-3, 5_003), rng.uniform(0.0, 1e6, 1_001),
        [0.0, 5e-324, 704.0, np.nextafter(704.0, 0.0), np.nextafter(704.0, 1e3), 746.0,
         np.nextafter(746.0, 0.0), 1e300]])
    for gamma in (1.0, 0.37, 1e-3, 25.0):
        for size in (squared.size, 1, 7, 9, 15):
            chosen, portable = squared[:size].copy(), squared[:size].copy()
            _pathcore.rbf_values(chosen, gamma)
            _pathcore.rbf_values(portable, gamma, portable=True)
            assert np.array_equal(chosen.view(np.int64), portable.view(np.int64))
    # The whole range is covered: values from 1 down to 0, subnormals among them.
    values = squared.copy()
    gathers = _pathcore.rbf_values(values, 1.0)
    if platform.machine() == "x86_64" and _cpu_flags() >= {"avx512f"}:
        assert gathers  # the AVX-512 loop is the one compared above
    assert values.max() == 1.0 and values.min() == 0.0
    assert np.any((values > 0) & (values < np.finfo(float).tiny))


def _events_by_the_rule(mode, db, y, driven, change, status, blocked, gap, g, tol_g):
    """The breakpoint's pass written out with numpy: sensitivities, then each point's step
    to its event (error and added points rising to the margin, reserve points falling to it
    or, with a finite gap, rising to their other side; none when blocked)."""
    from stream_svm.engine import ADDING, ERROR, RESERVE
    value = {0: y * ((change + driven) + db), 1: y * db, 2: y * driven}[mode]
    up, down = value > tol_g, value < -tol_g
    reserve = status == RESERVE
    flipping = reserve & up & (gap < np.inf)
    event = ((((status == ERROR) | (status == ADDING)) & up) | (reserve & down) | flipping)
    event &= blocked == 0
    with np.errstate(divide="ignore", invalid="ignore"):
        step = np.where(flipping, gap - g, -g) / value
        step = np.where(step <= 0.0, 0.0, step)
    return value, np.where(event, step, np.inf)


def test_the_events_pass_chosen_for_this_processor_gives_the_portable_bits():
    """The breakpoint's pass over the points (AVX-512 where the processor has it, eight points
    per instruction) against the loop that runs everywhere and against the rule written with
    numpy: the same sensitivities, steps and smallest step, bit for bit, for every state,
    blocked points, finite and infinite gaps, sensitivities at the noise threshold, the three
    modes and every remainder of the eight-point blocks."""
    from stream_svm.engine import REMOVING
    rng = np.random.default_rng(11)
    n, tol_g = 1003, 0.05
    events = flips = 0
    for mode in (0, 1, 2):
        for trial in range(4):
            y = rng.choice([-1.0, 1.0], n)
            driven = rng.normal(size=n)
            change = rng.normal(size=n)
            change[::17] = tol_g - driven[::17]  # |value| exactly at the threshold
            status = rng.integers(0, REMOVING + 1, n).astype(np.int8)
            blocked = (rng.random(n) < 0.1).astype(np.uint8)
            gap = np.where(rng.random(n) < 0.3, rng.uniform(0.0, 3.0, n), np.inf)
            g = rng.normal(size=n) * (10.0 ** rng.integers(-3, 3, n))
            g[::13] = 0.0
            if trial == 3:  # values no path should reach, but the two loops agree on them too
                g[::101] = np.nan
                g[5::101] = -np.nan
                g[7::211] = np.inf
            db = (0.3, -1e-9, 0.0, 2.5)[trial]
            for size in (n, 1, 7, 8, 9, 15):
                outputs = []
                for portable in (False, True):
                    sensitivities, steps = change[:size].copy(), np.empty(size)
                    smallest = _pathcore.point_events(
                        mode, db, y[:size], driven[:size], sensitivities, status[:size],
                        blocked[:size], gap[:size], g[:size], tol_g, steps, portable=portable)
                    outputs.append((sensitivities, steps, smallest))
                value, expected = _events_by_the_rule(mode, db, y[:size], driven[:size],
                                                      change[:size], status[:size],
                                                      blocked[:size], gap[:size], g[:size],
                                                      tol_g)
                (chosen, chosen_steps, chosen_min), portable_output = outputs
                # the loop chosen for this processor and the portable one: bit for bit
                assert np.array_equal(chosen.view(np.int64), portable_output[0].view(np.int64))
                assert np.array_equal(chosen_steps.view(np.int64),
                                      portable_output[1].view(np.int64))
                assert np.float64(chosen_min).view(np.int64) == np.float64(
                    portable_output[2]).view(np.int64)
                # and the rule (NaN's sign aside); the smallest step is ordered by bits
                assert np.array_equal(chosen.view(np.int64), value.view(np.int64))
                assert np.array_equal(chosen_steps, expected, equal_nan=True)
                smallest_bits = min(expected.view(np.int64).min(),
                                    np.float64(np.inf).view(np.int64))  # the search's start
                assert np.array_equal(np.int64(smallest_bits).view(np.float64), chosen_min,
                                      equal_nan=True)
                events += np.isfinite(expected).sum()
                flips += np.sum(np.isfinite(expected) & (gap[:size] < np.inf)
                                & (status[:size] == 2) & (value > 0))
    assert events > 2000 and flips > 100  # the comparisons above had events to compare
    if platform.machine() == "x86_64" and _cpu_flags() >= {"avx512f"}:
        assert _pathcore.avx512_loops()  # the AVX-512 loop is the one compared above


def test_the_search_for_a_steps_events_finds_each_one_in_order():
    values = np.full(1003, np.inf)
    at = [0, 7, 8, 9, 500, 995, 1002]
    values[at] = [0.5, 0.25, 0.5, 1.0, 0.5, 0.0, 0.5]
    for portable in (False, True):
        found, start = [], 0
        while (start := _pathcore.next_at_most(values, start, 0.5, portable=portable)) < 1003:
            found.append(start)
            start += 1
        assert found == [0, 7, 8, 500, 995, 1002]
        assert _pathcore.next_at_most(values, 1003, 0.5, portable=portable) == 1003
        assert _pathcore.next_at_most(values[:7], 1, 0.5, portable=portable) == 7
    with pytest.raises(ValueError, match="outside"):
        _pathcore.next_at_most(values, 1004, 0.5)


def test_rbf_columns_are_within_one_ulp_of_exp_down_to_the_subnormals():
    """The compiled loop's exp (vectorized, table-driven) against the C library's, from
    exp(0) = 1 to arguments whose exp is subnormal or rounds to 0."""
    import math

    rng = np.random.default_rng(11)
    squared = np.concatenate([[0.0, 1e-300, 704.0, 708.39, 709.8, 745.1, 745.2, 746.0, 1e308],
                              rng.random(20000) * 760.0, rng.random(20000) * 2.0,
                              rng.random(20000) * 1e-8])
    features = np.ascontiguousarray(np.concatenate([[0.0], np.sqrt(squared)])[None, :])
    n = features.shape[1]
    out = np.empty((1, n))
    _pathcore.kernel_columns(_pathcore.KERNEL_RBF, features, n, np.array([0]), 1.0, 0, 0.0, out)
    exponent = -(features[0] ** 2)  # one feature: the squared distance the loop forms
    expected = np.array([math.exp(value) for value in exponent])
    smallest = np.nextafter(0.0, 1.0)
    one_ulp = np.spacing(np.maximum(expected, smallest))
    assert np.all(np.abs(out[0] - expected) <= one_ulp)
    assert out[0, 0] == out[0, 1] == 1.0 and out[0, 9] == 0.0  # distances 0 and 1e154
    assert np.mean(out[0] == expected) > 0.99  # mostly the correctly rounded value itself


def test_an_rbf_kernel_refuses_a_gamma_that_is_not_positive():
    """Its values are then finite for any finite features (the engine relies on it)."""
    from stream_svm.kernels import RBFKernel

    for gamma in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="gamma"):
            RBFKernel(gamma)


def test_a_callable_kernel_walks_the_same_path_as_the_compiled_one():
    """A user-callable kernel's columns come from Python while the compiled loop waits: the
    same breakpoints and the same optimum as the built-in kernel it computes."""
    from stream_svm.engine import PathEngine

    rng = np.random.default_rng(4)
    X = rng.standard_normal((160, 3))
    y = np.where(X[:, 0] * X[:, 1] + 0.2 * rng.standard_normal(160) > 0, 1.0, -1.0)
    built_in = PathEngine(make_kernel("rbf", gamma=0.7), C=5.0)
    calls = []

    def rbf(A, B):
        calls.append(B.shape[0])
        return np.exp(-0.7 * cdist(A, B, "sqeuclidean"))

    callable_ = PathEngine(make_kernel(rbf), C=5.0)
    # Count the columns the loop asks Python for (not the new points' columns of update).
    following = callable_._follow_path
    inside = []

    def follow_path(*args):
        inside.append(len(calls))
        try:
            return following(*args)
        finally:
            inside.append(len(calls))

    callable_._follow_path = follow_path
    reused = {}
    for engine in (built_in, callable_):
        engine.update(X[:100], y[:100], list(range(100)))
        reused[engine] = 0
        for i in range(100, 160):
            engine.update(X[i : i + 1], y[i : i + 1], [i], remove=[i - 100])
            reused[engine] += engine.last_update.columns_reused
    assert built_in.breakpoints_total == callable_.breakpoints_total
    probe = rng.standard_normal((50, 3))
    np.testing.assert_allclose(callable_.decision_function(probe),
                               built_in.decision_function(probe), atol=1e-10)
    assert callable_.dual_objective() == pytest.approx(built_in.dual_objective(), rel=1e-12)
    served = sum(end - start for start, end in zip(inside[::2], inside[1::2], strict=True))
    assert served > 20  # columns were served to the loop from Python
    # Points re-entering S took the column they left with, under either kernel.
    assert reused[built_in] > 0 and reused[callable_] == reused[built_in]


def test_an_empty_model_round_trips_through_a_checkpoint():
    from stream_svm import IncrementalSVC

    arrays, meta = IncrementalSVC().to_checkpoint()
    restored = IncrementalSVC.from_checkpoint(arrays, meta)
    assert restored.n_stored == 0 and restored.decision_function_one({"a": 1.0}) == 0.0
    assert restored._engine.g_terms().shape == (0,)


@pytest.mark.parametrize("name", ["rbf", "poly"])
def test_kernel_values_at_some_rows_equal_the_full_columns_there(name):
    """New points' kernel values at S and E only (a wide tube's updates) are the very values
    their full columns hold at those rows: both paths of an update see the same kernel."""
    from stream_svm.engine import PathEngine

    rng = np.random.default_rng(7)
    X = rng.standard_normal((50, 6))
    engine = PathEngine(make_kernel(name, gamma=0.2, degree=2, coef0=1.0), C=1.0, ridge=1e-3)
    engine.update(X, np.where(rng.random(50) < 0.5, 1.0, -1.0), keys=list(range(50)))
    rows = np.array([3, 40, 7, 12, 49, 45], dtype=np.int64)
    positions = np.array([45, 12, 20], dtype=np.int64)  # two of them among the rows
    expected = engine._kernel_columns(positions)[rows]
    if name == "rbf":
        assert np.array_equal(engine._kernel_rows(rows, positions), expected)
    else:
        np.testing.assert_allclose(engine._kernel_rows(rows, positions), expected, rtol=1e-14)


@pytest.mark.parametrize("ridge", [0.0, 0.1])
def test_a_callable_kernel_may_return_read_only_blocks(ridge):
    """A user's kernel may hand back a read-only array (a memoized block, a view of another
    library's buffer): learning one point and removing one point at C, whose single kernel
    column reaches the compiled passes without a copy, and adding a ridge to the columns, must
    work as with a writable one."""
    from stream_svm.engine import ERROR, PathEngine

    def frozen_rbf(A, B):
        block = np.exp(-0.5 * cdist(A, B, "sqeuclidean"))
        block.flags.writeable = False
        return block

    rng = np.random.default_rng(9)
    X = rng.standard_normal((60, 2))
    y = np.where(X[:, 0] + 0.8 * rng.standard_normal(60) > 0, 1.0, -1.0)
    frozen = PathEngine(make_kernel(frozen_rbf), C=10.0, ridge=ridge)
    built_in = PathEngine(make_kernel("rbf", gamma=0.5), C=10.0, ridge=ridge)
    for engine in (frozen, built_in):
        engine.update(X[:40], y[:40], list(range(40)))
        for i in range(40, 60):  # one point at a time
            engine.update(X[i : i + 1], y[i : i + 1], [i])
    at_C = [key for key in range(60) if frozen._status[frozen._pos[key]] == ERROR]
    assert at_C, "the data should leave some points at C"
    for engine in (frozen, built_in):
        engine.update(remove=[at_C[0]])
    probes = rng.standard_normal((20, 2))
    np.testing.assert_allclose(frozen.decision_function(probes),
                               built_in.decision_function(probes), rtol=0, atol=1e-9)


def _swap_arrays(n: int, dim: int, members: list[int], recent_owners: list[int]) -> dict:
    """Consistent per-point arrays: S's members at the given positions (their slots in that
    order), recent columns owned by the given positions (-1: none)."""
    rng = np.random.default_rng(3)
    slot = np.full(n, -1, dtype=np.int64)
    slot[members] = np.arange(len(members))
    X = rng.normal(size=(n, dim))
    return {
        "X": X, "vectors": [rng.normal(size=n) for _ in range(8)],
        "status": rng.integers(-1, 3, size=n).astype(np.int8),
        "seq": np.arange(n, dtype=np.int64), "slot": slot, "XT": np.ascontiguousarray(X.T),
        "columns": rng.normal(size=(len(members) + 2, n)),
        "margin": np.array(members, dtype=np.int64),
        "recent": rng.normal(size=(len(recent_owners), n)),
        "recent_of": np.array(recent_owners, dtype=np.int64),
    }


def _swap_remove(arrays: dict, removed: list[int], n: int):
    holes = np.empty(len(removed), dtype=np.int64)
    movers = np.empty(len(removed), dtype=np.int64)
    moves = _pathcore.swap_remove(
        np.array(removed, dtype=np.int64), n, arrays["X"], *arrays["vectors"], arrays["status"],
        arrays["seq"], arrays["slot"], arrays["XT"], arrays["columns"], arrays["margin"],
        arrays["recent"], arrays["recent_of"], holes, movers)
    return holes[:moves], movers[:moves]


def test_swap_remove_moves_every_array_as_removing_one_point_at_a_time_would():
    """The reference: each removed point, highest position first, replaced by the last one.
    Every per-point array, S's kernel columns (not the rows past S), the feature copy, the
    member list and the recent columns with their owners follow their points."""
    n, members = 40, [3, 38, 11, 36, 20]
    owners = [39, 30, -1, 2, 38, 7]  # removed owners (30, 2, 7) lose their column
    arrays = _swap_arrays(n, 3, members, owners)
    removed = [30, 7, 2, 37, 39]
    per_point = ["X", "status", "seq", "slot"]
    expected = {name: arrays[name].copy() for name in per_point}
    expected_vectors = [v.copy() for v in arrays["vectors"]]
    expected_by_column = {name: arrays[name].copy() for name in ("XT", "columns", "recent")}
    where = list(range(n))  # where[i]: the original position now at i
    for position in sorted(removed, reverse=True):
        last = len(where) - 1
        for array in [*expected.values(), *expected_vectors]:
            array[position] = array[last]
        for name, array in expected_by_column.items():
            rows = slice(0, len(members)) if name == "columns" else slice(None)
            array[rows, position] = array[rows, last]
        where[position] = where[last]
        where.pop()
    now_at = {original: i for i, original in enumerate(where)}
    holes, movers = _swap_remove(arrays, removed, n)
    assert holes.tolist() == [30, 7, 2] and movers.tolist() == [38, 36, 35]
    for name in per_point:
        np.testing.assert_array_equal(arrays[name][: n - 5], expected[name][: n - 5])
    for got, want in zip(arrays["vectors"], expected_vectors, strict=True):
        np.testing.assert_array_equal(got[: n - 5], want[: n - 5])
    np.testing.assert_array_equal(arrays["XT"][:, : n - 5], expected_by_column["XT"][:, : n - 5])
    np.testing.assert_array_equal(arrays["columns"][:, : n - 5],  # rows past S untouched
                                  expected_by_column["columns"][:, : n - 5])
    assert arrays["margin"].tolist() == [now_at[m] for m in members]
    assert arrays["recent_of"].tolist() == [now_at.get(o, -1) if o >= 0 else -1
                                            for o in owners]
    for row, owner in enumerate(arrays["recent_of"]):
        if owner >= 0:
            np.testing.assert_array_equal(arrays["recent"][row, : n - 5],
                                          expected_by_column["recent"][row, : n - 5])


@pytest.mark.parametrize(("removed", "message"), [
    ([1, 10], "outside the 10 stored points"),
    ([4, 4], "listed twice"),
    ([1, 3], "in the margin set"),
])
def test_swap_remove_refuses_a_wrong_position_and_changes_nothing(removed, message):
    n = 10
    arrays = _swap_arrays(n, 2, [3, 5], [9, 1, -1])
    before = {name: np.copy(value) for name, value in arrays.items()}
    with pytest.raises(ValueError, match=message):
        _swap_remove(arrays, removed, n)
    for name, value in arrays.items():
        np.testing.assert_array_equal(value, before[name], err_msg=name)


def test_count_free_counts_coefficients_strictly_between_the_bounds():
    alpha = np.array([0.0, 1e-300, 0.5, 1.0, 1.0 - 1e-16, 2.0, 0.3])
    members = np.array([6, 0, 1, 2, 3, 4], dtype=np.int64)
    expected = np.count_nonzero((alpha[members] > 0) & (alpha[members] < 1.0))
    assert _pathcore.count_free(members, alpha, 1.0) == expected == 4
    with pytest.raises(ValueError, match="outside"):
        _pathcore.count_free(np.array([7], dtype=np.int64), alpha, 1.0)


def test_keep_rows_moves_the_kept_rows_up_in_order():
    block = np.arange(30.0).reshape(6, 5)
    original = block.copy()
    keep = np.array([False, True, False, True, True], dtype=bool)  # the last row is not flagged
    assert _pathcore.keep_rows(block, keep.view(np.uint8)) == 3
    np.testing.assert_array_equal(block[:3], original[:5][keep])
    np.testing.assert_array_equal(block[5], original[5])
    with pytest.raises(ValueError, match="7 flags for 6 rows"):
        _pathcore.keep_rows(block, np.ones(7, dtype=np.uint8))


def _engine_with_every_set():
    from stream_svm.engine import ERROR, MARGIN, RESERVE, PathEngine

    rng = np.random.default_rng(11)
    X = rng.standard_normal((120, 2))
    y = np.where(X[:, 0] + 0.8 * rng.standard_normal(120) > 0, 1.0, -1.0)
    engine = PathEngine(make_kernel("rbf", gamma=0.5), C=2.0)
    engine.update(X, y, keys=list(range(120)))
    status = engine._status[: engine.n]
    by_set = {name: np.flatnonzero(status == code).tolist()
              for name, code in (("margin", MARGIN), ("error", ERROR), ("reserve", RESERVE))}
    assert all(len(positions) >= 3 for positions in by_set.values())
    return engine, by_set


def test_leave_sets_sorts_the_removals_as_removing_them_one_at_a_time_would():
    """The reference: S's members leave through margin_remove in the order given, each column
    in the next block row (kept only when the coefficient is not 0); then the driven are S's
    members with a coefficient and E's, in the order given, and the settled the rest."""
    from stream_svm.engine import REMOVING

    engine, by_set = _engine_with_every_set()
    n = engine.n
    margin = by_set["margin"]
    # One of S's members with a coefficient of 0 (as a path can leave one): it settles.
    engine._alpha[margin[1]] = 0.0
    removed = np.array([by_set["reserve"][0], margin[2], by_set["error"][1], margin[1],
                        by_set["error"][0], margin[0], by_set["reserve"][2]], dtype=np.int64)
    state = {name: getattr(engine, name).copy()
             for name in ("_status", "_alpha", "_R", "_columns", "_margin", "_store", "_slot")}

    want = {name: value.copy() for name, value in state.items()}
    want_block = np.zeros((removed.size, n))
    driven_members = []
    k = want["_margin"].size
    for position in removed:
        if want["_status"][position] == 0:  # MARGIN
            members = want["_margin"][:k].copy()
            _pathcore.margin_remove(want["_R"], want["_columns"], members, want["_store"],
                                    want["_slot"], n, int(want["_slot"][position]),
                                    want_block[len(driven_members)])
            want["_margin"][: k - 1] = members[: k - 1]
            k -= 1
            if want["_alpha"][position] != 0.0:
                driven_members.append(int(position))
    errors = [int(p) for p in removed if want["_status"][p] == 1 and want["_alpha"][p] != 0]
    settled = [int(p) for p in removed if want["_alpha"][p] == 0.0]

    got = {name: value.copy() for name, value in state.items()}
    block = np.zeros((removed.size, n))
    order = np.empty(removed.size, dtype=np.int64)
    k_now, members_driven, errors_driven = _pathcore.leave_sets(
        removed, got["_status"], got["_alpha"], got["_R"], got["_columns"], got["_margin"],
        got["_store"], got["_slot"], got["_margin"].size, n, block, order)
    assert (k_now, members_driven, errors_driven) == (k, len(driven_members), len(errors))
    assert order.tolist() == driven_members + errors + settled
    np.testing.assert_array_equal(block[:members_driven], want_block[:members_driven])
    kk = k_now
    np.testing.assert_array_equal(got["_R"][:kk, :kk], want["_R"][:kk, :kk])
    np.testing.assert_array_equal(got["_margin"][:kk], want["_margin"][:kk])
    np.testing.assert_array_equal(got["_store"][:kk], want["_store"][:kk])
    np.testing.assert_array_equal(got["_slot"], want["_slot"])
    np.testing.assert_array_equal(got["_columns"][got["_store"][:kk], :n],
                                  want["_columns"][want["_store"][:kk], :n])
    assert np.all(got["_status"][removed] == REMOVING)
    others = np.setdiff1d(np.arange(n), removed)
    np.testing.assert_array_equal(got["_status"][others], state["_status"][others])


def test_leave_sets_refuses_a_reserve_point_with_a_coefficient_and_changes_nothing():
    engine, by_set = _engine_with_every_set()
    n = engine.n
    stray = by_set["reserve"][1]
    engine._alpha[stray] = 1e-3  # a broken engine's state
    removed = np.array([by_set["margin"][0], stray], dtype=np.int64)
    arrays = [engine._status, engine._alpha, engine._R, engine._columns, engine._margin,
              engine._store, engine._slot]
    before = [array.copy() for array in arrays]
    with pytest.raises(RuntimeError, match="reserve point"):
        _pathcore.leave_sets(removed, engine._status, engine._alpha, engine._R, engine._columns,
                             engine._margin, engine._store, engine._slot, engine._margin.size,
                             n, np.zeros((2, n)), np.empty(2, dtype=np.int64))
    for array, saved in zip(arrays, before, strict=True):
        np.testing.assert_array_equal(array, saved)


def test_a_restored_engine_with_a_smaller_factor_walks_the_same_path_as_a_fresh_one():
    """A rollback gives the factor the room S needs (``_restore``), less than the loop's
    scratch kept from before; S then outgrowing it in the middle of a path changes where the
    loop keeps what it derived from the factor: it must derive it again, as a loop with new
    scratch does, to the last bit."""
    from stream_svm.engine import PathEngine

    rng = np.random.default_rng(0)
    X = rng.normal(size=(400, 5))
    y = np.where(X[:, 0] + 0.3 * rng.normal(size=400) > 0, 1.0, -1.0)

    def shrunk() -> PathEngine:
        engine = PathEngine(make_kernel("rbf", gamma=0.5), C=50.0)
        engine.update(X[:150], y[:150], keys=list(range(150)))
        engine.update(remove=list(range(140)))
        engine._restore(engine._snapshot(with_columns=True))
        return engine

    kept, fresh = shrunk(), shrunk()
    fresh._loop_arrays = None
    assert kept._R.shape[0] < 64 and kept._loop_arrays is not None
    for engine in (kept, fresh):
        engine.update(X[150:], y[150:], keys=list(range(150, 400)))
    assert kept._margin.size > 64  # S outgrew the restored factor's room during the path
    np.testing.assert_array_equal(kept._alpha[: kept.n], fresh._alpha[: fresh.n])
    assert kept.b == fresh.b


def test_rbf_decisions_by_the_compiled_kernel_equal_the_kernel_objects_own():
    """RBF predictions go through the compiled kernel loop, PREDICT_CHUNK points at a time:
    the same decision values as the kernel object's (SciPy's cdist and numpy's exp) to a few
    ulps, for more points than one chunk, and for queries wider or narrower than the model."""
    from stream_svm.engine import PREDICT_CHUNK, PathEngine

    rng = np.random.default_rng(7)
    X = rng.standard_normal((300, 3))
    y = np.where(X[:, 0] * X[:, 2] > 0, 1.0, -1.0)
    engine = PathEngine(make_kernel("rbf", gamma=0.8), C=3.0)
    engine.update(X, y, keys=list(range(300)))
    support, coef = engine._support()
    queries = rng.standard_normal((2 * PREDICT_CHUNK + 7, 3))
    expected = engine.kernel(queries, support) @ coef + engine.b
    scale = np.abs(coef).sum() + abs(engine.b)
    np.testing.assert_allclose(engine.decision_function(queries), expected, rtol=0,
                               atol=1e-14 * scale)
    wider = np.hstack([queries[:5], np.full((5, 2), 0.5)])  # features no stored point has
    padded = np.hstack([support, np.zeros((support.shape[0], 2))])
    np.testing.assert_allclose(engine.decision_function(wider),
                               engine.kernel(wider, padded) @ coef + engine.b, rtol=0,
                               atol=1e-14 * scale)
    narrower = queries[:5, :2]  # the missing feature reads 0
    np.testing.assert_allclose(
        engine.decision_function(narrower),
        engine.kernel(np.hstack([narrower, np.zeros((5, 1))]), support) @ coef + engine.b,
        rtol=0, atol=1e-14 * scale)


@pytest.mark.parametrize("name", ["rbf", "poly"])
@pytest.mark.parametrize("extra", [-2, 0, 1, 3])
def test_predictions_against_the_kept_support_columns_have_the_bits_of_padded_rows(name, extra):
    """Predictions read the support vectors as the model keeps them, feature by feature (a
    copy of them with the queries appended, made for every call, cost a wide model several
    times the kernel): the same bits as the kernel block of the queries inside the points'
    own array, rows padded with zeros to the wider side (queries narrower than the model,
    as wide, one feature wider as predictions fold the unknown ones, and wider still)."""
    from stream_svm.engine import PathEngine, _compiled_block, _compiled_kernel

    rng = np.random.default_rng(11)
    X = rng.standard_normal((120, 5))
    y = np.where(X[:, 0] * X[:, 2] > 0, 1.0, -1.0)
    engine = PathEngine(make_kernel(name, gamma=0.3, degree=3, coef0=1.0), C=3.0)
    engine.update(X, y, keys=list(range(120)))
    support, coef = engine._support()
    queries = rng.standard_normal((9, 5 + extra))
    width = max(5, queries.shape[1])
    rows = np.zeros((support.shape[0] + 9, width))
    rows[: support.shape[0], :5] = support
    rows[support.shape[0]:, : queries.shape[1]] = queries
    kind, gamma, degree, coef0 = _compiled_kernel(engine.kernel)
    block = _compiled_block(kind, gamma, degree, coef0, np.ascontiguousarray(rows.T),
                            support.shape[0], np.arange(support.shape[0], rows.shape[0]))
    expected = np.empty(9)
    _pathcore.rows_times(block.T, coef, engine.b, expected)
    assert engine.decision_function(queries).tobytes() == expected.tobytes()


def test_an_engine_pickled_with_its_support_vectors_row_by_row_predicts_as_before():
    # Versions before the support vectors were kept feature by feature pickled them row by
    # row in _sv_cache: read as the new layout, an unpickled model predicted nonsense.
    import pickle

    from stream_svm.engine import PathEngine

    rng = np.random.default_rng(5)
    X = rng.standard_normal((80, 3))
    engine = PathEngine(make_kernel("rbf", gamma=0.5), C=2.0)
    engine.update(X, np.where(X[:, 0] > X[:, 1], 1.0, -1.0), keys=list(range(80)))
    queries = rng.standard_normal((6, 3))
    expected = engine.decision_function(queries)
    support, coef = engine._support()
    state = engine.__getstate__()
    state["_sv_cache"] = (np.ascontiguousarray(support), coef)  # the older layout
    older = PathEngine.__new__(PathEngine)
    older.__setstate__(state)
    assert older.decision_function(queries).tobytes() == expected.tobytes()
    assert pickle.loads(pickle.dumps(engine)).decision_function(queries).tobytes() == \
        expected.tobytes()


def test_a_callable_kernel_predicts_against_support_vectors_kept_row_by_row():
    # Copied row by row for every prediction, they cost a callable kernel's prediction
    # several times the kernel (0.9 ms against 0.12 ms at 1,486 x 400).
    from stream_svm.engine import PathEngine

    seen: list[np.ndarray] = []

    def linear(A, B):
        seen.append(B)
        return A @ B.T

    rng = np.random.default_rng(3)
    X = rng.standard_normal((60, 4))
    engine = PathEngine(make_kernel(linear), C=1.0)
    engine.update(X, np.where(X[:, 0] > 0, 1.0, -1.0), keys=list(range(60)))
    queries = rng.standard_normal((3, 4))
    seen.clear()
    first = engine.decision_function(queries)
    assert engine.decision_function(queries).tobytes() == first.tobytes()
    # The same kept array both times (given as a read-only view of it), not a new copy.
    assert seen[0].base is seen[1].base is not None and seen[0].flags.c_contiguous
    assert not seen[0].flags.writeable
    support, coef = engine._support()
    np.testing.assert_array_equal(seen[0], support)
    np.testing.assert_allclose(first, queries @ support.T @ coef + engine.b, rtol=1e-12)


@pytest.mark.parametrize("width", [1, 7, 8, 9, 300])
def test_rows_times_gives_each_rows_product_with_the_weights_plus_the_shift(width):
    rng = np.random.default_rng(width)
    rows = rng.standard_normal((5, width))
    weights = rng.standard_normal(width)
    out = np.full(5, np.nan)
    _pathcore.rows_times(rows, weights, 0.25, out)
    scale = np.abs(rows) @ np.abs(weights) + 0.25
    np.testing.assert_allclose(out, rows @ weights + 0.25, rtol=0, atol=1e-15 * scale.max())
    empty = np.full(3, np.nan)
    _pathcore.rows_times(np.zeros((3, 0)), np.zeros(0), -1.5, empty)
    assert np.array_equal(empty, np.full(3, -1.5))


def test_rows_times_refuses_shapes_that_do_not_match_and_writes_nothing():
    out = np.full(4, 7.0)
    with pytest.raises(ValueError, match="4 x 3 rows, 2 weights"):
        _pathcore.rows_times(np.ones((4, 3)), np.ones(2), 0.0, out)
    with pytest.raises(ValueError, match="3 outputs"):
        _pathcore.rows_times(np.ones((4, 3)), np.ones(3), 0.0, out[:3])
    assert np.array_equal(out, np.full(4, 7.0))


@pytest.mark.parametrize("name, params", [("linear", {}),
                                          ("poly", {"gamma": 0.5, "degree": 3, "coef0": 1.0})])
def test_linear_and_polynomial_decisions_equal_the_kernel_objects_own(name, params):
    """Linear predictions go through the primal weights w = sum_s coef_s x_s, polynomial ones
    through the compiled kernel loop: the same decision values as the kernel object's to the
    round-off of the sums, for any number of points and for wider or narrower queries."""
    from stream_svm.engine import PREDICT_CHUNK, PathEngine

    rng = np.random.default_rng(11)
    X = rng.standard_normal((200, 4))
    y = np.where(X[:, 0] + 0.5 * X[:, 1] ** 2 > 0.3, 1.0, -1.0)
    engine = PathEngine(make_kernel(name, **params), C=2.0)
    engine.update(X, y, keys=list(range(200)))
    support, coef = engine._support()
    assert coef.size > 10
    queries = rng.standard_normal((PREDICT_CHUNK + 3, 4))

    def check(batch: np.ndarray, as_stored: np.ndarray, stored: np.ndarray) -> None:
        values = engine.kernel(as_stored, stored)
        scale = np.abs(values) @ np.abs(coef) + abs(engine.b)
        got = engine.decision_function(batch)
        assert got.shape == (batch.shape[0],)
        np.testing.assert_allclose(got, values @ coef + engine.b, rtol=0,
                                   atol=1e-13 * max(scale.max(initial=0.0), 1.0))

    for batch in (queries, queries[:1], queries[:0]):
        check(batch, batch, support)
    wider = np.hstack([queries[:5], np.full((5, 2), 0.5)])  # features no stored point has
    check(wider, wider, np.hstack([support, np.zeros((support.shape[0], 2))]))
    narrower = queries[:5, :3]  # the missing feature reads 0
    check(narrower, np.hstack([narrower, np.zeros((5, 1))]), support)
    # After updates that change the support vectors (the linear weights are kept until then).
    before = engine.decision_function(queries[:7])
    engine.update(X[:40] + 0.3, -y[:40], keys=list(range(200, 240)), remove=list(range(40)))
    support, coef = engine._support()
    check(queries, queries, support)
    assert not np.allclose(engine.decision_function(queries[:7]), before)
    engine.update(remove=list(range(40, 200)) + list(range(200, 240)))
    assert np.array_equal(engine.decision_function(queries[:3]), np.full(3, engine.b))


def _power_by_squaring(base: np.ndarray, degree: int) -> np.ndarray:
    """base ** degree by the multiplications stream_svm_poly_values makes, in its order."""
    result, square, exponent = None, base.copy(), degree
    while exponent:
        if exponent & 1:
            result = square.copy() if result is None else result * square
        exponent >>= 1
        if exponent:
            square = square * square
    return result


@pytest.mark.parametrize("degree", [1, 2, 3, 4, 5, 7, 8, 13, 64])
def test_polynomial_columns_take_the_power_by_repeated_squaring(degree):
    """The polynomial kernel's power is taken by repeated squaring (pow took most of a
    column's time): the same bits as those multiplications in numpy, for bases of either
    sign, inf where they overflow, over more than one pass of 256 values; close to pow, the
    error growing with the degree."""
    rng = np.random.default_rng(degree)
    n = 600
    X = np.ascontiguousarray(rng.standard_normal((n, 3)))
    X[5] = [1e40, 1e40, 1e40]  # a point whose kernel values overflow at degree >= 4
    features = np.ascontiguousarray(X.T)
    positions = np.array([0, 5], dtype=np.int64)
    out = np.zeros((2, n))
    _pathcore.kernel_columns(_pathcore.KERNEL_POLY, features, n, positions, 0.7, degree, -0.3,
                             out)
    dots = np.zeros((2, n))  # the same inner products, by the linear kernel's loop
    _pathcore.kernel_columns(_pathcore.KERNEL_LINEAR, features, n, positions, 0.0, 1, 0.0,
                             dots)
    base = 0.7 * dots.T - 0.3
    with np.errstate(over="ignore", invalid="ignore"):
        assert np.array_equal(out.T, _power_by_squaring(base, degree), equal_nan=True)
        expected = np.power(base, float(degree))  # the C library's pow
    finite = np.isfinite(expected)
    np.testing.assert_allclose(out.T[finite], expected[finite], rtol=1e-15 * degree, atol=0)
    assert np.array_equal(out.T[~finite], expected[~finite])
    if degree >= 4:
        assert not finite.all()


@pytest.mark.parametrize("degree", [0, -1, 2.0, True, 2**31])
def test_a_polynomial_kernel_refuses_a_degree_that_is_not_a_positive_int(degree):
    from stream_svm.kernels import PolynomialKernel

    with pytest.raises(ValueError, match="degree must be an integer from 1"):
        PolynomialKernel(1.0, degree, 1.0)
    with pytest.raises(ValueError, match="degree must be an integer from 1"):
        make_kernel("poly", degree=degree)
