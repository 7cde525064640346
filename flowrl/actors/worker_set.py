"""A local rollout worker plus N remote ones, with weight sync and bounded worker recovery."""

from __future__ import annotations

import collections
import functools
import logging
import time
from typing import Any, Callable, Mapping, Sequence, TypeVar, cast

import gymnasium as gym

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
from flowrl.actors.rollout_worker import CONTROL_GROUP, RolloutWorker, WorkerMetrics, as_config, control_call
from flowrl.config import TrainerConfig
from flowrl.deferred import ray
from flowrl.envs import check_env as check_env_api
from flowrl.envs import check_multi_agent_env, is_multi_agent_env
from flowrl.envs.context import EnvContext
from flowrl.envs.registry import EnvCreator, close_env
from flowrl.errors import (
    BadObservationError,
    CallbackError,
    FlowRLError,
    ResourceUnavailableError,
    ShardFailedError,
    WorkerFailureError,
)

R = TypeVar("R")

logger = logging.getLogger(__name__)

#: Longest wait for a health probe (answered by a worker's control thread, even mid-sample).
PROBE_TIMEOUT_S = 10.0
#: Longest wait for a ``foreach_worker`` call when the config sets no ``sample_timeout_s``.
CALL_TIMEOUT_S = 600.0
#: Longest wait for the remote workers to close their envs when the set stops.
STOP_TIMEOUT_S = 5.0
MAX_RESTART_DELAY_S = 30.0


