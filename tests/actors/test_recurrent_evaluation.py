"""Evaluation episodes of a recurrent policy: the state, previous action and previous reward threaded through
each episode and reset at its start, for single-agent and multi-agent envs (no Ray)."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces

from flowrl.actors.evaluation import run_episodes
from flowrl.config import TrainerConfig
from flowrl.data import DEFAULT_POLICY_ID, SampleBatch
from flowrl.envs import MultiAgentEnv

pytestmark = pytest.mark.unit


class CountingEnv(gym.Env):
    """``obs = [t]``, reward ``t + 1`` at step t; episodes of ``length`` steps."""

    observation_space = spaces.Box(-100.0, 100.0, (1,), np.float32)
    action_space = spaces.Discrete(3)

    def __init__(self, length: int = 4) -> None:
        self.length, self.t = length, 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
        self.t = 0
        return np.array([0.0], np.float32), {}

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict]:
        self.t += 1
        return np.array([self.t], np.float32), float(self.t), self.t >= self.length, False, {}


class RecordingPolicy:
    """A recurrent stand-in whose state counts its steps; acts ``t % 3``; records what it acted from."""

    observation_space = CountingEnv.observation_space
    action_space = CountingEnv.action_space

    def __init__(self) -> None:
        self.calls: list[tuple[float, float, int, float]] = []  # (t, state, prev action, prev reward)

    def get_initial_state(self) -> list[np.ndarray]:
        return [np.zeros(1, np.float32)]

    def compute_actions(self, obs: np.ndarray, **kwargs: Any) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        state = kwargs["state"]
        for k in range(len(obs)):
            self.calls.append(
                (
                    float(obs[k, 0]),
                    float(state[0][k, 0]),
                    int(kwargs["prev_actions"][k]),
                    float(kwargs["prev_rewards"][k]),
                )
            )
        return obs[:, 0].astype(np.int64) % 3, {f"{SampleBatch.STATE_OUT}0": state[0] + 1}


def expected_calls(
    length: int, episodes: int, reward_of: Any = lambda t: float(t)
) -> list[tuple[float, float, int, float]]:
    episode = [(float(t), float(t), (t - 1) % 3 if t else 0, reward_of(t) if t else 0.0) for t in range(length)]
    return episode * episodes


def test_a_recurrent_policy_is_evaluated_from_its_state_reset_at_each_episode() -> None:
    policy = RecordingPolicy()
    episodes = run_episodes(
        {DEFAULT_POLICY_ID: policy},
        lambda ctx: CountingEnv(4),
        TrainerConfig(),
        [0, 1, 2],  # type: ignore[dict-item]
    )
    assert [e["episode_length"] for e in episodes] == [4, 4, 4]
    assert policy.calls == expected_calls(4, 3)


class TurnsEnv(MultiAgentEnv):
    """'a' and 'b' move in turns (a, b, a, ...) for 6 moves; each move earns the mover 1 and the other 10; obs =
    [moves made so far by the observer]."""

    turn_based = True

    def __init__(self) -> None:
        self.possible_agents = ["a", "b"]
        self.agents: list[str] = []
        self.moves = {"a": 0, "b": 0}

    def observation_space(self, agent: str) -> spaces.Space:
        return CountingEnv.observation_space

    def action_space(self, agent: str) -> spaces.Space:
        return CountingEnv.action_space

    @property
    def agent_selection(self) -> str:
        return self.possible_agents[sum(self.moves.values()) % 2]

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        self.agents, self.moves = list(self.possible_agents), {"a": 0, "b": 0}
        return {a: np.array([0.0], np.float32) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions: dict) -> tuple[dict, dict, dict, dict, dict]:
        [mover] = actions
        self.moves[mover] += 1
        over = sum(self.moves.values()) >= 6
        obs = {a: np.array([self.moves[a]], np.float32) for a in self.agents}
        rewards = {a: 1.0 if a == mover else 10.0 for a in self.agents}
        done = {a: over for a in self.agents}
        if over:
            self.agents = []
        return obs, rewards, done, {a: False for a in obs}, {a: {} for a in obs}


def test_each_agent_of_a_multi_agent_episode_carries_its_own_state() -> None:
    policies = {"pa": RecordingPolicy(), "pb": RecordingPolicy()}
    config = TrainerConfig.from_dict({"policy_mapping_fn": lambda agent: "p" + agent})
    episodes = run_episodes(policies, lambda ctx: TurnsEnv(), config, [0, 1])  # type: ignore[arg-type]
    assert [e["episode_length"] for e in episodes] == [6, 6]
    # Each agent's previous reward is all it earned since its last move: its own 1 and the other's 10.
    for policy in policies.values():
        assert policy.calls == expected_calls(3, 2, reward_of=lambda t: 11.0)
