"""What every model on the path-following engine shares: point keys and their checkpoint
arrays, the input's vectorization within bounded feature names, the engine's counters and the
decision function. Classifiers and regressors add their labels or targets."""

from __future__ import annotations

import contextlib
import copy
import datetime
import decimal
import fractions
import functools
import inspect
import json
import math
import numbers
import threading
import warnings
import weakref
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from scipy.spatial.distance import pdist

from stream_svm._input import (
    FeatureSpace,
    caller_level,
    check_findable_keys,
    check_new_name,
    check_paired,
    key_list,
    numbered_rows,
    real_to_float,
)
from stream_svm.engine import PathEngine, UpdateStats, check_self_similarity
from stream_svm.kernels import (
    CallableKernel,
    Kernel,
    LinearKernel,
    PolynomialKernel,
    RBFKernel,
    make_kernel,
)


@dataclass(frozen=True, order=True)
class AutoKey:
    """The key of a point learned without one (equal only to itself, never to a user key)."""

    number: int


def unknown_key(what: str, key: Hashable, stored: Iterable[Hashable],
                reason: str = "") -> KeyError:
    """KeyError "no ``what`` has key ``key``"; when the model holds points learned without a
    key, it says where their automatic keys come from: a row number of a DataFrame with
    pandas' default index is not one (the usual surprise of a first ``forget_many``).

    >>> print(unknown_key("stored point", 100, [AutoKey(1)]).args[0])  # doctest: +ELLIPSIS
    no stored point has key 100; the points ... automatic keys, such as AutoKey(number=1): ...
    """
    message = f"no {what} has key {key!r}{reason}"
    if not isinstance(key, AutoKey):
        automatic = next((k for k in stored if isinstance(k, AutoKey)), None)
        if automatic is not None:
            message += (
                "; the points learned without a key (learn_one without key=, or learn_many "
                "rows of a DataFrame with pandas' default index) have automatic keys, such as "
                f"{automatic!r}: stored_keys() lists them; to forget by keys of your own, "
                "learn with them (key=, keys=, or a DataFrame index of your own)")
    return KeyError(message)


def plain_key(key: Hashable) -> Hashable:
    """A numpy scalar key as the Python value it holds (equal to it, with the same hash): one
    compared with a tuple in a list gives an array instead of False, which breaks ``in``.

    >>> import numpy as np
    >>> plain_key(np.int64(7)), plain_key(("p", 1))
    (7, ('p', 1))
    """
    if isinstance(key, np.datetime64):
        # (one to the nanosecond holds an int: as one it would be another key, learned under a
        # number; kept as it is, the checks refuse it as a key no checkpoint keeps)
        value = key.item()
        return value if isinstance(value, datetime.datetime) else key
    return key.item() if isinstance(key, np.generic) else key


#: The kinds of keys a checkpoint keeps (``key_kind``).
KEY_AUTO, KEY_INT, KEY_STR, KEY_FLOAT, KEY_TIMESTAMP, KEY_TUPLE = range(6)


def checkpoint_key_kind(key: Hashable) -> int:
    """How a checkpoint keeps a point's key: KEY_AUTO (an AutoKey), KEY_INT, KEY_STR,
    KEY_FLOAT (a float index's labels), KEY_TIMESTAMP (a DatetimeIndex's, or a datetime) or
    KEY_TUPLE (a MultiIndex's labels: a tuple of such keys, checked as it is written);
    TypeError for any other key. (A timestamp's time zone is checked as it is written:
    :func:`_timestamp_parts`.)"""
    if isinstance(key, AutoKey):
        return KEY_AUTO
    if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
        return KEY_INT
    if isinstance(key, str):
        return KEY_STR
    if isinstance(key, (float, np.floating)):
        return KEY_FLOAT
    if isinstance(key, (datetime.datetime, np.datetime64)):
        return KEY_TIMESTAMP
    if type(key) is tuple:  # (not a named tuple: it would come back as a plain one)
        return KEY_TUPLE
    raise TypeError(f"key {key!r} (a {type(key).__name__}) cannot be checkpointed: a "
                    "checkpoint keeps str, int, float and timestamp keys, and tuples of them. "
                    "Learn with keys of those (without keys=, learn_many takes them from X's "
                    "index: pass e.g. keys=[str(key) for key in X.index])")


def _timestamp_parts(key: Any) -> tuple[int, str]:
    """A timestamp key as nanoseconds since the epoch (UTC) and its time zone's name ("" for
    none), checked to read back as an equal key."""
    try:
        stamp = pd.Timestamp(key)
        zone = "" if stamp.tz is None else str(stamp.tz)
        nanoseconds = int(stamp.value)
        back = _timestamp_key(nanoseconds, zone)
        same = back == key and hash(back) == hash(key)
    # (pandas' errors derive from these; a time zone without a name zoneinfo knows, as
    # dateutil's tzfile('/usr/share/zoneinfo/...'), raises its KeyError)
    except (TypeError, ValueError, OverflowError, KeyError):
        same = False
    if not same and isinstance(key, np.datetime64):
        if not pd.Timestamp.min <= key <= pd.Timestamp.max:
            raise TypeError(f"key {key!r} cannot be checkpointed: a checkpoint keeps times "
                            f"from {pd.Timestamp.min} to {pd.Timestamp.max} (nanoseconds in "
                            "64 bits); use str keys")
        # (numpy's datetime64 below the microsecond hashes unlike the equal pandas Timestamp,
        # so the key read back could not find the point again)
        raise TypeError(f"key {key!r} cannot be checkpointed: a numpy datetime64 finer than "
                        "microseconds does not read back as the same key; pass "
                        "pd.Timestamp(key) instead, for this point and when forgetting it")
    if not same:
        raise TypeError(f"key {key!r} cannot be checkpointed: as a time in nanoseconds and "
                        "the name of its time zone it does not read back as the same key; use "
                        "a time zone by name (e.g. 'UTC', 'Europe/Paris'), or str keys")
    return nanoseconds, zone


def _timestamp_key(nanoseconds: int, zone: str) -> pd.Timestamp:
    """The timestamp key :func:`_timestamp_parts` took apart (a datetime comes back as the
    pandas Timestamp equal to it, with the same hash)."""
    return pd.Timestamp(nanoseconds, tz=zone or None)


def _float_key(bits: int) -> float:
    """The float key whose bits a checkpoint keeps (as an int64); ValueError for a NaN, which
    no lookup could find."""
    key = float(np.int64(bits).view(np.float64))
    if key != key:
        raise ValueError("a checkpoint's float key is NaN")
    return key


def key_to_json(key: Hashable) -> Any:
    """A user key (not an AutoKey) as checkpoint metadata keeps it: an int or a str as it is,
    a float or a timestamp as a tagged object (JSON has no infinity, and no time), a tuple as
    the list of its elements' (TypeError naming the key if an element is none of these).

    >>> key_to_json(("gauge-3", 2.5, 7))
    ['gauge-3', {'float_bits': 4612811918334230528}, 7]
    >>> key_from_json(key_to_json(("gauge-3", 2.5, 7)))
    ('gauge-3', 2.5, 7)
    """
    kind = checkpoint_key_kind(key)
    if kind == KEY_INT:
        return int(key)  # type: ignore[call-overload]
    if kind == KEY_FLOAT:
        return {"float_bits": int(np.float64(key).view(np.int64))}  # (every bit, inf too)
    if kind == KEY_TIMESTAMP:
        nanoseconds, zone = _timestamp_parts(key)
        return {"timestamp_ns": nanoseconds, "zone": zone}
    if kind == KEY_TUPLE:
        try:
            elements = [key_to_json(element) for element in key]  # type: ignore[attr-defined]
        except TypeError as exc:
            raise TypeError(f"key {key!r} cannot be checkpointed: {exc}") from None
        try:
            back = key_from_json(elements)
            same = back == key and hash(back) == hash(key)
        except ValueError:  # (a NaN, which no lookup could find)
            same = False
        if not same:
            raise TypeError(f"key {key!r} cannot be checkpointed: it does not read back as "
                            "the same key")
        return elements
    if kind == KEY_AUTO:
        raise TypeError(f"{key!r} is a key of the model's own, not one a user gave")
    return key


def key_from_json(value: Any) -> Hashable:
    """The key :func:`key_to_json` wrote; ValueError for anything else."""
    if isinstance(value, list):
        return tuple(key_from_json(element) for element in value)
    if isinstance(value, dict):
        if set(value) == {"float_bits"} and _is_int64(value["float_bits"]):
            with contextlib.suppress(ValueError):
                return _float_key(value["float_bits"])
        elif (set(value) == {"timestamp_ns", "zone"} and _is_int64(value["timestamp_ns"])
              and isinstance(value["zone"], str)):
            with contextlib.suppress(TypeError, ValueError, OverflowError):
                return _timestamp_key(value["timestamp_ns"], value["zone"])
        raise ValueError(f"{value!r} is not a key a checkpoint writes")
    if isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    raise ValueError(f"{value!r} is not a key a checkpoint writes")


