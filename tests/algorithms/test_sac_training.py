"""SAC in a trainer: live keys reach what reads them, evaluation, and the plan it runs."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from flowrl import Trainer

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("ray_session"), pytest.mark.timeout(300)]

SMALL = {
    "num_workers": 0,
    "seed": 0,
    "learning_starts": 32,
    "train_batch_size": 16,
    "timesteps_per_iteration": 64,
    "actor_hiddens": [16],
    "critic_hiddens": [16],
}


def critics(weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {name: value for name, value in weights.items() if name.startswith("critics.")}


def test_a_live_tau_reaches_the_target_updates_and_target_entropy_the_loss() -> None:
    with Trainer("sac", "Pendulum-v1", SMALL) as trainer:
        trainer.train()
        policy = trainer.workers.local_worker().get_policy()
        target = {k: v.detach().numpy() for k, v in policy.target_model.state_dict().items()}
        assert any(not np.array_equal(target[k], v) for k, v in critics(policy.get_weights()).items())
        trainer.update_config({"tau": 1.0, "target_entropy": 5.0})
        trainer.train()
        # tau 1 copies: after the last update of the iteration the targets are the critics.
        target = {k: v.detach().numpy() for k, v in policy.target_model.state_dict().items()}
        for name, value in critics(policy.get_weights()).items():
            np.testing.assert_array_equal(target[name], value)
        # An entropy target far above the policy's: alpha grows from here on.
        alpha = trainer.train()["info"]["learner"]["default_policy"]["alpha"]
        assert trainer.train()["info"]["learner"]["default_policy"]["alpha"] > alpha


def test_evaluation_runs_the_deterministic_policy_on_pendulum_and_cartpole() -> None:
    for env in ("Pendulum-v1", "CartPole-v1"):
        config: dict[str, Any] = {**SMALL, "evaluation_interval": 1, "evaluation_num_episodes": 1}
        with Trainer("sac", env, config) as trainer:
            result = trainer.train()
        assert result["evaluation"]["episodes"] == 1 and np.isfinite(result["evaluation"]["episode_reward_mean"]), env


def test_discrete_sac_trains_on_a_masked_env_without_an_illegal_action() -> None:
    config = {**SMALL, "learning_starts": 200, "timesteps_per_iteration": 400, "env_config": {"mask": "observation"}}
    with Trainer("sac", "MaskedCartPole-v1", config) as trainer:
        for _ in range(3):
            stats = trainer.train()["info"]["learner"]["default_policy"]
        envs = trainer.workers.local_worker().envs
        assert sum(env.unwrapped.illegal_actions for env in envs) == 0
    assert all(np.isfinite(stats[key]) for key in ("critic_loss", "actor_loss", "alpha_loss", "entropy"))
