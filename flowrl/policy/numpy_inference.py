"""Acting with small MLP policies in NumPy, for the per-step forward passes of sampling.

For the small batches a rollout worker acts on (one row per vectorized env), PyTorch's
per-module dispatch costs several times the arithmetic. This module runs the same MLP
forward pass (:class:`NumpyActorCritic`), the same step of a recurrent model's MLP encoder
and LSTM (:class:`NumpyRecurrentActorCritic`), and categorical / Gaussian sampling in NumPy
on arrays that share memory with the model's parameters, so weight updates
(``load_state_dict``, optimizer steps, both in place) are seen without copying. Learning
still happens in PyTorch.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import gymnasium as gym
import numpy as np
from torch import nn

from flowrl.data import SampleBatch
from flowrl.envs.flatten import is_structured
from flowrl.policy.action_masks import mask_logits_numpy
from flowrl.policy.distributions import ActionDistribution, Categorical, DiagGaussian
from flowrl.policy.models import ActorCriticModel, MLPEncoder
from flowrl.policy.recurrent import RecurrentActorCritic

Array = np.ndarray
Layer = tuple[Array, Array, Callable[[Array], Array] | None]

_ACTIVATIONS: dict[type[nn.Module], Callable[[Array], Array] | None] = {
    nn.Tanh: np.tanh,
    nn.ReLU: lambda x: np.maximum(x, 0.0, out=x),
    nn.Identity: None,
}
_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)
#: The most multiply-adds OpenBLAS (NumPy's BLAS) computes a matrix product with on one thread. A bigger
#: product starts its thread pool, whose hand-offs cost more than the product when the cores are busy, as
#: they are while sampling: a [256, 128] x [128, 16] product took 50 us on two busy cores, 11 us on one thread.
SINGLE_THREAD_PRODUCT = 4 * 65536


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


def _supported_obs_space(obs_space: gym.Space[Any]) -> bool:
    return isinstance(obs_space, (gym.spaces.Box, gym.spaces.Discrete)) or is_structured(obs_space)


def _columns(obs: Array, obs_space: gym.Space[Any]) -> Array:
    """The observations as ``[features, batch]`` float32 columns (see :func:`_run`)."""
    if isinstance(obs_space, gym.spaces.Discrete):
        return np.eye(int(obs_space.n), dtype=np.float32)[:, np.asarray(obs, dtype=np.int64)]
    return np.ascontiguousarray(np.asarray(obs, dtype=np.float32).reshape(len(obs), -1).T)


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
        if not _supported_obs_space(obs_space):
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
        return _columns(obs, self.obs_space)

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


class _NumpyEncoderLSTM:
    """One step of an MLP encoder and a one-layer LSTM (PyTorch's gate order: input, forget, cell, output)."""

    def __init__(self, encoder: list[Layer], lstm: nn.LSTM) -> None:
        self.encoder = encoder
        self.size = lstm.hidden_size
        params = {name: p.detach().numpy() for name, p in lstm.named_parameters()}
        self.w_ih, self.w_hh = params["weight_ih_l0"], params["weight_hh_l0"]
        self.b_ih, self.b_hh = params["bias_ih_l0"][:, None], params["bias_hh_l0"][:, None]

    @staticmethod
    def build(branch: nn.Module) -> "_NumpyEncoderLSTM | None":
        lstm, encoder_module = branch.lstm, branch.encoder
        if not isinstance(lstm, nn.LSTM) or not isinstance(encoder_module, MLPEncoder):
            return None
        if lstm.num_layers != 1 or not lstm.bias or lstm.proj_size:
            return None
        encoder = _layers(list(encoder_module.net))
        return None if encoder is None else _NumpyEncoderLSTM(encoder, lstm)

    def step(self, x: Array, extra: list[Array], h: Array, c: Array) -> tuple[Array, Array]:
        """From ``[features, B]`` observation columns and extra input columns, and ``[B, size]`` rows ``h``
        and ``c``: the next ``h`` and ``c`` as ``[size, B]`` columns (``h`` is also the LSTM's output)."""
        features = _run(self.encoder, x)
        if extra:
            features = np.concatenate([features, *extra], axis=0)
        gates = self.w_ih @ features
        gates += self.w_hh @ np.ascontiguousarray(h.T, dtype=np.float32)
        gates += self.b_ih
        gates += self.b_hh
        n = self.size
        cell = np.tanh(gates[2 * n : 3 * n])
        # The sigmoid of all gates (the cell candidate's rows are not read again) as 0.5 * tanh(x / 2) + 0.5:
        # one transcendental ufunc instead of exp and a division.
        gates *= 0.5
        np.tanh(gates, out=gates)
        gates *= 0.5
        gates += 0.5
        c_next = gates[n : 2 * n] * c.T
        c_next += gates[:n] * cell
        h_next = gates[3 * n :] * np.tanh(c_next)
        return h_next, c_next


class NumpyRecurrentActorCritic:
    """One step of an MLP :class:`~flowrl.policy.recurrent.RecurrentActorCritic` in NumPy."""

    def __init__(
        self,
        branch: _NumpyEncoderLSTM,
        vf_branch: _NumpyEncoderLSTM | None,
        policy_head: list[Layer],
        value_head: list[Layer],
        model: RecurrentActorCritic,
        obs_space: gym.Space[Any],
    ) -> None:
        self.branch = branch
        self.vf_branch = vf_branch  # None: the value head reads the policy's LSTM
        self.policy_head = policy_head
        self.value_head = value_head
        self.obs_space = obs_space
        weights = [
            w for b in (branch, vf_branch) if b is not None for w in (b.w_ih, b.w_hh, *(x[0] for x in b.encoder))
        ]
        #: The most rows a step takes in NumPy: more run in PyTorch (see :data:`SINGLE_THREAD_PRODUCT`).
        self.max_rows = SINGLE_THREAD_PRODUCT // max(w.size for w in weights + [x[0] for x in policy_head])
        self.prev_action_dim = model.previous.action_dim
        self.discrete_actions = isinstance(model.action_space, gym.spaces.Discrete)
        self.use_prev_reward = model.previous.reward

    @staticmethod
    def build(model: nn.Module, obs_space: gym.Space[Any]) -> "NumpyRecurrentActorCritic | None":
        """The NumPy twin of ``model``, or None when it is not a CPU recurrent model with MLP encoders."""
        if not isinstance(model, RecurrentActorCritic) or not _supported_obs_space(obs_space):
            return None
        if any(p.device.type != "cpu" for p in model.parameters()):
            return None
        branch = _NumpyEncoderLSTM.build(model.branch)
        vf_branch = None if model.vf_branch is None else _NumpyEncoderLSTM.build(model.vf_branch)
        policy_head, value_head = _layers([model.policy_head]), _layers([model.value_head])
        if branch is None or (model.vf_branch is not None and vf_branch is None):
            return None
        if policy_head is None or value_head is None:
            return None
        return NumpyRecurrentActorCritic(branch, vf_branch, policy_head, value_head, model, obs_space)

    def _extra_inputs(self, prev_actions: Array | None, prev_rewards: Array | None) -> list[Array]:
        """The previous actions (one-hot if discrete) and rewards as columns, where the model reads them."""
        extra = []
        if self.prev_action_dim:
            if prev_actions is None:
                raise ValueError("this model reads the previous actions (lstm_use_prev_action) but got none")
            if self.discrete_actions:
                extra.append(np.eye(self.prev_action_dim, dtype=np.float32)[:, np.asarray(prev_actions, np.int64)])
            else:
                extra.append(np.asarray(prev_actions, dtype=np.float32).reshape(len(prev_actions), -1).T)
        if self.use_prev_reward:
            if prev_rewards is None:
                raise ValueError("this model reads the previous rewards (lstm_use_prev_reward) but got none")
            extra.append(np.asarray(prev_rewards, dtype=np.float32)[None, :])
        return extra

    def _initial_rows(self, n: int) -> list[Array]:
        zeros = np.zeros((n, self.branch.size), np.float32)
        return [zeros] * (2 if self.vf_branch is None else 4)

    def step(
        self, obs: Array, state: list[Array] | None, prev_actions: Array | None, prev_rewards: Array | None
    ) -> tuple[Array, Array, list[Array]] | None:
        """One step for each row of ``obs`` from ``state`` (``[h, c]`` of each LSTM, ``[B, size]`` each; None:
        the initial state, zeros): distribution inputs ``[B, num_outputs]``, values ``[B]`` and the next state;
        None for more than :attr:`max_rows` rows."""
        if len(obs) > self.max_rows:
            return None
        x = _columns(obs, self.obs_space)
        extra = self._extra_inputs(prev_actions, prev_rewards)
        state = self._initial_rows(len(obs)) if state is None else state
        h, c = self.branch.step(x, extra, state[0], state[1])
        dist_inputs = np.ascontiguousarray(_run(self.policy_head, h).T)
        next_state = [h, c]
        vf_h = h
        if self.vf_branch is not None:
            vf_h, vf_c = self.vf_branch.step(x, extra, state[2], state[3])
            next_state += [vf_h, vf_c]
        values = _run(self.value_head, vf_h)[0]
        return dist_inputs, values, [np.ascontiguousarray(s.T) for s in next_state]

    def value(
        self, obs: Array, state: list[Array] | None, prev_actions: Array | None, prev_rewards: Array | None
    ) -> Array | None:
        """The values of :meth:`step` alone: only the value function's LSTM steps (the policy's, if shared);
        None for more than :attr:`max_rows` rows."""
        if len(obs) > self.max_rows:
            return None
        x = _columns(obs, self.obs_space)
        extra = self._extra_inputs(prev_actions, prev_rewards)
        state = self._initial_rows(len(obs)) if state is None else state
        if self.vf_branch is None:
            h, _ = self.branch.step(x, extra, state[0], state[1])
        else:
            h, _ = self.vf_branch.step(x, extra, state[2], state[3])
        values: Array = _run(self.value_head, h)[0]
        return values


def act(
    dist_class: type[ActionDistribution],
    dist_inputs: Array,
    values: Array | None,
    action_mask: Array | None,
    explore: bool,
    rng: np.random.Generator,
) -> tuple[Array, dict[str, Array]] | None:
    """Actions (within ``action_mask``) and their extras from a twin's outputs; None for a distribution
    :func:`sample_numpy` does not sample."""
    if action_mask is not None:
        dist_inputs = mask_logits_numpy(dist_inputs, action_mask)
    sampled = sample_numpy(dist_class, dist_inputs, explore, rng)
    if sampled is None:
        return None
    actions, logp = sampled
    extra = {SampleBatch.ACTION_LOGP: logp, SampleBatch.ACTION_DIST_INPUTS: dist_inputs}
    if values is not None:
        extra[SampleBatch.VF_PREDS] = values
    return actions, extra


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
