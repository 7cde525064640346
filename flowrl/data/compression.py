"""LZ4 compression of whole columns.

A compressed column is a :class:`CompressedColumn`, never ``bytes``, so it cannot be
mistaken for an observation space whose values are raw bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

import lz4.block
import numpy as np


@dataclass(frozen=True)
class CompressedColumn:
    """An array compressed with LZ4, with the dtype and shape to restore it bit-exactly."""

    data: bytes
    dtype: str
    shape: tuple[int, ...]

    def __len__(self) -> int:
        return self.shape[0] if self.shape else 0

    @property
    def nbytes(self) -> int:
        """Compressed size in bytes."""
        return len(self.data)

    @property
    def raw_nbytes(self) -> int:
        """Size of the array once decompressed."""
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


def compress_array(array: np.ndarray) -> CompressedColumn:
    """Compress ``array`` (any dtype of fixed size) into a :class:`CompressedColumn`."""
    if array.dtype.hasobject:
        raise ValueError(f"cannot compress a column of Python objects (dtype {array.dtype})")
    contiguous = np.asarray(array, order="C")  # unlike ascontiguousarray, keeps 0-d arrays 0-d
    return CompressedColumn(lz4.block.compress(contiguous, store_size=True), contiguous.dtype.str, contiguous.shape)


def decompress_array(column: CompressedColumn) -> np.ndarray:
    """The array that :func:`compress_array` compressed, bit for bit (writable)."""
    raw = lz4.block.decompress(column.data, return_bytearray=True)  # a bytearray: writable, no extra copy
    return np.frombuffer(raw, dtype=np.dtype(column.dtype)).reshape(column.shape)
