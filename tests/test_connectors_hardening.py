"""Hardening of the daemon without a broker: poison messages, the parser under random input,
the processor's one-outcome-per-message rule, the bounded unlabelled cache, the checkpoint
loader against crafted files, the lock, and the refusals to start a new model silently.

The same failures through a real daemon on the embedded broker are in
test_connectors_hardening_broker.py."""

from __future__ import annotations

import io
import json
import logging
import math
import os
import shutil
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from connectors.cache import UnlabelledCache
from connectors.checkpoint import (
    VERSION,
    CheckpointError,
    CheckpointFromNewerVersion,
    CheckpointMismatch,
    CheckpointStore,
)
from connectors.config import load_config
from connectors.daemon import Daemon, DaemonError, StartRefused, _locked
from connectors.messages import (
    Forget,
    Label,
    Malformed,
    Observe,
    Relabel,
    encode_key,
    parse_label,
    parse_message,
)
from connectors.metrics import Metrics
from connectors.models import build_model
from connectors.processor import Processor, Record
from stream_svm import ConvergenceError, IncrementalSVC

HUGE = "1" + "0" * 400  # an integer literal no float can hold


def _record(offset: int, value: bytes | dict, topic: str = "in") -> Record:
    raw = value if isinstance(value, bytes) else json.dumps(value).encode()
    return Record(topic, 0, offset, raw, 1_000 + offset)


def _strict_json(data: bytes) -> Any:
    def refuse(name: str) -> None:
        raise AssertionError(f"non-finite number {name} written")

    return json.loads(data.decode("utf-8"), parse_constant=refuse)


def _trained(kernel: str = "rbf") -> IncrementalSVC:
    model = IncrementalSVC(C=1.0, kernel=kernel, gamma=0.5)
    model.learn_one({"a": 1.0}, True, key="s1")
    model.learn_one({"a": -1.0}, False, key="s2")
    return model


# -- the parser under random input ------------------------------------------------------------

_surrogates = st.text(st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), min_size=1,
                      max_size=3)
_texts = st.one_of(st.text(max_size=12), _surrogates, st.builds(lambda a, b: a + b,
                                                                 st.text(max_size=4), _surrogates))
_numbers = st.one_of(
    st.integers(), st.integers(min_value=10**300, max_value=10**400).map(lambda v: v * -1
                                                                         if v % 2 else v),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0, 1, -1, 1.0, 0.0, 2]),
)
_scalars = st.one_of(st.none(), st.booleans(), _numbers, _texts)
_json = st.recursive(_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(_texts, inner, max_size=4)), max_leaves=12)
_messages = st.dictionaries(
    st.sampled_from(["id", "x", "y", "op", "extra"]),
    st.one_of(_json, st.dictionaries(_texts, _scalars, max_size=6),
              st.sampled_from(["forget", "relabel", "observe"])),
    max_size=5,
)


def _check_operation(operation: Any) -> None:
    """What the processor relies on in a parsed message."""
    assert isinstance(operation, (Observe, Label, Forget, Relabel))
    encode_key(operation.id)  # the id becomes a UTF-8 Kafka key
    if isinstance(operation, Observe):
        for name, value in operation.x.items():
            name.encode("utf-8")
            assert type(value) is float and math.isfinite(value)
        assert operation.y is None or type(operation.y) is bool
    if isinstance(operation, (Label, Relabel)):
        assert type(operation.y) is bool


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.binary(max_size=200), _messages.map(lambda d: json.dumps(d).encode()),
                 _json.map(lambda d: json.dumps(d).encode())))
def test_the_parser_returns_a_message_or_raises_malformed_only(raw):
    for parse in (parse_message, parse_label):
        try:
            operation = parse(raw, 10_000)
        except Malformed as exc:
            assert str(exc)  # the dead-letter reason
        else:
            _check_operation(operation)


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (f'{{"id": 6, "x": {{"a": {HUGE}}}}}', "too large for a float"),
        (f'{{"id": 6, "x": {{"a": -{HUGE}}}, "y": true}}', "too large for a float"),
        (f'{{"id": 7, "x": {{"a": 1.0}}, "y": {HUGE}}}', "not one of the two classes"),
        (f'{{"id": 7, "y": {HUGE}}}', "not one of the two classes"),
        (f'{{"op": "relabel", "id": 7, "y": {HUGE}}}', "not one of the two classes"),
        ('{"id": "\\ud800", "x": {"a": 1.0}}', "not valid Unicode"),
        ('{"op": "forget", "id": "a\\udfff"}', "not valid Unicode"),
        ('{"id": 1, "x": {"\\ud83d": 1.0}}', "not valid Unicode"),
        # Checkpoints keep text in numpy arrays, which drop trailing NULs ("k" came back).
        ('{"id": "k\\u0000", "x": {"a": 1.0}}', "contains a NUL character"),
        ('{"op": "forget", "id": "k\\u0000"}', "contains a NUL character"),
        ('{"id": 1, "x": {"b\\u0000": 1.0}}', "contains a NUL character"),
    ],
)
def test_poison_values_are_malformed_with_a_readable_reason(raw, reason):
    with pytest.raises(Malformed, match=reason) as caught:
        parse_message(raw.encode(), 10_000)
    assert len(str(caught.value)) < 300  # a 400-digit literal is cut, not copied


def test_integer_ids_are_exactly_the_64_bit_range():
    for value in (-(2**63), 2**63 - 1):
        assert parse_message(f'{{"id": {value}, "x": {{"a": 1.0}}}}'.encode(), 10_000).id == value
    for value in (-(2**63) - 1, 2**63):
        with pytest.raises(Malformed, match="does not fit in 64 bits"):
            parse_message(f'{{"id": {value}, "x": {{"a": 1.0}}}}'.encode(), 10_000)


# -- the processor: one outcome per message, whatever happens ---------------------------------


def _outcomes(result) -> int:
    return len(result.outputs) + len(result.dead_letters)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(
    st.binary(max_size=60),
    _messages.map(lambda d: json.dumps(d).encode()),
    st.builds(lambda i, a, y: json.dumps({"id": i, "x": {"a": a}, "y": y}).encode(),
              st.integers(0, 8), st.floats(-3, 3), st.booleans()),
    st.builds(lambda i: json.dumps({"op": "forget", "id": i}).encode(), st.integers(0, 8)),
    st.builds(lambda i, y: json.dumps({"op": "relabel", "id": i, "y": y}).encode(),
              st.integers(0, 8), st.booleans()),
    st.builds(lambda i, y: json.dumps({"id": i, "y": y}).encode(), st.integers(0, 8),
              st.booleans()),
), min_size=1, max_size=25))
def test_every_record_gets_exactly_one_encoded_outcome(values):
    processor = Processor(_trained("poly"), metrics=Metrics())
    result = processor.process([_record(i, raw) for i, raw in enumerate(values)])
    assert _outcomes(result) == len(values)
    for produced in result.outputs + result.dead_letters:
        assert _strict_json(produced.value) == produced.record
    assert processor.offsets == {"in:0": len(values)}


def test_a_finite_input_whose_score_is_not_finite_is_dead_lettered():
    processor = Processor(_trained("poly"))
    before = processor.model.n_stored
    result = processor.process([
        _record(0, {"id": 1, "x": {"a": 0.5}, "y": True}),
        _record(1, b'{"id": 9, "x": {"a": 1e300}, "y": true}'),
        _record(2, b'{"id": 10, "x": {"a": 1e300}}'),
        _record(3, {"id": 2, "x": {"a": -0.5}, "y": False}),
    ])
    assert [o.record["id"] for o in result.outputs] == [1, 2]
    assert [d.record["reason"] for d in result.dead_letters] == ["non_finite", "non_finite"]
    assert "not finite" in result.dead_letters[0].record["error"]
    for produced in result.outputs + result.dead_letters:
        _strict_json(produced.value)
    assert processor.model.n_stored == before + 2 and 9 not in processor.model
    assert 10 not in processor.cache


@pytest.mark.parametrize("document", [
    {"id": 1, "x": {"\u00a0" * 150_000: "n/a"}},  # the name is quoted, each space as \xa0
    {"id": 2, "x": {"a": 1.0}, "\u200b" * 150_000: 1},  # an unknown field, named
    {"id": 3, "x": {"a": 1.0}, **{f"field{i}\u200b": 1 for i in range(20_000)}},  # all named
])
def test_a_dead_letter_quoting_a_huge_message_fits_the_size_limit(document):
    # The error named the message's fields in full: a message under the limit made a dead
    # letter over the producer's limit, which was retried for ever, and the stream stalled.
    processor = Processor(_trained())
    raw = json.dumps(document, ensure_ascii=False).encode()
    assert len(raw) <= processor.max_message_bytes
    result = processor.process([_record(0, raw), _record(1, {"id": 9, "x": {"a": 0.2}})])
    (letter,) = result.dead_letters
    assert len(letter.value) <= processor.max_message_bytes
    error = letter.record["error"]
    assert len(error.encode()) <= 4096 and error.endswith(" characters in all)")
    assert [o.record["id"] for o in result.outputs] == [9]


def test_forget_and_relabel_refused_by_the_model_are_dead_letters(monkeypatch):
    processor = Processor(_trained())
    processor.process([_record(0, {"id": "p", "x": {"a": 0.3}, "y": True})])

    def refuse(*args, **kwargs):
        raise ConvergenceError("update stopped after 5 steps; the model is unchanged")

    monkeypatch.setattr(processor.model, "forget_one", refuse)
    monkeypatch.setattr(processor.model, "relabel_one", refuse)
    result = processor.process([
        _record(1, {"op": "forget", "id": "p"}),
        _record(2, {"op": "relabel", "id": "p", "y": False}),
        _record(3, {"id": "q", "x": {"a": 0.9}, "y": True}),
    ])
    assert [d.record["reason"] for d in result.dead_letters] == ["refused", "refused"]
    assert "ConvergenceError" in result.dead_letters[0].record["error"]
    assert [o.record["id"] for o in result.outputs] == ["q"]
    assert "p" in processor.model and "q" in processor.model
    assert processor.offsets == {"in:0": 4}
    assert processor.model.stored_point("p") == ({"a": 0.3}, True)


def test_an_unexpected_exception_dead_letters_only_its_message(monkeypatch):
    processor = Processor(_trained(), metrics=Metrics())
    learn_one = processor.model.learn_one

    def broken(x, y, key=None):
        if key == "bad":
            raise ZeroDivisionError("a bug in the model")
        return learn_one(x, y, key=key)

    monkeypatch.setattr(processor.model, "learn_one", broken)
    monkeypatch.setattr(processor.model, "learn_many", None)  # one point at a time
    result = processor.process([
        _record(0, {"id": "ok1", "x": {"a": 0.1}, "y": True}),
        _record(1, {"id": "bad", "x": {"a": 0.2}, "y": True}),
        _record(2, {"id": "ok2", "x": {"a": 0.3}, "y": False}),
    ])
    assert [o.record["id"] for o in result.outputs] == ["ok1", "ok2"]
    (letter,) = result.dead_letters
    assert letter.record["reason"] == "internal"
    assert "ZeroDivisionError: a bug in the model" in letter.record["error"]
    assert "bad" not in processor.model and "ok2" in processor.model
    assert b'reason="internal"' in processor.metrics.render()


def test_a_refused_late_label_keeps_the_features_cached(monkeypatch):
    processor = Processor(_trained())
    processor.process([_record(0, {"id": "u", "x": {"a": 0.4}})])

    def refuse(x, y, key=None):
        raise ValueError("too many features")

    monkeypatch.setattr(processor.model, "learn_one", refuse)
    result = processor.process([_record(1, {"id": "u", "y": True})])
    assert result.dead_letters[0].record["reason"] == "refused"
    assert processor.cache.get("u").x == {"a": 0.4}  # a corrected label can come again


def test_a_label_polled_before_its_features_finds_them():
    # A poll lists the two topics' records in whatever order their fetches completed: the
    # features of one poll go first, so a label sent right after them is not dead-lettered.
    processor = Processor(_trained(), label_topic="labels")
    result = processor.process([
        _record(0, {"id": "u", "y": True}, topic="labels"),
        _record(0, {"id": "u", "x": {"a": 0.4}}),
        _record(1, {"id": "v", "x": {"a": -0.4}}),
        _record(1, {"id": "v", "y": False}, topic="labels"),
    ])
    assert result.dead_letters == []
    assert [(o.record["id"], o.record.get("op")) for o in result.outputs] == [
        ("u", None), ("v", None), ("u", "label"), ("v", "label")]
    assert "u" in processor.model and "v" in processor.model
    assert processor.offsets == {"in:0": 2, "labels:0": 2}


