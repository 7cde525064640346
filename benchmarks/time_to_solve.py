"""Benchmark time to a solved CartPole: flowrl's tuned PPO and DQN against Stable-Baselines3's.

What it measures, for each algorithm (``--algos``, default ``ppo dqn``):

1. flowrl with the algorithm's tuned example (``tuned_examples/cartpole-ppo.yaml``,
   ``tuned_examples/cartpole-dqn.yaml``; ``--config ALGO=FILE`` picks another), exactly what
   ``flowrl train --config FILE --seed S`` builds, trained until ``episode_reward_mean`` (the
   mean of the last 100 finished episodes) reaches 475, checked after every ``train()`` call.

2. When stable-baselines3 is importable (the ``bench`` extra; without it this part is
   skipped and the JSON says so): SB3's PPO and DQN with rl-baselines3-zoo's CartPole-v1
   hyperparameters (:data:`SB3_ZOO`), trained until the mean of the last 100 finished
   episodes (the Monitor episodes in ``ep_info_buffer``) reaches 475, checked by a callback
   after every rollout. The zoo's schedules (PPO's linear learning rate and clip range,
   DQN's exploration) keep the zoo's horizon (``n_timesteps``) whatever the step cap, and
   stay at their final values past it. SB3 runs with its defaults: torch's default thread
   count (recorded in each trial), device "auto" (CPU here).

Each trial runs in a fresh Python process (``--trial flowrl|sb3 --algo A --seed S``) whose
clock starts before ``import ray`` / ``import torch``, so imports, Ray start-up, actor
creation, training and the stop are all counted; the wall time is the time until the target
was seen (flowrl: the ``train()`` call whose result reached it returns; SB3: ``learn()``
returns, one update after the rollout that reached it). Shutdown is timed separately. A
trial stops at ``--max-steps`` env steps (default 300k) and counts as failed. Seeds 0, 1, 2;
the trials alternate (flowrl PPO, SB3 PPO, flowrl DQN, SB3 DQN, then the next seed) so
machine noise hits all alike. Medians count failed trials as never reaching the target (an
infinite time); the ratio is median flowrl wall / median SB3 wall per algorithm (goal: <=
0.8 for both, and flowrl PPO <= 15 s).

For the median flowrl trial of each algorithm it prints where the time went: start-up,
training and shutdown, the plan's per-operator time shares (``result['plan']``) and the
timers of the final ``train()`` result.

Run from the repository root::

    python benchmarks/time_to_solve.py                          # full run: 12 trials, several minutes
    python benchmarks/time_to_solve.py --algos ppo --seeds 0    # one algorithm, one seed
    python benchmarks/time_to_solve.py --quick                  # one seed, easy target: a smoke test
    python benchmarks/time_to_solve.py --trial flowrl --algo dqn --seed 0   # one trial; prints a JSON line

It prints a table and writes the figures as JSON to ``--out`` (default
``benchmarks/results/time_to_solve.json``), with machine info and the 1-minute load average
at start and end (and around each trial): on a shared 2-core machine other load moves every
wall time.
"""

from __future__ import annotations

import time

_CLOCK_START = time.perf_counter()  # a --trial's clock: before importing ray, torch or flowrl

# Imported after the clock started, which counts them too.
import argparse  # noqa: E402
import importlib.metadata  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

ENV_ID = "CartPole-v1"
TARGET_REWARD = 475.0
MAX_STEPS = 300_000
SEEDS = (0, 1, 2)
RATIO_GOAL = 0.8
PPO_WALL_GOAL_S = 15.0
TRIAL_TIMEOUT_S = 1800
RESULT_PREFIX = "TRIAL_RESULT "  # the line a trial process prints its JSON result on
ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "time_to_solve.json"
ALGOS = ("ppo", "dqn")
TUNED_EXAMPLES = {"ppo": "tuned_examples/cartpole-ppo.yaml", "dqn": "tuned_examples/cartpole-dqn.yaml"}

