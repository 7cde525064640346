"""Benchmark the cost of the samplers' bad-data checks (finite, shape, dtype, bounds of every observation and reward).

1. :class:`flowrl.actors.sampling.vector.VectorSampler` on CartPole-v1, 8 envs, fragments of 100 steps,
   the default MLP actor-critic TorchPolicy (acting on its NumPy path, one torch thread as in a
   rollout actor), with the checks on (the default) and off (the sampler's private
   ``_check_data = False``, which skips every check and nothing else). Two setups: the stepping
   loop alone (no postprocessing: the checks' cost relative to the least work, the worst case)
   and with GAE postprocessing as PPO and A2C sample. Env steps per CPU second of this thread
   (less moved by other load than wall time; wall time is saved too). Two samplers, one per
   setting, alternate (A B A B ...) after a warm-up; medians, and on / off (goal: >= 0.95).

2. The same on :class:`flowrl.actors.sampling.multi_agent.MultiAgentSampler` (MultiAgentCartPole,
   4 agents, 4 envs, one policy), which checks each policy's stacked observations once per step:
   agent steps per CPU second, on / off (reported, no goal).

Run from the repository root::

    python benchmarks/sampler_checks.py              # about a minute
    python benchmarks/sampler_checks.py --quick      # a smoke test (~15 s)
    python benchmarks/sampler_checks.py --reps 11 --out /tmp/sampler_checks.json

It prints a table and writes the figures as JSON to ``--out`` (default
``benchmarks/results/sampler_checks.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from flowrl.actors.sampling.multi_agent import MultiAgentSampler
from flowrl.actors.sampling.vector import VectorSampler
from flowrl.config import TrainerConfig
from flowrl.data import SampleBatch
from flowrl.envs import MultiAgentCartPole
from flowrl.policy import TorchPolicy, bootstrap_value, compute_advantages

ENV_ID = "CartPole-v1"
NUM_ENVS = 8
FRAGMENT_LENGTH = 100
MULTI_AGENT_ENVS = 4
GOAL = 0.95
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "sampler_checks.json"
med = statistics.median


def bc_loss(policy: TorchPolicy, model: torch.nn.Module, dist_class: Any, batch: dict[str, torch.Tensor]) -> Any:
    """A behaviour-cloning loss: sampling never calls it, but a TorchPolicy needs one."""
    logits, _ = model(batch[SampleBatch.OBS])
    return -dist_class(logits).logp(batch[SampleBatch.ACTIONS]).mean(), {}


def gae(policy: TorchPolicy, batch: SampleBatch) -> SampleBatch:
    """GAE postprocessing, bootstrapped from the value head, as PPO/A2C use it."""
    return compute_advantages(batch, bootstrap_value(batch, policy.value), gamma=0.99, lambda_=0.95)


def vector_sampler(checks: bool, postprocess: bool) -> VectorSampler:
    """A seeded VectorSampler over ``NUM_ENVS`` CartPoles, its checks on or off."""
    env = gym.make(ENV_ID)
    kwargs = {"loss_fn": bc_loss, "postprocess_fn": gae if postprocess else None}
    policy = TorchPolicy(env.observation_space, env.action_space, TrainerConfig(seed=0), **kwargs)
    sampler = VectorSampler(
        [gym.make(ENV_ID) for _ in range(NUM_ENVS)], policy, fragment_length=FRAGMENT_LENGTH, seed=0
    )
    sampler._check_data = checks
    return sampler


def multi_agent_sampler(checks: bool) -> MultiAgentSampler:
    """A seeded MultiAgentSampler over ``MULTI_AGENT_ENVS`` MultiAgentCartPoles (4 agents each), one policy."""
    env = MultiAgentCartPole({})
    policy = TorchPolicy(env.observation_space(0), env.action_space(0), TrainerConfig(seed=0), loss_fn=bc_loss)
    envs = [MultiAgentCartPole({}) for _ in range(MULTI_AGENT_ENVS)]
    sampler = MultiAgentSampler(envs, {"p": policy}, lambda agent: "p", fragment_length=FRAGMENT_LENGTH, seed=0)
    sampler._check_data = checks
    return sampler


def alternate(samplers: dict[str, Any], count: Callable[[Any], int], reps: int, rep_cpu_s: float) -> dict[str, Any]:
    """Warm up, then ``reps`` rounds of ~``rep_cpu_s`` CPU s per sampler, in turn; steps per CPU s and per wall s."""
    for sampler in samplers.values():
        for _ in range(3):
            sampler.sample()
    start = time.thread_time()
    calls = 0
    while time.thread_time() - start < rep_cpu_s / 2:
        next(iter(samplers.values())).sample()
        calls += 1
    calls = max(1, calls * 2)
    per_cpu: dict[str, list[float]] = {name: [] for name in samplers}
    per_wall: dict[str, list[float]] = {name: [] for name in samplers}
    for _ in range(reps):
        for name, sampler in samplers.items():
            steps, cpu0, wall0 = 0, time.thread_time(), time.perf_counter()
            for _ in range(calls):
                steps += count(sampler.sample())
            per_cpu[name].append(steps / (time.thread_time() - cpu0))
            per_wall[name].append(steps / (time.perf_counter() - wall0))
    on, off = med(per_cpu["checks_on"]), med(per_cpu["checks_off"])
    return {
        "steps_per_cpu_s": {"checks_on": on, "checks_off": off},
        "ratio_on_over_off": on / off,
        "steps_per_wall_s": {name: med(v) for name, v in per_wall.items()},
        "ratio_on_over_off_wall": med(per_wall["checks_on"]) / med(per_wall["checks_off"]),
        "sample_calls_per_rep": calls,
        "reps_steps_per_cpu_s": per_cpu,
    }


def run(reps: int, rep_cpu_s: float) -> dict[str, Any]:
    """Every section's figures."""
    report: dict[str, Any] = {}
    for name, postprocess in (("vector_loop_only", False), ("vector_with_gae", True)):
        samplers = {"checks_on": vector_sampler(True, postprocess), "checks_off": vector_sampler(False, postprocess)}
        figures = alternate(samplers, lambda batch: batch.count, reps, rep_cpu_s)
        figures["setup"] = (
            f"VectorSampler, {ENV_ID} x {NUM_ENVS} envs, fragments of {FRAGMENT_LENGTH} steps, default model"
            f"{', GAE postprocessing' if postprocess else ', no postprocessing'}; env steps"
        )
        figures["goal"] = f"ratio_on_over_off >= {GOAL}"
        figures["met"] = figures["ratio_on_over_off"] >= GOAL
        report[name] = figures
    samplers = {"checks_on": multi_agent_sampler(True), "checks_off": multi_agent_sampler(False)}
    figures = alternate(samplers, lambda batch: batch.agent_steps(), reps, rep_cpu_s)
    figures["setup"] = (
        f"MultiAgentSampler, MultiAgentCartPole (4 agents) x {MULTI_AGENT_ENVS} envs, one policy, "
        f"fragments of {FRAGMENT_LENGTH} steps; agent steps"
    )
    report["multi_agent"] = figures
    return report


