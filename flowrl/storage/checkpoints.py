"""Checkpoints on disk: written so that a crash at any instant loses nothing, read back with clear errors.

A checkpoint is a directory holding ``state.pkl`` (everything needed to resume),
``metadata.json`` (what a person wants to read: algorithm, env, iteration, config), any extra
files its writer adds (``policies.safetensors``, ``policies.json``) and, written last, the
completion marker ``COMPLETE``: a JSON list of every other file's size and SHA-256. A run keeps
its checkpoints as ``checkpoint_<iteration>`` directories (six digits or more) in one
``checkpoints/`` directory, next to an optional copy named ``best``.

What a reader may rely on at every instant, whenever the writing process is killed:

- A checkpoint directory appears under its name only by a rename, after every file in it and
  then the marker were flushed to disk (``fsync``) and the directory itself was synced. A
  directory whose marker is missing, or whose files do not match their sizes and SHA-256 in the
  marker, is never a checkpoint: :func:`read_checkpoint` and :func:`verify_checkpoint` say so.
- Work in progress is hidden: ``.<name>.tmp-<hex>`` is a write not yet renamed into place,
  ``.<name>.old-<hex>`` a checkpoint being replaced, ``.<name>.deleting-<hex>`` one being
  deleted (a deletion renames first, so a half-deleted directory never looks complete).
- Replacing a checkpoint renames the old one aside, renames the new one in, then removes the
  old one. If the process dies between the two renames, the old one is still whole as
  ``.<name>.old-<hex>``: the next :func:`clean_orphans` (each write starts with one),
  :func:`list_checkpoints` or :func:`latest_checkpoint` renames it back. So for every name,
  the previous or the new checkpoint is always reachable.
- :func:`clean_orphans` removes what killed writes and deletions left behind.

Processes that change checkpoints in one directory take turns through an advisory lock on
that directory (``flock``, released by the kernel when a process dies), so a lookup in one
process never restores or removes what a write in another is in the middle of.

A checkpoint's ``metadata.json`` says its ``"kind"`` (:func:`checkpoint_kind`): ``"full"``, everything a
run resumes exactly from, or ``"weights"``, the small one a run writes first when a signal ends it
(weights, counters and config, no replay buffers nor envs). Both are read, listed and rotated alike.

Checkpoints written by flowrl before the marker existed (no ``COMPLETE``, and no ``"format"``
key in ``metadata.json``) are still read, without checksums to verify.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import pickle
import re
import shutil
import sys
import time
import uuid
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import cloudpickle

from flowrl.errors import CheckpointError, ConfigError, RunWarning
from flowrl.storage.versions import describe_versions, runtime_versions, version_skew

if sys.platform != "win32":
    import fcntl

logger = logging.getLogger(__name__)

STATE_FILE = "state.pkl"
METADATA_FILE = "metadata.json"
#: The completion marker, written last: each other file's size and SHA-256.
COMPLETE_FILE = "COMPLETE"
#: ``metadata.json``'s key for what a checkpoint holds, and its values (a checkpoint without it is full).
KIND_KEY = "kind"
FULL_KIND = "full"
WEIGHTS_KIND = "weights"
#: The on-disk format this module writes (``"format"`` in the marker and in ``metadata.json``).
FORMAT = 3

_CHECKPOINT_NAME = re.compile(r"checkpoint_([0-9]+)")
# Hidden siblings: a write in progress, a checkpoint being replaced, one being deleted.
_HIDDEN_NAME = re.compile(r"\.(?P<name>.+)\.(?P<kind>tmp|old|deleting)-[0-9a-f]+")
_RESERVED = (STATE_FILE, METADATA_FILE, COMPLETE_FILE)
_CHUNK = 1 << 20
#: Longest wait for another process's change to a checkpoints directory (a write takes moments).
LOCK_TIMEOUT_S = 60.0


# --- writing ---------------------------------------------------------------------------------------


def _write_file(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def fsync_dir(directory: Path) -> None:
    """Flush ``directory``'s entries (the renames and new files in it) to disk."""
    if sys.platform == "win32":
        return  # Windows cannot open a directory to sync it
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):  # filesystems that cannot sync directories
            raise
    finally:
        os.close(fd)


def _hidden(path: Path, kind: str) -> Path:
    """A fresh hidden sibling of ``path``: ``.<name>.<kind>-<hex>``."""
    return path.parent / f".{path.name}.{kind}-{uuid.uuid4().hex[:8]}"


