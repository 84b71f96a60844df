"""The bound on how far kafka-python may inflate a compressed record batch (connectors.inflate):
within it, the bytes of kafka-python's own decoders; one byte past it, InflateLimitError."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from connectors import inflate

kafka_codec = pytest.importorskip("kafka.codec")

CODECS = ["gzip", "snappy", "lz4", "zstd"]


@pytest.fixture()
def originals() -> Iterator[dict]:
    """kafka-python's own decoders, and the default bound restored after the test."""
    inflate.limit_inflation(inflate.DEFAULT_LIMIT)
    yield kafka_codec._stream_svm_originals
    inflate.limit_inflation(inflate.DEFAULT_LIMIT)


def _encode(codec: str, data: bytes) -> bytes:
    return getattr(kafka_codec, f"{codec}_encode")(data)


@pytest.mark.parametrize("codec", CODECS)
def test_within_the_bound_the_bytes_are_kafka_pythons(originals, codec):
    for data in (b"a", os.urandom(70_000), b"x" * 2_000_000, os.urandom(40) * 30_000):
        payload = _encode(codec, data)
        assert getattr(kafka_codec, f"{codec}_decode")(payload) == data
        assert originals[f"{codec}_decode"](payload) == data


@pytest.mark.parametrize("codec", CODECS)
def test_one_byte_past_the_bound_is_refused(originals, codec):
    import kafka.record.default_records as records

    inflate.limit_inflation(100_000)
    decode = getattr(records, f"{codec}_decode")  # what the client's batches call
    assert decode(_encode(codec, b"y" * 100_000)) == b"y" * 100_000
    with pytest.raises(inflate.InflateLimitError, match=f"a {codec} record batch inflates "
                       "beyond 100000 bytes"):
        decode(_encode(codec, b"y" * 100_001))


def test_snappy_blocks_are_counted_together_and_raw_snappy_too(originals):
    # kafka-python's snappy is framed in blocks of 32 KB: the bound holds for their sum.
    inflate.limit_inflation(100_000)
    framed = kafka_codec.snappy_encode(b"z" * 100_001, xerial_blocksize=32 * 1024)
    raw = kafka_codec.snappy_encode(b"z" * 100_001, xerial_compatible=False)
    for payload in (framed, raw):
        with pytest.raises(inflate.InflateLimitError):
            kafka_codec.snappy_decode(payload)


def test_a_damaged_lz4_frame_is_an_error_not_short_bytes(originals):
    payload = _encode("lz4", os.urandom(50_000))
    with pytest.raises(RuntimeError, match="ends early"):
        kafka_codec.lz4_decode(payload[:-100])


@pytest.mark.parametrize("bound", [0, -1, 1.5, True, "1000"])
def test_the_bound_must_be_a_positive_int(originals, bound):
    with pytest.raises(ValueError, match="positive int"):
        inflate.limit_inflation(bound)
