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
from torch import nn

from flowrl.policy.model_options import ACTIVATIONS, flat_obs_dim, image_layout, is_image_space


def mlp(in_dim: int, hiddens: Sequence[int], activation: str, out_dim: int | None = None) -> nn.Sequential:
    """Fully connected layers with ``activation`` after each hidden layer (none after ``out_dim``)."""
    layers: list[nn.Module] = []
    for size in hiddens:
        layers += [nn.Linear(in_dim, size), getattr(nn, ACTIVATIONS[activation])()]
        in_dim = size
    if out_dim is not None:
        layers.append(nn.Linear(in_dim, out_dim))
    return nn.Sequential(*layers)


def module_weights(module: nn.Module) -> dict[str, np.ndarray]:
    """``module``'s parameters and buffers as NumPy arrays on the CPU (copies)."""
    return {k: v.detach().cpu().numpy().copy() for k, v in module.state_dict().items()}


def load_module_weights(module: nn.Module, weights: Mapping[str, np.ndarray | torch.Tensor]) -> None:
    """Load :func:`module_weights`'s output (or a ``state_dict``) into ``module``, in place, on its device."""
    # torch.tensor copies: arrays from Ray's object store are read-only.
    module.load_state_dict({k: v if isinstance(v, torch.Tensor) else torch.tensor(v) for k, v in weights.items()})


def obs_to_tensor(obs: np.ndarray, space: gym.Space[Any], device: torch.device) -> torch.Tensor:
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

    def __init__(
        self, obs_shape: Sequence[int], layout: str, filters: Sequence[Sequence[int]], activation: str
    ) -> None:
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
            layers += [nn.Conv2d(in_channels, out_channels, kernel, stride), getattr(nn, ACTIVATIONS[activation])()]
            in_channels = out_channels
        self.convs = nn.Sequential(*layers, nn.Flatten())
        with torch.no_grad():
            flat = self.convs(torch.zeros(1, channels, height, width)).shape[1]
        self.fc = nn.Sequential(nn.Linear(flat, 512), getattr(nn, ACTIVATIONS[activation])())
        self.out_dim = 512

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        x = obs.float() / 255.0 if obs.dtype == torch.uint8 else obs
        if self.layout == "hw":
            x = x.unsqueeze(1)
        elif self.layout == "hwc":
            x = x.permute(0, 3, 1, 2)
        features: torch.Tensor = self.fc(self.convs(x))
        return features


class MLPEncoder(nn.Module):
    """Flattens observations and applies the hidden layers of an MLP."""

    def __init__(self, in_dim: int, hiddens: Sequence[int], activation: str) -> None:
        super().__init__()
        self.net = mlp(in_dim, hiddens, activation)
        self.out_dim = hiddens[-1] if hiddens else in_dim

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        features: torch.Tensor = self.net(obs.flatten(1))
        return features


def make_encoder(obs_space: gym.Space[Any], config: Mapping[str, Any]) -> CNNEncoder | MLPEncoder:
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

    def __init__(
        self, obs_space: gym.Space[Any], num_outputs: int, config: Mapping[str, Any], value_head: bool = True
    ) -> None:
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
