"""A Trainer's state: what a checkpoint holds (:meth:`TrainerState.get_state`, or only weights and counters:
:meth:`TrainerState.get_weights_state`), restoring it, checked first (:meth:`TrainerState.set_state`,
:meth:`TrainerState.restore`), writing it (:meth:`TrainerState.save`, :meth:`TrainerState.save_weights`), and
the upgrade of older checkpoint layouts (:func:`upgraded_state`)."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from flowrl.actors import PlanResources, WorkerSet
from flowrl.actors.rng import process_rng_state, set_process_rng_state
from flowrl.algorithms import Algorithm
from flowrl.callbacks import Callbacks, run_hook
from flowrl.config import TrainerConfig
from flowrl.engine.build import EnvSpec
from flowrl.engine.evaluator import Evaluator
from flowrl.engine.pretrain import OfflinePhases
from flowrl.engine.restore import Layout, check_restore, state_layout
from flowrl.errors import CheckpointError, RunWarning
from flowrl.operators import STEPS_SAMPLED_COUNTER, STEPS_TRAINED_COUNTER
from flowrl.plan.graph import Plan
from flowrl.serve.inference import policy_files
from flowrl.storage.checkpoints import FULL_KIND, KIND_KEY, WEIGHTS_KIND, read_checkpoint, write_checkpoint

CHECKPOINT_VERSION = 3

logger = logging.getLogger(__name__)


class TrainerState:
    """The checkpoint side of :class:`~flowrl.engine.trainer.Trainer`, which mixes it in: reading, saving
    and restoring everything a run needs to resume.

    It reads and writes these attributes of the trainer, which ``Trainer.__init__`` sets.
    """

    algorithm: Algorithm
    env: EnvSpec
    config: TrainerConfig
    workers: WorkerSet
    resources: PlanResources
    plan: Plan
    evaluator: Evaluator
    phases: OfflinePhases
    callbacks: Callbacks
    iteration: int
    time_total_s: float
    restore_report: dict[str, Any] | None
    _finished_metrics: tuple[dict[str, int], dict[str, Any]]
    _learner_steps_taken: int
    #: Periodic checkpoints of the whole run that failed (counted by :mod:`flowrl.runs.saving`, kept in checkpoints).
    num_failed_checkpoints: int = 0

    def get_state(self, *, replay: bool = True) -> dict[str, Any]:
        """Everything needed to resume: config, spaces, weights, optimizer and exploration state,
        counters, RNGs, the envs' episodes in progress in every rollout worker, and the plan's
        resources (replay buffers; without them with ``replay=False``: :meth:`save` streams them to
        the checkpoint's files, see :meth:`~flowrl.actors.PlanResources.write_replay`).

        A learner thread is paused while the state is read, so weights and counters agree.
        """
        remote = self.workers.get_remote_states()  # first: they may wait for samples in flight
        local = self.workers.local_worker()
        with local.lock:  # not halfway through a learner thread's step; it waits until we are done
            return {
                **self._driver_state(replay=replay),
                "worker": local.get_state(),
                "remote_workers": remote,
            }

    def get_weights_state(self) -> dict[str, Any]:
        """:meth:`get_state` without what is slow to gather or large (``"kind": "weights"``): the local
        policies' states (weights, optimizer and exploration state, target networks), the observation
        filter, counters, iteration, config and RNGs, read in this process without asking any actor.

        Left out, and fresh on restore: replay buffers, the envs and their episodes in progress, and the
        remote rollout workers' exploration state (their epsilon follows the restored timestep).
        """
        local = self.workers.local_worker()
        with local.lock:
            return {
                **self._driver_state(replay=False),
                KIND_KEY: WEIGHTS_KIND,
                "worker": {
                    "policies": {pid: p.get_state() for pid, p in local.policy_map.items()},
                    "obs_filter": None if local.obs_filter is None else local.obs_filter.get_state(),
                },
            }

    def _driver_state(self, *, replay: bool) -> dict[str, Any]:
        """What both kinds of state read in the driver (under the local worker's lock): identity, config,
        counters, restarts, the plan's metrics, the resources (their replay contents with ``replay``),
        the evaluation and the RNGs."""
        local = self.workers.local_worker()
        return {
            "version": CHECKPOINT_VERSION,
            "algo": self.algorithm.name,
            "env": self.env,
            "config": self.config.to_dict(jsonable=False),
            "iteration": self.iteration,
            "time_total_s": self.time_total_s,
            "spaces": {pid: (p.observation_space, p.action_space) for pid, p in local.policy_map.items()},
            "num_worker_restarts": self.workers.num_worker_restarts,
            "worker_restart_times": self.workers.restart_budget.get_state(),
            "num_failed_checkpoints": self.num_failed_checkpoints,
            "plan": {**self.plan.get_state(), "metrics": self._checkpoint_metrics()},
            "resources": self.resources.get_state(replay=replay),
            "evaluation": self.evaluator.get_state(),
            "offline_phases": self.phases.get_state(),
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
            weight_shapes={
                pid: {k: tuple(v.shape) for k, v in p.get_weights().items()} for pid, p in local.policy_map.items()
            },
            target_networks=frozenset(
                pid for pid, p in local.policy_map.items() if getattr(p, "target_model", None) is not None
            ),
            operators=self.plan.state_keys(),
            replay_shards=len(self.resources.replay_actors),
            replay_buffer=self.resources.replay_buffer is not None,
        )

    def _warn_weights_only(self, source: str) -> None:
        replay = " with empty replay buffers" if self.resources.replay_buffer or self.resources.replay_actors else ""
        warnings.warn(
            f"{source} holds weights and counters only (written when a signal ended the run, before the full "
            f"state could be saved): training goes on from iteration {self.iteration}{replay}, and the envs "
            f"start new episodes; the optimizer state and the counters are restored",
            RunWarning,
            stacklevel=3,
        )

    def set_state(
        self,
        state: Mapping[str, Any],
        *,
        allow_partial: bool = False,
        source: str = "the checkpoint",
        checkpoint_dir: Path | None = None,
    ) -> None:
        """Restore :meth:`get_state`'s output into this trainer; older layouts are upgraded. Replay rows
        a save wrote to the checkpoint's own files are read back from ``checkpoint_dir``.

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
            raise CheckpointError(
                f"{source} does not fit this trainer:\n" + "\n".join(f"  - {m}" for m in check.mismatches)
            )
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
        self.resources.set_state(state["resources"], allow_partial=allow_partial, directory=checkpoint_dir)
        if self.resources.learners is not None:  # the replicas learn from the restored policies
            with local.lock:
                self.resources.learners.sync()
        self.evaluator.set_state(state.get("evaluation", {}))
        self._finished_metrics = self.plan.metrics.save()
        learner = self.resources.learner
        self._learner_steps_taken = (
            learner.num_steps_trained - learner.steps_not_delivered() if learner is not None else 0
        )
        self.iteration = int(state["iteration"])
        self.time_total_s = float(state["time_total_s"])
        # The whole run's restarts, and those of them in the window max_worker_restarts caps (which goes
        # on across resumed sessions; this trainer's config says the cap and the window).
        self.workers.num_worker_restarts = int(state.get("num_worker_restarts", 0))
        self.workers.restart_budget.set_state(state.get("worker_restart_times", []))
        self.num_failed_checkpoints = int(state.get("num_failed_checkpoints", 0))
        set_process_rng_state(state["rng"])
        self.phases.set_state(state.get("offline_phases", {}))  # after the policies: pretraining goes on from them
        timestep = self.plan.metrics.counters[STEPS_SAMPLED_COUNTER]
        self.workers.sync_weights(global_vars={"timestep": timestep})
        fresh.update(self.workers.set_remote_states(state.get("remote_workers", {})))
        restarted = {index: envs for index, envs in fresh.items() if envs}
        weights_only = state.get(KIND_KEY) == WEIGHTS_KIND
        self.restore_report = {
            "checkpoint": source,
            "iteration": self.iteration,
            KIND_KEY: WEIGHTS_KIND if weights_only else FULL_KIND,
            "config_overrides": check.overrides,
            "partial": check.partial,
            "envs_restarted": restarted,
        }
        if weights_only:
            self._warn_weights_only(source)
        if restarted:
            logger.warning(
                "restored from %s, but these envs (worker index: vector indices) could not be restored "
                "mid-episode and started new episodes: %s (an env saved without its state, or whose saved "
                "state does not load here: each worker's log names which)",
                source,
                restarted,
            )

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
        return self._write(checkpoint_dir, lambda: self.get_state(replay=False), FULL_KIND, metadata)

    def save_weights(self, checkpoint_dir: str | Path) -> str:
        """Write a checkpoint of :meth:`get_weights_state` under ``checkpoint_dir`` (atomically, with the
        portable policy files) and return its path: what a run saves first when a signal ends it.

        Its ``metadata.json`` says ``"kind": "weights"``. It asks no actor and pickles no replay buffer,
        so its time depends only on the size of the policies. :func:`flowrl.load_policy`, ``flowrl
        evaluate`` and ``flowrl export`` read it as any checkpoint; :meth:`restore` resumes from it
        with a :class:`~flowrl.errors.RunWarning` naming what starts afresh.
        """
        return self._write(checkpoint_dir, self.get_weights_state, WEIGHTS_KIND, None)

    def _write(
        self,
        checkpoint_dir: str | Path,
        get_state: Callable[[], dict[str, Any]],
        kind: str,
        metadata: Mapping[str, Any] | None,
    ) -> str:
        path = Path(checkpoint_dir) / f"checkpoint_{self.iteration:06d}"
        metadata = {
            **(metadata or {}),
            KIND_KEY: kind,
            "algo": self.algorithm.name,
            "env": self.env if isinstance(self.env, str) else repr(self.env),
            "iteration": self.iteration,
            "timesteps_total": self._finished_metrics[0].get(STEPS_SAMPLED_COUNTER, 0),
            "config": self.config.to_dict(),
        }
        local = self.workers.local_worker()
        with local.lock:  # the portable weights are the same moment's as the state's
            state = get_state()
            try:
                files = policy_files(local.policy_map, self.algorithm.name, self.config, local.obs_filter)
            except CheckpointError as e:  # an exotic space JSON cannot describe: the full checkpoint still counts
                logger.warning("checkpoint %s: no portable policy files (load_policy cannot read it): %s", path, e)
                files = {}
        # A full checkpoint's replay rows go from the buffers straight to its files, never copied whole.
        replay = {"resources": lambda tmp: self.resources.write_replay(state["resources"], tmp)}
        streams = replay if kind == FULL_KIND else None
        saved = str(write_checkpoint(path, state, metadata, files=files, streams=streams))
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
        source = f"checkpoint {str(checkpoint_path)!r}"
        self.set_state(state, allow_partial=allow_partial, source=source, checkpoint_dir=Path(checkpoint_path))


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
        raise CheckpointError(
            f"the checkpoint's layout is version {version!r}; this flowrl reads versions 1 to {CHECKPOINT_VERSION}"
        )
    if version != 1:
        return {**state, "version": CHECKPOINT_VERSION, "upgraded_from": version}
    operators: dict[str, Any] = {}
    resources: dict[str, Any] = {}
    for key, op_state in state["plan"].get("operators", {}).items():
        label = key.partition(":")[2]
        if "StoreToReplayBuffer" in label:
            resources.update(
                {"replay_buffer": op_state["buffer"]} if "buffer" in op_state else {"replay_shards": op_state["shards"]}
            )
        for name, state_key in _V1_OPERATOR_KEYS.items():
            if name in label:  # numbered as Plan numbers repeated keys, in dataflow order
                repeats = sum(1 for k in operators if k.partition("#")[0] == state_key)
                operators[f"{state_key}#{repeats}" if repeats else state_key] = op_state
    return {
        **state,
        "version": CHECKPOINT_VERSION,
        "upgraded_from": 1,
        "plan": {**state["plan"], "operators": operators},
        "resources": resources,
    }
