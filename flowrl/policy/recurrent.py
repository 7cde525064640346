"""The recurrent actor-critic (``model: {use_lstm: true}``) and the padding of sequence batches.

:class:`RecurrentActorCritic` runs the built-in encoder (MLP, or CNN for image frames) on each
step, feeds the features (with the previous action and reward, if configured) through an LSTM,
and reads the policy's distribution inputs from the LSTM's output. The value comes from a second
encoder and LSTM of the same shape (as the feed-forward model's value head has its own encoder),
or with ``vf_share_layers`` from the policy's LSTM. Its state is ``[h, c]`` of each LSTM (four
arrays, or two when shared), each ``[lstm_cell_size]`` per env, zeros at an episode's start.
With ``use_lstm`` around a feed-forward custom model, the custom model is each branch's step encoder
(see :mod:`flowrl.policy.custom_model`).

Learning reads a batch cut into sequences (see :class:`~flowrl.data.SampleBatch`): :func:`pad`
lays its rows out as ``[B, T, ...]`` (T: the longest sequence), the LSTM runs from each
sequence's ``state_in_*``, and :func:`unpad` takes the outputs of the real steps back to rows,
so that every loss term and statistic is over the steps sampled, never over padding.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from flowrl.data import SampleBatch
from flowrl.errors import ConfigError
from flowrl.policy.models import CNNEncoder, MLPEncoder, make_encoder


def sequence_index(seq_lens: torch.Tensor, max_len: int) -> torch.Tensor:
    """For each row of a batch cut into sequences, its place ``b * max_len + t`` in the padded ``[B, T]`` layout."""
    seq_lens = seq_lens.long()
    starts = torch.cumsum(seq_lens, 0) - seq_lens
    sequence = torch.repeat_interleave(torch.arange(len(seq_lens), device=seq_lens.device), seq_lens)
    step = torch.arange(int(seq_lens.sum()), device=seq_lens.device) - starts[sequence]
    return sequence * max_len + step


def pad(rows: torch.Tensor, seq_lens: torch.Tensor, max_len: int) -> torch.Tensor:
    """``rows`` (``[N, ...]``, sequence after sequence) as ``[B, max_len, ...]``, zeros after each sequence's end."""
    padded = rows.new_zeros((len(seq_lens) * max_len, *rows.shape[1:]))
    padded[sequence_index(seq_lens, max_len)] = rows
    return padded.reshape(len(seq_lens), max_len, *rows.shape[1:])


def unpad(padded: torch.Tensor, seq_lens: torch.Tensor) -> torch.Tensor:
    """The real steps of ``padded`` (``[B, T, ...]``) back as rows ``[N, ...]`` (what :func:`pad` was given)."""
    B, T = padded.shape[:2]
    return padded.reshape(B * T, *padded.shape[2:])[sequence_index(seq_lens, T)]


def step_mask(seq_lens: torch.Tensor, max_len: int) -> torch.Tensor:
    """``[B, max_len]`` bools: True at the real steps of each sequence, False at its padding."""
    return torch.arange(max_len, device=seq_lens.device)[None, :] < seq_lens.long()[:, None]


def action_input_dim(action_space: gym.Space[Any]) -> int:
    if isinstance(action_space, gym.spaces.Discrete):
        return int(action_space.n)
    if isinstance(action_space, gym.spaces.Box):
        return int(np.prod(action_space.shape))
    raise ConfigError([f"model option lstm_use_prev_action takes a Discrete or Box action space, not {action_space}"])


class PreviousInputs:
    """What an LSTM reads with each step's features besides them (``lstm_use_prev_action``,
    ``lstm_use_prev_reward``): the previous action (one-hot for a Discrete space) and reward."""

    def __init__(self, action_space: gym.Space[Any], config: Mapping[str, Any]) -> None:
        self.action_space = action_space
        self.action_dim = action_input_dim(action_space) if config["lstm_use_prev_action"] else 0
        self.reward = bool(config["lstm_use_prev_reward"])
        #: Their width at each step.
        self.dim = self.action_dim + int(self.reward)

    def __call__(self, prev_actions: torch.Tensor | None, prev_rewards: torch.Tensor | None) -> list[torch.Tensor]:
        """``[B, T]`` previous actions and rewards as ``[B, T, ...]`` LSTM inputs (none if not read)."""
        inputs = []
        if self.action_dim:
            if prev_actions is None:
                raise ValueError("this model reads the previous actions (lstm_use_prev_action) but got none")
            if isinstance(self.action_space, gym.spaces.Discrete):
                inputs.append(nn.functional.one_hot(prev_actions.long(), self.action_dim).float())
            else:
                inputs.append(prev_actions.float().flatten(2))
        if self.reward:
            if prev_rewards is None:
                raise ValueError("this model reads the previous rewards (lstm_use_prev_reward) but got none")
            inputs.append(prev_rewards.float().unsqueeze(-1))
        return inputs


