"""A local rollout worker plus N remote ones, with weight sync and bounded worker recovery."""

from __future__ import annotations

import functools
import logging
import os
import signal
import sys
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence, TypeVar, cast

import gymnasium as gym

from flowrl._version import __version__
from flowrl.actors.liveness import STOPPED_GRACE_S, Answer, LivenessMonitor, SlowWorkers, process_state
from flowrl.actors.placeholders import PlaceholderActor, PlaceholderLocalWorker, placeholders_active
from flowrl.actors.placement import (
    WORKER,
    BundleRequest,
    Reservation,
    asks_for_actors,
    check_resources,
    driver_request,
    worker_request,
)
from flowrl.actors.restart_budget import RestartBudget
from flowrl.actors.rollout_worker import (
    CONTROL_GROUP,
    ProcessInfo,
    RolloutWorker,
    WorkerMetrics,
    as_config,
    control_call,
)
from flowrl.actors.target_sync import TargetSync
from flowrl.config import TrainerConfig
from flowrl.deferred import ray, torch
from flowrl.envs import check_env as check_env_api
from flowrl.envs import check_multi_agent_env, is_multi_agent_env
from flowrl.envs.context import EnvContext
from flowrl.envs.registry import EnvCreator, close_env
from flowrl.errors import (
    BadObservationError,
    CallbackError,
    FlowRLError,
    ResourceUnavailableError,
    RunWarning,
    ShardFailedError,
    WorkerFailureError,
)
from flowrl.policy.worker_priorities import target_weights

R = TypeVar("R")

logger = logging.getLogger(__name__)

#: Longest wait for a health probe (answered by a worker's control thread, even mid-sample).
PROBE_TIMEOUT_S = 10.0
#: Longest wait for a ``foreach_worker`` call when the config sets no ``sample_timeout_s``.
CALL_TIMEOUT_S = 600.0
#: Longest wait for the remote workers to close their envs when the set stops.
STOP_TIMEOUT_S = 5.0


@dataclass
class _Starting:
    """A replacement worker not yet in service: its actor, the ref of its first answer, and since when."""

    actor: Any
    ready: Any
    since: float
    warned: bool = False


class _Deferred:
    """Stands in for a replacement not made yet, which waits out its restart backoff (the one before it
    failed to start): gathers park its shard on it, and :meth:`WorkerSet.started` follows it to the actor
    made once ``due`` (monotonic seconds) has come."""

    def __init__(self, worker_index: int, incarnation: int, due: float) -> None:
        self.worker_index = worker_index
        self.incarnation = incarnation
        self.due = due

    def __repr__(self) -> str:
        return f"<replacement of rollout worker {self.worker_index}, due in {self.due - time.monotonic():.1f} s>"


