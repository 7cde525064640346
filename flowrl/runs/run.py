"""A run: the Trainer that writes a run directory, and the loop that trains until a stop criterion.

The run directory's files, the :class:`~flowrl.storage.rundir.RunSpec` in its ``params.json`` and the
stop criteria are :mod:`flowrl.storage.rundir`'s. Start one, train it, and read its summary::

    from flowrl.runs.run import start_run
    from flowrl.storage.rundir import RunSpec

    spec = RunSpec("ppo", "CartPole-v1", {"num_workers": 0}, stop={"training_iteration": 10}, checkpoint_freq=5)
    with start_run(spec, results_dir="flowrl_results") as run:
        summary = run.train(on_result=lambda result: print(result["episode_reward_mean"]))
    print(summary.stop_reason, summary.best_reward, summary.checkpoint)

Runs are not lost. :meth:`Run.train` checkpoints every ``checkpoint_freq`` iterations and every
``checkpoint_interval_s`` seconds (10 minutes by default), keeps the newest ``keep_checkpoints``
of them (and, with ``keep_best``, a copy of the best), and saves at the end; a periodic save that fails
is counted in ``num_failed_checkpoints`` and training goes on (see :mod:`flowrl.runs.saving`). Ctrl-C,
SIGTERM and SIGHUP end training with a checkpoint of weights and counters, then the full state within
``preemption_grace_s``, and a summary naming the signal (:attr:`RunSummary.interrupted_by`;
see :mod:`flowrl.runs.signals`); an error ends it with an emergency checkpoint when the Trainer's
state is intact, described in :attr:`Run.failure`, and then propagates. :mod:`flowrl.runs.resume`
continues a run from its latest usable checkpoint.

The ``flowrl train`` command is a shell over this module; it only parses flags and prints.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flowrl.errors import RunError, RunWarning
from flowrl.outputs.loggers import ResultLogger, check_trackers, open_loggers
from flowrl.plan.trace import traced_window, train_iteration, write_plan
from flowrl.runs.saving import RunSaving
from flowrl.runs.signals import interrupt_signal, interrupting_signals, signal_received_at
from flowrl.storage.lock import RunLock, RunLockedError
from flowrl.storage.results import finite_number
from flowrl.storage.rundir import (
    EVALUATION_REWARD,
    PRIVATE_UMASK,
    PROGRESS_FILE,
    VIDEOS_DIR,
    RunSpec,
    _write_params,
    applied_umask,
    json_safe,
    open_run_dir,
    run_parent,
    stop_reason,
)
from flowrl.storage.shared import check_storage_path

if TYPE_CHECKING:  # the Trainer imports torch: load it only when a run starts
    from typing_extensions import Self

    from flowrl.engine.trainer import Trainer


@dataclass(frozen=True)
class RunSummary:
    """How :meth:`Run.train` ended.

    ``stop_reason`` is the stop criterion met (``"timesteps_total 192 >= 150"``), or None
    when a signal ended training: ``interrupted_by`` says which (``signal.SIGINT`` for Ctrl-C,
    ``SIGTERM``, ``SIGHUP``). ``best_reward`` / ``best_iteration`` are the highest finite
    ``episode_reward_mean`` of the whole run (earlier sessions of a resumed run included) and
    its iteration. ``checkpoint`` is the last complete checkpoint (None if no iteration
    finished); ``save_interrupted`` says a second signal cut the final checkpoint short
    (``interrupted_by`` is then the first signal, or the one that cut it short when a stop
    criterion had ended training). ``weights_only`` says ``checkpoint`` holds weights and counters
    only: after a signal, the full state could not be saved (in time, or at all); a resume starts
    with empty replay buffers.
    """

    directory: Path
    stop_reason: str | None
    best_reward: float | None
    best_iteration: int | None
    checkpoint: Path | None
    save_interrupted: bool = False
    interrupted_by: signal.Signals | None = None
    weights_only: bool = False

    @property
    def interrupted(self) -> bool:
        """Whether a signal (Ctrl-C, SIGTERM, SIGHUP), not a stop criterion, ended training."""
        return self.stop_reason is None


@dataclass(frozen=True)
class RunFailure:
    """What :meth:`Run.train` saved when an error ended training (it is :attr:`Run.failure`, then the error propagates).

    ``error`` is the exception. ``checkpoint`` is the run's last complete checkpoint after it
    (None if there is none): the one just written when ``saved``, else an earlier one.
    ``not_saved_because`` says why no checkpoint was written for the error (the Trainer's
    state is not intact, the save itself failed or was interrupted), or is None when one was,
    or when the last finished iteration was already saved (or none finished).
    """

    error: BaseException
    checkpoint: Path | None
    saved: bool
    not_saved_because: str | None = None


def _default_keep_best(keep_best: str | None, evaluation_interval: int | None) -> str | None:
    """``keep_best`` as given, else :data:`~flowrl.storage.rundir.EVALUATION_REWARD` for a run that evaluates
    during training."""
    return EVALUATION_REWARD if keep_best is None and evaluation_interval else keep_best


def _better(best: tuple[float, int] | None, result: Mapping[str, Any]) -> tuple[float, int] | None:
    """``best`` or ``result``'s ``(episode_reward_mean, training_iteration)``, whichever reward is higher."""
    reward = finite_number(result.get("episode_reward_mean"))
    if reward is None or (best is not None and reward <= best[0]):
        return best
    return reward, int(result.get("training_iteration") or 0)


