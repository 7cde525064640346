"""Benchmark population-based training against a grid search, with the same env-step budget.

PPO on CartPole-v1, four trials side by side in each experiment (sampling in the trial's own
process, half a CPU each): first a 4-point grid over ``lr``, each trial stopping at a 100-episode
mean of ``--target`` or at its share of the budget; then PBT with four trials started from the
same four learning rates, exploiting every ``--interval`` iterations and mutating ``lr`` and
``entropy_coeff``, until one trial reaches the target or the population has used the budget.

Figures: for the grid's best setting (the trial that reached the target in the fewest env steps)
its env steps and its wall time; for PBT, the env steps behind the first trial to reach the
target (its own and those of the checkpoints it took over, as ``timesteps_total`` counts them),
the env steps the whole population had sampled by then, and the wall time to that result.

Run from the repository root::

    python benchmarks/pbt.py                  # about 5 minutes on 2 cores
    python benchmarks/pbt.py --quick          # a smoke test (target 100)
    python benchmarks/pbt.py --out /tmp/pbt.json

It prints a table and writes the figures as JSON to ``--out`` (default ``benchmarks/results/pbt.json``).
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import ray
from ray import tune
from ray.tune.schedulers import PopulationBasedTraining
from ray.tune.stopper import Stopper

from flowrl.tune.trainable import RunDirectoryLogger, trainable_for

LEARNING_RATES = [3e-3, 1e-3, 3e-4, 1e-4]
CONFIG = {
    "num_workers": 0,
    "num_cpus_for_driver": 0.5,
    "num_envs_per_worker": 4,
    "rollout_fragment_length": 250,
    "train_batch_size": 1000,
    "sgd_minibatch_size": 128,
    "num_sgd_iter": 10,
    "gamma": 0.99,
    "lambda": 0.95,
    "model": {"fcnet_hiddens": [64, 64]},
    "seed": 0,
}


class StopAtTarget(Stopper):
    """Stop a trial at ``target`` reward or ``cap`` env steps; with ``stop_all``, every trial once one
    reaches the target."""

    def __init__(self, target: float, cap: int, stop_all: bool) -> None:
        self.target, self.cap, self.all, self.reached = target, cap, stop_all, False

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        hit = result.get("episode_reward_mean", float("-inf")) >= self.target
        self.reached = self.reached or hit
        return hit or result["timesteps_total"] >= self.cap

    def stop_all(self) -> bool:
        return self.all and self.reached


def experiment(name: str, storage: Path, stopper: StopAtTarget, scheduler: Any = None) -> list[list[dict[str, Any]]]:
    """Run four trials; each trial's results, with ``wall_s`` (seconds since the experiment began) added."""
    start = time.monotonic()
    tuner = tune.Tuner(
        trainable_for("ppo", "CartPole-v1"),
        param_space={**CONFIG, "lr": tune.grid_search(LEARNING_RATES), "entropy_coeff": 0.0},
        tune_config=tune.TuneConfig(
            metric="episode_reward_mean", mode="max", scheduler=scheduler, reuse_actors=scheduler is not None
        ),
        run_config=tune.RunConfig(
            name=name, storage_path=str(storage), stop=stopper, verbose=0, callbacks=[RunDirectoryLogger()]
        ),
    )
    grid = tuner.fit()
    # Each result's wall-clock time (Tune's timestamp), relative to the experiment's start.
    offset = time.time() - (time.monotonic() - start)
    # progress.jsonl keeps every result of a trial, those before an exploit included.
    return [
        [
            {
                "timesteps_total": r["timesteps_total"],
                "episode_reward_mean": r["episode_reward_mean"],
                "lr": r["config"]["lr"],
                "wall_s": r["timestamp"] - offset,
            }
            for r in map(json.loads, (Path(trial.path) / "progress.jsonl").read_text().splitlines())
        ]
        for trial in grid
    ]