def _is_int64(value: Any) -> bool:
    return (isinstance(value, int) and not isinstance(value, bool)
            and -(2**63) <= value < 2**63)


def texts_to_arrays(texts: Sequence[str], name: str) -> dict[str, np.ndarray]:
    """Strings as two checkpoint arrays: ``{name}_utf8``, their UTF-8 bytes one after the
    other, and ``{name}_ends``, where each ends. A fixed-width text array gives every string
    the width of the longest: one key or name of 300,000 characters among 60,000 asked for
    67 GiB, and the checkpoint failed at every attempt.

    >>> arrays = texts_to_arrays(["a", "", "é"], "names")
    >>> arrays["names_utf8"].tolist(), arrays["names_ends"].tolist()
    ([97, 195, 169], [1, 1, 3])
    >>> texts_from_arrays(arrays, "names"), texts_from_arrays(texts_to_arrays([], "n"), "n")
    (['a', '', 'é'], [])
    """
    # surrogatepass: a str may hold a lone surrogate, which strict UTF-8 cannot write.
    encoded = [text.encode("utf-8", "surrogatepass") for text in texts]
    return {
        f"{name}_utf8": np.frombuffer(b"".join(encoded), dtype=np.uint8).copy(),
        f"{name}_ends": np.cumsum([len(data) for data in encoded], dtype=np.int64),
    }


def texts_from_arrays(arrays: Mapping[str, Any], name: str) -> list[str]:
    """The strings :func:`texts_to_arrays` wrote (or a fixed-width text array ``name``, as
    older checkpoints hold them); ValueError when the arrays do not fit together."""
    if f"{name}_utf8" not in arrays:
        check_checkpoint_members(arrays, (name,))
        texts = np.asarray(arrays[name])
        if texts.ndim != 1:
            raise ValueError(f"the checkpoint's {name} is not one text per entry")
        return [str(text) for text in texts.tolist()]
    check_checkpoint_members(arrays, (f"{name}_ends",))
    data = np.asarray(arrays[f"{name}_utf8"])
    ends = np.asarray(arrays[f"{name}_ends"])
    if data.dtype != np.uint8 or data.ndim != 1 or ends.ndim != 1 or ends.dtype.kind not in "iu":
        raise ValueError(f"the checkpoint's {name} arrays have the wrong types or shapes")
    ends = ends.astype(np.int64)
    cut = (ends[0] >= 0 and np.all(np.diff(ends) >= 0) and ends[-1] == data.size
           if ends.size else data.size == 0)
    if not cut:
        raise ValueError(f"the checkpoint's {name}_ends do not cut its {name}_utf8 bytes")
    raw = data.tobytes()
    starts = [0, *ends[:-1].tolist()] if ends.size else []
    try:
        return [raw[start:end].decode("utf-8", "surrogatepass")
                for start, end in zip(starts, ends.tolist(), strict=True)]
    except UnicodeDecodeError:
        raise ValueError(f"the checkpoint's {name}_utf8 is not UTF-8") from None


def keys_to_arrays(keys: Iterable[Hashable]) -> dict[str, np.ndarray]:
    """Point keys as four checkpoint arrays (no object dtype): ``key_kind`` (KEY_AUTO,
    KEY_INT, KEY_STR, KEY_FLOAT, KEY_TIMESTAMP, KEY_TUPLE), ``key_int`` (the number of an
    automatic key, an int key, a float key's bits, a timestamp's nanoseconds since the epoch),
    and texts (a str key, a timestamp's time zone, a tuple's elements in JSON as
    :func:`key_to_json` writes them, else empty) in ``key_str_utf8`` / ``key_str_ends``;
    TypeError for any other key type."""
    kinds, ints, texts = [], [], []
    for key in keys:
        kind = checkpoint_key_kind(key)
        kinds.append(kind)
        text = ""
        if kind == KEY_AUTO:
            number = key.number  # type: ignore[attr-defined]
        elif kind == KEY_INT:
            number = int(key)  # type: ignore[call-overload]
        elif kind == KEY_FLOAT:
            number = int(np.float64(key).view(np.int64))
        elif kind == KEY_TIMESTAMP:
            number, text = _timestamp_parts(key)
        elif kind == KEY_TUPLE:
            number, text = 0, json.dumps(key_to_json(key), allow_nan=False)
        else:
            number, text = 0, key
        ints.append(number)
        texts.append(text)
    return {
        "key_kind": np.array(kinds, dtype=np.int8),
        "key_int": np.array(ints, dtype=np.int64),
        **texts_to_arrays(texts, "key_str"),
    }


def keys_from_arrays(arrays: Mapping[str, np.ndarray]) -> list[Hashable]:
    """The keys that :func:`keys_to_arrays` wrote (or a checkpoint's ``key_str`` text array,
    as older checkpoints hold them); ValueError when they are missing or do not fit
    together."""
    check_checkpoint_members(arrays, ("key_kind", "key_int"))
    kinds, numbers_ = np.asarray(arrays["key_kind"]), np.asarray(arrays["key_int"])
    if (kinds.ndim != 1 or numbers_.shape != kinds.shape or kinds.dtype.kind not in "iu"
            or numbers_.dtype.kind not in "iu"):
        raise ValueError("the checkpoint's key_kind and key_int are not one integer per key")
    if not np.all((kinds >= KEY_AUTO) & (kinds <= KEY_TUPLE)):
        raise ValueError("the checkpoint's key_kind holds a kind other than 0 (automatic), "
                         "1 (int), 2 (str), 3 (float), 4 (timestamp) and 5 (tuple)")
    if np.any(numbers_[kinds == KEY_AUTO] < 1):
        raise ValueError("the checkpoint holds an automatic key numbered below 1")
    texts = texts_from_arrays(arrays, "key_str")
    if len(texts) != kinds.size:
        raise ValueError(f"the checkpoint holds {len(texts)} key texts for {kinds.size} keys")
    keys: list[Hashable] = []
    for kind, number, text in zip(kinds.tolist(), numbers_.tolist(), texts, strict=True):
        if kind == KEY_AUTO:
            keys.append(AutoKey(int(number)))
        elif kind == KEY_INT:
            keys.append(int(number))
        elif kind == KEY_STR:
            keys.append(text)
        elif kind == KEY_FLOAT:
            keys.append(_float_key(number))
        elif kind == KEY_TUPLE:
            try:
                key = key_from_json(json.loads(text))
            except ValueError:  # (json's own errors derive from it)
                key = None
            if not isinstance(key, tuple):
                raise ValueError(f"the checkpoint's tuple key {text!r} is not one a "
                                 "checkpoint writes")
            keys.append(key)
        else:
            try:
                keys.append(_timestamp_key(number, text))
            except (TypeError, ValueError, OverflowError):
                raise ValueError(f"the checkpoint's timestamp key {number} has a time zone "
                                 f"{text!r} pandas does not know") from None
    return keys


def stored_rows_frame(X: np.ndarray, rows: np.ndarray, keys: list[Hashable],
                      names: list[Hashable]) -> pd.DataFrame:
    """Stored points' features as a DataFrame indexed by key, one column per feature name. A
    name the model knows only from a buffered point (a window's next slide) has no column in
    the stored features yet: its values there are 0, as for any absent feature."""
    values = np.zeros((rows.size, len(names)))
    width = min(len(names), X.shape[1])
    values[:, :width] = X[rows][:, :width]
    return pd.DataFrame(values, index=pd.Index(keys, dtype=object), columns=list(names))


def forget_without_key_error(x: object, needs: str = "a key, or both x and y") -> ValueError:
    """The error of a forget_one given neither a key nor both x and y; one that was given the
    key in x's place (``forget_one("k1")``) is told to name it."""
    if x is not None and not isinstance(x, Mapping):
        return ValueError(f"forget_one got {x!r} as x, the features: to forget by key, name it: "
                          f"forget_one(key={x!r})")
    return ValueError(f"forget_one needs {needs}")


def refuse_key_with_value(method: str, keys: object, x: object, y: object) -> None:
    """ValueError when a forget names its points both by key and by value: the two may name
    different points, and forgetting one of them while the other stays learned would leave
    a point the caller asked to erase in the model."""
    if keys is not None and (x is not None or y is not None):
        by_key, by_value = ("keys", "X and y") if method == "forget_many" else ("a key", "x and y")
        raise ValueError(f"{method} takes {by_key}, or {by_value}, not both; nothing was "
                         "forgotten")


def check_checkpoint_members(arrays: Mapping[str, Any], names: Iterable[str]) -> None:
    """ValueError naming the first of ``names`` that a checkpoint's arrays lack."""
    for name in names:
        if name not in arrays:
            raise ValueError(f"the checkpoint lacks its {name!r} array")


