"""Benchmark flowrl on Atari: Pong frames per second from the emulator through the CNN to the learner.

Every figure counts emulator frames: one env step is ``frame_skip`` = 4 frames. All envs are
``PongNoFrameskip-v4`` with flowrl's DQN-style preprocessing (:func:`flowrl.envs.make_atari_env`:
frame skip 4 max-pooled over the last two frames, 84x84 grayscale, a stack of 4, no-op and
FIRE resets, episodic life, clipped rewards), acting with random actions or the Nature CNN.

1. Raw: one env stepped with random actions in this process, per wall second and per CPU
   second of this thread: this machine's ceiling for one core running Pong and its preprocessing.
2. One rollout worker in this process (IMPALA's CNN actor-critic, one PyTorch thread as in a
   remote worker, 8 envs, the tuned example's fragments of 20, LZ4 on its observations): frames
   sampled per wall and per CPU second, CNN inference included, against (1).
3. The learners alone, in this process on CPU (one PyTorch thread, the runs' learner_threads):
   IMPALA's V-trace update on the tuned example's batch (32 fragments of 20 steps) and
   Ape-X's double-dueling DQN update on a prioritized replayed batch of 512: frames trained
   per second.
4. IMPALA and Ape-X through the Trainer with 1 and then 2 rollout workers (one Ray CPU each,
   8 envs each; Ray started here with 2 CPUs, the learner in the driver): the tuned examples
   (``tuned_examples/pong-impala.yaml``, ``pong-apex.yaml``) shrunk to this machine (workers,
   replay buffer, learning starts), trained for a warm-up, then for ``--seconds``: frames
   sampled and trained per second, and sampled per worker against (1).
5. LZ4 (:mod:`flowrl.data.compression`) on the observation columns the worker of (2) sampled
   (``[160, 4, 84, 84]`` uint8 each, as ``compress_observations`` compresses them): ratio
   and MB (10**6 bytes of raw frames) per CPU second of one thread, compress and decompress.

The 1-minute load average before each section is saved with the figures: on a shared machine
it says how far they are from what an idle one gives. Run from the repository root::

    python benchmarks/atari.py                 # about six minutes
    python benchmarks/atari.py --quick         # a smoke test (~2 minutes)
    python benchmarks/atari.py --seconds 30 --out /tmp/atari.json

It prints a table and writes the figures as JSON to ``--out`` (default ``benchmarks/results/atari.json``).
Needs the atari extra (``pip install 'flowrl-ray[atari]'``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import ray
import torch
import yaml
from sampling import lz4_speed  # benchmarks/ is on the path
from throughput import steady_rates

from flowrl import Trainer
from flowrl.actors import RolloutWorker
from flowrl.actors.learner_thread import learn_on_local_worker
from flowrl.algorithms import get_algorithm
from flowrl.data import LocalReplayBuffer, SampleBatch, concat_samples
from flowrl.data.compression import CompressedColumn, decompress_array
from flowrl.engine.build import policy_specs
from flowrl.envs import get_env_creator, make_atari_env

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "atari.json"
ENV_ID = "PongNoFrameskip-v4"
FRAME_SKIP = 4
NUM_ENVS = 8
med = statistics.median


def tuned_config(algo: str) -> dict[str, Any]:
    """The Pong tuned example's config keys."""
    return dict(yaml.safe_load((ROOT / "tuned_examples" / f"pong-{algo}.yaml").read_text())["config"])


def run_config(algo: str, num_workers: int) -> dict[str, Any]:
    """The tuned example shrunk to this machine: ``num_workers`` workers of one CPU with 8 envs, a CPU learner."""
    config = {
        **tuned_config(algo),
        "num_workers": num_workers,
        "num_envs_per_worker": NUM_ENVS,
        "num_cpus_per_worker": 1,
        "num_gpus": 0,
        "learner_threads": 1,
        "timesteps_per_iteration": 1000,
        "seed": 0,
    }
    if algo == "apex":  # one replay shard on the driver's CPUs, a buffer of ~1 GB, learning from 2,000 steps on
        config.update(
            {
                "num_replay_shards": 1,
                "num_cpus_per_replay_shard": 0,
                "num_cpus_for_driver": 0,
                "buffer_size": 20_000,
                "learning_starts": 2_000,
                "target_network_update_freq": 50_000,
            }
        )
    return config


def local_worker(algo: str) -> RolloutWorker:
    """A rollout worker in this process with the algorithm's policy and the tuned example's sampling keys."""
    config = get_algorithm(algo).config_class.from_dict({**run_config(algo, 1), "num_workers": 1}).frozen()
    creator = get_env_creator(ENV_ID)
    return RolloutWorker(
        env_creator=creator,
        policy_specs=policy_specs(get_algorithm(algo), config, creator),
        config=config,
        worker_index=1,
    )


