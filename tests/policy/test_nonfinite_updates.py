"""Updates with a non-finite loss or gradient are skipped, counted, and fail the run past a cap (no Ray)."""

from __future__ import annotations

import copy
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from flowrl.algorithms.ddpg import TD3Config, make_ddpg_policy
from flowrl.config import TrainerConfig
from flowrl.data import SampleBatch
from flowrl.errors import NonFiniteUpdateError
from flowrl.policy import LossOutput, TorchPolicy
from flowrl.policy.policy import NONFINITE_UPDATE, LearnOutput
from flowrl.policy.postprocessing import DISCOUNTS
from flowrl.policy.sgd import minibatch_sgd

pytestmark = pytest.mark.unit

CARTPOLE = gym.make("CartPole-v1")


def pg_loss(policy: TorchPolicy, model: torch.nn.Module, dist_class: Any, batch: dict[str, torch.Tensor]) -> LossOutput:
    """Policy gradient on the rewards plus a value regression onto them: any NaN in the batch reaches the loss."""
    logits, values = model(batch[SampleBatch.OBS])
    rewards = batch[SampleBatch.REWARDS]
    loss = -(dist_class(logits).logp(batch[SampleBatch.ACTIONS]) * rewards).mean() + ((values - rewards) ** 2).mean()
    return LossOutput(loss, {"total_loss": loss.item()}, td_error=values.detach() - rewards)


def make_policy(**config: Any) -> TorchPolicy:
    return TorchPolicy(
        CARTPOLE.observation_space, CARTPOLE.action_space, TrainerConfig(seed=0, **config), loss_fn=pg_loss
    )


def cartpole_batch(bad: str | None = None, n: int = 32) -> SampleBatch:
    rng = np.random.default_rng(0)
    obs = rng.normal(size=(n, 4)).astype(np.float32)
    rewards = np.ones(n, np.float32)
    if bad == "nan_reward":
        rewards[3] = np.nan
    elif bad == "inf_reward":
        rewards[3] = np.inf
    elif bad == "nan_obs":
        obs[5, 2] = np.nan
    return SampleBatch({SampleBatch.OBS: obs, SampleBatch.ACTIONS: rng.integers(0, 2, n), SampleBatch.REWARDS: rewards})


def snapshot(policy: TorchPolicy) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    return {k: v.clone() for k, v in policy.model.state_dict().items()}, copy.deepcopy(policy.optimizer.state_dict())


def assert_unchanged(policy: TorchPolicy, before: tuple[dict[str, torch.Tensor], dict[str, Any]]) -> None:
    weights, optimizer = before
    assert all(torch.equal(weights[k], v) for k, v in policy.model.state_dict().items())
    after = policy.optimizer.state_dict()
    assert after["state"].keys() == optimizer["state"].keys()
    for k, state in after["state"].items():
        assert all(torch.equal(value, optimizer["state"][k][name]) for name, value in state.items())


@pytest.mark.parametrize("bad", ["nan_reward", "inf_reward", "nan_obs"])
@pytest.mark.parametrize("grad_clip", [None, 0.5])
def test_a_nonfinite_batch_leaves_weights_and_optimizer_state_bitwise_unchanged(
    bad: str, grad_clip: float | None
) -> None:
    policy = make_policy(grad_clip=grad_clip)
    policy.learn(cartpole_batch())  # the optimizer has state (Adam's moments) to keep intact
    before = snapshot(policy)
    out = policy.learn(cartpole_batch(bad))
    assert_unchanged(policy, before)
    assert out.stats[NONFINITE_UPDATE] == 1.0 and all(isinstance(v, float) for v in out.stats.values())
    assert out.td_error is None  # no priorities from a skipped update
    assert policy.num_nonfinite_updates == 1
    assert policy.learn_on_batch(cartpole_batch(bad))[NONFINITE_UPDATE] == 1.0 and policy.num_nonfinite_updates == 2
    assert NONFINITE_UPDATE not in policy.learn(cartpole_batch()).stats  # a finite one is applied as usual
    assert not all(torch.equal(before[0][k], v) for k, v in policy.model.state_dict().items())


def test_too_many_nonfinite_updates_in_a_row_raise() -> None:
    policy = make_policy(max_consecutive_nonfinite_updates=3)
    policy.learn(cartpole_batch("nan_reward"))
    policy.learn(cartpole_batch("nan_reward"))
    with pytest.raises(
        NonFiniteUpdateError,
        match=r"TorchPolicy on worker 0: 3 updates in a row .*max_consecutive_nonfinite_updates=3.*loss=nan",
    ):
        policy.learn(cartpole_batch("nan_reward"))
    assert policy.num_nonfinite_updates == 3


