"""A Trainer with ``num_gpus: 1`` learns on the GPU (PPO, one remote rollout worker acting on the CPU), and its
checkpoint resumes in a Trainer without a GPU, acting as the GPU policy did.

Skipped without CUDA; ``FLOWRL_GPU_REHEARSAL=1`` runs it anyway, ``num_gpus`` then giving the CPU.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from gpu_marks import DEVICE, GPU_MARKS

from flowrl import Trainer
from flowrl.data import DEFAULT_POLICY_ID
from flowrl.policy import TorchPolicy

pytestmark = [
    *GPU_MARKS,
    pytest.mark.integration,
    pytest.mark.usefixtures("ray_session"),
    pytest.mark.timeout(300),
]

TRAIN_BATCH = 100
PPO_CONFIG = {
    "num_workers": 1,
    "num_cpus_per_worker": 0.1,
    "rollout_fragment_length": 50,
    "train_batch_size": TRAIN_BATCH,
    "sgd_minibatch_size": 50,
    "num_sgd_iter": 2,
    "model": {"fcnet_hiddens": [32, 32]},
    "seed": 0,
}


def learner_policy(trainer: Trainer) -> TorchPolicy:
    policy = trainer.workers.local_worker().get_policy(DEFAULT_POLICY_ID)
    assert isinstance(policy, TorchPolicy)
    return policy


def test_ppo_learns_on_the_gpu_and_its_checkpoint_resumes_on_the_cpu(tmp_path: Path) -> None:
    obs = np.random.default_rng(0).uniform(-0.5, 0.5, (64, 4)).astype(np.float32)
    with Trainer("ppo", "CartPole-v1", {**PPO_CONFIG, "num_gpus": 1}) as trainer:
        for _ in range(2):
            result = trainer.train()
        assert result["training_iteration"] == 2
        assert result["info"]["num_steps_trained"] == 2 * TRAIN_BATCH
        stats = result["info"]["learner"][DEFAULT_POLICY_ID]
        assert stats and all(math.isfinite(v) for v in stats.values()), stats
        policy = learner_policy(trainer)
        assert policy.device.type == DEVICE
        assert {p.device.type for p in policy.model.parameters()} == {DEVICE}
        # The remote rollout worker acts with the weights the GPU learned.
        learned = policy.get_weights()
        (remote,) = trainer.workers.foreach_worker(lambda w: w.get_policy(DEFAULT_POLICY_ID).get_weights(), local=False)
        for key, value in learned.items():
            np.testing.assert_array_equal(remote[key], value)
        actions = policy.compute_actions(obs, explore=False)[0]
        path = trainer.save(tmp_path)
    with Trainer.from_checkpoint(path, config_overrides={"num_gpus": 0}) as restored:
        policy = learner_policy(restored)
        assert restored.config.num_gpus == 0 and policy.device.type == "cpu"
        np.testing.assert_array_equal(policy.compute_actions(obs, explore=False)[0], actions)
        result = restored.train()  # learns on from the GPU's optimizer state
        assert result["training_iteration"] == 3
        assert all(np.isfinite(w).all() for w in policy.get_weights().values())
