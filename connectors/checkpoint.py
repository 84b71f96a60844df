"""Checkpoint files: the model's arrays and metadata together with the daemon's state (the next
offset of every partition, the cache of unlabelled features, counters), in one file written
atomically.

Format: a ``.npz`` archive (numpy arrays only, read back with ``allow_pickle=False``) whose
member ``__meta__`` holds UTF-8 JSON, and whose other members are the model's arrays. Nothing is
ever unpickled. Files are written to a temporary name, fsynced, renamed into place and the
directory fsynced, so that a crash leaves either the old or the new checkpoint, never half of
one. The last ``keep`` checkpoints are kept; loading falls back to an older one when the newest
is corrupt.

>>> import numpy as np, tempfile
>>> store = CheckpointStore(tempfile.mkdtemp())
>>> path = store.save({"alpha": np.zeros(3)}, {"C": 1.0}, {"offsets": {"in:0": 42}})
>>> loaded = store.load_latest()
>>> loaded.arrays["alpha"].tolist(), loaded.model_meta, loaded.state["offsets"]
([0.0, 0.0, 0.0], {'C': 1.0}, {'in:0': 42})
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import time
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["Checkpoint", "CheckpointError", "CheckpointStore"]

log = logging.getLogger(__name__)

FORMAT = "stream-svm-checkpoint"
VERSION = 1
_META = "__meta__"
_NAME = re.compile(r"^checkpoint-(\d{12})\.npz$")


class CheckpointError(RuntimeError):
    """No usable checkpoint although checkpoint files exist, or one could not be written."""


@dataclass
class Checkpoint:
    """A loaded checkpoint: the model's ``(arrays, model_meta)`` and the daemon's ``state``."""

    path: Path
    sequence: int
    arrays: dict[str, np.ndarray]
    model_meta: dict[str, Any]
    state: dict[str, Any]
    restored: Any = None


def _fsync_directory(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class CheckpointStore:
    """The checkpoints of one daemon, in one directory (created if missing)."""

    def __init__(self, directory: str | os.PathLike[str], keep: int = 3) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.directory = Path(directory)
        self.keep = keep
        self.directory.mkdir(parents=True, exist_ok=True)

    def paths(self) -> list[tuple[int, Path]]:
        """Existing checkpoint files, newest first."""
        found = []
        for path in self.directory.iterdir():
            match = _NAME.match(path.name)
            if match:
                found.append((int(match.group(1)), path))
        return sorted(found, reverse=True)

    def save(
        self,
        arrays: Mapping[str, np.ndarray],
        model_meta: Mapping[str, Any],
        state: Mapping[str, Any],
    ) -> Path:
        """Write a new checkpoint atomically and prune old ones; returns its path."""
        if _META in arrays:
            raise CheckpointError(f"the model's arrays may not use the reserved name {_META!r}")
        for name, array in arrays.items():
            if np.asarray(array).dtype == object:
                raise CheckpointError(f"array {name!r} has dtype object, which needs pickle")
        existing = self.paths()
        sequence = existing[0][0] + 1 if existing else 1
        document = {
            "format": FORMAT,
            "version": VERSION,
            "sequence": sequence,
            "model": dict(model_meta),
            "state": dict(state),
        }
        try:
            meta = json.dumps(document, allow_nan=False, separators=(",", ":")).encode("utf-8")
        except (TypeError, ValueError) as exc:
            raise CheckpointError(f"checkpoint metadata is not JSON-serializable: {exc}") from None
        final = self.directory / f"checkpoint-{sequence:012d}.npz"
        temporary = self.directory / f".{final.name}.{os.getpid()}.tmp"
        members = {name: np.asarray(array) for name, array in arrays.items()}
        members[_META] = np.frombuffer(meta, dtype=np.uint8)
        try:
            with open(temporary, "wb") as handle:
                np.savez(handle, **members)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temporary, final)
            _fsync_directory(self.directory)
        except OSError as exc:
            temporary.unlink(missing_ok=True)
            raise CheckpointError(f"could not write checkpoint {final}: {exc}") from exc
        for _, old in existing[self.keep - 1 :]:
            old.unlink(missing_ok=True)
        return final

    def read(self, path: Path) -> Checkpoint:
        """Read and check one checkpoint file; raises :class:`CheckpointError` naming the
        problem."""
        match = _NAME.match(path.name)
        if not match:
            raise CheckpointError(f"{path} is not named like a checkpoint")
        try:
            with np.load(path, allow_pickle=False) as archive:
                # Reading every member checks every CRC of the archive.
                members = {name: archive[name] for name in archive.files}
        except (OSError, ValueError, EOFError, zipfile.BadZipFile, KeyError) as exc:
            raise CheckpointError(f"checkpoint {path} is unreadable: {exc}") from None
        if _META not in members:
            raise CheckpointError(f"checkpoint {path} has no {_META} member")
        try:
            document = json.loads(members.pop(_META).tobytes().decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise CheckpointError(f"checkpoint {path} has corrupt metadata: {exc}") from None
        if not isinstance(document, dict) or document.get("format") != FORMAT:
            raise CheckpointError(f"checkpoint {path} is not a {FORMAT} file")
        if document.get("version") != VERSION:
            raise CheckpointError(
                f"checkpoint {path} has format version {document.get('version')!r}; "
                f"this stream-svm reads version {VERSION}"
            )
        return Checkpoint(
            path=path,
            sequence=int(match.group(1)),
            arrays=members,
            model_meta=document.get("model", {}),
            state=document.get("state", {}),
        )

    def load_latest(self, restore: Callable[[Checkpoint], Any] | None = None) -> Checkpoint | None:
        """The newest usable checkpoint; None when there is none at all.

        A checkpoint is usable when it reads back and ``restore(checkpoint)`` (e.g. rebuilding
        the model) does not raise; the result of ``restore`` is stored in ``checkpoint.restored``.
        An unusable one is logged as an error and the previous one is tried; when checkpoint
        files exist but none is usable, raises :class:`CheckpointError` rather than silently
        start from scratch."""
        candidates = self.paths()
        problems = []
        for _, path in candidates:
            try:
                checkpoint = self.read(path)
                if restore is not None:
                    try:
                        checkpoint.restored = restore(checkpoint)
                    except Exception as exc:
                        raise CheckpointError(
                            f"checkpoint {path} could not be restored: "
                            f"{type(exc).__name__}: {exc}"
                        ) from exc
            except CheckpointError as exc:
                problems.append(str(exc))
                # Set aside (kept for inspection), so that pruning never counts it as one of
                # the checkpoints to keep and deletes a good one instead.
                aside = path.with_name(f"{path.name}.unusable-{int(time.time())}")
                with contextlib.suppress(OSError):
                    os.replace(path, aside)
                log.error("%s; set aside as %s, trying the previous checkpoint", exc, aside.name)
                continue
            if problems:
                log.warning("restored the older checkpoint %s", path)
            return checkpoint
        if problems:
            raise CheckpointError(
                "no usable checkpoint in "
                f"{self.directory}: {'; '.join(problems)}. Move the directory away to start "
                "a new model from the committed offsets."
            )
        return None
