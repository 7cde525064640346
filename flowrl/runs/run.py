"""A run: a run directory, the Trainer that writes it, and the loop that trains until a stop criterion.

One run directory per run::

    <results_dir>/<algo>_<env>_<YYYYmmdd-HHMMSS>/
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
every node mounts (NFS, a bucket mount), checked before training starts (:func:`check_storage_path`)
and recorded in ``params.json``, so that any node can resume the run, by its path or by its name
under the storage path (:func:`find_run_dir`).

Start one, train it, and read its summary::

    from flowrl.runs.run import RunSpec, start_run

    spec = RunSpec("ppo", "CartPole-v1", {"num_workers": 0}, stop={"training_iteration": 10}, checkpoint_freq=5)
    with start_run(spec, results_dir="flowrl_results") as run:
        summary = run.train(on_result=lambda result: print(result["episode_reward_mean"]))
    print(summary.stop_reason, summary.best_reward, summary.checkpoint)

Runs are not lost. :meth:`Run.train` checkpoints every ``checkpoint_freq`` iterations and every
``checkpoint_interval_s`` seconds (10 minutes by default), keeps the newest ``keep_checkpoints``
of them (and, with ``keep_best``, a copy of the best), and saves at the end. Ctrl-C, SIGTERM and
SIGHUP end training with a checkpoint and a summary naming the signal (:attr:`RunSummary.interrupted_by`);
an error ends it with an emergency checkpoint when the Trainer's state is intact, described in
:attr:`Run.failure`, and then propagates.

Resume one from its latest usable checkpoint (its algorithm, env and config are kept; the stop
criteria, checkpoint cadence, number of workers and Ray address may change)::

    point = find_resume_point(run_dir, stop={"training_iteration": 20})
    if point.stop_reason is None:  # else the run already meets its stop criteria
        with resume_run(point) as run:
            run.train()

A checkpoint that fails its checks (incomplete, or a checksum that does not match) is skipped
with a :class:`RunWarning`, and the one before it is used (:attr:`ResumePoint.skipped`).

The ``flowrl train`` command is a shell over this module; it only parses flags and prints.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import json
import math
import os
import re
import signal
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, NamedTuple

from flowrl.storage.checkpoints import (
    METADATA_FILE,
    copy_checkpoint,
    list_checkpoints,
    prune_checkpoints,
    read_metadata,
    verify_checkpoint,
)
from flowrl.config import parse_iteration_window
from flowrl.errors import CheckpointError, ConfigError, RunError
from flowrl.storage.results import finite_number, result_value
from flowrl.outputs.loggers import ResultLogger, check_trackers, open_loggers
from flowrl.storage.shared import check_storage_path, probe_storage, storage_root

if TYPE_CHECKING:  # the Trainer imports torch: load it only when a run starts
    from typing_extensions import Self

    from flowrl.engine.trainer import Trainer

DEFAULT_RESULTS_DIR = "flowrl_results"
PARAMS_FILE = "params.json"
PROGRESS_FILE = "progress.jsonl"
PLAN_FILE = "plan.json"  # the plan's graph (flowrl.plan.PlanGraph.to_dict), read by flowrl plan RUN_DIR
TRACE_DIR = "trace"  # the spans of the traced iterations (flowrl.plan.trace), read by flowrl trace
CHECKPOINTS_DIR = "checkpoints"
BEST_CHECKPOINT = "best"  # checkpoints/best: the copy keep_best keeps
DEFAULT_CHECKPOINT_INTERVAL_S = 600.0
DEFAULT_KEEP_CHECKPOINTS = 5
STORAGE_PATH_KEY = "storage_path"  # in params.json: the shared directory a run was started under

#: The evaluation's mean reward (``result["evaluation"]["episode_reward_mean"]``): what a run that
#: evaluates during training keeps its best checkpoint by, unless ``keep_best`` names another key.
EVALUATION_REWARD = "evaluation/episode_reward_mean"
EVALUATION_KEY_PREFIX = "evaluation/"
VIDEOS_DIR = "videos"

# The result keys a stop criterion may name: a run stops once result[key] >= the criterion's value.
STOP_KEYS = ("episode_reward_mean", "timesteps_total", "training_iteration", EVALUATION_REWARD)

# The signals Run.train turns into a checkpoint and a summary, as Python already does with SIGINT (Ctrl-C).
HANDLED_SIGNALS: tuple[signal.Signals, ...] = tuple(
    getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name)
)


class RunWarning(UserWarning):
    """Something about a run a user should know, that does not stop it (a skipped checkpoint, a metric never seen)."""


class SignalInterrupt(KeyboardInterrupt):
    """Raised in the main thread by the handlers :meth:`Run.train` installs for :data:`HANDLED_SIGNALS`.

    A ``KeyboardInterrupt``, so that everything treats SIGTERM and SIGHUP as it treats Ctrl-C
    (``except Exception`` lets it through); ``signal`` is the signal received.
    """

    def __init__(self, signum: int) -> None:
        self.signal = signal.Signals(signum)
        super().__init__(f"received {self.signal.name}")


# The signals the handlers of interrupting_signals() received in the current block. A signal that
# lands in a blocking Ray call (ray.get, ray.wait) may surface as a plain KeyboardInterrupt rather
# than the handler's SignalInterrupt, so the exception alone cannot always say which signal it was.
_received: list[signal.Signals] = []


def interrupt_signal(interrupt: KeyboardInterrupt) -> signal.Signals:
    """The signal behind ``interrupt``: SIGTERM or SIGHUP received by :func:`interrupting_signals`' handlers, else SIGINT."""
    if isinstance(interrupt, SignalInterrupt):
        return interrupt.signal
    return _received[-1] if _received else signal.SIGINT


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    _received.append(signal.Signals(signum))
    raise SignalInterrupt(signum)


