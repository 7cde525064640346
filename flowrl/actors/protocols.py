"""What operators and learner threads use of the rollout workers, as Protocols.

A :class:`~flowrl.actors.WorkerSet` and its local :class:`~flowrl.actors.RolloutWorker` have
it all; so may a stand-in that is neither (a test double that records what the operators did).
Operators that only learn, broadcast weights or collect metrics type their ``workers`` with
:class:`WorkerSetLike`; those that sample from the Ray actors themselves keep
:class:`~flowrl.actors.WorkerSet`. A :class:`~flowrl.actors.LearnerThread` needs only a
:class:`PolicyHolder`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import numpy as np

from flowrl.data import DEFAULT_POLICY_ID, SampleBatch
from flowrl.policy.protocols import Learner, LearningPolicy

if TYPE_CHECKING:
    from flowrl.actors.rollout_worker import WorkerMetrics

R = TypeVar("R")


class PolicyHolder(Protocol):
    """A worker as a learner thread sees it: policies to learn with, by policy id."""

    def get_policy(self, policy_id: str = DEFAULT_POLICY_ID) -> Learner:
        """The policy ``policy_id``."""
        ...


class LocalWorkerLike(PolicyHolder, Protocol):
    """The driver's rollout worker as operators see it: its policies, their weights and gradients,
    and its episode metrics."""

    @property
    def policy_map(self) -> Mapping[str, LearningPolicy]:
        """The worker's policies by policy id."""
        ...

    def get_policy(self, policy_id: str = DEFAULT_POLICY_ID) -> LearningPolicy:
        """The policy ``policy_id``."""
        ...

    def policy_class(self, policy_id: str = DEFAULT_POLICY_ID) -> type:
        """The class of policy ``policy_id`` (known before the policy is built)."""
        ...

    def get_weights(self, policies: list[str] | None = None) -> Mapping[str, Any]:
        """The weights of ``policies`` (default: all), by policy id."""
        ...

    def compute_gradients(
        self, batch: SampleBatch, policy_id: str = DEFAULT_POLICY_ID
    ) -> tuple[list[np.ndarray], dict[str, float]]:
        """Gradients of ``policy_id``'s loss on ``batch`` and their statistics."""
        ...

    def apply_gradients(self, gradients: list[np.ndarray], policy_id: str = DEFAULT_POLICY_ID) -> None:
        """Apply ``gradients`` to ``policy_id``."""
        ...

    def set_global_vars(self, global_vars: Mapping[str, Any]) -> None:
        """Pass run-wide variables (``timestep``: env steps sampled) to every policy."""
        ...

    def get_metrics(self) -> WorkerMetrics:
        """Episodes finished and faults absorbed since the last call."""
        ...


class WorkerSetLike(Protocol):
    """A set of rollout workers as learning and reporting operators see it: the local worker, the
    remote ones (Ray actor handles), weight broadcasts and metrics."""

    @property
    def num_worker_restarts(self) -> int:
        """Remote workers replaced after a failure, so far."""
        ...

    @property
    def num_workers_missing(self) -> int:
        """Replacements of failed remote workers not in service yet (waiting out a restart backoff or starting)."""
        ...

    @property
    def num_slow_workers(self) -> int:
        """Remote workers found slower than their siblings at the last metrics collection."""
        ...

    def local_worker(self) -> LocalWorkerLike:
        """The worker in the driver (it holds the learning policies)."""
        ...

    def remote_workers(self) -> list[Any]:
        """The remote workers' actor handles (none when the driver samples)."""
        ...

    def num_healthy_workers(self) -> int:
        """Remote workers alive."""
        ...

    def trainable_policies(self) -> list[str]:
        """The ids of the policies that learn."""
        ...

    def sync_weights(self, policies: list[str] | None = None, global_vars: Mapping[str, Any] | None = None) -> None:
        """Send the local worker's weights (of ``policies``, default all) to every remote worker."""
        ...

    def remember_global_vars(self, global_vars: Mapping[str, Any]) -> None:
        """Keep the global vars last sent, for a worker that replaces a failed one."""
        ...

    def foreach_worker(self, fn: Callable[[LocalWorkerLike], R], local: bool = True) -> list[R]:
        """``fn`` applied to every worker (the local one first, unless ``local`` is false)."""
        ...

    def collect_metrics(self) -> list[tuple[int, WorkerMetrics]]:
        """Each reporting worker's index and metrics since its last report."""
        ...
