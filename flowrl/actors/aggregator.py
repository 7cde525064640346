"""Aggregator actors for tree aggregation: each gathers experience from its own group of rollout workers.

With many rollout workers, one driver process that receives every fragment, concatenates
train batches and sends weights back becomes the bottleneck. Aggregators take that work
off it: each runs a gather over a group of rollout workers *inside its own process* (a
parallel iterator consumed in another actor), applies the plan's batching there, and
hands the driver a few large train batches. Weights flow back down the same tree.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from flowrl.actors.placeholders import PlaceholderActor, placeholders_active
from flowrl.actors.placement import AGGREGATOR
from flowrl.actors.restart_budget import RestartBudget
from flowrl.deferred import ray
from flowrl.errors import FlowRLError, ShardFailedError
from flowrl.iterators import LocalIterator, ParallelIteratorWorker, from_actors

if TYPE_CHECKING:
    from flowrl.actors.worker_set import WorkerSet

logger = logging.getLogger(__name__)

StreamFn = Callable[[LocalIterator[Any]], LocalIterator[Any]]


class Aggregated(NamedTuple):
    """An item an aggregator made (e.g. a train batch) and the env and agent steps its workers
    freshly sampled since the one before (replayed rows mixed in are not counted)."""

    item: Any
    env_steps: int
    agent_steps: int


class AggregatorWorker(ParallelIteratorWorker):
    """Gathers fragments from ``rollout_workers`` and serves what ``make_stream`` makes of them.

    ``make_stream`` receives the gathered fragments as a :class:`~flowrl.iterators.LocalIterator`
    (``num_async`` requests in flight per worker) and returns an iterator, e.g. with
    ``MixInReplay`` and ``ConcatBatches`` applied. The shard yields :class:`Aggregated`
    items: each item with the steps sampled since the one before. Weights set with
    :meth:`set_weights` are forwarded to each rollout worker of the group the next time
    it delivers a fragment, so its next sample uses them.

    A rollout worker of the group that dies, raises or gives nothing for ``shard_timeout_s``
    ends this actor's stream with a :class:`~flowrl.errors.ShardFailedError` whose
    ``shard_index`` is the worker's position in the group: the driver's
    :class:`AggregatorSet` then replaces the worker and this aggregator.
    """

    def __init__(
        self,
        rollout_workers: Sequence[Any],
        make_stream: StreamFn,
        num_async: int = 2,
        shard_timeout_s: float | None = None,
    ) -> None:
        if not rollout_workers:
            raise FlowRLError("AggregatorWorker needs at least one rollout worker")
        self.rollout_workers = list(rollout_workers)
        self.make_stream = make_stream
        self.num_async = num_async
        self.shard_timeout_s = shard_timeout_s
        self.weights: Any = None
        self.global_vars: Mapping[str, Any] | None = None
        self.weights_version = 0
        self.version_sent: dict[Any, int] = {}
        self.env_steps = self.agent_steps = 0
        super().__init__(self._stream)

    def _stream(self) -> Iterator[Aggregated]:
        fragments = (
            from_actors(
                self.rollout_workers,
                name="rollout_workers",
                on_shard_failure=_report,
                shard_timeout_s=self.shard_timeout_s,
            )
            .gather_async(num_async=self.num_async)
            .zip_with_source_actor()
            .for_each(self._forward_weights)
        )
        for item in self.make_stream(fragments):
            # The steps freshly sampled since the last item: replayed rows must not count as sampled.
            yield Aggregated(item, self.env_steps, self.agent_steps)
            self.env_steps = self.agent_steps = 0

    def _forward_weights(self, item: tuple[Any, Any]) -> Any:
        worker, fragment = item
        self.env_steps += fragment.env_steps()
        self.agent_steps += fragment.agent_steps()
        if self.weights is not None and self.version_sent.get(worker, 0) < self.weights_version:
            worker.set_weights.remote(self.weights, self.global_vars)
            self.version_sent[worker] = self.weights_version
        return fragment

    def set_weights(self, weights: Mapping[str, Any], global_vars: Mapping[str, Any] | None = None) -> None:
        """New weights for the group: stored once in the object store, forwarded worker by worker."""
        self.weights = ray.put(dict(weights))
        self.global_vars = global_vars
        self.weights_version += 1

    def ping(self) -> str:
        """Answer a health check."""
        return "pong"


def _report(shard_index: int, failed: Any, error: ShardFailedError) -> Any:
    """An aggregator cannot replace a rollout worker (the driver owns them): end the stream, naming it."""
    raise error


def _worker_failure(error: ShardFailedError) -> ShardFailedError | None:
    """The rollout worker's failure an aggregator reported, inside the failure of the aggregator's stream."""
    cause = error.__cause__
    if isinstance(cause, ray.exceptions.RayTaskError):
        cause = cause.cause
    return cause if isinstance(cause, ShardFailedError) else None


@dataclass(eq=False)
class _Pending:
    """An aggregator being recreated: due (monotonic seconds) once its restart backoff is over; waits for
    the replacements of its group's rollout workers until ``wait_until``; then made (``actor``), and in
    service once it answered (``ready``)."""

    index: int
    due: float
    wait_until: float
    actor: Any = None
    ready: Any = None


class AggregatorSet(Sequence[Any]):
    """The aggregator actors of a plan, each over its group of rollout workers (dealt round robin).

    A sequence of the actor handles in service. :meth:`replace` is the failure hook of a gather
    over them, and the set is that gather's :class:`~flowrl.iterators.shards.ShardSupervisor`
    (:meth:`started`): when an aggregator's stream ends because one of its rollout workers failed,
    that worker is handed to the :class:`~flowrl.actors.WorkerSet` (which restarts or drops it)
    and the aggregator is recreated over its group's workers in service; an aggregator that died
    itself is recreated too. Either way ``num_restarts`` counts it. Nothing waits for a recreated
    aggregator: the gather leaves it out until it has started, and it is made only once its
    group's replacement workers are in service (or have had ``worker_startup_timeout_s``; then it
    goes on without them). Aggregators have a restart budget of their own (``restart_budget``)
    with the worker set's cap and window: past it, :meth:`replace` raises
    :class:`~flowrl.errors.WorkerFailureError`; an aggregator whose replacements keep failing to
    start is made after a growing delay.
    """

    def __init__(
        self, workers: WorkerSet, num_aggregators: int, make_stream: StreamFn, num_cpus: float = 0.5, num_async: int = 2
    ) -> None:
        indices = workers.remote_worker_indices()
        if not 1 <= num_aggregators <= len(indices):
            raise FlowRLError(
                f"num_aggregation_workers={num_aggregators} must be between 1 and the number of rollout workers "
                f"({len(indices)}): each aggregator gathers from at least one worker"
            )
        self.workers = workers
        self.make_stream = make_stream
        self.num_async = num_async
        self.num_restarts = 0
        budget = workers.restart_budget
        self.restart_budget = RestartBudget("aggregator", budget.max_restarts, budget.window_s)
        self._remote_cls = ray.remote(num_cpus=num_cpus, max_restarts=0)(AggregatorWorker)
        self._groups = [indices[i::num_aggregators] for i in range(num_aggregators)]
        # Per aggregator, the worker handles it gathers from, in its shard order.
        self._members: list[list[Any]] = [[] for _ in self._groups]
        self._actors = [self._create(i) for i in range(num_aggregators)]
        # A failed aggregator -> what replaced it: a _Pending until made and started, then the actor (None: gone).
        self._replacements: dict[Any, Any] = {}
        self._pending: dict[int, _Pending] = {}

    def _create(self, index: int) -> Any:
        # Of its group, the workers in service now (a worker still being replaced rejoins the aggregator's next
        # incarnation: the group itself is kept).
        live = dict(zip(self.workers.remote_worker_indices(), self.workers.remote_workers()))
        self._members[index] = [live[i] for i in self._groups[index] if i in live]
        if not self._members[index]:
            return None
        if placeholders_active():
            return PlaceholderActor(AggregatorWorker.__name__)
        # In its bundle of the run's reservation (if aggregators have some), as its predecessors were.
        options = self.workers.reservation.options(AGGREGATOR, index)
        return self._remote_cls.options(**options).remote(
            self._members[index], self.make_stream, self.num_async, self.workers.sample_timeout_s
        )

    def _live(self) -> list[Any]:
        return [actor for actor in self._actors if actor is not None]

    def __getitem__(self, index: Any) -> Any:
        return self._live()[index]

    def __len__(self) -> int:
        return len(self._live())

    def replace(self, index: int, failed: Any, error: ShardFailedError) -> Any:
        """Hand a failed rollout worker to the worker set and recreate aggregator ``index`` (its position
        when the gather was built): returns what :meth:`started` follows to the new aggregator, or None if
        its group is gone. Never waits for the new aggregator or its workers."""
        if failed in self._replacements:
            return self._replacements[failed]
        worker_failure = _worker_failure(error)
        if worker_failure is not None:
            # The handle the aggregator gathered from: if the worker set already replaced it
            # (another caller saw the death first), this returns that replacement untouched.
            self.workers.handle_failure(self._members[index][worker_failure.shard_index], worker_failure)
        elif error.reason == "raised":
            raise error  # the aggregator's own code failed: not a fault a restart fixes
        ray.kill(failed, no_restart=True)
        self._actors[index] = None  # out of the sequence until its replacement is in service
        kept = {*self.workers.remote_worker_indices(), *self.workers.missing_worker_indices()}
        group = [i for i in self._groups[index] if i in kept]
        if not group:
            logger.warning("aggregator %d failed (%s); its rollout workers are gone", index, error)
            self._replacements[failed] = None
            self.num_restarts += 1
            return None
        what = f"aggregator {index} (of rollout workers {group}) failed"
        self.restart_budget.spend(what, error, worker_indices=group)
        delay = self.restart_budget.backoff(index, error)
        logger.warning("%s (%s); recreating it%s", what, error, f" in {delay:g} s" if delay else "")
        now = time.monotonic()
        pending = _Pending(index, now + delay, now + self.workers.worker_startup_timeout_s)
        self._pending[index] = pending
        self._replacements[failed] = pending
        self.num_restarts += 1
        return pending

    def started(self, actor: Any) -> Any | None:
        """:class:`~flowrl.iterators.shards.ShardSupervisor`: the aggregator serving in ``actor``'s place once it
        has started (its answer to a ping arrived: an error too, which its gather then reports), None while it
        is due, waits for its group's workers or starts (never blocks)."""
        self._refresh()
        while actor in self._replacements:
            actor = self._replacements[actor]
        return None if isinstance(actor, _Pending) else actor

    def check(self, actor: Any, since: float) -> float | None:
        """:class:`~flowrl.iterators.shards.ShardSupervisor`: never asked, as the aggregators' gather gives items
        no timeout (each aggregator bounds its own workers' requests); a late request would count as hung."""
        return None

    def _refresh(self) -> None:
        """Make the recreated aggregators that are due and whose group's replacement workers are in service (or
        have waited long enough); put those that have answered into service. Waits for nothing."""
        now = time.monotonic()
        missing = set(self.workers.missing_worker_indices()) if self._pending else set()
        for index, pending in list(self._pending.items()):
            if pending.actor is None:
                waiting = any(i in missing for i in self._groups[index])
                if now < pending.due or (waiting and now < pending.wait_until):
                    continue
                pending.actor = self._create(index)
                if pending.actor is None:
                    continue  # none of its workers is in service yet: made once one is
                pending.ready = pending.actor.ping.remote()
            if ray.wait([pending.ready], timeout=0)[0]:
                del self._pending[index]
                self._actors[index] = pending.actor
                self._replacements[pending] = pending.actor

    def stop(self) -> None:
        """Kill every aggregator actor (those being recreated too)."""
        for actor in [*self._live(), *(p.actor for p in self._pending.values() if p.actor is not None)]:
            ray.kill(actor, no_restart=True)
        self._actors = []
        self._pending = {}
