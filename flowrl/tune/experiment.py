"""Running a Tune experiment of flowrl trials: :func:`run` (``flowrl.tune.run``), which ``flowrl tune`` calls.

An experiment directory, ``<results_dir>/<name>/``, holds:

- ``spec.json``: the experiment as given, with its algo, env, metric and mode (what a resume reads);
- one directory per trial: flowrl's ``params.json`` and ``progress.jsonl``, Tune's ``result.json``,
  ``progress.csv``, ``params.pkl``, TensorBoard events and ``checkpoint_*/`` (flowrl checkpoints);
- ``trials.csv``: one row per trial, written when the experiment ends or is interrupted;
- Tune's own state (``experiment_state-*.json``, ``tuner.pkl``, ...), from which ``resume`` continues.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import json
import os
import re
import signal
import sys
import threading
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

import ray
from ray import tune
from ray.tune import Callback, CLIReporter
from ray.tune.experiment import Trial
from ray.tune.search.sample import Categorical, Domain, Float, Integer

from flowrl.engine.ray_runtime import start_ray, stop_ray
from flowrl.errors import ResourceUnavailableError, RunError, RunWarning
from flowrl.runs.signals import HANDLED_SIGNALS, SignalInterrupt
from flowrl.storage.results import finite_number, result_value
from flowrl.storage.rundir import DEFAULT_RESULTS_DIR, EXPERIMENT_FILE, json_safe, read_json_in
from flowrl.tune.reporting import TrialLines, TrialNames, last_line, tune_output
from flowrl.tune.spec import TuneSpec, load_spec, parse_spec
from flowrl.tune.trainable import RunDirectoryLogger, trainable_for, trial_resources

TRIALS_FILE = "trials.csv"
#: Tune's trial statuses of a trial that ended: the others (PENDING, RUNNING, PAUSED) were interrupted.
ENDED = (Trial.TERMINATED, Trial.ERROR)


@dataclasses.dataclass(frozen=True)
class TrialSummary:
    """One trial as it ended (or stood when the experiment was interrupted).

    ``status``: Tune's (``TERMINATED``, ``ERROR``; ``RUNNING``, ``PENDING`` or ``PAUSED`` when
    interrupted). ``config``: the searched keys' values (after PBT's last change).
    ``last`` and ``best``: the experiment's metric in the trial's last result and its best over
    all results (None if it never reported a finite value). A failed trial's ``error`` is the
    last line of the traceback that Tune wrote in ``error_file``.
    """

    trial_id: str
    status: str
    config: dict[str, Any]
    iterations: int
    timesteps_total: int | None
    last: float | None
    best: float | None
    directory: Path | None
    error: str | None = None
    error_file: Path | None = None


@dataclasses.dataclass(frozen=True)
class TuneSummary:
    """How an experiment ended: its directory, its trials, and which is best by ``metric`` and ``mode``.

    ``interrupted_by``: the signal that stopped the experiment before every trial ended (None
    if none did); :func:`run` with ``resume`` continues it.
    """

    directory: Path
    metric: str
    mode: str
    trials: list[TrialSummary]
    interrupted_by: signal.Signals | None = None

    @property
    def interrupted(self) -> bool:
        """Whether some trials had not ended when the experiment stopped."""
        return self.interrupted_by is not None

    @property
    def errored(self) -> list[TrialSummary]:
        """The trials that failed."""
        return [trial for trial in self.trials if trial.status == Trial.ERROR]

    @property
    def best(self) -> TrialSummary | None:
        """The trial whose last result has the best ``metric`` (None if no trial reported a finite value)."""
        scored = [(trial.last, trial) for trial in self.trials if trial.last is not None]
        if not scored:
            return None
        pick = max if self.mode == "max" else min
        return pick(scored, key=lambda pair: pair[0])[1]

    @property
    def trials_csv(self) -> Path:
        """The experiment's ``trials.csv``."""
        return self.directory / TRIALS_FILE


