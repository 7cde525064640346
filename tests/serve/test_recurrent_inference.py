"""load_policy of a recurrent policy: the state and the previous action and reward threaded through an episode."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from policy_files import lstm_policies, write_files

import flowrl
from flowrl.data import DEFAULT_POLICY_ID, SampleBatch
from flowrl.envs import StatelessCartPole
from flowrl.policy import Policy

pytestmark = pytest.mark.unit

LSTM = {"fcnet_hiddens": [16], "use_lstm": True, "lstm_cell_size": 8}


def original_episode(policy: Policy[Any], env: gym.Env, seed: int) -> list[Any]:
    """The greedy actions of the trained policy object over one episode, its state threaded by hand."""
    obs, _ = env.reset(seed=seed)
    state = [s[None] for s in policy.get_initial_state()]
    prev_action, prev_reward, actions = np.zeros(1, np.int64), np.zeros(1, np.float32), []
    while True:
        action, extra = policy.compute_actions(
            obs[None], explore=False, state=state, prev_actions=prev_action, prev_rewards=prev_reward
        )
        state = [extra[f"{SampleBatch.STATE_OUT}{k}"] for k in range(len(state))]
        actions.append(int(action[0]))
        obs, reward, terminated, truncated, _ = env.step(int(action[0]))
        prev_action, prev_reward = action, np.asarray([reward], np.float32)
        if terminated or truncated:
            return actions


@pytest.mark.parametrize("prev", [False, True], ids=["state", "state+prev_action_reward"])
def test_a_loaded_recurrent_policy_threads_its_state_as_the_original(tmp_path: Path, prev: bool) -> None:
    model = {**LSTM, "lstm_use_prev_action": prev, "lstm_use_prev_reward": prev}
    policy_map, config = lstm_policies(model)
    original = policy_map[DEFAULT_POLICY_ID]
    loaded = flowrl.load_policy(write_files(tmp_path, policy_map, "ppo", config))
    assert loaded.is_recurrent and loaded.reads_prev_action_reward == (prev, prev)
    initial = loaded.get_initial_state()
    assert [s.shape for s in initial] == [(8,)] * 4 and all(not s.any() for s in initial)

    env = StatelessCartPole()
    seen: set[int] = set()
    for seed in range(3):
        expected = original_episode(original, env, seed)
        seen.update(expected)
        obs, _ = env.reset(seed=seed)
        state, prev_action, prev_reward, actions = None, None, None, []
        while True:
            action, state = loaded.compute_action(obs, state, prev_action=prev_action, prev_reward=prev_reward)
            actions.append(int(action))
            obs, reward, terminated, truncated, _ = env.step(int(action))
            prev_action, prev_reward = action, float(reward)
            if terminated or truncated:
                break
        assert actions == expected
    assert seen == {0, 1}  # random weights: the check means something


def test_the_state_changes_the_action_and_none_is_the_initial_state(tmp_path: Path) -> None:
    policy_map, config = lstm_policies(LSTM)
    loaded = flowrl.load_policy(write_files(tmp_path, policy_map, "ppo", config))
    obs = np.random.default_rng(0).uniform(-1, 1, (64, 2)).astype(np.float32)
    from_none, state = loaded.compute_actions(obs)
    from_initial, _ = loaded.compute_actions(obs, state=[np.repeat(s[None], 64, 0) for s in loaded.get_initial_state()])
    np.testing.assert_array_equal(from_none, from_initial)
    assert [s.shape for s in state] == [(64, 8)] * 4
    later, _ = loaded.compute_actions(obs, state=[s * 50 for s in state])
    assert not np.array_equal(later, from_none)
    with pytest.raises(ValueError, match="does not fit this policy's state"):
        loaded.compute_actions(obs, state=[s[:3] for s in state])
