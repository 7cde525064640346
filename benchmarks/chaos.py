"""Chaos benchmark: training through killed workers, a straggler, and a long run with large observations.

Four parts (``--part a|b|c|d|all``), each printed and saved with its targets beside the
measured figures (pass / fail per target):

a. Ape-X DQN on CartPole-v1 (``tuned_examples/cartpole-apex.yaml``) with 4 rollout workers
   (0.25 CPU each, so that they fit on 2 cores). After every 5th ``train()`` call, up to
   the 40th, one worker chosen by a seeded RNG is killed (``ray.kill`` of a handle from
   ``trainer.workers.remote_workers()``). Reported: the run's ``num_worker_restarts``
   (target: exactly 8), for each kill the ``train()`` calls until the result shows it
   replaced (``num_worker_restarts`` counts it, ``num_healthy_workers`` is 4 again and the
   killed handle is no longer among the workers; target: <= 2), and the env steps until the
   100-episode mean reward reaches 150, against the same seeded run without kills (target:
   <= 1.25x). A run that has not reached 150 after 40 iterations goes on, without kills,
   up to a step cap. Asynchronous plans are not bit-for-bit reproducible even with a seed:
   the no-kill run is a reference, not a replay.
b. The same for IMPALA (``tuned_examples/cartpole-impala.yaml``).
c. A straggler: one of 4 rollout workers 10x slower. First the workers' own time per env
   step is measured in a run without a straggler (every worker samples at once, as in
   training, through ``foreach_worker``); a ``"slow"`` fault of
   :class:`flowrl.envs.testing.FaultInjectEnv` on worker 1 then adds 9x that time to each
   of its env steps. Env steps sampled per second over a fixed number of ``train()`` calls
   (each at least ``min_iter_time_s`` = 2 s, so that a window holds many of the straggler's
   fragments) after a warm-up, fresh trainer per repetition, medians: IMPALA and Ape-X with the
   straggler against without (target: >= 0.7x), PPO with the straggler and
   ``sample_min_fraction=0.75`` against PPO without a straggler (target: >= 0.7x), and, for
   contrast, PPO with the straggler and ``sample_min_fraction=1.0`` (no target). Every run,
   the baselines included, wraps CartPole in ``FaultInjectEnv`` (same wrapper cost). Ape-X
   runs here with ``training_intensity: None``: throttled to the learner, its sampling speed
   would say nothing about the straggler.
d. A memory soak: 2,000 short Ape-X iterations (``timesteps_per_iteration`` 300) on an env
   with 84*84 float32 observations (CartPole's state padded with noise; a small MLP) and a
   2,000-step replay buffer. Driver RSS (``/proc/self/statm``) at iteration 200 and at the end (target: growth <=
   5%), with a trace every 100 iterations, and the most replay writes and priority updates
   ever pending (``StoreToReplayBuffer.pending_writes``, ``UpdatePriorities.pending_updates``)
   against their bound (target: never above it).

Run from the repository root::

    python benchmarks/chaos.py                    # all parts, tens of minutes
    python benchmarks/chaos.py --part c           # one part
    python benchmarks/chaos.py --quick            # a smoke test (a few minutes; figures mean little)

It starts a local Ray with 2 CPUs, prints tables and writes the figures as JSON to ``--out``
(default ``benchmarks/results/chaos.json``), rewritten after each part, so a failing part
leaves the others' figures (a part that raises is recorded with its error and the others run).
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import platform
import random
import statistics
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import ray
import yaml
from time_to_solve import write_report  # benchmarks/ is on the path when a script in it runs

from flowrl import Trainer
from flowrl.envs.testing import FaultInjectEnv, release_fault_counters
from flowrl.operators import StoreToReplayBuffer
from flowrl.operators.replay_ops import UpdatePriorities

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "chaos.json"
ENV_ID = "CartPole-v1"
SEED = 0
NUM_WORKERS = 4
CPUS_PER_WORKER = 0.25

RESTARTS_TARGET = 8
RECOVERY_TARGET_ITERS = 2
STEPS_RATIO_TARGET = 1.25
THROUGHPUT_RATIO_TARGET = 0.7
RSS_GROWTH_TARGET_PCT = 5.0

FULL = {
    "kill_every": 5,
    "kill_iterations": 40,
    "reward_target": 150.0,
    "max_steps": {"apex": 200_000, "impala": 500_000},
    "straggler_reps": 3,
    "warmup_iterations": 2,
    "measured_iterations": 5,
    "straggler_min_iter_time_s": 2.0,
    "soak_iterations": 2000,
    "soak_rss_from": 200,
}
QUICK = {
    "kill_every": 5,
    "kill_iterations": 10,
    "reward_target": 30.0,
    "max_steps": {"apex": 20_000, "impala": 40_000},
    "straggler_reps": 1,
    "warmup_iterations": 1,
    "measured_iterations": 2,
    "straggler_min_iter_time_s": 0.5,
    "soak_iterations": 60,
    "soak_rss_from": 20,
}


# -- helpers ---------------------------------------------------------------------------------


def tuned_config(algo: str) -> dict[str, Any]:
    """The ``config`` of ``tuned_examples/cartpole-<algo>.yaml``."""
    spec = yaml.safe_load((ROOT / "tuned_examples" / f"cartpole-{algo}.yaml").read_text())
    return dict(spec["config"])


def target(name: str, measured: Any, goal: str, met: bool | None) -> dict[str, Any]:
    """One target beside its measured figure; ``met`` None: could not be measured."""
    status = "n/a" if met is None else ("PASS" if met else "FAIL")
    shown = f"{measured:.3f}" if isinstance(measured, float) else str(measured)
    print(f"  target {name}: {shown} (goal {goal}): {status}", flush=True)
    return {"name": name, "measured": measured, "goal": goal, "met": met}


def stop_trainer(trainer: Trainer) -> str | None:
    """Stop ``trainer``; a failure to stop is reported (returned), not raised, so the benchmark goes on."""
    try:
        trainer.stop()
        return None
    except Exception as e:  # noqa: BLE001 - a benchmark records it and carries on
        print(f"  Trainer.stop() raised {type(e).__name__}: {e}", flush=True)
        return f"{type(e).__name__}: {e}"


def fault_counts(result: dict[str, Any]) -> dict[str, Any]:
    """The fault counters at the top level of a result."""
    keys = (
        "num_healthy_workers",
        "num_worker_restarts",
        "num_faulty_episodes",
        "num_bad_observations",
        "num_nonfinite_updates",
        "num_late_fragments",
        "num_replay_shard_restarts",
    )
    return {k: result.get(k) for k in keys}


def reward_of(result: dict[str, Any]) -> float | None:
    value = result.get("episode_reward_mean")
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def loadavg() -> float:
    return round(os.getloadavg()[0], 2)


# -- (a), (b): killed workers ----------------------------------------------------------------


def kill_config(algo: str, quick: bool) -> dict[str, Any]:
    config = {**tuned_config(algo), "num_workers": NUM_WORKERS, "num_cpus_per_worker": CPUS_PER_WORKER, "seed": SEED}
    if quick:
        config["timesteps_per_iteration"] = 500 if algo == "apex" else 1000
        if algo == "apex":
            config.update(learning_starts=500, target_network_update_freq=500)
    return config


def train_run(algo: str, config: dict[str, Any], settings: dict[str, Any], *, kills: bool) -> dict[str, Any]:
    """One run of ``algo``: with ``kills``, a seeded random worker killed every ``kill_every``
    iterations up to ``kill_iterations``; until the reward target (and, with kills, past the last
    kill and its recovery) or the step cap."""
    goal, cap = settings["reward_target"], settings["max_steps"][algo]
    every, last_kill = settings["kill_every"], settings["kill_iterations"]
    rng = random.Random(SEED)
    trainer = Trainer(algo, ENV_ID, config)
    history: list[dict[str, Any]] = []
    killed: list[dict[str, Any]] = []
    reached_at: int | None = None
    started = time.perf_counter()
    stop_error = None
    try:
        while True:
            result = trainer.train()
            iteration = result["training_iteration"]
            steps = int(result["timesteps_total"])
            reward = reward_of(result)
            faults = fault_counts(result)
            history.append({"iteration": iteration, "steps": steps, "reward_mean": reward, **faults})
            if reached_at is None and reward is not None and reward >= goal:
                reached_at = steps
            for kill in killed:  # which kills does this result show repaired?
                if kill["recovered_after_iterations"] is None and (
                    (faults["num_worker_restarts"] or 0) >= kill["number"]
                    and faults["num_healthy_workers"] == NUM_WORKERS
                    and kill["handle"] not in trainer.workers.remote_workers()
                ):
                    kill["recovered_after_iterations"] = iteration - kill["iteration"]
            print(
                f"  [{algo}{' kills' if kills else ''}] iter {iteration:3d}  steps {steps:7d}  "
                f"reward {reward if reward is not None else float('nan'):6.1f}  "
                f"healthy {faults['num_healthy_workers']}  "
                f"restarts {faults['num_worker_restarts']}  t {time.perf_counter() - started:6.1f}s",
                flush=True,
            )
            if kills and iteration % every == 0 and iteration <= last_kill:
                handles, indices = trainer.workers.remote_workers(), trainer.workers.remote_worker_indices()
                position = rng.randrange(len(handles))
                ray.kill(handles[position])
                killed.append(
                    {
                        "number": len(killed) + 1,
                        "iteration": iteration,
                        "worker_index": indices[position],
                        "handle": handles[position],
                        "recovered_after_iterations": None,
                    }
                )
                print(f"  killed worker {indices[position]} after iteration {iteration}", flush=True)
            kills_done = not kills or iteration >= last_kill
            # Every kill seen repaired, or given up on well past its target.
            recoveries_seen = all(
                k["recovered_after_iterations"] is not None or iteration - k["iteration"] >= 5 * RECOVERY_TARGET_ITERS
                for k in killed
            )
            if steps >= cap or (kills_done and recoveries_seen and reached_at is not None):
                break
    finally:
        stop_error = stop_trainer(trainer)
    return {
        "kills": kills,
        "reached": reached_at is not None,
        "steps_to_target": reached_at,
        "iterations": len(history),
        "final_steps": history[-1]["steps"] if history else 0,
        "final_reward_mean": history[-1]["reward_mean"] if history else None,
        "num_worker_restarts": history[-1]["num_worker_restarts"] if history else None,
        "final_fault_counters": {k: v for k, v in history[-1].items() if k.startswith("num_")} if history else {},
        "killed": [{k: v for k, v in kill.items() if k != "handle"} for kill in killed],
        "wall_s": time.perf_counter() - started,
        "stop_error": stop_error,
        "history": history,
    }


def killed_workers_part(algo: str, settings: dict[str, Any], quick: bool) -> dict[str, Any]:
    config = kill_config(algo, quick)
    expected = settings["kill_iterations"] // settings["kill_every"]
    print(
        f"\n{algo}: {NUM_WORKERS} workers, a random one killed every {settings['kill_every']} iterations up to "
        f"{settings['kill_iterations']}; reward target {settings['reward_target']:g}",
        flush=True,
    )
    baseline = train_run(algo, config, settings, kills=False)
    chaos = train_run(algo, config, settings, kills=True)
    recoveries = [k["recovered_after_iterations"] for k in chaos["killed"]]
    worst = max((r for r in recoveries if r is not None), default=None)
    ratio = (
        chaos["steps_to_target"] / baseline["steps_to_target"]
        if chaos["steps_to_target"] and baseline["steps_to_target"]
        else None
    )
    print(f"  kills: {len(chaos['killed'])}, iterations until recovered after each: {recoveries}")
    print(
        f"  steps to a 100-episode mean of {settings['reward_target']:g}: with kills {chaos['steps_to_target']}, "
        f"without {baseline['steps_to_target']}"
    )
    targets = [
        target(
            "num_worker_restarts",
            chaos["num_worker_restarts"],
            f"== {expected}",
            chaos["num_worker_restarts"] == expected,
        ),
        target(
            "iterations until healthy again, worst kill",
            worst,
            f"<= {RECOVERY_TARGET_ITERS} for every kill",
            None if not recoveries else all(r is not None and r <= RECOVERY_TARGET_ITERS for r in recoveries),
        ),
        target(
            "steps to target, with kills / without",
            ratio,
            f"<= {STEPS_RATIO_TARGET}",
            None if ratio is None else ratio <= STEPS_RATIO_TARGET,
        ),
    ]
    if ratio is None:
        print("  (the ratio needs both runs to reach the reward target within the step cap)")
    return {
        "algo": algo,
        "config": config,
        "expected_restarts": expected,
        "recoveries_iterations": recoveries,
        "steps_ratio": ratio,
        "targets": targets,
        "with_kills": chaos,
        "without_kills": baseline,
    }


# -- (c): a straggler ------------------------------------------------------------------------


def straggler_config(algo: str, settings: dict[str, Any], quick: bool) -> dict[str, Any]:
    base = {
        **tuned_config(algo),
        "num_workers": NUM_WORKERS,
        "num_cpus_per_worker": CPUS_PER_WORKER,
        "seed": SEED,
        # Iterations long enough to hold many fragments of the straggler's.
        "min_iter_time_s": settings["straggler_min_iter_time_s"],
    }
    if algo == "ppo":
        # 4 x 4 envs x 125 steps: one round of the 4 workers is one train batch of 2,000.
        base.update(num_envs_per_worker=4, rollout_fragment_length=125, train_batch_size=2000)
        if quick:
            base.update(rollout_fragment_length=50, train_batch_size=800, num_sgd_iter=2)
    elif algo == "apex":
        base["training_intensity"] = None
        if quick:
            base.update(timesteps_per_iteration=1000, learning_starts=500)
    elif algo == "impala" and quick:
        base["timesteps_per_iteration"] = 2000
    return base


def with_env(config: dict[str, Any], delay_s: float | None) -> dict[str, Any]:
    """``config`` on CartPole in a FaultInjectEnv, with a slow worker 1 when ``delay_s`` is given."""
    faults = (
        [] if delay_s is None else [{"kind": "slow", "name": "straggler", "worker_indices": [1], "delay_s": delay_s}]
    )
    return {**config, "env_config": {"env": ENV_ID, "faults": faults}}


def _time_env_steps(worker: Any) -> float:
    """Runs in a rollout worker: seconds per env step of its own sampling (a warm-up fragment first)."""
    worker.sample()
    start, steps = time.perf_counter(), 0
    while time.perf_counter() - start < 1.0:
        steps += worker.sample().env_steps()
    return (time.perf_counter() - start) / steps


def measure_throughput(
    algo: str, config: dict[str, Any], settings: dict[str, Any], time_steps: bool = False
) -> dict[str, Any]:
    """Env steps sampled per second over ``measured_iterations`` train() calls after ``warmup_iterations``;
    with ``time_steps``, afterwards also each remote worker's seconds per env step while all sample."""
    load = loadavg()
    trainer = Trainer(algo, FaultInjectEnv, config)
    stop_error = None
    try:
        for _ in range(settings["warmup_iterations"]):
            result = trainer.train()
        steps0, start = result["timesteps_total"], time.perf_counter()
        for _ in range(settings["measured_iterations"]):
            result = trainer.train()
        wall = time.perf_counter() - start
        out = {
            "sampled_per_s": (result["timesteps_total"] - steps0) / wall,
            "wall_s": wall,
            "steps": result["timesteps_total"] - steps0,
            "num_late_fragments": result.get("num_late_fragments"),
            "num_worker_restarts": result.get("num_worker_restarts"),
            "num_healthy_workers": result.get("num_healthy_workers"),
            "load_avg_1m": load,
        }
        if time_steps:
            out["worker_s_per_env_step"] = trainer.workers.foreach_worker(_time_env_steps, local=False)
    finally:
        stop_error = stop_trainer(trainer)
    out["stop_error"] = stop_error
    return out


