"""IMPALA's options (minibatch epochs, MixInReplay, tree aggregation) and APPO's loss and plan."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import ray
import torch

from flowrl import Trainer
from flowrl.algorithms.appo import APPOConfig, appo_loss, make_appo_policy
from flowrl.algorithms.impala import ImpalaConfig, impala_loss, make_impala_policy
from flowrl.data import SampleBatch
from flowrl.operators import KL_COEFF, NUM_TARGET_UPDATES
from flowrl.operators.names import NUM_LEARNER_UPDATES

pytestmark = pytest.mark.unit

SMALL = {
    "num_workers": 2,
    "num_cpus_per_worker": 0.1,
    "num_envs_per_worker": 2,
    "rollout_fragment_length": 10,
    "train_batch_size": 40,
    "timesteps_per_iteration": 200,
    "seed": 0,
}
HORIZON = 5


def fragments(num: int, seed: int = 0) -> SampleBatch:
    """``num`` CartPole-shaped fragments of HORIZON steps with a behaviour policy's log-probabilities."""
    rng = np.random.default_rng(seed)
    n = num * HORIZON
    terminated = np.zeros(n, bool)
    terminated[HORIZON - 2] = True
    return SampleBatch(
        {
            SampleBatch.OBS: rng.normal(size=(n, 4)).astype(np.float32),
            SampleBatch.NEW_OBS: rng.normal(size=(n, 4)).astype(np.float32),
            SampleBatch.ACTIONS: rng.integers(2, size=n),
            SampleBatch.REWARDS: np.ones(n, np.float32),
            SampleBatch.TERMINATEDS: terminated,
            SampleBatch.TRUNCATEDS: np.zeros(n, bool),
            SampleBatch.ACTION_LOGP: np.log(rng.uniform(0.3, 0.7, size=n)).astype(np.float32),
        }
    )


def build(make: Any, config_class: Any, **overrides: Any) -> Any:
    env = gym.make("CartPole-v1")
    config = config_class.from_dict({"rollout_fragment_length": HORIZON, "entropy_coeff": 0.01, **overrides})
    return make(env.observation_space, env.action_space, config).build({"seed": 0})


def loss_grads(policy: Any, loss_fn: Any, batch: SampleBatch) -> list[torch.Tensor]:
    policy.model.zero_grad()
    loss_fn(policy, policy.model, policy.dist_class, policy.to_tensors(batch)).loss.backward()
    return [p.grad.clone() for p in policy.model.parameters()]