#: JSON types of checkpoint metadata fields, as :func:`check_checkpoint_meta` checks them.
JSON_COUNT, JSON_TEXT, JSON_LIST, JSON_TABLE, JSON_FLAG = "count", "text", "list", "table", "flag"


def check_checkpoint_meta(meta: object, fields: Mapping[str, str],
                          where: str = "checkpoint's metadata") -> None:
    """ValueError naming the first of ``fields`` (name -> JSON_COUNT, JSON_TEXT, JSON_LIST,
    JSON_TABLE or JSON_FLAG) that a checkpoint's metadata lacks or holds as something else:
    a count is an int >= 0, a flag a bool. A field read with a default would otherwise turn
    a damaged checkpoint into a model that silently lost part of its state."""
    if not isinstance(meta, Mapping):
        raise ValueError(f"the {where} is a {type(meta).__name__}, not a table")
    for name, kind in fields.items():
        if name not in meta:
            raise ValueError(f"the {where} lacks {name!r}")
        value = meta[name]
        valid = {
            JSON_COUNT: isinstance(value, int) and not isinstance(value, bool) and value >= 0,
            JSON_TEXT: isinstance(value, str),
            JSON_LIST: isinstance(value, list),
            JSON_TABLE: isinstance(value, Mapping),
            JSON_FLAG: isinstance(value, bool),
        }[kind]
        if not valid:
            raise ValueError(f"{name!r} in the {where} is {value!r}, not a "
                             f"{'count >= 0' if kind == JSON_COUNT else kind}")


#: The metadata every engine model's checkpoint holds (``extra`` is its subclass's part).
ENGINE_META = {"class": JSON_TEXT, "params": JSON_TABLE, "features": JSON_LIST,
               "auto_keys": JSON_COUNT, "breakpoints_total": JSON_COUNT,
               "updates_total": JSON_COUNT}


#: Counts a checkpoint keeps beside ENGINE_META under "counters" (checkpoints written before
#: they were kept lack them, and restore with them at 0).
COUNTERS_META = {"retries_total": JSON_COUNT, "relearns_total": JSON_COUNT,
                 "refactorizations_total": JSON_COUNT, "far_points_total": JSON_COUNT}


def checkpoint_counters(model: Any) -> dict[str, int | None]:
    """The engine model's counters and the kernel scale check's schedule, for its
    checkpoint's metadata (a restored model then counts on, and checks the scale when the
    original would have)."""
    engine = model._engine
    return {"retries_total": engine.retries_total, "relearns_total": engine.relearns_total,
            "refactorizations_total": engine.refactorizations_total,
            "far_points_total": model.far_points_total,
            "next_scale_check": model.__dict__.get("_next_scale_check")}


def restore_counters(model: Any, meta: Mapping[str, Any]) -> None:
    """Set what :func:`checkpoint_counters` wrote, once checked (ValueError naming it)."""
    counters = meta.get("counters")
    if counters is None:
        return
    check_checkpoint_meta(counters, COUNTERS_META, where="checkpoint's counters")
    scheduled = counters.get("next_scale_check")
    if scheduled is not None:
        check_checkpoint_meta(counters, {"next_scale_check": JSON_COUNT},
                              where="checkpoint's counters")
        model._next_scale_check = scheduled
    engine = model._engine
    engine.retries_total = counters["retries_total"]
    engine.relearns_total = counters["relearns_total"]
    engine.refactorizations_total = counters["refactorizations_total"]
    model._far_points = counters["far_points_total"]


def checkpoint_names(names: Iterable[Hashable]) -> list[Any]:
    """Feature names as a checkpoint writes them (:func:`key_to_json`: a str or an int as it
    is, numpy's as Python's, which they equal; a float, a timestamp or a tuple of such names
    tagged); TypeError for any other name (:func:`check_feature_names`)."""
    check_feature_names(names)
    return [key_to_json(plain_key(name)) for name in names]


def check_keys(keys: Iterable[Hashable]) -> None:
    """:func:`check_findable_keys`, and TypeError for a key a checkpoint cannot keep (not a
    str, an int, a float, a timestamp or a tuple of those). Checked as the keys are learned:
    a key a checkpoint refuses was learned, and every checkpoint of the model failed from
    then on, until its point was forgotten.

    >>> check_keys(["a", 7, ("gauge", 2.5)])
    >>> check_keys([b"a"])  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    TypeError: key b'a' (a bytes) cannot be checkpointed: ...
    """
    keys = keys if isinstance(keys, list) else list(keys)
    check_findable_keys(keys)
    for key in keys:
        if type(key) in _PLAIN_KEYS or isinstance(key, AutoKey):
            continue  # (most keys: checked above, kept as they are)
        key_to_json(key)


# Keys a checkpoint keeps as they are (a float by its bits), once check_findable_keys passed.
_PLAIN_KEYS = frozenset({int, str, float})


def check_feature_names(names: Iterable[Hashable]) -> None:
    """TypeError unless every feature name is one a checkpoint keeps: a str, an int, a float,
    a timestamp, or a tuple of those (a pandas MultiIndex's column labels). Checked as the names
    are learned: a name a checkpoint refuses was learned, and every checkpoint of the model
    failed from then on, until the points using it were forgotten."""
    for name in names:
        check_new_name(name)  # (NaN first: "nan (a float)" read as if floats were refused)
        try:
            back = key_from_json(key_to_json(plain_key(name)))
            # (Read back equal, with the same hash: numpy's nanosecond datetime64 holds an int
            # and would come back as one, another name, its column never found again.)
            same = back == name and hash(back) == hash(name)
        except (TypeError, ValueError):
            same = False
        if not same:
            raise TypeError(f"feature name {name!r} (a {type(name).__name__}) cannot be kept "
                            "in a checkpoint: use str, int, float or timestamp names, or tuples "
                            "of them")


def restored_names(values: Iterable[Any]) -> list[Hashable]:
    """The feature names :func:`checkpoint_names` wrote; ValueError for anything else."""
    names = []
    for value in values:
        try:
            names.append(key_from_json(value))
        except ValueError:
            raise ValueError(f"the checkpoint's feature name {value!r} is not one a checkpoint "
                             "writes") from None
    return names


_NOT_SET = object()


def refused_unchanged(method: Callable) -> Callable:
    """A learning method whose refusal (any exception) also undoes the drop of unused feature
    names it made to make room (see ``_EngineModel._admitted``), and the kernel scale check's
    schedule it moved on (``_check_kernel_scale``: a refused update is no update)."""
    @functools.wraps(method)
    def learning(self: Any, *args: Any, **kwargs: Any) -> Any:
        self._compaction_undo = None
        scheduled = self.__dict__.get("_next_scale_check", _NOT_SET)
        try:
            result = method(self, *args, **kwargs)
        except BaseException:
            self._undo_compaction()
            if scheduled is _NOT_SET:
                self.__dict__.pop("_next_scale_check", None)
            else:
                self._next_scale_check = scheduled
            raise
        self._compaction_undo = None
        return result
    return learning


def check_restored_names(names: list[Hashable], dim: int) -> None:
    """ValueError unless a checkpoint's feature names (as :func:`restored_names` gives them)
    are unique and cover its stored features' ``dim`` columns."""
    if len(set(names)) != len(names):
        raise ValueError("the checkpoint's feature names repeat: each names one column")
    if dim > len(names):
        raise ValueError(f"the checkpoint's points have {dim} feature columns but it names "
                         f"{len(names)} features")


def check_restored_auto_keys(auto_keys: object, keys: Iterable[Hashable]) -> int:
    """The count of automatic keys given, once checked against the automatic keys held: a
    count below one of them would hand that key out again at the next keyless learn."""
    if (not isinstance(auto_keys, numbers.Integral) or isinstance(auto_keys, bool)
            or not 0 <= auto_keys < 2**62):  # (the next keys are written as int64)
        raise ValueError(f"the checkpoint's auto_keys {auto_keys!r} is not a count")
    auto_keys = int(auto_keys)
    held = max((key.number for key in keys if isinstance(key, AutoKey)), default=0)
    if auto_keys < held:
        raise ValueError(f"the checkpoint's auto_keys {auto_keys} is below its automatic key "
                         f"{held}: the next keyless learn would take that key again")
    return auto_keys


def _check_feature_limit(name: str, value: object) -> None:
    if value is not None and (
        isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1
    ):
        raise ValueError(f"{name} must be None or an integer >= 1, got {value!r}")


#: The largest max_breakpoints.
MAX_BREAKPOINTS = 2**62

#: Feature names may grow to twice those in use (plus this) before unused ones are dropped.
_COMPACTION_SLACK = 64

