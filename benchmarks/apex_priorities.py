"""Benchmark Ape-X on CartPole-v1 to 475 with worker-side priorities against max-priority insertion.

Each trial trains ``apex`` with ``tuned_examples/cartpole-apex.yaml`` (``--config`` picks another), its
stop replaced by a 100-episode mean of ``--target`` (default 475) or ``--max-steps`` env steps (default
400k; a trial that hits it counts as failed), with ``worker_side_prioritization`` true (the rollout workers
compute their rows' initial priorities) or false (new rows enter at the max priority). Seeds 0, 1, 2; the
two variants alternate, each trial in a fresh Python process whose clock starts before ``import ray``, so
start-up counts. Wall time is the time until the ``train()`` call whose result reached the target returned.

Run from the repository root::

    python benchmarks/apex_priorities.py                         # 6 trials
    python benchmarks/apex_priorities.py --seeds 0 --max-steps 50000 --target 100   # a smoke test

It prints a table and writes the figures as JSON to ``--out`` (default
``benchmarks/results/apex_priorities.json``), with the 1-minute load average around each trial: on a shared
machine other load moves every wall time.
"""

from __future__ import annotations

import time

_CLOCK_START = time.perf_counter()  # a --trial's clock: before importing ray, torch or flowrl

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CONFIG = ROOT / "tuned_examples" / "cartpole-apex.yaml"
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "apex_priorities.json"
RESULT_PREFIX = "APEX_PRIORITIES_RESULT "
VARIANTS = {"worker_side": True, "max_priority": False}


def loadavg() -> float:
    """The 1-minute load average."""
    return round(os.getloadavg()[0], 2)


def trial(variant: str, seed: int, target: float, max_steps: int, config_file: Path) -> dict[str, Any]:
    """Train Ape-X until the 100-episode mean reaches ``target`` or ``max_steps`` (runs in its own process)."""
    load_start = loadavg()
    from flowrl.engine.trainer import Trainer
    from flowrl.runs.experiment import load_experiment_file

    experiment = load_experiment_file(str(config_file))
    config = {**experiment["config"], "seed": seed, "worker_side_prioritization": VARIANTS[variant]}
    trainer = Trainer("apex", "CartPole-v1", config)
    history: list[list[float]] = []
    reached, steps = False, 0
    try:
        while True:
            result = trainer.train()
            steps = int(result["timesteps_total"])
            reward = result.get("episode_reward_mean")
            now = time.perf_counter() - _CLOCK_START
            history.append([steps, reward, round(now, 2)])
            print(f"  [{variant} seed {seed}] steps {steps:>7}  reward {reward:7.1f}  t {now:6.1f}s", file=sys.stderr)
            if reward is not None and math.isfinite(reward) and reward >= target:
                reached = True
                break
            if steps >= max_steps:
                break
        wall_s = time.perf_counter() - _CLOCK_START
        trained = int(result["info"].get("num_steps_trained", 0))
    finally:
        trainer.stop()
    return {
        "variant": variant,
        "seed": seed,
        "reached": reached,
        "env_steps": steps,
        "steps_trained": trained,
        "wall_s": round(wall_s, 2),
        "history": history,
        "loadavg_start_end": [load_start, loadavg()],
    }


def run_trial(variant: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    """One trial in a fresh process: its result, or a failure record."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--trial", variant, "--seed", str(seed)]
    cmd += ["--target", str(args.target), "--max-steps", str(args.max_steps), "--config", str(args.config)]
    print(f"-- {variant} seed {seed} (load {loadavg():.2f})", flush=True)
    failure = {"variant": variant, "seed": seed, "reached": False}
    try:
        proc = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True, timeout=args.timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return {**failure, "error": f"timed out after {args.timeout_s} s"}
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT_PREFIX):
            result: dict[str, Any] = json.loads(line[len(RESULT_PREFIX) :])
            status = "reached" if result["reached"] else "NOT reached"
            print(f"   {status} {args.target:g} at {result['env_steps']} steps, {result['wall_s']:.1f} s", flush=True)
            return result
    return {**failure, "error": f"exit status {proc.returncode}"}


def summarize(trials: list[dict[str, Any]]) -> dict[str, Any]:
    """Per variant: trials reaching the target, and median env steps and wall time (a failure counts infinite)."""
    summary = {}
    for variant in VARIANTS:
        mine = [t for t in trials if t["variant"] == variant]
        steps = statistics.median([t["env_steps"] if t["reached"] else math.inf for t in mine])
        wall = statistics.median([t["wall_s"] if t["reached"] else math.inf for t in mine])
        summary[variant] = {
            "reached": sum(t["reached"] for t in mine),
            "trials": len(mine),
            "median_env_steps": steps if math.isfinite(steps) else None,
            "median_wall_s": wall if math.isfinite(wall) else None,
        }
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--target", type=float, default=475.0)
    parser.add_argument("--max-steps", type=int, default=400_000)
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="the tuned example trained")
    parser.add_argument("--timeout-s", type=float, default=1800.0, help="a trial's longest run")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--trial", choices=sorted(VARIANTS), help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.trial:
        result = trial(args.trial, args.seed, args.target, args.max_steps, args.config)
        print(RESULT_PREFIX + json.dumps(result), flush=True)
        return
    load_start = loadavg()
    trials = [run_trial(variant, seed, args) for seed in args.seeds for variant in VARIANTS]
    summary = summarize(trials)
    print(f"\nApe-X on CartPole-v1 to {args.target:g} ({args.config.name}, cap {args.max_steps} steps)")
    print(f"{'variant':<14}{'reached':>9}{'median steps':>15}{'median wall s':>15}")
    for variant, row in summary.items():
        print(
            f"{variant:<14}{row['reached']:>5}/{row['trials']:<3}{row['median_env_steps'] or 'n/a':>15}"
            f"{row['median_wall_s'] or 'n/a':>15}"
        )
    report = {
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version()},
        "loadavg_1m_start_end": [load_start, loadavg()],
        "target": args.target,
        "max_steps": args.max_steps,
        "config": str(args.config.relative_to(ROOT) if args.config.is_relative_to(ROOT) else args.config),
        "summary": summary,
        "trials": trials,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