class FirstOutput(nn.Module):
    """A module whose forward gives a tuple, as a step encoder: its first output (``[N, out_dim]``) is the
    step's features, the rest is left unused (a custom model wrapped by ``use_lstm``)."""

    def __init__(self, module: nn.Module, out_dim: int) -> None:
        super().__init__()
        self.module = module
        self.out_dim = out_dim

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        features: torch.Tensor = self.module(obs)[0]
        return features


#: A step encoder of :class:`RecurrentActorCritic`: ``[N, ...]`` observations to ``[N, out_dim]`` features.
StepEncoder = MLPEncoder | CNNEncoder | FirstOutput


class EncoderLSTM(nn.Module):
    """The encoder of each step, then an LSTM over the steps (with the previous action and reward)."""

    def __init__(self, encoder: StepEncoder, in_extra: int, cell_size: int) -> None:
        super().__init__()
        self.encoder = encoder
        self.lstm = nn.LSTM(encoder.out_dim + in_extra, cell_size, batch_first=True)

    def forward(
        self, obs: torch.Tensor, extra: list[torch.Tensor], state: list[torch.Tensor]
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        B, T = obs.shape[:2]
        features = self.encoder(obs.reshape(B * T, *obs.shape[2:])).reshape(B, T, -1)
        h, c = state
        out, (h_out, c_out) = self.lstm(torch.cat([features, *extra], dim=-1), (h.unsqueeze(0), c.unsqueeze(0)))
        return out, [h_out.squeeze(0), c_out.squeeze(0)]


class SequenceModel(nn.Module):
    """What a recurrent policy's model runs: a subclass gives its state at an episode's start
    (:meth:`initial_state`) and its pass over ``[B, T]`` sequences (:meth:`forward_sequences`); acting
    one step and learning over a batch cut into sequences are built on those two."""

    #: What :meth:`forward_sequences` reads besides the observations (None: nothing; padded for it only then).
    previous: PreviousInputs | None = None

    def initial_state(self) -> list[np.ndarray]:
        """The state of one env at an episode's start: a list of 1-d arrays."""
        raise NotImplementedError

    def forward_sequences(
        self,
        obs: torch.Tensor,
        state: list[torch.Tensor],
        prev_actions: torch.Tensor | None = None,
        prev_rewards: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, list[torch.Tensor]]:
        """Run ``[B, T, ...]`` observations from ``state`` (one ``[B, size]`` tensor per entry): distribution
        inputs (or Q-values) ``[B, T, num_outputs]``, values ``[B, T]`` (None: a model without a value
        head) and the state after the last step."""
        raise NotImplementedError

    def step(
        self,
        obs: torch.Tensor,
        state: list[np.ndarray],
        prev_actions: np.ndarray | None = None,
        prev_rewards: np.ndarray | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, list[torch.Tensor]]:
        """One step for each row of ``obs`` (``[B, ...]``, a tensor) from ``state`` and the previous actions
        and rewards (arrays): distribution inputs ``[B, num_outputs]``, values ``[B]`` (None without a value
        head) and the next state."""
        device = obs.device

        def one_step(value: np.ndarray | None) -> torch.Tensor | None:
            return None if value is None else torch.as_tensor(value, device=device).unsqueeze(1)

        state_in = [torch.as_tensor(s, device=device) for s in state]
        dist_inputs, values, state_out = self.forward_sequences(
            obs.unsqueeze(1), state_in, one_step(prev_actions), one_step(prev_rewards)
        )
        return dist_inputs[:, 0], None if values is None else values[:, 0], state_out

    def forward_rows(
        self, batch: Mapping[str, torch.Tensor], loading: Callable[[], AbstractContextManager[Any]] = nullcontext
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Distribution inputs and values for every row of a batch cut into sequences (tensors), padding
        left out; the padding runs in ``loading`` (a policy counts it as getting the batch ready)."""
        dist_inputs, values, _ = self._forward_padded(batch, loading, bootstrap=False)
        return dist_inputs, values

    def forward_rows_and_bootstrap(
        self, batch: Mapping[str, torch.Tensor], loading: Callable[[], AbstractContextManager[Any]] = nullcontext
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`forward_rows`, and for each sequence the value of its last row's ``new_obs`` from the
        state after that row (``[num_sequences]``): one more step, run in the same pass."""
        dist_inputs, values, bootstrap = self._forward_padded(batch, loading, bootstrap=True)
        assert bootstrap is not None
        return dist_inputs, values, bootstrap

    def _forward_padded(
        self, batch: Mapping[str, torch.Tensor], loading: Callable[[], AbstractContextManager[Any]], bootstrap: bool
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        seq_lens = batch[SampleBatch.SEQ_LENS].long()
        B = len(seq_lens)
        with loading():
            # With bootstrap, each sequence gets one more step after its last: the last row's next
            # observation, with that row's action and reward as the previous ones.
            max_len = int(seq_lens.max()) + int(bootstrap)
            index = sequence_index(seq_lens, max_len)
            after_last = torch.arange(B, device=seq_lens.device) * max_len + seq_lens
            last_rows = torch.cumsum(seq_lens, 0) - 1

            def padded(key: str, next_key: str) -> torch.Tensor | None:
                if key not in batch:
                    return None
                rows = batch[key]
                flat = rows.new_zeros((B * max_len, *rows.shape[1:]))
                flat[index] = rows
                if bootstrap:
                    flat[after_last] = batch[next_key][last_rows].to(flat.dtype)
                return flat.reshape(B, max_len, *rows.shape[1:])

            obs = padded(SampleBatch.OBS, SampleBatch.NEW_OBS)
            previous = self.previous
            reads_actions, reads_rewards = (
                (False, False) if previous is None else (previous.action_dim, previous.reward)
            )
            prev_actions = padded(SampleBatch.PREV_ACTIONS, SampleBatch.ACTIONS) if reads_actions else None
            prev_rewards = padded(SampleBatch.PREV_REWARDS, SampleBatch.REWARDS) if reads_rewards else None
            state = [batch[f"{SampleBatch.STATE_IN}{k}"] for k in range(len(self.initial_state()))]
        assert obs is not None
        dist_inputs, values, _ = self.forward_sequences(obs, state, prev_actions, prev_rewards)
        if values is None:
            raise TypeError(f"{type(self).__name__} has no value head: its rows are learned by its own loss")
        flat_values = values.reshape(B * max_len)
        rows_out = dist_inputs.reshape(B * max_len, -1)[index], flat_values[index]
        return *rows_out, flat_values[after_last] if bootstrap else None


class RecurrentActorCritic(SequenceModel):
    """An encoder and an LSTM over time, a head of ``num_outputs`` distribution inputs, and a value
    head on its own encoder and LSTM (on the policy's with ``vf_share_layers``).

    ``make_step_encoder()`` builds each branch's encoder (called once per branch); by default the
    built-in one for ``obs_space`` (:func:`~flowrl.policy.models.make_encoder`)."""

    previous: PreviousInputs

    def __init__(
        self,
        obs_space: gym.Space[Any],
        action_space: gym.Space[Any],
        num_outputs: int,
        config: Mapping[str, Any],
        make_step_encoder: Callable[[], StepEncoder] | None = None,
    ) -> None:
        super().__init__()
        self.action_space = action_space
        self.previous = PreviousInputs(action_space, config)
        self.cell_size = int(config["lstm_cell_size"])

        def branch() -> EncoderLSTM:
            encoder = make_encoder(obs_space, config) if make_step_encoder is None else make_step_encoder()
            return EncoderLSTM(encoder, self.previous.dim, self.cell_size)

        self.branch = branch()
        self.vf_branch = None if config["vf_share_layers"] else branch()
        self.policy_head = nn.Linear(self.cell_size, num_outputs)
        self.value_head = nn.Linear(self.cell_size, 1)
        nn.init.orthogonal_(self.policy_head.weight, gain=0.01)
        nn.init.zeros_(self.policy_head.bias)

    def initial_state(self) -> list[np.ndarray]:
        """The state of one env at an episode's start: ``[h, c]`` of each LSTM, zeros."""
        return [np.zeros(self.cell_size, dtype=np.float32) for _ in range(2 if self.vf_branch is None else 4)]

    def forward_sequences(
        self,
        obs: torch.Tensor,
        state: list[torch.Tensor],
        prev_actions: torch.Tensor | None = None,
        prev_rewards: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        """Run ``[B, T, ...]`` observations from ``state`` (``[h, c]`` of each LSTM, each ``[B, cell]``):
        distribution inputs ``[B, T, num_outputs]``, values ``[B, T]`` and the state after the last step."""
        inputs = self.previous(prev_actions, prev_rewards)
        out, state_out = self.branch(obs, inputs, state[:2])
        vf_out = out
        if self.vf_branch is not None:
            vf_out, vf_state_out = self.vf_branch(obs, inputs, state[2:])
            state_out += vf_state_out
        return self.policy_head(out), self.value_head(vf_out).squeeze(-1), state_out
