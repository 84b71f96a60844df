"""Checkpoint files: the model's arrays and metadata together with the daemon's state (the next
offset of every partition, the cache of unlabelled features, counters), in one file written
atomically.

Format: a ``.npz`` archive of plain numpy arrays (numbers and text only) whose member
``__meta__`` holds UTF-8 JSON: the model's metadata, the daemon's state, and a manifest of the
other members with their dtypes and shapes. The model's arrays are members under their own
names, the unlabelled cache's under ``cache.<name>``. Nothing is ever unpickled, and a member is
read only after its header was checked: an allowed dtype, the shape of the manifest, and exactly
as many bytes as the archive stores (so a crafted header cannot make the reader allocate more
than the file holds); only the members asked for are read. Files are written with mode 0600
(they hold raw training data) to a temporary name, fsynced, renamed into place and the directory
fsynced, so that a crash leaves either the old or the new checkpoint, never half of one. The
last ``keep`` checkpoints are kept; loading falls back to an older one when the newest is
unusable.

>>> import numpy as np, tempfile
>>> store = CheckpointStore(tempfile.mkdtemp())
>>> path = store.save({"alpha": np.zeros(3)}, {"C": 1.0}, {"offsets": {"in:0": 42}})
>>> loaded = store.load_latest()
>>> loaded.arrays["alpha"].tolist(), loaded.model_meta, loaded.state["offsets"]
([0.0, 0.0, 0.0], {'C': 1.0}, {'in:0': 42})
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import math
import os
import re
import stat
import time
import zipfile
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["Checkpoint", "CheckpointError", "CheckpointFromNewerVersion", "CheckpointLockLost",
           "CheckpointMismatch", "CheckpointStore", "DirectoryLock"]

log = logging.getLogger(__name__)

FORMAT = "stream-svm-checkpoint"
VERSION = 2
#: Version 1 kept the unlabelled cache in the JSON metadata and had no manifest.
READABLE_VERSIONS = (1, 2)
_META = "__meta__"
CACHE_PREFIX = "cache."
#: Member names np.savez would take for its own arguments (allow_pickle became its flag, and
#: the checkpoint lacked a member it listed; file raised a bare TypeError).
_SAVEZ_ARGUMENTS = frozenset({"file", "allow_pickle"})
# Twelve digits at least: a sequence past 999999999999 writes a longer name, which must count
# as the newest rather than be overwritten unseen at every save.
_NAME = re.compile(r"^checkpoint-(\d{12,})\.npz$")
#: Array kinds a checkpoint may hold: booleans, integers, floats and text.
_KINDS = "biufU"

#: ``check(name, dtype, shape)`` raises CheckpointError for a member the model cannot hold.
MemberCheck = Callable[[str, np.dtype, tuple[int, ...]], None]


class CheckpointError(RuntimeError):
    """No usable checkpoint although checkpoint files exist, or one could not be written."""


class CheckpointMismatch(CheckpointError):
    """A readable checkpoint that belongs to another configuration: nothing was touched."""


class CheckpointFromNewerVersion(CheckpointMismatch):
    """A checkpoint whose format version is newer than this stream-svm reads (written after an
    upgrade that was then rolled back): refused with nothing touched, as a checkpoint of
    another configuration is. Set aside, an older checkpoint would have been restored in its
    place, and the model would have gone back in time without anyone asking."""


class CheckpointLockLost(CheckpointError):
    """The checkpoint directory was removed and created again, and another process holds its
    new lock: this one must write no more checkpoints there."""


class _LockBusy(CheckpointError):
    """Another process holds the directory's lock."""


