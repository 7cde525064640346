"""Replay buffers: ring storage, uniform and prioritized sampling, weights, priorities, state."""

from __future__ import annotations

import pickle
from typing import Any, cast

import numpy as np
import pytest

from flowrl.data import (
    DEFAULT_POLICY_ID,
    LocalReplayBuffer,
    MultiAgentBatch,
    PrioritizedReplayBuffer,
    ReplayBuffer,
    ReplayBufferError,
    SampleBatch,
)
from flowrl.errors import FlowRLError

pytestmark = pytest.mark.unit


def make_batch(n: int, start: int = 0) -> SampleBatch:
    """Rows whose every column encodes the row's number, so a stored row can be identified."""
    idx = np.arange(start, start + n)
    return SampleBatch(
        obs=np.stack([idx, -idx], axis=1).astype(np.float32),
        actions=idx.astype(np.int64),
        rewards=idx.astype(np.float32),
    )


def storage(buffer: ReplayBuffer) -> dict[str, np.ndarray]:
    """The buffer's columns, read straight from its storage (allocated by the first add)."""
    assert buffer._storage is not None, "nothing was added to the buffer"
    return buffer._storage


def replayed(buffer: LocalReplayBuffer) -> SampleBatch:
    """A replayed single-policy batch (the buffer holds enough rows to replay)."""
    batch = buffer.replay()
    assert isinstance(batch, SampleBatch), batch
    return batch


def stored_rows(buffer: ReplayBuffer) -> np.ndarray:
    """The row number held at each position, read straight from the storage."""
    return storage(buffer)["actions"][: len(buffer)].copy()


# -- ReplayBuffer: storage -----------------------------------------------------------------


def test_rows_wrap_around_the_ring() -> None:
    buffer = ReplayBuffer(5)
    np.testing.assert_array_equal(buffer.add(make_batch(3)), [0, 1, 2])
    assert len(buffer) == 3 and buffer.num_added == 3
    np.testing.assert_array_equal(buffer.add(make_batch(4, start=3)), [3, 4, 0, 1])
    assert len(buffer) == 5 and buffer.num_added == 7
    np.testing.assert_array_equal(stored_rows(buffer), [5, 6, 2, 3, 4])
    np.testing.assert_array_equal(storage(buffer)["obs"][:, 1], -stored_rows(buffer))


@pytest.mark.parametrize("first", [0, 2, 5])
def test_oversize_batch_keeps_its_last_rows_as_if_added_one_by_one(first: int) -> None:
    whole, one_by_one = ReplayBuffer(5), ReplayBuffer(5)
    if first:
        whole.add(make_batch(first, start=100))
        one_by_one.add(make_batch(first, start=100))
    written = whole.add(make_batch(12))
    for i in range(12):
        one_by_one.add(make_batch(1, start=i))
    np.testing.assert_array_equal(stored_rows(whole), stored_rows(one_by_one))
    assert sorted(stored_rows(whole)) == [7, 8, 9, 10, 11]
    np.testing.assert_array_equal(storage(whole)["actions"][written], np.arange(7, 12))
    assert whole.num_added == first + 12 == one_by_one.num_added
    assert len(whole) == 5


def test_storage_is_allocated_from_the_first_batch_and_later_batches_are_cast() -> None:
    buffer = ReplayBuffer(4)
    buffer.add(make_batch(2))
    assert storage(buffer)["obs"].shape == (4, 2) and storage(buffer)["obs"].dtype == np.float32
    batch = make_batch(2, start=2)
    batch["obs"] = batch["obs"].astype(np.float64)  # same kind: stored as float32
    buffer.add(batch)
    assert storage(buffer)["obs"].dtype == np.float32
    assert sorted(buffer.columns) == ["actions", "obs", "rewards"]


def test_empty_batch_is_a_no_op() -> None:
    buffer = ReplayBuffer(4)
    assert len(buffer.add(SampleBatch())) == 0
    assert len(buffer) == 0 and buffer.columns == []


def test_column_mismatch_names_the_columns() -> None:
    buffer = ReplayBuffer(4)
    buffer.add(make_batch(2))
    other = make_batch(2)
    del other["rewards"]
    other["dones"] = np.zeros(2, dtype=bool)
    with pytest.raises(ReplayBufferError, match=r"missing: \['rewards'\], unexpected: \['dones'\]"):
        buffer.add(other)
    assert len(buffer) == 2  # nothing was written


