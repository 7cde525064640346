"""The action masks a sampler reads from its envs (the convention: :mod:`flowrl.envs.flatten`)."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from flowrl.data import SampleBatch
from flowrl.envs.flatten import action_mask_of, is_masked, legal_actions


class ActionMasks:
    """Each of ``num_envs`` envs' legal actions now, read from its observations or infos.

    Envs of a Discrete action space are masked when their observation space is a masked Dict, or
    once an observation's info holds ``"action_mask"`` (from ``reset`` on, so that the first fragment
    has the mask columns). ``current`` is every action until an env gives a mask; None for other
    action spaces.
    """

    def __init__(self, env: Any, num_envs: int, worker_index: int = 0) -> None:
        space = getattr(env, "action_space", None)
        self.num_actions = int(space.n) if isinstance(space, gym.spaces.Discrete) else 0
        self.current = np.ones((num_envs, self.num_actions), dtype=bool) if self.num_actions else None
        self.masked = self.current is not None and is_masked(getattr(env, "observation_space", None))
        self.worker_index = worker_index

    def columns(self, length: int) -> dict[str, np.ndarray]:
        """A fragment's ``action_mask`` and ``next_action_mask`` columns of ``length`` rows (all legal until
        written); none while the envs give no masks."""
        if not self.masked or self.current is None:
            return {}
        shape = (length, *self.current.shape)
        return {key: np.ones(shape, dtype=bool) for key in (SampleBatch.ACTION_MASK, SampleBatch.NEXT_ACTION_MASK)}

    def read(self, i: int, obs: Any, info: Any, into: np.ndarray | None = None) -> None:
        """Write env ``i``'s legal actions, from its (raw) observation or its info, into row ``i`` of ``into``
        (default: ``current``); every action where it gives no mask."""
        rows = self.current if into is None else into
        if rows is None:
            return
        mask = action_mask_of(obs, info)
        if mask is None:
            rows[i] = True
            return
        rows[i] = legal_actions(mask, self.num_actions, f"worker {self.worker_index}, env {i}: action_mask")
        self.masked = True
