"""Acting with small MLP policies in NumPy, for the per-step forward passes of sampling.

For the small batches a rollout worker acts on (one row per vectorized env), PyTorch's
per-module dispatch costs several times the arithmetic. This module runs the same MLP
forward pass and categorical / Gaussian sampling in NumPy on arrays that share memory
with the model's parameters, so weight updates (``load_state_dict``, optimizer steps,
both in place) are seen without copying. Learning still happens in PyTorch.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import gymnasium as gym
import numpy as np
from torch import nn

from flowrl.envs.flatten import is_structured
from flowrl.policy.distributions import ActionDistribution, Categorical, DiagGaussian
from flowrl.policy.models import ActorCriticModel, MLPEncoder

Array = np.ndarray
Layer = tuple[Array, Array, Callable[[Array], Array] | None]

_ACTIVATIONS: dict[type[nn.Module], Callable[[Array], Array] | None] = {
    nn.Tanh: np.tanh,
    nn.ReLU: lambda x: np.maximum(x, 0.0, out=x),
    nn.Identity: None,
}
_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


def _layers(modules: list[nn.Module]) -> list[Layer] | None:
    """(weight, bias as a column, activation) per Linear layer, or None if a module is not supported."""
    layers: list[Layer] = []
    for module in modules:
        if isinstance(module, nn.Linear) and module.bias is not None:
            layers.append((module.weight.detach().numpy(), module.bias.detach().numpy()[:, None], None))
        elif type(module) in _ACTIVATIONS and layers and layers[-1][2] is None:
            weight, bias, _ = layers[-1]
            layers[-1] = (weight, bias, _ACTIVATIONS[type(module)])
        else:
            return None
    return layers


def _run(layers: list[Layer], x: Array) -> Array:
    """The layers applied to ``x`` of shape ``[features, batch]`` (one column per observation).

    Column-major activations let each product read the ``[out, in]`` weight as stored: a small
    ``weight @ x`` runs much faster than ``x @ weight.T``, whose transposed operand takes a slower path.
    """
    for weight, bias, activation in layers:
        x = weight @ x
        x += bias
        if activation is not None:
            x = activation(x)
    return x


class NumpyActorCritic:
    """The forward pass of an MLP :class:`~flowrl.policy.models.ActorCriticModel` in NumPy."""

    def __init__(
        self,
        encoder: list[Layer],
        policy_head: list[Layer],
        value_encoder: list[Layer] | None,
        value_head: list[Layer] | None,
        obs_space: gym.Space[Any],
    ) -> None:
        self.encoder = encoder
        self.policy_head = policy_head
        self.value_encoder = value_encoder  # None: the value head reads the policy's encoder
        self.value_head = value_head
        self.obs_space = obs_space

    @staticmethod
    def build(model: nn.Module, obs_space: gym.Space[Any]) -> "NumpyActorCritic | None":
        """The NumPy twin of ``model``, or None when it is not a CPU MLP actor-critic it can mirror."""
        if not isinstance(model, ActorCriticModel) or not isinstance(model.encoder, MLPEncoder):
            return None
        if any(p.device.type != "cpu" for p in model.parameters()):
            return None
        if not isinstance(obs_space, (gym.spaces.Box, gym.spaces.Discrete)) and not is_structured(obs_space):
            return None
        encoder = _layers(list(model.encoder.net))
        policy_head = _layers([model.policy_head])
        value_encoder = value_head = None
        if model.value_head is not None:
            value_head = _layers([model.value_head])
            if model.vf_encoder is not None:
                if not isinstance(model.vf_encoder, MLPEncoder):
                    return None
                value_encoder = _layers(list(model.vf_encoder.net))
                if value_encoder is None:
                    return None
        if encoder is None or policy_head is None or (model.value_head is not None and value_head is None):
            return None
        return NumpyActorCritic(encoder, policy_head, value_encoder, value_head, obs_space)

    def _inputs(self, obs: Array) -> Array:
        """The observations as ``[features, batch]`` float32 columns (see :func:`_run`)."""
        if isinstance(self.obs_space, gym.spaces.Discrete):
            return np.eye(int(self.obs_space.n), dtype=np.float32)[:, np.asarray(obs, dtype=np.int64)]
        return np.ascontiguousarray(np.asarray(obs, dtype=np.float32).reshape(len(obs), -1).T)

    def forward(self, obs: Array) -> tuple[Array, Array | None]:
        """``(dist_inputs, values)`` for a batch of observations (values None without a value head)."""
        x = self._inputs(obs)
        features = _run(self.encoder, x)
        dist_inputs = np.ascontiguousarray(_run(self.policy_head, features).T)
        if self.value_head is None:
            return dist_inputs, None
        vf_features = features if self.value_encoder is None else _run(self.value_encoder, x)
        return dist_inputs, _run(self.value_head, vf_features)[0]

    def value(self, obs: Array) -> Array:
        """State values alone."""
        assert self.value_head is not None
        x = self._inputs(obs)
        features = _run(self.encoder if self.value_encoder is None else self.value_encoder, x)
        values: Array = _run(self.value_head, features)[0]
        return values


def sample_numpy(
    dist_class: type[ActionDistribution], dist_inputs: Array, explore: bool, rng: np.random.Generator
) -> tuple[Array, Array] | None:
    """Actions and log-probabilities for Categorical or DiagGaussian inputs; None for other distributions."""
    if dist_class is Categorical:
        shifted = dist_inputs - dist_inputs.max(axis=1, keepdims=True)
        log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
        scores = log_probs - np.log(-np.log(rng.random(log_probs.shape))) if explore else log_probs
        actions = scores.argmax(axis=1)
        return actions, log_probs[np.arange(len(actions)), actions]
    if dist_class is DiagGaussian:
        mean, log_std = np.split(dist_inputs, 2, axis=1)
        std = np.exp(log_std)
        actions = mean + std * rng.standard_normal(mean.shape, dtype=np.float32) if explore else mean
        z = (actions - mean) / std
        return actions, -(0.5 * z * z + log_std + _HALF_LOG_2PI).sum(axis=1)
    return None
