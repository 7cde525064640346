"""The policy of a recurrent Q-network (R2D2's): acts step by step, threading its state.

:class:`RecurrentQPolicy` is a :class:`~flowrl.policy.TorchPolicy` whose model is always a
:class:`~flowrl.policy.recurrent_q.RecurrentQModel`: it explores over the Q-values as DQN's policy
does (epsilon-greedy), and its samplers thread the state and cut fragments into sequences of
``replay_sequence_length // 2`` steps, which the replay joins into windows of
``replay_sequence_length`` that overlap by half (see :mod:`flowrl.data.sequence_replay`).

This module imports no PyTorch (the model's module is imported when a policy is built), so that
declaring a plan (``flowrl plan``) loads none.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

import gymnasium as gym
import numpy as np

from flowrl.data import SampleBatch
from flowrl.deferred import DeferredModule, nn
from flowrl.policy.model_options import model_config
from flowrl.policy.policy import LearnOutput
from flowrl.policy.torch_policy import TorchPolicy

if TYPE_CHECKING:
    from flowrl.policy import recurrent_q
else:
    recurrent_q = DeferredModule("flowrl.policy.recurrent_q")


class SequenceReplayConfig(Protocol):
    """The key of a config that replays sequences (R2D2's)."""

    replay_sequence_length: int
    replay_burn_in: int


def recurrent_q_model(
    obs_space: gym.Space[Any], action_space: gym.Space[Any], num_outputs: int, config: Mapping[str, Any]
) -> nn.Module:
    """A recurrent Q model without a dueling head (a ``make_model`` of :class:`~flowrl.policy.TorchPolicy`)."""
    return recurrent_q.RecurrentQModel(obs_space, action_space, config, dueling=False)


def dueling_recurrent_q_model(
    obs_space: gym.Space[Any], action_space: gym.Space[Any], num_outputs: int, config: Mapping[str, Any]
) -> nn.Module:
    """A recurrent Q model with a dueling head."""
    return recurrent_q.RecurrentQModel(obs_space, action_space, config, dueling=True)


class RecurrentQPolicy(TorchPolicy[Any]):
    """A :class:`~flowrl.policy.TorchPolicy` over a recurrent Q model (``make_model``), recurrent
    whatever ``model.use_lstm`` says: its model always carries a state."""

    def __init__(
        self, observation_space: gym.Space[Any], action_space: gym.Space[Any], config: Any, **kwargs: Any
    ) -> None:
        if model_config(config.model)["use_lstm"]:
            # The LSTM is this policy's own model; TorchPolicy would wrap the actor-critic in one.
            config = config.replace(model={**config.model, "use_lstm": False})
        super().__init__(observation_space, action_space, config, **kwargs)

    @property
    def max_seq_len(self) -> int:
        """The samplers cut sequences of half a replayed one: the replay's windows overlap by half."""
        sequence_config: SequenceReplayConfig = self.config
        return max(1, sequence_config.replay_sequence_length // 2)

    def _loss(self, batch: SampleBatch) -> tuple[LearnOutput, str | None]:
        """The loss, its gradients averaged over a learner group's replicas by the steps each one learned.

        R2D2's loss is a mean over the learned steps of its sequences, not over every row (a burn-in's
        are not learned but in a sequence that starts its episode), so each replica weights its gradients
        by those: the replicas then take the step one learner takes on the whole batch.
        """
        sync = self.gradient_sync
        if sync is None or SampleBatch.SEQ_LENS not in batch:
            return super()._loss(batch)
        sequence_config: SequenceReplayConfig = self.config
        seq_lens = np.asarray(batch[SampleBatch.SEQ_LENS], dtype=np.int64)
        learned_per_sequence = np.maximum(seq_lens - sequence_config.replay_burn_in, 0)
        if SampleBatch.T in batch:  # a sequence that starts its episode is learned whole (see r2d2_loss)
            from_start = batch[SampleBatch.T][np.cumsum(seq_lens) - seq_lens] == 0
            learned_per_sequence = np.where(from_start, seq_lens, learned_per_sequence)
        learned = int(learned_per_sequence.sum())
        self.gradient_sync = lambda model, rows, loss_finite: sync(model, learned, loss_finite)
        try:
            return super()._loss(batch)
        finally:
            self.gradient_sync = sync
