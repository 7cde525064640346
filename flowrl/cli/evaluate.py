"""``flowrl evaluate``: episodes run with a checkpoint's policy (deterministic actions), and their rewards."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from flowrl.cli.args import add_command, int_at_least
from flowrl.cli.exits import EXIT_OK
from flowrl.errors import CheckpointError
from flowrl.outputs.progress import format_number
from flowrl.storage.checkpoints import METADATA_FILE, latest_checkpoint
from flowrl.storage.rundir import CHECKPOINTS_DIR

if TYPE_CHECKING:
    from flowrl.cli.args import Subparsers


def _resolve_checkpoint(path: Path) -> Path:
    """A checkpoint directory, or the latest checkpoint of a run directory or a ``checkpoints/`` directory."""
    if (path / METADATA_FILE).is_file() or not path.is_dir():
        return path  # read_checkpoint reports what is wrong with it
    for directory in (path / CHECKPOINTS_DIR, path):
        found = latest_checkpoint(directory) if directory.is_dir() else None
        if found is not None:
            return found
    raise CheckpointError(f"{str(path)!r} is neither a checkpoint nor a directory holding checkpoint_* directories")


def run(args: argparse.Namespace) -> int:
    """``flowrl evaluate CHECKPOINT``: run the episodes and print their rewards and lengths."""
    from flowrl.engine.build import evaluate_checkpoint

    checkpoint = _resolve_checkpoint(Path(args.checkpoint))
    stats = evaluate_checkpoint(checkpoint, num_episodes=args.episodes, seed=args.seed, video_dir=args.video)
    print(f"checkpoint: {checkpoint} ({stats['algo']} on {stats['env']}, iteration {stats['iteration']})")
    print(f"{args.episodes} episode{'s' if args.episodes != 1 else ''}, deterministic actions:")
    print(
        f"episode_reward_mean {format_number(stats.get('episode_reward_mean'), '.2f')}  "
        f"min {format_number(stats.get('episode_reward_min'), '.2f')}  "
        f"max {format_number(stats.get('episode_reward_max'), '.2f')}  "
        f"episode_len_mean {format_number(stats.get('episode_len_mean'), '.1f')}"
    )
    if args.video is not None:
        print(f"videos: {args.video}")
    return EXIT_OK


def add_parser(subparsers: Subparsers) -> None:
    """Register ``flowrl evaluate`` and its flags."""
    evaluate = add_command(
        subparsers, "evaluate", run, help="run episodes with a checkpoint's policy (deterministic actions)"
    )
    evaluate.add_argument("checkpoint", help="a checkpoint directory, or a run directory (its latest checkpoint)")
    evaluate.add_argument(
        "--episodes", type=int_at_least(1), default=10, metavar="N", help="episodes to run (default 10)"
    )
    evaluate.add_argument("--seed", type=int, default=None, help="reset episode i with seed + i (default: unseeded)")
    evaluate.add_argument(
        "--video",
        metavar="DIR",
        help="record every episode as an MP4 file in DIR (needs pip install 'flowrl-ray[video]')",
    )
