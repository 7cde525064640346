"""What learning code asks of a policy, as Protocols: a :class:`~flowrl.policy.Policy` has it all,
and so may a stand-in (a test double, a scripted policy) that is no Policy subclass.

Operators, learner threads and :func:`~flowrl.policy.sgd.minibatch_sgd` type their policies
with these rather than with :class:`~flowrl.policy.Policy`, so that anything with the methods
they call is accepted (structural typing, checked by mypy; nothing is checked at run time).
"""

from __future__ import annotations

from typing import Any, Protocol

import gymnasium as gym
import numpy as np

from flowrl.data import SampleBatch
from flowrl.policy.policy import LearnOutput


class BatchLearner(Protocol):
    """A policy that takes one gradient step on a batch (what minibatch SGD calls)."""

    def learn_on_batch(self, batch: SampleBatch) -> dict[str, float]:
        """One gradient step on ``batch``; its learner statistics."""
        ...


class Learner(BatchLearner, Protocol):
    """A policy a learner thread trains: one step at a time, or epochs of minibatches."""

    def learn(self, batch: SampleBatch) -> LearnOutput:
        """One gradient step on ``batch``: its statistics and, for value-based policies, TD errors."""
        ...


class LearningPolicy(Learner, Protocol):
    """What operators use of a policy: learning steps, gradients and the count of updates it
    skipped for a non-finite value."""

    @property
    def num_nonfinite_updates(self) -> int:
        """Updates skipped because a loss or gradient was not finite."""
        ...

    def compute_gradients(self, batch: SampleBatch) -> tuple[list[np.ndarray], dict[str, float]]:
        """Gradients of the loss on ``batch`` (not applied) and their statistics."""
        ...


class ActingPolicy(Protocol):
    """What a sampler uses of a policy: actions for a batch of observations, and the
    postprocessing of each trajectory piece."""

    def compute_actions(
        self,
        obs_batch: np.ndarray,
        /,
        *,
        action_mask: np.ndarray | None = None,
        state: list[np.ndarray] | None = None,
        prev_actions: np.ndarray | None = None,
        prev_rewards: np.ndarray | None = None,
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Actions for ``obs_batch`` (each row's among its legal ones, given ``action_mask``) and extra
        per-row outputs (e.g. ``action_logp``; a recurrent policy's next ``state_out_*``, see
        :meth:`flowrl.policy.Policy.compute_actions`)."""
        ...

    def postprocess_trajectory(self, batch: SampleBatch) -> SampleBatch:
        """``batch`` (one trajectory piece) with derived columns added."""
        ...


class SamplingPolicy(ActingPolicy, Protocol):
    """What a single-agent sampler uses of a policy: :class:`ActingPolicy`, whether its
    postprocessing changes pieces (when it does not, the sampler hands fragments on whole), and
    its recurrent state (a recurrent policy's fragments are cut into sequences of ``max_seq_len``)."""

    @property
    def postprocesses(self) -> bool:
        """Whether :meth:`postprocess_trajectory` changes pieces."""
        ...

    def get_initial_state(self) -> list[np.ndarray]:
        """One env's recurrent state at an episode's start; ``[]`` for a feed-forward policy."""
        ...

    @property
    def max_seq_len(self) -> int:
        """Steps per training sequence of a recurrent policy (``model.max_seq_len``)."""
        ...


class AgentPolicy(ActingPolicy, Protocol):
    """What a multi-agent sampler uses of each policy: :class:`ActingPolicy`, and its action space
    (actions of a Box space are clipped to its bounds)."""

    @property
    def action_space(self) -> gym.Space[Any]:
        """The space the policy's actions are in."""
        ...