class DirectoryLock:
    """One process's exclusive lock on a checkpoint directory (flock on its ``.lock`` file,
    which holds the owner's pid). :meth:`verify` finds a directory removed and created again
    (the lock then guards a file no longer in it) and takes the new one's lock, or raises
    :class:`CheckpointLockLost` when another process took it first."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self._handle: Any = None
        self._pid_written = True  # (False while the lock file holds another's pid)
        #: the directories acquire created, the deepest first: released with nothing but the
        #: lock file in them (a refused start), they are removed again
        self._created: list[Path] = []

    def acquire(self) -> None:
        """Take the lock (creating the directory, mode 0700); CheckpointError when another
        process holds it or the lock file cannot be used."""
        missing = [path for path in (self.directory, *self.directory.parents)
                   if not path.exists()]
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            self._created = missing
        except (FileExistsError, NotADirectoryError):
            if self.directory.is_symlink() and not self.directory.exists():
                raise CheckpointError(
                    f"the checkpoint directory {self.directory} (checkpoint.dir, "
                    f"--checkpoint-dir) is a symbolic link to {os.readlink(self.directory)}, "
                    "which does not exist: create that directory, or give another") from None
            raise CheckpointError(f"the checkpoint directory {self.directory} (checkpoint.dir, "
                                  "--checkpoint-dir) is a file, or lies under one: give a "
                                  "directory") from None
        except OSError as exc:  # (permissions, a read-only or pseudo file system: /proc/x)
            raise CheckpointError(f"cannot create the checkpoint directory {self.directory} "
                                  f"(checkpoint.dir, --checkpoint-dir): {exc.strerror}") from None
        path = self.directory / ".lock"
        writable = True
        try:
            # O_NOFOLLOW: a symbolic link planted as .lock must not make the daemon open (and
            # write its pid into) whatever file it points to.
            descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                                 0o600)
        except OSError as exc:
            if path.is_symlink():
                raise CheckpointError(f"the lock file {path} is a symbolic link; refusing to "
                                      "follow it (remove it)") from None
            descriptor = -1
            if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
                # A directory turned read-only (a file system remounted after errors): the
                # lock file a daemon left there locks as well read-only (flock needs no
                # write), and the daemon starts from its checkpoints, whose writes then fail,
                # logged, as when the disk is full. A crash loop served nothing.
                with contextlib.suppress(OSError):
                    descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            if descriptor < 0:
                raise CheckpointError(f"cannot open the lock file {path} of the checkpoint "
                                      f"directory (checkpoint.dir, --checkpoint-dir): {exc}"
                                      ) from None
            writable = False
            log.warning("the checkpoint directory %s cannot be written (%s): locked through "
                        "its existing lock file, read-only; checkpoints fail until it can be "
                        "written", self.directory, exc.strerror or exc)
        handle = os.fdopen(descriptor, "r+" if writable else "r")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            holder = ""
            with contextlib.suppress(OSError, ValueError):
                pid = int(path.read_text().strip())
                holder = f" (process {pid}, as its lock file says)"
                if not _running(pid):
                    # (The holder took the lock on a full or read-only file system, where it
                    # could not write its pid: the one there is an earlier daemon's.)
                    holder = (f" (its lock file names process {pid}, which is not running "
                              "here: the daemon holding the lock runs elsewhere, in another "
                              "container or host, or could not write its own pid there, on "
                              "a full or read-only file system)")
            raise _LockBusy(
                f"checkpoint directory {self.directory} is in use by another daemon{holder}: "
                "stop it, or give this one another checkpoint.dir (--checkpoint-dir)") from None
        self._handle = handle
        self._pid_written = False
        if writable:
            try:
                self._write_pid()
            except OSError as exc:
                # (A full disk.) The lock is held all the same (flock needs no data; the pid
                # only tells an operator who holds it): the daemon starts, and its checkpoints
                # fail, logged, until the disk has room, as when it fills while the daemon
                # runs; the pid is written with the first checkpoint that can be. The start
                # was refused with a bare "[Errno 28] No space left on device".
                log.warning("cannot write this daemon's pid into the lock file %s (%s): the "
                            "checkpoint directory is locked all the same", path,
                            exc.strerror or exc)

    def catch_up_pid(self) -> None:
        """Write this process's pid into the lock file it holds if it could not be written
        when the lock was taken (a read-only or full file system), once it can be: until
        then, the file names the daemon that wrote it before."""
        if self._handle is not None and not self._pid_written:
            with contextlib.suppress(OSError):
                self._write_pid()

    def _write_pid(self) -> None:
        """This process's pid into the lock file it holds (OSError when it cannot be)."""
        assert self._handle is not None
        if "+" in self._handle.mode:
            descriptor, own = self._handle.fileno(), False
        else:  # (locked read-only: written through a descriptor of its own, once it can be)
            descriptor = os.open(self.directory / ".lock",
                                 os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            own = True
            opened, held = os.fstat(descriptor), os.fstat(self._handle.fileno())
            if (opened.st_dev, opened.st_ino) != (held.st_dev, held.st_ino):
                # (Replaced since it was locked, maybe locked by another daemon by now:
                # not this one's to write into.)
                os.close(descriptor)
                raise OSError(errno.ESTALE, "the lock file was replaced")
        try:
            # Unbuffered, on the descriptor: nothing is left for the handle to flush later.
            os.ftruncate(descriptor, 0)
            os.write(descriptor, str(os.getpid()).encode())
        finally:
            if own:
                os.close(descriptor)
        self._pid_written = True

    def held(self) -> bool:
        """Whether the directory's lock file is still the one this lock holds."""
        if self._handle is None:
            return False
        try:
            current = os.stat(self.directory / ".lock", follow_symlinks=False)
        except OSError:
            return False
        mine = os.fstat(self._handle.fileno())
        return (current.st_dev, current.st_ino) == (mine.st_dev, mine.st_ino)

    def verify(self) -> None:
        """Hold the lock of the directory as it is now (see the class), with this process's
        pid in its lock file once it can be written."""
        if self.held():
            self.catch_up_pid()
            return
        self.release()
        try:
            self.acquire()
        except _LockBusy as exc:
            raise CheckpointLockLost(
                f"checkpoint directory {self.directory} was removed and created again, or its "
                f"lock file was removed or replaced, and this daemon could not lock it again "
                f"({exc})") from None
        # (any other failure to lock it is the write's: retried like one)
        log.error("checkpoint directory %s was removed and created again, or its lock file "
                  "was removed or replaced: locked it again (a lock file removed lets another "
                  "daemon start on the directory until then)", self.directory)

    def release(self) -> None:
        """Give the lock up; directories it created that hold nothing but the lock file (a
        start refused before any checkpoint) are removed, so that a refusal leaves nothing."""
        if self._handle is not None:
            held = self.held()
            self._handle.close()
            self._handle = None
            with contextlib.suppress(OSError):
                if held and self._created and os.listdir(self.directory) == [".lock"]:
                    (self.directory / ".lock").unlink()
                    for directory in self._created:
                        directory.rmdir()  # (stops at the first one not empty)
        self._created = []


def _running(pid: int) -> bool:
    """Whether a process of this pid runs (one of another user's counts)."""
    if pid <= 0:
        return True  # (no process's pid: cannot tell, as the lock file says)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except (OSError, OverflowError, ValueError):
        return True  # (cannot tell: as the lock file says)
    return True


@dataclass
class Checkpoint:
    """A loaded checkpoint: the model's ``(arrays, model_meta)``, the daemon's ``state`` and the
    unlabelled cache's arrays (None for format 1, which kept the cache in ``state``)."""

    path: Path
    sequence: int
    arrays: dict[str, np.ndarray]
    model_meta: dict[str, Any]
    state: dict[str, Any]
    cache_arrays: dict[str, np.ndarray] | None = None
    version: int = VERSION
    restored: Any = None
    manifest: dict[str, Any] = field(default_factory=dict)


def _fsync_directory(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _read_member(
    archive: zipfile.ZipFile,
    name: str,
    declared: tuple[str, tuple[int, ...]] | None,
    check: MemberCheck | None,
) -> np.ndarray:
    """One ``.npy`` member, read only after its header proved sane (raises ValueError)."""
    info = archive.getinfo(f"{name}.npy")
    with archive.open(info) as handle:
        version = np.lib.format.read_magic(handle)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(handle)
        elif version == (2, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(handle)
        else:
            raise ValueError(f"unsupported .npy format version {version}")
        if dtype.hasobject or dtype.kind not in _KINDS or dtype.fields is not None:
            raise ValueError(f"dtype {dtype} is not a plain number or text type")
        shape = tuple(int(d) for d in shape)
        if declared is not None and (np.dtype(declared[0]) != dtype or tuple(declared[1]) != shape):
            raise ValueError(
                f"header says {dtype} {shape}, the manifest {declared[0]} {tuple(declared[1])}"
            )
        count = math.prod(shape)
        stored = info.file_size - handle.tell()
        if count * dtype.itemsize != stored:
            raise ValueError(
                f"header declares {count * dtype.itemsize} bytes of data, the archive holds "
                f"{stored}"
            )
        if check is not None:
            check(name, dtype, shape)
        array = np.empty(count, dtype=dtype)
        if count and handle.readinto(array.view(np.uint8)) != stored:
            raise ValueError("member ends early")
        handle.read(1)  # reaching the end makes zipfile verify the member's CRC
    return array.reshape(shape[::-1]).T if fortran else array.reshape(shape)


def _open_regular(path: Path) -> Any:
    """``path`` opened for reading when it is a regular file; CheckpointError otherwise. The
    open does not block: a named pipe given a checkpoint's name would have held the daemon's
    start (and its stop) until something wrote into it."""
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            raise CheckpointError(f"checkpoint {path} is not a regular file")
        os.set_blocking(descriptor, True)
        return os.fdopen(descriptor, "rb")
    except BaseException:
        os.close(descriptor)
        raise


class CheckpointStore:
    """The checkpoints of one daemon, in one directory (created with mode 0700 if missing)."""

    def __init__(self, directory: str | os.PathLike[str], keep: int = 3,
                 lock: DirectoryLock | None = None) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.directory = Path(directory)
        self.keep = keep
        #: the writer's lock, verified before every write (see DirectoryLock.verify)
        self.lock = lock
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)

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
        cache_arrays: Mapping[str, np.ndarray] | None = None,
    ) -> Path:
        """Write a new checkpoint atomically (mode 0600) and prune old ones; returns its path."""
        members: dict[str, np.ndarray] = {}
        for name, array in arrays.items():
            if name == _META or name in _SAVEZ_ARGUMENTS or name.startswith(CACHE_PREFIX):
                raise CheckpointError(f"the model's arrays may not use the reserved name {name!r}")
            members[name] = np.asarray(array)
        for name, array in (cache_arrays or {}).items():
            members[CACHE_PREFIX + name] = np.asarray(array)
        for name, array in members.items():
            if array.dtype == object:
                raise CheckpointError(f"array {name!r} has dtype object, which needs pickle")
            if array.dtype.kind not in _KINDS:
                raise CheckpointError(f"array {name!r} has dtype {array.dtype}, not plain")
        try:
            existing = self._paths_to_write()
        except OSError as exc:
            raise CheckpointError(
                f"could not write a checkpoint in {self.directory}: {exc}") from exc
        sequence = existing[0][0] + 1 if existing else 1
        document = {
            "format": FORMAT,
            "version": VERSION,
            "sequence": sequence,
            "model": dict(model_meta),
            "state": dict(state),
            "arrays": {name: [a.dtype.str, list(a.shape)] for name, a in members.items()},
        }
        try:
            meta = json.dumps(document, allow_nan=False, separators=(",", ":")).encode("utf-8")
        except (TypeError, ValueError) as exc:
            raise CheckpointError(f"checkpoint metadata is not JSON-serializable: {exc}") from None
        final = self.directory / f"checkpoint-{sequence:012d}.npz"
        temporary = self.directory / f".{final.name}.{os.getpid()}.tmp"
        members[_META] = np.frombuffer(meta, dtype=np.uint8)
        try:
            descriptor = os.open(
                temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600
            )
            with os.fdopen(descriptor, "wb") as handle:
                np.savez(handle, **members)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temporary, final)
            _fsync_directory(self.directory)
        except OSError as exc:
            # (On a file system remounted read-only, as ext4 does after an I/O error, the
            # removal fails too: that must not replace the error the daemon survives. A file
            # left behind is removed by the next write that can.)
            with contextlib.suppress(OSError):
                temporary.unlink(missing_ok=True)
            raise CheckpointError(f"could not write checkpoint {final}: {exc}") from exc
        if self.lock is not None and not self.lock.held():
            # Removed, created again and locked by another process while this one wrote: the
            # file is in that one's directory, where it does not belong.
            final.unlink(missing_ok=True)
            self.lock.verify()  # CheckpointLockLost, unless the lock is free to take again
            raise CheckpointError(f"checkpoint directory {self.directory} was replaced while "
                                  f"checkpoint {final.name} was written; it is written again "
                                  "next time")
        for _, old in existing[self.keep - 1 :]:
            try:
                old.unlink(missing_ok=True)
            except OSError as exc:  # the new one is written: pruning is retried next time
                if not old.is_dir():
                    log.warning("could not remove the old checkpoint %s: %s", old, exc)
                    continue
                # Not a checkpoint but a directory named like one: set aside, as a restore
                # does (it was warned of at every checkpoint, for ever).
                with contextlib.suppress(OSError):
                    self.set_aside(old, f"{old} is not a checkpoint but a directory")
        return final

    def _paths_to_write(self) -> list[tuple[int, Path]]:
        """:meth:`paths`, before a write: a directory removed meanwhile is created again (its
        checkpoints are gone: the next one starts over), and temporary files left by a write
        that was killed (they hold training data) are removed. The daemon holds the
        directory's lock, so no other write is under way."""
        if not self.directory.exists():
            log.error("checkpoint directory %s has disappeared, with every checkpoint in it: "
                      "creating it again", self.directory)
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        if self.lock is not None:
            # Removed and created again (by this writer or another process): the lock this
            # writer holds guards nothing there any more, and a second daemon could start on
            # it (it did, and answered a third of the stream twice).
            self.lock.verify()
        for path in self.directory.glob(".checkpoint-*.tmp"):
            path.unlink(missing_ok=True)
        return self.paths()

    def read(
        self,
        path: Path,
        members: Collection[str] | None = None,
        check: MemberCheck | None = None,
        accept: Callable[[dict[str, Any], dict[str, Any]], None] | None = None,
        optional: Collection[str] = (),
    ) -> Checkpoint:
        """Read and check one checkpoint file; raises :class:`CheckpointError` naming the
        problem. ``members`` names the model arrays to read (default: all of them), and
        ``optional`` those read too where the file has them (arrays a later stream-svm
        writes, which one written before lacks); ``check``
        may refuse a member by its dtype and shape before it is read; ``accept(model_meta,
        state)`` may refuse the checkpoint (e.g. :class:`CheckpointMismatch`) before any array
        is read."""
        match = _NAME.match(path.name)
        if not match:
            raise CheckpointError(f"{path} is not named like a checkpoint")
        try:
            with _open_regular(path) as handle, zipfile.ZipFile(handle) as archive:
                stored = {
                    info.filename[: -len(".npy")]
                    for info in archive.infolist()
                    if info.filename.endswith(".npy")
                }
                if _META not in stored:
                    raise CheckpointError(f"checkpoint {path} has no {_META} member")
                raw = _read_member(archive, _META, None, None)
                if raw.dtype != np.uint8 or raw.ndim != 1:
                    raise CheckpointError(f"checkpoint {path} has a malformed {_META} member")
                try:
                    document = json.loads(raw.tobytes().decode("utf-8"))
                except (UnicodeDecodeError, ValueError) as exc:
                    raise CheckpointError(
                        f"checkpoint {path} has corrupt metadata: {exc}"
                    ) from None
                version = document.get("version") if isinstance(document, dict) else None
                if not isinstance(document, dict) or document.get("format") != FORMAT:
                    raise CheckpointError(f"checkpoint {path} is not a {FORMAT} file")
                if (isinstance(version, int) and not isinstance(version, bool)
                        and version > VERSION):
                    raise CheckpointFromNewerVersion(
                        f"checkpoint {path} was written by a newer stream-svm (format version "
                        f"{version}; this one reads versions "
                        f"{', '.join(map(str, READABLE_VERSIONS))}): run the stream-svm that "
                        "wrote it, or move the checkpoint directory aside to start a new model"
                    )
                if version not in READABLE_VERSIONS:
                    raise CheckpointError(
                        f"checkpoint {path} has format version {version!r}; this stream-svm "
                        f"reads versions {', '.join(map(str, READABLE_VERSIONS))}"
                    )
                if not isinstance(document.get("model", {}), dict) or not isinstance(
                    document.get("state", {}), dict
                ):
                    raise CheckpointError(f"checkpoint {path} has malformed metadata")
                if accept is not None:
                    accept(document.get("model", {}), document.get("state", {}))
                if version == 1 and any(name.startswith(CACHE_PREFIX) for name in stored):
                    # (version 1 kept the cache in the metadata: read as version 1, these
                    # members would be dropped and the cached features lost)
                    raise CheckpointError(
                        f"checkpoint {path} says format version 1 but holds {CACHE_PREFIX}* "
                        "members, which only version 2 writes: its metadata is damaged"
                    )
                manifest = document.get("arrays", {}) if version >= 2 else {
                    name: None for name in stored - {_META}
                }
                if not isinstance(manifest, dict):
                    raise CheckpointError(f"checkpoint {path} has a malformed manifest")
                missing = set(manifest) - stored
                if missing:
                    raise CheckpointError(
                        f"checkpoint {path} lacks the members {sorted(missing)} it lists"
                    )
                model_names = [n for n in manifest if not n.startswith(CACHE_PREFIX)]
                if members is not None:
                    wanted = set(members)
                    # Texts written before variable-width UTF-8: one fixed-width text array
                    # NAME where NAME_utf8 and NAME_ends are now (the model reads either).
                    for name in {n.rpartition("_")[0] for n in wanted
                                 if n.endswith(("_utf8", "_ends"))}:
                        if (f"{name}_utf8" not in manifest and f"{name}_ends" not in manifest
                                and name in manifest):
                            wanted -= {f"{name}_utf8", f"{name}_ends"}
                            wanted.add(name)
                    absent = wanted - set(model_names)
                    if absent:
                        raise CheckpointError(
                            f"checkpoint {path} has no member(s) {sorted(absent)}"
                        )
                    wanted |= set(optional)
                    model_names = [n for n in model_names if n in wanted]
                arrays = {}
                for name in model_names:
                    arrays[name] = self._member(archive, path, name, manifest[name], check)
                cache = None
                if version >= 2:
                    cache = {
                        name[len(CACHE_PREFIX):]: self._member(
                            archive, path, name, manifest[name], check
                        )
                        for name in manifest
                        if name.startswith(CACHE_PREFIX)
                    }
        except CheckpointError:
            raise
        except Exception as exc:  # a torn, truncated or crafted file; MemoryError included
            raise CheckpointError(
                f"checkpoint {path} is unreadable: {type(exc).__name__}: {exc}"
            ) from None
        return Checkpoint(
            path=path,
            sequence=int(match.group(1)),
            arrays=arrays,
            model_meta=document.get("model", {}),
            state=document.get("state", {}),
            cache_arrays=cache,
            version=version,
            manifest=manifest,
        )

    @staticmethod
    def _member(
        archive: zipfile.ZipFile,
        path: Path,
        name: str,
        declared: Any,
        check: MemberCheck | None,
    ) -> np.ndarray:
        if declared is not None and not (
            isinstance(declared, list) and len(declared) == 2 and isinstance(declared[0], str)
            and isinstance(declared[1], list)
            and all(isinstance(d, int) and d >= 0 for d in declared[1])
        ):
            raise CheckpointError(f"checkpoint {path}: malformed manifest entry for {name!r}")
        try:
            return _read_member(archive, name, declared, check)
        except CheckpointError:
            raise
        except Exception as exc:
            raise CheckpointError(
                f"checkpoint {path}: member {name!r} is unusable: {type(exc).__name__}: {exc}"
            ) from None

    def set_aside_paths(self) -> list[Path]:
        """Checkpoint files set aside earlier as unusable (``*.unusable-<time>``)."""
        return sorted(p for p in self.directory.iterdir() if ".npz.unusable-" in p.name)

    def set_aside(self, path: Path, problem: str) -> Path:
        """Rename an unusable checkpoint out of the way (kept for inspection, and no longer
        counted among the ``keep`` newest, so that pruning never deletes a good one instead)."""
        aside = path.with_name(f"{path.name}.unusable-{int(time.time())}")
        os.replace(path, aside)
        log.error("%s; set aside as %s", problem, aside.name)
        return aside

    def _say_killed_writes(self) -> None:
        """Warn of the temporary files that writes killed midway left (removed at the next
        write): a restart after such a stop logged as one after a clean stop, though the
        messages after the last checkpoint are processed again and their outputs repeat."""
        try:
            left = sorted(path.name for path in self.directory.glob(".checkpoint-*.tmp"))
        except OSError:
            return
        if left:
            log.warning("the checkpoint directory %s holds %s left by a checkpoint write that "
                        "was killed midway (the process stopped uncleanly; removed at the "
                        "next write): the messages after the last checkpoint are processed "
                        "again and their outputs repeat", self.directory, ", ".join(left))

    def load_latest(self, restore: Callable[[Checkpoint], Any] | None = None,
                    read: Callable[[Path], Checkpoint] | None = None) -> Checkpoint | None:
        """The newest usable checkpoint; None when there is none at all.

        A checkpoint is usable when it reads back (``read``, default :meth:`read`) and
        ``restore(checkpoint)`` (e.g. rebuilding the model) does not raise; the result of
        ``restore`` is stored in ``checkpoint.restored``. When an older checkpoint is usable,
        the newer unusable ones are set aside (and logged). When checkpoint files exist but none
        is usable, raises :class:`CheckpointError` naming every problem and touches nothing,
        rather than let a new model start silently. A :class:`CheckpointMismatch` raised by
        ``read`` or ``restore`` (a checkpoint of another configuration, or of a newer
        stream-svm: :class:`CheckpointFromNewerVersion`) is raised at once, with nothing
        touched either."""
        read = read or self.read
        self._say_killed_writes()
        problems: list[tuple[Path, str]] = []
        for _, path in self.paths():
            try:
                checkpoint = read(path)
                if restore is not None:
                    try:
                        checkpoint.restored = restore(checkpoint)
                    except CheckpointError:
                        raise
                    except Exception as exc:
                        raise CheckpointError(
                            f"checkpoint {path} could not be restored: "
                            f"{type(exc).__name__}: {exc}"
                        ) from exc
            except CheckpointMismatch:
                raise
            except CheckpointError as exc:
                problems.append((path, str(exc)))
                continue
            for bad, problem in problems:
                try:
                    self.set_aside(bad, problem)
                except OSError as exc:
                    log.error("%s; could not set it aside: %s", problem, exc)
            if problems:
                log.warning("restored the older checkpoint %s", path)
            return checkpoint
        if problems:
            raise CheckpointError(
                f"no usable checkpoint in {self.directory}: "
                + "; ".join(problem for _, problem in problems)
            )
        return None
