"""PPO and DQN on MaskedCartPole-v1: each learns over 100k steps without one illegal action, exploration
with a fixed epsilon of 0.5 takes none either (the mask in the observation or in the info dict), and
DQN takes illegal actions once the mask is hidden from flowrl.

Illegal actions are counted by the env itself. The learning thresholds are far above what a random
legal policy reaches (about 22).
"""

from __future__ import annotations

from typing import Any

import pytest

from flowrl import Trainer

pytestmark = [pytest.mark.unit, pytest.mark.timeout(600)]

FAST = {"num_workers": 0, "num_envs_per_worker": 50, "rollout_fragment_length": 100, "seed": 0}
PPO_SAMPLING = {**FAST, "train_batch_size": 5000, "sgd_minibatch_size": 500}
# A fixed epsilon: half the actions random, half the (untrained) argmax.
DQN_SAMPLING = {**FAST, "exploration_config": {"type": "EpsilonGreedy", "epsilon": 0.5}}
# Discrete SAC: uniform legal actions for the first 10k steps, then the (untrained) policy's samples.
SAC_SAMPLING = {**FAST, "learning_starts": 10_000}


def sampled_illegal_actions(algo: str, config: dict[str, Any], steps: int, env_config: dict[str, Any]) -> int:
    """Illegal actions the envs saw in ``steps`` env steps sampled (exploring) by a new ``algo`` trainer."""
    trainer = Trainer(algo, "MaskedCartPole-v1", {**config, "env_config": env_config})
    try:
        worker = trainer.workers.local_worker()
        sampled = 0
        while sampled < steps:
            sampled += worker.sample().count
        return sum(env.unwrapped.illegal_actions for env in worker.envs)
    finally:
        trainer.stop()


@pytest.mark.parametrize(("algo", "config"), [("ppo", PPO_SAMPLING), ("dqn", DQN_SAMPLING), ("sac", SAC_SAMPLING)])
@pytest.mark.parametrize("mask", ["observation", "info"])
def test_no_illegal_action_in_20k_steps_of_exploring(algo: str, config: dict[str, Any], mask: str) -> None:
    assert sampled_illegal_actions(algo, config, 20_000, {"mask": mask}) == 0


def test_dqn_takes_illegal_actions_when_it_cannot_see_the_mask() -> None:
    assert sampled_illegal_actions("dqn", DQN_SAMPLING, 5_000, {"mask": "hidden"}) > 500


def train_100k_steps(algo: str, config: dict[str, Any], threshold: float) -> None:
    """Train ``algo`` for 100k env steps: not one illegal action, and a mean return of ``threshold`` at the end."""
    trainer = Trainer(algo, "MaskedCartPole-v1", {"seed": 0, "num_workers": 0, **config})
    curve: list[float] = []
    try:
        while True:
            result = trainer.train()
            curve.append(round(result["episode_reward_mean"], 1))
            if result["timesteps_total"] >= 100_000:
                break
        illegal = sum(env.unwrapped.illegal_actions for env in trainer.workers.local_worker().envs)
    finally:
        trainer.stop()
    assert illegal == 0
    assert curve[-1] >= threshold, f"{algo}: {curve[-1]} after {result['timesteps_total']} steps; curve {curve}"


# 100k steps in 6 s here (seed 0 ends at 486).
@pytest.mark.learning
def test_ppo_learns_the_masked_env_in_100k_steps_without_an_illegal_action() -> None:
    config = {
        "num_envs_per_worker": 8,
        "rollout_fragment_length": 125,
        "train_batch_size": 1000,
        "sgd_minibatch_size": 250,
        "num_sgd_iter": 8,
        "lr": 1e-3,
    }
    train_100k_steps("ppo", config, 400.0)


# 100k steps in 9 s here (seed 0 ends at 278; epsilon reaches 0.02 at 5k steps, so exploration goes on).
@pytest.mark.learning
def test_dqn_learns_the_masked_env_in_100k_steps_without_an_illegal_action() -> None:
    config = {
        "num_envs_per_worker": 8,
        "rollout_fragment_length": 4,
        "train_batch_size": 128,
        "lr": 1e-3,
        "learning_starts": 500,
        "target_network_update_freq": 500,
        "timesteps_per_iteration": 1000,
        "exploration_config": {
            "type": "EpsilonGreedy",
            "initial_epsilon": 1.0,
            "final_epsilon": 0.02,
            "epsilon_timesteps": 5000,
        },
    }
    train_100k_steps("dqn", config, 150.0)
