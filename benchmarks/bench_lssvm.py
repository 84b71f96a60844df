"""Benchmark of IncrementalLSSVC: Lee et al.'s mislabeled-data experiment, batch sizes, drift.

Run: .venv/bin/python benchmarks/bench_lssvm.py [--quick] [--no-shuttle]

Prints Markdown tables (copied into benchmarks/BENCHMARKS_lssvm.md):

1. Drift: relative distance of w to the closed form on the current multiset after 10^4 mixed
   single-sample updates, for this module and for the Woodbury recursion of the paper
   (Corollaries 1-2, re-implemented here from the equations as a reference).
2. Mislabeled data (the paper's experiment): 50% of the training labels flipped, the flipped
   samples removed in batches of 10% of the training set; test accuracy, seconds of the exact
   update (forget_many) and of the closed-form retrain (a fresh model's learn_many on the
   remaining samples), both in this process, best of three.
3. Update time against batch size: all flipped samples removed in batches of B.

Data: scikit-learn's digits (even vs odd) and River's Shuttle, both bundled (no download).
"""

from __future__ import annotations

import argparse
import copy
import math
import time

import numpy as np
import pandas as pd
from _common import limit_blas_threads

from stream_svm import IncrementalLSSVC

# ------------------------------------------------------------------------------------ drift


class WoodburyLSSVM:
    """The paper's recursion on (w, C = Phi (Phi^T Phi + rho I)^{-1} Phi^T), no intercept."""

    def __init__(self, rows: np.ndarray, targets: np.ndarray, rho: float) -> None:
        width = rows.shape[1]
        self.rho = rho
        inverse = np.linalg.inv(rho * np.eye(width) + rows.T @ rows)
        self.C = np.eye(width) - rho * inverse
        self.w = inverse @ (rows.T @ targets)

    def update(self, add, y_add, remove, y_remove) -> None:
        """Theorem 1, eqs. (5)-(6), with Phi_c = (Phi_a, Phi_r), Phi_c' = (Phi_a, -Phi_r)."""
        phi_c = np.vstack([add, remove]).T
        phi_c_prime = np.vstack([add, -remove]).T
        y_c = np.concatenate([y_add, -y_remove])
        c_minus_i_phi = self.C @ phi_c - phi_c
        middle = self.rho * np.eye(phi_c.shape[1]) - phi_c_prime.T @ c_minus_i_phi
        left = np.linalg.solve(middle.T, c_minus_i_phi.T).T  # (C - I) Phi_c middle^{-1}
        self.w = self.w + left @ (phi_c_prime.T @ self.w - y_c)
        self.C = self.C + left @ (phi_c_prime.T @ self.C - phi_c_prime.T)


def lstsq_closed_form(rows: np.ndarray, targets: np.ndarray, rho: float, bias: bool):
    n, width = rows.shape
    ones = np.ones((n, 1)) if bias else np.zeros((n, 0))
    stacked = np.vstack(
        [np.hstack([ones, rows]),
         np.hstack([np.zeros((width, ones.shape[1])), math.sqrt(rho) * np.eye(width)])]
    )
    return np.linalg.lstsq(stacked, np.concatenate([targets, np.zeros(width)]), rcond=None)[0]


def drift_problem(kind: str, rng: np.random.Generator, n: int = 3000):
    if kind == "rff":
        inputs = rng.normal(size=(n, 5))
        frequencies = rng.normal(scale=math.sqrt(0.2), size=(5, 30))
        rows = math.sqrt(2 / 30) * np.cos(inputs @ frequencies + rng.uniform(0, 2 * math.pi, 30))
        return rows, np.sign(inputs[:, 0] * inputs[:, 1] + 0.1 * rng.normal(size=n)), 1e-8
    rows = rng.normal(size=(n, 30))
    rho = 1.0
    if kind == "ill":
        rows = rows * np.logspace(-2, 1, 30)
        rows[:, 1] = rows[:, 0] + 1e-4 * rng.normal(size=n)
        rho = 1e-6
    return rows, np.sign(rows[:, 0] + 0.5 * rng.normal(size=n)), rho


