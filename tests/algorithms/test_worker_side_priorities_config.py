"""worker_side_prioritization as a config key: defaults, the checks that refuse it, RLlib's spellings."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from flowrl import Trainer
from flowrl.algorithms import get_algorithm
from flowrl.config.rllib import translate_rllib_config
from flowrl.data import DEFAULT_POLICY_ID
from flowrl.errors import ConfigError
from flowrl.operators import ParallelRollouts

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "algo, expected",
    [("dqn", False), ("ddpg", False), ("td3", False), ("apex", True), ("apex_ddpg", True), ("r2d2", False)],
)
def test_worker_side_prioritization_defaults(algo: str, expected: bool) -> None:
    assert get_algorithm(algo).config_class().worker_side_prioritization is expected


@pytest.mark.parametrize("algo", ["dqn", "apex", "ddpg", "apex_ddpg"])
def test_worker_side_prioritization_needs_prioritized_replay(algo: str) -> None:
    config_class = get_algorithm(algo).config_class
    with pytest.raises(ConfigError, match="worker_side_prioritization=True needs prioritized_replay=True"):
        config_class.from_dict({"worker_side_prioritization": True, "prioritized_replay": False})


def test_r2d2_refuses_worker_side_prioritization() -> None:
    with pytest.raises(ConfigError, match="worker_side_prioritization=True is not available for r2d2"):
        get_algorithm("r2d2").config_class.from_dict({"worker_side_prioritization": True})


def test_ppo_dqn_refuses_worker_side_prioritization() -> None:
    with pytest.raises(ConfigError, match=r"dqn\['worker_side_prioritization'\]=True is not available for ppo_dqn"):
        get_algorithm("ppo_dqn").config_class.from_dict({"dqn": {"worker_side_prioritization": True}})


@pytest.mark.parametrize(
    "algo, rllib, expected",
    [
        ("apex", {"worker_side_prioritization": False}, False),
        ("dqn", {"replay_buffer_config": {"worker_side_prioritization": True}}, True),
        ("apex_ddpg", {"replay_buffer_config": {"worker_side_prioritization": False}}, False),
    ],
)
def test_rllibs_worker_side_prioritization_is_the_dqn_familys_own_key(
    algo: str, rllib: dict[str, Any], expected: bool
) -> None:
    config_class = get_algorithm(algo).config_class
    translation = translate_rllib_config(config_class, rllib, config_class().to_dict(jsonable=False))
    assert not translation.problems
    assert translation.values["worker_side_prioritization"] is expected


def test_rllibs_worker_side_prioritization_is_refused_where_no_worker_computes_priorities() -> None:
    config_class = get_algorithm("ppo").config_class
    defaults = config_class().to_dict(jsonable=False)
    assert translate_rllib_config(config_class, {"worker_side_prioritization": False}, defaults).problems == []
    refused = translate_rllib_config(config_class, {"worker_side_prioritization": True}, defaults).problems
    assert len(refused) == 1 and "worker_side_prioritization=True is not implemented" in refused[0]


def test_a_policy_without_a_td_error_function_is_refused_when_the_plan_is_built() -> None:
    env = gym.make("CartPole-v1")
    algorithm = get_algorithm("dqn")
    config = algorithm.config_class.from_dict({"worker_side_prioritization": True})
    spec = algorithm.make_policy(env.observation_space, env.action_space, config)
    del spec.kwargs["td_error_fn"]

    class Workers:
        policy_specs = {DEFAULT_POLICY_ID: spec}

    with pytest.raises(ConfigError, match="policy 'default_policy' \\(TorchPolicy\\) has no td_error_fn"):
        ParallelRollouts(Workers(), worker_priorities=True)  # type: ignore[arg-type]


def test_with_num_workers_0_the_local_worker_stores_its_rows_at_their_td_errors() -> None:
    config = {
        "num_workers": 0,
        "worker_side_prioritization": True,
        "learning_starts": 1000,  # the first iteration ends at the first replay: few rows have new priorities
        "timesteps_per_iteration": 200,
        "model": {"fcnet_hiddens": [8]},
        "seed": 0,
    }
    trainer = Trainer("dqn", "CartPole-v1", config)
    try:
        trainer.train()
        priorities = trainer.resources.replay_buffer.buffers[DEFAULT_POLICY_ID].priorities()
    finally:
        trainer.stop()
    # Max-priority insertion would store them all at 1.0; the local worker's |TD error| + eps differ row by row.
    assert len(priorities) >= 1000 and len(np.unique(priorities)) > 0.9 * len(priorities)
