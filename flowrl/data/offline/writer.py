"""Writing experiences to Parquet files: what a rollout worker with ``output: DIR`` does with each fragment.

Each writer owns its files (``<prefix>-w<worker>-<id>-<n>.parquet``): a worker writes straight to the
directory, nothing passes through the driver. Batches are gathered into row groups of about
``row_group_bytes`` (a fragment, or one agent's piece of it, is often a few hundred rows: as many row groups
would make the files slow to read). A file is written under a ``.tmp`` name and renamed when it is closed
(past ``max_file_size`` bytes, or when the worker stops), so a reader never sees a file without its
footer; a worker killed mid-file loses only that file's rows.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from flowrl.data.offline.columns import batch_to_table
from flowrl.errors import OfflineDataError

#: The dataset description every output directory holds next to its Parquet files.
METADATA_FILE = "metadata.json"
#: What ``metadata.json``'s ``format`` names, and the version of the layout it describes.
FORMAT = "flowrl-experiences"
FORMAT_VERSION = 1
COMPRESSIONS = ("zstd", "snappy", "lz4", "gzip", "brotli", "none")
TEMP_SUFFIX = ".tmp"


class ExperienceWriter:
    """Appends sample batches to Parquet files under ``directory``.

    ``max_file_size``: bytes after which the current file is closed and a new one started.
    ``compression``: one of :data:`COMPRESSIONS`. ``row_group_bytes``: batches are held until they
    take this many bytes in memory (or ``max_file_size``, when smaller), then written as one row group.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        worker_index: int = 0,
        max_file_size: int = 64 * 2**20,
        compression: str = "zstd",
        prefix: str = "output",
        row_group_bytes: int = 4 * 2**20,
    ) -> None:
        if compression not in COMPRESSIONS:
            raise OfflineDataError(f"output compression {compression!r} is not one of {COMPRESSIONS}")
        self.directory = Path(directory)
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise OfflineDataError(f"cannot write experiences to {str(self.directory)!r}: {error}") from error
        self.max_file_size = max_file_size
        self.row_group_bytes = min(row_group_bytes, max_file_size)
        self._held: list[pa.Table] = []
        self._held_bytes = 0
        self.compression = None if compression == "none" else compression
        self._stem = f"{prefix}-w{worker_index:03d}-{uuid.uuid4().hex[:8]}"
        self._writer: pq.ParquetWriter | None = None
        self._path: Path | None = None
        self._files = 0
        self.rows_written = 0
        self.files_written: list[Path] = []

    def write(self, batch: Mapping[str, Any], constants: Mapping[str, str] | None = None) -> None:
        """Append ``batch``'s numeric columns (and a string column per ``constants`` entry)."""
        table = batch_to_table(batch, constants)
        if not table.num_rows:
            return
        current = self._held[0].schema if self._held else self._writer.schema if self._writer else None
        if current is not None and not current.equals(table.schema):
            self.close()  # other columns (another policy's batch): a file holds one schema
        self._held.append(table)
        self._held_bytes += table.nbytes
        self.rows_written += table.num_rows
        if self._held_bytes >= self.row_group_bytes:
            self._flush()

    def _flush(self) -> None:
        """Write the held batches as one row group; close the file once it is past ``max_file_size``."""
        if not self._held:
            return
        table = pa.concat_tables(self._held) if len(self._held) > 1 else self._held[0]
        self._held, self._held_bytes = [], 0
        if self._writer is None:
            self._files += 1
            self._path = self.directory / f"{self._stem}-{self._files:05d}.parquet{TEMP_SUFFIX}"
            self._writer = pq.ParquetWriter(self._path, table.schema, compression=self.compression)
        self._writer.write_table(table, row_group_size=table.num_rows)
        assert self._path is not None
        if self._path.stat().st_size >= self.max_file_size:
            self._finish()

    def close(self) -> None:
        """Write what is held and finish the current file (if any), giving it its final name."""
        self._flush()
        self._finish()

    def _finish(self) -> None:
        if self._writer is None or self._path is None:
            return
        self._writer.close()
        final = self._path.with_name(self._path.name.removesuffix(TEMP_SUFFIX))
        os.replace(self._path, final)
        self.files_written.append(final)
        self._writer = None
        self._path = None


def write_metadata(directory: str | os.PathLike[str], metadata: Mapping[str, Any]) -> Path:
    """Write ``metadata.json`` (the format tag and version added) into ``directory``, atomically."""
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    target = path / METADATA_FILE
    temp = target.with_name(target.name + TEMP_SUFFIX)
    temp.write_text(json.dumps({"format": FORMAT, "format_version": FORMAT_VERSION, **metadata}, indent=2))
    os.replace(temp, target)
    return target
