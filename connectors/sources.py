"""Data sources for ``replay`` and ``evaluate``: a data set that ships in an installed package
(River's Bananas and Phishing), the river-flow task of ``stream_svm.datasets``, or a CSV / JSONL
file.

>>> x, y = next(iter_source("bananas"))
>>> sorted(x), y
(['1', '2'], False)
"""

from __future__ import annotations

import csv
import functools
import itertools
import json
import logging
import math
import re
from collections.abc import Callable, Collection, Iterator
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

__all__ = ["BUNDLED", "SourceError", "count_source", "is_file_source", "iter_records",
           "iter_source", "raw_label"]

#: Binary-classification data sets of River that ship inside its wheel (no download).
BUNDLED = {"bananas": "Bananas", "phishing": "Phishing"}


class SourceError(ValueError):
    """A data source that cannot be read; the message says why."""


def _label(value: Any, where: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("true", "1", "1.0", "yes", "+1"):
            return True
        if text in ("false", "0", "0.0", "-1", "-1.0", "no"):
            return False
    elif isinstance(value, (int, float)):
        if value == 1:
            return True
        if value in (0, -1):
            return False
    raise SourceError(f"{where}: label {value!r} is not binary (true/1 or false/0/-1)")


def raw_label(value: Any, where: str) -> Any:
    """A label as the file holds it: JSON values unchanged; CSV text as a JSON reader would
    take it (true/false as booleans, numbers as numbers, anything else as text), so that it
    can be sent to the daemon and checked by the same rules there.

    >>> raw_label("spam", "f.csv:2"), raw_label("1", "f.csv:3"), raw_label("2.5", "f.csv:4")
    ('spam', 1, 2.5)
    """
    if not isinstance(value, str):
        return value
    text = value.strip()
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for kind in (int, float):
        try:
            number = kind(text)
        except ValueError:
            continue
        if kind is int or math.isfinite(number):
            return number
    return text


def _number(value: Any, name: str, where: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):  # (an integer of 400 digits overflows)
        raise SourceError(f"{where}: feature {name!r} is not a number: {value!r}") from None
    if not math.isfinite(number):
        raise SourceError(f"{where}: feature {name!r} is not finite: {value!r}")
    return number


def _utf8_text(reader: Callable[..., Iterator[Any]]) -> Callable[..., Iterator[Any]]:
    """A file reader whose bytes that are no UTF-8 text are a SourceError naming the file (a
    bare "'utf-8' codec can't decode byte 0x90" did not say which)."""
    @functools.wraps(reader)
    def read(path: Path, *args: Any, **kwargs: Any) -> Iterator[Any]:
        try:
            yield from reader(path, *args, **kwargs)
        except UnicodeDecodeError as exc:
            raise SourceError(f"{path}: not UTF-8 text (it holds the byte "
                              f"{exc.object[exc.start]:#04x}, which UTF-8 has no place for "
                              "there)") from None

    return read


@_utf8_text
def _csv(path: Path, target: str, read: Callable[[Any, str], Any], id_column: str | None,
         bad_rows: list[str] | None = None, unlabelled: bool = False,
         number_rows: bool = False, locations: list[str] | None = None,
         drop_columns: Collection[str] = ()) -> Iterator[tuple[Any, dict[str, float], Any]]:
    # utf-8-sig: a byte-order mark (spreadsheets' "CSV UTF-8") is not part of the first name.
    with open(path, newline="", encoding="utf-8-sig") as handle:
        reader = csv.DictReader(handle)
        if reader.fieldnames is None or target not in reader.fieldnames:
            raise SourceError(f"{path}: no column {target!r} (set the label column with --target)")
        repeated = sorted({n for n in reader.fieldnames if reader.fieldnames.count(n) > 1})
        if repeated:
            # DictReader keeps a repeated column's last value: which one is meant is not clear.
            raise SourceError(f"{path}: the header repeats the column(s) {repeated}")
        if id_column is not None and id_column not in reader.fieldnames:
            raise SourceError(f"{path}: no column {id_column!r} (the --id-column)")
        absent = [name for name in drop_columns if name not in reader.fieldnames]
        if absent:  # (a misspelt name would leave the column it meant among the features)
            raise SourceError(f"{path}: no column {absent[0]!r} (a --drop-column); its columns: "
                              f"{', '.join(reader.fieldnames)}")
        if id_column is None and "id" in reader.fieldnames and "id" not in drop_columns:
            _warn_id_is_a_feature(path)
        for record, row in enumerate(reader):
            # The line the row ends on: DictReader skips blank lines, and a quoted cell may
            # hold line breaks, so the row's own count would name another line.
            where = f"{path}:{reader.line_num}"
            try:
                if None in row:  # (DictReader keeps the cells beyond the header under None)
                    raise SourceError(f"{where}: {len(reader.fieldnames) + len(row[None])} cells, "
                                      f"but the header names {len(reader.fieldnames)} columns")
                label = row.pop(target)
                if label in ("", None) and unlabelled:  # an empty cell: a message without y
                    y = None
                elif label in ("", None):
                    raise SourceError(f"{where}: no label (the {target!r} cell is empty)")
                else:
                    y = read(label, where)
                identifier = (_identifier(row.pop(id_column), where, text=True) if id_column
                              else None)
                x = {k: _number(v, k, where) for k, v in row.items()
                     if v not in ("", None) and k not in drop_columns}
            except SourceError as exc:
                if bad_rows is None:
                    raise
                bad_rows.append(str(exc))
                continue
            if identifier is None and number_rows:
                identifier = record  # the row's own number: skipped rows keep theirs
            if locations is not None:
                locations.append(where)
            yield identifier, x, y


@_utf8_text
def _jsonl(path: Path, target: str, read: Callable[[Any, str], Any], id_column: str | None,
           bad_rows: list[str] | None = None, unlabelled: bool = False,
           number_rows: bool = False, locations: list[str] | None = None,
           controls: bool = False, drop_columns: Collection[str] = ()
           ) -> Iterator[tuple[Any, dict[str, float] | None, Any]]:
    form = {"form": _jsonl_form(path, target)}
    with open(path, encoding="utf-8-sig") as handle:  # (a leading byte-order mark is skipped)
        row = -1
        for line, text in enumerate(handle, start=1):
            if not text.strip():
                continue
            row += 1
            try:
                identifier, x, y = _jsonl_row(text, f"{path}:{line}", target, read, id_column,
                                              unlabelled, controls, form, drop_columns)
            except SourceError as exc:
                if bad_rows is None:
                    raise
                bad_rows.append(str(exc))
                continue
            if identifier is None and number_rows:
                identifier = row  # the row's own number: skipped rows keep theirs
            if locations is not None:
                locations.append(f"{path}:{line}")
            yield identifier, x, y


def _jsonl_form(path: Path, target: str) -> str:
    """Whether a JSON-lines file holds the daemon's messages ("messages": its points carry
    their features in "x") or flat rows ("rows"), from its first line that says: one with an
    object "x", or one with a field beside "id", "y", "op" and the label column. Lines that
    are not JSON objects say nothing, nor do labels and forgets, which may come first (a
    file of late labels alone is one of messages). Decided line by line, a label or forget
    before the first point was read as a flat row: a point of the feature "id"."""
    with open(path, encoding="utf-8-sig") as handle:
        for text in itertools.islice(handle, JSONL_FORM_LINES):
            if not text.strip():
                continue
            try:
                document = json.loads(text)
            except (ValueError, RecursionError):
                continue
            if not isinstance(document, dict):
                continue
            if isinstance(document.get("x"), dict):
                return "messages"
            if set(document) - {"id", "y", "op", "x", target}:  # ("x" not an object: bad)
                return "rows"
            if "op" in document:  # a forget or relabel names its op; a number is a feature
                return "messages" if isinstance(document["op"], str) else "rows"
    return "messages"


#: Lines read at most to tell a JSON-lines file's form (beyond: one of messages).
JSONL_FORM_LINES = 10_000


def _control_kind(document: dict[str, Any]) -> str | None:
    """What a JSON line of the daemon's own messages is when it is about an earlier message
    (a late label ``{"id", "y"}``, an ``op``: forget or relabel), else None (a point)."""
    if "op" in document:
        return {"forget": "a forget", "relabel": "a relabel"}.get(document["op"], "an op")
    if "x" not in document and set(document) == {"id", "y"}:
        return "a late label"
    return None


def _jsonl_row(text: str, where: str, target: str, read: Callable[[Any, str], Any],
               id_column: str | None, unlabelled: bool = False,
               controls: bool = False, form: dict[str, str] | None = None,
               drop_columns: Collection[str] = ()
               ) -> tuple[Any, dict[str, float] | None, Any]:
    """One line of a JSON-lines file: ``(id, x, y)``, or SourceError naming it. With
    ``unlabelled``, a label that is null (or absent from a message of the daemon's own form,
    as the daemon reads it) gives y None; otherwise it is an error. In a file of the daemon's
    messages (``form``, the file's, :func:`_jsonl_form`), a late label, forget or relabel
    message gives ``(id, None, the message)`` with ``controls``, else SourceError; in a file
    of flat rows, ``{"id": ..., "y": ...}`` is a row of no feature, and "op" a feature.
    Fields in ``drop_columns`` are no features (a flat row's, or a message's in its "x")."""
    from connectors.messages import Malformed, unique_fields
    from connectors.messages import _reject_constant as reject_constant
    from connectors.messages import features_of as daemon_features

    try:
        # Fields given twice and NaN / Infinity are refused, as the daemon dead-letters them.
        document = json.loads(text, object_pairs_hook=unique_fields,
                              parse_constant=reject_constant)
    except json.JSONDecodeError as exc:
        raise SourceError(f"{where}: not JSON: {exc}") from None
    except Malformed as exc:
        raise SourceError(f"{where}: {exc}") from None
    except ValueError as exc:  # e.g. an integer literal with too many digits
        raise SourceError(f"{where}: not usable JSON: {exc}") from None
    except RecursionError:
        raise SourceError(f"{where}: not JSON: nested too deeply") from None
    if not isinstance(document, dict):
        raise SourceError(f"{where}: each line must be a JSON object")
    # (Without the file's form, as for one line read alone: a point unless it is a message.)
    control = (_control_kind(document) if (form or {}).get("form", "messages") == "messages"
               else None)
    if control is not None:
        # Read line by line as a flat row, {"id": "a", "y": true} became a point of the
        # feature "id" (or of no feature), learned while the features it labels waited.
        if not controls:
            raise SourceError(f"{where}: {control} of the daemon's messages, not a point: "
                              "each row here needs its features and its label")
        if document.get("id") is None:
            raise SourceError(f"{where}: {control} needs an 'id'")
        return _identifier(document["id"], where), None, document
    identifier = None
    if id_column is not None:
        if id_column not in document:
            raise SourceError(f"{where}: no field {id_column!r} (the --id-column)")
        identifier = _identifier(document[id_column], where)
    if "x" in document:  # {"id": ..., "x": {...}, "y": ...}, the daemon's own format
        if not isinstance(document["x"], dict):
            raise SourceError(f"{where}: \"x\" must be an object of features")
        if id_column is None and document.get("id") is not None:
            identifier = _identifier(document["id"], where)  # its id is the message's
        y = document.get("y", document.get(target))
        may_be_unlabelled = True  # as the daemon reads it: y absent or null
        # The daemon's own rules for its own format: JSON numbers only (true, false, null and
        # numbers written as text are dead-lettered there, so they are not read as numbers
        # here).
        try:
            x = daemon_features(document)
        except Malformed as exc:
            raise SourceError(f"{where}: {exc} (the daemon dead-letters it)") from None
        x = {k: v for k, v in x.items() if k not in drop_columns}
    else:
        if id_column is None and "id" in document and "id" not in drop_columns:
            _warn_id_is_a_feature(where.rpartition(":")[0])
        features = {k: v for k, v in document.items()
                    if k not in (target, id_column) and k not in drop_columns}
        y = document.get(target)
        # A flat row names its label, null for none: were an absent one no label, a misspelt
        # --target would send every row unlabelled.
        may_be_unlabelled = target in document
        x = {k: _number(v, k, where) for k, v in features.items()}
    if y is None and not (unlabelled and may_be_unlabelled):
        raise SourceError(f"{where}: no label {target!r}")
    if y is None:
        return identifier, x, None
    if isinstance(y, float) and not math.isfinite(y):  # (1e400 reads as inf)
        raise SourceError(f"{where}: label {y} is not finite")
    # A JSON label is taken as the file holds it: raw_label's reading of text as numbers is
    # for CSV cells ("3.5" in JSON is text, which the daemon refuses as a target).
    return identifier, x, y if read is raw_label else read(y, where)


_WARNED_ID_FEATURE: set[str] = set()


def _warn_id_is_a_feature(path: Any) -> None:
    """Once per file: a column named "id" is a feature unless --id-column names it."""
    if str(path) not in _WARNED_ID_FEATURE:
        _WARNED_ID_FEATURE.add(str(path))
        log.warning("%s: the column 'id' is read as a feature; pass --id-column id to take the "
                    "messages' ids from it instead", path)


def _identifier(value: Any, where: str, text: bool = False) -> str | int:
    """A message id from a file: a JSON value as it is (an integer, or text); with ``text``
    (a CSV cell), an integer only where the cell is written as one of 64 bits ("7", "-12"),
    otherwise the text: "007" and "7" are two ids, as they are to the daemon. Whether the id
    (after a replay's prefix) is one the daemon takes is checked where it is used.

    >>> _identifier("007", "f.csv:2", text=True), _identifier(" 7 ", "f.csv:3", text=True)
    ('007', 7)
    """
    from connectors.messages import MAX_INT_ID

    if text and isinstance(value, str):
        value = value.strip()
        if _INTEGER_TEXT.fullmatch(value) and -MAX_INT_ID - 1 <= int(value) <= MAX_INT_ID:
            return int(value)
    if value is None or value == "":
        raise SourceError(f"{where}: no id (the cell or field is empty)")
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise SourceError(f"{where}: id {value!r} is neither an integer nor text")
    return value


#: An integer as JSON writes one (no sign +, no leading zeros; "-0" reads as 0, as
#: the daemon reads JSON's -0).
_INTEGER_TEXT = re.compile(r"-?(0|[1-9][0-9]*)")


def iter_source(
    source: str, target: str = "y", limit: int | None = None,
    read_label: Callable[[Any, str], Any] = _label,
) -> Iterator[tuple[dict[str, float], Any]]:
    """``(x, y)`` pairs of a source: ``bananas``, ``phishing``, ``river-flow:DIR[#RIVER]`` (a
    directory with the river's three series; ``target`` ``"flow"`` for the regression, else
    whether the flow rises), or a ``.csv`` / ``.jsonl`` file whose label is ``target``;
    labels read by ``read_label`` (default: binary; :func:`raw_label` keeps them as they
    are)."""
    return ((x, y) for _, x, y in iter_records(source, target, limit, read_label))


def iter_records(
    source: str, target: str = "y", limit: int | None = None,
    read_label: Callable[[Any, str], Any] = _label, id_column: str | None = None,
    bad_rows: list[str] | None = None, unlabelled: bool = False, number_rows: bool = False,
    locations: list[str] | None = None, controls: bool = False,
    drop_columns: Collection[str] = (),
) -> Iterator[tuple[Any, dict[str, float] | None, Any]]:
    """``(id, x, y)`` of a source, as :func:`iter_source`; the id is the ``id_column`` of a
    file's rows (not a feature then), or None. A file's row that cannot be read raises
    SourceError naming it, or with ``bad_rows`` is skipped and its error appended there.
    With ``unlabelled``, a file's row without a label (an empty CSV cell, a JSON null, a
    message of the daemon's form without ``y``) gives y None instead of an error. With
    ``number_rows``, a file's row without an id gets its number (from 0, over the rows that
    are not blank, those skipped included) instead of None. With ``locations``, a file's
    ``path:line`` of every row is appended there before the row is yielded (the line the row
    ends on, as its errors name it); a bundled source appends nothing.

    A ``.jsonl`` line that is one of the daemon's messages about an earlier one, a late label
    ``{"id", "y"}``, a forget or a relabel (``{"op", ...}``), is no point: with ``controls``
    it is yielded as ``(id, None, the message)``, to be sent as written; otherwise it is a row
    that cannot be read (SourceError, or skipped into ``bad_rows``).

    ``drop_columns`` names a file's columns (fields) that are no features: a second target, a
    timestamp, a free-text note. A CSV file must have each (a misspelt name is refused)."""
    stream: Iterator[tuple[Any, dict[str, Any] | None, Any]]
    if id_column is not None and id_column == target:
        raise SourceError(f"--id-column {id_column!r} is the label column (--target): name the "
                          "column that holds the ids")
    if id_column is not None and not is_file_source(source):
        raise SourceError(f"--id-column is for .csv and .jsonl files, not {source!r}")
    drop_columns = frozenset(drop_columns)
    for name, flag in ((target, "--target"), (id_column, "--id-column")):
        if name in drop_columns:
            raise SourceError(f"--drop-column {name!r} is the {flag} column")
    if drop_columns and not is_file_source(source):
        raise SourceError(f"--drop-column is for .csv and .jsonl files, not {source!r}")
    if source.lower() in BUNDLED:
        from river import datasets

        if target != "y":  # (ignored without a word: --target nosuch evaluated bananas)
            raise SourceError(f"--target names a column of a .csv or .jsonl file; {source!r} "
                              "has its own label")
        stream = iter(getattr(datasets, BUNDLED[source.lower()])())
        stream = ((None, x, read_label(y, source)) for x, y in stream)
    elif source.startswith("river-flow:"):
        from stream_svm.datasets import RIVER_FLOW_TARGETS, RiverFlow

        # river-flow:DIR (the Fisher river) or river-flow:DIR#RIVER; the label is whether the
        # flow rises, with the paper's features (min-max scaled over the whole series), or
        # with target "flow" the flow itself, with the features in the files' units, as a
        # live producer sends them (scaled over the whole series, they told of floods ahead).
        directory, _, river = source.partition(":")[2].partition("#")
        if target not in ("y", *RIVER_FLOW_TARGETS):
            raise SourceError(f"{source}: the target is one of {RIVER_FLOW_TARGETS}, "
                              f"not {target!r}")
        flow = target == "flow"
        try:
            dataset = RiverFlow(directory, river=river or "fisher", scaled=not flow,
                                target="flow" if flow else "rises")
        except (OSError, ValueError) as exc:
            raise SourceError(f"{source}: {exc}") from None
        stream = ((None, dict(x), read_label(y if flow else bool(y), source))
                  for x, y in dataset)
    else:
        path = Path(source)
        if not path.is_file():
            raise SourceError(
                f"data source {source!r} is neither a bundled data set "
                f"({', '.join(BUNDLED)}), river-flow:DIR, nor an existing file"
            )
        if path.suffix.lower() == ".csv":
            stream = _csv(path, target, read_label, id_column, bad_rows, unlabelled, number_rows,
                          locations, drop_columns)
        elif path.suffix.lower() in (".jsonl", ".ndjson", ".json"):
            stream = _jsonl(path, target, read_label, id_column, bad_rows, unlabelled,
                            number_rows, locations, controls, drop_columns)
        else:
            raise SourceError(f"{path}: use a .csv or .jsonl file")
    return itertools.islice(stream, limit) if limit is not None else stream


def is_file_source(source: str) -> bool:
    """Whether ``source`` names a file (whose rows may be unreadable), not a bundled set."""
    return source.lower() not in BUNDLED and not source.startswith("river-flow:")


def count_source(source: str, target: str = "y", limit: int | None = None) -> int | None:
    """How many pairs the source holds, when cheap to know (for a progress bar)."""
    if source.lower() in BUNDLED:
        from river import datasets

        total = int(getattr(datasets, BUNDLED[source.lower()])().n_samples)
        return min(total, limit) if limit is not None else total
    return None
