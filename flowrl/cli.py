"""The ``flowrl`` command: train, resume and evaluate runs, list algorithms, print execution plans.

``flowrl train`` writes one run directory per run::

    <results-dir>/<algo>_<env>_<YYYYmmdd-HHMMSS>/
        params.json        algo, env, the full validated config, stop criteria, checkpoint frequency
        progress.jsonl     one result dict per training iteration (JSON; NaN written as null)
        checkpoints/checkpoint_<iteration>/

Errors a user can cause (an unknown algorithm or env, an invalid config, a bad ``--set``,
an unreadable config file or checkpoint) print ``flowrl: error: ...`` to stderr and exit
with status 2, without a traceback; a failure while running (e.g. a worker that cannot be
recovered) exits with status 1. Ctrl-C during training saves a checkpoint and exits with
status 130.
"""

from __future__ import annotations

import argparse
import copy
import difflib
import json
import math
import os
import re
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence, TextIO

from flowrl.errors import (
    CheckpointError,
    CLIError,
    ConfigError,
    EnvError,
    FlowRLError,
    UnknownAlgorithmError,
)
from flowrl.ray_runtime import ray_session

if TYPE_CHECKING:  # the Trainer imports torch: load it only when a command needs it
    from flowrl.algorithms import Algorithm
    from flowrl.trainer import Trainer

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
USAGE_ERRORS = (CLIError, ConfigError, EnvError, UnknownAlgorithmError, CheckpointError)
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what shells report for a Ctrl-C

DEFAULT_RESULTS_DIR = "flowrl_results"
PARAMS_FILE = "params.json"
PROGRESS_FILE = "progress.jsonl"
CHECKPOINTS_DIR = "checkpoints"

# Stop criteria: the result key each one compares (result >= value stops) and the flag that sets it.
STOP_FLAGS = {
    "episode_reward_mean": "--stop-reward",
    "timesteps_total": "--stop-timesteps",
    "training_iteration": "--stop-iters",
}
# Top-level keys of an experiment file besides flat config keys ("run" is RLlib's name for "algo").
EXPERIMENT_KEYS = ("algo", "run", "env", "stop", "config")


# --- values and files -------------------------------------------------------------------------------


def parse_value(text: str) -> Any:
    """A ``--set`` value: JSON when it parses (numbers, true/false, null, lists, dicts), else the string.

    Python's ``True``/``False``/``None`` are accepted too, since they are what people type.
    """
    try:
        return json.loads(text)
    except ValueError:
        pass
    stripped = text.strip()
    return {"True": True, "False": False, "None": None}.get(stripped, stripped)


def parse_set(items: Sequence[str]) -> list[tuple[list[str], Any]]:
    """``["model.fcnet_hiddens=[64,64]", ...]`` -> ``[(["model", "fcnet_hiddens"], [64, 64]), ...]``."""
    parsed = []
    for item in items:
        key, sep, raw = item.partition("=")
        path = [part.strip() for part in key.split(".")]
        if not sep or not all(path):
            raise CLIError(
                f"--set {item!r} is not key=value; examples: --set lr=0.001, "
                f"--set model.fcnet_hiddens=[64,64], --set 'env_config={{\"max_steps\": 100}}'"
            )
        parsed.append((path, parse_value(raw)))
    return parsed