# rl-baselines3-zoo's CartPole-v1 entries: hyperparams/ppo.yml and hyperparams/dqn.yml.
SB3_ZOO: dict[str, dict[str, Any]] = {
    "ppo": {
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
    },
    "dqn": {
        "n_envs": 1,
        "n_timesteps": 50_000,
        "policy": "MlpPolicy",
        "learning_rate": 2.3e-3,
        "batch_size": 64,
        "buffer_size": 100_000,
        "learning_starts": 1000,
        "gamma": 0.99,
        "target_update_interval": 10,
        "train_freq": 256,
        "gradient_steps": 128,
        "exploration_fraction": 0.16,
        "exploration_final_eps": 0.04,
        "policy_kwargs": {"net_arch": [256, 256]},
    },
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


def write_report(out: Path, report: dict[str, Any], *, quiet: bool = False) -> None:
    """Write ``report`` to ``out`` as plain JSON (:func:`json_safe`), making its folder; say where unless ``quiet``."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(json_safe(report), indent=2, allow_nan=False) + "\n")
    if not quiet:
        print(f"\nfigures written to {out}")


def stop_at_reward(
    target: float, clock_start: float, on_rollout: Callable[[list[list[Any]]], None] | None = None
) -> Any:
    """An SB3 callback that stops ``learn()`` after the first rollout at whose end the mean return of the
    last 100 finished episodes reaches ``target``. Its ``history`` holds [env steps, mean return (None before
    any episode ends), seconds since ``clock_start``] per rollout, ``reached_at`` (seconds, env steps) once
    reached; ``on_rollout(history)`` runs after each rollout (progress lines)."""
    import numpy as np
    from stable_baselines3.common.callbacks import BaseCallback

    class StopAtReward(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.reached_at: tuple[float, int] | None = None
            self.history: list[list[Any]] = []

        def _on_step(self) -> bool:
            return self.reached_at is None

        def _on_rollout_end(self) -> None:
            episodes = self.model.ep_info_buffer
            mean = float(np.mean([e["r"] for e in episodes])) if episodes else None
            now = time.perf_counter() - clock_start
            self.history.append([self.model.num_timesteps, mean, round(now, 3)])
            if on_rollout is not None:
                on_rollout(self.history)
            if mean is not None and mean >= target and self.reached_at is None:
                self.reached_at = (now, self.model.num_timesteps)

    return StopAtReward()


def emit(result: dict[str, Any]) -> None:
    """Print a trial's result as one JSON line the parent picks out of stdout."""
    print(RESULT_PREFIX + json.dumps(json_safe(result), allow_nan=False), flush=True)


def finite(value: Any) -> float | None:
    """``value`` as a float, or None if it is missing or not finite."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


# -- one flowrl trial (in its own process) ---------------------------------------------


def flowrl_trial(algo: str, seed: int, target: float, max_steps: int, config_file: str) -> dict[str, Any]:
    """Train flowrl ``algo`` with ``config_file``'s config until the 100-episode mean reaches ``target``
    or ``max_steps``."""
    load_start = loadavg()
    cpu_start = time.process_time()
    from flowrl.algorithms import get_algorithm
    from flowrl.cli.args import build_config
    from flowrl.engine.trainer import Trainer
    from flowrl.runs.experiment import load_experiment_file

    experiment = load_experiment_file(config_file)
    # What `flowrl train --config FILE --seed S` builds.
    config = build_config(
        get_algorithm(algo), experiment["config"], argparse.Namespace(set=[], num_workers=None, seed=seed)
    )
    t_imported = time.perf_counter()
    trainer = Trainer(algo, ENV_ID, config)
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
            now = time.perf_counter() - _CLOCK_START
            history.append([steps, reward, round(now, 3)])
            print(
                f"  [flowrl {algo} seed {seed}] iter {result['training_iteration']:>3}  steps {steps:>7}  "
                f"reward {reward if reward is not None else float('nan'):7.1f}  t {now:6.1f}s",
                file=sys.stderr,
                flush=True,
            )
            if reward is not None and reward >= target:
                reached = True
                break
            if steps >= max_steps:
                break
        t_done = time.perf_counter()
        import torch  # already loaded by the Trainer: its thread count, not an import cost

        torch_threads = torch.get_num_threads()
        full_config = trainer.config.to_dict()
    finally:
        trainer.stop()
    t_stopped = time.perf_counter()
    return {
        "kind": "flowrl",
        "algo": algo,
        "variant": config_file,
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
        "config": {k: full_config[k] for k in sorted(full_config) if k not in ("env_config",)},
        "plan": result.get("plan", {}),
        "timers": result.get("timers", {}),
        "history": history,
        "loadavg_start_end": [load_start, loadavg()],
    }


# -- one SB3 trial (in its own process) ---------------------------------------------------


class ZooLinearSchedule:
    """A linear schedule from ``initial`` to ``final`` over the first ``fraction`` of ``horizon`` env steps.

    SB3 calls a schedule with ``progress_remaining = 1 - num_timesteps / total_timesteps``
    where ``total_timesteps`` is ``learn()``'s (here the step cap ``total``); this converts it
    back to steps so that the zoo's schedule keeps the zoo's horizon, and stays at ``final`` past it.
    """

    def __init__(self, initial: float, final: float, fraction: float, horizon: int, total: int) -> None:
        self.initial, self.final, self.span, self.total = initial, final, fraction * horizon, total

    def __call__(self, progress_remaining: float) -> float:
        steps = (1.0 - progress_remaining) * self.total
        return self.initial + (self.final - self.initial) * min(1.0, steps / self.span)


def sb3_model(algo: str, env: Any, seed: int, max_steps: int) -> Any:
    """SB3's ``algo`` with the zoo's CartPole-v1 hyperparameters (its schedules over the zoo's horizon)."""
    from stable_baselines3 import DQN, PPO

    zoo = SB3_ZOO[algo]
    horizon = zoo["n_timesteps"]
    if algo == "ppo":
        return PPO(
            zoo["policy"],
            env,
            n_steps=zoo["n_steps"],
            batch_size=zoo["batch_size"],
            gae_lambda=zoo["gae_lambda"],
            gamma=zoo["gamma"],
            n_epochs=zoo["n_epochs"],
            ent_coef=zoo["ent_coef"],
            learning_rate=ZooLinearSchedule(1e-3, 0.0, 1.0, horizon, max_steps),
            clip_range=ZooLinearSchedule(0.2, 0.0, 1.0, horizon, max_steps),
            seed=seed,
            verbose=0,
        )
    model = DQN(
        zoo["policy"],
        env,
        learning_rate=zoo["learning_rate"],
        batch_size=zoo["batch_size"],
        buffer_size=zoo["buffer_size"],
        learning_starts=zoo["learning_starts"],
        gamma=zoo["gamma"],
        target_update_interval=zoo["target_update_interval"],
        train_freq=zoo["train_freq"],
        gradient_steps=zoo["gradient_steps"],
        exploration_fraction=zoo["exploration_fraction"],
        exploration_final_eps=zoo["exploration_final_eps"],
        policy_kwargs=zoo["policy_kwargs"],
        seed=seed,
        verbose=0,
    )
    # DQN builds its epsilon schedule over learn()'s total_timesteps: keep the zoo's horizon instead.
    model.exploration_schedule = ZooLinearSchedule(
        1.0, zoo["exploration_final_eps"], zoo["exploration_fraction"], horizon, max_steps
    )
    return model


def sb3_trial(algo: str, seed: int, target: float, max_steps: int) -> dict[str, Any]:
    """Train SB3 ``algo`` (rl-zoo CartPole-v1 settings) until the 100-episode mean reaches ``target``
    or ``max_steps``."""
    load_start = loadavg()
    cpu_start = time.process_time()
    import stable_baselines3
    import torch
    from stable_baselines3.common.env_util import make_vec_env

    t_imported = time.perf_counter()
    env = make_vec_env(ENV_ID, n_envs=SB3_ZOO[algo]["n_envs"], seed=seed)  # DummyVecEnv, each env in a Monitor
    model = sb3_model(algo, env, seed, max_steps)
    t_ready = time.perf_counter()
    callback = stop_at_reward(target, _CLOCK_START)
    model.learn(total_timesteps=max_steps, callback=callback)
    t_done = time.perf_counter()
    env.close()
    t_stopped = time.perf_counter()
    reached = callback.reached_at is not None
    history = callback.history
    for row in history[:: max(1, len(history) // 20)] + history[-1:]:  # a thinned trace, like flowrl's lines
        mean = row[1] if row[1] is not None else float("nan")
        print(
            f"  [sb3 {algo} seed {seed}] steps {row[0]:>7}  reward {mean:7.1f}  t {row[2]:6.1f}s",
            file=sys.stderr,
            flush=True,
        )
    return {
        "kind": "sb3",
        "algo": algo,
        "variant": "rl-zoo CartPole-v1",
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


# -- the parent: alternating trials in fresh processes --------------------------------------


def run_trial(
    kind: str, algo: str, seed: int, target: float, max_steps: int, config_file: str, timeout_s: float
) -> dict[str, Any]:
    """Run one trial in a fresh Python process and return its JSON result (or a failure record)."""
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--trial",
        kind,
        "--algo",
        algo,
        "--seed",
        str(seed),
        "--target",
        str(target),
        "--max-steps",
        str(max_steps),
    ]
    if kind == "flowrl":
        cmd += ["--config", f"{algo}={config_file}"]
    print(f"\n-- {kind} {algo} seed {seed} (load {loadavg()[0]:.2f})", flush=True)
    result = run_child(cmd, {"kind": kind, "algo": algo, "seed": seed, "reached": False}, timeout_s)
    if "error" not in result:
        status = "reached" if result["reached"] else "NOT reached"
        print(
            f"   {status} {target:g} at {result['env_steps']} steps, {result['wall_s']:.1f} s "
            f"(process {result['process_wall_s']:.1f} s)",
            flush=True,
        )
    return result


def run_child(cmd: list[str], failure: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """Run a trial's ``cmd`` in a fresh process: the JSON its :func:`emit` printed, with ``process_wall_s``,
    or ``failure`` with the error (a timeout, or an exit without a result and its output's tail)."""
    started = time.perf_counter()
    try:
        # stderr passes through (progress lines); stdout carries the result line.
        proc = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return {**failure, "error": f"timed out after {timeout_s} s"}
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT_PREFIX):
            return {**json.loads(line[len(RESULT_PREFIX) :]), "process_wall_s": time.perf_counter() - started}
    tail = "\n".join(proc.stdout.splitlines()[-20:])
    print(f"   failed: exit status {proc.returncode}\n{tail}", flush=True)
    return {**failure, "error": f"exit status {proc.returncode}", "stdout_tail": tail}


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


def ratio(flowrl: dict[str, Any], sb3: dict[str, Any] | None) -> dict[str, Any] | None:
    """Median flowrl wall over median SB3 wall, against the goal (None without SB3)."""
    if sb3 is None:
        return None
    a, b = flowrl["median_wall_s"], sb3["median_wall_s"]
    value = a / b if a is not None and b is not None else None
    result: dict[str, Any] = {
        "flowrl_wall_over_sb3_wall": value,
        "goal": f"<= {RATIO_GOAL}",
        "met": value is not None and value <= RATIO_GOAL,
    }
    if a is not None and b is None:
        # SB3 missed the target in most trials: a missed trial would have taken at least the time it
        # ran, so the median of all its trials' walls bounds SB3's median from below, the ratio from above.
        walls = [p["wall_s"] for p in sb3["per_seed"] if p.get("wall_s") is not None]
        if len(walls) == len(sb3["per_seed"]):
            bound = a / statistics.median(walls)
            result.update(flowrl_wall_over_sb3_wall_at_most=bound, met=bound <= RATIO_GOAL)
    return result


def print_time_breakdown(trial: dict[str, Any]) -> None:
    """Where one flowrl trial's time went: phases, plan operators, timers."""
    print(
        f"\nWhere the time went: flowrl {trial['algo']} ({trial['variant']}), seed {trial['seed']} "
        f"({trial['wall_s']:.1f} s to target, {trial['iterations']} iterations, {trial['env_steps']} steps, "
        f"driver CPU {trial['driver_cpu_s']:.1f} s, driver torch threads {trial['torch_threads_driver']})"
    )
    for name, seconds in trial["phases_s"].items():
        print(f"  {name:<42}{seconds:8.2f} s")
    print(f"  {'operator (result[plan], last iteration)':<52}{'items':>7}{'time s':>9}{'share':>8}")
    for name, stats in trial["plan"].get("operators", {}).items():
        print(f"  {name[:52]:<52}{stats['items']:>7}{stats['time_s']:>9.2f}{100 * stats['share']:>7.1f}%")
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


def parse_config_files(values: list[str] | None) -> dict[str, str]:
    """``--config ALGO=FILE`` pairs over the tuned examples."""
    files = dict(TUNED_EXAMPLES)
    for value in values or []:
        algo, sep, file = value.partition("=")
        if not sep or algo not in ALGOS:
            raise SystemExit(f"--config {value!r}: give ALGO=FILE with ALGO one of {', '.join(ALGOS)}")
        files[algo] = file
    return files


def main() -> None:
    """Parse options; run one trial (``--trial``) or the whole alternating benchmark."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where to write the JSON figures")
    parser.add_argument("--quick", action="store_true", help="smoke test: seed 0 only, target 150, cap 50k steps")
    parser.add_argument(
        "--algos", nargs="+", choices=ALGOS, default=list(ALGOS), help="which algorithms (default: both)"
    )
    parser.add_argument(
        "--config",
        action="append",
        metavar="ALGO=FILE",
        help="flowrl's experiment file for ALGO (default: its tuned example); repeatable",
    )
    parser.add_argument("--seeds", type=int, nargs="+", help=f"seeds (default {' '.join(map(str, SEEDS))})")
    parser.add_argument("--target", type=float, help=f"100-episode mean reward to reach (default {TARGET_REWARD:g})")
    parser.add_argument("--max-steps", type=int, help=f"env steps after which a trial fails (default {MAX_STEPS})")
    parser.add_argument("--no-sb3", action="store_true", help="skip stable-baselines3 even if it is installed")
    parser.add_argument("--trial-timeout", type=float, default=TRIAL_TIMEOUT_S, help="seconds before a trial is killed")
    parser.add_argument("--trial", choices=("flowrl", "sb3"), help="run one trial in this process; print a JSON line")
    parser.add_argument("--algo", choices=ALGOS, default="ppo", help="the algorithm of a --trial")
    parser.add_argument("--seed", type=int, default=0, help="the seed of a --trial")
    args = parser.parse_args()
    target = args.target if args.target is not None else (150.0 if args.quick else TARGET_REWARD)
    max_steps = args.max_steps or (50_000 if args.quick else MAX_STEPS)
    config_files = parse_config_files(args.config)

    if args.trial == "flowrl":
        emit(flowrl_trial(args.algo, args.seed, target, max_steps, config_files[args.algo]))
        return
    if args.trial == "sb3":
        emit(sb3_trial(args.algo, args.seed, target, max_steps))
        return

    seeds = args.seeds or ([0] if args.quick else list(SEEDS))
    with_sb3 = sb3_available() and not args.no_sb3
    sb3_note = None
    if not with_sb3:
        sb3_note = (
            "skipped: --no-sb3"
            if args.no_sb3
            else "skipped: stable-baselines3 is not installed (pip install -e '.[bench]')"
        )
        print(f"SB3 comparison {sb3_note}")
    kinds = ["flowrl", "sb3"] if with_sb3 else ["flowrl"]
    machine = machine_info()
    load_start = loadavg()
    started = time.perf_counter()
    trials: dict[str, list[dict[str, Any]]] = {f"{kind} {algo}": [] for algo in args.algos for kind in kinds}
    for seed in seeds:  # alternating: every variant for one seed, then the next seed
        for algo in args.algos:
            for kind in kinds:
                trials[f"{kind} {algo}"].append(
                    run_trial(kind, algo, seed, target, max_steps, config_files[algo], args.trial_timeout)
                )
    load_end = loadavg()
    machine.update(
        loadavg_start=load_start,
        loadavg_end=load_end,
        note="1/5/15-minute load averages; on a shared machine other processes' load slows every trial",
    )

    summaries = {name: summarize(ts) for name, ts in trials.items()}
    ratios = {algo: ratio(summaries[f"flowrl {algo}"], summaries.get(f"sb3 {algo}")) for algo in args.algos}
    ppo_wall = summaries["flowrl ppo"]["median_wall_s"] if "ppo" in args.algos else None

    print(
        f"\nmachine: {machine['cpu_count']} CPUs ({machine.get('cpu_model', '?')}), Python {machine['python']}, "
        f"Ray {machine['ray']}, torch {machine['torch']}, gymnasium {machine['gymnasium']}, "
        f"SB3 {machine['stable-baselines3'] or 'not installed'}; load {load_start[0]:.2f} -> {load_end[0]:.2f}"
    )
    print(
        f"\nTime to a 100-episode mean reward of {target:g} on {ENV_ID} (cap {max_steps} steps), seeds {seeds}; "
        "failed trials count as infinite in medians"
    )
    print(f"{'variant':<20}{'reached':>8}{'median wall s':>15}{'median steps':>14}")
    for name, summary in summaries.items():
        wall = f"{summary['median_wall_s']:.1f}" if summary["median_wall_s"] is not None else "n/a"
        steps = f"{summary['median_env_steps']:.0f}" if summary["median_env_steps"] is not None else "n/a"
        print(f"{name:<20}{summary['reached']:>5}/{summary['trials']:<2}{wall:>15}{steps:>14}")
        for p in summary["per_seed"]:
            wall_p = f"{p['wall_s']:.1f} s" if p.get("wall_s") is not None else "-"
            print(
                f"    seed {p['seed']}: {'reached' if p['reached'] else 'NOT reached':<12}{wall_p:>9}  "
                f"{p.get('env_steps') or 0:>7} steps  final mean {p.get('final_reward_mean') or float('nan'):.1f}"
                + (f"  ({p['error']})" if "error" in p else "")
            )
    for algo, r in ratios.items():
        if r is not None:
            if r["flowrl_wall_over_sb3_wall"] is not None:
                value = f"{r['flowrl_wall_over_sb3_wall']:.3f}"
            elif "flowrl_wall_over_sb3_wall_at_most" in r:
                value = f"at most {r['flowrl_wall_over_sb3_wall_at_most']:.3f} (SB3 missed the target within the cap)"
            else:
                value = "n/a"
            print(f"{algo}: flowrl wall / SB3 wall = {value} (goal {r['goal']}): {'met' if r['met'] else 'NOT met'}")
    if ppo_wall is not None:
        print(
            f"flowrl PPO median wall {ppo_wall:.1f} s (goal <= {PPO_WALL_GOAL_S:g} s): "
            f"{'met' if ppo_wall <= PPO_WALL_GOAL_S else 'NOT met'}"
        )
    for algo in args.algos:  # where the time went, for the median flowrl trial that ran
        ran = sorted((t for t in trials[f"flowrl {algo}"] if "plan" in t), key=lambda t: t["wall_s"])
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
            "algos": args.algos,
            "order": "alternating per seed: " + ", ".join(trials),
            "flowrl_config_files": {algo: config_files[algo] for algo in args.algos},
            "sb3": {
                "hyperparameters": {algo: SB3_ZOO[algo] for algo in args.algos},
                "note": "the zoo's schedules over the zoo's n_timesteps, then at their final values; torch threads "
                "and device left at SB3's defaults",
            }
            if with_sb3
            else sb3_note,
            "wall_s": (
                "from process start (before importing ray/torch) to the train()/learn() call that reached the target"
            ),
            "total_benchmark_s": time.perf_counter() - started,
        },
        "results": summaries,
        "ratios": ratios,
        "goals": {
            "ratio": f"median flowrl wall / median SB3 wall <= {RATIO_GOAL} per algorithm",
            "ppo_wall_s": f"<= {PPO_WALL_GOAL_S:g}",
            "ppo_wall_s_met": ppo_wall is not None and ppo_wall <= PPO_WALL_GOAL_S,
        },
        "trials": trials,
    }
    write_report(args.out, report)


if __name__ == "__main__":
    main()
