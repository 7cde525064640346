"""The Trainer: config errors before any actor starts, results, checkpoints (atomic, portable), evaluation, stop.

One small PPO Trainer (1 remote worker) is shared by the module; tests that need
another algorithm or a fresh trainer use ``num_workers=0`` (no actors).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
import ray
import torch
from fakes import fingerprint

import flowrl.engine.state
import flowrl.engine.trainer
import flowrl.storage.checkpoints
from flowrl import Trainer
from flowrl.actors import WorkerSet
from flowrl.data import DEFAULT_POLICY_ID
from flowrl.errors import (
    CheckpointError,
    ConfigError,
    UnknownAlgorithmError,
    UnknownEnvError,
)

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("ray_session"), pytest.mark.timeout(180)]

REPO = Path(__file__).resolve().parents[2]
ENV = "CartPole-v1"
PPO_CONFIG = {
    "num_workers": 1,
    "num_cpus_per_worker": 0.1,
    "rollout_fragment_length": 20,
    "num_envs_per_worker": 1,
    "train_batch_size": 40,
    "sgd_minibatch_size": 20,
    "num_sgd_iter": 2,
    "seed": 0,
}
STEPS_PER_ITER = 40


@pytest.fixture(scope="module")
def trained(ray_session: None) -> Iterator[tuple[Trainer, dict[str, Any]]]:
    trainer = Trainer("ppo", ENV, PPO_CONFIG)
    result = trainer.train()
    yield trainer, result
    trainer.stop()


@pytest.fixture
def no_actors(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if a WorkerSet (hence any rollout actor) or Ray is started."""

    def fail(*args: Any, **kwargs: Any) -> None:
        pytest.fail("an invalid config must be rejected before any actor starts")

    monkeypatch.setattr(WorkerSet, "__init__", fail)
    monkeypatch.setattr(flowrl.engine.trainer, "start_ray", fail)


# --- config errors, before any actor starts ---

INVALID = [
    ("ppo", {"lrr": 0.1}, ["unknown config key 'lrr'; did you mean 'lr'?"]),
    ("ppo", {"num_workers": "2"}, ["num_workers='2' must be an int, got str"]),
    ("pg", {"train_batch_size": True}, ["train_batch_size=True must be an int, got bool"]),
    ("ppo", {"gamma": 1.5}, ["gamma=1.5 must be <= 1"]),
    ("pg", {"lr": 0}, ["lr=0 must be > 0"]),
    ("pg", {"lr": float("nan")}, ["lr=nan must be > 0"]),
    ("pg", {"rollout_fragment_length": 0}, ["rollout_fragment_length=0 must be >= 1"]),
    (
        "ppo",
        {"batch_mode": "episodes"},
        ["batch_mode='episodes' must be one of 'truncate_episodes', 'complete_episodes'"],
    ),
    ("ppo", {"sgd_minibatch_size": 512, "train_batch_size": 256}, ["sgd_minibatch_size=512 > train_batch_size=256"]),
    ("a2c", {"microbatch_size": 600, "train_batch_size": 500}, ["microbatch_size=600 > train_batch_size=500"]),
    ("a3c", {"num_workers": 0}, ["num_workers=0 must be >= 1"]),
    ("ppo", {"model": {"fcnet_hidden": [8]}}, ["unknown model key 'fcnet_hidden'; did you mean 'fcnet_hiddens'?"]),
    (
        "ppo",
        {"exploration_config": {"type": "EpsGreedy"}},
        ["exploration_config['type']='EpsGreedy'", "did you mean 'EpsilonGreedy'?"],
    ),
    (
        "pg",
        {"exploration_config": {"type": "EpsilonGreedy", "initial_epsilonn": 1.0}},
        ["'initial_epsilonn' is not an option of EpsilonGreedy; did you mean 'initial_epsilon'?"],
    ),
    ("ppo", {"framework": "jax"}, ["RLlib key framework='jax' must be one of", "on PyTorch"]),
    ("pg", {"num_sgd_iter": 3}, ["unknown config key 'num_sgd_iter'", "PGConfig.describe()"]),
    ("ppo", {"lambda": 1.5}, ["lambda_=1.5 must be <= 1"]),
    ("pg", {"env_config": 3}, ["env_config=3 must be a dict, got int"]),
    ("impala", {"num_workers": 2, "num_aggregation_workers": 3}, ["num_aggregation_workers=3 > num_workers=2"]),
    ("appo", {"sgd_minibatch_size": 1000, "train_batch_size": 800}, ["sgd_minibatch_size=1000 > train_batch_size=800"]),
    ("appo", {"clip_param": 0}, ["clip_param=0 must be > 0"]),
]


