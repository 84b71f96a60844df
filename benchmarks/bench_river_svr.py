"""Exact sliding-window SVR on next-day river flow (Fisher, Oldman, Saugeen).

Part 1, speed: a window of n = 1423 days (Saugeen has 1393 samples: its window is 1363), each
step adds the next 30 days and removes the oldest 30. For every (C, gamma, epsilon) of the grid
the same window steps are timed for

- ``SlidingWindowSVR(window_size=n, step=30)``: one ``learn_many`` of 30 rows (one multiple
  path adding 30 samples and removing 30: one engine point per sample, on whichever edge
  of the tube it lies beyond),
- libsvm: scikit-learn ``SVR(kernel="rbf")`` retrained from scratch on the new window (default
  tol 1e-3, cache_size 2000 MB), one BLAS thread,

in this process, after checking that both give the same predictions (libsvm to its tolerance).
As in bench_river_flow.py the series is treated as circular to take several steps. Features are
min-max scaled as in the paper; the flow is divided by its standard deviation over the series
(the grid's epsilon is in those units), a fixed scale for the experiment.

Part 2, accuracy: progressive validation (predict each day, then learn it) over each whole
series, flows in their own units: SlidingWindowSVR (window 365 days, step 1; flows divided by
the standard deviation of the first 365 days, known before they are predicted) against River's
``linear_model.LinearRegression``, ``neighbors.KNNRegressor`` and ``forest.ARFRegressor``: MAE,
RMSE and seconds. Figure: predicted and true flow over the last year of the Fisher series.

Run: ``.venv/bin/python benchmarks/bench_river_svr.py`` (``--quick`` for a smoke run).
"""

from __future__ import annotations

import argparse
import json
import math
import time

import numpy as np
from _common import (
    FIGURES_DIR,
    FISHER_DIR,
    OUT_DIR,
    ROOT,
    emit,
    limit_blas_threads,
    machine_info,
    markdown_table,
)
from sklearn.svm import SVR

from stream_svm import SlidingWindowSVR
from stream_svm.datasets import load_river_flow

WINDOW = 1423
STEP = 30
C_GRID = [0.1, 1.0, 10.0, 100.0]
GAMMA_GRID = [0.01, 0.1, 1.0]
EPSILON_GRID = [0.05, 0.2]
RIVERS = [("fisher", FISHER_DIR), ("oldman", FISHER_DIR.parent / "more-rivers"),
          ("saugeen", FISHER_DIR.parent / "more-rivers")]


def _frame(X: np.ndarray, names: list[str]):
    import pandas as pd

    return pd.DataFrame(X, columns=names)


def speed_setting(X, y, names, window, C, gamma, epsilon, steps) -> dict:
    import pandas as pd

    total = len(y)
    model = SlidingWindowSVR(window_size=window, step=STEP, C=C, epsilon=epsilon, gamma=gamma)
    start = np.arange(window)
    started = time.perf_counter()
    model.learn_many(_frame(X[start], names), pd.Series(y[start]), keys=[(0, int(i))
                                                                           for i in start])
    init_seconds = time.perf_counter() - started
    ours, theirs, breakpoints, gaps = [], [], [], []
    for k in range(1, steps + 1):
        new = (np.arange(window) + STEP * k)[-STEP:] % total
        frame = _frame(X[new], names)
        started = time.perf_counter()
        model.learn_many(frame, pd.Series(y[new]), keys=[(k, int(i)) for i in new])
        ours.append(time.perf_counter() - started)
        breakpoints.append(model.last_update.breakpoints)
        current = (np.arange(window) + STEP * k) % total
        svr = SVR(kernel="rbf", C=C, gamma=gamma, epsilon=epsilon, cache_size=2000)
        started = time.perf_counter()
        svr.fit(X[current], y[current])
        theirs.append(time.perf_counter() - started)
        probe = X[current[::50]]
        gaps.append(float(np.max(np.abs(model.predict_many(_frame(probe, names)).to_numpy()
                                        - svr.predict(probe)))))
    return {"C": C, "gamma": gamma, "epsilon": epsilon, "init_seconds": init_seconds,
            "ours_seconds": float(np.median(ours)), "libsvm_seconds": float(np.median(theirs)),
            "breakpoints": float(np.mean(breakpoints)), "n_margin": model.n_margin,
            "n_error": model.n_error, "max_gap_vs_libsvm": max(gaps)}


class _ScaledTarget:
    """A regressor learning y / scale (a constant fixed in advance) and predicting back."""

    def __init__(self, model, scale: float) -> None:
        self.model, self.scale = model, scale

    def predict_one(self, x):
        return self.model.predict_one(x) * self.scale

    def learn_one(self, x, y):
        self.model.learn_one(x, y / self.scale)


def progressive(X, y, names, models: dict) -> tuple[list[dict], dict]:
    """MAE, RMSE, seconds of each model, predicting each day before learning it; and the
    predictions (for the figure)."""
    rows, predictions = [], {}
    xs = [dict(zip(names, row, strict=True)) for row in X.tolist()]
    for name, model in models.items():
        predicted = np.empty(len(y))
        started = time.perf_counter()
        for i, (x, target) in enumerate(zip(xs, y.tolist(), strict=True)):
            value = model.predict_one(x)
            predicted[i] = 0.0 if value is None else value
            model.learn_one(x, target)
        seconds = time.perf_counter() - started
        errors = y - predicted
        rows.append({"model": name, "mae": float(np.mean(np.abs(errors))),
                     "rmse": float(math.sqrt(np.mean(errors**2))), "seconds": seconds})
        predictions[name] = predicted
    return rows, predictions


