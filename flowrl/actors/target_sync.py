"""Target networks sent with the weights to rollout workers that compute worker-side priorities,
only when a receiver does not hold their current version yet."""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import Any

from flowrl.deferred import ray
from flowrl.policy.worker_priorities import target_versions, target_weights


class TargetSync:
    """Which receivers (a rollout worker, or every one of a broadcast) lack the current target networks.

    :meth:`targets_for` gives the object ref of the targets' weights when ``receiver`` was last given
    other versions (or none), else None: DQN's target changes only at target updates, so most weight
    syncs go without it; soft updates (DDPG) change it at every training step. The weights go to the
    object store once per version, shared by every receiver.
    """

    def __init__(self) -> None:
        self._sent: dict[Hashable, dict[str, int]] = {}
        self._versions: dict[str, int] | None = None
        self._ref: Any = None

    def targets_for(
        self, receiver: Hashable, policies: Mapping[str, object], policy_ids: Sequence[str] | None = None
    ) -> Any:
        """The ref of the target networks' weights (of ``policy_ids``, default all) to send ``receiver`` with
        its weights, or None when it holds them (or no policy computes worker-side priorities)."""
        versions = target_versions(policies, policy_ids)
        if not versions or self._sent.get(receiver) == versions:
            return None
        if versions != self._versions:
            self._ref = ray.put(target_weights(policies, policy_ids))
            self._versions = versions
        self._sent[receiver] = versions
        return self._ref
