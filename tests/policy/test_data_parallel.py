"""Data-parallel replicas: two gloo processes, each on its shard, take the step one learner takes on the whole batch."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from flowrl.algorithms import get_algorithm
from flowrl.data import SampleBatch
from flowrl.policy import TorchPolicy
from flowrl.policy.data_parallel import Shard, synchronize_gradients
from flowrl.policy.sgd import minibatch_sgd

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

PPO = {"seed": 0, "model": {"fcnet_hiddens": [16, 16]}, "lr": 0.01}


def ppo_policy() -> TorchPolicy[Any]:
    import gymnasium as gym

    algorithm = get_algorithm("ppo")
    config = algorithm.config_class.from_dict(PPO).frozen()
    env = gym.make("CartPole-v1")
    assert algorithm.make_policy is not None
    torch.manual_seed(0)
    policy = algorithm.make_policy(env.observation_space, env.action_space, config).build()
    env.close()
    assert isinstance(policy, TorchPolicy)
    return policy


def ppo_batch(rows: int) -> SampleBatch:
    rng = np.random.default_rng(1)
    logits = rng.standard_normal((rows, 2)).astype(np.float32)
    actions = rng.integers(0, 2, rows)
    logp = logits[np.arange(rows), actions] - np.log(np.exp(logits).sum(axis=1))
    return SampleBatch(
        obs=rng.standard_normal((rows, 4)).astype(np.float32),
        actions=actions,
        action_logp=logp.astype(np.float32),
        action_dist_inputs=logits,
        advantages=rng.standard_normal(rows).astype(np.float32),
        value_targets=rng.standard_normal(rows).astype(np.float32),
        vf_preds=rng.standard_normal(rows).astype(np.float32),
    )


def learn(rows: int, shard: Shard | None) -> dict[str, np.ndarray]:
    policy = ppo_policy()
    if shard is not None:
        policy.gradient_sync = synchronize_gradients
    minibatch_sgd(policy, ppo_batch(rows), num_sgd_iter=2, sgd_minibatch_size=rows // 2, seed=3, shard=shard)
    return policy.get_weights()


def replica(rank: int, size: int, store: str, rows: int, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=size)
    try:
        weights = learn(rows, Shard(rank, size))
    finally:
        dist.destroy_process_group()
    np.savez(f"{out}_{rank}.npz", **weights)


@pytest.mark.parametrize("rows", [64, 66])  # equal shards, and shards of 16 and 17 rows
def test_two_replicas_take_the_single_learners_steps(tmp_path: Path, rows: int) -> None:
    single = learn(rows, None)
    mp.start_processes(
        replica, args=(2, str(tmp_path / "store"), rows, str(tmp_path / "w")), nprocs=2, start_method="spawn"
    )
    replicas = [dict(np.load(tmp_path / f"w_{rank}.npz")) for rank in range(2)]
    for name, value in single.items():
        assert np.array_equal(replicas[0][name], replicas[1][name]), name  # the replicas stay equal
        np.testing.assert_allclose(replicas[0][name], value, atol=1e-5, rtol=0, err_msg=name)
    assert any(not np.allclose(value, ppo_policy().get_weights()[name]) for name, value in single.items())


LSTM_PPO = {"seed": 0, "lr": 0.01, "model": {"fcnet_hiddens": [8], "use_lstm": True, "lstm_cell_size": 8}}


def lstm_learn(shard: Shard | None) -> dict[str, np.ndarray]:
    """Two epochs of LSTM-PPO minibatches over sequences of uneven lengths (so the shards are too)."""
    import gymnasium as gym

    from flowrl.algorithms.ppo import PPOConfig, make_ppo_policy

    torch.manual_seed(0)
    config = PPOConfig.from_dict(LSTM_PPO).frozen()
    policy = make_ppo_policy(gym.spaces.Box(-1.0, 1.0, (4,), np.float32), gym.spaces.Discrete(2), config).build()
    assert isinstance(policy, TorchPolicy)
    rng = np.random.default_rng(4)
    seq_lens = rng.integers(1, 9, 24)
    states = {
        f"{SampleBatch.STATE_IN}{k}": rng.standard_normal((len(seq_lens), *s.shape)).astype(np.float32)
        for k, s in enumerate(policy.get_initial_state())
    }
    batch = SampleBatch({**ppo_batch(int(seq_lens.sum())), **states, SampleBatch.SEQ_LENS: seq_lens.astype(np.int32)})
    if shard is not None:
        policy.gradient_sync = synchronize_gradients
    minibatch_sgd(policy, batch, num_sgd_iter=2, sgd_minibatch_size=batch.count // 2, seed=3, shard=shard)
    return policy.get_weights()


def lstm_replica(rank: int, size: int, store: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=size)
    try:
        weights = lstm_learn(Shard(rank, size))
    finally:
        dist.destroy_process_group()
    np.savez(f"{out}_{rank}.npz", **weights)


def test_two_replicas_sharing_whole_sequences_take_the_single_learners_steps(tmp_path: Path) -> None:
    single = lstm_learn(None)
    mp.start_processes(
        lstm_replica, args=(2, str(tmp_path / "store"), str(tmp_path / "w")), nprocs=2, start_method="spawn"
    )
    replicas = [dict(np.load(tmp_path / f"w_{rank}.npz")) for rank in range(2)]
    for name, value in single.items():
        assert np.array_equal(replicas[0][name], replicas[1][name]), name
        np.testing.assert_allclose(replicas[0][name], value, atol=1e-5, rtol=0, err_msg=name)


def td3_learn(shard: Shard | None) -> dict[str, np.ndarray]:
    """Four TD3 updates on one batch (policy_delay 2: the actor steps on the 2nd and 4th only), no target noise."""
    import gymnasium as gym

    from flowrl.algorithms.ddpg import ACTOR_STEPS, TD3Config, make_ddpg_policy
    from flowrl.policy.postprocessing import DISCOUNTS

    torch.manual_seed(0)
    spaces = gym.spaces.Box(-1.0, 1.0, (3,), np.float32), gym.spaces.Box(-2.0, 2.0, (1,), np.float32)
    policy = make_ddpg_policy(
        *spaces, TD3Config(seed=0, target_noise=0.0, actor_hiddens=[8], critic_hiddens=[8])
    ).build()
    rng, n = np.random.default_rng(2), 32
    batch = SampleBatch(
        {
            SampleBatch.OBS: rng.uniform(-1, 1, (n, 3)).astype(np.float32),
            SampleBatch.NEW_OBS: rng.uniform(-1, 1, (n, 3)).astype(np.float32),
            SampleBatch.ACTIONS: rng.uniform(-2, 2, (n, 1)).astype(np.float32),
            SampleBatch.REWARDS: rng.standard_normal(n).astype(np.float32),
            SampleBatch.TERMINATEDS: np.zeros(n, bool),
            DISCOUNTS: np.full(n, 0.99, np.float32),
        }
    )
    if shard is not None:
        policy.gradient_sync = synchronize_gradients
        batch = shard.rows(batch)
    for _ in range(4):
        policy.learn(batch)
    assert isinstance(policy, TorchPolicy) and policy.coeffs[ACTOR_STEPS] == 4
    return policy.get_weights()


def td3_replica(rank: int, size: int, store: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=size)
    try:
        weights = td3_learn(Shard(rank, size))
    finally:
        dist.destroy_process_group()
    np.savez(f"{out}_{rank}.npz", **weights)


def test_parameters_no_loss_reached_are_left_alone_as_by_one_learner(tmp_path: Path) -> None:
    """TD3's critic-only updates give the actor no gradient: the replicas' Adam must not step it on momentum."""
    single = td3_learn(None)
    mp.start_processes(
        td3_replica, args=(2, str(tmp_path / "store"), str(tmp_path / "w")), nprocs=2, start_method="spawn"
    )
    replicas = [dict(np.load(tmp_path / f"w_{rank}.npz")) for rank in range(2)]
    for name, value in single.items():
        np.testing.assert_allclose(replicas[0][name], value, atol=1e-5, rtol=0, err_msg=name)
        np.testing.assert_allclose(replicas[1][name], value, atol=1e-5, rtol=0, err_msg=name)


def test_a_shard_is_whole_runs_and_never_empty() -> None:
    batch = SampleBatch(t=np.arange(12))
    assert [Shard(r, 3).rows(batch, 2)["t"].tolist() for r in range(3)] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert [Shard(r, 2).rows(batch, 4)["t"].tolist() for r in range(2)] == [[0, 1, 2, 3], [4, 5, 6, 7, 8, 9, 10, 11]]
    with pytest.raises(ValueError, match="cannot be shared by 4 learners"):
        Shard(0, 4).rows(batch, 4)
    assert math.isclose(sum(Shard(r, 5).rows(batch).count for r in range(5)), 12)
