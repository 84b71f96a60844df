"""stream-svm: exact online kernel SVMs for streams, as River estimators."""

# Not in __all__: `from stream_svm import *` must not replace river.datasets.
from stream_svm import datasets  # noqa: F401 (stream_svm.datasets, as an attribute)
from stream_svm.alpha_isvm import AlphaISVC
from stream_svm.classifiers import (
    AutoKey,
    IncrementalSVC,
    SlidingWindowSVC,
    proba_from_decision,
)
from stream_svm.engine import ConvergenceError, PathEngine, UpdateStats
from stream_svm.lssvm import IncrementalLSSVC, IncrementalLSSVR
from stream_svm.regressors import IncrementalSVR, SlidingWindowSVR

__version__ = "0.1.0"

__all__ = [
    "AlphaISVC",
    "AutoKey",
    "ConvergenceError",
    "IncrementalLSSVC",
    "IncrementalLSSVR",
    "IncrementalSVC",
    "IncrementalSVR",
    "PathEngine",
    "SlidingWindowSVC",
    "SlidingWindowSVR",
    "UpdateStats",
    "proba_from_decision",
]
