"""Sample batches as Arrow tables and back: the column layout of flowrl's experience files.

One row per step; a column of per-row scalars is a plain Arrow column of its NumPy dtype, and a
column of per-row arrays (observations, logits, masks, recurrent states) is a fixed-size list per
dimension (``[B, 84, 84, 4]`` uint8 is ``fixed_size_list<fixed_size_list<fixed_size_list<uint8, 4>,
84>, 84>``), so the files describe their own shapes and any Parquet reader (pandas, Polars, DuckDB)
opens them. Columns that are not numeric arrays (Python objects) are not written.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa

from flowrl.data.sample_batch import SampleBatch

#: The string columns of multi-agent experiences: which policy acted, and as which agent.
POLICY_ID = SampleBatch.POLICY_ID
AGENT_ID = SampleBatch.AGENT_ID
STRING_COLUMNS = (POLICY_ID, AGENT_ID)


def column_to_arrow(values: np.ndarray) -> pa.Array | None:
    """``values`` (``[B, ...]``) as one Arrow array of ``B`` entries; None for a column that is not numeric."""
    if values.dtype.kind not in "biuf":
        return None
    flat = pa.array(np.ascontiguousarray(values).reshape(-1))
    for size in reversed(values.shape[1:]):
        flat = pa.FixedSizeListArray.from_arrays(flat, int(size))
    return flat


def column_from_arrow(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """An Arrow column written by :func:`column_to_arrow` (or any numeric or fixed-size-list one) as ``[B, ...]``."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    shape: list[int] = []
    kind = column.type
    while pa.types.is_fixed_size_list(kind):
        shape.append(kind.list_size)
        kind = kind.value_type
    flat = column
    for _ in shape:
        flat = flat.flatten()
    values = np.asarray(flat.to_numpy(zero_copy_only=False))
    if not values.flags.writeable:  # Arrow's memory, read-only: batches are arrays their users may write to
        values = values.copy()
    return values.reshape(len(column), *shape)


def batch_to_table(batch: Mapping[str, Any], constants: Mapping[str, str] | None = None) -> pa.Table:
    """A (decompressed) sample batch's numeric columns as a table, plus a string column per ``constants``
    entry repeating its value (e.g. the batch's policy id)."""
    names: list[str] = []
    arrays: list[pa.Array] = []
    rows = 0
    for name, values in batch.items():
        if name == SampleBatch.SEQ_LENS or name.startswith(SampleBatch.STATE_OUT):
            continue  # sequence bookkeeping: the rows' own columns are written, not the sequence cuts
        array = column_to_arrow(np.asarray(values))
        if array is not None:
            names.append(name)
            arrays.append(array)
            rows = len(array)
    for name, value in (constants or {}).items():
        names.append(name)
        arrays.append(pa.array([value] * rows, pa.string()))
    return pa.Table.from_arrays(arrays, names=names)


def table_to_batch(table: pa.Table | pa.RecordBatch, columns: list[str] | None = None) -> SampleBatch:
    """The numeric columns of ``table`` (only ``columns``, when given) as a :class:`SampleBatch`."""
    wanted = table.schema.names if columns is None else columns
    out: dict[str, np.ndarray] = {}
    for name in wanted:
        column = table.column(name)
        if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
            out[name] = np.asarray(column.to_pylist(), dtype=object)
        else:
            out[name] = column_from_arrow(column)
    return SampleBatch(out)


def shapes(schema: pa.Schema) -> dict[str, tuple[tuple[int, ...], str]]:
    """Each column's per-row shape and NumPy dtype name, as the schema of an experience file says."""
    out: dict[str, tuple[tuple[int, ...], str]] = {}
    for field in schema:
        shape: list[int] = []
        kind = field.type
        while pa.types.is_fixed_size_list(kind):
            shape.append(kind.list_size)
            kind = kind.value_type
        dtype = "object" if pa.types.is_string(kind) else np.dtype(kind.to_pandas_dtype()).name
        out[field.name] = (tuple(shape), dtype)
    return out
