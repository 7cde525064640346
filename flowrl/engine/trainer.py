"""The Trainer: builds an algorithm's plan over rollout workers, runs it, and saves and restores it."""

from __future__ import annotations

import logging
import random
import time
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from flowrl.actors import PlanResources
from flowrl.actors.placement import asks_for_actors
from flowrl.algorithms import Algorithm, get_algorithm
from flowrl.callbacks import Callbacks, run_hook
from flowrl.config import TrainerConfig
from flowrl.deferred import torch
from flowrl.engine.build import (
    EnvSpec,
    build_plan,
    make_workers,
    plan_bundles,
    validated_config,
    write_output_metadata,
)
from flowrl.engine.evaluator import Evaluator
from flowrl.engine.pretrain import OfflinePhases
from flowrl.engine.ray_runtime import start_ray, stop_ray
from flowrl.engine.state import TrainerState
from flowrl.envs import get_env_creator
from flowrl.errors import CheckpointError, ConfigError, FlowRLError, PlanStoppedError
from flowrl.operators import STEPS_SAMPLED_COUNTER
from flowrl.plan.xray import XRay
from flowrl.policy.schedules import ending_schedules
from flowrl.serve.evaluate import evaluate_policies
from flowrl.storage.checkpoints import read_checkpoint

logger = logging.getLogger(__name__)