@contextlib.contextmanager
def _locked(directory: Path, *, wait: bool = True) -> Iterator[bool]:
    """Hold the advisory lock of ``directory`` while the checkpoints in it change.

    Yields True when held (or when the platform or filesystem has no locks: then go on
    unlocked, as before locks existed); False only if ``wait`` is False and someone else holds it.
    With ``wait``, a lock held elsewhere for over :data:`LOCK_TIMEOUT_S` raises :class:`CheckpointError`.
    """
    if sys.platform == "win32":
        yield True
        return
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        yield True
        return
    held = True
    deadline = time.monotonic() + (LOCK_TIMEOUT_S if wait else 0.0)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    held = False
                    break
                time.sleep(0.05)  # another process writes here: its writes take moments
            except OSError:
                break  # no locks on this filesystem
        if wait and not held:
            raise CheckpointError(
                f"checkpoint directory {str(directory)!r}: another process has been changing it for over "
                f"{LOCK_TIMEOUT_S:g} s (a writer stuck on a slow or hung filesystem?)"
            )
        yield held
    finally:
        os.close(fd)  # releases the lock


def _make_parent(path: Path) -> None:
    if not path.parent.is_dir():
        path.parent.mkdir(parents=True, exist_ok=True)
        fsync_dir(path.parent.parent)


