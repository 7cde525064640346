"""Callbacks and custom metrics: the hooks run where and when they say, their metrics reach the
results over the smoothing window, their errors fail the iteration by name, and episodes in
progress survive checkpoints."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import ray.cloudpickle
from gymnasium import spaces

from flowrl import Trainer
from flowrl.actors import VectorSampler
from flowrl.actors.sampling.episode_hooks import EpisodeHooks
from flowrl.callbacks import Callbacks, Episode
from flowrl.config import TrainerConfig
from flowrl.errors import CallbackError, ConfigError, EnvError
from flowrl.operators.metric_ops import summarize_custom_metrics

pytestmark = [pytest.mark.unit, pytest.mark.timeout(300)]

# Ray's workers cannot import this module (pytest's pythonpath reaches only the test process):
# the env and callbacks classes below travel to them by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

LENGTHS = (3, 4, 5)


class CycleEnv(gym.Env[np.ndarray, int]):
    """Episodes of 3, 4, 5, 3, ... steps (per env), reward 1 per step; info ``final_t`` is the step count."""

    observation_space = spaces.Box(-1.0, 10.0, (2,), np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self, env_config: dict[str, Any] | None = None) -> None:
        self.episodes = 0
        self.t = 0
        self.length = LENGTHS[0]

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.length = LENGTHS[self.episodes % len(LENGTHS)]
        self.episodes += 1
        self.t = 0
        return np.zeros(2, np.float32), {"reset": True}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.t += 1
        info = {"final_t": self.t} if self.t == self.length else {}  # only the last step's info has it
        return np.array([self.t, 0.0], np.float32), 1.0, self.t >= self.length, False, info


class Recorder(Callbacks):
    """Counts hook calls, checks what the episode shows, and records a metric of its own."""

    def __init__(self) -> None:
        self.started = 0
        self.ended = 0
        self.samples = 0
        self.checkpoints: list[str] = []

    def on_episode_start(self, episode: Episode) -> None:
        assert episode.length == 0 and episode.last_info == {"reset": True}
        self.started += 1
        episode.user_data["rewards"] = []

    def on_episode_step(self, episode: Episode) -> None:
        episode.user_data["rewards"].append(episode.total_reward)

    def on_episode_end(self, episode: Episode) -> None:
        self.ended += 1
        assert episode.length == len(episode.user_data["rewards"]) == episode.last_obs[0]
        assert episode.custom_metrics["final_t"] == episode.length  # from custom_metrics_from_info, set first
        episode.custom_metrics["twice_return"] = 2 * episode.total_reward

    def on_sample_end(self, batch: Any, worker: Any) -> None:
        self.samples += 1

    def on_train_result(self, trainer: Trainer, result: dict[str, Any]) -> None:
        result["callback_episodes_in_driver"] = self.ended

    def on_checkpoint(self, trainer: Trainer, path: str) -> None:
        self.checkpoints.append(path)


class RaisesAtEnd(Callbacks):
    def on_episode_end(self, episode: Episode) -> None:
        raise ValueError("no metrics today")


class RaisesOnResult(Callbacks):
    def on_train_result(self, trainer: Trainer, result: dict[str, Any]) -> None:
        raise KeyError("missing")


class NotANumber(Callbacks):
    def on_episode_end(self, episode: Episode) -> None:
        episode.custom_metrics["label"] = "long"


def config(**overrides: Any) -> dict[str, Any]:
    return {
        "num_workers": 0,
        "num_cpus_per_worker": 0.5,
        "rollout_fragment_length": 20,
        "train_batch_size": 40,
        "seed": 0,
        "callbacks": Recorder,
        "custom_metrics_from_info": ["final_t"],
        **overrides,
    }


# --- config ---------------------------------------------------------------------------------------


def test_callbacks_config_takes_a_class_or_an_import_path() -> None:
    assert TrainerConfig.from_dict({"callbacks": Recorder}).callbacks is Recorder
    assert (
        TrainerConfig.from_dict({"callbacks": "flowrl.callbacks:Callbacks"}).callbacks == "flowrl.callbacks:Callbacks"
    )


def test_bad_callbacks_and_info_keys_are_config_errors_naming_them() -> None:
    with pytest.raises(ConfigError) as info:
        TrainerConfig.from_dict({"callbacks": "no_such_module:Nope", "custom_metrics_from_info": ["ok", 3]})
    assert len(info.value.problems) == 2
    assert "callbacks='no_such_module:Nope'" in info.value.problems[0] and "No module" in info.value.problems[0]
    assert "custom_metrics_from_info[1]=3" in info.value.problems[1]
    with pytest.raises(ConfigError, match="TrainerConfig is not a subclass of flowrl.callbacks.Callbacks"):
        TrainerConfig.from_dict({"callbacks": "flowrl.config:TrainerConfig"})
    with pytest.raises(ConfigError, match="must be a Callbacks subclass"):
        TrainerConfig.from_dict({"callbacks": Recorder()})


def test_summarize_custom_metrics_over_the_episodes_that_recorded_each() -> None:
    episodes = [{"custom_metrics": {"a": 1.0, "b": 5.0}}, {"custom_metrics": {"a": 3.0}}, {}]
    assert summarize_custom_metrics(episodes) == {
        "a_mean": 2.0,
        "a_min": 1.0,
        "a_max": 3.0,
        "b_mean": 5.0,
        "b_min": 5.0,
        "b_max": 5.0,
    }
    assert summarize_custom_metrics([]) == {}


# --- in a sampler, without Ray --------------------------------------------------------------------


class FirstAction:
    """A stand-in policy: always action 0."""

    postprocesses = True  # the sampler cuts its fragments into pieces, as for a postprocessing policy

    def compute_actions(self, obs: np.ndarray, **_: Any) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        return np.zeros(len(obs), np.int64), {}

    def postprocess_trajectory(self, batch: Any) -> Any:
        return batch


def test_sampler_runs_episode_hooks_and_reports_custom_metrics_per_episode() -> None:
    callbacks = Recorder()
    hooks = EpisodeHooks(callbacks, ["final_t", "absent"], worker_index=0, num_envs=2)
    sampler = VectorSampler([CycleEnv(), CycleEnv()], FirstAction(), fragment_length=12, hooks=hooks)
    sampler.sample()
    stats = sampler.pop_episode_stats()
    # 12 steps per env: episodes of 3, 4, 5 end in each, a fourth (3 steps) is in progress.
    assert [s.episode_length for s in stats] == [3, 3, 4, 4, 5, 5]
    assert [s.custom_metrics for s in stats] == [
        {"final_t": float(n), "twice_return": 2.0 * n} for n in (3, 3, 4, 4, 5, 5)
    ]
    assert callbacks.ended == 6 and callbacks.started == 8
    running = [episode for episode in hooks.episodes if episode is not None]
    assert [(e.env_index, e.length, e.total_reward) for e in running] == [(0, 0, 0.0), (1, 0, 0.0)]


def test_an_info_value_that_is_not_a_number_names_the_key() -> None:
    class WordInfo(CycleEnv):
        def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
            obs, reward, terminated, truncated, _ = super().step(action)
            return obs, reward, terminated, truncated, {"final_t": "done"}

    hooks = EpisodeHooks(Callbacks(), ["final_t"], worker_index=3, num_envs=1)
    sampler = VectorSampler([WordInfo()], FirstAction(), fragment_length=5, hooks=hooks)
    with pytest.raises(EnvError, match=r"info\['final_t'\]='done' \(worker 3, env 0, episode 1\) is not a real number"):
        sampler.sample()


def test_sampler_state_keeps_the_episodes_in_progress() -> None:
    def sampler() -> VectorSampler:
        hooks = EpisodeHooks(Recorder(), ["final_t"], worker_index=0, num_envs=1)
        return VectorSampler([CycleEnv()], FirstAction(), fragment_length=5, hooks=hooks)

    first = sampler()
    first.sample()  # an episode of 3 ended, one of 4 is 2 steps in
    assert len(first.pop_episode_stats()) == 1
    state = first.get_state()
    second = sampler()
    assert second.set_state(state) == []  # CycleEnv pickles mid-episode: nothing restarts
    assert second.hooks is not None and second.hooks.episodes[0] is not None
    assert second.hooks.episodes[0].user_data == {"rewards": [1.0, 2.0]}
    second.sample()
    [stats] = second.pop_episode_stats()
    assert (stats.episode_length, stats.custom_metrics) == (4, {"final_t": 4.0, "twice_return": 8.0})


# --- in a Trainer -------------------------------------------------------------------------------------


def flat_keys(result: dict[str, Any]) -> dict[str, Any]:
    """The result's ``custom_metrics`` as a logger flattens nested keys (``a/b``)."""
    return {f"custom_metrics/{name}": value for name, value in result["custom_metrics"].items()}


