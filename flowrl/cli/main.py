"""The ``flowrl`` command: train, resume, tune and evaluate runs, list algorithms, print execution plans.

This module parses flags, calls the library and prints. ``flowrl train`` is a shell over
:mod:`flowrl.runs.run` (the run directory, stop criteria, checkpoints, resuming), and ``--config``
files are read by :mod:`flowrl.runs.experiment`; ``flowrl tune`` is a shell over :func:`flowrl.tune.run`,
``flowrl export`` over :func:`flowrl.serve.export.export_policy` and ``flowrl plot`` over :func:`flowrl.outputs.plot.plot_runs`.

Exit statuses:

- 0: done (a stop criterion was met, or with ``--resume`` already was).
- 1: training failed (a worker that cannot be recovered, an env or learner error, any error
  raised while training): ``flowrl: error: ...``, then the checkpoint saved for it (when the
  Trainer's state was intact; else why none was), and the ``flowrl train --resume RUN_DIR``
  command.
- 2: an error a user can cause (an unknown algorithm or env, an invalid config, a bad ``--set``
  or flag, an unreadable config file, run directory or checkpoint, a ``--storage-path`` that
  cannot hold checkpoints, a Ray cluster that cannot be joined): ``flowrl: error: ...`` on
  stderr, without a traceback.
- ``tune``: 0 when every trial ended, 1 when a trial failed, 128 + the signal's number when a
  signal interrupted the experiment (Tune saves its state first; ``flowrl tune --resume EXP_DIR``
  continues it).
- 128 + the signal's number when a signal ended training: 130 for SIGINT (Ctrl-C), 143 for
  SIGTERM, 129 for SIGHUP. ``train`` first saves a checkpoint and prints the resume command;
  a second signal while it saves abandons that checkpoint (the previous one stays the
  latest) and exits with the same status.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import math
import signal
import sys
import time
import traceback
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from flowrl.storage.checkpoints import METADATA_FILE, latest_checkpoint
from flowrl.config import parse_iteration_window
from flowrl.errors import (
    CheckpointError,
    CLIError,
    ClusterConnectionError,
    ConfigError,
    EnvError,
    FlowRLError,
    RunError,
    UnknownAlgorithmError,
)
from flowrl.runs.experiment import load_experiment_file, parse_experiment
from flowrl.outputs.progress import ProgressDisplay, Verbosity
from flowrl.config.rllib import RLLIB_MARKER, RLlibConfigNote
from flowrl.runs.run import (
    CHECKPOINTS_DIR,
    DEFAULT_CHECKPOINT_INTERVAL_S,
    DEFAULT_KEEP_CHECKPOINTS,
    DEFAULT_RESULTS_DIR,
    PARAMS_FILE,
    PROGRESS_FILE,
    Run,
    RunSpec,
    RunSummary,
    RunWarning,
    find_resume_point,
    find_run_dir,
    interrupt_signal,
    read_run_spec,
    resume_run,
    start_run,
)

if TYPE_CHECKING:  # algorithms import torch: load them only when a command needs them
    from flowrl.algorithms import Algorithm

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
USAGE_ERRORS = (CLIError, ConfigError, EnvError, UnknownAlgorithmError, CheckpointError, RunError, ClusterConnectionError)
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what shells report for a Ctrl-C


def exit_status_for(signum: int) -> int:
    """The exit status for a run ended by signal ``signum``: 128 + its number, as shells report it."""
    return 128 + int(signum)


# --- --set values -----------------------------------------------------------------------------------


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


# --- building trainers ------------------------------------------------------------------------------


def _get_algorithm(name: str | None, source: str) -> Algorithm:
    from flowrl.algorithms import get_algorithm, list_algorithms

    if not name:
        raise CLIError(f"{source} needs --algo NAME (or 'algo' in the --config file); available: {', '.join(list_algorithms())}")
    return get_algorithm(name)  # UnknownAlgorithmError names the closest algorithms


def build_config(algorithm: Algorithm, file_config: Mapping[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """The config dict: algorithm defaults < config file < ``--set`` < ``--num-workers`` / ``--seed``.

    Keys left out keep the algorithm's defaults (the Trainer fills them in); the result is
    validated (``ConfigError`` listing every problem) before it is returned.
    """
    defaults = algorithm.config_class.from_dict({}).to_dict()
    if RLLIB_MARKER in file_config:
        defaults["model"] = {}  # an RLlib config's model keys left out take RLlib's model defaults, not flowrl's
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


def train_settings(args: argparse.Namespace, command: str = "train") -> tuple[Algorithm, str, dict[str, Any], dict[str, float]]:
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


# --- output -----------------------------------------------------------------------------------------


def _fmt(value: Any, spec: str = ".1f") -> str:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return format(value, spec)
    return "n/a"


def format_iteration(result: Mapping[str, Any], steps_this_iter: int) -> str:
    """One line per iteration: iteration, timesteps, reward mean (min/max), steps/s, total time,
    each policy's mean return per agent in multi-agent runs, the evaluation's mean reward on
    iterations that evaluate, and the faults absorbed so far (if any)."""
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
    evaluation = result.get("evaluation")
    if isinstance(evaluation, Mapping):
        line += f"  evaluation {_fmt(evaluation.get('episode_reward_mean'))}"
    faults = [f"{label} {result[key]}" for key, label in _FAULTS_SHOWN if result.get(key)]
    if faults:
        line += "  " + ", ".join(faults)
    return line


# Fault counters the iteration line shows once they are non-zero, with their labels.
_FAULTS_SHOWN = (
    ("num_worker_restarts", "restarts"),
    ("num_replay_shard_restarts", "replay shard restarts"),
    ("num_lost_replay_calls", "lost replay calls"),
    ("num_aggregator_restarts", "aggregator restarts"),
    ("num_evaluation_worker_restarts", "evaluation worker restarts"),
    ("num_faulty_episodes", "faulty episodes"),
    ("num_bad_observations", "bad observations"),
    ("num_nonfinite_updates", "non-finite updates"),
    ("num_late_fragments", "late fragments"),
)


def _describe_stop(stop: Mapping[str, float]) -> str:
    if not stop:
        return "no stop criteria: training runs until Ctrl-C"
    return "stop at " + " or ".join(f"{key} >= {_fmt(value, 'g')}" for key, value in stop.items())


# --- commands ---------------------------------------------------------------------------------------


def checkpoint_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The checkpoint settings given as flags, as :class:`~flowrl.runs.run.RunSpec` keywords (flags left out are absent)."""
    given = {
        "checkpoint_freq": getattr(args, "checkpoint_freq", None),
        "checkpoint_interval_s": getattr(args, "checkpoint_interval_s", None),
        "keep_checkpoints": getattr(args, "keep_checkpoints", None),
        "keep_best": getattr(args, "keep_best", None),
    }
    return {key: value for key, value in given.items() if value is not None}


