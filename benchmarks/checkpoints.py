"""Benchmark what a checkpoint costs: the time to save and restore one, its size, and ``load_policy``.

For each setup a Trainer trains a few iterations; then, alternating, ``trainer.save`` (the state
of the driver and of every remote worker, its envs mid-episode included, written crash-safely
with checksums), ``trainer.restore`` of that checkpoint into the same trainer (with its checks
first), and ``flowrl.load_policy`` (no Ray, no pickle). Medians over ``--reps`` rounds; sizes
are the files on disk.

Setups: PPO on CartPole-v1 with 2 remote rollout workers; DQN on CartPole-v1 sampling in the
driver after ``--dqn-steps`` env steps, with the replay buffer's contents in the checkpoint (the
default) and without (``store_buffer_in_checkpoints: false``).

Run from the repository root::

    python benchmarks/checkpoints.py              # about a minute
    python benchmarks/checkpoints.py --quick      # a smoke test
    python benchmarks/checkpoints.py --out /tmp/checkpoints.json

It prints a table and writes the figures as JSON to ``--out`` (default
``benchmarks/results/checkpoints.json``).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import ray

import flowrl
from flowrl import Trainer


def directory_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def measure(name: str, algo: str, config: dict[str, Any], iterations: int, reps: int) -> dict[str, Any]:
    save_s, restore_s, load_s = [], [], []
    with Trainer(algo, "CartPole-v1", config) as trainer, tempfile.TemporaryDirectory() as tmp:
        for _ in range(iterations):
            result = trainer.train()
        for rep in range(reps):
            start = time.perf_counter()
            path = Path(trainer.save(Path(tmp) / str(rep)))
            save_s.append(time.perf_counter() - start)
            start = time.perf_counter()
            trainer.restore(path)
            restore_s.append(time.perf_counter() - start)
            start = time.perf_counter()
            flowrl.load_policy(path)
            load_s.append(time.perf_counter() - start)
        files = {f.name: f.stat().st_size for f in path.iterdir()}
        return {
            "setup": name,
            "timesteps_total": result["timesteps_total"],
            "save_s": statistics.median(save_s),
            "restore_s": statistics.median(restore_s),
            "load_policy_s": statistics.median(load_s),
            "checkpoint_bytes": directory_bytes(path),
            "files": files,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=5, help="save/restore rounds per setup (default 5)")
    parser.add_argument("--dqn-steps", type=int, default=20_000, help="env steps DQN samples first (default 20000)")
    parser.add_argument("--quick", action="store_true", help="a smoke test: 2 rounds, 2000 DQN steps")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/checkpoints.json"))
    args = parser.parse_args()
    reps, dqn_steps = (2, 2_000) if args.quick else (args.reps, args.dqn_steps)
    dqn = {"num_workers": 0, "seed": 0, "learning_starts": 1000, "timesteps_per_iteration": 1000}
    setups = [
        (
            "ppo, 2 remote workers",
            "ppo",
            {"num_workers": 2, "num_cpus_per_worker": 0.5, "train_batch_size": 2000, "seed": 0},
            3,
        ),
        (f"dqn, {dqn_steps} steps, replay saved", "dqn", dqn, dqn_steps // 1000),
        (
            f"dqn, {dqn_steps} steps, replay not saved",
            "dqn",
            {**dqn, "store_buffer_in_checkpoints": False},
            dqn_steps // 1000,
        ),
    ]
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
    try:
        rows = [measure(name, algo, config, iterations, reps) for name, algo, config, iterations in setups]
    finally:
        ray.shutdown()
    print(f"{'setup':<36} {'steps':>7} {'save s':>8} {'restore s':>10} {'load_policy s':>14} {'size':>10}")
    for row in rows:
        print(
            f"{row['setup']:<36} {row['timesteps_total']:>7} {row['save_s']:>8.3f} {row['restore_s']:>10.3f} "
            f"{row['load_policy_s']:>14.3f} {row['checkpoint_bytes'] / 1e6:>8.2f}MB"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"machine": platform.platform(), "reps": reps, "results": rows}, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