#: The kernel's scale is checked once this many points are stored, on up to SCALE_SAMPLE of
#: them (about a millisecond)...
SCALE_CHECK_POINTS = 50
SCALE_SAMPLE = 200
#: ...and again every this many updates, on SCALE_SAMPLE points spread over the stored ones.
SCALE_CHECK_EVERY = 1000
#: K(x, x) of an incoming point beyond this many times the stored points' largest (linear and
#: polynomial kernels) is warned of, once OUTLIER_MIN_STORED points are stored: a feature of
#: 1e4 among features of about 1 (K about 1e7 times theirs) left a linear IncrementalSVC
#: learning as before; one of 1e5 (1e9 times) had 4 to 56 of the next 150 updates refused.
OUTLIER_DIAGONAL_RATIO = 1e8
OUTLIER_MIN_STORED = 10
#: What the models' ``far_points`` parameter takes.
FAR_POINTS = ("warn", "refuse")
#: (model type, what was said) of the kernel-scale warnings given in this process.
_SCALE_WARNED: set[tuple[str, str]] = set()
#: gamma times the median squared distance between stored points beyond which an RBF kernel
#: is reported too narrow (a typical kernel value below exp(-10) = 4.5e-5: nearly every point
#: a support vector of its own) or too wide (nearly constant: above exp(-1e-4)). (The first
#: points of a smooth series are close together: the Fisher river's first 50 have a median
#: squared distance a quarter of the whole series'.)
NARROW_KERNEL = 10.0
WIDE_KERNEL = 1e-4


def kernel_scale_warning(kernel: Kernel, X: np.ndarray) -> str | None:
    """What is wrong with an RBF kernel's ``gamma`` for the stored points ``X`` (None: nothing,
    or not an RBF kernel). gamma = 1 (the default) on 10 standardized features put 4,001 of
    5,000 points on the margin: 77 % accuracy in 137 s, against 88 % in 1.2 s at gamma = 0.01.

    >>> import numpy as np
    >>> from stream_svm.kernels import make_kernel
    >>> X = np.random.default_rng(0).normal(size=(100, 10))
    >>> print(kernel_scale_warning(make_kernel("rbf", gamma=1.0), X))  # doctest: +ELLIPSIS
    RBF gamma=1 is large for these features: ... the median heuristic gives gamma = 0.05...
    >>> kernel_scale_warning(make_kernel("rbf", gamma=0.05), X) is None
    True
    """
    if not isinstance(kernel, RBFKernel) or len(X) < 2:
        return None
    squared = pdist(X, "sqeuclidean")
    squared = squared[squared > 0]  # (repeated points say nothing of the scale)
    if squared.size == 0:
        return None
    return gamma_scale_message(
        kernel.gamma, float(np.median(squared)),
        f"the median squared distance between {len(X)} points (spread over those learned "
        "so far)", "median",
        "nearly every point becomes a support vector of its own (slow, and predictions away "
        "from the points fall back to the bias)")


def gamma_scale_message(gamma: float, squared_distance: float, measured: str, heuristic: str,
                        narrow_effect: str) -> str | None:
    """What is wrong with an RBF ``gamma`` for points a typical ``squared_distance`` apart (as
    ``measured``: the text of the measurement; ``heuristic``: "median" or "mean"), and what a
    kernel too narrow does (``narrow_effect``); None when gamma fits (gamma times the
    distance between WIDE_KERNEL and NARROW_KERNEL) or the points are all one."""
    if not squared_distance > 0:
        return None
    width = gamma * squared_distance
    if WIDE_KERNEL <= width <= NARROW_KERNEL:
        return None
    where = f"{measured} is {squared_distance:.3g}, so a typical kernel value is exp(-{width:.3g})"
    if width > NARROW_KERNEL:
        what = f"large for these features: {where} = {math.exp(-width):.1e}, and {narrow_effect}"
    else:
        what = (f"small for these features: {where} = 1 - {-math.expm1(-width):.1e}; the "
                "kernel is nearly constant and the model nearly linear with tiny weights")
    return (f"RBF gamma={gamma:g} is {what}; the {heuristic} heuristic gives gamma = "
            f"{1 / squared_distance:.3g}, a place to start. Standardize the features if they "
            "are not (River's preprocessing.StandardScaler; the daemon's [scaler]), and see "
            "'Choosing C and gamma' in the README")


#: The warnings each live model was given, said or not (see warnings_of), the latest of each
#: kind: kept beside the models, not in them, so that a warning changes nothing of a model's
#: state.
_GIVEN: dict[int, dict[str, str]] = {}
#: Kinds of warning kept per model, at most (the oldest go first).
MAX_KINDS_KEPT = 20


# (Re-entrant: a model freed by a collection while the lock is held forgets its warnings
# through the same lock, in the same thread.)
_GIVEN_LOCK = threading.RLock()


def note_warning(model: object, kind: str, message: str) -> None:
    """Keep ``message`` as the latest warning of its ``kind`` given ``model`` (for
    :func:`warnings_of`), whether or not the process says it."""
    with _GIVEN_LOCK:
        given = _GIVEN.get(id(model))
        if given is None:
            weakref.finalize(model, _forget_warnings, id(model))  # (before: may raise)
            given = _GIVEN[id(model)] = {}
        given.pop(kind, None)
        given[kind] = message
        while len(given) > MAX_KINDS_KEPT:
            del given[next(iter(given))]


def _forget_warnings(model_id: int) -> None:
    with _GIVEN_LOCK:
        _GIVEN.pop(model_id, None)


def warnings_of(model: object) -> list[str]:
    """The latest warning of each kind the library gave ``model`` (its kernel's or targets'
    scale, an ill-conditioned LS-SVM, samples left out of a buffer...), including those the
    process had said before for another model: what explains its poor answers, for a report
    of its own (``stream-svm evaluate``)."""
    with _GIVEN_LOCK:
        return list(_GIVEN.get(id(model), {}).values())


def warn_kernel_scale(model: object, message: str | None) -> None:
    """Warn with ``message`` (:func:`kernel_scale_warning`; None: nothing to say), once per
    process, model type, gamma and direction: models restored from a state topic one key
    after another would each say it again. Kept for :func:`warnings_of` either way."""
    if message is None:
        return
    note_warning(model, message.split(":")[0], message)
    said = (type(model).__name__, message.split(":")[0])
    if said not in _SCALE_WARNED:
        _SCALE_WARNED.add(said)
        warnings.warn(message, UserWarning, stacklevel=caller_level())


def _check_C(C: object) -> float:
    if (isinstance(C, bool) or not isinstance(C, numbers.Real)
            or not math.isfinite(real_to_float(C))):
        raise ValueError(f"C must be a finite number > 0, got {C!r}")
    if C <= 0:
        raise ValueError(f"C must be > 0, got {C!r}")
    if not C_RANGE[0] <= C <= C_RANGE[1]:
        # C = 1e-320 (a subnormal, of a few bits) or 1e308 were taken, and learning failed
        # within a few points with a message that blamed gamma and the ridge.
        raise ValueError(f"C must be from {C_RANGE[0]:g} to {C_RANGE[1]:g}, got {C!r}: the "
                         "coefficients (0 to C) and their products with the kernel need "
                         "float64's range")
    return float(C)


#: The C a model takes: coefficients and their sums stay within float64's normal range.
C_RANGE = (1e-150, 1e300)


def _check_far_points(value: object) -> None:
    if not isinstance(value, str) or value not in FAR_POINTS:
        raise ValueError(f"far_points must be one of {', '.join(map(repr, FAR_POINTS))}, "
                         f"got {value!r}")


_PARAMETERS: dict[type, frozenset[str]] = {}


def _parameters_of(cls: type) -> frozenset[str]:
    """The names of the constructor's parameters of ``cls`` (cached per class)."""
    names = _PARAMETERS.get(cls)
    if names is None:
        names = frozenset(name for name in inspect.signature(cls.__init__).parameters
                          if name != "self")
        _PARAMETERS[cls] = names
    return names


def warn_of_unused_parameters(model: Any, unused: Iterable[str], what: str, hint: str) -> None:
    """Warn (UserWarning, at the user's line) of the parameters among ``unused`` given other
    values than their defaults: ``what`` (the model's kernel or feature map) does not use them,
    and a user who set them most likely meant another one (``hint`` says which). A warning,
    not an error, as scikit-learn ignores them: a grid over kernels and gammas still runs.

    >>> import warnings
    >>> from stream_svm import IncrementalSVC
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     _ = IncrementalSVC(kernel="linear", gamma=0.5)
    >>> print(caught[0].message)  # doctest: +ELLIPSIS
    IncrementalSVC: gamma=0.5 does not apply to kernel='linear' and is ignored (...)
    """
    # (A subclass's constructor may leave a parameter out, fixing it: nothing given there.)
    defaults = inspect.signature(type(model).__init__).parameters
    given = [f"{name}={getattr(model, name)!r}" for name in unused
             if name in defaults and hasattr(model, name)
             and not _same_value(getattr(model, name), defaults[name].default)]
    if given:
        verb = "does not apply" if len(given) == 1 else "do not apply"
        warnings.warn(f"{type(model).__name__}: {', '.join(given)} {verb} to {what} and "
                      f"{'is' if len(given) == 1 else 'are'} ignored ({hint})", UserWarning,
                      stacklevel=caller_level())


