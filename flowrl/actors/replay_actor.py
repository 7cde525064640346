"""A replay buffer shard as a Ray actor (one shard of the Ape-X replay tier: :mod:`flowrl.actors.replay_shards`)."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any, Iterator, Mapping

import ray

from flowrl.data import LocalReplayBuffer, MultiAgentBatch, SampleBatch
from flowrl.iterators import ParallelIteratorWorker
from flowrl.storage.array_files import ArrayFileReader, ArrayFileWriter

logger = logging.getLogger(__name__)

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

    def write_state(self, directory: str, prefix: str, include_contents: bool) -> tuple[dict[str, Any], dict[str, Any]]:
        """The buffer's state with its rows written into ``directory`` (a checkpoint being staged), and the marker
        entries of the files written there (``<prefix>.<n>.npy``).

        The rows go from the buffer's columns to the files a chunk at a time, in this one call: the state
        and the rows are of one moment, and no copy of them is made. A shard that cannot see ``directory``
        (on another node, without a filesystem the nodes share) returns its rows in the state instead.
        """
        if not include_contents:
            return self.buffer.get_state(), {}
        if not Path(directory).is_dir():
            logger.warning(
                "replay shard on node %s cannot see the checkpoint directory %s: its rows go through the driver "
                "(keep runs on storage every node mounts, --storage-path, to write them directly)",
                ray.get_runtime_context().get_node_id(),
                directory,
            )
            return self.buffer.get_state(include_contents=True), {}
        writer = ArrayFileWriter(Path(directory), prefix)
        return self.buffer.get_state(include_contents=True, write_column=writer), writer.entries

    def set_state(self, state: Mapping[str, Any] | None, directory: str | None = None) -> None:
        """Restore :meth:`get_state`'s or :meth:`write_state`'s output; rows written to files are read back
        from the checkpoint ``directory``, a chunk at a time. None (a checkpoint saved while this shard was
        dead, past its restart cap) leaves the buffer as it is: empty in a new run."""
        if state is None:
            logger.warning(
                "replay shard: the checkpoint holds none of its rows (it was dead when saved): it starts empty"
            )
            return
        self.buffer.set_state(state, read_column=None if directory is None else ArrayFileReader(Path(directory)))

    def pid(self) -> int:
        """This shard's process id (to watch its memory)."""
        return os.getpid()

    def ping(self) -> str:
        """Answer a health check."""
        return "pong"
