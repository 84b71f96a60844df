"""alpha-ISVM (Xiao, Wang & Zhang 2000) on real data: the protocol of the paper's Tables 1-2.

Data: River's Phishing (1250 x 9) and scikit-learn's digits as even vs odd (1797 x 64, pixels
divided by 16). A random quarter is held out as the test set; of the rest, half is the initial
set and the other half arrives in 5 increments. Kernels: linear (the paper's "1 level
polynomial"), C = 1; RBF with gamma = 1 / (d * variance of the training features) (scikit-
learn's "scale") and C = 10.

Methods, after the initial set and after each increment:

* ``AlphaISVC`` for alpha in {0, 0.5, 0.9} with the paper's beta = 0.5 and misclassification
  as the validation error (the paper's rule), plus alpha = 0.9 with ``validation_margin = 1``
  (the search then trains on every margin violator, as an exact decomposition would);
* full retraining: a fresh ``IncrementalSVC`` trained on everything seen in one multiple
  update (the project's exact solver, so this is the batch optimum);
* scikit-learn's ``SVC`` fitted on everything seen (the external baseline, same C and kernel).

Reported: samples kept (in all sets; everything seen for the retraining baselines), accuracy
on the held-out test set, and wall seconds of the step (learn_many / fit only; predicting the
test set is not timed). Several random splits (``--seeds``); tables show their mean.

Run: ``.venv/bin/python benchmarks/bench_alpha_isvm.py`` (``--quick`` for a smoke run).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import pandas as pd

# Run as a script, so benchmarks/ itself is on sys.path.
from _common import OUT_DIR, emit, machine_info, markdown_table
from sklearn.svm import SVC

from stream_svm import AlphaISVC, IncrementalSVC

INCREMENTS = 5
TEST_FRACTION = 0.25
ALPHAS = (0.0, 0.5, 0.9)


def load(name: str) -> tuple[pd.DataFrame, np.ndarray]:
    if name == "phishing":
        from river import datasets

        rows, labels = zip(*datasets.Phishing(), strict=True)
        return pd.DataFrame(list(rows)).astype(float), np.array(labels, dtype=bool)
    from sklearn.datasets import load_digits

    digits = load_digits()
    X = pd.DataFrame(digits.data / 16.0, columns=[f"px{i}" for i in range(64)])
    return X, digits.target % 2 == 0


def kernel_params(kind: str, X: np.ndarray) -> dict:
    if kind == "linear":
        return {"kernel": "linear", "C": 1.0}
    return {"kernel": "rbf", "C": 10.0, "gamma": 1.0 / (X.shape[1] * X.var())}


def split(X: pd.DataFrame, y: np.ndarray, seed: int):
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(y))
    n_test = round(TEST_FRACTION * len(y))
    test, train = order[:n_test], order[n_test:]
    n_init = len(train) // 2
    chunks = [train[:n_init], *np.array_split(train[n_init:], INCREMENTS)]
    frame = X.reset_index(drop=True)
    return frame, y, chunks, test


def accuracy(predicted: np.ndarray, truth: np.ndarray) -> float:
    return float(np.mean(predicted == truth))


def run_alpha(params: dict, frame, y, chunks, test, **alpha_params) -> list[dict]:
    model = AlphaISVC(**alpha_params, **params)
    X_test = frame.iloc[test]
    rows = []
    for chunk in chunks:
        started = time.perf_counter()
        model.learn_many(frame.iloc[chunk], pd.Series(y[chunk]))
        seconds = time.perf_counter() - started
        stats = model.last_increment
        rows.append({"kept": model.n_stored, "acc": accuracy(model.predict_many(X_test)
                                                              .to_numpy(), y[test]),
                     "seconds": seconds, "rounds": stats.rounds, "converged": stats.converged,
                     "training": stats.n_training, "working": stats.n_working,
                     "caching": stats.n_caching, "backup": stats.n_backup,
                     "discarded": stats.discarded, "breakpoints": stats.breakpoints})
    return rows


def run_full(params: dict, frame, y, chunks, test) -> tuple[list[dict], list[dict]]:
    ours, sk = [], []
    X_test = frame.iloc[test]
    seen = np.zeros(0, dtype=int)
    sk_params = {k: v for k, v in params.items()}
    for chunk in chunks:
        seen = np.concatenate([seen, chunk])
        model = IncrementalSVC(**params)
        started = time.perf_counter()
        model.learn_many(frame.iloc[seen], pd.Series(y[seen]))
        seconds = time.perf_counter() - started
        ours.append({"kept": len(seen), "seconds": seconds,
                     "acc": accuracy(model.predict_many(X_test).to_numpy(), y[test]),
                     "breakpoints": model.last_update.breakpoints})
        svc = SVC(**sk_params)
        started = time.perf_counter()
        svc.fit(frame.iloc[seen].to_numpy(), y[seen])
        seconds = time.perf_counter() - started
        sk.append({"kept": len(seen), "seconds": seconds,
                   "acc": accuracy(svc.predict(X_test.to_numpy()), y[test])})
    return ours, sk


METHODS = [*(f"alpha={a:g}" for a in ALPHAS), "alpha=0.9, m=1", "full retrain (engine)",
           "full retrain (sklearn SVC)"]


def run_case(dataset: str, kind: str, seeds: list[int]) -> dict:
    X, y = load(dataset)
    results: dict[str, list[list[dict]]] = {m: [] for m in METHODS}
    for seed in seeds:
        frame, labels, chunks, test = split(X, y, seed)
        train_rows = np.concatenate(chunks)
        params = kernel_params(kind, frame.iloc[train_rows].to_numpy())
        for a in ALPHAS:
            results[f"alpha={a:g}"].append(
                run_alpha(params, frame, labels, chunks, test, discard_ratio=a, cache_ratio=0.5))
        results["alpha=0.9, m=1"].append(
            run_alpha(params, frame, labels, chunks, test, discard_ratio=0.9, cache_ratio=0.5,
                      validation_margin=1.0))
        ours, sk = run_full(params, frame, labels, chunks, test)
        results["full retrain (engine)"].append(ours)
        results["full retrain (sklearn SVC)"].append(sk)
        print(f"  {dataset}/{kind} seed {seed} done", flush=True)
    return results


def mean_of(runs: list[list[dict]], field: str) -> np.ndarray:
    return np.array([[step[field] for step in run] for run in runs], dtype=float).mean(axis=0)


def report(case: str, results: dict, n_seen: list[int]) -> str:
    steps = ["initial", *(f"inc {i}" for i in range(1, INCREMENTS + 1))]
    parts = [f"### {case}\n"]
    for field, title, fmt in (("kept", "Samples kept", lambda v: f"{v:.0f}"),
                              ("acc", "Test accuracy (%)", lambda v: f"{100 * v:.2f}"),
                              ("seconds", "Seconds of the step", lambda v: f"{v:.3f}")):
        rows = []
        for i, step in enumerate(steps):
            row = [step, n_seen[i]]
            row += [fmt(mean_of(results[m], field)[i]) for m in METHODS]
            rows.append(row)
        parts.append(f"{title}:\n\n" + markdown_table(["step", "seen", *METHODS], rows) + "\n")
    return "\n".join(parts)


def summary_rows(case: str, results: dict, seen: int) -> list[list]:
    full_acc = mean_of(results["full retrain (engine)"], "acc")[-1]
    rows = []
    for m in METHODS[:4]:
        runs = results[m]
        kept = mean_of(runs, "kept")[-1]
        acc = mean_of(runs, "acc")[-1]
        seconds = mean_of(runs, "seconds")[1:].sum()
        rounds = mean_of(runs, "rounds")[1:].sum()
        unconverged = int(sum(not s["converged"] for run in runs for s in run))
        rows.append([case, m, f"{100 * kept / seen:.1f}", f"{100 * acc:.2f}",
                     f"{100 * (acc - full_acc):+.2f}", f"{seconds:.3f}", f"{rounds:.1f}",
                     unconverged])
    for m in METHODS[4:]:
        rows.append([case, m, "100.0", f"{100 * mean_of(results[m], 'acc')[-1]:.2f}", "",
                     f"{mean_of(results[m], 'seconds')[1:].sum():.3f}", "", ""])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one seed, Phishing only")
    parser.add_argument("--seeds", type=int, default=5, help="number of random splits")
    args = parser.parse_args()
    seeds = [0] if args.quick else list(range(args.seeds))
    cases = [("phishing", "linear"), ("phishing", "rbf")]
    if not args.quick:
        cases += [("digits", "linear"), ("digits", "rbf")]
    sections, summary, raw = [], [], {}
    for dataset, kind in cases:
        results = run_case(dataset, kind, seeds)
        X, y = load(dataset)
        _, _, chunks, _ = split(X, y, seeds[0])
        n_seen = np.cumsum([len(c) for c in chunks]).tolist()
        name = f"{dataset} / {kind}"
        sections.append(report(name, results, n_seen))
        summary += summary_rows(name, results, n_seen[-1])
        raw[name] = results
    header = ["data / kernel", "method", "kept after inc 5 (% of seen)", "test acc (%)",
              "acc - full retrain (points)", "seconds, 5 increments", "search rounds",
              "increments stopped by max_rounds"]
    text = "\n".join([
        f"## alpha-ISVM, Tables 1-2 protocol ({len(seeds)} split(s); means)\n",
        machine_info(), "",
        "Summary after the last increment:\n", markdown_table(header, summary), "",
        *sections,
    ])
    suffix = "_quick" if args.quick else ""
    emit(f"alpha_isvm{suffix}", text)
    (OUT_DIR / f"alpha_isvm{suffix}.json").write_text(json.dumps(raw, indent=1, default=str))


if __name__ == "__main__":
    main()
