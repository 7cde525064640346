"""Ape-X with worker-side priorities on remote workers: the replay shard holds the rows at the priorities
the workers computed (not at the max), their targets follow the learner's, and their TD errors are the
driver's for the same rows, weights and target."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import ray

from flowrl import Trainer
from flowrl.data import DEFAULT_POLICY_ID, SampleBatch
from flowrl.policy.worker_priorities import add_td_errors, target_weights, td_errors

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("ray_session"), pytest.mark.timeout(300)]

SMALL = {
    "num_workers": 2,
    "num_cpus_per_worker": 0.25,
    "num_envs_per_worker": 1,
    "rollout_fragment_length": 20,
    "learning_starts": 600,
    "train_batch_size": 16,
    "timesteps_per_iteration": 400,
    "target_network_update_freq": 64,
    "max_weight_sync_delay": 20,
    "model": {"fcnet_hiddens": [16]},
    "seed": 0,
}


def _worker_target(worker: Any) -> dict[str, np.ndarray]:
    return target_weights(worker.policy_map)[DEFAULT_POLICY_ID]


def _prioritized_fragment(worker: Any) -> tuple[Any, dict[str, np.ndarray]]:
    """A fragment the worker sampled, with its TD errors, and the weights it computed them with."""
    batch = add_td_errors(worker.policy_map, worker.sample())
    return batch, worker.get_weights()[DEFAULT_POLICY_ID]


def test_apex_workers_compute_priorities_with_the_learners_target() -> None:
    trainer = Trainer("apex", "CartPole-v1", SMALL)
    try:
        assert trainer.config.worker_side_prioritization
        trainer.train()  # before learning_starts: nothing replayed, no priority updated yet
        state = ray.get(trainer.resources.replay_actors[0].get_state.remote(True), timeout=60)
        priorities = np.asarray(state["buffers"][DEFAULT_POLICY_ID]["contents"]["priorities"])
        # Max-priority insertion would store every row at 1.0; the workers' |TD error| + eps differ row by row.
        assert len(priorities) >= 400 and len(np.unique(priorities)) == len(priorities)
        for _ in range(2):
            result = trainer.train()
        assert result["info"]["num_target_updates"] > 0 and result["info"]["num_steps_trained"] > 0
        trainer.workers.sync_weights()
        learner_target = _worker_target(trainer.workers.local_worker())
        remote = trainer.workers.foreach_worker(_worker_target, local=False)
        assert len(remote) == 2
        for target in remote:
            assert target.keys() == learner_target.keys()
            for key, value in learner_target.items():
                np.testing.assert_array_equal(target[key], value)
        # A remote worker's priorities are the TD errors the driver computes with its weights and the target.
        batch, weights = trainer.workers.foreach_worker(_prioritized_fragment, local=False)[0]
        driver = trainer.workers.policy_specs[DEFAULT_POLICY_ID].build()
        driver.set_weights(weights)
        driver.target_network.load(learner_target)
        rows = SampleBatch({k: v for k, v in batch.items() if k != SampleBatch.TD_ERROR})
        np.testing.assert_allclose(batch[SampleBatch.TD_ERROR], td_errors(driver, rows), rtol=1e-5, atol=1e-6)
    finally:
        trainer.stop()
