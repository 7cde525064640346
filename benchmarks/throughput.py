"""Benchmark training throughput: IMPALA against PPO and A2C, and ES evaluation with 1 and 2 workers.

1. IMPALA, PPO and A2C on CartPole-v1 with the SAME rollout workers: 2 remote workers
   (one Ray CPU each), ``num_envs_per_worker=8``, ``rollout_fragment_length=50``. Training
   settings are each algorithm's tuned example (``tuned_examples/cartpole-*.yaml``) apart
   from those worker keys. Each repetition builds a fresh Trainer, runs one warm-up
   iteration, then trains for ``--seconds`` of wall time; env steps sampled and trained per
   second over that window are recorded. Algorithms alternate within each repetition
   (I P A I P A ...), and medians and IMPALA / PPO, IMPALA / A2C ratios (of sampling
   throughput) are reported (goal: IMPALA / PPO >= 1.5 on 2 workers).

2. IMPALA at its own tuned settings (``tuned_examples/cartpole-impala.yaml`` as it is: 2
   workers of one Ray CPU each, 64 envs per worker, 6400-step train batches), in the same
   alternation: env steps sampled and trained per second, training included (goal: >= 75k
   sampled per second on 2 cores).

3. ES (the tuned CartPole example) with 1 and then 2 remote workers, sizes alternating:
   env steps evaluated per second (perturbed and unperturbed episodes) and 2 / 1.

4. What the plan X-ray costs (``--profile-overhead`` runs this part alone): IMPALA at its tuned
   settings and the tuned PPO example (which samples in the driver), each as two trainers built
   side by side, one with ``profile: true`` (the default) and one with ``profile: false``, that
   take turns of ``--turn-seconds`` (0.5 s) for ``--seconds`` each, ``--reps`` times anew. Each
   round's on / off ratio of env steps sampled per second compares two measurements a second
   apart, which cancels the machine's drift in speed (on a shared machine, far larger than the
   X-ray's cost); their median and its 95% bootstrap interval are reported (goal: >= 0.98, i.e.
   the X-ray costs at most 2%).

Parts 1-3 save the 1-minute load average before every measurement: on a shared 2-core machine
it explains noisy figures. Run from the repository root::

    python benchmarks/throughput.py                 # about six minutes
    python benchmarks/throughput.py --quick         # a smoke test (~1 minute)
    python benchmarks/throughput.py --reps 5 --seconds 15 --out /tmp/throughput.json
    python benchmarks/throughput.py --profile-overhead --reps 4 --seconds 40   # the X-ray's cost alone (~13 minutes)

It prints tables and writes the figures as JSON to ``--out`` (default
``benchmarks/results/throughput.json``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import platform
import random
import statistics
import time
from pathlib import Path
from typing import Any

import ray
import yaml

from flowrl import Trainer

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "throughput.json"
WORKERS = {"num_workers": 2, "num_envs_per_worker": 8, "rollout_fragment_length": 50, "num_cpus_per_worker": 1.0}
ALGOS = ("impala", "ppo", "a2c")
#: IMPALA at its own tuned settings, measured beside the comparison on common workers.
IMPALA_TUNED = "impala_tuned"
IMPALA_GOAL = 75_000.0


def tuned_config(algo: str) -> dict[str, Any]:
    spec = yaml.safe_load((ROOT / "tuned_examples" / f"cartpole-{algo}.yaml").read_text())
    return dict(spec["config"])


def measure(algo: str, config: dict[str, Any], seconds: float) -> dict[str, float]:
    """Env steps sampled and trained per second of wall time, after one warm-up iteration."""
    load = os.getloadavg()[0]
    trainer = Trainer(algo, "CartPole-v1", {**config, "seed": 0})
    try:
        return {**steady_rates(trainer, seconds), "load_avg_1m": load}
    finally:
        trainer.stop()


def steady_rates(
    trainer: Trainer, seconds: float, warmup_s: float = 0.0, until_trained: bool = False
) -> dict[str, float]:
    """Env steps ``trainer`` samples and trains per second of wall time over ``seconds`` of ``train()`` calls,
    after a warm-up of one call, at least ``warmup_s``, and (``until_trained``) until something was trained."""
    start = time.perf_counter()
    result = trainer.train()
    while time.perf_counter() - start < warmup_s or (until_trained and not result["timesteps_trained"]):
        result = trainer.train()
    sampled0, trained0, start = result["timesteps_total"], result["timesteps_trained"], time.perf_counter()
    while time.perf_counter() - start < seconds:
        result = trainer.train()
    wall = time.perf_counter() - start
    return {
        "sampled_per_s": (result["timesteps_total"] - sampled0) / wall,
        "trained_per_s": (result["timesteps_trained"] - trained0) / wall,
        "wall_s": wall,
    }


def median_of(runs: list[dict[str, float]], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def compare_algorithms(reps: int, seconds: float) -> dict[str, Any]:
    configs = {algo: {**tuned_config(algo), **WORKERS, "timesteps_per_iteration": 2000} for algo in ALGOS}
    configs[IMPALA_TUNED] = {**tuned_config("impala"), "num_cpus_per_worker": 1.0}
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in configs}
    for rep in range(reps):
        for name, config in configs.items():
            runs[name].append(measure("impala" if name == IMPALA_TUNED else name, config, seconds))
            print(
                f"  rep {rep + 1}/{reps} {name:12s} sampled {runs[name][-1]['sampled_per_s']:9.0f}/s  "
                f"trained {runs[name][-1]['trained_per_s']:9.0f}/s",
                flush=True,
            )
    medians = {
        name: {
            "sampled_per_s": median_of(runs[name], "sampled_per_s"),
            "trained_per_s": median_of(runs[name], "trained_per_s"),
        }
        for name in configs
    }
    ratios = {
        "impala_over_ppo_sampled": medians["impala"]["sampled_per_s"] / medians["ppo"]["sampled_per_s"],
        "impala_over_a2c_sampled": medians["impala"]["sampled_per_s"] / medians["a2c"]["sampled_per_s"],
    }
    print("\nalgorithm     sampled env steps/s   trained env steps/s   (medians)")
    for name in configs:
        print(f"{name:12s}  {medians[name]['sampled_per_s']:19.0f}   {medians[name]['trained_per_s']:19.0f}")
    print(f"IMPALA / PPO (sampled, same workers): {ratios['impala_over_ppo_sampled']:.2f}   (goal >= 1.5)")
    print(f"IMPALA / A2C (sampled, same workers): {ratios['impala_over_a2c_sampled']:.2f}")
    loads = [r["load_avg_1m"] for r in runs[IMPALA_TUNED]]
    print(
        f"IMPALA at its tuned settings (sampled): {medians[IMPALA_TUNED]['sampled_per_s']:.0f}/s   "
        f"(goal >= {IMPALA_GOAL:.0f}; 1-minute load average {min(loads):.2f}-{max(loads):.2f})"
    )
    return {
        "workers": WORKERS,
        "configs": configs,
        "runs": runs,
        "medians": medians,
        "ratios": ratios,
        "impala_tuned_goal_sampled_per_s": IMPALA_GOAL,
    }


def es_scaling(reps: int, seconds: float) -> dict[str, Any]:
    base = {**tuned_config("es"), "num_cpus_per_worker": 1.0}
    runs: dict[int, list[dict[str, float]]] = {1: [], 2: []}
    for rep in range(reps):
        for n in (1, 2):
            runs[n].append(measure("es", {**base, "num_workers": n}, seconds))
            print(
                f"  rep {rep + 1}/{reps} ES {n} worker(s): {runs[n][-1]['sampled_per_s']:9.0f} env steps/s", flush=True
            )
    medians = {n: median_of(runs[n], "sampled_per_s") for n in runs}
    print("\nES workers   evaluated env steps/s (median)")
    for n in (1, 2):
        print(f"{n:10d}   {medians[n]:12.0f}")
    print(f"2 / 1 workers: {medians[2] / medians[1]:.2f}")
    return {
        "config": base,
        "runs": {str(n): r for n, r in runs.items()},
        "medians": {str(n): m for n, m in medians.items()},
        "two_over_one": medians[2] / medians[1],
    }


def interleaved_rates(trainers: dict[str, Trainer], turns: int, turn_s: float) -> list[dict[str, float]]:
    """Env steps each of ``trainers`` samples per second of its own ``train()`` calls, in ``turns``
    rounds: in each round every trainer trains in turn for ``turn_s`` (at least one iteration), the
    order reversed every other round, so the trainers of a round meet the same load on the machine."""
    totals = {name: trainer.train()["timesteps_total"] for name, trainer in trainers.items()}
    rounds = []
    for n in range(turns):
        rates: dict[str, float] = {}
        for name in list(trainers) if n % 2 == 0 else list(trainers)[::-1]:
            start = time.perf_counter()
            total = trainers[name].train()["timesteps_total"]
            while time.perf_counter() - start < turn_s:
                total = trainers[name].train()["timesteps_total"]
            rates[name] = (total - totals[name]) / (time.perf_counter() - start)
            totals[name] = total
        rounds.append(rates)
    return rounds


def bootstrap_median(values: list[float], draws: int = 2000) -> tuple[float, float]:
    """A 95% bootstrap interval of the median of ``values`` (fixed seed)."""
    rng = random.Random(0)
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(draws))
    return medians[int(0.025 * draws)], medians[int(0.975 * draws) - 1]


def profile_overhead(reps: int, seconds: float, turn_s: float) -> dict[str, Any]:
    """Env steps sampled per second with the plan X-ray on and off, per tuned example: a trainer of each
    setting built side by side, taking turns of ``turn_s`` for ``seconds`` each, ``reps`` times anew.
    The ratio of each round (on / off, measured a second apart) cancels the machine's drift in speed,
    which on a shared machine is far larger than the X-ray's cost. While one trainer has its turn, the
    other's workers finish the requests it has in flight: the same for both settings."""
    # Half a Ray CPU per worker lets both trainers' workers live at once; they take turns at the cores.
    examples = {"impala": {**tuned_config("impala"), "num_cpus_per_worker": 0.5}, "ppo": tuned_config("ppo")}
    report: dict[str, Any] = {"configs": examples, "turn_s": turn_s, "goal": 0.98, "examples": {}}
    print("\nexample   profile on /s   profile off /s   on / off: median of rounds [95% interval]   rounds")
    for algo, config in examples.items():
        rounds: list[dict[str, float]] = []
        for _ in range(reps):
            with contextlib.ExitStack() as stack:
                trainers = {
                    setting: stack.enter_context(
                        Trainer(algo, "CartPole-v1", {**config, "seed": 0, "profile": setting == "on"})
                    )
                    for setting in ("on", "off")
                }
                rounds += interleaved_rates(trainers, max(1, round(seconds / turn_s)), turn_s)
        ratios = [r["on"] / r["off"] for r in rounds]
        low, high = bootstrap_median(ratios)
        medians = {setting: statistics.median(r[setting] for r in rounds) for setting in ("on", "off")}
        ratio = statistics.median(ratios)
        print(
            f"{algo:8s}  {medians['on']:13.0f}   {medians['off']:14.0f}   {ratio:8.3f} [{low:.3f}, {high:.3f}]"
            f"{'':22s}{len(rounds):4d}",
            flush=True,
        )
        report["examples"][algo] = {
            "rounds": rounds,
            "medians": medians,
            "on_over_off": ratio,
            "on_over_off_95": [low, high],
        }
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=3, help="repetitions per algorithm (medians are reported)")
    parser.add_argument("--seconds", type=float, default=10.0, help="measured wall time per repetition")
    parser.add_argument("--quick", action="store_true", help="1 repetition of 4 s: a smoke test")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where to write the JSON figures")
    parser.add_argument(
        "--profile-overhead", action="store_true", help="measure only what the plan X-ray costs (part 4)"
    )
    parser.add_argument(
        "--turn-seconds",
        type=float,
        default=0.5,
        help="part 4: seconds each trainer trains before the other takes its turn",
    )
    args = parser.parse_args()
    reps, seconds = (1, 4.0) if args.quick else (args.reps, args.seconds)

    report: dict[str, Any] = {
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version()},
        "reps": reps,
        "seconds": seconds,
    }
    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False)
    try:
        if not args.profile_overhead:
            print(
                f"IMPALA vs PPO vs A2C on CartPole-v1, {reps} x {seconds:.0f} s each, workers {WORKERS}; "
                "and IMPALA at its tuned settings",
                flush=True,
            )
            report["algorithms"] = compare_algorithms(reps, seconds)
            print(f"\nES evaluation throughput, {reps} x {seconds:.0f} s each", flush=True)
            report["es"] = es_scaling(reps, seconds)
        print(
            f"\nThe plan X-ray's cost: tuned IMPALA and PPO with profile on and off, {reps} x {seconds:.0f} s each "
            f"in turns of {args.turn_seconds:g} s",
            flush=True,
        )
        report["profile_overhead"] = profile_overhead(reps, seconds, args.turn_seconds)
    finally:
        ray.shutdown()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
