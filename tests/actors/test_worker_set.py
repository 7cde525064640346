"""WorkerSet over Ray: weight sync, foreach_worker, and recovery from dead workers."""

from __future__ import annotations

import sys
import time
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import ray
from fakes import bc_loss, is_dead, weights_of

from flowrl.actors import WorkerSet
from flowrl.config import TrainerConfig
from flowrl.data import DEFAULT_POLICY_ID
from flowrl.envs import get_env_creator
from flowrl.errors import EnvCheckError, WorkerFailureError
from flowrl.iterators import from_actors
from flowrl.policy import PolicySpec, TorchPolicy

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("ray_session")]


def make_workers(num_workers: int = 2, recreate: bool = True, **config: Any) -> WorkerSet:
    env = gym.make("CartPole-v1")
    spec = PolicySpec(
        TorchPolicy, env.observation_space, env.action_space, TrainerConfig(lr=0.01), {"loss_fn": bc_loss}
    )
    return WorkerSet(
        env_creator=get_env_creator("CartPole-v1"),
        policy_specs={DEFAULT_POLICY_ID: spec},
        config={"seed": 0, "rollout_fragment_length": 20, "num_envs_per_worker": 2, **config},
        num_workers=num_workers,
        num_cpus_per_worker=0.1,
        recreate_failed_workers=recreate,
    )


def assert_same_weights(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_array_equal(a[key], b[key])


def test_sync_weights_makes_remote_weights_equal_local() -> None:
    workers = make_workers()
    try:
        local = workers.local_worker()
        local.learn_on_batch(local.sample())
        before = weights_of(workers)
        with pytest.raises(AssertionError):
            assert_same_weights(before[0], before[1])  # training changed only the local copy
        workers.sync_weights(global_vars={"timestep": 99})
        after = weights_of(workers)
        for remote in after[1:]:
            assert_same_weights(after[0], remote)
        assert workers.foreach_worker(lambda w: w.get_policy().global_timestep) == [99, 99, 99]
        assert workers.trainable_policies() == [DEFAULT_POLICY_ID]
    finally:
        workers.stop()


def test_remote_workers_sample_in_parallel_through_a_gather() -> None:
    workers = make_workers()
    try:
        batches = from_actors(workers.remote_workers()).gather_async().take(4)
        assert all(b.count == 40 for b in batches)
        assert workers.foreach_worker(lambda w: w.worker_index) == [0, 1, 2]
    finally:
        workers.stop()


@pytest.mark.timeout(120)
def test_a_killed_worker_is_recreated_with_current_weights_and_sampling_continues() -> None:
    workers = make_workers()
    try:
        local = workers.local_worker()
        local.learn_on_batch(local.sample())
        workers.sync_weights()
        rollouts = from_actors(workers.remote_workers(), on_shard_failure=workers.on_shard_failure).gather_async()
        assert len(rollouts.take(2)) == 2
        victim = workers.remote_workers()[1]
        ray.kill(victim, no_restart=True)
        # Sampling goes on through the failure; the dead worker is replaced in place.
        while workers.num_worker_restarts == 0:
            assert next(rollouts).count == 40
        assert len(rollouts.take(4)) == 4
        assert workers.num_worker_restarts == 1
        assert len(workers.remote_workers()) == 2 and workers.remote_workers()[1] is not victim
        weights = weights_of(workers)
        assert_same_weights(weights[0], weights[2])  # the replacement got the current weights
    finally:
        workers.stop()


@pytest.mark.timeout(120)
def test_dead_workers_are_dropped_when_recreation_is_off() -> None:
    workers = make_workers(recreate=False)
    try:
        ray.kill(workers.remote_workers()[0], no_restart=True)
        results = workers.foreach_worker(lambda w: w.worker_index)
        assert results == [0, 2]
        assert len(workers.remote_workers()) == 1 and workers.num_workers_dropped == 1
        assert workers.probe_unhealthy_workers() == 0
    finally:
        workers.stop()


def notes(error: BaseException) -> str:
    return "\n".join(getattr(error, "__notes__", []))


@pytest.mark.timeout(120)
def test_an_error_in_foreach_workers_function_reaches_the_caller_and_restarts_nothing() -> None:
    workers = make_workers()
    try:
        before = workers.remote_workers()
        started = time.monotonic()
        with pytest.raises(ZeroDivisionError) as info:
            workers.foreach_worker(lambda w: 1 / (w.worker_index - 2))  # only remote worker 2 divides by 0
        # The acceptance bound: the error arrives at once rather than after restarts and retries (it takes
        # well under a second here; a restart alone takes seconds).
        assert time.monotonic() - started < 5.0
        assert isinstance(info.value, ray.exceptions.RayTaskError)  # and Ray's remote traceback with it
        if sys.version_info >= (3, 11):
            assert "rollout worker 2 (the worker was not restarted)" in notes(info.value)
        assert workers.num_worker_restarts == 0 and workers.remote_workers() == before
        with pytest.raises(ZeroDivisionError) as info:
            workers.foreach_worker(lambda w: 1 / w.worker_index)  # the local worker, index 0
        if sys.version_info >= (3, 11):
            assert "rollout worker 0" in notes(info.value)
        assert workers.foreach_worker(lambda w: w.worker_index) == [0, 1, 2]  # every worker still serves
        assert workers.num_worker_restarts == 0 and workers.restart_budget.recent() == 0
    finally:
        workers.stop()


@pytest.mark.timeout(120)
def test_at_the_restart_cap_a_checkpoint_leaves_the_dead_worker_out_and_restarts_nothing() -> None:
    workers = make_workers(max_worker_restarts=0)
    try:
        victim = workers.remote_workers()[0]
        ray.kill(victim, no_restart=True)
        assert is_dead(victim)
        with pytest.raises(WorkerFailureError, match="max_worker_restarts=0") as info:
            workers.foreach_worker(lambda w: w.worker_index)
        assert info.value.worker_indices == [1] and workers.restart_budget.exhausted
        states = workers.get_remote_states()  # what an emergency checkpoint asks for
        assert list(states) == [2] and workers.num_worker_restarts == 0
    finally:
        workers.stop()


class NaNObservations(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        return np.full(2, np.nan, np.float32), 0.0, False, False, {}


def test_a_broken_env_is_rejected_before_any_actor_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    env = NaNObservations()
    spec = PolicySpec(TorchPolicy, env.observation_space, env.action_space, TrainerConfig(), {"loss_fn": bc_loss})
    started: list[int] = []
    monkeypatch.setattr(WorkerSet, "_make_remote", lambda self, index: started.append(index))
    with pytest.raises(EnvCheckError, match="NaN"):
        WorkerSet(
            env_creator=lambda cfg: NaNObservations(), policy_specs={DEFAULT_POLICY_ID: spec}, config={}, num_workers=2
        )
    assert started == []
