"""observation_filter: MeanStdFilter across rollout workers, in checkpoints, evaluation and load_policy."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import ray
from fakes import bc_loss, is_dead

import flowrl
from flowrl import Trainer
from flowrl.actors import RolloutWorker, WorkerSet
from flowrl.actors.rollout_worker import control_call
from flowrl.algorithms import get_algorithm
from flowrl.config import TrainerConfig
from flowrl.data import DEFAULT_POLICY_ID, SampleBatch
from flowrl.envs import get_env_creator
from flowrl.policy import PolicySpec, TorchPolicy
from flowrl.policy.filters import MeanStdFilter, RunningStats

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the env below travels to the worker actors

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("ray_session")]


class RecordingCartPole(gym.Wrapper):
    """CartPole keeping every observation it returns, and whether it ended an episode."""

    def __init__(self, env_config: Any = None) -> None:
        super().__init__(gym.make("CartPole-v1"))
        self.returned: list[tuple[np.ndarray, bool]] = []

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        obs, info = self.env.reset(**kwargs)
        self.returned.append((obs, False))
        return obs, info

    def step(self, action: Any) -> tuple[Any, ...]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.returned.append((obs, bool(terminated or truncated)))
        return obs, reward, terminated, truncated, info

    def acted_on(self) -> np.ndarray:
        """The observations a policy acted on: all but episodes' last ones and the one it acts on next."""
        return np.array([obs for obs, ended in self.returned[:-1] if not ended], dtype=np.float64)


def acted_on(worker: RolloutWorker) -> np.ndarray:
    return np.concatenate([env.acted_on() for env in worker.envs])


def make_workers(num_workers: int = 2) -> WorkerSet:
    env = gym.make("CartPole-v1")
    spec = PolicySpec(
        TorchPolicy, env.observation_space, env.action_space, TrainerConfig(lr=0.01), {"loss_fn": bc_loss}
    )
    return WorkerSet(
        env_creator=RecordingCartPole,
        policy_specs={DEFAULT_POLICY_ID: spec},
        config={"seed": 0, "rollout_fragment_length": 40, "observation_filter": "MeanStdFilter"},
        num_workers=num_workers,
        num_cpus_per_worker=0.1,
        check_env=False,
    )


def remote_filter_stats(workers: WorkerSet) -> list[RunningStats | None]:
    for worker in workers.remote_workers():  # syncs are control calls: done once a later one is answered
        ray.get(control_call(worker, "ping"))
    return workers.foreach_worker(lambda w: w.obs_filter.stats(), local=False)


def test_workers_statistics_merge_in_the_driver_and_go_back_to_every_worker() -> None:
    workers = make_workers()
    try:
        remote = workers.remote_workers()
        batches = ray.get([worker.sample.remote() for worker in remote] + [remote[0].sample.remote()])
        seen = workers.foreach_worker(acted_on, local=False)
        assert [len(s) for s in seen] == [80, 40]  # worker 1 sampled twice
        workers.sync_filters()
        merged = workers.local_worker().obs_filter.stats()
        everything = np.concatenate(seen)
        assert merged is not None and merged.count == len(everything)
        np.testing.assert_allclose(merged.mean, everything.mean(axis=0), rtol=1e-9)
        np.testing.assert_allclose(merged.var, everything.var(axis=0), rtol=1e-9)
        for stats in remote_filter_stats(workers):
            assert stats is not None and stats.count == merged.count
            np.testing.assert_allclose(stats.mean, merged.mean)
        # The batches hold what the policy acted on: each observation filtered as it arrived.
        replay = MeanStdFilter()
        expected = np.concatenate([replay(row[None]) for row in seen[1]])
        np.testing.assert_allclose(batches[1][SampleBatch.OBS], expected, rtol=1e-5, atol=1e-5)
        assert not np.allclose(batches[1][SampleBatch.OBS], seen[1])
        # A second sync adds only what was sampled since the first.
        ray.get(remote[1].sample.remote())
        workers.sync_filters()
        again = workers.local_worker().obs_filter.stats()
        assert again is not None and again.count == merged.count + 40
    finally:
        workers.stop()


def test_a_replacement_worker_starts_with_the_merged_statistics() -> None:
    workers = make_workers(num_workers=1)
    try:
        ray.get(workers.remote_workers()[0].sample.remote())
        workers.sync_filters()
        merged = workers.local_worker().obs_filter.stats()
        [failed] = workers.remote_workers()
        ray.kill(failed, no_restart=True)
        assert is_dead(failed)  # ray.kill is asynchronous: a probe right after it may still be answered
        workers.probe_unhealthy_workers()
        [stats] = remote_filter_stats(workers)
        assert merged is not None and stats is not None and stats.count == merged.count
    finally:
        workers.stop()


