"""The module an export traces: a policy's model with its greedy action choice, and what it outputs.

:class:`GreedyPolicyModule` wraps a policy's model, its observation filter and its action
choice (argmax, the Gaussian's mean, the deterministic actor's output) in one ``nn.Module``
whose ``forward(obs)`` returns ``(actions, *distribution inputs)`` (``forward(obs, action_mask)`` for a
policy of a masked observation space, choosing among legal actions; a recurrent policy's also takes its state,
and the previous action and reward if its model reads them, and returns the next state after the rest,
see :class:`GreedyPolicyModule`); ``_greedy_module`` builds it
from a :class:`~flowrl.policy.TorchPolicy` with the description of each output (``_Output``).
:mod:`flowrl.serve.export` traces it to TorchScript or ONNX. Holding an ``nn.Module`` subclass,
this module is imported only when exporting (through :mod:`flowrl.serve.export`), never by a
plan's declaration.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, cast

import gymnasium as gym
import numpy as np
import torch
from gymnasium.spaces.utils import flatdim
from torch import nn

from flowrl.envs.flatten import is_masked, is_structured
from flowrl.errors import RunError
from flowrl.policy import TorchPolicy
from flowrl.policy.action_masks import mask_logits
from flowrl.policy.distributions import Categorical, Deterministic, DiagGaussian, SquashedGaussian
from flowrl.policy.exploration import EpsilonGreedy
from flowrl.policy.filters import MeanStdFilter
from flowrl.policy.model_options import is_image_space, model_config

BATCH = "batch"  # the name of the dynamic batch dimension, in the description and the ONNX graph


@dataclasses.dataclass(frozen=True)
class RecurrentInputs:
    """What a recurrent policy's exported module takes beside the observations: its state's entries (each
    ``[B, size]``), and whether its model reads the previous action and the previous reward."""

    state_sizes: tuple[int, ...]
    prev_action: bool
    prev_reward: bool

    @property
    def state_entries(self) -> int:
        return len(self.state_sizes)


@dataclasses.dataclass(frozen=True)
class _Output:
    """One output of an exported model."""

    name: str
    dtype: str
    shape: list[int | str]
    description: str


class GreedyPolicyModule(nn.Module):
    """A policy's model with its greedy action choice: ``forward(obs)`` -> ``(actions, *distribution inputs)``.

    ``kind`` is ``"categorical"`` or ``"q_values"`` (argmax), ``"gaussian"`` (the mean),
    ``"squashed"`` (the mean squashed into the bounds) or ``"deterministic"`` (the model's
    output). ``bounds`` (low, high) clip Box actions as the samplers clip what reaches the env.
    ``normalization`` (shift, scale of flattened observations) is the run's observation filter,
    applied first. Observations of a Dict or Tuple space come in flattened. With ``masked``, ``forward`` also
    takes each row's legal actions (``[B, n]`` bools): illegal ones get the lowest float as their
    logit or Q-value (:func:`~flowrl.policy.action_masks.mask_logits`), so the argmax is legal.

    ``recurrent`` (a recurrent model: its number of state entries and whether it reads the previous action and
    reward): ``forward(obs, [action_mask], state_in_0, ..., [prev_actions], [prev_rewards])`` runs one step of
    the model's ``forward_sequences`` (an actor-critic's, or a recurrent Q-network's) from that state and
    returns ``state_out_0, ...`` after the other outputs.
    """

    # Registered buffers: nn.Module's __getattr__ types them as ``Tensor | Module``.
    low: torch.Tensor
    high: torch.Tensor
    squash_low: torch.Tensor
    squash_high: torch.Tensor
    obs_shift: torch.Tensor
    obs_scale: torch.Tensor

    def __init__(
        self,
        model: nn.Module,
        observation_space: gym.Space[Any],
        kind: str,
        bounds: tuple[np.ndarray, np.ndarray] | None,
        squash: tuple[torch.Tensor, torch.Tensor] | None = None,
        normalization: tuple[np.ndarray, np.ndarray] | None = None,
        masked: bool = False,
        recurrent: RecurrentInputs | None = None,
    ) -> None:
        super().__init__()
        self.model = model
        self.kind = kind
        self.masked = masked
        self.recurrent = recurrent
        self.normalize = normalization is not None
        shift, scale = normalization if normalization is not None else (np.zeros(0), np.ones(0))
        self.register_buffer("obs_shift", torch.as_tensor(shift, dtype=torch.float64))
        self.register_buffer("obs_scale", torch.as_tensor(scale, dtype=torch.float64))
        self.one_hot_size = int(observation_space.n) if isinstance(observation_space, gym.spaces.Discrete) else 0
        self.keep_uint8 = is_image_space(observation_space)
        self.clip = bounds is not None
        low, high = bounds if bounds is not None else (np.zeros(0), np.zeros(0))
        self.register_buffer("low", torch.as_tensor(low, dtype=torch.float32))
        self.register_buffer("high", torch.as_tensor(high, dtype=torch.float32))
        squash_low, squash_high = squash if squash is not None else (torch.zeros(0), torch.zeros(0))
        self.register_buffer("squash_low", torch.as_tensor(squash_low, dtype=torch.float32))
        self.register_buffer("squash_high", torch.as_tensor(squash_high, dtype=torch.float32))

    def _preprocess(self, obs: torch.Tensor) -> torch.Tensor:
        if self.normalize:
            # MeanStdFilter's arithmetic (flowrl.policy.filters): flattened rows in float64, float32 out.
            obs = ((obs.flatten(1).double() - self.obs_shift) / self.obs_scale).float().reshape_as(obs)
        # What flowrl.policy.models.obs_to_tensor does, written with traceable tensor operations
        # (it starts from torch.as_tensor, which a trace would record as a constant).
        if self.one_hot_size:
            return nn.functional.one_hot(obs.long(), self.one_hot_size).float()
        if self.keep_uint8 and obs.dtype == torch.uint8:
            return obs
        return obs.float()

    def forward(self, obs: torch.Tensor, *extra: torch.Tensor) -> tuple[torch.Tensor, ...]:
        rest = list(extra)
        action_mask = rest.pop(0) if self.masked else None
        if self.recurrent is None:
            out = self.model(self._preprocess(obs))
            return self._choose(out[0] if isinstance(out, (tuple, list)) else out, action_mask)
        # One step of the sequence model: a time axis of 1 in, taken off again.
        count = self.recurrent.state_entries
        state, rest = rest[:count], rest[count:]
        prev_actions = rest.pop(0).unsqueeze(1) if self.recurrent.prev_action else None
        prev_rewards = rest.pop(0).unsqueeze(1) if self.recurrent.prev_reward else None
        # (dist inputs, values, state) of an actor-critic, (Q-values, None, state) of a recurrent Q-network.
        dist_inputs, _, state_out = cast(Any, self.model).forward_sequences(
            self._preprocess(obs).unsqueeze(1), state, prev_actions, prev_rewards
        )
        return (*self._choose(dist_inputs[:, 0], action_mask), *state_out)

    def _choose(self, inputs: torch.Tensor, action_mask: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
        """The greedy actions from the distribution inputs (within ``action_mask``), then what they were chosen from."""
        if action_mask is not None:
            inputs = mask_logits(inputs, action_mask)
        if self.kind in ("categorical", "q_values"):
            # Categorical.deterministic_sample's argmax of the log-probabilities, so ties resolve alike.
            return torch.argmax(nn.functional.log_softmax(inputs, dim=-1), dim=-1), inputs
        if self.kind == "deterministic":
            return (self._clip(inputs),)
        mean, log_std = torch.chunk(inputs, 2, dim=-1)
        if self.kind == "squashed":
            actions = self.squash_low + (torch.tanh(mean) + 1.0) * 0.5 * (self.squash_high - self.squash_low)
            return self._clip(torch.clamp(actions, self.squash_low, self.squash_high)), mean, log_std
        return self._clip(mean), mean, log_std

    def _clip(self, actions: torch.Tensor) -> torch.Tensor:
        return torch.clamp(actions, self.low, self.high) if self.clip else actions


def _greedy_module(
    policy: TorchPolicy[Any], obs_filter: MeanStdFilter | None, what: str
) -> tuple[GreedyPolicyModule, list[_Output]]:
    """The module acting as ``policy`` (behind ``obs_filter``) acts greedily, and its outputs."""
    obs_space, action_space = policy.model_observation_space, policy.action_space
    if not isinstance(obs_space, (gym.spaces.Box, gym.spaces.Discrete)) and not is_structured(obs_space):
        raise RunError(
            f"{what} takes observations of {obs_space}, which the exporter cannot describe as one array; "
            "it exports policies of Box, Discrete, Dict and Tuple observation spaces"
        )
    dist = policy.dist_class
    bounds = None
    if isinstance(action_space, gym.spaces.Box) and bool(getattr(policy.config, "clip_actions", True)):
        bounds = (action_space.low, action_space.high)
    n = _dims(action_space)
    actions_shape: list[int | str] = [BATCH] if isinstance(action_space, gym.spaces.Discrete) else [BATCH, *n]
    squash = None
    if dist is Categorical:
        values = isinstance(policy.exploration, EpsilonGreedy)
        kind, name = ("q_values", "q_values") if values else ("categorical", "logits")
        outputs = [
            _Output(
                "actions", "int64", actions_shape, f"the action with the highest {'Q-value' if values else 'logit'}"
            ),
            _Output(
                name,
                "float32",
                [BATCH, *n],
                "each action's Q-value"
                if values
                else "each action's unnormalized log-probability (softmax gives the probabilities)",
            ),
        ]
    elif dist is Deterministic:
        kind = "deterministic"
        outputs = [_Output("actions", "float32", actions_shape, "the actor's action" + _clipped(bounds))]
    elif issubclass(dist, DiagGaussian):
        squashed = issubclass(dist, SquashedGaussian)
        kind = "squashed" if squashed else "gaussian"
        if issubclass(dist, SquashedGaussian):
            squash = (torch.as_tensor(dist.low, dtype=torch.float32), torch.as_tensor(dist.high, dtype=torch.float32))
        shown = "tanh(mean) scaled into the bounds" if squashed else "the Gaussian's mean"
        outputs = [
            _Output("actions", "float32", actions_shape, shown + _clipped(bounds)),
            _Output("mean", "float32", [BATCH, *n], "the Gaussian's mean" + (" (before the tanh)" if squashed else "")),
            _Output("log_std", "float32", [BATCH, *n], "the Gaussian's log standard deviation"),
        ]
    else:
        raise RunError(
            f"{what} acts through a {dist.__name__} distribution, which the exporter does not know; "
            "it exports Categorical, DiagGaussian, SquashedGaussian and Deterministic policies"
        )
    normalization = None
    if obs_filter is not None:
        stats = obs_filter.stats()
        size = int(flatdim(obs_space))  # what the filter sees: flattened observations
        # No statistics yet: the filter only casts to float32.
        normalization = stats.normalization() if stats is not None else (np.zeros(size), np.ones(size))
    model = copy.deepcopy(policy.model).cpu().eval()
    masked = is_masked(policy.observation_space) and kind in ("categorical", "q_values")
    if masked:
        legal = "; illegal actions' entries are the lowest float32"
        outputs[1] = dataclasses.replace(outputs[1], description=outputs[1].description + legal)
    recurrent = None
    initial = policy.get_initial_state()
    if initial:
        if any(s.ndim != 1 for s in initial):
            raise RunError(
                f"{what} has a recurrent state of shapes {[list(s.shape) for s in initial]}; "
                "the exporter takes state entries of one dimension (per batch row)"
            )
        options = model_config(policy.config.model)
        recurrent = RecurrentInputs(
            tuple(int(s.shape[0]) for s in initial),
            bool(options["lstm_use_prev_action"]),
            bool(options["lstm_use_prev_reward"]),
        )
        outputs += [
            _Output(f"state_out_{k}", "float32", [BATCH, size], f"the next state: state_in_{k} at the next step")
            for k, size in enumerate(recurrent.state_sizes)
        ]
    module = GreedyPolicyModule(model, obs_space, kind, bounds, squash, normalization, masked, recurrent)
    return module.eval(), outputs


def _dims(space: gym.Space[Any]) -> list[int | str]:
    if isinstance(space, gym.spaces.Discrete):
        return [int(space.n)]
    return [int(d) for d in space.shape or ()]


def _clipped(bounds: tuple[np.ndarray, np.ndarray] | None) -> str:
    return ", clipped to the action space's bounds" if bounds is not None else " (clip_actions=False: not clipped)"