def test_row_shape_and_unsafe_dtype_mismatches_raise() -> None:
    buffer = ReplayBuffer(4)
    buffer.add(make_batch(2))
    wide = make_batch(2)
    wide["obs"] = np.zeros((2, 3), dtype=np.float32)
    with pytest.raises(ReplayBufferError, match=r"'obs' has rows of shape \(3,\)"):
        buffer.add(wide)
    floats = make_batch(2)
    floats["actions"] = floats["actions"] + 0.5
    with pytest.raises(ReplayBufferError, match="'actions' has dtype float64"):
        buffer.add(floats)


def test_compressed_columns_are_decompressed_on_add() -> None:
    buffer = ReplayBuffer(8)
    batch = make_batch(4).compress(["obs"])
    buffer.add(batch)
    assert batch.is_compressed()  # the caller's batch is untouched
    sample = buffer.sample(16)
    np.testing.assert_array_equal(sample["obs"][:, 0], sample["actions"].astype(np.float32))
    assert not sample.is_compressed()


# -- ReplayBuffer: sampling ----------------------------------------------------------------


def test_uniform_sampling_covers_every_row_evenly() -> None:
    buffer = ReplayBuffer(10, seed=0)
    buffer.add(make_batch(15))  # positions hold rows 10..14 then 5..9
    sample = buffer.sample(20_000)
    assert sample.count == 20_000
    np.testing.assert_array_equal(sample["actions"], storage(buffer)["actions"][sample["batch_indexes"]])
    counts = np.bincount(sample["batch_indexes"], minlength=10)
    assert counts.min() > 0
    expected = 20_000 / 10
    chi2 = ((counts - expected) ** 2 / expected).sum()
    assert chi2 < 30  # 9 degrees of freedom: p < 0.001 above ~27.9
    assert sorted(np.unique(sample["actions"])) == list(range(5, 15))


def test_sampling_only_draws_filled_rows() -> None:
    buffer = ReplayBuffer(100, seed=0)
    buffer.add(make_batch(3))
    assert set(buffer.sample(500)["batch_indexes"]) == {0, 1, 2}


def test_sample_errors() -> None:
    buffer = ReplayBuffer(4)
    with pytest.raises(ReplayBufferError, match="empty"):
        buffer.sample(1)
    buffer.add(make_batch(1))
    with pytest.raises(ReplayBufferError, match="-1"):
        buffer.sample(-1)
    assert buffer.sample(0).count == 0


def test_same_seed_same_samples() -> None:
    a, b = ReplayBuffer(10, seed=3), ReplayBuffer(10, seed=3)
    a.add(make_batch(10))
    b.add(make_batch(10))
    np.testing.assert_array_equal(a.sample(50)["batch_indexes"], b.sample(50)["batch_indexes"])


def test_stats() -> None:
    buffer = ReplayBuffer(10)
    buffer.add(make_batch(4))
    buffer.sample(3)
    stats = buffer.stats()
    assert stats["capacity"] == 10 and stats["num_entries"] == 4 and stats["num_added"] == 4
    assert stats["num_sampled"] == 3
    assert stats["est_size_bytes"] == 4 * (2 * 4 + 8 + 4)


@pytest.mark.parametrize("capacity", [0, -3, 2.5, True, "10"])
def test_invalid_capacity_names_the_value(capacity: object) -> None:
    with pytest.raises(ReplayBufferError, match=f"capacity must be an integer >= 1, got {capacity!r}"):
        ReplayBuffer(cast(Any, capacity))


# -- PrioritizedReplayBuffer ---------------------------------------------------------------


def filled_prioritized(priorities: np.ndarray, alpha: float, seed: int = 0) -> PrioritizedReplayBuffer:
    buffer = PrioritizedReplayBuffer(len(priorities), alpha=alpha, seed=seed)
    idxes = buffer.add(make_batch(len(priorities)))
    buffer.update_priorities(idxes, priorities)
    return buffer


def test_new_rows_get_the_max_priority_seen() -> None:
    buffer = PrioritizedReplayBuffer(8, alpha=0.6)
    buffer.add(make_batch(3))
    np.testing.assert_array_equal(buffer.priorities(), [1.0, 1.0, 1.0])
    buffer.update_priorities(np.array([0, 1]), np.array([0.5, 4.0]))
    assert buffer.max_priority == 4.0
    buffer.update_priorities(np.array([1]), np.array([0.1]))
    assert buffer.max_priority == 4.0  # the max never decreases
    buffer.add(make_batch(2, start=3))
    np.testing.assert_array_equal(buffer.priorities(), [0.5, 0.1, 1.0, 4.0, 4.0])


