"""RolloutWorker sampling in both batch modes, episode statistics, weights and state (no Ray)."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from fakes import bc_loss

from flowrl.actors import RolloutWorker, WorkerMetrics
from flowrl.config import TrainerConfig
from flowrl.data import DEFAULT_POLICY_ID, SampleBatch
from flowrl.envs import get_env_creator
from flowrl.policy import PolicySpec, TorchPolicy, bootstrap_value, compute_advantages

pytestmark = pytest.mark.unit


def gae(policy: TorchPolicy, batch: SampleBatch) -> SampleBatch:
    return compute_advantages(batch, bootstrap_value(batch, policy.value), gamma=0.99, lambda_=0.95)


def cartpole_spec() -> PolicySpec:
    env = gym.make("CartPole-v1")
    return PolicySpec(
        TorchPolicy,
        env.observation_space,
        env.action_space,
        TrainerConfig(),
        {"loss_fn": bc_loss, "postprocess_fn": gae},
    )


def make_worker(**config: Any) -> RolloutWorker:
    return RolloutWorker(
        env_creator=get_env_creator("CartPole-v1"),
        policy_specs={DEFAULT_POLICY_ID: cartpole_spec()},
        config={"seed": 0, **config},
    )


@pytest.mark.parametrize("num_envs", [1, 4])
def test_truncate_episodes_returns_fragment_times_envs(num_envs: int) -> None:
    worker = make_worker(num_envs_per_worker=num_envs, rollout_fragment_length=50)
    for _ in range(3):
        batch = worker.sample()
        assert batch.count == 50 * num_envs
    assert sorted(set(batch[SampleBatch.ENV_ID].tolist())) == list(range(num_envs))
    for key in (SampleBatch.ADVANTAGES, SampleBatch.VALUE_TARGETS, SampleBatch.VF_PREDS, SampleBatch.ACTION_LOGP):
        assert key in batch and np.isfinite(batch[key]).all()


@pytest.mark.parametrize("num_envs", [1, 4])
def test_complete_episodes_returns_only_whole_episodes(num_envs: int) -> None:
    worker = make_worker(num_envs_per_worker=num_envs, rollout_fragment_length=30, batch_mode="complete_episodes")
    batch = worker.sample()
    assert batch.count >= 30 * num_envs
    for episode in batch.split_by_episode():
        assert episode[SampleBatch.T][0] == 0  # starts at the episode's first step
        assert episode[SampleBatch.T].tolist() == list(range(episode.count))
        assert episode[SampleBatch.TERMINATEDS][-1] or episode[SampleBatch.TRUNCATEDS][-1]
        assert not (episode[SampleBatch.TERMINATEDS][:-1] | episode[SampleBatch.TRUNCATEDS][:-1]).any()


def test_rows_are_consistent_transitions() -> None:
    batch = make_worker(num_envs_per_worker=2, rollout_fragment_length=40).sample()
    for piece in batch.split_by_episode():
        # Within an episode piece, each step's next observation is the following step's observation.
        np.testing.assert_array_equal(piece[SampleBatch.NEW_OBS][:-1], piece[SampleBatch.OBS][1:])


def test_episode_statistics_match_the_sampled_rewards() -> None:
    worker = make_worker(num_envs_per_worker=1, rollout_fragment_length=500, batch_mode="complete_episodes")
    batch = worker.sample()
    stats = worker.get_metrics().episodes
    episodes = batch.split_by_episode()
    assert len(stats) == len(episodes) > 0
    for s, episode in zip(stats, episodes):
        assert s["episode_length"] == episode.count
        assert s["episode_reward"] == pytest.approx(float(episode[SampleBatch.REWARDS].sum()))
    again = worker.get_metrics()
    assert again[:3] == WorkerMetrics([], 0, 0)[:3]  # each episode is reported once
    assert (
        again.phases is not None and again.phases["samples"] == 0 and again.phases["sample_s"] == 0
    )  # no sample since


def test_truncation_bootstraps_and_termination_does_not() -> None:
    worker = make_worker(num_envs_per_worker=1, rollout_fragment_length=20)
    batch = worker.sample()
    policy = worker.get_policy()
    for piece in batch.split_by_episode():
        last = piece.count - 1
        expected_last_r = (
            0.0 if piece[SampleBatch.TERMINATEDS][last] else float(policy.value(piece[SampleBatch.NEW_OBS][-1:])[0])
        )
        # The last row's one-step TD error uses exactly the bootstrap value.
        delta = piece[SampleBatch.REWARDS][last] + 0.99 * expected_last_r - piece[SampleBatch.VF_PREDS][last]
        assert piece[SampleBatch.ADVANTAGES][last] == pytest.approx(delta, rel=1e-5, abs=1e-5)


def test_same_seed_same_samples() -> None:
    a = make_worker(num_envs_per_worker=2, rollout_fragment_length=25).sample()
    b = make_worker(num_envs_per_worker=2, rollout_fragment_length=25).sample()
    np.testing.assert_array_equal(a[SampleBatch.OBS], b[SampleBatch.OBS])
    np.testing.assert_array_equal(a[SampleBatch.ACTIONS], b[SampleBatch.ACTIONS])


def test_weights_and_state_round_trip() -> None:
    source, target = make_worker(), make_worker(seed=1)
    batch = source.sample()
    source.learn_on_batch(batch)
    target.set_weights(source.get_weights(), {"timestep": 1234})
    for key, value in source.get_weights()[DEFAULT_POLICY_ID].items():
        np.testing.assert_array_equal(value, target.get_weights()[DEFAULT_POLICY_ID][key])
    assert target.get_policy().global_timestep == 1234
    target.set_state(source.get_state())
    assert (
        target.get_policy().get_state()["optimizer"]["state"].keys()
        == source.get_policy().get_state()["optimizer"]["state"].keys()
    )


def test_compressed_observations_and_apply() -> None:
    worker = make_worker(compress_observations=True, rollout_fragment_length=10)
    batch = worker.sample()
    assert batch.is_compressed()
    assert batch.decompress_if_needed()[SampleBatch.OBS].shape == (10, 4)
    assert worker.apply(lambda w, x: (w.worker_index, x), 7) == (0, 7)


def test_bad_batch_mode_is_rejected() -> None:
    with pytest.raises(ValueError, match="batch_mode='whole'"):
        make_worker(batch_mode="whole")
