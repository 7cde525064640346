"""A recurrent policy's batches shared by a learner group and shuffled into minibatches keep every
sequence whole: each replica's shard is whole sequences (and whole fragments for V-trace), and
minibatch SGD moves a fragment's sequences with it."""

from __future__ import annotations

import numpy as np
import pytest

from flowrl.data import SampleBatch
from flowrl.data.sequences import chop_into_sequences
from flowrl.policy.data_parallel import Shard
from flowrl.policy.sgd import minibatch_sgd

pytestmark = pytest.mark.unit


def sequences(seq_lens: list[int]) -> SampleBatch:
    """Rows numbered 0..n-1; each sequence's state_in_0 is the number of its first row."""
    n = sum(seq_lens)
    starts = np.concatenate([[0], np.cumsum(seq_lens)[:-1]])
    return SampleBatch(
        {
            SampleBatch.OBS: np.arange(n, dtype=np.float32),
            f"{SampleBatch.STATE_IN}0": starts.astype(np.float32),
            SampleBatch.SEQ_LENS: np.array(seq_lens, np.int32),
        }
    )


def assert_whole_sequences(part: SampleBatch) -> None:
    """Each sequence's rows are consecutive from the row its state_in names."""
    for start, length, first in zip(part.sequence_bounds()[:-1], part[SampleBatch.SEQ_LENS], part["state_in_0"]):
        np.testing.assert_array_equal(part[SampleBatch.OBS][start : start + length], first + np.arange(length))


@pytest.mark.parametrize("size", [2, 3, 4])
@pytest.mark.parametrize("seed", range(5))
def test_learner_group_shards_never_split_a_sequence(size: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    seq_lens = rng.integers(1, 9, rng.integers(size, 40)).tolist()
    batch = sequences(seq_lens)
    shards = [Shard(rank, size).rows(batch) for rank in range(size)]
    # Together the shards are the batch in order; each is whole sequences and none is empty.
    np.testing.assert_array_equal(np.concatenate([s[SampleBatch.OBS] for s in shards]), batch[SampleBatch.OBS])
    np.testing.assert_array_equal(np.concatenate([s[SampleBatch.SEQ_LENS] for s in shards]), seq_lens)
    for shard in shards:
        assert len(shard[SampleBatch.SEQ_LENS]) >= 1
        assert_whole_sequences(shard)
    if len(seq_lens) >= 4 * size:  # enough sequences: each share is within a sequence of an even one
        for shard in shards:
            assert abs(shard.count - batch.count / size) <= max(seq_lens)


def test_shards_of_fragments_cut_where_a_fragment_starts() -> None:
    # Three fragments of 6 rows, each cut into sequences by its episodes.
    batch = sequences([2, 4, 6, 1, 1, 4])
    shards = [Shard(rank, 2).rows(batch, sequence_length=6) for rank in range(2)]
    assert [s.count for s in shards] == [6, 12]
    assert Shard(0, 1).rows(batch, 6).count == 18
    with pytest.raises(ValueError, match="cannot be shared by 4 learners"):
        Shard(0, 4).rows(batch, sequence_length=6)


def test_too_few_sequences_for_the_learners_is_an_error_naming_them() -> None:
    with pytest.raises(ValueError, match=r"2 sequences .* cannot be shared by 3 learners"):
        Shard(0, 3).rows(sequences([5, 5]))


class Recorder:
    """A stand-in learner that keeps the minibatches it is given."""

    def __init__(self) -> None:
        self.minibatches: list[SampleBatch] = []

    def learn_on_batch(self, batch: SampleBatch) -> dict[str, float]:
        self.minibatches.append(batch)
        return {}


def test_minibatches_of_fragments_move_each_fragments_sequences_with_it() -> None:
    # Four fragments of 8 rows (V-trace's runs), each cut into sequences of at most 3 rows.
    pieces = [[8], [5, 3], [2, 6], [1, 7]]
    fragments = []
    for f, episodes in enumerate(pieces):
        start = 8 * f
        for length in episodes:
            rows = start + np.arange(length, dtype=np.float32)
            piece = SampleBatch(
                {SampleBatch.OBS: rows, f"{SampleBatch.STATE_IN}0": rows, f"{SampleBatch.STATE_OUT}0": rows + 1}
            )
            fragments.append(chop_into_sequences(piece, 3))
            start += length
    batch = SampleBatch(
        {k: np.concatenate([piece[k] for piece in fragments]) for k in fragments[0] if k != "state_out_0"}
    )
    learner = Recorder()
    minibatch_sgd(learner, batch, num_sgd_iter=3, sgd_minibatch_size=16, seed=0, sequence_length=8)
    assert len(learner.minibatches) == 6
    orders = set()
    for minibatch in learner.minibatches:
        assert minibatch.count == 16
        assert_whole_sequences(minibatch)
        firsts = minibatch[SampleBatch.OBS][::8]
        assert all(first % 8 == 0 for first in firsts)  # whole fragments
        orders.add(tuple(firsts))
    assert len(orders) > 1  # shuffled