def filter_config(**extra: Any) -> dict[str, Any]:
    return {
        "num_workers": 1,
        "num_cpus_per_worker": 0.5,
        "rollout_fragment_length": 100,
        "train_batch_size": 200,
        "observation_filter": "MeanStdFilter",
        "seed": 0,
        **extra,
    }


def test_checkpoints_restore_the_filter_and_load_policy_applies_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Trainer("pg", "CartPole-v1", filter_config()) as trainer:
        for _ in range(2):
            trainer.train()
        saved = trainer.workers.local_worker().obs_filter.get_state()
        remote_saved = trainer.workers.foreach_worker(lambda w: w.obs_filter.get_state(), local=False)
        path = trainer.save(tmp_path)
    assert saved["total"].count == 400  # every observation acted on in 2 iterations of 200 steps
    restored = Trainer.from_checkpoint(path)
    try:
        state = restored.workers.local_worker().obs_filter.get_state()
        assert state["total"].count == saved["total"].count
        np.testing.assert_array_equal(state["total"].mean, saved["total"].mean)
        [remote_state] = restored.workers.foreach_worker(lambda w: w.obs_filter.get_state(), local=False)
        assert remote_state["total"].count == remote_saved[0]["total"].count
        np.testing.assert_array_equal(remote_state["total"].m2, remote_saved[0]["total"].m2)
        policy = restored.workers.local_worker().get_policy()
        obs = np.random.default_rng(0).normal(size=(16, 4)).astype(np.float32)
        shift, scale = saved["total"].normalization()
        expected, _ = policy.compute_actions(((obs - shift) / scale).astype(np.float32), explore=False)
    finally:
        restored.stop()

    loaded = flowrl.load_policy(path)
    assert loaded.observation_filter is not None
    loaded_stats = loaded.observation_filter.stats()
    assert loaded_stats is not None and loaded_stats.count == saved["total"].count
    np.testing.assert_array_equal(loaded.compute_actions(obs), expected)

    # flowrl evaluate (evaluate_checkpoint) plays its episodes through the same filter.
    from flowrl.engine import build as build_module

    given: list[MeanStdFilter | None] = []
    monkeypatch.setattr(
        build_module, "evaluate_policies", lambda *args, obs_filter=None, **kw: given.append(obs_filter) or {}
    )
    build_module.evaluate_checkpoint(path, num_episodes=1)
    [evaluated] = given
    assert evaluated is not None and evaluated.stats().count == saved["total"].count


def test_runs_without_a_filter_write_none() -> None:
    with Trainer("pg", "CartPole-v1", filter_config(observation_filter="NoFilter", num_workers=0)) as trainer:
        trainer.train()
        assert trainer.workers.local_worker().obs_filter is None
        assert trainer.get_state()["worker"]["obs_filter"] is None


def test_es_and_ars_filter_in_their_model_not_in_the_sampler() -> None:
    algorithm = get_algorithm("es")
    config = algorithm.config_class.from_dict({"num_workers": 0})
    assert config.observation_filter == "MeanStdFilter"
    env = gym.make("CartPole-v1")
    worker = RolloutWorker(
        env_creator=get_env_creator("CartPole-v1"),
        policy_specs={DEFAULT_POLICY_ID: algorithm.make_policy(env.observation_space, env.action_space, config)},
        config=config,
    )
    assert worker.obs_filter is None


@pytest.mark.parametrize("evaluation_workers", [0, 1])
def test_evaluation_during_training_filters_with_the_runs_statistics(evaluation_workers: int) -> None:
    config = filter_config(
        num_workers=0, evaluation_interval=1, evaluation_num_episodes=1, evaluation_num_workers=evaluation_workers
    )
    with Trainer("pg", "CartPole-v1", config) as trainer:
        trainer.train()
        merged = trainer.workers.local_worker().obs_filter.stats()
        evaluator = trainer.evaluator
        if evaluation_workers:
            [actor] = evaluator._remote.actors
            count = ray.get(actor.__ray_call__.remote(lambda worker: worker.obs_filter.stats().count))
        else:
            count = evaluator._local.obs_filter.stats().count
    assert merged is not None and count == merged.count == 200
