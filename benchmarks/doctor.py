"""Benchmark ``flowrl doctor``: six runs, each with one injected bottleneck, and whether the doctor names it.

Each case trains PPO on CartPole-v1 (2 remote workers of half a CPU each, small SGD settings so that
nothing else dominates) with ONE thing made slow, as a ``flowrl train`` run directory; then
``flowrl doctor`` reads the run's plan X-ray and gives its verdict:

==================  ========================================================================  =================
case                injected                                                                  expected verdict
==================  ========================================================================  =================
slow_env            every env step sleeps 100 us (about 10x CartPole's step)                  env-bound
slow_policy         a 3 x 1024 policy network, one env per worker (a big forward per step)    inference-bound
slow_learner        60 epochs of 64-step minibatches per train batch                          learner-bound
huge_observations   200,000-float observations (the policy reads 4 of them)                   transfer-bound
starved_driver      an ``on_train_result`` callback burning 1.5 s of driver CPU               driver-bound
straggler           worker 2's env steps sleep 1 ms (10x worker 1's 100 us)                   straggler
==================  ========================================================================  =================

Run from the repository root::

    python benchmarks/doctor.py                  # about 3 minutes
    python benchmarks/doctor.py --iterations 4 --cases slow_env straggler

It prints each case's verdict and summary, the score (goal: 6 of 6), and writes the diagnoses as
JSON to ``--out`` (default ``benchmarks/results/doctor.json``). The X-ray's own cost is measured by
``benchmarks/throughput.py --profile-overhead``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from flowrl.callbacks import Callbacks
from flowrl.envs import FaultInjectEnv, register_env
from flowrl.plan.doctor import diagnose_run
from flowrl.runs.run import start_run
from flowrl.storage.rundir import RunSpec

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "doctor.json"
BASE = {
    "num_workers": 2,
    "num_cpus_per_worker": 0.5,
    "num_envs_per_worker": 4,
    "rollout_fragment_length": 100,
    "train_batch_size": 800,
    "sgd_minibatch_size": 800,
    "num_sgd_iter": 1,
    "model": {"fcnet_hiddens": [32, 32]},
    "seed": 0,
}
HUGE_OBS = 200_000


class HugeObservations(gym.ObservationWrapper[np.ndarray, Any, np.ndarray]):
    """CartPole whose observation carries ``HUGE_OBS`` floats: its own 4, then zeros."""

    def __init__(self, env: gym.Env[np.ndarray, Any]) -> None:
        super().__init__(env)
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (HUGE_OBS,), np.float32)
        self._buffer = np.zeros(HUGE_OBS, dtype=np.float32)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        out = self._buffer.copy()
        out[:4] = observation
        return out


def huge_cartpole(env_config: dict[str, Any]) -> gym.Env[np.ndarray, Any]:
    return HugeObservations(gym.make("CartPole-v1"))


class FirstFour(nn.Module):
    """An actor-critic that reads the first 4 observation values (CartPole's own) of huge observations."""

    def __init__(
        self, obs_space: gym.Space[Any], action_space: gym.Space[Any], num_outputs: int, **options: Any
    ) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 32), nn.Tanh())
        self.pi = nn.Linear(32, num_outputs)
        self.vf = nn.Linear(32, 1)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features = self.body(obs[:, :4])
        return self.pi(features), self.vf(features).squeeze(-1)


class BusyDriver(Callbacks):
    """Burns driver CPU after every iteration (a heavy per-result computation in a callback)."""

    def on_train_result(self, trainer: Any, result: dict[str, Any]) -> None:
        deadline = time.perf_counter() + 1.5
        x = 0.0
        while time.perf_counter() < deadline:
            x += sum(i * i for i in range(1000))


def slow_steps(*faults: dict[str, Any]) -> dict[str, Any]:
    """The env_config of CartPole whose steps sleep (FaultInjectEnv's ``slow`` faults)."""
    return {"env": "CartPole-v1", "faults": [{"kind": "slow", **fault} for fault in faults]}


#: case -> (env, config changes, the verdict the doctor should give)
CASES: dict[str, tuple[str, dict[str, Any], str]] = {
    "slow_env": ("doctor-faults", {"env_config": slow_steps({"delay_s": 1e-4})}, "env-bound"),
    "slow_policy": (
        "CartPole-v1",
        {
            "model": {"fcnet_hiddens": [1024, 1024, 1024]},
            "num_envs_per_worker": 1,
            "rollout_fragment_length": 200,
            "train_batch_size": 400,
            "sgd_minibatch_size": 400,
        },
        "inference-bound",
    ),
    "slow_learner": ("CartPole-v1", {"num_sgd_iter": 60, "sgd_minibatch_size": 64}, "learner-bound"),
    "huge_observations": (
        "doctor-huge",
        {
            "model": {"custom_model": FirstFour},
            "rollout_fragment_length": 25,
            "num_envs_per_worker": 2,
            "train_batch_size": 100,
            "sgd_minibatch_size": 100,
        },
        "transfer-bound",
    ),
    "starved_driver": ("CartPole-v1", {"callbacks": BusyDriver}, "driver-bound"),
    "straggler": (
        "doctor-faults",
        {"env_config": slow_steps({"delay_s": 1e-4, "worker_indices": [1]}, {"delay_s": 1e-3, "worker_indices": [2]})},
        "straggler",
    ),
}


def run_case(name: str, iterations: int, results_dir: Path) -> dict[str, Any]:
    env, changes, expected = CASES[name]
    config = {**BASE, **changes}
    started = time.perf_counter()
    with start_run(
        RunSpec(algo="ppo", env=env, config=config, stop={"training_iteration": iterations}), results_dir=results_dir
    ) as run:
        run.train()
        directory = run.directory
    diagnosis = diagnose_run(directory)
    return {
        "case": name,
        "expected": expected,
        "verdict": diagnosis.verdict,
        "named": diagnosis.verdict == expected,
        "summary": diagnosis.summary,
        "shares": diagnosis.shares,
        "figures": diagnosis.figures,
        "wall_s": round(time.perf_counter() - started, 1),
        "run_dir": str(directory),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=6, help="training iterations per case (default 6)")
    parser.add_argument("--cases", nargs="+", choices=sorted(CASES), default=list(CASES))
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    register_env("doctor-faults", FaultInjectEnv)
    register_env("doctor-huge", huge_cartpole)
    rows = []
    with tempfile.TemporaryDirectory(prefix="flowrl-doctor-") as tmp:
        for name in args.cases:
            row = run_case(name, args.iterations, Path(tmp))
            rows.append(row)
            mark = "yes" if row["named"] else "NO"
            shares = ", ".join(
                f"{part} {100 * share:.0f}%" for part, share in sorted(row["shares"].items(), key=lambda kv: -kv[1])
            )
            print(
                f"{name:<18} expected {row['expected']:<16} doctor: {row['verdict']:<16} "
                f"named: {mark:<4} ({row['wall_s']} s)"
            )
            print(f"{'':<18} {row['summary']}")
            print(f"{'':<18} shares: {shares}", flush=True)
    named = sum(row["named"] for row in rows)
    print(f"\nflowrl doctor named the injected bottleneck in {named} of {len(rows)} runs (goal: 6 of 6)")
    out = {
        "named": named,
        "cases": rows,
        "iterations": args.iterations,
        "cpu_count": os.cpu_count(),
        "load_1min": os.getloadavg()[0],
        "python": platform.python_version(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2, default=str))
    print(f"figures written to {args.out}")


if __name__ == "__main__":
    main()
