"""Writes the pickles in this folder; run under an earlier stream-svm (see README.txt)."""

import gzip
import itertools
import pickle
import sys
from pathlib import Path


def main(out: Path) -> None:
    from river import compose, datasets, preprocessing

    import stream_svm

    points = list(itertools.islice(datasets.Bananas(), 80))
    models = {
        "incremental_svc": stream_svm.IncrementalSVC(C=1.0, gamma=0.5),
        "sliding_window_svc": stream_svm.SlidingWindowSVC(window_size=50, C=1.0, gamma=0.5),
        "incremental_svr": stream_svm.IncrementalSVR(C=1.0, gamma=0.5, epsilon=0.1),
        "alpha_isvc": stream_svm.AlphaISVC(batch_size=20, C=1.0, gamma=0.5),
        "pipeline_svc": compose.Pipeline(preprocessing.StandardScaler(),
                                         stream_svm.IncrementalSVC(C=1.0, gamma=0.5)),
        "sliding_window_svr": stream_svm.SlidingWindowSVR(window_size=50, C=1.0, gamma=0.5,
                                                          epsilon=0.1),
        "incremental_lssvc": stream_svm.IncrementalLSSVC(rho=1.0, features="rff",
                                                         n_components=50, gamma=0.5, seed=7),
    }
    for name, model in models.items():
        for i, (x, y) in enumerate(points):
            target = x["1"] - 0.5 * x["2"] if name.endswith("svr") else y
            if name in ("incremental_svc", "incremental_svr", "incremental_lssvc"):
                model.learn_one(x, target, key=i)
            else:
                model.learn_one(x, target)
        (out / f"{name}.pkl.gz").write_bytes(gzip.compress(pickle.dumps(model, protocol=4), 9))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
