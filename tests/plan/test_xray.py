"""The plan X-ray (result["plan"]): every second of an iteration attributed, per operator and per actor, and
``flowrl doctor`` reading it back."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from fakes import BUILT_IN_ALGORITHMS
from offline_files import episodes, write_dataset

from flowrl import Trainer
from flowrl.errors import FlowRLError
from flowrl.plan.doctor import VERDICTS, diagnose, diagnose_run

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("ray_session"), pytest.mark.timeout(300)]

REMOTE = {"num_workers": 2, "num_cpus_per_worker": 0.1, "rollout_fragment_length": 25}
REPLAY = {"learning_starts": 64, "train_batch_size": 32, "timesteps_per_iteration": 200}
RECORDED = "<the recorded fixture's directory>"
OFFLINE = {"num_workers": 0, "input": RECORDED, "timesteps_per_iteration": 1024, "evaluation_num_episodes": 1}
# Every built-in algorithm on CartPole (Pendulum for continuous actions, the multi-agent CartPole for
# ppo_dqn), small, with remote workers where the algorithm samples on them.
ALGORITHMS: dict[str, tuple[str, dict[str, Any]]] = {
    "pg": ("CartPole-v1", {**REMOTE, "train_batch_size": 100}),
    "a2c": ("CartPole-v1", {**REMOTE, "train_batch_size": 100}),
    "a3c": ("CartPole-v1", {**REMOTE, "timesteps_per_iteration": 200}),
    "ppo": ("CartPole-v1", {**REMOTE, "train_batch_size": 200, "sgd_minibatch_size": 100, "num_sgd_iter": 2}),
    "dqn": ("CartPole-v1", {**REMOTE, **REPLAY}),
    "apex": ("CartPole-v1", {**REMOTE, **REPLAY, "num_replay_shards": 1}),
    "apex_ddpg": ("Pendulum-v1", {**REMOTE, **REPLAY, "num_replay_shards": 1}),
    "r2d2": ("StatelessCartPole-v1", {**REMOTE, **REPLAY, "num_replay_shards": 1, "replay_sequence_length": 8}),
    "ddpg": ("Pendulum-v1", {"num_workers": 0, **REPLAY}),
    "td3": ("Pendulum-v1", {"num_workers": 0, **REPLAY}),
    "sac": ("Pendulum-v1", {"num_workers": 0, **REPLAY}),
    "impala": ("CartPole-v1", {**REMOTE, "train_batch_size": 100, "timesteps_per_iteration": 400}),
    "appo": ("CartPole-v1", {**REMOTE, "train_batch_size": 100, "timesteps_per_iteration": 400}),
    "ppo_dqn": ("MultiAgentCartPole", {"num_workers": 0}),
    "es": (
        "CartPole-v1",
        {
            "num_workers": 1,
            "num_cpus_per_worker": 0.1,
            "episodes_per_batch": 4,
            "train_batch_size": 200,
            "noise_table_size": 100_000,
        },
    ),
    "ars": (
        "CartPole-v1",
        {
            "num_workers": 1,
            "num_cpus_per_worker": 0.1,
            "num_rollouts": 2,
            "rollouts_used": 2,
            "noise_table_size": 100_000,
        },
    ),
    # The offline algorithms read the experiences of the `recorded` fixture (input: RECORDED).
    "bc": ("CartPole-v1", {**OFFLINE, "train_batch_size": 128}),
    "marwil": ("CartPole-v1", {**OFFLINE, "train_batch_size": 128}),
    "cql": ("CartPole-v1", {**OFFLINE, "train_batch_size": 64}),
}
OPERATOR_KEYS = {
    "items",
    "bytes",
    "time_s",
    "busy_s",
    "wait_s",
    "transfer_s",
    "blocked_out_s",
    "held_out_s",
    "share",
    "items_per_s",
    "bytes_per_s",
    "items_total",
}


def test_every_built_in_algorithm_is_covered() -> None:
    assert sorted(ALGORITHMS) == sorted(BUILT_IN_ALGORITHMS)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """CartPole-shaped experiences (50 episodes of 20 steps) for the offline algorithms."""
    return write_dataset(tmp_path_factory.mktemp("recorded"), episodes(50, 20))


@pytest.mark.parametrize("algo", sorted(ALGORITHMS))
def test_the_operators_explain_at_least_95_percent_of_each_iteration(algo: str, recorded: Path) -> None:
    env, config = ALGORITHMS[algo]
    config = {key: str(recorded) if value == RECORDED else value for key, value in config.items()}
    with Trainer(algo, env, {**config, "seed": 0}) as trainer:
        results = [trainer.train() for _ in range(3)]
        positions = [f"{i}:{stage.label}" for i, stage in enumerate(trainer.plan.graph.operators.values(), start=1)]
    for result in results[1:]:  # the first iteration also starts things up
        plan = result["plan"]
        assert plan["profile"] is True and list(plan["operators"]) == positions
        assert plan["attributed_share"] >= 0.95, (algo, plan["unattributed_s"], plan["iteration_s"])
        assert math.isclose(
            plan["attributed_s"] + plan["unattributed_s"], plan["iteration_s"], rel_tol=0.05, abs_tol=1e-3
        )
        assert plan["iteration_s"] >= result["time_this_iter_s"]
        for entry in plan["operators"].values():
            assert set(entry) >= OPERATOR_KEYS
            assert 0 <= entry["share"] <= 1 and entry["busy_s"] >= 0 and entry["wait_s"] >= 0
            parts = entry["busy_s"] + entry["wait_s"] + entry["transfer_s"] + entry["blocked_out_s"]
            assert math.isclose(parts, entry["time_s"], abs_tol=1e-5) and entry["held_out_s"] >= 0
        json.dumps(plan)


def test_a_sampling_iteration_reports_its_workers_fragments_and_bytes() -> None:
    env, config = ALGORITHMS["ppo"]
    with Trainer("ppo", env, {**config, "seed": 0}) as trainer:
        trainer.train()
        plan = trainer.train()["plan"]
    gather = plan["operators"]["1:batch_across_shards(rollout_workers)"]
    # 200 steps a batch = 2 workers x 4 rounds of 25 steps; CartPole's rows are a few hundred bytes.
    assert gather["items"] == 4 and gather["bytes"] > 200 * 4 * 4 and gather["wait_s"] > 0
    assert sorted(plan["latency_s"]) == ["rollout_workers[0]", "rollout_workers[1]"]
    assert all(figures["count"] == 4 and 0 < figures["p50"] <= figures["max"] for figures in plan["latency_s"].values())
    workers = plan["actors"]["RolloutWorker"]
    assert workers["count"] == 2 and workers["in_driver"] is False and sorted(workers["per_worker"]) == ["1", "2"]
    assert workers["env_s"] > 0 and workers["inference_s"] > 0 and 0 < workers["busy_share"] <= 1
    assert all(w["fragments"] == 4 and w["sample_s_per_fragment"] > 0 for w in workers["per_worker"].values())
    # Every fragment the gather fetched was serialized by Ray in its worker, and timed there.
    assert workers["fragments_serialized"] == 8 and workers["serialize_s"] > 0
    train = plan["operators"]["6:for_each(TrainOneStep)"]
    # TrainOneStep's two parts, within its own time; learning split into getting the data ready and updating.
    assert set(plan["learner"]) == {"learn_s", "weight_sync_s", "load_s", "update_s"}
    assert plan["learner"]["learn_s"] + plan["learner"]["weight_sync_s"] <= train["time_s"] + 1e-4
    assert plan["learner"]["load_s"] > 0 and plan["learner"]["update_s"] > 0
    assert plan["learner"]["load_s"] + plan["learner"]["update_s"] <= plan["learner"]["learn_s"] + 1e-4


def test_an_asynchronous_plan_reports_its_learner_thread_and_replay_shards() -> None:
    env, config = ALGORITHMS["apex"]
    with Trainer("apex", env, {**config, "seed": 0}) as trainer:
        plan = [trainer.train() for _ in range(2)][-1]["plan"]
    assert set(plan["actors"]) == {"RolloutWorker", "LearnerThread", "ReplayActor"}
    shard = plan["actors"]["ReplayActor"]
    assert shard["count"] == 1 and shard["add_s"] > 0 and shard["sample_s"] > 0 and shard["serialize_s"] > 0
    assert 0 <= plan["actors"]["LearnerThread"]["busy_share"] <= 1
    assert plan["learner"]["update_s"] > 0  # the learner thread's updates, by the policy's own clock
    sent = next(v for k, v in plan["operators"].items() if "SendWeightsToSource" in k)
    assert plan["policy_lag"]["batches"] == sent["batches_received"] == sent["items"] > 0
    assert plan["policy_lag"]["mean_updates"] >= 0


@pytest.mark.parametrize("algo", ["ppo", "apex"])
def test_profile_off_measures_nothing(algo: str) -> None:
    env, config = ALGORITHMS[algo]
    with Trainer(algo, env, {**config, "seed": 0, "profile": False}) as trainer:
        results = [trainer.train() for _ in range(2)]
        assert not trainer.plan.metrics.stage_stats and not trainer.plan.metrics.latencies
        learn_times = trainer.workers.local_worker().get_policy("default_policy").learn_times
        assert results[-1]["timesteps_trained"] > 0 and learn_times.load_s == learn_times.update_s == 0
    for result in results:
        assert result["plan"] == {"profile": False, "iteration_s": pytest.approx(result["time_this_iter_s"], abs=1e-3)}
    for shard in results[-1]["info"].get("replay_shards", []):  # Ape-X's shards did not time their hand-offs either
        assert shard["num_steps_replayed"] > 0 and shard["serialize_time_total_s"] == 0


def test_a_callback_after_the_iteration_counts_as_driver_time() -> None:
    from flowrl.callbacks import Callbacks

    class Slow(Callbacks):
        def on_train_result(self, trainer: Any, result: dict[str, Any]) -> None:
            import time

            time.sleep(0.3)

    with Trainer("pg", "CartPole-v1", {"num_workers": 0, "train_batch_size": 64, "callbacks": Slow}) as trainer:
        plan = trainer.train()["plan"]
    assert plan["driver"]["on_train_result_s"] >= 0.3 and plan["iteration_s"] >= 0.3
    assert plan["attributed_share"] >= 0.95


# --- flowrl doctor ---


def xray(operators: dict[str, dict[str, float]], iteration_s: float = 1.0, **extra: Any) -> dict[str, Any]:
    """A result whose plan X-ray has ``operators`` (time_s = busy + wait + transfer) and ``extra`` keys."""
    full = {
        key: {
            "time_s": op.get("busy_s", 0) + op.get("wait_s", 0) + op.get("transfer_s", 0),
            "busy_s": 0.0,
            "wait_s": 0.0,
            "transfer_s": 0.0,
            **op,
        }
        for key, op in operators.items()
    }
    attributed = sum(op["time_s"] for op in full.values())
    return {
        "plan": {
            "profile": True,
            "iteration_s": iteration_s,
            "operators": full,
            "unattributed_s": iteration_s - attributed,
            "driver": {},
            **extra,
        }
    }


GATHER, TRAIN, METRICS = (
    "1:batch_across_shards(rollout_workers)",
    "5:for_each(TrainOneStep)",
    "7:for_each(CollectMetrics)",
)


def workers(env_s: float, inference_s: float, other_s: float = 0.0) -> dict[str, Any]:
    return {
        "RolloutWorker": {"count": 2, "env_s": env_s, "inference_s": inference_s, "other_s": other_s, "busy_share": 0.9}
    }


@pytest.mark.parametrize(
    ("result", "verdict"),
    [
        (xray({GATHER: {"wait_s": 0.8}, TRAIN: {"busy_s": 0.15}}, actors=workers(0.9, 0.1)), "env-bound"),
        (xray({GATHER: {"wait_s": 0.8}, TRAIN: {"busy_s": 0.15}}, actors=workers(0.1, 0.9)), "inference-bound"),
        (xray({GATHER: {"wait_s": 0.2}, TRAIN: {"busy_s": 0.75}}, actors=workers(0.5, 0.5)), "learner-bound"),
        (
            xray({GATHER: {"wait_s": 0.3, "transfer_s": 0.4}, TRAIN: {"busy_s": 0.1}}, actors=workers(0.1, 0.1, 0.8)),
            "transfer-bound",
        ),
        (
            xray({GATHER: {"wait_s": 0.1}, TRAIN: {"busy_s": 0.1}, METRICS: {"busy_s": 0.7}}, actors=workers(0.5, 0.5)),
            "driver-bound",
        ),
        (
            xray(
                {GATHER: {"wait_s": 0.8}, TRAIN: {"busy_s": 0.15}},
                actors=workers(0.9, 0.1),
                latency_s={
                    "rollout_workers[0]": {"p50": 0.01},
                    "rollout_workers[1]": {"p50": 0.012},
                    "rollout_workers[2]": {"p50": 0.1},
                },
            ),
            "straggler",
        ),
        # Bulk-synchronous rounds: every fragment arrives with the slowest; the workers' own seconds per fragment tell.
        (
            xray(
                {GATHER: {"wait_s": 0.8}, TRAIN: {"busy_s": 0.15}},
                actors={
                    "RolloutWorker": {
                        **workers(0.9, 0.1)["RolloutWorker"],
                        "per_worker": {"1": {"sample_s_per_fragment": 0.02}, "2": {"sample_s_per_fragment": 0.2}},
                    }
                },
                latency_s={"rollout_workers[0]": {"p50": 0.2}, "rollout_workers[1]": {"p50": 0.2}},
            ),
            "straggler",
        ),
    ],
)
def test_the_doctor_names_the_part_that_takes_the_most_time(result: dict[str, Any], verdict: str) -> None:
    diagnosis = diagnose([result])
    assert diagnosis.verdict == verdict and verdict in VERDICTS
    assert diagnosis.advice and verdict in diagnosis.report()
    assert math.isclose(sum(diagnosis.shares.values()), 1.0, abs_tol=0.01)


def test_the_doctor_counts_blocking_in_place_as_waiting_but_not_an_older_runs_held_queue() -> None:
    waiting = "driver waiting on the learner, replay or other branches (mean share)"
    priorities = "5:for_each(UpdatePriorities)"
    blocked = xray(
        {
            GATHER: {"wait_s": 0.3},
            TRAIN: {"busy_s": 0.2},
            priorities: {"time_s": 0.4, "blocked_out_s": 0.4, "held_out_s": 0.0},
        },
        actors=workers(0.5, 0.5),
    )
    assert diagnose([blocked]).figures[waiting] == pytest.approx(0.4)
    # Before held_out_s, a full learner queue's held time (outside time_s) was reported as blocked_out_s.
    older = xray(
        {GATHER: {"wait_s": 0.3}, TRAIN: {"busy_s": 0.6}, "5:transform(Enqueue)": {"blocked_out_s": 5.0}},
        actors=workers(0.5, 0.5),
    )
    assert waiting not in diagnose([older]).figures


def test_the_doctor_reads_a_run_directory(tmp_path: Path) -> None:
    from flowrl.cli.main import main as cli

    argv = [
        "train",
        "--algo",
        "ppo",
        "--env",
        "CartPole-v1",
        "--results-dir",
        str(tmp_path),
        "--num-workers",
        "0",
        "--set",
        "train_batch_size=64",
        "--set",
        "sgd_minibatch_size=32",
        "--set",
        "num_sgd_iter=30",
        "--stop-iters",
        "3",
    ]
    assert cli(argv) == 0
    run_dir = next(p for p in tmp_path.iterdir() if p.is_dir())
    diagnosis = diagnose_run(run_dir, last=2)
    assert diagnosis.iterations == [2, 3] and diagnosis.algo == "ppo" and diagnosis.verdict == "learner-bound"


def test_the_doctor_refuses_results_without_an_x_ray() -> None:
    with pytest.raises(FlowRLError, match="no iteration carries a plan X-ray"):
        diagnose([{"training_iteration": 1, "plan": {"profile": False, "iteration_s": 1.0}}])