def restart_delay_s(failed_starts: int) -> float:
    """Seconds to wait before restarting a worker whose last ``failed_starts`` incarnations failed to start.

    0 after a worker that ran (a one-off crash is replaced at once), then 1, 2, 4 ...
    capped at 30: a worker whose constructor keeps failing backs off.
    """
    return 0.0 if failed_starts == 0 else min(2.0 ** (failed_starts - 1), MAX_RESTART_DELAY_S)


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
    ``config.max_worker_restarts`` and back off while a worker's replacements fail to start; past the
    cap, or with no worker left, a :class:`~flowrl.errors.WorkerFailureError` names the
    worker and carries the remote traceback.
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
        self.max_worker_restarts = config.max_worker_restarts
        self.sample_timeout_s = config.sample_timeout_s
        self.sample_min_fraction = config.sample_min_fraction
        self.num_worker_restarts = 0
        self.num_workers_dropped = 0
        self._init_failures: dict[int, int] = collections.defaultdict(int)  # in a row, per worker index
        self._node_ids: dict[int, str] = {}
        self._remote: list[Any] = []
        self._indices: list[int] = []
        self._replacements: dict[Any, Any] = {}
        self._global_vars: Mapping[str, Any] | None = None
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
        probes = {control_call(worker, "node_id"): index for worker, index in zip(self._remote, self._indices)}
        timeout = self._config.worker_startup_timeout_s
        ready, pending = ray.wait(list(probes), num_returns=len(probes), timeout=timeout)
        try:
            for ref in ready:
                self._node_ids[probes[ref]] = ray.get(ref)
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
        """Handles of the live remote workers, in worker-index order."""
        return list(self._remote)

    def remote_worker_indices(self) -> list[int]:
        """The worker index (1-based, as in ``env_config.worker_index``) of each of :meth:`remote_workers`."""
        return list(self._indices)

    def num_healthy_workers(self) -> int:
        """Remote workers in service (replacements included, dropped ones not)."""
        return len(self._remote)

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
        """Broadcast the local worker's weights (one ``ray.put``) and ``global_vars`` to every remote worker.

        Actor calls from one caller run in order, so each worker's next sample uses them.
        """
        if global_vars is not None:
            self.remember_global_vars(global_vars)
            self._local.set_global_vars(global_vars)
        if not self._remote:
            return
        weights = ray.put(self._local.get_weights(policies))
        for worker in self._remote:
            worker.set_weights.remote(weights, self._global_vars)

    def sync_filters(self) -> None:
        """Merge the observation statistics each remote worker gathered since the last sync into the local
        worker's filter, and send the merged statistics back to every remote worker (RLlib's
        ``FilterManager.synchronize``). Nothing to do without an observation filter.

        Asked through the workers' control threads, with a timeout; a worker that cannot answer
        is handled as failed (its statistics since the last sync are lost with it). Returns once
        every worker has the merged statistics.
        """
        local_filter = self._local.obs_filter
        if local_filter is None:
            return
        local_filter.pop_delta()  # the local worker's own observations are in its statistics already
        asked = [(worker, control_call(worker, "pop_filter_delta")) for worker in self._remote]
        for worker, ref in asked:
            try:
                local_filter.apply_delta(ray.get(ref, timeout=PROBE_TIMEOUT_S))
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as e:
                self.handle_failure(worker, e)
        if self._remote:
            # Waited for: once train() returns, every worker filters with the merged statistics (and a
            # checkpoint or a state read right after sees them, not a sync still on its way).
            merged = ray.put(local_filter.stats())
            synced = [(worker, control_call(worker, "sync_filter", merged)) for worker in self._remote]
            for worker, ref in synced:
                try:
                    ray.get(ref, timeout=PROBE_TIMEOUT_S)
                except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as e:
                    self.handle_failure(worker, e)

    def foreach_worker(self, fn: Callable[[RolloutWorker], R], local: bool = True) -> list[R]:
        """``fn(worker)`` on the local worker (if ``local``) and every remote one; results in order.

        A remote worker that fails (or takes longer than ``sample_timeout_s``) is handled as
        in a gather, and ``fn`` runs on its replacement.
        """
        results = [fn(self._local)] if local else []
        timeout = self._config.sample_timeout_s or CALL_TIMEOUT_S
        for worker, ref in [(w, w.apply.remote(fn)) for w in self._remote]:
            while True:
                try:
                    results.append(ray.get(ref, timeout=timeout))
                    break
                except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError, ray.exceptions.GetTimeoutError) as e:
                    worker = self.handle_failure(worker, e)
                    if worker is None:
                        break
                    ref = worker.apply.remote(fn)
        return results

    def get_remote_states(self) -> dict[int, dict[str, Any]]:
        """Each remote worker's state (:meth:`RolloutWorker.get_state` without weights) keyed by worker index.

        Asked in the workers' sampling thread, so each answers between two samples (an
        asynchronous plan's requests in flight are served first). A worker that fails, or
        has not answered once ``sample_timeout_s`` has passed since all were asked, is handled
        as failed (counted in ``num_worker_restarts``) and left out: its replacement starts
        afresh on restore.
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
        when there are none. Asked through the control thread, with a timeout; a worker that
        cannot answer is handled as failed (its report is lost with it)."""
        if not self._remote:
            return [(0, self._local.get_metrics())]
        asked = [
            (index, worker, control_call(worker, "get_metrics")) for index, worker in zip(self._indices, self._remote)
        ]
        reports = []
        for index, worker, ref in asked:
            try:
                reports.append((index, ray.get(ref, timeout=PROBE_TIMEOUT_S)))
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as e:
                self.handle_failure(worker, e)
        return reports

    def on_shard_failure(self, shard_index: int, failed: Any, error: ShardFailedError) -> Any:
        """Failure hook for gathers over the remote workers (``from_actors(..., on_shard_failure=...)``)."""
        return self.handle_failure(failed, error)

    def handle_failure(self, failed: Any, error: BaseException) -> Any:
        """Kill a failed remote worker and replace or drop it; returns the replacement or None."""
        if failed in self._replacements:  # another caller already handled this failure
            replacement = self._replacements[failed]
            while replacement in self._replacements:  # which may have failed to start in turn
                replacement = self._replacements[replacement]
            return replacement
        if failed not in self._remote:
            raise FlowRLError(f"rollout worker {failed} failed but is not one of this WorkerSet's workers") from error
        position = self._remote.index(failed)
        worker_index = self._indices[position]
        what = f"rollout worker {worker_index} {_how_it_failed(error)}"
        if what.endswith("timed out"):
            what += f" ({_probe(failed)})"
        ray.kill(failed, no_restart=True)  # a worker that raised or hangs is still alive
        cause = error.__cause__ if isinstance(error, ShardFailedError) and error.__cause__ is not None else error
        if isinstance(cause, BadObservationError):
            raise cause  # on_bad_observation="raise": the user asked for the run to stop on it
        if isinstance(cause, CallbackError):
            raise cause  # the user's code failed: a replacement would run it again
        if not self.recreate_failed_workers:
            self._remote.pop(position)
            self._indices.pop(position)
            self._replacements[failed] = None
            self.num_workers_dropped += 1
            if not self._remote:
                raise WorkerFailureError(
                    f"{what}, and it was the last one: every rollout worker failed and recreate_failed_workers=False. "
                    f"Last failure:\n{cause}",
                    worker_indices=[worker_index],
                ) from cause
            logger.warning("%s; continuing without it (%d left)", what, len(self._remote))
            return None
        if self.num_worker_restarts >= self.max_worker_restarts:
            raise WorkerFailureError(
                f"{what}, and the run already restarted workers {self.num_worker_restarts} times "
                f"(max_worker_restarts={self.max_worker_restarts}). Last failure:\n{cause}",
                worker_indices=[worker_index],
            ) from cause
        delay = self._backoff(worker_index, cause)
        logger.warning("%s; recreating it%s: %s", what, f" in {delay:g} s" if delay else "", cause)
        time.sleep(delay)
        self.num_worker_restarts += 1
        replacement = self._make_remote(worker_index, incarnation=self.num_worker_restarts)
        with self._local.lock:  # not halfway through a learner thread's step
            weights = self._local.get_weights()
        replacement.set_weights.remote(weights, self._global_vars)
        if self._local.obs_filter is not None:  # it filters with the run's statistics from its first sample on
            replacement.sync_filter.remote(self._local.obs_filter.stats())
        self._remote[position] = replacement
        self._replacements[failed] = replacement
        return self._started(replacement, worker_index)

    def _started(self, replacement: Any, worker_index: int) -> Any:
        """``replacement`` once it has started (its constructor ran), or what replaced it in turn if it failed to.

        Waiting here, rather than in the gather that asked, keeps a short ``sample_timeout_s``
        from timing out a worker that is still starting.
        """
        try:
            self._node_ids[worker_index] = ray.get(
                control_call(replacement, "node_id"), timeout=self._config.worker_startup_timeout_s
            )
        except ray.exceptions.RayActorError as e:
            return self.handle_failure(replacement, e)
        except ray.exceptions.GetTimeoutError:
            raise ResourceUnavailableError(
                f"the replacement of rollout worker {worker_index} did not start within worker_startup_timeout_s="
                f"{self._config.worker_startup_timeout_s:g}; Ray has {ray.available_resources()} available now"
            ) from None
        return replacement

    def _backoff(self, worker_index: int, cause: BaseException) -> float:
        """The delay before restarting ``worker_index``: it grows while its replacements keep failing to start."""
        if isinstance(cause, ray.exceptions.RayActorError) and cause.actor_init_failed:
            self._init_failures[worker_index] += 1
        else:
            self._init_failures[worker_index] = 0
        return restart_delay_s(self._init_failures[worker_index])

    def probe_unhealthy_workers(self) -> int:
        """Probe every remote worker (with a timeout), replacing or dropping the dead; returns how many were dead."""
        probes = [(worker, control_call(worker, "ping")) for worker in self._remote]
        dead = 0
        for worker, ref in probes:
            try:
                ray.get(ref, timeout=PROBE_TIMEOUT_S)
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
        for worker in self._remote:
            ray.kill(worker, no_restart=True)
        self._remote, self._indices = [], []
        self.reservation.release()

    def placement(self) -> dict[str, Any]:
        """Where the plan runs: the placement strategy, the Ray node of the driver (the local worker and
        the learner), each remote worker's (by worker index) and each reserved bundle's."""
        return {
            "strategy": self._config.placement_strategy,
            "driver_node": ray.get_runtime_context().get_node_id(),
            "worker_nodes": {index: self._node_ids.get(index) for index in self._indices},
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


def _probe(worker: Any) -> str:
    """Whether a worker that timed out is still alive (a health probe with its own timeout)."""
    try:
        ray.get(control_call(worker, "ping"), timeout=PROBE_TIMEOUT_S)
        return "it is alive but stuck"
    except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
        return "it does not answer probes"
