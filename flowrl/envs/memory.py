"""Built-in partially observable envs, where a policy needs memory (registered with Gymnasium on import).

- ``StatelessCartPole-v1``: CartPole-v1 observing only the cart's position and the pole's angle, not
  their velocities. A policy that sees one observation cannot tell which way the pole is falling; one
  that remembers the last few can.
- ``TMaze-v0``: a cue at the first step says which way to turn at the end of a corridor of ``length``
  steps (``env_config={"length": N}``, default 10). The corridor and the junction look the same
  whatever the cue, so a policy without memory earns 0 on average (+1 for the right turn, -1 for
  the wrong one), and one that remembers the cue earns +1.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

from flowrl.errors import EnvError

STATELESS_CARTPOLE_ID = "StatelessCartPole-v1"
TMAZE_ID = "TMaze-v0"

#: The entries of CartPole's observation that StatelessCartPole keeps: cart position and pole angle.
_POSITIONS = [0, 2]


class StatelessCartPole(CartPoleEnv):
    """CartPole whose observation is ``[cart position, pole angle]``: the velocities are left out."""

    def __init__(self, render_mode: str | None = None) -> None:
        super().__init__(render_mode=render_mode)
        full = self.observation_space
        assert isinstance(full, spaces.Box)
        self.observation_space = spaces.Box(full.low[_POSITIONS], full.high[_POSITIONS], dtype=np.float32)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        obs, info = super().reset(seed=seed, options=options)
        return obs[_POSITIONS], info

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = super().step(action)
        return obs[_POSITIONS], float(reward), terminated, truncated, info


class TMaze(gym.Env[np.ndarray, np.int64]):
    """A cue, a corridor of ``length`` steps, and a junction where the cue's side pays +1 and the other -1.

    Observations are ``[cue left, cue right, at the junction]``: ``[1, 0, 0]`` or ``[0, 1, 0]`` at the first
    step, ``[0, 0, 0]`` along the corridor and ``[0, 0, 1]`` at the junction. Actions: 0 (left) and 1 (right);
    in the corridor either one moves on. An episode lasts ``length + 1`` steps.
    """

    metadata = {"render_modes": []}

    def __init__(self, env_config: dict[str, Any] | None = None, *, length: int | None = None) -> None:
        # As a creator it gets env_config; through gymnasium.make (the id), its keys as keywords.
        config = {**(env_config or {}), **({} if length is None else {"length": length})}
        self.length = config.pop("length", 10)
        if config or not isinstance(self.length, int) or isinstance(self.length, bool) or self.length < 1:
            raise EnvError(f"{TMAZE_ID} takes env_config {{'length': an int >= 1}}, got {env_config!r}")
        self.observation_space = spaces.Box(0.0, 1.0, (3,), np.float32)
        self.action_space = spaces.Discrete(2)
        self._cue = 0
        self._position = 0

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self._cue = int(self.np_random.integers(2))
        self._position = 0
        obs = np.zeros(3, np.float32)
        obs[self._cue] = 1.0
        return obs, {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        if self._position < self.length:
            self._position += 1
            obs = np.zeros(3, np.float32)
            if self._position == self.length:
                obs[2] = 1.0
            return obs, 0.0, False, False, {}
        reward = 1.0 if int(action) == self._cue else -1.0
        return np.zeros(3, np.float32), reward, True, False, {}


if STATELESS_CARTPOLE_ID not in gym.registry:
    gym.register(STATELESS_CARTPOLE_ID, entry_point=f"{__name__}:StatelessCartPole", max_episode_steps=500)
if TMAZE_ID not in gym.registry:
    gym.register(TMAZE_ID, entry_point=f"{__name__}:TMaze")
