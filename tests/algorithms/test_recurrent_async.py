"""LSTM A3C, IMPALA and APPO with a remote rollout worker, LSTM A2C's microbatches and PG, and an LSTM learner
group: fragments of sequences reach the learners (through replay and aggregator actors too) and train."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from flowrl import Trainer
from flowrl.data import SampleBatch, concat_samples
from flowrl.operators import ConcatBatches, MixInReplay

LSTM = {"fcnet_hiddens": [16], "use_lstm": True, "lstm_cell_size": 16, "max_seq_len": 8}
SMALL = {
    "num_workers": 1,
    "num_cpus_per_worker": 0.25,
    "num_envs_per_worker": 2,
    "rollout_fragment_length": 16,
    "train_batch_size": 64,
    "timesteps_per_iteration": 128,
    "seed": 0,
    "model": LSTM,
}


def train(
    algo: str, config: dict[str, Any], iterations: int, until: Callable[[dict[str, Any]], bool] | None = None
) -> dict[str, Any]:
    """Train ``iterations`` times (or fewer, once ``until(result)``); the last result."""
    trainer = Trainer(algo, "StatelessCartPole-v1", config)
    try:
        before = trainer.workers.local_worker().get_policy().get_weights()
        for _ in range(iterations):
            result = trainer.train()
            if until is not None and until(result):
                break
        after = trainer.workers.local_worker().get_policy().get_weights()
        assert any(not np.array_equal(before[k], after[k]) for k in before)  # it learned
        assert result["num_worker_restarts"] == 0
        return result
    finally:
        trainer.stop()


@pytest.mark.integration
@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize(
    ("algo", "extra"),
    [
        ("a3c", {}),
        ("impala", {"replay_proportion": 1.0, "num_sgd_iter": 2, "sgd_minibatch_size": 32}),
        ("impala", {"num_aggregation_workers": 1, "num_cpus_per_aggregator": 0.1}),
        ("appo", {}),
        ("a2c", {"num_workers": 0, "microbatch_size": 32}),
        ("pg", {"num_workers": 0}),
    ],
)
def test_lstm_algorithms_train_on_sequences(algo: str, extra: dict[str, Any]) -> None:
    if not extra.get("replay_proportion"):
        result = train(algo, {**SMALL, **extra}, 3)
        assert result["timesteps_total"] > 0 and result["timesteps_trained"] > 0
        return

    # Each batch learns as many replayed steps as new ones, so the steps trained overtake the steps sampled
    # once the asynchronous learner has caught up with the sampling (which runs ahead by a bounded queue).
    def replayed(result: dict[str, Any]) -> bool:
        return result["timesteps_trained"] > result["timesteps_total"]

    result = train(algo, {**SMALL, **extra}, 20, until=replayed)
    assert replayed(result), (result["timesteps_trained"], result["timesteps_total"])


@pytest.mark.integration
@pytest.mark.timeout(180)
@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("algo", ["ppo", "impala"])
def test_an_lstm_learner_group_of_two_trains_on_whole_sequences(algo: str) -> None:
    config = {**SMALL, "num_learners": 2, "num_cpus_per_learner": 0.25, "sgd_minibatch_size": 32}
    if algo == "ppo":
        config["num_sgd_iter"] = 2
    result = train(algo, config, 2)
    assert result["timesteps_trained"] > 0


@pytest.mark.unit
def test_replayed_fragments_keep_their_sequence_columns() -> None:
    rng = np.random.default_rng(0)
    fragments = [
        SampleBatch(
            {
                SampleBatch.OBS: rng.normal(size=(6, 2)).astype(np.float32),
                f"{SampleBatch.STATE_IN}0": rng.normal(size=(2, 4)).astype(np.float32),
                SampleBatch.SEQ_LENS: np.array(seq_lens, np.int32),
            }
        )
        for seq_lens in ([4, 2], [1, 5])
    ]
    mix, concat = MixInReplay(num_slots=2, replay_proportion=1.0, seed=0), ConcatBatches(18)
    out = [batch for fragment in fragments for mixed in mix(fragment) for batch in concat(mixed)]
    # The first fragment, the second, then the first again (the one slot filled when the second came).
    expected = concat_samples([fragments[0], fragments[1], fragments[0]])
    assert len(out) == 1 and out[0].keys() == expected.keys()
    for key in expected:
        np.testing.assert_array_equal(out[0][key], expected[key])
    np.testing.assert_array_equal(out[0][SampleBatch.SEQ_LENS], [4, 2, 1, 5, 4, 2])
