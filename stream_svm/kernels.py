"""Kernel functions on dense row matrices.

A kernel maps two row matrices ``A`` (n x d) and ``B`` (m x d) to the n x m Gram block.
Built-in kernels are chosen by name (``"linear"``, ``"rbf"``, ``"poly"``); any callable with the
same signature can be passed instead, and must be positive semi-definite for the solution to be
the SVM optimum.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from scipy.spatial.distance import cdist

__all__ = [
    "KERNEL_NAMES",
    "CallableKernel",
    "Kernel",
    "LinearKernel",
    "PolynomialKernel",
    "RBFKernel",
    "make_kernel",
]

KERNEL_NAMES = ("linear", "rbf", "poly")

KernelCallable = Callable[[np.ndarray, np.ndarray], np.ndarray]


class Kernel:
    """A validated kernel: ``kernel(A, B)`` returns the Gram block K(A_i, B_j).

    Built-in kernels are plain classes (not closures) so that models pickle and clone.

    >>> k = make_kernel("rbf", gamma=0.5)
    >>> float(k(np.zeros((1, 2)), np.ones((1, 2)))[0, 0])  # exp(-0.5 * 2)
    0.36787944117144233
    """

    name = "kernel"
    #: Whether K(a, b) depends on features where b is 0 only through their Euclidean norm in a
    #: (true of dot products and distances): such features can be folded into one column of a
    #: query, and features 0 in every stored point dropped. Unknown for a user's callable.
    folds_absent_features = True
    #: Whether K(a, b) is finite for all finite a and b (RBF: exp(-gamma |a - b|^2) lies in
    #: [0, 1]), so that neither learnable input nor computed kernel values need be checked.
    finite_values = False

    def _block(self, A: np.ndarray, B: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def __call__(self, A: np.ndarray, B: np.ndarray) -> np.ndarray:
        block = np.asarray(self._block(A, B), dtype=float)
        if not block.flags.writeable:  # a user's read-only result: the engine adds its ridge
            block = block.copy()
        if block.shape != (A.shape[0], B.shape[0]):
            raise ValueError(
                f"kernel {self.name!r} returned shape {block.shape}, expected "
                f"{(A.shape[0], B.shape[0])} for inputs of {A.shape[0]} and {B.shape[0]} rows"
            )
        return block

    def diagonal(self, A: np.ndarray) -> np.ndarray:
        """K(A_i, A_i) for every row of A (built-in kernels: without forming the block)."""
        return np.array([self(row[None, :], row[None, :])[0, 0] for row in A])

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


class LinearKernel(Kernel):
    name = "linear"

    def _block(self, A: np.ndarray, B: np.ndarray) -> np.ndarray:
        return A @ B.T

    def diagonal(self, A: np.ndarray) -> np.ndarray:
        return np.einsum("ij,ij->i", A, A)


class RBFKernel(Kernel):
    name = "rbf"
    finite_values = True

    def __init__(self, gamma: float) -> None:
        # gamma > 0 keeps every value finite (finite_values): 0 * inf would be nan.
        self.gamma = _check_positive("gamma", gamma)

    def _block(self, A: np.ndarray, B: np.ndarray) -> np.ndarray:
        # cdist subtracts coordinates directly: no cancellation from ||a||^2 + ||b||^2 - 2ab.
        return np.exp(-self.gamma * cdist(A, B, "sqeuclidean"))

    def diagonal(self, A: np.ndarray) -> np.ndarray:
        return np.ones(A.shape[0])


_MAX_DEGREE = 2**31 - 1


class PolynomialKernel(Kernel):
    name = "poly"

    def __init__(self, gamma: float, degree: int, coef0: float) -> None:
        # (The compiled loop takes the power by repeated squaring, in a C int.)
        if (isinstance(degree, bool) or not isinstance(degree, (int, np.integer))
                or not 1 <= degree <= _MAX_DEGREE):
            raise ValueError(f"degree must be an integer from 1 to {_MAX_DEGREE}, got {degree!r}")
        self.gamma, self.degree, self.coef0 = gamma, int(degree), coef0

    def _block(self, A: np.ndarray, B: np.ndarray) -> np.ndarray:
        return (self.gamma * (A @ B.T) + self.coef0) ** self.degree

    def diagonal(self, A: np.ndarray) -> np.ndarray:
        return (self.gamma * np.einsum("ij,ij->i", A, A) + self.coef0) ** self.degree


class CallableKernel(Kernel):
    folds_absent_features = False

    def __init__(self, function: KernelCallable) -> None:
        self.function = function
        self.name = getattr(function, "__name__", type(function).__name__)

    def _block(self, A: np.ndarray, B: np.ndarray) -> np.ndarray:
        try:
            # Read-only views: these may be the model's own stored points, which a function
            # normalizing its arguments in place rewrote without a word.
            return self.function(_read_only(A), _read_only(B))
        except (TypeError, ValueError, IndexError, KeyError, AttributeError) as error:
            if "read-only" in str(error) or "not writable" in str(error):
                raise ValueError(
                    f"kernel {self.name!r} raised {type(error).__name__}: {error}: it is given "
                    "the model's own points, read-only (a kernel that writes into its arguments "
                    "changed the stored points); one that needs writable arrays (ctypes' "
                    "from_buffer, a Cython memoryview without const) must copy them first, "
                    "np.array(A)") from error
            # A function written for two single points (dicts, or 1-D vectors) fails deep in
            # numpy ("shapes (1,2) and (1,2) not aligned"): say what it is given and owes.
            # (Other errors, such as running out of memory, pass as they are.)
            raise ValueError(
                f"kernel {self.name!r} raised {type(error).__name__}: {error} (given A of shape "
                f"{A.shape} and B of shape {B.shape}: a kernel function takes two 2-D arrays "
                "whose rows are points, their features in the model's order, and returns the "
                "len(A) x len(B) array of K(A[i], B[j]))"
            ) from error


def _read_only(array: np.ndarray) -> np.ndarray:
    view = array.view()
    view.flags.writeable = False
    return view


#: What a text given for gamma ("scale", "auto", as scikit-learn takes them) is told.
GAMMA_TEXT_HINT = (
    "a model that learns online keeps one kernel for every point it stores, so gamma is a "
    "number it cannot rescale later, not 'scale' or 'auto': 1 / median ||x - x'||^2 over a "
    "sample of the (scaled) features is a good start, and the models warn with that value "
    "when gamma does not fit the features' scale"
)


def _check_positive(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
        hint = f": {GAMMA_TEXT_HINT}" if name == "gamma" and isinstance(value, str) else ""
        raise TypeError(f"{name} must be a number, got {value!r}{hint}")
    if not np.isfinite(_as_float(value)) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def _as_float(value: int | float | np.number) -> float:
    """A number as a float, one too large for a float (an int of 400 digits) as infinite."""
    try:
        return float(value)
    except OverflowError:
        return np.inf


def make_kernel(
    kernel: str | KernelCallable,
    gamma: float = 1.0,
    degree: int = 3,
    coef0: float = 0.0,
) -> Kernel:
    """Build a kernel from a name and its parameters, or wrap a user callable.

    - ``"linear"``: ``<a, b>``
    - ``"rbf"``: ``exp(-gamma * ||a - b||^2)``
    - ``"poly"``: ``(gamma * <a, b> + coef0) ** degree``
    - a callable ``f(A, B) -> (len(A), len(B)) array``, used as given.

    Unknown names and out-of-range parameters raise ValueError naming them.

    >>> make_kernel("poly", gamma=1.0, degree=2, coef0=1.0)(np.ones((1, 1)), np.ones((1, 1)))
    array([[4.]])
    """
    if callable(kernel):
        return CallableKernel(kernel)
    if not isinstance(kernel, str) or kernel not in KERNEL_NAMES:
        raise ValueError(f"unknown kernel {kernel!r}: use one of {KERNEL_NAMES} or a callable")
    if kernel == "linear":
        return LinearKernel()
    if kernel == "rbf":
        return RBFKernel(gamma)
    g = _check_positive("gamma", gamma)
    if isinstance(coef0, bool) or not isinstance(coef0, (int, float, np.number)):
        raise TypeError(f"coef0 must be a number, got {coef0!r}")
    if not np.isfinite(_as_float(coef0)) or coef0 < 0:
        # A negative offset makes the polynomial kernel indefinite.
        raise ValueError(f"coef0 must be finite and >= 0 for a positive semi-definite kernel, "
                         f"got {coef0!r}")
    return PolynomialKernel(g, degree, float(coef0))
