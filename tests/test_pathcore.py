"""The compiled pieces of the engine against their definitions."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.linalg import cholesky

from stream_svm import _pathcore
from stream_svm.kernels import make_kernel


@pytest.mark.parametrize("k", [1, 2, 5, 40])
def test_deleting_a_factor_column_gives_the_factor_without_it(k):
    rng = np.random.default_rng(k)
    A = rng.standard_normal((k, k + 3))
    P = A @ A.T + 1e-3 * np.eye(k)
    R = np.ascontiguousarray(cholesky(P, lower=False))
    for j in range(k):
        buffer = np.full((k + 4, k + 6), np.nan)  # a factor with spare capacity
        buffer[:k, :k] = R
        _pathcore.delete_factor_column(buffer, k, j)
        kept = np.delete(np.delete(P, j, axis=0), j, axis=1)
        left = buffer[: k - 1, : k - 1]
        assert np.array_equal(np.triu(left), left)  # still upper triangular
        assert np.abs(left.T @ left - kept).max(initial=0.0) <= 1e-12 * np.abs(P).max()
    with pytest.raises(ValueError, match="not in a"):
        _pathcore.delete_factor_column(np.zeros((3, 3)), 3, 3)


@pytest.mark.parametrize(("name", "code"), [("linear", _pathcore.KERNEL_LINEAR),
                                            ("rbf", _pathcore.KERNEL_RBF),
                                            ("poly", _pathcore.KERNEL_POLY)])
def test_kernel_columns_equal_the_kernels(name, code):
    rng = np.random.default_rng(1)
    X = np.ascontiguousarray(rng.standard_normal((30, 4)))
    positions = np.array([0, 7, 29], dtype=np.int64)
    kernel = make_kernel(name, gamma=0.3, degree=3, coef0=1.5)
    out = np.zeros((30, 3))
    _pathcore.kernel_columns(code, X, 30, positions, 0.3, 3, 1.5, out)
    np.testing.assert_allclose(out, kernel(X, X[positions]), rtol=1e-14, atol=1e-14)
    with pytest.raises(ValueError, match="position 30"):
        _pathcore.kernel_columns(code, X, 30, np.array([30], dtype=np.int64), 0.3, 3, 1.5,
                                 out)
