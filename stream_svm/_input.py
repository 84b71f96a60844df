"""Validation and vectorization of River-style inputs (feature dicts and binary labels).

Every estimator of the package turns a feature dict into a dense row over a growing list of
feature names. Validation happens before anything is committed, so that bad input leaves the
model exactly as it was.
"""

from __future__ import annotations

import datetime
import decimal
import math
import numbers
import os
import sys
import warnings
from collections.abc import Hashable, Iterable, Mapping
from typing import Any

import numpy as np
import pandas as pd

__all__ = [
    "FeatureSpace", "check_classes", "check_findable_keys", "check_paired", "class_of",
    "classes_of", "label_sign",
    "parse_binary_label", "parse_binary_labels",
]


def check_findable_keys(keys: Iterable[Hashable]) -> None:
    """KeyError for a key not equal to itself (NaN, e.g. an id column with missing values, or
    a tuple holding one): no lookup could find it again, and repeats of it would go unseen.

    >>> check_findable_keys([1, "a", (2, 3)])
    >>> check_findable_keys([1, float("nan")])  # doctest: +IGNORE_EXCEPTION_DETAIL
    Traceback (most recent call last):
    ...
    KeyError: 'key nan is not equal to itself (NaN) ...'

    Also KeyError for a str key holding a NUL character, or an int key beyond 64 bits, which
    a checkpoint would lose, and for a boolean key, which is the same key as 0 or 1.
    """
    always = _ALWAYS_EQUAL_TO_ITSELF
    for key in keys:
        kind = type(key)
        if kind is bool or kind is np.bool_:
            # True == 1 and False == 0, with the same hashes: as keys they are the same point.
            raise KeyError(f"key {key!r} is a boolean, which as a key is the same as "
                           f"{int(key)}: use str or int keys")
        if isinstance(key, np.integer):
            key, kind = int(key), int  # as the checkpoint will keep it
        try:
            hash(key)
        except TypeError:
            raise TypeError(f"key {shown(key)} is not hashable ({kind.__name__}): use a str, "
                            "an int, a float, a timestamp or a tuple of them (what a "
                            "checkpoint keeps)") from None
        if (kind is str or (kind not in always and isinstance(key, str))) and "\x00" in key:
            # Checkpoints keep str keys in numpy text arrays, which drop trailing NULs: the
            # point came back under another key ("k\x00" as "k"), or not at all.
            raise KeyError(f"key {shown(key)} contains a NUL character (U+0000), which a "
                           "checkpoint cannot keep")
        if kind is int and not -(2**63) <= key < 2**63:
            raise KeyError(f"key {shown(key)} does not fit in 64 bits, which a checkpoint "
                           "keeps an int key in")
        if kind in always:
            continue  # (most keys: one set lookup instead of a comparison)
        if kind is tuple and always.issuperset(map(type, key)):
            continue  # a tuple of such items, e.g. (batch, row): one pass in C
        if not _equals_itself(key):
            raise KeyError(
                f"key {shown(key)} is not equal to itself (NaN): no point could be found by it "
                "again; fill or drop the missing ids, or pass keys="
            )


def check_new_name(name: Hashable) -> None:
    # A NaN name is a new feature at every learn (nan != nan), and after a pickle round trip
    # even the stored ones are found no more: the copy answered differently.
    if type(name) not in _ALWAYS_EQUAL_TO_ITSELF and not _equals_itself(name):
        raise TypeError(f"feature name {shown(name)} is not equal to itself (NaN): the model "
                        "could never find its feature again; name the feature (pandas holds "
                        "a column named None as NaN)")


# Exactly these types (not subclasses, whose == may be anything) equal themselves always.
_ALWAYS_EQUAL_TO_ITSELF = frozenset({int, str, bytes, bool})


def _equals_itself(key: object) -> bool:
    # A tuple compares its items by identity first: (nan,) == (nan,) for one nan object, but
    # not for the equal-looking key of a later lookup. Its items are checked one by one.
    if isinstance(key, tuple):
        return all(_equals_itself(item) for item in key)
    try:
        return bool(key == key)
    except (TypeError, ValueError):  # an array's == is elementwise
        return False


