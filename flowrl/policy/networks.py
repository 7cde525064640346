"""The torch modules of the value-based and deterministic actor-critic algorithms: DQN's Q model,
DDPG's and TD3's actor and critics.

Apart from the algorithms' modules, which import them on first use, so that declaring a plan
(``flowrl plan``) loads no PyTorch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from flowrl.policy.model_options import flat_obs_dim
from flowrl.policy.models import make_encoder, mlp


class QModel(nn.Module):
    """An encoder and a Q head (dueling: value + advantage - mean advantage); forward gives ``(q, None)``."""

    def __init__(
        self, obs_space: gym.Space[Any], num_actions: int, model_config: Mapping[str, Any], dueling: bool
    ) -> None:
        super().__init__()
        self.encoder = make_encoder(obs_space, model_config)
        self.advantage = nn.Linear(self.encoder.out_dim, num_actions)
        self.value = nn.Linear(self.encoder.out_dim, 1) if dueling else None

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, None]:
        features = self.encoder(obs)
        advantages = self.advantage(features)
        if self.value is None:
            return advantages, None
        return self.value(features) + advantages - advantages.mean(dim=1, keepdim=True), None


class ActorCritics(nn.Module):
    """A deterministic actor squashed into the action bounds, and one or two Q(s, a) critics.

    ``forward(obs)`` gives ``(actions, None)``, so acting goes through the usual policy path.
    ``actor`` and ``critics`` are MLPs of ``actor_hiddens`` / ``critic_hiddens`` (two critics with
    ``twin_q``) unless given (a custom model's).
    """

    low: torch.Tensor  # the action bounds, registered buffers (they move with the module)
    high: torch.Tensor
    mid: torch.Tensor
    half_range: torch.Tensor

    def __init__(
        self,
        obs_space: gym.Space[Any],
        action_space: gym.spaces.Box,
        actor_hiddens: Sequence[int] = (),
        critic_hiddens: Sequence[int] = (),
        twin_q: bool = False,
        actor: nn.Module | None = None,
        critics: nn.ModuleList | None = None,
    ) -> None:
        super().__init__()
        obs_dim, act_dim = flat_obs_dim(obs_space), int(np.prod(action_space.shape))
        self.actor = actor if actor is not None else mlp(obs_dim, list(actor_hiddens), "relu", act_dim)
        self.critics = (
            critics
            if critics is not None
            else nn.ModuleList(
                mlp(obs_dim + act_dim, list(critic_hiddens), "relu", 1) for _ in range(2 if twin_q else 1)
            )
        )
        self.register_buffer("low", torch.tensor(action_space.low, dtype=torch.float32))
        self.register_buffer("high", torch.tensor(action_space.high, dtype=torch.float32))
        # The bounds' midpoint and half-width, kept so that acting and target smoothing take one op
        # each to map into the bounds; derived from low and high, so left out of the state dict.
        self.register_buffer("mid", 0.5 * (self.low + self.high), persistent=False)
        self.register_buffer("half_range", 0.5 * (self.high - self.low), persistent=False)

    def act(self, obs: torch.Tensor) -> torch.Tensor:
        """Deterministic actions within the bounds."""
        return torch.addcmul(self.mid, torch.tanh(self.actor(obs.flatten(1))), self.half_range)

    def q(self, obs: torch.Tensor, actions: torch.Tensor) -> list[torch.Tensor]:
        """Each critic's Q(s, a), shape ``[B]``."""
        x = torch.cat([obs.flatten(1), actions], dim=1)
        return [critic(x).squeeze(-1) for critic in self.critics]

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, None]:
        return self.act(obs), None
