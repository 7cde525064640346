"""lr_schedule and entropy_coeff_schedule in a policy: the optimizer's rates and the loss's entropy coefficient
follow the global timestep; several rates keep their proportions; a live value ends its schedule."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from flowrl.algorithms import get_algorithm
from flowrl.algorithms.a2c import actor_critic_loss
from flowrl.config import TrainerConfig
from flowrl.data import SampleBatch
from flowrl.errors import ConfigError
from flowrl.policy import TorchPolicy
from flowrl.policy.optimizers import LearningRates
from flowrl.policy.schedules import ending_schedules

pytestmark = pytest.mark.unit

OBS = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
ACT = gym.spaces.Discrete(2)
SCHEDULE = [[100, 1e-2], [300, 1e-3]]


def bc_loss(policy: TorchPolicy, model: torch.nn.Module, dist_class: Any, batch: dict[str, torch.Tensor]) -> Any:
    logits, _ = model(batch[SampleBatch.OBS])
    return -dist_class(logits).logp(batch[SampleBatch.ACTIONS]).mean(), {}


def batch(n: int = 16) -> SampleBatch:
    obs = np.random.default_rng(0).standard_normal((n, 4)).astype(np.float32)
    return SampleBatch(obs=obs, actions=(obs[:, 0] > 0).astype(np.int64))


def policy_at(timestep: int, **config: Any) -> TorchPolicy:
    keys = {"model": {"fcnet_hiddens": [8]}, "lr_schedule": SCHEDULE, **config}
    policy = TorchPolicy(OBS, ACT, TrainerConfig.from_dict(keys), loss_fn=bc_loss)
    policy.on_global_var_update({"timestep": timestep})
    return policy


@pytest.mark.parametrize(
    ("timestep", "lr"),
    [(0, 1e-2), (100, 1e-2), (150, 1e-2 + 0.25 * (1e-3 - 1e-2)), (200, 5.5e-3), (300, 1e-3), (10_000, 1e-3)],
)
def test_the_optimizer_steps_at_the_scheduled_rate_before_between_and_after_the_points(
    timestep: int, lr: float
) -> None:
    policy = policy_at(timestep, lr=0.5)  # the schedule replaces lr
    stats = policy.learn(batch()).stats
    assert stats["cur_lr"] == pytest.approx(lr)
    assert policy.optimizer.param_groups[0]["lr"] == pytest.approx(lr)


def test_the_rate_follows_the_timestep_from_step_to_step_and_in_apply_gradients() -> None:
    policy = policy_at(100)
    grads, stats = policy.compute_gradients(batch())
    assert stats["cur_lr"] == pytest.approx(1e-2)
    policy.on_global_var_update({"timestep": 200})
    policy.apply_gradients(grads)
    assert policy.optimizer.param_groups[0]["lr"] == pytest.approx(5.5e-3)


def test_without_a_schedule_lr_is_the_rate_and_is_reported() -> None:
    policy = policy_at(10_000, lr_schedule=None, lr=3e-4)
    assert policy.learn(batch()).stats["cur_lr"] == pytest.approx(3e-4)


def test_rates_of_their_own_keys_are_scaled_by_the_schedule_over_its_peak() -> None:
    """The rule a custom make_optimizer's parameter groups follow (DDPG's, SAC's): rate * s(t) / max(s)."""
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.Adam([{"params": [model.weight], "lr": 1e-3}, {"params": [model.bias], "lr": 4e-3}])
    rates = LearningRates(optimizer, from_lr=False)
    warm_up_then_decay = [[0, 0.0], [100, 2.0], [300, 0.5]]
    assert rates.scheduled(warm_up_then_decay, 50) == pytest.approx([0.5e-3, 2e-3])
    assert rates.scheduled(warm_up_then_decay, 100) == pytest.approx([1e-3, 4e-3])
    assert rates.scheduled(warm_up_then_decay, 1000) == pytest.approx([0.25e-3, 1e-3])
    config = TrainerConfig(lr_schedule=warm_up_then_decay)
    assert rates.set(config, 200) == pytest.approx(0.625e-3)
    assert [group["lr"] for group in optimizer.param_groups] == pytest.approx([0.625e-3, 2.5e-3])


def test_ddpg_actor_and_critic_rates_keep_their_proportion() -> None:
    algorithm = get_algorithm("ddpg")
    obs, act = gym.spaces.Box(-1.0, 1.0, (3,), np.float32), gym.spaces.Box(-2.0, 2.0, (1,), np.float32)
    keys = {"actor_lr": 1e-3, "critic_lr": 2e-3, "lr_schedule": [[0, 1.0], [1000, 0.1]], "num_workers": 0}
    config = algorithm.config_class.from_dict(keys)
    policy = algorithm.make_policy(obs, act, config).build()
    assert isinstance(policy, TorchPolicy)
    policy.on_global_var_update({"timestep": 500})
    assert policy.learning_rates.set(policy.config, policy.global_timestep) == pytest.approx(0.55e-3)
    assert [group["lr"] for group in policy.optimizer.param_groups] == pytest.approx([0.55e-3, 1.1e-3])


