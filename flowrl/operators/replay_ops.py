"""Operators for experience replay: storing rollouts, replaying batches, updating priorities."""

from __future__ import annotations

import random
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from flowrl.actors import Learned
from flowrl.data import (
    LocalReplayBuffer,
    MultiAgentBatch,
    SampleBatch,
)
from flowrl.errors import FlowRLError
from flowrl.iterators import (
    LocalIterator,
    NextValueNotReady,
    SharedMetrics,
    from_actors,
)
from flowrl.operators.names import (
    STEPS_SAMPLED_COUNTER,
    STEPS_TRAINED_COUNTER,
)
from flowrl.operators.protocol import ActorLink, HiddenOperator, Operator, StatefulOperator
from flowrl.operators.train_ops import Trained

Batch = SampleBatch | MultiAgentBatch


class StoreToReplayBuffer(Operator):
    """Add each batch to a local replay buffer, or to a random one of the replay actors (pass-through).

    The buffers are owned outside the plan (:class:`~flowrl.actors.PlanResources`), which
    also checkpoints them.
    """

    def __init__(self, *, local_buffer: LocalReplayBuffer | None = None, actors: Sequence[Any] | None = None) -> None:
        if (local_buffer is None) == (actors is None):
            raise FlowRLError("StoreToReplayBuffer needs exactly one of local_buffer= or actors=")
        self.local_buffer = local_buffer
        self.actors = list(actors) if actors is not None else []

    def plan_links(self) -> list[ActorLink]:
        """Adds batches to the replay shards (nothing for a local buffer)."""
        return [ActorLink("ReplayActor", "add batch")] if self.actors else []

    def __call__(self, batch: Batch) -> Batch:
        if self.local_buffer is not None:
            self.local_buffer.add_batch(batch)
        else:
            random.choice(self.actors).add_batch.remote(batch)
        return batch


class _IsBatch(HiddenOperator):
    """Drops the None a replay shard answers before it holds ``learning_starts`` steps."""

    def __call__(self, item: Any) -> bool:
        return item is not None


def Replay(
    *, local_buffer: LocalReplayBuffer | None = None, actors: Sequence[Any] | None = None, num_async: int = 4
) -> LocalIterator[Batch]:
    """A source of replayed batches, from a local buffer or from replay actors.

    Until a buffer holds ``learning_starts`` steps it has nothing to give: inside a union a
    local buffer yields a not-ready marker so the other sub-flows (the one filling the
    buffer) run, and replay actors answer None after a short wait, which is dropped here.
    With actors, batches arrive as shards produce them (``num_async`` requests in flight
    per shard); :meth:`~flowrl.iterators.LocalIterator.zip_with_source_actor` names the shard.
    """
    if (local_buffer is None) == (actors is None):
        raise FlowRLError("Replay needs exactly one of local_buffer= or actors=")
    if actors is not None:
        return from_actors(list(actors), name="replay_actors").gather_async(num_async=num_async).filter(_IsBatch())

    def base(timeout: float | None) -> Iterator[Any]:
        while True:
            batch = local_buffer.replay()  # type: ignore[union-attr]
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


class MixInReplay(StatefulOperator):
    """Mix replayed batches into a stream of fresh ones; use with ``combine``.

    Keeps the last ``num_slots`` input batches. Each input comes out first, followed on
    average by ``replay_proportion`` batches drawn uniformly from the slots (the whole
    part always, the fractional part by chance), so the train batches it feeds are
    ``replay_proportion / (1 + replay_proportion)`` replay. Off-policy learners (IMPALA's
    V-trace) correct for the older behaviour policy of the replayed batches.
    """

    state_key = "mix_in_replay"

    def __init__(self, num_slots: int, replay_proportion: float, seed: int | None = None) -> None:
        if num_slots < 1:
            raise FlowRLError(f"MixInReplay(num_slots={num_slots}): must be >= 1")
        if replay_proportion < 0:
            raise FlowRLError(f"MixInReplay(replay_proportion={replay_proportion}): must be >= 0")
        self.num_slots = num_slots
        self.replay_proportion = replay_proportion
        self.slots: list[Batch] = []
        self.next_slot = 0
        self.rng = np.random.default_rng(seed)

    def get_state(self) -> dict[str, Any]:
        """The sampling RNG, for checkpoints (the slots are not saved: they refill within ``num_slots`` batches)."""
        return {"rng": self.rng.bit_generator.state}

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`get_state`'s output."""
        self.rng.bit_generator.state = state["rng"]

    def __call__(self, batch: Batch) -> list[Batch]:
        whole = int(self.replay_proportion)
        num_replays = whole + int(self.rng.random() < self.replay_proportion - whole)
        replayed = [self.slots[i] for i in self.rng.integers(len(self.slots), size=num_replays)] if self.slots else []
        if len(self.slots) < self.num_slots:
            self.slots.append(batch)
        else:
            self.slots[self.next_slot] = batch
            self.next_slot = (self.next_slot + 1) % self.num_slots
        return [batch, *replayed]


class UpdatePriorities(Operator):
    """Set the replayed rows' new priorities where they were replayed from (pass-through).

    Consumes :class:`~flowrl.operators.train_ops.Trained` (TrainOneStep's, replayed from
    ``local_buffer``) or :class:`~flowrl.actors.Learned` (a learner thread's, replayed from
    the replay shard that is its ``source``) and hands their ``priorities`` (replayed rows'
    indexes and TD errors) to that buffer.
    """

    def __init__(self, local_buffer: LocalReplayBuffer | None = None) -> None:
        self.local_buffer = local_buffer

    def plan_links(self) -> list[ActorLink]:
        """Sends priorities back to the replay shards (nothing for a local buffer)."""
        return [] if self.local_buffer is not None else [ActorLink("ReplayActor", "update priorities")]

    def __call__(self, item: Trained | Learned) -> Trained | Learned:
        if not item.priorities:
            return item
        if self.local_buffer is not None:
            self.local_buffer.update_priorities(item.priorities)
        elif isinstance(item, Learned) and item.source is not None:
            item.source.update_priorities.remote(dict(item.priorities))
        else:
            raise FlowRLError("UpdatePriorities without local_buffer= needs Learned items whose source is a replay shard")
        return item


class ThrottleSampling:
    """Hold back sampling so that training keeps up: a transform for the sampling sub-flow.

    Once ``start_after`` steps were sampled, the next batch is pulled only while
    ``steps_sampled <= start_after + steps_trained / training_intensity``; otherwise it
    yields a not-ready marker, so an async union serves the learner's sub-flows until they
    have trained enough. Keeps the replay ratio of asynchronous plans (Ape-X) close to
    ``training_intensity`` whatever the relative speed of sampling and learning.
    """

    def __init__(self, training_intensity: float, start_after: int) -> None:
        if training_intensity <= 0:
            raise FlowRLError(f"ThrottleSampling(training_intensity={training_intensity}): must be > 0")
        self.training_intensity = training_intensity
        self.start_after = start_after

    def __call__(self, upstream: Iterator[Any]) -> Iterator[Any]:
        while True:
            counters = LocalIterator.get_metrics().counters
            allowed = self.start_after + counters[STEPS_TRAINED_COUNTER] / self.training_intensity
            if counters[STEPS_SAMPLED_COUNTER] > allowed:
                yield NextValueNotReady(waits_on_siblings=True)
                continue
            try:
                item = next(upstream)
            except StopIteration:
                return
            yield item