def tracker_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The trackers given as flags (``--wandb``, ``--mlflow``), as :class:`~flowrl.runs.run.RunSpec` keywords."""
    given = {"wandb_project": getattr(args, "wandb", None), "mlflow_tracking_uri": getattr(args, "mlflow", None)}
    return {key: value for key, value in given.items() if value is not None}


def _verbosity(args: argparse.Namespace) -> Verbosity:
    return "quiet" if args.quiet else "verbose" if args.verbose else "normal"


def _announce(args: argparse.Namespace, message: str) -> None:
    """Print a line about the run starting; --quiet prints only the summary and errors."""
    if not args.quiet:
        print(message, flush=True)


def _train(args: argparse.Namespace) -> int:
    if args.storage_path is not None and args.results_dir is not None:
        raise CLIError("--storage-path and --results-dir both say where run directories go: give one "
                       "(--storage-path for a filesystem every node of the cluster mounts)")
    if args.resume:
        return _resume(args)
    algorithm, env, config, stop = train_settings(args)
    spec = RunSpec(algorithm.name, env, config, stop, **checkpoint_settings(args), **tracker_settings(args))
    with start_run(spec, results_dir=args.results_dir, storage_path=args.storage_path, address=args.address) as run:
        _announce(args, f"training {algorithm.name} on {env}; {_describe_stop(stop)}")
        _announce(args, f"run directory: {run.directory}")
        return _train_until_stopped(run, _verbosity(args))


def resume_conflicts(args: argparse.Namespace, spec: RunSpec, params: Path) -> list[str]:
    """What in the flags contradicts the run being resumed (``spec``, read from ``params``), one message each.

    ``--algo`` and ``--env`` may be given when they name the run's own (in any case), and
    ``--seed`` when it is the run's seed; flags that would change its config are refused.
    """
    refused = [flag for flag, value in (("--config", args.config), ("--set", args.set),
                                        ("--results-dir", args.results_dir)) if value not in (None, [])]
    conflicts = []
    if refused:
        conflicts.append(f"{', '.join(refused)} cannot be used with --resume: a resumed run keeps the settings in "
                         f"{params} (stop flags, --num-workers, the checkpoint flags, --wandb, --mlflow and --address "
                         f"may change)")
    for key, value in (("algo", args.algo), ("env", args.env)):
        if value and value.lower() != getattr(spec, key).lower():
            conflicts.append(f"--{key} {value} differs from the run's {key} {getattr(spec, key)} (in {params})")
    seed = spec.config.get("seed")
    if args.seed is not None and args.seed != seed:
        unseeded = "it is unseeded; " if seed is None else ""
        conflicts.append(f"--seed {args.seed} differs from the run's seed {seed} ({unseeded}in {params})")
    return conflicts


def _resume(args: argparse.Namespace) -> int:
    run_dir = find_run_dir(args.resume, args.storage_path)
    spec = read_run_spec(run_dir)
    conflicts = resume_conflicts(args, spec, run_dir / PARAMS_FILE)
    if conflicts:
        raise CLIError("; ".join(conflicts))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RunWarning)  # the skipped checkpoints are printed below, in full
        point = find_resume_point(run_dir, storage_path=args.storage_path, stop=stop_from_flags(args),
                                  **checkpoint_settings(args), **tracker_settings(args))
    run_dir = point.directory  # absolute for a run on a storage path
    for skipped in point.skipped:
        print(f"flowrl: warning: skipped checkpoint {skipped.path}: {skipped.problem}", file=sys.stderr, flush=True)
    if point.stop_reason:
        print(f"nothing to do: {run_dir} already meets {point.stop_reason}; give a larger stop flag to train further")
        return EXIT_OK
    with resume_run(point, num_workers=args.num_workers, address=args.address) as run:
        if point.drops_results:
            _announce(args, f"{run_dir / PROGRESS_FILE}: dropped the results after iteration {point.iteration}, "
                            f"the checkpoint's")
        _announce(args, f"resuming {spec.algo} on {spec.env} from {point.checkpoint} "
                        f"(iteration {run.trainer.iteration}); {_describe_stop(run.spec.stop)}")
        _announce(args, f"run directory: {run_dir}")
        return _train_until_stopped(run, _verbosity(args))


def _signal_label(signum: signal.Signals) -> str:
    return "Ctrl-C" if signum == signal.SIGINT else signum.name


def _train_until_stopped(run: Run, verbosity: Verbosity) -> int:
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
        print(f"interrupted again while saving; the last complete checkpoint is {summary.checkpoint or 'none'}",
              file=sys.stderr, flush=True)
        if summary.checkpoint:
            print(f"resume with: flowrl train --resume {summary.directory}", file=sys.stderr, flush=True)
        return exit_status_for(interrupted_by)
    print(f"interrupted ({_signal_label(interrupted_by)})" if summary.interrupted else f"stopped: {summary.stop_reason}")
    if summary.best_reward is not None:
        print(f"best episode_reward_mean: {summary.best_reward:.2f} (iteration {summary.best_iteration})")
    print(f"checkpoint: {summary.checkpoint or 'none (no iteration finished)'}")
    print(f"results: {summary.directory}")
    if summary.interrupted:
        if summary.checkpoint:
            print(f"resume with: flowrl train --resume {summary.directory}", flush=True)
        return exit_status_for(interrupted_by)
    return EXIT_OK


def _report_failure(run: Run, error: Exception) -> None:
    """Print the error that ended training, the checkpoint saved for it (or why none was) and how to resume."""
    cause = getattr(error, "cause", None)
    if isinstance(error, FlowRLError) or isinstance(cause, FlowRLError):
        _report(error, sys.stderr)
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


def _tune(args: argparse.Namespace) -> int:
    if args.resume and (args.config or args.results_dir):
        raise CLIError("--config and --results-dir cannot be used with --resume: a resumed experiment keeps its "
                       "settings and its directory")
    if not args.resume and not args.config:
        raise CLIError("tune needs --config FILE (an experiment file, e.g. tuned_examples/tune-cartpole-ppo-grid.yaml) "
                       "or --resume EXP_DIR")
    from flowrl.tune import run as run_experiment  # Ray Tune is imported only for this command

    summary = run_experiment(args.config, results_dir=args.results_dir, address=args.address, resume=args.resume)
    counts: dict[str, int] = {}
    for trial in summary.trials:
        counts[trial.status.lower()] = counts.get(trial.status.lower(), 0) + 1
    print(f"trials: {len(summary.trials)} ({', '.join(f'{n} {status}' for status, n in sorted(counts.items()))})")
    best = summary.best
    if best is not None:
        config = ", ".join(f"{key}={json.dumps(value)}" for key, value in best.config.items()) or "no searched keys"
        print(f"best trial: {best.trial_id} ({config}): {summary.metric} {_fmt(best.last, '.4g')} at iteration "
              f"{best.iterations} (its best: {_fmt(best.best, '.4g')})")
        print(f"best trial directory: {best.directory}")
    print(f"all trials: {summary.trials_csv}")
    print(f"experiment: {summary.directory}", flush=True)
    for trial in summary.errored:
        print(f"flowrl: error: trial {trial.trial_id} failed: {trial.error} (traceback: {trial.error_file})",
              file=sys.stderr, flush=True)
    if summary.interrupted_by is not None:
        print(f"interrupted ({_signal_label(summary.interrupted_by)}); "
              f"resume with: flowrl tune --resume {summary.directory}", file=sys.stderr, flush=True)
        return exit_status_for(summary.interrupted_by)
    return EXIT_FAILURE if summary.errored else EXIT_OK


def _list(args: argparse.Namespace) -> int:
    from flowrl.algorithms import algorithm_descriptions, get_algorithm

    if args.algo:
        algorithm = get_algorithm(args.algo)  # imports that algorithm's module only
        print(f"{algorithm.name}: {algorithm.description}\n")
        print(algorithm.config_class.describe())
        return EXIT_OK
    descriptions = algorithm_descriptions()  # imports no algorithm module
    width = max(map(len, descriptions))
    for name, description in descriptions.items():
        print(f"{name:<{width}}  {description}")
    return EXIT_OK


def _plan(args: argparse.Namespace) -> int:
    if args.run_dir is not None:
        return _plan_of_run(args)
    run_flags = [flag for flag, given in (("--live", args.live), ("--last", args.last is not None),
                                          ("--interval", args.interval is not None), ("--format html", args.format == "html"))
                 if given]
    if run_flags:
        raise CLIError(f"{', '.join(run_flags)}: only for a run's plan with its measured figures; give RUN_DIR "
                       f"(a run directory of flowrl train)")
    from flowrl.engine.dry_plan import dry_plan  # the plan over placeholder actors: no Ray, no actor starts

    algorithm, env, config, _ = train_settings(args, "plan")
    plan = dry_plan(algorithm.name, env, config)
    print({"text": plan.describe, "mermaid": plan.to_mermaid, "dot": plan.to_dot}[args.format]())
    return EXIT_OK


def _plan_of_run(args: argparse.Namespace) -> int:
    """``flowrl plan RUN_DIR``: the run's plan coloured by its X-ray, once or (``--live``) until Ctrl-C."""
    from flowrl.plan.views import DEFAULT_LAST, render_run, watch_run

    settings = [flag for flag, given in (("--algo", args.algo), ("--env", args.env), ("--config", args.config),
                                         ("--set", args.set), ("--num-workers", args.num_workers is not None)) if given]
    if settings:
        raise CLIError(f"{', '.join(settings)} cannot be used with RUN_DIR: the run's own plan is drawn "
                       f"(leave out RUN_DIR to build a plan from settings)")
    last = DEFAULT_LAST if args.last is None else args.last
    if not args.live:
        if args.interval is not None:
            raise CLIError("--interval is the redraw interval of --live; add --live")
        print(render_run(args.run_dir, args.format, last))
        return EXIT_OK
    if args.format != "text":
        raise CLIError(f"--live redraws the text view; --format {args.format} draws once (leave out --live)")
    try:
        watch_run(args.run_dir, last=last, interval_s=2.0 if args.interval is None else args.interval)
    except KeyboardInterrupt:  # how a live view ends
        print()
    return EXIT_OK


