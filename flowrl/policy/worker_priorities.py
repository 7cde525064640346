"""Worker-side replay priorities (Ape-X): the TD error of each sampled row, computed where it was sampled.

A policy computes priorities when its algorithm gave it a TD-error function (``td_error_fn``, see
:data:`~flowrl.policy.torch_hooks.TDErrorFn`) and its config turns ``worker_side_prioritization``
on. A rollout worker then adds the ``td_error`` column to each fragment it sampled (after the n-step
postprocessing), from its current weights and its copy of the learner's target network; a prioritized
replay buffer stores the rows at ``|td_error| + eps`` instead of the max priority. The target networks'
weights travel with the weight syncs, each with the version of the target it copies (changed by every
target update), so a sender resends them only after they changed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeGuard

import numpy as np

from flowrl.data import MultiAgentBatch, SampleBatch, as_policy_batches
from flowrl.deferred import torch
from flowrl.policy.policy import ModelWeights
from flowrl.policy.torch_policy import TorchPolicy

if TYPE_CHECKING:
    from flowrl.policy.target_network import TargetNetwork

Batch = SampleBatch | MultiAgentBatch


def computes_priorities(policy: object) -> TypeGuard[TorchPolicy[Any]]:
    """Whether ``policy`` computes the priorities of its rows where they are sampled."""
    return isinstance(policy, TorchPolicy) and policy.td_error_fn is not None and wants_priorities(policy)


def wants_priorities(policy: Any) -> bool:
    """Whether ``policy``'s config asks for worker-side priorities (whether or not it can compute them)."""
    return bool(getattr(policy.config, "worker_side_prioritization", False))


def td_errors(policy: TorchPolicy[Any], batch: SampleBatch) -> np.ndarray:
    """The TD error of each row of a postprocessed ``batch`` by ``policy``'s ``td_error_fn``, without gradient."""
    assert policy.td_error_fn is not None
    # A new dict of the same arrays: decompressing it leaves the batch compressed for its journey.
    tensors = policy.to_tensors(SampleBatch(dict(batch)))
    with torch.no_grad():
        return policy.td_error_fn(policy, tensors).detach().cpu().numpy().astype(np.float32)


def add_td_errors(policies: Mapping[str, object], batch: Batch) -> Batch:
    """Add the ``td_error`` column to the rows of each policy that computes priorities (in place; returns it)."""
    for policy_id, rows in as_policy_batches(batch).items():
        policy = policies.get(policy_id)
        if policy is not None and rows.count and computes_priorities(policy):
            rows[SampleBatch.TD_ERROR] = td_errors(policy, rows)
    return batch


def _targets(policies: Mapping[str, object], policy_ids: Sequence[str] | None) -> dict[str, TargetNetwork]:
    """The target networks the rollout workers need, of the policies ``policy_ids`` (default all)."""
    targets = {}
    for pid in policy_ids or policies:
        policy = policies.get(pid)
        if computes_priorities(policy) and policy.target_network is not None:
            targets[pid] = policy.target_network
    return targets


def target_versions(policies: Mapping[str, object], policy_ids: Sequence[str] | None = None) -> dict[str, int]:
    """The version of each target network the rollout workers need (of ``policy_ids``, default all)."""
    return {pid: target.version for pid, target in _targets(policies, policy_ids).items()}


def target_weights(policies: Mapping[str, object], policy_ids: Sequence[str] | None = None) -> dict[str, ModelWeights]:
    """The weights of each target network the rollout workers need (of ``policy_ids``, default all)."""
    return {pid: target.get_weights() for pid, target in _targets(policies, policy_ids).items()}


def load_target_weights(policies: Mapping[str, object], targets: Mapping[str, ModelWeights]) -> None:
    """Load :func:`target_weights`'s output into the policies' target networks."""
    for pid, weights in targets.items():
        policy = policies[pid]
        if not isinstance(policy, TorchPolicy) or policy.target_network is None:
            raise TypeError(f"policy {pid!r} ({type(policy).__name__}) has no target network to load")
        policy.target_network.load(weights)
