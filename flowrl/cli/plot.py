"""``flowrl plot``: learning curves of runs and Tune experiments drawn into an image."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from flowrl.cli.args import add_command
from flowrl.cli.exits import EXIT_OK
from flowrl.errors import install_hint

if TYPE_CHECKING:
    from flowrl.cli.args import Subparsers


def run(args: argparse.Namespace) -> int:
    """``flowrl plot RUN_DIR...``: draw the curves with :func:`flowrl.outputs.plot.plot_runs` and say what was drawn."""
    from flowrl.outputs.plot import plot_runs

    given = {"x": args.x, "y": args.y, "out": args.output}
    drawn = plot_runs(args.run_dirs, **{key: value for key, value in given.items() if value is not None})
    print(f"{drawn.path}: {drawn.y_key} against {drawn.x_key}, {drawn.curves} curve{'s' if drawn.curves != 1 else ''}")
    for group in drawn.groups:
        print(f"  {group.label}")
    return EXIT_OK


HELP = "draw learning curves of runs (seeds of one setting as mean ± std)"
DESCRIPTION = (
    "Draw learning curves from runs' progress.jsonl: runs of one algorithm, env "
    "and config that differ only in their seed as their mean ± std, each trial "
    f"of a flowrl tune experiment as its own curve. Needs {install_hint('plot')}."
)


def add_parser(subparsers: Subparsers) -> None:
    """Register ``flowrl plot`` and its flags."""
    plotter = add_command(subparsers, "plot", run, help=HELP, description=DESCRIPTION)
    plotter.add_argument(
        "run_dirs", nargs="+", metavar="RUN_DIR", help="run directories or flowrl tune experiment directories"
    )
    plotter.add_argument("--x", metavar="KEY", help="result key on the x axis (default timesteps_total)")
    plotter.add_argument(
        "--y",
        metavar="KEY",
        help="result key on the y axis; nested keys with /, e.g. evaluation/episode_reward_mean "
        "(default episode_reward_mean)",
    )
    plotter.add_argument(
        "-o",
        "--output",
        metavar="FILE.png",
        help="image to write; its suffix sets the format: .png, .svg, .pdf (default curve.png)",
    )