def run(
    experiment: TuneSpec | Mapping[str, Any] | str | os.PathLike[str] | None = None,
    *,
    results_dir: str | os.PathLike[str] | None = None,
    address: str | None = None,
    resume: str | os.PathLike[str] | None = None,
    verbose: bool | None = None,
    callbacks: Sequence[Callback] = (),
) -> TuneSummary:
    """Run an experiment of flowrl trials on Ray Tune until every trial stops, or continue one.

    ``experiment``: a :class:`~flowrl.tune.spec.TuneSpec`, the mapping an experiment file holds,
    or the file's path (checked as :func:`~flowrl.tune.spec.parse_spec` does, before Ray
    starts). The experiment directory is ``<results_dir>/<name>`` (default results directory
    ``./flowrl_results``; default name ``<algo>_<env>_<timestamp>``). ``resume``: instead,
    the directory of an interrupted experiment to continue; its trials go on from their latest
    checkpoints (failed ones too), with the experiment's own settings and stop criteria.
    ``address``: the Ray cluster to join (default: ``$RAY_ADDRESS``, else an embedded local
    Ray; a Ray already initialised in this process is used as it is). ``verbose``: a live table
    of the trials (Tune's ``CLIReporter``) when true, a line per trial start and end when false;
    by default the table when stdout is a terminal. ``callbacks``: more Tune callbacks (loggers,
    say) for a new experiment; a resumed one keeps its own.

    SIGTERM and SIGHUP interrupt the experiment as Ctrl-C does: Tune saves its state and the
    summary says which signal it was. Writes ``trials.csv`` and returns the summary.
    """
    if verbose is None:
        verbose = sys.stdout.isatty()
    spec: TuneSpec | None = None
    if experiment is not None and resume is None:
        spec = _as_spec(experiment)
        algo, env, metric, mode, searched = spec.algo, spec.env, spec.metric, spec.mode, list(spec.searched)
        directory = _new_experiment_dir(Path(results_dir or DEFAULT_RESULTS_DIR).expanduser().resolve(), spec)
    elif resume is not None and experiment is None:
        if results_dir is not None or callbacks:
            raise RunError("results_dir and callbacks cannot be given with resume: a resumed experiment keeps its own")
        directory, saved = _read_experiment_dir(resume)
        algo, env, metric, mode = saved["algo"], saved["env"], saved["metric"], saved["mode"]
        searched = [str(key) for key in saved.get("searched", [])]
    else:
        raise RunError("give an experiment (a spec, its mapping or its file) or resume=EXPERIMENT_DIR, one of the two")

    # The trials' lines reach this process's output as long as Ray runs: plain ones all that time.
    with tune_output(terminal=sys.stdout.isatty()):
        started_here = start_ray(address)
        try:
            if spec is None:
                tuner = tune.Tuner.restore(str(directory), trainable=trainable_for(algo, env), resume_errored=True)
            else:
                # Only an embedded Ray that flowrl started here cannot grow; a cluster's autoscaler may add nodes.
                embedded = started_here and not (address or os.environ.get("RAY_ADDRESS"))
                _check_trial_fits(spec, can_grow=not embedded)
                tuner = _new_tuner(spec, directory, verbose, callbacks)
                _write_spec_file(directory / EXPERIMENT_FILE, spec)
            with _signals_to_tune() as received:
                tuner.fit()
            trials = _trial_summaries(directory, metric, mode, searched)  # Tune's trials need Ray
        finally:
            stop_ray(started_here)
    interrupted = any(trial.status not in ENDED for trial in trials)
    interrupted_by = (received[-1] if received else signal.SIGINT) if interrupted else None
    summary = TuneSummary(directory, metric, mode, trials, interrupted_by)
    write_trials_csv(summary)
    return summary


def _as_spec(experiment: TuneSpec | Mapping[str, Any] | str | os.PathLike[str]) -> TuneSpec:
    if isinstance(experiment, TuneSpec):
        return experiment
    if isinstance(experiment, Mapping):
        return parse_spec(experiment)
    return load_spec(experiment)


# --- the experiment directory ---------------------------------------------------------------------


def _new_experiment_dir(results_dir: Path, spec: TuneSpec) -> Path:
    """Create ``<results_dir>/<name>``, which must not hold an experiment yet (an unnamed one: the first free name)."""
    results_dir.mkdir(parents=True, exist_ok=True)
    if spec.name is not None:
        directory = results_dir / spec.name
        if directory.exists() and any(directory.iterdir()):
            raise RunError(
                f"experiment directory {str(directory)!r} already exists: continue it with "
                f"flowrl tune --resume {directory}, or give the experiment another name"
            )
        directory.mkdir(exist_ok=True)
        return directory
    stem = f"{spec.algo}_{re.sub(r'[^A-Za-z0-9._-]+', '_', spec.env)}_{time.strftime('%Y%m%d-%H%M%S')}"
    for n in range(1000):
        directory = results_dir / (stem if n == 0 else f"{stem}_{n}")
        try:
            directory.mkdir()  # atomic: two experiments started in the same second get different names
        except FileExistsError:
            continue
        return directory
    raise RunError(
        f"cannot create an experiment directory {stem!r} under {str(results_dir)!r}: every numbered name is taken"
    )


