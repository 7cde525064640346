"""``flowrl tune``: run an experiment file's trials on Ray Tune (or resume them) and print the summary.

A shell over :func:`flowrl.tune.run`, which is imported only when this command runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from flowrl.cli.args import add_address_flag, add_command, add_experiment_flag, add_results_dir_flag
from flowrl.cli.exits import EXIT_FAILURE, EXIT_OK, exit_status_for, signal_label
from flowrl.errors import CLIError
from flowrl.outputs.progress import format_number

if TYPE_CHECKING:
    from flowrl.cli.args import Subparsers


def run(args: argparse.Namespace) -> int:
    """``flowrl tune``: run or resume an experiment; returns the exit status."""
    if args.resume and (args.config or args.results_dir):
        raise CLIError(
            "--config and --results-dir cannot be used with --resume: a resumed experiment keeps its "
            "settings and its directory"
        )
    if not args.resume and not args.config:
        raise CLIError(
            "tune needs --config FILE (an experiment file, e.g. tuned_examples/tune-cartpole-ppo-grid.yaml) "
            "or --resume EXP_DIR"
        )
    from flowrl.tune import run as run_experiment  # Ray Tune is imported only for this command

    summary = run_experiment(args.config, results_dir=args.results_dir, address=args.address, resume=args.resume)
    counts: dict[str, int] = {}
    for trial in summary.trials:
        counts[trial.status.lower()] = counts.get(trial.status.lower(), 0) + 1
    print(f"trials: {len(summary.trials)} ({', '.join(f'{n} {status}' for status, n in sorted(counts.items()))})")
    best = summary.best
    if best is not None:
        config = ", ".join(f"{key}={json.dumps(value)}" for key, value in best.config.items()) or "no searched keys"
        print(
            f"best trial: {best.trial_id} ({config}): {summary.metric} {format_number(best.last, '.4g')} at iteration "
            f"{best.iterations} (its best: {format_number(best.best, '.4g')})"
        )
        print(f"best trial directory: {best.directory}")
    print(f"all trials: {summary.trials_csv}")
    print(f"experiment: {summary.directory}", flush=True)
    for trial in summary.errored:
        print(
            f"flowrl: error: trial {trial.trial_id} failed: {trial.error} (traceback: {trial.error_file})",
            file=sys.stderr,
            flush=True,
        )
    if summary.interrupted_by is not None:
        print(
            f"interrupted ({signal_label(summary.interrupted_by)}); "
            f"resume with: flowrl tune --resume {summary.directory}",
            file=sys.stderr,
            flush=True,
        )
        return exit_status_for(summary.interrupted_by)
    return EXIT_FAILURE if summary.errored else EXIT_OK


HELP = "search hyperparameters or train a population (PBT) on Ray Tune"
DESCRIPTION = (
    "Run the trials of an experiment file on Ray Tune, side by side, and write "
    "an experiment directory with one run directory per trial and trials.csv."
)
EXAMPLES = (
    "flowrl tune --config tuned_examples/tune-cartpole-ppo-grid.yaml",
    "flowrl tune --config tuned_examples/tune-cartpole-ppo-pbt.yaml --results-dir ~/tune_results",
    "flowrl tune --resume flowrl_results/ppo_CartPole-v1_20250101-120000",
    "flowrl evaluate BEST_TRIAL_DIRECTORY  # the best trial's best checkpoint, as tune prints it",
)


def add_parser(subparsers: Subparsers) -> None:
    """Register ``flowrl tune`` and its flags."""
    tuner = add_command(subparsers, "tune", run, help=HELP, description=DESCRIPTION, examples=EXAMPLES)
    add_experiment_flag(
        tuner,
        ": a tuned example with search spaces in its config, and "
        "num_samples, metric, mode, scheduler, search_alg (see docs/tune.md)",
    )
    add_results_dir_flag(tuner, "the experiment directory goes")
    tuner.add_argument(
        "--resume",
        metavar="EXP_DIR",
        help="continue the interrupted experiment in EXP_DIR: its unfinished and failed trials go on "
        "from their latest checkpoints, with the experiment's own settings; it unpickles the experiment's "
        "state and checkpoints, which can run code: resume only experiments you trust",
    )
    add_address_flag(tuner)
