"""One agent's trajectory in a multi-agent episode, as :class:`~flowrl.actors.sampling.multi_agent.MultiAgentSampler`
builds it: complete rows, and the row of the agent's last action while it waits for its next turn."""

from __future__ import annotations

import collections
from collections.abc import Mapping
from typing import Any

import numpy as np

from flowrl.data import SampleBatch


class AgentTrajectory:
    """The rows of one agent's current trajectory piece, and the row of its last action while it waits."""

    def __init__(self, policy_id: str, agent_index: int, env_index: int, eps_id: int) -> None:
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

    def open(self, row: dict[str, Any]) -> None:
        """The agent acted: ``row`` (observation, action, ...) collects its rewards until :meth:`complete`."""
        row[SampleBatch.REWARDS] = self.pending_reward
        self.pending_reward = 0.0
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
