"""Benchmark learning speed: wall time and env steps for PPO to solve CartPole-v1.

What it measures:

1. flowrl PPO with flowrl's default PPO config, exactly what
   ``flowrl train --algo ppo --env CartPole-v1 --stop-reward 475 --seed S`` runs (the
   algorithm's defaults plus ``seed``), trained until ``episode_reward_mean`` (the mean
   of the last 100 finished episodes) reaches 475, checked after every ``train()``
   call. Optionally (``--config FILE``, e.g. ``tuned_examples/cartpole-ppo.yaml``) the
   same with that experiment file's config (as ``flowrl train --config FILE`` reads it;
   its own stop criteria are replaced by this benchmark's).

2. When stable-baselines3 is importable (it is never a flowrl dependency; without it
   this part is skipped and the JSON says so): SB3's PPO with the rl-zoo CartPole-v1
   hyperparameters (8 envs in a DummyVecEnv from ``make_vec_env``, n_steps 32,
   batch_size 256, gae_lambda 0.8, gamma 0.98, n_epochs 20, ent_coef 0.0, learning rate
   linear from 1e-3 to 0 and clip range linear from 0.2 to 0), trained until the mean of
   the last 100 finished episodes (the Monitor episodes in ``ep_info_buffer``) reaches
   475, checked by a callback after every rollout (256 env steps). The zoo trains 1e5
   steps, so the linear schedules use 1e5 as their horizon and stay at their final
   values (0) past it. SB3 runs with its defaults: torch's default thread count (recorded
   in each trial), device "auto" (CPU here).

Each trial runs in a fresh Python process (``--trial flowrl|sb3 --seed S``) whose clock
starts before ``import ray`` / ``import torch``, so imports, Ray start-up, actor
creation, training and the stop are all counted; the wall time is the time until the
target was seen (flowrl: the ``train()`` call whose result reached it returns; SB3:
``learn()`` returns, one PPO update after the rollout that reached it). Shutdown is
timed separately. A trial stops at ``--max-steps`` env steps (default 300k) and counts
as failed. Seeds 0, 1, 2; the trials are interleaved (flowrl, [flowrl --config], SB3,
flowrl, ...) so machine noise hits all alike. Medians are reported with failed trials
counted as never reaching the target (an infinite time), beside the per-seed figures,
and the ratio median flowrl wall / median SB3 wall (goal: <= 0.8).

For one flowrl trial (the median one) it prints where the time went: start-up,
training and shutdown, the plan's per-operator time shares (``result['plan']``) and the
timers of the final ``train()`` result.

Run from the repository root::

    python benchmarks/learning.py                                        # full run, several minutes
    python benchmarks/learning.py --config tuned_examples/cartpole-ppo.yaml
    python benchmarks/learning.py --quick                                # one seed, easy target: a smoke test
    python benchmarks/learning.py --trial flowrl --seed 0                # one trial; prints a JSON line

It prints a table and writes the figures as JSON to ``--out`` (default
``benchmarks/results/learning.json``), with machine info and the 1-minute load average
at start and end (and around each trial): on a shared 2-core machine other load moves
every wall time.
"""

from __future__ import annotations

import time

_CLOCK_START = time.perf_counter()  # a --trial's clock: before importing ray, torch or flowrl

import argparse
import importlib.metadata
import importlib.util
import json
import math
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

ENV_ID = "CartPole-v1"
TARGET_REWARD = 475.0
MAX_STEPS = 300_000
SEEDS = (0, 1, 2)
RATIO_GOAL = 0.8
TRIAL_TIMEOUT_S = 1800
RESULT_PREFIX = "LEARNING_TRIAL_RESULT "
ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "learning.json"

# rl-baselines3-zoo, hyperparams/ppo.yml, CartPole-v1.
SB3_ZOO = {
    "n_envs": 8,
    "n_timesteps": 100_000,
    "policy": "MlpPolicy",
    "n_steps": 32,
    "batch_size": 256,
    "gae_lambda": 0.8,
    "gamma": 0.98,
    "n_epochs": 20,
    "ent_coef": 0.0,
    "learning_rate": "lin_1e-3",
    "clip_range": "lin_0.2",
}


def loadavg() -> list[float]:
    """The 1, 5 and 15-minute load averages."""
    return [round(x, 2) for x in os.getloadavg()]


