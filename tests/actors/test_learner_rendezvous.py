"""A learner group's rendezvous listens on the node's cluster address only, and gloo on its interface (no Ray:
one learner forms a group of one in this process)."""

from __future__ import annotations

import os

import pytest
import ray
import torch.distributed as dist

from flowrl.actors.learner_group import LearnerActor

pytestmark = pytest.mark.unit

psutil = pytest.importorskip("psutil")


def a_non_loopback_address() -> tuple[str, str]:
    for interface, addresses in psutil.net_if_addrs().items():
        for entry in addresses:
            if entry.family.name == "AF_INET" and not entry.address.startswith("127."):
                return interface, entry.address
    pytest.skip("this machine has no IPv4 address besides loopback")


def listening_on(port: int) -> list[str]:
    return [
        c.laddr.ip
        for c in psutil.Process().net_connections(kind="tcp")
        if c.status == psutil.CONN_LISTEN and c.laddr.port == port
    ]


def test_the_rendezvous_listens_on_the_node_address_only(monkeypatch: pytest.MonkeyPatch) -> None:
    interface, node_address = a_non_loopback_address()
    monkeypatch.setattr(ray.util, "get_node_ip_address", lambda: node_address)
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "unset below; restored after the test")
    monkeypatch.delenv("GLOO_SOCKET_IFNAME")
    learner = LearnerActor({}, num_gpus=0.0, num_threads=1, seed=0, incarnation=0)
    host, port = learner.address()
    assert host == node_address
    assert listening_on(port) == [node_address]  # not 0.0.0.0 or ::, which every interface reaches
    learner.join(host, port, rank=0, size=1, timeout_s=30)
    try:
        assert dist.is_initialized() and dist.get_world_size() == 1
        assert listening_on(port) == [node_address]  # the store serves on the same socket
        assert os.environ["GLOO_SOCKET_IFNAME"] == interface
    finally:
        dist.destroy_process_group()
