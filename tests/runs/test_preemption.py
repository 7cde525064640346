"""Preemption: after SIGTERM a run writes a checkpoint of weights and counters first, then the full state within
``preemption_grace_s``; a run resumes from either.

The in-process tests use DQN with a local replay buffer; the last one runs Ape-X with a replay shard of about 200 MB
through ``flowrl train`` in a process of its own, on :class:`BigObservations` (imported there by its Gymnasium id
``test_preemption:BigObs-v0``, this module being on the ``PYTHONPATH`` of that process and its Ray workers).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

import flowrl
from flowrl.errors import RunWarning
from flowrl.runs.resume import find_resume_point, resume_run
from flowrl.runs.run import Run, start_run
from flowrl.storage.checkpoints import checkpoint_kind, read_checkpoint
from flowrl.storage.rundir import RunSpec

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]

# 50 kB observations: each replayed transition holds two, so 2000 of them are about 200 MB of replay contents.
OBS_BYTES = 50_000


class BigObservations(gym.Env[np.ndarray, np.int64]):
    """Episodes of 50 steps whose observations are :data:`OBS_BYTES` zero bytes: replay fills by 100 kB a step."""

    observation_space = gym.spaces.Box(0, 255, (OBS_BYTES,), np.uint8)
    action_space = gym.spaces.Discrete(2)

    def __init__(self) -> None:
        self._obs = np.zeros(OBS_BYTES, np.uint8)
        self._steps = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self._steps = 0
        return self._obs.copy(), {}

    def step(self, action: np.int64) -> tuple[np.ndarray, float, bool, bool, dict]:
        self._steps += 1
        return self._obs.copy(), 1.0, self._steps >= 50, False, {}


if "BigObs-v0" not in gym.registry:
    gym.register("BigObs-v0", entry_point=BigObservations)

DQN = {
    "num_workers": 0,
    "rollout_fragment_length": 16,
    "train_batch_size": 16,
    "learning_starts": 32,
    "buffer_size": 1000,
    "model": {"fcnet_hiddens": [16]},
    "seed": 0,
}


def terminate_at(iteration: int) -> Any:
    def on_result(result: dict[str, Any]) -> None:
        if result["training_iteration"] == iteration:
            os.kill(os.getpid(), signal.SIGTERM)

    return on_result


def record_saves(run: Run, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The kinds of the trainer's saves, in order."""
    saves: list[str] = []
    real_save, real_save_weights = run.trainer.save, run.trainer.save_weights

    def save(checkpoint_dir: Any, metadata: Any = None) -> str:
        saves.append("full")
        return real_save(checkpoint_dir, metadata)

    def save_weights(checkpoint_dir: Any) -> str:
        saves.append("weights")
        return real_save_weights(checkpoint_dir)

    monkeypatch.setattr(run.trainer, "save", save)
    monkeypatch.setattr(run.trainer, "save_weights", save_weights)
    return saves


def test_sigterm_saves_weights_first_then_the_full_state_in_its_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with start_run(RunSpec("dqn", "CartPole-v1", DQN), results_dir=tmp_path) as run:
        saves = record_saves(run, monkeypatch)
        summary = run.train(on_result=terminate_at(3))
    assert saves == ["weights", "full"]
    assert summary.interrupted_by == signal.SIGTERM and not summary.save_interrupted and not summary.weights_only
    assert summary.checkpoint == run.directory / "checkpoints" / "checkpoint_000003"
    assert sorted(p.name for p in summary.checkpoint.parent.iterdir()) == ["checkpoint_000003"]
    assert checkpoint_kind(summary.checkpoint) == "full"
    state, _ = read_checkpoint(summary.checkpoint)
    assert state["resources"]["replay_buffer"]["num_steps_added"] > 0


