"""Breakpoints and time per breakpoint of the engine on fixed benchmark paths, recorded so that
another build of the engine can be checked to walk the same paths.

Paths (all deterministic):

- ``learn_one ring``: 2000 points of the ring-and-blob set (bench_learn_one.py), one
  ``learn_one`` each, C = 10, gamma = 1;
- ``learn_one fisher``: the 1454 Fisher river samples, C = 10, gamma = 1 (skipped without
  ../shared/data);
- ``multiple``: on 400 points of the two-Gaussian mixture (bench_multiple.py), 10 updates
  each adding 50, removing 50, and both;
- ``window``: 6 steps of the Fisher window (n = 1423, 30 added + 30 removed) at four
  (C, gamma) points: small and large margin sets.

For every update the number of breakpoints, the margin set size at its end and the seconds are
stored; ``--compare FILE`` prints, path by path, how many updates took another number of
breakpoints and the largest difference of final decision values on probe points, then the
time per breakpoint against FILE's (same machine, one BLAS thread).

Run: ``.venv/bin/python benchmarks/bench_paths.py --out benchmarks/out/paths.json --compare
benchmarks/reference/paths_numpy_engine.json``. The reference is the record of the engine whose
breakpoint loop ran in numpy (Givens rotations in Python), before its loop was compiled.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
from _common import limit_blas_threads, load_fisher, machine_info
from bench_learn_one import ring_and_blob
from bench_multiple import mixture

from stream_svm.engine import PathEngine
from stream_svm.kernels import make_kernel

WINDOW_GRID = [(1.0, 0.01), (10.0, 0.1), (100.0, 1.0), (1000.0, 1.0)]


def _probe(X: np.ndarray) -> np.ndarray:
    rng = np.random.default_rng(99)
    return X[rng.choice(len(X), size=min(200, len(X)), replace=False)] + 0.01


def _record(engine: PathEngine, updates: list[tuple], probe: np.ndarray) -> dict:
    breakpoints, margins, seconds = [], [], []
    for X_add, y_add, keys, remove in updates:
        started = time.perf_counter()
        stats = engine.update(X_add, y_add, keys, remove)
        seconds.append(time.perf_counter() - started)
        breakpoints.append(stats.breakpoints)
        margins.append(engine.n_margin)
    return {"breakpoints": breakpoints, "margin": margins, "seconds": seconds,
            "decisions": engine.decision_function(probe).tolist()}


def learn_one_path(X: np.ndarray, y: np.ndarray, C: float, gamma: float) -> dict:
    engine = PathEngine(make_kernel("rbf", gamma=gamma), C)
    updates = [(X[i : i + 1], y[i : i + 1], [i], []) for i in range(len(y))]
    return _record(engine, updates, _probe(X))


def multiple_paths() -> dict:
    rng = np.random.default_rng(7)
    X, y = mixture(600, rng)
    engine = PathEngine(make_kernel("rbf", gamma=0.5), 10.0)
    engine.update(X[:400], y[:400], list(range(400)))
    updates, pending, stored = [], list(range(400, 600)), list(range(400))
    for round_ in range(10):
        kind = ("add", "remove", "both")[round_ % 3]
        add = pending[:50] if kind != "remove" else []
        pending = pending[len(add):]
        remove = stored[:50] if kind != "add" else []
        stored = stored[len(remove):] + add
        pending += remove
        updates.append((X[add], y[add], add, remove))
    return _record(engine, updates, _probe(X))


def window_paths(X: np.ndarray, y: np.ndarray) -> dict:
    out = {}
    total = len(y)
    for C, gamma in WINDOW_GRID:
        engine = PathEngine(make_kernel("rbf", gamma=gamma), C)
        first = np.arange(1423)
        engine.update(X[first], y[first], [(0, int(i)) for i in first])
        updates, window = [], [(0, int(i)) for i in first]
        for step in range(1, 7):
            incoming = (np.arange(1423 - 30, 1423) + 30 * step) % total
            keys = [(step, int(i)) for i in incoming]
            updates.append((X[incoming], y[incoming], keys, window[:30]))
            window = window[30:] + keys
        out[f"C={C:g} gamma={gamma:g}"] = _record(engine, updates, _probe(X))
    return out


def run() -> dict:
    X, y = ring_and_blob(2000, seed=1)
    paths = {"learn_one ring": learn_one_path(X, y, 10.0, 1.0), "multiple": multiple_paths()}
    fisher = load_fisher()
    if fisher is not None:
        Xf, yf = fisher
        paths["learn_one fisher"] = learn_one_path(Xf, yf, 10.0, 1.0)
        for name, record in window_paths(Xf, yf).items():
            paths[f"window {name}"] = record
    return paths


def compare(new: dict, old: dict) -> None:
    print(f"{'path':28} {'updates':>7} {'other bp':>8} {'max |df|':>9} {'bp old':>7} "
          f"{'ms/bp old':>9} {'ms/bp new':>9} {'speed-up':>8}")
    for name, record in new.items():
        if name not in old:
            print(f"{name:28} (not in the reference)")
            continue
        before = old[name]
        differ = sum(a != b for a, b in zip(record["breakpoints"], before["breakpoints"],
                                            strict=True))
        gap = float(np.max(np.abs(np.subtract(record["decisions"], before["decisions"]))))
        bp_old = sum(before["breakpoints"])
        per_old = 1e3 * sum(before["seconds"]) / max(bp_old, 1)
        per_new = 1e3 * sum(record["seconds"]) / max(sum(record["breakpoints"]), 1)
        print(f"{name:28} {len(record['breakpoints']):7d} {differ:8d} {gap:9.2e} {bp_old:7d} "
              f"{per_old:9.4f} {per_new:9.4f} {per_old / per_new:7.1f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write")
    parser.add_argument("--compare", type=Path, help="a reference JSON written by this script")
    args = parser.parse_args()
    with limit_blas_threads():
        paths = run()
    args.out.write_text(json.dumps({"machine": machine_info(), "paths": paths}))
    print(f"wrote {args.out}")
    if args.compare:
        compare(paths, json.loads(args.compare.read_text())["paths"])


if __name__ == "__main__":
    main()
