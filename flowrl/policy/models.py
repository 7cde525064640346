"""Neural network models: MLP and CNN encoders, and an actor-critic with a value head.

Model options use RLlib's key names, given as the ``model`` dict of a policy config:
``fcnet_hiddens``, ``fcnet_activation``, ``conv_filters``, ``conv_activation``,
``vf_share_layers``; ``custom_model``, ``custom_model_config`` and ``custom_model_obs``
plug in a user's ``torch.nn.Module`` instead (see :mod:`flowrl.policy.custom_model`).

Observations of Dict and Tuple spaces reach the models flattened (see :mod:`flowrl.envs.flatten`).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import gymnasium as gym
import numpy as np
import torch
from gymnasium.spaces.utils import flatdim
from torch import nn

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
}
CUSTOM_MODEL_OBS = ("flat", "structured")

_ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU, "elu": nn.ELU, "silu": nn.SiLU, "linear": nn.Identity}


def model_config(overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The default model config updated with ``overrides``; unknown keys raise."""
    overrides = dict(overrides or {})
    unknown = sorted(set(overrides) - set(DEFAULT_MODEL_CONFIG))
    if unknown:
        raise FlowRLError(f"unknown model option(s) {unknown}; valid options are {sorted(DEFAULT_MODEL_CONFIG)}")
    config = {**DEFAULT_MODEL_CONFIG, **overrides}
    for key in ("fcnet_activation", "conv_activation"):
        if config[key] not in _ACTIVATIONS:
            raise FlowRLError(f"model option {key}={config[key]!r} is not one of {sorted(_ACTIVATIONS)}")
    if config["custom_model_obs"] not in CUSTOM_MODEL_OBS:
        shown = config["custom_model_obs"]
        raise FlowRLError(f"model option custom_model_obs={shown!r} is not one of {list(CUSTOM_MODEL_OBS)}")
    return config


def mlp(in_dim: int, hiddens: Sequence[int], activation: str, out_dim: int | None = None) -> nn.Sequential:
    """Fully connected layers with ``activation`` after each hidden layer (none after ``out_dim``)."""
    layers: list[nn.Module] = []
    for size in hiddens:
        layers += [nn.Linear(in_dim, size), _ACTIVATIONS[activation]()]
        in_dim = size
    if out_dim is not None:
        layers.append(nn.Linear(in_dim, out_dim))
    return nn.Sequential(*layers)


_MAX_CHANNELS = 16


def image_layout(space: gym.Space) -> str | None:
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


def is_image_space(space: gym.Space) -> bool:
    """Whether observations are image frames for a CNN (see :func:`image_layout`)."""
    return image_layout(space) is not None


def flat_obs_dim(space: gym.Space) -> int:
    """Size of an observation once :func:`obs_to_tensor` has flattened or one-hot encoded it."""
    if isinstance(space, gym.spaces.Discrete):
        return int(space.n)
    if isinstance(space, gym.spaces.Box):
        return int(np.prod(space.shape))
    if is_structured(space):
        return int(flatdim(space))
    raise FlowRLError(f"observation space {space} is not supported; use a Box, Discrete, Dict or Tuple space")


def obs_to_tensor(obs: np.ndarray, space: gym.Space, device: torch.device) -> torch.Tensor:
    """A batch of observations as the tensor the models expect.

    Discrete observations are one-hot encoded; image frames keep their dtype (the CNN
    scales uint8); everything else (flattened Dict and Tuple observations too) becomes float32.
    """
    tensor = torch.as_tensor(obs, device=device)
    if isinstance(space, gym.spaces.Discrete):
        return nn.functional.one_hot(tensor.long(), int(space.n)).float()
    if is_image_space(space) and tensor.dtype == torch.uint8:
        return tensor
    return tensor.float()


class CNNEncoder(nn.Module):
    """Convolutions over image frames (uint8 scaled to [0, 1]) then a 512-unit layer.

    ``layout`` is the frames' axis order without the batch axis: ``"hwc"``, ``"chw"`` or ``"hw"``.
    """

    def __init__(self, obs_shape: Sequence[int], layout: str, filters: Sequence[Sequence[int]], activation: str) -> None:
        super().__init__()
        self.layout = layout
        if layout == "hw":
            channels, height, width = 1, obs_shape[0], obs_shape[1]
        elif layout == "hwc":
            height, width, channels = obs_shape
        else:
            channels, height, width = obs_shape
        layers: list[nn.Module] = []
        in_channels = channels
        for out_channels, kernel, stride in filters:
            layers += [nn.Conv2d(in_channels, out_channels, kernel, stride), _ACTIVATIONS[activation]()]
            in_channels = out_channels
        self.convs = nn.Sequential(*layers, nn.Flatten())
        with torch.no_grad():
            flat = self.convs(torch.zeros(1, channels, height, width)).shape[1]
        self.fc = nn.Sequential(nn.Linear(flat, 512), _ACTIVATIONS[activation]())
        self.out_dim = 512

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        x = obs.float() / 255.0 if obs.dtype == torch.uint8 else obs
        if self.layout == "hw":
            x = x.unsqueeze(1)
        elif self.layout == "hwc":
            x = x.permute(0, 3, 1, 2)
        return self.fc(self.convs(x))


class MLPEncoder(nn.Module):
    """Flattens observations and applies the hidden layers of an MLP."""

    def __init__(self, in_dim: int, hiddens: Sequence[int], activation: str) -> None:
        super().__init__()
        self.net = mlp(in_dim, hiddens, activation)
        self.out_dim = hiddens[-1] if hiddens else in_dim

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs.flatten(1))


def make_encoder(obs_space: gym.Space, config: Mapping[str, Any]) -> CNNEncoder | MLPEncoder:
    """A CNN for image frames, else an MLP, as configured."""
    layout = image_layout(obs_space)
    if layout is not None and isinstance(obs_space, gym.spaces.Box):  # image_layout() is None unless a Box
        return CNNEncoder(obs_space.shape, layout, config["conv_filters"], config["conv_activation"])
    return MLPEncoder(flat_obs_dim(obs_space), config["fcnet_hiddens"], config["fcnet_activation"])


class ActorCriticModel(nn.Module):
    """An encoder, a head of ``num_outputs`` distribution inputs and a value head.

    With ``vf_share_layers`` the value head reads the policy's encoder; otherwise it has
    its own encoder of the same shape. ``forward`` returns ``(dist_inputs, values)``;
    with ``value_head=False`` there is no value head and ``values`` is None.
    """

    def __init__(self, obs_space: gym.Space, num_outputs: int, config: Mapping[str, Any], value_head: bool = True) -> None:
        super().__init__()
        self.encoder = make_encoder(obs_space, config)
        self.policy_head = nn.Linear(self.encoder.out_dim, num_outputs)
        self.has_value_head = value_head
        self.vf_encoder = None if config["vf_share_layers"] or not value_head else make_encoder(obs_space, config)
        self.value_head = nn.Linear(self.encoder.out_dim, 1) if value_head else None
        # Small initial policy outputs keep the first actions close to uniform.
        nn.init.orthogonal_(self.policy_head.weight, gain=0.01)
        nn.init.zeros_(self.policy_head.bias)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        features = self.encoder(obs)
        if self.value_head is None:
            return self.policy_head(features), None
        vf_features = features if self.vf_encoder is None else self.vf_encoder(obs)
        return self.policy_head(features), self.value_head(vf_features).squeeze(-1)