def key_list(keys: Any, what: str = "keys") -> list:
    """``keys`` as a list; TypeError for a single str or bytes, which would otherwise be taken
    key by character ("ab" forgetting the points keyed "a" and "b"), and for a key that is not
    hashable (which no model can hold), naming it.

    >>> key_list(("a", 2))
    ['a', 2]
    """
    if isinstance(keys, (str, bytes)):
        raise TypeError(f"{what} must be a collection of keys, not the single key {keys!r}: "
                        f"pass [{keys!r}]")
    try:
        keys = list(keys)
    except TypeError:
        raise TypeError(f"{what} must be a collection of keys, got {type(keys).__name__}"
                        ) from None
    for key in keys:
        try:
            hash(key)
        except TypeError:
            raise TypeError(f"key {shown(key)} in {what} is not hashable "
                            f"({type(key).__name__}): no model holds such a key") from None
    return keys


def check_paired(X: Any, y: Any, what: str = "y", noun: str = "labels", rows: str = "X"
                 ) -> None:
    """ValueError unless ``y`` holds one value per row of ``X``, and unless its index, where
    both are pandas', says it pairs with X's rows by position. Values pair with rows by
    position: a y indexed in another order would teach every row another row's label,
    silently.

    >>> import pandas as pd
    >>> X = pd.DataFrame({"a": [1.0, 2.0]}, index=["p", "q"])
    >>> check_paired(X, pd.Series([True, False], index=["p", "q"]))
    >>> check_paired(X, pd.Series([True, False]))  # numbered 0, 1: paired by position
    >>> check_paired(X, pd.Series([False, True], index=["q", "p"]))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: y's index is not X's ...

    Two indexes with labels of their own must be equal. pandas' numbering 0, 1, ... (a
    RangeIndex from 0 by 1, as a Series built from a list has) pairs by position, unless the
    other index holds the same numbers in another order: a shuffled or sorted frame against
    the column it came from (its rows would learn other rows' labels), or a frame rebuilt
    from an array against a shuffled column (which pairs right): which one is meant cannot be
    told, and either is one call away. Other numberings (``iloc`` slices, reversed or
    strided) are rows' labels, compared as such, except beside labels of another kind (a
    date index against a slice of a numbered y: by position).
    """
    if not isinstance(X, pd.DataFrame):
        # (A dict of columns has one "row" per column name, and None no length at all.)
        raise TypeError(f"{rows} must be a pandas DataFrame, got {type(X).__name__}")
    if isinstance(y, pd.DataFrame):
        # len() and iteration of a frame are its columns: its column labels would be learned.
        raise TypeError(f"{what} must be a Series (one value per row), got a DataFrame with "
                        f"columns {list(y.columns)!r}: pass one column, e.g. frame[name]")
    if isinstance(y, (str, bytes)) or not hasattr(y, "__len__"):
        raise TypeError(f"{what} must be a Series (one value per row of {rows}), got "
                        f"{type(y).__name__} {y!r:.60}")
    if len(y) != len(X):
        raise ValueError(f"{what} has {len(y)} {noun} for {len(X)} rows of {rows}")
    y_index, x_index = getattr(y, "index", None), getattr(X, "index", None)
    if not isinstance(y_index, pd.Index) or not isinstance(x_index, pd.Index):
        return
    problem = _pairing_problem(y_index, x_index)
    if problem == "reordered":
        raise ValueError(
            f"{what}'s index holds the same numbers as {rows}'s in another order: paired by "
            f"position, as learn_many pairs them, a row could learn another row's value. If "
            f"{rows}'s rows are in {what}'s order ({rows} built from an array, say), pass "
            f"{what}.to_numpy(); if {what}'s numbers name {rows}'s rows (a shuffled or sorted "
            f"frame against the column it came from), pass {what}.loc[{rows}.index]"
        )
    if problem is not None:
        raise ValueError(
            f"{what}'s index is not {rows}'s (values pair with rows by position, so these would "
            f"pair wrongly): pass {what}.loc[{rows}.index] to pair them by label, or "
            f"{what}.to_numpy() to pair them by position"
        )


def numbered_rows(index: pd.Index) -> bool:
    """Whether ``index`` is pandas' own numbering of rows, which names no sample: a RangeIndex
    without a name (a frame's default index, or a slice of it such as ``X.iloc[100:200]``).
    A named one is the user's labels: pandas 3 stores a column of consecutive integers made
    the index (``set_index("id")``, ``read_csv(..., index_col="id")``) as a RangeIndex.

    >>> numbered_rows(pd.RangeIndex(100, 200)), numbered_rows(pd.RangeIndex(5, 8, name="id"))
    (True, False)
    """
    return isinstance(index, pd.RangeIndex) and index.name is None


