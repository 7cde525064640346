"""Benchmark how long the ``flowrl`` command takes for commands that should feel instant.

Each command runs as a fresh subprocess of this Python (``python -m flowrl.cli ...``, what the
``flowrl`` script runs), ``--reps`` times (default 5), and the median wall time is reported:

- ``import flowrl``: ``python -c "import flowrl"`` (loads neither PyTorch, Gymnasium nor Ray);
- ``flowrl --help`` and ``flowrl list``: argument parsing and the algorithm registry only
  (goal: at most 0.5 s for ``--help``);
- ``flowrl list ppo``: one algorithm's config keys (imports that algorithm's module, without PyTorch);
- ``flowrl plan --algo ppo|apex --env CartPole-v1``: the plan's graph, built over placeholder
  actors without starting Ray (goal: well under 2 s);
- ``flowrl train --algo ppo --env CartPole-v1 --num-workers 0 --stop-iters 1``: one PPO
  iteration in the driver alone, run directory in a temporary directory (median of
  ``--train-reps``, default 3; ``--train-reps 0`` leaves it out).

``RAY_ADDRESS`` is removed from the commands' environment, so none joins a cluster. Wall times
depend on the machine's load (CPU count and load average are saved with the figures): compare
figures taken on the same machine. To time another source tree (before and after a change), run
this script from outside the repository with ``PYTHONPATH`` pointing at that tree (``python -m``
puts the current directory first on the path).

Run from the repository root::

    python benchmarks/cli_latency.py                       # about a minute
    python benchmarks/cli_latency.py --reps 3 --train-reps 0 --out /tmp/cli_latency.json

It prints a table and writes the figures as JSON to ``--out`` (default
``benchmarks/results/cli_latency.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "cli_latency.json"
CLI = [sys.executable, "-m", "flowrl.cli"]
#: name -> (command, goal in seconds or None)
COMMANDS: dict[str, tuple[list[str], float | None]] = {
    "import flowrl": ([sys.executable, "-c", "import flowrl"], None),
    "flowrl --help": ([*CLI, "--help"], 0.5),
    "flowrl list": ([*CLI, "list"], None),
    "flowrl list ppo": ([*CLI, "list", "ppo"], None),
    "flowrl plan --algo ppo --env CartPole-v1": ([*CLI, "plan", "--algo", "ppo", "--env", "CartPole-v1"], 2.0),
    "flowrl plan --algo apex --env CartPole-v1": ([*CLI, "plan", "--algo", "apex", "--env", "CartPole-v1"], 2.0),
}
TRAIN = "flowrl train --algo ppo --env CartPole-v1 --num-workers 0 --stop-iters 1"


def wall_times(command: list[str], reps: int) -> list[float]:
    """Seconds each of ``reps`` runs of ``command`` took; a failing command raises with its output."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        proc = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
        times.append(time.perf_counter() - start)
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(command)} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return times


def main() -> None:
    """Parse options, time each command, print and save the figures."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where to write the JSON figures")
    parser.add_argument("--reps", type=int, default=5, help="runs per command (default 5)")
    parser.add_argument(
        "--train-reps", type=int, default=3, help="runs of the one-iteration PPO train (default 3; 0: skip)"
    )
    args = parser.parse_args()

    load_before = os.getloadavg()
    figures: dict[str, dict[str, Any]] = {}
    for name, (command, goal) in COMMANDS.items():
        times = wall_times(command, args.reps)
        figures[name] = {
            "median_s": round(statistics.median(times), 3),
            "runs_s": [round(t, 3) for t in times],
            "goal_s": goal,
        }
    if args.train_reps:
        with tempfile.TemporaryDirectory(prefix="flowrl-cli-latency-") as results:
            command = [*CLI, *TRAIN.split()[1:], "--results-dir", results, "--quiet"]
            times = wall_times(command, args.train_reps)
        figures[TRAIN] = {
            "median_s": round(statistics.median(times), 3),
            "runs_s": [round(t, 3) for t in times],
            "goal_s": None,
        }

    print(f"{'command':<74}{'median s':>9}  {'goal':>6}  met")
    for name, figure in figures.items():
        goal = figure["goal_s"]
        met = "-" if goal is None else ("yes" if figure["median_s"] <= goal else "NO")
        shown_goal = "-" if goal is None else f"<={goal:g}"
        print(f"{name:<74}{figure['median_s']:>9.3f}  {shown_goal:>6}  {met}")
    report = {
        "machine": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "load_average_1_5_15_before": [round(x, 2) for x in load_before],
            "load_average_1_5_15_after": [round(x, 2) for x in os.getloadavg()],
        },
        "settings": {
            "reps": args.reps,
            "train_reps": args.train_reps,
            "statistic": "median wall time of fresh subprocesses",
        },
        "commands": figures,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nfigures written to {args.out}")


if __name__ == "__main__":
    main()
