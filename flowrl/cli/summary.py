"""How ``flowrl train`` shows a run training and reports how it ended: the summary, or the error and the checkpoint."""

from __future__ import annotations

import shlex
import signal
import sys
import traceback
from collections.abc import Mapping
from pathlib import Path

from flowrl.cli.exits import EXIT_FAILURE, EXIT_OK, exit_status_for, report_error, signal_label
from flowrl.errors import CheckpointError, FlowRLError
from flowrl.outputs.loggers import offline_wandb_runs
from flowrl.outputs.progress import ProgressDisplay, Verbosity, format_iteration, format_number
from flowrl.runs.run import Run, RunSummary
from flowrl.storage.checkpoints import read_metadata
from flowrl.storage.rundir import BEST_CHECKPOINT, CHECKPOINTS_DIR


def describe_stop(stop: Mapping[str, float]) -> str:
    """The stop criteria as the line announcing a run says them."""
    if not stop:
        return "no stop criteria: training runs until Ctrl-C"
    return "stop at " + " or ".join(f"{key} >= {format_number(value, 'g')}" for key, value in stop.items())


def train_until_stopped(run: Run, verbosity: Verbosity) -> int:
    """Train ``run``, showing each iteration (live on a terminal, else :func:`format_iteration`'s line),
    then print the summary; returns the exit status."""
    try:
        with ProgressDisplay.for_run(run, format_line=format_iteration, verbosity=verbosity) as display:
            summary = run.train(on_result=display.update)
    except Exception as error:  # noqa: BLE001 - every error that ends training is reported the same way
        _report_failure(run, error)
        return EXIT_FAILURE
    return _report_summary(summary)


def _report_summary(summary: RunSummary) -> int:
    """Print how training ended; returns the exit status."""
    interrupted_by = summary.interrupted_by or signal.SIGINT
    if summary.save_interrupted:
        print(
            f"interrupted again while saving; the last complete checkpoint is {summary.checkpoint or 'none'}",
            file=sys.stderr,
            flush=True,
        )
        if summary.checkpoint:
            print(f"resume with: flowrl train --resume {summary.directory}", file=sys.stderr, flush=True)
        return exit_status_for(interrupted_by)
    print(f"interrupted ({signal_label(interrupted_by)})" if summary.interrupted else f"stopped: {summary.stop_reason}")
    if summary.best_reward is not None:
        print(f"best episode_reward_mean: {summary.best_reward:.2f} (iteration {summary.best_iteration})")
    weights_only = " (weights and counters only: replay buffers were not saved)" if summary.weights_only else ""
    print(f"checkpoint: {summary.checkpoint or 'none (no iteration finished)'}{weights_only}")
    best = _best_checkpoint(summary.directory)
    if best is not None:
        print(f"best checkpoint: {best}")
    print(f"results: {summary.directory}")
    offline = offline_wandb_runs(summary.directory)
    if offline:
        print(f"W&B offline run: {offline[-1]}")
        print(f"upload it with: wandb sync {' '.join(shlex.quote(str(path)) for path in offline)}")
    if summary.interrupted:
        if summary.checkpoint:
            print(f"resume with: flowrl train --resume {summary.directory}", flush=True)
        return exit_status_for(interrupted_by)
    return EXIT_OK


def _best_checkpoint(directory: Path) -> str | None:
    """``checkpoints/best`` of a run directory with the metric and value it was kept for, as the summary says it;
    None without one."""
    best = directory / CHECKPOINTS_DIR / BEST_CHECKPOINT
    if not best.is_dir():
        return None
    try:
        metadata = read_metadata(best)
    except CheckpointError:
        return str(best)
    kept = metadata.get("keep_best")
    if not isinstance(kept, Mapping) or not isinstance(kept.get("metric"), str):
        return str(best)
    iteration = metadata.get("iteration")
    at = f" at iteration {iteration}" if isinstance(iteration, int) else ""
    return f"{best} ({kept['metric']} {format_number(kept.get('value'), '.2f')}{at})"


def _report_failure(run: Run, error: Exception) -> None:
    """Print the error that ended training, the checkpoint saved for it (or why none was) and how to resume."""
    cause = getattr(error, "cause", None)
    if isinstance(error, FlowRLError) or isinstance(cause, FlowRLError):
        report_error(error, sys.stderr)
    else:  # not an error flowrl raises on purpose: the traceback is what a bug report needs
        traceback.print_exception(type(error), error, error.__traceback__, file=sys.stderr)
        print(f"flowrl: error: {type(error).__name__}: {error}", file=sys.stderr)
    failure = run.failure
    checkpoint = failure.checkpoint if failure is not None else run.checkpoint
    if failure is not None and failure.saved:
        print(f"saved a checkpoint of iteration {run.trainer.iteration} after the error: {checkpoint}", file=sys.stderr)
    elif failure is not None and failure.not_saved_because:
        print(f"no checkpoint written after the error: {failure.not_saved_because}", file=sys.stderr)
        print(f"the last complete checkpoint is {checkpoint or 'none'}", file=sys.stderr)
    else:
        print(f"the last complete checkpoint is {checkpoint or 'none (no iteration finished)'}", file=sys.stderr)
    if checkpoint is not None:
        print(f"resume with: flowrl train --resume {run.directory}", file=sys.stderr)
    sys.stderr.flush()
