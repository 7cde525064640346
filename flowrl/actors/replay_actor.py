"""A replay buffer shard as a Ray actor (one shard of the Ape-X replay tier: :mod:`flowrl.actors.replay_shards`)."""

from __future__ import annotations

import time
from typing import Any, Iterator, Mapping

import ray

from flowrl.data import LocalReplayBuffer, MultiAgentBatch, SampleBatch
from flowrl.iterators import ParallelIteratorWorker

Batch = SampleBatch | MultiAgentBatch


@ray.remote(num_cpus=0)
class ReplayActor(ParallelIteratorWorker):
    """A :class:`~flowrl.data.LocalReplayBuffer` as a Ray actor: ``ReplayActor.remote(capacity=..., ...)``.

    Takes the buffer's arguments (``capacity``, ``learning_starts``, ``replay_batch_size``,
    the ``prioritized_replay_*`` settings, ``prioritized``, ``seed``) for this shard alone, and
    ``time_handoffs`` (the X-ray's timing of Ray's serialization of replayed batches, ``profile``);
    :func:`create_replay_actors` splits a whole replay tier over several. As a
    :class:`~flowrl.iterators.ParallelIteratorWorker` its shard yields replayed batches
    forever; while it has fewer than ``learning_starts`` steps it waits ``empty_wait_s`` and
    yields None (filtered by :func:`flowrl.operators.Replay`), so a gather over idle shards
    costs a few calls per second, not a spin.
    """

    def __init__(self, *, empty_wait_s: float = 0.01, time_handoffs: bool = True, **buffer_args: Any) -> None:
        self.buffer = LocalReplayBuffer(**buffer_args)
        self.empty_wait_s = empty_wait_s
        # Seconds spent storing and replaying (the X-ray's busy time of a shard), and Ray's serializing of the
        # replayed batches its shard returned (handoff_s).
        self.add_s = 0.0
        self.sample_s = 0.0
        super().__init__(self._replay_forever)
        self.time_handoffs = time_handoffs

    def _replay_forever(self) -> Iterator[Batch | None]:
        while True:
            batch = self.replay()
            if batch is None:
                # Actor calls run one at a time: a short wait, not a loop, keeps add_batch flowing.
                time.sleep(self.empty_wait_s)
            yield batch

    def add_batch(self, batch: Batch) -> None:
        """Store a batch of experience."""
        started = time.perf_counter()
        self.buffer.add_batch(batch)
        self.add_s += time.perf_counter() - started

    def replay(self) -> Batch | None:
        """One replayed batch, or None before ``learning_starts``."""
        started = time.perf_counter()
        batch = self.buffer.replay()
        self.sample_s += time.perf_counter() - started
        return batch

    def update_priorities(self, prio_dict: Mapping[str, tuple[Any, Any]]) -> None:
        """Set priorities from TD errors: ``{policy_id: (batch_indexes, td_errors)}``."""
        self.buffer.update_priorities(prio_dict)

    def stats(self) -> dict[str, Any]:
        """The buffer's statistics, the seconds spent storing, replaying and serializing replayed batches
        so far, and the Ray node this shard runs on (``node_id``)."""
        return {
            **self.buffer.stats(),
            "add_time_total_s": self.add_s,
            "sample_time_total_s": self.sample_s,
            "serialize_time_total_s": self.handoff_s,
            "node_id": ray.get_runtime_context().get_node_id(),
        }

    def get_state(self, include_contents: bool = False) -> dict[str, Any]:
        """The buffer's state (optionally with its contents)."""
        return self.buffer.get_state(include_contents=include_contents)

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`get_state`'s output."""
        self.buffer.set_state(state)

    def ping(self) -> str:
        """Answer a health check."""
        return "pong"
