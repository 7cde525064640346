"""Operators over real rollout workers: ParallelRollouts, AsyncGradients, TrainOneStep, ApplyGradients.

One small WorkerSet (2 remote workers) is shared by the module; tests that compare
weights first make every copy equal.
"""

from __future__ import annotations

from typing import Iterator

import gymnasium as gym
import numpy as np
import pytest
import ray
from fakes import from_list, weights_of

from flowrl.actors import WorkerSet
from flowrl.algorithms import get_algorithm
from flowrl.data import DEFAULT_POLICY_ID, SampleBatch
from flowrl.envs import get_env_creator
from flowrl.errors import FlowRLError
from flowrl.iterators import ParallelIterator
from flowrl.operators import (
    LEARNER_INFO,
    STEPS_SAMPLED_COUNTER,
    STEPS_TRAINED_COUNTER,
    ApplyGradients,
    AsyncGradients,
    ComputedGradients,
    ComputeGradients,
    ParallelRollouts,
    TrainOneStep,
)

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("ray_session"), pytest.mark.timeout(120)]

FRAGMENT = 10


def make_workers(num_workers: int) -> WorkerSet:
    a2c = get_algorithm("a2c")
    config = a2c.config_class.from_dict(
        {
            "seed": 0,
            "rollout_fragment_length": FRAGMENT,
            "num_envs_per_worker": 1,
            "lr": 0.01,
            "num_workers": num_workers,
        }
    )
    env = gym.make("CartPole-v1")
    spec = a2c.make_policy(env.observation_space, env.action_space, config)
    return WorkerSet(
        env_creator=get_env_creator("CartPole-v1"),
        policy_specs={DEFAULT_POLICY_ID: spec},
        config=config,
        num_workers=num_workers,
        num_cpus_per_worker=0.1,
    )


@pytest.fixture(scope="module")
def workers(ray_session: None) -> Iterator[WorkerSet]:
    ws = make_workers(2)
    yield ws
    ws.stop()


@pytest.fixture(scope="module")
def local_only(ray_session: None) -> Iterator[WorkerSet]:
    ws = make_workers(0)
    yield ws
    ws.stop()


def same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


# --- ParallelRollouts ---


def test_bulk_sync_concatenates_one_fragment_from_every_worker(workers: WorkerSet) -> None:
    rollouts = ParallelRollouts(workers, mode="bulk_sync")
    first, second = rollouts.take(2)
    for batch in (first, second):
        assert batch.count == 2 * FRAGMENT
        # Episode ids carry the worker index in their high bits: both workers contributed FRAGMENT rows.
        sources = (batch[SampleBatch.EPS_ID] >> 40).tolist()
        assert sorted(set(sources)) == [1, 2] and sources.count(1) == FRAGMENT
    counters = rollouts.shared_metrics.get().counters
    assert counters[STEPS_SAMPLED_COUNTER] == 4 * FRAGMENT
    assert counters["num_agent_steps_sampled"] == 4 * FRAGMENT


def test_async_yields_single_fragments_as_they_arrive(workers: WorkerSet) -> None:
    rollouts = ParallelRollouts(workers, mode="async", num_async=2)
    batches = rollouts.take(4)
    assert [b.count for b in batches] == [FRAGMENT] * 4
    for b in batches:
        assert len(set((b[SampleBatch.EPS_ID] >> 40).tolist())) == 1  # one worker's fragment
    metrics = rollouts.shared_metrics.get()
    assert metrics.counters[STEPS_SAMPLED_COUNTER] == 4 * FRAGMENT
    assert metrics.current_actor in workers.remote_workers()


def test_raw_returns_the_parallel_iterator_over_the_workers(workers: WorkerSet) -> None:
    raw = ParallelRollouts(workers, mode="raw")
    assert isinstance(raw, ParallelIterator)
    assert raw.num_shards() == 2
    batches = raw.gather_sync().take(2)
    assert [b.count for b in batches] == [FRAGMENT, FRAGMENT]


def test_an_unknown_mode_raises(workers: WorkerSet) -> None:
    with pytest.raises(FlowRLError, match="mode"):
        ParallelRollouts(workers, mode="sync")


def test_without_remote_workers_the_local_worker_samples(local_only: WorkerSet) -> None:
    rollouts = ParallelRollouts(local_only, mode="bulk_sync")
    batches = rollouts.take(3)
    assert [b.count for b in batches] == [FRAGMENT] * 3
    assert rollouts.shared_metrics.get().counters[STEPS_SAMPLED_COUNTER] == 3 * FRAGMENT
    assert (ParallelRollouts(local_only, mode="async").take(1)[0]).count == FRAGMENT
    with pytest.raises(FlowRLError, match="remote workers"):
        ParallelRollouts(local_only, mode="raw")
    with pytest.raises(FlowRLError, match="remote workers"):
        AsyncGradients(local_only)


