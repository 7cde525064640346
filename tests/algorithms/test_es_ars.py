"""ES and ARS as execution plans: one iteration each (in the driver and over 2 remote workers), the
plan graph, checkpoints (weights, optimizer state, observation filter), evaluation, and learning CartPole."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from algorithms.test_learning import train_until

from flowrl import Trainer
from flowrl.data import DEFAULT_POLICY_ID
from flowrl.engine.build import evaluate_checkpoint
from flowrl.operators import STEPS_SAMPLED_COUNTER, STEPS_TRAINED_COUNTER
from flowrl.operators.perturbation_ops import (
    EVAL_STEPS_COUNTER,
    PERTURBED_EPISODES_COUNTER,
)

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("ray_session"), pytest.mark.timeout(300)]

SMALL: dict[str, dict[str, Any]] = {
    "es": {"episodes_per_batch": 8, "train_batch_size": 50, "model": {"fcnet_hiddens": [8]}},
    "ars": {"num_rollouts": 4, "rollouts_used": 2},
}
COMMON = {"seed": 0, "noise_table_size": 100_000, "eval_prob": 1.0, "num_cpus_per_worker": 0.5}
REPORTING = ["filter(OncePerTimestepsElapsed)", "filter(OncePerTimeInterval)", "for_each(CollectMetrics)"]


def make_trainer(algo: str, num_workers: int, env: str = "CartPole-v1", **overrides: Any) -> Trainer:
    return Trainer(algo, env, {**COMMON, **SMALL[algo], "num_workers": num_workers, **overrides})


def labels(trainer: Trainer) -> list[str]:
    return [stage.label for stage in trainer.plan.graph.operators.values()]


def state_of(trainer: Trainer) -> dict[str, Any]:
    policy = trainer.workers.local_worker().get_policy()
    return {"weights": policy.get_weights(), "optimizer": policy.get_state()["optimizer"]}


def assert_same_state(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a["weights"].keys() == b["weights"].keys()
    for key in a["weights"]:
        np.testing.assert_array_equal(a["weights"][key], b["weights"][key], err_msg=key)
    assert a["optimizer"]["param_groups"] == b["optimizer"]["param_groups"]
    assert a["optimizer"]["state"].keys() == b["optimizer"]["state"].keys()
    for index, per_param in a["optimizer"]["state"].items():
        for name, value in per_param.items():
            torch.testing.assert_close(value, b["optimizer"]["state"][index][name], rtol=0, atol=0)


@pytest.mark.parametrize(("algo", "num_workers"), list(itertools.product(["es", "ars"], [0, 2])))
def test_one_iteration_updates_and_reports_the_unperturbed_policy(algo: str, num_workers: int) -> None:
    trainer = make_trainer(algo, num_workers)
    try:
        before = trainer.workers.local_worker().get_policy().get_weights()
        result = trainer.train()
        after = trainer.workers.local_worker().get_policy().get_weights()
    finally:
        trainer.stop()
    counters = result["info"]
    pairs = 4 if algo == "es" else SMALL["ars"]["num_rollouts"]
    assert counters[PERTURBED_EPISODES_COUNTER] >= 2 * pairs
    # Every env step is counted, those of the evaluation episodes too.
    assert result["timesteps_total"] == counters[STEPS_SAMPLED_COUNTER] > counters[STEPS_TRAINED_COUNTER] > 0
    assert counters[EVAL_STEPS_COUNTER] == counters[STEPS_SAMPLED_COUNTER] - counters[STEPS_TRAINED_COUNTER]
    # eval_prob=1: one unperturbed episode per pair is what episode_reward_mean reports.
    assert result["episodes_this_iter"] >= pairs and result["episode_reward_mean"] >= 8
    assert set(result["info"]["learner"][DEFAULT_POLICY_ID]) >= {"weights_norm", "perturbed_return_mean", "num_pairs"}
    assert any(not np.array_equal(before[k], after[k]) for k in before)


def test_remote_workers_get_the_new_weights_and_filter() -> None:
    trainer = make_trainer("ars", 2)
    try:
        trainer.train()
        local = trainer.workers.local_worker().get_policy().get_weights()
        assert float(local["obs_count"]) > 0
        for remote in trainer.workers.foreach_worker(lambda w: w.get_policy().get_weights(), local=False):
            for key in local:
                np.testing.assert_array_equal(remote[key], local[key], err_msg=key)
    finally:
        trainer.stop()


@pytest.mark.parametrize(("algo", "update"), [("es", "for_each(ESUpdate)"), ("ars", "for_each(ARSUpdate)")])
def test_the_plan_graph_shows_the_dataflow(algo: str, update: str) -> None:
    trainer = make_trainer(algo, 2)
    try:
        assert labels(trainer) == [
            "batch_across_shards(rollout_workers.transform())",
            "for_each(concat)",
            "for_each(count_perturbation_steps)",
            "combine(CollectPerturbations)",
            update,
            "for_each(UpdateObservationFilter)",
            "for_each(BroadcastWeights)",
            *REPORTING,
        ]
        assert trainer.plan.graph.actors == {"RolloutWorker": 2}
        text = trainer.plan.describe()
        assert text.startswith(f"plan {algo}:")
        assert "batch_across_shards(rollout_workers.transform())  <- RolloutWorker x2" in text
        assert "for_each(BroadcastWeights) --broadcast weights--> RolloutWorker x2" in text
    finally:
        trainer.stop()
    # Without an observation filter there is nothing to merge; in the driver the local worker evaluates.
    local = make_trainer(algo, 0, observation_filter="NoFilter")
    try:
        assert labels(local) == [
            "local_worker.evaluate_perturbations()",
            "for_each(count_perturbation_steps)",
            "combine(CollectPerturbations)",
            update,
            "for_each(BroadcastWeights)",
            *REPORTING,
        ]
    finally:
        local.stop()


@pytest.mark.parametrize("algo", ["es", "ars"])
def test_checkpoints_keep_weights_optimizer_state_and_the_observation_filter(algo: str, tmp_path: Path) -> None:
    trainer = make_trainer(algo, 0, **({"optimizer": "adam"} if algo == "es" else {}))
    try:
        for _ in range(2):
            trainer.train()
        saved = state_of(trainer)
        path = trainer.save(tmp_path)
        evaluated = trainer.evaluate(num_episodes=2, seed=0)
        trainer.train()  # move on, then come back
        assert any(not np.array_equal(saved["weights"][k], v) for k, v in state_of(trainer)["weights"].items())
        trainer.restore(path)
        assert_same_state(saved, state_of(trainer))
    finally:
        trainer.stop()
    assert float(saved["weights"]["obs_count"]) > 0 and not np.all(saved["weights"]["obs_scale"] == 1)
    if algo == "es":
        assert saved["optimizer"]["state"], "Adam's moments are part of the checkpoint"
    restored = Trainer.from_checkpoint(path)
    try:
        assert_same_state(saved, state_of(restored))
        assert restored.plan.metrics.counters[STEPS_SAMPLED_COUNTER] > 0
        restored.train()  # and training goes on from there
    finally:
        restored.stop()
    # Evaluating the checkpoint (no Ray, no workers) acts exactly as the trainer's policy did.
    offline = evaluate_checkpoint(path, num_episodes=2, seed=0)
    assert offline["episode_reward_mean"] == evaluated["episode_reward_mean"]


@pytest.mark.learning
@pytest.mark.timeout(600)
@pytest.mark.parametrize("example", ["cartpole-es.yaml", "cartpole-ars.yaml"])
def test_learns_cartpole_within_budget(example: str) -> None:
    reward, steps, curve = train_until(example, 195.0, 2_000_000)
    assert reward >= 195.0, f"{example}: mean reward {reward:.1f} < 195 after {steps} steps; curve {curve}"
    assert steps <= 2_000_000
