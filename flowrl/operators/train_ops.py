"""Operators that learn: SGD steps on the local worker, gradients, weight broadcast, target networks."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any, ClassVar, ContextManager, NamedTuple, Protocol, cast, runtime_checkable

import numpy as np

from flowrl.actors import Learned, LearnerInfo, PlanResources, Priorities
from flowrl.actors.learner_group import LEARNER_ACTOR
from flowrl.actors.learner_thread import GroupLearner, learn_on_local_worker
from flowrl.actors.protocols import WorkerSetLike
from flowrl.data import (
    DEFAULT_POLICY_ID,
    MultiAgentBatch,
    SampleBatch,
    as_policy_batches,
)
from flowrl.errors import FlowRLError
from flowrl.iterators import LocalIterator
from flowrl.operators.metric_ops import record_learner_info
from flowrl.operators.names import (
    AGENT_STEPS_TRAINED_COUNTER,
    APPLY_GRADS_TIMER,
    COMPUTE_GRADS_TIMER,
    LAST_TARGET_UPDATE_TS,
    LEARN_ON_BATCH_TIMER,
    LEARNER_INFO,
    NUM_TARGET_UPDATES,
    STEPS_SAMPLED_COUNTER,
    STEPS_TRAINED_COUNTER,
)
from flowrl.operators.protocol import ActorFlow, ActorLink, Operator, PlanLink
from flowrl.operators.weight_sync import broadcast_weights, send_weights, timestep_to_learner

Batch = SampleBatch | MultiAgentBatch
Gradients = list[np.ndarray]
LearnerStats = dict[str, dict[str, float]]

#: The ``policy.coeffs`` entry holding the weight of a KL penalty (PPO, APPO).
KL_COEFF = "kl_coeff"


class Trained(NamedTuple):
    """What :class:`TrainOneStep` yields, RLlib Flow's ``batch, info``: the batch it learned on and
    a :class:`~flowrl.actors.LearnerInfo`, each policy's learner stats with, in ``info.priorities``,
    the new priorities of replayed rows (empty unless the batch was replayed)."""

    batch: Batch
    info: LearnerInfo

    @property
    def priorities(self) -> Priorities:
        """``info.priorities`` (none when ``info`` is a plain mapping of stats)."""
        return self.info.priorities if isinstance(self.info, LearnerInfo) else {}


class ComputedGradients(NamedTuple):
    """Gradients of one policy's loss and the env steps they were computed on."""

    gradients: Gradients
    steps: int


class SGDConfig(Protocol):
    """The keys :class:`TrainOneStep` reads from a config given as its ``num_sgd_iter`` (PPO's)."""

    num_sgd_iter: int
    sgd_minibatch_size: int
    seed: int | None


class TargetNetworkConfig(Protocol):
    """The keys :class:`UpdateTargetNetwork` reads from a config given as its ``target_update_freq``
    (DQN's family, APPO's)."""

    #: The metrics counter that ``target_network_update_freq`` counts in (e.g. steps sampled).
    target_update_counter: ClassVar[str]

    @property
    def target_network_update_freq(self) -> int:
        """Units of ``target_update_counter`` between target updates (0: after every item)."""

    @property
    def tau(self) -> float:
        """How far each update moves a target: 1 copies the network, less blends it in."""


@runtime_checkable
class TargetNetworkPolicy(Protocol):
    """A policy with a target network (what :class:`UpdateTargetNetwork` moves)."""

    def update_target(self, tau: float = 1.0) -> None: ...


@runtime_checkable
class CoefficientPolicy(Protocol):
    """A policy whose adaptive loss coefficients live in ``coeffs`` (what :class:`UpdateKL` adapts)."""

    coeffs: dict[str, float]
    config: Any


def learner_group_links(learners: GroupLearner | None, driven_by: str | None = None) -> list[PlanLink]:
    """How ``learners`` shows in the plan graph (nothing without a group): the operator that learns through
    it, or the actor ``driven_by`` (a learner thread), sends it batches; its actors all-reduce gradients."""
    if learners is None:
        return []
    label = "learn on batch shards"
    to_group = ActorLink(LEARNER_ACTOR, label) if driven_by is None else ActorFlow(driven_by, LEARNER_ACTOR, label)
    return [to_group, ActorFlow(LEARNER_ACTOR, LEARNER_ACTOR, "all-reduce gradients")]


