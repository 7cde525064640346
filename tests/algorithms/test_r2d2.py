"""R2D2's loss and config: h(x), sequence priorities, burn-in, padding, config checks."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from flowrl.algorithms import get_algorithm
from flowrl.algorithms.r2d2 import inverse_value_rescale, r2d2_loss, sequence_priorities, value_rescale
from flowrl.data import SampleBatch
from flowrl.errors import ConfigError

pytestmark = pytest.mark.unit

OBS_SPACE = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
ACTIONS = gym.spaces.Discrete(2)


def policy_of(**config: Any) -> Any:
    algorithm = get_algorithm("r2d2")
    cfg = algorithm.config_class.from_dict(
        {"seed": 0, "num_workers": 0, "n_step": 2, "model": {"fcnet_hiddens": [8], "lstm_cell_size": 8}, **config}
    )
    policy = algorithm.make_policy(OBS_SPACE, ACTIONS, cfg).build()
    policy.update_target()
    return policy


def sequences(seq_lens: list[int], seed: int = 0, terminated_last: bool = False) -> dict[str, torch.Tensor]:
    """A replayed batch of sequences (rows in sequence order) with random steps and states."""
    rng = np.random.default_rng(seed)
    n = sum(seq_lens)
    terminateds = np.zeros(n, dtype=bool)
    if terminated_last:
        terminateds[-1] = True
    columns = {
        SampleBatch.OBS: rng.normal(size=(n, 3)).astype(np.float32),
        SampleBatch.NEW_OBS: rng.normal(size=(n, 3)).astype(np.float32),
        SampleBatch.ACTIONS: rng.integers(0, 2, n),
        SampleBatch.REWARDS: rng.normal(size=n).astype(np.float32),
        SampleBatch.TERMINATEDS: terminateds,
        SampleBatch.PREV_ACTIONS: rng.integers(0, 2, n),
        SampleBatch.PREV_REWARDS: rng.normal(size=n).astype(np.float32),
        SampleBatch.SEQ_LENS: np.array(seq_lens, dtype=np.int32),
        "state_in_0": rng.normal(size=(len(seq_lens), 8)).astype(np.float32),
        "state_in_1": rng.normal(size=(len(seq_lens), 8)).astype(np.float32),
    }
    return {key: torch.as_tensor(value) for key, value in columns.items()}


def part(batch: dict[str, torch.Tensor], k: int) -> dict[str, torch.Tensor]:
    """Sequence ``k`` of ``batch`` alone."""
    seq_lens = batch[SampleBatch.SEQ_LENS].long()
    start = int(seq_lens[:k].sum())
    end = start + int(seq_lens[k])
    return {
        key: value[k : k + 1] if key == SampleBatch.SEQ_LENS or key.startswith("state_in_") else value[start:end]
        for key, value in batch.items()
    }


def loss_of(policy: Any, batch: dict[str, torch.Tensor]) -> Any:
    return r2d2_loss(policy, policy.model, policy.dist_class, batch)


def test_value_rescaling_round_trips_and_squashes() -> None:
    x = torch.linspace(-500, 500, 1001, dtype=torch.float64)
    assert torch.allclose(inverse_value_rescale(value_rescale(x, 1e-3), 1e-3), x, atol=1e-6)
    assert torch.allclose(value_rescale(inverse_value_rescale(x / 50, 1e-2), 1e-2), x / 50, atol=1e-9)
    assert float(value_rescale(torch.tensor(99.0), 0.0)) == pytest.approx(9.0)  # sqrt(100) - 1


def test_a_sequence_priority_is_eta_max_plus_one_minus_eta_mean_over_its_learned_steps() -> None:
    abs_td = torch.tensor([[1.0, 3.0, 100.0], [2.0, 2.0, 2.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])  # the 100 is padding
    priorities = sequence_priorities(abs_td, mask, eta=0.9)
    assert priorities.tolist() == pytest.approx([0.9 * 3 + 0.1 * 2, 2.0])


def test_burn_in_steps_give_no_gradient_and_no_loss() -> None:
    policy = policy_of(replay_burn_in=3, replay_sequence_length=8, rollout_fragment_length=8)
    batch = sequences([8, 6])
    batch[SampleBatch.OBS].requires_grad_(True)
    out = loss_of(policy, batch)
    out.loss.backward()
    grads = batch[SampleBatch.OBS].grad.abs().sum(dim=1)
    burn_in = np.r_[0:3, 8:11]
    assert torch.all(grads[burn_in] == 0), "the burn-in warms the state without gradient"
    assert torch.all(grads[np.r_[3:8, 11:14]] > 0)
    assert out.stats["learned_steps"] == (8 - 3) + (6 - 3)
    # A burn-in step's action and reward are in no loss term; a learned step's are.
    changed = {key: value.detach().clone() for key, value in batch.items()}
    changed[SampleBatch.ACTIONS][burn_in] = 1 - changed[SampleBatch.ACTIONS][burn_in]
    changed[SampleBatch.REWARDS][burn_in] += 10.0
    assert float(loss_of(policy, changed).loss.detach()) == pytest.approx(float(out.loss.detach()), rel=1e-6)
    changed[SampleBatch.REWARDS][5] += 10.0
    assert float(loss_of(policy, changed).loss.detach()) != pytest.approx(float(out.loss.detach()), rel=1e-3)
    # The state the burn-in warms is the one learning reads: without burn-in the loss differs.
    unburnt = policy_of(replay_burn_in=0, replay_sequence_length=8, rollout_fragment_length=8)
    unburnt.set_weights(policy.get_weights())
    unburnt.update_target()
    assert float(loss_of(unburnt, batch).loss.detach()) != pytest.approx(float(out.loss.detach()), rel=1e-3)


def test_a_sequence_that_starts_its_episode_is_learned_from_its_first_step() -> None:
    """Its stored state is the episode's initial state, which needs no burn-in: every step is learned."""
    policy = policy_of(replay_burn_in=3, replay_sequence_length=8, rollout_fragment_length=8)
    batch = sequences([8, 6])
    batch[SampleBatch.T] = torch.as_tensor(np.r_[0:8, 20:26])  # the first starts its episode, the second not
    batch[SampleBatch.OBS].requires_grad_(True)
    out = loss_of(policy, batch)
    out.loss.backward()
    grads = batch[SampleBatch.OBS].grad.abs().sum(dim=1)
    assert torch.all(grads[0:8] > 0) and torch.all(grads[8:11] == 0) and torch.all(grads[11:14] > 0)
    assert out.stats["learned_steps"] == 8 + (6 - 3)
    unburnt = policy_of(replay_burn_in=0, replay_sequence_length=8, rollout_fragment_length=8)
    unburnt.set_weights(policy.get_weights())
    unburnt.update_target()
    first = {key: value.detach() for key, value in part(batch, 0).items()}
    assert float(loss_of(policy, first).loss.detach()) == pytest.approx(float(loss_of(unburnt, first).loss.detach()))


