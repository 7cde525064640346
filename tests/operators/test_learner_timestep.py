"""Every learning operator gives the learner's policies the env steps sampled so far before they learn (what
lr_schedule and entropy_coeff_schedule read): TrainOneStep, ComputeGradients, ApplyGradients (A3C's apply
path) and SendWeightsToSource (the learner thread's policies, in IMPALA, APPO and Ape-X)."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any, cast

import numpy as np
import pytest
from fakes import FakeWorkerSet, from_list, id_batch

from flowrl.actors import LearnerThread
from flowrl.data import DEFAULT_POLICY_ID, SampleBatch
from flowrl.iterators import FromActor, LocalIterator
from flowrl.operators import (
    STEPS_SAMPLED_COUNTER,
    ApplyGradients,
    ComputedGradients,
    ComputeGradients,
    TrainOneStep,
)
from flowrl.operators.learner_ops import SendWeightsToSource

pytestmark = pytest.mark.unit


def sampled(steps: int) -> Any:
    def count(item: Any) -> Any:
        LocalIterator.get_metrics().counters[STEPS_SAMPLED_COUNTER] += steps
        return item

    return count


def timestep_seen(workers: FakeWorkerSet) -> int | None:
    return workers.local.global_vars[-1]["timestep"] if workers.local.global_vars else None


def test_train_one_step_gives_the_learner_the_timestep_before_it_learns() -> None:
    workers = FakeWorkerSet()
    policy = workers.local.get_policy()
    seen: list[int | None] = []
    learn = policy.learn_on_batch

    def record_learn(batch: SampleBatch) -> dict[str, float]:
        seen.append(timestep_seen(workers))
        return learn(batch)

    policy.learn_on_batch = record_learn  # type: ignore[method-assign]
    list(from_list([id_batch(3), id_batch(3)]).for_each(sampled(50)).for_each(TrainOneStep(workers)))
    assert seen == [50, 100]


def test_compute_and_apply_gradients_give_the_learner_the_timestep_first() -> None:
    workers = FakeWorkerSet()
    seen: list[int | None] = []
    compute = workers.local.compute_gradients

    def record_compute(batch: SampleBatch, policy_id: str = DEFAULT_POLICY_ID) -> Any:
        seen.append(timestep_seen(workers))
        return compute(batch, policy_id)

    workers.local.compute_gradients = record_compute  # type: ignore[method-assign]
    flow = from_list([id_batch(2)]).for_each(sampled(7)).for_each(ComputeGradients(workers))
    next(flow)
    assert seen == [7]

    apply_workers = FakeWorkerSet()
    apply = apply_workers.local.apply_gradients
    applied_at: list[int | None] = []

    def record_apply(gradients: list[np.ndarray], policy_id: str = DEFAULT_POLICY_ID) -> None:
        applied_at.append(timestep_seen(apply_workers))
        apply(gradients, policy_id)

    apply_workers.local.apply_gradients = record_apply  # type: ignore[method-assign]
    item = ComputedGradients([np.ones(2)], 4)
    list(from_list([item, item]).for_each(sampled(30)).for_each(ApplyGradients(apply_workers)))
    assert applied_at == [30, 60]


def test_send_weights_to_source_keeps_the_learner_threads_timestep_current() -> None:
    workers = FakeWorkerSet()
    learner = SimpleNamespace(num_batches_trained=0, lock=threading.Lock())
    # Never due (no learner update yet): only the timestep moves.
    op = SendWeightsToSource(cast(LearnerThread, learner), workers, min_learner_updates=1)
    items = [FromActor("worker", id_batch(5)) for _ in range(3)]
    list(from_list(items).for_each(sampled(5)).for_each(op))
    assert [v["timestep"] for v in workers.local.global_vars] == [5, 10, 15]