def learner_group_counts(learners: GroupLearner | None) -> dict[str, int]:
    """The learner group's actors, for an operator's :meth:`~flowrl.operators.Operator.plan_actor_counts`."""
    return {} if learners is None else {LEARNER_ACTOR: learners.size}


def _needs(operator: str, kind: str, policy_id: str, policy: Any) -> FlowRLError:
    policy_class = policy if isinstance(policy, type) else type(policy)
    return FlowRLError(f"{operator} needs {kind}; policy {policy_id!r} is a {policy_class.__name__}")


class TrainOneStep(Operator):
    """Learn on a batch with the local worker's policies (only ``policies``, default all
    trainable), then broadcast the new weights.

    Consumes a batch and yields :class:`Trained`. With ``num_sgd_iter`` > 1 or
    ``sgd_minibatch_size`` > 0 it runs that many epochs of shuffled minibatches. Given the
    algorithm's config as ``num_sgd_iter`` (an :class:`SGDConfig`), it takes both settings
    from there, and its ``seed`` shuffles reproducibly. Counts ``num_steps_trained`` and keeps
    the per-policy learner stats in ``info["learner"]``. When ``resources`` (the plan's
    :class:`~flowrl.actors.PlanResources`) hold a learner group, the group learns,
    data-parallel, and the local policies take rank 0's weights before the broadcast.
    """

    def __init__(
        self,
        workers: WorkerSetLike,
        policies: Sequence[str] | None = None,
        num_sgd_iter: int | SGDConfig = 1,
        sgd_minibatch_size: int = 0,
        *,
        resources: PlanResources | None = None,
    ) -> None:
        self.seed: int | None = None
        if not isinstance(num_sgd_iter, int):
            if sgd_minibatch_size:
                raise FlowRLError(
                    "TrainOneStep: a config given as num_sgd_iter sets sgd_minibatch_size too; drop the argument"
                )
            config = num_sgd_iter
            num_sgd_iter, sgd_minibatch_size, self.seed = config.num_sgd_iter, config.sgd_minibatch_size, config.seed
        if num_sgd_iter < 1:
            raise FlowRLError(f"TrainOneStep(num_sgd_iter={num_sgd_iter}): must be >= 1")
        self.workers = workers
        self.policies = list(policies) if policies is not None else workers.trainable_policies()
        self.num_sgd_iter = num_sgd_iter
        self.sgd_minibatch_size = sgd_minibatch_size
        self.learners = resources.learners if resources is not None else None

    def plan_links(self) -> list[PlanLink]:
        """Broadcasts to the rollout workers, naming the policies unless it is only the default one; the
        learner group."""
        label = (
            "broadcast weights"
            if self.policies == [DEFAULT_POLICY_ID]
            else f"broadcast weights of {', '.join(self.policies)}"
        )
        return [*learner_group_links(self.learners), ActorLink("RolloutWorker", label)]

    def plan_actor_counts(self) -> dict[str, int]:
        """The learner group's actors."""
        return learner_group_counts(self.learners)

    def __call__(self, batch: Batch) -> Trained:
        metrics = LocalIterator.get_metrics()
        local = self.workers.local_worker()
        # Shuffles seeded by (seed, steps trained): reproducible, also after a restore.
        seed = None if self.seed is None else [self.seed, metrics.counters[STEPS_TRAINED_COUNTER]]
        timestep_to_learner(self.workers)
        with metrics.timers[LEARN_ON_BATCH_TIMER] as timer:
            settings: dict[str, Any] = {
                "policies": self.policies,
                "num_sgd_iter": self.num_sgd_iter,
                "sgd_minibatch_size": self.sgd_minibatch_size,
                "seed": seed,
            }
            if self.learners is not None:
                learned = self.learners.learn(batch, **settings)
            else:
                learned = learn_on_local_worker(local, batch, **settings)
            timer.push_units_processed(batch.env_steps())
        metrics.counters[STEPS_TRAINED_COUNTER] += batch.env_steps()
        metrics.counters[AGENT_STEPS_TRAINED_COUNTER] += batch.agent_steps()
        record_learner_info(learned.info)
        broadcast_weights(self.workers, self.policies)
        return Trained(batch, LearnerInfo(learned.info, learned.priorities))


