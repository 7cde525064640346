"""Learner groups: 2 gloo learner actors take one learner's steps, survive a killed learner, hand back their
state, follow what the driver changes, and run under a Trainer (``num_learners``) with checkpoints and faults."""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np
import pytest
import ray

from flowrl import Trainer
from flowrl.actors.learner_group import LearnerGroup
from flowrl.actors.learner_thread import learn_on_local_worker
from flowrl.data import SampleBatch
from flowrl.errors import ConfigError, NonFiniteUpdateError

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("ray_session"), pytest.mark.timeout(240)]

PPO = {
    "num_workers": 0,
    "seed": 0,
    "train_batch_size": 128,
    "rollout_fragment_length": 128,
    "model": {"fcnet_hiddens": [16, 16]},
}
SGD = {"num_sgd_iter": 2, "sgd_minibatch_size": 64, "seed": 5}


def weights(trainer: Trainer) -> dict[str, np.ndarray]:
    return trainer.workers.local_worker().get_weights()["default_policy"]


def test_two_learners_take_the_single_learners_steps_and_survive_a_killed_one() -> None:
    with Trainer("ppo", "CartPole-v1", PPO) as single, Trainer("ppo", "CartPole-v1", PPO) as grouped:
        batch = single.workers.local_worker().sample()
        group = LearnerGroup(grouped.workers, ["default_policy"], 2, timeout_s=60, num_cpus=0.1)
        try:
            learned = group.learn(batch, **SGD)
            learn_on_local_worker(single.workers.local_worker(), batch, **SGD)
            assert learned.steps == batch.count and set(learned.info) == {"default_policy"}
            for name, value in weights(single).items():
                np.testing.assert_allclose(weights(grouped)[name], value, atol=1e-5, rtol=0, err_msg=name)

            ray.kill(group.actors[1])  # a learner lost mid-run: rebuilt from the driver's policy, batch learned again
            group.learn(batch, **SGD)
            learn_on_local_worker(single.workers.local_worker(), batch, **SGD)
            assert group.num_restarts == 1
            # The driver follows rank 0, optimizer moments included: it equals the single learner's policy.
            state: dict[str, Any] = grouped.workers.local_worker().get_policy().get_state()
            expected: dict[str, Any] = single.workers.local_worker().get_policy().get_state()
            for name, value in expected["weights"].items():
                np.testing.assert_allclose(state["weights"][name], value, atol=1e-5, rtol=0, err_msg=name)
            moments = [s["optimizer"]["state"][0]["exp_avg"].numpy() for s in (state, expected)]
            np.testing.assert_allclose(moments[0], moments[1], atol=1e-5, rtol=0)
        finally:
            group.stop()


GROUP = {"num_learners": 2, "num_cpus_per_learner": 0.25, "learner_timeout_s": 60}


def replica_states(trainer: Trainer, pid: str = "default_policy") -> list[dict[str, Any]]:
    """Each learner actor's state of policy ``pid``, rank 0 first."""
    assert trainer.resources.learners is not None
    return [ray.get(actor.get_state.remote([pid]), timeout=60)[pid] for actor in trainer.resources.learners.actors]


def assert_replicas_equal_the_driver(trainer: Trainer, *, target: bool = False) -> None:
    """Every replica holds the driver's weights (and target networks: their moves since the last update
    travel with the next one, so they are made first here), read between two updates."""
    learner = trainer.resources.learner
    with learner.lock if learner is not None else contextlib.nullcontext():
        if target and trainer.resources.learners is not None:
            trainer.resources.learners.flush_targets()
        for pid in trainer.workers.trainable_policies():
            driver = trainer.workers.local_worker().get_policy(pid).get_state()
            for rank, state in enumerate(replica_states(trainer, pid)):
                for name, value in driver["weights"].items():
                    np.testing.assert_allclose(
                        state["weights"][name], value, atol=1e-6, rtol=0, err_msg=f"rank {rank}: {pid} {name}"
                    )
                if target and driver.get("target") is not None:
                    for name, value in driver["target"].items():
                        np.testing.assert_allclose(
                            state["target"][name].numpy(),
                            value.numpy(),
                            atol=1e-6,
                            rtol=0,
                            err_msg=f"rank {rank}: {pid} target {name}",
                        )