@contextlib.contextmanager
def interrupting_signals() -> Iterator[None]:
    """Within the block, SIGTERM and SIGHUP raise :class:`SignalInterrupt` in the main thread.

    The previous handlers come back when the block ends. Nothing changes outside the main
    thread (Python runs signal handlers only there), nor for a signal that is ignored
    (``nohup`` ignores SIGHUP so that a command outlives its terminal: so does the run).
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _received.clear()
    previous: dict[signal.Signals, Any] = {}
    try:
        for signum in HANDLED_SIGNALS:
            handler = signal.getsignal(signum)
            if handler is signal.SIG_IGN:
                continue
            # None: a handler set outside Python, which cannot be put back; the default action is the closest.
            previous[signum] = signal.SIG_DFL if handler is None else handler
            signal.signal(signum, _raise_interrupt)
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


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
    to that MLflow tracking server or store (both need ``pip install 'flowrl-ray[tracking]'``); a
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
            problems.append(f"checkpoint_interval_s={interval!r} must be a finite number of seconds >= 0 "
                            "(0: no checkpoints by time)")
        keep = self.keep_checkpoints
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            problems.append(f"keep_checkpoints={keep!r} must be an integer >= 1 (how many of the newest checkpoints stay)")
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
        params = {"algo": self.algo, "env": self.env, "config": dict(self.config), "stop": dict(self.stop),
                  "checkpoint_freq": self.checkpoint_freq, "checkpoint_interval_s": self.checkpoint_interval_s,
                  "keep_checkpoints": self.keep_checkpoints, "keep_best": self.keep_best}
        params.update({key: getattr(self, key) for key in _TRACKER_SETTINGS if getattr(self, key) is not None})
        return params


# RunSpec's checkpoint settings: params.json files older than some of them lack them (their defaults apply).
_CHECKPOINT_SETTINGS = ("checkpoint_freq", "checkpoint_interval_s", "keep_checkpoints", "keep_best")
_TRACKER_SETTINGS = ("wandb_project", "mlflow_tracking_uri")  # absent from params.json when not set


def read_run_spec(run_dir: str | os.PathLike[str]) -> RunSpec:
    """The :class:`RunSpec` in a run directory's ``params.json``; :class:`RunError` if it is not a run directory."""
    return _read_params(Path(run_dir))[0]


