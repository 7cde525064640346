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
from flowrl.policy.recurrent import EncoderLSTM, action_input_dim


class RecurrentQModel(nn.Module):
    """An encoder and an LSTM over time, then a Q head of ``num_actions`` values per step."""

    def __init__(
        self, obs_space: gym.Space[Any], action_space: gym.Space[Any], config: Mapping[str, Any], dueling: bool
    ) -> None:
        super().__init__()
        num_actions = int(action_space.n) if isinstance(action_space, gym.spaces.Discrete) else 0
        if not num_actions:
            raise TypeError(f"a recurrent Q model needs a Discrete action space, got {action_space}")
        self.prev_action_dim = action_input_dim(action_space) if config["lstm_use_prev_action"] else 0
        self.use_prev_reward = bool(config["lstm_use_prev_reward"])
        self.cell_size = int(config["lstm_cell_size"])
        in_extra = self.prev_action_dim + int(self.use_prev_reward)
        self.branch = EncoderLSTM(make_encoder(obs_space, config), in_extra, self.cell_size)
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
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Run ``[B, T, ...]`` observations from ``state`` (``[h, c]``, each ``[B, cell]``): Q-values
        ``[B, T, num_actions]`` and the state after the last step. ``prev_actions`` and ``prev_rewards``
        (``[B, T]``) are read only if the model was configured to."""
        inputs = []
        if self.prev_action_dim:
            if prev_actions is None:
                raise ValueError("this model reads the previous actions (lstm_use_prev_action) but got none")
            inputs.append(nn.functional.one_hot(prev_actions.long(), self.prev_action_dim).float())
        if self.use_prev_reward:
            if prev_rewards is None:
                raise ValueError("this model reads the previous rewards (lstm_use_prev_reward) but got none")
            inputs.append(prev_rewards.float().unsqueeze(-1))
        out, state_out = self.branch(obs, inputs, state)
        advantages = self.advantage(out)
        if self.value is None:
            return advantages, state_out
        return self.value(out) + advantages - advantages.mean(dim=-1, keepdim=True), state_out

    def step(
        self,
        obs: torch.Tensor,
        state: list[np.ndarray],
        prev_actions: np.ndarray | None = None,
        prev_rewards: np.ndarray | None = None,
    ) -> tuple[torch.Tensor, None, list[torch.Tensor]]:
        """One step for each row of ``obs`` (``[B, ...]``) from ``state``: Q-values ``[B, num_actions]``,
        no value, and the next state (what :class:`~flowrl.policy.TorchPolicy` acts from)."""
        device = obs.device

        def one_step(value: np.ndarray | None) -> torch.Tensor | None:
            return None if value is None else torch.as_tensor(value, device=device).unsqueeze(1)

        state_in = [torch.as_tensor(s, device=device) for s in state]
        q_values, state_out = self.forward_sequences(
            obs.unsqueeze(1), state_in, one_step(prev_actions), one_step(prev_rewards)
        )
        return q_values[:, 0], None, state_out