# -- 1. the raw env ----------------------------------------------------------------------------------


def raw_frames(seconds: float, reps: int) -> dict[str, Any]:
    """Frames per wall and per CPU second of one env stepped with random actions, ``reps`` windows of ``seconds``."""
    env = make_atari_env(ENV_ID)
    env.reset(seed=0)
    env.action_space.seed(0)
    wall, cpu = [], []
    for _ in range(reps + 1):  # the first window warms up
        steps, start, cpu0 = 0, time.perf_counter(), time.thread_time()
        while time.perf_counter() - start < seconds:
            *_, terminated, truncated, _ = env.step(env.action_space.sample())
            steps += 1
            if terminated or truncated:
                env.reset()
        wall.append(steps * FRAME_SKIP / (time.perf_counter() - start))
        cpu.append(steps * FRAME_SKIP / (time.thread_time() - cpu0))
    env.close()
    return {"frames_per_s": med(wall[1:]), "frames_per_cpu_s": med(cpu[1:]), "reps_frames_per_s": wall[1:]}


# -- 2. one rollout worker with its CNN ----------------------------------------------------------------


def worker_frames(seconds: float, reps: int, raw: dict[str, Any]) -> tuple[dict[str, Any], list[np.ndarray]]:
    """IMPALA's worker sampling in this process; also returns the observation columns it sampled (for LZ4)."""
    worker = local_worker("impala")
    worker.sample()
    wall, cpu = [], []
    packed = []
    for _ in range(reps):
        steps, start, cpu0 = 0, time.perf_counter(), time.thread_time()
        while time.perf_counter() - start < seconds:
            batch = worker.sample()
            steps += batch.count
            packed.append(batch[SampleBatch.OBS])
        wall.append(steps * FRAME_SKIP / (time.perf_counter() - start))
        cpu.append(steps * FRAME_SKIP / (time.thread_time() - cpu0))
    worker.stop()
    report = {
        "setup": f"IMPALA's policy (Nature CNN, vf_share_layers), {NUM_ENVS} envs, fragments of "
        f"{worker.config.rollout_fragment_length}, compress_observations "
        f"{worker.config.compress_observations}, torch threads {torch.get_num_threads()}",
        "frames_per_s": med(wall),
        "frames_per_cpu_s": med(cpu),
        "over_raw": med(wall) / raw["frames_per_s"],
        "over_raw_per_cpu_s": med(cpu) / raw["frames_per_cpu_s"],
        "reps_frames_per_s": wall,
    }
    columns = [decompress_array(c) if isinstance(c, CompressedColumn) else c for c in packed]
    return report, columns


# -- 3. the learners alone -----------------------------------------------------------------------------


def learner_frames(algo: str, seconds: float) -> dict[str, Any]:
    """Frames trained per second by the algorithm's learning step alone, on a batch sampled here."""
    worker = local_worker(algo)
    config = worker.config
    batches = []
    while sum(b.count for b in batches) < max(config.train_batch_size, 2000):
        batches.append(worker.sample())
    if algo == "apex":
        buffer = LocalReplayBuffer(
            20_000,
            0,
            config.train_batch_size,
            config.prioritized_replay_alpha,
            config.prioritized_replay_beta,
            config.prioritized_replay_eps,
        )
        for b in batches:
            buffer.add_batch(b)
        batch = buffer.replay()
        assert batch is not None
    else:
        batch = concat_samples(batches).slice(0, config.train_batch_size)
    learn_on_local_worker(worker, batch)  # warm-up
    updates, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        learn_on_local_worker(worker, batch)
        updates += 1
    wall = time.perf_counter() - start
    worker.stop()
    return {
        "batch_steps": batch.count,
        "updates": updates,
        "s_per_update": wall / updates,
        "frames_trained_per_s": updates * batch.count * FRAME_SKIP / wall,
    }


# -- 4. IMPALA and Ape-X through the Trainer -------------------------------------------------------------


def trainer_frames(algo: str, num_workers: int, warmup_s: float, seconds: float) -> dict[str, Any]:
    """Frames sampled and trained per second over ``seconds`` after ``warmup_s`` (and, for Ape-X, learning started)."""
    load = os.getloadavg()[0]
    trainer = Trainer(algo, ENV_ID, run_config(algo, num_workers))
    try:
        rates = steady_rates(trainer, seconds, warmup_s, until_trained=True)
    finally:
        trainer.stop()
    sampled = rates["sampled_per_s"] * FRAME_SKIP
    return {
        "frames_sampled_per_s": sampled,
        "frames_trained_per_s": rates["trained_per_s"] * FRAME_SKIP,
        "frames_sampled_per_s_per_worker": sampled / num_workers,
        "window_s": rates["wall_s"],
        "load_avg_1m_before": load,
    }