@pytest.mark.parametrize("num_workers", [0, 1])
def test_callbacks_count_episodes_and_custom_metrics_reach_the_results(
    ray_session: None, num_workers: int, tmp_path: Path
) -> None:
    trainer = Trainer("pg", CycleEnv, config(num_workers=num_workers, metrics_smoothing_episodes=4))
    try:
        for _ in range(3):
            result = trainer.train()
            # The window is the last 4 episodes, of lengths cycling 3, 4, 5 in the one env.
            lengths = [LENGTHS[i % 3] for i in range(result["episodes_total"])][-4:]
            expected = {"mean": float(np.mean(lengths)), "min": float(min(lengths)), "max": float(max(lengths))}
            assert result["episode_len_mean"] == expected["mean"]
            flat = flat_keys(result)
            for stat, value in expected.items():
                assert flat[f"custom_metrics/final_t_{stat}"] == value
                assert flat[f"custom_metrics/twice_return_{stat}"] == 2 * value
        counts = trainer.workers.foreach_worker(lambda w: (w.callbacks.ended, w.callbacks.samples))
        sampling = counts[-1]  # the worker that samples: the only remote one, or the local one
        assert sampling[0] == result["episodes_total"]
        assert sampling[1] == 3 * 2  # two fragments of 20 steps per train batch of 40
        assert result["callback_episodes_in_driver"] == (result["episodes_total"] if num_workers == 0 else 0)
        path = trainer.save(tmp_path)
        assert trainer.callbacks.checkpoints == [path]
    finally:
        trainer.stop()


