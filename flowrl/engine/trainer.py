"""The Trainer: builds an algorithm's plan over rollout workers, runs it, and saves and restores it."""

from __future__ import annotations

import logging
import random
import time
from pathlib import Path
from typing import Any, Callable, Mapping

import gymnasium as gym
import numpy as np

from flowrl.algorithms import Algorithm, get_algorithm, list_algorithms
from flowrl.actors import PlanResources, WorkerSet
from flowrl.actors.evaluation import evaluation_request
from flowrl.actors.placement import BundleRequest, asks_for_actors, learner_request
from flowrl.actors.rng import process_rng_state, set_process_rng_state
from flowrl.callbacks import Callbacks, run_hook
from flowrl.storage.checkpoints import read_checkpoint, write_checkpoint
from flowrl.config import TrainerConfig
from flowrl.data import DEFAULT_POLICY_ID
from flowrl.deferred import torch
from flowrl.envs import get_env_creator, is_multi_agent_env
from flowrl.envs.context import EnvContext
from flowrl.envs.registry import EnvCreator, close_env
from flowrl.serve.inference import policy_files
from flowrl.errors import CheckpointError, ConfigError, FlowRLError, PlanStoppedError
from flowrl.engine.evaluator import Evaluator, evaluate_policies
from flowrl.operators import STEPS_SAMPLED_COUNTER, STEPS_TRAINED_COUNTER
from flowrl.plan.graph import Plan
from flowrl.policy import PolicySpec
from flowrl.policy.filters import MeanStdFilter
from flowrl.policy.mapping import policy_mapping
from flowrl.engine.ray_runtime import start_ray, stop_ray
from flowrl.engine.restore import Layout, check_restore, state_layout
from flowrl.plan.xray import XRay

EnvSpec = str | Callable[[dict[str, Any]], gym.Env]
CHECKPOINT_VERSION = 3

logger = logging.getLogger(__name__)


