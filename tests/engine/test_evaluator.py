"""Evaluation during training: when it runs, what it reports, what it leaves alone, its actors' faults,
and the best checkpoint a run keeps by it."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import ray
from fakes import checkpoints, progress

from flowrl import Trainer
from flowrl.actors.evaluation import episode_seeds, evaluation_request, split_seeds
from flowrl.algorithms.ppo import PPOConfig
from flowrl.envs.testing import FaultInjectEnv
from flowrl.errors import ConfigError
from flowrl.runs.resume import find_resume_point, resume_run
from flowrl.runs.run import start_run
from flowrl.storage.rundir import RunSpec, stop_reason

pytestmark = pytest.mark.unit

# One process, two tiny SGD steps per iteration; a short CartPole episode per evaluation episode.
PPO_TINY = {
    "num_workers": 0,
    "train_batch_size": 64,
    "rollout_fragment_length": 32,
    "sgd_minibatch_size": 32,
    "seed": 0,
}
EVALUATION = {"evaluation_interval": 2, "evaluation_num_episodes": 3}
EVALUATION_KEYS = {"episode_reward_mean", "episode_reward_min", "episode_reward_max", "episode_len_mean", "episodes"}


def train(trainer: Trainer, iterations: int) -> list[dict[str, Any]]:
    return [trainer.train() for _ in range(iterations)]


# --- config and helpers (no Ray) -----------------------------------------------------------------------


def test_evaluation_config_is_checked_as_config_keys() -> None:
    with pytest.raises(ConfigError) as caught:
        PPOConfig.from_dict(
            {
                "evaluation_interval": 1,
                "evaluation_config": {"lrr": 0.1, "explore": 1, "evaluation_interval": 3, "clip_param": -1},
            }
        )
    assert caught.value.problems == [
        "evaluation_config: unknown config key 'lrr'; did you mean 'lr'?",
        "evaluation_config: explore=1 must be a bool, got int",
        "evaluation_config sets 'evaluation_interval': evaluation keys go at the top level of the config",
        "evaluation_config: clip_param=-1 must be > 0",
    ]
    with pytest.raises(
        ConfigError, match="evaluation_video=True records evaluation episodes, but evaluation_interval=None"
    ):
        PPOConfig.from_dict({"evaluation_video": True})
    # An algorithm's own keys are valid there; evaluation is deterministic unless it says otherwise.
    config = PPOConfig.from_dict(
        {"evaluation_interval": 1, "evaluation_config": {"clip_param": 0.1, "env_config": {"x": 1}}}
    )
    assert config.evaluation_config == {"clip_param": 0.1, "env_config": {"x": 1}}


def test_each_evaluation_worker_plays_a_run_of_the_seeds() -> None:
    assert episode_seeds(7, 3) == [7, 8, 9] and episode_seeds(None, 2) == [None, None]
    assert split_seeds([0, 1, 2, 3, 4], 2) == [[0, 1, 2], [3, 4]]
    assert split_seeds([0, 1], 3) == [[0], [1], []]


def test_evaluation_workers_are_reserved_only_while_evaluation_is_on() -> None:
    off = evaluation_request(PPOConfig.from_dict({"evaluation_num_workers": 2}))
    assert off.count == 0
    on = evaluation_request(
        PPOConfig.from_dict(
            {"evaluation_interval": 1, "evaluation_num_workers": 2, "evaluation_config": {"num_cpus_per_worker": 0.5}}
        )
    )
    assert (on.count, on.bundle()) == (2, {"CPU": 0.5})
    assert on.term("CPU") == "evaluation_num_workers=2 x evaluation_config['num_cpus_per_worker']=0.5"


def test_a_tune_trial_reserves_its_evaluation_workers() -> None:
    pytest.importorskip("ray.tune")
    from flowrl.tune.trainable import trial_resources

    config = {
        "num_workers": 1,
        "evaluation_interval": 1,
        "evaluation_num_workers": 2,
        "evaluation_config": {"num_cpus_per_worker": 0.5},
    }
    # The trainable's bundle, the rollout worker's, then the evaluation workers': as the Trainer reserves them.
    assert trial_resources("ppo", config).bundles[1:] == [{"CPU": 1.0}, {"CPU": 0.5}, {"CPU": 0.5}]


def test_an_evaluation_reward_can_stop_a_run() -> None:
    stop = {"evaluation/episode_reward_mean": 100}
    assert stop_reason(stop, {"episode_reward_mean": 500.0}) is None  # iterations without an evaluation never stop it
    assert (
        stop_reason(stop, {"evaluation": {"episode_reward_mean": 120.0}}) == "evaluation/episode_reward_mean 120 >= 100"
    )


# --- evaluation in a trainer ---------------------------------------------------------------------------


@pytest.mark.parametrize("evaluation_num_workers", [0, 1])
def test_a_synchronous_trainer_evaluates_every_interval_with_the_current_weights(
    evaluation_num_workers: int, ray_session: None
) -> None:
    trainer = Trainer(
        "ppo", "CartPole-v1", {**PPO_TINY, **EVALUATION, "evaluation_num_workers": evaluation_num_workers}
    )
    try:
        results = train(trainer, 4)
        # A deterministic evaluation of the weights as they are now, with the same episode seeds.
        again = trainer.evaluate(num_episodes=3, seed=PPO_TINY["seed"])
    finally:
        trainer.stop()
    assert ["evaluation" in r for r in results] == [False, True, False, True]
    for result in results[1::2]:
        assert set(result["evaluation"]) == EVALUATION_KEYS and result["evaluation"]["episodes"] == 3
        assert 1 <= result["evaluation"]["episode_reward_min"] <= result["evaluation"]["episode_reward_max"] <= 500
    assert all(r["num_evaluation_worker_restarts"] == 0 for r in results)
    assert results[-1]["evaluation"] == again


def test_evaluation_episodes_count_neither_as_steps_nor_as_training_episodes(ray_session: None) -> None:
    keys = ("timesteps_total", "episodes_total", "episodes_this_iter", "episode_reward_mean", "episode_len_mean")

    def run(config: dict[str, Any]) -> list[tuple[Any, ...]]:
        trainer = Trainer("ppo", "CartPole-v1", config)
        try:
            return [tuple(r[key] for key in keys) for r in train(trainer, 2)]
        finally:
            trainer.stop()

    # Same seed, same training: evaluation changes nothing the training reports.
    assert run({**PPO_TINY, "evaluation_interval": 1, "evaluation_num_episodes": 5}) == run(PPO_TINY)


def test_an_asynchronous_trainer_evaluates_while_the_iteration_trains(
    ray_session: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = {
        "num_workers": 1,
        "num_cpus_per_worker": 0.25,
        "num_envs_per_worker": 2,
        "rollout_fragment_length": 10,
        "train_batch_size": 40,
        "timesteps_per_iteration": 100,
        "seed": 0,
        **EVALUATION,
        "evaluation_num_workers": 1,
    }
    trainer = Trainer("impala", "CartPole-v1", config)
    try:
        remote = trainer.evaluator._remote
        assert trainer.evaluator.parallel and remote is not None
        started_after: list[int] = []  # the iterations finished when each round was sent
        real_start = remote.start

        def start(*args: Any, **kwargs: Any) -> None:
            started_after.append(trainer.iteration)
            real_start(*args, **kwargs)

        monkeypatch.setattr(remote, "start", start)
        results = train(trainer, 4)
    finally:
        trainer.stop()
    assert started_after == [1, 3]  # sent before iterations 2 and 4 trained, collected after
    assert ["evaluation" in r for r in results] == [False, True, False, True]
    assert all(r["evaluation"]["episodes"] == 3 for r in results[1::2])


def test_a_killed_evaluation_actor_is_recreated_and_counted(ray_session: None) -> None:
    trainer = Trainer(
        "ppo",
        "CartPole-v1",
        {**PPO_TINY, "evaluation_interval": 1, "evaluation_num_episodes": 2, "evaluation_num_workers": 1},
    )
    try:
        first = trainer.train()
        remote = trainer.evaluator._remote
        assert remote is not None
        killed = remote.actors[0]
        ray.kill(killed, no_restart=True)
        second, third = train(trainer, 2)
        assert remote.actors[0] is not killed
        restored_count = trainer.get_state()["evaluation"]
    finally:
        trainer.stop()
    assert first["num_evaluation_worker_restarts"] == 0
    # The replacement played the lost episodes: the evaluation is whole, and the run goes on.
    assert second["num_evaluation_worker_restarts"] == third["num_evaluation_worker_restarts"] == 1
    assert second["evaluation"]["episodes"] == third["evaluation"]["episodes"] == 2
    assert restored_count == {"num_evaluation_worker_restarts": 1}


def test_a_hung_evaluation_actor_is_given_up_after_sample_timeout_s(ray_session: None) -> None:
    # Only the evaluation's envs hang (in reset, for ever): evaluation_config gives them the fault.
    hang = {"env": "CartPole-v1", "faults": [{"kind": "hang", "on_reset": True, "worker_indices": [0]}]}
    config = {
        **PPO_TINY,
        "env_config": {"env": "CartPole-v1"},
        "sample_timeout_s": 2.0,
        "evaluation_interval": 1,
        "evaluation_num_episodes": 2,
        "evaluation_num_workers": 1,
        "evaluation_config": {"env_config": hang},
    }
    trainer = Trainer("ppo", FaultInjectEnv, config)
    try:
        first, second = train(trainer, 2)
    finally:
        trainer.stop()
    # Each round waited sample_timeout_s, then killed and recreated the actor; the training went on.
    assert [r["num_evaluation_worker_restarts"] for r in (first, second)] == [1, 2]
    assert first["evaluation"]["episodes"] == 0 and math.isnan(first["evaluation"]["episode_reward_mean"])
    assert [r["timesteps_total"] for r in (first, second)] == [64, 128]


def test_multi_agent_evaluation_reports_each_policys_reward(ray_session: None) -> None:
    config = {
        "num_workers": 0,
        "rollout_fragment_length": 20,
        "train_batch_size": 40,
        "sgd_minibatch_size": 20,
        "seed": 0,
        "policies": {"even": None, "odd": None},
        "policy_mapping_fn": by_parity,
        "evaluation_interval": 1,
        "evaluation_num_episodes": 2,
    }
    trainer = Trainer("ppo", "MultiAgentCartPole", config)
    try:
        (result,) = train(trainer, 1)
    finally:
        trainer.stop()
    assert result["evaluation"]["episodes"] == 2
    assert set(result["evaluation"]["policy_reward_mean"]) == {"even", "odd"}


def test_ppo_dqn_evaluates_both_of_its_policies(ray_session: None) -> None:
    # ppo_dqn keeps explore per policy: evaluation acts greedily without setting the key.
    config = {
        "num_workers": 1,
        "num_cpus_per_worker": 0.25,
        "rollout_fragment_length": 20,
        "seed": 0,
        "ppo": {"train_batch_size": 160, "sgd_minibatch_size": 40, "num_sgd_iter": 2},
        "dqn": {"learning_starts": 100},
        "evaluation_interval": 1,
        "evaluation_num_episodes": 2,
    }
    trainer = Trainer("ppo_dqn", "MultiAgentCartPole", config)
    try:
        (result,) = train(trainer, 1)
    finally:
        trainer.stop()
    assert result["evaluation"]["episodes"] == 2
    assert set(result["evaluation"]["policy_reward_mean"]) == {"ppo_policy", "dqn_policy"}


def by_parity(agent: int) -> str:
    return "even" if agent % 2 == 0 else "odd"


# --- the best checkpoint -------------------------------------------------------------------------------


def test_the_best_checkpoint_is_the_best_evaluated_one(
    tmp_path: Path, ray_session: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Evaluation rewards go up, then down; iterations 1, 3 and 5 have no evaluation.
    rewards = {2: 5.0, 4: 9.0, 6: 3.0}
    config = {**PPO_TINY, "evaluation_interval": 2, "evaluation_num_episodes": 1}
    spec = RunSpec("ppo", "CartPole-v1", config, stop={"training_iteration": 6})
    with start_run(spec, results_dir=tmp_path) as run:
        real_train = run.trainer.train

        def train_with_rewards() -> dict[str, Any]:
            result = real_train()
            if "evaluation" in result:
                result["evaluation"]["episode_reward_mean"] = rewards[result["training_iteration"]]
            return result

        monkeypatch.setattr(run.trainer, "train", train_with_rewards)
        run.train()
    assert run.spec.keep_best == "evaluation/episode_reward_mean"  # the default once evaluation is on
    assert json.loads((run.directory / "params.json").read_text())["keep_best"] == "evaluation/episode_reward_mean"
    # No regular cadence here (checkpoint_freq 0): iterations 2 and 4 were saved because they beat the best.
    assert checkpoints(run.directory) == ["best", "checkpoint_000002", "checkpoint_000004", "checkpoint_000006"]
    best = json.loads((run.directory / "checkpoints" / "best" / "metadata.json").read_text())
    assert best["iteration"] == 4 and best["keep_best"] == {"metric": "evaluation/episode_reward_mean", "value": 9.0}


def test_a_real_run_keeps_the_checkpoint_of_its_best_evaluation(tmp_path: Path, ray_session: None) -> None:
    config = {
        "num_workers": 0,
        "train_batch_size": 64,
        "rollout_fragment_length": 32,
        "lr": 0.01,
        "seed": 1,
        "evaluation_interval": 1,
        "evaluation_num_episodes": 2,
    }
    spec = RunSpec("pg", "CartPole-v1", config, stop={"training_iteration": 4}, checkpoint_freq=2)
    with start_run(spec, results_dir=tmp_path) as run:
        run.train()
    evaluated = {r["training_iteration"]: r["evaluation"]["episode_reward_mean"] for r in progress(run.directory)}
    top = max(evaluated.values())
    first_top = min(i for i, reward in evaluated.items() if reward == top)  # a tie does not replace the best
    best = json.loads((run.directory / "checkpoints" / "best" / "metadata.json").read_text())
    assert best["iteration"] == first_top and math.isclose(best["keep_best"]["value"], top)

    # A resumed run knows the best so far: only a better evaluation replaces it.
    point = find_resume_point(run.directory, stop={"training_iteration": 5})
    with resume_run(point) as resumed:
        assert resumed.spec.keep_best == "evaluation/episode_reward_mean"
        resumed.train()
    fifth = progress(run.directory)[-1]["evaluation"]["episode_reward_mean"]
    best = json.loads((run.directory / "checkpoints" / "best" / "metadata.json").read_text())
    assert best["iteration"] == (5 if fifth > top else first_top)