def _trace(args: argparse.Namespace) -> int:
    from flowrl.plan.trace import write_trace

    trace = write_trace(args.run_dir, args.output, args.iterations)
    events = trace["traceEvents"]
    operators = sum(1 for event in events if event.get("cat") == "operator")
    actor_spans = [event for event in events if event.get("cat") == "actor"]
    samples = sum(1 for event in actor_spans if event["name"] == "RolloutWorker.sample()")
    workers = len({event["args"]["worker"] for event in actor_spans})
    iterations = trace["otherData"]["iterations"]
    shown = f"iteration {iterations[0]}" if len(iterations) == 1 else f"iterations {', '.join(map(str, iterations))}"
    print(f"{args.output}: {shown} of {args.run_dir}: {operators} operator calls, {samples} samples "
          f"and {len(actor_spans) - samples} hand-offs of {workers} rollout worker{'s' if workers != 1 else ''}")
    print("open it in https://ui.perfetto.dev or chrome://tracing")
    return EXIT_OK


def _doctor(args: argparse.Namespace) -> int:
    from flowrl.plan.doctor import diagnose_run

    diagnosis = diagnose_run(args.run_dir, last=args.last)
    print(json.dumps(diagnosis.to_dict(), indent=2) if args.json else diagnosis.report())
    return EXIT_OK