def test_a_label_read_polls_before_its_features_says_it_may_have_run_ahead():
    # After a backlog, a poll can hold the label topic's records and none of the input's:
    # the dead letter named only ids never seen, expired or labelled (and, scoped, a wrong
    # Kafka key), never that the label came first and can be sent again.
    processor = Processor(_trained(), label_topic="labels")
    result = processor.process([_record(0, {"id": "u", "y": True}, topic="labels")])
    [letter] = result.dead_letters
    assert letter.record["reason"] == "unknown_id"
    assert ("(never seen, expired, or already labelled; or not read yet: a label waits until "
            "the input topic is read up to its timestamp, so one stamped before its features "
            "(producers whose clocks differ) or whose input partition stopped moving for a "
            "minute can run ahead of them: send the label again from this dead letter)"
            ) in letter.record["error"]
    result = processor.process([_record(1, {"id": "w", "y": True})])  # (on the input topic)
    assert "run ahead" not in result.dead_letters[0].record["error"]


def test_a_forget_erases_features_waiting_for_their_label():
    processor = Processor(_trained(), label_topic="labels")
    processor.process([_record(0, {"id": "u", "x": {"a": 0.4}}),
                       _record(1, {"op": "forget", "id": "u"})])
    assert "u" not in processor.cache
    result = processor.process([_record(0, {"id": "u", "y": True}, topic="labels")])
    assert result.dead_letters[0].record["reason"] == "unknown_id"  # nothing left to learn
    assert "u" not in processor.model


def test_a_forget_acknowledges_erased_unlabelled_features():
    processor = Processor(_trained())
    result = processor.process([_record(0, {"id": "u", "x": {"a": 0.4}}),
                                _record(1, {"op": "forget", "id": "u"})])
    ack = result.outputs[1].record
    assert ack["op"] == "forget" and ack["ok"] is True and ack["was"] == "unlabelled"
    # A point learned and also cached under its id (an unlabelled resend) loses both.
    result = processor.process([_record(2, {"id": "s1", "x": {"a": 0.9}}),
                                _record(3, {"op": "forget", "id": "s1"})])
    assert "was" not in result.outputs[1].record
    assert "s1" not in processor.model and "s1" not in processor.cache


def test_a_forget_for_a_model_without_ids_erases_waiting_features_and_says_it_cannot_forget():
    from stream_svm import AlphaISVC

    processor = Processor(AlphaISVC(batch_size=2))
    result = processor.process([_record(0, {"id": "u", "x": {"a": 0.4}}),
                                _record(1, {"op": "forget", "id": "u"})])
    (letter,) = result.dead_letters
    assert letter.record["reason"] == "unsupported"
    assert letter.record["error"].endswith("its features waiting for a label were erased")
    assert "u" not in processor.cache


def test_the_embedded_broker_is_tied_to_its_owner_only_from_the_main_thread():
    # The signal follows the thread that starts the broker: one started from a helper thread
    # was stopped as soon as that thread ended.
    import sys
    import threading

    from connectors.broker import _stopped_with_parent

    command = ["tansu", "broker"]
    wrapped = _stopped_with_parent(command)
    if sys.platform.startswith("linux"):
        assert wrapped[0] == sys.executable and wrapped[-2:] == command
    seen = []
    helper = threading.Thread(target=lambda: seen.append(_stopped_with_parent(command)))
    helper.start()
    helper.join()
    assert seen == [command]


# -- the unlabelled cache ----------------------------------------------------------------------


def test_cache_bounds_in_entries_bytes_and_processing_time_oldest_first():
    cache = UnlabelledCache(max_entries=8, max_bytes=10_000, max_age_seconds=60)
    for i in range(10):
        cache.put(i, {"f": float(i), "g": 1.0}, prediction=bool(i % 2), now=float(i))
    assert list(cache) == list(range(2, 10)) and cache.evictions == {"entries": 2}
    cache.put(3, {"f": 3.5}, prediction=True, now=10.0)  # a re-put moves to the end
    assert list(cache) == [2, 4, 5, 6, 7, 8, 9, 3]

    cache = UnlabelledCache(max_entries=100, max_bytes=11_000, max_age_seconds=60)
    for i in range(10):
        cache.put(i, {"f": float(i), "g": 1.0}, prediction=bool(i % 2), now=float(i))
    # Wide points push the oldest ones out by the byte bound, never the newest.
    for j in range(4):
        cache.put(f"wide{j}", {f"w{j}_{i}": 1.0 for i in range(20)}, prediction=False,
                  now=11.0 + j)
        assert cache.bytes <= 11_000 and f"wide{j}" in cache
    assert cache.evictions["bytes"] >= 1 and set(cache.evictions) == {"bytes"}
    small = [i for i in cache if isinstance(i, int)]
    assert small and small == list(range(10 - len(small), 10))  # the oldest went first
    assert cache.expire(now=70.0) == {"age": len(small)}  # cached before t = 10
    assert list(cache) == [f"wide{j}" for j in range(4)]
    assert cache.pop("nope") is None and cache.pop("wide3").x["w3_0"] == 1.0
    # A stream of ever new feature names stays within the byte bound (dropped names go too).
    for j in range(300):
        cache.put(f"n{j}", {f"name{j}_{i}": 1.0 for i in range(5)}, prediction=True,
                  now=80.0)
        assert cache.bytes <= 11_000 and f"n{j}" in cache
    assert len(cache._names) < 2 * 11_000 / 100  # reclaimed, not only uncounted


def test_cache_arrays_round_trip_through_a_checkpoint(tmp_path):
    cache = UnlabelledCache(1000, 1 << 20, 3600)
    cache.put(1, {"a": 1.0, "b": -2.0}, True, 5.0)
    cache.put("s", {"é": 3.0}, False, 6.0)
    cache.put(2, {}, True, 7.0)
    cache.pop(1)
    store = CheckpointStore(tmp_path)
    store.save({"w": np.zeros(2)}, {}, {}, cache.to_arrays())
    loaded = store.load_latest()
    again = UnlabelledCache(1000, 1 << 20, 3600)
    again.load_arrays(loaded.cache_arrays, now=8.0)
    assert list(again) == ["s", 2]
    assert again.get("s") == cache.get("s") and again.get(2).x == {}
    with pytest.raises(ValueError, match="inconsistent"):
        broken = dict(loaded.cache_arrays)
        broken["indptr"] = broken["indptr"][:-1]
        again.load_arrays(broken, now=8.0)


def test_a_checkpoint_on_a_read_only_file_system_is_a_checkpoint_error(tmp_path,
                                                                       monkeypatch):
    # Remounted read-only (as ext4 does after an I/O error), the removal of the temporary
    # file failed too, and that error escaped: the daemon exited where it should log an
    # ERROR, keep the previous checkpoint and go on.
    import errno
    from pathlib import Path

    store = CheckpointStore(tmp_path)
    first = store.save({"w": np.zeros(2)}, {}, {})
    read_only = OSError(errno.EROFS, "Read-only file system")

    def refuse(*_: object, **__: object) -> None:
        raise read_only

    unlink = Path.unlink

    def unlink_refused(self: Path, missing_ok: bool = False) -> None:
        if self.name.endswith(".tmp"):
            raise read_only
        unlink(self, missing_ok=missing_ok)

    monkeypatch.setattr(os, "replace", refuse)
    monkeypatch.setattr(Path, "unlink", unlink_refused)
    with pytest.raises(CheckpointError, match="Read-only file system"):
        store.save({"w": np.ones(2)}, {}, {})
    monkeypatch.undo()
    assert [path for _, path in store.paths()] == [first]
    store.save({"w": np.ones(2)}, {}, {})  # writable again: the file left behind is removed
    assert not list(tmp_path.glob(".checkpoint-*.tmp"))


def test_a_restart_after_a_write_killed_midway_says_so(tmp_path, caplog):
    # A restart after a SIGKILL during a checkpoint write logged exactly as one after a clean
    # stop, though the temporary file it left showed the process had died.
    store = CheckpointStore(tmp_path)
    store.save({"w": np.zeros(2)}, {}, {})
    with caplog.at_level("WARNING"):
        assert store.load_latest() is not None
    assert "killed midway" not in caplog.text
    (tmp_path / ".checkpoint-000000000002.npz.4242.tmp").write_bytes(b"PK\x03")
    with caplog.at_level("WARNING"):
        assert store.load_latest() is not None
    assert (".checkpoint-000000000002.npz.4242.tmp left by a checkpoint write that was killed "
            "midway") in caplog.text
    store.save({"w": np.ones(2)}, {}, {})
    assert not list(tmp_path.glob(".checkpoint-*.tmp"))


def test_a_large_cache_is_many_times_smaller_in_a_checkpoint_than_json(tmp_path):
    """The cache no longer goes through JSON: its arrays are a small, fixed cost per feature
    (no wall-clock assertion: the size of what a checkpoint writes)."""
    cache = UnlabelledCache(100_000, 1 << 30, 3600)
    rng = np.random.default_rng(0)
    for i in range(20_000):
        cache.put(i, {f"feature_{j}": float(v) for j, v in enumerate(rng.normal(size=10))},
                  True, 0.0)
    arrays = cache.to_arrays()
    as_json = len(json.dumps([[i, cache.get(i).x, 0, True] for i in range(20_000)]))
    assert sum(a.nbytes for a in arrays.values()) < as_json / 2


# -- checkpoint files ----------------------------------------------------------------------


