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


def test_lz4_reads_as_kafka_pythons_decoder_does(originals):
    # The first frame only, what follows it ignored; an incomplete frame or none refused.
    frame = _encode("lz4", os.urandom(5_000))
    decode, original = kafka_codec.lz4_decode, originals["lz4_decode"]
    for payload in (frame + b"\0" * 8, frame + b"garbage!", frame + frame):
        assert decode(payload) == original(payload)
    for payload in (frame[:-100], b""):
        with pytest.raises(RuntimeError):
            original(payload)
        with pytest.raises(RuntimeError):
            decode(payload)


def test_a_bound_set_while_a_batch_inflates_does_not_change_its_bound(originals, monkeypatch):
    # Read again at every chunk, a bound lowered meanwhile made gzip read with no bound at all.
    import gzip

    inflate.limit_inflation(3_000_000)
    monkeypatch.setattr(inflate, "_CHUNK", 1_000_000)
    stream_read = gzip.GzipFile.read

    def read_and_lower(self, size=-1):
        inflate.limit_inflation(10)
        return stream_read(self, size)

    monkeypatch.setattr(gzip.GzipFile, "read", read_and_lower)
    assert len(kafka_codec.gzip_decode(gzip.compress(b"q" * 2_500_000))) == 2_500_000


@pytest.mark.parametrize("bound", [0, -1, 1.5, True, "1000"])
def test_the_bound_must_be_a_positive_int(originals, bound):
    with pytest.raises(ValueError, match="positive int"):
        inflate.limit_inflation(bound)
