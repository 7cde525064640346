"""Learning curves: runs' ``progress.jsonl`` drawn with matplotlib, the seeds of one setting as a mean ± std band.

:func:`plot_runs` reads run directories (``params.json`` and ``progress.jsonl``) and Tune
experiment directories (``spec.json`` and one run directory per trial), and draws one curve
per group of runs:

- runs of the same algorithm, env and config but for ``seed`` are one group: their mean, with a
  band of ± one standard deviation across them (population std, ``ddof=0``). Their results are
  put on a common x grid first: every x value any of them reports within the range all of them
  cover, each run linearly interpolated onto it (``numpy.interp``); nothing is extrapolated, so
  the curve ends where the shortest run ends. A group of one run is its line.
- each trial of a Tune experiment is its own curve, labelled by its searched config.

Result keys nested in a result are named with ``/``: ``evaluation/episode_reward_mean``,
``info/learner/default_policy/loss``. Results without a finite value for x or y are skipped (an
evaluation every few iterations gives a point every few iterations).

It draws on a :class:`matplotlib.figure.Figure` of its own (the Agg canvas, never a window or
pyplot's global state); matplotlib is the ``plot`` extra.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from flowrl.errors import RunError, RunWarning, install_hint
from flowrl.storage.results import finite_number, flatten_result, result_value
from flowrl.storage.rundir import EXPERIMENT_FILE, PARAMS_FILE, PROGRESS_FILE, read_run_spec

PLOT_EXTRA = "plot"
DEFAULT_X = "timesteps_total"
DEFAULT_Y = "episode_reward_mean"
DEFAULT_OUT = "curve.png"
_CLOSE_KEYS = 8


@dataclass(frozen=True)
class CurveGroup:
    """One curve: its legend label, the run directories behind it, and what was drawn.

    ``x`` is the common grid, ``mean`` the mean of the runs on it and ``std`` their standard
    deviation (zeros for a single run).
    """

    label: str
    runs: tuple[Path, ...]
    x: np.ndarray
    mean: np.ndarray
    std: np.ndarray


@dataclass(frozen=True)
class PlotResult:
    """What :func:`plot_runs` drew: the image file, the keys, the curves, and the runs left out (with why)."""

    path: Path
    x_key: str
    y_key: str
    groups: tuple[CurveGroup, ...]
    #: The lines on the axes matplotlib drew into the image: one per group.
    curves: int
    skipped: tuple[tuple[Path, str], ...] = ()


@dataclass(frozen=True)
class _Run:
    directory: Path
    algo: str
    env: str
    config: dict[str, Any]
    results: list[dict[str, Any]]
    #: For a Tune trial: its label (the searched config); None for a run of its own.
    trial_label: str | None = None


def plot_runs(
    paths: Sequence[str | os.PathLike[str]],
    x: str = DEFAULT_X,
    y: str = DEFAULT_Y,
    out: str | os.PathLike[str] = DEFAULT_OUT,
    title: str | None = None,
) -> PlotResult:
    """Draw learning curves of the runs (and Tune experiments) in ``paths`` into the image ``out``;
    returns what was drawn.

    ``x`` and ``y`` are result keys (nested keys joined by ``/``). The image format follows
    ``out``'s suffix (``.png``, ``.svg``, ``.pdf``, ...). Runs that have results but no value
    of ``x`` or ``y`` are left out with a :class:`~flowrl.errors.RunWarning`.

    Raises :class:`~flowrl.errors.RunError` for a path that is neither a run nor an experiment
    directory, runs without results, a key no result holds (naming the keys close to it), an
    image format matplotlib cannot write, or a missing matplotlib.
    """
    figure_class = _figure_class()
    if not paths:
        raise RunError("plot needs at least one run directory or Tune experiment directory")
    runs = [run for path in paths for run in _read_runs(Path(path))]
    with_results = [run for run in runs if run.results]
    if not with_results:
        raise RunError(
            f"no results to plot: {_names(runs)} {'has' if len(runs) == 1 else 'have'} an empty {PROGRESS_FILE}"
        )
    skipped = [(run.directory, f"its {PROGRESS_FILE} is empty") for run in runs if not run.results]
    series: list[tuple[_Run, np.ndarray, np.ndarray]] = []
    for run in with_results:
        xs, ys = _points(run.results, x, y)
        if len(xs):
            series.append((run, xs, ys))
        else:
            skipped.append((run.directory, f"none of its results has finite values of both {x!r} and {y!r}"))
    if not series:
        _raise_for_missing_keys(with_results, x, y)
    for directory, why in skipped:
        warnings.warn(f"{directory} is not plotted: {why}", RunWarning, stacklevel=2)

    groups = [_aggregate(label, members) for label, members in _group(series)]
    figure = figure_class(figsize=(8, 5), layout="constrained")
    axes = figure.subplots()
    for group in groups:
        single_point = len(group.x) == 1
        (line,) = axes.plot(group.x, group.mean, label=group.label, marker="o" if single_point else None)
        if len(group.runs) > 1:
            axes.fill_between(
                group.x, group.mean - group.std, group.mean + group.std, color=line.get_color(), alpha=0.2
            )
    axes.set_xlabel(x)
    axes.set_ylabel(y)
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize="small")
    if title:
        axes.set_title(title)
    path = Path(out)
    supported = sorted(figure.canvas.get_supported_filetypes())
    if path.suffix.lstrip(".").lower() not in supported:
        raise RunError(
            f"cannot write the plot to {str(path)!r}: its suffix {path.suffix!r} is not an image format "
            f"matplotlib writes ({', '.join('.' + s for s in supported)})"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    return PlotResult(path, x, y, tuple(groups), len(axes.get_lines()), tuple(skipped))


def _figure_class() -> Any:
    try:
        from matplotlib.figure import Figure
    except ImportError as e:
        raise RunError(f"plotting needs the optional dependency matplotlib ({e}): {install_hint(PLOT_EXTRA)}") from None
    return Figure


# --- reading runs -----------------------------------------------------------------------------------


def _read_runs(path: Path) -> list[_Run]:
    """The runs ``path`` holds: itself (a run directory) or each trial of a Tune experiment directory."""
    if (path / PARAMS_FILE).is_file():
        return [_read_run(path)]
    if (path / EXPERIMENT_FILE).is_file():
        return _read_experiment(path)
    if not path.is_dir():
        raise RunError(f"{str(path)!r}: no such directory")
    inside = sorted(entry.name for entry in path.iterdir() if (entry / PARAMS_FILE).is_file())
    hint = (
        f"; it holds run directories ({', '.join(inside[:3])}{', ...' if len(inside) > 3 else ''}): name them"
        if inside
        else ""
    )
    raise RunError(
        f"{str(path)!r} is neither a flowrl run directory (with {PARAMS_FILE} and {PROGRESS_FILE}) nor "
        f"a flowrl tune experiment directory (with {EXPERIMENT_FILE}){hint}"
    )


def _read_run(directory: Path) -> _Run:
    spec = read_run_spec(directory)  # RunError naming what is wrong with params.json
    return _Run(directory, spec.algo, spec.env, dict(spec.config), _read_progress(directory))


def _read_progress(directory: Path) -> list[dict[str, Any]]:
    """The results of ``progress.jsonl``, flattened (nested keys joined by ``/``); [] if there is none yet."""
    results = []
    try:
        lines = (directory / PROGRESS_FILE).read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return []
    except OSError as e:
        raise RunError(f"run directory {str(directory)!r}: cannot read {PROGRESS_FILE} ({e})") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            result = json.loads(line)
        except ValueError:
            if number == len(lines):
                continue  # a run still writing its last line
            raise RunError(f"{str(directory / PROGRESS_FILE)!r}: line {number} is not JSON") from None
        if isinstance(result, dict):
            results.append(flatten_result(result))
    return results


def _read_experiment(directory: Path) -> list[_Run]:
    """Each trial of a Tune experiment: its run directory, labelled by its searched config."""
    try:
        searched = [
            str(key)
            for key in json.loads((directory / EXPERIMENT_FILE).read_text(encoding="utf-8")).get("searched", [])
        ]
    except (OSError, ValueError, AttributeError) as e:
        raise RunError(f"experiment directory {str(directory)!r}: cannot read {EXPERIMENT_FILE} ({e})") from None
    trials = sorted(entry for entry in directory.iterdir() if (entry / PARAMS_FILE).is_file())
    if not trials:
        raise RunError(f"experiment directory {str(directory)!r} has no trial directories (with {PARAMS_FILE}) yet")
    runs = []
    for trial in trials:
        run = _read_run(trial)
        shown = ", ".join(f"{key}={_text(result_value(run.config, key))}" for key in searched)
        runs.append(dataclasses.replace(run, trial_label=shown or trial.name))
    return runs


def _text(value: Any) -> str:
    return (
        f"{value:.4g}"
        if isinstance(value, float)
        else json.dumps(value)
        if isinstance(value, (list, dict))
        else str(value)
    )


def _names(runs: Sequence[_Run]) -> str:
    return ", ".join(repr(str(run.directory)) for run in runs)


def _points(results: Sequence[Mapping[str, Any]], x: str, y: str) -> tuple[np.ndarray, np.ndarray]:
    """The (x, y) points of the results where both are finite numbers, sorted by x (the last y of a repeated x)."""
    points: dict[float, float] = {}
    for result in results:
        xv, yv = finite_number(result.get(x)), finite_number(result.get(y))
        if xv is not None and yv is not None:
            points[xv] = yv
    xs = np.array(sorted(points), dtype=np.float64)
    return xs, np.array([points[v] for v in xs], dtype=np.float64)


def _raise_for_missing_keys(runs: Sequence[_Run], x: str, y: str) -> None:
    numeric = sorted(
        {
            key
            for run in runs
            for result in run.results
            for key, value in result.items()
            if finite_number(value) is not None
        }
    )
    problems = []
    for role, key in (("--x", x), ("--y", y)):
        if key in numeric:
            continue
        close = difflib.get_close_matches(key, numeric, n=_CLOSE_KEYS, cutoff=0.6)
        tail = key.rsplit("/", 1)[-1]
        close += [k for k in numeric if tail in k and k not in close][: _CLOSE_KEYS - len(close)]
        hint = (
            f"keys close to it: {', '.join(close)}"
            if close
            else f"numeric keys: {', '.join(numeric[:_CLOSE_KEYS])}, ..."
        )
        problems.append(f"{role} {key!r} is in no result ({hint})")
    if not problems:
        problems.append(f"no result holds finite values of both {x!r} and {y!r}")
    raise RunError(f"nothing to plot from {_names(runs)}: {'; '.join(problems)}")


# --- groups -----------------------------------------------------------------------------------------


def _group(
    series: Sequence[tuple[_Run, np.ndarray, np.ndarray]],
) -> list[tuple[str, list[tuple[np.ndarray, np.ndarray, Path]]]]:
    """``(label, [(xs, ys, run directory), ...])`` per curve, in the order the runs were given."""
    members: dict[Any, list[tuple[np.ndarray, np.ndarray, Path]]] = {}
    settings: dict[Any, _Run] = {}
    for run, xs, ys in series:
        if run.trial_label is not None:
            key: Any = ("trial", str(run.directory))
        else:
            without_seed = {k: v for k, v in run.config.items() if k != "seed"}
            key = (run.algo, run.env, json.dumps(without_seed, sort_keys=True, default=str))
        members.setdefault(key, []).append((xs, ys, run.directory))
        settings.setdefault(key, run)
    return [(_label(settings[key], list(settings.values()), len(runs)), runs) for key, runs in members.items()]


def _label(run: _Run, others: Sequence[_Run], count: int) -> str:
    if run.trial_label is not None:
        return run.trial_label
    label = f"{run.algo} {run.env}"
    # Groups of one algorithm and env differ in their configs: name the keys they differ in.
    same = [other for other in others if other.trial_label is None and (other.algo, other.env) == (run.algo, run.env)]
    differing = sorted(
        {
            key
            for other in same
            for key in set(run.config) | set(other.config)
            if key != "seed" and other.config.get(key) != run.config.get(key)
        }
    )
    if differing:
        label += " " + ", ".join(f"{key}={_text(run.config.get(key))}" for key in differing[:3])
    if count > 1:
        label += f" ({count} runs)"
    elif run.config.get("seed") is not None:
        label += f" (seed {run.config['seed']})"
    return label


def _aggregate(label: str, members: Sequence[tuple[np.ndarray, np.ndarray, Path]]) -> CurveGroup:
    """The group's mean and std on the common grid (see the module doc); one run is its own points."""
    runs = tuple(directory for _, _, directory in members)
    if len(members) == 1:
        xs, ys, _ = members[0]
        return CurveGroup(label, runs, xs, ys, np.zeros_like(ys))
    low = max(float(xs[0]) for xs, _, _ in members)
    high = min(float(xs[-1]) for xs, _, _ in members)
    if low > high:
        ranges = "; ".join(f"{directory}: {xs[0]:g} to {xs[-1]:g}" for xs, _, directory in members)
        raise RunError(
            f"the runs of {label!r} share no range of x to average them over ({ranges}); "
            "plot them one by one, or choose another --x"
        )
    grid = np.unique(np.concatenate([xs[(xs >= low) & (xs <= high)] for xs, _, _ in members]))
    values = np.stack([np.interp(grid, xs, ys) for xs, ys, _ in members])
    return CurveGroup(label, runs, grid, values.mean(axis=0), values.std(axis=0))