class Trainer:
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
            self.resources = PlanResources()
            try:
                self.resources = self.algorithm.make_resources(self.workers, self.config)
                self.plan = build_plan(self.algorithm, self.workers, self.config, self.resources)
                self.xray = XRay(self.plan, profile=self.config.profile)
                #: Evaluation during training (``evaluation_interval``); its actors live in the workers' reservation.
                self.evaluator = Evaluator(
                    self.config, env_creator, self.workers.policy_specs, self.workers, parallel=self.algorithm.asynchronous
                )
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
        planned = time.perf_counter()
        self.workers.sync_filters()  # once per iteration, as RLlib did: the workers' new observation statistics
        synced = time.perf_counter()
        result.update(self.evaluator.after_iteration(self.iteration + 1, self.plan.metrics.counters[STEPS_SAMPLED_COUNTER]))
        elapsed = time.perf_counter() - start
        evaluation_s += elapsed - (synced - start)
        self.iteration += 1
        self.time_total_s += elapsed
        result.update(training_iteration=self.iteration, time_this_iter_s=elapsed, time_total_s=self.time_total_s, timestamp=time.time())
        result.setdefault("info", {}).update(self.resources.stats())  # may replace a dead replay shard: first
        driver = {"sync_filters_s": synced - planned, "evaluation_s": evaluation_s}
        learn_times = [self.workers.local_worker().get_policy(pid).learn_times for pid in self.workers.trainable_policies()]
        result["plan"] = self.xray.report(elapsed, result.get("plan", {}), result["info"], driver, learn_times)
        if self.workers.remote_workers():
            result["info"]["placement"] = self.workers.placement()
        result.update(self.resources.fault_counters())
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

    def update_config(self, changes: Mapping[str, Any]) -> None:
        """Change hyperparameters of the running trainer, e.g. ``{"lr": 1e-4}`` (what PBT does).

        Only the algorithm's ``live_keys`` can change (read by the learner's loss and optimizer at
        each update); any other key, or an invalid value, raises :class:`~flowrl.errors.ConfigError`
        and changes nothing. The new values go into :attr:`config` (and so into checkpoints).
        """
        not_live = sorted(set(changes) - self.algorithm.live_keys)
        if not_live:
            live = ", ".join(sorted(self.algorithm.live_keys)) or "none"
            raise ConfigError([f"{key} cannot change on a running {self.algorithm.name} trainer (keys that can: {live}); "
                               "build a new trainer and restore a checkpoint into it" for key in not_live])
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
        return evaluate_policies(local.policy_map, self.env, self.config, num_episodes, seed, obs_filter=local.obs_filter)

    # -- checkpoints -----------------------------------------------------------------

    def get_state(self) -> dict[str, Any]:
        """Everything needed to resume: config, spaces, weights, optimizer and exploration state,
        counters, RNGs, the envs' episodes in progress in every rollout worker, and the plan's
        resources (replay buffers).

        A learner thread is paused while the state is read, so weights and counters agree.
        """
        remote = self.workers.get_remote_states()  # first: they may wait for samples in flight
        local = self.workers.local_worker()
        with local.lock:  # not halfway through a learner thread's step; it waits until we are done
            return {
                "version": CHECKPOINT_VERSION,
                "algo": self.algorithm.name,
                "env": self.env,
                "config": self.config.to_dict(jsonable=False),
                "iteration": self.iteration,
                "time_total_s": self.time_total_s,
                "spaces": {pid: (p.observation_space, p.action_space) for pid, p in local.policy_map.items()},
                "worker": local.get_state(),
                "remote_workers": remote,
                "num_worker_restarts": self.workers.num_worker_restarts,
                "plan": {**self.plan.get_state(), "metrics": self._checkpoint_metrics()},
                "resources": self.resources.get_state(),
                "evaluation": self.evaluator.get_state(),
                "rng": process_rng_state(),
            }

    def _checkpoint_metrics(self) -> tuple[dict[str, int], dict[str, Any]]:
        # The counters of the last finished iteration, plus the steps a learner thread trained
        # since (their results wait in its outqueue): those are in the weights being saved.
        counters, info = self._finished_metrics
        learner = self.resources.learner
        if learner is None:
            return dict(counters), dict(info)
        extra = learner.num_steps_trained - self._learner_steps_taken
        return {**counters, STEPS_TRAINED_COUNTER: counters.get(STEPS_TRAINED_COUNTER, 0) + extra}, dict(info)

    def layout(self) -> Layout:
        """What a checkpoint restored into this trainer must match (see :mod:`flowrl.engine.restore`)."""
        local = self.workers.local_worker()
        return Layout(
            algo=self.algorithm.name,
            env=self.env if isinstance(self.env, str) else None,
            spaces={pid: (p.observation_space, p.action_space) for pid, p in local.policy_map.items()},
            weight_shapes={pid: {k: tuple(v.shape) for k, v in p.get_weights().items()} for pid, p in local.policy_map.items()},
            target_networks=frozenset(pid for pid, p in local.policy_map.items() if getattr(p, "target_model", None) is not None),
            operators=self.plan.state_keys(),
            replay_shards=len(self.resources.replay_actors),
            replay_buffer=self.resources.replay_buffer is not None,
        )

    def set_state(self, state: Mapping[str, Any], *, allow_partial: bool = False, source: str = "the checkpoint") -> None:
        """Restore :meth:`get_state`'s output into this trainer; older layouts are upgraded.

        Everything is checked first (see :mod:`flowrl.engine.restore`): a checkpoint of another
        algorithm, env, spaces or model shapes raises :class:`~flowrl.errors.CheckpointError`
        naming both sides, and so does a partial restore unless ``allow_partial`` (then it
        is logged and reported); in either case the trainer is left as it was. This
        trainer's config wins over the checkpoint's: the optimizers keep its learning rates
        and loss coefficients named in it take its values. What the restore found is kept
        in :attr:`restore_report` and reported in every later result under ``"restore"``.
        """
        state = upgraded_state(state)
        check = check_restore(state_layout(state), self.layout(), state["config"], self.config.to_dict(jsonable=False))
        if check.mismatches:
            raise CheckpointError(f"{source} does not fit this trainer:\n" + "\n".join(f"  - {m}" for m in check.mismatches))
        if check.partial and not allow_partial:
            raise CheckpointError(
                f"{source} can only be restored in part (pass allow_partial=True to accept that):\n"
                + "\n".join(f"  - {p}" for p in check.partial)
            )
        for problem in check.partial:
            logger.warning("partial restore from %s: %s", source, problem)
        local = self.workers.local_worker()
        with local.lock:
            fresh = {0: local.set_state(state["worker"])}
            self._apply_overrides(check.overrides)
        self.plan.set_state(state["plan"])
        self.resources.set_state(state["resources"], allow_partial=allow_partial)
        if self.resources.learners is not None:  # the replicas learn from the restored policies
            with local.lock:
                self.resources.learners.sync()
        self.evaluator.set_state(state.get("evaluation", {}))
        self._finished_metrics = self.plan.metrics.save()
        learner = self.resources.learner
        self._learner_steps_taken = learner.num_steps_trained - learner.steps_not_delivered() if learner is not None else 0
        self.iteration = int(state["iteration"])
        self.time_total_s = float(state["time_total_s"])
        # The whole run's restarts: max_worker_restarts caps them across resumed sessions too.
        self.workers.num_worker_restarts = int(state.get("num_worker_restarts", 0))
        set_process_rng_state(state["rng"])
        timestep = self.plan.metrics.counters[STEPS_SAMPLED_COUNTER]
        self.workers.sync_weights(global_vars={"timestep": timestep})
        fresh.update(self.workers.set_remote_states(state.get("remote_workers", {})))
        restarted = {index: envs for index, envs in fresh.items() if envs}
        self.restore_report = {
            "checkpoint": source,
            "iteration": self.iteration,
            "config_overrides": check.overrides,
            "partial": check.partial,
            "envs_restarted": restarted,
        }
        if restarted:
            logger.warning("restored from %s, but these envs (worker index: vector indices) could not be saved "
                           "mid-episode and started new episodes: %s", source, restarted)

    def _apply_overrides(self, overrides: Mapping[str, Any]) -> None:
        # Loss coefficients an algorithm adapts (PPO's kl_coeff) are saved state; a value the
        # caller gives in the config at restore replaces the saved one.
        for policy in self.workers.local_worker().policy_map.values():
            coeffs = getattr(policy, "coeffs", {})
            for key in overrides:
                if key in coeffs:
                    coeffs[key] = float(getattr(policy.config, key))

    def save(self, checkpoint_dir: str | Path, metadata: Mapping[str, Any] | None = None) -> str:
        """Write a checkpoint under ``checkpoint_dir`` (atomically) and return its path.

        ``metadata`` adds keys to the checkpoint's ``metadata.json`` (e.g. the metric a run
        keeps its best checkpoint by).
        """
        path = Path(checkpoint_dir) / f"checkpoint_{self.iteration:06d}"
        metadata = {
            **(metadata or {}),
            "algo": self.algorithm.name,
            "env": self.env if isinstance(self.env, str) else repr(self.env),
            "iteration": self.iteration,
            "timesteps_total": self._finished_metrics[0].get(STEPS_SAMPLED_COUNTER, 0),
            "config": self.config.to_dict(),
        }
        local = self.workers.local_worker()
        with local.lock:  # the portable weights are the same moment's as the state's
            state = self.get_state()
            try:
                files = policy_files(local.policy_map, self.algorithm.name, self.config, local.obs_filter)
            except CheckpointError as e:  # an exotic space JSON cannot describe: the full checkpoint still counts
                logger.warning("checkpoint %s: no portable policy files (load_policy cannot read it): %s", path, e)
                files = {}
        saved = str(write_checkpoint(path, state, metadata, files=files))
        run_hook(self.callbacks, "on_checkpoint", self, saved, where=f"driver, iteration {self.iteration}")
        return saved

    def state_problem(self) -> str | None:
        """Why this trainer's state is not worth saving (a policy weight that is not finite), or None.

        A run that ends with an error saves an emergency checkpoint only when this is None.
        """
        for pid, policy in self.workers.local_worker().policy_map.items():
            for name, value in policy.get_weights().items():
                if not np.isfinite(value).all():
                    return f"policy {pid!r} has non-finite weights in {name!r}"
        return None

    def restore(self, checkpoint_path: str | Path, *, allow_partial: bool = False) -> None:
        """Load a checkpoint written by :meth:`save` into this trainer (checked first: see :meth:`set_state`).

        A checkpoint is a pickle, and loading a pickle can run code: restore only checkpoints
        you trust (:func:`flowrl.load_policy` reads a policy from anyone without unpickling).
        """
        state, _ = read_checkpoint(checkpoint_path)
        self.set_state(state, allow_partial=allow_partial, source=f"checkpoint {str(checkpoint_path)!r}")

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
                raise CheckpointError(f"checkpoint {str(checkpoint_path)!r} has no {key!r}: not a flowrl Trainer checkpoint")
        trainer = cls(state["algo"], state["env"], {**state["config"], **(config_overrides or {})}, address=address)
        try:
            trainer.set_state(state, allow_partial=allow_partial, source=f"checkpoint {str(checkpoint_path)!r}")
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
        for step in (self.resources.stop, self.evaluator.stop, self.workers.stop):
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
            raise FlowRLError("Trainer.stop(): everything was released, but:\n" + "\n".join(f"  - {p}" for p in problems))

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


