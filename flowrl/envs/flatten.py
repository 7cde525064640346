"""Dict and Tuple observations as flat vectors, with Gymnasium's flattening utilities, and the
action masks some of them carry.

Samplers store observations in arrays, one row per step, so an observation of a Dict or Tuple
space (nested ones too) is flattened as it arrives, with ``gymnasium.spaces.utils.flatten``:
its parts in the space's order (a Dict's keys as the space lists them), Box parts flattened,
Discrete parts one-hot. Batches, replay buffers and the built-in models see the Box
``gymnasium.spaces.utils.flatten_space(space)``; policies keep the original space, and a custom
model can ask for the structure back (``model: {custom_model_obs: "structured"}``).

Action masks (the PettingZoo and RLlib convention): a Dict observation with the keys
``"observations"`` and ``"action_mask"`` (one 0/1 entry per action of a Discrete action space;
1: legal), or ``info["action_mask"]`` beside any observation. The mask is split off before
flattening: models see the ``"observations"`` part (:func:`model_space`), and the mask travels
as its own batch column.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.spaces.utils import flatten, flatten_space

from flowrl.errors import EnvError

#: The key of an observation's (or an info dict's) legal actions.
ACTION_MASK_KEY = "action_mask"
#: The key of a masked Dict observation's part that models see.
OBSERVATIONS_KEY = "observations"


def is_structured(space: gym.Space[Any] | None) -> bool:
    """Whether observations of ``space`` are flattened before they are sampled (a Dict or Tuple space)."""
    return isinstance(space, (gym.spaces.Dict, gym.spaces.Tuple))


def is_masked(space: gym.Space[Any] | None) -> bool:
    """Whether observations of ``space`` carry an action mask (a Dict space with an ``"action_mask"`` key)."""
    return isinstance(space, gym.spaces.Dict) and ACTION_MASK_KEY in space.spaces


def model_space(space: gym.Space[Any]) -> gym.Space[Any]:
    """What a model sees of observations of ``space``: the ``"observations"`` part of a masked Dict, else ``space``.

    Raises :class:`~flowrl.errors.EnvError` for a Dict with ``"action_mask"`` and keys other than
    ``"observations"``.
    """
    if not is_masked(space):
        return space
    assert isinstance(space, gym.spaces.Dict)
    if set(space.spaces) != {ACTION_MASK_KEY, OBSERVATIONS_KEY}:
        raise EnvError(
            f"an observation space with an {ACTION_MASK_KEY!r} key must be a Dict of exactly the keys "
            f"{OBSERVATIONS_KEY!r} (what the model sees; nest other parts inside it) and {ACTION_MASK_KEY!r}, "
            f"got the keys {sorted(map(str, space.spaces))}"
        )
    return space.spaces[OBSERVATIONS_KEY]


def action_mask_of(obs: Any, info: Any = None) -> Any:
    """The action mask of a masked Dict observation ``obs``, else ``info["action_mask"]``; None when neither has one."""
    if isinstance(obs, Mapping) and ACTION_MASK_KEY in obs:
        return obs[ACTION_MASK_KEY]
    if isinstance(info, Mapping):
        return info.get(ACTION_MASK_KEY)
    return None


def legal_actions(mask: Any, num_actions: int, where: str = "action_mask") -> np.ndarray:
    """``mask`` as ``num_actions`` bools (nonzero: legal); raises :class:`~flowrl.errors.EnvError`, naming
    ``where``, unless it is one number per action."""
    array = np.asarray(mask)
    if array.shape != (num_actions,) or array.dtype.kind not in "biuf":
        raise EnvError(
            f"{where}={mask!r} must hold one 0/1 number per action of the Discrete({num_actions}) action space "
            f"(shape ({num_actions},)), got shape {array.shape} and dtype {array.dtype}"
        )
    return array != 0


def no_legal_action(legal: np.ndarray, field: str) -> str:
    """What is wrong with the mask ``field`` whose legal actions ``legal`` (bools, :func:`legal_actions`) allow
    none, for a state an agent must act in.

    Such a mask is a bad observation: no action taken there is right. A state where nothing can be
    done ends the episode (terminated or truncated), and its mask is then not read.
    """
    shown = np.array2string(legal.astype(np.int8), threshold=8, edgeitems=2, separator=", ")
    return (
        f"{field}={shown}, which allows no action; a state an agent acts in needs at least one legal action "
        "(end the episode, terminated or truncated, where none is left)"
    )


def mask_field(space: gym.Space[Any] | None, obs_field: str, info_field: str = "info") -> str:
    """Where an observation of ``space`` carries its action mask, named for messages: ``obs_field['action_mask']``
    for a masked Dict space, else ``info_field['action_mask']``."""
    return f"{obs_field if is_masked(space) else info_field}[{ACTION_MASK_KEY!r}]"


class ObsFlattener:
    """Flattens observations of a Dict or Tuple space ``structure`` into rows of ``space``.

    ``space`` is ``flatten_space`` of what models see (:func:`model_space`): for a masked Dict, the
    ``"observations"`` part, flattened if it is a Dict or Tuple, as it is otherwise (the mask is left out).
    """

    def __init__(self, structure: gym.Space[Any]) -> None:
        if not is_structured(structure):
            raise TypeError(f"only Dict and Tuple spaces are flattened, not {structure}")
        self.structure = structure
        self.masked = is_masked(structure)
        self.observed = model_space(structure)
        self.space: gym.Space[Any] = flatten_space(self.observed) if is_structured(self.observed) else self.observed

    def __call__(self, obs: Any) -> Any:
        """``obs`` as one flat array, or ``obs`` unchanged when it does not fit the structure
        (a missing key, a wrong type): the sampler's observation checks then report it."""
        try:
            if self.masked:
                part = obs[OBSERVATIONS_KEY]
                return flatten(self.observed, part) if is_structured(self.observed) else np.asarray(part)
            return flatten(self.structure, obs)
        except (KeyError, IndexError, TypeError, ValueError, AttributeError):
            return obs


def flatten_observation(space: gym.Space[Any], obs: Any) -> Any:
    """One observation as a policy takes it: flattened for a Dict or Tuple ``space`` (the ``"observations"``
    part of a masked Dict), else unchanged."""
    if is_masked(space):
        space, obs = model_space(space), obs[OBSERVATIONS_KEY]
    return np.asarray(flatten(space, obs)) if is_structured(space) else obs