def package_version(name: str) -> str | None:
    """An installed distribution's version, without importing it."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def sb3_available() -> bool:
    """Whether stable-baselines3 can be imported here (checked without importing it)."""
    return importlib.util.find_spec("stable_baselines3") is not None


def json_safe(value: Any) -> Any:
    """``value`` as plain JSON data: NaN and infinities become None, tuples lists, other objects strings."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    try:
        return json_safe(float(value))  # numpy scalars
    except (TypeError, ValueError):
        return str(value)


def emit(result: dict[str, Any]) -> None:
    """Print a trial's result as one JSON line the parent picks out of stdout."""
    print(RESULT_PREFIX + json.dumps(json_safe(result), allow_nan=False), flush=True)


def finite(value: Any) -> float | None:
    """``value`` as a float, or None if it is missing or not finite."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


# -- one flowrl trial (in its own process) ---------------------------------------------


def flowrl_trial(seed: int, target: float, max_steps: int, config_file: str | None) -> dict[str, Any]:
    """Train flowrl PPO until the 100-episode mean reaches ``target`` or ``max_steps`` env steps."""
    load_start = loadavg()
    cpu_start = time.process_time()
    import torch

    from flowrl.algorithms import get_algorithm
    from flowrl.cli import build_config
    from flowrl.experiment import load_experiment_file, parse_experiment
    from flowrl.trainer import Trainer

    experiment = load_experiment_file(config_file) if config_file else parse_experiment({})
    algorithm = get_algorithm("ppo")
    # What `flowrl train --algo ppo --env CartPole-v1 --seed S [--config FILE]` builds.
    config = build_config(
        algorithm,
        experiment["config"],
        argparse.Namespace(set=[], num_workers=None, seed=seed),
    )
    t_imported = time.perf_counter()
    trainer = Trainer("ppo", ENV_ID, config)
    t_ready = time.perf_counter()
    history: list[list[Any]] = []
    result: dict[str, Any] = {}
    reached = False
    steps = 0
    try:
        while True:
            result = trainer.train()
            steps = int(result.get("timesteps_total", 0))
            reward = finite(result.get("episode_reward_mean"))
            history.append([steps, reward, round(time.perf_counter() - _CLOCK_START, 3)])
            print(
                f"  [flowrl seed {seed}] iter {result['training_iteration']:>3}  steps {steps:>7}  "
                f"reward {reward if reward is not None else float('nan'):7.1f}  "
                f"t {time.perf_counter() - _CLOCK_START:6.1f}s",
                file=sys.stderr,
                flush=True,
            )
            if reward is not None and reward >= target:
                reached = True
                break
            if steps >= max_steps:
                break
        t_done = time.perf_counter()
        torch_threads = torch.get_num_threads()
        full_config = trainer.config.to_dict()
    finally:
        trainer.stop()
    t_stopped = time.perf_counter()
    return {
        "kind": "flowrl",
        "variant": "config " + config_file if config_file else "default",
        "seed": seed,
        "reached": reached,
        "wall_s": t_done - _CLOCK_START,
        "env_steps": steps,
        "final_reward_mean": finite(result.get("episode_reward_mean")),
        "iterations": int(result.get("training_iteration", 0)),
        "phases_s": {
            "imports": t_imported - _CLOCK_START,
            "trainer_start (ray.init, actors, plan)": t_ready - t_imported,
            "training (train() calls)": t_done - t_ready,
            "shutdown (trainer.stop, ray.shutdown)": t_stopped - t_done,
        },
        "driver_cpu_s": time.process_time() - cpu_start,
        "torch_threads_driver": torch_threads,
        "config": {k: full_config[k] for k in sorted(full_config) if k not in ("env_config", "exploration_config")},
        "plan": result.get("plan", {}),
        "timers": result.get("timers", {}),
        "history": history,
        "loadavg_start_end": [load_start, loadavg()],
    }


# -- one SB3 trial (in its own process) ---------------------------------------------------


class ZooLinearSchedule:
    """The zoo's ``lin_<x>`` (``progress_remaining * x``) over a fixed horizon of env steps.

    SB3 calls a schedule with ``progress_remaining = 1 - num_timesteps / total_timesteps``
    where ``total_timesteps`` is ``learn()``'s (here the step cap); this converts it back to
    steps and applies the zoo's schedule over ``horizon`` steps, staying at 0 past it.
    """

    def __init__(self, initial: float, horizon: int, total: int) -> None:
        self.initial, self.horizon, self.total = initial, horizon, total

    def __call__(self, progress_remaining: float) -> float:
        steps = (1.0 - progress_remaining) * self.total
        return self.initial * max(0.0, 1.0 - steps / self.horizon)


def sb3_trial(seed: int, target: float, max_steps: int, threads: int | None = None) -> dict[str, Any]:
    """Train SB3 PPO (rl-zoo CartPole-v1 settings) until the 100-episode mean reaches ``target`` or ``max_steps``.

    ``threads``: call ``torch.set_num_threads(threads)`` first (None: torch's default, as SB3 runs).
    """
    load_start = loadavg()
    cpu_start = time.process_time()
    import numpy as np
    import stable_baselines3
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env

    if threads is not None:
        torch.set_num_threads(threads)

    class StopAtReward(BaseCallback):
        """After each rollout, stop once the mean of the last 100 finished episodes reaches the target."""

        def __init__(self) -> None:
            super().__init__()
            self.reached_at: tuple[float, int] | None = None
            self.history: list[list[Any]] = []

        def _on_step(self) -> bool:
            return self.reached_at is None

        def _on_rollout_end(self) -> None:
            episodes = self.model.ep_info_buffer
            mean = float(np.mean([e["r"] for e in episodes])) if episodes else None
            now = time.perf_counter() - _CLOCK_START
            self.history.append([self.model.num_timesteps, mean, round(now, 3)])
            if mean is not None and mean >= target and self.reached_at is None:
                self.reached_at = (now, self.model.num_timesteps)

    t_imported = time.perf_counter()
    env = make_vec_env(ENV_ID, n_envs=SB3_ZOO["n_envs"], seed=seed)  # DummyVecEnv, each env in a Monitor
    model = PPO(
        SB3_ZOO["policy"],
        env,
        n_steps=SB3_ZOO["n_steps"],
        batch_size=SB3_ZOO["batch_size"],
        gae_lambda=SB3_ZOO["gae_lambda"],
        gamma=SB3_ZOO["gamma"],
        n_epochs=SB3_ZOO["n_epochs"],
        ent_coef=SB3_ZOO["ent_coef"],
        learning_rate=ZooLinearSchedule(1e-3, SB3_ZOO["n_timesteps"], max_steps),
        clip_range=ZooLinearSchedule(0.2, SB3_ZOO["n_timesteps"], max_steps),
        seed=seed,
        verbose=0,
    )
    t_ready = time.perf_counter()
    callback = StopAtReward()
    model.learn(total_timesteps=max_steps, callback=callback)
    t_done = time.perf_counter()
    env.close()
    t_stopped = time.perf_counter()
    reached = callback.reached_at is not None
    history = callback.history
    # Print a thinned progress trace, like flowrl's per-iteration lines.
    for row in history[:: max(1, len(history) // 20)] + history[-1:]:
        mean = row[1] if row[1] is not None else float("nan")
        print(
            f"  [sb3 seed {seed}] steps {row[0]:>7}  reward {mean:7.1f}  t {row[2]:6.1f}s",
            file=sys.stderr,
            flush=True,
        )
    return {
        "kind": "sb3",
        "variant": "rl-zoo CartPole-v1" + (f", torch threads {threads}" if threads is not None else ""),
        "seed": seed,
        "reached": reached,
        "wall_s": t_done - _CLOCK_START,
        "env_steps": callback.reached_at[1] if reached else int(model.num_timesteps),
        "wall_s_at_rollout_reaching_target": callback.reached_at[0] if reached else None,
        "final_reward_mean": history[-1][1] if history else None,
        "rollouts": len(history),
        "phases_s": {
            "imports": t_imported - _CLOCK_START,
            "setup (envs, model)": t_ready - t_imported,
            "training (learn())": t_done - t_ready,
            "shutdown (env.close)": t_stopped - t_done,
        },
        "driver_cpu_s": time.process_time() - cpu_start,
        "torch_threads": torch.get_num_threads(),
        "device": str(model.device),
        "sb3_version": stable_baselines3.__version__,
        "history": history[:: max(1, len(history) // 100)] + history[-1:],
        "loadavg_start_end": [load_start, loadavg()],
    }


# -- the parent: interleaved trials in fresh processes --------------------------------------


def run_trial(
    kind: str,
    seed: int,
    target: float,
    max_steps: int,
    option: str | None,
    timeout_s: float,
) -> dict[str, Any]:
    """Run one trial in a fresh Python process and return its JSON result (or a failure record).

    ``option``: flowrl's ``--config`` file, or SB3's torch thread count (None: defaults).
    """
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--trial",
        kind,
        "--seed",
        str(seed),
        "--target",
        str(target),
        "--max-steps",
        str(max_steps),
    ]
    config_file = option if kind == "flowrl" else None
    if option:
        cmd += ["--config", option] if kind == "flowrl" else ["--sb3-threads", option]
    label = f"{kind}{' --config ' + option if config_file else ''}{' torch threads ' + option if option and not config_file else ''} seed {seed}"
    print(f"\n-- {label} (load {loadavg()[0]:.2f})", flush=True)
    started = time.perf_counter()
    try:
        # stderr passes through (progress lines); stdout carries the result line.
        proc = subprocess.run(
            cmd,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return {
            "kind": kind,
            "seed": seed,
            "reached": False,
            "error": f"timed out after {timeout_s} s",
            "variant": "config " + config_file if config_file else None,
        }
    process_wall = time.perf_counter() - started
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT_PREFIX):
            result = json.loads(line[len(RESULT_PREFIX) :])
            result["process_wall_s"] = process_wall
            status = "reached" if result["reached"] else "NOT reached"
            print(
                f"   {status} {target:g} at {result['env_steps']} steps, {result['wall_s']:.1f} s "
                f"(process {process_wall:.1f} s)",
                flush=True,
            )
            return result
    tail = "\n".join(proc.stdout.splitlines()[-20:])
    print(f"   failed: exit status {proc.returncode}\n{tail}", flush=True)
    return {
        "kind": kind,
        "seed": seed,
        "reached": False,
        "error": f"exit status {proc.returncode}",
        "stdout_tail": tail,
        "variant": "config " + config_file if config_file else None,
    }


def median_time(trials: list[dict[str, Any]], key: str) -> float:
    """Median of ``key`` over trials, a failed trial counting as infinite."""
    return statistics.median([t[key] if t.get("reached") else math.inf for t in trials])


def summarize(trials: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians and per-seed figures of one variant's trials."""
    wall, steps = median_time(trials, "wall_s"), median_time(trials, "env_steps")
    reached = [t for t in trials if t.get("reached")]
    return {
        "trials": len(trials),
        "reached": len(reached),
        "median_wall_s": wall if math.isfinite(wall) else None,
        "median_env_steps": steps if math.isfinite(steps) else None,
        "median_wall_s_reached_only": statistics.median([t["wall_s"] for t in reached]) if reached else None,
        "median_env_steps_reached_only": statistics.median([t["env_steps"] for t in reached]) if reached else None,
        "per_seed": [
            {
                "seed": t["seed"],
                "reached": t.get("reached", False),
                "wall_s": t.get("wall_s"),
                "env_steps": t.get("env_steps"),
                "process_wall_s": t.get("process_wall_s"),
                "final_reward_mean": t.get("final_reward_mean"),
                "env_steps_per_s": t["env_steps"] / t["wall_s"] if t.get("wall_s") else None,
                **({"error": t["error"]} if "error" in t else {}),
            }
            for t in trials
        ],
    }


def ratio(
    flowrl: dict[str, Any],
    sb3: dict[str, Any] | None,
    sb3_threads: dict[str, Any] | None,
) -> dict[str, Any] | None:
    """Median flowrl wall over median SB3 wall (SB3's defaults), against the goal; beside it, over the
    thread-limited SB3 variant when that ran (for context, no goal)."""
    if sb3 is None:
        return None

    def divide(b: dict[str, Any]) -> float | None:
        a, c = flowrl["median_wall_s"], b["median_wall_s"]
        return a / c if a is not None and c is not None else None

    value = divide(sb3)
    out = {
        "flowrl_wall_over_sb3_wall": value,
        "goal": f"<= {RATIO_GOAL}",
        "met": value is not None and value <= RATIO_GOAL,
    }
    if sb3_threads is not None:
        out["flowrl_wall_over_sb3_threads_limited_wall"] = divide(sb3_threads)
    return out


def print_time_breakdown(trial: dict[str, Any]) -> None:
    """Where one flowrl trial's time went: phases, plan operators, timers."""
    print(
        f"\nWhere the time went: flowrl {trial['variant']}, seed {trial['seed']} "
        f"({trial['wall_s']:.1f} s to target, {trial['iterations']} iterations, {trial['env_steps']} steps, "
        f"driver CPU {trial['driver_cpu_s']:.1f} s, driver torch threads {trial['torch_threads_driver']})"
    )
    for name, seconds in trial["phases_s"].items():
        print(f"  {name:<42}{seconds:8.2f} s")
    print(f"  {'operator (result[plan], cumulative)':<52}{'items':>7}{'time s':>9}{'share':>8}")
    for name, s in trial["plan"].items():
        print(f"  {name[:52]:<52}{s['items']:>7}{s['time_s']:>9.2f}{100 * s['time_share']:>7.1f}%")
    if trial["timers"]:
        print(
            "  timers of the last train() result: "
            + ", ".join(f"{k} {v:g}" for k, v in sorted(trial["timers"].items()))
        )


def machine_info() -> dict[str, Any]:
    """What the figures were measured on (versions read without importing the packages)."""
    info: dict[str, Any] = {
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        **{name: package_version(name) for name in ("ray", "torch", "gymnasium", "numpy", "stable-baselines3")},
    }
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu_model"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return info


def main() -> None:
    """Parse options; run one trial (``--trial``) or the whole interleaved benchmark."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where to write the JSON figures")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke test: seed 0 only, target 150, cap 50k steps (the figures mean little)",
    )
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="also run flowrl with this experiment file's config, e.g. tuned_examples/cartpole-ppo.yaml",
    )
    parser.add_argument(
        "--seeds",
        type=int,
        nargs="+",
        help=f"seeds (default {' '.join(map(str, SEEDS))})",
    )
    parser.add_argument(
        "--target",
        type=float,
        help=f"100-episode mean reward to reach (default {TARGET_REWARD:g})",
    )
    parser.add_argument(
        "--max-steps",
        type=int,
        help=f"env steps after which a trial fails (default {MAX_STEPS})",
    )
    parser.add_argument(
        "--no-sb3",
        action="store_true",
        help="skip stable-baselines3 even if it is installed",
    )
    parser.add_argument(
        "--sb3-threads",
        type=int,
        metavar="N",
        help="also run SB3 with torch.set_num_threads(N) (context only; the goal uses SB3's defaults)",
    )
    parser.add_argument(
        "--trial-timeout",
        type=float,
        default=TRIAL_TIMEOUT_S,
        help="seconds before a trial is killed",
    )
    parser.add_argument(
        "--trial",
        choices=("flowrl", "sb3"),
        help="run one trial in this process; print a JSON line",
    )
    parser.add_argument("--seed", type=int, default=0, help="the seed of a --trial")
    args = parser.parse_args()
    target = args.target if args.target is not None else (150.0 if args.quick else TARGET_REWARD)
    max_steps = args.max_steps or (50_000 if args.quick else MAX_STEPS)

    if args.trial == "flowrl":
        emit(flowrl_trial(args.seed, target, max_steps, args.config))
        return
    if args.trial == "sb3":
        emit(sb3_trial(args.seed, target, max_steps, args.sb3_threads))
        return

    seeds = args.seeds or ([0] if args.quick else list(SEEDS))
    with_sb3 = sb3_available() and not args.no_sb3
    sb3_note = None
    if not with_sb3:
        sb3_note = (
            "skipped: --no-sb3"
            if args.no_sb3
            else "skipped: stable-baselines3 is not installed (pip install stable-baselines3 to compare)"
        )
        print(f"SB3 comparison {sb3_note}")
    # (name, kind, option): option is flowrl's --config file or SB3's torch thread count.
    variants: list[tuple[str, str, str | None]] = [("flowrl default", "flowrl", None)]
    if args.config:
        variants.append((f"flowrl --config {args.config}", "flowrl", args.config))
    if with_sb3:
        variants.append(("sb3 rl-zoo", "sb3", None))
        if args.sb3_threads:
            variants.append(
                (
                    f"sb3 rl-zoo, torch threads {args.sb3_threads}",
                    "sb3",
                    str(args.sb3_threads),
                )
            )

    machine = machine_info()
    load_start = loadavg()
    started = time.perf_counter()
    trials: dict[str, list[dict[str, Any]]] = {name: [] for name, _, _ in variants}
    for seed in seeds:  # interleaved: every variant for one seed, then the next seed
        for name, kind, option in variants:
            trials[name].append(run_trial(kind, seed, target, max_steps, option, args.trial_timeout))
    load_end = loadavg()
    machine["loadavg_start"] = load_start
    machine["loadavg_end"] = load_end
    machine["note"] = (
        "1/5/15-minute load averages; on a shared machine other processes' load "
        "slows every trial (each trial records its own too)"
    )

    summaries = {name: summarize(ts) for name, ts in trials.items()}
    sb3_summary = summaries.get("sb3 rl-zoo")
    sb3_threads_summary = summaries.get(f"sb3 rl-zoo, torch threads {args.sb3_threads}") if args.sb3_threads else None
    ratios = {
        name: ratio(s, sb3_summary, sb3_threads_summary) for name, s in summaries.items() if name.startswith("flowrl")
    }

    # -- print ----------------------------------------------------------------------
    print(
        f"\nmachine: {machine['cpu_count']} CPUs ({machine.get('cpu_model', '?')}), Python {machine['python']}, "
        f"Ray {machine['ray']}, torch {machine['torch']}, gymnasium {machine['gymnasium']}, "
        f"SB3 {machine['stable-baselines3'] or 'not installed'}; load {load_start[0]:.2f} -> {load_end[0]:.2f}"
    )
    print(
        f"\nTime to a 100-episode mean reward of {target:g} on {ENV_ID} (cap {max_steps} steps), "
        f"seeds {seeds}; failed trials count as infinite in medians"
    )
    print(f"{'variant':<48}{'reached':>8}{'median wall s':>15}{'median steps':>14}")
    for name, s in summaries.items():
        wall = f"{s['median_wall_s']:.1f}" if s["median_wall_s"] is not None else "n/a"
        steps = f"{s['median_env_steps']:.0f}" if s["median_env_steps"] is not None else "n/a"
        print(f"{name:<48}{s['reached']:>5}/{s['trials']:<2}{wall:>15}{steps:>14}")
        for p in s["per_seed"]:
            wall_p = f"{p['wall_s']:.1f} s" if p.get("wall_s") is not None else "-"
            print(
                f"    seed {p['seed']}: {'reached' if p['reached'] else 'NOT reached':<12}{wall_p:>9}  "
                f"{p.get('env_steps') or 0:>7} steps  final mean {p.get('final_reward_mean') or float('nan'):.1f}"
                + (f"  ({p['error']})" if "error" in p else "")
            )
    for t in trials.get("sb3 rl-zoo", [])[:1]:
        if "torch_threads" in t:
            print(f"SB3: torch threads {t['torch_threads']} (its default), device {t['device']}")
    for name, r in ratios.items():
        if r is not None:
            value = f"{r['flowrl_wall_over_sb3_wall']:.3f}" if r["flowrl_wall_over_sb3_wall"] is not None else "n/a"
            print(f"{name}: flowrl wall / SB3 wall = {value} (goal {r['goal']}): {'met' if r['met'] else 'NOT met'}")
            if "flowrl_wall_over_sb3_threads_limited_wall" in r:
                limited = r["flowrl_wall_over_sb3_threads_limited_wall"]
                print(
                    f"    (over SB3 with torch threads {args.sb3_threads}: "
                    f"{f'{limited:.3f}' if limited is not None else 'n/a'}, no goal)"
                )

    # Where the time went, for the median flowrl-default trial that ran.
    ran = sorted((t for t in trials["flowrl default"] if "plan" in t), key=lambda t: t["wall_s"])
    if ran:
        print_time_breakdown(ran[len(ran) // 2])

    report = {
        "machine": machine,
        "settings": {
            "quick": args.quick,
            "env": ENV_ID,
            "target_reward_mean_100_episodes": target,
            "max_steps": max_steps,
            "seeds": seeds,
            "order": "interleaved per seed: " + ", ".join(name for name, _, _ in variants),
            "flowrl_default": "flowrl train --algo ppo --env CartPole-v1 --stop-reward 475 --seed S (PPO defaults)",
            "flowrl_config_file": args.config,
            "sb3": (
                {
                    "hyperparameters": SB3_ZOO,
                    "schedule_horizon_steps": SB3_ZOO["n_timesteps"],
                    "note": "linear schedules over 1e5 steps, then at 0; torch threads and device left at SB3's defaults",
                    "extra_thread_limited_variant": args.sb3_threads,
                }
                if with_sb3
                else sb3_note
            ),
            "wall_s": "from process start (before importing ray/torch) to the train()/learn() call that reached the target",
            "total_benchmark_s": time.perf_counter() - started,
        },
        "results": summaries,
        "ratios": ratios,
        "goal": f"median flowrl wall / median SB3 wall <= {RATIO_GOAL}",
        "goal_met": (ratios["flowrl default"] or {}).get("met") if with_sb3 else None,
        "trials": trials,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(json_safe(report), indent=2, allow_nan=False) + "\n")
    print(f"\nfigures written to {args.out}")


if __name__ == "__main__":
    main()
