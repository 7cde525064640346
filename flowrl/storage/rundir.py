"""The run directory: its layout, the ``params.json`` spec and stop criteria, and the readers of what a run left.

One run directory per run, named by the run (``name``) or by its algorithm, env and start time, created
private (:data:`PRIVATE_UMASK`)::

    <results_dir>/<algo>_<env>_<YYYYmmdd-HHMMSS>/
        run.lock           while a driver writes the run: its host and pid (flowrl.storage.lock)
        params.json        algo, env, the full validated config, stop criteria, checkpoint cadence
        plan.json          the plan's graph: operators, actors, edges (rewritten on resume)
        progress.jsonl     one result dict per training iteration (JSON; NaN written as null)
        progress.csv       the same, one row per iteration, nested keys flattened to a/b columns
        events.out.tfevents.*  TensorBoard scalars of every numeric result key, at step timesteps_total
        trackers.json      with wandb_project / mlflow_tracking_uri: the W&B and MLflow run ids
        checkpoints/checkpoint_<iteration>/    the newest ``keep_checkpoints`` of them
        checkpoints/best/                      with ``keep_best``: a copy of the best one so far
        videos/iteration_<iteration>.mp4       with evaluation_video: the first episode of each evaluation
        trace/iteration_<iteration>.json       the spans of the iterations trace_iterations names (flowrl trace)

On a Ray cluster, start it under a ``storage_path`` instead of ``results_dir``: an absolute path
every node mounts (NFS, a bucket mount), checked before training starts
(:func:`~flowrl.storage.shared.check_storage_path`) and recorded in ``params.json``, so that any node
can resume the run, by its path or by its name under the storage path (:func:`find_run_dir`).

This module knows the files; :mod:`flowrl.runs.run` starts and trains a run that writes them, and
:mod:`flowrl.runs.resume` continues one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import json
import math
import os
import re
import shutil
import time
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flowrl.errors import CheckpointError, ConfigError, RunError, RunWarning
from flowrl.storage.checkpoints import (
    METADATA_FILE,
    is_plain_name,
    list_checkpoints,
    read_metadata,
    verify_checkpoint,
)
from flowrl.storage.lock import LOCK_FILE, RunLock
from flowrl.storage.results import finite_number, result_value
from flowrl.storage.shared import storage_root

DEFAULT_RESULTS_DIR = "flowrl_results"
PARAMS_FILE = "params.json"
PROGRESS_FILE = "progress.jsonl"
PLAN_FILE = "plan.json"  # the plan's graph (flowrl.plan.graph.PlanGraph.to_dict), read by flowrl plan RUN_DIR
TRACE_DIR = "trace"  # the spans of the traced iterations (flowrl.plan.trace), read by flowrl trace
CHECKPOINTS_DIR = "checkpoints"
EXPERIMENT_FILE = "spec.json"  # in a flowrl tune experiment directory: its spec, metric and mode
BEST_CHECKPOINT = "best"  # checkpoints/best: the copy keep_best keeps
DEFAULT_CHECKPOINT_INTERVAL_S = 600.0
DEFAULT_KEEP_CHECKPOINTS = 5
STORAGE_PATH_KEY = "storage_path"  # in params.json: the shared directory a run was started under
#: The umask a run writes its directory under unless told otherwise: directories 0700, files 0600, since
#: checkpoints hold the policy, the config and pickles.
PRIVATE_UMASK = 0o077

#: The evaluation's mean reward (``result["evaluation"]["episode_reward_mean"]``): what a run that
#: evaluates during training keeps its best checkpoint by, unless ``keep_best`` names another key.
EVALUATION_REWARD = "evaluation/episode_reward_mean"
EVALUATION_KEY_PREFIX = "evaluation/"
VIDEOS_DIR = "videos"

# The result keys a stop criterion may name: a run stops once result[key] >= the criterion's value.
STOP_KEYS = ("episode_reward_mean", "timesteps_total", "training_iteration", EVALUATION_REWARD)


# --- stop criteria ----------------------------------------------------------------------------------


def parse_stop(stop: Any, source: str) -> dict[str, float]:
    """Check a ``stop`` mapping (keys among :data:`STOP_KEYS`, numeric values); ``source`` names it in errors."""
    if not isinstance(stop, Mapping):
        raise RunError(f"{source}: stop must be a mapping like {{training_iteration: 10}}, not {type(stop).__name__}")
    checked = {}
    for key, value in stop.items():
        if key not in STOP_KEYS:
            close = difflib.get_close_matches(str(key), list(STOP_KEYS), n=1, cutoff=0.5)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise RunError(f"{source}: unknown stop criterion {key!r}; {hint}valid: {', '.join(STOP_KEYS)}")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise RunError(f"{source}: stop {key}={value!r} must be a number")
        checked[key] = value
    return checked


def stop_reason(stop: Mapping[str, float], result: Mapping[str, Any]) -> str | None:
    """Which stop criterion ``result`` meets, as text (``"training_iteration 3 >= 3"``), or None."""
    for key, bound in stop.items():
        value = result_value(result, key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= bound:
            # Of the non-finite bounds a file can give, only -inf is ever met; the CLI has always shown it as n/a.
            return f"{key} {value:g} >= {bound:g}" if math.isfinite(bound) else f"{key} {value:g} >= n/a"
    return None


# --- what a run is ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunSpec:
    """What a run trains and when it stops and checkpoints: the contents of its ``params.json``.

    ``config`` holds the algorithm's config keys (keys left out keep their defaults; a
    started run's spec holds every key). ``stop`` maps keys of :data:`STOP_KEYS` to the
    value that ends training; with none, training runs until Ctrl-C (or SIGTERM, SIGHUP).

    Checkpoints: one every ``checkpoint_freq`` iterations (0: off) and one whenever
    ``checkpoint_interval_s`` seconds have passed since the last (0: off), and one at the end.
    Only the newest ``keep_checkpoints`` (>= 1) stay, besides the one a resumed run started
    from. ``keep_best`` names a result key (e.g. ``episode_reward_mean``; ``a/b`` for the nested
    ``result["a"]["b"]``): each checkpoint whose iteration has the highest finite value of it so far
    is copied to ``checkpoints/best``. A run whose config evaluates during training
    (``evaluation_interval``) keeps its best by :data:`EVALUATION_REWARD` unless ``keep_best`` says
    otherwise; with a key under ``evaluation/``, every iteration whose evaluation beats the kept best
    is saved at once, so that ``checkpoints/best`` is the best evaluated checkpoint.

    Every run writes TensorBoard event files and ``progress.csv`` (:mod:`flowrl.outputs.loggers`).
    ``wandb_project`` also logs it to that Weights & Biases project and ``mlflow_tracking_uri``
    to that MLflow tracking server or store (both need the ``tracking`` extra); a
    resumed run keeps logging to them, in the same tracker runs.
    """

    algo: str
    env: str
    config: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    stop: Mapping[str, float] = dataclasses.field(default_factory=dict)
    checkpoint_freq: int = 0
    checkpoint_interval_s: float = DEFAULT_CHECKPOINT_INTERVAL_S
    keep_checkpoints: int = DEFAULT_KEEP_CHECKPOINTS
    keep_best: str | None = None
    wandb_project: str | None = None
    mlflow_tracking_uri: str | None = None

    def __post_init__(self) -> None:
        problems = []
        freq = self.checkpoint_freq
        if isinstance(freq, bool) or not isinstance(freq, int) or freq < 0:
            problems.append(f"checkpoint_freq={freq!r} must be an integer >= 0 (0: no checkpoints by iteration count)")
        interval = self.checkpoint_interval_s
        if isinstance(interval, bool) or not isinstance(interval, (int, float)) or not 0 <= interval < math.inf:
            problems.append(
                f"checkpoint_interval_s={interval!r} must be a finite number of seconds >= 0 "
                "(0: no checkpoints by time)"
            )
        keep = self.keep_checkpoints
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            problems.append(
                f"keep_checkpoints={keep!r} must be an integer >= 1 (how many of the newest checkpoints stay)"
            )
        best = self.keep_best
        if best is not None and (not isinstance(best, str) or not best.strip()):
            problems.append(f"keep_best={best!r} must be the name of a result key, e.g. 'episode_reward_mean', or None")
        for key, example in (("wandb_project", "'cartpole'"), ("mlflow_tracking_uri", "'http://localhost:5000'")):
            value = getattr(self, key)
            if value is not None and (not isinstance(value, str) or not value.strip()):
                problems.append(f"{key}={value!r} must be a non-empty string, e.g. {example}, or None (not logged)")
        if problems:
            raise ConfigError(problems)
        # Copies, so that a caller changing its dicts later does not change a started run's spec.
        object.__setattr__(self, "config", dict(self.config))
        object.__setattr__(self, "stop", parse_stop(self.stop, "stop"))
        object.__setattr__(self, "checkpoint_interval_s", float(interval))

    def to_params(self) -> dict[str, Any]:
        """The ``params.json`` contents (the tracker settings only when set)."""
        params = {
            "algo": self.algo,
            "env": self.env,
            "config": dict(self.config),
            "stop": dict(self.stop),
            "checkpoint_freq": self.checkpoint_freq,
            "checkpoint_interval_s": self.checkpoint_interval_s,
            "keep_checkpoints": self.keep_checkpoints,
            "keep_best": self.keep_best,
        }
        params.update({key: getattr(self, key) for key in _TRACKER_SETTINGS if getattr(self, key) is not None})
        return params


# RunSpec's checkpoint settings: params.json files older than some of them lack them (their defaults apply).
_CHECKPOINT_SETTINGS = ("checkpoint_freq", "checkpoint_interval_s", "keep_checkpoints", "keep_best")
_TRACKER_SETTINGS = ("wandb_project", "mlflow_tracking_uri")  # absent from params.json when not set


def read_run_spec(run_dir: str | os.PathLike[str]) -> RunSpec:
    """The :class:`RunSpec` in a run directory's ``params.json``; :class:`RunError` if it is not a run directory."""
    return _read_params(Path(run_dir))[0]


