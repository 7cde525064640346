"""``MaskedCartPole-v1``: a built-in env whose observations carry an action mask (for tests and docs).

CartPole with four actions, two of them legal at each step: actions 0 and 2 push the cart left,
1 and 3 push it right, and each step either ``{0, 1}`` or ``{2, 3}`` is legal, drawn at random. So
the task is CartPole's (a policy that honours the mask can always push either way), while a policy
that ignores the mask picks an illegal action half the time. An illegal action ends the episode
(terminated, reward 0) and is counted in ``illegal_actions``, where the env sees it.

``env_config["mask"]`` says where the mask goes: ``"observation"`` (the default: a Dict observation
``{"observations": CartPole's 4 numbers, "action_mask": 4 int8 0/1}``), ``"info"`` (CartPole's
observation, and ``info["action_mask"]``) or ``"hidden"`` (the Dict with the mask under the key
``"legal_actions"``, which flowrl does not read as a mask: a check that masks matter).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

from flowrl.envs.flatten import ACTION_MASK_KEY, OBSERVATIONS_KEY
from flowrl.errors import EnvError

ENV_ID = "MaskedCartPole-v1"
MASK_PLACES = ("observation", "info", "hidden")
HIDDEN_KEY = "legal_actions"


class MaskedCartPole(gym.Env[Any, Any]):
    """CartPole-v1 (500 steps at most) with four actions of which a random two are legal each step (see the module)."""

    metadata = {"render_modes": []}
    max_episode_steps = 500

    def __init__(self, env_config: dict[str, Any] | None = None, *, mask: str | None = None) -> None:
        # As a creator it gets env_config; through gymnasium.make (the id), its keys as keywords.
        config = {**(env_config or {}), **({} if mask is None else {"mask": mask})}
        self.mask_place = config.pop("mask", "observation")
        if config or self.mask_place not in MASK_PLACES:
            raise EnvError(f"{ENV_ID} takes env_config {{'mask': one of {list(MASK_PLACES)}}}, got {env_config!r}")
        self.cartpole = CartPoleEnv()
        box = self.cartpole.observation_space
        mask_space = spaces.Box(0, 1, (4,), np.int8)
        self.action_space = spaces.Discrete(4)
        if self.mask_place == "info":
            self.observation_space: spaces.Space[Any] = box
        else:
            key = ACTION_MASK_KEY if self.mask_place == "observation" else HIDDEN_KEY
            self.observation_space = spaces.Dict({OBSERVATIONS_KEY: box, key: mask_space})
        #: Illegal actions this env was given (each ended its episode).
        self.illegal_actions = 0
        self._mask = np.ones(4, np.int8)
        self._steps = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        super().reset(seed=seed)
        obs, info = self.cartpole.reset(seed=None if seed is None else int(self.np_random.integers(2**31)))
        self._steps = 0
        return self._observe(obs, info)

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        action = int(action)
        if not self._mask[action]:
            self.illegal_actions += 1
            obs, info = self._observe(np.asarray(self.cartpole.state, np.float32), {})
            return obs, 0.0, True, False, info
        obs, reward, terminated, truncated, info = self.cartpole.step(action % 2)
        self._steps += 1
        obs, info = self._observe(obs, info)
        return obs, float(reward), terminated, truncated or self._steps >= self.max_episode_steps, info

    def _observe(self, obs: np.ndarray, info: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        """A new mask for the next step, and the observation and info that carry it."""
        legal = 2 * int(self.np_random.integers(2))
        self._mask = np.zeros(4, np.int8)
        self._mask[legal : legal + 2] = 1
        if self.mask_place == "info":
            return obs, {**info, ACTION_MASK_KEY: self._mask.copy()}
        key = ACTION_MASK_KEY if self.mask_place == "observation" else HIDDEN_KEY
        return {OBSERVATIONS_KEY: obs, key: self._mask.copy()}, info


if ENV_ID not in gym.registry:
    gym.register(ENV_ID, entry_point=f"{__name__}:MaskedCartPole")
