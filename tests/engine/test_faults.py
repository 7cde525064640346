"""Runs survive faults: worker failures, hangs, stragglers, bad data and lost resources, each counted.

Every test injects its fault (a FaultInjectEnv fault, a killed actor) into a small seeded run
and asserts the exact counts in the result dict. All share the test session's Ray instance
(2 CPUs), so workers take fractional CPUs.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Iterator

import fakes
import pytest
import ray

from flowrl import Trainer
from flowrl.actors.restart_budget import restart_delay_s
from flowrl.envs.testing import FaultInjectEnv, faults_fired, remove_fault_counter
from flowrl.errors import (
    BadObservationError,
    ConfigError,
    FlowRLError,
    PlanStoppedError,
    ResourceUnavailableError,
    WorkerFailureError,
)

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("ray_session"), pytest.mark.timeout(180)]

FAULT_KEYS = (
    "num_healthy_workers",
    "num_worker_restarts",
    "num_faulty_episodes",
    "num_bad_observations",
    "num_nonfinite_updates",
    "num_late_fragments",
    "num_replay_shard_restarts",
)

# Small, fast settings per algorithm family: a few hundred env steps per iteration.
SMALL = {
    "ppo": {"train_batch_size": 400, "sgd_minibatch_size": 100, "num_sgd_iter": 2, "rollout_fragment_length": 100},
    "a3c": {"rollout_fragment_length": 50},
    "impala": {"train_batch_size": 200, "rollout_fragment_length": 50, "num_envs_per_worker": 2},
    "apex": {
        "learning_starts": 200,
        "timesteps_per_iteration": 400,
        "num_envs_per_worker": 2,
        "rollout_fragment_length": 25,
    },
    "es": {"episodes_per_batch": 8, "train_batch_size": 50, "noise_table_size": 100_000, "eval_prob": 1.0},
}


def fault_env(counter: str, *faults: dict[str, Any], env: str = "CartPole-v1") -> dict[str, Any]:
    """An env_config for FaultInjectEnv around ``env`` with ``faults``, counted under ``counter``."""
    return {"env": env, "fault_counter": counter, "faults": list(faults)}


@pytest.fixture
def counter(request: pytest.FixtureRequest) -> Iterator[str]:
    """A fault counter name of this test's own, removed afterwards."""
    name = request.node.name
    yield name
    remove_fault_counter(name)


def make_trainer(algo: str, env: Any = "CartPole-v1", **config: Any) -> Trainer:
    return Trainer(
        algo=algo, env=env, config={"num_workers": 2, "num_cpus_per_worker": 0.25, "seed": 0, **SMALL[algo], **config}
    )


def train_until(trainer: Trainer, done: Any, max_iterations: int = 20, within_s: float = 0.0) -> dict[str, Any]:
    """``train()`` until ``done(result)`` (at most ``max_iterations`` times, or, if longer, for ``within_s``
    seconds: a replacement starts in the background, however short the iterations); the last result."""
    started, iterations = time.monotonic(), 0
    while iterations < max_iterations or time.monotonic() - started < within_s:
        result = trainer.train()
        iterations += 1
        if done(result):
            return result
    raise AssertionError(f"not done after {iterations} iterations: { {k: result[k] for k in FAULT_KEYS} }")


# -- where envs run ---------------------------------------------------------------------


def test_env_creators_learn_where_they_run() -> None:
    trainer = make_trainer("ppo", fakes.RecordsContext, num_envs_per_worker=2, env_config={"size": 3})
    try:
        contexts = trainer.workers.foreach_worker(lambda w: [(e.context, e.user_keys) for e in w.envs])
        assert contexts == [
            [((0, 0, 2, False), {"size": 3}), ((0, 1, 2, False), {"size": 3})],
            [((1, 0, 2, False), {"size": 3}), ((1, 1, 2, False), {"size": 3})],
            [((2, 0, 2, False), {"size": 3}), ((2, 1, 2, False), {"size": 3})],
        ]
        ray.kill(trainer.workers.remote_workers()[0], no_restart=True)
        fakes.is_dead(trainer.workers.remote_workers()[0])
        trainer.workers.probe_unhealthy_workers()
        replaced = trainer.workers.foreach_worker(lambda w: [e.context for e in w.envs], local=False)
        assert replaced[0] == [(1, 0, 2, True), (1, 1, 2, True)]
    finally:
        trainer.stop()


# -- application errors and deaths --------------------------------------------------------


