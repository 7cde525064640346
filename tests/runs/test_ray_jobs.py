"""``flowrl train`` submitted with Ray Jobs to a cluster this test starts (``ray start --head
--block`` in its own process, dashboard on, token authentication on), and ``ray job stop``
ending it with a checkpoint."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fakes import checkpoints, progress

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

RAY = str(Path(sys.executable).with_name("ray"))
REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ray_env() -> dict[str, str]:
    """This environment without the test session's cluster address, with the machine's Ray token."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    token = Path.home() / ".ray" / "auth_token"
    return {**env, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": env.get("RAY_AUTH_TOKEN") or token.read_text().strip()}


@pytest.fixture(scope="module")
def jobs_address(ray_session: None) -> Iterator[str]:
    """The Jobs API address of a one-node cluster (2 CPUs) with a dashboard, in its own process group."""
    temp = tempfile.mkdtemp(prefix="rj", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    port, dashboard = free_port(), free_port()
    head = subprocess.Popen(
        [
            RAY,
            "start",
            "--head",
            "--block",
            f"--port={port}",
            f"--dashboard-port={dashboard}",
            "--include-dashboard=true",
            "--num-cpus=2",
            f"--temp-dir={temp}",
            f"--ray-client-server-port={free_port()}",
            f"--dashboard-agent-listen-port={free_port()}",
            f"--node-manager-port={free_port()}",
            f"--object-manager-port={free_port()}",
            f"--metrics-export-port={free_port()}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=ray_env(),
        start_new_session=True,
    )
    address = f"http://127.0.0.1:{dashboard}"
    try:
        deadline = time.monotonic() + 90
        while subprocess.run(
            [RAY, "job", "list", "--address", address], capture_output=True, env=ray_env(), timeout=60
        ).returncode:
            assert head.poll() is None, "ray start --head exited"
            assert time.monotonic() < deadline, "the Jobs API did not answer within 90 s"
            time.sleep(1)
        yield address
    finally:
        # ray start --block stops its node's processes on SIGTERM, gracefully, over up to a minute:
        # the test is done with them, so what is left after a few seconds is killed.
        os.killpg(head.pid, signal.SIGTERM)
        try:
            head.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait(timeout=30)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(head.pid, signal.SIGKILL)  # the node's processes that outlived `ray start` (the group's)
        shutil.rmtree(temp, ignore_errors=True)


def submit(address: str, *args: str, wait: bool = True) -> subprocess.CompletedProcess[str]:
    """``ray job submit`` of ``flowrl train *args``, retried while the node's job agent is still starting."""
    command = [
        RAY,
        "job",
        "submit",
        "--address",
        address,
        *([] if wait else ["--no-wait"]),
        "--",
        sys.executable,
        "-m",
        "flowrl.cli",
        "train",
        *args,
    ]
    deadline = time.monotonic() + 60
    while True:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=200, env=ray_env(), cwd=REPO)
        if "No available agent" not in proc.stdout + proc.stderr or time.monotonic() > deadline:
            return proc
        time.sleep(2)


def test_a_submitted_run_finishes_and_its_run_directory_is_complete(jobs_address: str, tmp_path: Path) -> None:
    proc = submit(
        jobs_address, "--algo", "pg", "--env", "CartPole-v1", "--stop-iters", "2", "--results-dir", str(tmp_path)
    )
    assert proc.returncode == 0 and "succeeded" in proc.stdout + proc.stderr, (proc.stdout + proc.stderr)[-3000:]
    [run] = list(tmp_path.iterdir())
    assert json.loads((run / "params.json").read_text())["algo"] == "pg"
    assert [r["training_iteration"] for r in progress(run)] == [1, 2]
    assert (run / "checkpoints" / "checkpoint_000002" / "COMPLETE").is_file()


def test_ray_job_stop_ends_a_run_with_a_checkpoint(jobs_address: str, tmp_path: Path) -> None:
    proc = submit(jobs_address, "--algo", "pg", "--env", "CartPole-v1", "--results-dir", str(tmp_path), wait=False)
    [job] = re.findall(r"raysubmit_\w+", proc.stdout + proc.stderr)[:1]
    deadline = time.monotonic() + 120
    while not any(path.stat().st_size for path in tmp_path.glob("*/progress.jsonl")):
        assert time.monotonic() < deadline, "the job trained no iteration within 120 s"
        time.sleep(0.5)
    subprocess.run(
        [RAY, "job", "stop", "--address", jobs_address, job],
        capture_output=True,
        timeout=120,
        env=ray_env(),
        check=True,
    )
    logs = subprocess.run(
        [RAY, "job", "logs", "--address", jobs_address, job], capture_output=True, text=True, timeout=60, env=ray_env()
    ).stdout
    assert "interrupted (SIGTERM)" in logs and "resume with: flowrl train --resume" in logs, logs[-3000:]
    [run] = list(tmp_path.iterdir())
    [checkpoint] = checkpoints(run)
    assert (run / "checkpoints" / checkpoint / "COMPLETE").is_file()