def checkpoint_params(model: Any) -> tuple[dict[str, Any], dict[str, str]]:
    """The constructor's parameters a checkpoint stores, and those it cannot: callables (a
    user's kernel), by name, with what they were (module and qualified name, for messages),
    which ``from_checkpoint`` must be given back."""
    params: dict[str, Any] = {}
    callables: dict[str, str] = {}
    for name, value in model._get_params().items():
        if callable(value):
            module = getattr(value, "__module__", None) or "?"
            callables[name] = f"{module}.{getattr(value, '__qualname__', type(value).__name__)}"
        else:
            params[name] = _plain(value)
    return params, callables


def _plain(value: Any) -> Any:
    """A parameter as JSON keeps it: numpy scalars (gamma=np.float32(0.5), or the classes
    of list(np.unique(y))) as the Python numbers, bools or strs they hold, also inside a
    list or tuple, a Fraction or a Decimal as a float, and a numpy or pandas array
    (classes=np.unique(y)) as a list."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (fractions.Fraction, decimal.Decimal)):
        # Taken as numbers by the checks, and the same model as their floats, but no JSON.
        return float(value)
    if not isinstance(value, (str, bytes, list, tuple)) and hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value


#: Parameters that checkpoints of the first versions do not hold: those take their defaults
#: (what the models were then).
_ADDED_PARAMETERS = frozenset({"max_features", "max_new_features", "classes", "far_points"})


def restored_params(cls: type, meta: Mapping[str, Any], given: Mapping[str, Any]
                    ) -> dict[str, Any]:
    """The constructor's arguments for a checkpoint of ``cls``: the parameters it stores, and
    ``given``, the callables it could not store, passed back. ValueError when one is missing
    (a checkpoint made with a user's kernel is not restored with the default one) or when one
    given was stored (or is not a callable); TypeError for a name ``cls`` does not take."""
    params = dict(meta["params"])
    callables = dict(meta.get("callables", {}))
    if "callables" not in meta and "kernel" in _parameters_of(cls) and "kernel" not in params:
        callables["kernel"] = "not named in checkpoints of earlier versions"
    unknown = sorted(set(given) - _parameters_of(cls))
    if unknown:
        raise TypeError(f"{cls.__name__} takes no parameter {unknown[0]!r}")
    for name, value in given.items():
        if name in params:
            raise ValueError(
                f"{name} is stored in the checkpoint ({params[name]!r}): only a callable "
                f"the checkpoint could not hold is passed back to {cls.__name__}.from_checkpoint"
            )
        if name not in callables:
            raise ValueError(
                f"the model of this checkpoint had no callable {name}: only a callable the "
                f"checkpoint could not hold is passed back to {cls.__name__}.from_checkpoint"
            )
        if not callable(value):
            raise ValueError(f"{name} must be the callable the model was made with, not "
                             f"{type(value).__name__}")
    absent = sorted(_parameters_of(cls) - set(params) - set(callables) - _ADDED_PARAMETERS)
    if absent:
        # Every checkpoint has stored these: one without them would come back with a default
        # (a window of 1000 instead of its own), and answer as another model.
        raise ValueError(f"the checkpoint's params lack {absent[0]!r}: a damaged or edited "
                         f"{cls.__name__} checkpoint")
    missing = [name for name in callables if name not in given]
    if missing:
        name = missing[0]
        raise ValueError(
            f"this {cls.__name__} checkpoint was made with a user-callable {name} "
            f"({callables[name]}), which a checkpoint cannot hold: pass it back, "
            f"{cls.__name__}.from_checkpoint(arrays, meta, {name}=...). Nothing was restored."
        )
    params.update(given)
    return params


class FixedParameters:
    """A model whose constructor's parameters are fixed once it is built (a mixin): what it
    learns was set up from them, so assigning one afterwards would change what the model
    shows (and what ``clone()`` copies) but not what it does. AttributeError instead, pointing
    to the constructor and ``clone``. A model is built once ``_built_by`` is among its
    attributes (the constructor sets it last). The bounds on feature names are read at every
    learn: they stay settable, and River's ``mutate`` changes them."""

    _built_by = "_engine"

    @property
    def _mutable_attributes(self) -> set[str]:
        # (far_points: the models that take it, not the LS-SVMs)
        return {"max_features", "max_new_features"} | (
            {"far_points"} & _parameters_of(type(self)))

    def __setattr__(self, name: str, value: Any) -> None:
        if (name[:1] != "_" and self._built_by in self.__dict__
                and name in _parameters_of(type(self)) and name not in self._mutable_attributes):
            cls = type(self).__name__
            raise AttributeError(
                f"{cls}.{name} is fixed when the model is constructed (it was set up with "
                f"{name}={getattr(self, name)!r}): construct {cls}({name}=...), or use "
                f"model.clone({{{name!r}: ...}}) for a new, untrained model"
            )
        if name in ("max_features", "max_new_features") and self._built_by in self.__dict__:
            _check_feature_limit(name, value)  # as the constructor checks it
        if name == "far_points" and self._built_by in self.__dict__:
            _check_far_points(value)
        object.__setattr__(self, name, value)

    def clone(self, new_params: dict[str, Any] | None = None,
              include_attributes: bool = False) -> Any:
        """River's ``clone``: a new, untrained model with the same parameters (or
        ``new_params``); with ``include_attributes=True``, a copy of what this one learned,
        which cannot take other fixed parameters (ValueError): what it learned was set up
        with these, and the copy would show the new ones while doing the old ones.

        >>> from stream_svm import IncrementalSVC
        >>> model = IncrementalSVC(C=0.5)
        >>> model.clone({"C": 2.0}).C
        2.0
        """
        if include_attributes and new_params:
            current = self._get_params()
            changed = sorted(str(name) for name, value in new_params.items()
                             if name not in self._mutable_attributes
                             and not _same_value(current.get(name, _MISSING), value))
            if changed:
                cls = type(self).__name__
                raise ValueError(
                    f"clone(include_attributes=True) copies what this {cls} learned, which was "
                    f"set up with its parameters: {', '.join(changed)} cannot change with it. "
                    "Use clone(new_params) for a new, untrained model with them.")
        return super().clone(new_params, include_attributes)  # type: ignore[misc]


_MISSING = object()


def _same_value(current: Any, new: Any) -> bool:
    """Whether a parameter's new value is its current one (arrays and callables included)."""
    if current is new:
        return True
    try:
        return bool(np.all(current == new))
    except Exception:  # values that cannot be compared are different
        return False


class _EngineModel(FixedParameters):
    """The engine, the feature space and the keys of an engine-backed model (a mixin under a
    River base class); subclasses call :meth:`_init_common` from their constructor."""

    #: (What a model pickled before the parameter existed does: its constructor's default.)
    far_points = "warn"

    def _init_common(self) -> None:
        """Check the shared parameters and build the engine, the feature space and keys."""
        _check_C(self.C)
        if (isinstance(self.ridge, bool) or not isinstance(self.ridge, numbers.Real)
                or self.ridge < 0 or not math.isfinite(real_to_float(self.ridge))):
            raise ValueError(f"ridge must be a finite number >= 0, got {self.ridge!r}")
        if self.max_breakpoints is not None and (
            isinstance(self.max_breakpoints, bool)
            or not isinstance(self.max_breakpoints, numbers.Integral)
            or not 1 <= self.max_breakpoints <= MAX_BREAKPOINTS
        ):
            # (The compiled path counts them in a C integer: 2**63 broke every update.)
            raise ValueError(f"max_breakpoints must be None or an integer in [1, 2**62], "
                             f"got {self.max_breakpoints!r}")
        _check_feature_limit("max_features", self.max_features)
        _check_feature_limit("max_new_features", self.max_new_features)
        _check_far_points(self.far_points)
        kernel = make_kernel(self.kernel, gamma=self.gamma, degree=self.degree, coef0=self.coef0)
        # (A callable kernel may not hash: scikit-learn's kernels and dataclasses do not.)
        unused = ({"linear": ("gamma", "degree", "coef0"), "rbf": ("degree", "coef0")}.get(
            self.kernel, ()) if isinstance(self.kernel, str) else ("gamma", "degree", "coef0"))
        warn_of_unused_parameters(
            self, unused, f"kernel={self.kernel!r}" if isinstance(self.kernel, str)
            else "a kernel function", "gamma shapes the 'rbf' and 'poly' kernels, degree and "
            "coef0 the 'poly' kernel")
        self._engine = PathEngine(kernel, self.C, ridge=self.ridge,
                                  max_breakpoints=self.max_breakpoints)
        self._features = FeatureSpace()
        self._auto_keys = 0
        self._compacted_at = 0  # feature names after the latest drop of unused ones

    # ---------------------------------------------------------------- counters
    @property
    def last_update(self) -> UpdateStats:
        """Statistics of the latest engine update (breakpoints, migrations, seconds)."""
        return self._engine.last_update

    @property
    def breakpoints_total(self) -> int:
        return self._engine.breakpoints_total

    @property
    def updates_total(self) -> int:
        return self._engine.updates_total

    @property
    def retries_total(self) -> int:
        """Updates that round-off derailed and that were redone one point at a time (a count
        that grows tells that the kernel matrix is near singular: standardize the features,
        or add a ridge)."""
        return self._engine.retries_total

    @property
    def far_points_total(self) -> int:
        """Points given to learn (refused ones too) whose K(x, x) was more than
        OUTLIER_DIAGONAL_RATIO (1e8) times the largest of the points stored then (linear and
        polynomial kernels): warned of once per process and model type, each counted here
        (the daemon's ``stream_svm_far_points_total``). While such a point is stored, updates
        may be refused: forget it, or standardize the features."""
        return getattr(self, "_far_points", 0)

    @property
    def relearns_total(self) -> int:
        """Updates completed only by learning their points afresh (see ``PathEngine.update``)."""
        return self._engine.relearns_total

    @property
    def n_margin(self) -> int:
        return self._engine.n_margin

    @property
    def n_error(self) -> int:
        return self._engine.n_error

    @property
    def n_reserve(self) -> int:
        return self._engine.n_reserve

    @property
    def n_stored(self) -> int:
        return self._engine.n

    @property
    def intercept(self) -> float:
        """The bias b of f(x) = sum_i dual_coef_i K(x_i, x) + b."""
        return self._engine.b

    #: while set, reserve discards (``reserve_epsilon``) wait for the end of _discards_held
    _holding_discards = False

    def _discard_reserve(self) -> None:
        """Discard the points ``reserve_epsilon`` says to (none for a model without it)."""

    @contextlib.contextmanager
    def _discards_held(self) -> Iterator[None]:
        """Updates in the block discard no reserve point; the discard runs once after them. A
        relabel's forget must not discard a point its learn brings back to the margin: a
        relabel to the same label moved decision values by 20 and more."""
        if self._holding_discards:
            yield
            return
        try:
            self._holding_discards = True
            yield
        finally:
            self.__dict__.pop("_holding_discards", None)
        self._discard_reserve()

    @contextlib.contextmanager
    def _all_or_nothing(self, deep: bool = True) -> Iterator[None]:
        """Run several updates as one: on any exception the model returns to its state before
        them (the engine from its snapshot, everything else from a deep copy), then re-raises.
        With ``deep`` False the model's own containers are copied one level only: enough when
        the updates change nothing but the engine and such containers' items (a window's
        points, an SVR's targets), and far cheaper for a window slid point by point."""
        engine = self._engine
        snapshot = engine._snapshot()
        counters = engine.counters()
        # The user's kernel is kept, not copied: it may hold what cannot be copied (a lock, a
        # connection), and the model must keep the very object it was given.
        kept = {id(value): value for value in (getattr(self, "kernel", None), engine.kernel)}
        rest = {k: v for k, v in self.__dict__.items() if k != "_engine"}
        if deep:
            rest = copy.deepcopy(rest, kept)
        else:
            rest = {k: copy.copy(v) if isinstance(v, (dict, list, set)) else v
                    for k, v in rest.items()}
        try:
            yield
        except BaseException:
            engine._restore(snapshot)
            engine.set_counters(counters)
            self.__dict__.update(rest)
            raise

    # ---------------------------------------------------------------- input plumbing
    def _row(self, x: Mapping) -> tuple[np.ndarray, list[Hashable]]:
        return self._features.vectorize(x)

    def _frame(self, X: pd.DataFrame) -> tuple[np.ndarray, list[Hashable]]:
        if not isinstance(X, pd.DataFrame):
            raise TypeError(f"X must be a pandas DataFrame, got {type(X).__name__}")
        if not X.columns.is_unique:
            repeated = X.columns[X.columns.duplicated()].unique().tolist()
            raise ValueError(f"X has repeated column names {repeated!r}: one feature's values "
                             "would silently replace the other's")
        fast = self._features.vectorize_frame(X)
        if fast is not None:
            return fast
        return self._features.vectorize_many(X.to_dict(orient="records"))

    def _new_key(self) -> AutoKey:
        self._auto_keys += 1
        return AutoKey(self._auto_keys)

    def _keys_for(self, X: pd.DataFrame, keys: Iterable[Hashable] | None) -> list[Hashable]:
        if keys is not None:
            keys = key_list(keys)
            if len(keys) != len(X):
                raise ValueError(f"{len(keys)} keys for {len(X)} rows")
            check_keys([plain_key(key) for key in keys])
            return keys
        if numbered_rows(X.index):
            # pandas' own numbering carries no identity: such rows get automatic keys.
            return [AutoKey(self._auto_keys + i + 1) for i in range(len(X))]
        index_keys = [plain_key(key) for key in X.index]
        check_keys(index_keys)
        problem = None
        if len(set(index_keys)) != len(index_keys):
            seen: set = set()
            repeated = next(key for key in index_keys if key in seen or seen.add(key))
            problem = f"key {repeated!r} repeats in X's index"
        elif (held := self._first_held(index_keys)) is not None:
            problem = f"key {held!r} of X's index is already in the model"
        if problem is not None:
            # (A filtered or concatenated frame keeps the index it came with: the second batch
            # of an ordinary loop would otherwise fail with no hint of where its keys came from.)
            raise KeyError(
                f"{problem}: without keys=, X's index (unless pandas' default numbering) names "
                "the rows, and names must be unique; pass keys=, or X.reset_index(drop=True) "
                "for automatic keys"
            )
        return index_keys

    def _update_keys(self, X: pd.DataFrame, keys: Iterable[Hashable] | None,
                     forget_keys: list[Hashable]) -> list[Hashable]:
        """:meth:`_keys_for` the rows an ``update_many`` adds; a key it also forgets is named
        as such (the advice to pass keys= could not help there: one path cannot remove a key
        and add it again)."""
        try:
            add_keys = self._keys_for(X, keys)
        except KeyError:
            index_keys = (key_list(keys) if keys is not None
                          else [] if numbered_rows(X.index)
                          else [plain_key(key) for key in X.index])
            both = [key for key in index_keys if key in set(forget_keys)]
            if both:
                raise ValueError(self._learned_and_forgotten(both)) from None
            raise
        both = [key for key in add_keys if key in set(forget_keys)]
        if both:
            raise ValueError(self._learned_and_forgotten(both))
        return add_keys

    @staticmethod
    def _learned_and_forgotten(keys: list[Hashable]) -> str:
        shown = ", ".join(repr(key) for key in keys[:3]) + (", ..." if len(keys) > 3 else "")
        return (f"update_many would forget and learn again the key(s) {shown} in one path, "
                "which holds each key once: give them new labels with relabel_one, or "
                "forget_many then learn_many; nothing was changed")

    def _first_held(self, keys: list[Hashable]) -> Hashable | None:
        """The first of ``keys``, in their order, that names a point the model holds."""
        if self._engine.first_stored(keys) is None:
            return None
        return next(key for key in keys if key in self)

    def _keys_to_forget(self, keys: Iterable[Hashable] | None, X: pd.DataFrame | None,
                        y: pd.Series | None, noun: str) -> list[Hashable]:
        """forget_many's keys: those given, or else for each row of X with its value in y the
        oldest equal sample not taken by an earlier row (KeyError when there is none)."""
        if isinstance(keys, (pd.DataFrame, pd.Series)):
            raise TypeError("forget_many's first argument is keys; to forget by value pass X= "
                            "and y= (forget_many(X=X, y=y))")
        refuse_key_with_value("forget_many", keys, X, y)
        if keys is not None:
            return key_list(keys)
        if X is None or y is None:
            raise ValueError("forget_many needs keys, or both X and y")
        check_paired(X, y, noun=noun)
        taken: set = set()
        found: list[Hashable] = []
        for (_, row), value in zip(X.iterrows(), y, strict=True):
            key = self._find_by_value(row.to_dict(), value, taken)
            taken.add(key)
            found.append(key)
        return found

    def _held_keys(self) -> list[Hashable]:
        """Keys of every sample the model holds (a window's buffered ones too)."""
        return self._engine.keys

    def _engine_took(self, added: list[Hashable], removed: list[Hashable],
                     next_sequence: int) -> bool:
        """Whether the engine holds the outcome of an update adding ``added`` and removing
        ``removed`` that started at the engine's ``next_sequence`` (all or nothing: one key
        tells; an added key numbered from ``next_sequence`` on is the update's, also when it
        was removed and added again, as a relabel does)."""
        engine = self._engine
        if added:
            key = added[-1]
            return key in engine and engine.sequence[engine.position(key)] >= next_sequence
        return not removed or removed[-1] not in engine

    def _learned_through(self, update: Callable[[], object], added: list[Hashable],
                         removed: list[Hashable], new: list[Hashable]) -> None:
        """Run the engine ``update`` (adding ``added``, removing ``removed``) with the feature
        names ``new`` it brings and its automatic keys recorded first, and taken back only if
        the engine did not take the update. An interrupt (Ctrl-C) right after the update left
        points stored whose feature names the model did not know, and the next new name took
        their column; one during the taking back leaves names no point uses (dropped as
        unused later) or automatic keys skipped: never a point without its names."""
        names, auto_keys = len(self._features), self._auto_keys
        next_sequence = self._engine._next_seq
        self._features.add(new)
        self._commit_keys(added)
        try:
            update()
        except BaseException:
            if not self._engine_took(added, removed, next_sequence):
                self._features.truncate(names)
                self._auto_keys = auto_keys
            raise

    def _commit_keys(self, keys: list[Hashable]) -> None:
        used = [key.number for key in keys if isinstance(key, AutoKey)]
        if used:
            self._auto_keys = max(self._auto_keys, max(used))

    # ---------------------------------------------------------------- bounded features
    @property
    def n_features(self) -> int:
        """Feature names the model holds columns for (those of its stored points, and unused
        ones not dropped yet)."""
        return len(self._features)

    #: At most this many buffered samples are left out of one refused update (see
    #: ``_far_suspects``); each try costs an update, which a refusal makes slow.
    MAX_LEFT_OUT_TRIES = 4
    #: A buffered sample is suspected of making an update refused where it lies this many
    #: times farther from the stored points' mean than the farthest of them (a unit slip).
    FAR_SUSPECT_FACTOR = 1e3

    def _far_suspects(self, rows: list[np.ndarray]) -> list[int]:
        """Positions of buffered ``rows`` far beyond the stored points' scale (see
        FAR_SUSPECT_FACTOR), the farthest first, at most MAX_LEFT_OUT_TRIES: the samples a
        refused update may be tried again without. None where nothing is stored."""
        stored = self._engine.X
        if not stored.shape[0] or not rows:
            return []
        width = max([stored.shape[1], *(row.size for row in rows)])
        center = np.zeros(width)
        center[: stored.shape[1]] = stored.mean(axis=0)
        reach = float(np.abs(stored - center[: stored.shape[1]]).max(initial=0.0))
        if not math.isfinite(reach):
            return []
        distances = []
        for row in rows:
            padded = np.zeros(width)
            padded[: row.size] = row
            with np.errstate(over="ignore", invalid="ignore"):
                distance = float(np.abs(padded - center).max(initial=0.0))
            distances.append(distance if not math.isnan(distance) else math.inf)
        far = [i for i, distance in enumerate(distances)
               if distance > self.FAR_SUSPECT_FACTOR * max(reach, np.finfo(float).tiny)]
        far.sort(key=lambda i: (-distances[i], i))
        return far[: self.MAX_LEFT_OUT_TRIES]

    def _note_left_out(self, key: Hashable | None, why: str) -> None:
        """Record a buffered sample left out (the last thousand are kept), and warn."""
        # (a model pickled before the list existed gets it here)
        left_out = self.__dict__.setdefault("refused_from_buffer", [])
        left_out.append((key, why))
        del left_out[:-1000]
        named = "a buffered sample" if key is None else f"the sample buffered under key {key!r}"
        message = f"{named} is left out: {why} (refused_from_buffer lists such samples)"
        note_warning(self, "left out of the buffer", message)
        warnings.warn(message, RuntimeWarning, stacklevel=4)

    def _check_new_key(self, key: Hashable | None) -> None:
        """KeyError for a key the model holds, before anything is done (dropping unused
        feature names to make room included)."""
        if key is not None:
            check_keys([key])
            if key in self._engine:
                raise KeyError(f"key {key!r} is already stored; keys must be unique")

    def _admitted(
        self, vectorize: Callable[[], tuple[np.ndarray, list[Hashable]]], slides: bool = False,
        values: Any = None,
    ) -> tuple[np.ndarray, list[Hashable]]:
        """Vectorize input to learn (with its labels or targets: ``values``), within
        ``max_new_features`` and ``max_features`` (ValueError naming the limit, model
        unchanged); unused names are dropped first when that makes room, and the input
        vectorized again on the new columns."""
        rows, new = vectorize()
        check_feature_names(new)
        self._check_kernel_scale(rows, values)
        self._judge_far_points(rows, new)
        arriving = rows.shape[0] if rows.ndim == 2 else 1
        if self.max_new_features is not None and len(new) > self.max_new_features:
            raise ValueError(
                f"the input brings {len(new)} features the model does not know; "
                f"max_new_features={self.max_new_features}"
            )
        limit = self.max_features
        if limit is None or len(self._features) + len(new) <= limit:
            return rows, new
        self._check_room(arriving, slides, new, limit)
        # Undone if the call then fails (see refused_unchanged): decisions do not depend on
        # unused names, but a refused call must not change the model at all.
        undo = (self._engine.dim, self._features.names, self._features.index,
                self._compacted_at,
                {name: getattr(self, name) for name in self._extra_row_attributes})
        kept = self._compact_features()
        if kept is not None:
            self._compaction_undo = (kept, *undo)
        rows, new = vectorize()
        # Again: names of the input that no stored point used were dropped, and are new now.
        self._check_room(arriving, slides, new, limit)
        return rows, new

    def _check_room(self, arriving: int, slides: bool, new: list[Hashable], limit: int
                    ) -> None:
        used = int(self._used_columns(self._leaving_positions(arriving, slides)).sum())
        if not self._engine.kernel.folds_absent_features:
            # A user's kernel may see every column: no name is ever dropped.
            held = len(self._features)
            raise ValueError(
                f"learning the input would give the model {held + len(new)} features ({held} "
                f"it holds, {used} of them used by its stored points, and {len(new)} new); "
                f"max_features={limit}. With a callable kernel the model keeps every name it "
                "has learned, even once no stored point uses it: raise max_features, or give "
                "the features fixed names")
        if used + len(new) > limit:
            raise ValueError(
                f"learning the input would give the model {used + len(new)} features ({used} "
                f"used by its stored points and {len(new)} new); max_features={limit}"
            )

    def _undo_compaction(self) -> None:
        undo = getattr(self, "_compaction_undo", None)
        self._compaction_undo = None
        if undo is None:
            return
        kept, dim, names, index, compacted_at, extra = undo
        # The engine's arrays are those of its own rollback by now: widened in place.
        self._engine.widen_columns(kept, dim)
        self._features.restore(names, index)
        self._compacted_at = compacted_at
        for name, value in extra.items():
            setattr(self, name, value)

    #: Attributes holding the rows of :meth:`_extra_rows` (which a compaction replaces).
    _extra_row_attributes: tuple[str, ...] = ()

    def _extra_rows(self) -> list[np.ndarray]:
        """Feature rows the model holds besides the engine's (buffers, kept samples)."""
        return []

    def _keep_extra_columns(self, columns: np.ndarray) -> None:
        """Keep only the given feature columns in :meth:`_extra_rows`' rows."""

    def _leaving_positions(self, arriving: int, slides: bool) -> np.ndarray:
        """Stored points that learning ``arriving`` more samples removes (a window's oldest,
        in the slide that learns them: this call's when it ``slides``, else the one a full
        buffer triggers), whose feature names the limit then does not count."""
        return np.zeros(0, dtype=np.int64)

    def _used_columns(self, leaving: np.ndarray | None = None) -> np.ndarray:
        """Which feature names some stored or buffered point (but those ``leaving``) has a
        non-zero value for."""
        width = len(self._features)
        used = np.zeros(width, dtype=bool)
        stored = self._engine.X
        if leaving is not None and leaving.size:
            stored = np.delete(stored, leaving, axis=0)
        for block in [stored, *self._extra_rows()]:
            block = np.atleast_2d(block)
            span = min(width, block.shape[1])
            if block.shape[0] and span:
                used[:span] |= np.any(block[:, :span] != 0, axis=0)
        return used

    def _compact_features(self) -> np.ndarray | None:
        """Drop the feature names no stored or buffered point uses (decisions unchanged);
        returns the engine's columns kept, None when nothing was dropped."""
        if not self._engine.kernel.folds_absent_features:
            return None  # a user's kernel may depend on all-zero columns
        used = self._used_columns()
        kept = None
        if not used.all():
            columns = np.flatnonzero(used)
            kept = columns[columns < self._engine.dim]
            self._engine.keep_columns(kept)
            self._keep_extra_columns(columns)
            self._features.keep(columns)
        self._compacted_at = len(self._features)
        return kept

    def _unknown_key(self, key: Hashable, noun: str = "point") -> KeyError:
        """The error for a key to forget that no stored point has: reserve truncation
        (``reserve_epsilon``) may have discarded the point, which the message then says (a
        batch to forget is refused whole: filter it against ``stored_keys()``)."""
        reason = (" (reserve truncation may have discarded it; forget only the keys in "
                  "stored_keys())" if getattr(self, "reserve_epsilon", None) is not None
                  else "")
        return unknown_key(f"stored {noun}", key, self._engine._pos, reason)

    def _forgotten(self) -> None:
        """After a forget: the feature names only the forgotten points had go at once (a
        forgotten text's tokens are names: an erased e-mail address stayed in checkpoints
        and in ``support_vectors()`` until the next amortized drop)."""
        self._compact_features()

    def _after_learning(self) -> None:
        """After points were learned: an amortized :meth:`_compact_features` (when the names
        have doubled since the last, or exceed ``max_features``: a window's slide learns new
        names before its oldest points and theirs leave)."""
        limit = self.max_features
        if (len(self._features) >= 2 * self._compacted_at + _COMPACTION_SLACK
                or (limit is not None and len(self._features) > limit)):
            self._compact_features()

    def _check_kernel_scale(self, incoming: np.ndarray, values: Any = None) -> None:
        """Before points are learned (so that a warning made an error changes nothing): the
        kernel's scale against the stored points and the ``incoming`` rows (their labels or
        targets: ``values``), once SCALE_CHECK_POINTS would be stored and again every
        SCALE_CHECK_EVERY updates. Counting the incoming rows warns a model fit by one
        ``learn_many``; a feature whose scale jumped mid-stream (a unit changed upstream)
        made every later point a support vector of its own, and increments of a second and
        more, silently."""
        incoming = np.atleast_2d(incoming)
        engine = self._engine
        if (engine.n + incoming.shape[0] < SCALE_CHECK_POINTS
                or engine.updates_total < getattr(self, "_next_scale_check", 0)):
            return
        self._warn_of_scale(incoming, values)  # (a warning made an error: checked again)
        self._next_scale_check = engine.updates_total + SCALE_CHECK_EVERY

    def _judge_far_points(self, incoming: np.ndarray, new_names: list[Hashable]) -> None:
        """Count, and warn of (once per process and model type) or refuse (ValueError, with
        ``far_points="refuse"``), an incoming point whose K(x, x), under a kernel whose values
        grow with the features (linear, polynomial), is more than OUTLIER_DIAGONAL_RATIO times
        the largest of the stored points': one message with a unit slip or a raw timestamp
        among unit-scale features. Learned, it stays, and its terms swamp the others'
        conditions: 4 to 56 of the next 150 updates of a linear IncrementalSVC were refused
        (ConvergenceError, each after trying to learn every stored point afresh), without a
        word, until it was forgotten."""
        engine = self._engine
        kernel = engine.kernel
        # (RBF: K(x, x) = 1; a user's kernel: a call per point, not made here.)
        # (a window of fewer points is judged when full: it never held OUTLIER_MIN_STORED)
        needed = min(OUTLIER_MIN_STORED, getattr(self, "window_size", OUTLIER_MIN_STORED))
        if not isinstance(kernel, (LinearKernel, PolynomialKernel)) or engine.n < needed:
            return
        scale = engine._diag_scale
        if incoming.ndim == 1:
            # One point (learn_one): K(x, x) in Python floats, a microsecond, where numpy's
            # calls cost 7 % of a linear model's learn_one.
            squared = float(incoming @ incoming)
            if isinstance(kernel, PolynomialKernel):
                try:
                    squared = (kernel.gamma * squared + kernel.coef0) ** kernel.degree
                except OverflowError:
                    return  # (not finite: refused by _check_kernel_values)
            if not squared > OUTLIER_DIAGONAL_RATIO * scale:
                return
        with np.errstate(over="ignore", invalid="ignore"):
            diagonal = kernel.diagonal(np.atleast_2d(incoming))
        beyond = np.isfinite(diagonal) & (diagonal > OUTLIER_DIAGONAL_RATIO * scale)
        if not scale > 0 or not beyond.any():
            return  # (a diagonal that is not finite is refused by _check_kernel_values)
        self._far_points = getattr(self, "_far_points", 0) + int(beyond.sum())
        row = np.atleast_2d(incoming)[int(np.argmax(np.where(beyond, diagonal, -np.inf)))]
        column = int(np.argmax(np.abs(row)))
        names = self._features.names
        name = names[column] if column < len(names) else new_names[column - len(names)]
        value = float(diagonal[beyond].max())
        point = (
            f"a point far beyond the kernel scale of the stored points: its K(x, x) = "
            f"{value:.3g} is {value / scale:.3g} times the largest of the {engine.n} points "
            f"stored ({scale:.3g}; its feature {name!r} = {row[column]:.6g})")
        if self.far_points == "refuse":
            raise ValueError(f"{point}: refused (far_points='refuse'), the model is unchanged: "
                             "stored, it would swamp the other points' conditions. A unit slip "
                             "or an unscaled feature (a raw timestamp)? Standardize the "
                             "features, or learn it with far_points='warn'")
        warn_kernel_scale(self, (
            f"{point}. Once stored, its terms swamp the other points' conditions, which "
            "float64 then resolves only to about 1e-16 of its size: this update and later ones "
            "may be refused "
            "(ConvergenceError; the daemon dead-letters them 'refused'), each refusal after "
            "trying to learn the stored points afresh (slow). A unit slip or an unscaled "
            "feature (a raw timestamp)? Forget the point (forget_one with its key), refuse "
            "such points (far_points='refuse'), or standardize the features (River's "
            "preprocessing.StandardScaler; the daemon's [scaler])"))

    def _warn_of_scale(self, incoming: np.ndarray, values: Any) -> None:
        """Warn when the kernel's scale does not fit the points (see _check_kernel_scale)."""
        engine = self._engine
        # Points spread over the stored ones in arrival order, then the incoming ones: the
        # newest alone, consecutive in a time-ordered stream, can be far closer together
        # than the stream's points.
        order = np.argsort(engine.sequence, kind="stable")
        total = order.size + incoming.shape[0]
        spread = np.linspace(0, total - 1, min(total, SCALE_SAMPLE)).astype(int)
        stored = engine._X[order[spread[spread < order.size]], : engine.dim]
        arriving = incoming[spread[spread >= order.size] - order.size]
        sample = np.zeros((spread.size, max(stored.shape[1], arriving.shape[1])))
        sample[: len(stored), : stored.shape[1]] = stored
        sample[len(stored):, : arriving.shape[1]] = arriving
        warn_kernel_scale(self, kernel_scale_warning(engine.kernel, sample))

    def _fold(self, rows: np.ndarray) -> np.ndarray:
        """Query rows with the features no stored point has folded into one column of their
        norm: the same kernel values (see Kernel.folds_absent_features) at O(known) cost."""
        known = self._engine.dim
        if rows.shape[1] <= known + 1 or not self._engine.kernel.folds_absent_features:
            return rows
        absent = np.sqrt(np.einsum("ij,ij->i", rows[:, known:], rows[:, known:]))
        return np.hstack([rows[:, :known], absent[:, None]])

    def _check_kernel_values(self, rows: np.ndarray) -> None:
        """ValueError (nothing changed) when K(x, x) is not finite for a row to be buffered, or
        below 0 (a user's kernel): such a point could never be learned, and would block every
        later slide."""
        if self._engine.kernel.finite_values:
            return  # rows are finite here (vectorizing refuses anything else)
        with np.errstate(over="ignore", invalid="ignore"):
            diagonal = self._engine.kernel.diagonal(np.atleast_2d(rows))
        if not np.all(np.isfinite(diagonal)):
            raise ValueError(
                "the kernel value K(x, x) of the input is not finite (features too large for "
                "this kernel); the model is unchanged"
            )
        if isinstance(self._engine.kernel, CallableKernel):
            # Refused here, as the engine refuses it: buffered, it blocked every later slide.
            check_self_similarity(diagonal, np.atleast_2d(rows))

    def decision_function_one(self, x: Mapping) -> float:
        """f(x) = sum_i alpha_i y_i K(x_i, x) + b (for a classifier, positive means the
        positive class)."""
        row, unknown = self._row(x)
        self._features.warn_misnamed(unknown)
        return float(self._engine.decision_function(self._fold(row[None, :]))[0])

    def decision_function_many(self, X: pd.DataFrame) -> pd.Series:
        """f(x) for every row of X, indexed as X (as ``predict_many``).

        >>> import pandas as pd
        >>> from stream_svm import IncrementalSVC
        >>> model = IncrementalSVC(kernel="linear")
        >>> model.learn_one({"a": 1.0}, True)
        >>> model.learn_one({"a": -1.0}, False)
        >>> X = pd.DataFrame({"a": [2.0, -3.0]}, index=["p", "q"])
        >>> model.decision_function_many(X).round(6)
        p    2.0
        q   -3.0
        dtype: float64
        """
        return pd.Series(self._decisions(X), index=X.index, dtype=float)

    def _decisions(self, X: pd.DataFrame) -> np.ndarray:
        if len(X) == 0:
            return np.zeros(0)
        rows, unknown = self._frame(X)
        self._features.warn_misnamed(unknown)
        return self._engine.decision_function(self._fold(rows))

