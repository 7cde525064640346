"""The torch modules of Soft Actor-Critic: a stochastic actor, twin soft Q critics and the learnable
entropy temperature.

Apart from :mod:`flowrl.algorithms.sac`, which imports it on first use, so that declaring a plan
(``flowrl plan``) loads no PyTorch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from flowrl.policy.model_options import flat_obs_dim
from flowrl.policy.models import mlp

#: The actor's log standard deviations are clamped into this range: below it the Gaussian collapses
#: to a point (log-probabilities blow up), above it tanh saturates and every action sits on a bound.
LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0
_LOG2 = math.log(2.0)
#: How far inside the bounds :meth:`SACModel.logp` reads actions on a bound (in units of half the range).
_INSIDE = 1e-6


class SACModel(nn.Module):
    """A stochastic actor, one or two soft Q critics, and ``log_alpha``, the log of the entropy temperature.

    Continuous (a Box of actions): the actor maps flat observations to ``[mean, log_std]`` of a Gaussian
    that tanh squashes into the bounds, and each critic maps ``[obs, action]`` to one Q-value.
    Discrete: the actor gives one logit per action and each critic one Q-value per action.
    ``forward(obs)`` gives ``(dist_inputs, None)``, so acting goes through the policy's distribution.
    ``log_alpha`` is a parameter of the model so that it travels with the weights, checkpoints and the
    gradient averaging of learner groups. ``actor`` and ``critics`` are MLPs of ``actor_hiddens`` /
    ``critic_hiddens`` unless given (a custom model's).
    """

    low: torch.Tensor  # the action bounds (continuous), registered buffers that move with the module
    high: torch.Tensor
    half_range: torch.Tensor

    def __init__(
        self,
        obs_space: gym.Space[Any],
        action_space: gym.Space[Any],
        actor_hiddens: Sequence[int] = (),
        critic_hiddens: Sequence[int] = (),
        twin_q: bool = True,
        initial_alpha: float = 1.0,
        actor: nn.Module | None = None,
        critics: nn.ModuleList | None = None,
    ) -> None:
        super().__init__()
        obs_dim = flat_obs_dim(obs_space)
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        if isinstance(action_space, gym.spaces.Discrete):
            act_dim = int(action_space.n)
            actor_out, critic_in, critic_out = act_dim, obs_dim, act_dim
        else:
            assert isinstance(action_space, gym.spaces.Box)  # make_sac_policy refuses other action spaces
            act_dim = int(np.prod(action_space.shape))
            actor_out, critic_in, critic_out = 2 * act_dim, obs_dim + act_dim, 1
            self.register_buffer("low", torch.tensor(action_space.low, dtype=torch.float32))
            self.register_buffer("high", torch.tensor(action_space.high, dtype=torch.float32))
            # Derived from the bounds: left out of the state dict.
            self.register_buffer("half_range", 0.5 * (self.high - self.low), persistent=False)
        self.actor = actor if actor is not None else mlp(obs_dim, list(actor_hiddens), "relu", actor_out)
        self.critics = (
            critics
            if critics is not None
            else nn.ModuleList(
                mlp(critic_in, list(critic_hiddens), "relu", critic_out) for _ in range(2 if twin_q else 1)
            )
        )
        self.log_alpha = nn.Parameter(torch.tensor(math.log(initial_alpha), dtype=torch.float32))

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, None]:
        return self.dist_inputs(obs), None

    def dist_inputs(self, obs: torch.Tensor) -> torch.Tensor:
        """The actor's outputs for ``obs``: logits (discrete), or ``[mean, log_std]`` with log_std clamped."""
        out: torch.Tensor = self.actor(obs.flatten(1))
        if self.discrete:
            return out
        mean, log_std = torch.chunk(out, 2, dim=-1)
        return torch.cat([mean, log_std.clamp(LOG_STD_MIN, LOG_STD_MAX)], dim=-1)

    def sample(self, dist_inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Reparameterised actions within the bounds from ``[mean, log_std]`` inputs, and their log-densities."""
        mean, log_std = torch.chunk(dist_inputs, 2, dim=-1)
        raw = torch.addcmul(mean, log_std.exp(), torch.randn_like(mean))
        actions = torch.addcmul(self.low, torch.tanh(raw) + 1.0, self.half_range)
        return actions, squashed_logp(raw, mean, log_std, self.half_range)

    def logp(self, dist_inputs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """The log-density of given ``actions`` (within the bounds) under the squashed Gaussian of ``[mean,
        log_std]`` inputs, shape ``[B]`` (continuous; cloning recorded actions). Actions on a bound, where the
        density is 0, are read a hair inside it."""
        mean, log_std = torch.chunk(dist_inputs, 2, dim=-1)
        unit = ((actions - self.low) / self.half_range - 1.0).clamp(-1.0 + _INSIDE, 1.0 - _INSIDE)
        return squashed_logp(torch.atanh(unit), mean, log_std, self.half_range)

    def q(self, obs: torch.Tensor, actions: torch.Tensor) -> list[torch.Tensor]:
        """Each critic's Q(s, a), shape ``[B]`` (continuous)."""
        x = torch.cat([obs.flatten(1), actions], dim=1)
        return [critic(x).squeeze(-1) for critic in self.critics]

    def q_all(self, obs: torch.Tensor) -> list[torch.Tensor]:
        """Each critic's Q-values of every action, shape ``[B, n]`` (discrete)."""
        x = obs.flatten(1)
        return [critic(x) for critic in self.critics]


def squashed_logp(
    raw: torch.Tensor, mean: torch.Tensor, log_std: torch.Tensor, half_range: torch.Tensor
) -> torch.Tensor:
    """The log-density of ``low + (tanh(raw) + 1) * half_range`` for ``raw`` drawn from N(mean, exp(log_std)),
    summed over the action's dimensions (``[B]``).

    The change of variables subtracts ``log |d action / d raw| = log half_range + log(1 - tanh(raw)^2)``,
    written as ``2 (log 2 - raw - softplus(-2 raw))``, which stays finite where tanh saturates (the usual
    ``log(1 - tanh^2 + eps)`` is biased there by the epsilon).
    """
    z = (raw - mean) * torch.exp(-log_std)
    gaussian = -(0.5 * z.square() + log_std + 0.5 * math.log(2 * math.pi))
    log_det = 2.0 * (_LOG2 - raw - nn.functional.softplus(-2.0 * raw)) + torch.log(half_range)
    return (gaussian - log_det).sum(-1)