@pytest.mark.parametrize(("algo", "config", "expected"), INVALID, ids=[f"{a}-{'-'.join(c)}" for a, c, _ in INVALID])
def test_invalid_config_is_rejected_before_any_actor_starts(
    algo: str, config: dict[str, Any], expected: list[str], no_actors: None
) -> None:
    with pytest.raises(ConfigError) as info:
        Trainer(algo, ENV, config)
    message = str(info.value)
    for fragment in expected:
        assert fragment in message
    assert len(info.value.problems) == 1 and message.startswith("invalid config (1 problem):")


def test_every_problem_is_reported_at_once(no_actors: None) -> None:
    with pytest.raises(ConfigError) as info:
        Trainer("ppo", ENV, {"lrr": 1, "gamma": 2, "num_workers": -1, "batch_mode": "x"})
    problems = info.value.problems
    assert len(problems) == 4 and str(info.value).startswith("invalid config (4 problems):")
    text = "\n".join(problems)
    for fragment in (
        "'lrr'; did you mean 'lr'?",
        "gamma=2 must be <= 1",
        "num_workers=-1 must be >= 0",
        "batch_mode='x'",
    ):
        assert fragment in text


def test_unknown_keys_and_cross_field_problems_are_reported_together(no_actors: None) -> None:
    with pytest.raises(ConfigError) as info:
        Trainer("ppo", ENV, {"lrr": 1, "sgd_minibatch_size": 512, "train_batch_size": 256})
    assert info.value.problems == [
        "unknown config key 'lrr'; did you mean 'lr'?",
        "sgd_minibatch_size=512 > train_batch_size=256",
    ]


def test_a_config_that_is_not_a_mapping_is_rejected(no_actors: None) -> None:
    with pytest.raises(ConfigError, match="mapping"):
        Trainer("pg", ENV, cast(Any, [("lr", 0.1)]))


def test_unknown_algorithm_suggests_the_closest(no_actors: None) -> None:
    with pytest.raises(UnknownAlgorithmError) as info:
        Trainer("ppp", ENV, {})
    message = str(info.value)
    assert "'ppp'" in message and "did you mean 'ppo'" in message and "pg" in message


def test_algorithm_names_are_case_insensitive() -> None:
    assert flowrl.engine.trainer.get_algorithm("PPO").name == "ppo"


def test_unknown_env_suggests_the_closest(no_actors: None) -> None:
    with pytest.raises(UnknownEnvError) as info:
        Trainer("ppo", "CartPol-v1", {})
    assert "unknown env 'CartPol-v1'; did you mean 'CartPole-v1'?" in str(info.value)


def test_the_lambda_alias_sets_lambda_() -> None:
    with Trainer(
        "ppo", ENV, {"num_workers": 0, "lambda": 0.9, "train_batch_size": 40, "sgd_minibatch_size": 20}
    ) as trainer:
        assert trainer.config.lambda_ == 0.9
        assert trainer.workers.local_worker().get_policy().config.lambda_ == 0.9
        assert trainer.workers.remote_workers() == []


# --- results ---


