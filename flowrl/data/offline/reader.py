"""Reading experience files: an ``input`` value resolved to Parquet files, checked, and streamed in batches.

A dataset is streamed, never loaded whole: with Ray running, as a Ray Dataset (read tasks feed the
driver's iterator with back-pressure); without Ray, file by file with PyArrow. Rows come in file order,
so that episodes stay contiguous for postprocessing (returns, n-step); :class:`ShuffleBuffer` mixes them
afterwards within a bounded number of rows.
"""

from __future__ import annotations

import glob as globbing
import itertools
import json
import logging
import os
import queue
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from flowrl.data.offline.columns import shapes, table_to_batch
from flowrl.data.offline.writer import FORMAT, METADATA_FILE, TEMP_SUFFIX
from flowrl.data.sample_batch import SampleBatch, concat_samples
from flowrl.errors import OfflineDataError

_GLOB_CHARS = "*?["
#: Seconds the plan waits for the next batch of experiences before it gives up on the reader.
READ_TIMEOUT_S = 300.0
#: The object store memory the blocks of a dataset streaming through Ray Data may take ahead of the learner.
READ_AHEAD_BYTES = 256 * 2**20
#: How experiences are read: "arrow", file by file with PyArrow in the reading process (memory: about a row
#: group at a time); "ray_data", as a Ray Dataset whose read tasks run on the cluster (Ray must be running).
READERS = ("arrow", "ray_data")


