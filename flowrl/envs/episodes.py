"""Running whole episodes of one env outside a sampler (evaluation, perturbation searches)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np


def run_episode(env: gym.Env, actor: Callable[[np.ndarray], Any], seed: int | None, observations: list[np.ndarray] | None = None) -> tuple[float, int]:
    """One episode of ``actor`` from ``env.reset(seed=seed)``: its return and length.

    Appends every observation acted on to ``observations`` when given.
    """
    obs, _ = env.reset(seed=seed)
    total, length = 0.0, 0
    while True:
        if observations is not None:
            observations.append(obs)
        obs, reward, terminated, truncated, _ = env.step(actor(obs))
        total += float(reward)
        length += 1
        if terminated or truncated:
            return total, length