def _resolve_checkpoint(path: Path) -> Path:
    """A checkpoint directory, or the latest checkpoint of a run directory or a ``checkpoints/`` directory."""
    if (path / METADATA_FILE).is_file() or not path.is_dir():
        return path  # read_checkpoint reports what is wrong with it
    for directory in (path / CHECKPOINTS_DIR, path):
        found = latest_checkpoint(directory) if directory.is_dir() else None
        if found is not None:
            return found
    raise CheckpointError(f"{str(path)!r} is neither a checkpoint nor a directory holding checkpoint_* directories")


def _evaluate(args: argparse.Namespace) -> int:
    from flowrl.engine.trainer import evaluate_checkpoint

    checkpoint = _resolve_checkpoint(Path(args.checkpoint))
    stats = evaluate_checkpoint(checkpoint, num_episodes=args.episodes, seed=args.seed, video_dir=args.video)
    print(f"checkpoint: {checkpoint} ({stats['algo']} on {stats['env']}, iteration {stats['iteration']})")
    print(f"{args.episodes} episode{'s' if args.episodes != 1 else ''}, deterministic actions:")
    print(f"episode_reward_mean {_fmt(stats.get('episode_reward_mean'), '.2f')}  "
          f"min {_fmt(stats.get('episode_reward_min'), '.2f')}  max {_fmt(stats.get('episode_reward_max'), '.2f')}  "
          f"episode_len_mean {_fmt(stats.get('episode_len_mean'), '.1f')}")
    if args.video is not None:
        print(f"videos: {args.video}")
    return EXIT_OK


