"""Resuming a run directory: finding its newest usable checkpoint, then continuing the run from it.

Resume one from its latest usable checkpoint (its algorithm, env and config are kept; the stop
criteria, checkpoint cadence, number of workers and Ray address may change)::

    point = find_resume_point(run_dir, stop={"training_iteration": 20})
    if point.stop_reason is None:  # else the run already meets its stop criteria
        with resume_run(point) as run:
            run.train()

A checkpoint that fails its checks (incomplete, or a checksum that does not match) is skipped
with a :class:`~flowrl.errors.RunWarning`, and the one before it is used (:attr:`ResumePoint.skipped`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from flowrl.errors import CheckpointError, ConfigError, RunError, RunWarning
from flowrl.outputs.loggers import check_trackers, open_loggers
from flowrl.plan.trace import write_plan
from flowrl.runs.run import Run, _default_keep_best
from flowrl.storage.checkpoints import list_checkpoints, verify_checkpoint
from flowrl.storage.lock import RunLock
from flowrl.storage.rundir import (
    CHECKPOINTS_DIR,
    PRIVATE_UMASK,
    PROGRESS_FILE,
    RunSpec,
    _checkpoint_progress,
    _read_params,
    _read_progress,
    _replace_file,
    _write_params,
    applied_umask,
    find_run_dir,
    json_safe,
    stop_reason,
)
from flowrl.storage.shared import probe_storage, storage_root

if TYPE_CHECKING:  # the Trainer imports torch: load it only when a run resumes
    from flowrl.engine.trainer import Trainer


#: The config keys a resumed run may change: a run that stopped at its restart cap goes on with a higher one.
RESUME_CONFIG_KEYS = frozenset({"max_worker_restarts", "restart_window_s"})


class SkippedCheckpoint(NamedTuple):
    """A checkpoint :func:`find_resume_point` passed over, and what is wrong with it."""

    path: Path
    problem: str


@dataclass(frozen=True)
class ResumePoint:
    """Where a run directory resumes, found without starting Ray (see :func:`find_resume_point`).

    ``spec`` is the run's spec with the new stop criteria and checkpoint settings;
    ``checkpoint`` its newest usable checkpoint, at ``iteration`` and ``timesteps_total``;
    ``skipped`` the newer ones that failed their checks. ``results`` are the results in
    ``progress.jsonl`` up to that iteration. ``drops_results`` says ``progress.jsonl`` holds
    more (results after the checkpoint, or a line cut short), which :func:`resume_run` drops.
    ``stop_reason`` is the criterion the run already meets at the checkpoint, or None if
    there is training to do. ``storage_path`` is the shared directory the run lives under (None
    for a run under a local results directory); ``directory`` is then absolute.
    """

    directory: Path
    spec: RunSpec
    checkpoint: Path
    iteration: int
    timesteps_total: int
    results: list[dict[str, Any]]
    drops_results: bool
    stop_reason: str | None
    skipped: tuple[SkippedCheckpoint, ...] = ()
    storage_path: Path | None = None


def find_resume_point(
    run_dir: str | os.PathLike[str],
    *,
    storage_path: str | os.PathLike[str] | None = None,
    stop: Mapping[str, float] | None = None,
    checkpoint_freq: int | None = None,
    checkpoint_interval_s: float | None = None,
    keep_checkpoints: int | None = None,
    keep_best: str | None = None,
    wandb_project: str | None = None,
    mlflow_tracking_uri: str | None = None,
    config: Mapping[str, Any] | None = None,
) -> ResumePoint:
    """Read a run directory and find where it resumes: its newest usable checkpoint and the results up to it.

    With ``storage_path``, ``run_dir`` may be a run directory's name under it (see
    :func:`~flowrl.storage.rundir.find_run_dir`), and the run is taken to live there; without, a run started under a
    storage path keeps the one its ``params.json`` records. ``stop`` criteria, when given
    (not empty), replace the run's own (none of them is kept) and count the whole run; each checkpoint
    and tracker setting given (not None) replaces the run's own, and so do the keys of ``config``, which
    may only be the restart budget's (:data:`RESUME_CONFIG_KEYS`; others raise :class:`ConfigError`).
    Checkpoints are checked newest first (:func:`~flowrl.storage.checkpoints.verify_checkpoint`:
    complete, checksums match); one that fails is skipped with a :class:`~flowrl.errors.RunWarning` and
    recorded in :attr:`ResumePoint.skipped`. Raises :class:`RunError` if ``run_dir`` is not a run
    directory and :class:`CheckpointError` if none of its checkpoints is usable.
    """
    refused = sorted(set(config or {}) - RESUME_CONFIG_KEYS)
    if refused:
        raise ConfigError(
            f"{', '.join(refused)} cannot change on resume: a resumed run keeps its config but for "
            f"{', '.join(sorted(RESUME_CONFIG_KEYS))}"
        )
    directory = find_run_dir(run_dir, storage_path)
    spec, recorded_storage = _read_params(directory)
    storage = recorded_storage if storage_path is None else storage_root(storage_path)
    if storage is not None:
        # The resume command printed for the run must work from any working directory (and node).
        directory = Path(os.path.abspath(directory))
    spec = dataclasses.replace(
        spec,
        stop=dict(stop) if stop else spec.stop,
        config={**spec.config, **(config or {})},
        checkpoint_freq=spec.checkpoint_freq if checkpoint_freq is None else checkpoint_freq,
        checkpoint_interval_s=spec.checkpoint_interval_s if checkpoint_interval_s is None else checkpoint_interval_s,
        keep_checkpoints=spec.keep_checkpoints if keep_checkpoints is None else keep_checkpoints,
        keep_best=spec.keep_best if keep_best is None else keep_best,
        wandb_project=spec.wandb_project if wandb_project is None else wandb_project,
        mlflow_tracking_uri=spec.mlflow_tracking_uri if mlflow_tracking_uri is None else mlflow_tracking_uri,
    )
    candidates = list_checkpoints(directory / CHECKPOINTS_DIR)
    if not candidates:
        raise CheckpointError(
            f"run directory {str(directory)!r}: no checkpoint under {str(directory / CHECKPOINTS_DIR)!r} to resume from"
        )
    skipped: list[SkippedCheckpoint] = []
    for checkpoint in reversed(candidates):
        try:
            verify_checkpoint(checkpoint)
            iteration, timesteps = _checkpoint_progress(checkpoint)
        except CheckpointError as e:
            skipped.append(SkippedCheckpoint(checkpoint, str(e)))
            warnings.warn(f"skipping checkpoint {str(checkpoint)!r}: {e}", RunWarning, stacklevel=2)
            continue
        break
    else:
        tried = "\n".join(f"  - {s.path.name}: {s.problem}" for s in skipped)
        raise CheckpointError(
            f"run directory {str(directory)!r}: none of its {len(skipped)} checkpoints is usable:\n{tried}"
        )
    results, intact = _read_progress(directory / PROGRESS_FILE)
    kept = [r for r in results if int(r.get("training_iteration") or 0) <= iteration]
    # The checkpoint's own counts win: progress.jsonl may lack the line of the checkpoint's iteration.
    at_checkpoint = {**(kept[-1] if kept else {}), "training_iteration": iteration, "timesteps_total": timesteps}
    drops_results = len(kept) != len(results) or not intact
    return ResumePoint(
        directory,
        spec,
        checkpoint,
        iteration,
        timesteps,
        kept,
        drops_results,
        stop_reason(spec.stop, at_checkpoint),
        tuple(skipped),
        storage,
    )


def resume_run(
    point: ResumePoint,
    *,
    num_workers: int | None = None,
    address: str | None = None,
    umask: int | None = PRIVATE_UMASK,
) -> Run:
    """Restore ``point``'s checkpoint into a new Trainer and continue its run directory.

    The run directory's lock is taken first (:class:`~flowrl.storage.lock.RunLockedError` names the
    driver writing it; a stale lock is taken over with a warning), and :class:`~flowrl.errors.RunError`
    is raised if a checkpoint newer than ``point``'s appeared since it was found. Files are written
    under ``umask`` as :func:`~flowrl.runs.run.start_run` writes them.

    Results after the checkpoint are dropped from ``progress.jsonl`` (they are lost work;
    dropping them keeps iteration numbers unique), and ``params.json`` is rewritten with the
    new stop criteria, checkpoint settings and ``num_workers``, and ``plan.json`` with the new
    plan's graph. The algorithm, env and the rest of the config are the run's own. The
    checkpoint resumed from is never rotated away. A run on a storage path is first checked to
    be writable from this node, as :func:`~flowrl.storage.shared.check_storage_path` checks a
    new one, and keeps its storage path in ``params.json``. The loggers go on in the same files
    and tracker runs: ``progress.csv`` is rewritten from the results kept, and TensorBoard hides
    the points logged after the checkpoint.
    """
    from flowrl.engine.trainer import Trainer

    check_trackers(point.spec.wandb_project, point.spec.mlflow_tracking_uri)
    if point.storage_path is not None:
        probe_storage(point.directory, "run directory")
    config = dict(point.spec.config)
    if num_workers is not None:
        config["num_workers"] = num_workers
    lock = RunLock.acquire(point.directory)
    try:
        _check_still_latest(point)
        trainer = Trainer(point.spec.algo, point.spec.env, config, address=address)
    except BaseException:
        lock.release()
        raise
    try:
        with applied_umask(umask):
            return _resumed(point, trainer, lock, umask)
    except BaseException:
        try:
            trainer.stop()
        finally:
            lock.release()
        raise


def _check_still_latest(point: ResumePoint) -> None:
    """:class:`~flowrl.errors.RunError` if the run directory has a checkpoint newer than those ``point`` saw."""
    newest_seen = point.skipped[0].path if point.skipped else point.checkpoint
    checkpoints = list_checkpoints(point.directory / CHECKPOINTS_DIR)
    if checkpoints and checkpoints[-1] != newest_seen:
        raise RunError(
            f"run directory {str(point.directory)!r} has a checkpoint newer than its resume point "
            f"({checkpoints[-1].name}, written since by another driver): find the resume point again"
        )


def _resumed(point: ResumePoint, trainer: Trainer, lock: RunLock, umask: int | None) -> Run:
    """The resumed run: ``point``'s checkpoint restored, ``progress.jsonl``, ``params.json`` and ``plan.json``
    rewritten, the loggers open."""
    trainer.restore(point.checkpoint)
    if point.drops_results:
        _replace_file(point.directory / PROGRESS_FILE, "".join(json.dumps(r) + "\n" for r in point.results))
    spec = dataclasses.replace(
        point.spec,
        config=trainer.config.to_dict(),
        keep_best=_default_keep_best(point.spec.keep_best, trainer.config.evaluation_interval),
    )
    _write_params(point.directory, spec, point.storage_path)
    write_plan(point.directory, trainer)
    loggers = open_loggers(
        point.directory,
        json_safe(spec.to_params()),
        wandb_project=spec.wandb_project,
        mlflow_tracking_uri=spec.mlflow_tracking_uri,
        previous_results=point.results,
        resumed_at_step=point.timesteps_total,
    )
    return Run(
        point.directory,
        spec,
        trainer,
        checkpoint=point.checkpoint,
        previous_results=point.results,
        loggers=loggers,
        lock=lock,
        umask=umask,
    )
