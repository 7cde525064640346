"""What a vector sampler carries for a recurrent policy: each env's state, previous action and reward."""

from __future__ import annotations

import copy
from typing import Any

import gymnasium as gym
import numpy as np

from flowrl.data import SampleBatch


class RecurrentState:
    """Each of ``n`` envs' recurrent state (one ``[n, ...]`` array per entry of ``initial``), previous
    action and previous reward; an env's are reset (:meth:`reset`) when it starts an episode."""

    def __init__(self, initial: list[np.ndarray], n: int, action_space: gym.Space[Any]) -> None:
        self.initial = initial
        self.states = [np.repeat(s[None], n, axis=0) for s in initial]
        dtype = action_space.dtype if action_space.dtype is not None else np.float32
        self.prev_actions = np.zeros((n, *(action_space.shape or ())), dtype=dtype)
        self.prev_rewards = np.zeros(n, dtype=np.float32)

    def columns(self, T: int) -> dict[str, np.ndarray]:
        """Empty ``[T, n, ...]`` columns of a fragment for the state acted from and the previous action and reward."""
        columns = {
            f"{SampleBatch.STATE_IN}{k}": np.empty((T, *s.shape), dtype=s.dtype) for k, s in enumerate(self.states)
        }
        columns[SampleBatch.PREV_ACTIONS] = np.empty((T, *self.prev_actions.shape), dtype=self.prev_actions.dtype)
        columns[SampleBatch.PREV_REWARDS] = np.empty((T, *self.prev_rewards.shape), dtype=np.float32)
        return columns

    def record(self, columns: dict[str, np.ndarray], step: int) -> dict[str, Any]:
        """Write the current state, previous actions and rewards into row ``step``; returns them as
        the keyword arguments of ``compute_actions``."""
        for k, state in enumerate(self.states):
            columns[f"{SampleBatch.STATE_IN}{k}"][step] = state
        columns[SampleBatch.PREV_ACTIONS][step] = self.prev_actions
        columns[SampleBatch.PREV_REWARDS][step] = self.prev_rewards
        return {"state": self.states, "prev_actions": self.prev_actions, "prev_rewards": self.prev_rewards}

    def advance(self, extra: dict[str, np.ndarray], actions: np.ndarray, rewards: np.ndarray) -> None:
        """Move every env on by one step: the policy's ``state_out_*``, and the step's actions and rewards."""
        for k, state in enumerate(self.states):
            state[:] = extra[f"{SampleBatch.STATE_OUT}{k}"]
        self.prev_actions[:] = actions
        self.prev_rewards[:] = rewards

    def reset(self, i: int) -> None:
        """Env ``i`` starts an episode: the initial state, no previous action or reward."""
        for state, initial in zip(self.states, self.initial):
            state[i] = initial
        self.prev_actions[i] = 0
        self.prev_rewards[i] = 0.0

    def get_state(self) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
        """A copy of what :meth:`set_state` restores."""
        return copy.deepcopy((self.states, self.prev_actions, self.prev_rewards))

    def set_state(self, state: tuple[list[np.ndarray], np.ndarray, np.ndarray]) -> None:
        """Restore :meth:`get_state`'s output."""
        self.states, self.prev_actions, self.prev_rewards = copy.deepcopy(state)
