"""Loaders for the real data sets used in the experiments.

The data is not shipped with the project: every loader takes the directory that holds the files.

River flow (Karasuyama & Takeuchi, NIPS 2009, sec. 4.2)
    Daily series of the Hipel & McLeod / Astatkie collection (Time Series Data Library). A river
    ``<name>`` is three files in one directory, each one series of one value per day:

    - ``<name>.dat``: mean daily flow,
    - ``<name>p.dat``: daily precipitation,
    - ``<name>t.dat``: mean daily temperature.

    The task predicts from the previous ``lags`` days of the three series whether the flow of
    today rises above yesterday's.

Example
-------
>>> from stream_svm.datasets import RiverFlow, load_river_flow
>>> X, y, names = load_river_flow("../shared/data/fisher-river")  # doctest: +SKIP
>>> X.shape, int((y > 0).sum()), names[0], names[-1]  # doctest: +SKIP
((1454, 21), 563, 'temperature_lag1', 'flow_lag7')
>>> for x, rises in RiverFlow("../shared/data/fisher-river"):  # doctest: +SKIP
...     pass
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from river.datasets import base

__all__ = [
    "RIVER_FLOW_VARIABLES",
    "RiverFlow",
    "available_rivers",
    "load_river_flow",
    "read_daily_series",
    "river_flow_feature_names",
]

#: The three series of a river, in feature order, with the file-name suffix of each.
RIVER_FLOW_VARIABLES: tuple[tuple[str, str], ...] = (
    ("temperature", "t"),
    ("precipitation", "p"),
    ("flow", ""),
)

# A plain decimal number. float() alone would also accept "nan", "inf" and "1_0", none of which
# is a valid daily observation in these files, so they must be reported rather than read.
_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")


def read_daily_series(path: str | Path) -> np.ndarray:
    """Read one daily series file into a 1-d float array, one entry per day in file order.

    The format: a title line, then comment lines starting with ``#``, then one number per line.
    The collection's files carry between one and eight ``#`` lines (not always three), so any
    number of them is accepted. Blank lines are accepted only at the end of the file (several
    files end with some). Everything else is an error, because a skipped or misread line would
    silently shift every later day against the other two series of the river.

    Parameters
    ----------
    path
        The ``.dat`` file.

    Raises
    ------
    FileNotFoundError
        If the file does not exist.
    ValueError
        If the file is malformed: no title line, a ``#`` line or blank line among the values, a
        line that is not one finite decimal number, or no values at all. The message names the
        file and the 1-based line number.

    Example
    -------
    >>> flow = read_daily_series("../shared/data/fisher-river/fisher.dat")  # doctest: +SKIP
    >>> flow.shape, flow[:3]  # doctest: +SKIP
    ((1461,), array([0.19 , 0.167, 0.189]))
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"daily series file not found: {path}")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not a text file ({exc})") from exc

    if not lines or not lines[0].strip():
        raise ValueError(f"{path}, line 1: expected a title line, found an empty line")
    if _NUMBER.fullmatch(lines[0].strip()):
        raise ValueError(
            f"{path}, line 1: expected a title line, found the number {lines[0].strip()!r}"
        )

    values: list[float] = []
    first_blank: int | None = None  # line number of the first blank line seen after the header
    in_header = True
    for number, line in enumerate(lines[1:], start=2):
        text = line.strip()
        if in_header and text.startswith("#"):
            continue
        in_header = False
        if not text:
            if first_blank is None:
                first_blank = number
            continue
        if first_blank is not None:
            raise ValueError(
                f"{path}, line {first_blank}: blank line among the values (the next value is on "
                f"line {number}); a missing day would shift all later days"
            )
        if text.startswith("#"):
            raise ValueError(f"{path}, line {number}: comment line {text!r} among the values")
        if not _NUMBER.fullmatch(text):
            raise ValueError(f"{path}, line {number}: expected one number, found {text!r}")
        value = float(text)
        if not math.isfinite(value):  # e.g. "1e999" overflows to inf
            raise ValueError(f"{path}, line {number}: value {text!r} is not finite")
        values.append(value)

    if not values:
        raise ValueError(f"{path}: no values after the title and '#' lines")
    return np.asarray(values, dtype=float)


def river_flow_feature_names(lags: int = 7) -> list[str]:
    """Names of the river-flow features, in column order.

    All lags of temperature, then of precipitation, then of flow; ``<variable>_lag<k>`` is the
    value ``k`` days before the day being predicted (``lag1`` = the previous day).

    >>> river_flow_feature_names(1)
    ['temperature_lag1', 'precipitation_lag1', 'flow_lag1']
    """
    _check_lags(lags)
    return [f"{name}_lag{k}" for name, _ in RIVER_FLOW_VARIABLES for k in range(1, lags + 1)]


