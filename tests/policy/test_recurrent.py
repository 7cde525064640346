"""The recurrent model (``model.use_lstm``): padding sequences, PPO's loss over padded sequences, acting with
a state, sequence batches and minibatches cut at sequence boundaries, and the config's checks."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from flowrl.algorithms.ppo import PPOConfig, make_ppo_policy, ppo_loss
from flowrl.config import TrainerConfig
from flowrl.data import MultiAgentBatch, SampleBatch, concat_samples
from flowrl.data.sequences import chop_into_sequences
from flowrl.errors import ConfigError
from flowrl.policy import TorchPolicy
from flowrl.policy.recurrent import pad, step_mask, unpad
from flowrl.policy.sgd import minibatch_sgd

pytestmark = pytest.mark.unit

OBS_SPACE = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
LSTM = {"use_lstm": True, "lstm_cell_size": 8, "max_seq_len": 4, "fcnet_hiddens": [8]}


def lstm_policy(**model: Any) -> TorchPolicy[Any]:
    config = PPOConfig.from_dict({"seed": 0, "model": {**LSTM, **model}}).frozen()
    policy = make_ppo_policy(OBS_SPACE, gym.spaces.Discrete(2), config).build()
    assert isinstance(policy, TorchPolicy)
    return policy


def test_pad_and_unpad_round_trip() -> None:
    seq_lens = torch.tensor([3, 1, 4, 2])
    rows = torch.arange(10 * 2, dtype=torch.float32).reshape(10, 2)
    padded = pad(rows, seq_lens, 4)
    assert padded.shape == (4, 4, 2)
    np.testing.assert_array_equal(padded[1, 1:].numpy(), 0.0)  # padding after a sequence's end
    np.testing.assert_array_equal(padded[0, :3].numpy(), rows[:3].numpy())
    np.testing.assert_array_equal(unpad(padded, seq_lens).numpy(), rows.numpy())
    assert step_mask(seq_lens, 4).sum() == 10


def sequence_batch(policy: TorchPolicy[Any], seq_lens: list[int], seed: int = 0) -> SampleBatch:
    """A batch cut into sequences of ``seq_lens``, with random columns as PPO's loss reads them."""
    rng = np.random.default_rng(seed)
    n = sum(seq_lens)
    state = policy.get_initial_state()
    return SampleBatch(
        {
            SampleBatch.OBS: rng.uniform(-1, 1, (n, 3)).astype(np.float32),
            SampleBatch.ACTIONS: rng.integers(0, 2, n),
            SampleBatch.ACTION_LOGP: np.log(rng.uniform(0.3, 0.7, n)).astype(np.float32),
            SampleBatch.ACTION_DIST_INPUTS: rng.normal(size=(n, 2)).astype(np.float32),
            SampleBatch.VF_PREDS: rng.normal(size=n).astype(np.float32),
            SampleBatch.ADVANTAGES: rng.normal(size=n).astype(np.float32),
            SampleBatch.VALUE_TARGETS: rng.normal(size=n).astype(np.float32),
            SampleBatch.PREV_ACTIONS: rng.integers(0, 2, n),
            SampleBatch.PREV_REWARDS: rng.normal(size=n).astype(np.float32),
            **{
                f"{SampleBatch.STATE_IN}{k}": rng.normal(size=(len(seq_lens), *s.shape)).astype(np.float32)
                for k, s in enumerate(state)
            },
            SampleBatch.SEQ_LENS: np.array(seq_lens, np.int32),
        }
    )


