"""R2D2 in a learner group: two gloo replicas, each on whole replayed sequences, take the single learner's step,
and their TD errors gathered back line up with the replayed rows; a run with num_learners 2 learns."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from flowrl import Trainer
from flowrl.algorithms import get_algorithm
from flowrl.data import SampleBatch
from flowrl.data.replay_buffer import BATCH_INDEXES
from flowrl.policy.data_parallel import Shard, synchronize_gradients

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

R2D2 = {
    "seed": 0,
    "num_workers": 0,
    "lr": 0.01,
    "n_step": 2,
    "replay_sequence_length": 8,
    "replay_burn_in": 2,
    "model": {"fcnet_hiddens": [8], "lstm_cell_size": 8, "lstm_use_prev_action": True},
}


def replayed_sequences() -> SampleBatch:
    """A replayed batch of 12 sequences of uneven lengths (some no longer than the burn-in), each with its
    stored state, importance weight and buffer index repeated on its rows."""
    rng = np.random.default_rng(5)
    seq_lens = rng.integers(1, 9, 12)
    n = int(seq_lens.sum())
    return SampleBatch(
        {
            SampleBatch.OBS: rng.normal(size=(n, 3)).astype(np.float32),
            SampleBatch.NEW_OBS: rng.normal(size=(n, 3)).astype(np.float32),
            SampleBatch.ACTIONS: rng.integers(0, 2, n),
            SampleBatch.PREV_ACTIONS: rng.integers(0, 2, n),
            SampleBatch.REWARDS: rng.normal(size=n).astype(np.float32),
            SampleBatch.TERMINATEDS: rng.random(n) < 0.1,
            SampleBatch.SEQ_LENS: seq_lens.astype(np.int32),
            "state_in_0": rng.normal(size=(len(seq_lens), 8)).astype(np.float32),
            "state_in_1": rng.normal(size=(len(seq_lens), 8)).astype(np.float32),
            SampleBatch.WEIGHTS: np.repeat(rng.uniform(0.2, 1.0, len(seq_lens)), seq_lens).astype(np.float32),
            BATCH_INDEXES: np.repeat(np.arange(100, 100 + len(seq_lens)), seq_lens),
        }
    )


def r2d2_learn(shard: Shard | None) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """Two steps on the replayed batch (or the shard's sequences of it): weights, and the rows' buffer
    indexes and TD errors (new priorities) of the last step."""
    algorithm = get_algorithm("r2d2")
    config = algorithm.config_class.from_dict(R2D2).frozen()
    torch.manual_seed(0)
    assert algorithm.make_policy is not None
    policy: Any = algorithm.make_policy(gym.spaces.Box(-1.0, 1.0, (3,), np.float32), gym.spaces.Discrete(2), config)
    policy = policy.build()
    policy.update_target()
    batch = replayed_sequences()
    if shard is not None:
        policy.gradient_sync = synchronize_gradients
        batch = shard.rows(batch)
    for _ in range(2):
        out = policy.learn(batch)
    return policy.get_weights(), batch[BATCH_INDEXES], out.td_error


def r2d2_replica(rank: int, size: int, store: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=size)
    try:
        weights, indexes, td_error = r2d2_learn(Shard(rank, size))
    finally:
        dist.destroy_process_group()
    np.savez(f"{out}_{rank}.npz", indexes=indexes, td_error=td_error, **weights)


def test_two_replicas_on_whole_replayed_sequences_take_the_single_learners_steps(tmp_path: Path) -> None:
    single, indexes, td_error = r2d2_learn(None)
    mp.start_processes(
        r2d2_replica, args=(2, str(tmp_path / "store"), str(tmp_path / "w")), nprocs=2, start_method="spawn"
    )
    replicas = [dict(np.load(tmp_path / f"w_{rank}.npz")) for rank in range(2)]
    shards = [replica.pop("indexes") for replica in replicas]
    # Whole sequences each, and unequal learned steps (the burn-in weighs more on the replica of shorter ones).
    assert all(len(shard) for shard in shards) and not set(shards[0]) & set(shards[1])
    for name, value in single.items():
        assert np.array_equal(replicas[0][name], replicas[1][name]), name  # the replicas stay equal
        np.testing.assert_allclose(replicas[0][name], value, atol=1e-5, rtol=0, err_msg=name)
    # Gathered back in rank order, the replicas' new priorities are the single learner's, row by row.
    np.testing.assert_array_equal(np.concatenate(shards), indexes)
    gathered = np.concatenate([replica["td_error"] for replica in replicas])
    np.testing.assert_allclose(gathered, td_error, atol=1e-5, rtol=0)


@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("num_workers", [0, 2])  # DQN's plan in the driver, Ape-X's learner thread
def test_r2d2_trains_in_a_learner_group_of_two(num_workers: int) -> None:
    config = {
        **R2D2,
        "num_workers": num_workers,
        "num_replay_shards": 1,
        "num_cpus_per_worker": 0.1,
        "num_envs_per_worker": 2,
        "rollout_fragment_length": 16,
        "train_batch_size": 64,
        "learning_starts": 64,
        "timesteps_per_iteration": 128,
        "num_learners": 2,
        "num_cpus_per_learner": 0.25,
    }
    with Trainer("r2d2", "StatelessCartPole-v1", config) as trainer:
        assert trainer.resources.learners is not None and trainer.resources.learners.size == 2
        policy = trainer.workers.local_worker().get_policy()
        before = {k: v.copy() for k, v in policy.get_weights().items()}
        for _ in range(2):
            result = trainer.train()
        stats = result["info"]["learner"]["default_policy"]
        assert result["info"]["num_steps_trained"] > 0 and np.isfinite(stats["loss"])
        # The driver's policy follows the group's rank 0 (what the workers act with).
        assert any(not np.array_equal(before[k], v) for k, v in policy.get_weights().items())
