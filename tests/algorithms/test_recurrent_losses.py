"""PG, A2C, IMPALA and APPO over a recurrent policy's sequences: each loss over padded sequences equals
the loss over the sequences' steps run one sequence at a time (no padding at all), and V-trace reads a
fragment's second episode from the reset state and bootstraps from the state after a sequence's last step."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from flowrl.algorithms import appo, impala
from flowrl.algorithms.a2c import A2CConfig, actor_critic_loss, make_actor_critic_policy
from flowrl.algorithms.appo import APPOConfig, appo_loss, make_appo_policy
from flowrl.algorithms.impala import ImpalaConfig, impala_loss, make_impala_policy
from flowrl.algorithms.pg import PGConfig, make_pg_policy, pg_loss
from flowrl.data import SampleBatch
from flowrl.policy import TorchPolicy
from flowrl.policy.recurrent import RecurrentActorCritic
from flowrl.policy.vtrace import FragmentOutputs, fragment_outputs

pytestmark = pytest.mark.unit

OBS_SPACE = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
LSTM = {"use_lstm": True, "lstm_cell_size": 8, "max_seq_len": 4, "fcnet_hiddens": [8]}
PREV = {"lstm_use_prev_action": True, "lstm_use_prev_reward": True, "vf_share_layers": True}
HORIZON = 6
# Two fragments of HORIZON rows: the first with an episode truncated after 3 steps and one that
# goes on (cut at max_seq_len=4 would not apply: 3 rows), the second cut at max_seq_len into 4 + 2.
SEQ_LENS = [3, 3, 4, 2]
TRUNCATED_ROWS = [2]


def build(make: Any, config_class: Any, **model: Any) -> TorchPolicy[Any]:
    config = config_class.from_dict(
        {"seed": 0, "rollout_fragment_length": HORIZON, "model": {**LSTM, **model}}
    ).frozen()
    torch.manual_seed(0)
    policy = make(OBS_SPACE, gym.spaces.Discrete(2), config).build()
    assert isinstance(policy, TorchPolicy) and policy.is_recurrent
    return policy


def sequence_batch(policy: TorchPolicy[Any], seq_lens: list[int], seed: int = 0) -> SampleBatch:
    """Random columns of a batch cut into ``seq_lens`` (what the four losses read)."""
    rng = np.random.default_rng(seed)
    n = sum(seq_lens)
    truncateds = np.zeros(n, bool)
    truncateds[TRUNCATED_ROWS] = True
    return SampleBatch(
        {
            SampleBatch.OBS: rng.uniform(-1, 1, (n, 3)).astype(np.float32),
            SampleBatch.NEW_OBS: rng.uniform(-1, 1, (n, 3)).astype(np.float32),
            SampleBatch.ACTIONS: rng.integers(0, 2, n),
            SampleBatch.REWARDS: rng.normal(size=n).astype(np.float32),
            SampleBatch.TERMINATEDS: np.zeros(n, bool),
            SampleBatch.TRUNCATEDS: truncateds,
            SampleBatch.ACTION_LOGP: np.log(rng.uniform(0.3, 0.7, n)).astype(np.float32),
            SampleBatch.ADVANTAGES: rng.normal(size=n).astype(np.float32),
            SampleBatch.VALUE_TARGETS: rng.normal(size=n).astype(np.float32),
            SampleBatch.PREV_ACTIONS: rng.integers(0, 2, n),
            SampleBatch.PREV_REWARDS: rng.normal(size=n).astype(np.float32),
            **{
                f"{SampleBatch.STATE_IN}{k}": rng.normal(size=(len(seq_lens), *s.shape)).astype(np.float32)
                for k, s in enumerate(policy.get_initial_state())
            },
            SampleBatch.SEQ_LENS: np.array(seq_lens, np.int32),
        }
    )


def one_sequence_at_a_time(model: Any, batch: dict[str, torch.Tensor]) -> FragmentOutputs:
    """Each sequence run alone from its state_in, with its last row's next observation as one more
    step: the rows' outputs, and next values (the next row's value, or that extra step's)."""
    assert isinstance(model, RecurrentActorCritic)
    seq_lens = batch[SampleBatch.SEQ_LENS].tolist()
    bounds = np.concatenate([[0], np.cumsum(seq_lens)])
    logits, values, next_values = [], [], []
    with torch.no_grad():
        for j, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):

            def steps(key: str, then: str) -> torch.Tensor:
                return torch.cat([batch[key][a:b], batch[then][b - 1 : b]])[None]  # noqa: B023

            state = [batch[f"{SampleBatch.STATE_IN}{k}"][j : j + 1] for k in range(len(model.initial_state()))]
            dist_inputs, seq_values, _ = model.forward_sequences(
                steps(SampleBatch.OBS, SampleBatch.NEW_OBS),
                state,
                steps(SampleBatch.PREV_ACTIONS, SampleBatch.ACTIONS),
                steps(SampleBatch.PREV_REWARDS, SampleBatch.REWARDS),
            )
            logits.append(dist_inputs[0, :-1])
            values.append(seq_values[0, :-1])
            next_values.append(seq_values[0, 1:])
    return FragmentOutputs(torch.cat(logits), torch.cat(values), torch.cat(next_values))