def _fresh_numbering(index: pd.Index) -> bool:
    """pandas' numbering 0, 1, 2, ... (a RangeIndex from 0 by 1): no labels of its own."""
    return isinstance(index, pd.RangeIndex) and index.start == 0 and index.step == 1


def _in_numbering(index: pd.Index, numbering: pd.Index) -> np.ndarray:
    """Which labels of ``index`` are numbers of ``numbering`` (none, for labels that cannot
    be compared with numbers: a MultiIndex's tuples)."""
    if not isinstance(index, pd.MultiIndex):
        try:
            return np.asarray(index.isin(numbering), dtype=bool)
        except (TypeError, ValueError):
            pass
    return np.zeros(len(index), dtype=bool)


def _same_numbers(index: pd.Index, numbering: pd.Index) -> bool:
    """Whether ``index`` holds exactly the numbers of ``numbering`` (as long)."""
    return index.is_unique and bool(_in_numbering(index, numbering).all())


def _pairing_problem(first: pd.Index, second: pd.Index) -> str | None:
    """None when values indexed by ``first`` may pair with rows indexed by ``second`` (as
    long) by position; "reordered" or "other labels" when not: see :func:`check_paired`."""
    if first.equals(second):
        return None
    fresh = [index for index in (first, second) if _fresh_numbering(index)]
    if fresh:
        other = second if fresh[0] is first else first
        return "reordered" if _same_numbers(other, fresh[0]) else None
    numbered = [isinstance(index, pd.RangeIndex) for index in (first, second)]
    if any(numbered) and not all(numbered):
        # A slice of a numbering beside labels of another kind (dates): by position, unless
        # they share labels, which disagree.
        numbering, other = (first, second) if numbered[0] else (second, first)
        return "other labels" if _in_numbering(other, numbering).any() else None
    return "other labels"


def real_to_float(value: Any) -> float:
    """A real number as a float; one too large for a float (an int of thousands of digits)
    as the infinity of its sign, for the callers' checks of finiteness to refuse by name,
    rather than an OverflowError that names nothing.

    >>> real_to_float(3), real_to_float(-10**400)
    (3.0, -inf)
    """
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf  # (copysign would convert it too)
    except ValueError:
        if isinstance(value, decimal.Decimal) and value.is_snan():
            return math.nan  # (a signaling NaN has no float: a NaN, for the checks to name)
        raise


def real_target(y: object) -> float:
    """A regression target as a float: TypeError for anything but a real number (a str, a
    bool), ValueError when it is not finite.

    >>> real_target(3), real_target(2.5), real_target(decimal.Decimal("0.25"))
    (3.0, 2.5, 0.25)
    """
    if isinstance(y, decimal.Decimal):
        # A database's NUMERIC column (as for features); a NaN, signaling or not, is not finite.
        value = math.nan if y.is_nan() else real_to_float(y)
    elif isinstance(y, bool) or not isinstance(y, numbers.Real):
        raise TypeError(f"the target must be a real number, got {shown(y)}")
    else:
        value = real_to_float(y)
    if not math.isfinite(value):
        raise ValueError(f"the target must be finite, got {shown(y)}")
    return value


def shown(value: object) -> str:
    """``repr(value)`` for an error message, cut short (an int of thousands of digits).

    >>> shown(2.5), shown(10**400)
    ('2.5', '10000000000000000000...0000000000 (401 digits)')
    """
    try:
        text = repr(value)
    except ValueError:  # an int beyond Python's limit on digits converted to text
        return f"an int of {value.bit_length()} bits"  # type: ignore[attr-defined]
    if len(text) <= 60:
        return text
    if isinstance(value, int):
        return f"{text[:20]}...{text[-10:]} ({len(text.lstrip('-'))} digits)"
    return f"{text[:50]}... ({len(text)} characters)"


def finite_score(value: float) -> float:
    """A prediction's decision value, or ValueError when it is not finite: finite features
    can still overflow a kernel (a polynomial or linear kernel at 1e300), and no class or
    value follows from inf or NaN."""
    if not math.isfinite(value):
        raise ValueError(
            f"the model's decision value for these features is {value} (not finite): they are "
            "too large for its kernel; nothing was predicted"
        )
    return value