class WorkerSet:
    """The local worker (in this process) and ``num_workers`` remote rollout actors.

    Unless ``check_env=False``, one env is made and checked with
    :func:`flowrl.envs.check_env` first, and the workers' resources are checked against
    the cluster's (an impossible request is a :class:`~flowrl.errors.ConfigError`). The
    driver's, the remote workers' and the plan's other actors' resources (``bundles``: the
    replay shards and aggregators its algorithm declares) are reserved together as one
    :class:`~flowrl.actors.placement.Reservation` (``reservation``), laid out by
    ``config.placement_strategy``; the reservation and the workers must be ready within
    ``config.worker_startup_timeout_s``. A replacement takes its predecessor's bundle, which
    Ray moves to another node when the one holding it is lost. A set with no remote worker,
    in a plan with no other actor, reserves nothing and never calls Ray. Inside
    :func:`~flowrl.actors.placeholders.placeholder_actors` the remote workers are
    placeholders (a plan built for its graph) and nothing is reserved or started.

    A remote worker that dies, raises or hangs (reported by :meth:`foreach_worker` and by
    gathers built with :meth:`on_shard_failure` as their hook) is killed and, with
    ``recreate_failed_workers``, replaced by a new actor at the same index (same
    exploration slot), loaded with the local worker's weights and the latest global vars,
    and counted in ``num_worker_restarts``; without, dropped. Restarts are capped by
    ``config.max_worker_restarts`` within any ``config.restart_window_s`` seconds (``restart_budget``)
    and back off while a worker's replacements fail to start; past the cap, or with no worker
    left, a :class:`~flowrl.errors.WorkerFailureError` names the worker and carries the remote
    traceback. A replacement waiting out that backoff is not waited for either: it is made when its
    delay is over (by :meth:`started` and every other call that looks at the workers in service),
    and counts in ``num_workers_missing`` meanwhile. An exception that ``foreach_worker``'s function
    raises is the caller's, not a worker fault: it is raised as it is and restarts nothing.

    Liveness, not deadlines: a gather's request past ``sample_timeout_s`` fails its worker only
    once :class:`~flowrl.actors.liveness.LivenessMonitor` finds it hung (no env step for that long,
    a stopped process, or a control thread silent for ``worker_unresponsive_timeout_s``); slow
    workers are counted in ``num_slow_workers``. A replacement is never waited for: it joins
    :meth:`remote_workers` (with the current weights, global vars and filter) once it has started,
    which a node lost without spare capacity may put off for long; meanwhile the run goes on with
    the others (``num_workers_missing``), unless fewer than ``min_healthy_workers`` are left once a
    replacement has waited ``worker_startup_timeout_s``. The set is the gathers'
    :class:`~flowrl.iterators.shards.ShardSupervisor` (:meth:`check`, :meth:`started`).
    """

    def __init__(
        self,
        *,
        env_creator: EnvCreator,
        policy_specs: Mapping[str, Any],
        config: TrainerConfig | Mapping[str, Any],
        num_workers: int,
        num_cpus_per_worker: float = 1.0,
        recreate_failed_workers: bool = True,
        check_env: bool = True,
        bundles: Sequence[BundleRequest] = (),
    ) -> None:
        config = as_config(config)
        if check_env:
            # Reject a broken env here, with a message naming the fault, before any actor starts.
            env = env_creator(EnvContext(config.env_config, num_workers=num_workers))
            try:
                if is_multi_agent_env(env):
                    check_multi_agent_env(env)
                else:
                    check_env_api(cast(gym.Env, env))
            finally:
                close_env(env)
        # Only a plan that starts actors reserves resources (and so needs Ray); one over placeholder
        # actors (built for its graph) starts none.
        self._placeholders = placeholders_active()
        requests: list[BundleRequest] = []
        if asks_for_actors(num_workers, bundles) and not self._placeholders:
            requests = [driver_request(config), worker_request(config, num_workers, num_cpus_per_worker), *bundles]
        check_resources(requests, config.placement_strategy)
        self._env_creator = env_creator
        self._policy_specs = dict(policy_specs)
        self._config = config
        self._num_workers = num_workers
        self._remote_options = {
            "num_cpus": num_cpus_per_worker,
            "num_gpus": config.num_gpus_per_worker,
            "resources": dict(config.custom_resources_per_worker),
            "max_restarts": 0,
            "concurrency_groups": {CONTROL_GROUP: 1},
        }
        self.recreate_failed_workers = recreate_failed_workers
        self.restart_budget = RestartBudget("rollout worker", config.max_worker_restarts, config.restart_window_s)
        self.sample_timeout_s = config.sample_timeout_s
        self.worker_startup_timeout_s = config.worker_startup_timeout_s
        self.sample_min_fraction = config.sample_min_fraction
        self.num_worker_restarts = 0
        self.num_workers_dropped = 0
        self.min_healthy_workers = min(config.min_healthy_workers, num_workers)
        self.liveness = LivenessMonitor(
            config.sample_timeout_s or CALL_TIMEOUT_S,
            config.worker_unresponsive_timeout_s,
            ask=lambda worker: control_call(worker, "progress"),
            answer=_poll,
            stopped=self._stopped,
        )
        self.slow_workers = SlowWorkers(config.slow_worker_factor)
        self._info: dict[int, ProcessInfo] = {}
        self._remote: list[Any] = []
        self._indices: list[int] = []
        self._starting: dict[int, _Starting] = {}
        self._deferred: dict[int, _Deferred] = {}
        self._hung: dict[Any, str] = {}
        self._replacements: dict[Any, Any] = {}
        self._global_vars: Mapping[str, Any] | None = None
        self._target_sync = TargetSync()
        self.reservation = Reservation(requests, config.placement_strategy, config.worker_startup_timeout_s)
        try:
            self._local = self._make_local(env_creator, policy_specs, config, num_workers)
            self._remote = [self._make_remote(i + 1) for i in range(num_workers)]
            self._indices = list(range(1, num_workers + 1))
            if self._remote and not self._placeholders:
                self._wait_started(num_cpus_per_worker)
                self.sync_weights()
        except BaseException:
            self._kill_remote()
            raise

    def _make_local(
        self, env_creator: EnvCreator, policy_specs: Mapping[str, Any], config: TrainerConfig, num_workers: int
    ) -> RolloutWorker:
        if not self._placeholders:
            return RolloutWorker(
                env_creator=env_creator,
                policy_specs=policy_specs,
                config=config,
                worker_index=0,
                num_workers=num_workers,
            )
        env = env_creator(EnvContext(config.env_config, num_workers=num_workers))
        try:
            multi_agent = is_multi_agent_env(env)
        finally:
            close_env(env)
        # What the plan's build reads of the local worker, served without building its envs and policies.
        return cast(RolloutWorker, PlaceholderLocalWorker(policy_specs, config, multi_agent=multi_agent))

    @functools.cached_property
    def _remote_cls(self) -> Any:
        """:class:`RolloutWorker` as a Ray actor class with this set's resources (made when the first
        remote worker starts)."""
        # Ray's stubs do not list concurrency_groups, which ray.remote takes for actor classes.
        return cast(Any, ray.remote)(**self._remote_options)(RolloutWorker)

    def _make_remote(self, worker_index: int, incarnation: int = 0) -> Any:
        if self._placeholders:
            return PlaceholderActor(RolloutWorker.__name__)
        config = self._config
        if incarnation and config.seed is not None:
            # A replacement must not replay its predecessor's env seeds and exploration draws.
            config = config.replace(seed=config.seed + 7919 * incarnation)
        # Into its own bundle, wherever Ray placed (or re-placed) it.
        return self._remote_cls.options(**self.reservation.options(WORKER, worker_index - 1)).remote(
            env_creator=self._env_creator,
            policy_specs=self._policy_specs,
            config=config,
            worker_index=worker_index,
            num_workers=self._num_workers,
            recreated=incarnation > 0,
        )

    def _wait_started(self, num_cpus_per_worker: float) -> None:
        """Wait for every remote worker to answer a probe; fail clearly (killing them all) if one cannot."""
        probes = {control_call(worker, "process_info"): index for worker, index in zip(self._remote, self._indices)}
        timeout = self._config.worker_startup_timeout_s
        ready, pending = ray.wait(list(probes), num_returns=len(probes), timeout=timeout)
        try:
            for ref in ready:
                self._record(probes[ref], ray.get(ref))
        except ray.exceptions.RayActorError as e:
            self._kill_remote()
            raise WorkerFailureError(
                f"a rollout worker failed to start: {e}", worker_indices=[probes[r] for r in ready]
            ) from e
        if pending:
            self._kill_remote()
            wanted = ", ".join(
                f"{amount:g} {name}"
                for name, amount in worker_request(self._config, 1, num_cpus_per_worker).bundle().items()
            )
            raise ResourceUnavailableError(
                f"rollout workers {sorted(probes[r] for r in pending)} did not start within "
                f"worker_startup_timeout_s={timeout:g}: each needs {wanted or 'no resources'}, and Ray has "
                f"{ray.available_resources()} available now (other actors or runs may hold the rest)"
            )

    def local_worker(self) -> RolloutWorker:
        """The worker living in this process (the learner's copy of the policies)."""
        return self._local

    def remote_workers(self) -> list[Any]:
        """Handles of the remote workers in service, in worker-index order (replacements once started)."""
        self._refresh()
        return list(self._remote)

    def remote_worker_indices(self) -> list[int]:
        """The worker index (1-based, as in ``env_config.worker_index``) of each of :meth:`remote_workers`."""
        self._refresh()
        return list(self._indices)

    def num_healthy_workers(self) -> int:
        """Remote workers in service (started replacements included, dropped ones not)."""
        self._refresh()
        return len(self._remote)

    @property
    def num_slow_workers(self) -> int:
        """Workers slower than ``slow_worker_factor`` times their siblings' median at the last metrics collection."""
        return len(self.slow_workers.slow)

    @property
    def num_workers_missing(self) -> int:
        """Replacements not in service yet: waiting out their restart backoff, or not started yet (e.g. waiting
        for room after their node was lost)."""
        return len(self._starting) + len(self._deferred)

    def missing_worker_indices(self) -> list[int]:
        """The worker indices of the replacements that :attr:`num_workers_missing` counts, sorted."""
        self._refresh()
        return sorted([*self._starting, *self._deferred])

    def _record(self, index: int, info: ProcessInfo) -> None:
        """Remember where worker ``index`` runs, and warn if its node runs other flowrl or torch versions."""
        self._info[index] = info
        here = (__version__, str(torch.__version__))
        if (info.flowrl_version, info.torch_version) != here:
            message = (
                f"rollout worker {index} on node {info.node_id} runs flowrl {info.flowrl_version} and torch "
                f"{info.torch_version}, the driver flowrl {here[0]} and torch {here[1]}: install the same versions "
                "on every node"
            )
            logger.warning(message)
            warnings.warn(message, RunWarning, stacklevel=2)

    def _stopped(self, worker: Any) -> bool:
        """Whether ``worker``'s process is known to be stopped (state T): readable on the driver's node only."""
        index = self._index_of(worker)
        info = None if index is None else self._info.get(index)
        if info is None or info.node_id != self._driver_node:
            return False
        return process_state(info.pid) == "T"

    @functools.cached_property
    def _driver_node(self) -> str:
        return str(ray.get_runtime_context().get_node_id())

    def _index_of(self, worker: Any) -> int | None:
        if worker in self._remote:
            return self._indices[self._remote.index(worker)]
        return next((index for index, s in self._starting.items() if s.actor is worker), None)

    def _latest(self, actor: Any) -> Any:
        """What serves in ``actor``'s place now: itself, or its latest replacement (None: dropped)."""
        while actor in self._replacements:
            actor = self._replacements[actor]
        return actor

    def check(self, actor: Any, since: float) -> float | None:
        """:class:`~flowrl.iterators.shards.ShardSupervisor`: for a request to ``actor`` past ``sample_timeout_s``,
        seconds until its next check while it makes progress, or None once it is hung (never blocks)."""
        recheck = self.liveness.check(actor, since)
        if recheck is None:
            self._hung[actor] = self.liveness.reason
        return recheck

    def started(self, actor: Any) -> Any | None:
        """:class:`~flowrl.iterators.shards.ShardSupervisor`: the worker serving in ``actor``'s place once it has
        started, None while it is starting (never blocks; may raise :class:`~flowrl.errors.WorkerFailureError`
        when fewer than ``min_healthy_workers`` are in service)."""
        self._refresh()
        actor = self._latest(actor)
        return actor if actor is not None and actor in self._remote else None

    def _refresh(self) -> None:
        """Make the replacements whose backoff is over; put those that have started into service (without
        waiting for any); handle those that failed to start; warn about those past ``worker_startup_timeout_s``,
        and end the run if too few workers are left to go on with."""
        now = time.monotonic()
        for index, deferred in list(self._deferred.items()):
            if now >= deferred.due:
                del self._deferred[index]
                self._replacements[deferred] = self._start_replacement(index, deferred.incarnation)
        if not self._starting:
            return
        timeout = self._config.worker_startup_timeout_s
        refs = [starting.ready for starting in self._starting.values()]
        ready = set(ray.wait(refs, num_returns=len(refs), timeout=0)[0])  # one look at them all
        for index, starting in list(self._starting.items()):
            if self._starting.get(index) is not starting:
                continue  # replaced while an earlier one was handled
            if starting.ready in ready:
                try:
                    info = ray.get(starting.ready)
                except ray.exceptions.RayActorError as e:
                    self.handle_failure(starting.actor, e)
                    continue
                self._rejoin(index, starting.actor, info)
            elif not starting.warned and now - starting.since >= timeout:
                starting.warned = True
                message = (
                    f"the replacement of rollout worker {index} did not start within worker_startup_timeout_s="
                    f"{timeout:g} (Ray has {ray.available_resources()} available); the run goes on with "
                    f"{len(self._remote)} of {self._num_workers} workers, and it joins once Ray finds it room"
                )
                logger.warning(message)
                warnings.warn(message, RunWarning, stacklevel=2)
        waited = [i for i, s in self._starting.items() if s.warned]
        if waited and len(self._remote) < self.min_healthy_workers:
            raise WorkerFailureError(
                f"only {len(self._remote)} rollout workers are in service, fewer than min_healthy_workers="
                f"{self.min_healthy_workers}: the replacements of workers {sorted(waited)} did not start within "
                f"worker_startup_timeout_s={timeout:g}; Ray has {ray.available_resources()} available now",
                worker_indices=sorted(waited),
            )

    def _rejoin(self, index: int, actor: Any, info: ProcessInfo) -> None:
        """Put a started replacement into service, with the current weights, global vars and filter."""
        del self._starting[index]
        self._record(index, info)
        self._send_state(actor)
        position = sum(1 for i in self._indices if i < index)
        self._remote.insert(position, actor)
        self._indices.insert(position, index)
        logger.info("rollout worker %d is back in service (%d of %d)", index, len(self._remote), self._num_workers)

    def _send_state(self, actor: Any) -> None:
        """Queue the local worker's weights, the last global vars and the filter's statistics to ``actor``."""
        with self._local.lock:  # not halfway through a learner thread's step
            weights = self._local.get_weights()
            targets = target_weights(self._local.policy_map)  # for worker-side priorities
        actor.set_weights.remote(weights, self._global_vars, *([targets] if targets else []))
        if self._local.obs_filter is not None:  # it filters with the run's statistics from its first sample on
            actor.sync_filter.remote(self._local.obs_filter.stats())

    def _await_control(self, worker: Any, ref: Any, deadline: float) -> Any:
        """A control call's answer: a worker whose control thread waits for the GIL gets until ``deadline``;
        one whose process is stopped fails as soon as that shows (GetTimeoutError)."""
        while True:
            left = deadline - time.monotonic()
            ready, _ = ray.wait([ref], timeout=max(0.0, min(STOPPED_GRACE_S, left)))
            if ready:
                return ray.get(ref)
            if left <= STOPPED_GRACE_S or self._stopped(worker):
                raise ray.exceptions.GetTimeoutError(f"rollout worker {self._index_of(worker)} did not answer")

    def _control_deadline(self) -> float:
        return time.monotonic() + self._config.worker_unresponsive_timeout_s

    @property
    def policy_specs(self) -> dict[str, Any]:
        """The specs the workers build their policies from, by policy id (evaluation workers and
        learner replicas are built from them too)."""
        return dict(self._policy_specs)

    def trainable_policies(self) -> list[str]:
        """Ids of the policies to train (``policies_to_train``, default all)."""
        return list(self._config.policies_to_train or self._policy_specs)

    def remember_global_vars(self, global_vars: Mapping[str, Any]) -> None:
        """Record the run-wide variables last sent to a worker: what a replacement starts with."""
        self._global_vars = dict(global_vars)

    def sync_weights(self, policies: list[str] | None = None, global_vars: Mapping[str, Any] | None = None) -> None:
        """Broadcast the local worker's weights (one ``ray.put``) and ``global_vars`` to every remote worker,
        with the target networks of policies that compute worker-side priorities when they changed since the
        last broadcast (a replacement worker gets them all when it rejoins).

        Actor calls from one caller run in order, so each worker's next sample uses them.
        """
        if global_vars is not None:
            self.remember_global_vars(global_vars)
            self._local.set_global_vars(global_vars)
        self._refresh()
        if not self._remote:
            return
        weights = ray.put(self._local.get_weights(policies))
        targets = self._target_sync.targets_for("broadcast", self._local.policy_map, policies)
        extra = [] if targets is None else [targets]  # only rollout workers of such policies take targets
        for worker in self._remote:
            worker.set_weights.remote(weights, self._global_vars, *extra)

    def sync_filters(self) -> None:
        """Merge the observation statistics each remote worker gathered since the last sync into the local
        worker's filter, and send the merged statistics back to every remote worker (RLlib's
        ``FilterManager.synchronize``). Nothing to do without an observation filter.

        Asked through the workers' control threads, with a timeout (``worker_unresponsive_timeout_s``;
        a stopped process fails at once); a worker that cannot answer is handled as failed (its
        statistics since the last sync are lost with it). Returns once every worker has the merged statistics.
        """
        local_filter = self._local.obs_filter
        if local_filter is None:
            return
        local_filter.pop_delta()  # the local worker's own observations are in its statistics already
        asked = [(worker, control_call(worker, "pop_filter_delta")) for worker in self._remote]
        deadline = self._control_deadline()
        for worker, ref in asked:
            try:
                local_filter.apply_delta(self._await_control(worker, ref, deadline))
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as e:
                self.handle_failure(worker, e)
        if self._remote:
            # Waited for: once train() returns, every worker filters with the merged statistics (and a
            # checkpoint or a state read right after sees them, not a sync still on its way).
            merged = ray.put(local_filter.stats())
            synced = [(worker, control_call(worker, "sync_filter", merged)) for worker in self._remote]
            deadline = self._control_deadline()
            for worker, ref in synced:
                try:
                    self._await_control(worker, ref, deadline)
                except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as e:
                    self.handle_failure(worker, e)

    def foreach_worker(self, fn: Callable[[RolloutWorker], R], local: bool = True) -> list[R]:
        """``fn(worker)`` on the local worker (if ``local``) and every remote one; results in order.

        An exception ``fn`` raises is the caller's error, not a worker fault: it is raised here
        as soon as it arrives (a remote one as Ray raises it, an instance of both ``RayTaskError``
        and the original type), with a note naming the worker index, and nothing is restarted.
        A remote worker that dies (or takes longer than ``sample_timeout_s``) is handled as in
        a gather, and ``fn`` runs on its replacement once that has started. Replacements still
        starting are waited for, each up to ``worker_startup_timeout_s`` from its start; one that has
        not started by then (e.g. no room after a lost node), or that waits out its restart backoff, is
        left out.
        """
        results = []
        if local:
            try:
                results.append(fn(self._local))
            except Exception as e:
                _name_worker(e, 0)
                raise
        timeout = self._config.sample_timeout_s or CALL_TIMEOUT_S
        for starting in [s for s in self._starting.values() if not s.warned]:
            self.wait_for_start(starting.actor)
        for index, worker, ref in [(i, w, w.apply.remote(fn)) for i, w in zip(self._indices, self._remote)]:
            while True:
                try:
                    results.append(ray.get(ref, timeout=timeout))
                    break
                except ray.exceptions.RayTaskError as e:  # the task ran and fn raised: its worker is fine
                    _name_worker(e, index)
                    raise
                except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as e:
                    worker = self.wait_for_start(self.handle_failure(worker, e))
                    if worker is None:
                        break
                    ref = worker.apply.remote(fn)
        return results

    def wait_for_start(self, replacement: Any) -> Any | None:
        """``replacement`` (or what replaced it in turn) once in service, within ``worker_startup_timeout_s``;
        None if dropped, waiting out its restart backoff, or not started by then."""
        starting = next((s for s in self._starting.values() if s.actor is replacement), None)
        deadline = (starting.since if starting else time.monotonic()) + self._config.worker_startup_timeout_s
        while replacement is not None:
            starting = next((s for s in self._starting.values() if s.actor is replacement), None)
            if starting is not None:
                ray.wait([starting.ready], timeout=max(0.0, deadline - time.monotonic()))
            started = self.started(replacement)
            if started is not None or starting is None or time.monotonic() >= deadline:
                return started
            replacement = self._latest(replacement)  # it failed to start: its own replacement, if any
        return None

    def get_remote_states(self) -> dict[int, dict[str, Any]]:
        """Each remote worker's state (:meth:`RolloutWorker.get_state` without weights) keyed by worker index.

        Asked in the workers' sampling thread, so each answers between two samples (an
        asynchronous plan's requests in flight are served first). A worker that fails, or
        has not answered once ``sample_timeout_s`` has passed since all were asked, is handled
        as failed (counted in ``num_worker_restarts``) and left out: its replacement starts
        afresh on restore. Once the restart cap was reached (the run is ending with that error,
        and this is its emergency checkpoint), a failed worker is only left out: nothing restarts.
        """
        deadline = time.monotonic() + (self._config.sample_timeout_s or CALL_TIMEOUT_S)
        asked = [
            (index, worker, worker.get_state.remote(weights=False))
            for index, worker in zip(self._indices, self._remote)
        ]
        states = {}
        for index, worker, ref in asked:
            try:
                states[index] = ray.get(ref, timeout=max(0.0, deadline - time.monotonic()))
            except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError, ray.exceptions.GetTimeoutError) as e:
                logger.warning(
                    "rollout worker %d gave no state for the checkpoint (%s); it will start afresh",
                    index,
                    _how_it_failed(e),
                )
                if not self.restart_budget.exhausted:
                    self.handle_failure(worker, e)
        return states

    def set_remote_states(self, states: Mapping[int, Mapping[str, Any]]) -> dict[int, list[int]]:
        """Restore :meth:`get_remote_states`'s output into the remote workers of the same index.

        Workers with no saved state (more workers than when the checkpoint was taken) keep
        their own; saved states of workers this set lacks are not used. Returns, per worker
        index, the envs that started a new episode because their state could not be restored.
        """
        deadline = time.monotonic() + (self._config.sample_timeout_s or CALL_TIMEOUT_S)
        asked = [
            (index, worker.set_state.remote(states[index]))
            for index, worker in zip(self._indices, self._remote)
            if index in states
        ]
        fresh = {}
        for index, ref in asked:
            try:
                fresh[index] = ray.get(ref, timeout=max(0.0, deadline - time.monotonic()))
            except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError, ray.exceptions.GetTimeoutError) as e:
                raise FlowRLError(
                    f"rollout worker {index} could not restore its checkpointed state: {_how_it_failed(e)}"
                ) from e
        return fresh

    def collect_metrics(self) -> list[tuple[int, WorkerMetrics]]:
        """(worker index, report) of each worker in service: the remote ones', or the local worker's
        when there are none. Asked through the control thread, with a timeout
        (``worker_unresponsive_timeout_s``; a stopped process fails at once); a worker that cannot
        answer is handled as failed (its report is lost with it). Updates ``num_slow_workers``."""
        self._refresh()
        if not self._remote:
            return [(0, self._local.get_metrics())]
        asked = [
            (index, worker, control_call(worker, "get_metrics")) for index, worker in zip(self._indices, self._remote)
        ]
        reports = []
        deadline = self._control_deadline()
        for index, worker, ref in asked:
            try:
                reports.append((index, self._await_control(worker, ref, deadline)))
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as e:
                self.handle_failure(worker, e)
        self.slow_workers.update({index: report.fragment_s for index, report in reports})
        return reports

    def on_shard_failure(self, shard_index: int, failed: Any, error: ShardFailedError) -> Any:
        """Failure hook for gathers over the remote workers (``from_actors(..., on_shard_failure=...)``)."""
        return self.handle_failure(failed, error)

    def handle_failure(self, failed: Any, error: BaseException) -> Any:
        """Kill a failed remote worker and replace or drop it; returns the replacement (which joins
        :meth:`remote_workers` once started: see :meth:`started`; while it waits out its restart backoff, a
        stand-in that :meth:`started` follows to it) or None. Never waits for the replacement."""
        if failed in self._replacements:  # another caller already handled this failure
            return self._latest(failed)
        worker_index = self._index_of(failed)
        if worker_index is None:
            raise FlowRLError(f"rollout worker {failed} failed but is not one of this WorkerSet's workers") from error
        cause = error.__cause__ if isinstance(error, ShardFailedError) and error.__cause__ is not None else error
        # Neither is a fault of the worker, which is left alive (an emergency checkpoint still gets its state).
        if isinstance(cause, BadObservationError):
            raise cause  # on_bad_observation="raise": the user asked for the run to stop on it
        if isinstance(cause, CallbackError):
            raise cause  # the user's code failed: a replacement would run it again
        what = f"rollout worker {worker_index} {_how_it_failed(error)}"
        if what.endswith("timed out"):
            what += f" ({self._hung.pop(failed, None) or _probe(failed)})"
        self._kill(failed)
        self.liveness.forget(failed)
        if failed in self._remote:
            position = self._remote.index(failed)
            self._remote.pop(position)
            self._indices.pop(position)
        else:
            del self._starting[worker_index]
        if not self.recreate_failed_workers:
            self._replacements[failed] = None
            self.num_workers_dropped += 1
            if not self._remote and not self._starting:
                raise WorkerFailureError(
                    f"{what}, and it was the last one: every rollout worker failed and recreate_failed_workers=False. "
                    f"Last failure:\n{cause}",
                    worker_indices=[worker_index],
                ) from cause
            logger.warning("%s; continuing without it (%d left)", what, len(self._remote))
            return None
        try:
            self.restart_budget.spend(what, cause, worker_indices=[worker_index])
        except WorkerFailureError:
            self._replacements[failed] = None  # at the cap, the run ends: its state is left out of a checkpoint
            raise
        delay = self.restart_budget.backoff(worker_index, cause)
        logger.warning("%s; recreating it%s: %s", what, f" in {delay:g} s" if delay else "", cause)
        self.num_worker_restarts += 1
        if delay:  # made by _refresh once the delay is over: nothing here waits for it
            replacement: Any = _Deferred(worker_index, self.num_worker_restarts, time.monotonic() + delay)
            self._deferred[worker_index] = replacement
        else:
            replacement = self._start_replacement(worker_index, self.num_worker_restarts)
        self._replacements[failed] = replacement
        return replacement

    def _start_replacement(self, worker_index: int, incarnation: int) -> Any:
        """Make the actor replacing worker ``worker_index``; it joins :meth:`remote_workers` once it has started."""
        replacement = self._make_remote(worker_index, incarnation=incarnation)
        ready = control_call(replacement, "process_info")  # the weights follow when it rejoins (_rejoin)
        self._starting[worker_index] = _Starting(replacement, ready, time.monotonic())
        return replacement

    def _kill(self, worker: Any) -> None:
        """Kill a worker that raised or hangs (it is still alive); a stopped process on this node by its pid too,
        since it cannot act on Ray's request and holds its bundle until it dies."""
        if self._stopped(worker):
            index = self._index_of(worker)
            if index is not None:
                try:
                    os.kill(self._info[index].pid, signal.SIGKILL)
                except OSError:
                    pass  # gone already
        ray.kill(worker, no_restart=True)

    def probe_unhealthy_workers(self) -> int:
        """Probe every remote worker (with a timeout), replacing or dropping the dead; returns how many were dead."""
        self._refresh()
        probes = [(worker, control_call(worker, "ping")) for worker in self._remote]
        dead = 0
        deadline = self._control_deadline()
        for worker, ref in probes:
            try:
                self._await_control(worker, ref, deadline)
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as e:
                dead += 1
                self.handle_failure(worker, e)
        return dead

    def stop(self) -> None:
        """Close every worker's envs and kill the remote workers, even when an env's ``close`` raises.

        Raises a :class:`~flowrl.errors.FlowRLError` naming the failed closes after every
        actor is gone.
        """
        problems = []
        try:
            self._local.stop()
        except FlowRLError as e:
            problems.append(str(e))
        closing = [worker.stop.remote() for worker in self._remote]
        done, _ = ray.wait(closing, num_returns=len(closing), timeout=STOP_TIMEOUT_S) if closing else ([], [])
        for ref in done:
            try:
                ray.get(ref)
            except ray.exceptions.RayActorError:
                pass  # a dead worker has no envs left to close
            except ray.exceptions.RayTaskError as e:
                problems.append(str(e).strip().splitlines()[-1])
        self._kill_remote()
        if problems:
            raise FlowRLError("stopping the rollout workers: " + "; ".join(problems))

    def _kill_remote(self) -> None:
        for worker in [*self._remote, *(s.actor for s in self._starting.values())]:
            ray.kill(worker, no_restart=True)
        self._remote, self._indices, self._starting, self._deferred = [], [], {}, {}
        self.reservation.release()

    def placement(self) -> dict[str, Any]:
        """Where the plan runs: the placement strategy, the Ray node of the driver (the local worker and
        the learner), each remote worker's (by worker index) and each reserved bundle's."""
        return {
            "strategy": self._config.placement_strategy,
            "driver_node": ray.get_runtime_context().get_node_id(),
            "worker_nodes": {
                index: info.node_id if (info := self._info.get(index)) else None for index in self._indices
            },
            "bundles": self.reservation.layout(),
        }


