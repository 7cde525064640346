"""A recurrent policy's sequence columns (``state_in_*``, ``seq_lens``) travel unchanged: through LZ4
compression and pickling, in multi-agent batches (concatenated and selected), and from a remote rollout
worker with ``compress_observations`` along a gather that names each batch's actor (``FromActor``)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from flowrl import Trainer
from flowrl.data import MultiAgentBatch, SampleBatch, concat_samples
from flowrl.data.sequences import chop_into_sequences
from flowrl.iterators import FromActor
from flowrl.operators import ParallelRollouts, SelectExperiences

pytestmark = pytest.mark.unit

STATE_0, STATE_1 = f"{SampleBatch.STATE_IN}0", f"{SampleBatch.STATE_IN}1"


def sequences(n: int, max_seq_len: int, state_sizes: tuple[int, ...], seed: int) -> SampleBatch:
    """``n`` steps of one episode cut into sequences, with per-sequence states as a recurrent sampler records."""
    rng = np.random.default_rng(seed)
    columns: dict[str, np.ndarray] = {
        SampleBatch.OBS: rng.integers(0, 255, (n, 6, 6), dtype=np.uint8),
        SampleBatch.NEW_OBS: rng.integers(0, 255, (n, 6, 6), dtype=np.uint8),
        SampleBatch.ACTIONS: rng.integers(0, 3, n),
        SampleBatch.PREV_ACTIONS: rng.integers(0, 3, n),
        SampleBatch.REWARDS: rng.normal(size=n).astype(np.float32),
    }
    for k, size in enumerate(state_sizes):
        columns[f"{SampleBatch.STATE_IN}{k}"] = rng.normal(size=(n, size)).astype(np.float32)
        columns[f"{SampleBatch.STATE_OUT}{k}"] = rng.normal(size=(n, size)).astype(np.float32)
    return chop_into_sequences(SampleBatch(columns), max_seq_len)


def assert_same(got: SampleBatch, want: SampleBatch) -> None:
    assert isinstance(got, SampleBatch) and set(got) == set(want) and got.count == want.count
    for key in want:
        assert got[key].dtype == want[key].dtype, key
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)


@pytest.mark.parametrize(
    "columns",
    [
        (SampleBatch.OBS, SampleBatch.NEW_OBS),  # what compress_observations compresses
        (SampleBatch.OBS, SampleBatch.NEW_OBS, STATE_0, STATE_1, SampleBatch.SEQ_LENS),
    ],
)
def test_lz4_keeps_the_sequence_columns_and_rows(columns: tuple[str, ...]) -> None:
    batch = sequences(11, 4, (5, 5), seed=0)
    assert batch[SampleBatch.SEQ_LENS].tolist() == [4, 4, 3] and batch[STATE_0].shape == (3, 5)
    packed = batch.copy().compress(columns)
    assert packed.is_compressed() and packed.count == 11
    shipped = pickle.loads(pickle.dumps(packed))  # as Ray ships a fragment
    assert shipped.count == 11
    assert_same(shipped.decompress_if_needed(), batch)
    # Compressed fragments concatenate into one batch of all their sequences.
    joined = concat_samples([batch.copy().compress(columns), sequences(6, 4, (5, 5), seed=1).compress(columns)])
    assert joined[SampleBatch.SEQ_LENS].tolist() == [4, 4, 3, 4, 2] and joined.count == 17
    np.testing.assert_array_equal(joined[STATE_1][:3], batch[STATE_1])


def test_multi_agent_batches_keep_each_policys_sequences_through_concat_and_select() -> None:
    def round_(seed: int) -> MultiAgentBatch:
        return MultiAgentBatch(
            {
                "lstm": sequences(7, 3, (4, 4), seed=seed),
                "gru": sequences(5, 8, (2,), seed=seed + 1),
                "mlp": SampleBatch({SampleBatch.OBS: np.zeros((9, 2), np.float32)}),
            },
            env_steps=9,
        )

    first, second = round_(0), round_(10)
    joined = concat_samples([first.copy().compress(), second.copy().compress()])
    assert isinstance(joined, MultiAgentBatch) and joined.env_steps() == 18
    joined.decompress_if_needed()
    lstm, gru = joined.policy_batches["lstm"], joined.policy_batches["gru"]
    assert lstm[SampleBatch.SEQ_LENS].tolist() == [3, 3, 1] * 2 and lstm.count == 14
    assert gru[SampleBatch.SEQ_LENS].tolist() == [5, 5] and gru[STATE_0].shape == (2, 2) and STATE_1 not in gru
    for pid in ("lstm", "gru"):
        for key in first.policy_batches[pid]:
            want = np.concatenate([first.policy_batches[pid][key], second.policy_batches[pid][key]])
            np.testing.assert_array_equal(joined.policy_batches[pid][key], want, err_msg=f"{pid}/{key}")
    selected = SelectExperiences(["gru", "mlp"])(joined)
    assert isinstance(selected, MultiAgentBatch) and set(selected.policy_batches) == {"gru", "mlp"}
    assert selected.policy_batches["gru"] is gru and selected.env_steps() == 18


def test_a_remote_workers_compressed_lstm_fragments_arrive_with_their_sequences(ray_session: None) -> None:
    trainer = Trainer(
        "ppo",
        "StatelessCartPole-v1",
        {
            "num_workers": 1,
            "num_envs_per_worker": 2,
            "rollout_fragment_length": 25,
            "train_batch_size": 50,
            "sgd_minibatch_size": 25,
            "compress_observations": True,
            "seed": 0,
            "model": {"use_lstm": True, "lstm_cell_size": 8, "max_seq_len": 10, "fcnet_hiddens": [8]},
        },
    )
    try:
        [remote] = trainer.workers.remote_workers()
        gathered = ParallelRollouts(trainer.workers, mode="raw").gather_async().zip_with_source_actor()
        items = [next(iter(gathered)) for _ in range(2)]
    finally:
        trainer.stop()
    for item in items:
        assert isinstance(item, FromActor) and item.actor == remote
        batch = item.item
        assert isinstance(batch, SampleBatch) and batch.is_compressed()
        seq_lens = batch[SampleBatch.SEQ_LENS]
        assert batch.count == 50 and seq_lens.max() <= 10 and seq_lens.sum() == 50
        assert [batch[f"{SampleBatch.STATE_IN}{k}"].shape for k in range(4)] == [(len(seq_lens), 8)] * 4
        batch.decompress_if_needed()
        assert batch[SampleBatch.OBS].shape == (50, 2) and batch.sequence_bounds()[-1] == 50
        # Each sequence that starts an episode starts from the initial state (zeros).
        starts = batch.sequence_bounds()[:-1]
        first_steps = np.isin(starts, np.flatnonzero(batch[SampleBatch.T] == 0))
        assert first_steps.any() and not batch[f"{SampleBatch.STATE_IN}0"][first_steps].any()
