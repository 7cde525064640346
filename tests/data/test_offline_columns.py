"""Sample batches as Arrow tables and back (flowrl.data.offline.columns): shapes, dtypes and string columns."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from flowrl.data import SampleBatch
from flowrl.data.offline import AGENT_ID, POLICY_ID, batch_to_table, table_to_batch
from flowrl.data.offline.columns import shapes

pytestmark = pytest.mark.unit


def mixed_batch(rows: int = 6) -> SampleBatch:
    rng = np.random.default_rng(0)
    return SampleBatch(
        {
            SampleBatch.OBS: rng.standard_normal((rows, 3, 2)).astype(np.float32),
            "image": rng.integers(0, 256, (rows, 4, 4, 2)).astype(np.uint8),
            SampleBatch.ACTIONS: rng.integers(0, 5, rows),
            SampleBatch.REWARDS: rng.standard_normal(rows),  # float64 stays float64
            SampleBatch.TERMINATEDS: np.arange(rows) % 3 == 2,
            SampleBatch.ACTION_MASK: np.ones((rows, 5), bool),
        }
    )


def test_columns_round_trip_with_their_shapes_and_dtypes() -> None:
    batch = mixed_batch()
    back = table_to_batch(batch_to_table(batch))
    assert set(back) == set(batch)
    for name, values in batch.items():
        assert back[name].dtype == values.dtype, name
        assert back[name].shape == values.shape, name
        np.testing.assert_array_equal(back[name], values)


def test_arrays_are_fixed_size_lists_that_describe_their_shape() -> None:
    table = batch_to_table(mixed_batch())
    assert table.schema.field("image").type == pa.list_(pa.list_(pa.list_(pa.uint8(), 2), 4), 4)
    assert table.schema.field(SampleBatch.ACTIONS).type == pa.int64()
    found = shapes(table.schema)
    assert found[SampleBatch.OBS] == ((3, 2), "float32")
    assert found["image"] == ((4, 4, 2), "uint8")
    assert found[SampleBatch.TERMINATEDS] == ((), "bool")


def test_string_constants_repeat_per_row_and_read_back_as_objects() -> None:
    batch = mixed_batch(4)
    table = batch_to_table(batch, {POLICY_ID: "pol0", AGENT_ID: "agent_1"})
    assert table.column(POLICY_ID).to_pylist() == ["pol0"] * 4
    back = table_to_batch(table, [SampleBatch.OBS, POLICY_ID, AGENT_ID])
    assert list(back) == [SampleBatch.OBS, POLICY_ID, AGENT_ID]
    assert back[AGENT_ID].dtype == object and list(back[AGENT_ID]) == ["agent_1"] * 4
    assert shapes(table.schema)[POLICY_ID] == ((), "object")


def test_object_columns_and_sequence_bookkeeping_are_not_written() -> None:
    batch = dict(mixed_batch(4))
    batch["infos"] = np.array([{"x": 1}] * 4, dtype=object)
    batch[SampleBatch.SEQ_LENS] = np.array([2, 2])
    batch[SampleBatch.STATE_OUT + "0"] = np.zeros((4, 8), np.float32)
    batch[SampleBatch.STATE_IN + "0"] = np.zeros((4, 8), np.float32)
    names = batch_to_table(batch).schema.names
    assert "infos" not in names and SampleBatch.SEQ_LENS not in names and SampleBatch.STATE_OUT + "0" not in names
    assert SampleBatch.STATE_IN + "0" in names  # the state each row was acted on is a row's own column
