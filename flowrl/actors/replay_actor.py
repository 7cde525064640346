"""Replay buffer shards as Ray actors (the Ape-X replay tier)."""

from __future__ import annotations

import time
from typing import Any, Iterator, Mapping

import ray

from flowrl.data import LocalReplayBuffer, MultiAgentBatch, SampleBatch
from flowrl.iterators import ParallelIteratorWorker

Batch = SampleBatch | MultiAgentBatch


class ReplayActor(ParallelIteratorWorker):
    """One shard of a replay buffer split over ``num_shards`` actors.

    Capacity and ``learning_starts`` are divided by the number of shards. As a
    :class:`~flowrl.iterators.ParallelIteratorWorker` its shard yields replayed batches
    forever; while it has fewer than its share of ``learning_starts`` steps it waits
    ``empty_wait_s`` and yields None (filtered by :func:`flowrl.operators.Replay`), so a
    gather over idle shards costs a few calls per second, not a spin.
    """

    def __init__(
        self,
        num_shards: int,
        buffer_size: int,
        learning_starts: int,
        empty_wait_s: float = 0.01,
        **buffer_args: Any,
    ) -> None:
        # buffer_args: the other keyword arguments of LocalReplayBuffer (batch size, priorities, seed).
        self.buffer = LocalReplayBuffer(
            capacity=max(1, buffer_size // num_shards), learning_starts=learning_starts // num_shards, **buffer_args
        )
        self.empty_wait_s = empty_wait_s
        super().__init__(self._replay_forever)

    def _replay_forever(self) -> Iterator[Batch | None]:
        while True:
            batch = self.buffer.replay()
            if batch is None:
                # Actor calls run one at a time: a short wait, not a loop, keeps add_batch flowing.
                time.sleep(self.empty_wait_s)
            yield batch

    def add_batch(self, batch: Batch) -> None:
        """Store a batch of experience."""
        self.buffer.add_batch(batch)

    def replay(self) -> Batch | None:
        """One replayed batch, or None before ``learning_starts``."""
        return self.buffer.replay()

    def update_priorities(self, prio_dict: Mapping[str, tuple[Any, Any]]) -> None:
        """Set priorities from TD errors: ``{policy_id: (batch_indexes, td_errors)}``."""
        self.buffer.update_priorities(prio_dict)

    def stats(self) -> dict[str, Any]:
        """The buffer's statistics."""
        return self.buffer.stats()

    def get_state(self, include_contents: bool = False) -> dict[str, Any]:
        """The buffer's state (optionally with its contents)."""
        return self.buffer.get_state(include_contents=include_contents)

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`get_state`'s output."""
        self.buffer.set_state(state)


def create_replay_actors(num_shards: int, num_cpus: float = 0.0, **buffer_args: Any) -> list[Any]:
    """``num_shards`` :class:`ReplayActor` shards (``buffer_args`` as for its constructor)."""
    remote = ray.remote(num_cpus=num_cpus)(ReplayActor)
    seed = buffer_args.pop("seed", None)
    return [
        remote.remote(num_shards, seed=None if seed is None else seed + shard, **buffer_args) for shard in range(num_shards)
    ]