@pytest.mark.parametrize("algo", ["ppo", "impala", "apex"])
def test_an_env_raising_in_step_restarts_its_worker_and_training_goes_on(algo: str, counter: str) -> None:
    fault = {"kind": "raise", "worker_indices": [1], "at_step": 120, "times": 1}
    trainer = make_trainer(algo, FaultInjectEnv, env_config=fault_env(counter, fault))
    try:
        # An asynchronous plan's iterations can be short on a loaded machine: worker 1 may need many to reach step 120.
        result = train_until(trainer, lambda r: r["num_worker_restarts"] == 1, max_iterations=100)
        steps = result["timesteps_total"]
        # Training goes on, and the replacement rejoins once started (the driver does not wait for it).
        result = train_until(
            trainer, lambda r: r["timesteps_total"] > steps and r["num_healthy_workers"] == 2, within_s=60
        )
        assert result["num_worker_restarts"] == 1 and result["num_healthy_workers"] == 2
        assert faults_fired(counter) == {"raise#0": 1}
    finally:
        trainer.stop()


def test_restart_failed_sub_environments_recreates_only_the_env(counter: str) -> None:
    fault = {"kind": "raise", "worker_indices": [1], "at_step": 50, "times": 1}
    trainer = make_trainer(
        "ppo", FaultInjectEnv, restart_failed_sub_environments=True, env_config=fault_env(counter, fault)
    )
    try:
        result = train_until(trainer, lambda r: r["num_faulty_episodes"] == 1)
        assert result["num_worker_restarts"] == 0
        assert faults_fired(counter) == {"raise#0": 1}
    finally:
        trainer.stop()


def test_a_hung_env_is_timed_out_and_its_worker_replaced(counter: str) -> None:
    fault = {"kind": "hang", "worker_indices": [2], "at_step": 150, "times": 1}
    # The hang lasts for ever (10**6 s): 2 s without a step is as clearly a hang as 5 s, found 3 s sooner.
    trainer = make_trainer("ppo", FaultInjectEnv, sample_timeout_s=2.0, env_config=fault_env(counter, fault))
    try:
        result = train_until(
            trainer, lambda r: r["num_worker_restarts"] == 1 and r["num_healthy_workers"] == 2, within_s=60
        )
        assert result["num_workers_missing"] == 0
        assert trainer.train()["num_worker_restarts"] == 1
    finally:
        trainer.stop()


def kill_one(trainer: Trainer, position: int = 0) -> None:
    worker = trainer.workers.remote_workers()[position]
    ray.kill(worker, no_restart=True)
    fakes.is_dead(worker)


@pytest.mark.parametrize(
    "algo, config",
    [
        ("ppo", {}),
        ("a3c", {}),
        ("impala", {}),
        ("impala", {"num_aggregation_workers": 1}),
        ("apex", {}),
        ("es", {}),
    ],
    ids=["ppo", "a3c", "impala", "impala-aggregated", "apex", "es"],
)
def test_a_killed_worker_is_replaced_for_every_algorithm_family(algo: str, config: dict[str, Any]) -> None:
    trainer = make_trainer(algo, **config)
    try:
        trainer.train()
        # Ape-X reads episode statistics from its highest-index worker: kill that one.
        kill_one(trainer, position=-1)
        # The replacement rejoins once it has started (the driver does not wait for it).
        train_until(
            trainer,
            lambda r: r["num_worker_restarts"] == 1 and r["episodes_this_iter"] > 0 and r["num_healthy_workers"] == 2,
            within_s=60,
        )
        assert trainer.train()["num_worker_restarts"] == 1
        if algo != "es":  # ES evaluates perturbations, not fragments
            # The replacement samples for the plan again (through its aggregator too, once it started).
            deadline = time.monotonic() + 30
            while min(trainer.workers.foreach_worker(lambda w: w.sampler.steps_sampled, local=False)) == 0:
                assert time.monotonic() < deadline, "the replacement never sampled"
                trainer.train()
    finally:
        trainer.stop()


def test_a_replacement_starts_at_the_current_global_timestep() -> None:
    trainer = make_trainer("apex")
    try:
        trainer.train()
        steps = trainer.train()["timesteps_total"]
        kill_one(trainer)
        trainer.workers.probe_unhealthy_workers()
        timesteps = trainer.workers.foreach_worker(lambda w: w.get_policy().global_timestep, local=False)
        assert min(timesteps) > 0 and max(timesteps) <= steps
    finally:
        trainer.stop()


# -- bounded restarts and losing everything -----------------------------------------------


def backoff_of(*delays_s: float) -> Any:
    """A restart_delay_s giving ``delays_s`` for the first failed starts of a slot in a row, then an hour."""
    return lambda failed_starts: [0.0, *delays_s][failed_starts] if failed_starts <= len(delays_s) else 3600.0


