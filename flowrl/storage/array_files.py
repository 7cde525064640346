"""Large arrays in a checkpoint's files, written and read in bounded chunks, never copied whole.

Each array is one ``.npy`` file (NumPy's format: ``numpy.load`` opens it, ``mmap_mode="r"`` included).
:func:`write_array` streams an array's bytes to disk a chunk at a time, straight from the array's memory,
computing the file's SHA-256 on the way, and flushes it to disk (``fsync``): what a checkpoint's marker
needs (see :mod:`flowrl.storage.checkpoints`). :class:`NpyFile` reads one back chunk by chunk into an
array the caller has allocated. So saving or restoring an array of any size takes no more memory than
the array itself.

:class:`ArrayFileWriter` and :class:`ArrayFileReader` are the column writer and reader a replay buffer's
``get_state`` and ``set_state`` take (:class:`~flowrl.data.ReplayBuffer`): the buffer's state keeps a small
reference to each file in place of the rows.
"""

from __future__ import annotations

import hashlib
import io
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from flowrl.errors import CheckpointError
from flowrl.storage.checkpoints import is_plain_name

#: Bytes written or read per system call (and held by no buffer: chunks are views of the array).
CHUNK_BYTES = 16 << 20
#: The key of a replay column's reference to its file, in a buffer's state.
FILE_KEY = "npy_file"


def _bytes_view(array: np.ndarray) -> np.ndarray:
    """The array's memory as flat bytes, without copying (it must be C-contiguous)."""
    if not array.flags.c_contiguous:
        raise ValueError("write_array/read_into need a C-contiguous array")
    return array.reshape(-1).view(np.uint8)


def write_array(path: Path, array: np.ndarray, chunk_bytes: int = CHUNK_BYTES) -> dict[str, Any]:
    """Write ``array`` (C-contiguous, no Python objects) to the new ``.npy`` file ``path``, ``chunk_bytes`` at
    a time, and flush it to disk; returns its marker entry ``{"size": bytes, "sha256": hex}``."""
    if array.dtype.hasobject:
        raise ValueError(f"write_array: dtype {array.dtype} holds Python objects, which have no bytes to stream")
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, np.lib.format.header_data_from_array_1_0(array))
    digest = hashlib.sha256(header.getvalue())
    data = _bytes_view(array)
    with open(path, "xb") as f:
        f.write(header.getvalue())
        for start in range(0, len(data), chunk_bytes):
            chunk = data[start : start + chunk_bytes].data  # a memoryview: no copy
            digest.update(chunk)
            f.write(chunk)
        f.flush()
        os.fsync(f.fileno())
    return {"size": len(header.getvalue()) + len(data), "sha256": digest.hexdigest()}


class NpyFile:
    """An ``.npy`` file of a checkpoint, read on demand: its ``shape`` and ``dtype`` from its header, its
    rows by :meth:`read_into`. Raises :class:`~flowrl.errors.CheckpointError` for a missing or damaged file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            with open(path, "rb") as f:
                version = np.lib.format.read_magic(f)
                read_header = (
                    np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
                )
                shape, fortran_order, dtype = read_header(f)
                self._offset = f.tell()
        except FileNotFoundError:
            raise CheckpointError(
                f"checkpoint file {str(path)!r} is missing (a process restoring replay contents must see the "
                "checkpoint's directory: on a cluster, keep runs on storage every node mounts, --storage-path)"
            ) from None
        except (OSError, ValueError) as e:
            raise CheckpointError(f"checkpoint file {str(path)!r} is not a readable .npy file: {e}") from e
        if fortran_order or dtype.hasobject:
            raise CheckpointError(
                f"checkpoint file {str(path)!r}: not an array flowrl wrote (Fortran order or objects)"
            )
        self.shape: tuple[int, ...] = tuple(shape)
        self.dtype: np.dtype[Any] = dtype

    def read_into(self, out: np.ndarray, chunk_bytes: int = CHUNK_BYTES) -> None:
        """Fill ``out`` (C-contiguous, of this file's shape and dtype) with the file's rows, chunk by chunk."""
        if out.shape != self.shape or out.dtype != self.dtype:
            raise CheckpointError(
                f"checkpoint file {str(self.path)!r} holds {self.dtype}{list(self.shape)}, "
                f"not the {out.dtype}{list(out.shape)} asked for"
            )
        data = _bytes_view(out)
        with open(self.path, "rb", buffering=0) as f:
            f.seek(self._offset)
            for start in range(0, len(data), chunk_bytes):
                wanted = min(chunk_bytes, len(data) - start)
                if f.readinto(data[start : start + wanted].data) != wanted:
                    raise CheckpointError(f"checkpoint file {str(self.path)!r} is truncated")


class ArrayFileWriter:
    """Writes arrays as ``<prefix>.<n>.npy`` files into ``directory``; :attr:`entries` holds each file's
    marker entry. Called as ``writer(name, rows)``, it returns what a state keeps in the array's place:
    ``{"npy_file": file name, "name": name}``, or a copy of ``rows`` if they hold Python objects (kept in
    the pickled state: such rows have no fixed layout to stream)."""

    def __init__(self, directory: Path, prefix: str) -> None:
        self.directory = directory
        self.prefix = prefix
        self.entries: dict[str, dict[str, Any]] = {}

    def __call__(self, name: str, rows: np.ndarray) -> Any:
        if rows.dtype.hasobject:
            return rows.copy()
        file = f"{self.prefix}.{len(self.entries)}.npy"
        self.entries[file] = write_array(self.directory / file, np.ascontiguousarray(rows))
        return {FILE_KEY: file, "name": name}


class ArrayFileReader:
    """The reader of :class:`ArrayFileWriter`'s references: ``reader(reference)`` is the :class:`NpyFile`
    it names in ``directory`` (the checkpoint's)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def __call__(self, reference: Any) -> NpyFile:
        if not isinstance(reference, Mapping) or not isinstance(reference.get(FILE_KEY), str):
            raise CheckpointError(f"not a reference to a checkpoint's array file: {reference!r}")
        file = reference[FILE_KEY]
        if not is_plain_name(file):
            raise CheckpointError(f"array file reference {file!r} is not a file name of the checkpoint")
        return NpyFile(self.directory / file)
