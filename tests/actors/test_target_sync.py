"""TargetSync: the target networks go with the weights only to a receiver that lacks their version."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from flowrl.actors import target_sync
from flowrl.actors.target_sync import TargetSync
from flowrl.algorithms import get_algorithm
from flowrl.data import DEFAULT_POLICY_ID

pytestmark = pytest.mark.unit


def dqn_policy(**config: Any) -> Any:
    env = gym.make("CartPole-v1")
    algorithm = get_algorithm("dqn")
    cfg = algorithm.config_class.from_dict(
        {"seed": 0, "worker_side_prioritization": True, "model": {"fcnet_hiddens": [8]}, **config}
    )
    return algorithm.make_policy(env.observation_space, env.action_space, cfg).build()


@pytest.fixture
def puts(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """What TargetSync put into the object store (a list standing in for Ray; refs are 'ref<n>')."""
    stored: list[Any] = []

    class FakeRay:
        @staticmethod
        def put(value: Any) -> str:
            stored.append(value)
            return f"ref{len(stored)}"

    monkeypatch.setattr(target_sync, "ray", FakeRay)
    return stored


def test_target_sync_sends_the_targets_only_when_a_receiver_lacks_their_version(puts: list[Any]) -> None:
    policy = dqn_policy()
    policies = {DEFAULT_POLICY_ID: policy}
    sync = TargetSync()
    assert sync.targets_for("a", policies) == "ref1"
    assert sync.targets_for("b", policies) == "ref1"  # one put per version, shared
    assert sync.targets_for("a", policies) is None
    policy.update_target()
    assert sync.targets_for("a", policies) == "ref2"
    assert sync.targets_for("a", policies) is None
    assert len(puts) == 2
    sent, now = puts[1][DEFAULT_POLICY_ID], policy.target_network.get_weights()
    assert sent.keys() == now.keys() and all(np.array_equal(sent[k], now[k]) for k in now)


def test_target_sync_sends_nothing_without_worker_side_priorities(puts: list[Any]) -> None:
    policies = {DEFAULT_POLICY_ID: dqn_policy(worker_side_prioritization=False)}
    assert TargetSync().targets_for("a", policies) is None
    assert puts == []