def _write_spec_file(path: Path, spec: TuneSpec) -> None:
    saved = {
        "name": path.parent.name,
        "algo": spec.algo,
        "env": spec.env,
        "metric": spec.metric,
        "mode": spec.mode,
        "searched": list(spec.searched),
        "spec": spec.source,
    }
    path.write_text(json.dumps(json_safe(saved), indent=2) + "\n", encoding="utf-8")


def _read_experiment_dir(path: str | os.PathLike[str]) -> tuple[Path, dict[str, Any]]:
    """An experiment directory to resume and its ``spec.json`` (:class:`RunError` if it is neither)."""
    directory = Path(path).expanduser().resolve()
    saved = read_json_in(
        directory, EXPERIMENT_FILE, kind="experiment directory", not_one="an experiment directory of flowrl tune"
    )
    if not isinstance(saved, dict) or not all(
        isinstance(saved.get(key), str) for key in ("algo", "env", "metric", "mode")
    ):
        raise RunError(f"experiment directory {str(directory)!r}: {EXPERIMENT_FILE} lacks algo, env, metric or mode")
    if not tune.Tuner.can_restore(directory):
        raise RunError(
            f"experiment directory {str(directory)!r} holds no Tune experiment state to resume "
            "(it was interrupted before its first trial started)"
        )
    return directory, saved


# --- the Tuner ------------------------------------------------------------------------------------


def _new_tuner(spec: TuneSpec, directory: Path, verbose: bool, extra_callbacks: Sequence[Callback]) -> tune.Tuner:
    callbacks: list[Callback] = [RunDirectoryLogger(), *extra_callbacks]
    if verbose:
        reporter = CLIReporter(
            parameter_columns=list(spec.searched),
            metric_columns={"training_iteration": "iter", "timesteps_total": "steps", spec.metric: spec.metric},
            max_report_frequency=10,
        )
    else:
        reporter = None
        callbacks.append(TrialLines(spec.metric, spec.searched))
    return tune.Tuner(
        trainable_for(spec.algo, spec.env),
        param_space=spec.param_space,
        tune_config=tune.TuneConfig(
            num_samples=spec.num_samples,
            metric=spec.metric,
            mode=spec.mode,
            scheduler=spec.scheduler,
            search_alg=spec.search_alg,
            max_concurrent_trials=spec.max_concurrent_trials,
            # PBT hands a paused trial's actor the next trial; its trainable takes the new config live or rebuilds.
            reuse_actors=spec.is_pbt,
            trial_name_creator=TrialNames(spec.algo, spec.env),
            trial_dirname_creator=TrialNames(spec.algo, spec.env),
        ),
        run_config=tune.RunConfig(
            name=directory.name,
            storage_path=str(directory.parent),
            stop=spec.stop,
            callbacks=callbacks,
            checkpoint_config=tune.CheckpointConfig(
                checkpoint_frequency=spec.checkpoint_freq, checkpoint_at_end=True, num_to_keep=spec.keep_checkpoints
            ),
            progress_reporter=reporter,
            verbose=1 if verbose else 0,
            # What a trial writes beside its results (plan.json, trace/) reaches its trial directory.
            sync_config=tune.SyncConfig(sync_artifacts=True),
        ),
    )


@contextlib.contextmanager
def _signals_to_tune() -> Iterator[list[signal.Signals]]:
    """Within the block, SIGTERM and SIGHUP stop the experiment as Ctrl-C does; yields the signals received.

    Tune handles SIGINT while it runs (it stops the trials and saves the experiment's state), so
    these signals become a SIGINT then; before and after, they raise
    :class:`~flowrl.runs.signals.SignalInterrupt` as ``flowrl train``'s do. Only in the main thread.
    """
    received: list[signal.Signals] = []
    if threading.current_thread() is not threading.main_thread():
        yield received
        return

    def forward(signum: int, frame: FrameType | None) -> None:
        received.append(signal.Signals(signum))
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            raise SignalInterrupt(signum)
        signal.raise_signal(signal.SIGINT)

    previous: dict[signal.Signals, Any] = {}
    try:
        for signum in HANDLED_SIGNALS:
            handler = signal.getsignal(signum)
            if handler is signal.SIG_IGN:  # nohup: the experiment outlives its terminal
                continue
            previous[signum] = signal.SIG_DFL if handler is None else handler
            signal.signal(signum, forward)
        yield received
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


