"""Two ``flowrl train --resume`` processes on one run directory: the second is refused, then takes over a killed one."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fakes import progress

from flowrl.cli import main as cli
from flowrl.storage.lock import read_lock

pytestmark = pytest.mark.integration

TINY = ["--num-workers", "0", "--set", "train_batch_size=64", "--set", "rollout_fragment_length=32"]


def resume(run: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "flowrl.cli", "train", "--resume", str(run), "-q", *extra]


def test_one_driver_per_run_and_a_killed_one_is_taken_over(tmp_path: Path) -> None:
    argv = ["train", "--algo", "pg", "--env", "CartPole-v1", "--results-dir", str(tmp_path), *TINY]
    assert cli.main([*argv, "--name", "shared", "--stop-iters", "1", "-q"]) == 0
    run = tmp_path / "shared"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    # The first driver trains for as long as it is let (no checkpoint before it is killed: the interval is 10 min).
    first = subprocess.Popen(
        resume(run, "--stop-iters", "100000000"), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 60
        while (owner := read_lock(run)) is None or owner.pid != first.pid:
            assert first.poll() is None, first.communicate()[1].decode()[-3000:]
            assert time.monotonic() < deadline, "the first driver did not take the lock in 60 s"
            time.sleep(0.1)

        second = subprocess.run(resume(run, "--stop-iters", "2"), env=env, capture_output=True, text=True, timeout=120)
        assert second.returncode == 2, second.stderr[-3000:]
        assert f"is in use by another driver (pid {first.pid} on host {socket.gethostname()} since " in second.stderr
        assert first.poll() is None  # the refusal did not disturb it
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=60)

    third = subprocess.run(resume(run, "--stop-iters", "2"), env=env, capture_output=True, text=True, timeout=120)
    assert third.returncode == 0, third.stderr[-3000:]
    assert "flowrl: warning: run directory" in third.stderr and "taking over the lock" in third.stderr
    assert f"pid {first.pid} is not running on this host" in third.stderr
    assert [r["training_iteration"] for r in progress(run)] == [1, 2]  # the killed driver's results are dropped
    assert read_lock(run) is None