def finite_scores(values: Any, index: Any) -> np.ndarray:
    """:func:`finite_score` for a batch (``index``: the rows' labels, for the message)."""
    values = np.asarray(values, dtype=float)
    bad = np.flatnonzero(~np.isfinite(values))
    if bad.size:
        raise ValueError(
            f"the model's decision value for row {index[bad[0]]!r} is {values[bad[0]]} (not "
            f"finite; {bad.size} such rows): its features are too large for the model's "
            "kernel; nothing was predicted"
        )
    return values


def parse_binary_label(y: object) -> float:
    """Map a binary label to +1.0 or -1.0.

    True and 1 are the positive class; False, 0 and -1 are the negative class. Anything else
    raises ValueError naming the label.

    >>> parse_binary_label(True), parse_binary_label(0), parse_binary_label(-1)
    (1.0, -1.0, -1.0)
    """
    if isinstance(y, (bool, np.bool_)):
        return 1.0 if y else -1.0
    if isinstance(y, numbers.Number) and not isinstance(y, complex):
        value = real_to_float(y)
        if value == 1.0:
            return 1.0
        if value in (0.0, -1.0):
            return -1.0
    raise ValueError(
        f"label {shown(y)} is not binary: use True/1 for the positive class and False/0/-1 for the "
        "negative class, or name the two classes with classes=[negative, positive] (e.g. "
        "classes=['ham', 'spam']); for more than two, wrap the model in River's "
        "multiclass.OneVsRestClassifier"
    )


def parse_binary_labels(ys: Iterable[object]) -> np.ndarray:
    """Vector version of :func:`parse_binary_label`."""
    return np.array([parse_binary_label(y) for y in ys], dtype=float)


def check_classes(classes: object) -> tuple[object, object] | None:
    """The ``classes`` parameter of a binary classifier as a (negative, positive) pair.

    None keeps the boolean labels (True/1 positive, False/0/-1 negative). Otherwise two
    distinct labels of JSON-like types (str, int, float, bool), e.g. ``["ham", "spam"]``: the
    first is the negative class, the second the positive one (positive decision values).

    >>> check_classes(["ham", "spam"])
    ('ham', 'spam')
    >>> check_classes(["spam", "spam"])  # doctest: +IGNORE_EXCEPTION_DETAIL
    Traceback (most recent call last):
    ...
    ValueError: classes must be two distinct labels, got ['spam', 'spam']
    """
    if classes is None:
        return None
    if not isinstance(classes, (str, bytes, list, tuple)) and hasattr(classes, "tolist"):
        # a numpy or pandas array (a column's unique values), its scalars as Python's
        classes = classes.tolist()
    if isinstance(classes, (str, bytes)) or not isinstance(classes, (list, tuple)):
        raise ValueError(
            "classes must be None or a list of two labels [negative, positive], got "
            f"{classes!r}"
        )
    if len(classes) != 2:
        raise ValueError(f"classes must be two labels [negative, positive], got {classes!r}")
    for label in classes:
        if not isinstance(label, (str, numbers.Real, np.bool_)) or isinstance(label, np.ndarray):
            raise ValueError(
                f"classes: class {label!r} must be a string, a number or a boolean, got "
                f"{type(label).__name__}"
            )
        if isinstance(label, numbers.Real) and not math.isfinite(real_to_float(label)):
            raise ValueError(f"classes: class {shown(label)} must be finite")
    negative, positive = classes
    if negative == positive:
        raise ValueError(f"classes must be two distinct labels, got {classes!r}")
    return negative, positive


