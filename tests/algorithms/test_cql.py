"""CQL: the conservative penalties (discrete and continuous), the policy each action space gets, the
config's checks, and two learning tests from experiences recorded in the test (DQN on CartPole, SAC on
Pendulum)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
import yaml

from flowrl import Trainer
from flowrl.algorithms import get_algorithm
from flowrl.algorithms.cql import UPDATES, continuous_penalty, discrete_penalty
from flowrl.algorithms.registry import NOT_IMPLEMENTED
from flowrl.data import SampleBatch
from flowrl.errors import ConfigError
from flowrl.policy.networks import QModel
from flowrl.policy.postprocessing import DISCOUNTS
from flowrl.policy.sac_networks import SACModel

TUNED = Path(__file__).resolve().parents[2] / "tuned_examples"
PENDULUM = (gym.spaces.Box(-1.0, 1.0, (3,), np.float32), gym.spaces.Box(-2.0, 2.0, (1,), np.float32))
DISCRETE = (gym.spaces.Box(-1.0, 1.0, (4,), np.float32), gym.spaces.Discrete(3))


def policy_of(spaces: tuple[gym.Space[Any], gym.Space[Any]], **config: Any) -> Any:
    algorithm = get_algorithm("cql")
    small = {"seed": 0, "actor_hiddens": [16], "critic_hiddens": [16], "model": {"fcnet_hiddens": [16]}}
    return algorithm.make_policy(*spaces, algorithm.config_class.from_dict({**small, **config})).build()


def batch(spaces: tuple[gym.Space[Any], gym.Space[Any]], n: int = 32) -> dict[str, torch.Tensor]:
    rng = np.random.default_rng(1)
    obs_dim, action_space = spaces[0].shape[0], spaces[1]
    if isinstance(action_space, gym.spaces.Discrete):
        actions = torch.as_tensor(rng.integers(0, int(action_space.n), n))
    else:
        actions = torch.as_tensor(rng.uniform(-2, 2, size=(n, 1)), dtype=torch.float32)
    return {
        SampleBatch.OBS: torch.as_tensor(rng.normal(size=(n, obs_dim)), dtype=torch.float32),
        SampleBatch.NEW_OBS: torch.as_tensor(rng.normal(size=(n, obs_dim)), dtype=torch.float32),
        SampleBatch.ACTIONS: actions,
        SampleBatch.REWARDS: torch.as_tensor(rng.normal(size=n), dtype=torch.float32),
        SampleBatch.TERMINATEDS: torch.zeros(n, dtype=torch.bool),
        DISCOUNTS: torch.full((n,), 0.9),
    }


@pytest.mark.unit
def test_the_discrete_penalty_is_zero_when_only_the_data_action_has_a_finite_q() -> None:
    q = torch.tensor([[0.0, -math.inf, -math.inf], [-math.inf, 2.0, -math.inf]])
    actions = torch.tensor([0, 1])
    for temperature in (1.0, 0.1):
        torch.testing.assert_close(discrete_penalty(q, actions, temperature), torch.zeros(2))


@pytest.mark.unit
def test_the_discrete_penalty_is_logsumexp_minus_the_data_q_over_the_legal_actions() -> None:
    q = torch.tensor([[1.0, 2.0, 3.0]])
    actions = torch.tensor([0])
    expected = math.log(math.e + math.e**2 + math.e**3) - 1.0
    assert float(discrete_penalty(q, actions, 1.0)) == pytest.approx(expected)
    # Equal Q-values: the penalty's floor, -T log n.
    assert float(discrete_penalty(torch.zeros(1, 4), actions, 0.5)) == pytest.approx(0.5 * math.log(4))
    # Action 2 is illegal: only actions 0 and 1 count.
    mask = torch.tensor([[1, 1, 0]], dtype=torch.bool)
    assert float(discrete_penalty(q, actions, 1.0, mask)) == pytest.approx(math.log(math.e + math.e**2) - 1.0)


def gap_growth(cql_alpha: float) -> tuple[float, dict[str, float]]:
    """How much 20 updates on data that only ever takes action 0 raise its Q-value above the best other one
    (on average over the batch's observations), and the last update's statistics."""
    policy = policy_of(DISCRETE, cql_alpha=cql_alpha, lr=0.01)
    assert isinstance(policy.model, QModel)
    data = batch(DISCRETE)
    data[SampleBatch.ACTIONS] = torch.zeros(32, dtype=torch.long)

    def gap() -> float:
        with torch.no_grad():
            q = policy.model(data[SampleBatch.OBS])[0]
        return float((q[:, 0] - q[:, 1:].max(1).values).mean())

    before = gap()
    for _ in range(20):
        stats = policy.learn(SampleBatch({k: v.numpy() for k, v in data.items()})).stats
    return gap() - before, stats


@pytest.mark.unit
def test_discrete_cql_lowers_the_q_values_of_actions_the_data_never_takes() -> None:
    growth, stats = gap_growth(5.0)
    plain, _ = gap_growth(0.0)  # DQN's loss alone: the unseen actions' Q-values drift, no more
    assert growth > 1.0 and growth > plain + 1.0, (growth, plain)
    assert {"loss", "mean_q", "cql_penalty"} <= set(stats)


@pytest.mark.unit
def test_the_continuous_penalty_has_a_row_per_critic_and_moves_only_the_critics() -> None:
    policy = policy_of(PENDULUM, num_actions=3)
    model = policy.model
    assert isinstance(model, SACModel) and len(model.critics) == 2
    penalties = continuous_penalty(model, batch(PENDULUM, n=8), num_actions=3, temperature=1.0)
    assert [tuple(p.shape) for p in penalties] == [(8,), (8,)]
    assert all(bool(torch.isfinite(p).all()) for p in penalties)
    total = sum(p.sum() for p in penalties)
    grads = torch.autograd.grad(total, [*model.actor.parameters(), model.log_alpha], allow_unused=True)
    assert all(g is None for g in grads)
    assert all(g is not None for g in torch.autograd.grad(total, list(model.critics.parameters())))


@pytest.mark.unit
def test_the_continuous_penalty_estimates_the_logsumexp_of_a_constant_q() -> None:
    """With Q = 0 everywhere each draw's term is ``1 / p(a)``, whose mean over draws from ``p`` (uniform or the
    policy's) estimates the volume of the action range, 4: the penalty is about ``log 4``."""
    policy = policy_of(PENDULUM, twin_q=False)
    model = policy.model
    with torch.no_grad():
        for critic in model.critics:
            for p in critic.parameters():
                p.zero_()  # Q = 0 everywhere
        (penalty,) = continuous_penalty(model, batch(PENDULUM, n=256), num_actions=50, temperature=1.0)
    assert float(penalty.mean()) == pytest.approx(math.log(4.0), abs=0.15)


@pytest.mark.unit
def test_the_actor_clones_the_data_for_bc_iters_updates_then_maximises_q() -> None:
    policy = policy_of(PENDULUM, bc_iters=2)
    data = SampleBatch({k: v.numpy() for k, v in batch(PENDULUM).items()})
    model = policy.model
    obs, actions = torch.as_tensor(data[SampleBatch.OBS]), torch.as_tensor(data[SampleBatch.ACTIONS])
    with torch.no_grad():
        cloning = -float(model.logp(model.dist_inputs(obs), actions).mean())
    first = policy.learn(data).stats
    assert first["actor_loss"] == pytest.approx(cloning, rel=1e-4)
    policy.learn(data)
    assert policy.coeffs[UPDATES] == 2
    third = policy.learn(data).stats  # SAC's actor loss now: alpha log pi - Q, no longer a log-likelihood
    with torch.no_grad():
        cloning = -float(model.logp(model.dist_inputs(obs), actions).mean())
    assert third["actor_loss"] != pytest.approx(cloning, rel=1e-2)


@pytest.mark.unit
def test_the_squashed_log_density_of_given_actions_matches_the_sampled_ones() -> None:
    model = policy_of(PENDULUM).model
    with torch.no_grad():
        inputs = model.dist_inputs(batch(PENDULUM)[SampleBatch.OBS])
        actions, logp = model.sample(inputs)
        torch.testing.assert_close(model.logp(inputs, actions), logp, rtol=1e-3, atol=1e-3)
        on_bound = model.logp(inputs[:1], torch.tensor([[2.0]]))
    assert bool(torch.isfinite(on_bound).all())


@pytest.mark.unit
def test_the_config_checks_cqls_keys_and_refuses_mixing_in_the_sampler() -> None:
    config_class = get_algorithm("cql").config_class
    for bad, key in (({"cql_alpha": -1.0}, "cql_alpha"), ({"num_actions": 0}, "num_actions")):
        with pytest.raises(ConfigError, match=key):
            config_class.from_dict(bad)
    with pytest.raises(ConfigError, match="cql learns from recorded experiences alone"):
        config_class.from_dict({"input": {"sampler": 0.5, "data/": 0.5}})


@pytest.mark.unit
def test_cql_is_an_offline_algorithm_and_no_longer_answered_with_others() -> None:
    assert "cql" not in NOT_IMPLEMENTED
    assert get_algorithm("cql").offline


@pytest.mark.integration
@pytest.mark.usefixtures("ray_session")
def test_a_run_without_experiences_says_to_set_input() -> None:
    with pytest.raises(ConfigError, match="cql learns from recorded experiences: set input"):
        Trainer("cql", "CartPole-v1", {"num_workers": 0})


def record(example: str, steps: int, out: Path) -> None:
    """Write the experiences of the tuned example's first ``steps`` env steps (seed 0) under ``out``."""
    spec = yaml.safe_load((TUNED / example).read_text())
    trainer = Trainer(spec["algo"], spec["env"], {**spec["config"], "seed": 0, "output": str(out)})
    try:
        while trainer.train()["timesteps_total"] < steps:
            pass
    finally:
        trainer.stop()


def train_offline(example: str, data: Path, threshold: float, budget: int) -> tuple[float, int, list[float]]:
    """Train the tuned example on ``data`` until its evaluation mean reaches ``threshold`` or it has read
    ``budget`` rows."""
    spec = yaml.safe_load((TUNED / example).read_text())
    trainer = Trainer("cql", spec["env"], {**spec["config"], "seed": 0, "input": str(data)})
    curve: list[float] = []
    try:
        while True:
            result = trainer.train()
            reward = result["evaluation"]["episode_reward_mean"]
            curve.append(round(reward, 1))
            if reward >= threshold or result["timesteps_total"] >= budget:
                return reward, result["timesteps_total"], curve
    finally:
        trainer.stop()


@pytest.mark.learning
@pytest.mark.usefixtures("ray_session")
@pytest.mark.timeout(300)
def test_discrete_cql_learns_cartpole_from_a_dqn_runs_experiences(tmp_path: Path) -> None:
    """15,000 env steps of cartpole-dqn.yaml (mostly exploring; its last episodes average about 117), then CQL
    alone: 283 at 44,800 rows read (700 updates of 64) with seed 0. Measured on the shared 2-core machine
    (load 6-10): recording 15 s (9 s of CPU), training 5 s (3.5 s of CPU). The same settings without the
    penalty (cql_alpha 0) learn this dataset too: its exploration covers the actions well."""
    record("cartpole-dqn.yaml", 15_000, tmp_path)
    reward, rows, curve = train_offline("cartpole-cql.yaml", tmp_path, 250.0, 96_000)
    assert reward >= 250.0, f"evaluation mean {reward:.1f} < 250 after {rows} rows; curve {curve}"


@pytest.mark.learning
@pytest.mark.usefixtures("ray_session")
@pytest.mark.timeout(300)
def test_continuous_cql_learns_pendulum_from_a_sac_runs_experiences(tmp_path: Path) -> None:
    """5,000 env steps of pendulum-sac.yaml (its last episodes average about -900), then CQL alone: -357 at
    128,000 rows read (1,000 updates of 128) with seed 0. Measured on the shared 2-core machine (load 6-10):
    recording 12 s (11 s of CPU), training 14 s (13 s of CPU)."""
    record("pendulum-sac.yaml", 5_000, tmp_path)
    reward, rows, curve = train_offline("pendulum-cql.yaml", tmp_path, -400.0, 256_000)
    assert reward >= -400.0, f"evaluation mean {reward:.1f} < -400 after {rows} rows; curve {curve}"
