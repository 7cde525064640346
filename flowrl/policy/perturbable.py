"""Policies for the perturbation searches (ES, ARS): a network whose parameters are one flat vector.

- :class:`PerturbableModel`: an MLP over observations normalized with statistics held in its
  buffers (so the filter travels with the weights and the checkpoints), and
  :class:`FlatActor`, its NumPy forward pass from a flat parameter vector, fast enough to act
  at an env's pace. The statistics are :class:`~flowrl.policy.filters.RunningStats`.
- :func:`flat_parameters`, :func:`unflatten` and :func:`ascend` (an update through the
  policy's optimizer, so its state is checkpointed with the policy).

The policy spec that builds this model is :func:`flowrl.policy.perturbation_spec.perturbation_policy_spec`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from flowrl.errors import FlowRLError
from flowrl.policy.filters import RunningStats
from flowrl.policy.models import mlp
from flowrl.policy.torch_policy import TorchPolicy

# --- the policy network and its NumPy forward pass -------------------------------------------------

_NUMPY_ACTIVATIONS: dict[str, Callable[[np.ndarray], np.ndarray] | None] = {
    "tanh": np.tanh,
    "relu": lambda x: np.maximum(x, 0.0),
    "elu": lambda x: np.where(x > 0, x, np.expm1(np.minimum(x, 0.0))),
    "silu": lambda x: x / (1.0 + np.exp(-x)),
    "linear": None,
}


class PerturbableModel(nn.Module):
    """An MLP from normalized observations to the action distribution's inputs (no value head).

    ``forward(obs)`` gives ``(dist_inputs, None)`` with ``obs`` shifted and scaled by the
    ``obs_shift`` / ``obs_scale`` buffers. The statistics behind them (``obs_count``,
    ``obs_mean``, ``obs_m2``) are buffers too, so the observation filter is part of the
    weights that are broadcast, checkpointed and evaluated; perturbations and updates touch
    only the parameters. With no hidden layers the policy is linear. ``zero_init`` starts
    the output layer at zero (ARS), otherwise it starts small so first actions are near-uniform.
    """

    # Registered buffers: nn.Module's __getattr__ types them as ``Tensor | Module``.
    obs_count: torch.Tensor
    obs_mean: torch.Tensor
    obs_m2: torch.Tensor
    obs_shift: torch.Tensor
    obs_scale: torch.Tensor

    def __init__(
        self, obs_dim: int, num_outputs: int, hiddens: Sequence[int], activation: str, zero_init: bool = False
    ) -> None:
        super().__init__()
        if activation not in _NUMPY_ACTIVATIONS:
            raise FlowRLError(f"fcnet_activation={activation!r}: ES/ARS support {sorted(_NUMPY_ACTIVATIONS)}")
        self.activation = activation
        self.net = mlp(obs_dim, list(hiddens), activation, num_outputs)
        output = self.net[-1]
        assert isinstance(output, nn.Linear)  # mlp() ends with the out_dim layer
        if zero_init:
            nn.init.zeros_(output.weight)
        else:
            nn.init.orthogonal_(output.weight, gain=0.01)
        nn.init.zeros_(output.bias)
        self.register_buffer("obs_count", torch.zeros((), dtype=torch.float64))
        self.register_buffer("obs_mean", torch.zeros(obs_dim, dtype=torch.float64))
        self.register_buffer("obs_m2", torch.zeros(obs_dim, dtype=torch.float64))
        self.register_buffer("obs_shift", torch.zeros(obs_dim))
        self.register_buffer("obs_scale", torch.ones(obs_dim))

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, None]:
        return self.net((obs.flatten(1) - self.obs_shift) / self.obs_scale), None

    def observation_stats(self) -> RunningStats:
        """The running observation statistics held in the buffers."""
        stats = RunningStats(self.obs_mean.numel())
        stats.count = float(self.obs_count)
        stats.mean = self.obs_mean.cpu().numpy().copy()
        stats.m2 = self.obs_m2.cpu().numpy().copy()
        return stats

    def set_observation_stats(self, stats: RunningStats) -> None:
        """Store ``stats`` and normalize observations with them from now on."""
        shift, scale = stats.normalization()
        with torch.no_grad():
            self.obs_count.fill_(stats.count)
            self.obs_mean.copy_(torch.as_tensor(stats.mean))
            self.obs_m2.copy_(torch.as_tensor(stats.m2))
            self.obs_shift.copy_(torch.as_tensor(shift, dtype=torch.float32))
            self.obs_scale.copy_(torch.as_tensor(scale, dtype=torch.float32))


def flat_parameters(model: nn.Module) -> np.ndarray:
    """The model's parameters (not its buffers) as one float32 vector, in ``parameters()`` order."""
    return np.concatenate([p.detach().cpu().numpy().ravel() for p in model.parameters()]).astype(np.float32)


