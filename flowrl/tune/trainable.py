"""flowrl algorithms as Ray Tune trainables (Tune's class API).

A trial is a :class:`~flowrl.Trainer`: ``step`` is one ``Trainer.train()`` and returns its result
dict, checkpoints are flowrl checkpoints, and the trial asks Tune for its plan's placement group
(:func:`trial_resources`), which the Trainer's reservation then adopts. Each trial directory
holds the plan's ``plan.json`` and the traces of the iterations ``trace_iterations`` names (as a
run directory does), and with :class:`RunDirectoryLogger` among a Tuner's callbacks flowrl's
``params.json`` and ``progress.jsonl`` beside Tune's files and checkpoints: ``flowrl plan``,
``flowrl doctor`` and ``flowrl trace`` read a trial directory as they read a run directory.

PBT: when a trial exploits another's checkpoint with mutated hyperparameters, keys the algorithm
can change live (:func:`live_keys`) are applied to the running trainer; any other change
replaces the trial's trainer with a new one, into which Tune restores the checkpoint.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import ray
from ray import tune
from ray.tune import PlacementGroupFactory
from ray.tune.experiment import Trial
from ray.tune.logger import JsonLoggerCallback

from flowrl.actors.placement import trial_bundles, worker_request
from flowrl.algorithms import get_algorithm
from flowrl.engine.build import plan_bundles
from flowrl.engine.trainer import Trainer
from flowrl.errors import CheckpointError, FlowRLError
from flowrl.plan.trace import traced_window, train_iteration, write_plan
from flowrl.policy.schedules import SCHEDULES
from flowrl.storage.checkpoints import list_checkpoints
from flowrl.storage.rundir import PARAMS_FILE, PROGRESS_FILE, RunSpec, json_safe

#: Config keys a live value ends (``Trainer.update_config``): the schedules.
ENDED_BY_LIVE = frozenset(SCHEDULES.values())
#: CPUs a trial's trainable (the driver: local worker and learner) gets when ``num_cpus_for_driver`` is 0:
#: Tune runs it as an actor in the trial's first bundle, which must ask for something.
TRIAL_DRIVER_CPUS = 1.0


def live_keys(algo: str) -> frozenset[str]:
    """The config keys a running ``algo`` trainer can change (PBT applies them without a restart)."""
    return get_algorithm(algo).live_keys


def trial_resources(algo: str, config: Mapping[str, Any]) -> PlacementGroupFactory:
    """What a trial of ``algo`` with ``config`` asks Tune for: its plan's placement group.

    The first bundle is the trainable's (``num_cpus_for_driver``, else :data:`TRIAL_DRIVER_CPUS`;
    ``num_gpus`` when the cluster has GPUs), then one per rollout worker, per actor the
    algorithm declares, per learner actor and per evaluation worker, laid out by
    ``placement_strategy``. Invalid keys raise :class:`~flowrl.errors.ConfigError`.
    """
    algorithm = get_algorithm(algo)
    cfg = algorithm.config_class.from_dict(dict(config))
    driver = {"CPU": cfg.num_cpus_for_driver or TRIAL_DRIVER_CPUS}
    if cfg.num_gpus > 0 and ray.is_initialized() and ray.cluster_resources().get("GPU", 0.0) > 0:
        driver["GPU"] = cfg.num_gpus
    requests = [worker_request(cfg, cfg.num_workers, cfg.num_cpus_per_worker), *plan_bundles(algorithm, cfg)]
    return PlacementGroupFactory(trial_bundles(requests, driver), strategy=cfg.placement_strategy)


class FlowRLTrainable(tune.Trainable):
    """One trial: a Trainer for :attr:`algo` on :attr:`env` with the trial's config (see the module docs).

    Made per algorithm and env by :func:`trainable_for`.
    """

    algo: ClassVar[str]
    env: ClassVar[str]

    def setup(self, config: dict[str, Any]) -> None:
        self.trainer = Trainer(self.algo, self.env, dict(config))
        self._trial_config = dict(config)  # as Tune gave it: Tune sets self.config before reset_config
        write_plan(self.logdir, self.trainer)
        self._traced = traced_window(self.trainer)
        self._trial = self.trial_id
        self._config_change = "initial"
        # Set when this actor takes over another trial: unless Tune restores that trial's
        # checkpoint next, its trainer must start afresh, not from the weights trained here.
        self._needs_fresh_trainer = False

    def step(self) -> dict[str, Any]:
        if self._needs_fresh_trainer:
            self._rebuild(self.config)
        result: dict[str, Any] = json_safe(train_iteration(self.trainer, self.logdir, self._traced))
        # The trial's hyperparameters as they are now: PBT's mutations show in every result.
        result["config"] = json_safe(dict(self.config))
        result.setdefault("info", {})["tune"] = {"config_change": self._config_change}
        return result

    def save_checkpoint(self, checkpoint_dir: str) -> None:
        self.trainer.save(checkpoint_dir)

    def load_checkpoint(self, checkpoint: str | dict[str, Any] | None) -> None:
        if not isinstance(checkpoint, str):
            raise CheckpointError(
                f"a flowrl trial restores from a checkpoint directory, not {type(checkpoint).__name__}"
            )
        found = list_checkpoints(Path(checkpoint))
        if not found:
            raise CheckpointError(f"Tune checkpoint {checkpoint!r} holds no flowrl checkpoint")
        self.trainer.restore(found[-1])
        self._needs_fresh_trainer = False

    def reset_config(self, new_config: dict[str, Any]) -> bool:
        """Take a new config without a new actor: PBT's mutated hyperparameters, or another trial's.

        If every changed key is one the algorithm can change live, the running trainer takes
        them (Tune then restores the trial's checkpoint into it, if it has one); otherwise the
        trainer is replaced by a new one built from ``new_config``. Each result says which in
        ``result["info"]["tune"]["config_change"]``: ``initial``, ``live`` or ``rebuilt``. A live
        ``lr`` ends ``lr_schedule`` (see :meth:`~flowrl.Trainer.update_config`), which stays ended while
        the trial's config keeps the schedule it had.
        """
        current, previous = self.trainer.config.to_dict(jsonable=False), self._trial_config
        self._trial_config = dict(new_config)
        changes = {
            key: value
            for key, value in new_config.items()
            # A schedule that a live value ended here is no change while the trial's config has it as before.
            if current.get(key) != value
            and not (key in ENDED_BY_LIVE and current.get(key) is None and previous.get(key) == value)
        }
        if not set(changes) <= self.trainer.algorithm.live_keys:
            self._rebuild(new_config)
            return True
        self.trainer.update_config(changes)
        write_plan(self.logdir, self.trainer)  # Tune has made the (new) trial's directory
        self._config_change = "live"
        self._needs_fresh_trainer = self.trial_id != self._trial
        self._trial = self.trial_id
        return True

    def _rebuild(self, config: dict[str, Any]) -> None:
        self.trainer.stop()
        self.setup(config)
        self._config_change = "rebuilt"

    def cleanup(self) -> None:
        self.trainer.stop()

    @classmethod
    def default_resource_request(cls, config: dict[str, Any]) -> PlacementGroupFactory:
        return trial_resources(cls.algo, config)


class RunDirectoryLogger(JsonLoggerCallback):
    """Tune's JSON logger (``result.json``, ``params.pkl``) that also keeps each trial directory a
    flowrl run directory: ``params.json`` (algo, env and the trial's config, rewritten when PBT
    changes it) and ``progress.jsonl`` (one result per line), which ``flowrl`` commands read.

    Being a :class:`~ray.tune.logger.JsonLoggerCallback`, it takes the place of the one Tune adds.
    """

    def update_config(self, trial: Trial, config: dict[str, Any]) -> None:
        super().update_config(trial, config)
        trainable = trial.get_trainable_cls()
        spec = RunSpec(getattr(trainable, "algo", trial.trainable_name), getattr(trainable, "env", ""), config)
        (_trial_dir(trial) / PARAMS_FILE).write_text(json.dumps(json_safe(spec.to_params()), indent=2) + "\n")

    def log_trial_start(self, trial: Trial) -> None:
        super().log_trial_start(trial)
        # A resumed experiment stages its trial directories afresh: take the results written
        # before the interruption from the experiment directory, as Tune does for result.json.
        if not (_trial_dir(trial) / PROGRESS_FILE).exists():
            self._restore_from_remote(PROGRESS_FILE, trial)

    def log_trial_result(self, iteration: int, trial: Trial, result: dict[str, Any]) -> None:
        super().log_trial_result(iteration, trial, result)
        with open(_trial_dir(trial) / PROGRESS_FILE, "a") as f:
            f.write(json.dumps(json_safe(result)) + "\n")


def _trial_dir(trial: Trial) -> Path:
    if trial.local_path is None:  # Tune sets it before a trial starts
        raise FlowRLError(f"Tune trial {trial} has no directory yet")
    return Path(trial.local_path)


def trainable_for(algo: str, env: str) -> type[FlowRLTrainable]:
    """A Tune trainable class training ``algo`` on ``env`` (Tune's ``config``: the algorithm's config keys)."""
    name = get_algorithm(algo).name
    return type(f"flowrl_{name}", (FlowRLTrainable,), {"algo": name, "env": env, "__module__": __name__})
