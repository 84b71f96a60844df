"""Where float64 runs out: three ill-conditioned cases the README describes, measured.

1. Nearly repeated regression samples at epsilon = 0 (x equal or 1e-5 apart, targets 0.5
   apart): the same samples learned in four orders by IncrementalSVR; how far apart the
   decision values end, without and with a small ridge.
2. Polynomial kernels on standardized heavy-tailed features: updates refused
   (ConvergenceError) at the defaults (coef0 = 0, gamma = 1) and with coef0 = 1,
   gamma = 1 / features.
3. One point far beyond the others' scale under a linear kernel (a unit slip): updates
   refused while it is stored, what a refusal costs, and the model after forgetting it.

Run: .venv/bin/python benchmarks/bench_conditioning.py [--quick]   (about 1 minute)
"""

from __future__ import annotations

import argparse
import math
import random
import time
import warnings

import numpy as np
from river import compose, preprocessing

from stream_svm import ConvergenceError, IncrementalSVC, IncrementalSVR


def near_repeats(sets: int, ridge: float) -> tuple[int, int, float]:
    """(sets learned, sets whose decision values depend on the order by more than 1e-7,
    the largest such spread) over ``sets`` random sets of 6-25 1-D samples."""
    probes = [{"a": v} for v in np.linspace(-2.5, 2.5, 21)]
    learned = dependent = 0
    worst = 0.0
    for seed in range(sets):
        rng = random.Random(seed)
        C, gamma = 10 ** rng.uniform(0, 3), 10 ** rng.uniform(0, 1.5)
        samples: list[tuple[float, float]] = []
        for _ in range(rng.randint(6, 25)):
            if samples and rng.random() < 0.3:  # a near repeat, often with another target
                x0, t0 = rng.choice(samples)
                samples.append((x0 + rng.choice([0.0, 1e-5, 5e-5]) * rng.choice([1, -1]),
                                t0 + rng.choice([0.0, 0.5, -0.5])))
            else:
                x = rng.gauss(0, 1)
                samples.append((x, math.sin(x)))
        values = []
        try:
            for shuffle in range(4):
                order = list(range(len(samples)))
                if shuffle:
                    random.Random(seed * 10 + shuffle).shuffle(order)
                model = IncrementalSVR(C=C, epsilon=0.0, gamma=gamma, ridge=ridge)
                for i in order:
                    model.learn_one({"a": samples[i][0]}, samples[i][1], key=i)
                values.append(np.array([model.predict_one(q) for q in probes]))
        except ConvergenceError:
            continue
        learned += 1
        spread = float(np.max(np.ptp(np.array(values), axis=0)))
        worst = max(worst, spread)
        dependent += spread > 1e-7
    return learned, dependent, worst


def polynomial_refusals(degree: int, coef0: float, gamma: float, n: int) -> int:
    rng = np.random.default_rng(0)
    X = rng.standard_t(1.5, size=(n, 3))
    model = compose.Pipeline(preprocessing.StandardScaler(), IncrementalSVC(
        kernel="poly", degree=degree, coef0=coef0, gamma=gamma))
    refused = 0
    for row in X:
        try:
            model.learn_one({f"f{j}": row[j] for j in range(3)}, bool(row[0] > 0))
        except ConvergenceError:
            refused += 1
    return refused


def far_point(value: float, stored: int, after: int) -> tuple[int, float, float, float]:
    """(updates refused of ``after``, median seconds of an accepted and of a refused one,
    largest |f| difference after forgetting the point from a model that never had it)."""
    rng = random.Random(2)

    def point() -> tuple[dict, bool]:
        a, b = rng.uniform(-2, 2), rng.uniform(-2, 2)
        return {"a": a, "b": b}, a + b > 0

    model, never = IncrementalSVC(kernel="linear"), IncrementalSVC(kernel="linear")
    for key in range(stored):
        x, y = point()
        model.learn_one(x, y, key=key)
        never.learn_one(x, y, key=key)
    try:
        model.learn_one({"a": value, "b": 0.5}, True, key="far")
    except ConvergenceError:
        pass
    accepted, refused = [], []
    for key in range(stored, stored + after):
        x, y = point()
        started = time.perf_counter()
        try:
            model.learn_one(x, y, key=key)
        except ConvergenceError:
            refused.append(time.perf_counter() - started)
            continue
        accepted.append(time.perf_counter() - started)
        never.learn_one(x, y, key=key)
    if "far" in model.stored_keys():
        model.forget_one(key="far")
    probes = [point()[0] for _ in range(50)]
    gap = max(abs(model.decision_function_one(q) - never.decision_function_one(q))
              for q in probes)
    return (len(refused), float(np.median(accepted)),
            float(np.median(refused)) if refused else 0.0, gap)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run")
    args = parser.parse_args()
    warnings.simplefilter("ignore")  # (the far point's own warning is the subject here)
    sets = 60 if args.quick else 600
    print("1. IncrementalSVR at epsilon = 0, nearly repeated samples, 4 orders per set")
    for ridge in (0.0, 1e-8):
        learned, dependent, worst = near_repeats(sets, ridge)
        print(f"   ridge {ridge:g}: {dependent} of {learned} sets order-dependent "
              f"(decision values > 1e-7 apart); largest spread {worst:.2g}")
    n = 200 if args.quick else 500
    print(f"2. Polynomial kernels, {n} standardized Student-t (1.5) samples of 3 features")
    for degree in (2, 3, 5):
        default = polynomial_refusals(degree, 0.0, 1.0, n)
        shifted = polynomial_refusals(degree, 1.0, 1 / 3, n)
        print(f"   degree {degree}: refused {default} at coef0 = 0, gamma = 1; "
              f"{shifted} at coef0 = 1, gamma = 1/3")
    stored = 300 if args.quick else 1000
    print(f"3. Linear IncrementalSVC, {stored} points of 2 features in [-2, 2], then one far "
          "point, then 150 more")
    for value in (1e4, 1e5, 1e16):
        refused, accepted_s, refused_s, gap = far_point(value, stored, 150)
        print(f"   feature {value:g}: {refused} of 150 refused; median update "
              f"{accepted_s * 1e3:.2f} ms accepted, {refused_s:.2f} s refused; after "
              f"forgetting it, |f| within {gap:.1g} of a model that never had it")


if __name__ == "__main__":
    main()