def _entry(data: bytes) -> dict[str, Any]:
    return {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def _marker(entries: Mapping[str, Mapping[str, Any]]) -> bytes:
    return json.dumps({"format": FORMAT, "files": dict(entries)}, indent=2, sort_keys=True).encode()


def _swap_in(tmp: Path, path: Path) -> None:
    """Rename the finished directory ``tmp`` to ``path``, replacing what is there (see the module docstring)."""
    if not os.path.lexists(path):
        os.rename(tmp, path)
        fsync_dir(path.parent)
        return
    old = _hidden(path, "old")
    os.rename(path, old)  # rename cannot replace a non-empty directory: move the old one aside first
    try:
        os.rename(tmp, path)
    except BaseException:
        if not os.path.lexists(path):
            os.rename(old, path)  # put the previous checkpoint back where it was
        raise
    fsync_dir(path.parent)
    _remove(old)


def _remove(path: Path) -> bool:
    """Remove the file or directory ``path``; whether it is gone (a failure is logged, not raised)."""
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as e:
        logger.warning("could not remove %s: %s", path, e)
    return not os.path.lexists(path)


def is_plain_name(name: object) -> bool:
    """Whether ``name`` is one plain path component: a string, not blank, ``.`` or ``..``, with no ``/``
    (nor ``os.sep``) and no NUL; what a checkpoint's files and a run directory may be called."""
    return (
        isinstance(name, str)
        and name.strip() not in ("", ".", "..")
        and "/" not in name
        and os.sep not in name
        and "\0" not in name
    )


def _check_file_names(files: Mapping[str, bytes]) -> None:
    for name in files:
        if not is_plain_name(name) or name in _RESERVED:
            raise ValueError(
                f"write_checkpoint: extra file name {name!r} cannot be used; give a plain file name "
                f"other than {', '.join(_RESERVED)}"
            )


def write_checkpoint(
    path: str | Path,
    state: Mapping[str, Any],
    metadata: Mapping[str, Any],
    files: Mapping[str, bytes] | None = None,
    *,
    streams: Mapping[str, StreamWriter] | None = None,
) -> Path:
    """Write the checkpoint directory ``path`` so that a crash at any instant loses nothing; returns ``path``.

    ``state`` is pickled to ``state.pkl``, ``metadata`` (plus ``"format": 3`` and this process's
    ``"versions"``, see :func:`~flowrl.storage.versions.runtime_versions`) written to
    ``metadata.json``, and ``files`` (file name -> bytes) written beside them. An existing
    checkpoint at ``path`` is replaced; it stays in place if the write fails or raises. Leftovers
    of earlier interrupted writes in ``path``'s parent directory are cleaned up first.

    ``streams`` write the large parts of the state (replay buffers' rows) without a copy in memory:
    each ``streams[key](directory)`` is called, first, with the hidden directory being written. It
    writes its files there (this process or any other that sees the directory: a replay shard on a
    filesystem the nodes share), a bounded chunk at a time, and returns ``(value, entries)``:
    ``state[key]``'s value (what refers to those files) and each file's ``{"size", "sha256"}``, which
    the marker lists. Their files are checked to exist with those sizes before the marker is written.
    """
    path = Path(path)
    extra = dict(files or {})
    _check_file_names(extra)
    contents = {
        METADATA_FILE: json.dumps(
            {**metadata, "versions": runtime_versions(), "format": FORMAT}, indent=2, default=str
        ).encode(),
        **{name: bytes(data) for name, data in extra.items()},
    }
    with _staging(path) as (tmp, entries):
        streamed = {key: _stream(key, write, tmp, entries, set(contents)) for key, write in (streams or {}).items()}
        contents[STATE_FILE] = cloudpickle.dumps({**state, **streamed})
        for name, data in contents.items():
            _write_file(tmp / name, data)
            entries[name] = _entry(data)
    return path


#: Writes a large part of a checkpoint's state into the directory being staged; returns ``(value, entries)``
#: (see :func:`write_checkpoint`'s ``streams``).
StreamWriter = Callable[[Path], tuple[Any, Mapping[str, Mapping[str, Any]]]]


def _stream(key: str, write: StreamWriter, tmp: Path, entries: dict[str, Any], taken: set[str]) -> Any:
    """Run the stream writer of ``state[key]`` in ``tmp``; record its files' entries; return its value."""
    value, written = write(tmp)
    for name, entry in written.items():
        if not is_plain_name(name) or name in _RESERVED or name in taken or name in entries:
            raise ValueError(f"write_checkpoint: stream {key!r} wrote {name!r}: a name taken, or not a file name")
        size = (tmp / name).stat().st_size if (tmp / name).is_file() else None
        if size != entry.get("size") or not isinstance(entry.get("sha256"), str):
            raise CheckpointError(
                f"checkpoint {str(tmp)!r}: stream {key!r} reported {name} as {dict(entry)}, but the file "
                f"{'is missing' if size is None else f'has {size} bytes'}"
            )
        entries[name] = {"size": entry["size"], "sha256": entry["sha256"]}
    return value


@contextlib.contextmanager
def _staging(path: Path) -> Iterator[tuple[Path, dict[str, Any]]]:
    """A hidden temporary directory for checkpoint ``path``, and the dict of its files' marker entries.

    The caller writes the files and records each one's entry; when the block ends, the marker
    is written last, the directory synced and swapped into place. If the block raises, the
    temporary directory is removed and ``path`` is left as it was.
    """
    _make_parent(path)
    with _locked(path.parent):
        _clean(path.parent)
        tmp = _hidden(path, "tmp")
        os.mkdir(tmp)
        entries: dict[str, Any] = {}
        try:
            yield tmp, entries
            _write_file(tmp / COMPLETE_FILE, _marker(entries))
            fsync_dir(tmp)
            _swap_in(tmp, path)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise


def _link_or_copy(source: Path, dest: Path) -> None:
    try:
        os.link(source, dest)  # files are never changed after they are written: sharing them is safe
        return
    except OSError:
        pass  # another filesystem, or one without hard links
    with open(source, "rb") as src, open(dest, "wb") as dst:
        shutil.copyfileobj(src, dst, _CHUNK)
        dst.flush()
        os.fsync(dst.fileno())


def copy_checkpoint(source: str | Path, dest: str | Path) -> Path:
    """Make ``dest`` a complete checkpoint with ``source``'s files, as safely as
    :func:`write_checkpoint`; returns ``dest``.

    Files are hard-linked where the filesystem allows (no extra disk), copied otherwise. An
    existing ``dest`` is replaced. Raises :class:`CheckpointError` if ``source`` is missing or
    incomplete (a file gone or of the wrong size; checksums are not recomputed, the marker's
    are carried over so that a later read still detects damage).
    """
    source, dest = Path(source), Path(dest)
    problem = _problem(source, checksums=False)
    if problem is not None:
        raise CheckpointError(f"cannot copy checkpoint {str(source)!r} to {str(dest)!r}: it {problem}")
    entries = _listed_files(source)
    names = (
        sorted(entries)
        if entries is not None
        else sorted(p.name for p in source.iterdir() if p.is_file() and p.name != COMPLETE_FILE)
    )
    with _staging(dest) as (tmp, copied):
        for name in names:
            _link_or_copy(source / name, tmp / name)
            size = (tmp / name).stat().st_size
            if entries is not None:
                if size != entries[name]["size"]:
                    raise CheckpointError(
                        f"cannot copy checkpoint {str(source)!r}: {name} changed while it was copied "
                        f"({size} bytes, {COMPLETE_FILE} lists {entries[name]['size']})"
                    )
                copied[name] = entries[name]
            else:  # a checkpoint older than the marker: sum what was copied
                copied[name] = {"size": size, "sha256": _sha256(tmp / name)}
    return dest


# --- reading and checking ----------------------------------------------------------------------------


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _listed_files(path: Path) -> dict[str, dict[str, Any]] | None:
    """The marker's ``{file: {"size", "sha256"}}`` (None if there is no marker); ValueError or
    TypeError if unreadable."""
    try:
        text = (path / COMPLETE_FILE).read_bytes()
    except FileNotFoundError:
        return None
    document = json.loads(text)
    if not isinstance(document, dict) or not isinstance(document.get("files"), dict):
        raise TypeError("not a JSON object with a 'files' object")
    version = document.get("format")
    if not isinstance(version, int) or version > FORMAT:
        raise ValueError(f"format {version!r}; this flowrl reads format {FORMAT} and older")
    files: dict[str, dict[str, Any]] = document["files"]
    for name, entry in files.items():
        if name in ("", ".", "..", COMPLETE_FILE) or "/" in name or os.sep in name:
            raise ValueError(f"it lists {name!r}, which is not a file of a checkpoint")
        if not (
            isinstance(entry, dict) and isinstance(entry.get("size"), int) and isinstance(entry.get("sha256"), str)
        ):
            raise TypeError(f"its entry for {name!r} is not {{'size': int, 'sha256': str}}")
    return files


def _legacy_problem(path: Path) -> str | None:
    """Why ``path`` (no marker) is not a checkpoint written before the marker existed; None if it is one."""
    cut_short = f"is incomplete (no {COMPLETE_FILE} marker: the write was cut short)"
    try:
        metadata = json.loads((path / METADATA_FILE).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return f"{cut_short}; {METADATA_FILE} is missing too"
    except (OSError, ValueError) as e:
        return f"{cut_short}; its {METADATA_FILE} is unreadable ({type(e).__name__}: {e})"
    if not isinstance(metadata, dict) or "format" in metadata:
        return cut_short  # written with a marker, which never came
    if not (path / STATE_FILE).is_file():
        return f"is incomplete: {STATE_FILE} is missing"
    return None


def _problem(path: Path, *, checksums: bool) -> str | None:
    """What is wrong with the checkpoint ``path`` (a phrase following its name), or None if it is sound."""
    if not path.is_dir():
        return "does not exist or is not a directory"
    try:
        entries = _listed_files(path)
    except (OSError, ValueError, TypeError) as e:
        return f"is corrupt: its {COMPLETE_FILE} marker is unreadable ({type(e).__name__}: {e})"
    if entries is None:
        return _legacy_problem(path)
    for name in (STATE_FILE, METADATA_FILE):
        if name not in entries:
            return f"is corrupt: its {COMPLETE_FILE} marker does not list {name}"
    for name, entry in entries.items():  # sizes first: cheap, and what a cut-short deletion changes
        try:
            size = (path / name).stat().st_size
        except FileNotFoundError:
            return f"is corrupt: {name} is missing (listed in {COMPLETE_FILE})"
        except OSError as e:
            return f"is corrupt: {name} cannot be read ({type(e).__name__}: {e})"
        if size != entry["size"]:
            return f"is corrupt: {name} has {size} bytes, {COMPLETE_FILE} lists {entry['size']}"
    if checksums:
        for name, entry in entries.items():
            try:
                digest = _sha256(path / name)
            except OSError as e:
                return f"is corrupt: {name} cannot be read ({type(e).__name__}: {e})"
            if digest != entry["sha256"]:
                return (
                    f"is corrupt: {name} does not match its SHA-256 in {COMPLETE_FILE} "
                    f"(damaged or changed after it was written)"
                )
    return None


def verify_checkpoint(path: str | Path) -> None:
    """Check that ``path`` is a complete checkpoint whose files match their sizes and SHA-256, without unpickling.

    Raises :class:`CheckpointError` naming the path and the problem: ``incomplete`` (no marker:
    the write was cut short), ``corrupt: <file> ...`` (missing, wrong size, checksum mismatch).
    A checkpoint older than the marker passes if its files are there (it has no checksums).
    """
    path = Path(path)
    problem = _problem(path, checksums=True)
    if problem is not None:
        raise CheckpointError(f"checkpoint {str(path)!r} {problem}")


def read_metadata(path: str | Path) -> dict[str, Any]:
    """The checkpoint ``path``'s ``metadata.json`` (nothing else is read or checked); raises
    :class:`CheckpointError`."""
    path = Path(path)
    try:
        metadata = json.loads((path / METADATA_FILE).read_text(encoding="utf-8"))
    except FileNotFoundError:
        where = "is missing" if path.is_dir() else "is missing (the checkpoint directory does not exist)"
        raise CheckpointError(f"checkpoint {str(path)!r}: {METADATA_FILE} {where}") from None
    except (OSError, ValueError) as e:
        raise CheckpointError(
            f"checkpoint {str(path)!r}: unreadable {METADATA_FILE} ({type(e).__name__}: {e})"
        ) from None
    if not isinstance(metadata, dict):
        raise CheckpointError(
            f"checkpoint {str(path)!r}: {METADATA_FILE} holds a {type(metadata).__name__}, not a JSON object"
        )
    return metadata


def checkpoint_kind(path: str | Path) -> str:
    """What the checkpoint ``path`` holds: :data:`WEIGHTS_KIND` or :data:`FULL_KIND` (also for one written
    before kinds existed); raises :class:`CheckpointError` as :func:`read_metadata` does."""
    return WEIGHTS_KIND if read_metadata(path).get(KIND_KEY) == WEIGHTS_KIND else FULL_KIND


def read_checkpoint(path: str | Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(state, metadata)`` of the checkpoint at ``path``, verified first (see :func:`verify_checkpoint`).

    Raises :class:`CheckpointError` naming the path if it is missing, incomplete or corrupt, or if
    its pickle names what this process lacks (a module, a class, a signature: most likely other
    versions of flowrl or its dependencies; the message names the checkpoint's and this process's).
    A checkpoint written with other major versions (minor too for Python and PyTorch, see
    :func:`~flowrl.storage.versions.version_skew`) is read with a :class:`~flowrl.errors.RunWarning`.
    Loading a pickle can run code: read only checkpoints from sources you trust.
    """
    path = Path(path)
    verify_checkpoint(path)
    metadata = read_metadata(path)
    recorded = metadata.get("versions")
    recorded = recorded if isinstance(recorded, dict) else {}
    here = runtime_versions()
    skew = version_skew(recorded, here)
    if skew:
        warnings.warn(
            f"checkpoint {str(path)!r} was written with other versions: {'; '.join(skew)}. Its pickled state "
            "may not load, or may not behave the same; restore it with the versions it names to be sure",
            RunWarning,
            stacklevel=2,
        )
    try:
        with open(path / STATE_FILE, "rb") as f:
            state = cloudpickle.load(f)
    except (EOFError, pickle.UnpicklingError) as e:  # the bytes themselves: truncated, not a pickle
        raise CheckpointError(f"checkpoint {str(path)!r} is corrupt: {STATE_FILE}: {type(e).__name__}: {e}") from e
    except Exception as e:  # well-formed bytes naming what this process lacks or defines otherwise
        checked = " (its files match their checksums)" if (path / COMPLETE_FILE).is_file() else ""
        raise CheckpointError(
            f"checkpoint {str(path)!r}: {STATE_FILE} cannot be loaded by this process ({type(e).__name__}: {e}); "
            f"most likely version skew, not damage{checked}. The checkpoint's versions: "
            f"{describe_versions(recorded)}; this process's: {describe_versions(here)}. Load it with the versions "
            "it was written with"
        ) from e
    if not isinstance(state, dict):
        raise CheckpointError(
            f"checkpoint {str(path)!r} is corrupt: {STATE_FILE} holds a {type(state).__name__}, not a dict"
        )
    return state, metadata


# --- the checkpoints of a directory --------------------------------------------------------------------


def _restore_displaced(directory: Path) -> None:
    """Rename back each complete ``.<name>.old-*`` whose ``<name>`` is missing (a replace killed
    between its renames)."""
    for entry in sorted(directory.iterdir()):
        match = _HIDDEN_NAME.fullmatch(entry.name)
        if match is None or match["kind"] != "old" or not entry.is_dir():
            continue
        live = directory / match["name"]
        if os.path.lexists(live) or _problem(entry, checksums=False) is not None:
            continue
        try:
            os.rename(entry, live)
            fsync_dir(directory)
        except OSError as e:
            logger.warning("could not restore checkpoint %s from %s: %s", live, entry.name, e)
            continue
        logger.warning("restored checkpoint %s, which an interrupted overwrite had left as %s", live, entry.name)


def _clean(directory: Path) -> list[Path]:
    """:func:`clean_orphans` for a caller that holds ``directory``'s lock."""
    _restore_displaced(directory)
    removed = []
    for entry in sorted(directory.iterdir()):
        match = _HIDDEN_NAME.fullmatch(entry.name)
        if match is None:
            continue
        if (
            match["kind"] == "old"
            and not os.path.lexists(directory / match["name"])
            and _problem(entry, checksums=False) is None
        ):
            continue  # the only copy of a checkpoint that could not be renamed back: never delete it
        if _remove(entry):
            removed.append(entry)
    return removed


def clean_orphans(directory: str | Path) -> list[Path]:
    """Remove what interrupted writes and deletions left in ``directory``; returns the paths removed.

    First puts back any checkpoint an interrupted replace left aside (``.<name>.old-*`` whose
    ``<name>`` is missing), then removes the hidden ``.<name>.tmp-*``, ``.<name>.old-*`` and
    ``.<name>.deleting-*`` entries. :func:`write_checkpoint` calls it in the directory it writes to.
    """
    directory = Path(directory)
    if not directory.is_dir():
        return []
    with _locked(directory):
        return _clean(directory)


def _scan(directory: Path) -> list[Path]:
    found = []
    for entry in directory.iterdir():
        match = _CHECKPOINT_NAME.fullmatch(entry.name)
        if match is None or not entry.is_dir():
            continue
        if (entry / COMPLETE_FILE).is_file() or _legacy_problem(entry) is None:
            found.append((int(match[1]), entry.name, entry))
    return [path for *_, path in sorted(found)]


def list_checkpoints(directory: str | Path) -> list[Path]:
    """The ``checkpoint_<iteration>`` directories under ``directory``, oldest iteration first (by number).

    Only complete ones count: a marker present, or a checkpoint older than the marker. Other
    names (``best``, hidden work in progress) are left out. A checkpoint an interrupted replace
    left aside is put back first (unless another process is writing there).
    """
    directory = Path(directory)
    if not directory.is_dir():
        return []
    with _locked(directory, wait=False) as held:
        if held:  # otherwise a writer is busy here, and its own cleanup will do it
            _restore_displaced(directory)
    return _scan(directory)


def latest_checkpoint(directory: str | Path) -> Path | None:
    """The complete checkpoint with the highest iteration under ``directory`` (None if there is none)."""
    found = list_checkpoints(directory)
    return found[-1] if found else None


def prune_checkpoints(directory: str | Path, keep: int, protect: Iterable[str | Path] = ()) -> list[Path]:
    """Delete all but the newest ``keep`` checkpoints of ``directory`` (by iteration); returns those deleted.

    A checkpoint in ``protect`` (compared as resolved paths) and ``best`` (not a
    ``checkpoint_<iteration>`` name) are never deleted. Each is renamed to a hidden
    ``.<name>.deleting-*`` before it is removed, so a kill mid-delete leaves nothing that looks
    like a checkpoint. Raises :class:`~flowrl.errors.ConfigError` if ``keep`` is not an int >= 1.
    """
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise ConfigError(f"keep={keep!r}: prune_checkpoints must keep at least the newest checkpoint (an int >= 1)")
    directory = Path(directory)
    if not directory.is_dir():
        return []
    kept = {Path(p).resolve() for p in protect}
    deleted = []
    with _locked(directory):
        _clean(directory)
        for path in _scan(directory)[:-keep]:
            if path.resolve() in kept:
                continue
            doomed = _hidden(path, "deleting")
            os.rename(path, doomed)
            deleted.append(path)
            _remove(doomed)
        if deleted:
            fsync_dir(directory)
    return deleted