def plot_year(y, predictions, path, river) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    days = np.arange(len(y))[-365:]
    fig, ax = plt.subplots(figsize=(7.0, 3.0))
    ax.plot(days, y[-365:], color="black", linewidth=1.2, label="true flow")
    for name, style in (("SlidingWindowSVR", "-"), ("KNNRegressor", ":")):
        if name in predictions:
            ax.plot(days, predictions[name][-365:], style, linewidth=0.9, label=name)
    ax.set_xlabel("day of the series")
    ax.set_ylabel("flow")
    ax.set_title(f"{river}: next-day flow, progressive predictions over the last year",
                 fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=70)
    plt.close(fig)


def main() -> None:
    from river import forest, linear_model, neighbors

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="two settings, Fisher only")
    parser.add_argument("--steps", type=int, default=10, help="window steps per setting")
    args = parser.parse_args()
    _threads = limit_blas_threads()
    if not (FISHER_DIR / "fisher.dat").exists():
        print(f"river data not found at {FISHER_DIR}: nothing to measure", flush=True)
        return
    rivers = RIVERS[:1] if args.quick else RIVERS
    grid = ([(1.0, 0.1, 0.05), (100.0, 1.0, 0.2)] if args.quick else
            [(C, g, e) for g in GAMMA_GRID for C in C_GRID for e in EPSILON_GRID])
    speed, accuracy, texts = [], [], []
    for river, directory in rivers:
        X, flow, names = load_river_flow(directory, river=river, target="flow")
        window = min(WINDOW, len(flow) - STEP)
        y = flow / flow.std()
        for C, gamma, epsilon in grid:
            started = time.perf_counter()
            row = {"river": river, "window": window,
                   **speed_setting(X, y, names, window, C, gamma, epsilon, args.steps)}
            speed.append(row)
            print(f"{river} C={C:g} gamma={gamma:g} eps={epsilon:g}: ours "
                  f"{row['ours_seconds']:.4f}s libsvm {row['libsvm_seconds']:.4f}s "
                  f"({time.perf_counter() - started:.1f}s)", flush=True)
        scale = float(flow[:365].std())
        models = {
            "SlidingWindowSVR": _ScaledTarget(
                SlidingWindowSVR(window_size=365, step=1, C=10.0, gamma=0.1, epsilon=0.05),
                scale),
            "LinearRegression": linear_model.LinearRegression(),
            "KNNRegressor": neighbors.KNNRegressor(n_neighbors=5),
            "ARFRegressor": forest.ARFRegressor(seed=1),
        }
        rows, predictions = progressive(X, flow, names, models)
        for row in rows:
            accuracy.append({"river": river, **row})
        if river == "fisher":
            figure = (OUT_DIR if args.quick else FIGURES_DIR) / "river_svr_year.png"
            figure.parent.mkdir(parents=True, exist_ok=True)
            plot_year(flow, predictions, figure, river)

    OUT_DIR.mkdir(parents=True, exist_ok=True)
    suffix = "_quick" if args.quick else ""
    (OUT_DIR / f"river_svr{suffix}.json").write_text(json.dumps(
        {"speed": speed, "accuracy": accuracy}, indent=1))
    ratios = [r["libsvm_seconds"] / r["ours_seconds"] for r in speed]
    geo = math.exp(float(np.mean(np.log(ratios))))
    worst = min(speed, key=lambda r: r["libsvm_seconds"] / r["ours_seconds"])
    texts.append(f"## Sliding-window SVR step vs libsvm SVR retrain ({args.steps} step(s) per "
                 f"setting, medians)")
    texts.append(markdown_table(
        ["river", "window", "gamma", "C", "epsilon", "ours s/step", "libsvm s/retrain",
         "libsvm/ours", "bp/step", "n margin", "n error", "init s", "max |f - f_libsvm|"],
        [[r["river"], r["window"], f"{r['gamma']:g}", f"{r['C']:g}", f"{r['epsilon']:g}",
          r["ours_seconds"], r["libsvm_seconds"], r["libsvm_seconds"] / r["ours_seconds"],
          r["breakpoints"], r["n_margin"], r["n_error"], r["init_seconds"],
          r["max_gap_vs_libsvm"]] for r in speed]))
    texts.append(f"libsvm/ours: min {min(ratios):.3g} ({worst['river']}, C={worst['C']:g}, "
                 f"gamma={worst['gamma']:g}, epsilon={worst['epsilon']:g}), geometric mean "
                 f"{geo:.3g} over {len(ratios)} settings; >= 5x: "
                 f"{sum(r >= 5 for r in ratios)}/{len(ratios)}.")
    texts.append("## Progressive validation, next-day flow (flow units)")
    texts.append(markdown_table(["river", "model", "MAE", "RMSE", "seconds"],
                                [[r["river"], r["model"], r["mae"], r["rmse"], r["seconds"]]
                                 for r in accuracy]))
    texts.append(f"Figure: {((OUT_DIR if args.quick else FIGURES_DIR) / 'river_svr_year.png').relative_to(ROOT)}")  # noqa: E501
    texts.append(machine_info())
    emit(f"river_svr{suffix}", "\n\n".join(texts))


if __name__ == "__main__":
    main()
