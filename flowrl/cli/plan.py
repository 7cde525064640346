"""``flowrl plan``: the plan an algorithm would run, built without Ray, or a run's plan with its measured figures."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from flowrl.cli.args import RUN_DIR_HELP, add_command, add_config_flags, add_last_flag, positive_seconds, train_settings
from flowrl.cli.exits import EXIT_OK
from flowrl.errors import CLIError

if TYPE_CHECKING:
    from flowrl.cli.args import Subparsers


def run(args: argparse.Namespace) -> int:
    """``flowrl plan``: print the plan built from the settings, or (RUN_DIR) the run's own."""
    if args.run_dir is not None:
        return _plan_of_run(args)
    run_flags = [
        flag
        for flag, given in (
            ("--live", args.live),
            ("--last", args.last is not None),
            ("--interval", args.interval is not None),
            ("--format html", args.format == "html"),
        )
        if given
    ]
    if run_flags:
        raise CLIError(
            f"{', '.join(run_flags)}: only for a run's plan with its measured figures; give RUN_DIR "
            f"(a run directory of flowrl train)"
        )
    from flowrl.engine.dry_plan import dry_plan  # the plan over placeholder actors: no Ray, no actor starts

    algorithm, env, config, _ = train_settings(args, "plan")
    plan = dry_plan(algorithm.name, env, config)
    print({"text": plan.describe, "mermaid": plan.to_mermaid, "dot": plan.to_dot}[args.format]())
    return EXIT_OK


def _plan_of_run(args: argparse.Namespace) -> int:
    """``flowrl plan RUN_DIR``: the run's plan coloured by its X-ray, once or (``--live``) until Ctrl-C."""
    from flowrl.plan.views import DEFAULT_LAST, render_run, watch_run

    settings = [
        flag
        for flag, given in (
            ("--algo", args.algo),
            ("--env", args.env),
            ("--config", args.config),
            ("--set", args.set),
            ("--num-workers", args.num_workers is not None),
        )
        if given
    ]
    if settings:
        raise CLIError(
            f"{', '.join(settings)} cannot be used with RUN_DIR: the run's own plan is drawn "
            f"(leave out RUN_DIR to build a plan from settings)"
        )
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


HELP = "print an algorithm's execution plan graph, or a run's with its measured figures"
DESCRIPTION = (
    "Without RUN_DIR: build the plan --algo and --env would run, without Ray, and print "
    "its graph. With RUN_DIR: draw that run's plan (its plan.json) with each operator "
    "coloured by its share of the iteration and each edge by its rate, from the plan "
    "X-ray of its last iterations (result['plan'] in progress.jsonl)."
)


def add_parser(subparsers: Subparsers) -> None:
    """Register ``flowrl plan`` and its flags."""
    plan = add_command(subparsers, "plan", run, help=HELP, description=DESCRIPTION)
    plan.add_argument("run_dir", nargs="?", metavar="RUN_DIR", help=f"{RUN_DIR_HELP}: draw its plan with its figures")
    add_config_flags(plan)
    plan.add_argument(
        "--format",
        choices=("text", "mermaid", "dot", "html"),
        default="text",
        help="output format (default text); html (a self-contained page) needs RUN_DIR",
    )
    add_last_flag(
        plan,
        "with RUN_DIR: average the figures of the last N iterations (default 5; the first "
        "iteration is left out when there are more)",
    )
    plan.add_argument(
        "--live",
        action="store_true",
        help="with RUN_DIR: redraw the text view every --interval seconds, re-reading the run, until Ctrl-C",
    )
    plan.add_argument("--interval", type=positive_seconds, metavar="S", help="--live's redraw interval (default 2 s)")
