"""Learning tests: each algorithm must reach a reward threshold within a step budget.

Fixed seeds; the configs are the tuned examples in ``tuned_examples/``, so what CI checks is
what users run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from flowrl import Trainer

pytestmark = [pytest.mark.learning, pytest.mark.usefixtures("ray_session"), pytest.mark.timeout(900)]

TUNED = Path(__file__).resolve().parents[2] / "tuned_examples"


def train_until(
    example: str, threshold: float, budget: int, overrides: dict[str, Any] | None = None
) -> tuple[float, int, list[float]]:
    spec = yaml.safe_load((TUNED / example).read_text())
    # The test session's Ray has 2 CPUs shared with other tests' leftovers: ask for fractions.
    config: dict[str, Any] = {**spec["config"], "seed": 0, "num_cpus_per_worker": 0.5, **(overrides or {})}
    trainer = Trainer(spec["algo"], spec["env"], config)
    curve: list[float] = []
    try:
        while True:
            result = trainer.train()
            curve.append(round(result["episode_reward_mean"], 1))
            if result["episode_reward_mean"] >= threshold or result["timesteps_total"] >= budget:
                return result["episode_reward_mean"], result["timesteps_total"], curve
    finally:
        trainer.stop()


@pytest.mark.parametrize(
    ("example", "threshold", "budget"),
    [
        ("cartpole-ppo.yaml", 475.0, 150_000),
        ("cartpole-a2c.yaml", 195.0, 300_000),
        ("cartpole-a3c.yaml", 195.0, 300_000),
        ("cartpole-pg.yaml", 100.0, 200_000),
        ("cartpole-dqn.yaml", 475.0, 150_000),
        ("cartpole-sac.yaml", 150.0, 20_000),
        ("cartpole-apex.yaml", 195.0, 150_000),
        ("stateless-cartpole-r2d2.yaml", 150.0, 100_000),
        ("pendulum-td3.yaml", -250.0, 30_000),
        ("pendulum-ddpg.yaml", -250.0, 30_000),
        ("pendulum-sac.yaml", -250.0, 20_000),
        ("pendulum-apex_ddpg.yaml", -300.0, 150_000),
        ("cartpole-impala.yaml", 195.0, 500_000),
        ("cartpole-appo.yaml", 195.0, 500_000),
    ],
)
def test_reaches_threshold_within_budget(example: str, threshold: float, budget: int) -> None:
    reward, steps, curve = train_until(example, threshold, budget)
    assert reward >= threshold, f"{example}: mean reward {reward:.1f} < {threshold} after {steps} steps; curve {curve}"
    assert steps <= budget


@pytest.mark.parametrize("example", ["cartpole-ppo.yaml", "cartpole-impala.yaml"])
def test_two_learners_learn_as_one(example: str) -> None:
    """The tuned examples trained by a learner group of 2 gloo actors (TrainOneStep's, a learner thread's)."""
    group = {"num_learners": 2, "num_cpus_per_learner": 0.25}
    reward, steps, curve = train_until(example, 150.0, 300_000, group)
    assert reward >= 150.0, (
        f"{example} with 2 learners: mean reward {reward:.1f} < 150 after {steps} steps; curve {curve}"
    )


#: An eighth of the tuned example's updates, of twice its rows, at thrice its learning rate and four times its
#: tau: every update costs a round trip to the remote workers (its weight broadcast) or to the learner group.
#: In one process: -250 at 11,000 and 12,000 env steps with seeds 0 and 1 (the tuned example: 8,000 and 7,000).
FEWER_UPDATES = {"train_batch_size": 256, "training_intensity": 32, "lr": 3e-3, "tau": 0.02}


@pytest.mark.parametrize(
    "overrides",
    [{"num_workers": 2}, {"num_learners": 2, "num_cpus_per_learner": 0.25}],
    ids=["2-remote-workers", "2-learners"],
)
def test_sac_learns_pendulum_with_remote_workers_or_a_learner_group(overrides: dict[str, Any]) -> None:
    reward, steps, curve = train_until("pendulum-sac.yaml", -250.0, 20_000, {**FEWER_UPDATES, **overrides})
    assert reward >= -250.0, f"SAC with {overrides}: mean reward {reward:.1f} < -250 after {steps} steps; curve {curve}"


def train_until_each_policy(
    example: str, threshold: float, budget: int
) -> tuple[dict[str, float], int, list[dict[str, float]]]:
    """Train until every policy's mean return per agent reaches ``threshold`` in one iteration."""
    spec = yaml.safe_load((TUNED / example).read_text())
    trainer = Trainer(spec["algo"], spec["env"], {**spec["config"], "seed": 0, "num_cpus_per_worker": 0.5})
    curve: list[dict[str, float]] = []
    try:
        while True:
            result = trainer.train()
            rewards = result.get("policy_reward_mean", {})
            curve.append({pid: round(r, 1) for pid, r in rewards.items()})
            if (rewards and min(rewards.values()) >= threshold) or result["timesteps_total"] >= budget:
                return rewards, result["timesteps_total"], curve
    finally:
        trainer.stop()


@pytest.mark.parametrize(
    ("example", "policies", "budget"),
    [
        ("multiagent-cartpole-ppo.yaml", {"default_policy"}, 100_000),
        ("multiagent-cartpole-ppo_dqn.yaml", {"ppo_policy", "dqn_policy"}, 400_000),
    ],
)
def test_multi_agent_policies_reach_150_per_agent(example: str, policies: set[str], budget: int) -> None:
    rewards, steps, curve = train_until_each_policy(example, 150.0, budget)
    assert set(rewards) == policies
    assert min(rewards.values()) >= 150.0, f"{example}: {rewards} after {steps} steps; curve {curve[-10:]}"
