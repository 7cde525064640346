"""Benchmark offline data: offline→online against learning from scratch, and streaming a large dataset.

``--part pretrain`` (issue 36's goal: pretrained PPO needs at most half the env steps of PPO from scratch):
an expert (PPO with ``tuned_examples/cartpole-ppo.yaml``, seed 1000, trained to 475) has 40 greedy episodes
recorded (``flowrl record``'s library call); then for each seed, PPO from scratch and PPO with
``pretrain: {algo: bc, input: DATA, iterations: K}`` are trained with the tuned example's settings until
``episode_reward_mean`` (the last 100 training episodes) reaches 475, counting the online env steps
(``timesteps_total``; the pretraining reads rows, not env steps, and its wall time is reported apart).

``--part streaming`` (goal: reader and driver memory at most 1.5 GB, the learner waiting at most 10% of an
iteration): writes a Parquet dataset of at least ``--gigabytes`` (default 2) of CartPole rows (the
expert's episodes repeated, their observations jittered so that they do not compress away), then trains
``bc`` on it for one pass (``--iterations`` to change; ``--rows-per-iteration``, default 1M), streaming
(the dataset is larger than what flowrl keeps in memory), and samples the memory of the driver and of Ray's
worker processes (the read tasks) every 0.2 s: RSS, and PSS, which counts the object store's shared pages
once in all (the goal is on PSS). The waiting share is the X-ray's share of the iteration
``ReadOffline`` took to hand the learner its batches (reading, decoding, postprocessing and shuffling;
the ``offline_*`` timers split it).

Run from the repository root::

    python benchmarks/offline.py --part pretrain --seeds 0 1 2
    python benchmarks/offline.py --part streaming --gigabytes 2

Results print as a table and go to ``benchmarks/results/offline_<part>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import yaml

from flowrl import Trainer
from flowrl.data.offline import ExperienceWriter, OfflineData
from flowrl.engine.record import record_checkpoint

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
TARGET = 475.0


def tuned_ppo() -> dict[str, Any]:
    spec: dict[str, Any] = yaml.safe_load((REPO / "tuned_examples" / "cartpole-ppo.yaml").read_text())
    return dict(spec["config"])


def record_expert(root: Path, episodes: int = 40) -> Path:
    """Train the expert (seed 1000) to 475 and record ``episodes`` greedy episodes under ``root/expert``."""
    trainer = Trainer("ppo", "CartPole-v1", {**tuned_ppo(), "seed": 1000})
    try:
        while trainer.train()["episode_reward_mean"] < TARGET:
            pass
        checkpoint = trainer.save(root / "expert_checkpoint")
    finally:
        trainer.stop()
    out = root / "expert"
    record_checkpoint(checkpoint, out, episodes=episodes, seed=1000)
    return out


def steps_to_target(config: dict[str, Any], max_steps: int) -> dict[str, Any]:
    """Train PPO with ``config`` until the target or ``max_steps`` online env steps."""
    started = time.perf_counter()
    trainer = Trainer("ppo", "CartPole-v1", config)
    pretrain_s = 0.0
    try:
        while True:
            result = trainer.train()
            if result.get("phase") == "pretrain":
                pretrain_s += result["time_this_iter_s"]
                continue
            if result["episode_reward_mean"] >= TARGET or result["timesteps_total"] >= max_steps:
                break
    finally:
        trainer.stop()
    return {
        "reached": result["episode_reward_mean"] >= TARGET,
        "env_steps": result["timesteps_total"],
        "wall_s": round(time.perf_counter() - started, 2),
        "pretrain_s": round(pretrain_s, 2),
    }


def part_pretrain(args: argparse.Namespace) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="flowrl-offline-"))
    data = record_expert(root)
    trials: dict[str, list[dict[str, Any]]] = {"scratch": [], "pretrained": []}
    for seed in args.seeds:
        base = {**tuned_ppo(), "seed": seed}
        pretrain = {"algo": "bc", "input": str(data), "iterations": args.pretrain_iterations}
        for kind, config in (("scratch", base), ("pretrained", {**base, "pretrain": pretrain})):
            trial = {"seed": seed, **steps_to_target(config, args.max_steps)}
            trials[kind].append(trial)
            print(kind, trial, flush=True)
    medians = {
        kind: statistics.median(t["env_steps"] if t["reached"] else float("inf") for t in runs)
        for kind, runs in trials.items()
    }
    return {
        "trials": trials,
        "median_env_steps": medians,
        "ratio": medians["pretrained"] / medians["scratch"],
        "expert_rows": OfflineData(data).num_rows,
        "pretrain_iterations": args.pretrain_iterations,
    }


class MemorySampler(threading.Thread):
    """Samples the memory of this process and of Ray's worker processes every ``period`` seconds: RSS, which
    counts the object store's shared pages once in every process that maps them, and PSS, which splits them
    among those processes (so that the processes' PSS add up to what they hold together)."""

    def __init__(self, period: float = 0.2) -> None:
        super().__init__(daemon=True)
        self.period = period
        self.peaks = {"driver_rss": 0, "driver_pss": 0, "workers_rss": 0, "workers_pss": 0, "total_pss": 0}
        self._done = threading.Event()

    def run(self) -> None:
        me = psutil.Process()
        while not self._done.is_set():
            mine = me.memory_full_info()
            rss = pss = 0
            for process in psutil.process_iter(["cmdline"]):
                if " ".join(process.info["cmdline"] or []).startswith("ray::"):
                    try:
                        info = process.memory_full_info()
                    except psutil.Error:
                        continue  # it ended
                    rss, pss = rss + info.rss, pss + info.pss
            now = {
                "driver_rss": mine.rss,
                "driver_pss": mine.pss,
                "workers_rss": rss,
                "workers_pss": pss,
                "total_pss": mine.pss + pss,
            }
            self.peaks = {key: max(value, now[key]) for key, value in self.peaks.items()}
            time.sleep(self.period)

    def stop(self) -> None:
        self._done.set()
        self.join()


def write_large_dataset(root: Path, expert: Path, gigabytes: float) -> Path:
    """The expert's rows, repeated with jittered observations, until the files hold ``gigabytes`` GB."""
    rows = next(OfflineData(expert).iter_batches(1_000_000))
    out = root / "large"
    writer = ExperienceWriter(out)  # output's default file size
    rng = np.random.default_rng(0)
    written, copy = 0, 0
    while written < gigabytes * 1e9:
        batch = dict(rows)
        noise = rng.normal(0, 1e-3, size=rows["obs"].shape).astype(np.float32)
        batch["obs"] = rows["obs"] + noise
        batch["new_obs"] = rows["new_obs"] + noise
        batch["eps_id"] = rows["eps_id"] + copy * 1_000_000
        writer.write(batch)
        copy += 1
        written = sum(p.stat().st_size for p in out.glob("*.parquet*"))
    writer.close()
    return out


def part_streaming(args: argparse.Namespace) -> dict[str, Any]:
    import ray

    root = Path(tempfile.mkdtemp(prefix="flowrl-offline-"))
    expert = record_expert(root, episodes=20)
    started = time.perf_counter()
    large = write_large_dataset(root, expert, args.gigabytes)
    data = OfflineData(large)
    written_s = time.perf_counter() - started
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    sampler = MemorySampler()
    sampler.start()
    config = {"input": str(large), "seed": 0, "evaluation_interval": None, "profile": True, "input_reader": args.reader}
    trainer = Trainer("bc", "CartPole-v1", {**config, "timesteps_per_iteration": args.rows_per_iteration})
    passes = args.iterations or -(-data.num_rows // args.rows_per_iteration)  # default: one pass over the data
    iterations = []
    try:
        for _ in range(passes):
            result = trainer.train()
            read = next(v for k, v in result["plan"]["operators"].items() if "ReadOffline" in k)
            done = sum(i["rows"] for i in iterations)
            iterations.append(
                {
                    "time_s": round(result["time_this_iter_s"], 3),
                    "rows": result["timesteps_total"] - done,
                    "waiting_share": read["share"],
                    "read_s": read["time_s"],
                    "offline_timers_ms": {k: v for k, v in result["timers"].items() if k.startswith("offline_")},
                }
            )
            print(iterations[-1], flush=True)
    finally:
        trainer.stop()
        sampler.stop()
        ray.shutdown()
    gb = 1e9
    steady = iterations[1:] or iterations  # the first iteration starts the Ray Data read
    return {
        "dataset_bytes": sum(p.stat().st_size for p in data.files),
        "dataset_rows": data.num_rows,
        "decoded_bytes": data.decoded_bytes,
        "write_s": round(written_s, 1),
        "iterations": iterations,
        "median_waiting_share": statistics.median(i["waiting_share"] for i in steady),
        **{f"{key}_peak_gb": round(value / gb, 3) for key, value in sampler.peaks.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=["pretrain", "streaming"], required=True)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--pretrain-iterations", type=int, default=3)
    parser.add_argument("--max-steps", type=int, default=300_000)
    parser.add_argument("--gigabytes", type=float, default=2.0)
    parser.add_argument("--iterations", type=int, help="bc iterations (default: as many as one pass takes)")
    parser.add_argument("--rows-per-iteration", type=int, default=1_000_000)
    parser.add_argument("--reader", choices=["arrow", "ray_data"], default="arrow", help="input_reader (streaming)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    load = os.getloadavg()[0]
    figures = part_pretrain(args) if args.part == "pretrain" else part_streaming(args)
    report = {
        "part": args.part,
        "reader": args.reader,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "load_1min": {"start": round(load, 2), "end": round(os.getloadavg()[0], 2)},
        **figures,
    }
    suffix = f"_{args.reader}" if args.part == "streaming" else ""
    out = args.out or RESULTS / f"offline_{args.part}{suffix}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2, default=str))
    print(json.dumps({k: v for k, v in report.items() if k not in ("trials", "iterations")}, indent=2, default=str))
    print(f"written to {out}")


if __name__ == "__main__":
    main()
