"""Tally: a dependency-free PettingZoo AEC (turn-based) env for the tests of turn-based envs and their sampling.

Importing this module needs PettingZoo: test modules skip without it first (``pytest.importorskip``).
"""

from __future__ import annotations

import importlib
from typing import Any, ClassVar

import numpy as np
from gymnasium import spaces

AECEnv: Any = importlib.import_module("pettingzoo").AECEnv


class Tally(AECEnv):
    """Players "a" and "b" move in turn, ``moves`` moves in all; each move pays the mover 1 and the other 10.

    A dependency-free AEC env written as PettingZoo's docs say: the mover's cumulative reward is cleared
    when it moves, finished agents are removed by ``step(None)``.
    """

    metadata: ClassVar[dict[str, Any]] = {"name": "tally_v0", "is_parallelizable": False}

    def __init__(self, moves: int = 4) -> None:
        super().__init__()
        self.possible_agents = ["a", "b"]
        self.moves = moves
        self._action_space = spaces.Discrete(2)
        self._observation_space = spaces.Box(0.0, 100.0, (1,), np.float32)

    def observation_space(self, agent: str) -> spaces.Space:
        return self._observation_space

    def action_space(self, agent: str) -> spaces.Space:
        return self._action_space

    def observe(self, agent: str) -> np.ndarray:
        return np.array([self.t], np.float32)

    def reset(self, seed: int | None = None, options: dict | None = None) -> None:
        self.agents = list(self.possible_agents)
        self.t = 0
        self.rewards = dict.fromkeys(self.agents, 0.0)
        self._cumulative_rewards = dict.fromkeys(self.agents, 0.0)
        self.terminations = dict.fromkeys(self.agents, False)
        self.truncations = dict.fromkeys(self.agents, False)
        self.infos: dict[str, dict[str, Any]] = {agent: {} for agent in self.agents}
        self.agent_selection = "a"

    def step(self, action: Any) -> None:
        mover = self.agent_selection
        if self.terminations[mover] or self.truncations[mover]:
            self._was_dead_step(action)
            return
        other = "b" if mover == "a" else "a"
        self._cumulative_rewards[mover] = 0.0
        self.rewards = {mover: 1.0, other: 10.0}
        self.t += 1
        if self.t >= self.moves:
            self.terminations = dict.fromkeys(self.agents, True)
        self.agent_selection = other
        self._accumulate_rewards()