def test_overwritten_rows_take_the_new_rows_priority() -> None:
    buffer = PrioritizedReplayBuffer(4, alpha=1.0)
    buffer.add(make_batch(4))
    buffer.update_priorities(np.arange(4), np.array([0.1, 0.2, 0.3, 3.0]))
    buffer.add(make_batch(2, start=4))  # overwrites positions 0 and 1
    np.testing.assert_allclose(buffer.priorities(), [3.0, 3.0, 0.3, 3.0])
    assert buffer._sum_tree.total() == pytest.approx(9.3)
    assert buffer._min_tree.min() == pytest.approx(0.3)


def test_explicit_priorities_on_add() -> None:
    buffer = PrioritizedReplayBuffer(4, alpha=1.0)
    buffer.add(make_batch(3), priorities=np.array([1.0, 2.0, 5.0]))
    np.testing.assert_array_equal(buffer.priorities(), [1.0, 2.0, 5.0])
    assert buffer.max_priority == 5.0
    with pytest.raises(ReplayBufferError, match="2 priorities for a batch of 3 rows"):
        buffer.add(make_batch(3), priorities=np.array([1.0, 2.0]))


def test_sampling_frequencies_are_proportional_to_priority_to_the_alpha() -> None:
    priorities = np.array([0.5, 1.0, 2.0, 3.0, 5.0, 8.0, 0.1, 13.0])
    alpha = 0.7
    buffer = filled_prioritized(priorities, alpha, seed=42)
    counts = np.zeros(len(priorities))
    draws = 0
    for _ in range(200):
        sample = buffer.sample(64, beta=0.4)
        counts += np.bincount(sample["batch_indexes"], minlength=len(priorities))
        draws += 64
    expected = draws * priorities**alpha / (priorities**alpha).sum()
    chi2 = ((counts - expected) ** 2 / expected).sum()
    assert chi2 < 30, (counts, expected)  # 7 degrees of freedom: p < 0.001 above ~24.3


def test_stratified_sampling_draws_one_row_per_segment() -> None:
    buffer = filled_prioritized(np.ones(8), alpha=1.0)
    # Equal priorities and as many strata as rows: each row exactly once, in buffer order.
    for _ in range(5):
        np.testing.assert_array_equal(buffer.sample(8, beta=0.5)["batch_indexes"], np.arange(8))


def test_importance_weights_match_brute_force() -> None:
    rng = np.random.default_rng(5)
    priorities = rng.random(37) * 10 + 0.01
    alpha, beta = 0.6, 0.4
    buffer = PrioritizedReplayBuffer(50, alpha=alpha, seed=1)  # not full: N is the stored rows
    buffer.update_priorities(buffer.add(make_batch(37)), priorities)
    sample = buffer.sample(256, beta=beta)
    n = len(buffer)
    probs = priorities**alpha / (priorities**alpha).sum()
    all_weights = (n * probs) ** -beta
    expected = all_weights[sample["batch_indexes"]] / all_weights.max()
    assert sample["weights"].dtype == np.float32
    np.testing.assert_allclose(sample["weights"], expected, rtol=1e-6)
    assert sample["weights"].max() <= 1.0
    np.testing.assert_array_equal(sample["actions"], sample["batch_indexes"])  # row i holds row number i


def test_beta_zero_gives_unit_weights_and_beta_is_validated() -> None:
    buffer = filled_prioritized(np.array([1.0, 10.0, 100.0]), alpha=1.0)
    np.testing.assert_array_equal(buffer.sample(10, beta=0.0)["weights"], np.ones(10, dtype=np.float32))
    for beta in (-0.1, 1.5, np.nan):
        with pytest.raises(ReplayBufferError, match="beta"):
            buffer.sample(4, beta=beta)


def test_alpha_zero_samples_uniformly() -> None:
    priorities = np.array([0.01, 1.0, 100.0, 1e4, 5.0])
    buffer = filled_prioritized(priorities, alpha=0.0, seed=7)
    counts = np.zeros(5)
    for _ in range(100):
        sample = buffer.sample(50, beta=1.0)
        counts += np.bincount(sample["batch_indexes"], minlength=5)
        np.testing.assert_array_equal(sample["weights"], np.ones(50, dtype=np.float32))
    expected = counts.sum() / 5
    assert ((counts - expected) ** 2 / expected).sum() < 20  # 4 degrees of freedom


