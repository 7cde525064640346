"""A run: a run directory, the Trainer that writes it, and the loop that trains until a stop criterion.

One run directory per run::

    <results_dir>/<algo>_<env>_<YYYYmmdd-HHMMSS>/
        params.json        algo, env, the full validated config, stop criteria, checkpoint frequency
        progress.jsonl     one result dict per training iteration (JSON; NaN written as null)
        checkpoints/checkpoint_<iteration>/

Start one, train it, and read its summary::

    from flowrl.run import RunSpec, start_run

    spec = RunSpec("ppo", "CartPole-v1", {"num_workers": 0}, stop={"training_iteration": 10}, checkpoint_freq=5)
    with start_run(spec, results_dir="flowrl_results") as run:
        summary = run.train(on_result=lambda result: print(result["episode_reward_mean"]))
    print(summary.stop_reason, summary.best_reward, summary.checkpoint)

Resume one from its latest checkpoint (its algorithm, env and config are kept; the stop
criteria, checkpoint frequency, number of workers and Ray address may change)::

    point = find_resume_point(run_dir, stop={"training_iteration": 20})
    if point.stop_reason is None:  # else the run already meets its stop criteria
        with resume_run(point) as run:
            run.train()

The ``flowrl train`` command is a shell over this module; it only parses flags and prints.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from flowrl.checkpoint import METADATA_FILE, latest_checkpoint
from flowrl.errors import CheckpointError, ConfigError, RunError

if TYPE_CHECKING:  # the Trainer imports torch: load it only when a run starts
    from flowrl.trainer import Trainer

DEFAULT_RESULTS_DIR = "flowrl_results"
PARAMS_FILE = "params.json"
PROGRESS_FILE = "progress.jsonl"
CHECKPOINTS_DIR = "checkpoints"

# The result keys a stop criterion may name: a run stops once result[key] >= the criterion's value.
STOP_KEYS = ("episode_reward_mean", "timesteps_total", "training_iteration")


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
        value = result.get(key)
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
    value that ends training; with none, training runs until Ctrl-C. ``checkpoint_freq``
    saves a checkpoint every that many iterations (0: only at the end and on Ctrl-C).
    """

    algo: str
    env: str
    config: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    stop: Mapping[str, float] = dataclasses.field(default_factory=dict)
    checkpoint_freq: int = 0

    def __post_init__(self) -> None:
        freq = self.checkpoint_freq
        if isinstance(freq, bool) or not isinstance(freq, int) or freq < 0:
            raise ConfigError(f"checkpoint_freq={freq!r} must be an integer >= 0 (0: checkpoint only at the end)")
        # Copies, so that a caller changing its dicts later does not change a started run's spec.
        object.__setattr__(self, "config", dict(self.config))
        object.__setattr__(self, "stop", parse_stop(self.stop, "stop"))

    def to_params(self) -> dict[str, Any]:
        """The ``params.json`` contents."""
        return {"algo": self.algo, "env": self.env, "config": dict(self.config), "stop": dict(self.stop),
                "checkpoint_freq": self.checkpoint_freq}


def read_run_spec(run_dir: str | os.PathLike[str]) -> RunSpec:
    """The :class:`RunSpec` in a run directory's ``params.json``; :class:`RunError` if it is not a run directory."""
    run_dir = Path(run_dir)
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
    return RunSpec(params["algo"], params["env"], params["config"], stop, int(params.get("checkpoint_freq") or 0))


@dataclass(frozen=True)
class RunSummary:
    """How :meth:`Run.train` ended.

    ``stop_reason`` is the stop criterion met (``"timesteps_total 192 >= 150"``), or None
    when Ctrl-C ended training. ``best_reward`` / ``best_iteration`` are the highest finite
    ``episode_reward_mean`` of the whole run (earlier sessions of a resumed run included) and
    its iteration. ``checkpoint`` is the last complete checkpoint (None if no iteration
    finished); ``save_interrupted`` says a second Ctrl-C cut the final checkpoint short.
    """

    directory: Path
    stop_reason: str | None
    best_reward: float | None
    best_iteration: int | None
    checkpoint: Path | None
    save_interrupted: bool = False

    @property
    def interrupted(self) -> bool:
        """Whether Ctrl-C, not a stop criterion, ended training."""
        return self.stop_reason is None


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