def read_json_in(directory: Path, name: str, *, kind: str, not_one: str) -> Any:
    """The JSON file ``name`` of ``directory``, a ``kind`` (e.g. ``"run directory"``); :class:`RunError` when there
    is no such directory, when it lacks the file (then it "is not ``not_one``") or when the file cannot be read."""
    if not directory.is_dir():
        raise RunError(f"{kind} {str(directory)!r}: no such directory")
    try:
        return json.loads((directory / name).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RunError(f"{str(directory)!r} is not {not_one}: it has no {name}") from None
    except (OSError, ValueError) as e:
        raise RunError(f"{kind} {str(directory)!r}: cannot read {name} ({e})") from None


def _read_params(run_dir: Path) -> tuple[RunSpec, Path | None]:
    """A run directory's :class:`RunSpec` and the storage path it was started under (None: none), from
    ``params.json``."""
    path = run_dir / PARAMS_FILE
    params = read_json_in(run_dir, PARAMS_FILE, kind="run directory", not_one="a flowrl run directory")
    if not isinstance(params, dict) or not all(
        isinstance(params.get(k), t) for k, t in (("algo", str), ("env", str), ("config", dict))
    ):
        raise RunError(
            f"run directory {str(run_dir)!r}: {PARAMS_FILE} lacks algo, env or config; "
            "it was not written by flowrl train"
        )
    stop = parse_stop(params.get("stop") or {}, f"{path}")
    settings = {key: params[key] for key in _CHECKPOINT_SETTINGS + _TRACKER_SETTINGS if params.get(key) is not None}
    try:
        spec = RunSpec(params["algo"], params["env"], params["config"], stop, **settings)
    except ConfigError as e:
        raise RunError(f"{path}: {'; '.join(e.problems)}") from None
    storage = params.get(STORAGE_PATH_KEY)
    if storage is not None and not (isinstance(storage, str) and Path(storage).is_absolute()):
        raise RunError(f"{path}: {STORAGE_PATH_KEY}={storage!r} must be an absolute path (or absent)")
    return spec, None if storage is None else Path(storage)


# --- files of a run directory -----------------------------------------------------------------------


def json_safe(value: Any) -> Any:
    """``value`` as plain JSON data: NaN and infinities become None, numpy and torch values Python ones."""
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [json_safe(v) for v in value]
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    tolist = getattr(value, "tolist", None)  # numpy scalars and arrays, torch tensors
    if callable(tolist):
        return json_safe(tolist())
    return str(value)


def check_run_name(name: str) -> str:
    """``name`` if it can name a run directory (one path component: no ``/``, not ``.`` or ``..``), else
    :class:`~flowrl.errors.RunError`."""
    if not is_plain_name(name):
        raise RunError(
            f"run name {name!r} cannot name a run directory: give one directory name, without '/', "
            "e.g. 'apex1' or 'ppo-cartpole-seed0'"
        )
    return name


def run_parent(results_dir: str | os.PathLike[str] | None, storage_path: str | os.PathLike[str] | None) -> Path:
    """The directory run directories go in: ``storage_path`` if given (it must be absolute), else
    ``results_dir``, else ``./flowrl_results``."""
    if storage_path is not None:
        return storage_root(storage_path)
    return Path(DEFAULT_RESULTS_DIR if results_dir is None else results_dir)


def named_run_dir(
    name: str, *, results_dir: str | os.PathLike[str] | None = None, storage_path: str | os.PathLike[str] | None = None
) -> Path:
    """The run directory named ``name``: under ``storage_path`` if given, else under ``results_dir``
    (None: ``./flowrl_results``); it may not exist."""
    check_run_name(name)
    return run_parent(results_dir, storage_path) / name


def open_run_dir(
    parent: Path, algo: str, env: str, *, name: str | None = None, restart_unfinished: bool = False
) -> tuple[Path, RunLock]:
    """Create a new run directory under ``parent`` and take its lock (:class:`~flowrl.storage.lock.RunLock`).

    Its name is ``name``, else ``<algo>_<env>_<YYYYmmdd-HHMMSS>``. A run directory ``name`` that
    exists already raises :class:`~flowrl.errors.RunError` (a run is never overwritten), except with
    ``restart_unfinished`` when it is a run that ended before its first checkpoint: its files are
    removed (with a :class:`~flowrl.errors.RunWarning`) and the new run starts in it. A directory
    another driver is writing raises :class:`~flowrl.storage.lock.RunLockedError`.
    """
    if name is None:
        directory = _make_run_dir(parent, algo, env)
        return directory, RunLock.acquire(directory)
    parent.mkdir(parents=True, exist_ok=True)
    directory = parent / check_run_name(name)
    try:
        directory.mkdir()
    except FileExistsError:
        if not directory.is_dir():
            raise RunError(f"cannot create run directory {str(directory)!r}: a file of that name exists") from None
    else:
        (directory / CHECKPOINTS_DIR).mkdir()
        return directory, RunLock.acquire(directory)
    lock = RunLock.acquire(directory)
    try:
        _restart_unfinished(directory, restart_unfinished)
    except BaseException:
        lock.release()
        raise
    return directory, lock


def _restart_unfinished(directory: Path, allowed: bool) -> None:
    """Empty ``directory`` (all but its lock) for a new run, if it is an unfinished run and ``allowed``; else raise."""
    entries = [path for path in directory.iterdir() if path.name != LOCK_FILE]
    if not entries:
        (directory / CHECKPOINTS_DIR).mkdir()
        return
    if list_checkpoints(directory / CHECKPOINTS_DIR) or not allowed:
        raise RunError(
            f"run directory {str(directory)!r} already exists; a run is never overwritten: resume it "
            f"(flowrl train --resume {directory}, or the same command with --name {directory.name} "
            "--resume-if-exists), or give another name"
        )
    if not (directory / PARAMS_FILE).is_file():
        raise RunError(
            f"{str(directory)!r} exists and is not a flowrl run directory (it has no {PARAMS_FILE}): give another name"
        )
    warnings.warn(
        f"run directory {str(directory)!r} holds no checkpoint (its run ended before the first): starting it again",
        RunWarning,
        stacklevel=3,
    )
    for path in entries:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    (directory / CHECKPOINTS_DIR).mkdir()


def _make_run_dir(results_dir: Path, algo: str, env: str) -> Path:
    """Create ``<results_dir>/<algo>_<env>_<YYYYmmdd-HHMMSS>`` (with ``_1``, ``_2``... if taken)."""
    stem = f"{algo}_{re.sub(r'[^A-Za-z0-9._-]+', '_', env)}_{time.strftime('%Y%m%d-%H%M%S')}"
    results_dir.mkdir(parents=True, exist_ok=True)
    for n in range(1000):
        run_dir = results_dir / (stem if n == 0 else f"{stem}_{n}")
        try:
            run_dir.mkdir()
        except FileExistsError:
            continue
        (run_dir / CHECKPOINTS_DIR).mkdir()
        return run_dir
    raise RunError(f"cannot create a run directory {stem!r} under {str(results_dir)!r}: every numbered name is taken")


@contextlib.contextmanager
def applied_umask(umask: int | None) -> Iterator[None]:
    """Within the block, the process creates files and directories under ``umask`` (None: the umask as it is).

    The previous umask comes back when the block ends. A umask is the whole process's: threads that
    create files meanwhile (TensorBoard's writer) get it too.
    """
    if umask is None:
        yield
        return
    previous = os.umask(umask)
    try:
        yield
    finally:
        os.umask(previous)


def parse_umask(text: str) -> int:
    """A umask written in octal (``"022"``, ``"0o077"``) as a number; :class:`ValueError` if it is not one."""
    digits = text.strip().lower().removeprefix("0o")
    if not digits or any(c not in "01234567" for c in digits) or int(digits, 8) > 0o777:
        raise ValueError(f"{text!r} is not a umask: give 3 octal digits, e.g. 022 (files 0644, directories 0755)")
    return int(digits, 8)


def _replace_file(path: Path, text: str) -> None:
    """Write ``path`` through a temporary sibling and a rename: a reader never sees half of it."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _write_json(path: Path, data: Any) -> None:
    _replace_file(path, json.dumps(json_safe(data), indent=2, allow_nan=False) + "\n")


def _write_params(run_dir: Path, spec: RunSpec, storage_path: Path | None) -> None:
    """Write ``params.json``: the spec, and the storage path of a run started under one."""
    params = spec.to_params()
    if storage_path is not None:
        params[STORAGE_PATH_KEY] = str(storage_path)
    _write_json(run_dir / PARAMS_FILE, params)


_RUNS_SHOWN = 5  # run directories an unknown name's error lists


def find_run_dir(run: str | os.PathLike[str], storage_path: str | os.PathLike[str] | None = None) -> Path:
    """The run directory ``run`` names: ``run`` itself, or with ``storage_path``, ``run`` under it.

    With a storage path, ``run`` is usually a run directory's name there
    (``ppo_CartPole-v1_20261124-010203``); an absolute ``run`` is taken as it is. Raises
    :class:`~flowrl.errors.RunError` if the storage path is relative or missing, or holds no
    such directory (the error lists the newest run directories it does hold).
    """
    if storage_path is None:
        return Path(run)
    root = storage_root(storage_path)
    directory = root / run
    if directory.is_dir():
        return directory
    if not root.is_dir():
        raise RunError(
            f"storage path {str(root)!r} does not exist on this node (is the shared filesystem mounted here?)"
        )
    runs = _runs_under(root)
    shown = ", ".join(path.name for path in runs[:_RUNS_SHOWN])
    if len(runs) > _RUNS_SHOWN:
        shown += f" ({len(runs)} in all)"
    held = f"the newest there: {shown}" if runs else "it holds no run directories"
    raise RunError(f"no run directory {str(run)!r} under storage path {str(root)!r}; {held}")


def _runs_under(root: Path) -> list[Path]:
    """The run directories (those with a ``params.json``) directly under ``root``, newest first.

    Newest by ``params.json``'s time: written when a run starts, rewritten when it resumes.
    """
    runs: list[tuple[float, Path]] = []
    for path in root.iterdir():
        with contextlib.suppress(OSError):  # no params.json (not a run), or gone meanwhile
            runs.append(((path / PARAMS_FILE).stat().st_mtime, path))
    return [path for _, path in sorted(runs, key=lambda pair: pair[0], reverse=True)]


def _read_progress(path: Path) -> tuple[list[dict[str, Any]], bool]:
    """The results in ``progress.jsonl`` up to its first damaged line, and whether the file is intact."""
    if not path.is_file():
        return [], True
    text = path.read_text(encoding="utf-8")
    results = []
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            results.append(json.loads(line))
        except ValueError:
            return results, False  # a line cut short by a crash: everything after it is unreliable
    return results, text == "" or text.endswith("\n")


def read_results(run_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The results a run directory's ``progress.jsonl`` holds (up to a line a crash cut short).

    Raises :class:`~flowrl.errors.RunError` for a directory that is not a flowrl run directory.
    """
    directory = Path(run_dir)
    read_run_spec(directory)  # a clear error for anything but a run directory
    return _read_progress(directory / PROGRESS_FILE)[0]


def _checkpoint_progress(checkpoint: Path) -> tuple[int, int]:
    """``(iteration, timesteps_total)`` from a checkpoint's metadata, read without loading its state."""
    try:
        metadata = json.loads((checkpoint / METADATA_FILE).read_text(encoding="utf-8"))
        return int(metadata["iteration"]), int(metadata.get("timesteps_total") or 0)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CheckpointError(
            f"checkpoint {str(checkpoint)!r}: unreadable {METADATA_FILE} ({type(e).__name__}: {e})"
        ) from None


def kept_best_value(checkpoints: Path, metric: str | None) -> float | None:
    """The ``metric`` value recorded in ``checkpoints/best`` (None: no usable best checkpoint for that metric)."""
    best = checkpoints / BEST_CHECKPOINT
    if metric is None or not best.is_dir():
        return None
    try:
        verify_checkpoint(best)  # a damaged best copy is replaced by the next save, whatever its value
        recorded = read_metadata(best).get("keep_best")
    except (CheckpointError, OSError):
        return None
    if not isinstance(recorded, Mapping) or recorded.get("metric") != metric:
        return None  # kept by another metric: the first save under this one replaces it
    return finite_number(recorded.get("value"))