def test_zero_priority_rows_are_never_sampled_and_do_not_zero_the_weights() -> None:
    buffer = filled_prioritized(np.array([0.0, 1.0, 0.0, 4.0]), alpha=1.0)
    sample = buffer.sample(1000, beta=1.0)
    assert set(sample["batch_indexes"]) == {1, 3}
    weights = dict(zip(sample["batch_indexes"].tolist(), sample["weights"].tolist(), strict=True))
    assert weights == {1: 1.0, 3: 0.25}
    buffer.update_priorities(np.array([1, 3]), np.array([0.0, 0.0]))
    with pytest.raises(ReplayBufferError, match="priority 0"):
        buffer.sample(1, beta=0.5)


@pytest.mark.parametrize(("bad", "shown"), [(np.nan, "nan"), (np.inf, "inf"), (-np.inf, "-inf"), (-0.5, "-0.5")])
def test_update_priorities_rejects_invalid_values_naming_the_index(bad: float, shown: str) -> None:
    buffer = PrioritizedReplayBuffer(10, alpha=0.6)
    buffer.add(make_batch(10))
    before = buffer.priorities()
    idxes = np.array([4, 7, 2, 9])
    priorities = np.array([1.0, 2.0, bad, bad])
    with pytest.raises(ValueError, match=rf"priority {shown} for index 2 \(position 2 of 4\)") as info:
        buffer.update_priorities(idxes, priorities)
    assert isinstance(info.value, FlowRLError)
    np.testing.assert_array_equal(buffer.priorities(), before)  # nothing was applied


def test_update_priorities_rejects_bad_indexes_and_lengths() -> None:
    buffer = PrioritizedReplayBuffer(10, alpha=0.6)
    buffer.add(make_batch(4))
    with pytest.raises(ReplayBufferError, match=r"index 4 \(position 1\) is not a stored row"):
        buffer.update_priorities(np.array([0, 4]), np.array([1.0, 1.0]))
    with pytest.raises(ReplayBufferError, match="2 indexes but 3 priorities"):
        buffer.update_priorities(np.array([0, 1]), np.array([1.0, 1.0, 1.0]))
    with pytest.raises(ReplayBufferError, match="integers"):
        buffer.update_priorities(np.array([0.0]), np.array([1.0]))


def test_priority_overflowing_under_alpha_is_rejected() -> None:
    buffer = PrioritizedReplayBuffer(4, alpha=3.0)
    buffer.add(make_batch(2))
    with pytest.raises(ReplayBufferError, match="for index 1 overflows"):
        buffer.update_priorities(np.array([0, 1]), np.array([1.0, 1e200]))
    np.testing.assert_array_equal(buffer.priorities(), [1.0, 1.0])


@pytest.mark.parametrize("alpha", [-0.1, np.nan, np.inf, "0.6"])
def test_invalid_alpha_names_the_value(alpha: object) -> None:
    with pytest.raises(ReplayBufferError, match="alpha"):
        PrioritizedReplayBuffer(4, alpha=cast(Any, alpha))


# -- state ---------------------------------------------------------------------------------


def test_uniform_state_round_trip_with_contents_samples_identically() -> None:
    buffer = ReplayBuffer(8, seed=11)
    buffer.add(make_batch(11))
    buffer.sample(5)
    state = pickle.loads(pickle.dumps(buffer.get_state(include_contents=True)))
    restored = ReplayBuffer(8, seed=999)
    restored.set_state(state)
    assert len(restored) == 8 and restored.num_added == 11
    np.testing.assert_array_equal(stored_rows(restored), stored_rows(buffer))
    for _ in range(3):
        a, b = buffer.sample(20), restored.sample(20)
        for key in a:
            np.testing.assert_array_equal(a[key], b[key])
    # The ring position survives too: the next add overwrites the same slot in both.
    np.testing.assert_array_equal(buffer.add(make_batch(1, start=50)), restored.add(make_batch(1, start=50)))
    np.testing.assert_array_equal(stored_rows(restored), stored_rows(buffer))
    assert restored.stats() == buffer.stats()


def test_state_is_a_copy() -> None:
    buffer = ReplayBuffer(4)
    buffer.add(make_batch(2))
    state = buffer.get_state(include_contents=True)
    buffer.add(make_batch(2, start=10))
    np.testing.assert_array_equal(state["contents"]["columns"]["actions"], [0, 1])


