"""The wire format of the daemon: parsing and checking of input and label messages, and the
output, acknowledgement and dead-letter records it writes.

Parsing never raises anything but :class:`Malformed`, whose message is the reason written to the
dead-letter topic; checks that need the model (unknown id, duplicate id) happen in the processor.

>>> parse_message(b'{"id": 7, "x": {"a": 1.5}, "y": true}', max_bytes=1000)
Observe(id=7, x={'a': 1.5}, y=True)
>>> parse_message(b'{"op": "forget", "id": "u-1"}', max_bytes=1000)
Forget(id='u-1')
>>> bad = b'{"id": 1, "x": {"a": "high"}}'
>>> parse_message(bad, max_bytes=1000)  # doctest: +IGNORE_EXCEPTION_DETAIL
Traceback (most recent call last):
...
connectors.messages.Malformed: feature 'a' must be a finite number, got 'high' (str)
"""

from __future__ import annotations

import base64
import json
import math
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from stream_svm._input import shown

__all__ = [
    "MAX_INT_ID",
    "Forget",
    "Label",
    "Malformed",
    "Observe",
    "Relabel",
    "Source",
    "Targets",
    "UnreadableRecord",
    "dead_letter",
    "encode",
    "features_of",
    "message_id",
    "parse_label",
    "parse_message",
    "targets_of",
]

#: Integer ids must fit in a signed 64-bit integer (they are checkpointed as numpy arrays).
MAX_INT_ID = 2**63 - 1
MAX_ID_LENGTH = 1024

Id = str | int
#: A parsed label: True/False (positive/negative class) or, for a regressor, a float.
Target = bool | float


class Malformed(ValueError):
    """A message that cannot be processed; ``str(exc)`` is the dead-letter reason."""


@dataclass(frozen=True)
class Source:
    """Where a message was read: written back in outputs and dead letters."""

    topic: str
    partition: int
    offset: int

    def as_dict(self) -> dict[str, Any]:
        return {"topic": self.topic, "partition": self.partition, "offset": self.offset}

    def letter_key(self) -> bytes:
        """The Kafka key of a dead letter of this message: where it was read."""
        return f"{self.topic}:{self.partition}:{self.offset}".encode()


@dataclass(frozen=True)
class UnreadableRecord:
    """In place of a Kafka record the client could not read (its batch damaged, or compressed
    with a codec this installation lacks): dead-lettered as ``unreadable`` with ``error``, and
    its offset passed, so that the partition behind it moves on. It has no key, value,
    headers or timestamp (-1, as Kafka writes "none"), since none of them could be read."""

    topic: str
    partition: int
    offset: int
    error: str
    key: None = None
    value: None = None
    headers: tuple = ()
    timestamp: int = -1


@dataclass(frozen=True)
class Observe:
    """Features to predict; with a label, learned afterwards (test-then-train)."""

    id: Id
    x: dict[str, float]
    y: Target | None = None


@dataclass(frozen=True)
class Label:
    """A label that arrives after its features (joined by id to the cache)."""

    id: Id
    y: Target


@dataclass(frozen=True)
class Forget:
    """Exact removal of the point learned under ``id``."""

    id: Id


@dataclass(frozen=True)
class Relabel:
    """Forget the point learned under ``id`` and learn it again with label ``y``."""

    id: Id
    y: Target


Operation = Observe | Label | Forget | Relabel


class _NonFinite(ValueError):
    """A NaN or Infinity literal in a message (which JSON does not have)."""


def _reject_constant(name: str) -> float:
    raise _NonFinite(name)


def _as_json(value: object) -> str:
    """A value of a decoded message as its sender wrote it (null, true, "text", [1, 2]),
    shortened: the dead letter speaks JSON, not Python."""
    if isinstance(value, float) and math.isinf(value):
        return "a number beyond the float range"  # (JSON has no infinity: 1e400 reads so)
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):  # (an integer of thousands of digits)
        return shown(value)
    return text if len(text) <= 60 else f"{text[:57]}..."


#: A JSON string literal, or anything else one character at a time: scanned left to right,
#: each literal is consumed once (linear in the message; a search for a literal followed by
#: ': NaN' from every quote took minutes on a message of escaped quotes).
_STRING_OR_CHARACTER = re.compile(r'"(?:[^"\\]|\\.)*"|[^"]+', re.DOTALL)


