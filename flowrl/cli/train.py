"""``flowrl train``: its flags, and a new run or a resumed one started from them.

A shell over :mod:`flowrl.runs.run` (the run directory, stop criteria, checkpoints, resuming);
``--config`` files are read by :mod:`flowrl.runs.experiment`, and :mod:`flowrl.cli.summary`
shows the run training and reports how it ended.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flowrl.cli.args import (
    add_checkpoint_flags,
    add_command,
    add_config_flags,
    add_results_dir_flag,
    add_umask_flag,
    checkpoint_settings,
    finite_float,
    int_at_least,
    parse_set,
    stop_from_flags,
    tracker_settings,
    train_settings,
)
from flowrl.cli.exits import EXIT_OK
from flowrl.cli.summary import describe_stop, train_until_stopped
from flowrl.errors import CLIError, RunWarning, install_hint
from flowrl.outputs.progress import Verbosity
from flowrl.runs.resume import RESUME_CONFIG_KEYS, find_resume_point, resume_run
from flowrl.runs.run import start_run
from flowrl.storage.checkpoints import list_checkpoints
from flowrl.storage.rundir import (
    CHECKPOINTS_DIR,
    PARAMS_FILE,
    PROGRESS_FILE,
    RunSpec,
    find_run_dir,
    json_safe,
    named_run_dir,
    read_run_spec,
)

if TYPE_CHECKING:
    from flowrl.cli.args import Subparsers, TrainSettings


def _verbosity(args: argparse.Namespace) -> Verbosity:
    return "quiet" if args.quiet else "verbose" if args.verbose else "normal"


def _announce(args: argparse.Namespace, message: str) -> None:
    """Print a line about the run starting; --quiet prints only the summary and errors."""
    if not args.quiet:
        print(message, flush=True)


def run(args: argparse.Namespace) -> int:
    """``flowrl train``: a new run, or (``--resume``, ``--resume-if-exists``) the rest of one; returns the exit
    status."""
    if args.storage_path is not None and args.results_dir is not None:
        raise CLIError(
            "--storage-path and --results-dir both say where run directories go: give one "
            "(--storage-path for a filesystem every node of the cluster mounts)"
        )
    if args.resume_if_exists and not args.name:
        raise CLIError("--resume-if-exists needs --name NAME: the run directory to resume if it exists")
    if args.resume and args.name:
        raise CLIError(f"--name names a new run's directory; --resume continues {args.resume}: give one of them")
    if args.resume:
        return _resume(args, args.resume)
    if args.name is not None:
        named = named_run_dir(args.name, results_dir=args.results_dir, storage_path=args.storage_path)
        if args.resume_if_exists and list_checkpoints(named / CHECKPOINTS_DIR):
            return _resume(args, str(named), repeated=True)
    algorithm, env, config, stop = train_settings(args)
    spec = RunSpec(algorithm.name, env, config, stop, **checkpoint_settings(args), **tracker_settings(args))
    with start_run(
        spec,
        results_dir=args.results_dir,
        storage_path=args.storage_path,
        address=args.address,
        name=args.name,
        restart_unfinished=args.resume_if_exists,
        umask=args.umask,
    ) as started:
        _announce(args, f"training {algorithm.name} on {env}; {describe_stop(stop)}")
        _announce(args, f"run directory: {started.directory}")
        return train_until_stopped(started, _verbosity(args))


def resume_conflicts(
    args: argparse.Namespace,
    spec: RunSpec,
    params: Path,
    *,
    repeated: bool = False,
    assignments: Sequence[tuple[list[str], Any]] | None = None,
    settings: Callable[[], TrainSettings] | None = None,
) -> list[str]:
    """What in the flags contradicts the run being resumed (``spec``, read from ``params``), one message each.

    ``--algo`` and ``--env`` may be given when they name the run's own (in any case), and
    ``--seed`` when it is the run's seed; flags that would change its config are refused, but for
    ``--set`` of the restart budget's keys. When the command is ``repeated`` (``--resume-if-exists``:
    the command that started the run, run again), ``--results-dir`` finds the run, and ``--config``
    and ``--set`` may give the run's own config. ``assignments`` (``parse_set(args.set)``) and ``settings``
    (what returns ``train_settings(args)``, called only when ``repeated`` and nothing above conflicts) are
    worked out here when not given.
    """
    if assignments is None:
        assignments = parse_set(args.set or [])
    given_sets = zip(args.set or [], assignments)
    other_sets = [item for item, (path, _) in given_sets if ".".join(path) not in RESUME_CONFIG_KEYS]
    refused = [
        flag
        for flag, value in (("--config", args.config), ("--set", other_sets), ("--results-dir", args.results_dir))
        if value not in (None, []) and not repeated
    ]
    conflicts = []
    if refused:
        conflicts.append(
            f"{', '.join(refused)} cannot be used with --resume: a resumed run keeps the settings in "
            f"{params} (stop flags, --num-workers, --set {'/'.join(sorted(RESUME_CONFIG_KEYS))}, the checkpoint "
            f"flags, --wandb, --mlflow and --address may change)"
        )
    for key, value in (("algo", args.algo), ("env", args.env)):
        if value and value.lower() != getattr(spec, key).lower():
            conflicts.append(f"--{key} {value} differs from the run's {key} {getattr(spec, key)} (in {params})")
    if repeated and not conflicts:
        given = settings() if settings is not None else train_settings(args, assignments=assignments)
        return _config_changes(given, spec, params)  # --seed included
    seed = spec.config.get("seed")
    if args.seed is not None and args.seed != seed:
        unseeded = "it is unseeded; " if seed is None else ""
        conflicts.append(f"--seed {args.seed} differs from the run's seed {seed} ({unseeded}in {params})")
    return conflicts


def _config_changes(settings: TrainSettings, spec: RunSpec, params: Path) -> list[str]:
    """The config keys the flags (``--config``, ``--set``, ``--seed``; ``settings``: the flags' ``train_settings``)
    give other values than the run's own."""
    algorithm, _, config, _ = settings
    given = json.loads(json.dumps(json_safe(algorithm.config_class.from_dict(config).to_dict())))
    may_change = RESUME_CONFIG_KEYS | {"num_workers"}
    changed = [key for key in sorted(given) if key not in may_change and given[key] != spec.config.get(key, given[key])]
    if not changed:
        return []
    shown = ", ".join(
        f"{key}={json.dumps(given[key])} (the run's: {json.dumps(spec.config.get(key))})" for key in changed
    )
    return [f"the flags give {shown}: a resumed run keeps its config (in {params})"]


def _resume(args: argparse.Namespace, run: str, *, repeated: bool = False) -> int:
    run_dir = find_run_dir(run, args.storage_path)
    spec = read_run_spec(run_dir)
    assignments = parse_set(args.set or [])
    # The command run again (--resume-if-exists): its flags' own settings, made once when first needed (by
    # resume_conflicts, after --algo and --env are found to be the run's) and used again for the stop criteria.
    settings = functools.cache(functools.partial(train_settings, args, assignments=assignments))
    conflicts = resume_conflicts(
        args, spec, run_dir / PARAMS_FILE, repeated=repeated, assignments=assignments, settings=settings
    )
    if conflicts:
        raise CLIError("; ".join(conflicts))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RunWarning)  # the skipped checkpoints are printed below, in full
        point = find_resume_point(
            run_dir,
            storage_path=args.storage_path,
            stop=settings()[3] if repeated else stop_from_flags(args),
            config={path[0]: value for path, value in assignments if path[0] in RESUME_CONFIG_KEYS},
            **checkpoint_settings(args),
            **tracker_settings(args),
        )
    run_dir = point.directory  # absolute for a run on a storage path
    for skipped in point.skipped:
        print(f"flowrl: warning: skipped checkpoint {skipped.path}: {skipped.problem}", file=sys.stderr, flush=True)
    if point.stop_reason:
        print(f"nothing to do: {run_dir} already meets {point.stop_reason}; give a larger stop flag to train further")
        return EXIT_OK
    with resume_run(point, num_workers=args.num_workers, address=args.address, umask=args.umask) as resumed:
        if point.drops_results:
            _announce(
                args,
                f"{run_dir / PROGRESS_FILE}: dropped the results after iteration {point.iteration}, the checkpoint's",
            )
        _announce(
            args,
            f"resuming {spec.algo} on {spec.env} from {point.checkpoint} "
            f"(iteration {resumed.trainer.iteration}); {describe_stop(resumed.spec.stop)}",
        )
        _announce(args, f"run directory: {run_dir}")
        return train_until_stopped(resumed, _verbosity(args))