def _npy(header: dict[str, Any], data: bytes) -> bytes:
    text = repr(header).encode("latin1")
    text += b" " * ((64 - (10 + len(text) + 1) % 64) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(text).to_bytes(2, "little") + text + data


def _crafted(path: Path, members: dict[str, bytes], manifest: dict | None) -> Path:
    document = {"format": "stream-svm-checkpoint", "version": 2 if manifest is not None else 1,
                "sequence": 1, "model": {}, "state": {}}
    if manifest is not None:
        document["arrays"] = manifest
    meta = json.dumps(document).encode()
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("__meta__.npy", _npy(
            {"descr": "|u1", "fortran_order": False, "shape": (len(meta),)}, meta))
        for name, data in members.items():
            archive.writestr(f"{name}.npy", data)
    return path


@pytest.mark.parametrize("with_manifest", [True, False])
def test_a_header_claiming_a_huge_shape_is_refused_before_allocating(tmp_path, with_manifest):
    huge = 10**12
    member = _npy({"descr": "<f8", "fortran_order": False, "shape": (huge,)}, b"\x00" * 8)
    manifest = {"X": ["<f8", [huge]]} if with_manifest else None
    path = _crafted(tmp_path / "checkpoint-000000000001.npz", {"X": member}, manifest)
    with pytest.raises(CheckpointError, match="declares 8000000000000 bytes") as caught:
        CheckpointStore(tmp_path).read(path)
    assert "allow_pickle" not in str(caught.value)


def test_object_members_are_refused_without_mentioning_pickle(tmp_path):
    buffer = io.BytesIO()
    np.save(buffer, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    path = _crafted(tmp_path / "checkpoint-000000000001.npz", {"o": buffer.getvalue()},
                    {"o": ["|O", [1]]})
    with pytest.raises(CheckpointError, match="not a plain number or text type") as caught:
        CheckpointStore(tmp_path).read(path)
    assert "pickle" not in str(caught.value)


def test_only_the_members_asked_for_are_read_within_the_bounds(tmp_path):
    store = CheckpointStore(tmp_path)
    store.save({"alpha": np.ones(3), "X": np.zeros((3, 2))}, {}, {})
    ((_, path),) = store.paths()
    # A foreign member is never read, even when it would be unreadable.
    with zipfile.ZipFile(path, "a") as archive:
        archive.writestr("junk.npy", b"\x93NUMPY garbage")
    read: list[str] = []

    def check(name, dtype, shape):
        read.append(name)
        if name == "X" and shape[0] > 2:
            raise CheckpointError(f"member {name!r} holds {shape[0]} points, more than 2")

    assert store.read(path, members={"alpha"}, check=check).arrays.keys() == {"alpha"}
    assert read == ["alpha"]
    with pytest.raises(CheckpointError, match="more than 2"):
        store.read(path, check=check)
    with pytest.raises(CheckpointError, match="no member"):
        store.read(path, members={"beta"})


def test_checkpoints_are_private_files_in_a_private_directory(tmp_path):
    directory = tmp_path / "new"
    store = CheckpointStore(directory)
    path = store.save({"X": np.ones((2, 2))}, {}, {})
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert os.stat(directory).st_mode & 0o777 == 0o700


@pytest.mark.parametrize("array", [np.array([1 + 2j]), np.array([1], dtype="m8[s]"),
                                   np.zeros(1, dtype=[("a", "<f8")])],
                         ids=["complex", "timedelta", "structured"])
@pytest.mark.parametrize("as_cache", [False, True])
def test_arrays_of_a_kind_a_checkpoint_cannot_read_back_are_refused_on_save(tmp_path, array,
                                                                           as_cache):
    # Written, they would make every restart refuse the checkpoint the daemon had just called
    # good (the reader takes booleans, integers, floats and text only).
    store = CheckpointStore(tmp_path)
    arrays, cache = ({"w": np.zeros(2)}, {"odd": array}) if as_cache else ({"odd": array}, None)
    with pytest.raises(CheckpointError, match=r"'(cache\.)?odd' has dtype .*not plain"):
        store.save(arrays, {}, {}, cache)
    assert store.paths() == []


def test_metadata_that_is_not_strict_json_is_refused_on_save(tmp_path):
    # NaN would be written as the bare word NaN: no longer JSON that other readers (jq, a
    # dashboard) parse, and the restart would take the setting back as NaN.
    store = CheckpointStore(tmp_path)
    for meta, state in (({"C": math.nan}, {}), ({}, {"clock": math.inf})):
        with pytest.raises(CheckpointError, match="not JSON-serializable"):
            store.save({"w": np.zeros(2)}, meta, state)
    assert store.paths() == []


@pytest.mark.parametrize("name", ["__meta__", "cache.x", "file", "allow_pickle"])
def test_a_model_array_under_a_reserved_name_is_refused_on_save(tmp_path, name):
    # A model array named cache.x would come back as the unlabelled cache's member x, and be
    # missing from the model's arrays of the checkpoint it had just written; np.savez took
    # allow_pickle for its flag (a checkpoint saved that could not be read) and file for its
    # file (a bare TypeError, the temporary file left behind).
    store = CheckpointStore(tmp_path)
    with pytest.raises(CheckpointError, match=f"reserved name '{name}'"):
        store.save({name: np.zeros(2)}, {}, {})
    assert store.paths() == []


def test_a_fortran_ordered_array_round_trips_exactly(tmp_path):
    # Read back in C order, a transposed (Fortran-ordered) array would come back with its
    # values shuffled: a model restored from it would be another model.
    store = CheckpointStore(tmp_path)
    X = np.asfortranarray(np.arange(6.0).reshape(2, 3))
    codes = np.asfortranarray(np.array([["a", "bb"], ["ccc", "d"]]))
    store.save({"X": X, "codes": codes}, {}, {}, {"rows": X.T})
    loaded = store.load_latest()
    assert loaded.arrays["X"].tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    assert loaded.arrays["codes"].tolist() == [["a", "bb"], ["ccc", "d"]]
    assert loaded.cache_arrays["rows"].tolist() == X.T.tolist()


def test_keep_below_one_is_refused(tmp_path):
    # keep=0 must be refused: the store keeps the checkpoint it writes all the same.
    with pytest.raises(ValueError, match="keep must be >= 1, got 0"):
        CheckpointStore(tmp_path / "checkpoints", keep=0)
    assert not (tmp_path / "checkpoints").exists()


def test_a_checkpoint_is_fsynced_and_so_is_its_directory(tmp_path, monkeypatch):
    # Without the fsync of the file, a power cut after the rename could leave a checkpoint
    # of the right name and no data; without the directory's, the rename itself could be lost.
    synced: list[tuple[int, int]] = []
    fsync = os.fsync

    def recorded(descriptor: int) -> None:
        status = os.fstat(descriptor)
        synced.append((status.st_dev, status.st_ino))
        fsync(descriptor)

    monkeypatch.setattr(os, "fsync", recorded)
    path = CheckpointStore(tmp_path).save({"w": np.zeros(2)}, {}, {})
    monkeypatch.undo()
    identity = [(s.st_dev, s.st_ino) for s in (os.stat(path), os.stat(tmp_path))]
    assert synced == identity  # the file first, then the directory its new name is in


def test_a_failed_write_leaves_no_temporary_file(tmp_path, monkeypatch, caplog):
    # The half-written file (training data) must go with the failure: left, it would stay
    # until the next write, and a restart meanwhile would say a write was killed midway.
    import errno

    store = CheckpointStore(tmp_path)
    first = store.save({"w": np.zeros(2)}, {}, {})

    def failing(descriptor: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fsync", failing)
    with pytest.raises(CheckpointError, match="Input/output error"):
        store.save({"w": np.ones(2)}, {}, {})
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == [first.name]
    with caplog.at_level("WARNING"):
        assert store.load_latest().path == first
    assert "killed midway" not in caplog.text


def test_a_stale_longer_pid_in_the_lock_file_is_replaced_whole(tmp_path):
    # Written over the start of a longer pid left by an earlier daemon, the pid would be a
    # number no process has, and the busy message would name it.
    from connectors.checkpoint import DirectoryLock

    directory = tmp_path / "checkpoints"
    directory.mkdir()
    (directory / ".lock").write_text("9" * 30)
    lock = DirectoryLock(directory)
    lock.acquire()
    try:
        assert (directory / ".lock").read_text() == str(os.getpid())
        with pytest.raises(CheckpointError, match=rf"\(process {os.getpid()}, as its lock"):
            DirectoryLock(directory).acquire()
    finally:
        lock.release()


def _one_member(path: Path, descr: str, shape: tuple[int, ...], data: bytes,
                manifest: list) -> Path:
    member = _npy({"descr": descr, "fortran_order": False, "shape": shape}, data)
    return _crafted(path, {"X": member}, {"X": manifest})


@pytest.mark.parametrize("descr, shape, data, manifest, problem", [
    # complex, timedelta: kinds the model has no use for, whatever the manifest says
    ("<c16", (1,), b"\x00" * 16, ["<c16", [1]], "not a plain number or text type"),
    ("<m8[s]", (1,), b"\x00" * 8, ["<m8[s]", [1]], "not a plain number or text type"),
    # the header disagrees with the manifest written with it
    ("<i8", (2,), b"\x00" * 16, ["<f8", [2]], r"header says int64 \(2,\), the manifest <f8"),
    ("<f8", (2,), b"\x00" * 16, ["<f8", [1, 2]], r"header says float64 \(2,\), the manifest "
                                                 r"<f8 \(1, 2\)"),
], ids=["complex", "timedelta", "dtype", "shape"])
def test_a_member_unlike_what_its_checkpoint_declares_is_refused(tmp_path, descr, shape, data,
                                                                 manifest, problem):
    # Each must be refused before the model gets it: a damaged or crafted file would be
    # restored as good, integers taken for floats or a matrix for a vector.
    path = _one_member(tmp_path / "checkpoint-000000000001.npz", descr, shape, data, manifest)
    with pytest.raises(CheckpointError, match=problem):
        CheckpointStore(tmp_path).read(path)


@pytest.mark.parametrize("refusal", [CheckpointError, CheckpointMismatch])
def test_a_restore_that_refuses_a_checkpoint_is_not_taken_for_a_restore(tmp_path, refusal):
    # A restore that raises CheckpointError must not be ignored: load_latest would return
    # that checkpoint as restored, with no model in it, and the daemon go on with a new one.
    store = CheckpointStore(tmp_path)
    older = store.save({"w": np.zeros(2)}, {}, {})
    newer = store.save({"w": np.ones(2)}, {}, {})

    def restore(checkpoint):
        if checkpoint.path == newer:
            raise refusal(f"{checkpoint.path.name} is refused")
        return "model"

    before = sorted(p.name for p in tmp_path.iterdir())
    if refusal is CheckpointError:  # unusable: the older one is restored, the newer set aside
        loaded = store.load_latest(restore)
        assert loaded.path == older and loaded.restored == "model"
        assert [p.name.split(".unusable-")[0] for p in store.set_aside_paths()] == [newer.name]
    else:  # another configuration's (or a newer stream-svm's): stops, touching nothing
        with pytest.raises(refusal, match="is refused"):
            store.load_latest(restore)
        assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_when_no_checkpoint_is_usable_nothing_is_renamed(tmp_path):
    store = CheckpointStore(tmp_path)
    for i in range(2):
        store.save({"w": np.arange(i + 1.0)}, {}, {})
    for _, path in store.paths():
        path.write_bytes(path.read_bytes()[:100])
    before = sorted((p.name, p.read_bytes()) for p in tmp_path.iterdir())
    with pytest.raises(CheckpointError, match="no usable checkpoint"):
        store.load_latest()
    assert sorted((p.name, p.read_bytes()) for p in tmp_path.iterdir()) == before


def test_format_1_checkpoints_still_restore_with_their_json_cache(tmp_path):
    model = _trained()
    arrays, meta = model.to_checkpoint()
    state = {"model_settings": {}, "processor": {
        "offsets": {"in:0": 5}, "cache": [["u", {"a": 2.0}, 123, True]], "updates": 2}}
    document = {"format": "stream-svm-checkpoint", "version": 1, "sequence": 4, "model": meta,
                "state": state}
    path = tmp_path / "checkpoint-000000000004.npz"
    np.savez(path, **arrays, __meta__=np.frombuffer(json.dumps(document).encode(), np.uint8))
    loaded = CheckpointStore(tmp_path).load_latest()
    assert loaded.version == 1 and loaded.cache_arrays is None
    processor = Processor(IncrementalSVC.from_checkpoint(loaded.arrays, loaded.model_meta))
    processor.load_state(loaded.state["processor"], loaded.cache_arrays)
    assert processor.offsets == {"in:0": 5} and processor.cache.get("u").x == {"a": 2.0}


def test_a_symlinked_lock_is_not_followed(tmp_path):
    target = tmp_path / "precious.txt"
    target.write_text("keep me")
    directory = tmp_path / "checkpoints"
    directory.mkdir()
    (directory / ".lock").symlink_to(target)
    with pytest.raises(DaemonError, match="symbolic link"), _locked(directory):
        pass
    assert target.read_text() == "keep me"


def test_a_checkpoint_dir_that_is_a_file_is_named_as_the_setting(tmp_path):
    # It said "[Errno 17] File exists: 'afile'", naming neither the setting nor the problem.
    afile = tmp_path / "afile"
    afile.write_text("not a directory")
    for directory in (afile, afile / "below"):
        with pytest.raises(DaemonError, match=r"\(checkpoint\.dir, --checkpoint-dir\) is a "
                                              "file, or lies under one"), _locked(directory):
            pass
    assert afile.read_text() == "not a directory"


# -- no new model without the operator's say -------------------------------------------------


def _settings(tmp_path: Path, **extra: Any):
    return load_config(None, {
        "kafka.bootstrap_servers": "127.0.0.1:9",  # never reached: the refusals come first
        "kafka.input_topic": "in",  # the topic of _record's messages
        "checkpoint.dir": str(tmp_path / "checkpoints"),
        "metrics.enabled": False,
        "retry.max_attempts": 1,
        "kafka.request_timeout_ms": 200,
        **extra,
    }, environ={})


def _checkpoint_a_model(config, also_read: dict[str, int] | None = None) -> Path:
    """A checkpoint of a model that read 12 messages of "in" (and the partitions
    ``also_read`` names up to their offsets)."""
    daemon = Daemon(config)
    daemon._store = CheckpointStore(config.checkpoint.dir)
    daemon.processor = daemon._new_processor(build_model(config))
    daemon.processor.process([_record(i, {"id": i, "x": {"a": i / 10}, "y": i % 2 == 0})
                              for i in range(12)])
    daemon.processor.offsets.update(also_read or {})
    daemon._since_checkpoint = 12
    daemon.checkpoint()
    return Path(config.checkpoint.dir)


def _files(directory: Path) -> list[tuple[str, bytes]]:
    return sorted((p.name, p.read_bytes()) for p in directory.iterdir() if p.name != ".lock")


def _keyed_model_and_cache(config) -> Daemon:
    daemon = Daemon(config)
    daemon._store = CheckpointStore(config.checkpoint.dir)
    daemon.processor = daemon._new_processor(build_model(config))
    daemon.processor.process(
        [_record(i, {"id": f"p{i}", "x": {"a": i / 10}, "y": i % 2 == 0}) for i in range(6)]
        + [_record(6 + i, {"id": f"u{i}", "x": {f"name-{i}": 1.0}}) for i in range(3)]
        + [_record(9, {"id": "long", "x": {"n" * 300_000: 1.0}})])
    daemon._since_checkpoint = 10
    return daemon


def test_one_long_feature_name_in_the_cache_does_not_widen_every_name_of_the_checkpoint(
        tmp_path):
    # The cache's names were one fixed-width text array: each of them as wide as the longest.
    # 60,000 names beside one of 300,000 characters asked for 67 GiB, and the checkpoint
    # failed (and the daemon stopped) at every attempt.
    config = _settings(tmp_path)
    daemon = _keyed_model_and_cache(config)
    daemon.processor.process([_record(10 + i, {"id": f"w{i}", "x": {
        f"f{i}_{j}": 1.0 for j in range(100)}}) for i in range(100)])
    daemon._since_checkpoint = 100
    daemon.checkpoint()
    (path,) = Path(config.checkpoint.dir).glob("checkpoint-*.npz")
    # The names take their own bytes: 300 KB, 10,000 short names, and the points.
    assert path.stat().st_size < 1_000_000
    restored = Daemon(config)
    restored._store = CheckpointStore(config.checkpoint.dir)
    processor = restored._restore()
    assert len(processor.cache) == 104 and processor.model.n_stored == 6
    assert processor.cache.get("long").x == {"n" * 300_000: 1.0}


def test_a_checkpoint_written_before_the_solver_state_was_kept_is_still_restored(tmp_path):
    # The daemon reads the arrays an empty model's checkpoint lists: with the solver's state
    # (factor, E's sums) among them, every checkpoint written before would lack members.
    from stream_svm.engine import OPTIONAL_STATE_ARRAYS

    config = _settings(tmp_path)
    daemon = _keyed_model_and_cache(config)
    daemon.checkpoint()
    written = CheckpointStore(config.checkpoint.dir).load_latest()
    assert OPTIONAL_STATE_ARRAYS <= set(written.arrays)
    restored = Daemon(config)
    restored._store = CheckpointStore(config.checkpoint.dir)
    processor = restored._restore()
    engine, saved = processor.model._engine, written.arrays
    np.testing.assert_array_equal(engine.get_state()["h"], saved["h"])
    arrays = {name: value for name, value in written.arrays.items()
              if name not in OPTIONAL_STATE_ARRAYS}
    older = tmp_path / "older"
    CheckpointStore(older).save(arrays, written.model_meta, written.state,
                                dict(written.cache_arrays))
    config = _settings(tmp_path, **{"checkpoint.dir": str(older)})
    restored = Daemon(config)
    restored._store = CheckpointStore(config.checkpoint.dir)
    processor = restored._restore()
    assert sorted(processor.model._engine.keys) == [f"p{i}" for i in range(6)]


def test_a_checkpoint_with_fixed_width_text_arrays_is_still_restored(tmp_path):
    # Checkpoints written before the texts were variable-width UTF-8.
    config = _settings(tmp_path)
    daemon = _keyed_model_and_cache(config)
    daemon.checkpoint()
    written = CheckpointStore(config.checkpoint.dir).load_latest()
    arrays, cache = dict(written.arrays), dict(written.cache_arrays)
    from stream_svm._engine_model import texts_from_arrays

    for table, name in ((arrays, "key_str"), (cache, "id_str"), (cache, "names")):
        table[name] = np.array(texts_from_arrays(table, name), dtype=str)
        del table[f"{name}_utf8"], table[f"{name}_ends"]
    older = tmp_path / "older"
    CheckpointStore(older).save(arrays, written.model_meta, written.state, cache)
    config = _settings(tmp_path, **{"checkpoint.dir": str(older)})
    restored = Daemon(config)
    restored._store = CheckpointStore(config.checkpoint.dir)
    processor = restored._restore()
    assert sorted(processor.model._engine.keys) == [f"p{i}" for i in range(6)]
    assert sorted(processor.cache) == ["long", "u0", "u1", "u2"]
    x = {"a": 0.25}
    original = daemon.processor.model
    assert processor.model.decision_function_one(x) == original.decision_function_one(x)


def test_a_changed_model_setting_stops_and_touches_nothing(tmp_path):
    directory = _checkpoint_a_model(_settings(tmp_path, **{"model.C": 1.0}))
    before = _files(directory)
    with pytest.raises(StartRefused, match=r"model\.C|C 1\.0 -> 2\.0") as caught:
        Daemon(_settings(tmp_path, **{"model.C": 2.0})).run()
    assert "Nothing was changed" in str(caught.value)
    assert _files(directory) == before
    # The original settings restore it (and only then is the broker needed).
    with pytest.raises(DaemonError, match=r"unreachable|giving up"):
        Daemon(_settings(tmp_path, **{"model.C": 1.0})).run()
    assert _files(directory) == before


def test_a_checkpoint_of_another_input_topic_stops_and_touches_nothing(tmp_path):
    # Its offsets name none of this input's partitions: the input was read from its
    # beginning into the other stream's model (merged, or every message a duplicate_id).
    directory = _checkpoint_a_model(_settings(tmp_path))
    before = _files(directory)
    with pytest.raises(StartRefused, match=r"hold a model made on the input topic in \(it read "
                       r"in\), not on other\.input"):
        Daemon(_settings(tmp_path, **{"kafka.input_topic": "other.input"})).run()
    assert _files(directory) == before
    # With its own input topic (a label topic added meanwhile), it restores.
    with pytest.raises(DaemonError, match=r"unreachable|giving up"):
        Daemon(_settings(tmp_path, **{"kafka.label_topic": "labels"})).run()
    assert _files(directory) == before


def test_a_checkpoint_of_another_input_topic_is_refused_even_with_the_same_label_topic(
        tmp_path):
    # One topic in common was enough: a stream on another input topic with the label topic of
    # the checkpoint's stream was merged into its model, with no more than an INFO line.
    directory = _checkpoint_a_model(_settings(tmp_path, **{"kafka.label_topic": "labels"}),
                                    also_read={"labels:0": 3})
    before = _files(directory)
    for other in ({"kafka.input_topic": "other.input", "kafka.label_topic": "labels"},
                  {"kafka.input_topic": "other.input", "kafka.label_topic": "in"}):
        with pytest.raises(StartRefused, match=r"hold a model made on the input topic in \(it "
                           r"read in, labels\), not on other\.input"):
            Daemon(_settings(tmp_path, **other)).run()
        assert _files(directory) == before
    # Its own input, with the label topic dropped, restores.
    with pytest.raises(DaemonError, match=r"unreachable|giving up"):
        Daemon(_settings(tmp_path)).run()
    assert _files(directory) == before


@pytest.mark.parametrize("written_before_it_named_its_input", [False, True])
def test_a_model_that_has_read_only_labels_restarts(tmp_path, monkeypatch,
                                                    written_before_it_named_its_input):
    # Its offsets name the label topic only (labels came, their features had not): the check
    # that the model read this input refused its restart with the very same settings.
    import connectors.checkpoint as checkpoint_module

    config = _settings(tmp_path, **{"kafka.label_topic": "labels"})
    daemon = Daemon(config)
    daemon._store = CheckpointStore(config.checkpoint.dir)
    daemon.processor = daemon._new_processor(build_model(config))
    daemon.processor.process([_record(i, {"id": i, "y": True}, topic="labels")
                              for i in range(3)])
    assert set(daemon.processor.offsets) == {"labels:0"}
    daemon._since_checkpoint = 3
    if written_before_it_named_its_input:
        save = checkpoint_module.CheckpointStore.save

        def without_input(self, arrays, meta, state, *rest, **kwargs):
            return save(self, arrays, meta, {k: v for k, v in state.items()
                                             if k != "input_topic"}, *rest, **kwargs)

        monkeypatch.setattr(checkpoint_module.CheckpointStore, "save", without_input)
    daemon.checkpoint()
    again = Daemon(_settings(tmp_path, **{"kafka.label_topic": "labels"}))
    again._store = CheckpointStore(config.checkpoint.dir)
    assert again._restore().offsets == {"labels:0": 3}


def _with_metadata(source: Path, target: Path, change: Callable[[dict], None]) -> None:
    """``source`` copied to ``target`` with its JSON metadata passed through ``change``."""
    with zipfile.ZipFile(source) as archive:
        members = {info.filename: archive.read(info) for info in archive.infolist()}
    document = json.loads(np.load(io.BytesIO(members["__meta__.npy"])).tobytes())
    change(document)
    buffer = io.BytesIO()
    np.save(buffer, np.frombuffer(json.dumps(document).encode(), dtype=np.uint8))
    members["__meta__.npy"] = buffer.getvalue()
    with zipfile.ZipFile(target, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)


def test_a_checkpoint_of_a_newer_stream_svm_stops_and_touches_nothing(tmp_path):
    # After an upgrade rolled back: the newer version's checkpoint was set aside as damaged
    # and the one before it restored, the model quietly back where it was before the upgrade.
    directory = _checkpoint_a_model(_settings(tmp_path))
    (path,) = directory.glob("checkpoint-*.npz")
    newer = directory / "checkpoint-000000000099.npz"
    _with_metadata(path, newer, lambda document: document.update(version=VERSION + 1))
    before = _files(directory)
    with pytest.raises(StartRefused, match=rf"newer stream-svm \(format version {VERSION + 1}"):
        Daemon(_settings(tmp_path)).run()
    with pytest.raises(StartRefused, match="newer stream-svm"):
        Daemon(_settings(tmp_path, **{"checkpoint.start_fresh": True})).run()
    with pytest.raises(CheckpointFromNewerVersion):
        CheckpointStore(directory).load_latest()
    assert _files(directory) == before


def test_a_version_1_label_on_a_checkpoint_with_a_cache_is_not_read_without_it(tmp_path):
    # Read as version 1 (whose cache lay in the metadata), its cache members were skipped:
    # restored without the cached features, later labels for them were dead-lettered.
    config = _settings(tmp_path)
    _keyed_model_and_cache(config).checkpoint()
    directory = Path(config.checkpoint.dir)
    (path,) = directory.glob("checkpoint-*.npz")
    damaged = tmp_path / "checkpoint-000000000099.npz"
    _with_metadata(path, damaged, lambda document: document.update(version=1))
    with pytest.raises(CheckpointError, match="says format version 1 but holds cache"):
        CheckpointStore(tmp_path).read(damaged)


# (The solver's state, "checked_terms", "diag_scale", "factor", "g", "h", "h_abs", "h_drift",
# "shift" and "store", came later under version 2 without a new version: the readers of
# version 2 before it read only the arrays they know, and so read such a checkpoint as before;
# one without them restores from its points alone.)
_ENGINE_MODEL = ("X:f", "alpha:f", "b:f", "checked_terms:f", "diag_scale:f", "factor:f", "g:f",
                 "h:f", "h_abs:f", "h_drift:f", "key_int:i", "key_kind:i", "key_str_ends:i",
                 "key_str_utf8:u", "margin:i", "next_sequence:i", "sequence:i", "shift:f",
                 "status:i", "store:i", "y:f")
# ("counters" came later under version 2 without a new version: the readers of version 2
# before it read none of the metadata they do not know, and so read such a checkpoint as
# before, without its counters; one without it restores with them at 0.)
_ENGINE_META = ("auto_keys", "breakpoints_total", "callables", "class", "counters", "extra",
                "features", "params", "updates_total")
_LSSVM = ("X:f", "gram_hi:f", "gram_lo:f", "key_int:i", "key_kind:i", "key_str_ends:i",
          "key_str_utf8:u", "omega:f", "phase:f", "rhs_hi:f", "rhs_lo:f", "solution:f", "y:f")
_LSSVM_META = ("callables", "class", "features", "fourier_seed", "has_space", "n_samples",
               "params", "roundoff_terms")
_SVR = ("gap:f", "linear:f", "target:f")
#: What a checkpoint of format VERSION holds, per estimator: its arrays (name:dtype kind) and
#: the keys of its model metadata. A stream-svm that reads this version expects exactly these:
#: a layout changed under the same version was read by an older stream-svm as damaged (it
#: set the newer checkpoints aside and restored one from before the upgrade).
CHECKPOINT_LAYOUT = {
    2: {
        "IncrementalSVC": (_ENGINE_MODEL, _ENGINE_META),
        "SlidingWindowSVC": (_ENGINE_MODEL, _ENGINE_META),
        "IncrementalSVR": (tuple(sorted(_ENGINE_MODEL + _SVR)), _ENGINE_META),
        "SlidingWindowSVR": (tuple(sorted(_ENGINE_MODEL + _SVR)), _ENGINE_META),
        "AlphaISVC": (tuple(sorted((
            *_ENGINE_MODEL, "aisvc_ids:i", "aisvc_in_T:b", "aisvc_labels:f", "aisvc_psi:f",
            "aisvc_rows:f", "aisvc_set:i", "aisvc_used:i"))), _ENGINE_META),
        "IncrementalLSSVC": (_LSSVM, _LSSVM_META),
        "IncrementalLSSVR": (_LSSVM, _LSSVM_META),
        "cache": (("cached_at:f", "feature:i", "id_int:i", "id_is_int:b", "id_str_ends:i",
                   "id_str_utf8:u", "indptr:i", "names_ends:i", "names_utf8:u", "prediction:f",
                   "value:f"), ()),
    },
}


def test_a_checkpoint_layout_changes_only_with_its_format_version():
    """Fails when what a checkpoint holds changes without connectors.checkpoint.VERSION: raise
    VERSION (and keep reading the older layout), then add the new layout here."""
    import stream_svm

    layouts = CHECKPOINT_LAYOUT.get(VERSION)
    assert layouts is not None, f"no layout recorded for checkpoint format {VERSION}"
    points = [({"a": math.sin(i), "b": math.cos(3 * i)}, i % 3 == 0) for i in range(40)]
    for name, (arrays_expected, meta_expected) in layouts.items():
        if name == "cache":
            cache = UnlabelledCache(10, 1 << 20, 3600)
            cache.put("u", {"f": 1.0}, True, 0.0)
            arrays, meta = cache.to_arrays(), {}
        else:
            model = getattr(stream_svm, name)()
            regression = name.endswith("SVR")
            for x, y in points:
                model.learn_one(x, x["a"] if regression else y)
            arrays, meta = model.to_checkpoint()
        layout = tuple(sorted(f"{member}:{array.dtype.kind}" for member, array in arrays.items()))
        assert (layout, tuple(sorted(meta))) == (arrays_expected, meta_expected), (
            f"the checkpoint layout of {name} changed under format version {VERSION}")


def test_unusable_checkpoints_stop_the_daemon_until_the_operator_starts_fresh(tmp_path):
    directory = _checkpoint_a_model(_settings(tmp_path))
    (path,) = directory.glob("checkpoint-*.npz")
    path.write_bytes(path.read_bytes()[:200])
    before = _files(directory)
    for _ in range(2):  # the second start finds the same, not an empty directory
        with pytest.raises(StartRefused, match="--start-fresh"):
            Daemon(_settings(tmp_path)).run()
        assert _files(directory) == before
    with pytest.raises(DaemonError, match=r"unreachable|giving up"):
        Daemon(_settings(tmp_path, **{"checkpoint.start_fresh": True})).run()
    assert not list(directory.glob("checkpoint-*.npz"))
    assert len(list(directory.glob("*.unusable-*"))) == 1
    # Set aside earlier (e.g. by an older version): still no silent new model.
    with pytest.raises(StartRefused, match="set aside as unusable"):
        Daemon(_settings(tmp_path)).run()


# -- bounded features -------------------------------------------------------------------------


def _wide(offset: int, names: int, label: bool | None) -> Record:
    message: dict[str, Any] = {"id": f"w{offset}", "x": {f"f{i}": 1.0 for i in range(names)}}
    if label is not None:
        message["y"] = label
    return _record(offset, message)


def test_a_message_over_the_feature_limits_is_refused_and_the_stream_goes_on():
    config = load_config(None, {"model.max_features": "50", "model.max_new_features": "20"},
                         environ={})
    processor = Processor(build_model(config))
    records = [_record(0, {"id": "a", "x": {"a": 1.0}, "y": True}),
               _wide(1, 30, True),   # 30 new names in one message
               _wide(2, 15, True),   # fits
               _wide(3, 40, None),   # predicted only: any number of unknown names
               _record(4, {"id": "b", "x": {"a": -1.0}, "y": False})]
    result = processor.process(records)
    (letter,) = result.dead_letters
    assert letter.record["reason"] == "refused" and letter.record["source"]["offset"] == 1
    assert "max_new_features=20" in letter.record["error"]
    assert [o.record["id"] for o in result.outputs] == ["a", "w2", "w3", "b"]
    assert sorted(processor.model.stored_keys()) == ["a", "b", "w2"]
    assert processor.model.n_features == 16


def test_feature_limits_may_change_between_restarts_and_bound_checkpoints(tmp_path):
    from connectors.models import checkpoint_bounds, model_settings, restore_model

    first = load_config(None, {"model.max_features": "100"}, environ={})
    model = build_model(first)
    for i in range(5):
        model.learn_one({f"f{i}": 1.0, "a": float(i)}, bool(i % 2), key=i)
    arrays, meta = model.to_checkpoint()
    second = load_config(None, {"model.max_features": "0", "model.max_new_features": "3"},
                         environ={})
    assert model_settings(first) == model_settings(second)  # not a settings mismatch
    restored = restore_model(second, arrays, meta)
    assert (restored.max_features, restored.max_new_features) == (None, 3)
    store = CheckpointStore(tmp_path)
    store.save(arrays, meta, {})
    ((_, path),) = store.paths()
    narrow = load_config(None, {"model.max_features": "4"}, environ={})
    with pytest.raises(CheckpointMismatch, match=r"holds 6 features \(member 'X'\), more than "
                       r"model\.max_features=4 allows\. Nothing was changed\. Set "
                       r"model\.max_features to 6 at least"):
        store.read(path, check=checkpoint_bounds(narrow))
    assert store.read(path, check=checkpoint_bounds(first)).arrays["X"].shape == (5, 6)


def test_a_new_model_over_a_topic_that_lost_its_first_messages_is_warned_of(tmp_path, caplog):
    # An INFO line was all that told a checkpoint.dir resolved elsewhere, once the group's
    # committed offsets were gone, from a first start: the new model silently missed what
    # retention had removed.
    from kafka import TopicPartition

    class Consumer:
        def __init__(self) -> None:
            self.sought: list[int] = []

        def committed(self, tp, metadata=False):
            return None

        def seek_to_beginning(self, tp):
            self.sought.append(tp.partition)

        def beginning_offsets(self, partitions):
            return {tp: {0: 1200, 1: 0}[tp.partition] for tp in partitions}

    daemon = Daemon(_settings(tmp_path))
    daemon._store = CheckpointStore(daemon.config.checkpoint.dir)
    with caplog.at_level("INFO", logger="connectors.daemon"):
        daemon.processor = daemon._restore()
        consumer = Consumer()
        daemon._seek(consumer, [TopicPartition("in", 0), TopicPartition("in", 1)])
    assert consumer.sought == [0, 1]
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "a new, empty model (no checkpoint in" in warnings[0]
    assert "reads from the first offsets left in its partitions (in:0 from 1200)" in warnings[0]
    assert "in:1" not in warnings[0]


def test_committed_offsets_other_than_the_models_are_named_at_the_start(tmp_path, caplog):
    # kafka-consumer-groups --reset-offsets on a stopped daemon's group was dropped without a
    # word: the model reads on from its own offsets.
    from kafka import TopicPartition
    from kafka.structs import OffsetAndMetadata

    class Consumer:
        def __init__(self) -> None:
            self.sought: dict[int, int] = {}

        def committed(self, tp, metadata=False):
            return OffsetAndMetadata({0: 90, 1: 20}[tp.partition], "", -1)

        def seek(self, tp, offset):
            self.sought[tp.partition] = offset

    daemon = Daemon(_settings(tmp_path))
    daemon._store = CheckpointStore(daemon.config.checkpoint.dir)
    daemon.processor = daemon._restore()
    daemon.processor.offsets.update({"in:0": 50, "in:1": 20})
    consumer = Consumer()
    with caplog.at_level("WARNING", logger="connectors.daemon"):
        daemon._seek(consumer, [TopicPartition("in", 0), TopicPartition("in", 1)])
    assert consumer.sought == {0: 50, 1: 20}
    assert ("the group's committed offsets differ from the model's (in:0 committed 90, the "
            "model 50): a tool reset them") in caplog.text

    # Messages held for the scaler's warm-up commit short of the model's offsets: what its
    # checkpoint committed is no difference to name (it was named at every restart).
    warming = Daemon(_settings(tmp_path / "warm-up", **{"scaler.mode": "warmup",
                                                         "scaler.warmup_messages": 100}))
    warming._store = CheckpointStore(warming.config.checkpoint.dir)
    warming.processor = warming._restore()
    warming.processor.process([_record(i, {"id": i, "x": {"a": i / 10}, "y": i % 2 == 0})
                               for i in range(5)])
    assert warming.processor.offsets == {"in:0": 5} and warming.processor.held
    caplog.clear()

    class Committed(Consumer):
        def committed(self, tp, metadata=False):
            return OffsetAndMetadata(0, "", -1)

    with caplog.at_level("WARNING", logger="connectors.daemon"):
        warming._seek(Committed(), [TopicPartition("in", 0)])
    assert "committed offsets differ" not in caplog.text


def test_a_kill_between_checkpoint_and_commit_is_known_without_commit_metadata(tmp_path,
                                                                              caplog):
    # The embedded broker keeps no commit metadata (it reads back None): the restart after a
    # kill between a checkpoint and its commit still warned that "a tool reset them". The
    # checkpoint records the group's offsets as the daemon knew them when it was written.
    from kafka import TopicPartition
    from kafka.structs import OffsetAndMetadata

    writer = Daemon(_settings(tmp_path))
    writer._store = CheckpointStore(writer.config.checkpoint.dir)
    writer.processor = writer._restore()
    writer.processor.offsets.update({"in:0": 800})
    writer._group_known = {"in:0": (720, "")}  # (its last commit, or the one found at start)
    writer._attempted = {"in:0": {760}}  # (a commit that raised: it may have been made)
    writer.checkpoint()
    assert writer._store.paths()

    class Consumer:
        def __init__(self, offset: int, metadata: str | None) -> None:
            self.offset, self.metadata = offset, metadata

        def committed(self, tp, metadata=False):
            return OffsetAndMetadata(self.offset, self.metadata, -1)

        def seek(self, tp, offset):
            pass

    for committed, level, metadata in ((720, "INFO", None), (760, "INFO", None),
                                       (5, "WARNING", None),
                                       (720, "WARNING", "")):  # (Kafka: a tool's reset)
        daemon = Daemon(_settings(tmp_path))
        daemon._store = CheckpointStore(daemon.config.checkpoint.dir)
        daemon.processor = daemon._restore()
        caplog.clear()
        with caplog.at_level("INFO", logger="connectors.daemon"):
            daemon._seek(Consumer(committed, metadata), [TopicPartition("in", 0)])
        said = [r for r in caplog.records if "committed offsets" in r.getMessage()]
        assert [r.levelname for r in said] == [level], (committed, caplog.text)
        assert f"in:0 committed {committed}, the model 800" in said[0].getMessage()


def test_a_daemon_stopped_between_its_checkpoint_and_its_commit_is_no_warning(tmp_path,
                                                                               caplog):
    # After a kill between writing a checkpoint and committing its offsets, every restart
    # warned that "a tool reset them": the group's offsets are the daemon's own commit (its
    # metadata), behind the checkpoint's. A tool's reset, or a commit ahead, still warns.
    from kafka import TopicPartition
    from kafka.structs import OffsetAndMetadata

    from connectors.daemon import COMMIT_METADATA_PREFIX

    commits = {0: (720, f"{COMMIT_METADATA_PREFIX}host pid 12 abcd1234"),
               1: (20, f"{COMMIT_METADATA_PREFIX}host pid 12 abcd1234"),  # ahead: warned
               2: (5, "")}  # a tool's reset, behind: warned

    class Consumer:
        def committed(self, tp, metadata=False):
            return OffsetAndMetadata(*commits[tp.partition], -1)

        def seek(self, tp, offset):
            pass

    daemon = Daemon(_settings(tmp_path))
    daemon._store = CheckpointStore(daemon.config.checkpoint.dir)
    daemon.processor = daemon._restore()
    daemon.processor.offsets.update({"in:0": 800, "in:1": 10, "in:2": 30})
    with caplog.at_level("INFO", logger="connectors.daemon"):
        daemon._seek(Consumer(), [TopicPartition("in", p) for p in range(3)])
    infos = [r.getMessage() for r in caplog.records if r.levelname == "INFO"]
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any("committed offsets are behind the model's (in:0 committed 720, the model 800): "
               "the daemon that committed them stopped after its last checkpoint" in message
               for message in infos)
    assert len(warnings) == 1 and ("differ from the model's (in:1 committed 20, the model 10; "
                                   "in:2 committed 5, the model 30): a tool reset them"
                                   in warnings[0])


@pytest.mark.parametrize("model_type", ["IncrementalSVC", "IncrementalLSSVC"])
def test_a_max_features_below_the_models_refuses_the_start_and_sets_nothing_aside(tmp_path,
                                                                                  model_type):
    # Taken for a damaged file, the newest checkpoint was set aside, the one before restored,
    # and the messages learned since read again: acknowledged learns rolled back, and all of
    # them refused for their features, with exit 0.
    daemon = Daemon(_settings(tmp_path, **{"model.type": model_type}))
    daemon._store = CheckpointStore(daemon.config.checkpoint.dir)
    daemon.processor = daemon._new_processor(build_model(daemon.config))
    for first, features in ((0, ("a", "b")), (6, ("a", "b", "c"))):
        daemon.processor.process([
            _record(i, {"id": i, "x": {f: (i + 1) / (7 + j) for j, f in enumerate(features)},
                        "y": i % 2 == 0}) for i in range(first, first + 6)])
        daemon._since_checkpoint = 6
        daemon.checkpoint()
    directory = Path(daemon.config.checkpoint.dir)
    before = _files(directory)
    with pytest.raises(StartRefused, match=r"holds 3 features .* more than "
                       r"model\.max_features=2 allows\. Nothing was changed"):
        Daemon(_settings(tmp_path, **{"model.type": model_type,
                                      "model.max_features": 2})).run()
    assert _files(directory) == before


def _window_of_two_checkpoint():
    """The configuration of a SlidingWindowSVC of 2 points, and its checkpoint after 3."""
    config = load_config(None, {"model.type": "SlidingWindowSVC", "model.window_size": "2",
                                "model.step": "1"}, environ={})
    model = build_model(config)
    for i in range(3):
        model.learn_one({"a": float(i)}, bool(i % 2), key=f"k{i}")
    arrays, meta = model.to_checkpoint()
    return config, arrays, meta


@pytest.mark.parametrize("member", [
    "checked_terms", "factor", "g", "h", "h_abs", "h_drift", "store"])
def test_a_window_checkpoint_with_solver_arrays_longer_than_its_window_is_refused(tmp_path,
                                                                                 member):
    # Arrays of a crafted file are bounded before they are read: g and checked_terms, added
    # with the solver's state, were read whole (1e6 entries for a window of 2).
    from connectors.models import checkpoint_bounds

    config, arrays, meta = _window_of_two_checkpoint()
    arrays[member] = np.zeros((3, 3) if member == "factor" else 3,
                              dtype=np.int64 if member == "store" else float)
    store = CheckpointStore(tmp_path)
    store.save(arrays, meta, {})
    ((_, path),) = store.paths()
    with pytest.raises(CheckpointError, match=rf"member '{member}' holds 3 points, more than "
                                              r"model\.window_size=2"):
        store.read(path, check=checkpoint_bounds(config))


def test_a_window_checkpoint_with_more_key_bytes_than_its_ids_can_hold_is_refused(tmp_path):
    # A crafted or foreign file: its key texts would be read whole before the model saw them.
    from connectors.models import checkpoint_bounds

    config, arrays, meta = _window_of_two_checkpoint()
    store = CheckpointStore(tmp_path)
    store.save(arrays, meta, {})
    ((_, path),) = store.paths()
    assert store.read(path, check=checkpoint_bounds(config)).arrays["key_str_ends"].size == 2
    arrays["key_str_utf8"] = np.zeros(2 * 4096 + 1, dtype=np.uint8)
    store.save(arrays, meta, {})
    path = store.paths()[0][1]
    with pytest.raises(CheckpointError, match=r"member 'key_str_utf8' holds 8193 bytes of keys"):
        store.read(path, check=checkpoint_bounds(config))


def test_a_huge_regression_target_is_refused_and_checkpoints_keep_working(tmp_path):
    """A finite target whose square would overflow the progressive RMSE is a dead letter; an
    accumulator that is not finite anyway (a wild prediction) still checkpoints."""
    config = _settings(tmp_path, **{"model.type": "IncrementalSVR"})
    daemon = Daemon(config)
    daemon._store = CheckpointStore(config.checkpoint.dir)
    daemon.processor = daemon._new_processor(build_model(config))
    result = daemon.processor.process(
        [_record(i, {"id": i, "x": {"a": i / 10}, "y": float(i)}) for i in range(5)]
        + [_record(5, {"id": 5, "x": {"a": 0.5}, "y": 1e200})])
    assert len(result.outputs) == 5
    assert [d.record["reason"] for d in result.dead_letters] == ["malformed"]
    assert "too large" in result.dead_letters[0].record["error"]
    daemon.processor.squared_error = math.inf
    daemon._since_checkpoint = 6
    daemon.checkpoint()
    assert daemon.summary.checkpoints == 1 and daemon.summary.checkpoint_failures == 0
    restored = daemon._new_processor(build_model(config))
    restored.load_state(json.loads(json.dumps(daemon.processor.state())))
    assert restored.squared_error == math.inf and restored.scored == 5


def test_a_failing_final_checkpoint_is_not_a_clean_stop(tmp_path, monkeypatch, caplog):
    config = _settings(tmp_path)
    daemon = Daemon(config)
    daemon._store = CheckpointStore(config.checkpoint.dir)
    daemon.processor = daemon._new_processor(build_model(config))
    daemon.processor.process([_record(i, {"id": i, "x": {"a": i / 10}, "y": i % 2 == 0})
                              for i in range(4)])
    daemon._since_checkpoint = 4

    def full_disk(*args, **kwargs):
        raise CheckpointError("no space left on device")

    monkeypatch.setattr(daemon._store, "save", full_disk)
    daemon._maybe_checkpoint()  # not due yet by messages or time: nothing happens
    daemon._shutdown()
    assert daemon.summary.checkpoint_failures == 1
    assert daemon.summary.exit_code == 1
    # (it said "the previous checkpoint stays in use": there was none; then that a restart
    # would start from the committed offsets, of which there are none before a checkpoint)
    assert ("no checkpoint is written yet, and nothing is committed before one: a restart "
            "reads again all that this run has read") in caplog.text
    # After a failure the next attempt waits (no retry at every poll).
    daemon._last_checkpoint = 0.0
    daemon._maybe_checkpoint()
    assert daemon.summary.checkpoint_failures == 1


def test_a_checkpoint_directory_replaced_by_a_file_is_not_said_to_hold_a_checkpoint(
        tmp_path, caplog):
    # "the previous checkpoint stays in use", said while every checkpoint was gone with it.
    config = _settings(tmp_path)
    daemon = Daemon(config)
    daemon._store = CheckpointStore(config.checkpoint.dir)
    daemon.processor = daemon._new_processor(build_model(config))
    daemon.processor.process([_record(0, {"id": 0, "x": {"a": 0.1}, "y": True})])
    daemon._since_checkpoint = 1
    daemon.checkpoint()
    directory = Path(config.checkpoint.dir)
    shutil.rmtree(directory)
    directory.write_bytes(b"not a directory")
    daemon.processor.process([_record(1, {"id": 1, "x": {"a": 0.2}, "y": False})])
    daemon._since_checkpoint = 1
    with caplog.at_level("ERROR", logger="connectors.daemon"):
        daemon.checkpoint()
    assert daemon.summary.checkpoint_failures == 1
    assert "previous checkpoint stays in use" not in caplog.text
    assert "the checkpoints written before may be gone" in caplog.text


class _Consumer:
    """The part of a KafkaConsumer that a global daemon's shutdown uses: commits recorded."""

    def __init__(self) -> None:
        self.commits: list[Any] = []

    def commit(self, offsets: Any) -> None:
        self.commits.append(offsets)

    def close(self, autocommit: bool = True) -> None:
        pass


class _InterruptedProducer:
    """A producer interrupted while it sends (Ctrl-C in a program embedding the daemon)."""

    def partitions_for(self, topic: str) -> set[int]:
        return {0}

    def send(self, *args: Any, **kwargs: Any) -> None:
        raise KeyboardInterrupt

    def flush(self, timeout: float | None = None) -> None:
        pass

    def close(self, timeout: float | None = None) -> None:
        pass


def test_a_batch_interrupted_before_its_outputs_are_sent_is_neither_checkpointed_nor_committed(
        tmp_path):
    config = _settings(tmp_path)
    daemon = Daemon(config)
    daemon._store = CheckpointStore(config.checkpoint.dir)
    daemon.processor = daemon._new_processor(build_model(config))
    daemon._consumer, daemon._producer = _Consumer(), _InterruptedProducer()
    daemon._since_checkpoint = 3  # earlier batches were delivered and are due a checkpoint
    batch = [_record(i, {"id": i, "x": {"a": i / 10}, "y": i % 2 == 0}) for i in range(10)]
    with pytest.raises(KeyboardInterrupt):
        try:
            daemon._handle_batch(batch)
        finally:
            daemon._shutdown()
    # The batch is in the model but none of its outputs left: a checkpoint or a commit now
    # would make the restart skip it, answering none of its messages.
    assert daemon._store.load_latest() is None and daemon._consumer.commits == []
    assert daemon.summary.exit_code == 1


def test_messages_held_for_the_scalers_warm_up_are_not_committed(tmp_path):
    config = _settings(tmp_path, **{"scaler.mode": "warmup", "scaler.warmup_messages": 20})
    daemon = Daemon(config)
    daemon._store = CheckpointStore(config.checkpoint.dir)
    daemon.processor = daemon._new_processor(build_model(config))
    daemon._consumer = consumer = _Consumer()
    answered = [_record(i, {"id": i, "x": {"a": i / 10}, "y": i % 2 == 0}) for i in range(30)]
    daemon.processor.process(answered)  # the warm-up froze at the 20th: all 30 answered
    daemon.checkpoint()
    daemon._commit()
    held = [_record(i, {"id": i, "x": {"a": i / 10}, "y": i % 2 == 0}) for i in range(30, 35)]
    daemon.processor = daemon._new_processor(build_model(config))  # a new warm-up
    daemon.processor.offsets = {"in:0": 30}
    daemon.processor.process(held)
    assert len(daemon.processor.held) == 5 and daemon.processor.offsets == {"in:0": 35}
    daemon.checkpoint()
    daemon._commit()
    committed = [{f"{tp.topic}:{tp.partition}": meta.offset for tp, meta in offsets.items()}
                 for offsets in consumer.commits]
    assert committed == [{"in:0": 30}]  # the held messages' partition stays at the first


def test_offsets_are_committed_only_as_far_as_a_checkpoint_covers_them(tmp_path):
    """A daemon killed before its first checkpoint had committed what it processed: the restart
    found a commit and no checkpoint and refused to start, and --start-fresh then skipped what
    the lost model had learned. The group's offset is what the newest checkpoint covers."""
    config = _settings(tmp_path)
    daemon = Daemon(config)
    daemon._store = CheckpointStore(config.checkpoint.dir)
    daemon.processor = daemon._new_processor(build_model(config))
    daemon._consumer = consumer = _Consumer()
    daemon.processor.process([_record(i, {"id": i, "x": {"a": i / 10}, "y": i % 2 == 0})
                              for i in range(12)])
    daemon._commit()
    assert consumer.commits == []  # processed, not checkpointed: nothing to commit
    daemon.checkpoint()
    daemon.processor.process([_record(i, {"id": i, "x": {"a": i / 10}, "y": i % 2 == 0})
                              for i in range(12, 20)])
    daemon._commit()
    committed = [{f"{tp.topic}:{tp.partition}": meta.offset for tp, meta in offsets.items()}
                 for offsets in consumer.commits]
    assert committed == [{"in:0": 12}]  # the checkpoint's, not the 20 processed


def test_the_retry_delay_stays_finite_however_long_the_outage():
    """2 ** 1024 overflows a float: after 1025 failures at a small initial delay (some hours of
    outage) the daemon died with OverflowError, although max_attempts = 0 never gives up."""
    from connectors.daemon import backoff_delay

    assert backoff_delay(0.001, 0.001, 5000) == 0.001
    assert backoff_delay(0.5, 30.0, 1) == 0.5 and backoff_delay(0.5, 30.0, 3) == 2.0
    assert backoff_delay(0.5, 30.0, 10**6) == 30.0


def test_a_checkpoint_directory_removed_or_replaced_does_not_stop_the_stream(tmp_path, caplog):
    """The directory removed: created again, and the checkpoint written (the old ones are gone,
    said at ERROR). Replaced by a file: a CheckpointError (the daemon logs it, counts it and
    goes on) instead of a FileNotFoundError that ended the daemon. Temporary files a killed
    write left behind (they hold training data) are removed by the next write."""
    import shutil

    directory = tmp_path / "checkpoints"
    store = CheckpointStore(directory)
    store.save({"a": np.zeros(2)}, {}, {})
    (directory / ".checkpoint-000000000009.npz.12345.tmp").write_bytes(b"training data")
    shutil.rmtree(directory)
    with caplog.at_level("ERROR"):
        path = store.save({"a": np.ones(2)}, {}, {})
    assert path.exists() and "has disappeared" in caplog.text
    (directory / ".checkpoint-000000000009.npz.12345.tmp").write_bytes(b"training data")
    store.save({"a": np.ones(2)}, {}, {})
    assert not list(directory.glob("*.tmp"))
    shutil.rmtree(directory)
    directory.write_bytes(b"")  # a file where the directory was
    with pytest.raises(CheckpointError, match="could not write a checkpoint"):
        store.save({"a": np.ones(2)}, {}, {})

    config = _settings(tmp_path / "daemon")
    daemon = Daemon(config)
    daemon._store = CheckpointStore(config.checkpoint.dir)
    daemon.processor = daemon._new_processor(build_model(config))
    daemon.processor.process([_record(i, {"id": i, "x": {"a": i / 10}, "y": i % 2 == 0})
                              for i in range(6)])
    shutil.rmtree(config.checkpoint.dir)
    Path(config.checkpoint.dir).write_bytes(b"")
    daemon.checkpoint()  # logged and counted, not raised
    assert daemon.summary.checkpoint_failures == 1


class _TooLargeProducer:
    """A producer whose send raises for one value (a record over max_request_size), after
    buffering the ones before it: those are delivered by the next flush."""

    def __init__(self, refused: bytes) -> None:
        self.refused, self.buffered, self.delivered = refused, [], []

    def partitions_for(self, topic: str) -> set[int]:
        return {0}

    def send(self, topic: str, key: Any = None, value: bytes = b"",
             partition: int | None = None) -> Any:
        from kafka.errors import MessageSizeTooLargeError

        if value == self.refused:
            raise MessageSizeTooLargeError("too large")
        future = _Future()
        self.buffered.append((value, future))
        return future

    def flush(self, timeout: float | None = None) -> None:
        for value, future in self.buffered:
            self.delivered.append(value)
            future.done = True
        self.buffered = []


class _Future:
    """As kafka-python's: done once the broker answered, failed if that answer is an error."""

    def __init__(self) -> None:
        self.done = False
        self.error: Exception | None = None

    @property
    def is_done(self) -> bool:
        return self.done

    def succeeded(self) -> bool:
        return self.done and self.error is None

    def failed(self) -> bool:
        return self.done and self.error is not None


def test_a_send_that_raises_does_not_send_the_ones_before_it_twice(tmp_path):
    config = _settings(tmp_path, **{"retry.initial_backoff_seconds": 0.001,
                                    "retry.max_backoff_seconds": 0.001})
    daemon = Daemon(config)
    daemon._producer = producer = _TooLargeProducer(refused=b"big")
    sends = [("out", None, b"one"), ("out", None, b"two"), ("out", None, b"big")]
    attempts = []
    daemon.stop_event.wait = lambda delay=None: attempts.append(delay)  # type: ignore[method-assign]

    def give_up(*_: Any) -> None:
        if len(attempts) >= 3:
            daemon._stop_requests = 2
    daemon.metrics.broker_errors.inc = give_up  # type: ignore[method-assign]
    assert daemon._deliver(sends) is False
    assert producer.delivered == [b"one", b"two"]  # each once, whatever the retries



class _StalledProducer(_TooLargeProducer):
    """A producer whose broker answers late: the first flush times out with every record
    still unanswered (the producer retries them itself), the next one delivers them."""

    def __init__(self) -> None:
        super().__init__(refused=b"")
        self.sent: list[bytes] = []
        self.flushes = 0

    def send(self, topic: str, key: Any = None, value: bytes = b"",
             partition: int | None = None) -> Any:
        self.sent.append(value)
        return super().send(topic, key, value, partition)

    def flush(self, timeout: float | None = None) -> None:
        from kafka.errors import KafkaTimeoutError

        self.flushes += 1
        if self.flushes <= 2:  # the flush, and the one after the error, time out
            raise KafkaTimeoutError("Timeout waiting for future")
        super().flush(timeout)


def test_outputs_the_broker_answers_late_are_waited_for_not_sent_again(tmp_path):
    # After a flush that timed out, the unanswered outputs were sent again while the producer
    # still held them: every output was written two or three times once the broker answered.
    config = _settings(tmp_path, **{"retry.initial_backoff_seconds": 0.001,
                                    "retry.max_backoff_seconds": 0.001})
    daemon = Daemon(config)
    daemon._producer = producer = _StalledProducer()
    sends = [("out", None, b"one"), ("out", None, b"two")]
    assert daemon._deliver(sends) is True
    assert producer.sent == [b"one", b"two"]
    assert producer.delivered == [b"one", b"two"]


class _PartitionedProducer:
    """A producer that records the partition each send names, for topics of 1 or 3 partitions."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, Any, int | None]] = []

    def partitions_for(self, topic: str) -> set[int]:
        return {0} if topic == "one" else {0, 1, 2}

    def send(self, topic: str, key: Any = None, value: bytes = b"",
             partition: int | None = None) -> Any:
        self.sent.append((topic, key, partition))
        future = _Future()
        future.done = True
        return future

    def flush(self, timeout: float | None = None) -> None:
        pass


def test_outputs_name_the_only_partition_and_leave_keyed_topics_to_the_partitioner(tmp_path):
    """A topic of one partition gets its records there by name (no key hashing); a topic of
    several keeps the producer's partitioner, so that an id's outputs stay on one partition."""
    daemon = Daemon(_settings(tmp_path))
    daemon._producer = producer = _PartitionedProducer()
    sends = [("one", b"1", b"a"), ("three", b"1", b"b"), ("one", b"2", b"c")]
    assert daemon._deliver(sends) is True
    assert producer.sent == [("one", b"1", 0), ("three", b"1", None), ("one", b"2", 0)]


class _UnauthorizedTopicProducer(_PartitionedProducer):
    """A producer whose broker refuses the metadata of topic "dead" (not authorized) until
    it is granted; a record sent there meanwhile fails on its future, as kafka-python's send
    reports such an error."""

    def __init__(self) -> None:
        super().__init__()
        self.granted = False

    def partitions_for(self, topic: str) -> set[int]:
        from kafka.errors import TopicAuthorizationFailedError

        if topic == "dead" and not self.granted:
            raise TopicAuthorizationFailedError("dead")
        return {0}

    def send(self, topic: str, key: Any = None, value: bytes = b"",
             partition: int | None = None) -> Any:
        from kafka.errors import TopicAuthorizationFailedError

        future = super().send(topic, key, value, partition)
        if topic == "dead" and not self.granted:
            future.error = TopicAuthorizationFailedError("dead")
        return future


def test_a_topic_whose_metadata_is_refused_does_not_hold_back_the_others(tmp_path):
    config = _settings(tmp_path, **{"retry.initial_backoff_seconds": 0.001,
                                    "retry.max_backoff_seconds": 0.001})
    daemon = Daemon(config)
    daemon._producer = producer = _UnauthorizedTopicProducer()
    waits = []

    def wait(delay: float | None = None) -> bool:
        waits.append(delay)
        producer.granted = True  # the next attempt finds the topic authorized
        return False
    daemon.stop_event.wait = wait  # type: ignore[method-assign]
    sends = [("one", b"1", b"a"), ("dead", b"1", b"why"), ("one", b"2", b"c")]
    assert daemon._deliver(sends) is True
    assert len(waits) == 1  # one retry, of the dead letter alone
    assert producer.sent == [("one", b"1", 0), ("dead", b"1", None), ("one", b"2", 0),
                             ("dead", b"1", 0)]

class _Seeking(_Consumer):
    """A consumer that records seeks."""

    def __init__(self) -> None:
        super().__init__()
        self.seeks: list[tuple[str, int, int]] = []

    def seek(self, tp: Any, offset: int) -> None:
        self.seeks.append((tp.topic, tp.partition, offset))


class _Metric:
    def __init__(self, value: float) -> None:
        self.number = value

    def value(self) -> float:
        return self.number


def _connected_daemon(tmp_path: Any) -> tuple[Daemon, _Seeking, dict[str, float]]:
    """A daemon whose model resumes "in:0" at 20, after a first look at a connection that is
    made and not closed; the counts of connections made and closed are the caller's to move."""
    config = _settings(tmp_path)
    daemon = Daemon(config)
    daemon.processor = daemon._new_processor(build_model(config))
    daemon.processor.offsets = {"in:0": 20}
    daemon._consumer = consumer = _Seeking()
    counts = {"made": 1.0, "closed": 0.0}
    daemon._made_connections = lambda: counts["made"]
    daemon._closed_connections = lambda: counts["closed"]
    daemon._connection_metric = _Metric(1.0)
    daemon._watch_connection()
    return daemon, consumer, counts


@pytest.mark.parametrize("reconnected", [False, True])
def test_after_a_closed_connection_only_reads_from_a_new_connection_wait_for_the_check(
        tmp_path, reconnected):
    """The client connects on its own thread, at any time. Records polled while no connection
    was made since a close were fetched before it: answered. Once one was made (here before
    the daemon even looked), they may come from a broker that restarted empty with a recreated
    topic: the partition is read again from the model's offset, until metadata that came
    after the close has been checked."""
    daemon, consumer, counts = _connected_daemon(tmp_path)
    counts["closed"] += 1  # the broker restarts ...
    if reconnected:
        counts["made"] += 1  # ... and the client reconnected before the daemon looked
    daemon._watch_connection()
    records = [_record(i, {"id": i, "x": {"a": 0.1}, "y": True}) for i in range(20, 23)]
    kept = daemon._hold_until_verified(records)
    if not reconnected:
        assert kept == records and consumer.seeks == []
        return
    assert kept == [] and consumer.seeks == [("in", 0, 20)]


def test_the_wait_for_the_check_counts_from_the_reconnect_not_from_the_close(tmp_path,
                                                                             monkeypatch):
    # After an outage longer than the wait (max(5 s, request_timeout_ms)), the deadline set
    # when the connection closed had passed by the reconnect: the first records after it, of
    # a topic recreated on a broker that restarted empty, were learned and checkpointed
    # unchecked (4,830 messages of another topic, seen on the embedded broker).
    import connectors.daemon as daemon_module

    clock = {"now": 1000.0}
    monkeypatch.setattr(daemon_module.time, "monotonic", lambda: clock["now"])
    daemon, consumer, counts = _connected_daemon(tmp_path)
    counts["closed"] += 1  # the broker goes away ...
    daemon._watch_connection()
    clock["now"] += 10 * daemon._verify_seconds()  # ... for far longer than the wait
    counts["made"] += 1  # and comes back
    records = [_record(i, {"id": i, "x": {"a": 0.1}, "y": True}) for i in range(20, 23)]
    assert daemon._hold_until_verified(records) == []
    assert consumer.seeks == [("in", 0, 20)]
    clock["now"] += daemon._verify_seconds() / 2  # still within the wait, from the reconnect
    assert daemon._hold_until_verified(records) == []
    clock["now"] += daemon._verify_seconds()  # no metadata came at all: read on, warned
    assert daemon._hold_until_verified(records) == records


def test_records_of_a_topic_the_metadata_lacks_wait_until_it_shows_the_topic(tmp_path):
    """A topic missing at the last metadata check (a broker restarted empty, the topic not yet
    created again) can be fetched from as soon as it is created, with the partition leaders
    the client knew before, ahead of the metadata that shows it with its new id: those records
    are not handled (the partition is read again from the model's offset) until metadata
    showing the topic has been checked. Another topic's records are handled meanwhile."""
    config = _settings(tmp_path)
    daemon = Daemon(config)
    daemon.processor = daemon._new_processor(build_model(config))
    daemon.processor.offsets = {"in:0": 20, "more:0": 5}
    daemon._consumer = consumer = _Seeking()
    daemon._missing_topics = {"in"}
    point = {"id": 0, "x": {"a": 0.1}, "y": True}
    records = [_record(i, point) for i in range(20, 23)] + [_record(5, point, topic="more")]
    assert daemon._hold_missing_topics(records) == records[-1:]
    assert consumer.seeks == [("in", 0, 20)]
    daemon._missing_topics.clear()  # the metadata shows it again, checked
    assert daemon._hold_missing_topics(records) == records


def test_records_of_a_missing_topic_are_held_for_a_bounded_time_only(tmp_path, caplog):
    """Metadata that keeps lacking a topic whose messages keep coming (a broker that answers
    with no leader for it, say) must not stop its stream: after max(5 s, request_timeout) of
    holding, the messages are handled, with one warning."""
    config = _settings(tmp_path)
    daemon = Daemon(config)
    daemon.processor = daemon._new_processor(build_model(config))
    daemon.processor.offsets = {"in:0": 20}
    daemon._consumer = consumer = _Seeking()
    daemon._missing_topics = {"in"}
    records = [_record(i, {"id": i, "x": {"a": 0.1}, "y": True}) for i in range(20, 23)]
    assert daemon._hold_missing_topics(records) == []
    daemon._held_since["in"] -= daemon._verify_seconds()  # as if it had been held that long
    with caplog.at_level(logging.WARNING, logger="connectors.daemon"):
        assert daemon._hold_missing_topics(records) == records
        assert daemon._hold_missing_topics(records) == records
    assert len(consumer.seeks) == 1
    assert sum("reading on without the check" in r.getMessage() for r in caplog.records) == 1


def _save_one(store: CheckpointStore) -> Path:
    return store.save({"w": np.arange(3.0)}, {"kind": "test"}, {"offsets": {}})


def test_a_lock_file_removed_under_a_running_daemon_is_named_and_taken_again(tmp_path,
                                                                           caplog):
    # (The log said the directory had been removed and created again: only its lock file was.)
    directory = tmp_path / "ckpt"
    with _locked(directory) as lock:
        store = CheckpointStore(directory, lock=lock)
        first = _save_one(store)
        (directory / ".lock").unlink()
        with caplog.at_level("ERROR", logger="connectors.checkpoint"):
            assert _save_one(store).exists()
        assert "or its lock file was removed or replaced: locked it again" in caplog.text
        assert first.exists() and lock.held()
        with pytest.raises(DaemonError, match="in use by another daemon"), _locked(directory):
            pass


@pytest.mark.parametrize("taken", [False, True])
def test_a_lock_file_removed_is_taken_again_within_a_second_not_at_the_next_checkpoint(
        tmp_path, caplog, taken):
    # Checked only before a checkpoint (30 s by default), a removed lock file let a second
    # daemon start on the directory, and both answered the stream meanwhile.
    from connectors.checkpoint import DirectoryLock

    config = _settings(tmp_path)
    daemon = Daemon(config)
    directory = Path(config.checkpoint.dir)
    with _locked(directory) as lock:
        daemon._store = CheckpointStore(directory, lock=lock)
        daemon.processor = daemon._new_processor(build_model(config))
        daemon._maybe_checkpoint()  # (held: nothing to do)
        (directory / ".lock").unlink()
        other = DirectoryLock(directory)
        if taken:
            other.acquire()  # another daemon was quicker
        daemon._lock_checked_at = 0.0  # (a second later)
        with caplog.at_level("ERROR"):
            daemon._maybe_checkpoint()
        if taken:
            assert daemon.stop_event.is_set() and daemon.summary.exit_code == 1
            assert "could not lock it again" in caplog.text
            other.release()
        else:
            assert lock.held() and not daemon.stop_event.is_set()
            assert "or its lock file was removed or replaced: locked it again" in caplog.text
            with pytest.raises(DaemonError, match="in use by another daemon"), \
                    _locked(directory):
                pass


def test_a_checkpoint_directory_removed_and_created_again_is_locked_again(tmp_path, caplog):
    import shutil

    from connectors.checkpoint import CheckpointLockLost, DirectoryLock

    directory = tmp_path / "ckpt"
    with _locked(directory) as lock:
        store = CheckpointStore(directory, lock=lock)
        _save_one(store)
        shutil.rmtree(directory)
        with caplog.at_level("ERROR", logger="connectors.checkpoint"):
            assert _save_one(store).exists()  # created again, and locked again
        assert ("was removed and created again, or its lock file was removed or replaced: "
                "locked it again") in caplog.text
        # A second daemon is refused by the new directory's lock, as by the first one's.
        with pytest.raises(DaemonError, match="in use by another daemon"), _locked(directory):
            pass
        # Removed again, and this time another daemon locks the new directory first: this
        # one writes nothing more there (it had deleted the other's temporary files before).
        shutil.rmtree(directory)
        other = DirectoryLock(directory)
        other.acquire()
        try:
            pending = directory / ".checkpoint-9.tmp"
            pending.write_bytes(b"the other daemon's write")
            with pytest.raises(CheckpointLockLost, match="could not lock it again"):
                _save_one(store)
            assert pending.exists() and store.paths() == []
        finally:
            other.release()


def test_a_directory_replaced_while_a_checkpoint_is_written_keeps_nothing_of_it(tmp_path,
                                                                                monkeypatch):
    import shutil

    import connectors.checkpoint as checkpoint_module
    from connectors.checkpoint import CheckpointLockLost, DirectoryLock

    directory = tmp_path / "ckpt"
    other = DirectoryLock(directory)
    replace = os.replace

    def replaced_meanwhile(source, target):
        replace(source, target)
        # Meanwhile the directory was removed, created again and locked by another daemon.
        shutil.rmtree(directory)
        other.acquire()
        (directory / Path(target).name).write_bytes(Path(tmp_path / "copy").read_bytes())

    with _locked(directory) as lock:
        store = CheckpointStore(directory, lock=lock)
        (tmp_path / "copy").write_bytes(_save_one(store).read_bytes())
        monkeypatch.setattr(checkpoint_module.os, "replace", replaced_meanwhile)
        try:
            with pytest.raises(CheckpointLockLost):
                _save_one(store)
            monkeypatch.undo()
            # Nothing of this writer's is left in the other daemon's directory.
            assert store.paths() == []
        finally:
            other.release()


def test_a_recreated_directory_that_cannot_be_locked_is_a_write_failure_retried(tmp_path):
    import shutil

    from connectors.checkpoint import CheckpointLockLost

    directory = tmp_path / "ckpt"
    with _locked(directory) as lock:
        store = CheckpointStore(directory, lock=lock)
        shutil.rmtree(directory)
        directory.mkdir()
        (directory / ".lock").symlink_to(tmp_path / "elsewhere")
        with pytest.raises(CheckpointError, match="symbolic link") as caught:
            _save_one(store)
        assert not isinstance(caught.value, CheckpointLockLost)  # no other daemon: retried
        (directory / ".lock").unlink()
        assert _save_one(store).exists()  # the next write locks it and goes on


def test_a_new_model_logs_its_input_limits_too(tmp_path, caplog):
    with caplog.at_level("INFO", logger="connectors.daemon"), \
            pytest.raises(DaemonError, match=r"unreachable|giving up"):
        Daemon(_settings(tmp_path, **{"model.max_features": 50})).run()
    assert ("(input limits {'max_features': 50, 'max_new_features': 1000, "
            "'far_points': 'refuse'})") in caplog.text


def test_commits_that_raised_but_were_made_are_not_taken_for_another_daemons(tmp_path,
                                                                             monkeypatch):
    # On a broker that keeps no commit metadata (the embedded one) only offsets tell commits
    # apart: a commit that raised but was made, then one that raised and was not, made the
    # next commit read the first one as another consumer's, and a lone daemon stopped.
    from kafka import OffsetAndMetadata, TopicPartition
    from kafka.errors import KafkaTimeoutError

    import connectors.daemon

    monkeypatch.setattr(connectors.daemon, "GROUP_CHECK_SECONDS", 0.0)
    stored = {}

    class Consumer:  # a broker that drops commit metadata, and loses some acknowledgements
        def __init__(self) -> None:
            self.plan = ["ok", "made, then raised", "raised", "ok", "ok"]

        def committed(self, tp, metadata=False, timeout_ms=None):
            offset = stored.get(tp)
            return None if offset is None else OffsetAndMetadata(offset, "", -1)

        def commit(self, offsets):
            what = self.plan.pop(0)
            if what != "raised":
                stored.update({tp: meta.offset for tp, meta in offsets.items()})
            if what != "ok":
                raise KafkaTimeoutError("commit response not received in time")

    daemon = Daemon(_settings(tmp_path))
    daemon.processor = daemon._new_processor(build_model(daemon.config))
    daemon._consumer = Consumer()
    stored[TopicPartition("in", 0)] = 100  # this daemon's previous run
    daemon._group_known["in:0"] = (100, "")
    for offset in (150, 200, 250, 300, 350):
        daemon._covered = {"in:0": offset}
        daemon._commit()
        assert not daemon.stop_event.is_set(), offset
    assert stored[TopicPartition("in", 0)] == 350
    # A commit nobody here tried is another consumer's.
    stored[TopicPartition("in", 0)] = 999
    daemon._covered = {"in:0": 400}
    daemon._commit()
    assert daemon.stop_event.is_set() and daemon.summary.exit_code == 1


def test_a_signal_repeated_at_once_is_one_stop_request(tmp_path, caplog):
    # GNU timeout signals the daemon, then its process group: the daemon took the second
    # SIGTERM for a second request, which gives undelivered outputs up, and said so.
    import signal

    daemon = Daemon(_settings(tmp_path))
    daemon.stop(signal.SIGTERM)
    daemon.stop(signal.SIGTERM)
    assert daemon.stop_event.is_set() and not daemon._second_stop.is_set()
    assert "stop requested again" not in caplog.text
    daemon.stop(signal.SIGINT)  # another signal is another request (a user's Ctrl-C)
    assert daemon._second_stop.is_set()

    later = Daemon(_settings(tmp_path))
    later.stop(signal.SIGTERM)
    later._first_stop = (signal.SIGTERM, later._first_stop[1] - 1.0)  # a second ago
    later.stop(signal.SIGTERM)
    assert later._second_stop.is_set() and "stop requested again" in caplog.text


def test_the_latencies_kept_for_percentiles_are_bounded(tmp_path, monkeypatch):
    # One float per output for the daemon's life: 2.7 GB a day at 1,000 messages per second.
    monkeypatch.setattr(Daemon, "LATENCIES_KEPT", 50)
    daemon = Daemon(_settings(tmp_path))
    daemon._producer = _PartitionedProducer()
    daemon.processor = daemon._new_processor(build_model(daemon.config))
    for start in range(0, 120, 40):
        daemon._handle([_record(i, {"id": i, "x": {"a": i / 100}})
                        for i in range(start, start + 40)])
    assert daemon.summary.outputs == 120 and len(daemon.latencies) == 50


def test_a_stop_signal_that_interrupts_a_write_to_stderr_still_stops(tmp_path, monkeypatch):
    # The handler logged before setting the stop: a signal arriving while the main thread
    # wrote to stderr made that log line raise (a reentrant call) and the request was lost.
    import signal

    import connectors.daemon as daemon_module

    def reentrant(*_: Any, **__: Any) -> None:
        raise RuntimeError("reentrant call inside <_io.BufferedWriter name='<stderr>'>")

    daemon = Daemon(_settings(tmp_path))
    monkeypatch.setattr(daemon_module.log, "info", reentrant)
    monkeypatch.setattr(daemon_module.log, "warning", reentrant)
    daemon.stop(signal.SIGHUP)
    assert daemon.stop_event.is_set() and daemon._stop_requests == 1
    daemon.stop(signal.SIGTERM)
    assert daemon._second_stop.is_set() and daemon._stop_requests == 2


class _FrozenBrokerProducer(_TooLargeProducer):
    """A producer whose broker stalls: every flush waits its whole timeout, then times out."""

    def __init__(self) -> None:
        super().__init__(refused=b"")
        self.waits: list[tuple[float, float]] = []  # (when, timeout) of each flush

    def flush(self, timeout: float | None = None) -> None:
        from kafka.errors import KafkaTimeoutError

        self.waits.append((time.monotonic(), float(timeout or 0.0)))
        time.sleep(timeout or 0.0)
        raise KafkaTimeoutError("Timeout waiting for future")


def test_a_second_stop_ends_the_wait_for_a_stalled_broker_within_a_second(tmp_path):
    # Each flush waited kafka.request_timeout_ms (twice per attempt) before the second stop
    # was looked at: 80 s from a second SIGTERM to the exit with a stalled broker.
    import threading

    config = _settings(tmp_path, **{"kafka.request_timeout_ms": 5000,
                                    "retry.initial_backoff_seconds": 0.01,
                                    "retry.max_backoff_seconds": 0.01})
    daemon = Daemon(config)
    daemon._producer = producer = _FrozenBrokerProducer()
    daemon.stop()
    second = threading.Timer(0.3, daemon.stop)
    second.start()
    try:
        assert daemon._deliver([("out", None, b"one")]) is False
    finally:
        second.cancel()
    after = [timeout for when, timeout in producer.waits if when >= producer.waits[0][0] + 0.3]
    assert sum(after) <= 2.0  # at most a slice of a second per flush once asked twice


def test_a_batch_learned_and_waiting_for_the_broker_counts_as_unsaved(tmp_path):
    # stream_svm_seconds_unsaved (the README's alert) read 0 through a broker stall of
    # minutes: the batch was counted only once its outputs were delivered.
    import re

    daemon = Daemon(_settings(tmp_path))
    daemon.processor = daemon._new_processor(build_model(daemon.config))
    seen: list[float] = []

    class Watching(_PartitionedProducer):
        def flush(self, timeout: float | None = None) -> None:
            time.sleep(0.05)  # the broker answers late
            text = daemon.metrics.render().decode()
            seen.append(float(re.search(r"^stream_svm_seconds_unsaved (\S+)$", text, re.M)[1]))

    daemon._producer = Watching()
    daemon._handle([_record(i, {"id": i, "x": {"a": i / 10}, "y": i % 2 == 0})
                    for i in range(4)])
    assert seen and seen[0] > 0.0


def test_a_reset_that_stops_the_daemon_is_logged_once_per_partition(tmp_path, caplog):
    # The same partition found reset twice in one check (beyond its end, and a new topic
    # id) gave two ERROR lines; another partition's reset must still be named.
    from kafka import TopicPartition

    config = _settings(tmp_path)
    daemon = Daemon(config)
    daemon.processor = daemon._new_processor(build_model(config))
    daemon._consumer = consumer = _Seeking()
    first, second = TopicPartition("in", 0), TopicPartition("in", 1)
    with caplog.at_level(logging.ERROR, logger="connectors.daemon"):
        daemon._partition_reset(consumer, first, "beyond_end", "it ends at 0")
        daemon._partition_reset(consumer, first, "topic_recreated", "a new topic id")
        daemon._partition_reset(consumer, second, "beyond_end", "it ends at 0")
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(lines) == 2 and "partition in:0 " in lines[0] and "partition in:1 " in lines[1]
    assert daemon.stop_event.is_set() and daemon.summary.exit_code == 1


def test_a_reset_names_the_topic_created_at_this_start_only_while_no_reconnect_came_since(
        tmp_path, caplog):
    # The daemon created its input topic at its start; then the broker restarted empty and
    # a producer created the topic again, with 4 partitions: the refusal still said the
    # daemon had created it, and not how many partitions it had now.
    from kafka import TopicPartition

    class Partitioned(_Seeking):
        def partitions_for_topic(self, topic: str) -> set[int]:
            return {0, 1, 2, 3}

    def refusal(daemon: Daemon) -> str:
        caplog.clear()
        with caplog.at_level(logging.ERROR, logger="connectors.daemon"):
            daemon._partition_reset(daemon._consumer, TopicPartition("in", 0), "beyond_end",
                                    "the partition ends at 0")
        return next(r.getMessage() for r in caplog.records if r.levelno == logging.ERROR)

    config = _settings(tmp_path)
    for reconnected in (False, True):
        daemon = Daemon(config)
        daemon.processor = daemon._new_processor(build_model(config))
        daemon._consumer = Partitioned()
        daemon._created_topics.add("in")
        if reconnected:
            daemon._notice_reconnect()
        told = refusal(daemon)
        assert ("this daemon created it anew" in told) is not reconnected
        assert "; in has 4 partition(s) now" in told
