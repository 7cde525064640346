"""Reading offline experiences as a plan's source: :func:`ReadOffline`."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol, cast

import numpy as np

from flowrl.data import DEFAULT_POLICY_ID, SampleBatch, concat_samples
from flowrl.errors import FlowRLError
from flowrl.iterators import LocalIterator, SharedMetrics
from flowrl.operators.rollout_ops import count_sampled

if TYPE_CHECKING:
    from flowrl.actors.protocols import WorkerSetLike
    from flowrl.data.offline import OfflineData
    from flowrl.policy.protocols import SamplingPolicy

#: Timers of :func:`ReadOffline` (seconds per training batch): waiting for rows from the files (reading and
#: decoding them), postprocessing them with the policy, and drawing shuffled batches.
READ_TIMER = "offline_read"
POSTPROCESS_TIMER = "offline_postprocess"
SHUFFLE_TIMER = "offline_shuffle"
#: Passes over the whole dataset begun so far.
EPOCHS_COUNTER = "num_offline_epochs"
#: Datasets whose rows take at most this many bytes decoded are read from the files once and kept in memory
#: for the later passes (starting a Ray Data read costs seconds); larger ones are streamed on every pass.
MEMORY_CACHE_BYTES = 512 * 2**20


class ReadConfig(Protocol):
    """What :func:`ReadOffline` reads of an algorithm's config."""

    @property
    def train_batch_size(self) -> int: ...
    @property
    def shuffle_buffer_size(self) -> int: ...
    @property
    def seed(self) -> int | None: ...


def episode_pieces(batch: SampleBatch) -> list[SampleBatch]:
    """``batch`` cut where its episode id changes (rows in file order keep an episode's steps together)."""
    if SampleBatch.EPS_ID not in batch or batch.count < 2:
        return [batch]
    ids = np.asarray(batch[SampleBatch.EPS_ID])
    cuts = (np.flatnonzero(ids[1:] != ids[:-1]) + 1).tolist()
    bounds = [0, *cuts, batch.count]
    return [batch.slice(start, stop) for start, stop in zip(bounds[:-1], bounds[1:])]


def _nothing_to_read(timeout: float | None) -> Iterator[SampleBatch]:
    raise FlowRLError("ReadOffline was built without experiences (a plan built for its graph): it reads nothing")
    yield  # a generator: the error comes when the plan is run


def ReadOffline(
    data: OfflineData | None, workers: WorkerSetLike, config: ReadConfig, *, policy_id: str = DEFAULT_POLICY_ID
) -> LocalIterator[SampleBatch]:
    """Training batches of ``config.train_batch_size`` rows from ``data``, for ever (pass after pass).

    Rows are read in file order, cut into episode pieces and postprocessed by the local worker's policy
    ``policy_id`` (returns, n-step: as if it had sampled them), then mixed in a buffer of
    ``config.shuffle_buffer_size`` rows. A dataset of at most :data:`MEMORY_CACHE_BYTES` decoded is read
    from the files once; later passes take its rows from memory (postprocessed again, by the policy as it is
    then). The rows read count as steps sampled; the reading, postprocessing and shuffling times are the
    ``offline_*`` timers, and passes begun the ``num_offline_epochs`` counter.
    ``data`` None: a plan built for its graph only (over placeholder actors), which reads nothing.
    """
    if data is None:
        return LocalIterator(_nothing_to_read, SharedMetrics(), name="ReadOffline(no input)")
    rows = config.train_batch_size
    # The local worker's policies sample too (with num_workers=0): they postprocess as samplers do.
    policy = cast("SamplingPolicy", workers.local_worker().get_policy(policy_id))
    rng = np.random.default_rng(config.seed)
    from flowrl.data.offline import ShuffleBuffer  # imported here: PyArrow only for plans that read files

    buffer = ShuffleBuffer(config.shuffle_buffer_size, rng)
    chunk = max(rows, config.shuffle_buffer_size // 2, 1)

    cache: list[SampleBatch] | None = [] if data.decoded_bytes <= MEMORY_CACHE_BYTES else None

    def one_pass(first: bool) -> Iterator[SampleBatch]:
        if cache is None or first:
            for read in data.iter_batches(chunk):
                if cache is not None:
                    cache.append(read)
                yield read
        else:
            yield from cache

    def batches(timeout: float | None) -> Iterator[SampleBatch]:
        metrics = LocalIterator.get_metrics()
        for epoch in itertools.count():
            metrics.counters[EPOCHS_COUNTER] += 1
            reader = one_pass(epoch == 0)
            while True:
                while buffer.wants(rows):
                    started = time.perf_counter()
                    read = next(reader, None)
                    metrics.timers[READ_TIMER].push(time.perf_counter() - started)
                    if read is None:
                        break
                    with metrics.timers[POSTPROCESS_TIMER]:
                        if policy.postprocesses:
                            pieces = [policy.postprocess_trajectory(piece) for piece in episode_pieces(read)]
                            read = concat_samples(pieces) if len(pieces) > 1 else pieces[0]
                    buffer.add(read)
                if len(buffer) < rows:
                    break  # the pass is over: the rows left wait for the next one's
                with metrics.timers[SHUFFLE_TIMER]:
                    batch = buffer.draw(rows)
                count_sampled(batch.count, batch.count)
                yield batch

    return LocalIterator(batches, SharedMetrics(), name=f"ReadOffline({data.describe()})")