def test_a_trainer_with_two_learners_trains_through_them_and_rebuilds_a_killed_one() -> None:
    with Trainer("ppo", "CartPole-v1", {**PPO, **GROUP, **SGD}) as trainer:
        group = trainer.resources.learners
        assert group is not None and len(group.actors) == 2
        first = trainer.train()
        assert first["num_learner_restarts"] == 0
        assert {"policy_loss", "kl"} <= set(first["info"]["learner"]["default_policy"])  # the replicas' statistics
        learner = first["plan"]["learner"]  # the driver learns nothing itself: rank 0 reports its phases
        assert learner["load_s"] > 0 and learner["update_s"] > 0
        assert_replicas_equal_the_driver(trainer)

        ray.kill(group.actors[1])
        results = [trainer.train() for _ in range(2)]
        assert [r["num_learner_restarts"] for r in results] == [1, 1]
        assert results[-1]["timesteps_total"] == 3 * PPO["train_batch_size"]
        assert_replicas_equal_the_driver(trainer)


SMALL_WORKERS = {"num_workers": 1, "num_cpus_per_worker": 0.1}
REPLAY = {"learning_starts": 64, "train_batch_size": 32, "timesteps_per_iteration": 100}
# Every other algorithm that trains in a learner group, small: TrainOneStep's plans, the learner thread's
# (IMPALA's is a learning test), target networks moved on the replicas, and a composed plan.
GROUP_PLANS = {
    "pg": ("CartPole-v1", {"num_workers": 0, "train_batch_size": 64}),
    "a2c": ("CartPole-v1", {"num_workers": 0, "train_batch_size": 64}),
    "ddpg": ("Pendulum-v1", {"num_workers": 0, **REPLAY}),
    "td3": ("Pendulum-v1", {"num_workers": 0, **REPLAY}),
    "sac": ("Pendulum-v1", {"num_workers": 0, **REPLAY}),
    "apex": ("CartPole-v1", {**SMALL_WORKERS, **REPLAY, "num_replay_shards": 1}),
    "appo": ("CartPole-v1", {**SMALL_WORKERS, "train_batch_size": 100, "timesteps_per_iteration": 400}),
    "ppo_dqn": ("MultiAgentCartPole", {"num_workers": 0}),
}


@pytest.mark.parametrize("algo", sorted(GROUP_PLANS))
def test_every_group_plan_trains_its_replicas_in_step_with_the_driver(algo: str) -> None:
    env, config = GROUP_PLANS[algo]
    with Trainer(algo, env, {**config, **GROUP, "seed": 0}) as trainer:
        results = [trainer.train() for _ in range(2)]
        assert results[-1]["timesteps_trained"] > 0 and results[-1]["info"]["learner"]
        assert results[-1]["num_learner_restarts"] == 0
        assert_replicas_equal_the_driver(trainer, target=True)


def test_a_checkpoint_of_a_group_run_restores_into_every_replica(tmp_path: Any) -> None:
    config = {**PPO, **GROUP, **SGD}
    with Trainer("ppo", "CartPole-v1", config) as trainer:
        for _ in range(2):
            trainer.train()
        ray.kill(trainer.resources.learners.actors[0])
        trainer.train()
        path = trainer.save(tmp_path)
        saved = weights(trainer)
    with Trainer("ppo", "CartPole-v1", config) as restored:
        before = replica_states(restored)[0]["weights"]
        restored.restore(path)
        for name, value in saved.items():
            np.testing.assert_array_equal(weights(restored)[name], value, err_msg=name)
            assert not np.array_equal(before[name], value), name  # the replicas really moved to the checkpoint
        assert_replicas_equal_the_driver(restored)
        result = restored.train()
        assert result["num_learner_restarts"] == 1  # the whole run's count, kept in the checkpoint
        assert result["training_iteration"] == 4


