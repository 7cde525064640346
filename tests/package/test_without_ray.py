"""Ray only when a plan starts an actor: ``flowrl plan`` and ``num_workers=0`` runs never start it.

The checks run in fresh processes (this test session may have Ray running) whose temporary
directory is the test's own: a Ray instance started there, even for a moment, would leave its
session directory in ``<tmp>/ray``, so its absence shows that no Ray process was started.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fakes import BUILT_IN_ALGORITHMS

from flowrl import Trainer
from flowrl.actors.evaluation import evaluation_request
from flowrl.actors.placement import REPLAY_SHARD, BundleRequest, asks_for_actors
from flowrl.config import TrainerConfig

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]
PPO_TINY = {
    "num_workers": 0,
    "train_batch_size": 64,
    "rollout_fragment_length": 32,
    "sgd_minibatch_size": 32,
    "num_sgd_iter": 2,
    "seed": 0,
}


def run_isolated(tmp_path: Path, command: list[str], timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """Run ``command`` with ``tmp_path/tmp`` as its temporary directory (Ray's too) and no cluster address."""
    tmp = tmp_path / "tmp"
    tmp.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(TMPDIR=str(tmp), RAY_TMPDIR=str(tmp))
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=REPO, env=env, check=False)


def assert_no_ray_started(tmp_path: Path) -> None:
    sessions = tmp_path / "tmp" / "ray"
    assert not sessions.exists(), f"a Ray instance was started: {sorted(p.name for p in sessions.iterdir())}"


def result_of(proc: subprocess.CompletedProcess[str]) -> Any:
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT ") :])


PLAN_IN_PROCESS = textwrap.dedent(
    """
    import json
    import ray
    from flowrl.cli.main import main
    status = main(["plan", "--algo", "apex", "--env", "CartPole-v1"])
    print("RESULT " + json.dumps({"status": status, "ray": ray.is_initialized()}))
    """
)


def test_flowrl_plan_leaves_ray_uninitialised(tmp_path: Path) -> None:
    proc = run_isolated(tmp_path, [sys.executable, "-c", PLAN_IN_PROCESS])
    assert result_of(proc) == {"status": 0, "ray": False}
    assert "plan apex:" in proc.stdout and "ReplayActor" in proc.stdout
    assert_no_ray_started(tmp_path)