# Version 1 keyed operator state by "<position>:<label>" and kept the replay buffers' state
# there; version 2 keys operators by their state_key and keeps replay state under "resources";
# version 3 adds the spaces, the remote workers' and the samplers' states (read where present).
_V1_OPERATOR_KEYS = {"CollectMetrics": "collect_metrics", "MixInReplay": "mix_in_replay"}


def upgraded_state(state: Mapping[str, Any]) -> dict[str, Any]:
    """A Trainer state (``get_state``'s output) in this version's layout.

    A version-1 state (written before plans got their resources) keeps everything: its
    replay buffers' state moves to ``resources`` and its operators' state to their keys.
    Raises :class:`~flowrl.errors.CheckpointError` for a version this flowrl cannot read.
    """
    version = state.get("version", 1)
    if version not in (1, 2, CHECKPOINT_VERSION):
        raise CheckpointError(f"the checkpoint's layout is version {version!r}; this flowrl reads versions 1 to {CHECKPOINT_VERSION}")
    if version != 1:
        return {**state, "version": CHECKPOINT_VERSION, "upgraded_from": version}
    operators: dict[str, Any] = {}
    resources: dict[str, Any] = {}
    for key, op_state in state["plan"].get("operators", {}).items():
        label = key.partition(":")[2]
        if "StoreToReplayBuffer" in label:
            resources.update({"replay_buffer": op_state["buffer"]} if "buffer" in op_state else {"replay_shards": op_state["shards"]})
        for name, state_key in _V1_OPERATOR_KEYS.items():
            if name in label:  # numbered as Plan numbers repeated keys, in dataflow order
                repeats = sum(1 for k in operators if k.partition("#")[0] == state_key)
                operators[f"{state_key}#{repeats}" if repeats else state_key] = op_state
    return {**state, "version": CHECKPOINT_VERSION, "upgraded_from": 1, "plan": {**state["plan"], "operators": operators},
            "resources": resources}