def test_state_without_contents_keeps_counters_and_rng_but_no_rows() -> None:
    buffer = ReplayBuffer(8, seed=2)
    buffer.add(make_batch(6))
    state = buffer.get_state()
    assert state["contents"] is None
    restored = ReplayBuffer(8)
    restored.add(make_batch(3, start=40))
    restored.set_state(state)
    assert len(restored) == 0 and restored.num_added == 6 and restored.columns == []
    # Same RNG state: once both hold the same rows, they draw the same positions.
    fresh = ReplayBuffer(8)
    fresh.set_state(buffer.get_state())
    buffer_copy = ReplayBuffer(8)
    buffer_copy.set_state(buffer.get_state())
    fresh.add(make_batch(6))
    buffer_copy.add(make_batch(6))
    np.testing.assert_array_equal(fresh.sample(30)["batch_indexes"], buffer_copy.sample(30)["batch_indexes"])


def test_restoring_contents_into_another_capacity_raises() -> None:
    buffer = ReplayBuffer(8)
    buffer.add(make_batch(2))
    with pytest.raises(ReplayBufferError, match="capacity 8 .* capacity 4"):
        ReplayBuffer(4).set_state(buffer.get_state(include_contents=True))
    ReplayBuffer(4).set_state(buffer.get_state())  # counters alone fit any capacity


def test_prioritized_state_round_trip_restores_trees_and_max_priority() -> None:
    rng = np.random.default_rng(0)
    buffer = PrioritizedReplayBuffer(16, alpha=0.6, seed=4)
    buffer.add(make_batch(20))
    buffer.update_priorities(np.arange(16), rng.random(16) * 5)
    buffer.sample(8, beta=0.4)
    state = pickle.loads(pickle.dumps(buffer.get_state(include_contents=True)))
    restored = PrioritizedReplayBuffer(16, alpha=0.6)
    restored.set_state(state)
    assert restored.max_priority == buffer.max_priority
    np.testing.assert_array_equal(restored.priorities(), buffer.priorities())
    np.testing.assert_array_equal(restored._sum_tree._value, buffer._sum_tree._value)
    np.testing.assert_array_equal(restored._min_tree._value, buffer._min_tree._value)
    for _ in range(3):
        a, b = buffer.sample(32, beta=0.5), restored.sample(32, beta=0.5)
        for key in a:
            np.testing.assert_array_equal(a[key], b[key])

    empty = PrioritizedReplayBuffer(16, alpha=0.6)
    empty.set_state(buffer.get_state())
    assert len(empty) == 0 and empty.max_priority == buffer.max_priority
    empty.add(make_batch(1))
    assert empty.priorities()[0] == buffer.max_priority


class MemoryColumns:
    """A column writer and reader that keep the rows they are given in a dict (a checkpoint's files, in tests)."""

    class Source:
        def __init__(self, rows: np.ndarray) -> None:
            self.rows, self.shape, self.dtype = rows, rows.shape, rows.dtype

        def read_into(self, out: np.ndarray) -> None:
            out[...] = self.rows

    def __init__(self) -> None:
        self.stored: dict[str, np.ndarray] = {}
        self.views: list[np.ndarray] = []

    def write(self, name: str, rows: np.ndarray) -> Any:
        self.views.append(rows)
        self.stored[name] = rows.copy()
        return {"ref": name}

    def read(self, reference: Any) -> MemoryColumns.Source:
        return self.Source(self.stored[reference["ref"]])


def test_written_columns_are_views_of_the_rows_and_read_back_into_new_columns() -> None:
    buffer = PrioritizedReplayBuffer(8, alpha=0.6, seed=3)
    buffer.add(make_batch(6))
    buffer.update_priorities(np.arange(6), np.linspace(0.5, 3, 6))
    columns = MemoryColumns()
    state = pickle.loads(pickle.dumps(buffer.get_state(include_contents=True, write_column=columns.write)))
    assert state["contents"]["columns"] == {key: {"ref": key} for key in buffer.columns}
    # No copy of the rows is made: the writer gets views of the buffer's columns, of the filled rows.
    assert all(np.shares_memory(view, buffer._storage[key]) for view, key in zip(columns.views, buffer.columns))
    assert [len(view) for view in columns.views] == [6] * len(buffer.columns)
    restored = PrioritizedReplayBuffer(8, alpha=0.6)
    restored.set_state(state, read_column=columns.read)
    np.testing.assert_array_equal(stored_rows(restored), stored_rows(buffer))
    np.testing.assert_array_equal(restored.priorities(), buffer.priorities())
    a, b = buffer.sample(16, beta=0.4), restored.sample(16, beta=0.4)
    for key in a:
        np.testing.assert_array_equal(a[key], b[key])