def _where_non_finite(text: str, name: str) -> str:
    """Where the first literal ``name`` (NaN, Infinity, -Infinity) outside the strings of a
    message stands, where the decoder stopped: the field it is the value of, if any."""
    field = None  # the last string literal, while only ':' and blanks follow it
    for token in _STRING_OR_CHARACTER.finditer(text):
        piece = token.group()
        if piece.startswith('"'):
            field = piece
            continue
        at = piece.find(name)
        while at > 0 and name == "Infinity" and piece[at - 1] == "-":
            at = piece.find(name, at + 1)  # (the decoder names -Infinity so)
        if at < 0:
            if field is not None and piece.strip() not in ("", ":"):
                field = None
            continue
        if field is None or piece[:at].strip() != ":":
            return ""
        try:
            return f" (the value of {shown(json.loads(field))})"
        except ValueError:
            return ""
    return ""


# Made once: json.loads and json.dumps with options build a decoder or an encoder on every call
# (1.5 us and 0.9 us of a message's 2.7 us and 3.0 us here). Both are safe to share between
# threads, as the json module's own defaults are.
def unique_fields(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object's fields as a dict; Malformed when one is given twice."""
    document = dict(pairs)
    if len(document) != len(pairs):
        # The last value won silently: {"y": true, "y": false} was learned as false, and a
        # feature given twice took its second value.
        seen: set[str] = set()
        for name, _ in pairs:
            if name in seen:
                raise Malformed(f"field {shown(name)} appears twice in one object: which value "
                                "is meant is not clear")
            seen.add(name)
    return document


_DECODER = json.JSONDecoder(parse_constant=_reject_constant, object_pairs_hook=unique_fields)
_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)