class ComputeGradients:
    """Gradients of the local worker's policy on a batch: yields :class:`ComputedGradients`."""

    def __init__(self, workers: WorkerSetLike, policy_id: str = DEFAULT_POLICY_ID) -> None:
        self.workers = workers
        self.policy_id = policy_id

    def __call__(self, batch: Batch) -> ComputedGradients:
        metrics = LocalIterator.get_metrics()
        timestep_to_learner(self.workers)
        with metrics.timers[COMPUTE_GRADS_TIMER]:
            grads, info = self.workers.local_worker().compute_gradients(
                as_policy_batches(batch)[self.policy_id], self.policy_id
            )
        record_learner_info({self.policy_id: info})
        return ComputedGradients(grads, batch.env_steps())


class AverageGradients:
    """Average a list of :class:`ComputedGradients` (e.g. from ``.batch(n)``) into one, weighted by count."""

    def __call__(self, items: list[ComputedGradients]) -> ComputedGradients:
        if not items:
            raise FlowRLError("AverageGradients got an empty list")
        total = sum(item.steps for item in items)
        averaged = [
            np.sum([item.gradients[i] * (item.steps / total) for item in items], axis=0)
            for i in range(len(items[0].gradients))
        ]
        return ComputedGradients(averaged, total)


class ApplyGradients(Operator):
    """Apply :class:`ComputedGradients` to the local worker's policy and send out the new weights.

    ``update_all=True`` broadcasts to every remote worker; ``False`` sends the weights
    only to the worker that produced the gradients (the metrics context's
    ``current_actor``, set by :func:`AsyncGradients`), as A3C does. Yields the learner info.
    """

    def __init__(self, workers: WorkerSetLike, policy_id: str = DEFAULT_POLICY_ID, update_all: bool = True) -> None:
        self.workers = workers
        self.policy_id = policy_id
        self.update_all = update_all

    def plan_links(self) -> list[ActorLink]:
        """Sends weights to every rollout worker, or to the source worker."""
        target = "all" if self.update_all else "the source worker"
        return [ActorLink("RolloutWorker", f"send weights to {target}")]

    def __call__(self, item: ComputedGradients) -> LearnerStats:
        metrics = LocalIterator.get_metrics()
        local = self.workers.local_worker()
        timestep_to_learner(self.workers)
        with metrics.timers[APPLY_GRADS_TIMER]:
            local.apply_gradients(item.gradients, self.policy_id)
        metrics.counters[STEPS_TRAINED_COUNTER] += item.steps
        metrics.counters[AGENT_STEPS_TRAINED_COUNTER] += item.steps
        if self.update_all:
            broadcast_weights(self.workers, [self.policy_id])
        else:
            actor = metrics.current_actor
            if actor is None:
                raise FlowRLError(
                    "ApplyGradients(update_all=False) needs the source actor; use it right after AsyncGradients"
                )
            send_weights(self.workers, actor, local.get_weights([self.policy_id]))
        info: LearnerStats = metrics.info.get(LEARNER_INFO, {})
        return info