# --- TrainOneStep ---


def test_train_one_step_learns_locally_and_broadcasts_weights(workers: WorkerSet) -> None:
    workers.sync_weights()
    before = workers.local_worker().get_weights()[DEFAULT_POLICY_ID]
    batch = workers.local_worker().sample()
    flow = from_list([batch]).for_each(TrainOneStep(workers))
    info = next(flow).info
    metrics = flow.shared_metrics.get()
    assert metrics.counters[STEPS_TRAINED_COUNTER] == batch.count
    assert set(info) == {DEFAULT_POLICY_ID} and "vf_loss" in info[DEFAULT_POLICY_ID]
    assert metrics.info[LEARNER_INFO] == info
    assert metrics.timers["learn"].count == 1 and metrics.timers["update"].count == 1
    weights = weights_of(workers)
    assert not same(weights[0], before)  # it learned
    assert all(same(weights[0], remote) for remote in weights[1:])  # and every worker has the result


def test_train_one_step_runs_num_sgd_iter_epochs_of_minibatches(
    workers: WorkerSet, monkeypatch: pytest.MonkeyPatch
) -> None:
    policy = workers.local_worker().get_policy()
    sizes: list[int] = []
    original = policy.learn_on_batch

    def counting(batch: SampleBatch) -> dict[str, float]:
        sizes.append(batch.count)
        return original(batch)

    monkeypatch.setattr(policy, "learn_on_batch", counting)
    batch = workers.local_worker().sample()  # FRAGMENT rows
    op = TrainOneStep(workers, num_sgd_iter=3, sgd_minibatch_size=FRAGMENT // 2)
    list(from_list([batch]).for_each(op))
    assert sizes == [FRAGMENT // 2] * 6  # 3 epochs x 2 minibatches


# --- gradients ---


def test_async_gradients_yield_grads_and_count_and_set_the_source_actor(workers: WorkerSet) -> None:
    flow = AsyncGradients(workers)
    grads, count = next(flow)
    params = list(workers.local_worker().get_policy().model.parameters())
    assert [g.shape for g in grads] == [tuple(p.shape) for p in params]
    assert count == FRAGMENT
    metrics = flow.shared_metrics.get()
    assert metrics.current_actor in workers.remote_workers()
    assert metrics.counters[STEPS_SAMPLED_COUNTER] == FRAGMENT
    assert DEFAULT_POLICY_ID in metrics.info[LEARNER_INFO]


def test_async_gradients_count_agent_steps_sampled_too(workers: WorkerSet) -> None:
    flow = AsyncGradients(workers)
    next(flow)
    assert flow.shared_metrics.get().counters["num_agent_steps_sampled"] == FRAGMENT


def test_apply_gradients_to_the_source_worker_only(workers: WorkerSet) -> None:
    workers.sync_weights()
    before = weights_of(workers)
    assert all(same(before[0], w) for w in before[1:])
    flow = AsyncGradients(workers).for_each(ApplyGradients(workers, update_all=False))
    next(flow)
    source = flow.shared_metrics.get().current_actor
    assert flow.shared_metrics.get().counters[STEPS_TRAINED_COUNTER] == FRAGMENT
    after = weights_of(workers)
    assert not same(after[0], before[0])  # the local policy applied the gradients
    remotes = workers.remote_workers()
    for worker, weights in zip(remotes, after[1:]):
        if worker == source:
            assert same(weights, after[0])  # the source got the new weights
        else:
            assert same(weights, before[0])  # the other worker still has the old ones


def test_compute_then_apply_gradients_updates_every_worker(workers: WorkerSet) -> None:
    workers.sync_weights()
    before = workers.local_worker().get_weights()[DEFAULT_POLICY_ID]
    batches = [workers.local_worker().sample() for _ in range(2)]
    flow = from_list(batches).for_each(ComputeGradients(workers)).batch(2)
    [(first, second)] = flow.take(1)
    assert first[1] == second[1] == FRAGMENT
    averaged, total = [(g1 + g2) / 2 for g1, g2 in zip(first[0], second[0])], 2 * FRAGMENT
    apply_flow = from_list([ComputedGradients(averaged, total)]).for_each(ApplyGradients(workers, update_all=True))
    next(apply_flow)
    assert apply_flow.shared_metrics.get().counters[STEPS_TRAINED_COUNTER] == total
    weights = weights_of(workers)
    assert not same(weights[0], before)
    assert all(same(weights[0], remote) for remote in weights[1:])


def test_workers_are_alive_after_the_operator_tests(workers: WorkerSet) -> None:
    assert ray.get([w.ping.remote() for w in workers.remote_workers()]) == ["pong", "pong"]
