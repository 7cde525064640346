"""How ``flowrl tune`` shows and names its trials: a line per trial start and end for logs
(:class:`TrialLines`), short trial names (:class:`TrialNames`), and Tune's output settings (:func:`tune_output`)."""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from ray.tune import Callback
from ray.tune.experiment import Trial

from flowrl.outputs.progress import format_number
from flowrl.storage.results import finite_number, result_value


class TrialLines(Callback):
    """Prints a line when a trial starts (or continues, as PBT's do), ends or fails: progress for logs."""

    def __init__(self, metric: str, searched: Sequence[str]) -> None:
        self.metric, self.searched = metric, list(searched)
        self.started: set[str] = set()

    def on_trial_start(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        verb = "continued" if trial.trial_id in self.started else "started"
        self.started.add(trial.trial_id)
        config = ", ".join(f"{key}={result_value(trial.config, key)!r}" for key in self.searched) or "no searched keys"
        print(f"trial {trial.trial_id} {verb}: {config}", flush=True)

    def on_trial_complete(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        result = trial.last_result
        print(
            f"trial {trial.trial_id} ended after {result.get('training_iteration', 0)} iterations: "
            f"{self.metric} {format_number(finite_number(result.get(self.metric)), '.4g')}",
            flush=True,
        )

    def on_trial_error(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        error = last_line(Path(trial.error_file)) if trial.error_file else None
        print(f"trial {trial.trial_id} failed: {error or 'no error recorded'}", flush=True)


@contextlib.contextmanager
def tune_output(terminal: bool) -> Iterator[None]:
    """Tune's ``CLIReporter`` table and quiet mode, which its newer output engine (the default) ignores; and
    off a ``terminal`` (a log file, a pipe), the trials' printed lines without ANSI colour codes in their
    ``(pid=...)`` prefix (unless ``RAY_COLOR_PREFIX`` is set already)."""
    settings = {"RAY_AIR_NEW_OUTPUT": "0"}  # read when fit() starts
    if not terminal and "RAY_COLOR_PREFIX" not in os.environ:
        settings["RAY_COLOR_PREFIX"] = "0"  # read by the driver as it prints each worker line
    previous = {name: os.environ.get(name) for name in settings}
    os.environ.update(settings)
    try:
        yield
    finally:
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


class TrialNames:
    """A trial's name and directory name: ``<algo>_<env>_<index>_<short id>`` (``ppo_CartPole-v1_3_a1b2c``).

    Tune's own names append every searched value (and a date) to the directory's, which with a
    few floats from Optuna reach 140 characters; the values are in ``params.json`` and ``trials.csv``.
    """

    def __init__(self, algo: str, env: str) -> None:
        self.stem = f"{algo}_{re.sub(r'[^A-Za-z0-9._-]+', '_', env)}"

    def __call__(self, trial: Trial) -> str:
        index = str(trial.experiment_tag).partition("_")[0]  # Tune's tag: "<index>_<searched values>"
        short_id = str(trial.trial_id).partition("_")[0]  # "<random hex>_<count>" or, from a searcher, "<hex>"
        return f"{self.stem}_{index}_{short_id}" if index.isdigit() else f"{self.stem}_{short_id}"


def last_line(path: Path | None) -> str | None:
    """The last non-empty line of a text file (a traceback's exception), or None."""
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines() if path is not None else []
    except OSError:
        return None
    return next((line.strip() for line in reversed(lines) if line.strip()), None)
