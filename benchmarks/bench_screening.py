"""Could a float32 copy of S's kernel columns screen the events, so that a breakpoint reads half
the bytes? Where S is large the breakpoint loop is bound by reading S's float64 kernel columns
(8 n |S| bytes) once per breakpoint. A float32 copy is half the bytes; to stay exact, it could
only screen: each point's float32 sensitivity, with a guaranteed error bound, would rule points
out, and the exact value be computed for the rest. This measures whether such a bound is tight
enough on the Fisher river windows where S is large.

For each (C, gamma), the engine learns the first window (n = 1423); then the first direction of
30 arrivals driven from 0 to C (a window step's, up to its removals and to arrivals already
satisfied, which the engine does not drive) is solved in float64 from the engine's margin set:

    [K_SS 1; 1' 0] [beta_S; db] = [-K_SD beta_D; -sum(beta_D)],  beta_D = C y_D

and the sensitivities are change = K_{:,S} beta_S + K_{:,D} beta_D + db over the 1453 points.
Reported: sum |beta_S| max|K| / max |change| (how much S's direction cancels), the float32
product's actual error and its guaranteed bound ((|S| + 3) u sum_s |K_is| |beta_s|,
u = 2^-24), both relative to max |change|, and the two products' times (best of 200).

A bound that needs no pass over S's columns at all is the direction's norm in the kernel's
feature space: |change_i| <= ||w|| sqrt(K_ii) + |db|, with ||w||^2 = beta' K beta over S and
the driven points (K_ii = 1 for the RBF kernel). Reported: ||w|| / max |change|, and how many
of the points outside S that bound keeps as candidates for the path's first event (those with
|g_i| <= t (||w|| + |db|), t the first event's step, where g is y_i f(x_i) - 1), at the first
step of a path, before any lazily moved g would widen the band.

Run: ``.venv/bin/python benchmarks/bench_screening.py`` (needs ../shared/data; ``--quick``:
two settings).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from _common import emit, limit_blas_threads, load_fisher, machine_info, markdown_table

from stream_svm.engine import MARGIN, PathEngine
from stream_svm.kernels import make_kernel

WINDOW, STEP = 1423, 30
SETTINGS = [(1.0, 1e-2), (100.0, 1.0), (1e3, 1.0), (1e4, 1.0), (1e5, 1.0), (1e4, 0.1),
            (1e5, 0.1)]
UNIT_ROUNDOFF_32 = 2.0 ** -24


def _best_seconds(function, repeats: int = 200) -> float:
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        function()
        best = min(best, time.perf_counter() - started)
    return best


def measure(X: np.ndarray, y: np.ndarray, C: float, gamma: float) -> list:
    kernel = make_kernel("rbf", gamma=gamma)
    engine = PathEngine(kernel, C=C)
    window = np.arange(WINDOW)
    engine.update(X[window], y[window], keys=[int(i) for i in window])
    stored = np.asarray(engine.keys, dtype=int)
    margin = stored[engine.status == MARGIN]
    incoming = np.arange(WINDOW, WINDOW + STEP) % X.shape[0]
    points = np.concatenate([stored, incoming])
    K_S = kernel(X[points], X[margin])  # every point against S
    K_D = kernel(X[points], X[incoming])
    beta_D = C * y[incoming]
    driven = K_D @ beta_D
    k = margin.size
    bordered = np.zeros((k + 1, k + 1))
    bordered[:k, :k] = kernel(X[margin], X[margin])
    bordered[:k, k] = bordered[k, :k] = 1.0
    rows_of_S = np.flatnonzero(engine.status == MARGIN)
    solution = np.linalg.solve(bordered, np.concatenate([-driven[rows_of_S], [-beta_D.sum()]]))
    beta_S, db = solution[:k], solution[k]
    change = K_S @ beta_S + driven + db
    scale = float(np.abs(change).max())
    kept, norm_ratio = _norm_bound_candidates(engine, kernel, X[np.concatenate([margin, incoming])],
                                              np.concatenate([beta_S, beta_D]), beta_S, db,
                                              change[: stored.size], C)
    columns = np.ascontiguousarray(K_S.T)  # as the loop keeps them: one row per member
    columns32 = columns.astype(np.float32)
    beta32 = beta_S.astype(np.float32)
    product32 = (beta32 @ columns32).astype(float)
    error = float(np.abs(product32 - K_S @ beta_S).max())
    bound = float(((k + 3) * UNIT_ROUNDOFF_32 * (np.abs(K_S) @ np.abs(beta_S))).max())
    seconds64 = _best_seconds(lambda: beta_S @ columns)
    seconds32 = _best_seconds(lambda: beta32 @ columns32)
    cancel = float(np.abs(beta_S).sum() * np.abs(K_S).max()) / scale
    return [gamma, C, k, f"{8 * k * points.size / 1e6:.2f}", f"{cancel:.3g}",
            f"{error / scale:.2g}", f"{bound / scale:.2g}", f"{1e6 * seconds64:.1f}",
            f"{1e6 * seconds32:.1f}", f"{norm_ratio:.3g}", kept]


def _norm_bound_candidates(engine: PathEngine, kernel, X_w: np.ndarray, beta_w: np.ndarray,
                           beta_S: np.ndarray, db: float, change: np.ndarray,
                           C: float) -> tuple[str, float]:
    """The points outside S that the feature-space norm bound cannot rule out of the first
    event, as "kept of outside", and ||w|| + |db| over the largest |change| outside S (w the
    direction's weight vector: beta_w over the rows X_w, S's members then the driven points)."""
    outside = engine.status != MARGIN
    largest = float(np.abs(change[outside]).max())
    norm = float(np.sqrt(max(beta_w @ kernel(X_w, X_w) @ beta_w, 0.0))) + abs(db)
    g, y_stored = engine.g, engine.y
    slope = y_stored * change  # d g_i / d theta
    with np.errstate(divide="ignore", invalid="ignore"):
        events = np.where((g > 0) & (slope < 0), g / -slope, np.inf)
        events = np.where((g < 0) & (slope > 0), -g / slope, events)
    alpha_S = engine.alpha[~outside]
    move_S = y_stored[~outside] * beta_S  # d alpha_s / d theta
    with np.errstate(divide="ignore", invalid="ignore"):
        bounds_S = np.where(move_S > 0, (C - alpha_S) / move_S,
                            np.where(move_S < 0, -alpha_S / move_S, np.inf))
    first = min(1.0, float(events[outside].min()), float(bounds_S.min(initial=np.inf)))
    kept = int((outside & (np.abs(g) <= first * norm)).sum())
    return f"{kept} of {int(outside.sum())}", norm / largest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="two settings only")
    settings = SETTINGS[:2] if parser.parse_args().quick else SETTINGS
    data = load_fisher()
    if data is None:
        print("skipped: the Fisher river series is not in ../shared/data")
        return
    X, y = data
    blas_limit = limit_blas_threads()  # noqa: F841 (kept alive: one BLAS thread)
    rows = []
    for C, gamma in settings:
        rows.append(measure(X, y, C, gamma))
        print(rows[-1], flush=True)
    table = markdown_table(
        ["gamma", "C", "size of S", "float64 columns MB",
         "sum abs(beta_S) max K / max abs(change)", "float32 error / max abs(change)",
         "float32 bound / max abs(change)",
         "float64 product us", "float32 product us",
         "(norm(w) + abs(db)) / max abs(change)", "points the norm bound keeps"], rows)
    emit("screening", machine_info() + "\n\n" + table)


if __name__ == "__main__":
    main()