def validated_config(algorithm: Algorithm, config: Mapping[str, Any] | TrainerConfig | None) -> TrainerConfig:
    """``config`` as ``algorithm``'s frozen config (every problem in one :class:`~flowrl.errors.ConfigError`)."""
    if isinstance(config, TrainerConfig):
        config = config.to_dict(jsonable=False)
    settings = algorithm.config_class.from_dict(config).frozen()
    if settings.num_learners >= 2 and not algorithm.learner_group:
        able = [name for name in list_algorithms() if get_algorithm(name).learner_group]
        raise ConfigError([f"num_learners={settings.num_learners}: {algorithm.name!r} does not train in a learner group "
                           f"(its plan learns in the driver or on the rollout workers); algorithms that do: {', '.join(able)}"])
    return settings


def plan_bundles(algorithm: Algorithm, config: TrainerConfig) -> list[BundleRequest]:
    """What the plan's actors besides the rollout workers ask Ray for: the algorithm's (replay shards,
    aggregators), the learner group's and the evaluation workers'."""
    return [*algorithm.bundles(config), learner_request(config), evaluation_request(config)]


def make_workers(algorithm: Algorithm, config: TrainerConfig, env_creator: EnvCreator, bundles: list[BundleRequest]) -> WorkerSet:
    """The run's rollout workers: a local one and ``config.num_workers`` remote ones, reserved with ``bundles``."""
    return WorkerSet(
        env_creator=env_creator,
        policy_specs=policy_specs(algorithm, config, env_creator),
        config=config,
        num_workers=config.num_workers,
        num_cpus_per_worker=config.num_cpus_per_worker,
        recreate_failed_workers=config.recreate_failed_workers,
        check_env=config.check_env,
        bundles=bundles,
    )