def straggler_part(settings: dict[str, Any], quick: bool) -> dict[str, Any]:
    reps = settings["straggler_reps"]
    print(
        f"\nstraggler: worker 1 of {NUM_WORKERS} 10x slower; {settings['warmup_iterations']} warm-up + "
        f"{settings['measured_iterations']} measured iterations, {reps} repetition(s), medians",
        flush=True,
    )
    report: dict[str, Any] = {"algorithms": {}, "targets": []}
    for algo in ("impala", "apex", "ppo"):
        config = straggler_config(algo, settings, quick)
        first = measure_throughput(algo, with_env(config, None), settings, time_steps=True)
        per_step = statistics.median(first["worker_s_per_env_step"])
        delay = 9 * per_step
        print(
            f"  {algo}: a worker takes {1e6 * per_step:.0f} us per env step (median of 4, all sampling); "
            f"the straggler sleeps {1e6 * delay:.0f} us more per step",
            flush=True,
        )
        variants: dict[str, tuple[dict[str, Any], float | None]] = {
            "without straggler": (config, None),
            "with straggler": (config, delay),
        }
        if algo == "ppo":
            variants = {
                "without straggler": (config, None),
                "with straggler, sample_min_fraction=0.75": ({**config, "sample_min_fraction": 0.75}, delay),
                "with straggler, sample_min_fraction=1.0": (config, delay),
            }
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in variants}
        runs["without straggler"].append(first)
        for rep in range(reps):
            for name, (variant_config, variant_delay) in variants.items():
                if rep == 0 and name == "without straggler":
                    run = first
                else:
                    run = measure_throughput(algo, with_env(variant_config, variant_delay), settings)
                    runs[name].append(run)
                print(
                    f"  rep {rep + 1}/{reps} {algo:6s} {name:42s} {run['sampled_per_s']:8.0f} steps/s  "
                    f"late fragments {run['num_late_fragments']}  load {run['load_avg_1m']}",
                    flush=True,
                )
        medians = {name: statistics.median(r["sampled_per_s"] for r in rs) for name, rs in runs.items()}
        base = medians["without straggler"]
        ratios = {name: m / base for name, m in medians.items() if name != "without straggler"}
        report["algorithms"][algo] = {
            "config": config,
            "worker_s_per_env_step": first["worker_s_per_env_step"],
            "straggler_delay_s": delay,
            "median_sampled_per_s": medians,
            "ratios_to_without": ratios,
            "runs": runs,
        }
        for name, ratio in ratios.items():
            if name.endswith("sample_min_fraction=1.0"):
                print(f"  {algo} {name} / without: {ratio:.2f} (for contrast, no target)")
                continue
            report["targets"].append(
                target(
                    f"{algo} {name} / without, sampled steps/s",
                    ratio,
                    f">= {THROUGHPUT_RATIO_TARGET}",
                    ratio >= THROUGHPUT_RATIO_TARGET,
                )
            )
    return report


