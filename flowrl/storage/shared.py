"""Storage every node of a Ray cluster shares, for run directories that any node can resume.

A storage path is an absolute directory that every node mounts at the same place (NFS, EFS, a
Kubernetes volume, a bucket mount). :func:`check_storage_path` checks, before a run starts, that
checkpoints can be written there (:mod:`flowrl.runs.run` puts run directories under it).
"""

from __future__ import annotations

import os
import shutil
import sys
import uuid
import warnings
from collections.abc import Callable
from pathlib import Path

from flowrl.errors import RunError
from flowrl.storage.checkpoints import fsync_dir


class StorageWarning(UserWarning):
    """A storage path lacks something checkpoints use when it is there (hard links, ``flock``)."""


def storage_root(storage_path: str | os.PathLike[str]) -> Path:
    """``storage_path`` as a Path; :class:`~flowrl.errors.RunError` unless it is absolute."""
    root = Path(storage_path)
    if not root.is_absolute():
        raise RunError(
            f"storage path {str(storage_path)!r} is relative; it must be absolute, naming the same "
            f"directory on every node of the cluster (e.g. /mnt/shared/flowrl_runs)"
        )
    return root


def check_storage_path(storage_path: str | os.PathLike[str]) -> Path:
    """Check that ``storage_path`` can hold run directories; return it as a Path.

    It must be absolute (every node must reach a run under the same path) and is created if
    missing. Then what checkpoints do on disk is tried in a hidden temporary directory inside
    it, removed after (see :func:`probe_storage`). Raises :class:`~flowrl.errors.RunError`
    naming the path and what failed.
    """
    root = storage_root(storage_path)
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise RunError(f"storage path {str(root)!r}: cannot create it ({type(e).__name__}: {e})") from None
    probe_storage(root, "storage path")
    return root


def probe_storage(directory: Path, what: str) -> None:
    """Try what checkpoints do on disk in a hidden temporary directory inside ``directory``.

    Writing and fsyncing a file, renaming it, fsyncing, renaming and removing a directory are
    required: a failure raises :class:`~flowrl.errors.RunError` naming ``what`` and the
    operation. Hard links (checkpoints copy instead) and ``flock`` (checkpoints are then written
    unlocked) are not: their failure is a :class:`StorageWarning`. A network or FUSE filesystem
    may lack some of these; finding out here beats finding out at the first checkpoint.
    """
    probe = directory / f".flowrl-storage-check-{uuid.uuid4().hex[:8]}"
    moved = probe.with_name(f"{probe.name}-renamed")
    # Checkpoints lock nothing on Windows (flowrl.storage.checkpoints._locked).
    lock = [] if sys.platform == "win32" else [("locking a directory (fcntl.flock)", lambda: _lock_once(probe), False)]
    steps: list[tuple[str, Callable[[], object], bool]] = [
        ("creating a directory (is it writable?)", probe.mkdir, True),
        ("writing and fsyncing a file", lambda: _write_synced(probe / "file"), True),
        ("renaming a file (os.replace)", lambda: os.replace(probe / "file", probe / "renamed"), True),
        ("hard-linking a file (os.link)", lambda: os.link(probe / "renamed", probe / "linked"), False),
        ("fsyncing a directory", lambda: fsync_dir(probe), True),
        *lock,
        ("renaming a directory (os.rename)", lambda: os.rename(probe, moved), True),
        ("removing a directory", lambda: shutil.rmtree(moved), True),
    ]
    for operation, step, required in steps:
        try:
            step()
        except OSError as e:
            if not required:
                warnings.warn(
                    f"{what} {str(directory)!r}: {operation} failed there ({type(e).__name__}: {e}); "
                    "checkpoints will do without it (copies instead of links, no lock)",
                    StorageWarning,
                    stacklevel=3,
                )
                continue
            for leftover in (probe, moved):
                shutil.rmtree(leftover, ignore_errors=True)
            raise RunError(
                f"{what} {str(directory)!r} cannot hold checkpoints: {operation} failed there "
                f"({type(e).__name__}: {e}); use a filesystem that supports it"
            ) from None


def _write_synced(path: Path) -> None:
    with open(path, "wb") as f:
        f.write(b"flowrl storage check\n")
        f.flush()
        os.fsync(f.fileno())


def _lock_once(directory: Path) -> None:
    """Take and release the exclusive ``flock`` a checkpoint write takes on its directory."""
    import fcntl

    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