def test_a_finite_update_resets_the_count_in_a_row() -> None:
    policy = make_policy(max_consecutive_nonfinite_updates=3)
    for bad in ["nan_obs", "nan_obs", None, "nan_obs", "nan_obs", None, "nan_obs", "nan_obs"]:
        policy.learn(cartpole_batch(bad))
    assert policy.num_nonfinite_updates == 6  # cumulative; never 3 in a row


def test_apply_gradients_skips_nonfinite_gradients() -> None:
    policy = make_policy(max_consecutive_nonfinite_updates=2)
    grads, stats = policy.compute_gradients(cartpole_batch())
    assert NONFINITE_UPDATE not in stats
    grads[1] = grads[1].copy()
    grads[1].flat[0] = np.nan
    before = snapshot(policy)
    policy.apply_gradients(grads)
    assert_unchanged(policy, before)
    assert policy.num_nonfinite_updates == 1
    with pytest.raises(NonFiniteUpdateError, match="a non-finite gradient of .* given to apply_gradients"):
        policy.apply_gradients(grads)
    assert_unchanged(policy, before)


def test_gradients_of_a_nonfinite_loss_are_poisoned_so_that_applying_them_is_skipped() -> None:
    worker_policy, learner = make_policy(), make_policy()
    grads, stats = worker_policy.compute_gradients(cartpole_batch("nan_reward"))
    assert stats[NONFINITE_UPDATE] == 1.0 and all(np.isnan(g).all() for g in grads)
    assert worker_policy.num_nonfinite_updates == 0  # counted where they would be applied
    before = snapshot(learner)
    learner.apply_gradients(grads)
    assert_unchanged(learner, before)
    assert learner.num_nonfinite_updates == 1


def test_the_count_survives_a_checkpoint() -> None:
    policy = make_policy()
    policy.learn(cartpole_batch("nan_reward"))
    restored = make_policy()
    restored.set_state(policy.get_state())
    assert restored.num_nonfinite_updates == 1


def test_td3_skips_actor_and_critic_updates_on_a_nonfinite_batch() -> None:
    obs_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    action_space = gym.spaces.Box(-2.0, 2.0, (1,), np.float32)
    policy = make_ddpg_policy(obs_space, action_space, TD3Config(seed=0, policy_delay=1)).build()
    n = 16
    rng = np.random.default_rng(0)
    rewards = np.ones(n, np.float32)
    rewards[0] = np.nan
    batch = SampleBatch(
        {
            SampleBatch.OBS: rng.uniform(-1, 1, (n, 3)).astype(np.float32),
            SampleBatch.NEW_OBS: rng.uniform(-1, 1, (n, 3)).astype(np.float32),
            SampleBatch.ACTIONS: rng.uniform(-2, 2, (n, 1)).astype(np.float32),
            SampleBatch.REWARDS: rewards,
            SampleBatch.TERMINATEDS: np.zeros(n, bool),
            DISCOUNTS: np.full(n, 0.99, np.float32),
        }
    )
    assert isinstance(policy, TorchPolicy) and policy.target_model is not None
    before, target = snapshot(policy), copy.deepcopy(policy.target_model.state_dict())
    out = policy.learn(batch)
    assert out.stats[NONFINITE_UPDATE] == 1.0 and "actor_loss" in out.stats  # the actor's step was in this update
    assert_unchanged(policy, before)
    assert all(torch.equal(target[k], v) for k, v in policy.target_model.state_dict().items())


class ScriptedPolicy:
    """learn_on_batch returns the next of ``stats``."""

    def __init__(self, stats: list[dict[str, float]]) -> None:
        self.stats = list(stats)

    def learn_on_batch(self, batch: SampleBatch) -> dict[str, float]:
        return self.stats.pop(0)

    def learn(self, batch: SampleBatch) -> LearnOutput:
        return LearnOutput(self.learn_on_batch(batch))


def test_minibatch_sgd_averages_the_applied_updates_and_reports_the_fraction_skipped() -> None:
    batch = SampleBatch({"x": np.arange(8)})
    skipped = {"loss": float("nan"), NONFINITE_UPDATE: 1.0}
    policy = ScriptedPolicy([{"loss": 1.0}, skipped, {"loss": 3.0}, skipped])
    stats = minibatch_sgd(policy, batch, num_sgd_iter=2, sgd_minibatch_size=4, seed=0)
    assert stats == {"loss": 2.0, NONFINITE_UPDATE: 0.5}
    every_one_skipped = ScriptedPolicy([skipped, skipped])
    stats = minibatch_sgd(every_one_skipped, batch, num_sgd_iter=2, sgd_minibatch_size=0)
    assert np.isnan(stats["loss"]) and stats[NONFINITE_UPDATE] == 1.0
    assert minibatch_sgd(ScriptedPolicy([{"loss": 1.0}]), batch, 1, 0) == {"loss": 1.0}