# -- (d): memory soak ------------------------------------------------------------------------

OBS_SIZE = 84 * 84


class LargeObsCartPole(gym.Env):
    """CartPole whose observation is a 7,056-float vector: the 4 state values, then noise in [-1, 1]."""

    def __init__(self, env_config: Any = None) -> None:
        self.inner = gym.make(ENV_ID)
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (OBS_SIZE,), np.float32)
        self.action_space = self.inner.action_space
        self.rng = np.random.default_rng()

    def _pad(self, state: np.ndarray) -> np.ndarray:
        obs = self.rng.uniform(-1.0, 1.0, OBS_SIZE).astype(np.float32)
        obs[:4] = state
        return obs

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        state, info = self.inner.reset(seed=seed, options=options)
        return self._pad(state), info

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        state, reward, terminated, truncated, info = self.inner.step(action)
        return self._pad(state), float(reward), terminated, truncated, info

    def close(self) -> None:
        self.inner.close()


def make_large_obs_cartpole(env_config: Any) -> gym.Env:
    return LargeObsCartPole(env_config)


def soak_config() -> dict[str, Any]:
    return {
        "num_workers": 2,
        "num_cpus_per_worker": 0.5,
        "num_envs_per_worker": 2,
        "rollout_fragment_length": 25,
        "timesteps_per_iteration": 300,
        "buffer_size": 2000,
        "learning_starts": 500,
        "train_batch_size": 32,
        "target_network_update_freq": 2000,
        "model": {"fcnet_hiddens": [32, 32]},
        "seed": SEED,
    }


