"""Model options: their defaults and checks, and what the observation space implies for the model.

Apart from :mod:`flowrl.policy.models` (the torch modules), so that a config is validated and a
plan declared without loading PyTorch.
"""

from __future__ import annotations

from typing import Any, Mapping

import gymnasium as gym
import numpy as np
from gymnasium.spaces.utils import flatdim

from flowrl.envs.flatten import is_structured
from flowrl.errors import FlowRLError

DEFAULT_MODEL_CONFIG: dict[str, Any] = {
    "fcnet_hiddens": [64, 64],
    "fcnet_activation": "tanh",
    # (out_channels, kernel, stride) per layer; the DQN Nature network for 84x84 frames.
    "conv_filters": [(32, 8, 4), (64, 4, 2), (64, 3, 1)],
    "conv_activation": "relu",
    "vf_share_layers": False,
    # A torch.nn.Module subclass (or its "module:Class" path) used instead of the built-in model.
    "custom_model": None,
    # Keyword arguments of the custom model's constructor.
    "custom_model_config": {},
    # "flat": Dict/Tuple observations reach the custom model flattened; "structured": as dicts/tuples of tensors.
    "custom_model_obs": "flat",
    # Wrap the model (the built-in MLP or CNN encoder, or a feed-forward custom model) in an LSTM: the
    # policy then carries a recurrent state.
    "use_lstm": False,
    # Units of the LSTM's hidden and cell states.
    "lstm_cell_size": 256,
    # Steps per training sequence: longer pieces of an episode are cut (each piece starts from the state sampled).
    "max_seq_len": 20,
    # Feed the previous action (one-hot if discrete) and the previous reward to the LSTM as well.
    "lstm_use_prev_action": False,
    "lstm_use_prev_reward": False,
}
CUSTOM_MODEL_OBS = ("flat", "structured")

#: The activations a model option may name, and the ``torch.nn`` module each builds.
ACTIVATIONS = {"tanh": "Tanh", "relu": "ReLU", "elu": "ELU", "silu": "SiLU", "linear": "Identity"}


def model_config(overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The default model config updated with ``overrides``; unknown keys raise."""
    overrides = dict(overrides or {})
    unknown = sorted(set(overrides) - set(DEFAULT_MODEL_CONFIG))
    if unknown:
        raise FlowRLError(f"unknown model option(s) {unknown}; valid options are {sorted(DEFAULT_MODEL_CONFIG)}")
    config = {**DEFAULT_MODEL_CONFIG, **overrides}
    for key in ("fcnet_activation", "conv_activation"):
        if config[key] not in ACTIVATIONS:
            raise FlowRLError(f"model option {key}={config[key]!r} is not one of {sorted(ACTIVATIONS)}")
    for key in ("lstm_cell_size", "max_seq_len"):
        value = config[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise FlowRLError(f"model option {key}={value!r} must be an integer >= 1")
    for key in ("use_lstm", "lstm_use_prev_action", "lstm_use_prev_reward"):
        if not isinstance(config[key], bool):
            raise FlowRLError(f"model option {key}={config[key]!r} must be true or false")
    if config["custom_model"] is not None and not config["use_lstm"]:
        # The previous action and reward feed the LSTM use_lstm wraps around a custom model; a recurrent
        # custom model is not given them.
        feeding = [key for key in ("lstm_use_prev_action", "lstm_use_prev_reward") if config[key]]
        if feeding:
            raise FlowRLError(
                f"model option(s) {', '.join(feeding)} feed the LSTM that use_lstm wraps around the model; a "
                "custom_model is given them only with use_lstm=True (a recurrent custom model is not given them)"
            )
    if config["custom_model_obs"] not in CUSTOM_MODEL_OBS:
        shown = config["custom_model_obs"]
        raise FlowRLError(f"model option custom_model_obs={shown!r} is not one of {list(CUSTOM_MODEL_OBS)}")
    return config


_MAX_CHANNELS = 16


def image_layout(space: gym.Space[Any]) -> str | None:
    """``"hw"``, ``"hwc"`` or ``"chw"`` for image-frame observations (sides >= 32 pixels), else None.

    Gymnasium's frame stacking puts the stack first (``[4, 84, 84]``); most image envs put
    channels last (``[84, 84, 3]``).
    """
    if not isinstance(space, gym.spaces.Box):
        return None
    shape = space.shape
    if len(shape) == 2 and min(shape) >= 32:
        return "hw"
    if len(shape) == 3 and min(shape[:2]) >= 32 and shape[2] <= _MAX_CHANNELS:
        return "hwc"
    if len(shape) == 3 and min(shape[1:]) >= 32 and shape[0] <= _MAX_CHANNELS:
        return "chw"
    return None


def is_image_space(space: gym.Space[Any]) -> bool:
    """Whether observations are image frames for a CNN (see :func:`image_layout`)."""
    return image_layout(space) is not None


def flat_obs_dim(space: gym.Space[Any]) -> int:
    """Size of an observation once :func:`~flowrl.policy.models.obs_to_tensor` has flattened or one-hot encoded it."""
    if isinstance(space, gym.spaces.Discrete):
        return int(space.n)
    if isinstance(space, gym.spaces.Box):
        return int(np.prod(space.shape))
    if is_structured(space):
        return int(flatdim(space))
    raise FlowRLError(f"observation space {space} is not supported; use a Box, Discrete, Dict or Tuple space")
