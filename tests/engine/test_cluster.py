"""flowrl on a real multi-node Ray cluster: three raylets on this machine (``ray.cluster_utils.Cluster``
in a harness process, see ``cluster_harness.py``), one CPU each, shared by the tests of this module
and driven by ``flowrl train --address`` in subprocesses (a driver joins one Ray cluster; this
process keeps the test session's own).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
import yaml
from cluster_harness import ClusterHandle
from fakes import progress

from flowrl.algorithms import get_algorithm

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cluster(ray_session: None) -> Iterator[ClusterHandle]:
    """A head and two worker nodes, one CPU each, with token authentication, held by a harness
    process beside (never inside) this test session's own Ray."""
    # The session's local Ray turned token authentication on in this process (Ray >= 2.59): the
    # cluster requires the machine's token (~/.ray/auth_token), which the flowrl drivers below find.
    assert os.environ.get("RAY_AUTH_MODE") == "token"
    handle = ClusterHandle(workers=2, num_cpus=1, env=environment())
    try:
        yield handle
    finally:
        handle.close()


def flowrl(*args: str) -> list[str]:
    return [sys.executable, "-m", "flowrl.cli", *args]


def environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}


def run_directory(results: Path) -> Path:
    [directory] = list(results.iterdir())
    return directory


