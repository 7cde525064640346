"""Exact resume: a seeded run killed with SIGKILL after a checkpoint and resumed with ``flowrl train --resume``
ends bit-identical to the uninterrupted run (weights, optimizer state, counters, per-iteration rewards).

The PPO and DQN tests run the ``flowrl`` command three times in subprocesses (each with its own
embedded Ray); the other synchronous algorithms are checked through the Trainer, in this process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from fakes import progress

from flowrl import Trainer
from flowrl.data import DEFAULT_POLICY_ID
from flowrl.storage.checkpoints import latest_checkpoint, list_checkpoints, read_checkpoint
from flowrl.storage.rundir import json_safe

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]
ITERATIONS = 6
CONFIGS = {
    "ppo": [
        "--set",
        "train_batch_size=200",
        "--set",
        "rollout_fragment_length=100",
        "--set",
        "sgd_minibatch_size=50",
        "--set",
        "num_sgd_iter=2",
        "--set",
        "num_envs_per_worker=2",
    ],
    "dqn": ["--set", "learning_starts=100", "--set", "timesteps_per_iteration=100", "--set", "train_batch_size=16"],
}
# LSTM-PPO: a checkpoint taken mid-episode holds each env's recurrent state (the sampler's), which the resumed
# run must act from for its fragments, and so its weights, to repeat.
LSTM = ["model.use_lstm=true", "model.lstm_cell_size=16", "model.max_seq_len=8", "model.fcnet_hiddens=[16]"]
CASES = {
    "ppo": ("ppo", "CartPole-v1", CONFIGS["ppo"]),
    "dqn": ("dqn", "CartPole-v1", CONFIGS["dqn"]),
    "lstm-ppo": ("ppo", "StatelessCartPole-v1", [*CONFIGS["ppo"], *(arg for s in LSTM for arg in ("--set", s))]),
}
# What a result must repeat exactly (timings and timestamps differ by nature).
REPEATED = (
    "training_iteration",
    "timesteps_total",
    "episode_reward_mean",
    "episode_reward_min",
    "episode_reward_max",
    "episode_len_mean",
    "episodes_total",
)


def flowrl_train(*args: str) -> list[str]:
    return [sys.executable, "-m", "flowrl.cli", "train", *args]


def environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}


def run_dir(results: Path) -> Path:
    [directory] = list(results.iterdir())
    return directory


def final_state(directory: Path) -> dict[str, Any]:
    checkpoint = latest_checkpoint(directory / "checkpoints")
    assert checkpoint is not None and checkpoint.name == f"checkpoint_{ITERATIONS:06d}"
    state, _ = read_checkpoint(checkpoint)
    return state


@pytest.mark.parametrize("case", list(CASES))
def test_a_run_killed_after_a_checkpoint_resumes_bit_identically(case: str, tmp_path: Path) -> None:
    algo, env, settings = CASES[case]
    common = ["--algo", algo, "--env", env, "--num-workers", "0", "--seed", "3", "--checkpoint-freq", "2", *settings]
    uninterrupted = tmp_path / "uninterrupted"
    done = subprocess.run(
        flowrl_train(*common, "--stop-iters", str(ITERATIONS), "--results-dir", str(uninterrupted)),
        capture_output=True,
        text=True,
        timeout=240,
        cwd=REPO,
        env=environment(),
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]

    killed = tmp_path / "killed"
    proc = subprocess.Popen(
        flowrl_train(*common, "--results-dir", str(killed)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        cwd=REPO,
        env=environment(),
    )
    try:
        deadline = time.monotonic() + 200
        while time.monotonic() < deadline and proc.poll() is None:
            found = (
                latest_checkpoint(run_dir(killed) / "checkpoints")
                if killed.exists() and any(killed.iterdir())
                else None
            )
            if found is not None:
                break
            time.sleep(0.05)
        assert proc.poll() is None, "the run ended before it could be killed"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    directory = run_dir(killed)
    resumed = subprocess.run(
        flowrl_train("--resume", str(directory), "--stop-iters", str(ITERATIONS)),
        capture_output=True,
        text=True,
        timeout=240,
        cwd=REPO,
        env=environment(),
        check=False,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]

    expected, got = progress(run_dir(uninterrupted)), progress(directory)
    assert [r["training_iteration"] for r in got] == list(range(1, ITERATIONS + 1))
    for want, have in zip(expected, got):
        assert {k: want.get(k) for k in REPEATED} == {k: have.get(k) for k in REPEATED}
        assert want["info"]["num_steps_trained"] == have["info"]["num_steps_trained"]
    if (
        case == "lstm-ppo"
    ):  # the checkpoint resumed from was taken mid-episode: its envs' states are not the initial ones
        first, _ = read_checkpoint(list_checkpoints(directory / "checkpoints")[0])
        states, _, _ = first["worker"]["sampler"]["recurrent"]
        assert all(np.abs(state).sum(axis=1).all() for state in states)
    a, b = final_state(run_dir(uninterrupted)), final_state(directory)
    policy_a, policy_b = a["worker"]["policies"][DEFAULT_POLICY_ID], b["worker"]["policies"][DEFAULT_POLICY_ID]
    assert policy_a["weights"].keys() == policy_b["weights"].keys()
    for name in policy_a["weights"]:
        assert np.array_equal(policy_a["weights"][name], policy_b["weights"][name]), name
    optimizer_a, optimizer_b = policy_a["optimizer"]["state"], policy_b["optimizer"]["state"]
    assert optimizer_a.keys() == optimizer_b.keys()
    for index, moments in optimizer_a.items():
        assert all(
            torch.equal(torch.as_tensor(value), torch.as_tensor(optimizer_b[index][key]))
            for key, value in moments.items()
        )
    assert a["plan"]["metrics"][0] == b["plan"]["metrics"][0]


SYNCHRONOUS = [
    ("pg", "CartPole-v1", {"num_workers": 0, "train_batch_size": 100}),
    ("a2c", "CartPole-v1", {"num_workers": 1, "train_batch_size": 100, "rollout_fragment_length": 50}),
    (
        "ddpg",
        "Pendulum-v1",
        {"num_workers": 0, "learning_starts": 50, "timesteps_per_iteration": 100, "train_batch_size": 16},
    ),
    (
        "td3",
        "Pendulum-v1",
        {
            "num_workers": 1,
            "learning_starts": 50,
            "timesteps_per_iteration": 100,
            "train_batch_size": 16,
            "rollout_fragment_length": 25,
        },
    ),
    (
        "sac",
        "Pendulum-v1",
        {
            "num_workers": 1,
            "learning_starts": 50,
            "timesteps_per_iteration": 100,
            "train_batch_size": 16,
            "rollout_fragment_length": 25,
        },
    ),
    (
        "sac",
        "CartPole-v1",
        {"num_workers": 0, "learning_starts": 50, "timesteps_per_iteration": 100, "train_batch_size": 16},
    ),
    ("es", "CartPole-v1", {"num_workers": 1, "episodes_per_batch": 4, "train_batch_size": 100}),
    ("ars", "CartPole-v1", {"num_workers": 0, "train_batch_size": 100}),
    (
        "ppo",
        "MultiAgentCartPole",
        {
            "num_workers": 1,
            "train_batch_size": 100,
            "rollout_fragment_length": 50,
            "sgd_minibatch_size": 50,
            "num_sgd_iter": 1,
        },
    ),
]


@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize(("algo", "env", "config"), SYNCHRONOUS, ids=[f"{a}-{e}" for a, e, _ in SYNCHRONOUS])
def test_a_restored_trainer_repeats_the_uninterrupted_run(
    algo: str, env: str, config: dict[str, Any], tmp_path: Path
) -> None:
    """Through ``Trainer.save`` and ``from_checkpoint``, with the driver or remote workers sampling."""
    config = {**config, "seed": 1, "num_cpus_per_worker": 0.25}
    with Trainer(algo, env, config) as trainer:
        trainer.train()
        path = trainer.save(tmp_path)
        expected = [repeated(trainer.train()) for _ in range(2)]
        expected_fingerprint = fingerprint_all(trainer)
    with Trainer.from_checkpoint(path) as restored:
        assert [repeated(restored.train()) for _ in range(2)] == expected
        assert fingerprint_all(restored) == expected_fingerprint
        assert restored.restore_report is not None and restored.restore_report["envs_restarted"] == {}


def repeated(result: dict[str, Any]) -> dict[str, Any]:
    """What a result must repeat exactly, NaN (no episode finished yet) as None so that it compares equal."""
    return json_safe({k: result.get(k) for k in REPEATED})


def fingerprint_all(trainer: Trainer) -> dict[str, Any]:
    """Every policy's weights, and the counters."""
    weights = {
        pid: {name: value.tobytes() for name, value in policy.get_weights().items()}
        for pid, policy in trainer.workers.local_worker().policy_map.items()
    }
    return {"weights": weights, "counters": dict(trainer.plan.metrics.counters)}