@pytest.mark.parametrize(
    "model", [{}, {"vf_share_layers": True, "lstm_use_prev_action": True, "lstm_use_prev_reward": True}]
)
def test_the_loss_over_padded_sequences_equals_the_loss_over_their_steps(model: dict[str, Any]) -> None:
    policy = lstm_policy(**model)
    seq_lens = [4, 1, 3, 2, 4]
    batch = sequence_batch(policy, seq_lens)
    together = ppo_loss(policy, policy.model, policy.dist_class, policy.to_tensors(batch))
    # Each sequence alone: no padding at all (T is its own length); the row-weighted mean is the batch's.
    bounds = batch.sequence_bounds()
    alone = [
        ppo_loss(policy, policy.model, policy.dist_class, policy.to_tensors(batch.slice(a, b)))
        for a, b in zip(bounds[:-1], bounds[1:])
    ]
    weights = np.array(seq_lens) / sum(seq_lens)
    for key in ("policy_loss", "vf_loss", "kl", "entropy"):
        expected = sum(w * out.stats[key] for w, out in zip(weights, alone))
        assert together.stats[key] == pytest.approx(expected, rel=1e-5, abs=1e-6), key
    expected_loss = sum(w * float(out.loss.detach()) for w, out in zip(weights, alone))
    assert float(together.loss) == pytest.approx(expected_loss, rel=1e-5)


@pytest.mark.parametrize("path", ["numpy", "torch"])
def test_acting_step_by_step_gives_the_outputs_of_learning_over_the_sequence(path: str) -> None:
    policy = lstm_policy(lstm_use_prev_action=True, lstm_use_prev_reward=True)
    if path == "torch":
        policy._numpy_model = None  # the PyTorch step instead of the NumPy twin sampling acts with
    assert (policy._numpy_twin() is not None) == (path == "numpy")
    batch = sequence_batch(policy, [4])
    state = [s[None] for s in policy.get_initial_state()]
    batch = SampleBatch({**batch, **{f"{SampleBatch.STATE_IN}{k}": s for k, s in enumerate(state)}})
    logits, values = [], []
    for t in range(4):
        rows = slice(t, t + 1)
        _, extra = policy.compute_actions(
            batch[SampleBatch.OBS][rows],
            state=state,
            prev_actions=batch[SampleBatch.PREV_ACTIONS][rows],
            prev_rewards=batch[SampleBatch.PREV_REWARDS][rows],
        )
        state = [extra[f"{SampleBatch.STATE_OUT}{k}"] for k in range(len(state))]
        logits.append(extra[SampleBatch.ACTION_DIST_INPUTS][0])
        values.append(extra[SampleBatch.VF_PREDS][0])
    with torch.no_grad():
        learned, learned_values = policy.model_outputs(policy.model, policy.to_tensors(batch))
    np.testing.assert_allclose(learned.numpy(), np.array(logits), rtol=1e-5, atol=1e-6)
    assert learned_values is not None
    np.testing.assert_allclose(learned_values.numpy(), np.array(values), rtol=1e-5, atol=1e-6)


def test_a_feed_forward_policy_has_no_state_and_ignores_one() -> None:
    config = PPOConfig.from_dict({"seed": 0}).frozen()
    policy = make_ppo_policy(OBS_SPACE, gym.spaces.Discrete(2), config).build()
    assert policy.get_initial_state() == [] and not policy.is_recurrent
    _, extra = policy.compute_actions(np.zeros((2, 3), np.float32))
    assert not any(key.startswith(SampleBatch.STATE_OUT) for key in extra)


def test_pieces_are_cut_into_sequences_of_at_most_max_seq_len() -> None:
    n = 9
    piece = SampleBatch(
        {
            SampleBatch.T: np.arange(n),
            f"{SampleBatch.STATE_IN}0": np.arange(n, dtype=np.float32)[:, None],
            f"{SampleBatch.STATE_OUT}0": np.arange(1, n + 1, dtype=np.float32)[:, None],
        }
    )
    sequences = chop_into_sequences(piece, 4)
    np.testing.assert_array_equal(sequences[SampleBatch.SEQ_LENS], [4, 4, 1])
    np.testing.assert_array_equal(sequences[f"{SampleBatch.STATE_IN}0"][:, 0], [0, 4, 8])
    assert f"{SampleBatch.STATE_OUT}0" not in sequences and sequences.count == n


def small_sequence_batch(seq_lens: list[int], offset: int = 0) -> SampleBatch:
    n = sum(seq_lens)
    return SampleBatch(
        {
            SampleBatch.OBS: np.arange(offset, offset + n, dtype=np.float32),
            f"{SampleBatch.STATE_IN}0": np.array(seq_lens, np.float32)[:, None],
            SampleBatch.SEQ_LENS: np.array(seq_lens, np.int32),
        }
    )