def measure_drift(kind: str, steps: int) -> dict[str, float]:
    rng = np.random.default_rng(0)
    rows, targets, rho = drift_problem(kind, rng)
    held, outside = list(range(500)), list(range(500, len(rows)))
    names = [f"f{i}" for i in range(rows.shape[1])]
    frame = pd.DataFrame(rows, columns=names)
    labels = pd.Series(targets > 0)
    woodbury = WoodburyLSSVM(rows[held], targets[held], rho)
    model = IncrementalLSSVC(rho=rho, fit_intercept=False)
    model.learn_many(frame.iloc[held], labels.iloc[held])
    dicts = frame.to_dict("records")
    empty = np.zeros((0, rows.shape[1]))
    for _ in range(steps):
        if (rng.random() < 0.5 or len(held) < 200) and len(held) < 2000:
            i = outside.pop(int(rng.integers(len(outside))))
            held.append(i)
            woodbury.update(rows[i : i + 1], targets[i : i + 1], empty, np.zeros(0))
            model.learn_one(dicts[i], bool(labels[i]))
        else:
            i = held.pop(int(rng.integers(len(held))))
            outside.append(i)
            woodbury.update(empty, np.zeros(0), rows[i : i + 1], targets[i : i + 1])
            model.forget_one(dicts[i], bool(labels[i]))
    reference = lstsq_closed_form(rows[held], targets[held], rho, bias=False)
    fresh = IncrementalLSSVC(rho=rho, fit_intercept=False)
    fresh.learn_many(frame.iloc[held], labels.iloc[held])

    def error(w: np.ndarray) -> float:
        return float(np.linalg.norm(w - reference) / np.linalg.norm(reference))

    gram = rho * np.eye(rows.shape[1]) + rows[held].T @ rows[held]
    return {
        "cond": float(np.linalg.cond(gram)),
        "woodbury": error(woodbury.w),
        "this module": error(model.coef_),
        "fresh normal equations": error(fresh.coef_),
    }


# ------------------------------------------------------------------------------------- data


def load_digits_even_odd(rng: np.random.Generator):
    from sklearn.datasets import load_digits

    digits = load_digits()
    X = digits.data / 16.0
    y = digits.target % 2 == 0
    return X, y


def load_shuttle(rng: np.random.Generator):
    from river import datasets

    rows, labels = [], []
    for x, y in datasets.Shuttle():
        rows.append([x[f"f{i}"] for i in range(1, 10)])
        labels.append(bool(y))
    X = np.asarray(rows, dtype=float)
    # The nine sensor readings have very different ranges: standardize for one RBF width.
    X = (X - X.mean(axis=0)) / X.std(axis=0)
    return X, np.asarray(labels)


def split(X, y, rng, test_fraction=0.3):
    order = rng.permutation(len(X))
    cut = int(len(X) * (1 - test_fraction))
    train, test = order[:cut], order[cut:]
    return X[train], y[train], X[test], y[test]


def best_of(repeats: int, run) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def frame_of(X: np.ndarray) -> pd.DataFrame:
    return pd.DataFrame(X, columns=[f"x{i}" for i in range(X.shape[1])])


# ------------------------------------------------------------------------ mislabeled removal