def test_a_replacement_backing_off_never_blocks_the_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    # Worker 1's replacements fail to start: the first is tried again after 0.5 s, the next after an hour.
    monkeypatch.setattr("flowrl.actors.restart_budget.restart_delay_s", backoff_of(0.5))
    trainer = make_trainer("ppo", fakes.FailsWhenRecreated)
    try:
        trainer.train()
        kill_one(trainer)  # restart 1, at once (it ran); 2 after its failed start, 0.5 s later; 3 due in an hour
        result = train_until(trainer, lambda r: r["num_worker_restarts"] == 3, within_s=60)
        for _ in range(3):  # meanwhile the iterations go on with worker 2
            before = result["timesteps_total"]
            result = trainer.train()
            assert result["timesteps_total"] - before >= trainer.config.train_batch_size
            assert (result["num_worker_restarts"], result["num_healthy_workers"], result["num_workers_missing"]) == (
                3,
                1,
                1,
            )
        assert trainer.workers.remote_worker_indices() == [2] and trainer.workers.missing_worker_indices() == [1]
    finally:
        trainer.stop()


def test_an_aggregator_waits_for_its_workers_replacement_without_blocking_the_driver(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr("flowrl.actors.restart_budget.restart_delay_s", backoff_of(0.5))
    # One aggregator per worker: aggregator 0 gathers from worker 1 alone, whose first replacement fails to start.
    env_config = {"count_dir": str(tmp_path), "failed_starts": 1}
    trainer = make_trainer(
        "impala",
        fakes.FailsFirstRecreations,
        env_config=env_config,
        num_aggregation_workers=2,
        num_cpus_per_aggregator=0.1,
    )
    try:
        trainer.train()
        aggregators = trainer.resources.aggregators
        assert aggregators is not None
        kill_one(trainer)
        in_service: list[int] = []  # aggregators in service after each iteration

        def both_back(result: dict[str, Any]) -> bool:
            in_service.append(len(aggregators))
            return len(aggregators) == 2 and result["num_healthy_workers"] == 2

        result = train_until(trainer, both_back, within_s=60)
        # Iterations went on (through aggregator 1) while aggregator 0 waited for worker 1's second replacement.
        assert 1 in in_service
        assert (result["num_worker_restarts"], result["num_workers_missing"], result["num_aggregator_restarts"]) == (
            2,
            0,
            1,
        )
        assert [p.name for p in tmp_path.iterdir()] == ["failed_start_0"]
        timesteps = result["timesteps_total"]
        assert trainer.train()["timesteps_total"] > timesteps
    finally:
        trainer.stop()


def test_restarts_are_capped_and_the_error_names_the_worker_and_its_traceback() -> None:
    trainer = make_trainer("ppo", fakes.FailsWhenRecreated, max_worker_restarts=2)
    try:
        trainer.train()
        kill_one(trainer)
        killed_at = time.monotonic()
        with pytest.raises(WorkerFailureError, match="max_worker_restarts=2") as info:
            while time.monotonic() - killed_at < 60:  # each failed start is found in the background
                trainer.train()
        assert info.value.worker_indices == [1]
        assert "cannot start again on worker 1" in str(info.value)
        assert trainer.workers.num_worker_restarts == 2
        with pytest.raises(PlanStoppedError, match="WorkerFailureError"):
            trainer.train()
    finally:
        trainer.stop()


@pytest.mark.parametrize("algo", ["ppo", "apex", "impala"])
def test_losing_every_worker_fails_fast_and_the_plan_stays_stopped(algo: str) -> None:
    trainer = make_trainer(algo, recreate_failed_workers=False)
    try:
        trainer.train()
        for _ in range(2):
            kill_one(trainer)
            trainer.workers.probe_unhealthy_workers() if trainer.workers.num_healthy_workers() > 1 else None
        started = time.monotonic()
        with pytest.raises(WorkerFailureError, match="every rollout worker failed"):
            for _ in range(10):
                trainer.train()
        assert time.monotonic() - started < 30  # the bound on failing fast (not a speed benchmark)
        with pytest.raises(PlanStoppedError, match="every rollout worker failed"):
            trainer.train()
    finally:
        trainer.stop()


def test_an_impossible_resource_request_is_a_config_error_before_any_actor_starts() -> None:
    actors_before = len(ray.util.list_named_actors(all_namespaces=True))
    with pytest.raises(
        ConfigError, match=r"num_workers=4 x num_cpus_per_worker=1 needs 4 CPU, but the Ray cluster has 2"
    ):
        Trainer(algo="ppo", env="CartPole-v1", config={"num_workers": 4, "num_cpus_per_worker": 1})
    with pytest.raises(ConfigError, match=r"custom_resources_per_worker\['tpu'\]"):
        Trainer(algo="ppo", env="CartPole-v1", config={"num_workers": 1, "custom_resources_per_worker": {"tpu": 1}})
    assert len(ray.util.list_named_actors(all_namespaces=True)) == actors_before


# -- bad data ------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["nan_obs", "out_of_space_obs", "wrong_shape_obs", "nan_reward"])
def test_bad_observations_drop_their_episode_and_are_counted(kind: str, counter: str) -> None:
    fault = {"kind": kind, "worker_indices": [1], "at_step": 60, "times": 1}
    trainer = make_trainer(
        "ppo", FaultInjectEnv, on_bad_observation="drop_episode", env_config=fault_env(counter, fault)
    )
    try:
        result = train_until(trainer, lambda r: r["num_bad_observations"] == 1)
        assert result["num_worker_restarts"] == 0
        assert trainer.train()["num_bad_observations"] == 1
    finally:
        trainer.stop()


def test_a_bad_observation_raises_by_default_naming_where_it_came_from(counter: str) -> None:
    fault = {"kind": "nan_obs", "worker_indices": [2], "at_step": 60, "times": 1}
    trainer = make_trainer("ppo", FaultInjectEnv, env_config=fault_env(counter, fault))
    try:
        with pytest.raises(BadObservationError, match="worker 2") as info:
            for _ in range(5):
                trainer.train()
        assert "nan" in str(info.value).lower()
    finally:
        trainer.stop()


# -- shutdown ------------------------------------------------------------------------------


def test_a_raising_env_close_still_releases_every_actor() -> None:
    trainer = make_trainer("ppo", fakes.CloseRaises)
    workers = trainer.workers.remote_workers()
    trainer.train()
    with pytest.raises(FlowRLError, match="simulator socket already gone"):
        trainer.stop()
    assert all(fakes.is_dead(worker) for worker in workers)


@ray.remote(num_cpus=2)
class HoldsEveryCPU:
    def ping(self) -> str:
        return "pong"


def test_resources_that_exist_but_are_taken_fail_after_worker_startup_timeout_s() -> None:
    blocker = HoldsEveryCPU.remote()
    try:
        ray.get(blocker.ping.remote(), timeout=60)
        with pytest.raises(ResourceUnavailableError, match=r"within worker_startup_timeout_s=2: 1 x worker \(1 CPU\)"):
            Trainer(
                algo="ppo",
                env="CartPole-v1",
                config={"num_workers": 1, "num_cpus_per_worker": 1, "worker_startup_timeout_s": 2},
            )
    finally:
        ray.kill(blocker)


def test_restart_backoff_grows_for_a_crash_loop_and_is_capped() -> None:
    assert [restart_delay_s(n) for n in range(8)] == [0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]


# -- stragglers ----------------------------------------------------------------------------


def test_sample_min_fraction_goes_on_without_a_straggler_and_counts_its_late_fragments(counter: str) -> None:
    # Worker 2 takes about 0.5 s per fragment (100 steps x 5 ms); worker 1 a few milliseconds.
    slow = {"kind": "slow", "worker_indices": [2], "delay_s": 0.005}
    trainer = make_trainer(
        "ppo", FaultInjectEnv, sample_min_fraction=0.5, train_batch_size=200, env_config=fault_env(counter, slow)
    )
    try:
        result = train_until(trainer, lambda r: r["num_late_fragments"] >= 1, max_iterations=500)
        assert result["num_worker_restarts"] == 0 and result["num_healthy_workers"] == 2
    finally:
        trainer.stop()


def test_metrics_are_collected_while_a_worker_is_stuck_in_a_sample(
    counter: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # stop() waits STOP_TIMEOUT_S (5 s) for the stuck worker to close its envs, which it never does, before it
    # kills it: this test is not about that wait.
    monkeypatch.setattr("flowrl.actors.worker_set.STOP_TIMEOUT_S", 0.5)
    hang = {"kind": "hang", "worker_indices": [2], "at_step": 10, "times": 1, "hang_s": 60}
    trainer = make_trainer("apex", FaultInjectEnv, env_config=fault_env(counter, hang))
    try:
        trainer.train()  # worker 2 is stuck from its first fragment on; worker 1 samples
        reports = trainer.workers.collect_metrics()
        assert [index for index, _ in reports] == [1, 2]  # worker 2 answered from its control thread
        assert trainer.workers.num_worker_restarts == 0
    finally:
        trainer.stop()


def test_an_aggregator_reporting_a_worker_the_set_already_replaced_does_not_restart_it_again() -> None:
    trainer = make_trainer("impala", num_aggregation_workers=1)
    try:
        trainer.train()
        kill_one(trainer)
        assert trainer.workers.probe_unhealthy_workers() == 1  # the worker set replaces it first
        aggregators = trainer.resources.aggregators
        assert aggregators is not None
        result = train_until(
            trainer,
            lambda r: aggregators.num_restarts == 1 and r["episodes_this_iter"] > 0 and r["num_healthy_workers"] == 2,
            within_s=60,
        )
        assert result["num_worker_restarts"] == 1 and result["num_healthy_workers"] == 2
        assert result["num_aggregator_restarts"] == 1
    finally:
        trainer.stop()