def test_replicas_follow_the_drivers_targets_coefficients_and_live_config() -> None:
    dqn = {
        "num_workers": 0,
        "seed": 0,
        "learning_starts": 64,
        "train_batch_size": 32,
        "rollout_fragment_length": 16,
        "target_network_update_freq": 64,
        "timesteps_per_iteration": 200,
        "model": {"fcnet_hiddens": [16]},
        **GROUP,
    }
    with Trainer("dqn", "CartPole-v1", dqn) as trainer:
        result = trainer.train()
        assert result["info"]["num_target_updates"] >= 2
        assert_replicas_equal_the_driver(trainer, target=True)
        trainer.update_config({"lr": 1e-4})
        for state in replica_states(trainer):
            assert [group["lr"] for group in state["optimizer"]["param_groups"]] == [1e-4]
        # A learner lost between updates: the change that finds it dead rebuilds the group, which has it too.
        ray.kill(trainer.resources.learners.actors[0])
        trainer.update_config({"lr": 2e-4})
        assert trainer.resources.learners.num_restarts == 1
        for state in replica_states(trainer):
            assert [group["lr"] for group in state["optimizer"]["param_groups"]] == [2e-4]
        assert_replicas_equal_the_driver(trainer, target=True)

    with Trainer("ppo", "CartPole-v1", {**PPO, **GROUP, **SGD}) as trainer:
        local = trainer.workers.local_worker()
        local.get_policy().coeffs["kl_coeff"] = 0.123  # what UpdateKL does between rounds
        trainer.resources.learners.learn(local.sample(), **SGD)
        assert [state["coeffs"]["kl_coeff"] for state in replica_states(trainer)] == [0.123, 0.123]


def test_a_nonfinite_batch_is_skipped_by_every_replica_counted_and_capped_not_restarted() -> None:
    config = {**PPO, **GROUP, "max_consecutive_nonfinite_updates": 2}
    with Trainer("ppo", "CartPole-v1", config) as trainer:
        local, group = trainer.workers.local_worker(), trainer.resources.learners
        batch = local.sample()
        batch[SampleBatch.ADVANTAGES][3] = np.nan  # in rank 0's half: rank 1's finite loss is skipped too
        before = weights(trainer)
        group.learn(batch)
        assert local.get_policy().num_nonfinite_updates == 1
        for name, value in before.items():
            np.testing.assert_array_equal(weights(trainer)[name], value, err_msg=name)
        assert_replicas_equal_the_driver(trainer)
        with pytest.raises(NonFiniteUpdateError, match="2 updates in a row"):
            group.learn(batch)
        # A learner's own error is the run's error, not a lost learner: raised as it is, no rebuild.
        with pytest.raises(ValueError, match="cannot be shared by 2 learners"):
            group.learn(batch.slice(0, 1))
        assert group.num_restarts == 0


def test_learner_group_settings_are_checked_before_anything_starts() -> None:
    with pytest.raises(ConfigError, match=r"num_learners=2: 'a3c' does not train in a learner group.*ppo"):
        Trainer("a3c", "CartPole-v1", {"num_workers": 1, "num_learners": 2})
    with pytest.raises(ConfigError, match=r"num_gpus_per_learner=0.5: each learner of a group needs whole GPUs"):
        Trainer("ppo", "CartPole-v1", {"num_workers": 0, "num_learners": 2, "num_gpus_per_learner": 0.5})
    with pytest.raises(
        ConfigError, match=r"num_learners=2 x num_gpus_per_learner=1 needs 2 GPU, but the Ray cluster has 0"
    ):
        Trainer("ppo", "CartPole-v1", {"num_workers": 0, "num_learners": 2, "num_gpus_per_learner": 1})
    with pytest.raises(ConfigError, match=r"num_learners=4 learners share each minibatch of 100 steps .* it has 2"):
        Trainer("impala", "CartPole-v1", {"num_learners": 4, "sgd_minibatch_size": 100, "rollout_fragment_length": 50})
    with pytest.raises(ConfigError, match=r"dqn\['num_learners'\]: one learner group trains both policies"):
        Trainer("ppo_dqn", "MultiAgentCartPole", {"dqn": {"num_learners": 2}})
