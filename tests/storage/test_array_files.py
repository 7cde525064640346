"""Arrays streamed to a checkpoint's files and back (storage.array_files), and write_checkpoint's streams."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from flowrl.errors import CheckpointError
from flowrl.storage.array_files import ArrayFileReader, ArrayFileWriter, NpyFile, write_array
from flowrl.storage.checkpoints import (
    COMPLETE_FILE,
    STATE_FILE,
    read_checkpoint,
    verify_checkpoint,
    write_checkpoint,
)

pytestmark = pytest.mark.unit


def test_an_array_round_trips_in_chunks_smaller_than_a_row(tmp_path: Path) -> None:
    array = np.arange(6 * 5 * 3, dtype=np.int32).reshape(6, 5, 3)
    entry = write_array(tmp_path / "a.npy", array, chunk_bytes=7)
    data = (tmp_path / "a.npy").read_bytes()
    assert entry == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    np.testing.assert_array_equal(np.load(tmp_path / "a.npy"), array)  # NumPy's own format
    source = NpyFile(tmp_path / "a.npy")
    assert (source.shape, source.dtype) == ((6, 5, 3), np.dtype(np.int32))
    out = np.zeros_like(array)
    source.read_into(out, chunk_bytes=11)
    np.testing.assert_array_equal(out, array)


def test_an_empty_array_and_booleans_round_trip(tmp_path: Path) -> None:
    for name, array in {"empty": np.zeros((0, 4), np.float32), "flags": np.array([True, False, True])}.items():
        write_array(tmp_path / f"{name}.npy", array)
        out = np.empty_like(array)
        NpyFile(tmp_path / f"{name}.npy").read_into(out)
        np.testing.assert_array_equal(out, array)


def test_write_array_refuses_objects_and_never_overwrites(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="Python objects"):
        write_array(tmp_path / "o.npy", np.array([{}, None], dtype=object))
    write_array(tmp_path / "a.npy", np.zeros(3))
    with pytest.raises(FileExistsError):
        write_array(tmp_path / "a.npy", np.zeros(3))


def test_damaged_missing_or_mismatched_files_raise_checkpoint_errors(tmp_path: Path) -> None:
    write_array(tmp_path / "a.npy", np.arange(100, dtype=np.int64))
    source = NpyFile(tmp_path / "a.npy")
    with pytest.raises(CheckpointError, match=r"holds int64\[100\], not the float64\[100\] asked for"):
        source.read_into(np.zeros(100))
    with open(tmp_path / "a.npy", "r+b") as f:
        f.truncate(200)
    with pytest.raises(CheckpointError, match="is truncated"):
        source.read_into(np.zeros(100, np.int64))
    with pytest.raises(CheckpointError, match="is missing .*--storage-path"):
        NpyFile(tmp_path / "gone.npy")
    (tmp_path / "junk.npy").write_bytes(b"not numpy")
    with pytest.raises(CheckpointError, match="not a readable .npy file"):
        NpyFile(tmp_path / "junk.npy")


def test_the_writer_names_files_records_entries_and_keeps_object_rows_inline(tmp_path: Path) -> None:
    writer = ArrayFileWriter(tmp_path, "shard_0")
    first = writer("p/obs", np.ones((4, 2), np.uint8))
    inline = writer("p/infos", np.array([{"a": 1}, {}], dtype=object))
    second = writer("p/rewards", np.arange(4, dtype=np.float32))
    assert first == {"npy_file": "shard_0.0.npy", "name": "p/obs"}
    assert second == {"npy_file": "shard_0.1.npy", "name": "p/rewards"}
    assert isinstance(inline, np.ndarray) and inline[0] == {"a": 1}
    assert sorted(writer.entries) == ["shard_0.0.npy", "shard_0.1.npy"]
    reader = ArrayFileReader(tmp_path)
    out = np.zeros(4, np.float32)
    reader(second).read_into(out)
    np.testing.assert_array_equal(out, np.arange(4))
    for bad in ({"npy_file": "../shard_0.0.npy"}, {"npy_file": ".."}, {"file": "x"}, "shard_0.0.npy"):
        with pytest.raises(CheckpointError):
            reader(bad)


def _rows_stream(rows: np.ndarray) -> Any:
    def write(directory: Path) -> tuple[Any, dict[str, Any]]:
        writer = ArrayFileWriter(directory, "rows")
        return {"rows": writer("rows", rows), "count": len(rows)}, writer.entries

    return write


def test_streams_write_into_the_staged_checkpoint_and_their_values_join_the_state(tmp_path: Path) -> None:
    rows = np.arange(1000, dtype=np.float64)
    path = write_checkpoint(
        tmp_path / "checkpoint_000001", {"iteration": 1, "replay": None}, {}, streams={"replay": _rows_stream(rows)}
    )
    verify_checkpoint(path)
    assert "rows.0.npy" in (path / COMPLETE_FILE).read_text()
    state, _ = read_checkpoint(path)
    assert state == {"iteration": 1, "replay": {"rows": {"npy_file": "rows.0.npy", "name": "rows"}, "count": 1000}}
    out = np.zeros(1000)
    ArrayFileReader(path)(state["replay"]["rows"]).read_into(out)
    np.testing.assert_array_equal(out, rows)
    (path / "rows.0.npy").write_bytes((path / "rows.0.npy").read_bytes()[:-8] + b"\0" * 8)
    with pytest.raises(CheckpointError, match="rows.0.npy"):
        verify_checkpoint(path)  # streamed files are checksummed like the others


@pytest.mark.parametrize(
    "stream, error",
    [
        (lambda d: (None, {"ghost.npy": {"size": 3, "sha256": "0" * 64}}), "is missing"),
        (lambda d: ((d / "x.npy").write_bytes(b"abc"), {"x.npy": {"size": 4, "sha256": "0" * 64}}), "has 3 bytes"),
        (lambda d: (None, {STATE_FILE: {"size": 1, "sha256": "0"}}), "a name taken"),
        (lambda d: (None, {"../x": {"size": 1, "sha256": "0"}}), "not a file name"),
    ],
    ids=["missing", "wrong size", "reserved name", "not a name"],
)
def test_a_stream_that_fails_or_misreports_leaves_the_previous_checkpoint(
    tmp_path: Path, stream: Any, error: str
) -> None:
    path = write_checkpoint(tmp_path / "checkpoint_000001", {"iteration": 1}, {})
    with pytest.raises((CheckpointError, ValueError), match=error):
        write_checkpoint(path, {"iteration": 2}, {}, streams={"replay": stream})
    assert read_checkpoint(path)[0] == {"iteration": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint_000001"]  # the staged files are gone