HELP = "train an algorithm on an env, writing a run directory"
DESCRIPTION = (
    "Train an algorithm on an env. Config precedence: algorithm defaults "
    "< --config file < --set < --num-workers/--seed."
)
EXAMPLES = (
    "flowrl train --algo ppo --env CartPole-v1 --stop-reward 475",
    "flowrl train --config tuned_examples/cartpole-ppo.yaml --num-workers 4 --set lr=0.0003",
    "flowrl train --algo dqn --env CartPole-v1 --stop-timesteps 100000 --keep-best episode_reward_mean",
    "flowrl train --resume flowrl_results/ppo_CartPole-v1_20250101-120000 --stop-iters 200",
    "flowrl train --config tuned_examples/cartpole-ppo.yaml --name nightly --resume-if-exists",
)


def add_parser(subparsers: Subparsers) -> None:
    """Register ``flowrl train`` and its flags."""
    train = add_command(subparsers, "train", run, help=HELP, description=DESCRIPTION, examples=EXAMPLES)
    add_config_flags(train)
    train.add_argument("--seed", type=int, help="random seed (config key seed); overrides --config and --set")
    train.add_argument("--stop-reward", type=finite_float, metavar="R", help="stop when episode_reward_mean >= R")
    train.add_argument("--stop-timesteps", type=int_at_least(1), metavar="T", help="stop when timesteps_total >= T")
    train.add_argument("--stop-iters", type=int_at_least(1), metavar="I", help="stop when training_iteration >= I")
    add_results_dir_flag(train, "run directories go")
    train.add_argument(
        "--storage-path",
        metavar="DIR",
        help="put the run directory under DIR instead: an absolute path that every node of the Ray "
        "cluster mounts (NFS, a bucket mount), so that any node can resume the run; checked "
        "before training starts (writable; fsync and rename work there). "
        "With --resume, RUN may be a run directory's name under DIR",
    )
    add_checkpoint_flags(train)
    train.add_argument(
        "--wandb",
        metavar="PROJECT",
        help=f"also log the run to this Weights & Biases project (needs {install_hint('tracking')}; "
        "WANDB_MODE=offline logs without an account)",
    )
    train.add_argument(
        "--mlflow",
        metavar="TRACKING_URI",
        help="also log the run to this MLflow tracking server or store, e.g. http://localhost:5000 "
        f"(needs {install_hint('tracking')}); the experiment is $MLFLOW_EXPERIMENT_NAME, "
        "default flowrl",
    )
    shown = train.add_mutually_exclusive_group()
    shown.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="print no line per iteration: only the summary at the end, and errors",
    )
    shown.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="print each iteration's line (also on a terminal, above the live display) followed by "
        "its learner statistics, health counters and evaluation and custom metrics",
    )
    train.add_argument(
        "--resume",
        metavar="RUN",
        help="continue the run in run directory RUN (with --storage-path DIR: RUN's name under DIR) "
        "from its latest usable checkpoint (stop and checkpoint flags given here replace its own; "
        "--algo, --env and --seed may repeat its own)",
    )
    train.add_argument(
        "--name",
        metavar="NAME",
        help="name the run directory NAME (under --results-dir or --storage-path) instead of "
        "<algo>_<env>_<timestamp>; an existing run of that name is an error, unless --resume-if-exists",
    )
    train.add_argument(
        "--resume-if-exists",
        action="store_true",
        help="with --name: resume the run NAME from its latest checkpoint if it exists (as --resume does; "
        "--config, --set and --results-dir may repeat its own), else start it, so that a resubmitted "
        "job goes on where it stopped",
    )
    add_umask_flag(train, "run directory")
