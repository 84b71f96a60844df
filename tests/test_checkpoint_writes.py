"""Checkpoints on disk (connectors.checkpoint): a write a kill cannot tear and that prunes
nothing before it is in place, the directory's lock kept across writes, and a checkpoint
whose metadata or array data is damaged refused, the older one restored."""

from __future__ import annotations

import errno
import logging
import os
import zipfile

import numpy as np
import pytest

from connectors.checkpoint import CheckpointError, CheckpointStore, DirectoryLock
from tests.test_connectors_hardening import _with_metadata


def test_a_checkpoint_is_written_under_another_name_and_renamed_into_place(tmp_path,
                                                                         monkeypatch):
    # A write killed midway (a crash, SIGKILL, a power cut) must leave the older checkpoints
    # as the newest: written under its final name, the half-written file would be taken for
    # the newest checkpoint (and, had it been pruned to keep, the good ones gone).
    store = CheckpointStore(tmp_path, keep=1)
    first = store.save({"w": np.zeros(3)}, {}, {"offsets": {"in:0": 1}})
    seen: list[list[str]] = []
    fsync = os.fsync

    def killed(descriptor: int) -> None:
        seen.append(sorted(os.listdir(tmp_path)))
        raise KeyboardInterrupt  # (not an OSError: nothing cleans up, as after a kill)

    monkeypatch.setattr(os, "fsync", killed)
    try:
        store.save({"w": np.ones(3)}, {}, {"offsets": {"in:0": 2}})
    except KeyboardInterrupt:
        pass
    monkeypatch.setattr(os, "fsync", fsync)
    assert seen and not any(n.startswith("checkpoint-") and n != first.name for n in seen[0])
    loaded = CheckpointStore(tmp_path, keep=1).load_latest()
    assert loaded.path == first
    assert loaded.state["offsets"] == {"in:0": 1}


def test_a_write_that_fails_prunes_nothing_so_keep_1_still_has_its_checkpoint(tmp_path,
                                                                           monkeypatch):
    # Old checkpoints go only once the new one is in place: pruned before a write that then
    # fails (a full disk, an I/O error), keep=1 leaves no checkpoint at all, and the next
    # start finds an empty directory and starts a new, empty model.
    store = CheckpointStore(tmp_path, keep=1)
    first = store.save({"w": np.zeros(3)}, {}, {"offsets": {"in:0": 1}})

    def failing(descriptor: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", failing)
    with pytest.raises(CheckpointError, match="No space left"):
        store.save({"w": np.ones(3)}, {}, {"offsets": {"in:0": 2}})
    monkeypatch.undo()
    assert [path for _, path in store.paths()] == [first]
    assert store.load_latest().state["offsets"] == {"in:0": 1}


def test_a_lock_still_held_is_kept_across_writes_not_dropped_and_taken_again(tmp_path,
                                                                            caplog):
    # verify() before every write must leave a lock that still guards the directory alone:
    # released and taken again, another daemon could take it in between (and this one would
    # stop writing checkpoints), and every write would say the directory was replaced.
    directory = tmp_path / "deep" / "ckpt"
    lock = DirectoryLock(directory)
    lock.acquire()
    try:
        handle = lock._handle
        identity = os.stat(directory / ".lock").st_ino
        store = CheckpointStore(directory, lock=lock)
        with caplog.at_level(logging.WARNING, logger="connectors.checkpoint"):
            for value in range(3):
                store.save({"w": np.full(2, float(value))}, {}, {"n": value})
        assert not caplog.records, caplog.text
        assert lock._handle is handle and lock.held()
        assert os.stat(directory / ".lock").st_ino == identity
        assert [sequence for sequence, _ in store.paths()] == [3, 2, 1]
    finally:
        lock.release()


@pytest.mark.parametrize("part, value", [("model", [1.0]), ("state", "offsets"),
                                         ("model", None)])
def test_a_checkpoint_whose_model_or_state_is_not_an_object_is_refused(tmp_path, part, value):
    # Restored, a list or a string in their place would reach the model and the daemon's
    # state (e.g. its offsets) and fail there, or be taken for an empty state.
    store = CheckpointStore(tmp_path)
    older = store.save({"w": np.zeros(2)}, {"C": 1.0}, {"offsets": {"in:0": 5}})
    newest = store.save({"w": np.ones(2)}, {"C": 1.0}, {"offsets": {"in:0": 9}})
    _with_metadata(newest, newest, lambda document: document.__setitem__(part, value))
    with pytest.raises(CheckpointError, match="malformed metadata"):
        store.read(newest)
    assert store.load_latest().path == older


def _flip_a_data_byte(path, member: str) -> None:
    """Flip one byte in the middle of ``member``'s data, where no header check can see it."""
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo(member)
    raw = bytearray(path.read_bytes())
    # local file header: 30 bytes + name + extra field, then the (stored) data
    name_length = int.from_bytes(raw[info.header_offset + 26:info.header_offset + 28], "little")
    extra_length = int.from_bytes(raw[info.header_offset + 28:info.header_offset + 30], "little")
    start = info.header_offset + 30 + name_length + extra_length
    raw[start + info.compress_size - 8] ^= 0x40  # inside the array's data, past its header
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize("member", ["alpha.npy", "cache.features.npy"])
def test_a_checkpoint_with_damaged_array_data_is_not_restored(tmp_path, member):
    store = CheckpointStore(tmp_path)
    good = {"alpha": np.linspace(0.0, 1.0, 1000)}
    older = store.save(good, {"C": 1.0}, {"offsets": {"in:0": 10}},
                       cache_arrays={"features": np.ones(1000)})
    newest = store.save({"alpha": np.linspace(1.0, 2.0, 1000)}, {"C": 1.0},
                        {"offsets": {"in:0": 20}}, cache_arrays={"features": np.ones(1000)})
    _flip_a_data_byte(newest, member)
    with pytest.raises(CheckpointError, match=r"Bad CRC|unusable"):
        store.read(newest)
    loaded = store.load_latest()  # the older, whole checkpoint instead
    assert loaded.path == older
    assert loaded.arrays["alpha"].tobytes() == good["alpha"].tobytes()


def test_a_directory_named_like_an_old_checkpoint_is_set_aside_not_warned_of_for_ever(
        tmp_path, caplog):
    # Pruning could not remove it: "could not remove the old checkpoint ... Is a directory"
    # at every checkpoint, across restarts.
    store = CheckpointStore(tmp_path, keep=1)
    (tmp_path / "checkpoint-000000000001.npz").mkdir()
    with caplog.at_level(logging.WARNING, logger="connectors.checkpoint"):
        for value in range(3):
            store.save({"w": np.full(2, float(value))}, {}, {"n": value})
    assert "could not remove" not in caplog.text
    assert caplog.text.count("is not a checkpoint but a directory; set aside as") == 1
    [aside] = store.set_aside_paths()
    assert aside.is_dir() and aside.name.startswith("checkpoint-000000000001.npz.unusable-")
    assert [path.name for _, path in store.paths()] == ["checkpoint-000000000004.npz"]
    assert store.load_latest().state == {"n": 2}