def test_the_plan_command_prints_the_graph_without_starting_ray(tmp_path: Path) -> None:
    proc = run_isolated(
        tmp_path, [sys.executable, "-m", "flowrl.cli", "plan", "--algo", "apex", "--env", "CartPole-v1"]
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[0] == "plan apex:"
    assert "    RolloutWorker x2" in lines and "    ReplayActor" in lines
    assert any(line.endswith("for_each(StoreToReplayBuffer) --add batch--> ReplayActor") for line in lines)
    assert_no_ray_started(tmp_path)


def test_the_plan_command_shows_a_learner_group_without_starting_ray(tmp_path: Path) -> None:
    proc = run_isolated(
        tmp_path,
        [
            sys.executable,
            "-m",
            "flowrl.cli",
            "plan",
            "--algo",
            "ppo",
            "--env",
            "CartPole-v1",
            "--set",
            "num_learners=2",
        ],
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert "    LearnerActor x2" in lines
    assert any(line.endswith("for_each(TrainOneStep) --learn on batch shards--> LearnerActor x2") for line in lines)
    assert "    LearnerActor x2 --all-reduce gradients--> LearnerActor x2" in lines
    assert_no_ray_started(tmp_path)


PLANS_IMPORT_NEITHER = textwrap.dedent(
    """
    import json
    import sys
    from flowrl.algorithms import list_algorithms
    from flowrl.engine.dry_plan import dry_plan
    envs = {"ddpg": "Pendulum-v1", "td3": "Pendulum-v1", "apex_ddpg": "Pendulum-v1", "ppo_dqn": "MultiAgentCartPole"}
    operators = {algo: len(dry_plan(algo, envs.get(algo, "CartPole-v1")).graph.operators) for algo in list_algorithms()}
    print("RESULT " + json.dumps({"operators": operators, "loaded": sorted({"torch", "ray"} & set(sys.modules))}))
    """
)


def test_every_plan_is_declared_without_importing_pytorch_or_ray(tmp_path: Path) -> None:
    """What makes ``flowrl plan`` instant: the algorithms, their plans and a placeholder local worker
    import neither (each plan's build reads its policies' classes and specs, never a built policy)."""
    result = result_of(run_isolated(tmp_path, [sys.executable, "-c", PLANS_IMPORT_NEITHER]))
    assert result["loaded"] == []
    # The fresh process knows the built-in algorithms only (this session may have registered more).
    assert sorted(result["operators"]) == sorted(BUILT_IN_ALGORITHMS) and min(result["operators"].values()) >= 5


TRAINER_LIFECYCLE = textwrap.dedent(
    """
    import json, sys
    import ray
    from flowrl import Trainer
    config = json.loads(sys.argv[1])
    seen = {}
    trainer = Trainer("ppo", "CartPole-v1", config)
    seen["built"] = ray.is_initialized()
    result = trainer.train()
    seen["trained"] = ray.is_initialized()
    path = trainer.save(sys.argv[2])
    seen["saved"] = ray.is_initialized()
    trainer.restore(path)
    trainer.train()
    seen["restored"] = ray.is_initialized()
    trainer.stop()
    again = Trainer.from_checkpoint(path)
    again.train()
    again.stop()
    seen["from_checkpoint"] = ray.is_initialized()
    seen["evaluated"] = "evaluation" in result
    print("RESULT " + json.dumps(seen))
    """
)


def test_a_trainer_with_no_actors_never_starts_ray(tmp_path: Path) -> None:
    # Evaluation in the driver too (evaluation_num_workers 0), with an observation filter to sync.
    config = {**PPO_TINY, "evaluation_interval": 1, "evaluation_num_episodes": 1, "observation_filter": "MeanStdFilter"}
    proc = run_isolated(tmp_path, [sys.executable, "-c", TRAINER_LIFECYCLE, json.dumps(config), str(tmp_path / "ckpt")])
    assert result_of(proc) == {
        "built": False,
        "trained": False,
        "saved": False,
        "restored": False,
        "from_checkpoint": False,
        "evaluated": True,
    }
    assert_no_ray_started(tmp_path)


def test_train_and_evaluate_commands_with_no_workers_never_start_ray(tmp_path: Path) -> None:
    cli = [sys.executable, "-m", "flowrl.cli"]
    results = tmp_path / "results"
    train = run_isolated(
        tmp_path,
        [
            *cli,
            "train",
            "--algo",
            "ppo",
            "--env",
            "CartPole-v1",
            "--num-workers",
            "0",
            "--stop-iters",
            "1",
            "--results-dir",
            str(results),
            "--set",
            "train_batch_size=64",
            "--set",
            "sgd_minibatch_size=32",
            "--quiet",
        ],
    )
    assert train.returncode == 0, train.stderr[-3000:]
    (run_dir,) = results.iterdir()
    evaluate = run_isolated(tmp_path, [*cli, "evaluate", str(run_dir), "--episodes", "1", "--seed", "0"])
    assert evaluate.returncode == 0, evaluate.stderr[-3000:]
    assert "episode_reward_mean" in evaluate.stdout
    assert_no_ray_started(tmp_path)


SEEDED_RUN = textwrap.dedent(
    """
    import json, sys
    import ray
    from flowrl import Trainer
    with Trainer("ppo", "CartPole-v1", json.loads(sys.argv[1])) as trainer:
        results = [trainer.train() for _ in range(3)]
        weights = trainer.workers.local_worker().get_weights()["default_policy"]
    print("RESULT " + json.dumps({
        "ray": ray.is_initialized(),
        "rewards": [r["episode_reward_mean"] for r in results],
        "losses": [r["info"]["learner"]["default_policy"]["policy_loss"] for r in results],
        "weights": {name: value.tolist() for name, value in weights.items()},
    }))
    """
)


def test_a_seeded_run_is_the_same_with_and_without_ray(tmp_path: Path, ray_session: None) -> None:
    without = result_of(run_isolated(tmp_path, [sys.executable, "-c", SEEDED_RUN, json.dumps(PPO_TINY)]))
    assert without["ray"] is False
    assert_no_ray_started(tmp_path)
    with Trainer("ppo", "CartPole-v1", PPO_TINY) as trainer:  # here Ray runs (the test session's)
        results = [trainer.train() for _ in range(3)]
        weights = trainer.workers.local_worker().get_weights()["default_policy"]
    assert [r["episode_reward_mean"] for r in results] == without["rewards"]
    assert [r["info"]["learner"]["default_policy"]["policy_loss"] for r in results] == without["losses"]
    assert sorted(weights) == sorted(without["weights"])
    for name, value in weights.items():
        assert np.array_equal(value, np.asarray(without["weights"][name], dtype=value.dtype)), name


def test_ray_is_needed_only_for_actors() -> None:
    config = TrainerConfig.from_dict({})
    assert not asks_for_actors(0, [evaluation_request(config)])
    assert asks_for_actors(1, [])
    evaluating = TrainerConfig.from_dict({"evaluation_interval": 1, "evaluation_num_workers": 1})
    assert asks_for_actors(0, [evaluation_request(evaluating)])
    # Actors count even when they ask for no resources (zero-CPU replay shards).
    assert asks_for_actors(0, [BundleRequest(REPLAY_SHARD, 2, {"CPU": 0.0}, {"CPU": "num_cpus_per_replay_shard"})])