def test_written_columns_cannot_be_restored_without_a_reader_nor_with_other_sizes() -> None:
    buffer = ReplayBuffer(8)
    buffer.add(make_batch(4))
    columns = MemoryColumns()
    state = buffer.get_state(include_contents=True, write_column=columns.write)
    with pytest.raises(ReplayBufferError, match="column 'obs' of the state is stored outside it .*read_column"):
        ReplayBuffer(8).set_state(state)
    columns.stored["obs"] = columns.stored["obs"][:3]
    with pytest.raises(ReplayBufferError, match=r"column 'obs' of the state holds \(3,\) rows, its size says 4"):
        ReplayBuffer(8).set_state(state, read_column=columns.read)


# -- LocalReplayBuffer ---------------------------------------------------------------------


def test_replay_is_none_until_learning_starts_then_full_batches() -> None:
    local = LocalReplayBuffer(capacity=100, learning_starts=50, replay_batch_size=16, seed=0)
    assert local.replay() is None
    local.add_batch(make_batch(30))
    assert local.replay() is None
    local.add_batch(make_batch(19, start=30))
    assert local.num_steps_added == 49 and local.replay() is None
    local.add_batch(make_batch(1, start=49))
    replayed = local.replay()
    assert isinstance(replayed, SampleBatch)
    assert replayed.count == 16
    assert {"obs", "actions", "rewards", "weights", "batch_indexes"} <= set(replayed)


def test_learning_starts_zero_with_an_empty_buffer_returns_none() -> None:
    local = LocalReplayBuffer(capacity=10, learning_starts=0, replay_batch_size=4)
    assert local.replay() is None
    local.add_batch(make_batch(1))
    assert replayed(local).count == 4


def test_update_priorities_sets_abs_td_error_plus_eps() -> None:
    local = LocalReplayBuffer(
        capacity=10, learning_starts=0, replay_batch_size=4, prioritized_replay_alpha=1.0, prioritized_replay_eps=0.01
    )
    local.add_batch(make_batch(10))
    replayed = local.replay()
    assert isinstance(replayed, SampleBatch)
    idxes = replayed["batch_indexes"]
    td = np.linspace(-2.0, 2.0, len(idxes))
    local.update_priorities({DEFAULT_POLICY_ID: (idxes, td)})
    buffer = local.buffers[DEFAULT_POLICY_ID]
    assert isinstance(buffer, PrioritizedReplayBuffer)
    expected = np.ones(10)
    expected[idxes] = np.abs(td) + 0.01
    np.testing.assert_allclose(buffer.priorities(), expected)
    with pytest.raises(ValueError, match="nan"):
        local.update_priorities({DEFAULT_POLICY_ID: (idxes[:1], np.array([np.nan]))})
    with pytest.raises(ReplayBufferError, match="unknown policy id 'nope'"):
        local.update_priorities({"nope": (idxes, td)})


def test_multi_agent_batches_get_one_buffer_per_policy() -> None:
    local = LocalReplayBuffer(capacity=20, learning_starts=10, replay_batch_size=8, seed=0)
    batch = MultiAgentBatch({"pol_a": make_batch(6), "pol_b": make_batch(12, start=100)}, env_steps=6)
    local.add_batch(batch)
    assert local.num_steps_added == 6 and local.replay() is None  # env steps, not agent steps, gate replay
    local.add_batch(batch)
    replayed = local.replay()
    assert isinstance(replayed, MultiAgentBatch)
    assert set(replayed.policy_batches) == {"pol_a", "pol_b"}
    assert replayed.env_steps() == 8
    assert replayed.policy_batches["pol_a"].count == replayed.policy_batches["pol_b"].count == 8
    assert replayed.policy_batches["pol_a"]["actions"].max() < 6
    assert replayed.policy_batches["pol_b"]["actions"].min() >= 100
    assert {pid: len(b) for pid, b in local.buffers.items()} == {"pol_a": 12, "pol_b": 20}
    prio = {pid: (b["batch_indexes"], np.full(8, 3.0)) for pid, b in replayed.policy_batches.items()}
    local.update_priorities(prio)
    stats = local.stats()
    assert stats["num_steps_added"] == 12 and stats["num_steps_replayed"] == 8
    assert stats["policies"]["pol_b"]["num_entries"] == 20
    assert stats["policies"]["pol_a"]["max_priority"] == pytest.approx(3.0 + 1e-6)


def test_uniform_local_buffer() -> None:
    local = LocalReplayBuffer(capacity=10, learning_starts=0, replay_batch_size=5, prioritized=False, seed=0)
    local.add_batch(make_batch(10))
    replayed = local.replay()
    assert isinstance(replayed, SampleBatch) and replayed.count == 5
    assert "weights" not in replayed and "batch_indexes" in replayed
    assert type(local.buffers[DEFAULT_POLICY_ID]) is ReplayBuffer
    local.update_priorities({DEFAULT_POLICY_ID: (replayed["batch_indexes"], np.ones(5))})  # a no-op


