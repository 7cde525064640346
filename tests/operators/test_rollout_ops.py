"""Reshaping experience without a cluster: ConcatBatches, SelectExperiences, StandardizeFields, step counting."""

from __future__ import annotations

from typing import Iterable

import numpy as np
import pytest
from fakes import from_list

from flowrl.data import DEFAULT_POLICY_ID, MultiAgentBatch, SampleBatch
from flowrl.errors import FlowRLError
from flowrl.operators import (
    AGENT_STEPS_SAMPLED_COUNTER,
    STEPS_SAMPLED_COUNTER,
    ConcatBatches,
    SelectExperiences,
    StandardizeFields,
)
from flowrl.operators.rollout_ops import count_steps_sampled

pytestmark = pytest.mark.unit


def batch_of(ids: Iterable[int]) -> SampleBatch:
    ids = np.asarray(list(ids))
    return SampleBatch({"id": ids, SampleBatch.REWARDS: ids.astype(np.float32)})


def test_concat_batches_yields_once_min_size_is_reached_keeping_every_row() -> None:
    batches = [batch_of(range(3 * i, 3 * i + 3)) for i in range(9)]  # 27 rows, 3 per batch
    out = list(from_list(batches).combine(ConcatBatches(10)))
    # 4 batches (12 rows >= 10) per output; rows beyond the minimum are kept, not dropped or carried.
    assert [b.count for b in out] == [12, 12]
    assert np.concatenate([b["id"] for b in out]).tolist() == list(range(24))


def test_concat_batches_returns_nothing_while_accumulating() -> None:
    op = ConcatBatches(5)
    assert op(batch_of([0, 1])) == []
    assert op(batch_of([2, 3])) == []
    (out,) = op(batch_of([4, 5, 6]))
    assert out["id"].tolist() == [0, 1, 2, 3, 4, 5, 6]
    assert op(batch_of([7])) == []  # starts over after an output


def test_concat_batches_passes_a_big_batch_through_alone() -> None:
    (out,) = ConcatBatches(4)(batch_of(range(9)))
    assert out.count == 9


def test_concat_batches_of_multi_agent_batches_counts_env_steps() -> None:
    op = ConcatBatches(10)
    first = MultiAgentBatch({"a": batch_of(range(6)), "b": batch_of(range(2))}, env_steps=6)
    assert op(first) == []
    (out,) = op(MultiAgentBatch({"a": batch_of(range(6, 12))}, env_steps=6))
    assert isinstance(out, MultiAgentBatch) and out.env_steps() == 12
    assert out.policy_batches["a"]["id"].tolist() == list(range(12))
    assert out.policy_batches["b"].count == 2


def test_concat_batches_rejects_a_non_positive_size() -> None:
    with pytest.raises(FlowRLError, match="min_batch_size"):
        ConcatBatches(0)


def test_select_experiences_keeps_only_the_given_policies() -> None:
    batch = MultiAgentBatch({"p1": batch_of(range(3)), "p2": batch_of(range(5)), "p3": batch_of(range(1))}, env_steps=5)
    out = SelectExperiences(["p1", "p3"])(batch)
    assert isinstance(out, MultiAgentBatch)
    assert set(out.policy_batches) == {"p1", "p3"}
    assert out.env_steps() == 5 and out.agent_steps() == 4


def test_select_experiences_on_a_single_agent_batch() -> None:
    batch = batch_of(range(4))
    assert SelectExperiences([DEFAULT_POLICY_ID])(batch) is batch
    with pytest.raises(FlowRLError, match="single-agent"):
        SelectExperiences(["other"])(batch)


def test_standardize_fields_gives_mean_zero_and_std_one() -> None:
    rng = np.random.default_rng(0)
    batch = SampleBatch({"adv": rng.normal(5.0, 3.0, 200).astype(np.float32), "keep": np.arange(200.0)})
    out = StandardizeFields(["adv"])(batch)
    assert out["adv"].mean() == pytest.approx(0.0, abs=1e-5)
    assert out["adv"].std() == pytest.approx(1.0, abs=1e-4)
    np.testing.assert_array_equal(out["keep"], np.arange(200.0))


def test_standardize_fields_per_policy_of_a_multi_agent_batch() -> None:
    batch = MultiAgentBatch(
        {"a": SampleBatch({"adv": np.array([1.0, 2.0, 3.0])}), "b": SampleBatch({"adv": np.array([100.0, 300.0])})}, 3
    )
    out = StandardizeFields(["adv"])(batch)
    for pid in ("a", "b"):
        column = out.policy_batches[pid]["adv"]
        assert column.mean() == pytest.approx(0.0, abs=1e-6) and column.std() == pytest.approx(1.0, abs=1e-5)


def test_standardize_a_constant_field_stays_finite() -> None:
    out = StandardizeFields(["adv"])(SampleBatch({"adv": np.full(5, 2.0)}))
    np.testing.assert_array_equal(out["adv"], np.zeros(5))


def test_count_steps_sampled_counts_env_and_agent_steps() -> None:
    multi = MultiAgentBatch({"a": batch_of(range(4)), "b": batch_of(range(4))}, env_steps=4)
    flow = from_list([batch_of(range(3)), multi]).for_each(count_steps_sampled)
    assert len(list(flow)) == 2
    counters = flow.shared_metrics.get().counters
    assert counters[STEPS_SAMPLED_COUNTER] == 7
    assert counters[AGENT_STEPS_SAMPLED_COUNTER] == 11