def _decode(raw: bytes | None, max_bytes: int) -> dict[str, Any]:
    if raw is None:
        raise Malformed("empty message (no value)")
    if not raw.strip():
        raise Malformed(f"empty message ({len(raw)} bytes{', all blank' if raw else ''})")
    if len(raw) > max_bytes:
        raise Malformed(f"message of {len(raw)} bytes is over the size limit of {max_bytes} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Malformed(f"not UTF-8: {exc}") from None
    try:
        document = _DECODER.decode(text)
    except Malformed:
        raise
    except _NonFinite as exc:
        name = str(exc)
        raise Malformed(f"non-finite number {name}{_where_non_finite(text, name)} is not "
                        "allowed: JSON has no such number (where a value is missing, leave "
                        "the field out)") from None
    except json.JSONDecodeError as exc:
        if text.startswith("\ufeff"):
            raise Malformed("not JSON: the message starts with a byte-order mark (U+FEFF); "
                            "send UTF-8 JSON without it") from None
        raise Malformed(f"not JSON: {exc}") from None
    except ValueError as exc:  # e.g. an integer literal with too many digits
        if "digits" in str(exc):  # (Python's message advises a call the sender cannot make)
            raise Malformed("not usable JSON: an integer has more than "
                            f"{sys.get_int_max_str_digits()} digits") from None
        raise Malformed(f"not usable JSON: {exc}") from None
    except RecursionError:
        raise Malformed("not JSON: nested too deeply") from None
    if isinstance(document, str) and document.lstrip().startswith("{"):
        raise Malformed("a message must be a JSON object, got a JSON string holding one: the "
                        "message was encoded twice (send the object's JSON once)")
    if not isinstance(document, dict):
        raise Malformed(f"a message must be a JSON object, got {_as_json(document)}")
    return document


def _id(document: dict[str, Any]) -> Id:
    if "id" not in document:
        raise Malformed("missing 'id'")
    return message_id(document["id"])


def message_id(value: object) -> Id:
    """``value`` as a message's ``id``, or Malformed saying why it cannot be one: an integer
    of 64 bits or a non-empty text (the same text and the same integer are two ids).

    >>> message_id("007"), message_id(7)
    ('007', 7)
    """
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise Malformed(f"'id' must be a string or an integer, got {_as_json(value)}")
    if isinstance(value, int) and not -MAX_INT_ID - 1 <= value <= MAX_INT_ID:
        raise Malformed(f"integer 'id' {shown(value)} does not fit in 64 bits")
    if isinstance(value, str):
        if not 0 < len(value) <= MAX_ID_LENGTH:
            raise Malformed(f"string 'id' must have 1 to {MAX_ID_LENGTH} characters")
        _check_text("'id'", value)
    return value


@dataclass(frozen=True)
class Targets:
    """What a message's ``y`` may be, and how it maps to and from the model's labels.

    ``Targets()``: two classes, true/1 positive and false/0/-1 negative. ``Targets(classes=
    ("ham", "spam"))``: exactly those two JSON values (negative, positive), which the model
    learns and the outputs carry. ``Targets(regression=True)``: any finite number.
    Parsed labels are True/False (positive or not) or floats.

    >>> Targets(classes=("ham", "spam")).parse("spam"), Targets(regression=True).parse(2)
    (True, 2.0)
    """

    classes: tuple[Any, Any] | None = None
    regression: bool = False

    def parse(self, value: object) -> Target:
        """The label of a message's ``y``; :class:`Malformed` when it is not one."""
        if self.regression:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise Malformed(f"target {_as_json(value)} is not a number")
            try:
                number = float(value)
            except OverflowError:
                raise Malformed(f"target {shown(value)} is too large for a float") from None
            if math.isinf(number):  # (JSON has no infinity: a literal beyond float range)
                raise Malformed("target is too large for a float: its magnitude is beyond "
                                f"{sys.float_info.max:.3g}")
            if not math.isfinite(number):
                raise Malformed(f"target {_as_json(value)} is not finite")
            if abs(number) > MAX_TARGET:
                # Its squared error, summed into the progressive RMSE, would overflow.
                raise Malformed(f"target {shown(value)} is too large: |y| must be at most "
                                f"{MAX_TARGET:g}")
            return number
        if self.classes is not None:
            negative, positive = self.classes
            # Same JSON type and value: "1" is not 1, and true is not 1.
            if type(value) is type(positive) and value == positive:
                return True
            if type(value) is type(negative) and value == negative:
                return False
            raise Malformed(
                f"label {_as_json(value)} is not one of the classes "
                f"{_as_json(list(self.classes))} "
                "(model.classes: negative, positive)"
            )
        if isinstance(value, bool):
            return value
        if isinstance(value, float) and math.isinf(value):  # (1e400: JSON has no infinity)
            raise Malformed("label is too large for a float: its magnitude is beyond "
                            f"{sys.float_info.max:.3g}")
        # Integers are compared as integers: math.isfinite(10**400) raises OverflowError.
        if isinstance(value, int) and value in (1, 0, -1):
            return value == 1
        if isinstance(value, float) and value in (1.0, 0.0, -1.0):
            return value == 1.0
        hint = ""
        if isinstance(value, str):  # named classes ("ham"/"spam") need the setting
            hint = "; for labels such as this one set model.classes = [negative, positive]"
        elif isinstance(value, (int, float)):  # a quantity, to predict with a regressor
            hint = ("; to predict a number, use a regressor (model.type = \"IncrementalSVR\"), "
                    "or for two numbered classes set model.classes = [negative, positive]")
        raise Malformed(
            f"label {_as_json(value)} is not one of the two classes (true/1 positive, "
            f"false/0/-1 negative){hint}"
        )

    def model_label(self, y: Target) -> Any:
        """What the model learns for a parsed label: the class value, or the number."""
        if self.regression:
            return float(y)
        return bool(y) if self.classes is None else self.classes[int(bool(y))]

    def shown(self, y: Target) -> Any:
        """A parsed label or prediction as the outputs write it."""
        return self.model_label(y)


_BINARY = Targets()


class AnyLabel(Targets):
    """Any JSON value but null as a label, taken as it is: for a tool that sends messages
    (``stream-svm replay``) without knowing the classes or targets of the model that reads
    them, which judges the labels itself."""

    def parse(self, value: object) -> Target:
        return value  # type: ignore[return-value]


def targets_of(model: Any) -> Targets:
    """How the messages' labels read for this model: numbers for a River regressor, else two
    classes (the model's ``classes`` when it has them)."""
    from river import base as river_base

    if isinstance(model, river_base.Regressor):
        return Targets(regression=True)
    classes = getattr(model, "classes", None)
    return Targets(classes=tuple(classes) if classes is not None else None)


def _label(document: dict[str, Any], targets: Targets = _BINARY) -> Target:
    """The label of a message that is one (a late label, a relabel): null, which marks an
    unlabelled message that carries features, says nothing here."""
    if document["y"] is None:
        kind = "relabel" if document.get("op") == "relabel" else "label"
        raise Malformed(f"a {kind} needs a value for 'y', not null (null marks a message with "
                        "features as unlabelled)")
    return targets.parse(document["y"])


def _check_text(what: str, text: str) -> None:
    # A NUL ("\u0000") is valid JSON, but checkpoints keep text in numpy arrays, which drop
    # trailing NULs: "k\u0000" came back as "k", another point's id.
    if "\x00" in text:
        raise Malformed(f"{what} {text!r} contains a NUL character (U+0000)")
    # JSON may spell lone surrogates ("\ud800"): valid JSON, but not Unicode text, so they
    # could be neither a Kafka key nor a feature name written back as UTF-8.
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise Malformed(f"{what} {text!r} is not valid Unicode (lone surrogate)") from None


def _number(name: str, value: object) -> float:
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        if math.isinf(value):  # (JSON has no infinity: a literal beyond float range)
            raise Malformed(f"feature {name!r} is too large for a float: its magnitude is "
                            f"beyond {sys.float_info.max:.3g}")
    elif isinstance(value, int) and not isinstance(value, bool):
        try:
            return float(value)
        except OverflowError:
            raise Malformed(
                f"feature {name!r} is too large for a float: {shown(value)}"
            ) from None
    raise Malformed(
        f"feature {name!r} must be a finite number, got {_as_json(value)}"
    )


def features_of(document: dict[str, Any]) -> dict[str, float]:
    """The features (``x``) of a feature message, or Malformed naming what is wrong."""
    value = document["x"]
    if not isinstance(value, dict):
        raise Malformed(f"'x' must be an object of feature: number, got {_as_json(value)}")
    features: dict[str, float] = {}
    for name, number in value.items():
        _check_text("feature name", name)
        # Only JSON numbers: true/false/null are refused rather than read as 1/0/missing, so
        # that a producer's encoding slip is seen in the dead letters instead of being learned.
        features[name] = _number(name, number)
    return features


_FIELDS = {
    "observe": {"id", "x", "y"},
    "label": {"id", "y"},
    "forget": {"op", "id"},
    "relabel": {"op", "id", "y"},
}


_KIND_NAMES = {"observe": "a feature message", "label": "a label", "forget": "a forget",
               "relabel": "a relabel"}


def _check_fields(document: dict[str, Any], kind: str) -> None:
    # Refused rather than ignored: a misspelt field ("label" for "y") would otherwise turn a
    # labelled message into an unlabelled one without a word.
    unknown = set(document) - _FIELDS[kind]
    if unknown:
        allowed = ", ".join(repr(name) for name in sorted(_FIELDS[kind]))
        hint = ""
        if kind == "label" and document.get("op") in ("forget", "relabel"):
            hint = "; forgets and relabels go on the input topic"  # (read on the label topic)
        elif kind == "label" and "x" in unknown:  # (only the label topic reads 'x' as unknown)
            hint = "; feature messages go on the input topic"
        elif kind == "label" and any(isinstance(document[name], dict) for name in unknown):
            # (on the input topic, what has no 'x' is read as a label)
            hint = "; a feature message carries its features in 'x' ('id', 'x', 'y')"
        raise Malformed(f"unknown field(s) {', '.join(sorted(map(repr, unknown)))} in "
                        f"{_KIND_NAMES[kind]}, whose fields are {allowed}{hint}")


#: The largest |target| a regressor takes from a message: squares of errors of this size
#: stay finite when summed over 1e7 messages.
MAX_TARGET = 1e150


def parse_message(raw: bytes | None, max_bytes: int, targets: Targets = _BINARY) -> Operation:
    """Parse one message of the input topic: features (with or without a label), a late
    label (``{"id", "y"}``), or an ``op`` (``forget`` / ``relabel``); labels as ``targets``
    reads them. Raises :class:`Malformed`."""
    document = _decode(raw, max_bytes)
    if "op" in document:
        op = document["op"]
        if op == "forget":
            _check_fields(document, "forget")
            return Forget(_id(document))
        if op == "relabel":
            _check_fields(document, "relabel")
            if "y" not in document:
                raise Malformed("a relabel needs 'y'")
            return Relabel(_id(document), _label(document, targets))
        raise Malformed(f'unknown op {_as_json(op)} (known: "forget", "relabel")')
    if "x" not in document:
        if "y" in document:
            _check_fields(document, "label")
            return Label(_id(document), _label(document, targets))
        near = sorted(name for name in document
                      if name.lower() in ("x", "op") and name not in ("x", "op"))
        raise Malformed("missing 'x' (features) and 'op'" + (
            f" (found {', '.join(map(shown, near))}: field names are lower case)" if near
            else f" (its fields: {', '.join(map(shown, sorted(document)[:10]))})" if document
            else ""))
    _check_fields(document, "observe")
    identifier = _id(document)
    features = features_of(document)
    label = (_label(document, targets) if "y" in document and document["y"] is not None
             else None)
    return Observe(identifier, features, label)


def parse_label(raw: bytes | None, max_bytes: int, targets: Targets = _BINARY) -> Label:
    """Parse one message of the label topic (``{"id": ..., "y": ...}``)."""
    document = _decode(raw, max_bytes)
    _check_fields(document, "label")
    if "y" not in document:
        raise Malformed("a label message needs 'y'")
    return Label(_id(document), _label(document, targets))


def encode(record: dict[str, Any]) -> bytes:
    """Compact UTF-8 JSON."""
    return _ENCODER.encode(record).encode("utf-8")


def encode_key(identifier: Id | None) -> bytes | None:
    """The Kafka key of an output: the id as text (so an id keeps its partition)."""
    return None if identifier is None else str(identifier).encode("utf-8")


def dead_letter(
    error: str, raw: bytes | None, source: Source, max_bytes: int, reason: str = "malformed",
    fields: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The dead-letter record of a message: what is wrong (``error``, a sentence), the kind of
    problem (``reason``: malformed, unknown_id, duplicate_id, unsupported, unknown_feature,
    non_finite, refused, unreadable, internal),
    the original bytes, where it was read, and ``fields`` (the model that refused it).

    The bytes are kept as text when they are UTF-8, otherwise in base64, and cut short
    (``truncated`` true) so that the whole record, encoded, takes at most ``max_bytes`` bytes:
    JSON escapes a control character in 6 bytes, so 400 KB of them made a 2.4 MB dead letter
    that no broker accepted, and the stream stalled on it.

    >>> record = dead_letter("bad", b"\\x01" * 1000, Source("t", 0, 5), max_bytes=600)
    >>> len(encode(record)) <= 600, record["raw_encoding"], record["truncated"]
    (True, 'utf-8', True)
    """
    record: dict[str, Any] = {"error": _bounded_error(error, max_bytes), "reason": reason,
                              "source": source.as_dict(), **(fields or {})}
    data = b"" if raw is None else raw
    # What the record takes without the bytes, with room for the keys that carry them.
    budget = max(0, max_bytes - len(encode(record)) - _DEAD_LETTER_KEYS)
    cut = data[:budget]
    text = _utf8_prefix(cut, whole=len(cut) == len(data))
    if text is not None:
        text = _escaped_prefix(text, budget)
        record["raw"], record["raw_encoding"] = text, "utf-8"
        kept = len(text.encode("utf-8"))
    else:
        cut = data[: budget // 4 * 3]  # base64 writes 4 bytes per 3
        record["raw"] = base64.b64encode(cut).decode("ascii")
        record["raw_encoding"] = "base64"
        kept = len(cut)
    if kept < len(data):
        record["truncated"] = True
    return record


#: At most this many bytes of a dead letter's ``error`` (escaped as JSON), and a quarter of
#: the record's limit: an error naming a message's fields quotes them, and 420,000 non-breaking
#: spaces in one feature name (840 KB, under the limit) made an error of 2.1 MB that no broker
#: accepted, and the stream stalled on it at every restart.
MAX_ERROR_BYTES = 4096


def _bounded_error(error: str, max_bytes: int) -> str:
    """``error``, cut to what a dead letter of ``max_bytes`` leaves it, saying it was cut.

    >>> cut = _bounded_error("feature " + repr("\u00a0" * 5000) + " is not a number", 10**6)
    >>> len(cut) <= MAX_ERROR_BYTES, cut[-30:]
    (True, ' ... (20026 characters in all)')
    """
    limit = max(128, min(MAX_ERROR_BYTES, max_bytes // 4))
    if len(error) <= limit // 6 or len(json.dumps(error)) - 2 <= limit:
        return error
    suffix = f" ... ({len(error)} characters in all)"
    return _escaped_prefix(error, limit - len(suffix)) + suffix


#: Bytes of a dead letter's keys for its payload: ,"raw":"", "raw_encoding":"base64" and
#: "truncated":true, with room to spare.
_DEAD_LETTER_KEYS = 64


def _escaped_prefix(text: str, budget: int) -> str:
    """The longest prefix of ``text`` whose JSON string form (escapes included, quotes not)
    takes at most ``budget`` bytes: a binary search, for the rare message that needs it."""
    if len(json.dumps(text)) - 2 <= budget:
        return text
    low, high = 0, min(len(text), budget)  # an escape never takes less than its character
    while low < high:
        middle = (low + high + 1) // 2
        if len(json.dumps(text[:middle])) - 2 <= budget:
            low = middle
        else:
            high = middle - 1
    return text[:low]


def _utf8_prefix(data: bytes, whole: bool) -> str | None:
    """``data`` as text, or None when it is not UTF-8. A prefix cut from longer bytes may end
    inside a character: up to three trailing bytes are dropped for that."""
    for end in range(len(data), max(len(data) - (1 if whole else 4), -1), -1):
        try:
            return data[:end].decode("utf-8")
        except UnicodeDecodeError:
            continue
    return None