# --- a run in progress ------------------------------------------------------------------------------


class Run:
    """A run directory and the Trainer writing it; made by :func:`start_run` or :func:`~flowrl.runs.resume.resume_run`.

    ``directory`` is the run directory, ``spec`` what ``params.json`` holds, ``trainer``
    the :class:`~flowrl.engine.trainer.Trainer`, ``checkpoint`` the latest complete checkpoint
    (None until one is saved), ``resumed_from`` the checkpoint a resumed run started from
    (never deleted by rotation), and ``failure`` what was saved when an error ended
    :meth:`train` (None otherwise). ``loggers`` get every result (TensorBoard, ``progress.csv``,
    the trackers: see :func:`~flowrl.outputs.loggers.open_loggers`); append your own
    :class:`~flowrl.outputs.loggers.ResultLogger` to add one. :meth:`close` (or leaving a ``with`` block)
    closes the loggers, stops the Trainer and releases ``lock``, the run directory's
    :class:`~flowrl.storage.lock.RunLock` (one driver at a time writes a run). Files are written under
    ``umask`` (:data:`~flowrl.storage.rundir.PRIVATE_UMASK`: private; None: the process's own).
    """

    def __init__(
        self,
        directory: Path,
        spec: RunSpec,
        trainer: Trainer,
        *,
        checkpoint: Path | None = None,
        previous_results: Sequence[Mapping[str, Any]] = (),
        loggers: Sequence[ResultLogger] = (),
        lock: RunLock | None = None,
        umask: int | None = PRIVATE_UMASK,
    ) -> None:
        self.directory = directory
        self.lock = lock
        self.umask = umask
        self.spec = spec
        self.trainer = trainer
        self.loggers = list(loggers)
        self._failed_loggers: set[int] = set()  # id() of the loggers already warned about
        #: The run's checkpoints: when they are due, rotation, failed saves (see :mod:`flowrl.runs.saving`).
        self.saving = RunSaving(directory, spec, trainer, checkpoint)
        self.failure: RunFailure | None = None
        self._best: tuple[float, int] | None = None
        for result in previous_results:
            self._best = _better(self._best, result)
        self._traced = traced_window(trainer)

    @property
    def checkpoint(self) -> Path | None:
        """The latest complete checkpoint (None until one is saved)."""
        return self.saving.checkpoint

    @property
    def resumed_from(self) -> Path | None:
        """The checkpoint a resumed run started from (never deleted by rotation), or None."""
        return self.saving.resumed_from

    @property
    def best(self) -> tuple[float, int] | None:
        """``(reward, iteration)``: the highest finite ``episode_reward_mean`` of the whole run so far, or None."""
        return self._best

    @property
    def timesteps_total(self) -> int:
        """Env steps sampled so far in the whole run, resumed sessions included."""
        from flowrl.operators import STEPS_SAMPLED_COUNTER

        return int(self.trainer.plan.metrics.counters[STEPS_SAMPLED_COUNTER])

    def train(self, on_result: Callable[[dict[str, Any]], None] | None = None) -> RunSummary:
        """Train until a stop criterion is met (at least one iteration) or a signal; return how it ended.

        Each result is appended to ``progress.jsonl`` (and the spans of the iterations the config's
        ``trace_iterations`` names to ``trace/``, see :mod:`flowrl.plan.trace`), logged by :attr:`loggers` (a logger
        that raises is reported with a :class:`~flowrl.errors.RunWarning`, once, and training goes on) and
        then given to ``on_result``.
        Checkpoints follow ``spec`` (see :class:`~flowrl.storage.rundir.RunSpec`); each successful save is followed
        by the rotation to ``spec.keep_checkpoints`` and the ``keep_best`` copy, while a
        save that raises deletes nothing; a periodic save that fails on the disk or the checkpoint
        files is a :class:`~flowrl.errors.RunWarning`, counted in every later result's ``num_failed_checkpoints``,
        and training goes on. It first warns if ``keep_checkpoints`` checkpoints will not fit on the disk.
        At the end the last iteration is saved, unless it already is.

        Ctrl-C, SIGTERM and SIGHUP (handled while this method runs, when it runs in the
        main thread) end training with that final checkpoint in two steps: weights and counters,
        then the full state within ``preemption_grace_s`` (see :mod:`flowrl.runs.saving`); a second
        signal while the full state is written abandons it, and the weights checkpoint stays the latest
        (one while the weights are written abandons them too, and the previous checkpoint stays). Any error
        (a :class:`~flowrl.errors.FlowRLError` such as a worker failure, or another
        exception) first writes an emergency checkpoint of the last finished iteration if
        the Trainer's state is intact (:meth:`~flowrl.engine.trainer.Trainer.state_problem`), sets
        :attr:`failure`, then propagates.
        """
        with interrupting_signals(), applied_umask(self.umask):
            return self._train(on_result)

    def _train(self, on_result: Callable[[dict[str, Any]], None] | None) -> RunSummary:
        self.failure = None
        self.saving.start()
        reason: str | None = None
        interrupted_by: signal.Signals | None = None
        interrupted_at = 0.0
        saving = False
        try:
            with open(self.directory / PROGRESS_FILE, "a", encoding="utf-8") as progress:
                while reason is None:
                    result = train_iteration(self.trainer, self.directory, self._traced)
                    self._check_lock()
                    progress.write(json.dumps(json_safe(result), allow_nan=False) + "\n")
                    progress.flush()
                    self._log_result(result)
                    self.saving.observe(result)
                    self._write_video()
                    if on_result is not None:
                        on_result(result)
                    self._best = _better(self._best, result)
                    if self.saving.due(result):
                        saving = True
                        self.saving.save_periodic()
                        saving = False
                    reason = stop_reason(self.spec.stop, result)
        except KeyboardInterrupt as interrupt:
            interrupted_by = interrupt_signal(interrupt)
            interrupted_at = signal_received_at() or time.monotonic()
        except RunLockedError as error:
            because = "another driver took the run directory over: it is that driver's to write"
            self.failure = RunFailure(error, self.checkpoint, saved=False, not_saved_because=because)
            raise
        except Exception as error:
            self.failure = self._save_failed(error) if saving else self._save_after_error(error)
            raise
        save_interrupted = False
        if self.saving.unsaved():
            try:
                if interrupted_by is None:
                    self.saving.save()
                else:
                    save_interrupted = self.saving.save_on_signal(interrupted_by, interrupted_at)
            except KeyboardInterrupt as interrupt:
                save_interrupted = True
                interrupted_by = interrupted_by or interrupt_signal(interrupt)
            except Exception as error:
                self.failure = self._save_failed(error)
                raise
        best_reward, best_iteration = self._best if self._best is not None else (None, None)
        return RunSummary(
            self.directory,
            reason,
            best_reward,
            best_iteration,
            self.checkpoint,
            save_interrupted,
            interrupted_by,
            self.saving.weights_only,
        )

    def _check_lock(self) -> None:
        """Raise :class:`~flowrl.storage.lock.RunLockedError` if another driver took the run directory's lock over."""
        if self.lock is not None and self.lock.lost:
            raise RunLockedError(
                f"run directory {str(self.directory)!r}: another driver took its lock over (this one was "
                f"silent for too long); stopping without writing anything more"
            )

    def _write_video(self) -> None:
        """Write the video of the iteration's evaluation, if it recorded one, to ``videos/iteration_<n>.mp4``."""
        video = self.trainer.evaluator.take_video()
        if video is None:
            return
        directory = self.directory / VIDEOS_DIR
        directory.mkdir(exist_ok=True)
        path = directory / f"iteration_{video.iteration:06d}.mp4"
        tmp = path.with_name(f".{path.name}.tmp")  # a reader never sees half a file
        tmp.write_bytes(video.mp4)
        os.replace(tmp, path)

    def _save_failed(self, error: BaseException) -> RunFailure:
        """The failure of a checkpoint write itself: nothing new was saved."""
        return RunFailure(
            error,
            self.checkpoint,
            saved=False,
            not_saved_because=f"saving the checkpoint failed ({type(error).__name__})",
        )

    def _save_after_error(self, error: BaseException) -> RunFailure:
        """Write the emergency checkpoint for ``error`` if there is something worth saving."""
        if not self.saving.unsaved():
            return RunFailure(error, self.checkpoint, saved=False)
        try:
            problem = self.trainer.state_problem()
        except Exception as e:  # noqa: BLE001 - a trainer too broken to inspect is not worth saving
            problem = f"its state cannot be inspected ({type(e).__name__}: {e})"
        if problem is not None:
            return RunFailure(
                error, self.checkpoint, saved=False, not_saved_because=f"the trainer's state is not intact: {problem}"
            )
        try:
            self.saving.save()
        except KeyboardInterrupt as interrupt:
            because = f"{interrupt_signal(interrupt).name} interrupted the save"
            return RunFailure(error, self.checkpoint, saved=False, not_saved_because=because)
        except Exception as e:  # noqa: BLE001 - the training error is the one to raise
            because = f"saving it failed ({type(e).__name__}: {e})"
            return RunFailure(error, self.checkpoint, saved=False, not_saved_because=because)
        return RunFailure(error, self.checkpoint, saved=True)

    def _log_result(self, result: Mapping[str, Any]) -> None:
        for logger in self.loggers:
            try:
                logger.log_result(result)
            except Exception as e:  # noqa: BLE001 - a tracker outage or a full disk must not end the run
                self._logger_failed(logger, "logging a result", e)

    def _logger_failed(self, logger: ResultLogger, action: str, error: Exception) -> None:
        if id(logger) not in self._failed_loggers:
            self._failed_loggers.add(id(logger))
            warnings.warn(
                f"{type(logger).__name__} failed while {action} ({type(error).__name__}: {error}); "
                f"progress.jsonl has every result (further failures of this logger are not reported)",
                RunWarning,
                stacklevel=3,
            )

    def close(self) -> None:
        """Close the loggers (finishing the tracker runs), stop the Trainer (its actors, and Ray if it started it),
        then release the run directory's lock.

        A logger that fails to close is reported with a :class:`~flowrl.errors.RunWarning`.
        """
        try:
            with applied_umask(self.umask):
                for logger in self.loggers:
                    try:
                        logger.close()
                    except Exception as e:  # noqa: BLE001 - the others, and the Trainer, must still close
                        self._logger_failed(logger, "closing", e)
        finally:
            try:
                self.trainer.stop()
            finally:
                if self.lock is not None:
                    self.lock.release()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"Run({str(self.directory)!r}, algo={self.spec.algo!r}, env={self.spec.env!r}, "
            f"iteration={self.trainer.iteration})"
        )