def test_appo_with_its_target_equal_to_the_policy_has_impalas_gradient() -> None:
    appo = build(make_appo_policy, APPOConfig, use_kl_loss=True)
    impala = build(make_impala_policy, ImpalaConfig)
    impala.set_weights(appo.get_weights())
    batch = fragments(4)
    # ratio = 1 and its gradient is the log-probability's; the KL at equal policies has no gradient.
    for a, b in zip(loss_grads(appo, appo_loss, batch), loss_grads(impala, impala_loss, batch)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_appo_clips_the_ratio_to_the_target_policy() -> None:
    policy = build(make_appo_policy, APPOConfig, clip_param=0.1, vf_loss_coeff=0.0, entropy_coeff=0.0)
    # Every action is 0, which the policy (moved far from its target) takes almost surely and the
    # target about half the time: every ratio is near 2 > 1 + clip_param. Large rewards make every
    # advantage positive, so each row's surrogate sits on the clipped, flat side.
    batch = fragments(4)
    batch[SampleBatch.ACTIONS] = np.zeros(batch.count, np.int64)
    batch[SampleBatch.REWARDS] = np.full(batch.count, 100.0, np.float32)
    with torch.no_grad():
        policy.model.policy_head.bias.copy_(torch.tensor([8.0, -8.0]))
    policy.model.zero_grad()
    loss, stats, _ = appo_loss(policy, policy.model, policy.dist_class, policy.to_tensors(batch))
    loss.backward()
    assert stats["kl"] > 0.1 and stats[KL_COEFF] == 0.0
    assert float(policy.model.policy_head.bias.grad.abs().max()) == 0.0

    unclipped = build(make_appo_policy, APPOConfig, clip_param=10.0, vf_loss_coeff=0.0, entropy_coeff=0.0)
    unclipped.set_weights(policy.get_weights())
    unclipped.target_model.load_state_dict(policy.target_model.state_dict())
    unclipped.model.zero_grad()
    appo_loss(unclipped, unclipped.model, unclipped.dist_class, unclipped.to_tensors(batch)).loss.backward()
    assert float(unclipped.model.policy_head.bias.grad.abs().max()) > 0.0


@pytest.mark.usefixtures("ray_session")
def test_impala_with_minibatch_epochs_and_replay_trains_and_shows_both() -> None:
    trainer = Trainer(
        "impala", "CartPole-v1", {**SMALL, "num_sgd_iter": 2, "sgd_minibatch_size": 20, "replay_proportion": 1.0}
    )
    try:
        labels = [stage.label for stage in trainer.plan.graph.operators.values()]
        assert (
            labels.index("for_each(SendWeightsToSource)")
            < labels.index("combine(MixInReplay)")
            < labels.index("combine(ConcatBatches)")
        )
        result = trainer.train()
        # Each train batch is about half replay, so more steps are trained than sampled.
        for _ in range(10):
            if result["timesteps_trained"] > result["timesteps_total"]:
                break
            result = trainer.train()
        assert result["timesteps_trained"] > result["timesteps_total"]
    finally:
        trainer.stop()


@pytest.mark.usefixtures("ray_session")
def test_tree_aggregation_gathers_in_aggregator_actors_and_sends_weights_down() -> None:
    config = {**SMALL, "num_aggregation_workers": 1, "num_cpus_per_aggregator": 0.1}
    trainer = Trainer("impala", "CartPole-v1", config)
    try:
        graph = trainer.plan.graph
        assert graph.actors["AggregatorWorker"] == 1 and graph.actors["RolloutWorker"] == 2
        assert ("actor_RolloutWorker", "actor_AggregatorWorker", "gather_async") in graph.edges
        source = next(iter(graph.operators.values()))
        assert source.label == "gather_async(aggregators)"
        labels = [stage.label for stage in graph.operators.values()]
        assert "combine(ConcatBatches)" not in labels  # batching runs inside the aggregator
        initial = trainer.workers.local_worker().get_policy().get_weights()
        for _ in range(20):
            result = trainer.train()
            if result["info"].get("num_weight_syncs", 0) >= 2:
                break
        assert result["timesteps_trained"] > 0 and result["timesteps_total"] >= 200
        # Weights went to the aggregator, which passed them on to its rollout workers.
        remote = trainer.workers.foreach_worker(lambda w: w.get_policy().get_weights(), local=False)
        assert all(any(not np.array_equal(w[k], initial[k]) for k in initial) for w in remote)
        aggregators = list(source.actors)
    finally:
        trainer.stop()
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(aggregators[0].ping.remote(), timeout=30)


@pytest.mark.usefixtures("ray_session")
def test_appo_plan_syncs_its_target_network_on_the_learner_results(tmp_path: Path) -> None:
    trainer = Trainer("appo", "CartPole-v1", {**SMALL, "use_kl_loss": True})
    try:
        labels = [stage.label for stage in trainer.plan.graph.operators.values()]
        i = labels.index("for_each(RecordLearnerResults)")
        assert labels[i + 1 : i + 3] == ["for_each(UpdateTargetNetwork)", "for_each(UpdateKL)"]
        assert "LearnerThread" in trainer.plan.graph.actors
        result = trainer.train()
        assert result["info"][NUM_TARGET_UPDATES] >= 1
        assert {"policy_loss", "vf_loss", "kl", KL_COEFF} <= set(result["info"]["learner"]["default_policy"])
        policy = trainer.workers.local_worker().get_policy()
        policy.coeffs[KL_COEFF] = 0.123
        path = trainer.save(tmp_path / "ckpt")
        target = {k: v.clone() for k, v in policy.target_model.state_dict().items()}
    finally:
        trainer.stop()
    restored = Trainer.from_checkpoint(path)
    try:
        policy = restored.workers.local_worker().get_policy()
        assert policy.coeffs[KL_COEFF] == pytest.approx(0.123)
        for k, v in policy.target_model.state_dict().items():
            torch.testing.assert_close(v, target[k])
    finally:
        restored.stop()


@pytest.mark.usefixtures("ray_session")
def test_appo_syncs_its_target_every_target_update_frequency_learner_updates() -> None:
    # Train batches overshoot train_batch_size (whole fragments of 20 rows for a size of 30):
    # the pace is counted in learner updates, not steps.
    trainer = Trainer("appo", "CartPole-v1", {**SMALL, "train_batch_size": 30, "target_update_frequency": 3})
    try:
        result = trainer.train()
        while result["info"][NUM_LEARNER_UPDATES] < 7:
            result = trainer.train()
        assert result["info"][NUM_TARGET_UPDATES] == result["info"][NUM_LEARNER_UPDATES] // 3
    finally:
        trainer.stop()


@pytest.mark.usefixtures("ray_session")
def test_aggregators_count_only_fresh_steps_as_sampled() -> None:
    config = {**SMALL, "num_aggregation_workers": 1, "num_cpus_per_aggregator": 0.1, "replay_proportion": 1.0}
    trainer = Trainer("impala", "CartPole-v1", config)
    try:
        for _ in range(3):
            result = trainer.train()
        sampled_by_workers = sum(trainer.workers.foreach_worker(lambda w: w.sampler.steps_sampled, local=False))
        # Replay doubles the rows trained on, but not the steps counted as sampled.
        assert result["timesteps_total"] <= sampled_by_workers
        assert result["timesteps_trained"] > 1.3 * result["timesteps_total"]
    finally:
        trainer.stop()
