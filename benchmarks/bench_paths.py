"""Breakpoints and time per breakpoint of the engine on fixed benchmark paths, against the
engine of another git revision run on the same paths in this process.

Paths (all deterministic):

- ``learn_one ring``: 2000 points of the ring-and-blob set (bench_learn_one.py), one update
  each, C = 10, gamma = 1;
- ``learn_one fisher``: the 1454 Fisher river samples, C = 10, gamma = 1 (skipped without
  ../shared/data);
- ``multiple``: on 400 points of the two-Gaussian mixture (bench_multiple.py), 10 updates
  each adding 50, removing 50, or both;
- ``window``: 6 steps of the Fisher window (n = 1423, 30 added + 30 removed) at four
  (C, gamma) points: margin sets from 13 to 395 points.

``--baseline REV`` loads ``stream_svm/engine.py`` and ``kernels.py`` of that revision (default
7f4f8f5, the last engine whose breakpoint loop ran in numpy) as a package of their own and runs
both engines on every path, alternating, ``--repeat`` times. Reported: how many updates took
another number of breakpoints, the largest difference of final decision values on probe
points, and the best time per breakpoint of each (whole updates divided by breakpoints) with
their ratio. ``--out FILE`` writes the current engine's record (breakpoints and margin size per
update, decisions); ``benchmarks/reference/paths_numpy_engine.json`` is that record for the
numpy engine.

Run: ``.venv/bin/python benchmarks/bench_paths.py`` (a few minutes).
"""

from __future__ import annotations

import argparse
import atexit
import importlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
from _common import ROOT, limit_blas_threads, load_fisher, machine_info
from bench_learn_one import ring_and_blob
from bench_multiple import mixture

from stream_svm import engine as current_engine
from stream_svm import kernels as current_kernels

WINDOW_GRID = [(1.0, 0.01), (10.0, 0.1), (100.0, 1.0), (1000.0, 1.0)]


def _probe(X: np.ndarray) -> np.ndarray:
    rng = np.random.default_rng(99)
    return X[rng.choice(len(X), size=min(200, len(X)), replace=False)] + 0.01


def _record(engine, updates: list[tuple], probe: np.ndarray) -> dict:
    breakpoints, margins, seconds = [], [], []
    for X_add, y_add, keys, remove in updates:
        started = time.perf_counter()
        stats = engine.update(X_add, y_add, keys, remove)
        seconds.append(time.perf_counter() - started)
        breakpoints.append(stats.breakpoints)
        margins.append(engine.n_margin)
    return {"breakpoints": breakpoints, "margin": margins, "seconds": seconds,
            "decisions": engine.decision_function(probe).tolist()}


def learn_one_path(lib, X: np.ndarray, y: np.ndarray, C: float, gamma: float) -> dict:
    engine = lib.engine.PathEngine(lib.kernels.make_kernel("rbf", gamma=gamma), C)
    updates = [(X[i : i + 1], y[i : i + 1], [i], []) for i in range(len(y))]
    return _record(engine, updates, _probe(X))


def multiple_path(lib) -> dict:
    rng = np.random.default_rng(7)
    X, y = mixture(600, rng)
    engine = lib.engine.PathEngine(lib.kernels.make_kernel("rbf", gamma=0.5), 10.0)
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


def window_path(lib, X: np.ndarray, y: np.ndarray, C: float, gamma: float) -> dict:
    total = len(y)
    engine = lib.engine.PathEngine(lib.kernels.make_kernel("rbf", gamma=gamma), C)
    first = np.arange(1423)
    engine.update(X[first], y[first], [(0, int(i)) for i in first])
    updates, window = [], [(0, int(i)) for i in first]
    for step in range(1, 7):
        incoming = (np.arange(1423 - 30, 1423) + 30 * step) % total
        keys = [(step, int(i)) for i in incoming]
        updates.append((X[incoming], y[incoming], keys, window[:30]))
        window = window[30:] + keys
    return _record(engine, updates, _probe(X))


def paths() -> dict:
    """Path name -> a function of a library (its engine and kernels modules) that runs it."""
    X, y = ring_and_blob(2000, seed=1)
    out = {"learn_one ring": lambda lib: learn_one_path(lib, X, y, 10.0, 1.0),
           "multiple": multiple_path}
    fisher = load_fisher()
    if fisher is not None:
        Xf, yf = fisher
        out["learn_one fisher"] = lambda lib: learn_one_path(lib, Xf, yf, 10.0, 1.0)
        for C, gamma in WINDOW_GRID:
            out[f"window C={C:g} gamma={gamma:g}"] = (
                lambda lib, C=C, gamma=gamma: window_path(lib, Xf, yf, C, gamma))
    return out


def load_baseline(revision: str) -> SimpleNamespace:
    """engine.py and kernels.py of a git revision as a package of their own, beside ours."""
    folder = tempfile.mkdtemp(prefix="stream-svm-baseline-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)  # (one was left at every run)
    package = Path(folder) / "baseline_stream_svm"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for name in ("engine", "kernels"):
        source = subprocess.run(
            ["git", "-C", str(ROOT), "show", f"{revision}:stream_svm/{name}.py"],
            check=True, capture_output=True, text=True).stdout
        (package / f"{name}.py").write_text(
            source.replace("stream_svm.", "baseline_stream_svm."))
    sys.path.insert(0, str(package.parent))
    return SimpleNamespace(engine=importlib.import_module("baseline_stream_svm.engine"),
                           kernels=importlib.import_module("baseline_stream_svm.kernels"))


def _per_breakpoint(record: dict) -> float:
    return sum(record["seconds"]) / max(sum(record["breakpoints"]), 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default="7f4f8f5", help="git revision of the baseline")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each engine per path")
    parser.add_argument("--out", type=Path, help="JSON file for the current engine's record")
    args = parser.parse_args()
    baseline = load_baseline(args.baseline)
    current = SimpleNamespace(engine=current_engine, kernels=current_kernels)
    records = {}
    print(f"| path | updates | other breakpoints | max abs df | breakpoints | max abs S | "
          f"ms/bp baseline | ms/bp now | speed-up |\n|{'---|' * 9}")
    with limit_blas_threads():
        for name, run in paths().items():
            best = {"base": np.inf, "now": np.inf}
            for _ in range(args.repeat):  # alternated; the best of each
                old = run(baseline)
                new = run(current)
                best["base"] = min(best["base"], _per_breakpoint(old))
                best["now"] = min(best["now"], _per_breakpoint(new))
            records[name] = new
            differ = sum(a != b for a, b in zip(new["breakpoints"], old["breakpoints"],
                                                strict=True))
            gap = float(np.max(np.abs(np.subtract(new["decisions"], old["decisions"]))))
            print(f"| {name} | {len(new['breakpoints'])} | {differ} | {gap:.2e} | "
                  f"{sum(new['breakpoints'])} | {max(new['margin'])} | "
                  f"{1e3 * best['base']:.4f} | {1e3 * best['now']:.4f} | "
                  f"{best['base'] / best['now']:.1f}x |", flush=True)
    print(machine_info())
    if args.out:
        args.out.write_text(json.dumps({"machine": machine_info(), "paths": records}))
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
