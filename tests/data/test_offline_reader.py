"""Reading experiences (flowrl.data.offline.reader): what an input names, the checks on the files, streaming
them in file order (PyArrow without Ray, Ray Data with it), and the shuffle buffer."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from offline_files import episodes, write_dataset

from flowrl.data import SampleBatch, concat_samples
from flowrl.data.offline import OfflineData, ShuffleBuffer, resolve_files
from flowrl.errors import OfflineDataError

pytestmark = pytest.mark.unit


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    """30 episodes of 10 steps in three files (one per writer), with a metadata.json."""
    return write_dataset(tmp_path / "data", episodes(30, 10), files=3)


def test_resolve_files_takes_a_directory_a_file_a_glob_or_a_list(dataset: Path, tmp_path: Path) -> None:
    files = resolve_files(dataset)
    assert len(files) == 3 and files == sorted(files)
    nested = tmp_path / "more" / "deep"
    nested.mkdir(parents=True)
    (nested / files[0].name).write_bytes(files[0].read_bytes())
    assert resolve_files(tmp_path / "more") == [nested / files[0].name]  # searched recursively
    assert resolve_files(str(files[1])) == [files[1]]
    assert resolve_files(f"{dataset}/*-w001-*.parquet") == [files[1]]
    assert resolve_files([files[2], str(dataset), files[0]]) == [files[2], files[0], files[1]]  # each once


def test_resolve_files_names_what_it_could_not_find(tmp_path: Path) -> None:
    with pytest.raises(OfflineDataError, match=r"'.*nowhere' does not exist: give a directory of experiences"):
        resolve_files(tmp_path / "nowhere")
    with pytest.raises(OfflineDataError, match=r"the pattern matches no \.parquet file"):
        resolve_files(str(tmp_path / "*.parquet"))
    with pytest.raises(OfflineDataError, match="input is an empty list"):
        resolve_files([])
    (tmp_path / "notes.txt").write_text("")
    (tmp_path / "half.parquet.tmp").write_text("")  # a file still being written does not count
    with pytest.raises(OfflineDataError, match=r"is an empty dataset: the directory holds no \.parquet file"):
        resolve_files(tmp_path)


def test_offline_data_reads_footers_schema_and_metadata(dataset: Path) -> None:
    data = OfflineData(dataset)
    assert data.num_rows == 300
    assert data.columns[SampleBatch.OBS] == ((4,), "float32")
    assert data.metadata is not None and data.metadata["algorithm"] == "test"
    data.require([SampleBatch.OBS, SampleBatch.ACTIONS], "a test reads them")
    with pytest.raises(OfflineDataError, match=r"lacks the column\(s\) \['action_logp'\], needed because OPE"):
        data.require([SampleBatch.OBS, SampleBatch.ACTION_LOGP], "OPE weighs actions by their probabilities")


def test_iter_batches_with_pyarrow_streams_the_files_in_order(dataset: Path) -> None:
    data = OfflineData(dataset)
    batches = list(data.iter_batches(64, columns=[SampleBatch.EPS_ID, SampleBatch.OBS]))
    assert all(set(b) == {SampleBatch.EPS_ID, SampleBatch.OBS} for b in batches)
    assert max(b.count for b in batches) <= 64
    read = concat_samples(batches)
    np.testing.assert_array_equal(read[SampleBatch.EPS_ID], np.repeat(np.arange(30), 10))
    np.testing.assert_array_equal(read[SampleBatch.OBS], episodes(30, 10)[SampleBatch.OBS])


def test_iter_batches_with_ray_data_reads_the_same_rows_in_the_same_order(dataset: Path, ray_session: None) -> None:
    data = OfflineData(dataset)
    batches = list(data.iter_batches(64, reader="ray_data"))
    assert max(b.count for b in batches) <= 64
    read = concat_samples(batches)
    expected = episodes(30, 10)
    for name in (SampleBatch.EPS_ID, SampleBatch.OBS, SampleBatch.TERMINATEDS):
        np.testing.assert_array_equal(read[name], expected[name])


def test_a_file_that_is_not_parquet_is_named(dataset: Path) -> None:
    (dataset / "zz-broken.parquet").write_text("not a parquet file")
    with pytest.raises(OfflineDataError, match=r"zz-broken\.parquet' is not a readable Parquet file"):
        OfflineData(dataset)


def test_files_with_other_columns_are_refused(dataset: Path) -> None:
    pq.write_table(pa.table({"obs_other": [1.0]}), dataset / "zz-other.parquet")
    with pytest.raises(OfflineDataError, match=r"zz-other\.parquet' has the columns \['obs_other'\], but .* has \["):
        OfflineData(dataset)


def test_a_dataset_without_rows_is_empty(tmp_path: Path) -> None:
    write_dataset(tmp_path, episodes(1, 0))  # the writer writes nothing for no rows
    pq.write_table(pa.table({SampleBatch.OBS: pa.array([], pa.float32())}), tmp_path / "empty.parquet")
    with pytest.raises(OfflineDataError, match="is an empty dataset: its files hold no rows"):
        OfflineData(tmp_path)


def test_a_metadata_json_of_something_else_is_refused(dataset: Path) -> None:
    (dataset / "metadata.json").write_text('{"format": "somebody-elses"}')
    with pytest.raises(OfflineDataError, match="does not describe flowrl experiences"):
        OfflineData(dataset)
    (dataset / "metadata.json").write_text("{not json")
    with pytest.raises(OfflineDataError, match="is not readable JSON"):
        OfflineData(dataset)


def drain(buffer: ShuffleBuffer, batches: list[SampleBatch], rows: int) -> list[SampleBatch]:
    """One pass as ReadOffline makes it: add while the buffer wants rows, draw training batches, then the rest."""
    source, out = iter(batches), []
    while True:
        while buffer.wants(rows):
            batch = next(source, None)
            if batch is None:
                break
            buffer.add(batch)
        if not len(buffer):
            return out
        out.append(buffer.draw(rows))


def numbered(count: int, size: int) -> list[SampleBatch]:
    return [SampleBatch({"i": np.arange(k * size, (k + 1) * size)}) for k in range(count)]


def test_the_shuffle_buffer_hands_out_every_row_once_and_mixes_them() -> None:
    drawn = drain(ShuffleBuffer(500, np.random.default_rng(0)), numbered(20, 100), rows=64)
    order = np.concatenate([b["i"] for b in drawn])
    assert sorted(order.tolist()) == list(range(2000))
    assert all(b.count == 64 for b in drawn[:-1])
    assert not np.array_equal(order, np.arange(2000))
    # Mixed within the buffer's reach: the first batch holds rows from several of the first 500 (not just 64).
    first = drawn[0]["i"]
    assert first.max() < 500 and np.ptp(first) > 200


def test_a_shuffle_buffer_of_capacity_zero_keeps_file_order() -> None:
    drawn = drain(ShuffleBuffer(0, np.random.default_rng(0)), numbered(5, 30), rows=64)
    assert [b.count for b in drawn] == [64, 64, 22]
    np.testing.assert_array_equal(np.concatenate([b["i"] for b in drawn]), np.arange(150))


def test_a_stuck_read_is_given_up_after_the_timeout_naming_it() -> None:
    class Stuck:
        def iter_batches(self, rows: int, reader: str = "arrow") -> Any:
            threading.Event().wait(5)  # a read that does not come back in time
            yield from ()

    from flowrl.data.offline import BackgroundReader

    background = BackgroundReader(Stuck(), 8)  # type: ignore[arg-type]
    try:
        with pytest.raises(OfflineDataError, match=r"no experiences were read within 0.5 s"):
            background.next(timeout_s=0.5)
    finally:
        background.close()
