"""``flowrl evaluate``: episodes run with a checkpoint's policy (deterministic actions), and their rewards.

The policy is read from the checkpoint's portable files (:func:`flowrl.serve.evaluate.evaluate_policy_files`):
nothing is unpickled, and no module the checkpoint names is imported unless ``--allow-import`` allows it.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from flowrl.cli.args import add_allow_import_flag, add_command, int_at_least
from flowrl.cli.exits import EXIT_OK
from flowrl.errors import install_hint
from flowrl.outputs.progress import format_number

if TYPE_CHECKING:
    from flowrl.cli.args import Subparsers


def run(args: argparse.Namespace) -> int:
    """``flowrl evaluate CHECKPOINT``: run the episodes and print their rewards and lengths."""
    from flowrl.serve.evaluate import evaluate_policy_files  # loads PyTorch: only for this command
    from flowrl.serve.inference import checkpoint_dir

    checkpoint = checkpoint_dir(Path(args.checkpoint))
    stats = evaluate_policy_files(
        checkpoint, num_episodes=args.episodes, seed=args.seed, video_dir=args.video, allow_imports=args.allow_imports
    )
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
    evaluate.add_argument(
        "checkpoint",
        help="a checkpoint directory, a run directory (its latest checkpoint) or a flowrl tune trial "
        "directory (its best checkpoint by the experiment's metric)",
    )
    evaluate.add_argument(
        "--episodes", type=int_at_least(1), default=10, metavar="N", help="episodes to run (default 10)"
    )
    evaluate.add_argument("--seed", type=int, default=None, help="reset episode i with seed + i (default: unseeded)")
    evaluate.add_argument(
        "--video",
        metavar="DIR",
        help=f"record every episode as an MP4 file in DIR (needs {install_hint('video')})",
    )
    add_allow_import_flag(evaluate)