def _export(args: argparse.Namespace) -> int:
    from flowrl.serve.export import export_policy  # loads PyTorch: only for this command

    model = export_policy(args.run_dir, format=args.format, out=args.out, policy_id=args.policy, checkpoint=args.checkpoint)
    description = json.loads(model.with_name(model.name + ".json").read_text(encoding="utf-8"))

    def shown(tensor: Mapping[str, Any]) -> str:
        return f"{tensor['name']} {tensor['dtype']}[{', '.join(map(str, tensor['shape']))}]"

    print(f"exported policy {description['policy_id']} ({description['algo']}) of {description['checkpoint']}")
    print(f"model: {model}")
    print(f"description: {model.with_name(model.name + '.json')}")
    print(f"input: {shown(description['input'])}; outputs: {', '.join(shown(o) for o in description['outputs'])}")
    return EXIT_OK


def _plot(args: argparse.Namespace) -> int:
    from flowrl.outputs.plot import plot_runs

    given = {"x": args.x, "y": args.y, "out": args.output}
    drawn = plot_runs(args.run_dirs, **{key: value for key, value in given.items() if value is not None})
    print(f"{drawn.path}: {drawn.y_key} against {drawn.x_key}, {drawn.curves} curve{'s' if drawn.curves != 1 else ''}")
    for group in drawn.groups:
        print(f"  {group.label}")
    return EXIT_OK