def test_padded_steps_are_masked_out_of_the_loss_and_priorities() -> None:
    policy = policy_of(replay_burn_in=1, replay_sequence_length=10, rollout_fragment_length=10)
    batch = sequences([7, 3, 10], terminated_last=True)
    together = loss_of(policy, batch)
    alone = [loss_of(policy, part(batch, k)) for k in range(3)]
    steps = [out.stats["learned_steps"] for out in alone]
    assert steps == [6, 2, 9] and together.stats["learned_steps"] == sum(steps)
    # The mean over the real learned steps of all sequences: each alone, weighted by its steps.
    expected = sum(float(out.loss.detach()) * n for out, n in zip(alone, steps)) / sum(steps)
    assert float(together.loss.detach()) == pytest.approx(expected, rel=1e-5)
    # One priority per sequence, the same as alone, on each of its rows.
    priorities = together.td_error
    assert priorities.shape == (20,)
    assert priorities[:7].tolist() == pytest.approx([float(alone[0].td_error[0])] * 7, rel=1e-5)
    assert priorities[7:10].tolist() == pytest.approx([float(alone[1].td_error[0])] * 3, rel=1e-5)
    assert priorities[10:].tolist() == pytest.approx([float(alone[2].td_error[0])] * 10, rel=1e-5)


def test_a_batch_of_sequences_no_longer_than_the_burn_in_learns_nothing() -> None:
    """Short episodes replay sequences that end within the burn-in: none of their steps is learned."""
    policy = policy_of(replay_burn_in=3, replay_sequence_length=8, rollout_fragment_length=8)
    for batch in (sequences([3, 2]), {**sequences([3, 2]), "weights": torch.full((5,), 0.5)}):
        out = loss_of(policy, batch)
        assert float(out.loss.detach()) == 0.0 and out.stats["learned_steps"] == 0.0
        assert out.td_error.tolist() == [0.0] * 5  # priority 0: a sequence with no learned step


def test_importance_weights_scale_each_sequence_once() -> None:
    policy = policy_of()
    batch = sequences([5, 5])
    plain = float(loss_of(policy, batch).loss.detach())
    batch["weights"] = torch.tensor([2.0] * 5 + [2.0] * 5)
    assert float(loss_of(policy, batch).loss.detach()) == pytest.approx(2 * plain, rel=1e-5)


def test_config_checks_name_the_values() -> None:
    config_class = get_algorithm("r2d2").config_class
    with pytest.raises(ConfigError, match="replay_burn_in=20 >= replay_sequence_length=20"):
        config_class.from_dict({"replay_burn_in": 20, "replay_sequence_length": 20})
    with pytest.raises(ConfigError, match="rollout_fragment_length=10 < replay_sequence_length=20"):
        config_class.from_dict({"rollout_fragment_length": 10, "replay_sequence_length": 20})
    with pytest.raises(ConfigError, match="PerWorkerEpsilonGreedy.*num_workers=0"):
        config_class.from_dict({"num_workers": 0, "exploration_config": {"type": "PerWorkerEpsilonGreedy"}})


def test_the_policy_threads_its_state_and_accepts_rllibs_use_lstm() -> None:
    policy = policy_of(model={"fcnet_hiddens": [8], "lstm_cell_size": 8, "use_lstm": True})
    assert [s.shape for s in policy.get_initial_state()] == [(8,), (8,)]
    obs = np.zeros((2, 3), np.float32)
    state = [np.zeros((2, 8), np.float32)] * 2
    _, extra = policy.compute_actions(obs, state=state, explore=False)
    assert extra["state_out_0"].shape == (2, 8) and not np.allclose(extra["state_out_1"], 0)
    assert policy.max_seq_len == 10  # half of replay_sequence_length=20: the windows overlap by half