class Trainer(TrainerState):
    """Trains one algorithm on one env: ``train()`` runs one iteration of its execution plan.

    ``config`` is a dict of the algorithm's config keys (or its config object); every
    problem in it is reported in one :class:`~flowrl.errors.ConfigError` before any actor
    starts. Ray is used only by a plan that starts actors (remote rollout workers, replay
    shards, aggregators, evaluation workers): with no ``address`` an embedded local Ray is
    then started (and stopped by :meth:`stop`); with one, that cluster is joined and left
    running. A plan with none (``num_workers=0``) runs in this process without Ray.

    The Trainer owns what the plan wires: the rollout workers (``workers``) and the
    algorithm's resources (``resources``: replay buffers or shards, a learner thread,
    aggregators), created before the plan and released by :meth:`stop`.
    """

    def __init__(
        self,
        algo: str,
        env: EnvSpec,
        config: Mapping[str, Any] | TrainerConfig | None = None,
        *,
        address: str | None = None,
    ) -> None:
        self.algorithm: Algorithm = get_algorithm(algo)
        self.config = validated_config(self.algorithm, config)
        self.env = env
        env_creator = get_env_creator(env)
        bundles = plan_bundles(self.algorithm, self.config)
        self._owns_ray = start_ray(address) if asks_for_actors(self.config.num_workers, bundles) else False
        try:
            self._configure_driver()
            self.workers = make_workers(self.algorithm, self.config, env_creator, bundles)
            if self.config.output is not None:
                write_output_metadata(
                    self.algorithm,
                    env,
                    self.config,
                    self.workers.policy_specs,
                    multi_agent=self.workers.local_worker().multi_agent,
                )
            self.resources = PlanResources()
            try:
                self.resources = self.algorithm.make_resources(self.workers, self.config)
                self.plan = build_plan(self.algorithm, self.workers, self.config, self.resources)
                self.xray = XRay(self.plan, profile=self.config.profile)
                #: Evaluation during training (``evaluation_interval``); its actors live in the workers' reservation.
                self.evaluator = Evaluator(
                    self.config,
                    env_creator,
                    self.workers.policy_specs,
                    self.workers,
                    parallel=self.algorithm.asynchronous,
                    offline=self.resources.offline,
                )
                #: ``pretrain`` and ``replay_prefill``: what the run learns from recorded experiences besides its plan.
                self.phases = OfflinePhases(type(self), env, self.config, self.workers, self.resources)
            except BaseException:
                for release in (self.resources.stop, self.workers.stop):
                    try:
                        release()
                    except FlowRLError:  # keep the error that stopped the build the one raised
                        logger.exception("releasing a Trainer whose build failed")
                raise
        except BaseException:
            stop_ray(self._owns_ray)
            raise
        #: The config's callbacks in this process, shared with the local worker (see :mod:`flowrl.callbacks`).
        self.callbacks: Callbacks = self.workers.local_worker().callbacks
        self.iteration = 0
        self.time_total_s = 0.0
        self._stopped_by: str | None = None  # why the plan ended, once an error unwound it
        # The counters as of the last finished iteration: what a checkpoint records, so one taken
        # while an iteration is interrupted does not count that iteration's partial work.
        self._finished_metrics = self.plan.metrics.save()
        # The learner thread's steps the plan had taken in when the last iteration finished.
        self._learner_steps_taken = 0
        #: What the last restore found: checkpoint, config overrides, partial parts, envs restarted.
        self.restore_report: dict[str, Any] | None = None

    def _configure_driver(self) -> None:
        # Spinning OpenMP threads competing with rollout workers for a few cores slow small
        # models' SGD steps by an order of magnitude; the config decides how many to use.
        torch.set_num_threads(self.config.learner_threads)
        if self.config.seed is not None:
            random.seed(self.config.seed)
            np.random.seed(self.config.seed % 2**32)
            torch.manual_seed(self.config.seed)

    # -- running ---------------------------------------------------------------------

    def train(self) -> dict[str, Any]:
        """Run one training iteration (``next(plan)``) and return its result dict.

        An error the plan cannot absorb propagates and ends the plan: every later call raises
        :class:`~flowrl.errors.PlanStoppedError` saying why (restore a checkpoint into a new
        Trainer to go on).
        """
        if self._stopped_by is not None:
            raise PlanStoppedError(
                f"algorithm {self.algorithm.name!r}: the plan stopped at iteration {self.iteration + 1} with "
                f"{self._stopped_by}; build a new Trainer (or restore a checkpoint into one) to go on"
            )
        start = time.perf_counter()
        self.evaluator.before_iteration(self.iteration + 1, self.plan.metrics.counters[STEPS_SAMPLED_COUNTER])
        evaluation_s = time.perf_counter() - start
        if self.phases.pretraining_now:
            result = self.phases.pretrain_iteration(self.plan.metrics.counters[STEPS_SAMPLED_COUNTER])
        else:
            phase = self.phases.start_online()  # the replay prefill comes before the first online sample
            result = {**self._next_result(), **phase}
        planned = time.perf_counter()
        self.workers.sync_filters()  # once per iteration, as RLlib did: the workers' new observation statistics
        synced = time.perf_counter()
        result.update(
            self.evaluator.after_iteration(self.iteration + 1, self.plan.metrics.counters[STEPS_SAMPLED_COUNTER])
        )
        elapsed = time.perf_counter() - start
        evaluation_s += elapsed - (synced - start)
        self.iteration += 1
        self.time_total_s += elapsed
        result.update(
            training_iteration=self.iteration,
            time_this_iter_s=elapsed,
            time_total_s=self.time_total_s,
            timestamp=time.time(),
        )
        result.setdefault("info", {}).update(self.resources.stats())  # may replace a dead replay shard: first
        driver = {"sync_filters_s": synced - planned, "evaluation_s": evaluation_s}
        learn_times = [
            self.workers.local_worker().get_policy(pid).learn_times for pid in self.workers.trainable_policies()
        ]
        if result.get("phase") != "pretrain":  # a pretraining iteration brings its own plan's X-ray
            result["plan"] = self.xray.report(elapsed, result.get("plan", {}), result["info"], driver, learn_times)
        if self.workers.remote_workers():
            result["info"]["placement"] = self.workers.placement()
        result.update(self.resources.fault_counters())
        result["num_failed_checkpoints"] = self.num_failed_checkpoints  # periodic saves a run absorbed
        if self.restore_report is not None:
            result["restore"] = self.restore_report
        self._finished_metrics = self.plan.metrics.save()
        learner = self.resources.learner
        if learner is not None:
            self._learner_steps_taken = learner.num_steps_trained - learner.steps_not_delivered()
        hooked = time.perf_counter()
        run_hook(self.callbacks, "on_train_result", self, result, where=f"driver, iteration {self.iteration}")
        self.xray.add_driver_time(result["plan"], "on_train_result_s", time.perf_counter() - hooked)
        return result

    def _next_result(self) -> dict[str, Any]:
        """The plan's next result dict; an error ends the plan (later calls to :meth:`train` say so)."""
        try:
            result = next(self.plan)
        except StopIteration:
            self._stopped_by = "no more results (its sources ran out)"
            raise PlanStoppedError(f"algorithm {self.algorithm.name!r}: the plan ended: {self._stopped_by}") from None
        except BaseException as e:
            # The error unwound the plan's generators: they cannot be resumed.
            self._stopped_by = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
            raise
        if not isinstance(result, dict):
            raise FlowRLError(
                f"algorithm {self.algorithm.name!r}: its plan yielded a {type(result).__name__}, not a result dict; "
                "end the plan with StandardMetricsReporting"
            )
        return result

    def update_config(self, changes: Mapping[str, Any]) -> None:
        """Change hyperparameters of the running trainer, e.g. ``{"lr": 1e-4}`` (what PBT does).

        Only the algorithm's ``live_keys`` can change (read by the learner's loss and optimizer at
        each update); any other key, or an invalid value, raises :class:`~flowrl.errors.ConfigError`
        and changes nothing. The new values go into :attr:`config` (and so into checkpoints). A
        scheduled key changed here (``lr``, ``entropy_coeff``) ends its schedule (the config's
        ``lr_schedule``... becomes None): the value given holds from now on, also after a restore.
        """
        not_live = sorted(set(changes) - self.algorithm.live_keys)
        if not_live:
            live = ", ".join(sorted(self.algorithm.live_keys)) or "none"
            raise ConfigError(
                [
                    f"{key} cannot change on a running {self.algorithm.name} trainer (keys that can: {live}); "
                    "build a new trainer and restore a checkpoint into it"
                    for key in not_live
                ]
            )
        changes = ending_schedules(self.config, changes)
        config = self.config.replace(**changes)  # validates them all before anything changes
        local = self.workers.local_worker()
        with local.lock:  # a learner thread takes it for each update
            for pid in self.workers.trainable_policies():
                local.policy_map[pid].update_config(changes)
            if self.resources.learners is not None:
                self.resources.learners.update_config(changes)
            self.config = config

    def evaluate(self, num_episodes: int = 10, seed: int | None = None) -> dict[str, Any]:
        """Run ``num_episodes`` episodes with deterministic actions in this process; return their statistics."""
        local = self.workers.local_worker()
        return evaluate_policies(
            local.policy_map, self.env, self.config, num_episodes, seed, obs_filter=local.obs_filter
        )

    # -- checkpoints (saving and restoring: TrainerState, in flowrl.engine.state) -----

    @classmethod
    def from_checkpoint(
        cls,
        checkpoint_path: str | Path,
        *,
        address: str | None = None,
        config_overrides: Mapping[str, Any] | None = None,
        allow_partial: bool = False,
    ) -> "Trainer":
        """A new trainer built from a checkpoint's algorithm, env and config, with its state restored.

        ``config_overrides`` win over the checkpoint's config, optimizer state included (a
        new ``lr`` is the optimizer's learning rate); they are reported in the results'
        ``"restore"`` entry. Restore only checkpoints you trust (see :meth:`restore`).
        """
        state, _ = read_checkpoint(checkpoint_path)
        for key in ("algo", "env", "config"):
            if key not in state:
                raise CheckpointError(
                    f"checkpoint {str(checkpoint_path)!r} has no {key!r}: not a flowrl Trainer checkpoint"
                )
        trainer = cls(state["algo"], state["env"], {**state["config"], **(config_overrides or {})}, address=address)
        try:
            trainer.set_state(
                state,
                allow_partial=allow_partial,
                source=f"checkpoint {str(checkpoint_path)!r}",
                checkpoint_dir=Path(checkpoint_path),
            )
        except BaseException:
            trainer.stop()
            raise
        return trainer

    # -- lifecycle -------------------------------------------------------------------

    def stop(self) -> None:
        """Release the plan's resources and every actor, and stop Ray if this trainer started it.

        Every step runs even when an earlier one fails (an env's ``close`` raising, a learner
        thread that does not stop); the failures are then raised together as one
        :class:`~flowrl.errors.FlowRLError`.
        """
        problems = []
        for step in (self.phases.stop, self.resources.stop, self.evaluator.stop, self.workers.stop):
            try:
                step()
            except Exception as e:  # noqa: BLE001 - release the rest first, then report
                problems.append(f"{type(e).__name__}: {e}")
        learner = self.resources.learner
        if learner is not None and learner.is_alive():
            problems.append(f"learner thread {learner.name!r} did not stop (it is stuck in a learning step)")
        stop_ray(self._owns_ray)
        self._owns_ray = False
        if problems:
            raise FlowRLError(
                "Trainer.stop(): everything was released, but:\n" + "\n".join(f"  - {p}" for p in problems)
            )

    def __enter__(self) -> "Trainer":
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        try:
            self.stop()
        except FlowRLError:
            if exc_type is None:
                raise
            logger.exception("Trainer.stop() while handling another error")  # do not hide the error in flight

    def __repr__(self) -> str:
        return f"Trainer(algo={self.algorithm.name!r}, env={self.env!r}, iteration={self.iteration})"
