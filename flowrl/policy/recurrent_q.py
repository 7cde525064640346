"""A recurrent Q-network (R2D2's).

:class:`RecurrentQModel` runs the built-in encoder (MLP, or CNN for image frames) on each step, an
LSTM over the steps (reading the previous action and reward too, if ``model`` says so), and a Q head
(dueling: value + advantage - mean advantage) on the LSTM's output. Its state is ``[h, c]``, each
``[lstm_cell_size]`` per env, zeros at an episode's start.

The policy that acts and learns with it is :class:`~flowrl.policy.recurrent_q_policy.RecurrentQPolicy`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from flowrl.policy.models import make_encoder
from flowrl.policy.recurrent import EncoderLSTM, PreviousInputs, SequenceModel


class RecurrentQModel(SequenceModel):
    """An encoder and an LSTM over time, then a Q head of ``num_actions`` values per step (no value head:
    :meth:`forward_sequences` gives ``(q_values, None, state)``)."""

    previous: PreviousInputs

    def __init__(
        self, obs_space: gym.Space[Any], action_space: gym.Space[Any], config: Mapping[str, Any], dueling: bool
    ) -> None:
        super().__init__()
        num_actions = int(action_space.n) if isinstance(action_space, gym.spaces.Discrete) else 0
        if not num_actions:
            raise TypeError(f"a recurrent Q model needs a Discrete action space, got {action_space}")
        self.previous = PreviousInputs(action_space, config)
        self.cell_size = int(config["lstm_cell_size"])
        self.branch = EncoderLSTM(make_encoder(obs_space, config), self.previous.dim, self.cell_size)
        self.advantage = nn.Linear(self.cell_size, num_actions)
        self.value = nn.Linear(self.cell_size, 1) if dueling else None

    def initial_state(self) -> list[np.ndarray]:
        """The state of one env at an episode's start: ``[h, c]``, zeros."""
        return [np.zeros(self.cell_size, dtype=np.float32) for _ in range(2)]

    def forward_sequences(
        self,
        obs: torch.Tensor,
        state: list[torch.Tensor],
        prev_actions: torch.Tensor | None = None,
        prev_rewards: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, None, list[torch.Tensor]]:
        """Run ``[B, T, ...]`` observations from ``state`` (``[h, c]``, each ``[B, cell]``): Q-values
        ``[B, T, num_actions]``, no values, and the state after the last step. ``prev_actions`` and
        ``prev_rewards`` (``[B, T]``) are read only if the model was configured to."""
        out, state_out = self.branch(obs, self.previous(prev_actions, prev_rewards), state)
        advantages = self.advantage(out)
        if self.value is None:
            return advantages, None, state_out
        return self.value(out) + advantages - advantages.mean(dim=-1, keepdim=True), None, state_out