def _demo(args: argparse.Namespace) -> int:
    """Run a small dataflow over shard actors and check its answer."""
    from flowrl.iterators import LocalIterator, from_range
    from flowrl.engine.ray_runtime import ray_session

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


def _seconds(text: str) -> float:
    value = _finite_float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be >= 0 seconds (0: off)")
    return value


def _positive_seconds(text: str) -> float:
    value = _finite_float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be > 0 seconds")
    return value


def _iteration_window(text: str) -> tuple[int, int]:
    try:
        window = parse_iteration_window(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if window is None:
        raise argparse.ArgumentTypeError("give A:B (iterations A to B) or N (iteration N)")
    return window


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
    train.add_argument("--storage-path", metavar="DIR",
                       help="put the run directory under DIR instead: an absolute path that every node of the Ray "
                            "cluster mounts (NFS, a bucket mount), so that any node can resume the run; checked "
                            "before training starts (writable; fsync and rename work there). "
                            "With --resume, RUN may be a run directory's name under DIR")
    train.add_argument("--checkpoint-freq", type=_int_at_least(0), metavar="N",
                       help="also checkpoint every N iterations (default 0: off)")
    train.add_argument("--checkpoint-interval-s", type=_seconds, metavar="S",
                       help=f"checkpoint when S seconds have passed since the last one "
                            f"(default {DEFAULT_CHECKPOINT_INTERVAL_S:g}; 0: off); "
                            f"a run also checkpoints at the end, on an error and on Ctrl-C, SIGTERM or SIGHUP")
    train.add_argument("--keep-checkpoints", type=_int_at_least(1), metavar="K",
                       help=f"keep the newest K checkpoints, deleting older ones (default {DEFAULT_KEEP_CHECKPOINTS})")
    train.add_argument("--keep-best", metavar="METRIC",
                       help="also keep a copy of the checkpoint with the highest METRIC (a result key, e.g. "
                            "episode_reward_mean; a/b for a nested key) in checkpoints/best (default with "
                            "evaluation_interval set: evaluation/episode_reward_mean)")
    train.add_argument("--wandb", metavar="PROJECT",
                       help="also log the run to this Weights & Biases project (needs pip install 'flowrl-ray[tracking]'; "
                            "WANDB_MODE=offline logs without an account)")
    train.add_argument("--mlflow", metavar="TRACKING_URI",
                       help="also log the run to this MLflow tracking server or store, e.g. http://localhost:5000 "
                            "(needs pip install 'flowrl-ray[tracking]'); the experiment is $MLFLOW_EXPERIMENT_NAME, "
                            "default flowrl")
    shown = train.add_mutually_exclusive_group()
    shown.add_argument("-q", "--quiet", action="store_true",
                       help="print no line per iteration: only the summary at the end, and errors")
    shown.add_argument("-v", "--verbose", action="store_true",
                       help="print each iteration's line (also on a terminal, above the live display) followed by "
                            "its learner statistics, health counters and evaluation and custom metrics")
    train.add_argument("--resume", metavar="RUN",
                       help="continue the run in run directory RUN (with --storage-path DIR: RUN's name under DIR) "
                            "from its latest usable checkpoint (stop and checkpoint flags given here replace its own; "
                            "--algo, --env and --seed may repeat its own)")
    train.set_defaults(func=_train)

    tuner = sub.add_parser("tune", help="search hyperparameters or train a population (PBT) on Ray Tune",
                           description="Run the trials of an experiment file on Ray Tune, side by side, and write "
                                       "an experiment directory with one run directory per trial and trials.csv.")
    tuner.add_argument("--config", metavar="FILE",
                       help="YAML or JSON experiment file: a tuned example with search spaces in its config, and "
                            "num_samples, metric, mode, scheduler, search_alg (see docs/tune.md)")
    tuner.add_argument("--results-dir", metavar="DIR",
                       help=f"where the experiment directory goes (default ./{DEFAULT_RESULTS_DIR})")
    tuner.add_argument("--resume", metavar="EXP_DIR",
                       help="continue the interrupted experiment in EXP_DIR: its unfinished and failed trials go on "
                            "from their latest checkpoints, with the experiment's own settings")
    tuner.add_argument("--address", default=None, help=_ADDRESS_HELP)
    tuner.set_defaults(func=_tune)

    lister = sub.add_parser("list", help="list the algorithms (or one algorithm's config keys)")
    lister.add_argument("algo", nargs="?", help="show this algorithm's config keys, defaults and docs")
    lister.set_defaults(func=_list)

    plan = sub.add_parser("plan", help="print an algorithm's execution plan graph, or a run's with its measured figures",
                          description="Without RUN_DIR: build the plan --algo and --env would run, without Ray, and print "
                                      "its graph. With RUN_DIR: draw that run's plan (its plan.json) with each operator "
                                      "coloured by its share of the iteration and each edge by its rate, from the plan "
                                      "X-ray of its last iterations (result['plan'] in progress.jsonl).")
    plan.add_argument("run_dir", nargs="?", metavar="RUN_DIR", help="a run directory (flowrl train's): draw its plan with its figures")
    _add_config_flags(plan)
    plan.add_argument("--format", choices=("text", "mermaid", "dot", "html"), default="text",
                      help="output format (default text); html (a self-contained page) needs RUN_DIR")
    plan.add_argument("--last", type=_int_at_least(1), metavar="N",
                      help="with RUN_DIR: average the figures of the last N iterations (default 5; the first "
                           "iteration is left out when there are more)")
    plan.add_argument("--live", action="store_true",
                      help="with RUN_DIR: redraw the text view every --interval seconds, re-reading the run, until Ctrl-C")
    plan.add_argument("--interval", type=_positive_seconds, metavar="S", help="--live's redraw interval (default 2 s)")
    plan.set_defaults(func=_plan)

    tracer = sub.add_parser("trace", help="write a run's traced iterations as a Chrome / Perfetto trace",
                            description="Merge the spans a run recorded (trace/iteration_<n>.json, for the iterations its "
                                        "config's trace_iterations names) into one Chrome trace file: the plan's operators "
                                        "nested as they pull from each other, and the rollout workers' sample() calls "
                                        "with their env and inference seconds.")
    tracer.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (flowrl train's)")
    tracer.add_argument("-o", "--output", default="trace.json", metavar="FILE.json",
                        help="the trace file to write (default trace.json)")
    tracer.add_argument("--iterations", type=_iteration_window, metavar="A:B",
                        help="the traced iterations from A to B (or N alone) to include (default: every one recorded)")
    tracer.set_defaults(func=_trace)

    doctor = sub.add_parser("doctor", help="say which resource bounds a run (from its plan X-ray), with the numbers and the knob to turn",
                            description="Read the plan X-ray of a run's last iterations (result['plan'] in progress.jsonl) and "
                                        "say whether it is env-, inference-, learner-, transfer- or driver-bound, or held "
                                        "back by a straggler worker; the numbers behind the verdict and the config keys to turn.")
    doctor.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (flowrl train's)")
    doctor.add_argument("--last", type=_int_at_least(1), default=5, metavar="N",
                        help="iterations to read, from the end (default 5; the first iteration is left out when there are more)")
    doctor.add_argument("--json", action="store_true", help="print the diagnosis as JSON")
    doctor.set_defaults(func=_doctor)

    evaluate = sub.add_parser("evaluate", help="run episodes with a checkpoint's policy (deterministic actions)")
    evaluate.add_argument("checkpoint", help="a checkpoint directory, or a run directory (its latest checkpoint)")
    evaluate.add_argument("--episodes", type=_int_at_least(1), default=10, metavar="N", help="episodes to run (default 10)")
    evaluate.add_argument("--seed", type=int, default=None, help="reset episode i with seed + i (default: unseeded)")
    evaluate.add_argument("--video", metavar="DIR",
                          help="record every episode as an MP4 file in DIR (needs pip install 'flowrl-ray[video]')")
    evaluate.set_defaults(func=_evaluate)

    exporter = sub.add_parser("export", help="export a checkpoint's policy as a TorchScript or ONNX model for serving",
                              description="Write a model mapping a batch of observations to greedy actions (and what "
                                          "they were chosen from), loadable with torch or onnxruntime alone, and a "
                                          "JSON file beside it describing its input and outputs.")
    exporter.add_argument("run_dir", metavar="RUN_DIR", help="a run directory or a checkpoint directory")
    exporter.add_argument("--checkpoint", type=_int_at_least(0), metavar="N",
                          help="export the run's checkpoint_N (default: its latest checkpoint)")
    exporter.add_argument("--format", choices=("torchscript", "onnx"), required=True,
                          help="torchscript (.pt, needs torch) or onnx (.onnx, needs onnxruntime; pip install 'flowrl-ray[export]')")
    exporter.add_argument("--out", metavar="DIR", help="directory to write into (default: exports/<checkpoint> in the run directory)")
    exporter.add_argument("--policy", metavar="ID", help="the policy to export, for checkpoints holding several (multi-agent)")
    exporter.set_defaults(func=_export)

    plotter = sub.add_parser("plot", help="draw learning curves of runs (seeds of one setting as mean ± std)",
                             description="Draw learning curves from runs' progress.jsonl: runs of one algorithm, env "
                                         "and config that differ only in their seed as their mean ± std, each trial "
                                         "of a flowrl tune experiment as its own curve. Needs pip install 'flowrl-ray[plot]'.")
    plotter.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories or flowrl tune experiment directories")
    plotter.add_argument("--x", metavar="KEY", help="result key on the x axis (default timesteps_total)")
    plotter.add_argument("--y", metavar="KEY",
                         help="result key on the y axis; nested keys with /, e.g. evaluation/episode_reward_mean "
                              "(default episode_reward_mean)")
    plotter.add_argument("-o", "--output", metavar="FILE.png",
                         help="image to write; its suffix sets the format: .png, .svg, .pdf (default curve.png)")
    plotter.set_defaults(func=_plot)

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


@contextlib.contextmanager
def _run_warnings_as_messages() -> Iterator[None]:
    """Print :class:`~flowrl.runs.run.RunWarning` as ``flowrl: warning: ...`` lines and how RLlib keys were read
    (:class:`~flowrl.config.rllib.RLlibConfigNote`) as ``flowrl: note: ...``; other warnings as Python does."""
    show = warnings.showwarning

    def show_warning(message: Warning | str, category: type[Warning], *args: Any, **kwargs: Any) -> None:
        if issubclass(category, RunWarning):
            print(f"flowrl: warning: {message}", file=sys.stderr, flush=True)
        elif issubclass(category, RLlibConfigNote):
            print(f"flowrl: note: {message}", file=sys.stderr, flush=True)
        else:
            show(message, category, *args, **kwargs)

    warnings.showwarning = show_warning
    try:
        yield
    finally:
        warnings.showwarning = show


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``flowrl`` console script; returns the exit status."""
    args = build_parser().parse_args(argv)
    for name in ("items", "num_shards", "batch_size"):
        if getattr(args, name, 1) < 1:
            print(f"flowrl: error: --{name.replace('_', '-')}={getattr(args, name)} must be >= 1", file=sys.stderr)
            return EXIT_USAGE
    try:
        with _run_warnings_as_messages():
            return args.func(args)
    except FlowRLError as e:
        _report(e, sys.stderr)
        # Bad input is a usage error; anything else (a worker failing mid-run) is a failure.
        return EXIT_USAGE if isinstance(e, USAGE_ERRORS) else EXIT_FAILURE
    except KeyboardInterrupt as e:
        received = interrupt_signal(e)
        print(f"flowrl: interrupted ({_signal_label(received)})", file=sys.stderr, flush=True)
        return exit_status_for(received)