def test_a_full_save_that_fails_after_sigterm_says_the_run_ends_with_the_weights(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with start_run(RunSpec("dqn", "CartPole-v1", DQN), results_dir=tmp_path) as run:

        def save(checkpoint_dir: Any, metadata: Any = None) -> str:
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(run.trainer, "save", save)
        with pytest.warns(RunWarning) as warned:
            summary = run.train(on_result=terminate_at(2))
    weights = run.directory / "checkpoints" / "checkpoint_000002"
    assert summary.interrupted_by == signal.SIGTERM and summary.weights_only and summary.checkpoint == weights
    (message,) = [str(w.message) for w in warned if "failed" in str(w.message)]
    assert message.startswith("saving the full state of iteration 2 after SIGTERM failed (OSError: ")
    assert f"the run ends and its weights checkpoint {weights} stays the latest" in message
    assert "training goes on" not in message and "(num_failed_checkpoints=1)" in message


def test_with_no_grace_only_the_weights_are_saved_and_a_run_resumes_from_them(tmp_path: Path) -> None:
    spec = RunSpec("dqn", "CartPole-v1", {**DQN, "preemption_grace_s": 0})
    with start_run(spec, results_dir=tmp_path) as run:
        with pytest.warns(RunWarning, match=re.escape("SIGTERM: saved weights and counters only in ")):
            summary = run.train(on_result=terminate_at(3))
        weights = run.trainer.workers.local_worker().get_policy("default_policy").get_weights()
        counters = dict(run.trainer.plan.metrics.counters)
    assert summary.weights_only and summary.checkpoint == run.directory / "checkpoints" / "checkpoint_000003"
    metadata = json.loads((summary.checkpoint / "metadata.json").read_text())
    assert metadata["kind"] == "weights" and metadata["iteration"] == 3
    state, _ = read_checkpoint(summary.checkpoint)
    assert "replay_buffer" not in state["resources"] and "sampler" not in state["worker"]
    # What flowrl evaluate and export read: the portable policy files.
    policy = flowrl.load_policy(summary.checkpoint)
    assert policy.compute_action(np.zeros(4, np.float32)) in (0, 1)

    point = find_resume_point(run.directory, stop={"training_iteration": 4})
    assert point.checkpoint == summary.checkpoint and point.iteration == 3
    with pytest.warns(RunWarning) as warned:
        resumed = resume_run(point)
    try:
        (message,) = [str(w.message) for w in warned]
        assert "holds weights and counters only" in message and "with empty replay buffers" in message
        restored = resumed.trainer.workers.local_worker().get_policy("default_policy").get_weights()
        assert all(np.array_equal(restored[k], weights[k]) for k in weights)
        assert dict(resumed.trainer.plan.metrics.counters) == counters
        assert resumed.trainer.resources.replay_buffer is not None
        assert resumed.trainer.resources.replay_buffer.stats()["num_steps_added"] == 0
        resumed.train()
    finally:
        resumed.close()
    from fakes import progress

    assert [r["training_iteration"] for r in progress(run.directory)] == [1, 2, 3, 4]


def test_a_full_save_that_outlasts_the_grace_is_abandoned_and_the_weights_stay(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = RunSpec("dqn", "CartPole-v1", {**DQN, "preemption_grace_s": 1.0})
    with start_run(spec, results_dir=tmp_path) as run:
        monkeypatch.setattr(run.trainer, "get_state", lambda **_: time.sleep(60))  # a replay shard that never answers
        sent, alarm = time.monotonic(), signal.getsignal(signal.SIGALRM)
        with pytest.warns(RunWarning, match="ran out while the full state was being saved"):
            summary = run.train(on_result=terminate_at(2))
        took = time.monotonic() - sent
    assert summary.weights_only and not summary.save_interrupted
    assert 1.0 <= took < 20, f"the run ended {took:.1f} s after SIGTERM (preemption_grace_s=1)"
    assert sorted(p.name for p in (run.directory / "checkpoints").iterdir()) == ["checkpoint_000002"]
    assert checkpoint_kind(run.directory / "checkpoints" / "checkpoint_000002") == "weights"
    assert signal.getsignal(signal.SIGALRM) == alarm  # pytest-timeout's, with its timer


def test_a_second_signal_during_the_full_save_keeps_the_weights(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sighup_default: None
) -> None:
    with start_run(RunSpec("dqn", "CartPole-v1", DQN), results_dir=tmp_path) as run:

        def get_state(**_: Any) -> dict[str, Any]:
            os.kill(os.getpid(), signal.SIGHUP)
            raise AssertionError("the signal did not interrupt the save")

        monkeypatch.setattr(run.trainer, "get_state", get_state)
        summary = run.train(on_result=terminate_at(2))
    assert summary.save_interrupted and summary.weights_only and summary.interrupted_by == signal.SIGTERM
    assert checkpoint_kind(run.directory / "checkpoints" / "checkpoint_000002") == "weights"


# --- Ape-X through the CLI, in a process of its own ----------------------------------------------------

FLOWRL = (
    "import runpy, signal\n"
    "for signum in (signal.SIGTERM, signal.SIGHUP):\n"
    "    signal.signal(signum, signal.SIG_DFL)\n"
    "runpy.run_module('flowrl.cli', run_name='__main__', alter_sys=True)\n"
)
# 2 workers on a quarter CPU each; a 2000-row shard (about 200 MB) full after 1 iteration; checkpoints keep it.
APEX = [
    sys.executable,
    "-c",
    FLOWRL,
    "train",
    "--algo",
    "apex",
    "--env",
    "test_preemption:BigObs-v0",
    "--name",
    "apex1",
    *("--set", "num_workers=2", "--set", "num_cpus_per_worker=0.25", "--set", "num_envs_per_worker=1"),
    *("--set", "rollout_fragment_length=50", "--set", "timesteps_per_iteration=2000"),
    *("--set", "buffer_size=2000", "--set", "learning_starts=100", "--set", "train_batch_size=16"),
    *("--set", "training_intensity=null", "--set", "model.fcnet_hiddens=[8]", "--set", "preemption_grace_s=0"),
]


def flowrl_apex(*argv: str, stderr: Path) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parent), str(REPO / "tests"), env.get("PYTHONPATH", "")])
    with open(stderr, "w") as err:
        return subprocess.Popen([*APEX, *argv], stdout=subprocess.PIPE, stderr=err, text=True, cwd=REPO, env=env)


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_apex_with_a_full_replay_shard_saves_its_weights_within_2_5_s_of_sigterm_and_resumes(tmp_path: Path) -> None:
    results = tmp_path / "results"
    proc = flowrl_apex("--results-dir", str(results), stderr=tmp_path / "stderr.txt")
    try:
        out = []
        assert proc.stdout is not None
        for line in proc.stdout:  # one iteration: 2000 steps of 100 kB in the replay shard
            out.append(line)
            if line.startswith("iter    1"):
                break
        assert out and out[-1].startswith("iter    1"), "".join(out) + (tmp_path / "stderr.txt").read_text()[-3000:]
        time.sleep(0.5)  # mid-iteration
        sent_at = time.time()
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    output = "".join(out) + rest + (tmp_path / "stderr.txt").read_text()[-3000:]
    assert proc.returncode == 143, output
    run = results / "apex1"
    assert [p.name for p in results.iterdir()] == ["apex1"]
    (saved,) = sorted((run / "checkpoints").iterdir())
    metadata = json.loads((saved / "metadata.json").read_text())
    assert metadata["kind"] == "weights", output
    # A generous but real bound: the issue asks for 2.5 s, within ray job stop's 3 s before SIGKILL.
    written = (saved / "COMPLETE").stat().st_mtime - sent_at
    assert written <= 2.5, f"the weights checkpoint was complete {written:.2f} s after SIGTERM"
    shard = json.loads((run / "progress.jsonl").read_text().splitlines()[-1])["info"]["replay_shards"][0]
    replay_bytes = shard["policies"]["default_policy"]["est_size_bytes"]
    assert replay_bytes >= 190e6, shard  # about 200 MB of replay contents when the signal came

    # The same command, --resume-if-exists: it goes on in the same run directory from the weights checkpoint.
    proc = flowrl_apex(
        "--results-dir",
        str(results),
        "--resume-if-exists",
        "--stop-iters",
        str(metadata["iteration"] + 1),
        stderr=tmp_path / "stderr2.txt",
    )
    rest, _ = proc.communicate(timeout=120)
    stderr = (tmp_path / "stderr2.txt").read_text()
    assert proc.returncode == 0, rest + stderr[-3000:]
    assert [p.name for p in results.iterdir()] == ["apex1"]
    iterations = [json.loads(line)["training_iteration"] for line in (run / "progress.jsonl").read_text().splitlines()]
    assert iterations == list(range(1, metadata["iteration"] + 2))
    assert stderr.count("holds weights and counters only") == 1
