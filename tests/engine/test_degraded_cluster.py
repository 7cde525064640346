"""Degraded but alive: a run that loses a node with no spare capacity goes on with the workers it has,
and its lost worker rejoins when a node comes back. A harness-held 3-node cluster on this machine (see
``cluster_harness.py``), one CPU per node, driven by ``flowrl train --address`` in a subprocess."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster_harness import ClusterHandle

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
#: How long the run goes without the lost node. CI runs a 30 s gap to stay in its time budget; the issue's
#: 180 s: FLOWRL_DEGRADED_GAP_S=180 pytest tests/engine/test_degraded_cluster.py (passed in 210 s).
GAP_S = float(os.environ.get("FLOWRL_DEGRADED_GAP_S", "30"))


def environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}


@pytest.fixture(scope="module")
def cluster(ray_session: None) -> Iterator[ClusterHandle]:
    """A head and two worker nodes, one CPU each: no room for a third one-CPU worker."""
    handle = ClusterHandle(workers=2, num_cpus=1, env=environment())
    try:
        yield handle
    finally:
        handle.close()


def results_of(results_dir: Path) -> list[dict[str, Any]]:
    paths = list(results_dir.glob("*/progress.jsonl"))
    if not paths:
        return []
    return [json.loads(line) for line in paths[0].read_text().splitlines() if line.strip()]


def wait_for(proc: subprocess.Popen[str], results_dir: Path, done: Any, within_s: float) -> list[dict[str, Any]]:
    """The run's results once ``done(results)`` holds (the run must keep going meanwhile)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read()[-3000:] if proc.stderr else "the run ended"
        results = results_of(results_dir)
        if results and done(results):
            return results
        time.sleep(0.5)
    raise AssertionError(f"not done within {within_s:g} s: {len(results_of(results_dir))} iterations")


def steps_per_s(results: list[dict[str, Any]]) -> float:
    steps = results[-1]["timesteps_total"] - results[0]["timesteps_total"]
    return steps / sum(r["time_this_iter_s"] for r in results[1:])


@pytest.mark.parametrize("gap_s", [GAP_S])
def test_losing_a_node_without_spare_capacity_degrades_the_run_until_a_node_returns(
    cluster: ClusterHandle, tmp_path: Path, gap_s: float
) -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "flowrl.cli",
            "train",
            "--algo",
            "ppo",
            "--env",
            "CartPole-v1",
            "--num-workers",
            "2",
            "--seed",
            "0",
            "--address",
            cluster.address,
            "--results-dir",
            str(tmp_path),
            *("--set", "num_cpus_per_worker=1", "--set", "num_cpus_for_driver=1"),
            *("--set", "rollout_fragment_length=100", "--set", "train_batch_size=400"),
            *("--set", "sgd_minibatch_size=100", "--set", "num_sgd_iter=1"),
            # Iterations of 2 s at least: a steady pace to compare the rates before and during the gap.
            *("--set", "min_iter_time_s=2"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env=environment(),
    )
    try:
        before = wait_for(proc, tmp_path, lambda r: len(r) >= 3, 240)
        worker_nodes = before[-1]["info"]["placement"]["worker_nodes"]
        victim = worker_nodes["1"]
        assert victim != cluster.head
        cluster.remove_node(victim)
        lost_at = time.monotonic()
        degraded = wait_for(proc, tmp_path, lambda r: r[-1]["num_workers_missing"] == 1, 150)
        time.sleep(max(0.0, gap_s - (time.monotonic() - lost_at)))
        during = [r for r in results_of(tmp_path)[len(degraded) - 1 :]]
        cluster.add_node()
        back_from = len(results_of(tmp_path))
        # Back once the replacement has started on the new node (a new node and a new process: seconds);
        # waited for longer here, so that a slow start fails the assertion below with its count.
        after = wait_for(proc, tmp_path, lambda r: len(r) > back_from and r[-1]["num_workers_missing"] == 0, 120)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 143, stderr[-3000:]
    assert len(during) >= 3
    assert all(r["num_healthy_workers"] == 1 and r["num_workers_missing"] == 1 for r in during)
    # Training goes on through the gap at a rate that one of the two workers can give.
    rate_before, rate_during = steps_per_s(before[1:]), steps_per_s(during)
    print(f"env steps/s before {rate_before:.0f}, during the gap {rate_during:.0f} ({rate_during / rate_before:.0%})")
    print(f"back {len(after) - back_from} iterations after the node returned")
    assert rate_during >= 0.4 * rate_before
    assert len(after) - back_from <= 2 and after[-1]["num_healthy_workers"] == 2
    assert after[-1]["num_workers_missing"] == 0 and after[-1]["num_worker_restarts"] == 1
    assert victim not in after[-1]["info"]["placement"]["worker_nodes"].values()