def _read_params(run_dir: Path) -> tuple[RunSpec, Path | None]:
    """A run directory's :class:`RunSpec` and the storage path it was started under (None: none), from ``params.json``."""
    path = run_dir / PARAMS_FILE
    if not run_dir.is_dir():
        raise RunError(f"run directory {str(run_dir)!r}: no such directory")
    try:
        params = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RunError(f"run directory {str(run_dir)!r} is not a flowrl run directory: it has no {PARAMS_FILE}") from None
    except (OSError, ValueError) as e:
        raise RunError(f"run directory {str(run_dir)!r}: cannot read {PARAMS_FILE} ({e})") from None
    if not isinstance(params, dict) or not all(isinstance(params.get(k), t) for k, t in (("algo", str), ("env", str), ("config", dict))):
        raise RunError(f"run directory {str(run_dir)!r}: {PARAMS_FILE} lacks algo, env or config; it was not written by flowrl train")
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
    criterion had ended training).
    """

    directory: Path
    stop_reason: str | None
    best_reward: float | None
    best_iteration: int | None
    checkpoint: Path | None
    save_interrupted: bool = False
    interrupted_by: signal.Signals | None = None

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


def _default_keep_best(keep_best: str | None, evaluation_interval: int | None) -> str | None:
    """``keep_best`` as given, else :data:`EVALUATION_REWARD` for a run that evaluates during training."""
    return EVALUATION_REWARD if keep_best is None and evaluation_interval else keep_best


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


def write_plan(run_dir: str | os.PathLike[str], trainer: Trainer) -> None:
    """Write ``plan.json`` into ``run_dir``: the graph of the plan ``trainer`` runs (read by ``flowrl plan RUN_DIR``)."""
    _write_json(Path(run_dir) / PLAN_FILE, trainer.plan.graph.to_dict())


def traced_window(trainer: Trainer) -> tuple[int, int] | None:
    """The iterations whose spans a run of ``trainer`` records (its config's ``trace_iterations``): None when
    ``profile`` is off, which measures no operator."""
    return parse_iteration_window(trainer.config.trace_iterations) if trainer.config.profile else None


def train_iteration(trainer: Trainer, run_dir: str | os.PathLike[str], traced: tuple[int, int] | None) -> dict[str, Any]:
    """One training iteration of ``trainer``; when ``traced`` (first, last) holds it, its spans are recorded and
    written to ``<run_dir>/trace/iteration_<n>.json`` (see :mod:`flowrl.plan.trace`)."""
    iteration = trainer.iteration + 1
    if traced is None or not traced[0] <= iteration <= traced[1]:
        return trainer.train()
    from flowrl.plan.trace import trace_file, traced_iteration

    result, record = traced_iteration(trainer)
    path = trace_file(run_dir, iteration)
    path.parent.mkdir(exist_ok=True)
    _write_json(path, record)
    return result


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
        raise RunError(f"storage path {str(root)!r} does not exist on this node (is the shared filesystem mounted here?)")
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
        raise CheckpointError(f"checkpoint {str(checkpoint)!r}: unreadable {METADATA_FILE} ({type(e).__name__}: {e})") from None


def _kept_best_value(checkpoints: Path, metric: str | None) -> float | None:
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


def _better(best: tuple[float, int] | None, result: Mapping[str, Any]) -> tuple[float, int] | None:
    """``best`` or ``result``'s ``(episode_reward_mean, training_iteration)``, whichever reward is higher."""
    reward = finite_number(result.get("episode_reward_mean"))
    if reward is None or (best is not None and reward <= best[0]):
        return best
    return reward, int(result.get("training_iteration") or 0)


# --- a run in progress ------------------------------------------------------------------------------


class Run:
    """A run directory and the Trainer writing it; made by :func:`start_run` or :func:`resume_run`.

    ``directory`` is the run directory, ``spec`` what ``params.json`` holds, ``trainer``
    the :class:`~flowrl.engine.trainer.Trainer`, ``checkpoint`` the latest complete checkpoint
    (None until one is saved), ``resumed_from`` the checkpoint a resumed run started from
    (never deleted by rotation), and ``failure`` what was saved when an error ended
    :meth:`train` (None otherwise). ``loggers`` get every result (TensorBoard, ``progress.csv``,
    the trackers: see :func:`~flowrl.outputs.loggers.open_loggers`); append your own
    :class:`~flowrl.outputs.loggers.ResultLogger` to add one. :meth:`close` (or leaving a ``with`` block)
    closes the loggers and stops the Trainer.
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
    ) -> None:
        self.directory = directory
        self.spec = spec
        self.trainer = trainer
        self.loggers = list(loggers)
        self._failed_loggers: set[int] = set()  # id() of the loggers already warned about
        self.checkpoint = checkpoint
        self.resumed_from = checkpoint
        self.failure: RunFailure | None = None
        # A resumed run starts from its checkpoint: there is nothing new to save until it trains.
        self._saved_iteration = trainer.iteration if checkpoint is not None else None
        self._best: tuple[float, int] | None = None
        for result in previous_results:
            self._best = _better(self._best, result)
        self._kept_best = _kept_best_value(directory / CHECKPOINTS_DIR, spec.keep_best)
        self._last_result: Mapping[str, Any] | None = None
        self._last_save_time = time.monotonic()
        self._metric_seen = False
        self._warned_metric = False
        self._traced = traced_window(trainer)

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
        that raises is reported with a :class:`RunWarning`, once, and training goes on) and
        then given to ``on_result``.
        Checkpoints follow ``spec`` (see :class:`RunSpec`); each successful save is followed
        by the rotation to ``spec.keep_checkpoints`` and the ``keep_best`` copy, while a
        save that raises deletes nothing. At the end the last iteration is saved, unless it
        already is.

        Ctrl-C, SIGTERM and SIGHUP (handled while this method runs, when it runs in the
        main thread) end training with that final checkpoint; a second signal while it is
        written abandons it, and the previous checkpoint stays the latest. Any error
        (a :class:`~flowrl.errors.FlowRLError` such as a worker failure, or another
        exception) first writes an emergency checkpoint of the last finished iteration if
        the Trainer's state is intact (:meth:`~flowrl.engine.trainer.Trainer.state_problem`), sets
        :attr:`failure`, then propagates.
        """
        with interrupting_signals():
            return self._train(on_result)

    def _train(self, on_result: Callable[[dict[str, Any]], None] | None) -> RunSummary:
        self.failure = None
        self._last_save_time = time.monotonic()
        reason: str | None = None
        interrupted_by: signal.Signals | None = None
        saving = False
        try:
            with open(self.directory / PROGRESS_FILE, "a", encoding="utf-8") as progress:
                while reason is None:
                    result = train_iteration(self.trainer, self.directory, self._traced)
                    progress.write(json.dumps(json_safe(result), allow_nan=False) + "\n")
                    progress.flush()
                    self._log_result(result)
                    self._last_result = result
                    self._metric_seen = self._metric_seen or (
                        self.spec.keep_best is not None and result_value(result, self.spec.keep_best) is not None)
                    self._write_video()
                    if on_result is not None:
                        on_result(result)
                    self._best = _better(self._best, result)
                    if self._save_due() or self._evaluation_improved(result):
                        saving = True
                        self._save()
                        saving = False
                    reason = stop_reason(self.spec.stop, result)
        except KeyboardInterrupt as interrupt:
            interrupted_by = interrupt_signal(interrupt)
        except Exception as error:
            self.failure = self._save_failed(error) if saving else self._save_after_error(error)
            raise
        save_interrupted = False
        if self._unsaved():
            try:
                self._save()
            except KeyboardInterrupt as interrupt:
                save_interrupted = True
                interrupted_by = interrupted_by or interrupt_signal(interrupt)
            except Exception as error:
                self.failure = self._save_failed(error)
                raise
        best_reward, best_iteration = self._best if self._best is not None else (None, None)
        return RunSummary(self.directory, reason, best_reward, best_iteration, self.checkpoint, save_interrupted,
                          interrupted_by)

    def _unsaved(self) -> bool:
        """Whether a finished iteration is not in a checkpoint yet."""
        return self.trainer.iteration > 0 and self.trainer.iteration != self._saved_iteration

    def _save_due(self) -> bool:
        freq, interval = self.spec.checkpoint_freq, self.spec.checkpoint_interval_s
        if freq and self.trainer.iteration % freq == 0:
            return True
        return interval > 0 and time.monotonic() - self._last_save_time >= interval

    def _evaluation_improved(self, result: Mapping[str, Any]) -> bool:
        """Whether ``result``'s evaluation beats the kept best checkpoint's (kept by a key under ``evaluation/``)."""
        metric = self.spec.keep_best
        if metric is None or not metric.startswith(EVALUATION_KEY_PREFIX):
            return False
        value = finite_number(result_value(result, metric))
        return value is not None and (self._kept_best is None or value > self._kept_best)

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
        return RunFailure(error, self.checkpoint, saved=False,
                          not_saved_because=f"saving the checkpoint failed ({type(error).__name__})")

    def _save_after_error(self, error: BaseException) -> RunFailure:
        """Write the emergency checkpoint for ``error`` if there is something worth saving."""
        if not self._unsaved():
            return RunFailure(error, self.checkpoint, saved=False)
        try:
            problem = self.trainer.state_problem()
        except Exception as e:  # noqa: BLE001 - a trainer too broken to inspect is not worth saving
            problem = f"its state cannot be inspected ({type(e).__name__}: {e})"
        if problem is not None:
            return RunFailure(error, self.checkpoint, saved=False,
                              not_saved_because=f"the trainer's state is not intact: {problem}")
        try:
            self._save()
        except KeyboardInterrupt as interrupt:
            because = f"{interrupt_signal(interrupt).name} interrupted the save"
            return RunFailure(error, self.checkpoint, saved=False, not_saved_because=because)
        except Exception as e:  # noqa: BLE001 - the training error is the one to raise
            because = f"saving it failed ({type(e).__name__}: {e})"
            return RunFailure(error, self.checkpoint, saved=False, not_saved_because=because)
        return RunFailure(error, self.checkpoint, saved=True)

    def _save(self) -> None:
        """Save the last finished iteration, then keep the best copy and rotate (only once the save succeeded)."""
        checkpoints = self.directory / CHECKPOINTS_DIR
        metric = self.spec.keep_best
        value = None
        if metric is not None:
            self._warn_if_metric_unseen(metric)
            if self._last_result is not None and self._last_result.get("training_iteration") == self.trainer.iteration:
                value = finite_number(result_value(self._last_result, metric))
        best = value is not None and (self._kept_best is None or value > self._kept_best)
        metadata = {"keep_best": {"metric": metric, "value": value}} if best else None
        path = Path(self.trainer.save(checkpoints, metadata=metadata))
        self.checkpoint = path
        self._saved_iteration = self.trainer.iteration
        self._last_save_time = time.monotonic()
        if best:
            copy_checkpoint(path, checkpoints / BEST_CHECKPOINT)
            self._kept_best = value
        protect = [self.resumed_from] if self.resumed_from is not None else []
        prune_checkpoints(checkpoints, self.spec.keep_checkpoints, protect=protect)

    def _warn_if_metric_unseen(self, metric: str) -> None:
        if self._metric_seen or self._warned_metric or self._last_result is None:
            return
        interval = self.trainer.config.evaluation_interval
        if metric.startswith(EVALUATION_KEY_PREFIX) and interval and self.trainer.iteration < interval:
            return  # the first evaluation is still to come
        self._warned_metric = True
        close = difflib.get_close_matches(metric, [str(key) for key in self._last_result], n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        warnings.warn(
            f"keep_best={metric!r} is not a key of any result so far (up to iteration {self.trainer.iteration}); "
            f"no checkpoint is kept as best until it appears{hint}",
            RunWarning,
            stacklevel=2,
        )

    def _log_result(self, result: Mapping[str, Any]) -> None:
        for logger in self.loggers:
            try:
                logger.log_result(result)
            except Exception as e:  # noqa: BLE001 - a tracker outage or a full disk must not end the run
                self._logger_failed(logger, "logging a result", e)

    def _logger_failed(self, logger: ResultLogger, action: str, error: Exception) -> None:
        if id(logger) not in self._failed_loggers:
            self._failed_loggers.add(id(logger))
            warnings.warn(f"{type(logger).__name__} failed while {action} ({type(error).__name__}: {error}); "
                          f"progress.jsonl has every result (further failures of this logger are not reported)",
                          RunWarning, stacklevel=3)

    def close(self) -> None:
        """Close the loggers (finishing the tracker runs), then stop the Trainer: its actors, and Ray if it started it.

        A logger that fails to close is reported with a :class:`RunWarning`.
        """
        try:
            for logger in self.loggers:
                try:
                    logger.close()
                except Exception as e:  # noqa: BLE001 - the others, and the Trainer, must still close
                    self._logger_failed(logger, "closing", e)
        finally:
            self.trainer.stop()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"Run({str(self.directory)!r}, algo={self.spec.algo!r}, env={self.spec.env!r}, "
                f"iteration={self.trainer.iteration})")


def start_run(
    spec: RunSpec,
    *,
    results_dir: str | os.PathLike[str] | None = None,
    storage_path: str | os.PathLike[str] | None = None,
    address: str | None = None,
) -> Run:
    """Build the Trainer for ``spec``, then create its run directory with ``params.json`` and ``plan.json``.

    The run directory goes under ``results_dir`` (None: ``./flowrl_results``), or under
    ``storage_path``, an absolute path every node of the cluster mounts: it is checked first
    (:func:`check_storage_path`, before Ray starts) and recorded in ``params.json``. Giving
    both raises :class:`RunError`. The Trainer comes before the run directory, so that a
    config or env it rejects leaves none behind; ``params.json`` records the full validated
    config. ``address`` is the Ray cluster to join (None: ``$RAY_ADDRESS``, else an embedded local Ray).
    The run's loggers open last (:func:`~flowrl.outputs.loggers.open_loggers`); a tracker whose package
    is missing is reported before anything starts.
    """
    from flowrl.engine.trainer import Trainer

    check_trackers(spec.wandb_project, spec.mlflow_tracking_uri)
    if results_dir is not None and storage_path is not None:
        raise RunError(f"results_dir={str(results_dir)!r} and storage_path={str(storage_path)!r} both say where "
                       f"the run directory goes: give one (storage_path for a filesystem every node mounts)")
    storage = None if storage_path is None else check_storage_path(storage_path)
    parent = storage if storage is not None else Path(DEFAULT_RESULTS_DIR if results_dir is None else results_dir)
    trainer = Trainer(spec.algo, spec.env, dict(spec.config), address=address)
    try:
        directory = _make_run_dir(parent, trainer.algorithm.name, spec.env)
        spec = dataclasses.replace(spec, algo=trainer.algorithm.name, config=trainer.config.to_dict(),
                                   keep_best=_default_keep_best(spec.keep_best, trainer.config.evaluation_interval))
        _write_params(directory, spec, storage)
        write_plan(directory, trainer)
        loggers = open_loggers(directory, json_safe(spec.to_params()), wandb_project=spec.wandb_project,
                               mlflow_tracking_uri=spec.mlflow_tracking_uri)
    except BaseException:
        trainer.stop()
        raise
    return Run(directory, spec, trainer, loggers=loggers)


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
) -> ResumePoint:
    """Read a run directory and find where it resumes: its newest usable checkpoint and the results up to it.

    With ``storage_path``, ``run_dir`` may be a run directory's name under it (see
    :func:`find_run_dir`), and the run is taken to live there; without, a run started under a
    storage path keeps the one its ``params.json`` records. ``stop`` criteria replace the
    run's own key by key (the others are kept) and count the whole run; each checkpoint
    and tracker setting given (not None) replaces the run's own. Checkpoints are checked newest first
    (:func:`~flowrl.storage.checkpoints.verify_checkpoint`: complete, checksums match); one that fails
    is skipped with a :class:`RunWarning` and recorded in :attr:`ResumePoint.skipped`. Raises
    :class:`RunError` if ``run_dir`` is not a run directory and :class:`CheckpointError` if
    none of its checkpoints is usable.
    """
    directory = find_run_dir(run_dir, storage_path)
    spec, recorded_storage = _read_params(directory)
    storage = recorded_storage if storage_path is None else storage_root(storage_path)
    if storage is not None:
        # The resume command printed for the run must work from any working directory (and node).
        directory = Path(os.path.abspath(directory))
    spec = dataclasses.replace(
        spec,
        stop={**spec.stop, **(stop or {})},
        checkpoint_freq=spec.checkpoint_freq if checkpoint_freq is None else checkpoint_freq,
        checkpoint_interval_s=spec.checkpoint_interval_s if checkpoint_interval_s is None else checkpoint_interval_s,
        keep_checkpoints=spec.keep_checkpoints if keep_checkpoints is None else keep_checkpoints,
        keep_best=spec.keep_best if keep_best is None else keep_best,
        wandb_project=spec.wandb_project if wandb_project is None else wandb_project,
        mlflow_tracking_uri=spec.mlflow_tracking_uri if mlflow_tracking_uri is None else mlflow_tracking_uri,
    )
    candidates = list_checkpoints(directory / CHECKPOINTS_DIR)
    if not candidates:
        raise CheckpointError(f"run directory {str(directory)!r}: no checkpoint under {str(directory / CHECKPOINTS_DIR)!r} to resume from")
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
        raise CheckpointError(f"run directory {str(directory)!r}: none of its {len(skipped)} checkpoints is usable:\n{tried}")
    results, intact = _read_progress(directory / PROGRESS_FILE)
    kept = [r for r in results if int(r.get("training_iteration") or 0) <= iteration]
    # The checkpoint's own counts win: progress.jsonl may lack the line of the checkpoint's iteration.
    at_checkpoint = {**(kept[-1] if kept else {}), "training_iteration": iteration, "timesteps_total": timesteps}
    drops_results = len(kept) != len(results) or not intact
    return ResumePoint(directory, spec, checkpoint, iteration, timesteps, kept, drops_results,
                       stop_reason(spec.stop, at_checkpoint), tuple(skipped), storage)