def label_sign(y: object, classes: tuple[object, object] | None) -> float:
    """+1.0 for the positive class, -1.0 for the negative one; ValueError for anything else.

    >>> label_sign("spam", ("ham", "spam")), label_sign(False, None)
    (1.0, -1.0)
    """
    if classes is None:
        sign = parse_binary_label(y)
        if sign < 0 and y == -1 and not isinstance(y, (bool, np.bool_)):
            _warn_minus_one()
        return sign
    # Equality, so that numpy scalars and 1 == 1.0 match; a string never equals a number.
    # A boolean matches only a boolean class (True == 1 would learn True as the class 1,
    # which the daemon's labels, JSON's true and 1, keep apart).
    boolean = _is_boolean(y)
    try:
        if y == classes[1] and boolean == _is_boolean(classes[1]):
            return 1.0
        if y == classes[0] and boolean == _is_boolean(classes[0]):
            return -1.0
    except (TypeError, ValueError):  # e.g. an array, whose == is elementwise
        pass
    hint = ""
    numeric = (bool, np.bool_, numbers.Number)
    if isinstance(y, numeric) and any(isinstance(label, numeric) and y == label
                                      and boolean != _is_boolean(label) for label in classes):
        hint = ("; a boolean label matches only a boolean class, and a number only a number "
                "(JSON's true is not 1): give the classes as the labels are")
    raise ValueError(
        f"label {shown(y)} is not one of the classes {list(classes)!r} (negative, positive)"
        f"{hint}"
    )


def _is_boolean(value: object) -> bool:
    return isinstance(value, (bool, np.bool_))


_minus_one_warned = False


def _warn_minus_one() -> None:
    # -1 learns as the negative class, but the predictions (False/True) then do not equal the
    # labels: River's metrics would count every negative prediction wrong. Once per process: a
    # -1/+1 stream would otherwise pay for the warning machinery at every negative label.
    global _minus_one_warned
    if _minus_one_warned:
        return
    _minus_one_warned = True
    warnings.warn(
        "label -1 is learned as the negative class, but predictions are False/True, which do "
        "not equal -1 (River's metrics would count every negative prediction as a miss): pass "
        "classes=[-1, 1] to learn and predict -1 and 1",
        UserWarning, stacklevel=caller_level(),
    )


def caller_level() -> int:
    """The stacklevel of a warning that names the first caller outside this package (the
    user's line, not the estimator's)."""
    package = os.path.dirname(os.path.abspath(__file__))
    frame, level = sys._getframe(2), 2  # 1: the warn() call's caller
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package):
        frame, level = frame.f_back, level + 1
    return level


def label_signs(ys: Iterable[object], classes: tuple[object, object] | None) -> np.ndarray:
    """Vector version of :func:`label_sign`."""
    if classes is not None:
        return np.array([label_sign(y, classes) for y in ys], dtype=float)
    ys = list(ys)
    signs = parse_binary_labels(ys)
    if any(y == -1 and not isinstance(y, (bool, np.bool_)) for y in ys):
        _warn_minus_one()  # once per call, not once per label
    return signs


def class_of(positive: bool, classes: tuple[object, object] | None) -> object:
    """The label of a side of the decision: ``classes[positive]``, or the boolean itself."""
    return bool(positive) if classes is None else classes[int(bool(positive))]


def classes_of(positive: np.ndarray, classes: tuple[object, object]) -> np.ndarray:
    """The labels of the sides of many decisions, as :func:`class_of` gives each: an object
    array holding the very labels (``np.where`` would promote [False, "yes"] to the text
    "False", and refuse [0, "spam"]).

    >>> classes_of(np.array([True, False]), (False, "yes")).tolist()
    ['yes', False]
    """
    labels = np.empty(2, dtype=object)
    labels[0], labels[1] = classes
    return labels[np.asarray(positive, dtype=bool).astype(np.intp)]


def _is_pandas_missing(value: object) -> bool:
    """Whether ``value`` is pandas' missing-value marker (``pd.NA``, ``pd.NaT``), which a
    nullable column's rows hold (``stream.iter_pandas``), without importing pandas."""
    kind = type(value)
    return kind.__name__ in ("NAType", "NaTType") and kind.__module__.startswith("pandas")