def test_pg_and_a2c_losses_over_padded_sequences_equal_the_losses_over_their_steps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for make, config_class, loss_fn in [
        (make_pg_policy, PGConfig, pg_loss),
        (make_actor_critic_policy, A2CConfig, actor_critic_loss),
    ]:
        policy = build(make, config_class, **PREV)
        tensors = policy.to_tensors(sequence_batch(policy, [4, 1, 3, 2, 4]))
        padded = loss_fn(policy, policy.model, policy.dist_class, tensors)
        reference = one_sequence_at_a_time(policy.model, tensors)
        with monkeypatch.context() as patch:
            patch.setattr(policy, "model_outputs", lambda model, batch: (reference.dist_inputs, reference.values))
            unpadded = loss_fn(policy, policy.model, policy.dist_class, tensors)
        assert padded.stats.keys() == unpadded.stats.keys()
        for key, value in unpadded.stats.items():
            assert padded.stats[key] == pytest.approx(value, rel=1e-5, abs=1e-6), (loss_fn.__name__, key)


@pytest.mark.parametrize("model", [{}, PREV])
def test_fragment_outputs_over_padded_sequences_equal_each_sequence_run_alone(model: dict[str, Any]) -> None:
    policy = build(make_impala_policy, ImpalaConfig, **model)
    tensors = policy.to_tensors(sequence_batch(policy, SEQ_LENS))
    padded = fragment_outputs(policy, policy.model, tensors, HORIZON)
    reference = one_sequence_at_a_time(policy.model, tensors)
    for got, expected in zip(padded, reference):
        torch.testing.assert_close(got.detach(), expected, rtol=1e-5, atol=1e-6)


def test_impala_and_appo_losses_over_padded_sequences_equal_the_losses_over_their_steps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for module, make, config_class, loss_fn in [
        (impala, make_impala_policy, ImpalaConfig, impala_loss),
        (appo, make_appo_policy, APPOConfig, appo_loss),
    ]:
        policy = build(make, config_class, **PREV)
        if policy.target_model is not None:  # a target unlike the model, so that the ratio is not 1
            with torch.no_grad():
                for p in policy.target_model.parameters():
                    p.add_(0.1 * torch.randn_like(p))
        tensors = policy.to_tensors(sequence_batch(policy, SEQ_LENS))
        padded = loss_fn(policy, policy.model, policy.dist_class, tensors)
        reference = one_sequence_at_a_time(policy.model, tensors)
        with monkeypatch.context() as patch:
            patch.setattr(module, "fragment_outputs", lambda *args: reference)
            if policy.target_model is not None:
                target = one_sequence_at_a_time(policy.target_model, tensors)
                patch.setattr(policy, "model_outputs", lambda model, batch: (target.dist_inputs, target.values))
            unpadded = loss_fn(policy, policy.model, policy.dist_class, tensors)
        for key, value in unpadded.stats.items():
            assert padded.stats[key] == pytest.approx(value, rel=1e-5, abs=1e-6), (loss_fn.__name__, key)


def test_vtrace_reads_a_fragments_second_episode_from_the_reset_state() -> None:
    """One fragment, two episodes: the first (from the fragment's initial state) truncated after 3 steps,
    the second starting at row 3 from the reset state its sequence records."""
    policy = build(make_impala_policy, ImpalaConfig)
    model = policy.model
    assert isinstance(model, RecurrentActorCritic)
    batch = sequence_batch(policy, [3, 3])
    initial = policy.get_initial_state()
    for k, s in enumerate(initial):
        batch[f"{SampleBatch.STATE_IN}{k}"][1] = s  # the sampler's reset at the second episode's start
    tensors = policy.to_tensors(batch)
    with torch.no_grad():
        out = fragment_outputs(policy, model, tensors, HORIZON)
        obs, new_obs = tensors[SampleBatch.OBS], tensors[SampleBatch.NEW_OBS]
        fresh = [torch.as_tensor(s)[None] for s in initial]
        # The second episode alone from the reset state, with its last next observation.
        _, second, _ = model.forward_sequences(torch.cat([obs[3:], new_obs[5:]])[None], fresh)
        # Carried on from the first episode's state instead, its values would differ.
        first_state = [tensors[f"{SampleBatch.STATE_IN}{k}"][:1] for k in range(len(initial))]
        _, carried, _ = model.forward_sequences(torch.cat([obs, new_obs[5:]])[None], first_state)
        # The truncated row's bootstrap: its next observation after the first episode's steps.
        _, first, _ = model.forward_sequences(torch.cat([obs[:3], new_obs[2:3]])[None], first_state)
        _, from_scratch, _ = model.forward_sequences(new_obs[2:3][None], fresh)
    torch.testing.assert_close(out.values[3:], second[0, :3])
    torch.testing.assert_close(out.next_values[3:], second[0, 1:])
    assert not torch.allclose(out.values[3:], carried[0, 3:6], atol=1e-4)
    torch.testing.assert_close(out.next_values[2], first[0, 3])
    assert not torch.allclose(out.next_values[2], from_scratch[0, 0], atol=1e-4)


def test_padding_sequences_counts_as_loading_in_the_learn_times() -> None:
    policy = build(make_impala_policy, ImpalaConfig)
    tensors = policy.to_tensors(sequence_batch(policy, SEQ_LENS))
    times = policy.learn_times
    with times.updating():
        loaded = times.load_s
        policy.model_outputs(policy.model, tensors)
        after_outputs = times.load_s
        fragment_outputs(policy, policy.model, tensors, HORIZON)
    assert loaded < after_outputs < times.load_s
    assert times.update_s > 0  # the forward passes themselves are updating
