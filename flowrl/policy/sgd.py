"""Minibatch SGD over a train batch: the epochs-of-minibatches loop PPO, IMPALA and APPO share."""

from __future__ import annotations

import contextlib

import numpy as np

from flowrl.data import SampleBatch
from flowrl.policy.data_parallel import Shard
from flowrl.policy.policy import NONFINITE_UPDATE, Policy
from flowrl.policy.protocols import BatchLearner


def _shuffle_sequences(batch: SampleBatch, sequence_length: int, rng: np.random.Generator) -> SampleBatch:
    """A copy with whole runs of ``sequence_length`` rows in a random order (rows inside a run keep theirs)."""
    if sequence_length == 1:
        return batch.shuffle(rng)  # whole sequences, in a batch cut into them
    order = rng.permutation(batch.count // sequence_length)
    rows = (order[:, None] * sequence_length + np.arange(sequence_length)).reshape(-1)
    if SampleBatch.SEQ_LENS not in batch:
        return SampleBatch({k: v[rows] for k, v in batch.items()})
    # A run's sequences move with it (sequences never cross a run's start: a fragment's).
    starts = batch.sequence_bounds()[:-1]
    sequences = np.argsort(np.argsort(order)[starts // sequence_length], kind="stable")
    return SampleBatch({k: v[sequences if batch.is_sequence_column(k) else rows] for k, v in batch.items()})


def _minibatch_bounds(epoch: SampleBatch, size: int) -> list[tuple[int, int]]:
    """Row ranges of the minibatches of ``epoch``: ``size`` rows each, or, in a batch cut into
    sequences, whole sequences from the first boundary at or after each multiple of ``size``."""
    count = epoch.count
    if SampleBatch.SEQ_LENS not in epoch:
        starts = list(range(0, count, size))
    else:
        bounds = epoch.sequence_bounds()
        starts = sorted(set(bounds[np.searchsorted(bounds, np.arange(0, count, size))].tolist()) - {count})
    return list(zip(starts, [*starts[1:], count]))


def minibatch_sgd(
    policy: BatchLearner,
    batch: SampleBatch,
    num_sgd_iter: int,
    sgd_minibatch_size: int,
    seed: int | list[int] | None = None,
    sequence_length: int = 1,
    shard: Shard | None = None,
) -> dict[str, float]:
    """``num_sgd_iter`` epochs over ``batch`` in shuffled minibatches; returns mean learner stats.

    With ``sgd_minibatch_size`` 0 (or not smaller than the batch), each epoch is one step
    on the whole batch. A trailing minibatch smaller than half the size is skipped.
    ``sequence_length`` > 1 keeps runs of that many rows together (the fixed-length
    fragments V-trace reads time-major): the batch must hold whole runs, and the
    minibatch size is rounded down to whole runs (at least one). A batch cut into sequences
    (a recurrent policy's, with ``seq_lens``) shuffles whole sequences and cuts its minibatches
    at sequence boundaries only.

    The means are over the updates the policy applied (over all, if it skipped every one
    for a non-finite value); ``nonfinite_update`` is then the fraction it skipped.

    A replica of a learner group passes its ``shard``: it makes the same epochs and shuffles
    (the same ``seed``) and learns on its share of each minibatch (see
    :mod:`flowrl.policy.data_parallel`).
    """
    if sequence_length < 1 or batch.count % sequence_length:
        raise ValueError(
            f"minibatch_sgd: a batch of {batch.count} rows does not split into runs of "
            f"sequence_length={sequence_length}"
        )
    rng = np.random.default_rng(seed)
    applied: list[dict[str, float]] = []
    skipped: list[dict[str, float]] = []
    size = sgd_minibatch_size if 0 < sgd_minibatch_size < batch.count else batch.count
    size = max(sequence_length, size - size % sequence_length)
    # A Policy counts the seconds spent getting minibatches ready; a stand-in with only learn_on_batch need not.
    loading = policy.learn_times.loading if isinstance(policy, Policy) else contextlib.nullcontext
    for _ in range(num_sgd_iter):
        with loading():
            epoch = _shuffle_sequences(batch, sequence_length, rng) if size < batch.count else batch
        for start, stop in _minibatch_bounds(epoch, size):
            with loading():
                minibatch = epoch.slice(start, stop)
            if minibatch.count < max(1, size // 2):
                continue
            if shard is not None:
                with loading():
                    minibatch = shard.rows(minibatch, sequence_length)
            stats = policy.learn_on_batch(minibatch)
            (skipped if stats.get(NONFINITE_UPDATE) else applied).append(stats)
    averaged = applied or skipped
    keys = dict.fromkeys(key for stats in averaged for key in stats)  # in first-seen order
    means = {key: sum(float(stats[key]) for stats in averaged if key in stats) / len(averaged) for key in keys}
    if skipped:
        means[NONFINITE_UPDATE] = len(skipped) / (len(applied) + len(skipped))
    return means