def build_plan(algorithm: Algorithm, workers: WorkerSet, config: TrainerConfig, resources: PlanResources) -> Plan:
    """``algorithm``'s execution plan over ``workers`` and ``resources``, with its graph recorded."""
    return Plan(algorithm.execution_plan(workers, config, resources), name=algorithm.name)


def policy_specs(algorithm: Algorithm, config: TrainerConfig, env_creator: Callable[[dict[str, Any]], Any]) -> dict[str, PolicySpec]:
    """The policies to build for ``env_creator``'s env: ``default_policy`` for a Gymnasium env; for
    a multi-agent env, ``config.policies`` with spaces from the agents mapped to each.

    Problems a user can cause (a mapping to an unknown policy, agents of one policy with
    different spaces, ``policies`` on a single-agent env) raise one :class:`~flowrl.errors.ConfigError`.
    """
    probe = env_creator(EnvContext(config.env_config, num_workers=config.num_workers))
    try:
        if not is_multi_agent_env(probe):
            if config.policies:
                raise ConfigError(
                    [f"policies={sorted(config.policies)} needs a multi-agent env, but {type(probe).__name__} is a single-agent Gymnasium env"]
                )
            return {DEFAULT_POLICY_ID: algorithm.make_policy(probe.observation_space, probe.action_space, config)}
        if not algorithm.multi_agent:
            able = [name for name in list_algorithms() if get_algorithm(name).multi_agent]
            raise ConfigError(
                [f"algorithm {algorithm.name!r} trains single-agent envs, but {type(probe).__name__} is multi-agent; "
                 f"algorithms for multi-agent envs: {', '.join(able)}"]
            )
        spaces = multi_agent_policy_spaces(probe, config)
    finally:
        close_env(probe)
    if algorithm.make_policies is not None:
        return algorithm.make_policies(spaces, config)
    policy_keys = config.per_policy_keys()
    problems = [
        f"policies[{pid!r}]['config'] sets {key!r}, which is not a policy key; per-policy keys are {sorted(policy_keys)}"
        for pid, spec in config.policies.items()
        for key in (spec or {}).get("config", {})
        if key not in policy_keys
    ]
    if problems:
        raise ConfigError(problems)
    specs = {}
    for pid, (observation_space, action_space) in spaces.items():
        specs[pid] = algorithm.make_policy(observation_space, action_space, config.for_policy(pid))
    return specs


