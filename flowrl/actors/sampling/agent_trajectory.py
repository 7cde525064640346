"""One agent's trajectory in a multi-agent episode, as :class:`~flowrl.actors.sampling.multi_agent.MultiAgentSampler`
builds it: complete rows, the row of the agent's last action while it waits for its next turn, and (for a
recurrent policy) the state the agent acts from next."""

from __future__ import annotations

import collections
from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from flowrl.data import SampleBatch


class AgentTrajectory:
    """The rows of one agent's current trajectory piece, and the row of its last action while it waits.

    With a recurrent policy's ``initial_state`` (not empty) it also carries the agent's state, previous
    action and previous reward from its episode's start: each row records the ones it acted from
    (``state_in_*``, ``prev_actions``, ``prev_rewards``), and the agent moves on to the row's ``state_out_*``,
    its action and, once the row is complete, all it earned with it.
    """

    def __init__(
        self,
        policy_id: str,
        agent_index: int,
        env_index: int,
        eps_id: int,
        initial_state: Sequence[np.ndarray] = (),
        action_space: gym.Space[Any] | None = None,
    ) -> None:
        self.policy_id = policy_id
        self.agent_index = agent_index
        self.env_index = env_index
        self.eps_id = eps_id
        self.columns: dict[str, list[Any]] = collections.defaultdict(list)
        self.total_reward = 0.0
        # Rewards the env gave the agent before its first action (e.g. the step it joined):
        # they go into its first row.
        self.pending_reward = 0.0
        #: The row of the agent's last action, until its next observation completes it (see :meth:`complete`).
        self.open_row: dict[str, Any] | None = None
        #: The recurrent state the agent acts from next (``[]``: a feed-forward policy), and its previous action
        #: and reward (zeros at the episode's start).
        self.state = [s.copy() for s in initial_state]
        shape = () if action_space is None or action_space.shape is None else action_space.shape
        dtype = np.float32 if action_space is None or action_space.dtype is None else action_space.dtype
        self.prev_action = np.zeros(shape, dtype=dtype)
        self.prev_reward = 0.0

    def open(self, row: dict[str, Any]) -> None:
        """The agent acted: ``row`` (observation, action, ...) collects its rewards until :meth:`complete`;
        a recurrent policy's row records the state it acted from, and the agent moves on to its ``state_out_*``."""
        row[SampleBatch.REWARDS] = self.pending_reward
        self.pending_reward = 0.0
        if self.state:
            for k, state in enumerate(self.state):
                row[f"{SampleBatch.STATE_IN}{k}"] = state
            row[SampleBatch.PREV_ACTIONS] = self.prev_action
            row[SampleBatch.PREV_REWARDS] = np.float32(self.prev_reward)
            self.state = [row[f"{SampleBatch.STATE_OUT}{k}"] for k in range(len(self.state))]
            self.prev_action = np.asarray(row[SampleBatch.ACTIONS])
        self.open_row = row

    def reward(self, reward: float) -> None:
        """A reward the env gave the agent: its open row's, else its next row's."""
        self.total_reward += reward
        if self.open_row is not None:
            self.open_row[SampleBatch.REWARDS] += reward
        else:
            self.pending_reward += reward

    def complete(
        self, new_obs: Any, terminated: bool, truncated: bool, columns: Mapping[str, Any] | None = None
    ) -> None:
        """Close the open row with the agent's next observation, flags and ``columns`` (e.g. its next mask)."""
        row = self.open_row
        assert row is not None
        self.open_row = None
        if columns:
            row.update(columns)
        row[SampleBatch.NEW_OBS] = np.asarray(new_obs)
        row[SampleBatch.TERMINATEDS] = terminated
        row[SampleBatch.TRUNCATEDS] = truncated
        self.prev_reward = float(row[SampleBatch.REWARDS])
        for key, value in row.items():
            self.columns[key].append(value)

    def end_last_row(self, terminated: bool, truncated: bool) -> None:
        """The agent finished with no row open: its last row (if still in this piece) takes the flags and
        the rewards since."""
        if self.columns:
            self.columns[SampleBatch.TERMINATEDS][-1] = terminated
            self.columns[SampleBatch.TRUNCATEDS][-1] = truncated
            self.columns[SampleBatch.REWARDS][-1] += self.pending_reward
            self.pending_reward = 0.0

    def cut(self) -> SampleBatch | None:
        """The complete rows so far as a batch (None if there are none); the piece starts afresh (an open
        row stays, for the next piece)."""
        if not self.columns:
            return None
        n = len(self.columns[SampleBatch.REWARDS])
        batch = SampleBatch({k: np.asarray(v) for k, v in self.columns.items()})
        batch[SampleBatch.REWARDS] = batch[SampleBatch.REWARDS].astype(np.float32)
        batch[SampleBatch.EPS_ID] = np.full(n, self.eps_id, dtype=np.int64)
        batch[SampleBatch.ENV_ID] = np.full(n, self.env_index, dtype=np.int64)
        batch[SampleBatch.AGENT_INDEX] = np.full(n, self.agent_index, dtype=np.int64)
        self.columns = collections.defaultdict(list)
        return batch


def recurrent_inputs(trajectories: Sequence[AgentTrajectory]) -> dict[str, Any]:
    """The keyword arguments of a recurrent policy's ``compute_actions`` for the agents of ``trajectories``
    acting together: their states, previous actions and previous rewards stacked."""
    return {
        "state": [np.stack(states) for states in zip(*(t.state for t in trajectories))],
        "prev_actions": np.stack([t.prev_action for t in trajectories]),
        "prev_rewards": np.array([t.prev_reward for t in trajectories], dtype=np.float32),
    }
