"""The vector sampler's fragment: one ``_run``'s preallocated ``[T, num_envs, ...]`` columns.

:class:`_Fragment` holds the columns :class:`~flowrl.actors.sampling.vector.VectorSampler`
writes step by step, which rows to return (a dropped episode's are not: :meth:`_Fragment.drop_episode`),
the episodes it finished and the policy's actions; it turns into batches whole (:meth:`_Fragment.whole`) or cut
into one piece per env and episode part (:meth:`_Fragment.pieces`). The multi-agent sampler keeps
its own, per-agent fragment (:mod:`flowrl.actors.sampling.multi_agent`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from flowrl.actors.sampling.recovery import EpisodeStats
from flowrl.data import SampleBatch


@dataclass
class _Fragment:
    """One ``_run``'s ``[T, n, ...]`` columns, which of their rows to return, and the episodes it finished."""

    columns: dict[str, np.ndarray]
    keep: np.ndarray
    #: ``(episode id, stats)``: published once the fragment's checks passed (a check may drop one).
    finished: list[tuple[int, EpisodeStats]] = field(default_factory=list)
    #: The observations the policy acted on, where an observation filter changed them.
    filtered: np.ndarray | None = None
    #: The policy's actions and extra outputs, made at the first row (their shapes come from the policy).
    actions: np.ndarray | None = None
    extras: dict[str, np.ndarray] = field(default_factory=dict)

    def add_actions(self, step: int, actions: np.ndarray, extra: dict[str, np.ndarray]) -> None:
        """Write the policy's ``actions`` and ``extra`` outputs into row ``step``."""
        actions_buf = self.actions
        if actions_buf is None:
            T = len(self.keep)
            actions_buf = self.actions = np.empty((T, *actions.shape), dtype=actions.dtype)
            self.extras = {k: np.empty((T, *v.shape), dtype=v.dtype) for k, v in extra.items()}
        actions_buf[step] = actions
        extra_bufs = self.extras
        for key, value in extra.items():
            extra_bufs[key][step] = value

    def end_row(self, step: int, i: int) -> None:
        """Fill row ``step`` of env ``i`` with valid values that end its episode (a placeholder for a step whose
        result cannot be kept: the row is dropped with its episode)."""
        columns = self.columns
        columns[SampleBatch.NEW_OBS][step, i] = columns[SampleBatch.OBS][step, i]
        columns[SampleBatch.REWARDS][step, i] = 0.0
        columns[SampleBatch.TERMINATEDS][step, i] = False
        columns[SampleBatch.TRUNCATEDS][step, i] = True

    def drop_episode(self, step: int, i: int) -> tuple[int, bool]:
        """Leave out env ``i``'s episode holding row ``step``: its rows and its finished statistics.

        Returns its episode id and whether it is still running at the end of the fragment.
        """
        columns = self.columns
        ends = columns[SampleBatch.TERMINATEDS][:, i] | columns[SampleBatch.TRUNCATEDS][:, i]
        before, after = np.flatnonzero(ends[:step]), np.flatnonzero(ends[step:])
        start = int(before[-1]) + 1 if len(before) else 0
        stop = step + int(after[0]) + 1 if len(after) else len(ends)
        self.keep[start:stop, i] = False
        eps_id = int(columns[SampleBatch.EPS_ID][step, i])
        self.finished = [(e, stats) for e, stats in self.finished if e != eps_id]
        return eps_id, not len(after)

    def whole(self) -> SampleBatch:
        """The ``[T, n]`` columns as one batch, env by env (the rows of :meth:`pieces` concatenated),
        dropped episodes left out."""
        T, n = self.keep.shape
        columns = {k: v.swapaxes(0, 1).reshape(T * n, *v.shape[2:]) for k, v in self.columns.items()}
        columns[SampleBatch.ENV_ID] = np.repeat(np.arange(n, dtype=np.int64), T)
        keep = self.keep.T.reshape(-1)
        if not keep.all():
            columns = {k: v[keep] for k, v in columns.items()}
        return SampleBatch(columns)

    def pieces(self) -> list[SampleBatch]:
        """Cut ``[T, n]`` columns into one batch per env and episode part, leaving out dropped episodes."""
        T, n = self.keep.shape
        columns = self.columns
        ends = columns[SampleBatch.TERMINATEDS] | columns[SampleBatch.TRUNCATEDS]
        pieces: list[SampleBatch] = []
        for i in range(n):
            env_columns: dict[str, Any] = {k: v[:, i] for k, v in columns.items()}
            env_columns[SampleBatch.ENV_ID] = np.full(T, i, dtype=np.int64)
            bounds = [0, *(np.flatnonzero(ends[:, i]) + 1).tolist()]
            if bounds[-1] != T:
                bounds.append(T)
            for start, stop in zip(bounds[:-1], bounds[1:]):
                if self.keep[start, i]:  # a dropped episode's rows are exactly whole pieces
                    pieces.append(SampleBatch({k: v[start:stop] for k, v in env_columns.items()}))
        return pieces