def _feature_value(name: Hashable, value: object) -> float:
    if type(value) is float:  # the common case, without the abstract-class checks below
        if value - value == 0.0:  # finite (inf - inf and nan - nan are nan)
            return value
        if value != value:
            return 0.0
        raise ValueError(
            f"feature {name!r} is infinite ({value!r}); only finite values are allowed"
        )
    if value is None:
        return 0.0
    if isinstance(value, (bool, np.bool_)):
        return float(value)
    if isinstance(value, decimal.Decimal):
        # (What a database's NUMERIC columns come as, e.g. from pd.read_sql: a number, though
        # not a numbers.Real. A signaling NaN has no float.)
        value = float("nan") if value.is_snan() else float(value)
    if type(value) is np.ndarray and value.shape == () and value.dtype.kind in "biuf":
        value = value.item()  # a 0-d array holds one number (what some numpy reductions give)
    if isinstance(value, (np.timedelta64, datetime.timedelta)):
        # (numpy counts a timedelta64 among its integers, so it passed for a number.)
        raise TypeError(
            f"feature {name!r} has the non-numeric value {shown(value)} "
            f"({type(value).__name__}); encode it as a number first (e.g. a duration in "
            "seconds: value / np.timedelta64(1, 's'), or value.total_seconds())")
    if isinstance(value, (np.datetime64, datetime.date, datetime.time)) and not (
            _is_pandas_missing(value)):  # (pd.NaT is a datetime, and missing)
        # (A one-hot encoder, the advice for categories, would make each distinct time a
        # feature of its own, seen once: thousands of features that carry nothing.)
        raise TypeError(
            f"feature {name!r} has the non-numeric value {shown(value)} "
            f"({type(value).__name__}): a point in time is no feature as it stands; derive "
            "numbers from it (the hour of the day, the day of the week, seconds since an "
            "event of the sample's) or leave it out (river.compose.Discard)")
    if not isinstance(value, numbers.Real):
        if _is_pandas_missing(value):  # pd.NA, pd.NaT: missing, as learn_many reads them
            return 0.0
        if isinstance(value, (list, tuple)) or (isinstance(value, np.ndarray) and value.ndim):
            raise TypeError(
                f"feature {name!r} has the value {shown(value)} ({type(value).__name__}), a "
                "sequence under one name, but a feature is one number: give each element a "
                f"name of its own (e.g. {{'{name}_0': v[0], '{name}_1': v[1], ...}})")
        raise TypeError(
            f"feature {name!r} has the non-numeric value {shown(value)} ({type(value).__name__}); "
            "encode it as a number first (e.g. river.preprocessing.OneHotEncoder)"
        )
    number = real_to_float(value)
    if math.isnan(number):
        return 0.0
    if math.isinf(number):
        raise ValueError(
            f"feature {name!r} is infinite or too large for a float ({shown(value)}); only "
            "finite values are allowed"
        )
    return number


