"""A bound on the bytes a compressed Kafka record batch may inflate to in the daemon's client.

kafka-python inflates a compressed record batch whole, into memory, whatever its size: 12.8 KB
of zstd inflates to 400 MB, 800 MB of zeros gzip to 0.8 MB, and one fetch holds many batches.
A producer's batch of that kind (a bug, or on purpose) would have the daemon run out of memory,
or be killed by the system, at every start. With the bound in place a batch that inflates
beyond it raises :class:`InflateLimitError` in the client, and the daemon dead-letters its
records as ``unreadable`` (``kafka.max_inflated_batch_bytes`` sets the bound).

kafka-python's decoders are module-level functions shared by every client of the process, so
the bound is the process's: :func:`limit_inflation` sets it (the latest call holds) and
installs decoders that stop reading one byte past it. They give the same bytes as kafka-python's
own for every batch within the bound.

>>> limit_inflation(1_000)
>>> import gzip
>>> len(_gzip_decode(gzip.compress(b"x" * 1_000)))
1000
>>> try:
...     _gzip_decode(gzip.compress(b"x" * 1_001))
... except InflateLimitError as error:
...     print(error)
a gzip record batch inflates beyond 1000 bytes (kafka.max_inflated_batch_bytes)
>>> limit_inflation(DEFAULT_LIMIT)
"""

from __future__ import annotations

import gzip
import io
import struct
from collections.abc import Callable
from typing import Any

#: What kafka.max_inflated_batch_bytes is by default: far above what a producer's batch of
#: real messages inflates to (its batch.size is 16 KB to 1 MB compressed).
DEFAULT_LIMIT = 256 * 1024 * 1024

_limit = DEFAULT_LIMIT
_CHUNK = 1 << 20


class InflateLimitError(ValueError):
    """A compressed record batch inflates beyond the bound of :func:`limit_inflation`."""


def _too_large(codec: str, limit: int) -> InflateLimitError:
    return InflateLimitError(f"a {codec} record batch inflates beyond {limit} bytes "
                             "(kafka.max_inflated_batch_bytes)")


def _read_bounded(read: Callable[[int], bytes], codec: str, limit: int) -> bytes:
    """All ``read`` gives (a stream's read), refused one byte past ``limit``."""
    parts, total = [], 0
    while True:
        part = read(min(_CHUNK, limit + 1 - total))
        if not part:
            return b"".join(parts)
        parts.append(part)
        total += len(part)
        if total > limit:
            raise _too_large(codec, limit)


def _gzip_decode(payload: Any) -> bytes:
    limit = _limit  # (one bound for the whole batch, whatever a later call sets)
    with gzip.GzipFile(fileobj=io.BytesIO(payload), mode="rb") as stream:
        return _read_bounded(stream.read, "gzip", limit)


def _zstd_decode(payload: Any) -> bytes:
    import zstandard

    limit = _limit
    with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(payload),
                                                    read_across_frames=True) as stream:
        return _read_bounded(stream.read, "zstd", limit)


def _lz4_decode(payload: Any) -> bytes:
    """As ``lz4.frame.decompress``, kafka-python's decoder: the first frame, what follows it
    ignored, an incomplete one refused (RuntimeError)."""
    import lz4.frame

    limit, data = _limit, bytes(payload)
    if not data:
        return lz4.frame.decompress(data)  # (its own error for no frame at all)
    frame = lz4.frame.LZ4FrameDecompressor()
    inflated = frame.decompress(data, max_length=limit + 1)
    if len(inflated) > limit:
        raise _too_large("lz4", limit)
    if not frame.eof:
        raise RuntimeError("Frame incomplete: the lz4 batch ends within its frame")
    return inflated


def _varint(data: bytes, at: int) -> int:
    """The unsigned varint at ``at`` (snappy's length of a block inflated)."""
    value, shift = 0, 0
    while at < len(data) and shift < 64:
        byte = data[at]
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value
        at, shift = at + 1, shift + 7
    raise ValueError("a snappy block's length cannot be read: the batch is damaged")


def _snappy_inflated(payload: bytes) -> int:
    """The bytes a snappy payload says it inflates to (each block opens with its length, which
    the decoder holds it to), as kafka-python reads it: raw, or xerial-framed blocks."""
    from kafka.codec import _detect_xerial_stream

    if not _detect_xerial_stream(payload):
        return _varint(payload, 0)
    total, at = 0, 16
    while at + 4 <= len(payload):
        (size,) = struct.unpack_from("!i", payload, at)
        total += _varint(payload, at + 4)
        at += 4 + max(size, 0)
    return total


def _bounded_snappy(decode: Callable[[bytes], bytes]) -> Callable[[bytes], bytes]:
    def snappy_decode(payload: Any) -> bytes:
        limit = _limit
        try:
            inflated = _snappy_inflated(bytes(payload))
        except ValueError:  # (a length that cannot be read: the decoder says what is wrong)
            inflated = 0
        if inflated > limit:
            raise _too_large("snappy", limit)
        return decode(payload)

    return snappy_decode


def limit_inflation(limit: int) -> None:
    """Have every kafka-python client of the process refuse to inflate a compressed record
    batch beyond ``limit`` bytes (:class:`InflateLimitError`). A codec kafka-python reads with
    a module other than the ones the ``kafka`` extra installs is left as it is."""
    global _limit
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise ValueError(f"the bound on an inflated batch must be a positive int, not {limit!r}")
    _limit = limit
    import kafka.codec as codec
    import kafka.record.default_records as default_records
    import kafka.record.legacy_records as legacy_records

    original = getattr(codec, "_stream_svm_originals", None)
    if original is None:
        original = {name: getattr(codec, name) for name in
                    ("gzip_decode", "snappy_decode", "lz4_decode", "zstd_decode")}
        codec._stream_svm_originals = original  # type: ignore[attr-defined]
    bounded = {"gzip_decode": _gzip_decode,
               "snappy_decode": _bounded_snappy(original["snappy_decode"])}
    if codec.zstd is not None:
        bounded["zstd_decode"] = _zstd_decode
    lz4_frame = getattr(codec, "lz4", None)
    if lz4_frame is not None and original["lz4_decode"] is getattr(lz4_frame, "decompress", None):
        bounded["lz4_decode"] = _lz4_decode
    # codec's own functions too: the legacy format's lz4 decoder calls codec.lz4_decode.
    for module in (codec, default_records, legacy_records):
        for name, decode in bounded.items():
            if hasattr(module, name):
                setattr(module, name, decode)
