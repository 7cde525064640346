"""A multi-node Ray cluster on this machine (``ray.cluster_utils.Cluster``), held in its own process.

The test session keeps its own Ray in its own process; a ``Cluster`` made there would share
that process's Ray state (a multi-node cluster torn down beside a live session has broken
later tests). So the cluster lives here, driven over stdin/stdout, one JSON object per line
(answers prefixed with :data:`ANSWER`):

- at start: ``{"address", "head", "workers": [node ids]}`` (a head and ``--workers`` nodes of
  ``--num-cpus`` CPUs each);
- ``{"op": "add"}`` -> ``{"node_id"}``: a new worker node, once it has joined;
- ``{"op": "remove", "node_id"}`` -> ``{"ok": true}``: that worker node is stopped;
- ``{"op": "nodes"}`` -> ``{"nodes": [{"node_id", "alive"}]}``: whether each node's processes are running;
- ``{"op": "shutdown"}`` -> ``{"ok": true}``, and the process exits (as it does when stdin closes).

Run as ``python tests/cluster_harness.py --workers 2 --num-cpus 1``; :class:`ClusterHandle` drives it.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any
from unittest import mock

ANSWER = "cluster-harness: "  # how the harness's answers start, among whatever else reaches its stdout


class ClusterHandle:
    """The test side: starts the harness process and asks it for changes, each answer within ``timeout_s``."""

    def __init__(
        self, *, workers: int = 2, num_cpus: int = 1, env: dict[str, str] | None = None, timeout_s: float = 120
    ) -> None:
        self._timeout = timeout_s
        self._proc = subprocess.Popen(
            [sys.executable, str(Path(__file__)), "--workers", str(workers), "--num-cpus", str(num_cpus)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            start_new_session=True,
        )
        self._answers: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        try:
            started = self._answer()
        except BaseException:
            self.close()
            raise
        self.address: str = started["address"]
        self.head: str = started["head"]
        self.workers: list[str] = started["workers"]

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            if line.startswith(ANSWER):  # Ray may print too
                self._answers.put(line[len(ANSWER) :])

    def _answer(self) -> dict[str, Any]:
        try:
            line = self._answers.get(timeout=self._timeout)
        except queue.Empty:
            raise TimeoutError(f"the cluster harness did not answer within {self._timeout} s") from None
        return dict(json.loads(line))

    def _ask(self, **request: Any) -> dict[str, Any]:
        assert self._proc.stdin is not None
        self._proc.stdin.write(json.dumps(request) + "\n")
        self._proc.stdin.flush()
        return self._answer()

    def add_node(self) -> str:
        """Add a worker node; its id."""
        node_id: str = self._ask(op="add")["node_id"]
        self.workers.append(node_id)
        return node_id

    def remove_node(self, node_id: str) -> None:
        """Stop worker node ``node_id``."""
        self._ask(op="remove", node_id=node_id)
        self.workers.remove(node_id)

    def all_alive(self) -> bool:
        """Whether every node's processes are running."""
        return all(node["alive"] for node in self._ask(op="nodes")["nodes"])

    def num_nodes(self) -> int:
        return len(self._ask(op="nodes")["nodes"])

    def close(self) -> None:
        """Shut the cluster down; kill the harness's process group if it does not exit within a minute."""
        try:
            if self._proc.poll() is None:
                self._ask(op="shutdown")
                self._proc.wait(timeout=60)
        except (OSError, TimeoutError, subprocess.TimeoutExpired, ValueError):
            os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait(timeout=30)


def serve(workers: int, num_cpus: int) -> None:
    """The harness side: make the cluster and answer requests until told to stop."""
    from ray.cluster_utils import Cluster

    def reply(**answer: Any) -> None:
        print(ANSWER + json.dumps(answer), flush=True)

    # No metrics pipeline: while a lost node's placement group bundle waits for room, Ray's GCS retries placing
    # it without pause and exports metrics about each try, and the head's dashboard agent took a whole core
    # ingesting them. A real head node has its own cores for that; here the nodes share this machine's two
    # with the rollout workers (which Ray runs at nice 15), and the degraded run crawled.
    os.environ["RAY_enable_metrics_collection"] = "0"
    # Cluster records its address as this machine's current Ray cluster, which a later ray.init()
    # without an address would join: this test cluster must not be found that way.
    with mock.patch("ray._private.utils.write_ray_address"):
        cluster = Cluster(initialize_head=True, connect=False, head_node_args={"num_cpus": num_cpus})
    nodes = {cluster.head_node.node_id: cluster.head_node}
    try:
        for _ in range(workers):
            node = cluster.add_node(num_cpus=num_cpus)
            nodes[node.node_id] = node
        cluster.wait_for_nodes()
        reply(
            address=cluster.address,
            head=cluster.head_node.node_id,
            workers=[n for n in nodes if n != cluster.head_node.node_id],
        )
        for line in sys.stdin:
            request = json.loads(line)
            if request["op"] == "add":
                node = cluster.add_node(num_cpus=num_cpus)
                cluster.wait_for_nodes()
                nodes[node.node_id] = node
                reply(node_id=node.node_id)
            elif request["op"] == "remove":
                cluster.remove_node(nodes.pop(request["node_id"]))
                reply(ok=True)
            elif request["op"] == "nodes":
                reply(nodes=[{"node_id": n, "alive": not node.dead_processes()} for n, node in nodes.items()])
            elif request["op"] == "shutdown":
                break
    finally:
        with mock.patch("ray._common.utils.reset_ray_address"):
            cluster.shutdown()
    reply(ok=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--num-cpus", type=int, default=1)
    args = parser.parse_args()
    serve(args.workers, args.num_cpus)