# --- resources ------------------------------------------------------------------------------------


def _first_value(value: Any) -> Any:
    """``value`` with each search space replaced by its first value (first grid point or choice, lower bound)."""
    if isinstance(value, Mapping):
        if set(value) == {"grid_search"}:
            return value["grid_search"][0]
        return {key: _first_value(inner) for key, inner in value.items()}
    if isinstance(value, Categorical):
        return value.categories[0]
    if isinstance(value, (Float, Integer)):
        return value.lower
    if isinstance(value, Domain):
        raise TypeError(f"no first value for search space {value!r}")
    return value


def _check_trial_fits(spec: TuneSpec, can_grow: bool) -> None:
    """Check that Ray has the resources one trial asks for (its placement group), with its first searched values.

    Tune would otherwise wait for them forever: :class:`~flowrl.errors.ResourceUnavailableError`,
    or a :class:`~flowrl.errors.RunWarning` for a Ray that ``can_grow`` (an autoscaler may add nodes).
    """
    bundles = trial_resources(spec.algo, _first_value(spec.param_space)).bundles
    needed: dict[str, float] = {}
    for bundle in bundles:
        for resource, amount in bundle.items():
            needed[resource] = needed.get(resource, 0.0) + amount
    available = ray.cluster_resources()
    short = {resource: amount for resource, amount in needed.items() if amount > available.get(resource, 0.0) + 1e-9}
    if not short:
        return
    have = ", ".join(f"{available.get(resource, 0.0):g} {resource}" for resource in short)
    want = ", ".join(f"{amount:g} {resource}" for resource, amount in short.items())
    message = (
        f"a trial of this experiment asks for {want} (its placement group: {bundles}) but Ray has {have}; "
        "lower num_workers, num_cpus_per_worker or num_cpus_for_driver (fractions such as 0.5 work)"
    )
    if not can_grow:
        raise ResourceUnavailableError(message + ", or join a larger cluster with --address")
    warnings.warn(message + "; Tune waits until the cluster has them", RunWarning, stacklevel=3)


# --- results --------------------------------------------------------------------------------------


def _trial_summaries(directory: Path, metric: str, mode: str, searched: list[str]) -> list[TrialSummary]:
    """Every trial of the experiment in ``directory``, as Tune's saved state has it."""
    trials = tune.ExperimentAnalysis(str(directory), default_metric=metric, default_mode=mode).trials
    summaries = []
    for trial in sorted(trials, key=lambda t: t.trial_id):
        analysis = trial.metric_analysis.get(metric, {})
        error_file = None
        if trial.error_file:  # in the driver's staging copy of the trial directory; the experiment's outlives Ray
            synced = Path(trial.path or "") / Path(trial.error_file).name
            error_file = synced if synced.is_file() else Path(trial.error_file)
        result = trial.last_result or {}
        summaries.append(
            TrialSummary(
                trial_id=trial.trial_id,
                status=trial.status,
                config={key: result_value(trial.config, key) for key in searched},
                iterations=int(result.get("training_iteration", 0)),
                timesteps_total=result.get("timesteps_total"),
                last=finite_number(analysis.get("last")),
                best=finite_number(analysis.get(mode)),
                directory=Path(trial.path) if trial.path else None,
                error=last_line(error_file),
                error_file=error_file,
            )
        )
    return summaries


def write_trials_csv(summary: TuneSummary) -> Path:
    """Write the experiment's ``trials.csv``: one row per trial (lists and dicts as JSON); returns its path."""
    searched = list(summary.trials[0].config) if summary.trials else []
    header = [
        "trial_id",
        "status",
        "iterations",
        "timesteps_total",
        f"last_{summary.metric}",
        f"best_{summary.metric}",
        *(f"config/{key}" for key in searched),
        "directory",
    ]
    with open(summary.trials_csv, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        for trial in summary.trials:
            values = [json.dumps(json_safe(v)) if isinstance(v, (list, dict)) else v for v in trial.config.values()]
            writer.writerow(
                [
                    trial.trial_id,
                    trial.status,
                    trial.iterations,
                    trial.timesteps_total,
                    trial.last,
                    trial.best,
                    *values,
                    trial.directory,
                ]
            )
    return summary.trials_csv
