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
from dataclasses import dataclass
from typing import Any

__all__ = [
    "MAX_INT_ID",
    "Forget",
    "Label",
    "Malformed",
    "Observe",
    "Relabel",
    "Source",
    "dead_letter",
    "encode",
    "parse_label",
    "parse_message",
]

#: Integer ids must fit in a signed 64-bit integer (they are checkpointed as numpy arrays).
MAX_INT_ID = 2**63 - 1
MAX_ID_LENGTH = 1024

Id = str | int


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


@dataclass(frozen=True)
class Observe:
    """Features to predict; with a label, learned afterwards (test-then-train)."""

    id: Id
    x: dict[str, float]
    y: bool | None = None


@dataclass(frozen=True)
class Label:
    """A label that arrives after its features (joined by id to the cache)."""

    id: Id
    y: bool


@dataclass(frozen=True)
class Forget:
    """Exact removal of the point learned under ``id``."""

    id: Id


@dataclass(frozen=True)
class Relabel:
    """Forget the point learned under ``id`` and learn it again with label ``y``."""

    id: Id
    y: bool


Operation = Observe | Label | Forget | Relabel


def _reject_constant(name: str) -> float:
    raise Malformed(f"non-finite number {name} is not allowed")


def _decode(raw: bytes | None, max_bytes: int) -> dict[str, Any]:
    if raw is None:
        raise Malformed("empty message (no value)")
    if len(raw) > max_bytes:
        raise Malformed(f"message of {len(raw)} bytes is over the size limit of {max_bytes} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Malformed(f"not UTF-8: {exc}") from None
    try:
        document = json.loads(text, parse_constant=_reject_constant)
    except Malformed:
        raise
    except json.JSONDecodeError as exc:
        raise Malformed(f"not JSON: {exc}") from None
    except ValueError as exc:  # e.g. an integer literal with too many digits
        raise Malformed(f"not usable JSON: {exc}") from None
    except RecursionError:
        raise Malformed("not JSON: nested too deeply") from None
    if not isinstance(document, dict):
        raise Malformed(f"a message must be a JSON object, got {type(document).__name__}")
    return document


def _id(document: dict[str, Any]) -> Id:
    if "id" not in document:
        raise Malformed("missing 'id'")
    value = document["id"]
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise Malformed(f"'id' must be a string or an integer, got {value!r}")
    if isinstance(value, int) and not -MAX_INT_ID <= value <= MAX_INT_ID:
        raise Malformed(f"integer 'id' {value} does not fit in 64 bits")
    if isinstance(value, str) and not 0 < len(value) <= MAX_ID_LENGTH:
        raise Malformed(f"string 'id' must have 1 to {MAX_ID_LENGTH} characters")
    return value


def _label(document: dict[str, Any]) -> bool:
    value = document["y"]
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and math.isfinite(value):
        if value == 1:
            return True
        if value in (0, -1):
            return False
    raise Malformed(
        f"label {value!r} is not one of the two classes (true/1 positive, false/0/-1 negative)"
    )


def _features(document: dict[str, Any]) -> dict[str, float]:
    value = document["x"]
    if not isinstance(value, dict):
        raise Malformed(f"'x' must be an object of feature: number, got {type(value).__name__}")
    features: dict[str, float] = {}
    for name, number in value.items():
        if number is None:  # a missing value, as River reads it
            continue
        if isinstance(number, bool):
            features[name] = float(number)
            continue
        if not isinstance(number, (int, float)) or not math.isfinite(number):
            raise Malformed(
                f"feature {name!r} must be a finite number, got {number!r} "
                f"({type(number).__name__})"
            )
        try:
            features[name] = float(number)
        except OverflowError:
            raise Malformed(f"feature {name!r} is too large: {number}") from None
    return features


_FIELDS = {
    "observe": {"id", "x", "y"},
    "label": {"id", "y"},
    "forget": {"op", "id"},
    "relabel": {"op", "id", "y"},
}


def _check_fields(document: dict[str, Any], kind: str) -> None:
    unknown = set(document) - _FIELDS[kind]
    if unknown:
        raise Malformed(f"unknown field(s) {', '.join(sorted(map(repr, unknown)))} in a {kind}")


def parse_message(raw: bytes | None, max_bytes: int) -> Operation:
    """Parse one message of the input topic: features (with or without a label), a late
    label (``{"id", "y"}``), or an ``op`` (``forget`` / ``relabel``). Raises :class:`Malformed`."""
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
            return Relabel(_id(document), _label(document))
        raise Malformed(f"unknown op {op!r} (known: 'forget', 'relabel')")
    if "x" not in document:
        if "y" in document:
            _check_fields(document, "label")
            return Label(_id(document), _label(document))
        raise Malformed("missing 'x' (features) and 'op'")
    _check_fields(document, "observe")
    identifier = _id(document)
    features = _features(document)
    label = _label(document) if "y" in document and document["y"] is not None else None
    return Observe(identifier, features, label)


def parse_label(raw: bytes | None, max_bytes: int) -> Label:
    """Parse one message of the label topic (``{"id": ..., "y": ...}``)."""
    document = _decode(raw, max_bytes)
    _check_fields(document, "label")
    if "y" not in document:
        raise Malformed("a label message needs 'y'")
    return Label(_id(document), _label(document))


def encode(record: dict[str, Any]) -> bytes:
    """Compact UTF-8 JSON."""
    return json.dumps(record, separators=(",", ":"), allow_nan=False).encode("utf-8")


def encode_key(identifier: Id | None) -> bytes | None:
    """The Kafka key of an output: the id as text (so an id keeps its partition)."""
    return None if identifier is None else str(identifier).encode("utf-8")


def dead_letter(reason: str, raw: bytes | None, source: Source, max_bytes: int) -> dict[str, Any]:
    """The dead-letter record of a message: the reason, the original bytes (as text when they
    are UTF-8, otherwise base64; cut to ``max_bytes``) and where it was read."""
    record: dict[str, Any] = {"error": reason, "source": source.as_dict()}
    data = b"" if raw is None else raw
    if len(data) > max_bytes:
        data = data[:max_bytes]
        record["truncated"] = True
    try:
        record["raw"] = data.decode("utf-8")
        record["raw_encoding"] = "utf-8"
    except UnicodeDecodeError:
        record["raw"] = base64.b64encode(data).decode("ascii")
        record["raw_encoding"] = "base64"
    return record
