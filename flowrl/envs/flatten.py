"""Dict and Tuple observations as flat vectors, with Gymnasium's flattening utilities.

Samplers store observations in arrays, one row per step, so an observation of a Dict or Tuple
space (nested ones too) is flattened as it arrives, with ``gymnasium.spaces.utils.flatten``:
its parts in the space's order (a Dict's keys as the space lists them), Box parts flattened,
Discrete parts one-hot. Batches, replay buffers and the built-in models see the Box
``gymnasium.spaces.utils.flatten_space(space)``; policies keep the original space, and a custom
model can ask for the structure back (``model: {custom_model_obs: "structured"}``).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.spaces.utils import flatten, flatten_space


def is_structured(space: gym.Space[Any] | None) -> bool:
    """Whether observations of ``space`` are flattened before they are sampled (a Dict or Tuple space)."""
    return isinstance(space, (gym.spaces.Dict, gym.spaces.Tuple))


class ObsFlattener:
    """Flattens observations of a Dict or Tuple space ``structure`` into rows of the Box ``space``."""

    def __init__(self, structure: gym.Space[Any]) -> None:
        if not is_structured(structure):
            raise TypeError(f"only Dict and Tuple spaces are flattened, not {structure}")
        self.structure = structure
        space = flatten_space(structure)
        assert isinstance(space, gym.spaces.Box)  # Dicts and Tuples of the array spaces flatten to a Box
        self.space: gym.spaces.Box = space

    def __call__(self, obs: Any) -> Any:
        """``obs`` as one flat array, or ``obs`` unchanged when it does not fit the structure
        (a missing key, a wrong type): the sampler's observation checks then report it."""
        try:
            return flatten(self.structure, obs)
        except (KeyError, IndexError, TypeError, ValueError, AttributeError):
            return obs


def flatten_observation(space: gym.Space[Any], obs: Any) -> Any:
    """One observation as a policy takes it: flattened for a Dict or Tuple ``space``, else unchanged."""
    return np.asarray(flatten(space, obs)) if is_structured(space) else obs
