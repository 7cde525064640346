"""``flowrl record``: a trained policy's episodes written as experience files, for offline algorithms to learn from.

A shell over :func:`flowrl.engine.record.record_checkpoint`: the checkpoint's policy plays whole episodes
in this process (no Ray), and their rows are written as Parquet files with a ``metadata.json``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from flowrl.cli.args import add_command, int_at_least
from flowrl.cli.exits import EXIT_OK
from flowrl.errors import install_hint
from flowrl.outputs.progress import format_number

if TYPE_CHECKING:
    from flowrl.cli.args import Subparsers


def run(args: argparse.Namespace) -> int:
    """``flowrl record RUN_DIR --episodes N --out DIR``: record the episodes and print one line about them."""
    from flowrl.engine.record import record_checkpoint  # loads PyTorch and PyArrow: only for this command

    recorded = record_checkpoint(
        args.run_dir,
        args.out,
        episodes=args.episodes,
        checkpoint=args.checkpoint,
        explore=args.explore,
        seed=args.seed,
    )
    files = recorded["files"]
    print(
        f"recorded {recorded['episodes']} episodes, {recorded['steps']} steps, mean return "
        f"{format_number(recorded['episode_reward_mean'], '.2f')} ({'exploring' if args.explore else 'greedy'}) "
        f"of {recorded['algo']} on {recorded['env']} from {recorded['checkpoint']}: "
        f"{len(files)} file{'s' if len(files) != 1 else ''} in {Path(args.out)}"
    )
    return EXIT_OK


HELP = "record a checkpoint's episodes as experience files (Parquet) for offline algorithms"
DESCRIPTION = (
    "Play whole episodes with a checkpoint's policy (greedy unless --explore) and write their steps "
    "as Parquet files with a metadata.json into a new or empty directory, for bc or marwil's input "
    f"(needs {install_hint('offline')})."
)


def add_parser(subparsers: Subparsers) -> None:
    """Register ``flowrl record`` and its flags."""
    record = add_command(
        subparsers,
        "record",
        run,
        help=HELP,
        description=DESCRIPTION,
        run_dir="a run directory (its latest checkpoint), a checkpoint directory or a flowrl tune trial "
        "directory (its best checkpoint)",
    )
    record.add_argument("--episodes", type=int_at_least(1), required=True, metavar="N", help="whole episodes to record")
    record.add_argument("--out", required=True, metavar="DIR", help="a new or empty directory to write the files into")
    record.add_argument(
        "--checkpoint",
        type=int_at_least(0),
        metavar="N",
        help="record with the run's checkpoint of iteration N (default: its latest; a Tune trial's: its best)",
    )
    record.add_argument(
        "--explore", action="store_true", help="sample actions as in training (default: the greedy action)"
    )
    record.add_argument("--seed", type=int, default=None, help="seed the envs' resets and the sampling")