def rss_bytes() -> int:
    """This process's resident set size, from ``/proc/self/statm`` (Linux), else psutil if installed."""
    statm = Path("/proc/self/statm")
    if statm.exists():
        return int(statm.read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    import psutil  # type: ignore[import-untyped]  # a dev dependency; only off Linux

    return int(psutil.Process().memory_info().rss)


def plan_operators(trainer: Trainer, kind: type) -> list[Any]:
    return [stage.fn for stage in trainer.plan.graph.operators.values() if isinstance(stage.fn, kind)]


def soak_part(settings: dict[str, Any]) -> dict[str, Any]:
    iterations, rss_from = settings["soak_iterations"], settings["soak_rss_from"]
    config = soak_config()
    print(
        f"\nmemory soak: {iterations} Ape-X iterations of >= {config['timesteps_per_iteration']} env steps, "
        f"{OBS_SIZE}-float observations, buffer {config['buffer_size']}",
        flush=True,
    )
    trainer = Trainer("apex", make_large_obs_cartpole, config)
    trace: list[dict[str, Any]] = []
    rss_at: dict[int, int] = {}
    max_writes = max_updates = 0
    stop_error = None
    started = time.perf_counter()
    try:
        [store] = plan_operators(trainer, StoreToReplayBuffer)
        [updates] = plan_operators(trainer, UpdatePriorities)
        write_bound, update_bound = store._writes.max_in_flight, updates._updates.max_in_flight
        for i in range(1, iterations + 1):
            result = trainer.train()
            max_writes = max(max_writes, store.pending_writes)
            max_updates = max(max_updates, updates.pending_updates)
            if i == rss_from or i == iterations:
                rss_at[i] = rss_bytes()
            if i % 100 == 0 or i in (1, rss_from, iterations):
                shards = result.get("info", {}).get("replay_shards", [{}])
                point = {
                    "iteration": i,
                    "rss_mb": rss_bytes() / 2**20,
                    "steps": result["timesteps_total"],
                    "pending_writes": store.pending_writes,
                    "pending_priority_updates": updates.pending_updates,
                    "lost_replay_writes": store.num_lost_replay_writes,
                    "replay_shard_stats": shards,
                    "wall_s": time.perf_counter() - started,
                    **fault_counts(result),
                }
                trace.append(point)
                print(
                    f"  iter {i:5d}  rss {point['rss_mb']:7.1f} MiB  steps {point['steps']:8d}  "
                    f"pending writes {point['pending_writes']}/{write_bound}  pending priority updates "
                    f"{point['pending_priority_updates']}/{update_bound}  t {point['wall_s']:6.0f}s",
                    flush=True,
                )
    finally:
        stop_error = stop_trainer(trainer)
    growth = 100.0 * (rss_at[iterations] - rss_at[rss_from]) / rss_at[rss_from]
    print(
        f"  driver RSS: {rss_at[rss_from] / 2**20:.1f} MiB at iteration {rss_from}, "
        f"{rss_at[iterations] / 2**20:.1f} MiB at {iterations}"
    )
    targets = [
        target(
            f"driver RSS growth %, iteration {rss_from} -> {iterations}",
            growth,
            f"<= {RSS_GROWTH_TARGET_PCT}",
            growth <= RSS_GROWTH_TARGET_PCT,
        ),
        target("most replay writes pending", max_writes, f"<= {write_bound} (the bound)", max_writes <= write_bound),
        target(
            "most priority updates pending", max_updates, f"<= {update_bound} (the bound)", max_updates <= update_bound
        ),
    ]
    return {
        "config": config,
        "obs_shape": [OBS_SIZE],
        "obs_dtype": "float32",
        "rss_bytes": {str(k): v for k, v in rss_at.items()},
        "rss_growth_pct": growth,
        "max_pending_writes": max_writes,
        "pending_writes_bound": write_bound,
        "max_pending_priority_updates": max_updates,
        "pending_priority_updates_bound": update_bound,
        "wall_s": time.perf_counter() - started,
        "stop_error": stop_error,
        "targets": targets,
        "trace": trace,
    }


# -- main ------------------------------------------------------------------------------------


def run_part(name: str, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run one part; a part that raises is recorded with its error so the other parts still run."""
    started = time.perf_counter()
    try:
        out = fn()
    except Exception as e:  # noqa: BLE001 - the benchmark reports it
        print(f"\npart {name} failed: {type(e).__name__}: {e}", flush=True)
        out = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
    finally:
        release_fault_counters()
    out["part_wall_s"] = time.perf_counter() - started
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=("a", "b", "c", "d", "all"), default="all", help="which part to run")
    parser.add_argument("--quick", action="store_true", help="small sizes and an easy reward target: a smoke test")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where to write the JSON figures")
    args = parser.parse_args()
    settings = QUICK if args.quick else FULL
    parts = ["a", "b", "c", "d"] if args.part == "all" else [args.part]
    runners: dict[str, tuple[str, Callable[[], dict[str, Any]]]] = {
        "a": ("apex_killed_workers", lambda: killed_workers_part("apex", settings, args.quick)),
        "b": ("impala_killed_workers", lambda: killed_workers_part("impala", settings, args.quick)),
        "c": ("straggler", lambda: straggler_part(settings, args.quick)),
        "d": ("memory_soak", lambda: soak_part(settings)),
    }
    report: dict[str, Any] = {
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "ray": ray.__version__,
            "load_avg_1m_start": loadavg(),
        },
        "settings": {
            "quick": args.quick,
            **settings,
            "num_workers": NUM_WORKERS,
            "num_cpus_per_worker": CPUS_PER_WORKER,
            "seed": SEED,
        },
        "parts": {},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False)
    try:
        for part in parts:
            name, fn = runners[part]
            report["parts"][name] = run_part(part, fn)
            report["machine"]["load_avg_1m_end"] = loadavg()
            write_report(args.out, report, quiet=True)
    finally:
        ray.shutdown()
    print("\nsummary")
    for name, part in report["parts"].items():
        if "error" in part:
            print(f"  {name}: FAILED with {part['error']}")
        for t in part.get("targets", []):
            status = "n/a" if t["met"] is None else ("PASS" if t["met"] else "FAIL")
            measured = f"{t['measured']:.3f}" if isinstance(t["measured"], float) else t["measured"]
            print(f"  {name}: {t['name']}: {measured} (goal {t['goal']}): {status}")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