def machine_info() -> dict[str, Any]:
    """What the figures were measured on."""
    return {
        "cpu_count": os.cpu_count(),
        "loadavg_1min": os.getloadavg()[0],
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "gymnasium": gym.__version__,
        "platform": platform.platform(),
    }


def main() -> None:
    """Parse options, run the benchmark, print and save the figures."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where to write the JSON figures")
    parser.add_argument("--reps", type=int, help="alternating repetitions per setting (default 9, quick 3)")
    parser.add_argument("--quick", action="store_true", help="short repetitions, for a smoke test")
    args = parser.parse_args()
    reps = args.reps or (3 if args.quick else 9)
    rep_cpu_s = 0.3 if args.quick else 1.0
    torch.set_num_threads(1)  # as a rollout actor does
    machine = machine_info()
    report: dict[str, Any] = {
        "machine": machine,
        "settings": {"quick": args.quick, "reps": reps, "rep_cpu_s": rep_cpu_s},
    }
    report.update(run(reps, rep_cpu_s))
    machine["loadavg_1min_after"] = os.getloadavg()[0]
    print(
        f"machine: {machine['cpu_count']} CPUs, 1-min load {machine['loadavg_1min']:.2f} "
        f"-> {machine['loadavg_1min_after']:.2f}"
    )
    print(f"\n{'setup':<22}{'checks on':>12}{'checks off':>12}{'on / off':>10}{'(wall)':>8}  goal")
    for name in ("vector_loop_only", "vector_with_gae", "multi_agent"):
        figures = report[name]
        rate = figures["steps_per_cpu_s"]
        goal = ("met" if figures["met"] else "NOT MET") + f" (>= {GOAL})" if "met" in figures else "-"
        print(
            f"{name:<22}{rate['checks_on']:>12.0f}{rate['checks_off']:>12.0f}{figures['ratio_on_over_off']:>10.3f}"
            f"{figures['ratio_on_over_off_wall']:>8.3f}  {goal}"
        )
    print("(steps per CPU second of this thread, medians; vector: env steps, multi_agent: agent steps)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nfigures written to {args.out}")


if __name__ == "__main__":
    main()