def test_a_sequence_batch_slices_shuffles_concatenates_and_compresses_by_whole_sequences() -> None:
    batch = small_sequence_batch([2, 3, 1])
    assert batch.count == 6
    part = batch.slice(2, 6)
    np.testing.assert_array_equal(part[SampleBatch.SEQ_LENS], [3, 1])
    np.testing.assert_array_equal(part[f"{SampleBatch.STATE_IN}0"][:, 0], [3, 1])
    with pytest.raises(ValueError, match="cuts a sequence"):
        batch.slice(1, 6)
    shuffled = batch.shuffle(3)
    bounds = shuffled.sequence_bounds()
    for j, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):  # each sequence moved whole, with its state
        assert shuffled[f"{SampleBatch.STATE_IN}0"][j, 0] == b - a
        np.testing.assert_array_equal(np.diff(shuffled[SampleBatch.OBS][a:b]), 1)
    joined = concat_samples([batch, small_sequence_batch([4], offset=6)])
    np.testing.assert_array_equal(joined[SampleBatch.SEQ_LENS], [2, 3, 1, 4])
    assert joined.count == 10
    compressed = batch.copy().compress([SampleBatch.OBS, f"{SampleBatch.STATE_IN}0"])
    assert compressed.count == 6
    restored = compressed.decompress_if_needed()
    for key in batch:
        np.testing.assert_array_equal(restored[key], batch[key])
    multi = MultiAgentBatch.concat_samples([MultiAgentBatch({"p": batch}, 6), MultiAgentBatch({"p": batch}, 6)])
    np.testing.assert_array_equal(multi.policy_batches["p"][SampleBatch.SEQ_LENS], [2, 3, 1, 2, 3, 1])
    with pytest.raises(ValueError, match="seq_lens sum to"):
        SampleBatch({SampleBatch.OBS: np.zeros(5), SampleBatch.SEQ_LENS: np.array([2, 2])})


class RecordingLearner:
    def __init__(self) -> None:
        self.minibatches: list[SampleBatch] = []

    def learn_on_batch(self, batch: SampleBatch) -> dict[str, float]:
        self.minibatches.append(batch)
        return {}


def test_minibatches_are_cut_at_sequence_boundaries() -> None:
    seq_lens = [4, 3, 4, 1, 4, 2, 4, 4, 3, 4, 1, 4]
    batch = small_sequence_batch(seq_lens)
    learner = RecordingLearner()
    minibatch_sgd(learner, batch, num_sgd_iter=2, sgd_minibatch_size=10, seed=0)
    assert len(learner.minibatches) >= 4
    seen = 0
    for minibatch in learner.minibatches:
        assert int(minibatch[SampleBatch.SEQ_LENS].sum()) == minibatch.count >= 5
        bounds = minibatch.sequence_bounds()
        for j, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
            assert minibatch[f"{SampleBatch.STATE_IN}0"][j, 0] == b - a
            np.testing.assert_array_equal(np.diff(minibatch[SampleBatch.OBS][a:b]), 1)
        seen += minibatch.count
    assert seen >= 2 * batch.count - 2 * 5  # at most a short trailing minibatch per epoch is skipped


def test_use_lstm_with_an_algorithm_that_does_not_learn_from_sequences_names_ppo() -> None:
    with pytest.raises(
        ConfigError, match=r"model.use_lstm=True: TrainerConfig does not learn from sequences yet \(PPO"
    ):
        TrainerConfig.from_dict({"model": {"use_lstm": True}})


@pytest.mark.parametrize(
    ("model", "named"),
    [
        ({"lstm_cell_size": 0}, "lstm_cell_size=0"),
        ({"max_seq_len": 2.5}, "max_seq_len=2.5"),
        ({"use_lstm": "yes"}, "use_lstm='yes'"),
        ({"lstm_use_prev_reward": True, "custom_model": "torch.nn:Linear"}, "lstm_use_prev_reward feed the LSTM"),
    ],
)
def test_bad_lstm_options_are_config_errors(model: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        PPOConfig.from_dict({"model": model})
