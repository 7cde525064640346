"""SampleBatch and MultiAgentBatch: construction, slicing, concatenation, shuffling, splitting."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from flowrl.data import DEFAULT_POLICY_ID, MultiAgentBatch, SampleBatch, concat_samples

pytestmark = pytest.mark.unit


def make_batch(n: int = 10, start: int = 0) -> SampleBatch:
    idx = np.arange(start, start + n)
    return SampleBatch(
        obs=np.stack([idx, -idx], axis=1).astype(np.float32),
        actions=idx % 3,
        rewards=idx.astype(np.float32) * 0.5,
    )


# -- construction -----------------------------------------------------------------------


def test_lists_become_arrays_with_inferred_dtypes() -> None:
    b = SampleBatch(
        {"obs": [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], "actions": [0, 1, 2], "terminateds": [False, False, True]}
    )
    for v in b.values():
        assert isinstance(v, np.ndarray)
    assert b["obs"].shape == (3, 2)
    assert b["obs"].dtype.kind == "f"
    assert b["actions"].dtype.kind == "i"
    assert b["terminateds"].dtype == np.bool_
    assert b.count == 3 == len(b)


def test_keyword_construction_matches_dict_construction() -> None:
    a = SampleBatch(obs=[1, 2], rewards=[0.5, 1.5])
    b = SampleBatch({"obs": [1, 2], "rewards": [0.5, 1.5]})
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])


def test_existing_arrays_are_not_copied() -> None:
    arr = np.arange(4)
    b = SampleBatch(obs=arr)
    assert b["obs"] is arr


def test_mismatched_lengths_raise_naming_columns_and_lengths() -> None:
    with pytest.raises(ValueError) as info:
        SampleBatch(obs=np.zeros((3, 2)), rewards=np.zeros(4))
    msg = str(info.value)
    assert "obs" in msg and "rewards" in msg
    assert "3" in msg and "4" in msg


def test_empty_batch_counts_zero() -> None:
    b = SampleBatch()
    assert b.count == 0 == len(b)
    assert b.env_steps() == 0 == b.agent_steps()


def test_count_len_env_and_agent_steps() -> None:
    b = make_batch(7)
    assert b.count == 7
    assert len(b) == 7
    assert b.env_steps() == 7
    assert b.agent_steps() == 7
    assert "7 rows" in repr(b)


def test_dict_style_access_still_works() -> None:
    b = make_batch(4)
    assert set(b.keys()) == {"obs", "actions", "rewards"}
    assert SampleBatch.OBS in b
    np.testing.assert_array_equal(b[SampleBatch.ACTIONS], [0, 1, 2, 0])
    with pytest.raises(KeyError):
        b["nope"]


# -- slicing ----------------------------------------------------------------------------


def test_getitem_slice_returns_rows() -> None:
    b = make_batch(10)
    s = b[2:5]
    assert isinstance(s, SampleBatch)
    assert s.count == 3
    np.testing.assert_array_equal(s["actions"], b["actions"][2:5])
    np.testing.assert_array_equal(s["obs"], b["obs"][2:5])
    np.testing.assert_array_equal(s["rewards"], [1.0, 1.5, 2.0])


def test_slice_method_matches_getitem() -> None:
    b = make_batch(10)
    for start, end in [(0, 10), (3, 7), (9, 10), (4, 4)]:
        s1, s2 = b.slice(start, end), b[start:end]
        assert s1.count == s2.count == end - start
        for k in b:
            np.testing.assert_array_equal(s1[k], s2[k])


def test_open_and_negative_slices() -> None:
    b = make_batch(10)
    np.testing.assert_array_equal(b[:3]["rewards"], b["rewards"][:3])
    np.testing.assert_array_equal(b[7:]["rewards"], b["rewards"][7:])
    np.testing.assert_array_equal(b[-2:]["rewards"], b["rewards"][-2:])
    assert b[5:100].count == 5  # clipped like a list slice
    assert b[:].count == 10


def test_strided_slice_raises() -> None:
    b = make_batch(10)
    with pytest.raises(ValueError, match="step"):
        b[::2]


def test_slice_is_a_view() -> None:
    b = make_batch(10)
    s = b.slice(2, 4)
    s["rewards"][0] = 99.0
    assert b["rewards"][2] == 99.0


# -- concat -----------------------------------------------------------------------------


def test_concat_samples_row_order_and_values() -> None:
    a, b, c = make_batch(3, 0), make_batch(4, 3), make_batch(2, 7)
    out = concat_samples([a, b, c])
    ref = make_batch(9)
    assert isinstance(out, SampleBatch)
    assert out.count == 9
    for k in ref:
        np.testing.assert_array_equal(out[k], ref[k])
        assert out[k].dtype == ref[k].dtype


def test_concat_samples_skips_empty_batches() -> None:
    a = make_batch(3)
    out = concat_samples([SampleBatch(), a, SampleBatch()])
    assert out.count == 3
    np.testing.assert_array_equal(out["actions"], a["actions"])


def test_concat_samples_of_nothing_is_empty() -> None:
    assert concat_samples([]).count == 0


def test_concat_samples_does_not_alias_inputs() -> None:
    a, b = make_batch(2), make_batch(2, 2)
    out = concat_samples([a, b])
    out["rewards"][0] = 123.0
    assert a["rewards"][0] == 0.0


def test_concat_different_columns_raises_naming_columns() -> None:
    a = make_batch(3)
    b = SampleBatch(obs=np.zeros((2, 2), np.float32), actions=[0, 1], vf_preds=[0.0, 0.0])
    with pytest.raises(ValueError) as info:
        concat_samples([a, b])
    msg = str(info.value)
    assert "rewards" in msg and "vf_preds" in msg


# -- shuffle ----------------------------------------------------------------------------


def test_shuffle_permutes_rows_consistently() -> None:
    b = make_batch(50)
    s = b.shuffle(seed=1)
    assert s.count == 50
    assert not np.array_equal(s["actions"], b["actions"]) or not np.array_equal(s["rewards"], b["rewards"])
    # Same multiset of rows, and each row kept together across columns.
    order = np.argsort(s["rewards"])
    np.testing.assert_array_equal(s["rewards"][order], b["rewards"])
    np.testing.assert_array_equal(s["obs"][order], b["obs"])
    np.testing.assert_array_equal(s["actions"][order], b["actions"])


def test_shuffle_is_reproducible_with_a_seed_and_differs_across_seeds() -> None:
    b = make_batch(50)
    s1, s2, s3 = b.shuffle(seed=7), b.shuffle(seed=7), b.shuffle(seed=8)
    for k in b:
        np.testing.assert_array_equal(s1[k], s2[k])
    assert not np.array_equal(s1["rewards"], s3["rewards"])


def test_shuffle_accepts_a_generator_and_returns_a_copy() -> None:
    b = make_batch(20)
    before = b["rewards"].copy()
    s = b.shuffle(np.random.default_rng(3))
    np.testing.assert_array_equal(b["rewards"], before)  # original untouched
    s["rewards"][:] = -1.0
    np.testing.assert_array_equal(b["rewards"], before)


# -- episodes and timeslices ------------------------------------------------------------


def test_split_by_episode_contiguous_runs() -> None:
    eps = np.array([5, 5, 5, 2, 2, 9, 5, 5])
    b = SampleBatch(eps_id=eps, t=np.arange(8), rewards=np.arange(8, dtype=np.float32))
    parts = b.split_by_episode()
    assert [p.count for p in parts] == [3, 2, 1, 2]
    assert [int(p["eps_id"][0]) for p in parts] == [5, 2, 9, 5]
    for p in parts:
        assert len(set(p["eps_id"].tolist())) == 1
    np.testing.assert_array_equal(concat_samples(parts)["t"], np.arange(8))
    np.testing.assert_array_equal(parts[1]["rewards"], [3.0, 4.0])


def test_split_by_episode_single_episode_and_empty() -> None:
    b = SampleBatch(eps_id=[1, 1, 1], rewards=[1.0, 2.0, 3.0])
    parts = b.split_by_episode()
    assert len(parts) == 1 and parts[0].count == 3
    assert SampleBatch(eps_id=np.zeros(0, np.int64)).split_by_episode() == []


def test_split_by_episode_without_eps_id_raises() -> None:
    with pytest.raises(KeyError, match="eps_id"):
        make_batch(3).split_by_episode()


def test_timeslices() -> None:
    b = make_batch(10)
    parts = b.timeslices(4)
    assert [p.count for p in parts] == [4, 4, 2]
    np.testing.assert_array_equal(parts[2]["actions"], b["actions"][8:])
    np.testing.assert_array_equal(concat_samples(parts)["rewards"], b["rewards"])
    assert [p.count for p in b.timeslices(5)] == [5, 5]
    assert [p.count for p in b.timeslices(100)] == [10]
    assert [p.count for p in b.timeslices(1)] == [1] * 10


@pytest.mark.parametrize("size", [0, -3])
def test_timeslices_rejects_bad_size(size: int) -> None:
    with pytest.raises(ValueError, match=str(size)):
        make_batch(3).timeslices(size)


def test_rows() -> None:
    b = make_batch(4)
    rows = list(b.rows())
    assert len(rows) == 4
    assert set(rows[2]) == {"obs", "actions", "rewards"}
    np.testing.assert_array_equal(rows[2]["obs"], [2.0, -2.0])
    assert rows[2]["actions"] == 2
    assert rows[3]["rewards"] == 1.5
    assert list(SampleBatch().rows()) == []


# -- copy -------------------------------------------------------------------------------


def test_copy_is_independent() -> None:
    b = make_batch(5)
    c = b.copy()
    assert isinstance(c, SampleBatch)
    assert c.keys() == b.keys()
    for k in b:
        np.testing.assert_array_equal(c[k], b[k])
        assert not np.shares_memory(c[k], b[k])
    c["obs"][0, 0] = 1000.0
    c["rewards"][:] = -1.0
    c["new_col"] = np.zeros(5)
    assert b["obs"][0, 0] == 0.0
    assert b["rewards"][1] == 0.5
    assert "new_col" not in b


def test_copy_of_a_slice_does_not_write_through() -> None:
    b = make_batch(5)
    c = b[1:3].copy()
    c["rewards"][0] = 42.0
    assert b["rewards"][1] == 0.5


# -- MultiAgentBatch --------------------------------------------------------------------


def test_multi_agent_env_steps_vs_agent_steps() -> None:
    ma = MultiAgentBatch({"p0": make_batch(5), "p1": make_batch(3)}, env_steps=5)
    assert ma.env_steps() == 5
    assert ma.count == 5
    assert ma.agent_steps() == 8
    assert "env_steps=5" in repr(ma)


def test_multi_agent_concat_adds_env_steps_and_concatenates_per_policy() -> None:
    a = MultiAgentBatch({"p0": make_batch(5, 0), "p1": make_batch(3, 0)}, env_steps=5)
    b = MultiAgentBatch({"p0": make_batch(2, 5), "p2": make_batch(4, 0)}, env_steps=4)
    out = concat_samples([a, b])
    assert isinstance(out, MultiAgentBatch)
    assert out.env_steps() == 9
    assert out.agent_steps() == 5 + 3 + 2 + 4
    assert set(out.policy_batches) == {"p0", "p1", "p2"}
    np.testing.assert_array_equal(out.policy_batches["p0"]["rewards"], make_batch(7)["rewards"])
    assert out.policy_batches["p1"].count == 3
    assert out.policy_batches["p2"].count == 4
    # The static method agrees.
    out2 = MultiAgentBatch.concat_samples([a, b])
    assert out2.env_steps() == 9 and out2.agent_steps() == 14


def test_multi_agent_concat_with_plain_batch_raises() -> None:
    a = MultiAgentBatch({"p0": make_batch(2)}, env_steps=2)
    with pytest.raises(ValueError, match="SampleBatch"):
        MultiAgentBatch.concat_samples([a, make_batch(2)])


def test_multi_agent_copy_is_deep() -> None:
    a = MultiAgentBatch({"p0": make_batch(3)}, env_steps=3)
    c = a.copy()
    c.policy_batches["p0"]["rewards"][:] = -5.0
    assert a.policy_batches["p0"]["rewards"][1] == 0.5
    assert c.env_steps() == 3


def test_wrap_as_needed_default_policy_only_gives_sample_batch() -> None:
    sb = make_batch(4)
    out = MultiAgentBatch.wrap_as_needed({DEFAULT_POLICY_ID: sb}, env_steps=4)
    assert out is sb
    assert isinstance(out, SampleBatch)


def test_wrap_as_needed_other_policies_give_multi_agent_batch() -> None:
    out = MultiAgentBatch.wrap_as_needed({"p0": make_batch(4)}, env_steps=2)
    assert isinstance(out, MultiAgentBatch)
    assert out.env_steps() == 2 and out.agent_steps() == 4
    out = MultiAgentBatch.wrap_as_needed({DEFAULT_POLICY_ID: make_batch(4), "p1": make_batch(4)}, env_steps=4)
    assert isinstance(out, MultiAgentBatch)
    assert out.agent_steps() == 8


def test_multi_agent_size_bytes_sums_policies() -> None:
    a, b = make_batch(4), make_batch(6)
    ma = MultiAgentBatch({"a": a, "b": b}, env_steps=6)
    assert ma.size_bytes() == a.size_bytes() + b.size_bytes()
    assert a.size_bytes() == sum(v.nbytes for v in a.values())


def test_setting_a_column_converts_and_checks_its_length() -> None:
    batch = SampleBatch({"obs": np.zeros((3, 2))})
    batch["rewards"] = [1.0, 2.0, 3.0]
    assert isinstance(batch["rewards"], np.ndarray)
    with pytest.raises(ValueError, match="'dones' has 1 rows but the SampleBatch has 3"):
        batch["dones"] = [True]
    only = SampleBatch({"a": [1, 2]})
    only["a"] = [1, 2, 3]  # replacing the only column may change the row count
    assert only.count == 3


def test_concat_samples_leaves_compressed_inputs_compressed() -> None:
    packed = SampleBatch({"obs": np.ones((4, 8), np.uint8)}).compress(["obs"])
    joined = concat_samples([packed, packed])
    assert joined.count == 8 and not joined.is_compressed()
    assert packed.is_compressed()


def test_a_batch_of_sequences_survives_pickling_whatever_its_column_order() -> None:
    # Ray ships fragments by pickle: state_in_* before seq_lens once failed the row-count check on the way in.
    batch = SampleBatch({"state_in_0": np.zeros((2, 3)), "obs": np.arange(5.0), "seq_lens": np.array([3, 2])})
    restored = pickle.loads(pickle.dumps(batch))
    assert isinstance(restored, SampleBatch) and restored.count == 5
    np.testing.assert_array_equal(restored["seq_lens"], [3, 2])