def apply_set(config: dict[str, Any], assignments: Sequence[tuple[list[str], Any]], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``config`` with each ``(path, value)`` set; a dotted path sets a key inside a dict value.

    A dict a nested key goes into starts from ``config``'s value, else from the algorithm's
    default (``defaults``), so ``--set model.fcnet_hiddens=[64]`` keeps the other model keys.
    """
    config = copy.deepcopy(config)
    for path, value in assignments:
        target = config
        for depth, part in enumerate(path[:-1]):
            if part not in target:
                default = defaults.get(part, {}) if depth == 0 else {}
                target[part] = copy.deepcopy(default)  # not a dict: reported just below
            if not isinstance(target[part], dict):
                shown = ".".join(path[: depth + 1])
                raise CLIError(
                    f"--set {'.'.join(path)}=...: {shown} is {target[part]!r} ({type(target[part]).__name__}), "
                    f"not a dict, so it has no key {path[depth + 1]!r}"
                )
            target = target[part]
        target[path[-1]] = value
    return config


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


_yaml_loader: Any = None


def _load_yaml(text: str) -> Any:
    """Parse YAML (PyYAML, imported only now) reading ``1e-5`` as a float, as YAML 1.2 does."""
    global _yaml_loader
    import yaml

    if _yaml_loader is None:

        class Loader(yaml.SafeLoader):
            """PyYAML follows YAML 1.1, where a float needs a dot: ``lr: 5e-5`` would be a string."""

        Loader.add_implicit_resolver(
            "tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+$"), list("-+0123456789")
        )
        _yaml_loader = Loader
    return yaml.load(text, Loader=_yaml_loader)  # noqa: S506 - a SafeLoader subclass


def _yaml_problem(error: Exception) -> str:
    problem = getattr(error, "problem", None)
    mark = getattr(error, "problem_mark", None)
    if problem and mark is not None:
        return f"{problem} at line {mark.line + 1}, column {mark.column + 1}"
    return " ".join(str(error).split())


def load_experiment_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a YAML or JSON experiment file into ``{"algo", "env", "stop", "config"}`` (see :func:`parse_experiment`)."""
    file = Path(path)
    suffix = file.suffix.lower()
    if suffix not in (".yaml", ".yml", ".json"):
        raise CLIError(f"--config {str(file)!r}: unknown file type {suffix or '(no extension)'!r}; use .yaml, .yml or .json")
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CLIError(f"--config {str(file)!r}: no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise CLIError(f"--config {str(file)!r}: cannot read it ({e})") from None
    if suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise CLIError(f"--config {str(file)!r} is not valid JSON: {e.msg} at line {e.lineno}, column {e.colno}") from None
    else:
        try:
            import yaml
        except ImportError:
            raise CLIError(
                f"--config {str(file)!r}: reading YAML needs PyYAML (pip install pyyaml); or write the config as .json"
            ) from None
        try:
            data = _load_yaml(text)
        except yaml.YAMLError as e:
            raise CLIError(f"--config {str(file)!r} is not valid YAML: {_yaml_problem(e)}") from None
    return parse_experiment(data, source=f"--config {str(file)!r}")


def parse_experiment(data: Any, source: str = "the config file") -> dict[str, Any]:
    """Normalise an experiment: ``{"algo": str | None, "env": str | None, "stop": dict, "config": dict}``.

    Accepts RLlib's tuned-example layout (``algo`` or ``run``, ``env``, ``stop``, ``config``;
    optionally under one experiment name) and a flat dict of config keys; top-level keys
    that are not experiment keys are config keys.
    """
    if data is None:  # an empty file
        data = {}
    if not isinstance(data, Mapping):
        raise CLIError(f"{source} must hold a mapping of keys to values, not {type(data).__name__}")
    if len(data) == 1:
        (name, inner), = data.items()
        if name not in EXPERIMENT_KEYS and isinstance(inner, Mapping) and set(inner) & set(EXPERIMENT_KEYS):
            data = inner  # {"cartpole-ppo": {"run": "PPO", "env": ..., "config": ...}}
    data = dict(data)
    algo, run = data.pop("algo", None), data.pop("run", None)
    if algo is not None and run is not None and str(algo).lower() != str(run).lower():
        raise CLIError(f"{source} names two algorithms: algo={algo!r} and run={run!r}; keep one")
    algo = algo if algo is not None else run
    env = data.pop("env", None)
    for key, value in (("algo", algo), ("env", env)):
        if value is not None and not isinstance(value, str):
            raise CLIError(f"{source}: {key} must be a string, got {value!r} ({type(value).__name__})")
    stop = parse_stop(data.pop("stop", None) or {}, source)
    config = data.pop("config", None) or {}
    if not isinstance(config, Mapping):
        raise CLIError(f"{source}: config must be a mapping of config keys to values, not {type(config).__name__}")
    both = sorted(set(data) & set(config))
    if both:
        raise CLIError(f"{source} sets {', '.join(map(repr, both))} both at the top level and under 'config'; keep one")
    return {"algo": algo, "env": env, "stop": stop, "config": {**data, **config}}


def parse_stop(stop: Any, source: str) -> dict[str, float]:
    """Check a ``stop`` mapping: keys among :data:`STOP_FLAGS`, numeric values."""
    if not isinstance(stop, Mapping):
        raise CLIError(f"{source}: stop must be a mapping like {{training_iteration: 10}}, not {type(stop).__name__}")
    checked = {}
    for key, value in stop.items():
        if key not in STOP_FLAGS:
            close = difflib.get_close_matches(str(key), list(STOP_FLAGS), n=1, cutoff=0.5)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise CLIError(f"{source}: unknown stop criterion {key!r}; {hint}valid: {', '.join(STOP_FLAGS)}")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise CLIError(f"{source}: stop {key}={value!r} must be a number")
        checked[key] = value
    return checked


# --- building trainers ------------------------------------------------------------------------------


def _get_algorithm(name: str | None, source: str) -> "Algorithm":
    from flowrl.algorithms import get_algorithm, list_algorithms

    if not name:
        raise CLIError(f"{source} needs --algo NAME (or 'algo' in the --config file); available: {', '.join(list_algorithms())}")
    return get_algorithm(name)  # UnknownAlgorithmError names the closest algorithms


def build_config(algorithm: "Algorithm", file_config: Mapping[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """The config dict: algorithm defaults < config file < ``--set`` < ``--num-workers`` / ``--seed``.

    Keys left out keep the algorithm's defaults (the Trainer fills them in); the result is
    validated (``ConfigError`` listing every problem) before it is returned.
    """
    defaults = algorithm.config_class.from_dict({}).to_dict()
    config = apply_set(dict(file_config), parse_set(args.set or []), defaults)
    if getattr(args, "num_workers", None) is not None:
        config["num_workers"] = args.num_workers
    if getattr(args, "seed", None) is not None:
        config["seed"] = args.seed
    algorithm.config_class.from_dict(config)  # every problem at once, before Ray or any actor starts
    return config


def stop_from_flags(args: argparse.Namespace) -> dict[str, float]:
    """The stop criteria given as flags."""
    given = {
        "episode_reward_mean": getattr(args, "stop_reward", None),
        "timesteps_total": getattr(args, "stop_timesteps", None),
        "training_iteration": getattr(args, "stop_iters", None),
    }
    return {key: value for key, value in given.items() if value is not None}


def train_settings(args: argparse.Namespace, command: str = "train") -> tuple["Algorithm", str, dict[str, Any], dict[str, float]]:
    """``(algorithm, env, config, stop)`` of a new run from the flags and the ``--config`` file."""
    from flowrl.envs import get_env_creator

    experiment = load_experiment_file(args.config) if args.config else parse_experiment({})
    algorithm = _get_algorithm(args.algo or experiment["algo"], command)
    env = args.env or experiment["env"]
    if not env:
        raise CLIError(f"{command} needs --env ID (or 'env' in the --config file), e.g. --env CartPole-v1")
    get_env_creator(env)  # UnknownEnvError names the closest ids
    config = build_config(algorithm, experiment["config"], args)
    stop = {**experiment["stop"], **stop_from_flags(args)}
    return algorithm, env, config, stop


def _new_trainer(algo: str, env: str, config: Mapping[str, Any], address: str | None) -> "Trainer":
    from flowrl.trainer import Trainer

    return Trainer(algo, env, dict(config), address=address)


# --- the run directory ------------------------------------------------------------------------------


def make_run_dir(results_dir: str | os.PathLike[str], algo: str, env: str) -> Path:
    """Create ``<results_dir>/<algo>_<env>_<YYYYmmdd-HHMMSS>`` (with ``_1``, ``_2``... if taken)."""
    stem = f"{algo}_{re.sub(r'[^A-Za-z0-9._-]+', '_', env)}_{time.strftime('%Y%m%d-%H%M%S')}"
    root = Path(results_dir)
    root.mkdir(parents=True, exist_ok=True)
    for n in range(1000):
        run_dir = root / (stem if n == 0 else f"{stem}_{n}")
        try:
            run_dir.mkdir()
        except FileExistsError:
            continue
        (run_dir / CHECKPOINTS_DIR).mkdir()
        return run_dir
    raise CLIError(f"cannot create a run directory {stem!r} under {str(root)!r}: every numbered name is taken")


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(json_safe(data), indent=2, allow_nan=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)  # a reader never sees half a params.json


def read_params(run_dir: Path) -> dict[str, Any]:
    """The ``params.json`` of a run directory, checked enough to resume from."""
    path = run_dir / PARAMS_FILE
    if not run_dir.is_dir():
        raise CLIError(f"--resume {str(run_dir)!r}: no such directory")
    try:
        params = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CLIError(f"--resume {str(run_dir)!r} is not a flowrl run directory: it has no {PARAMS_FILE}") from None
    except (OSError, ValueError) as e:
        raise CLIError(f"--resume {str(run_dir)!r}: cannot read {PARAMS_FILE} ({e})") from None
    if not isinstance(params, dict) or not all(isinstance(params.get(k), t) for k, t in (("algo", str), ("env", str), ("config", dict))):
        raise CLIError(f"--resume {str(run_dir)!r}: {PARAMS_FILE} lacks algo, env or config; it was not written by flowrl train")
    params["stop"] = parse_stop(params.get("stop") or {}, f"{path}")
    return params


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


# --- output -----------------------------------------------------------------------------------------


def _fmt(value: Any, spec: str = ".1f") -> str:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return format(value, spec)
    return "n/a"


def format_iteration(result: Mapping[str, Any], steps_this_iter: int) -> str:
    """One line per iteration: iteration, timesteps, reward mean (min/max), steps/s, total time,
    and each policy's mean return per agent in multi-agent runs."""
    elapsed = result.get("time_this_iter_s") or 0.0
    rate = steps_this_iter / elapsed if elapsed > 0 else float("nan")
    line = (
        f"iter {result.get('training_iteration', 0):>4}  "
        f"timesteps {result.get('timesteps_total', 0):>9}  "
        f"reward {_fmt(result.get('episode_reward_mean')):>8} "
        f"(min {_fmt(result.get('episode_reward_min'))}, max {_fmt(result.get('episode_reward_max'))})  "
        f"steps/s {_fmt(rate, ',.0f'):>7}  "
        f"time {_fmt(result.get('time_total_s'), '.2f'):>8}s"
    )
    per_policy = result.get("policy_reward_mean") or {}
    if per_policy:
        line += "  " + " ".join(f"{pid} {_fmt(value)}" for pid, value in sorted(per_policy.items()))
    return line


def stop_reason(stop: Mapping[str, float], result: Mapping[str, Any]) -> str | None:
    """Which stop criterion ``result`` meets, as text, or None."""
    for key, bound in stop.items():
        value = result.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= bound:
            return f"{key} {_fmt(value, 'g')} >= {_fmt(bound, 'g')}"
    return None


def _better(best: tuple[float, int] | None, result: Mapping[str, Any]) -> tuple[float, int] | None:
    """``best`` or ``result``'s ``(episode_reward_mean, training_iteration)``, whichever reward is higher."""
    reward = result.get("episode_reward_mean")
    if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
        return best
    if best is not None and reward <= best[0]:
        return best
    return float(reward), int(result.get("training_iteration") or 0)


def _describe_stop(stop: Mapping[str, float]) -> str:
    if not stop:
        return "no stop criteria: training runs until Ctrl-C"
    return "stop at " + " or ".join(f"{key} >= {_fmt(value, 'g')}" for key, value in stop.items())


# --- commands ---------------------------------------------------------------------------------------


def _train(args: argparse.Namespace) -> int:
    if args.resume:
        return _resume(args)
    algorithm, env, config, stop = train_settings(args)
    checkpoint_freq = args.checkpoint_freq or 0
    trainer = _new_trainer(algorithm.name, env, config, args.address)
    try:
        run_dir = make_run_dir(args.results_dir or DEFAULT_RESULTS_DIR, algorithm.name, env)
        params = {
            "algo": algorithm.name,
            "env": env,
            "config": trainer.config.to_dict(),
            "stop": stop,
            "checkpoint_freq": checkpoint_freq,
        }
        _write_json(run_dir / PARAMS_FILE, params)
        print(f"training {algorithm.name} on {env}; {_describe_stop(stop)}", flush=True)
        print(f"run directory: {run_dir}", flush=True)
        return _run(trainer, run_dir, stop, checkpoint_freq)
    finally:
        trainer.stop()


def _resume(args: argparse.Namespace) -> int:
    from flowrl.checkpoint import latest_checkpoint

    run_dir = Path(args.resume)
    params = read_params(run_dir)
    fixed = [flag for flag, value in (("--config", args.config), ("--set", args.set), ("--seed", args.seed),
                                      ("--results-dir", args.results_dir)) if value not in (None, [])]
    fixed += [f"--{key} {value}" for key, value in (("algo", args.algo), ("env", args.env))
              if value and value.lower() != params[key].lower()]
    if fixed:
        raise CLIError(
            f"{', '.join(fixed)} cannot be used with --resume: a resumed run keeps the settings in "
            f"{run_dir / PARAMS_FILE} (stop flags, --num-workers, --checkpoint-freq and --address may change)"
        )
    checkpoint = latest_checkpoint(run_dir / CHECKPOINTS_DIR)
    if checkpoint is None:
        raise CheckpointError(f"--resume {str(run_dir)!r}: no checkpoint under {str(run_dir / CHECKPOINTS_DIR)!r} to resume from")
    iteration, timesteps = _checkpoint_progress(checkpoint)
    stop = {**params["stop"], **stop_from_flags(args)}
    checkpoint_freq = args.checkpoint_freq if args.checkpoint_freq is not None else int(params.get("checkpoint_freq") or 0)
    # Results after the checkpoint are lost work: drop them so iteration numbers stay unique.
    progress_path = run_dir / PROGRESS_FILE
    results, intact = _read_progress(progress_path)
    kept = [r for r in results if int(r.get("training_iteration") or 0) <= iteration]
    reason = stop_reason(stop, {**(kept[-1] if kept else {}), "training_iteration": iteration, "timesteps_total": timesteps})
    if reason:
        print(f"nothing to do: {run_dir} already meets {reason}; give a larger stop flag to train further")
        return EXIT_OK
    config = dict(params["config"])
    if args.num_workers is not None:
        config["num_workers"] = args.num_workers
    trainer = _new_trainer(params["algo"], params["env"], config, args.address)
    try:
        trainer.restore(checkpoint)
        if len(kept) != len(results) or not intact:
            tmp = progress_path.with_name(f".{PROGRESS_FILE}.tmp")
            tmp.write_text("".join(json.dumps(r) + "\n" for r in kept), encoding="utf-8")
            os.replace(tmp, progress_path)
            print(f"{progress_path}: dropped the results after iteration {iteration}, the checkpoint's", flush=True)
        _write_json(run_dir / PARAMS_FILE, {**params, "config": trainer.config.to_dict(), "stop": stop,
                                            "checkpoint_freq": checkpoint_freq})
        print(f"resuming {params['algo']} on {params['env']} from {checkpoint} (iteration {trainer.iteration}); "
              f"{_describe_stop(stop)}", flush=True)
        print(f"run directory: {run_dir}", flush=True)
        return _run(trainer, run_dir, stop, checkpoint_freq, previous=kept, last_saved=trainer.iteration,
                    last_checkpoint=str(checkpoint))
    finally:
        trainer.stop()


def _checkpoint_progress(checkpoint: Path) -> tuple[int, int]:
    """``(iteration, timesteps_total)`` from a checkpoint's metadata, read without loading its state."""
    from flowrl.checkpoint import METADATA_FILE

    try:
        metadata = json.loads((checkpoint / METADATA_FILE).read_text(encoding="utf-8"))
        return int(metadata["iteration"]), int(metadata.get("timesteps_total") or 0)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"checkpoint {str(checkpoint)!r}: unreadable {METADATA_FILE} ({type(e).__name__}: {e})") from None


def _run(
    trainer: "Trainer",
    run_dir: Path,
    stop: Mapping[str, float],
    checkpoint_freq: int,
    *,
    previous: Sequence[Mapping[str, Any]] = (),
    last_saved: int | None = None,
    last_checkpoint: str | None = None,
) -> int:
    """Train until a stop criterion is met or Ctrl-C; log each result, checkpoint, and summarise."""
    checkpoints = run_dir / CHECKPOINTS_DIR
    timesteps = int(trainer.plan.metrics.counters["num_steps_sampled"])
    best: tuple[float, int] | None = None  # (episode_reward_mean, iteration)
    for result in previous:
        best = _better(best, result)
    reason: str | None = None
    try:
        with open(run_dir / PROGRESS_FILE, "a", encoding="utf-8") as progress:
            while reason is None:
                result = trainer.train()
                progress.write(json.dumps(json_safe(result), allow_nan=False) + "\n")
                progress.flush()
                steps = int(result.get("timesteps_total", timesteps))
                print(format_iteration(result, steps - timesteps), flush=True)
                timesteps = steps
                best = _better(best, result)
                if checkpoint_freq and trainer.iteration % checkpoint_freq == 0:
                    last_checkpoint, last_saved = trainer.save(checkpoints), trainer.iteration
                reason = stop_reason(stop, result)
    except KeyboardInterrupt:
        reason = None
    interrupted = reason is None
    if trainer.iteration != last_saved and trainer.iteration > 0:
        try:
            last_checkpoint = trainer.save(checkpoints)
        except KeyboardInterrupt:
            print(f"interrupted again while saving; the last complete checkpoint is {last_checkpoint or 'none'}",
                  file=sys.stderr, flush=True)
            return EXIT_INTERRUPTED
    print("interrupted (Ctrl-C)" if interrupted else f"stopped: {reason}")
    if best is not None:
        print(f"best episode_reward_mean: {best[0]:.2f} (iteration {best[1]})")
    print(f"checkpoint: {last_checkpoint or 'none (no iteration finished)'}")
    print(f"results: {run_dir}")
    if interrupted:
        if last_checkpoint:
            print(f"resume with: flowrl train --resume {run_dir}", flush=True)
        return EXIT_INTERRUPTED
    return EXIT_OK


def _list(args: argparse.Namespace) -> int:
    from flowrl.algorithms import get_algorithm, list_algorithms

    if args.algo:
        algorithm = get_algorithm(args.algo)
        print(f"{algorithm.name}: {algorithm.description}\n")
        print(algorithm.config_class.describe())
        return EXIT_OK
    algorithms = [get_algorithm(name) for name in list_algorithms()]
    width = max(len(a.name) for a in algorithms)
    for algorithm in algorithms:
        print(f"{algorithm.name:<{width}}  {algorithm.description}")
    return EXIT_OK


def _plan(args: argparse.Namespace) -> int:
    algorithm, env, config, _ = train_settings(args, "plan")
    trainer = _new_trainer(algorithm.name, env, config, args.address)
    try:
        plan = trainer.plan
        print({"text": plan.describe, "mermaid": plan.to_mermaid, "dot": plan.to_dot}[args.format]())
    finally:
        trainer.stop()
    return EXIT_OK


def _resolve_checkpoint(path: Path) -> Path:
    """A checkpoint directory, or the latest checkpoint of a run directory or a ``checkpoints/`` directory."""
    from flowrl.checkpoint import METADATA_FILE, latest_checkpoint

    if (path / METADATA_FILE).is_file() or not path.is_dir():
        return path  # read_checkpoint reports what is wrong with it
    for directory in (path / CHECKPOINTS_DIR, path):
        found = latest_checkpoint(directory) if directory.is_dir() else None
        if found is not None:
            return found
    raise CheckpointError(f"{str(path)!r} is neither a checkpoint nor a directory holding checkpoint_* directories")


def _evaluate(args: argparse.Namespace) -> int:
    from flowrl.trainer import evaluate_checkpoint

    checkpoint = _resolve_checkpoint(Path(args.checkpoint))
    stats = evaluate_checkpoint(checkpoint, num_episodes=args.episodes, seed=args.seed)
    print(f"checkpoint: {checkpoint} ({stats['algo']} on {stats['env']}, iteration {stats['iteration']})")
    print(f"{args.episodes} episode{'s' if args.episodes != 1 else ''}, deterministic actions:")
    print(f"episode_reward_mean {_fmt(stats.get('episode_reward_mean'), '.2f')}  "
          f"min {_fmt(stats.get('episode_reward_min'), '.2f')}  max {_fmt(stats.get('episode_reward_max'), '.2f')}  "
          f"episode_len_mean {_fmt(stats.get('episode_len_mean'), '.1f')}")
    return EXIT_OK


def _demo(args: argparse.Namespace) -> int:
    """Run a small dataflow over shard actors and check its answer."""
    from flowrl.iterators import LocalIterator, from_range

    def count_items(batch: list[int]) -> int:
        metrics = LocalIterator.get_metrics()
        metrics.counters["items"] += len(batch)
        return sum(batch)

    with ray_session(address=args.address):
        plan = (
            from_range(args.items, num_shards=args.num_shards)
            .for_each(lambda x: x * x)  # runs inside the shard actors
            .batch(args.batch_size)
            .gather_async()
            .for_each(count_items)  # runs here, in the driver
        )
        print(f"plan: {plan!r}")
        start = time.perf_counter()
        total = sum(plan)
        elapsed = time.perf_counter() - start
    expected = sum(x * x for x in range(args.items))
    print(f"sum of squares below {args.items}: {total} (expected {expected})")
    print(f"{args.items} items through {args.num_shards} shard actors in {elapsed:.2f}s "
          f"({args.items / elapsed:,.0f} items/s)")
    return 0 if total == expected else 1


# --- the parser -------------------------------------------------------------------------------------


def _int_at_least(minimum: int) -> Any:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} must be >= {minimum}")
        return value

    parse.__name__ = "int"
    return parse


def _finite_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite number")
    return value


_ADDRESS_HELP = "Ray cluster to join (default: $RAY_ADDRESS, else start an embedded local Ray)"


def _add_config_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--algo", help="algorithm name (see `flowrl list`)")
    parser.add_argument("--env", help="Gymnasium id or flowrl env name, e.g. CartPole-v1 or the multi-agent MultiAgentCartPole")
    parser.add_argument("--num-workers", type=_int_at_least(0), metavar="N",
                        help="remote rollout workers (0: sample in this process); overrides --config and --set")
    parser.add_argument("--config", metavar="FILE", help="YAML or JSON experiment file (algo, env, stop, config; or flat config keys)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="set a config key (repeatable); VALUE is JSON if it parses, else a string; "
                             "dotted keys set inside dicts: model.fcnet_hiddens=[64,64]")
    parser.add_argument("--address", default=None, help=_ADDRESS_HELP)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``flowrl`` command."""
    parser = argparse.ArgumentParser(prog="flowrl", description="Distributed RL as dataflow execution plans.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    train = sub.add_parser("train", help="train an algorithm on an env, writing a run directory",
                           description="Train an algorithm on an env. Config precedence: algorithm defaults "
                                       "< --config file < --set < --num-workers/--seed.")
    _add_config_flags(train)
    train.add_argument("--seed", type=int, help="random seed (config key seed); overrides --config and --set")
    train.add_argument("--stop-reward", type=_finite_float, metavar="R", help="stop when episode_reward_mean >= R")
    train.add_argument("--stop-timesteps", type=_int_at_least(1), metavar="T", help="stop when timesteps_total >= T")
    train.add_argument("--stop-iters", type=_int_at_least(1), metavar="I", help="stop when training_iteration >= I")
    train.add_argument("--results-dir", metavar="DIR", help=f"where run directories go (default ./{DEFAULT_RESULTS_DIR})")
    train.add_argument("--checkpoint-freq", type=_int_at_least(0), metavar="N",
                       help="checkpoint every N iterations (default 0: only at the end and on Ctrl-C)")
    train.add_argument("--resume", metavar="RUN_DIR",
                       help="continue the run in RUN_DIR from its latest checkpoint (stop flags given here replace its own)")
    train.set_defaults(func=_train)

    lister = sub.add_parser("list", help="list the algorithms (or one algorithm's config keys)")
    lister.add_argument("algo", nargs="?", help="show this algorithm's config keys, defaults and docs")
    lister.set_defaults(func=_list)

    plan = sub.add_parser("plan", help="print an algorithm's execution plan graph")
    _add_config_flags(plan)
    plan.add_argument("--format", choices=("text", "mermaid", "dot"), default="text", help="output format (default text)")
    plan.set_defaults(func=_plan)

    evaluate = sub.add_parser("evaluate", help="run episodes with a checkpoint's policy (deterministic actions)")
    evaluate.add_argument("checkpoint", help="a checkpoint directory, or a run directory (its latest checkpoint)")
    evaluate.add_argument("--episodes", type=_int_at_least(1), default=10, metavar="N", help="episodes to run (default 10)")
    evaluate.add_argument("--seed", type=int, default=None, help="reset episode i with seed + i (default: unseeded)")
    evaluate.set_defaults(func=_evaluate)

    demo = sub.add_parser("demo", help="run a small dataflow over Ray shard actors")
    demo.add_argument("--items", type=int, default=100_000, help="numbers to square and sum (default 100000)")
    demo.add_argument("--num-shards", type=int, default=2, help="shard actors (default 2)")
    demo.add_argument("--batch-size", type=int, default=1000, help="items per message from a shard (default 1000)")
    demo.add_argument("--address", default=None, help="Ray cluster to join (default: start an embedded one)")
    demo.set_defaults(func=_demo)
    return parser


def _report(error: BaseException, stream: TextIO) -> None:
    # An error raised inside a Ray task arrives wrapped; its cause carries the message meant for the user.
    cause = getattr(error, "cause", None)
    if isinstance(cause, FlowRLError):
        error = cause
    print(f"flowrl: error: {error}", file=stream, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``flowrl`` console script; returns the exit status."""
    args = build_parser().parse_args(argv)
    for name in ("items", "num_shards", "batch_size"):
        if getattr(args, name, 1) < 1:
            print(f"flowrl: error: --{name.replace('_', '-')}={getattr(args, name)} must be >= 1", file=sys.stderr)
            return EXIT_USAGE
    try:
        return args.func(args)
    except FlowRLError as e:
        _report(e, sys.stderr)
        # Bad input is a usage error; anything else (a worker failing mid-run) is a failure.
        return EXIT_USAGE if isinstance(e, USAGE_ERRORS) else EXIT_FAILURE
    except KeyboardInterrupt:
        print("flowrl: interrupted", file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
