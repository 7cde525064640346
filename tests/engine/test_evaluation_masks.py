"""Every evaluation path honours action masks, the observation's and ``info["action_mask"]`` alike, and splits
the mask off before the run's observation filter: ``Trainer.evaluate``, evaluation during training (in the
driver and in evaluation actors), ``evaluate_checkpoint`` and ``flowrl evaluate``'s ``evaluate_policy_files``.

The policy is greedy and its unmasked argmax is action 0, illegal in half of MaskedCartPole's states; the
env counts illegal actions, and each one ends its episode with reward 0 (so a masked evaluation's mean
reward is its mean length: every step earns 1).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

from flowrl import Trainer
from flowrl.engine.build import evaluate_checkpoint
from flowrl.envs import MaskedCartPole, register_env
from flowrl.serve.evaluate import evaluate_policy_files

pytestmark = pytest.mark.unit

ENV = "CountedMaskedCartPole"
# 200 env steps per iteration, and a few updates too small to move the greedy action (see make_greedy).
DQN_SHORT = {"num_workers": 0, "seed": 0, "learning_starts": 200, "timesteps_per_iteration": 200}


class CountedMaskedCartPole(MaskedCartPole):
    """MaskedCartPole that keeps every instance, so that the envs evaluation makes and closes can be counted."""

    made: ClassVar[list[MaskedCartPole]] = []

    def __init__(self, env_config: dict[str, Any] | None = None) -> None:
        super().__init__(env_config)
        CountedMaskedCartPole.made.append(self)


@pytest.fixture
def counted() -> Iterator[list[MaskedCartPole]]:
    register_env(ENV, CountedMaskedCartPole)
    CountedMaskedCartPole.made.clear()
    yield CountedMaskedCartPole.made
    CountedMaskedCartPole.made.clear()


def make_greedy(trainer: Trainer) -> None:
    """Make the trainer's DQN policy prefer action 0 by far, whatever it sees, the mask left aside."""
    policy = trainer.workers.local_worker().get_policy()
    weights = policy.get_weights()
    weights["advantage.weight"][:] = 0.0
    weights["advantage.bias"][:] = [10.0, 0.0, 0.0, 0.0]
    policy.set_weights(weights)
    assert_greedy(trainer)


def assert_greedy(trainer: Trainer) -> None:
    """The trainer's greedy action, the mask left aside, is action 0."""
    observations = np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32)
    actions, _ = trainer.workers.local_worker().get_policy().compute_actions(observations, explore=False)
    assert actions.tolist() == [0] * 8


def illegal_actions(envs: list[MaskedCartPole]) -> int:
    return sum(env.illegal_actions for env in envs)


def assert_legal(stats: dict[str, Any], envs: list[MaskedCartPole]) -> None:
    """No illegal action in the episodes of ``stats``: each step earned 1, and ``envs`` (those the episodes were
    played in, where this process can see them) counted none."""
    assert stats["episodes"] == 3 and stats["episode_len_mean"] > 1
    assert stats["episode_reward_mean"] == stats["episode_len_mean"]
    assert illegal_actions(envs) == 0


@pytest.mark.parametrize("mask", ["observation", "info"])
def test_evaluating_a_trainer_or_its_checkpoint_takes_no_illegal_action(
    mask: str, counted: list[MaskedCartPole], tmp_path: Path
) -> None:
    config = {
        **DQN_SHORT,
        "observation_filter": "MeanStdFilter",  # the mask is split off before it
        "env_config": {"mask": mask},
        "evaluation_interval": 1,
        "evaluation_num_episodes": 3,
    }
    trainer = Trainer("dqn", ENV, config)
    try:
        make_greedy(trainer)
        training = len(counted)  # the training envs and the probes
        result = trainer.train()
        assert result["timesteps_total"] == 200 and illegal_actions(counted[:training]) == 0
        assert_greedy(trainer)
        assert_legal(result["evaluation"], counted[training:])
        evaluated = len(counted)
        assert_legal(trainer.evaluate(num_episodes=3, seed=0), counted[evaluated:])
        path = trainer.save(tmp_path)
    finally:
        trainer.stop()
    saved = len(counted)
    assert_legal(evaluate_checkpoint(path, num_episodes=3, seed=0), counted[saved:])
    files = len(counted)
    assert_legal(evaluate_policy_files(path, num_episodes=3, seed=0), counted[files:])


@pytest.mark.parametrize("mask", ["observation", "info"])
def test_evaluation_actors_take_no_illegal_action(mask: str, ray_session: None) -> None:
    config = {
        **DQN_SHORT,
        "env_config": {"mask": mask},
        "evaluation_interval": 1,
        "evaluation_num_episodes": 3,
        "evaluation_num_workers": 1,
    }
    trainer = Trainer("dqn", "MaskedCartPole-v1", config)
    try:
        make_greedy(trainer)
        evaluation = trainer.train()["evaluation"]
        assert_greedy(trainer)
    finally:
        trainer.stop()
    assert_legal(evaluation, [])
