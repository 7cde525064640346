"""ExperienceWriter and metadata.json: files per worker, rotation, compression, atomic renames, schema changes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from offline_files import episodes

from flowrl.data import SampleBatch, concat_samples
from flowrl.data.offline import (
    COMPRESSIONS,
    FORMAT,
    FORMAT_VERSION,
    METADATA_FILE,
    ExperienceWriter,
    table_to_batch,
    write_metadata,
)
from flowrl.errors import OfflineDataError

pytestmark = pytest.mark.unit


def read_rows(files: list[Path]) -> int:
    return sum(pq.read_metadata(f).num_rows for f in files)


def test_files_are_renamed_from_tmp_when_closed_and_carry_the_worker_index(tmp_path: Path) -> None:
    writer = ExperienceWriter(tmp_path, worker_index=3, row_group_bytes=1)  # every batch written at once
    writer.write(episodes(2, 5))
    assert [p.suffix for p in tmp_path.iterdir()] == [".tmp"]  # readers skip it: no footer yet
    writer.close()
    [written] = list(tmp_path.iterdir())
    assert written.name.startswith("output-w003-") and written.name.endswith("-00001.parquet")
    assert writer.files_written == [written] and writer.rows_written == 10
    writer.close()  # closing again does nothing
    assert read_rows([written]) == 10


def test_a_file_past_max_file_size_is_closed_and_the_next_batch_starts_another(tmp_path: Path) -> None:
    writer = ExperienceWriter(tmp_path, max_file_size=8_000, compression="none")
    batches = [episodes(10, 20, seed=i) for i in range(6)]  # 200 rows of 4 float32 observations: ~8 kB each
    for batch in batches:
        writer.write(batch)
    writer.close()
    files = sorted(tmp_path.glob("*.parquet"))
    assert len(files) == len(writer.files_written) >= 3
    assert not list(tmp_path.glob("*.tmp"))
    read = concat_samples([table_to_batch(pq.read_table(f)) for f in files])
    assert read.count == 1200
    np.testing.assert_array_equal(read[SampleBatch.OBS], concat_samples(batches)[SampleBatch.OBS])


def test_small_batches_are_gathered_into_row_groups(tmp_path: Path) -> None:
    writer = ExperienceWriter(tmp_path, row_group_bytes=20_000)
    writer.write(episodes(2, 10, seed=0))  # 20 rows, about 1.3 kB: an agent's piece of a fragment
    assert not list(tmp_path.iterdir())  # held in memory until a row group's worth
    for seed in range(1, 50):
        writer.write(episodes(2, 10, seed=seed))
    writer.close()
    [written] = writer.files_written
    meta = pq.read_metadata(written)
    assert meta.num_rows == 1000 and 3 <= meta.num_row_groups <= 5  # about 20 kB each, not 50 of 20 rows
    np.testing.assert_array_equal(
        table_to_batch(pq.read_table(written))[SampleBatch.OBS],
        concat_samples([episodes(2, 10, seed=seed) for seed in range(50)])[SampleBatch.OBS],
    )


def test_a_batch_of_other_columns_after_a_written_row_group_starts_a_new_file(tmp_path: Path) -> None:
    writer = ExperienceWriter(tmp_path, row_group_bytes=1)
    writer.write(episodes(1, 5))
    writer.write({**episodes(1, 5), SampleBatch.ACTION_LOGP: np.zeros(5, np.float32)})
    writer.close()
    assert [pq.read_metadata(f).num_rows for f in writer.files_written] == [5, 5]


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_every_compression_writes_readable_files(tmp_path: Path, compression: str) -> None:
    writer = ExperienceWriter(tmp_path, compression=compression)
    writer.write(episodes(2, 5))
    writer.close()
    meta = pq.read_metadata(writer.files_written[0])
    codec = meta.row_group(0).column(0).compression
    assert codec == ("UNCOMPRESSED" if compression == "none" else compression.upper())
    assert meta.num_rows == 10


def test_an_unknown_compression_is_refused_naming_the_valid_ones(tmp_path: Path) -> None:
    with pytest.raises(OfflineDataError, match=r"'lzma' is not one of .*'zstd'"):
        ExperienceWriter(tmp_path, compression="lzma")


def test_a_batch_with_other_columns_starts_a_new_file(tmp_path: Path) -> None:
    writer = ExperienceWriter(tmp_path)
    first = episodes(1, 5)
    writer.write(first)
    writer.write({**first, SampleBatch.ACTION_LOGP: np.zeros(5, np.float32)})
    writer.write(SampleBatch({k: v[:0] for k, v in first.items()}))  # no rows: nothing written
    writer.close()
    assert len(writer.files_written) == 2
    schemas = [pq.read_schema(f).names for f in writer.files_written]
    assert SampleBatch.ACTION_LOGP not in schemas[0] and SampleBatch.ACTION_LOGP in schemas[1]
    assert writer.rows_written == 10


def test_a_directory_that_cannot_be_made_is_an_offline_data_error(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(OfflineDataError, match="cannot write experiences to .*a-file/out"):
        ExperienceWriter(blocker / "out")


def test_metadata_json_carries_the_format_tag_and_version(tmp_path: Path) -> None:
    path = write_metadata(tmp_path / "new", {"algorithm": "ppo", "policies": {}})
    assert path.name == METADATA_FILE
    assert json.loads(path.read_text()) == {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "algorithm": "ppo",
        "policies": {},
    }
    assert [p.name for p in path.parent.iterdir()] == [METADATA_FILE]  # no temporary file left