def ac_batch(n: int = 32) -> SampleBatch:
    rng = np.random.default_rng(1)
    return SampleBatch(
        obs=rng.standard_normal((n, 4)).astype(np.float32),
        actions=rng.integers(0, 2, n),
        advantages=rng.standard_normal(n).astype(np.float32),
        value_targets=rng.standard_normal(n).astype(np.float32),
    )


def test_the_loss_uses_the_scheduled_entropy_coefficient() -> None:
    a2c = get_algorithm("a2c")
    base = {"model": {"fcnet_hiddens": [8]}, "num_workers": 0, "seed": 0}
    scheduled = a2c.make_policy(
        OBS,
        ACT,
        a2c.config_class.from_dict({**base, "entropy_coeff": 0.5, "entropy_coeff_schedule": [[0, 0.1], [1000, 0.0]]}),
    ).build()
    fixed = a2c.make_policy(OBS, ACT, a2c.config_class.from_dict({**base, "entropy_coeff": 0.075})).build()
    assert isinstance(scheduled, TorchPolicy) and isinstance(fixed, TorchPolicy)
    fixed.set_weights(scheduled.get_weights())
    scheduled.on_global_var_update({"timestep": 250})
    tensors = scheduled.to_tensors(ac_batch())
    loss, stats = actor_critic_loss(scheduled, scheduled.model, scheduled.dist_class, tensors)[:2]
    fixed_loss, fixed_stats = actor_critic_loss(fixed, fixed.model, fixed.dist_class, tensors)[:2]
    assert stats["entropy_coeff"] == pytest.approx(0.075) and fixed_stats["entropy_coeff"] == 0.075
    assert loss.item() == pytest.approx(fixed_loss.item())
    assert scheduled.learn(ac_batch()).stats["entropy_coeff"] == pytest.approx(0.075)


def test_a_live_value_ends_its_schedule_and_holds_from_then_on() -> None:
    policy = policy_at(0, entropy_coeff_schedule=None)
    policy.learn(batch())
    policy.update_config({"lr": 2e-4})
    assert policy.config.lr_schedule is None and policy.config.lr == 2e-4
    for timestep in (0, 200, 5000):
        policy.on_global_var_update({"timestep": timestep})
        assert policy.learn(batch()).stats["cur_lr"] == pytest.approx(2e-4)


def test_ending_schedules_adds_only_the_schedules_a_change_overrides() -> None:
    config = TrainerConfig(lr_schedule=SCHEDULE)
    assert ending_schedules(config, {"lr": 1e-4}) == {"lr": 1e-4, "lr_schedule": None}
    assert ending_schedules(config, {"gamma": 0.9}) == {"gamma": 0.9}
    assert ending_schedules(config, {"lr": 1e-4, "lr_schedule": [[0, 1e-3]]}) == {
        "lr": 1e-4,
        "lr_schedule": [[0, 1e-3]],
    }
    assert ending_schedules(TrainerConfig(), {"lr": 1e-4}) == {"lr": 1e-4}


@pytest.mark.parametrize(
    ("algo", "keys", "message"),
    [
        ("ppo", {"lr_schedule": [[0, 1e-3], [100, -1e-4]]}, "lr_schedule=.*values must be >= 0, got -0.0001"),
        ("ppo", {"lr_schedule": [[0, 0], [100, 0.0]]}, "every learning rate is 0"),
        ("ppo", {"lr_schedule": [[100, 1e-3], [0, 1e-4]]}, r"lr_schedule\[1\].*must not decrease"),
        ("ppo", {"entropy_coeff_schedule": 0.01}, "entropy_coeff_schedule=0.01 must be"),
        ("pg", {"entropy_coeff_schedule": [[0, 0.01]]}, "PGConfig's loss has no entropy bonus"),
        ("dqn", {"entropy_coeff_schedule": [[0, 0.01]]}, "DQNConfig's loss has no entropy bonus"),
    ],
)
def test_config_errors_name_the_key_and_what_is_wrong(algo: str, keys: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        get_algorithm(algo).config_class.from_dict(keys)


@pytest.mark.parametrize("algo", ["pg", "a2c", "a3c", "ppo", "impala", "appo", "dqn", "ddpg", "td3", "es", "ars"])
def test_every_algorithm_with_an_optimizer_takes_an_lr_schedule(algo: str) -> None:
    config = get_algorithm(algo).config_class.from_dict({"lr_schedule": [[0, 1e-3], [1000, 1e-4]]})
    assert config.lr_schedule == [[0, 1e-3], [1000, 1e-4]]