def multi_agent_policy_spaces(env: Any, config: TrainerConfig) -> dict[str, tuple[gym.Space, gym.Space]]:
    """Each policy's (observation space, action space): given in ``config.policies``, else those of
    the agents ``config.policy_mapping_fn`` maps to it, which must all agree."""
    policy_ids = list(config.policies) or [DEFAULT_POLICY_ID]
    problems: list[str] = []
    try:
        mapping = policy_mapping(config.policy_mapping_fn, policy_ids)
    except FlowRLError as e:
        raise ConfigError([str(e)]) from None
    found: dict[str, tuple[gym.Space, gym.Space, Any]] = {}
    for pid in policy_ids:
        given = config.policies.get(pid) or {}
        if "observation_space" in given and "action_space" in given:
            found[pid] = (given["observation_space"], given["action_space"], "its policies entry")
    for agent in env.possible_agents:
        pid = mapping(agent)
        if pid not in policy_ids:
            problems.append(f"policy_mapping_fn({agent!r}) returned {pid!r}, which is not a policy; the policies are {policy_ids}")
            continue
        agent_spaces = (env.observation_space(agent), env.action_space(agent))
        if pid not in found:
            found[pid] = (*agent_spaces, f"agent {agent!r}")
            continue
        for kind, mine, theirs in (("observation", agent_spaces[0], found[pid][0]), ("action", agent_spaces[1], found[pid][1])):
            if mine != theirs:
                problems.append(
                    f"the {kind} space of agent {agent!r}, {mine}, does not match that of policy {pid!r}, {theirs} (from {found[pid][2]})"
                )
    mapping_failed = bool(problems)
    for pid in policy_ids:
        if pid not in found and not mapping_failed:  # after a bad mapping this would only add noise
            problems.append(f"no agent maps to policy {pid!r}: give its 'observation_space' and 'action_space' in policies[{pid!r}]")
    if problems:
        raise ConfigError(problems)
    return {pid: (found[pid][0], found[pid][1]) for pid in policy_ids}


def evaluate_checkpoint(
    checkpoint_path: str | Path, num_episodes: int = 10, seed: int | None = None, *, video_dir: str | Path | None = None
) -> dict[str, Any]:
    """Evaluate a Trainer checkpoint's policy without Ray or rollout workers (deterministic actions).

    Returns the episode statistics plus the checkpoint's ``algo``, ``env`` and ``iteration``.
    With ``video_dir``, each episode is recorded there as an MP4 file (``pip install 'flowrl-ray[video]'``).
    """
    state, _ = read_checkpoint(checkpoint_path)
    for key in ("algo", "env", "config", "worker"):
        if key not in state:
            raise CheckpointError(f"checkpoint {str(checkpoint_path)!r} has no {key!r}: not a flowrl Trainer checkpoint")
    algorithm = get_algorithm(state["algo"])
    config = algorithm.config_class.from_dict(state["config"])
    policy_map = {}
    for pid, spec in policy_specs(algorithm, config, get_env_creator(state["env"])).items():
        policy_map[pid] = spec.build()
        policy_map[pid].set_state(state["worker"]["policies"][pid])
    obs_filter = None
    if state["worker"].get("obs_filter") is not None:  # the run filtered observations: so does its evaluation
        obs_filter = MeanStdFilter()
        obs_filter.set_state(state["worker"]["obs_filter"])
    stats = evaluate_policies(policy_map, state["env"], config, num_episodes, seed, video_dir=video_dir, obs_filter=obs_filter)
    return {**stats, "algo": state["algo"], "env": state["env"], "iteration": state["iteration"]}
