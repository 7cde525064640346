"""The Policy interface (the RLlib paper's "policy graph") and how to describe one to an actor."""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, Mapping

import gymnasium as gym
import numpy as np

from flowrl.data import SampleBatch

ModelWeights = dict[str, np.ndarray]


@dataclass
class PolicySpec:
    """Everything an actor needs to build a policy: its class, spaces and config.

    ``kwargs`` are extra constructor arguments (e.g. the loss function of a
    :class:`~flowrl.policy.TorchPolicy`); they must be picklable, so pass module-level
    functions rather than lambdas.
    """

    policy_class: type["Policy"]
    observation_space: gym.Space
    action_space: gym.Space
    config: dict[str, Any] = field(default_factory=dict)
    kwargs: dict[str, Any] = field(default_factory=dict)

    def build(self, config_overrides: Mapping[str, Any] | None = None) -> "Policy":
        """Construct the policy (``config_overrides`` win over ``config``)."""
        config = {**self.config, **(config_overrides or {})}
        return self.policy_class(self.observation_space, self.action_space, config, **self.kwargs)


class Policy(abc.ABC):
    """Maps observations to actions, learns from batches, and holds its own state.

    ``global_timestep`` is the number of env steps sampled by the whole run, pushed in by
    :meth:`on_global_var_update`; schedules (learning rate, exploration) read it.
    """

    def __init__(self, observation_space: gym.Space, action_space: gym.Space, config: Mapping[str, Any]) -> None:
        self.observation_space = observation_space
        self.action_space = action_space
        self.config = dict(config)
        self.global_timestep = 0

    @abc.abstractmethod
    def compute_actions(
        self, obs_batch: np.ndarray, *, explore: bool | None = None, timestep: int | None = None
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Actions for a batch of observations, and extra per-row outputs (e.g. ``action_logp``)."""

    def compute_single_action(self, obs: Any, *, explore: bool | None = None) -> Any:
        """The action for one observation."""
        actions, _ = self.compute_actions(np.asarray(obs)[None], explore=explore)
        return actions[0]

    def postprocess_trajectory(self, batch: SampleBatch) -> SampleBatch:
        """Add derived columns (advantages, n-step returns) to one trajectory piece."""
        return batch

    @abc.abstractmethod
    def learn_on_batch(self, batch: SampleBatch) -> dict[str, float]:
        """One gradient step on ``batch``; returns learner statistics."""

    @abc.abstractmethod
    def compute_gradients(self, batch: SampleBatch) -> tuple[list[np.ndarray], dict[str, float]]:
        """Gradients of the loss on ``batch`` (not applied) and learner statistics."""

    @abc.abstractmethod
    def apply_gradients(self, gradients: list[np.ndarray]) -> None:
        """Apply gradients computed by :meth:`compute_gradients` (possibly elsewhere)."""

    @abc.abstractmethod
    def get_weights(self) -> ModelWeights:
        """The model parameters as NumPy arrays."""

    @abc.abstractmethod
    def set_weights(self, weights: ModelWeights) -> None:
        """Load parameters from :meth:`get_weights`."""

    def get_state(self) -> dict[str, Any]:
        """Everything needed to resume: weights and counters (subclasses add optimizer state)."""
        return {"weights": self.get_weights(), "global_timestep": self.global_timestep}

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`get_state`'s output."""
        self.set_weights(state["weights"])
        self.global_timestep = int(state["global_timestep"])

    def on_global_var_update(self, global_vars: Mapping[str, Any]) -> None:
        """Receive run-wide variables; ``global_vars["timestep"]`` is the env steps sampled so far."""
        self.global_timestep = int(global_vars["timestep"])