def _checkpoint_progress(checkpoint: Path) -> tuple[int, int]:
    """``(iteration, timesteps_total)`` from a checkpoint's metadata, read without loading its state."""
    try:
        metadata = json.loads((checkpoint / METADATA_FILE).read_text(encoding="utf-8"))
        return int(metadata["iteration"]), int(metadata.get("timesteps_total") or 0)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"checkpoint {str(checkpoint)!r}: unreadable {METADATA_FILE} ({type(e).__name__}: {e})") from None


def _better(best: tuple[float, int] | None, result: Mapping[str, Any]) -> tuple[float, int] | None:
    """``best`` or ``result``'s ``(episode_reward_mean, training_iteration)``, whichever reward is higher."""
    reward = result.get("episode_reward_mean")
    if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
        return best
    if best is not None and reward <= best[0]:
        return best
    return float(reward), int(result.get("training_iteration") or 0)


# --- a run in progress ------------------------------------------------------------------------------


class Run:
    """A run directory and the Trainer writing it; made by :func:`start_run` or :func:`resume_run`.

    ``directory`` is the run directory, ``spec`` what ``params.json`` holds, ``trainer``
    the :class:`~flowrl.trainer.Trainer`, and ``checkpoint`` the latest complete checkpoint
    (None until one is saved). :meth:`close` (or leaving a ``with`` block) stops the Trainer.
    """

    def __init__(
        self,
        directory: Path,
        spec: RunSpec,
        trainer: "Trainer",
        *,
        checkpoint: Path | None = None,
        previous_results: Sequence[Mapping[str, Any]] = (),
    ) -> None:
        self.directory = directory
        self.spec = spec
        self.trainer = trainer
        self.checkpoint = checkpoint
        # A resumed run starts from its checkpoint: there is nothing new to save until it trains.
        self._saved_iteration = trainer.iteration if checkpoint is not None else None
        self._best: tuple[float, int] | None = None
        for result in previous_results:
            self._best = _better(self._best, result)

    @property
    def timesteps_total(self) -> int:
        """Env steps sampled so far in the whole run, resumed sessions included."""
        from flowrl.operators import STEPS_SAMPLED_COUNTER

        return int(self.trainer.plan.metrics.counters[STEPS_SAMPLED_COUNTER])

    def train(self, on_result: Callable[[dict[str, Any]], None] | None = None) -> RunSummary:
        """Train until a stop criterion is met (at least one iteration) or Ctrl-C; return how it ended.

        Each result is appended to ``progress.jsonl`` and then given to ``on_result``. A
        checkpoint is saved every ``spec.checkpoint_freq`` iterations, and at the end (also
        on Ctrl-C, which this method catches) unless the last iteration is already saved.
        An error raised by the Trainer propagates, without a final checkpoint.
        """
        checkpoints = self.directory / CHECKPOINTS_DIR
        freq = self.spec.checkpoint_freq
        reason: str | None = None
        try:
            with open(self.directory / PROGRESS_FILE, "a", encoding="utf-8") as progress:
                while reason is None:
                    result = self.trainer.train()
                    progress.write(json.dumps(json_safe(result), allow_nan=False) + "\n")
                    progress.flush()
                    if on_result is not None:
                        on_result(result)
                    self._best = _better(self._best, result)
                    if freq and self.trainer.iteration % freq == 0:
                        self._save(checkpoints)
                    reason = stop_reason(self.spec.stop, result)
        except KeyboardInterrupt:
            reason = None
        save_interrupted = False
        if self.trainer.iteration != self._saved_iteration and self.trainer.iteration > 0:
            try:
                self._save(checkpoints)
            except KeyboardInterrupt:
                save_interrupted = True
        best_reward, best_iteration = self._best if self._best is not None else (None, None)
        return RunSummary(self.directory, reason, best_reward, best_iteration, self.checkpoint, save_interrupted)

    def _save(self, checkpoints: Path) -> None:
        self.checkpoint = Path(self.trainer.save(checkpoints))
        self._saved_iteration = self.trainer.iteration

    def close(self) -> None:
        """Stop the Trainer: its actors, and Ray if the Trainer started it."""
        self.trainer.stop()

    def __enter__(self) -> "Run":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"Run({str(self.directory)!r}, algo={self.spec.algo!r}, env={self.spec.env!r}, "
                f"iteration={self.trainer.iteration})")