def mislabeled_experiment(name: str, X, y, params: dict, repeats: int = 3) -> None:
    rng = np.random.default_rng(42)
    X_train, y_train, X_test, y_test = split(X, y, rng)
    n = len(X_train)
    flipped = rng.permutation(n)[: n // 2]
    noisy = y_train.copy()
    noisy[flipped] = ~noisy[flipped]
    train_frame, test_frame = frame_of(X_train), frame_of(X_test)
    labels = pd.Series(noisy)

    model = IncrementalLSSVC(**params)
    model.learn_many(train_frame, labels)
    held = np.ones(n, dtype=bool)

    def accuracy(m: IncrementalLSSVC) -> float:
        return float((m.predict_many(test_frame).to_numpy() == y_test).mean())

    batch = n // 10
    print(f"\n#### {name}: n_train={n}, n_test={len(X_test)}, {params}\n")
    print("| removed | flipped left | test acc | update s | retrain s | speed-up | max rel diff |")
    print("|---|---|---|---|---|---|---|")
    print(f"| 0% | 50% | {accuracy(model):.4f} | | | | |")
    for step in range(5):
        chunk = flipped[step * batch : (step + 1) * batch]
        removal = (train_frame.iloc[chunk], labels.iloc[chunk])
        trials = [copy.deepcopy(model) for _ in range(repeats)]
        update_s = best_of(
            repeats, lambda trials=trials, removal=removal: trials.pop().forget_many(*removal)
        )
        model.forget_many(*removal)
        held[chunk] = False
        retrained: list[IncrementalLSSVC] = []

        def retrain(retrained: list = retrained) -> None:
            fresh = IncrementalLSSVC(**params)
            fresh.learn_many(train_frame[held], labels[held])
            retrained.append(fresh)

        retrain_s = best_of(repeats, retrain)
        reference = retrained[-1]
        w, w_ref = model._solution, reference._solution
        difference = float(np.linalg.norm(w - w_ref) / np.linalg.norm(w_ref))
        left = (n // 2 - (step + 1) * batch) / (n - (step + 1) * batch)
        print(
            f"| {10 * (step + 1)}% | {100 * left:.0f}% | {accuracy(model):.4f} | {update_s:.4f} "
            f"| {retrain_s:.4f} | {retrain_s / update_s:.1f}x | {difference:.1e} |"
        )


def batch_size_experiment(name: str, X, y, params: dict, sizes: list[int]) -> None:
    rng = np.random.default_rng(42)
    X_train, y_train, _, _ = split(X, y, rng)
    n = len(X_train)
    flipped = rng.permutation(n)[: n // 2]
    noisy = y_train.copy()
    noisy[flipped] = ~noisy[flipped]
    train_frame, labels = frame_of(X_train), pd.Series(noisy)
    start_model = IncrementalLSSVC(**params)
    start_model.learn_many(train_frame, labels)
    removed = flipped[: max(sizes) * (len(flipped) // max(sizes))]

    # Reference: the paper's Woodbury form on the same feature map, without intercept terms.
    design = start_model._design(
        train_frame[start_model.feature_names_].to_numpy(), start_model._omega,
        start_model._phase
    )
    targets = np.where(noisy, 1.0, -1.0)

    retrain_s = best_of(3, lambda: IncrementalLSSVC(**params).learn_many(
        train_frame.drop(index=removed), labels.drop(index=removed)))
    print(f"\n#### {name}: removing {len(removed)} samples in batches of B "
          f"(closed-form retrain on the rest: {retrain_s:.3f} s)\n")
    print("| B | batches | this module s | per sample ms | Woodbury (paper) s |")
    print("|---|---|---|---|---|")
    for size in sizes:
        chunks = [removed[i : i + size] for i in range(0, len(removed), size)]
        model = copy.deepcopy(start_model)
        frames = [(train_frame.iloc[c], labels.iloc[c]) for c in chunks]
        start = time.perf_counter()
        for X_r, y_r in frames:
            model.forget_many(X_r, y_r)
        ours = time.perf_counter() - start
        # The paper's problem on the same columns (its rho also shrinks the constant column).
        woodbury = WoodburyLSSVM(design, targets, params["rho"])
        empty = np.zeros((0, design.shape[1]))
        start = time.perf_counter()
        for c in chunks:
            woodbury.update(empty, np.zeros(0), design[c], targets[c])
        theirs = time.perf_counter() - start
        print(f"| {size} | {len(chunks)} | {ours:.3f} | {1e3 * ours / len(removed):.3f} "
              f"| {theirs:.3f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer steps and sizes")
    parser.add_argument("--no-shuttle", action="store_true")
    args = parser.parse_args()
    # One BLAS thread whatever the environment says: the ratios compare our updates with
    # refits in one process, and a second thread would time the other jobs on the machine.
    blas_limit = limit_blas_threads()  # noqa: F841 (kept alive)

    steps = 2000 if args.quick else 10_000
    print(f"### Drift after {steps} mixed single-sample updates (relative error on w)\n")
    print("| problem | rho | cond(A) | Woodbury (paper) | this module | fresh normal equations |")
    print("|---|---|---|---|---|---|")
    for kind, rho in [("well", "1"), ("ill", "1e-6"), ("rff", "1e-8")]:
        result = measure_drift(kind, steps)
        print(f"| {kind} | {rho} | {result['cond']:.1e} | {result['woodbury']:.1e} "
              f"| {result['this module']:.1e} | {result['fresh normal equations']:.1e} |")

    rng = np.random.default_rng(0)
    X, y = load_digits_even_odd(rng)
    digits_params = {"rho": 1.0, "features": "rff", "n_components": 500, "gamma": 0.25,
                     "seed": 0}
    mislabeled_experiment("digits even/odd, RFF", X, y, digits_params)
    sizes = [1, 5, 10, 25, 50, 100, 200, 600] if not args.quick else [1, 10, 100, 600]
    batch_size_experiment("digits", X, y, digits_params, sizes)

    if not args.no_shuttle:
        X, y = load_shuttle(rng)
        shuttle_params = {"rho": 1.0, "features": "rff", "n_components": 300, "gamma": 0.1,
                          "seed": 0}
        mislabeled_experiment("Shuttle, RFF", X, y, shuttle_params)
        sizes = [10, 100, 1000, 17000] if not args.quick else [100, 17000]
        batch_size_experiment("Shuttle", X, y, shuttle_params, sizes)


if __name__ == "__main__":
    main()