def resume_run(point: ResumePoint, *, num_workers: int | None = None, address: str | None = None) -> Run:
    """Restore ``point``'s checkpoint into a new Trainer and continue its run directory.

    Results after the checkpoint are dropped from ``progress.jsonl`` (they are lost work;
    dropping them keeps iteration numbers unique), and ``params.json`` is rewritten with the
    new stop criteria, checkpoint settings and ``num_workers``, and ``plan.json`` with the new
    plan's graph. The algorithm, env and the rest of the config are the run's own. The checkpoint resumed from is never rotated away.
    A run on a storage path is first checked to be writable from this node, as
    :func:`check_storage_path` checks a new one, and keeps its storage path in ``params.json``.
    The loggers go on in the same files and tracker runs: ``progress.csv`` is rewritten from
    the results kept, and TensorBoard hides the points logged after the checkpoint.
    """
    from flowrl.engine.trainer import Trainer

    check_trackers(point.spec.wandb_project, point.spec.mlflow_tracking_uri)
    if point.storage_path is not None:
        probe_storage(point.directory, "run directory")
    config = dict(point.spec.config)
    if num_workers is not None:
        config["num_workers"] = num_workers
    trainer = Trainer(point.spec.algo, point.spec.env, config, address=address)
    try:
        trainer.restore(point.checkpoint)
        if point.drops_results:
            _replace_file(point.directory / PROGRESS_FILE, "".join(json.dumps(r) + "\n" for r in point.results))
        spec = dataclasses.replace(point.spec, config=trainer.config.to_dict(),
                                   keep_best=_default_keep_best(point.spec.keep_best, trainer.config.evaluation_interval))
        _write_params(point.directory, spec, point.storage_path)
        write_plan(point.directory, trainer)
        loggers = open_loggers(point.directory, json_safe(spec.to_params()), wandb_project=spec.wandb_project,
                               mlflow_tracking_uri=spec.mlflow_tracking_uri, previous_results=point.results,
                               resumed_at_step=point.timesteps_total)
    except BaseException:
        trainer.stop()
        raise
    return Run(point.directory, spec, trainer, checkpoint=point.checkpoint, previous_results=point.results,
               loggers=loggers)