def resolve_files(source: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> list[Path]:
    """The Parquet files an ``input`` source names: a directory (its ``*.parquet`` files, searched
    recursively), a file, a glob pattern, or a list of these. Raises :class:`OfflineDataError` for
    a path that does not exist, a pattern that matches nothing, or a source with no Parquet file."""
    items = [source] if isinstance(source, (str, os.PathLike)) else list(source)
    if not items:
        raise OfflineDataError("input is an empty list: name at least one directory, file or glob of experiences")
    files: list[Path] = []
    for item in items:
        text = os.fspath(item)
        if any(c in text for c in _GLOB_CHARS):
            matched = sorted(Path(p) for p in globbing.glob(text, recursive=True) if p.endswith(".parquet"))
            if not matched:
                raise OfflineDataError(f"input {text!r}: the pattern matches no .parquet file")
            files.extend(matched)
            continue
        path = Path(text).expanduser()
        if not path.exists():
            raise OfflineDataError(
                f"input {text!r} does not exist: give a directory of experiences (as written by output: DIR or "
                "flowrl record), a .parquet file, a glob, or 'sampler' to sample the env"
            )
        if path.is_dir():
            found = sorted(p for p in path.rglob("*.parquet") if not p.name.endswith(TEMP_SUFFIX))
            if not found:
                raise OfflineDataError(f"input {text!r} is an empty dataset: the directory holds no .parquet file")
            files.extend(found)
        else:
            files.append(path)
    return list(dict.fromkeys(files))


class OfflineData:
    """An ``input`` source's files, their common schema and row count, and its ``metadata.json`` if any.

    Reading the footers only (no rows), it raises :class:`OfflineDataError` for files that are not
    Parquet, files whose columns differ, and a dataset without rows.
    """

    def __init__(self, source: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> None:
        self.source = source
        self.files = resolve_files(source)
        self.num_rows = 0
        #: The rows' size decoded (the files' uncompressed row groups), in bytes.
        self.decoded_bytes = 0
        schema: pa.Schema | None = None
        for path in self.files:
            try:
                meta = pq.read_metadata(path)
            except (OSError, pa.ArrowException) as error:
                raise OfflineDataError(f"input file {str(path)!r} is not a readable Parquet file: {error}") from error
            file_schema = meta.schema.to_arrow_schema()
            if schema is None:
                schema = file_schema
            elif set(file_schema.names) != set(schema.names):
                raise OfflineDataError(
                    f"input file {str(path)!r} has the columns {sorted(file_schema.names)}, but "
                    f"{str(self.files[0])!r} has {sorted(schema.names)}: one dataset holds one kind of experience"
                )
            self.num_rows += meta.num_rows
            self.decoded_bytes += sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
        assert schema is not None
        self.schema = schema
        if not self.num_rows:
            raise OfflineDataError(f"input {self.describe()!r} is an empty dataset: its files hold no rows")
        self.metadata = _read_metadata(self.files)

    @property
    def columns(self) -> dict[str, tuple[tuple[int, ...], str]]:
        """Each column's per-row shape and dtype name."""
        return shapes(self.schema)

    def describe(self) -> str:
        """The source as the user gave it."""
        return os.fspath(self.source) if isinstance(self.source, (str, os.PathLike)) else str(list(self.source))

    def require(self, columns: Sequence[str], why: str) -> None:
        """Raise :class:`OfflineDataError` naming the columns of ``columns`` the data lacks, and ``why``
        they are needed (a clause: "MARWIL weights actions by returns")."""
        missing = [c for c in columns if c not in self.schema.names]
        if missing:
            raise OfflineDataError(
                f"input {self.describe()!r} lacks the column(s) {missing}, needed because {why}; "
                f"it has {sorted(self.schema.names)}"
            )

    def iter_batches(
        self, rows: int, columns: Sequence[str] | None = None, reader: str = "arrow"
    ) -> Iterator[SampleBatch]:
        """One pass over the dataset in file order, as sample batches of ``rows`` rows (the last may be
        smaller), with only ``columns`` when given, read by ``reader`` (one of :data:`READERS`)."""
        wanted = list(self.schema.names if columns is None else columns)
        if reader == "ray_data":
            yield from _ray_batches(self.files, rows, wanted)
            return
        for path in self.files:
            parquet = pq.ParquetFile(path)
            for record_batch in parquet.iter_batches(batch_size=rows, columns=wanted):
                yield table_to_batch(record_batch, wanted)


class BackgroundReader:
    """Reads ``data`` pass after pass (``passes``; None: for ever) with ``reader`` in a thread of its own, up
    to ``ahead`` batches of ``rows`` rows before they are asked for, so that reading and decoding overlap
    learning.

    :meth:`next` gives the next batch, or None at the end of each pass; an error of the reading is raised
    there. :meth:`close` stops the thread (also when the reader is collected).
    """

    def __init__(
        self, data: OfflineData, rows: int, passes: int | None = None, ahead: int = 2, reader: str = "arrow"
    ) -> None:
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=ahead)
        self._closed = threading.Event()
        self._thread = threading.Thread(
            target=self._read,
            args=(data, rows, passes, reader, self._queue, self._closed),
            daemon=True,
            name="read-offline",
        )
        self._thread.start()

    @staticmethod
    def _read(
        data: OfflineData, rows: int, passes: int | None, reader: str, out: queue.Queue[Any], closed: threading.Event
    ) -> None:
        # A static method holding no reference to the reader: collecting the reader closes it.
        def put(item: Any) -> bool:
            while not closed.is_set():
                try:
                    out.put(item, timeout=0.5)
                    return True
                except queue.Full:
                    continue
            return False

        try:
            for _ in itertools.count() if passes is None else range(passes):
                for batch in data.iter_batches(rows, reader=reader):
                    if not put(batch):
                        return
                if not put(_PASS_END):
                    return
        except BaseException as error:  # noqa: BLE001 - handed to the reader's user, who raises it
            put(error)

    def next(self, timeout_s: float = READ_TIMEOUT_S) -> SampleBatch | None:
        """The next batch, or None where a pass ends. Raises :class:`OfflineDataError` when none came within
        ``timeout_s`` seconds (a stuck read) or the reading thread ended without handing one over."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                item = self._queue.get(timeout=min(1.0, max(0.0, deadline - time.monotonic())))
                break
            except queue.Empty:
                if not self._thread.is_alive() and self._queue.empty():
                    raise OfflineDataError("the thread reading the experiences ended without handing on rows") from None
                if time.monotonic() >= deadline:
                    raise OfflineDataError(
                        f"no experiences were read within {timeout_s:g} s: the files' storage or the reader is stuck"
                    ) from None
        if isinstance(item, BaseException):
            raise item
        return None if item is _PASS_END else item

    def close(self) -> None:
        """Stop reading (the thread ends within half a second)."""
        self._closed.set()

    def __del__(self) -> None:
        self._closed.set()


_PASS_END = object()


def _ray_batches(files: Sequence[Path], rows: int, columns: list[str]) -> Iterator[SampleBatch]:
    import ray.data

    logging.getLogger("ray.data").setLevel(logging.WARNING)
    # Fractional CPUs: the reads must not wait behind the rollout and evaluation workers' reservations.
    # The column selection is pushed down into the read: only ``columns`` are decoded.
    dataset = ray.data.read_parquet([os.fspath(f) for f in files], num_cpus=0.01, shuffle=None).select_columns(columns)
    # Blocks read ahead take at most this much of the object store: the stream's memory stays bounded, and the
    # reads pause (leaving the CPUs to the learner) while the learner has enough ahead of it.
    # The settings are this dataset's (its copy of the context), not the process's.
    options = dataset.context.execution_options
    options.resource_limits = ray.data.ExecutionResources(object_store_memory=READ_AHEAD_BYTES)
    options.preserve_order = True  # episodes stay contiguous
    dataset.context.enable_progress_bars = False
    for table in dataset.iter_batches(batch_size=rows, batch_format="pyarrow", prefetch_batches=2):
        yield table_to_batch(table, columns)


def _read_metadata(files: Sequence[Path]) -> dict[str, Any] | None:
    """The ``metadata.json`` of the directory holding the files (or of its parent), if there is one."""
    parents = {f.parent for f in files}
    for directory in sorted(parents) + sorted({p.parent for p in parents}):
        path = directory / METADATA_FILE
        if path.is_file():
            try:
                metadata = json.loads(path.read_text())
            except (OSError, ValueError) as error:
                raise OfflineDataError(f"{str(path)!r} is not readable JSON: {error}") from error
            if not isinstance(metadata, dict) or metadata.get("format") != FORMAT:
                raise OfflineDataError(f"{str(path)!r} does not describe flowrl experiences (format {FORMAT!r})")
            return metadata
    return None


class ShuffleBuffer:
    """Mixes rows of batches that arrive in file order. It fills up to ``capacity`` rows, shuffles what it
    holds once, and hands out batches from the shuffled rows until fewer than half the capacity remain;
    then it asks for more (so each row is copied about twice, whatever the batch size). ``capacity`` 0:
    no mixing, rows pass in order."""

    def __init__(self, capacity: int, rng: np.random.Generator) -> None:
        self.capacity = capacity
        self.rng = rng
        self._held: list[SampleBatch] = []
        self._rows = 0
        self._filling = True
        self._mixed = True

    def __len__(self) -> int:
        return self._rows

    def add(self, batch: SampleBatch) -> None:
        """Hold ``batch``'s rows."""
        self._held.append(batch)
        self._rows += batch.count
        self._mixed = False
        if self._rows >= self.capacity:
            self._filling = False

    def wants(self, rows: int) -> bool:
        """Whether to :meth:`add` before drawing ``rows`` rows (more can still come)."""
        return self._filling or self._rows < rows

    def draw(self, rows: int) -> SampleBatch:
        """``rows`` rows (all that are held, when fewer) of the shuffled ones, removed from the buffer."""
        if not self._mixed:
            held = concat_samples(self._held) if len(self._held) > 1 else self._held[0]
            if self.capacity:
                order = self.rng.permutation(held.count)
                held = SampleBatch({k: np.asarray(v)[order] for k, v in held.items()})
            self._held, self._mixed = [held], True
        held = self._held[0]
        take = min(rows, held.count)
        out = SampleBatch({k: v[:take] for k, v in held.items()})  # views of the shuffled rows
        self._held = [held.slice(take, held.count)] if take < held.count else []
        self._rows -= take
        if self._rows < self.capacity // 2:
            self._filling = True
        return out
