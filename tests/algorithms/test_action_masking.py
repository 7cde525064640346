"""PPO and DQN on MaskedCartPole-v1: no illegal action over 100k steps of acting and exploring, learning
within a short budget, and illegal actions once the mask is hidden from flowrl.

Illegal actions are counted by the env itself. The 100k-step checks only sample (acting and
exploration, no learning: 100k steps of DQN training would take minutes on CI's 2 cores); the
learning runs are short, with thresholds a random legal policy (about 22) does not reach.
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


@pytest.mark.parametrize(("algo", "config"), [("ppo", PPO_SAMPLING), ("dqn", DQN_SAMPLING)])
@pytest.mark.parametrize(("mask", "steps"), [("observation", 100_000), ("info", 20_000)])
def test_no_illegal_action_in_100k_steps(algo: str, config: dict[str, Any], mask: str, steps: int) -> None:
    assert sampled_illegal_actions(algo, config, steps, {"mask": mask}) == 0


def test_dqn_takes_illegal_actions_when_it_cannot_see_the_mask() -> None:
    assert sampled_illegal_actions("dqn", DQN_SAMPLING, 5_000, {"mask": "hidden"}) > 500


def train(algo: str, config: dict[str, Any], threshold: float, budget: int) -> None:
    trainer = Trainer(algo, "MaskedCartPole-v1", {"seed": 0, "num_workers": 0, **config})
    curve: list[float] = []
    try:
        while True:
            result = trainer.train()
            curve.append(round(result["episode_reward_mean"], 1))
            if result["episode_reward_mean"] >= threshold or result["timesteps_total"] >= budget:
                break
        illegal = sum(env.unwrapped.illegal_actions for env in trainer.workers.local_worker().envs)
    finally:
        trainer.stop()
    assert illegal == 0
    assert curve[-1] >= threshold, f"{algo}: {curve[-1]} after {result['timesteps_total']} steps; curve {curve}"


@pytest.mark.learning
def test_ppo_learns_the_masked_env() -> None:
    config = {
        "num_envs_per_worker": 8,
        "rollout_fragment_length": 125,
        "train_batch_size": 1000,
        "sgd_minibatch_size": 250,
        "num_sgd_iter": 8,
        "lr": 1e-3,
    }
    train("ppo", config, 100.0, 30_000)


@pytest.mark.learning
def test_dqn_learns_the_masked_env() -> None:
    config = {
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
    train("dqn", config, 75.0, 20_000)