def test_beta_can_be_annealed_and_is_validated() -> None:
    local = LocalReplayBuffer(capacity=10, learning_starts=0, replay_batch_size=64, prioritized_replay_alpha=1.0)
    local.add_batch(make_batch(10))
    idxes = np.arange(10)
    local.update_priorities({DEFAULT_POLICY_ID: (idxes, np.arange(1.0, 11.0))})
    local.beta = 0.0
    assert np.all(replayed(local)["weights"] == 1.0)
    local.beta = 1.0
    assert replayed(local)["weights"].min() < 0.2
    with pytest.raises(ReplayBufferError, match="got 1.2"):
        local.beta = 1.2
    assert local.beta == 1.0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"capacity": 0}, "capacity must be an integer >= 1, got 0"),
        ({"learning_starts": -1}, "learning_starts must be an integer >= 0, got -1"),
        ({"replay_batch_size": 0}, "replay_batch_size must be an integer >= 1, got 0"),
        ({"prioritized_replay_alpha": -1.0}, "alpha must be a finite number >= 0, got -1.0"),
        ({"prioritized_replay_beta": 1.5}, r"beta must be in \[0, 1\], got 1.5"),
        ({"prioritized_replay_beta": -0.1}, r"beta must be in \[0, 1\], got -0.1"),
        ({"prioritized_replay_eps": 0.0}, "eps must be a finite number > 0, got 0.0"),
        ({"prioritized_replay_eps": -1e-6}, "eps must be a finite number > 0, got -1e-06"),
    ],
)
def test_local_buffer_rejects_invalid_arguments(kwargs: dict, message: str) -> None:
    args = {"capacity": 10, "learning_starts": 0, "replay_batch_size": 4, **kwargs}
    with pytest.raises(ReplayBufferError, match=message) as info:
        LocalReplayBuffer(**args)
    assert isinstance(info.value, FlowRLError)


def test_local_buffer_reports_every_invalid_argument_at_once() -> None:
    with pytest.raises(ReplayBufferError) as info:
        LocalReplayBuffer(capacity=0, learning_starts=-5, replay_batch_size=0, prioritized_replay_eps=0)
    message = str(info.value)
    for part in ("capacity", "learning_starts", "replay_batch_size", "prioritized_replay_eps"):
        assert part in message


def test_wrong_batch_types_are_rejected() -> None:
    local = LocalReplayBuffer(capacity=10, learning_starts=0, replay_batch_size=4)
    with pytest.raises(ReplayBufferError, match="got dict"):
        local.add_batch(cast(Any, {"obs": np.zeros(3)}))
    with pytest.raises(ReplayBufferError, match="use LocalReplayBuffer"):
        ReplayBuffer(4).add(cast(Any, MultiAgentBatch({"a": make_batch(2)}, env_steps=2)))


def test_local_state_round_trip_with_contents_replays_identically() -> None:
    def build() -> LocalReplayBuffer:
        return LocalReplayBuffer(capacity=16, learning_starts=5, replay_batch_size=8, seed=123)

    local = build()
    local.add_batch(MultiAgentBatch({"a": make_batch(10), "b": make_batch(20, start=50)}, env_steps=10))
    first = local.replay()
    assert isinstance(first, MultiAgentBatch)
    td_errors = np.linspace(0, 3, 8)
    local.update_priorities({pid: (b["batch_indexes"], td_errors) for pid, b in first.policy_batches.items()})
    local.beta = 0.7
    state = pickle.loads(pickle.dumps(local.get_state(include_contents=True)))
    restored = build()
    restored.set_state(state)
    assert restored.beta == 0.7 and restored.num_steps_added == 10
    assert restored.stats() == local.stats()
    for _ in range(3):
        a, b = local.replay(), restored.replay()
        assert isinstance(a, MultiAgentBatch) and isinstance(b, MultiAgentBatch)
        for pid in a.policy_batches:
            for key in a.policy_batches[pid]:
                np.testing.assert_array_equal(a.policy_batches[pid][key], b.policy_batches[pid][key])


