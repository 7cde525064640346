"""Reading offline experiences as a plan's source: :func:`ReadOffline`."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from fractions import Fraction
from typing import TYPE_CHECKING, Any, Protocol, cast

import numpy as np

from flowrl.data import DEFAULT_POLICY_ID, SampleBatch, concat_samples
from flowrl.errors import FlowRLError
from flowrl.iterators import LocalIterator, SharedMetrics
from flowrl.operators.concurrency_ops import Concurrently
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
#: Passes over the whole dataset begun so far, and the rows read in them.
EPOCHS_COUNTER = "num_offline_epochs"
ROWS_READ_COUNTER = "num_offline_rows_read"
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
    @property
    def input_reader(self) -> str: ...


class MixConfig(ReadConfig, Protocol):
    """What :func:`MixInput` reads of an algorithm's config besides :class:`ReadConfig`'s keys."""

    @property
    def input(self) -> Any: ...
    def sampled_per_round(self) -> int: ...


#: The columns sampling gives every row (besides those the policy's acting adds).
SAMPLED_COLUMNS = frozenset(
    {
        SampleBatch.OBS,
        SampleBatch.ACTIONS,
        SampleBatch.REWARDS,
        SampleBatch.NEW_OBS,
        SampleBatch.TERMINATEDS,
        SampleBatch.TRUNCATEDS,
        SampleBatch.EPS_ID,
        SampleBatch.T,
        SampleBatch.ENV_ID,
    }
)


def as_sampled(batch: SampleBatch, policy: SamplingPolicy) -> SampleBatch:
    """Recorded rows with the columns ``policy``'s sampling gives its rows (a replay buffer holds one set).

    Columns its acting adds (e.g. ``action_logp``) that the data lacks are filled with its outputs for the
    data's observations (the value-based losses do not read them); columns it does not give are left out."""
    obs = batch[SampleBatch.OBS]
    _, extras = policy.compute_actions(obs[:1], explore=False)  # type: ignore[call-arg]  # which columns
    if not set(extras) <= set(batch):  # the policy's outputs for every row, only where the data lacks some
        _, extras = policy.compute_actions(obs, explore=False)  # type: ignore[call-arg]
    wanted = SAMPLED_COLUMNS | set(extras) | ({SampleBatch.ACTION_MASK, SampleBatch.NEXT_ACTION_MASK} & set(batch))
    return SampleBatch({key: batch[key] if key in batch else extras[key] for key in wanted})


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
    data: OfflineData | None,
    workers: WorkerSetLike,
    config: ReadConfig,
    *,
    policy_id: str = DEFAULT_POLICY_ID,
    rows: int | None = None,
    count_as_sampled: bool = True,
    like_sampled: bool = False,
) -> LocalIterator[SampleBatch]:
    """Batches of ``rows`` rows (default ``config.train_batch_size``) from ``data``, for ever (pass after pass).

    Rows are read in file order, cut into episode pieces and postprocessed by the local worker's policy
    ``policy_id`` (returns, n-step: as if it had sampled them), then mixed in a buffer of
    ``config.shuffle_buffer_size`` rows. A thread reads and decodes the files a few batches ahead of the
    plan (:class:`~flowrl.data.offline.BackgroundReader`). A dataset of at most :data:`MEMORY_CACHE_BYTES`
    decoded is read from the files once; later passes take its rows from memory (postprocessed again, by
    the policy as it is then).

    The rows read count as steps sampled (unless ``count_as_sampled`` is False: rows mixed with the
    sampler's) and as ``num_offline_rows_read``; the waiting for rows, postprocessing and shuffling times
    are the ``offline_*`` timers, and passes begun the ``num_offline_epochs`` counter. ``like_sampled``:
    the rows get the columns the policy's sampling gives (:func:`as_sampled`), to be stored with sampled
    ones. ``data`` None: a plan built for its graph only (over placeholder actors), which reads nothing.
    """
    if data is None:
        return LocalIterator(_nothing_to_read, SharedMetrics(), name="ReadOffline(no input)")
    rows = rows or config.train_batch_size
    # The local worker's policies sample too (with num_workers=0): they postprocess as samplers do.
    policy = cast("SamplingPolicy", workers.local_worker().get_policy(policy_id))
    rng = np.random.default_rng(config.seed)
    from flowrl.data.offline import BackgroundReader, ShuffleBuffer  # here: PyArrow only for plans reading files

    buffer = ShuffleBuffer(config.shuffle_buffer_size, rng)
    chunk = max(rows, config.shuffle_buffer_size // 2, 1)

    cache: list[SampleBatch] | None = [] if data.decoded_bytes <= MEMORY_CACHE_BYTES else None

    def reads(reader: BackgroundReader) -> Iterator[SampleBatch | None]:
        """Every pass's batches, each pass ending with None: the first from the files, in a reading thread;
        the later ones too, or from memory for a dataset small enough to keep (``cache``)."""
        for epoch in itertools.count():
            if cache is None or epoch == 0:
                while (read := reader.next()) is not None:
                    if cache is not None:
                        cache.append(read)
                    yield read
            else:
                yield from cache
            yield None

    def batches(timeout: float | None) -> Iterator[SampleBatch]:
        metrics = LocalIterator.get_metrics()
        reader = BackgroundReader(data, chunk, passes=1 if cache is not None else None, reader=config.input_reader)
        source = reads(reader)
        try:
            while True:
                metrics.counters[EPOCHS_COUNTER] += 1
                while True:
                    while buffer.wants(rows):
                        started = time.perf_counter()
                        read = next(source)
                        metrics.timers[READ_TIMER].push(time.perf_counter() - started)
                        if read is None:
                            break
                        with metrics.timers[POSTPROCESS_TIMER]:
                            if like_sampled:
                                read = as_sampled(read, policy)
                            if policy.postprocesses:
                                pieces = [policy.postprocess_trajectory(piece) for piece in episode_pieces(read)]
                                read = concat_samples(pieces) if len(pieces) > 1 else pieces[0]
                        buffer.add(read)
                    if len(buffer) < rows:
                        break  # the pass is over: the rows left wait for the next one's
                    with metrics.timers[SHUFFLE_TIMER]:
                        batch = buffer.draw(rows)
                    if count_as_sampled:
                        count_sampled(batch.count, batch.count)
                    metrics.counters[ROWS_READ_COUNTER] += batch.count
                    yield batch
        finally:
            reader.close()

    return LocalIterator(batches, SharedMetrics(), name=f"ReadOffline({data.describe()})")


def MixInput(
    rollouts: LocalIterator[SampleBatch],
    data: OfflineData | None,
    workers: WorkerSetLike,
    config: MixConfig,
) -> LocalIterator[SampleBatch]:
    """``rollouts`` alone, or, when ``config.input`` mixes the sampler with recorded experiences
    (``{"sampler": 0.5, DIR: 0.5}``), interleaved with batches of ``data`` (:func:`ReadOffline`, each as many
    rows as a rollout round: ``config.sampled_per_round()``) in the ratio of the fractions. Recorded rows do
    not count as steps sampled (``num_offline_rows_read`` counts them)."""
    if data is None or not isinstance(config.input, dict):
        return rollouts
    sampled = config.input["sampler"]
    recorded = sum(fraction for source, fraction in config.input.items() if source != "sampler")
    ratio = Fraction(sampled / recorded).limit_denominator(10)
    rows = config.sampled_per_round()
    offline = ReadOffline(data, workers, config, rows=rows, count_as_sampled=False, like_sampled=True)
    return Concurrently(
        [rollouts, offline], mode="round_robin", round_robin_weights=[ratio.numerator or 1, ratio.denominator]
    )