def test_train_result_has_the_design_keys(trained: tuple[Trainer, dict[str, Any]]) -> None:
    _, result = trained
    for key in ("episode_reward_mean", "episode_reward_min", "episode_reward_max", "episode_len_mean"):
        assert isinstance(result[key], float)
    assert result["episodes_this_iter"] >= 1  # 40 steps of a random CartPole policy finish an episode
    assert result["episode_reward_min"] <= result["episode_reward_mean"] <= result["episode_reward_max"]
    assert result["timesteps_total"] == STEPS_PER_ITER
    assert result["training_iteration"] == 1
    assert result["time_this_iter_s"] > 0 and result["time_total_s"] >= result["time_this_iter_s"]
    info = result["info"]
    assert set(info["learner"]) == {DEFAULT_POLICY_ID} and "kl" in info["learner"][DEFAULT_POLICY_ID]
    assert info["num_steps_sampled"] == STEPS_PER_ITER and info["num_steps_trained"] == STEPS_PER_ITER
    assert {"learn_time_ms", "update_time_ms"} <= set(result["timers"])
    plan = {key.split(":", 1)[1]: value for key, value in result["plan"]["operators"].items()}
    assert plan["for_each(TrainOneStep)"]["items"] == 1
    assert {"items", "time_s", "busy_s", "wait_s", "share"} <= set(plan["for_each(TrainOneStep)"])
    json.dumps({k: v for k, v in result.items()})  # results are JSON-friendly for progress.jsonl


# --- checkpoints ---


def test_save_writes_a_complete_checkpoint_atomically(trained: tuple[Trainer, dict[str, Any]], tmp_path: Path) -> None:
    trainer, _ = trained
    path = Path(trainer.save(tmp_path))
    assert path == tmp_path / f"checkpoint_{trainer.iteration:06d}"
    assert sorted(p.name for p in path.iterdir()) == [
        "COMPLETE",
        "metadata.json",
        "policies.json",
        "policies.safetensors",
        "state.pkl",
    ]
    metadata = json.loads((path / "metadata.json").read_text())
    assert metadata["algo"] == "ppo" and metadata["env"] == ENV and metadata["iteration"] == trainer.iteration
    assert metadata["config"]["sgd_minibatch_size"] == 20
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temp dirs left behind


NEW_PROCESS = textwrap.dedent(
    """
    import json, sys
    sys.path.insert(0, sys.argv[2])
    import ray
    from flowrl import Trainer
    from fakes import fingerprint
    trainer = Trainer.from_checkpoint(sys.argv[1])
    out = fingerprint(trainer)
    out["owns_ray"] = trainer._owns_ray
    weights = trainer.workers.foreach_worker(lambda w: w.get_weights()["default_policy"])
    out["remote_in_sync"] = all(
        all((weights[0][k] == remote[k]).all() for k in weights[0]) for remote in weights[1:]
    ) and len(weights) == 2
    out["next_iteration"] = trainer.train()["training_iteration"]
    trainer.stop()
    out["ray_stopped"] = not ray.is_initialized()
    print("RESULT " + json.dumps(out))
    """
)