def test_local_buffers_name_written_columns_by_policy_and_read_them_back() -> None:
    local = LocalReplayBuffer(capacity=16, learning_starts=5, replay_batch_size=8, seed=5)
    local.add_batch(MultiAgentBatch({"a": make_batch(10), "b": make_batch(20, start=50)}, env_steps=10))
    columns = MemoryColumns()
    state = local.get_state(include_contents=True, write_column=columns.write)
    assert sorted(columns.stored) == sorted(f"{pid}/{key}" for pid in "ab" for key in make_batch(1))
    restored = LocalReplayBuffer(capacity=16, learning_starts=5, replay_batch_size=8, seed=0)
    restored.set_state(state, read_column=columns.read)
    a, b = local.replay(), restored.replay()
    assert isinstance(a, MultiAgentBatch) and isinstance(b, MultiAgentBatch)
    for pid in a.policy_batches:
        for key in a.policy_batches[pid]:
            np.testing.assert_array_equal(a.policy_batches[pid][key], b.policy_batches[pid][key])


def test_local_state_without_contents_restores_counters_and_leaves_buffers_empty() -> None:
    local = LocalReplayBuffer(capacity=16, learning_starts=5, replay_batch_size=4, seed=1)
    local.add_batch(make_batch(10))
    state = local.get_state()
    restored = LocalReplayBuffer(capacity=16, learning_starts=5, replay_batch_size=4, seed=1)
    restored.set_state(state)
    assert restored.num_steps_added == 10
    assert restored.replay() is None  # past learning_starts, but nothing to replay
    restored.add_batch(make_batch(1))
    assert replayed(restored).count == 4


def test_a_state_says_whether_it_holds_rows() -> None:
    local = LocalReplayBuffer(capacity=16, learning_starts=5, replay_batch_size=4, seed=1)
    assert not LocalReplayBuffer.state_holds_rows(local.get_state(include_contents=True))  # nothing stored yet
    local.add_batch(make_batch(10))
    assert LocalReplayBuffer.state_holds_rows(local.get_state(include_contents=True))
    assert not LocalReplayBuffer.state_holds_rows(local.get_state())
    assert not LocalReplayBuffer.state_holds_rows(None)  # a shard that was dead when its checkpoint was saved


def test_per_policy_seeds_do_not_depend_on_arrival_order() -> None:
    one = LocalReplayBuffer(capacity=10, learning_starts=0, replay_batch_size=6, seed=9)
    two = LocalReplayBuffer(capacity=10, learning_starts=0, replay_batch_size=6, seed=9)
    one.add_batch(MultiAgentBatch({"x": make_batch(10), "y": make_batch(10)}, env_steps=10))
    two.add_batch(MultiAgentBatch({"y": make_batch(10), "x": make_batch(10)}, env_steps=10))
    a, b = one.replay(), two.replay()
    assert isinstance(a, MultiAgentBatch) and isinstance(b, MultiAgentBatch)
    for pid in ("x", "y"):
        np.testing.assert_array_equal(a.policy_batches[pid]["batch_indexes"], b.policy_batches[pid]["batch_indexes"])


def test_rows_with_td_errors_are_stored_at_those_priorities_and_sampled_by_them() -> None:
    """Worker-side priorities: a batch's td_error column sets its rows' priorities (|td| + eps), not the max."""
    buffer = LocalReplayBuffer(100, 0, 400, prioritized_replay_alpha=1.0, prioritized_replay_eps=0.01, seed=0)
    buffer.add_batch(make_batch(10))  # at the max priority (1.0)
    surprising = make_batch(10, start=10)
    surprising[SampleBatch.TD_ERROR] = np.array([-0.09] * 9 + [9.99], dtype=np.float32)
    buffer.add_batch(surprising)
    stored = buffer.buffers[DEFAULT_POLICY_ID]
    np.testing.assert_allclose(stored.priorities(), [1.0] * 10 + [0.1] * 9 + [10.0], rtol=1e-6)
    assert SampleBatch.TD_ERROR not in stored.columns
    replayed = buffer.replay()
    assert replayed is not None
    counts = np.bincount(replayed["actions"].astype(int), minlength=20)
    # P(row 19) = 10 / (10 + 0.9 + 10) ~ 0.48; a row at 0.1 gets ~ 0.005 of the draws.
    assert counts[19] > 150 and counts[10:19].sum() < 20


def test_a_uniform_buffer_drops_the_td_error_column() -> None:
    buffer = LocalReplayBuffer(10, 0, 2, prioritized=False, seed=0)
    batch = make_batch(3)
    batch[SampleBatch.TD_ERROR] = np.ones(3, dtype=np.float32)
    buffer.add_batch(batch)
    assert SampleBatch.TD_ERROR not in buffer.buffers[DEFAULT_POLICY_ID].columns