def test_custom_metrics_survive_save_and_restore(ray_session: None, tmp_path: Path) -> None:
    trainer = Trainer("pg", CycleEnv, config(num_workers=1))
    try:
        trainer.train()
        path = trainer.save(tmp_path)
        before = trainer.train()
    finally:
        trainer.stop()
    restored = Trainer.from_checkpoint(path)
    try:
        after = restored.train()
    finally:
        restored.stop()
    assert after["custom_metrics"] == before["custom_metrics"]
    assert after["episodes_total"] == before["episodes_total"]


@pytest.mark.parametrize("num_workers", [0, 1])
def test_a_raising_episode_hook_fails_the_iteration_naming_class_and_hook(ray_session: None, num_workers: int) -> None:
    trainer = Trainer("pg", CycleEnv, config(num_workers=num_workers, callbacks=RaisesAtEnd))
    try:
        with pytest.raises(CallbackError) as info:
            trainer.train()
        message = str(info.value)
        assert "RaisesAtEnd.on_episode_end raised ValueError: no metrics today" in message
        assert f"worker {num_workers}, env 0" in message
        assert trainer.workers.num_worker_restarts == 0  # not a worker fault: nothing restarted
    finally:
        trainer.stop()


def test_driver_hook_errors_and_non_numeric_metrics_are_callback_errors(ray_session: None) -> None:
    trainer = Trainer("pg", CycleEnv, config(callbacks=RaisesOnResult))
    try:
        with pytest.raises(
            CallbackError, match=r"RaisesOnResult.on_train_result raised KeyError: 'missing' \(driver, iteration 1\)"
        ):
            trainer.train()
    finally:
        trainer.stop()
    trainer = Trainer("pg", CycleEnv, config(callbacks=NotANumber))
    try:
        with pytest.raises(CallbackError, match=r"custom_metrics\['label'\]='long'"):
            trainer.train()
    finally:
        trainer.stop()


class AgentCount(Callbacks):
    def on_episode_end(self, episode: Episode) -> None:
        episode.custom_metrics["agents_seen"] = len(episode.agent_infos)
        episode.custom_metrics["length"] = episode.length


def test_multi_agent_episodes_run_the_same_hooks(ray_session: None) -> None:
    trainer = Trainer(
        "ppo",
        "MultiAgentCartPole",
        {
            "num_workers": 0,
            "env_config": {"num_agents": 2},
            "rollout_fragment_length": 100,
            "train_batch_size": 200,
            "sgd_minibatch_size": 50,
            "num_sgd_iter": 1,
            "seed": 0,
            "callbacks": AgentCount,
        },
    )
    try:
        result = trainer.train()
        while result["episodes_this_iter"] == 0:
            result = trainer.train()
    finally:
        trainer.stop()
    metrics = result["custom_metrics"]
    assert metrics["agents_seen_min"] == metrics["agents_seen_max"] == 2.0
    assert metrics["length_mean"] == result["episode_len_mean"]