def first_at(trials: list[list[dict[str, Any]]], target: float) -> tuple[int, dict[str, Any]] | None:
    """The trial index and result that reached ``target`` earliest in wall time (None if none did)."""
    hits = [
        (r["wall_s"], i, r) for i, results in enumerate(trials) for r in results if r["episode_reward_mean"] >= target
    ]
    if not hits:
        return None
    _, index, result = min(hits, key=lambda hit: hit[0])
    return index, result


def population_steps(trials: list[list[dict[str, Any]]], wall_s: float) -> int:
    """Env steps the population sampled up to ``wall_s``: one train batch per iteration of every trial."""
    return CONFIG["train_batch_size"] * sum(r["wall_s"] <= wall_s + 1e-6 for results in trials for r in results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", type=float, default=475.0)
    parser.add_argument(
        "--budget", type=int, default=600_000, help="env steps for the whole population (default 600000)"
    )
    parser.add_argument("--interval", type=int, default=5, help="PBT perturbation interval, in iterations")
    parser.add_argument("--quick", action="store_true", help="target 100, budget 40000")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/pbt.json"))
    args = parser.parse_args()
    if args.quick:
        args.target, args.budget = 100.0, 40_000
    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.ERROR)
    with tempfile.TemporaryDirectory() as storage:
        grid = experiment(
            "grid", Path(storage), StopAtTarget(args.target, args.budget // len(LEARNING_RATES), stop_all=False)
        )
        pbt_scheduler = PopulationBasedTraining(
            time_attr="training_iteration",
            perturbation_interval=args.interval,
            quantile_fraction=0.25,
            resample_probability=0.25,
            hyperparam_mutations={"lr": tune.loguniform(1e-4, 3e-3), "entropy_coeff": [0.0, 0.001, 0.01]},
        )
        pbt = experiment("pbt", Path(storage), StopAtTarget(args.target, args.budget, stop_all=True), pbt_scheduler)
    ray.shutdown()

    grid_hits = [
        (results[i], results)
        for results in grid
        for i, r in enumerate(results)
        if r["episode_reward_mean"] >= args.target
    ]
    best_grid = min(grid_hits, key=lambda hit: hit[0]["timesteps_total"]) if grid_hits else None
    pbt_hit = first_at(pbt, args.target)
    figures: dict[str, Any] = {
        "target": args.target,
        "budget_env_steps": args.budget,
        "perturbation_interval": args.interval,
        "machine": platform.machine(),
        "learning_rates": LEARNING_RATES,
        "grid": {
            "reached": best_grid is not None,
            "best_lr": best_grid[0]["lr"] if best_grid else None,
            "best_env_steps": best_grid[0]["timesteps_total"] if best_grid else None,
            "best_wall_s": round(best_grid[0]["wall_s"], 1) if best_grid else None,
            "population_env_steps_then": population_steps(grid, best_grid[0]["wall_s"]) if best_grid else None,
            "final_rewards": {results[0]["lr"]: round(results[-1]["episode_reward_mean"], 1) for results in grid},
        },
        "pbt": {
            "reached": pbt_hit is not None,
            "env_steps": pbt_hit[1]["timesteps_total"] if pbt_hit else None,
            "lr_then": pbt_hit[1]["lr"] if pbt_hit else None,
            "wall_s": round(pbt_hit[1]["wall_s"], 1) if pbt_hit else None,
            "population_env_steps_then": population_steps(pbt, pbt_hit[1]["wall_s"]) if pbt_hit else None,
        },
    }
    print(f"{'':6} {'reached':>8} {'env steps':>10} {'wall s':>8} {'population steps':>17}")
    g, p = figures["grid"], figures["pbt"]
    print(
        f"{'grid':6} {g['reached']!s:>8} {g['best_env_steps']!s:>10} {g['best_wall_s']!s:>8} "
        f"{g['population_env_steps_then']!s:>17}"
        f"   (best lr {g['best_lr']})"
    )
    print(
        f"{'pbt':6} {p['reached']!s:>8} {p['env_steps']!s:>10} {p['wall_s']!s:>8} "
        f"{p['population_env_steps_then']!s:>17}"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(figures, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