# -- 5. LZ4 on the sampled frame stacks ----------------------------------------------------------------------


# -- report ------------------------------------------------------------------------------------------------------


def print_report(report: dict[str, Any]) -> None:
    raw, worker, learner, runs, lz = (report[k] for k in ("raw", "worker", "learner", "runs", "lz4"))
    load = report["machine"]["load_avg_1m"]
    print(
        f"\nPong ({ENV_ID}, DQN preprocessing), emulator frames per second; machine: {report['machine']['cpu_count']}"
        f" CPUs, 1-min load before each section: " + ", ".join(f"{k} {v:.1f}" for k, v in load.items())
    )
    print(f"\n{'what':<58}{'frames/s':>12}{'per CPU s':>12}")
    print(f"{'1. raw env, random actions (one core)':<58}{raw['frames_per_s']:>12.0f}{raw['frames_per_cpu_s']:>12.0f}")
    print(
        f"{'2. one rollout worker in-process, CNN inference included':<58}{worker['frames_per_s']:>12.0f}"
        f"{worker['frames_per_cpu_s']:>12.0f}"
    )
    print(f"{'   worker / raw':<58}{worker['over_raw']:>12.2f}{worker['over_raw_per_cpu_s']:>12.2f}")
    for algo, figures in learner.items():
        label = f"3. {algo} learner alone, batch of {figures['batch_steps']} ({figures['s_per_update']:.2f} s/update)"
        print(f"{label:<58}{figures['frames_trained_per_s']:>12.0f}")
    print(
        f"\n4. through the Trainer{'':<26}{'workers':>8}{'sampled/s':>12}"
        f"{'trained/s':>12}{'per worker':>12}{'/ raw':>8}"
    )
    for key, figures in runs.items():
        algo, workers = key.split("/")
        per_worker = figures["frames_sampled_per_s_per_worker"]
        print(
            f"   {algo:<44}{workers:>8}{figures['frames_sampled_per_s']:>12.0f}{figures['frames_trained_per_s']:>12.0f}"
            f"{per_worker:>12.0f}{per_worker / raw['frames_per_s']:>8.2f}"
        )
    print(
        f"\n5. LZ4 on {lz['columns']} sampled observation columns {lz['column_shape']} uint8, one thread:"
        f" ratio {lz['ratio']:.1f}, compress {lz['compress_mb_per_cpu_s']:.0f} MB/s,"
        f" decompress {lz['decompress_mb_per_cpu_s']:.0f} MB/s (per CPU s)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=20.0, help="measured window of each Trainer run")
    parser.add_argument("--reps", type=int, default=3, help="windows per in-process figure (medians are reported)")
    parser.add_argument("--quick", action="store_true", help="short windows: a smoke test")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where to write the JSON figures")
    args = parser.parse_args()
    seconds, reps, window = (5.0, 2, 1.0) if args.quick else (args.seconds, args.reps, 3.0)
    torch.set_num_threads(1)  # as a rollout worker and the runs' learner (learner_threads: 1)
    load: dict[str, float] = {}
    report: dict[str, Any] = {
        "machine": {
            "cpu_count": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "torch": torch.__version__,
            "ray": ray.__version__,
            "load_avg_1m": load,
        },
        "settings": {
            "env": ENV_ID,
            "frame_skip": FRAME_SKIP,
            "num_envs_per_worker": NUM_ENVS,
            "seconds": seconds,
            "reps": reps,
            "window_s": window,
        },
    }
    load["raw"] = os.getloadavg()[0]
    report["raw"] = raw_frames(window, reps)
    load["worker"] = os.getloadavg()[0]
    report["worker"], columns = worker_frames(window, reps, report["raw"])
    load["learner"] = os.getloadavg()[0]
    report["learner"] = {algo: learner_frames(algo, 2 * window) for algo in ("impala", "apex")}
    load["runs"] = os.getloadavg()[0]
    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False)
    try:
        report["runs"] = {}
        for algo in ("impala", "apex"):
            for n in (1, 2):
                report["runs"][f"{algo}/{n}"] = figures = trainer_frames(algo, n, seconds / 2, seconds)
                print(
                    f"  {algo} with {n} worker(s): {figures['frames_sampled_per_s']:.0f} frames sampled/s,"
                    f" {figures['frames_trained_per_s']:.0f} trained/s",
                    flush=True,
                )
    finally:
        ray.shutdown()
    load["lz4"] = os.getloadavg()[0]
    report["lz4"] = lz4_speed(columns, reps)
    print_report(report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nfigures written to {args.out}")


if __name__ == "__main__":
    main()