def unflatten(flat: np.ndarray, model: nn.Module) -> list[np.ndarray]:
    """Split a flat vector into float32 arrays shaped like the model's parameters."""
    arrays, offset = [], 0
    for p in model.parameters():
        arrays.append(np.asarray(flat[offset : offset + p.numel()], dtype=np.float32).reshape(tuple(p.shape)))
        offset += p.numel()
    if offset != len(flat):
        raise ValueError(f"a flat vector of {len(flat)} values for {offset} parameters")
    return arrays


def ascend(policy: TorchPolicy[Any], direction: np.ndarray, l2_coeff: float = 0.0) -> None:
    """One step of the policy's optimizer up ``direction``, with L2 decay ``l2_coeff * theta``.

    The optimizer minimizes, so it is handed ``-direction + l2_coeff * theta`` as the gradient;
    its state (Adam's moments, momentum) is then part of the policy's checkpointed state.
    """
    gradient = -np.asarray(direction, dtype=np.float64)
    if l2_coeff:
        gradient = gradient + l2_coeff * flat_parameters(policy.model)
    policy.apply_gradients(unflatten(gradient, policy.model))


class FlatActor:
    """Deterministic actions of a :class:`PerturbableModel` in NumPy, its parameters given as one vector.

    A CartPole step takes about 10 microseconds; a PyTorch forward pass about 200. Acting
    one observation at a time in NumPy keeps evaluation at the env's pace.
    """

    def __init__(self, model: PerturbableModel, action_space: gym.Space[Any], clip_actions: bool = True) -> None:
        self.shapes = [tuple(p.shape) for p in model.parameters()]
        self.dim = sum(int(np.prod(s)) for s in self.shapes)
        self.activation = _NUMPY_ACTIVATIONS[model.activation]
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        self.action_shape = action_space.shape
        self.bounds: tuple[np.ndarray, np.ndarray] | None = None
        if isinstance(action_space, gym.spaces.Box) and clip_actions:
            self.bounds = (action_space.low, action_space.high)
        self.layers: list[tuple[np.ndarray, np.ndarray]] = []
        self.shift = np.zeros(self.shapes[0][1], dtype=np.float32)
        self.scale = np.ones(self.shapes[0][1], dtype=np.float32)

    def set_normalization(self, shift: np.ndarray, scale: np.ndarray) -> None:
        """Normalize observations as ``(obs - shift) / scale``."""
        self.shift = np.asarray(shift, dtype=np.float32)
        self.scale = np.asarray(scale, dtype=np.float32)

    def set_parameters(self, flat: np.ndarray) -> None:
        """Act with these parameters (``parameters()`` order: weight then bias of each layer)."""
        if len(flat) != self.dim:
            raise ValueError(f"{len(flat)} parameters given, the model has {self.dim}")
        self.layers, offset = [], 0
        for weight_shape, bias_shape in zip(self.shapes[0::2], self.shapes[1::2]):
            w_size, b_size = int(np.prod(weight_shape)), int(np.prod(bias_shape))
            weight = flat[offset : offset + w_size].reshape(weight_shape)
            bias = flat[offset + w_size : offset + w_size + b_size]
            self.layers.append((weight, bias))
            offset += w_size + b_size

    def outputs(self, obs: np.ndarray) -> np.ndarray:
        """The model's outputs (distribution inputs) for one observation."""
        x = (np.asarray(obs, dtype=np.float32).ravel() - self.shift) / self.scale
        last = len(self.layers) - 1
        for i, (weight, bias) in enumerate(self.layers):
            x = weight @ x + bias
            if i < last and self.activation is not None:
                x = self.activation(x)
        return x

    def __call__(self, obs: np.ndarray) -> Any:
        out = self.outputs(obs)
        if self.discrete:
            return int(out.argmax())
        action = out.reshape(self.action_shape)
        return np.clip(action, *self.bounds) if self.bounds is not None else action