class UpdateTargetNetwork(Operator):
    """Every ``target_update_freq`` steps, move each policy's target network to its network
    (only ``policies``, default all trainable).

    Pass-through. Counts steps sampled, or steps trained with ``by_steps_trained``; a
    frequency of 0 updates on every item. Given the algorithm's config as
    ``target_update_freq`` (a :class:`TargetNetworkConfig`), it takes the frequency, the
    counter it is in (e.g. ``NUM_LEARNER_UPDATES``: train batches learned) and ``tau`` from
    there, ``tau`` from the first policy's config at each update (so that a live change, e.g. SAC's,
    applies from the next one); ``tau`` < 1 blends instead of copying (soft updates). The policies must have an
    ``update_target(tau)`` method. From ``resources`` (the plan's
    :class:`~flowrl.actors.PlanResources`): the lock of their learner thread is held while the
    targets move, so a learner training in another thread never reads a half-copied target,
    and the replicas of their learner group move their targets the same way.
    """

    def __init__(
        self,
        workers: WorkerSetLike,
        target_update_freq: int | TargetNetworkConfig,
        by_steps_trained: bool = False,
        *,
        policies: Sequence[str] | None = None,
        resources: PlanResources | None = None,
    ) -> None:
        self.workers = workers
        self.tau = 1.0
        self.live_tau = not isinstance(target_update_freq, int)
        self.counter = STEPS_TRAINED_COUNTER if by_steps_trained else STEPS_SAMPLED_COUNTER
        if not isinstance(target_update_freq, int):
            if by_steps_trained:
                raise FlowRLError(
                    "UpdateTargetNetwork: a config given as target_update_freq names the counter; drop by_steps_trained"
                )
            config = target_update_freq
            target_update_freq, self.tau, self.counter = (
                config.target_network_update_freq,
                config.tau,
                config.target_update_counter,
            )
        self.target_update_freq = target_update_freq
        learner = resources.learner if resources is not None else None
        self.lock: ContextManager[Any] = learner.lock if learner is not None else contextlib.nullcontext()
        self.learners = resources.learners if resources is not None else None
        self.policies = list(policies) if policies is not None else workers.trainable_policies()
        # Checked by class when the plan is built (a plan declared over placeholders builds no policy);
        # the policies themselves are taken on the first update: the local worker keeps them for good.
        for pid in self.policies:
            policy_class = workers.local_worker().policy_class(pid)
            if not issubclass(policy_class, TargetNetworkPolicy):
                raise _needs("UpdateTargetNetwork", "policies with a target network", pid, policy_class)
        self._targets: list[TargetNetworkPolicy] | None = None

    def plan_links(self) -> list[PlanLink]:
        """The learner group's replicas, whose targets move too."""
        return [] if self.learners is None else [ActorLink(LEARNER_ACTOR, "update target networks")]

    def __call__(self, item: Any) -> Any:
        metrics = LocalIterator.get_metrics()
        now = metrics.counters[self.counter]
        if now - metrics.counters[LAST_TARGET_UPDATE_TS] >= self.target_update_freq:
            if self._targets is None:
                local = self.workers.local_worker()
                self._targets = [cast(TargetNetworkPolicy, local.get_policy(pid)) for pid in self.policies]
            if self.live_tau and self._targets:
                self.tau = getattr(getattr(self._targets[0], "config", None), "tau", self.tau)
            with self.lock:
                for policy in self._targets:
                    policy.update_target(self.tau)
                if self.learners is not None:
                    self.learners.update_target(self.policies, self.tau)
            metrics.counters[NUM_TARGET_UPDATES] += 1
            metrics.counters[LAST_TARGET_UPDATE_TS] = now
        return item


class UpdateKL:
    """After each training step, adapt every policy's KL coefficient to its measured KL (pass-through).

    Reads the learner info of a :class:`Trained` (TrainOneStep's) or a
    :class:`~flowrl.actors.Learned` (a learner thread's) item. The coefficient,
    ``policy.coeffs[KL_COEFF]``, grows by half when the KL exceeds twice the policy's
    ``config.kl_target`` and halves when the KL is below half of it; a coefficient of 0
    stays off.
    """

    def __init__(self, workers: WorkerSetLike) -> None:
        self.workers = workers

    def __call__(self, item: Trained | Learned) -> Trained | Learned:
        for pid, stats in item.info.items():
            policy = self.workers.local_worker().get_policy(pid)
            if not isinstance(policy, CoefficientPolicy):
                raise _needs("UpdateKL", "policies with loss coefficients (coeffs)", pid, policy)
            kl, target = stats.get("kl"), float(policy.config.kl_target)
            if kl is None or policy.coeffs[KL_COEFF] == 0:
                continue
            if kl > 2.0 * target:
                policy.coeffs[KL_COEFF] *= 1.5
            elif kl < 0.5 * target:
                policy.coeffs[KL_COEFF] *= 0.5
        return item