def available_rivers(directory: str | Path) -> list[str]:
    """Names of the rivers in ``directory`` that have all three files (flow, ``p``, ``t``).

    >>> available_rivers("../shared/data/more-rivers")  # doctest: +SKIP
    ['oldman', 'saugeen']
    """
    directory = Path(directory)
    if not directory.is_dir():
        return []
    stems = {p.stem for p in directory.glob("*.dat") if p.is_file()}
    return sorted(
        s for s in stems if all(s + suffix in stems for _, suffix in RIVER_FLOW_VARIABLES)
    )


#: What :func:`load_river_flow` can predict.
RIVER_FLOW_TARGETS = ("rises", "flow")


def load_river_flow(
    directory: str | Path,
    river: str = "fisher",
    lags: int = 7,
    scaled: bool = True,
    target: str = "rises",
) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Build the river-flow task of Karasuyama & Takeuchi (2009) as arrays: the classification
    (does the flow rise?) or, with ``target="flow"``, the regression (the flow itself).

    With days numbered ``0..n-1`` in file order, there is one sample per day ``t = lags..n-1``
    (``n - lags`` samples, in time order; 1454 for the Fisher River with ``lags=7``):

    - ``X[t - lags]`` holds, for each of temperature, precipitation and flow, the values of days
      ``t-1, t-2, ..., t-lags`` (column ``<variable>_lag<k>`` is day ``t-k``). Day ``t`` itself is
      never a feature.
    - ``y[t - lags]`` is ``+1.0`` if ``flow[t] > flow[t-1]`` and ``-1.0`` otherwise; days of
      unchanged flow count as ``-1`` (as in the paper's counts: 563 rises and 891 others for
      the Fisher River, of which 103 unchanged). With ``target="flow"`` it is ``flow[t]``, in
      the file's units and never scaled: the next day's flow from the previous ``lags`` days.

    With ``scaled=True`` every column of ``X`` is min-max scaled to ``[0, 1]`` over all the
    samples, as in the paper; a constant column becomes 0. This is a global transform that looks
    at the whole series, so it is meant for reproducing the experiments, not for a live stream.
    Each column is scaled by its own range, so the same day can get slightly different scaled
    values under different lags.

    Parameters
    ----------
    directory
        Directory holding ``<river>.dat``, ``<river>p.dat`` and ``<river>t.dat``.
    river
        File stem of the river, e.g. ``"fisher"``, ``"oldman"``, ``"saugeen"``.
    lags
        Number of previous days per variable; gives ``3 * lags`` features.
    scaled
        Min-max scale the columns (``True``) or return the raw values (``False``).
    target
        ``"rises"`` (+1 / -1, the paper's classification) or ``"flow"`` (the day's flow).

    Returns
    -------
    X
        Float array of shape ``(n - lags, 3 * lags)``.
    y
        Float array of ``+1.0`` (flow rises) and ``-1.0`` (otherwise), or of the flows with
        ``target="flow"``, shape ``(n - lags,)``.
    feature_names
        The column names of ``X``, see :func:`river_flow_feature_names`.

    Raises
    ------
    FileNotFoundError
        If the directory or one of the three files is missing.
    ValueError
        If a file is malformed, the three series differ in length, there are not more than
        ``lags`` days, or ``target`` is unknown.

    Example
    -------
    >>> X, y, names = load_river_flow("../shared/data/fisher-river")  # doctest: +SKIP
    >>> X.shape, int((y == 1).sum()), names[:2]  # doctest: +SKIP
    ((1454, 21), 563, ['temperature_lag1', 'temperature_lag2'])
    """
    if target not in RIVER_FLOW_TARGETS:
        raise ValueError(f"target must be one of {RIVER_FLOW_TARGETS}, got {target!r}")
    names = river_flow_feature_names(lags)
    series = _read_river(Path(directory), river)
    n_days = len(series[-1])
    if n_days <= lags:
        raise ValueError(
            f"river {river!r} has {n_days} days, need more than lags={lags} to make a sample"
        )

    # Column for lag k, sample i (day t = lags + i) is day t - k: the slice [lags-k, n_days-k).
    columns = [values[lags - k : n_days - k] for values in series for k in range(1, lags + 1)]
    X = np.column_stack(columns)
    flow = series[-1]
    if target == "flow":
        y = np.array(flow[lags:], dtype=float)
    else:
        y = np.where(flow[lags:] > flow[lags - 1 : -1], 1.0, -1.0)

    if scaled:
        X = _min_max_scale(X)
    return X, y, names


class RiverFlow(base.Dataset):
    """The river-flow task as a River stream of ``(x, y)`` in time order.

    ``x`` is a dict from the feature names of :func:`river_flow_feature_names` to floats and
    ``y`` is ``True`` when the flow of the day rises above the previous day's (or, with
    ``target="flow"``, the day's flow: a regression stream). The samples are
    exactly the rows of :func:`load_river_flow` (read once, when the stream is created), so see
    there for which days each lag refers to and for the scaling.

    Parameters
    ----------
    directory
        Directory holding ``<river>.dat``, ``<river>p.dat`` and ``<river>t.dat``.
    river
        File stem of the river, e.g. ``"fisher"``, ``"oldman"``, ``"saugeen"``.
    lags
        Number of previous days per variable; gives ``3 * lags`` features.
    scaled
        Min-max scale every feature to ``[0, 1]`` over the whole series, as in the paper.
    target
        ``"rises"`` (default) or ``"flow"``.

    Examples
    --------
    >>> stream = RiverFlow("../shared/data/fisher-river")  # doctest: +SKIP
    >>> stream.n_samples, stream.n_features  # doctest: +SKIP
    (1454, 21)
    >>> x, y = next(iter(stream))  # doctest: +SKIP
    >>> X, y_array, names = stream.to_arrays()  # doctest: +SKIP
    """

    def __init__(
        self,
        directory: str | Path,
        river: str = "fisher",
        lags: int = 7,
        scaled: bool = True,
        target: str = "rises",
    ) -> None:
        X, y, names = load_river_flow(directory, river=river, lags=lags, scaled=scaled,
                                      target=target)
        if target == "flow":
            super().__init__(task=base.REG, n_features=X.shape[1], n_samples=X.shape[0])
        else:
            super().__init__(
                task=base.BINARY_CLF, n_features=X.shape[1], n_samples=X.shape[0], n_classes=2
            )
        self.target = target
        self.directory = Path(directory)
        self.river = river
        self.lags = lags
        self.scaled = scaled
        self._X = X
        self._y = y
        self._names = names

    @property
    def feature_names(self) -> list[str]:
        """The feature names, in column order."""
        return list(self._names)

    def to_arrays(self) -> tuple[np.ndarray, np.ndarray, list[str]]:
        """``(X, y, feature_names)`` as returned by :func:`load_river_flow` (copies)."""
        return self._X.copy(), self._y.copy(), list(self._names)

    def __iter__(self) -> Iterator[tuple[dict[str, float], bool | float]]:
        regression = self.target == "flow"
        for row, value in zip(self._X.tolist(), self._y.tolist(), strict=True):
            yield dict(zip(self._names, row, strict=True)), value if regression else value > 0


def _check_lags(lags: int) -> None:
    if isinstance(lags, bool) or not isinstance(lags, (int, np.integer)) or lags < 1:
        raise ValueError(f"lags must be a positive integer, got {lags!r}")


def _read_river(directory: Path, river: str) -> list[np.ndarray]:
    """The river's series in the order of RIVER_FLOW_VARIABLES, checked to be of equal length."""
    if not directory.is_dir():
        raise FileNotFoundError(f"river data directory not found: {directory}")
    series = []
    for variable, suffix in RIVER_FLOW_VARIABLES:
        path = directory / f"{river}{suffix}.dat"
        if not path.is_file():
            found = available_rivers(directory)
            raise FileNotFoundError(
                f"{variable} series of river {river!r} not found: {path} "
                f"(complete rivers in that directory: {', '.join(found) or 'none'})"
            )
        series.append(read_daily_series(path))

    lengths = {len(values) for values in series}
    if len(lengths) > 1:
        detail = ", ".join(
            f"{river}{suffix}.dat: {len(values)}"
            for (_, suffix), values in zip(RIVER_FLOW_VARIABLES, series, strict=True)
        )
        raise ValueError(
            f"the series of river {river!r} in {directory} have different lengths ({detail} "
            "values); the days cannot be aligned"
        )
    return series


def _min_max_scale(X: np.ndarray) -> np.ndarray:
    low = X.min(axis=0)
    span = X.max(axis=0) - low
    # A constant column carries no information; map it to 0 instead of dividing by zero.
    safe = np.where(span > 0, span, 1.0)
    return np.where(span > 0, (X - low) / safe, 0.0)