def test_a_resource_the_cluster_lacks_fails_before_training(cluster: ClusterHandle, tmp_path: Path) -> None:
    start = time.monotonic()
    proc = subprocess.run(
        flowrl(
            "train",
            "--algo",
            "ppo",
            "--env",
            "CartPole-v1",
            "--num-workers",
            "2",
            "--address",
            cluster.address,
            "--set",
            'custom_resources_per_worker={"TPU": 1}',
            "--results-dir",
            str(tmp_path),
        ),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env=environment(),
        check=False,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "TPU" in proc.stderr and "custom_resources_per_worker" in proc.stderr
    assert time.monotonic() - start < 30
    assert not tmp_path.exists() or not any(tmp_path.iterdir())  # no run directory: nothing trained
    assert cluster.all_alive()


def test_a_driver_without_the_clusters_token_is_refused(cluster: ClusterHandle, tmp_path: Path) -> None:
    home = tmp_path / "home"  # no ~/.ray/auth_token there
    home.mkdir()
    env = {k: v for k, v in environment().items() if k not in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")}
    proc = subprocess.run(
        flowrl(
            "train",
            "--algo",
            "pg",
            "--env",
            "CartPole-v1",
            "--address",
            cluster.address,
            "--results-dir",
            str(tmp_path / "runs"),
        ),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={**env, "HOME": str(home), "RAY_AUTH_MODE": "token"},
        check=False,
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert f"flowrl: error: cannot join the Ray cluster at '{cluster.address}'" in proc.stderr
    assert "RAY_AUTH_TOKEN" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    ("example", "extra"),
    [
        ("cartpole-ppo.yaml", ["--set", "num_workers=2"]),
        ("cartpole-apex.yaml", ["--set", "num_replay_shards=2", "--set", "replay_shard_placement=spread"]),
    ],
    ids=["ppo", "apex-spread-shards"],
)
def test_a_run_spreads_its_workers_over_nodes_learns_and_leaves_the_cluster_running(
    cluster: ClusterHandle, example: str, extra: list[str], tmp_path: Path
) -> None:
    proc = subprocess.run(
        flowrl(
            "train",
            "--config",
            f"tuned_examples/{example}",
            "--address",
            cluster.address,
            "--seed",
            "0",
            "--set",
            "num_cpus_per_worker=1",
            "--set",
            "num_cpus_for_driver=1",
            *extra,
            "--stop-reward",
            "150",
            "--results-dir",
            str(tmp_path),
        ),
        capture_output=True,
        text=True,
        timeout=280,
        cwd=REPO,
        env=environment(),
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = progress(run_directory(tmp_path))
    assert results[-1]["episode_reward_mean"] >= 150
    placement = results[-1]["info"]["placement"]
    nodes = set(placement["worker_nodes"].values())
    assert len(nodes) == 2  # one CPU per node: two one-CPU workers cannot share one
    # The driver's CPU is reserved on its own node, so the workers went to the other two.
    [driver] = [bundle for bundle in placement["bundles"] if bundle["role"] == "driver"]
    assert driver["node_id"] == placement["driver_node"] not in nodes
    shards = results[-1]["info"].get("replay_shards", [])
    assert len({shard["node_id"] for shard in shards}) == len(shards)  # spread: Ape-X's two shards on two nodes
    assert cluster.all_alive() and cluster.num_nodes() == 3


def test_replay_shards_run_next_to_the_learner_by_default(cluster: ClusterHandle, tmp_path: Path) -> None:
    proc = subprocess.run(
        flowrl(
            "train",
            "--algo",
            "apex",
            "--env",
            "CartPole-v1",
            "--address",
            cluster.address,
            "--set",
            "num_cpus_per_worker=1",
            "--set",
            "num_replay_shards=2",
            "--set",
            "learning_starts=100",
            "--set",
            "timesteps_per_iteration=200",
            "--stop-iters",
            "1",
            "--results-dir",
            str(tmp_path),
        ),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env=environment(),
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    [result] = progress(run_directory(tmp_path))
    driver = result["info"]["placement"]["driver_node"]
    assert [shard["node_id"] for shard in result["info"]["replay_shards"]] == [driver, driver]


def test_losing_a_worker_node_restarts_its_worker_elsewhere_and_training_goes_on(
    cluster: ClusterHandle, tmp_path: Path
) -> None:
    batch, fragment = 400, 100

    def a_worker_node(result: dict[str, Any], head: str) -> str:
        return next(node for node in result["info"]["placement"]["worker_nodes"].values() if node != head)

    _, results, victim_id = lose_a_node_mid_run(
        cluster,
        tmp_path,
        a_worker_node,
        "--algo",
        "ppo",
        "--env",
        "CartPole-v1",
        "--num-workers",
        "2",
        "--seed",
        "0",
        "--set",
        "num_cpus_per_worker=1",
        "--set",
        f"rollout_fragment_length={fragment}",
        "--set",
        f"train_batch_size={batch}",
        "--set",
        "sgd_minibatch_size=100",
        "--set",
        "num_sgd_iter=1",
    )
    assert results[-1]["num_worker_restarts"] == 1
    assert results[-1]["num_healthy_workers"] == 2
    assert victim_id not in results[-1]["info"]["placement"]["worker_nodes"].values()
    totals = [0] + [r["timesteps_total"] for r in results]
    # A round that lost its dead worker's fragment can make the concatenation end one fragment over B.
    assert all(batch <= after - before <= batch + fragment for before, after in pairwise(totals)), totals


def test_losing_a_node_recreates_its_replay_shard_and_worker_and_apex_goes_on(
    cluster: ClusterHandle, tmp_path: Path
) -> None:
    def a_shard_node(result: dict[str, Any], head: str) -> str:
        return next(shard["node_id"] for shard in result["info"]["replay_shards"] if shard["node_id"] != head)  # spread

    before, results, victim_id = lose_a_node_mid_run(
        cluster,
        tmp_path,
        a_shard_node,
        "--algo",
        "apex",
        "--env",
        "CartPole-v1",
        "--seed",
        "0",
        "--set",
        "num_cpus_per_worker=1",
        "--set",
        "num_replay_shards=2",
        "--set",
        "replay_shard_placement=spread",
        "--set",
        "learning_starts=100",
        "--set",
        "timesteps_per_iteration=200",
    )
    shard_nodes = [shard["node_id"] for shard in before[-1]["info"]["replay_shards"]]
    worker_nodes = list(before[-1]["info"]["placement"]["worker_nodes"].values())
    last = results[-1]
    assert last["num_replay_shard_restarts"] == shard_nodes.count(victim_id)
    assert last["num_worker_restarts"] == worker_nodes.count(victim_id)
    assert victim_id not in [shard["node_id"] for shard in last["info"]["replay_shards"]]
    assert all(shard["num_steps_added"] > 0 for shard in last["info"]["replay_shards"])  # both shards fill again
    assert last["timesteps_total"] > before[-1]["timesteps_total"]


def test_losing_a_node_recreates_its_aggregator_and_impala_goes_on(cluster: ClusterHandle, tmp_path: Path) -> None:
    def an_aggregator_node(result: dict[str, Any], head: str) -> str:
        # One-CPU aggregators on one-CPU nodes: the two are on two nodes, so at least one is off the head.
        bundles = result["info"]["placement"]["bundles"]
        return next(b["node_id"] for b in bundles if b["role"] == "aggregator" and b["node_id"] != head)

    before, results, victim_id = lose_a_node_mid_run(
        cluster,
        tmp_path,
        an_aggregator_node,
        "--algo",
        "impala",
        "--env",
        "CartPole-v1",
        "--seed",
        "0",
        "--set",
        "num_cpus_per_worker=0.5",
        "--set",
        "num_aggregation_workers=2",
        "--set",
        "num_cpus_per_aggregator=1",
    )
    last = results[-1]
    assert last["num_aggregator_restarts"] >= 1
    bundles = last["info"]["placement"]["bundles"]
    assert victim_id not in [b["node_id"] for b in bundles]  # every bundle was re-reserved on a live node
    assert last["timesteps_total"] > before[-1]["timesteps_total"] and last["num_healthy_workers"] == 2


def lose_a_node_mid_run(
    cluster: ClusterHandle, tmp_path: Path, victim_of: Callable[[dict[str, Any], str], str], *args: str
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], str]:
    """Run ``flowrl train *args`` on the cluster; after 2 iterations remove the node ``victim_of(last result,
    head node id)`` names and add a fresh one; after 5 more, once every worker is in service again, SIGTERM
    the run (which must exit 143).

    Returns the results before the loss, all the results, and the lost node's id.
    """
    proc = subprocess.Popen(
        flowrl("train", *args, "--address", cluster.address, "--results-dir", str(tmp_path)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env=environment(),
    )
    try:
        before = wait_for_iterations(proc, tmp_path, 2)
        victim_id = victim_of(before[-1], cluster.head)
        cluster.remove_node(victim_id)
        cluster.add_node()
        results = wait_for_iterations(proc, tmp_path, len(before) + 5, whole=True)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 143, stderr[-3000:]
    assert cluster.all_alive()
    return before, results, victim_id


def wait_for_iterations(
    proc: subprocess.Popen[str], results_dir: Path, iterations: int, whole: bool = False
) -> list[dict[str, Any]]:
    """The run's results once ``progress.jsonl`` holds ``iterations`` of them (the process must keep running)
    and, with ``whole``, the last of them has every worker in service (a replacement starts in the background
    while the run goes on without it)."""
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read()[-3000:] if proc.stderr else "the run ended"
        if results_dir.exists() and any(results_dir.iterdir()):
            path = run_directory(results_dir) / "progress.jsonl"
            if path.exists():
                results = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
                if len(results) >= iterations and not (whole and results[-1]["num_workers_missing"]):
                    return results
        time.sleep(0.2)
    raise AssertionError(f"fewer than {iterations} iterations{' with every worker' if whole else ''} within 180 s")


def test_the_cluster_tuned_example_is_a_valid_config() -> None:
    spec = yaml.safe_load((REPO / "tuned_examples" / "apex-cluster.yaml").read_text())
    config = get_algorithm(spec["algo"]).config_class.from_dict(spec["config"])
    assert (config.placement_strategy, config.replay_shard_placement) == ("PACK", "driver_node")
    assert config.num_workers * config.num_cpus_per_worker == 32