class FeatureSpace:
    """An ordered, growing list of feature names and the dense vectors over it.

    Missing features, None and NaN read as 0; a feature first seen later reads 0 in every row
    vectorized before it. Order of the dict never matters.

    >>> space = FeatureSpace()
    >>> row, new = space.vectorize({"b": 2.0, "a": 1.0})
    >>> space.add(new)
    >>> space.names, row.tolist()
    (['b', 'a'], [2.0, 1.0])
    >>> space.vectorize({"a": 5, "c": float("nan")})[0].tolist()
    [0.0, 5.0]
    """

    def __init__(self, names: Iterable[Hashable] = ()) -> None:
        self.names: list[Hashable] = []
        self.index: dict[Hashable, int] = {}
        self._texts: dict[str, Hashable] | None = None  # warn_misnamed's, until names change
        self.add(names)

    def __len__(self) -> int:
        return len(self.names)

    def __getstate__(self) -> dict[str, Any]:
        # Without warn_misnamed's cache: a prediction changes nothing of a model's pickle.
        return {**self.__dict__, "_texts": None}

    def add(self, names: Iterable[Hashable]) -> None:
        """Append feature names (already-known names are ignored)."""
        for name in names:
            if name not in self.index:
                self.index[name] = len(self.names)
                self.names.append(name)
                self._texts = None

    def keep(self, columns: Iterable[int]) -> None:
        """Keep only the names at the given (increasing) positions, in that order."""
        self.names = [self.names[i] for i in columns]
        self.index = {name: i for i, name in enumerate(self.names)}
        self._texts = None

    def restore(self, names: list[Hashable], index: dict[Hashable, int]) -> None:
        """Put back names and their positions saved before a change (an undone compaction)."""
        self.names, self.index, self._texts = names, index, None

    def truncate(self, count: int) -> None:
        """Forget the names added after the first ``count`` (undoes :meth:`add`)."""
        for name in self.names[count:]:
            del self.index[name]
        del self.names[count:]
        self._texts = None

    def warn_misnamed(self, unknown: Iterable[Hashable]) -> None:
        """Warn of the features a prediction ignores (``unknown``: names the model never
        learned) that are written as one it learned (the text 0 beside the int 0, as a frame
        built from an array names its columns): predictions ignore names they do not know,
        so every such feature read as missing, and the predictions came out about equal,
        silently. (Shown once per message, where the prediction was asked for.)"""
        unknown = list(unknown)
        if not unknown or not self.names:
            return
        if getattr(self, "_texts", None) is None:  # (a space pickled before it had them)
            self._texts = {str(name): name for name in self.names}
        texts = self._texts
        for name in unknown:
            learned = texts.get(str(name), name)
            if learned is name or learned == name:
                continue
            warnings.warn(
                f"feature {name!r} ({type(name).__name__}) is not one of those the model "
                f"learned, but {learned!r} ({type(learned).__name__}) is: the prediction took "
                f"{name!r} for a feature no learned point has, not for {learned!r}. Name the "
                "features as they were learned",
                UserWarning, stacklevel=caller_level(),
            )
            return

    def vectorize(self, x: Mapping[Hashable, object]) -> tuple[np.ndarray, list[Hashable]]:
        """Validate ``x`` and return its row over known + new features, and the new names.

        Nothing is committed: call :meth:`add` with the new names once the whole operation is
        known to succeed. New features with value 0 (or NaN/None) are not reported as new.
        """
        if not isinstance(x, Mapping):
            raise TypeError(f"x must be a dict of feature name -> number, got {type(x).__name__}")
        known: list[tuple[int, float]] = []
        new_names: list[Hashable] = []
        new_values: list[float] = []
        for name, raw in x.items():
            value = _feature_value(name, raw)
            column = self.index.get(name)
            if column is not None:
                known.append((column, value))
            elif value != 0.0:
                check_new_name(name)
                new_names.append(name)
                new_values.append(value)
        row = np.zeros(len(self.names) + len(new_names))
        for column, value in known:
            row[column] = value
        row[len(self.names) :] = new_values
        return row, new_names

    def vectorize_frame(self, frame: Any) -> tuple[np.ndarray, list[Hashable]] | None:
        """:meth:`vectorize_many` of a DataFrame's rows straight from its numeric columns (the
        same matrix and new names, in the same order), or None when the frame needs the
        row-by-row path: non-numeric or boolean columns, repeated names, or infinite values
        (whose error that path names)."""
        names = list(frame.columns)
        if len(set(names)) != len(names):
            return None
        raw = frame.to_numpy()
        if raw.dtype.kind in "fiu":  # numeric numpy columns only (a bool one makes it object)
            values = raw.astype(float)
        elif all(dtype.kind in "fiu" for dtype in frame.dtypes):  # pandas' nullable numbers
            values = frame.to_numpy(dtype=float, copy=True)
        else:
            return None
        if np.isinf(values).any():
            return None
        values[np.isnan(values)] = 0.0
        known = [j for j, name in enumerate(names) if name in self.index]
        unknown = [j for j, name in enumerate(names) if name not in self.index]
        # New names in first-seen order: by the first row where they are nonzero, then by
        # their place in the row (a dict's order), as vectorize_many meets them.
        first_seen = []
        for j in unknown:
            nonzero = np.flatnonzero(values[:, j])
            if nonzero.size:
                first_seen.append((int(nonzero[0]), j))
        first_seen.sort()
        for _, j in first_seen:
            check_new_name(names[j])
        width = len(self.names) + len(first_seen)
        matrix = np.zeros((values.shape[0], width))
        matrix[:, [self.index[names[j]] for j in known]] = values[:, known]
        for offset, (_, j) in enumerate(first_seen):
            matrix[:, len(self.names) + offset] = values[:, j]
        return matrix, [names[j] for _, j in first_seen]

    def vectorize_many(
        self, rows: Iterable[Mapping[Hashable, object]]
    ) -> tuple[np.ndarray, list[Hashable]]:
        """Vectorize several dicts at once; returns (matrix, new names in first-seen order)."""
        rows = list(rows)
        staged = FeatureSpace(self.names)
        vectors = []
        for x in rows:
            row, new = staged.vectorize(x)
            staged.add(new)
            vectors.append(row)
        width = len(staged.names)
        matrix = np.zeros((len(vectors), width))
        for i, row in enumerate(vectors):
            matrix[i, : row.size] = row
        return matrix, staged.names[len(self.names) :]
