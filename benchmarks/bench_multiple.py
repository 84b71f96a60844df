"""Multiple vs single incremental-decremental updates (Karasuyama & Takeuchi 2009, sec 4.1).

n = 500 points in 2-D (class +1 a mixture of two Gaussians, class -1 one Gaussian, equal priors,
as in the paper's Fig 3), standardized with the pool's mean and deviation; RBF kernel with
C = 10 and gamma = 1 (our choice: the paper does not state its values). Three scenarios:

(a) add m = 1..50 points, (b) remove l = 1..50 points, (c) add m and remove l = m, m = 1..25.

As in the paper the moved points are ones whose alpha is C: added points are drawn from
candidates that are bounded (alpha = C, and y f <= 0.5) in the solution trained on the base
set plus all 400 candidates, and removed points are stored points with alpha = C in the base
solution. (An added point is not guaranteed to end at C with fewer companions; the fraction
that did is reported.)

For each m (or l): breakpoints and seconds of MID (one ``PathEngine.update`` with all points),
SID (m + l single updates from the same starting state, a deep copy; removals first, as
``SlidingWindowSVC(strategy="single")`` does), and scikit-learn's SVC retrained on the resulting
set, averaged over several random draws. Karasuyama's analysis predicts MID breakpoints
~ SID breakpoints * sqrt(k) / k with k the number of moved points, all ending at C or 0.

Run: ``.venv/bin/python benchmarks/bench_multiple.py`` (``--quick`` for a smoke run).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import time

import numpy as np

# Run as a script, so benchmarks/ itself is on sys.path.
from _common import (
    FIGURES_DIR,
    OUT_DIR,
    ROOT,
    emit,
    limit_blas_threads,
    machine_info,
    markdown_table,
)
from sklearn.svm import SVC

from stream_svm.engine import PathEngine
from stream_svm.kernels import make_kernel

N_BASE = 500
N_CANDIDATES = 400
C = 10.0
GAMMA = 1.0


def mixture(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """+1 from 0.5 N((-1.5, 0), I) + 0.5 N((1.5, 0), I); -1 from N((0, 0.5), I)."""
    positive = rng.random(n) < 0.5
    side = np.where(rng.random(n) < 0.5, -1.5, 1.5)
    centers = np.where(positive[:, None], np.column_stack([side, np.zeros(n)]),
                       np.array([[0.0, 0.5]]))
    X = centers + rng.normal(size=(n, 2))
    return X, np.where(positive, 1.0, -1.0)


def draw(seed: int) -> dict:
    """Base set, bounded candidates to add, bounded stored points to remove, test grid."""
    rng = np.random.default_rng(seed)
    X, y = mixture(N_BASE + N_CANDIDATES, rng)
    X = (X - X.mean(axis=0)) / X.std(axis=0)
    kernel = make_kernel("rbf", gamma=GAMMA)
    base = PathEngine(kernel, C=C)
    base.update(X[:N_BASE], y[:N_BASE], keys=list(range(N_BASE)))
    full = PathEngine(kernel, C=C)
    full.update(X, y, keys=list(range(X.shape[0])))
    # Bounded and well inside the error region (y f <= 0.5) in the bigger solution: such points
    # almost always stay at C with fewer companions (checked: the "ending at C" column).
    at_bound = [i for i in range(N_BASE, X.shape[0])
                if full.alpha[full.position(i)] == C and full.g[full.position(i)] <= -0.5]
    stored_bound = [k for k in range(N_BASE) if base.alpha[base.position(k)] == C]
    add = rng.permutation(at_bound)
    remove = rng.permutation(stored_bound)
    return {"X": X, "y": y, "base": base, "add": [int(i) for i in add],
            "remove": [int(k) for k in remove], "test": rng.normal(size=(400, 2))}


def measure(state: dict, add: list[int], remove: list[int]) -> dict:
    X, y, base = state["X"], state["y"], state["base"]
    mid = copy.deepcopy(base)
    started = time.perf_counter()
    stats = mid.update(X[add], y[add], keys=add, remove=remove)
    mid_seconds = time.perf_counter() - started
    ended_at_C = sum(mid.alpha[mid.position(i)] == C for i in add)

    sid = copy.deepcopy(base)
    breakpoints = 0
    started = time.perf_counter()
    for key in remove:
        breakpoints += sid.update(remove=[key]).breakpoints
    for i in add:
        breakpoints += sid.update(X[i : i + 1], y[i : i + 1], keys=[i]).breakpoints
    sid_seconds = time.perf_counter() - started
    gap = float(np.max(np.abs(mid.decision_function(state["test"])
                              - sid.decision_function(state["test"]))))

    kept = sorted(set(range(N_BASE)) - set(remove)) + list(add)
    svc = SVC(kernel="rbf", C=C, gamma=GAMMA, cache_size=500)
    started = time.perf_counter()
    svc.fit(X[kept], y[kept])
    svc_seconds = time.perf_counter() - started
    return {"mid_bp": stats.breakpoints, "sid_bp": breakpoints, "mid_s": mid_seconds,
            "sid_s": sid_seconds, "svc_s": svc_seconds, "gap": gap,
            "added_at_C": ended_at_C, "added": len(add)}


def plot(curves: dict[str, list[dict]], path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(10, 5.6))
    titles = {"add": "(a) add m", "remove": "(b) remove l", "both": "(c) add m, remove l = m"}
    for column, (scenario, rows) in enumerate(curves.items()):
        ks = [r["k"] for r in rows]
        moved = [r["moved"] for r in rows]
        sid = np.array([r["sid_bp"] for r in rows])
        top, bottom = axes[0][column], axes[1][column]
        top.plot(ks, sid, "s-", label="SID", markersize=3)
        top.plot(ks, [r["mid_bp"] for r in rows], "o-", label="MID", markersize=3)
        top.plot(ks, sid * np.sqrt(moved) / np.array(moved), "k--", label="SID sqrt(k)/k")
        top.set_title(titles[scenario], fontsize=9)
        top.set_ylabel("breakpoints")
        bottom.semilogy(ks, [r["sid_s"] for r in rows], "s-", label="SID", markersize=3)
        bottom.semilogy(ks, [r["mid_s"] for r in rows], "o-", label="MID", markersize=3)
        bottom.semilogy(ks, [r["svc_s"] for r in rows], "^:", label="libsvm retrain",
                        markersize=3)
        bottom.set_xlabel("m" if scenario != "remove" else "l")
        bottom.set_ylabel("seconds")
        for ax in (top, bottom):
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=70)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="one draw, a few m")
    parser.add_argument("--draws", type=int, default=5)
    args = parser.parse_args()
    _threads = limit_blas_threads()
    draws = 1 if args.quick else args.draws
    ks = {"add": [1, 5, 10, 50], "remove": [1, 5, 10, 50], "both": [1, 5, 25]} if args.quick \
        else {"add": range(1, 51), "remove": range(1, 51), "both": range(1, 26)}

    raw: dict[str, dict[int, list[dict]]] = {s: {k: [] for k in ks[s]} for s in ks}
    for d in range(draws):
        state = draw(seed=1000 + d)
        print(f"draw {d}: {len(state['add'])} bounded candidates, {len(state['remove'])} "
              f"bounded stored points", flush=True)
        for scenario, values in ks.items():
            for k in values:
                add = state["add"][:k] if scenario != "remove" else []
                remove = state["remove"][:k] if scenario != "add" else []
                if len(add) < (k if scenario != "remove" else 0) or \
                        len(remove) < (k if scenario != "add" else 0):
                    raise RuntimeError(f"draw {d} has too few bounded points for k = {k}")
                raw[scenario][k].append(measure(state, add, remove))

    curves: dict[str, list[dict]] = {}
    for scenario, per_k in raw.items():
        rows = []
        for k, runs in per_k.items():
            moved = k if scenario != "both" else 2 * k
            row = {"k": k, "moved": moved}
            for name in ("mid_bp", "sid_bp", "mid_s", "sid_s", "svc_s"):
                row[name] = float(np.mean([r[name] for r in runs]))
            row["gap"] = max(r["gap"] for r in runs)
            added = sum(r["added"] for r in runs)
            row["at_C"] = sum(r["added_at_C"] for r in runs) / added if added else float("nan")
            rows.append(row)
        curves[scenario] = rows

    suffix = "_quick" if args.quick else ""
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    (OUT_DIR / f"multiple{suffix}.json").write_text(json.dumps(curves, indent=1))
    # Smoke-run plots stay in the git-ignored out/; figures/ holds the full runs' plots.
    figure = (OUT_DIR if args.quick else FIGURES_DIR) / f"multiple_breakpoints{suffix}.png"
    figure.parent.mkdir(parents=True, exist_ok=True)
    plot(curves, figure)

    shown = {1, 2, 5, 10, 15, 20, 25, 30, 40, 50}
    sections = [f"## Multiple vs single updates, artificial 2-D data (n = {N_BASE}, C = {C:g}, "
                f"gamma = {GAMMA:g}, RBF, {draws} draw(s), means over draws)"]
    summary = []
    for scenario, rows in curves.items():
        table_rows = []
        for r in rows:
            if r["k"] in shown or args.quick:
                theory = r["sid_bp"] * math.sqrt(r["moved"]) / r["moved"]
                table_rows.append([r["k"], r["mid_bp"], r["sid_bp"], theory,
                                   r["mid_bp"] / r["sid_bp"], math.sqrt(r["moved"]) / r["moved"],
                                   r["mid_s"], r["sid_s"], r["svc_s"], r["gap"], r["at_C"]])
        sections.append(f"### {scenario}\n\n" + markdown_table(
            ["k", "MID bp", "SID bp", "SID*sqrt(k)/k", "MID/SID bp", "sqrt(k)/k", "MID s",
             "SID s", "libsvm s", "max abs(f_MID - f_SID)", "added ending at C"], table_rows))
        last = rows[-1]
        ratio = last["mid_bp"] / last["sid_bp"]
        theory = math.sqrt(last["moved"]) / last["moved"]
        summary.append([scenario, last["k"], last["moved"], ratio, theory, ratio / theory,
                        last["sid_s"] / last["mid_s"]])
    sections.append("k = m (or l); the theory uses the number of moved points (m + l for (c)).")
    sections.append("### Ratio at the largest k\n\n" + markdown_table(
        ["scenario", "k", "moved points", "MID/SID breakpoints", "sqrt(moved)/moved",
         "measured / theory", "SID/MID seconds"], summary))
    sections.append(f"Figure: {figure.relative_to(ROOT)}")
    sections.append(machine_info())
    emit(f"multiple{suffix}", "\n\n".join(sections))


if __name__ == "__main__":
    main()