def start_run(
    spec: RunSpec,
    *,
    results_dir: str | os.PathLike[str] | None = None,
    storage_path: str | os.PathLike[str] | None = None,
    address: str | None = None,
    name: str | None = None,
    restart_unfinished: bool = False,
    umask: int | None = PRIVATE_UMASK,
) -> Run:
    """Build the Trainer for ``spec``, then create its run directory with ``params.json`` and ``plan.json``.

    The run directory is named ``name``, else ``<algo>_<env>_<YYYYmmdd-HHMMSS>``; a run directory
    ``name`` that exists raises :class:`~flowrl.errors.RunError`, unless ``restart_unfinished`` and its
    run ended before its first checkpoint (see :func:`~flowrl.storage.rundir.open_run_dir`). The run
    holds the directory's lock until it closes. Everything in it is created under ``umask``:
    :data:`~flowrl.storage.rundir.PRIVATE_UMASK` (directories 0700, files 0600) unless another is
    given (``0o022``: 0755 and 0644), or None for the process's umask.

    The run directory goes under ``results_dir`` (None: ``./flowrl_results``), or under
    ``storage_path``, an absolute path every node of the cluster mounts: it is checked first
    (:func:`~flowrl.storage.shared.check_storage_path`, before Ray starts) and recorded in ``params.json``. Giving
    both raises :class:`~flowrl.errors.RunError`. The Trainer comes before the run directory, so that a
    config or env it rejects leaves none behind; ``params.json`` records the full validated
    config. ``address`` is the Ray cluster to join (None: ``$RAY_ADDRESS``, else an embedded local Ray).
    The run's loggers open last (:func:`~flowrl.outputs.loggers.open_loggers`); a tracker whose package
    is missing is reported before anything starts.
    """
    from flowrl.engine.trainer import Trainer

    check_trackers(spec.wandb_project, spec.mlflow_tracking_uri)
    if results_dir is not None and storage_path is not None:
        raise RunError(
            f"results_dir={str(results_dir)!r} and storage_path={str(storage_path)!r} both say where "
            f"the run directory goes: give one (storage_path for a filesystem every node mounts)"
        )
    storage = None if storage_path is None else check_storage_path(storage_path)
    parent = run_parent(results_dir, storage)
    trainer = Trainer(spec.algo, spec.env, dict(spec.config), address=address)
    lock = None
    try:
        with applied_umask(umask):  # after the Trainer: Ray's own files keep the process's umask
            directory, lock = open_run_dir(
                parent, trainer.algorithm.name, spec.env, name=name, restart_unfinished=restart_unfinished
            )
            return _started(directory, lock, spec, trainer, storage, umask)
    except BaseException:
        try:
            trainer.stop()
        finally:
            if lock is not None:
                lock.release()
        raise


def _started(
    directory: Path, lock: RunLock, spec: RunSpec, trainer: Trainer, storage: Path | None, umask: int | None
) -> Run:
    """The new run in ``directory``, once its ``params.json`` and ``plan.json`` are written and its loggers open."""
    spec = dataclasses.replace(
        spec,
        algo=trainer.algorithm.name,
        config=trainer.config.to_dict(),
        keep_best=_default_keep_best(spec.keep_best, trainer.config.evaluation_interval),
    )
    _write_params(directory, spec, storage)
    write_plan(directory, trainer)
    loggers = open_loggers(
        directory,
        json_safe(spec.to_params()),
        wandb_project=spec.wandb_project,
        mlflow_tracking_uri=spec.mlflow_tracking_uri,
    )
    return Run(directory, spec, trainer, loggers=loggers, lock=lock, umask=umask)