def start_run(
    spec: RunSpec, *, results_dir: str | os.PathLike[str] = DEFAULT_RESULTS_DIR, address: str | None = None
) -> Run:
    """Build the Trainer for ``spec``, then create its run directory under ``results_dir`` with ``params.json``.

    The Trainer comes first, so that a config or env it rejects leaves no run directory
    behind; ``params.json`` records the full validated config. ``address`` is the Ray
    cluster to join (None: ``$RAY_ADDRESS``, else an embedded local Ray).
    """
    from flowrl.trainer import Trainer

    trainer = Trainer(spec.algo, spec.env, dict(spec.config), address=address)
    try:
        directory = _make_run_dir(Path(results_dir), trainer.algorithm.name, spec.env)
        spec = dataclasses.replace(spec, algo=trainer.algorithm.name, config=trainer.config.to_dict())
        _write_json(directory / PARAMS_FILE, spec.to_params())
    except BaseException:
        trainer.stop()
        raise
    return Run(directory, spec, trainer)


@dataclass(frozen=True)
class ResumePoint:
    """Where a run directory resumes, found without starting Ray (see :func:`find_resume_point`).

    ``spec`` is the run's spec with the new stop criteria and checkpoint frequency;
    ``checkpoint`` its latest complete checkpoint, at ``iteration`` and ``timesteps_total``;
    ``results`` the results in ``progress.jsonl`` up to that iteration. ``drops_results``
    says ``progress.jsonl`` holds more (results after the checkpoint, or a line cut short),
    which :func:`resume_run` drops. ``stop_reason`` is the criterion the run already meets
    at the checkpoint, or None if there is training to do.
    """

    directory: Path
    spec: RunSpec
    checkpoint: Path
    iteration: int
    timesteps_total: int
    results: list[dict[str, Any]]
    drops_results: bool
    stop_reason: str | None


def find_resume_point(
    run_dir: str | os.PathLike[str], *, stop: Mapping[str, float] | None = None, checkpoint_freq: int | None = None
) -> ResumePoint:
    """Read a run directory and find where it resumes: its latest checkpoint and the results up to it.

    ``stop`` criteria replace the run's own key by key (the others are kept) and count the
    whole run; ``checkpoint_freq`` replaces the run's own. Raises :class:`RunError` if
    ``run_dir`` is not a run directory and :class:`CheckpointError` if it has no usable checkpoint.
    """
    directory = Path(run_dir)
    spec = read_run_spec(directory)
    checkpoint = latest_checkpoint(directory / CHECKPOINTS_DIR)
    if checkpoint is None:
        raise CheckpointError(f"run directory {str(directory)!r}: no checkpoint under {str(directory / CHECKPOINTS_DIR)!r} to resume from")
    iteration, timesteps = _checkpoint_progress(checkpoint)
    spec = dataclasses.replace(
        spec,
        stop={**spec.stop, **(stop or {})},
        checkpoint_freq=spec.checkpoint_freq if checkpoint_freq is None else checkpoint_freq,
    )
    results, intact = _read_progress(directory / PROGRESS_FILE)
    kept = [r for r in results if int(r.get("training_iteration") or 0) <= iteration]
    # The checkpoint's own counts win: progress.jsonl may lack the line of the checkpoint's iteration.
    at_checkpoint = {**(kept[-1] if kept else {}), "training_iteration": iteration, "timesteps_total": timesteps}
    drops_results = len(kept) != len(results) or not intact
    return ResumePoint(directory, spec, checkpoint, iteration, timesteps, kept, drops_results,
                       stop_reason(spec.stop, at_checkpoint))


def resume_run(point: ResumePoint, *, num_workers: int | None = None, address: str | None = None) -> Run:
    """Restore ``point``'s checkpoint into a new Trainer and continue its run directory.

    Results after the checkpoint are dropped from ``progress.jsonl`` (they are lost work;
    dropping them keeps iteration numbers unique), and ``params.json`` is rewritten with the
    new stop criteria, checkpoint frequency and ``num_workers``. The algorithm, env and the
    rest of the config are the run's own.
    """
    from flowrl.trainer import Trainer

    config = dict(point.spec.config)
    if num_workers is not None:
        config["num_workers"] = num_workers
    trainer = Trainer(point.spec.algo, point.spec.env, config, address=address)
    try:
        trainer.restore(point.checkpoint)
        if point.drops_results:
            _replace_file(point.directory / PROGRESS_FILE, "".join(json.dumps(r) + "\n" for r in point.results))
        spec = dataclasses.replace(point.spec, config=trainer.config.to_dict())
        _write_json(point.directory / PARAMS_FILE, spec.to_params())
    except BaseException:
        trainer.stop()
        raise
    return Run(point.directory, spec, trainer, checkpoint=point.checkpoint, previous_results=point.results)