@pytest.mark.timeout(240)
def test_checkpoint_restores_into_a_new_process(trained: tuple[Trainer, dict[str, Any]], tmp_path: Path) -> None:
    trainer, _ = trained
    path = trainer.save(tmp_path)
    expected = fingerprint(trainer)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.run(
        [sys.executable, "-c", NEW_PROCESS, path, str(Path(__file__).parents[1])],
        capture_output=True,
        text=True,
        timeout=200,
        cwd=REPO,
        env=env,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    restored = json.loads(lines[-1][len("RESULT ") :])
    assert restored["owns_ray"] is True  # its own embedded Ray, not this session's
    assert restored["weights"] == expected["weights"]
    assert restored["optimizer"] == expected["optimizer"]
    assert restored["coeffs"] == expected["coeffs"]
    assert restored["counters"] == expected["counters"]
    assert restored["iteration"] == expected["iteration"]
    assert restored["remote_in_sync"] is True
    assert restored["next_iteration"] == expected["iteration"] + 1
    assert restored["ray_stopped"] is True


def test_restore_continues_iteration_numbering_and_counters(
    trained: tuple[Trainer, dict[str, Any]], tmp_path: Path
) -> None:
    trainer, _ = trained
    path = trainer.save(tmp_path)
    saved = fingerprint(trainer)
    config = {**PPO_CONFIG, "num_workers": 0}
    with Trainer("ppo", ENV, config) as fresh:
        fresh.restore(path)
        assert fingerprint(fresh) == saved
        result = fresh.train()
        assert result["training_iteration"] == saved["iteration"] + 1
        assert result["timesteps_total"] == saved["counters"]["num_steps_sampled"] + STEPS_PER_ITER
        assert result["info"]["num_steps_trained"] == saved["counters"]["num_steps_trained"] + STEPS_PER_ITER
        assert result["time_total_s"] > result["time_this_iter_s"]  # time carried over too


def test_from_checkpoint_with_overrides(trained: tuple[Trainer, dict[str, Any]], tmp_path: Path) -> None:
    trainer, _ = trained
    path = trainer.save(tmp_path)
    with Trainer.from_checkpoint(path, config_overrides={"num_workers": 0}) as restored:
        assert restored.config.num_workers == 0 and restored.config.sgd_minibatch_size == 20
        assert fingerprint(restored) == fingerprint(trainer)


def test_an_interrupted_save_to_a_new_path_leaves_nothing_behind(
    trained: tuple[Trainer, dict[str, Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trainer, _ = trained
    first = Path(trainer.save(tmp_path))
    first_state = fingerprint(trainer)
    trainer.train()
    target = tmp_path / f"checkpoint_{trainer.iteration:06d}"
    real_write = flowrl.storage.checkpoints._write_file
    calls: list[Path] = []

    def dies_on_second_file(path: Path, data: bytes) -> None:
        calls.append(path)
        if len(calls) == 2:
            raise KeyboardInterrupt("killed half-way through the save")
        real_write(path, data)

    monkeypatch.setattr(flowrl.storage.checkpoints, "_write_file", dies_on_second_file)
    with pytest.raises(KeyboardInterrupt):
        trainer.save(tmp_path)
    assert len(calls) == 2
    assert not target.exists()
    assert [p.name for p in tmp_path.iterdir()] == [first.name]  # temp dir cleaned up
    monkeypatch.undo()
    with Trainer.from_checkpoint(first, config_overrides={"num_workers": 0}) as restored:
        assert fingerprint(restored) == first_state


def test_an_interrupted_overwrite_keeps_the_old_checkpoint(
    trained: tuple[Trainer, dict[str, Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trainer, _ = trained
    path = Path(trainer.save(tmp_path))
    before = (path / "state.pkl").read_bytes()
    real_write = flowrl.storage.checkpoints._write_file
    calls: list[Path] = []

    def dies_on_second_file(p: Path, data: bytes) -> None:
        calls.append(p)
        if len(calls) == 2:
            raise OSError("disk full")
        real_write(p, data)

    monkeypatch.setattr(flowrl.storage.checkpoints, "_write_file", dies_on_second_file)
    with pytest.raises(OSError, match="disk full"):
        trainer.save(tmp_path)
    assert (path / "state.pkl").read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == [path.name]
    flowrl.storage.checkpoints.read_checkpoint(path)


def test_a_failed_rename_during_an_overwrite_keeps_the_old_checkpoint(
    trained: tuple[Trainer, dict[str, Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trainer, _ = trained
    path = Path(trainer.save(tmp_path))
    real_rename = os.rename
    calls: list[tuple[Any, Any]] = []

    def rename(src: Any, dst: Any) -> None:
        calls.append((src, dst))
        if len(calls) == 2:
            raise OSError("killed during the swap")
        real_rename(src, dst)

    monkeypatch.setattr(flowrl.storage.checkpoints.os, "rename", rename)
    with pytest.raises(OSError):
        trainer.save(tmp_path)
    monkeypatch.undo()
    flowrl.storage.checkpoints.read_checkpoint(path)  # the previous checkpoint must still be there


def test_a_corrupt_checkpoint_raises_a_checkpoint_error_naming_it(
    trained: tuple[Trainer, dict[str, Any]], tmp_path: Path, no_actors: None
) -> None:
    trainer, _ = trained
    path = Path(trainer.save(tmp_path / "good"))
    corrupt = tmp_path / "corrupt"
    shutil.copytree(path, corrupt)
    data = (corrupt / "state.pkl").read_bytes()
    (corrupt / "state.pkl").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="corrupt") as info:
        trainer.restore(corrupt)
    assert str(corrupt) in str(info.value)
    with pytest.raises(CheckpointError) as info:
        Trainer.from_checkpoint(corrupt)
    assert str(corrupt) in str(info.value)


def test_missing_or_incomplete_checkpoints_raise_checkpoint_errors(
    trained: tuple[Trainer, dict[str, Any]], tmp_path: Path
) -> None:
    trainer, _ = trained
    with pytest.raises(CheckpointError, match="does not exist"):
        trainer.restore(tmp_path / "nowhere")
    path = Path(trainer.save(tmp_path))
    (path / "metadata.json").unlink()
    with pytest.raises(CheckpointError, match="metadata.json") as info:
        trainer.restore(path)
    assert str(path) in str(info.value)


def test_a_checkpoint_of_another_algorithm_is_rejected(trained: tuple[Trainer, dict[str, Any]], tmp_path: Path) -> None:
    trainer, _ = trained
    path = trainer.save(tmp_path)
    with Trainer("pg", ENV, {"num_workers": 0, "train_batch_size": 40, "rollout_fragment_length": 20}) as pg:
        before = fingerprint(pg)
        with pytest.raises(CheckpointError) as info:
            pg.restore(path)
        assert "'ppo'" in str(info.value) and "'pg'" in str(info.value)
        assert fingerprint(pg) == before  # nothing was half-restored


# --- evaluation and lifecycle ---


def test_evaluate_uses_deterministic_actions(trained: tuple[Trainer, dict[str, Any]]) -> None:
    trainer, _ = trained
    torch.manual_seed(1)
    first = trainer.evaluate(num_episodes=3, seed=123)
    torch.manual_seed(2)
    np.random.seed(2)
    second = trainer.evaluate(num_episodes=3, seed=123)
    assert first == second
    assert first["episodes"] == 3
    assert first["episode_reward_min"] <= first["episode_reward_mean"] <= first["episode_reward_max"]
    assert not math.isnan(first["episode_len_mean"]) and first["episode_reward_min"] >= 1


def test_stop_kills_remote_workers_and_leaves_a_joined_ray_running() -> None:
    address = ray.get_runtime_context().gcs_address
    trainer = Trainer(
        "pg",
        ENV,
        {"num_workers": 1, "num_cpus_per_worker": 0.1, "train_batch_size": 20, "rollout_fragment_length": 20},
        address=address,
    )
    remote = trainer.workers.remote_workers()
    assert len(remote) == 1 and ray.get(remote[0].ping.remote()) == "pong"
    trainer.stop()
    # ray.kill is asynchronous: a call sent right after it may still be served, but not for long.
    deadline = time.monotonic() + 30
    while True:
        try:
            ray.get(remote[0].ping.remote(), timeout=30)
        except ray.exceptions.RayActorError:
            break
        assert time.monotonic() < deadline, "the remote worker still answers 30 s after stop()"
        time.sleep(0.1)
    assert trainer.workers.remote_workers() == []
    assert ray.is_initialized()
    assert ray.get(ray.put("still running")) == "still running"


# --- reproducibility and running totals ---

SMALL_PPO = {
    "num_workers": 0,
    "rollout_fragment_length": 20,
    "train_batch_size": 40,
    "sgd_minibatch_size": 20,
    "num_sgd_iter": 2,
    "seed": 0,
}


def weights_after_one_iteration(algo: str, config: dict[str, Any]) -> dict[str, np.ndarray]:
    with Trainer(algo, ENV, config) as trainer:
        trainer.train()
        return trainer.workers.local_worker().get_weights()[DEFAULT_POLICY_ID]


def test_pg_with_a_seed_is_reproducible() -> None:
    config = {"num_workers": 0, "rollout_fragment_length": 20, "train_batch_size": 40, "seed": 0}
    a, b = weights_after_one_iteration("pg", config), weights_after_one_iteration("pg", config)
    assert all(np.array_equal(a[k], b[k]) for k in a)


def test_ppo_with_a_seed_is_reproducible() -> None:
    a, b = weights_after_one_iteration("ppo", SMALL_PPO), weights_after_one_iteration("ppo", SMALL_PPO)
    assert all(np.array_equal(a[k], b[k]) for k in a)


def test_episodes_total_survives_a_restore(tmp_path: Path) -> None:
    config = {"num_workers": 0, "rollout_fragment_length": 20, "train_batch_size": 40, "seed": 0}
    with Trainer("pg", ENV, config) as trainer:
        for _ in range(3):
            before = trainer.train()
        path = trainer.save(tmp_path)
    assert before["episodes_total"] > 1
    with Trainer("pg", ENV, config) as fresh:
        fresh.restore(path)
        after = fresh.train()
    assert after["training_iteration"] == before["training_iteration"] + 1
    assert after["episodes_total"] == before["episodes_total"] + after["episodes_this_iter"]


@pytest.mark.parametrize("with_contents", [False, True])
def test_dqn_checkpoint_keeps_the_replay_buffer_on_request(tmp_path: Any, with_contents: bool) -> None:
    from flowrl.operators.replay_ops import StoreToReplayBuffer

    def replay_buffer(trainer: Trainer) -> Any:
        return next(
            s.fn.local_buffer for s in trainer.plan.graph.operators.values() if isinstance(s.fn, StoreToReplayBuffer)
        )

    config = {
        "num_workers": 0,
        "learning_starts": 50,
        "train_batch_size": 16,
        "timesteps_per_iteration": 100,
        "seed": 0,
        "store_buffer_in_checkpoints": with_contents,
    }
    trainer = Trainer("dqn", "CartPole-v1", config)
    try:
        trainer.train()
        path = trainer.save(tmp_path)
        added = replay_buffer(trainer).num_steps_added
    finally:
        trainer.stop()
    restored = Trainer.from_checkpoint(path)
    try:
        buffer = replay_buffer(restored)
        assert buffer.num_steps_added == added > 0
        assert (sum(len(b) for b in buffer.buffers.values()) > 0) == with_contents
    finally:
        restored.stop()


def test_evaluate_checkpoint_needs_no_workers_even_for_algorithms_that_require_them(tmp_path: Any) -> None:
    from flowrl.engine.build import evaluate_checkpoint

    config = {
        "num_workers": 1,
        "num_cpus_per_worker": 0.1,
        "rollout_fragment_length": 10,
        "num_envs_per_worker": 1,
        "seed": 0,
    }
    trainer = Trainer("a3c", "CartPole-v1", config)  # A3C needs at least one remote worker to train
    try:
        trainer.train()
        path = trainer.save(tmp_path)
        expected = trainer.evaluate(num_episodes=2, seed=3)
    finally:
        trainer.stop()
    stats = evaluate_checkpoint(path, num_episodes=2, seed=3)
    assert stats["algo"] == "a3c" and stats["iteration"] == 1
    assert stats["episode_reward_mean"] == expected["episode_reward_mean"]


def test_apex_checkpoints_carry_the_replay_shards(tmp_path: Any) -> None:
    config = {
        "num_workers": 1,
        "num_cpus_per_worker": 0.1,
        "num_envs_per_worker": 1,
        "rollout_fragment_length": 20,
        "learning_starts": 50,
        "train_batch_size": 16,
        "timesteps_per_iteration": 100,
        "seed": 0,
        "store_buffer_in_checkpoints": True,
    }
    trainer = Trainer("apex", "CartPole-v1", config)
    try:
        trainer.train()
        path = trainer.save(tmp_path)
        saved = trainer.resources.get_state()
    finally:
        trainer.stop()
    restored = Trainer.from_checkpoint(path)
    try:
        [shard] = restored.resources.get_state()["replay_shards"]
        [original] = saved["replay_shards"]
        assert shard["num_steps_added"] >= original["num_steps_added"] > 0
    finally:
        restored.stop()


def test_a_version_1_checkpoint_restores_its_replay_buffer_and_operator_state(tmp_path: Any) -> None:
    """Version 1 kept replay state among the plan's operators, keyed by position and label."""
    config = {
        "num_workers": 0,
        "learning_starts": 50,
        "train_batch_size": 16,
        "timesteps_per_iteration": 100,
        "seed": 0,
        "store_buffer_in_checkpoints": True,
    }
    with Trainer("dqn", "CartPole-v1", config) as trainer:
        trainer.train()
        state = trainer.get_state()
    v1_state = {key: value for key, value in state.items() if key != "resources"}
    v1_state["version"] = 1
    v1_state["plan"] = {
        **state["plan"],
        "operators": {
            "2:for_each(StoreToReplayBuffer)": {"buffer": state["resources"]["replay_buffer"]},
            "9:for_each(CollectMetrics)": state["plan"]["operators"]["collect_metrics"],
        },
    }
    path = flowrl.storage.checkpoints.write_checkpoint(tmp_path / "v1", v1_state, {"iteration": 1})
    with Trainer.from_checkpoint(path) as restored:
        buffer = restored.resources.need_replay_buffer()
        assert buffer.num_steps_added == state["resources"]["replay_buffer"]["num_steps_added"] > 0
        assert sum(len(b) for b in buffer.buffers.values()) > 0
        # Version 1 did not save the pacing filter's count: everything else comes back.
        unsaved = "once_per_timesteps_elapsed"
        assert {k: v for k, v in restored.plan.get_state()["operators"].items() if k != unsaved} == {
            k: v for k, v in state["plan"]["operators"].items() if k != unsaved
        }
    with pytest.raises(CheckpointError, match="layout is version 7; this flowrl reads versions 1 to 3"):
        flowrl.engine.state.upgraded_state({**state, "version": 7})


def test_update_config_changes_live_keys_of_a_running_trainer_and_nothing_else() -> None:
    trainer = Trainer(
        "ppo", "CartPole-v1", {"num_workers": 0, "train_batch_size": 64, "sgd_minibatch_size": 32, "seed": 0}
    )
    try:
        trainer.train()
        policy = trainer.workers.local_worker().policy_map[DEFAULT_POLICY_ID]
        moments = policy.optimizer.state_dict()["state"]
        trainer.update_config({"lr": 1e-4, "entropy_coeff": 0.02})
        assert (trainer.config.lr, trainer.config.entropy_coeff) == (1e-4, 0.02)
        assert (policy.config.lr, policy.config.entropy_coeff) == (1e-4, 0.02)
        assert [group["lr"] for group in policy.optimizer.param_groups] == [1e-4]
        assert policy.optimizer.state_dict()["state"].keys() == moments.keys()  # Adam's moments kept
        with pytest.raises(
            ConfigError,
            match=r"gamma cannot change on a running ppo trainer "
            r"\(keys that can: clip_param, entropy_coeff, lr, vf_loss_coeff\)",
        ):
            trainer.update_config({"gamma": 0.9, "lr": 1e-3})
        with pytest.raises(ConfigError, match="lr=-1.0 must be > 0"):
            trainer.update_config({"lr": -1.0, "entropy_coeff": 0.5})
        assert (trainer.config.lr, policy.config.entropy_coeff, trainer.config.gamma) == (1e-4, 0.02, 0.99)  # unchanged
        trainer.train()
        assert trainer.get_state()["config"]["lr"] == 1e-4  # checkpoints record the new values
    finally:
        trainer.stop()
