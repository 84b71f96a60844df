"""stream-svm: exact online kernel SVMs for streams, as River estimators."""

__version__ = "0.1.0"