def _how_it_failed(error: BaseException) -> str:
    """How a worker failed, in words, from the error a gather or a call reported."""
    if isinstance(error, ShardFailedError):
        reason = error.reason
    elif isinstance(error, ray.exceptions.GetTimeoutError):
        reason = "timed_out"
    elif isinstance(error, ray.exceptions.RayTaskError):
        reason = "raised"
    else:
        reason = "died"
    return {"died": "died", "raised": "raised an error", "timed_out": "timed out"}[reason]


def _name_worker(error: BaseException, worker_index: int) -> None:
    """Say which worker's ``foreach_worker`` call raised ``error``: a note under its traceback (Python 3.11 on),
    else a line in the log."""
    note = f"raised by foreach_worker's function in rollout worker {worker_index} (the worker was not restarted)"
    if sys.version_info >= (3, 11):
        error.add_note(note)
    else:
        logger.error(note)


def _poll(ref: Any) -> Answer:
    """A progress probe's answer without waiting: the progress, None while unanswered, or a dead worker's error."""
    ready, _ = ray.wait([ref], timeout=0)
    if not ready:
        return None
    try:
        return cast(Answer, ray.get(ref))
    except ray.exceptions.RayActorError as e:
        return e


def _probe(worker: Any) -> str:
    """Whether a worker that timed out is still alive (a health probe with its own timeout)."""
    try:
        ray.get(control_call(worker, "ping"), timeout=PROBE_TIMEOUT_S)
        return "it is alive but stuck"
    except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
        return "it does not answer probes"
