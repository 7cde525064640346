"""Operators for experience replay: storing rollouts, replaying batches, updating priorities."""

from __future__ import annotations

import random
from typing import Any, Iterator, Sequence

import numpy as np

from flowrl.data import DEFAULT_POLICY_ID, LocalReplayBuffer, MultiAgentBatch, SampleBatch
from flowrl.errors import FlowRLError
from flowrl.iterators import LocalIterator, NextValueNotReady, SharedMetrics
from flowrl.operators.names import LEARNER_INFO

Batch = SampleBatch | MultiAgentBatch
TD_ERROR = "td_error"


class StoreToReplayBuffer:
    """Add each batch to a local replay buffer, or to a random one of the replay actors (pass-through)."""

    def __init__(self, *, local_buffer: LocalReplayBuffer | None = None, actors: Sequence[Any] | None = None) -> None:
        if (local_buffer is None) == (actors is None):
            raise FlowRLError("StoreToReplayBuffer needs exactly one of local_buffer= or actors=")
        self.local_buffer = local_buffer
        self.actors = list(actors) if actors is not None else []

    def plan_links(self) -> list[tuple[str, str]]:
        """What this operator does to actors, for the plan graph."""
        return [("ReplayActor", "add batch")] if self.actors else []

    def __call__(self, batch: Batch) -> Batch:
        if self.local_buffer is not None:
            self.local_buffer.add_batch(batch)
        else:
            random.choice(self.actors).add_batch.remote(batch)
        return batch


def Replay(*, local_buffer: LocalReplayBuffer) -> LocalIterator[Batch]:
    """A source of replayed batches from a local buffer.

    Until the buffer holds ``learning_starts`` steps it has nothing to give: inside a union
    it yields a not-ready marker so the other sub-flows (the one filling the buffer) run.
    """

    def base(timeout: float | None) -> Iterator[Any]:
        while True:
            batch = local_buffer.replay()
            if batch is None:
                if timeout is None:
                    raise FlowRLError(
                        "Replay: the buffer has fewer than learning_starts steps and nothing else fills it "
                        "here; run Replay inside Concurrently with the flow that stores experience"
                    )
                yield NextValueNotReady(waits_on_siblings=True)
            else:
                yield batch

    return LocalIterator(base, SharedMetrics(), name="replay")


class UpdatePriorities:
    """Set the replayed rows' priorities from the TD errors the learner reported (pass-through).

    Consumes TrainOneStep's ``(batch, info)``; the ``td_error`` arrays are removed from the
    learner info so results stay small.
    """

    def __init__(self, local_buffer: LocalReplayBuffer) -> None:
        self.local_buffer = local_buffer

    def __call__(self, item: tuple[Batch, dict[str, dict[str, Any]]]) -> tuple[Batch, dict[str, dict[str, Any]]]:
        batch, info = item
        batches = batch.policy_batches if isinstance(batch, MultiAgentBatch) else {DEFAULT_POLICY_ID: batch}
        updates = {}
        for pid, stats in info.items():
            td_error = stats.pop(TD_ERROR, None)
            if td_error is not None and pid in batches:
                updates[pid] = (batches[pid]["batch_indexes"], np.asarray(td_error))
        if updates:
            self.local_buffer.update_priorities(updates)
        LocalIterator.get_metrics().info[LEARNER_INFO] = info
        return item
