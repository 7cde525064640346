"""A local rollout worker plus N remote ones, with weight sync and worker recovery."""

from __future__ import annotations

import logging
from typing import Any, Callable, Mapping, TypeVar, cast

import gymnasium as gym
import ray

from flowrl.actors.rollout_worker import RolloutWorker, as_config
from flowrl.config import TrainerConfig
from flowrl.envs import check_env as check_env_api
from flowrl.envs import check_multi_agent_env, is_multi_agent_env
from flowrl.envs.registry import EnvCreator
from flowrl.errors import FlowRLError, ShardFailedError
from flowrl.policy import PolicySpec

R = TypeVar("R")

logger = logging.getLogger(__name__)


class WorkerSet:
    """The local worker (in this process) and ``num_workers`` remote rollout actors.

    Unless ``check_env=False``, one env is made and checked with
    :func:`flowrl.envs.check_env` first. ``recreate_failed_workers=True`` replaces a remote worker that died with a new actor
    at the same index, loaded with the local worker's current weights and state, and
    counts it in ``num_worker_restarts``; ``False`` drops it and carries on with the
    rest. Failures are noticed by :meth:`foreach_worker` and by gathers built with
    :meth:`on_shard_failure` as their hook.
    """

    def __init__(
        self,
        *,
        env_creator: EnvCreator,
        policy_specs: Mapping[str, PolicySpec],
        config: TrainerConfig | Mapping[str, Any],
        num_workers: int,
        num_cpus_per_worker: float = 1.0,
        recreate_failed_workers: bool = True,
        check_env: bool = True,
    ) -> None:
        config = as_config(config)
        if check_env:
            # Reject a broken env here, with a message naming the fault, before any actor starts.
            env = env_creator(dict(config.env_config))
            try:
                if is_multi_agent_env(env):
                    check_multi_agent_env(env)
                else:
                    check_env_api(cast(gym.Env, env))
            finally:
                env.close()
        self._env_creator = env_creator
        self._policy_specs = dict(policy_specs)
        self._config = config
        self._remote_cls = ray.remote(num_cpus=num_cpus_per_worker, max_restarts=0)(RolloutWorker)
        self.recreate_failed_workers = recreate_failed_workers
        self.num_worker_restarts = 0
        self.num_workers_dropped = 0
        self._local = RolloutWorker(env_creator=env_creator, policy_specs=policy_specs, config=config, worker_index=0)
        self._remote = [self._make_remote(i + 1) for i in range(num_workers)]
        self._replacements: dict[Any, Any] = {}
        self._global_vars: Mapping[str, Any] | None = None
        if self._remote:
            self.sync_weights()

    def _make_remote(self, worker_index: int, incarnation: int = 0) -> Any:
        config = self._config
        if incarnation and config.seed is not None:
            # A replacement must not replay its predecessor's env seeds and exploration draws.
            config = config.replace(seed=config.seed + 7919 * incarnation)
        return self._remote_cls.remote(
            env_creator=self._env_creator,
            policy_specs=self._policy_specs,
            config=config,
            worker_index=worker_index,
        )

    def local_worker(self) -> RolloutWorker:
        """The worker living in this process (the learner's copy of the policies)."""
        return self._local

    def remote_workers(self) -> list[Any]:
        """Handles of the live remote workers, in worker-index order."""
        return list(self._remote)

    def trainable_policies(self) -> list[str]:
        """Ids of the policies to train (``policies_to_train``, default all)."""
        return list(self._config.policies_to_train or self._local.policy_map)

    def sync_weights(self, policies: list[str] | None = None, global_vars: Mapping[str, Any] | None = None) -> None:
        """Broadcast the local worker's weights (one ``ray.put``) and ``global_vars`` to every remote worker.

        Actor calls from one caller run in order, so each worker's next sample uses them.
        """
        if global_vars is not None:
            self._global_vars = dict(global_vars)
            self._local.set_global_vars(global_vars)
        if not self._remote:
            return
        weights = ray.put(self._local.get_weights(policies))
        for worker in self._remote:
            worker.set_weights.remote(weights, self._global_vars)

    def foreach_worker(self, fn: Callable[[RolloutWorker], R], local: bool = True) -> list[R]:
        """``fn(worker)`` on the local worker (if ``local``) and every remote one; results in order."""
        results = [fn(self._local)] if local else []
        refs = [(w, w.apply.remote(fn)) for w in self._remote]
        for worker, ref in refs:
            try:
                results.append(ray.get(ref))
            except ray.exceptions.RayActorError as e:
                replacement = self._handle_failure(worker, e)
                if replacement is not None:
                    results.append(ray.get(replacement.apply.remote(fn)))
        return results

    def on_shard_failure(self, shard_index: int, dead_actor: Any, error: ShardFailedError) -> Any:
        """Failure hook for gathers over the remote workers (``from_actors(..., on_shard_failure=...)``)."""
        return self._handle_failure(dead_actor, error)

    def _handle_failure(self, dead: Any, error: Exception) -> Any:
        """Replace or drop a dead remote worker; returns the replacement or None."""
        if dead in self._replacements:  # another caller already handled this death
            return self._replacements[dead]
        if dead not in self._remote:
            raise FlowRLError(f"rollout worker {dead} failed but is not one of this WorkerSet's workers") from error
        index = self._remote.index(dead)
        if not self.recreate_failed_workers:
            logger.warning("rollout worker %d died (%s); continuing without it", index + 1, error)
            self._remote.pop(index)
            self._replacements[dead] = None
            self.num_workers_dropped += 1
            return None
        logger.warning("rollout worker %d died (%s); recreating it", index + 1, error)
        self.num_worker_restarts += 1
        replacement = self._make_remote(index + 1, incarnation=self.num_worker_restarts)
        replacement.set_weights.remote(self._local.get_weights(), self._global_vars)
        self._remote[index] = replacement
        self._replacements[dead] = replacement
        return replacement

    def probe_unhealthy_workers(self) -> int:
        """Ping every remote worker, replacing (or dropping) the dead; returns how many were dead."""
        dead = 0
        for worker in list(self._remote):
            try:
                ray.get(worker.ping.remote())
            except ray.exceptions.RayActorError as e:
                dead += 1
                self._handle_failure(worker, e)
        return dead

    def stop(self) -> None:
        """Close the local worker's envs and kill the remote workers."""
        self._local.stop()
        for worker in self._remote:
            ray.kill(worker)
        self._remote = []
