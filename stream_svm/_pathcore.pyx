# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: initializedcheck=False
"""Compiled pieces of the path-following engine (:mod:`stream_svm.engine`).

BLAS comes from SciPy (``scipy.linalg.cython_blas``), as in scikit-learn's compiled solvers:
no BLAS of our own is linked. Every function works in place on arrays the engine owns and
releases the GIL while it computes.
"""

from libc.math cimport exp, pow
from scipy.linalg.cython_blas cimport drot, drotg

cdef enum:
    LINEAR = 0
    RBF = 1
    POLY = 2

#: Kernel codes of :func:`kernel_columns`.
KERNEL_LINEAR, KERNEL_RBF, KERNEL_POLY = LINEAR, RBF, POLY


cdef void _delete_factor_column(double[:, ::1] R, Py_ssize_t k, Py_ssize_t j) noexcept nogil:
    cdef Py_ssize_t i, c
    cdef int length, stride = 1
    cdef double cos, sin, a, b
    # Drop column j: the columns right of it move one to the left (rows 0..k-1).
    for i in range(k):
        for c in range(j, k - 1):
            R[i, c] = R[i, c + 1]
    # The tail is upper Hessenberg: rotations of rows (i, i + 1) restore the triangle.
    for i in range(j, k - 1):
        a = R[i, i]
        b = R[i + 1, i]
        drotg(&a, &b, &cos, &sin)
        length = <int>(k - 1 - i)
        drot(&length, &R[i, i], &stride, &R[i + 1, i], &stride, &cos, &sin)
        R[i + 1, i] = 0.0


def delete_factor_column(double[:, ::1] R, Py_ssize_t k, Py_ssize_t j) -> None:
    """Remove row and column ``j`` of P from the upper Cholesky factor held in ``R[:k, :k]``
    (C order), in place: afterwards ``R[:k-1, :k-1]`` is the factor of P without them.

    Givens rotations keep R'R equal to P minus row/column j (rotations are orthogonal);
    O(k^2) and no allocation.
    """
    if not (0 <= j < k <= R.shape[0] and k <= R.shape[1]):
        raise ValueError(f"column {j} is not in a {k} x {k} factor of capacity {R.shape}")
    with nogil:
        _delete_factor_column(R, k, j)


def kernel_columns(int kind, double[:, ::1] X, Py_ssize_t n, long[::1] positions,
                   double gamma, int degree, double coef0, double[:, ::1] out) -> None:
    """``out[i, c] = K(X[i], X[positions[c]])`` for i < n: the built-in kernels (``kind``:
    KERNEL_LINEAR, KERNEL_RBF exp(-gamma |a-b|^2), KERNEL_POLY (gamma <a,b> + coef0)^degree),
    computed without the GIL. Squared distances are summed feature by feature, as SciPy's
    ``cdist(..., "sqeuclidean")`` does."""
    cdef Py_ssize_t i, c, f, p, dim = X.shape[1], m = positions.shape[0]
    cdef double acc, diff
    if out.shape[0] < n or out.shape[1] < m:
        raise ValueError("out is too small")
    for c in range(m):
        if not 0 <= positions[c] < n:
            raise ValueError(f"position {positions[c]} is not among the {n} points")
    with nogil:
        for i in range(n):
            for c in range(m):
                p = positions[c]
                acc = 0.0
                if kind == RBF:
                    for f in range(dim):
                        diff = X[i, f] - X[p, f]
                        acc = acc + diff * diff
                    out[i, c] = exp(-gamma * acc)
                else:
                    for f in range(dim):
                        acc = acc + X[i, f] * X[p, f]
                    if kind == POLY:
                        out[i, c] = pow(gamma * acc + coef0, degree)
                    else:
                        out[i, c] = acc
