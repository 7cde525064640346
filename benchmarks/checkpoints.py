"""Benchmark what a checkpoint costs: the time to save and restore one, its size, and ``load_policy``.

For each setup a Trainer trains a few iterations; then, alternating, ``trainer.save`` (the state
of the driver and of every remote worker, its envs mid-episode included, written crash-safely
with checksums), ``trainer.restore`` of that checkpoint into the same trainer (with its checks
first), and ``flowrl.load_policy`` (no Ray, no pickle). Medians over ``--reps`` rounds; sizes
are the files on disk.

Setups: PPO on CartPole-v1 with 2 remote rollout workers; DQN on CartPole-v1 sampling in the
driver after ``--dqn-steps`` env steps, with the replay buffer's contents in the checkpoint (the
default) and without (``store_buffer_in_checkpoints: false``).

Run from the repository root::

    python benchmarks/checkpoints.py              # about a minute
    python benchmarks/checkpoints.py --quick      # a smoke test
    python benchmarks/checkpoints.py --out /tmp/checkpoints.json

It prints a table and writes the figures as JSON to ``--out`` (default
``benchmarks/results/checkpoints.json``).

``--replay`` measures large replay buffers instead: a DQN trainer's local buffer and an Ape-X trainer's
one shard, each filled directly with ``--replay-gib`` GiB (default 1) of Atari-sized rows
(``uint8[84, 84, 4]``). For each, the save's time, MB/s and the peak growth of the resident memory of
the driver and of the shard process (sampled every 10 ms), then the restore's (``Trainer.from_checkpoint``:
time, the driver's peak growth, the restored shard's resident memory). Each is measured with the rows
streamed to their own files (how ``Trainer.save`` writes them) and, unless ``--skip-old``, the way
saves wrote them before: copied into the state and pickled whole into ``state.pkl``. Written to
``benchmarks/results/checkpoints-replay.json`` unless ``--out`` says otherwise::

    python benchmarks/checkpoints.py --replay                  # about two minutes, 6 GiB of memory at most
    python benchmarks/checkpoints.py --replay --replay-gib 0.25 --skip-old
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import ray

import flowrl
from flowrl import Trainer
from flowrl.data import DEFAULT_POLICY_ID, SampleBatch
from flowrl.storage.checkpoints import write_checkpoint

GIB = 1 << 30
OBS_SHAPE = (84, 84, 4)
ROW_BYTES = int(np.prod(OBS_SHAPE)) + 8  # obs and t (int64)


def directory_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def measure(name: str, algo: str, config: dict[str, Any], iterations: int, reps: int) -> dict[str, Any]:
    save_s, restore_s, load_s = [], [], []
    with Trainer(algo, "CartPole-v1", config) as trainer, tempfile.TemporaryDirectory() as tmp:
        for _ in range(iterations):
            result = trainer.train()
        for rep in range(reps):
            start = time.perf_counter()
            path = Path(trainer.save(Path(tmp) / str(rep)))
            save_s.append(time.perf_counter() - start)
            start = time.perf_counter()
            trainer.restore(path)
            restore_s.append(time.perf_counter() - start)
            start = time.perf_counter()
            flowrl.load_policy(path)
            load_s.append(time.perf_counter() - start)
        files = {f.name: f.stat().st_size for f in path.iterdir()}
        return {
            "setup": name,
            "timesteps_total": result["timesteps_total"],
            "save_s": statistics.median(save_s),
            "restore_s": statistics.median(restore_s),
            "load_policy_s": statistics.median(load_s),
            "checkpoint_bytes": directory_bytes(path),
            "files": files,
        }


class PeakRss:
    """The largest growth of each process's resident memory while the block runs (sampled every 10 ms)."""

    def __init__(self, pids: Sequence[int]) -> None:
        self.processes = [psutil.Process(pid) for pid in pids]
        self.growth = [0] * len(pids)
        self._stop = threading.Event()

    def _sample(self, baseline: list[int]) -> None:
        while not self._stop.wait(0.01):
            for i, process in enumerate(self.processes):
                self.growth[i] = max(self.growth[i], process.memory_info().rss - baseline[i])

    def __enter__(self) -> PeakRss:
        baseline = [process.memory_info().rss for process in self.processes]
        self._thread = threading.Thread(target=self._sample, args=(baseline,), daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def atari_batches(rows: int, size: int = 2048) -> Any:
    for start in range(0, rows, size):
        index = np.arange(start, min(start + size, rows))
        obs = np.broadcast_to((index % 251).astype(np.uint8)[:, None, None, None], (len(index), *OBS_SHAPE))
        yield SampleBatch(obs=obs, t=index)


def measure_replay(algo: str, gib: float, streamed: bool, directory: Path) -> dict[str, Any]:
    """One save and one restore of a trainer whose replay buffer (DQN) or one shard (Ape-X) holds ``gib`` GiB."""
    rows = int(gib * GIB) // ROW_BYTES
    config: dict[str, Any] = {"buffer_size": rows, "learning_starts": 1, "store_buffer_in_checkpoints": True, "seed": 0}
    if algo == "apex":
        config.update(num_workers=1, num_cpus_per_worker=0.25, num_replay_shards=1, rollout_fragment_length=20)
    else:
        config.update(num_workers=0)
    driver = psutil.Process().pid
    with Trainer(algo, "CartPole-v1", config) as trainer:
        if algo == "apex":
            [shard] = trainer.resources.need_replay_actors()
            for batch in atari_batches(rows):
                ray.get(shard.add_batch.remote(batch), timeout=60)
            pids = [driver, ray.get(shard.pid.remote(), timeout=60)]
        else:
            buffer = trainer.resources.need_replay_buffer()
            for batch in atari_batches(rows):
                buffer.add_batch(batch)
            pids = [driver]
        start = time.perf_counter()
        with PeakRss(pids) as save:
            if streamed:
                path = Path(trainer.save(directory))
            else:  # how a save wrote replay rows before: copied into the state, pickled whole with it
                path = write_checkpoint(directory / "checkpoint_000000", trainer.get_state(), {"algo": algo})
        save_s = time.perf_counter() - start
    size = directory_bytes(path)
    start = time.perf_counter()
    with PeakRss([driver]) as restore, Trainer.from_checkpoint(path) as restored:
        restore_s = time.perf_counter() - start
        if algo == "apex":
            [shard] = restored.resources.need_replay_actors()
            shard_rss = psutil.Process(ray.get(shard.pid.remote(), timeout=60)).memory_info().rss
            entries = ray.get(shard.stats.remote(), timeout=60)["policies"][DEFAULT_POLICY_ID]["num_entries"]
        else:
            shard_rss = None
            entries = len(restored.resources.need_replay_buffer().buffers[DEFAULT_POLICY_ID])
    shutil.rmtree(path)
    assert entries == rows, f"restored {entries} rows of {rows}"
    return {
        "setup": f"{algo}, {'streamed' if streamed else 'pickled (before)'}",
        "replay_bytes": rows * ROW_BYTES,
        "checkpoint_bytes": size,
        "save_s": save_s,
        "save_mb_per_s": rows * ROW_BYTES / 1e6 / save_s,
        "save_driver_peak_growth_gib": save.growth[0] / GIB,
        "save_shard_peak_growth_gib": save.growth[1] / GIB if len(save.growth) > 1 else None,
        "restore_s": restore_s,
        "restore_mb_per_s": rows * ROW_BYTES / 1e6 / restore_s,
        "restore_driver_peak_growth_gib": restore.growth[0] / GIB,
        "restored_shard_rss_gib": None if shard_rss is None else shard_rss / GIB,
    }


def replay_main(args: argparse.Namespace) -> None:
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
    rows = []
    try:
        with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
            for algo in ("dqn", "apex"):
                for streamed in (True,) if args.skip_old else (True, False):
                    rows.append(measure_replay(algo, args.replay_gib, streamed, Path(tmp)))
    finally:
        ray.shutdown()
    header = ("setup", "GiB", "save s", "MB/s", "driver+", "shard+", "restore s", "driver+")
    print(" ".join(f"{name:<26}" if i == 0 else f"{name:>{max(len(name), 7)}}" for i, name in enumerate(header)))
    for row in rows:
        shard = row["save_shard_peak_growth_gib"]
        print(
            f"{row['setup']:<26} {row['replay_bytes'] / GIB:>5.2f} {row['save_s']:>7.2f} {row['save_mb_per_s']:>6.0f} "
            f"{row['save_driver_peak_growth_gib']:>7.2f}G {'' if shard is None else f'{shard:.2f}G':>7} "
            f"{row['restore_s']:>9.2f} {row['restore_driver_peak_growth_gib']:>7.2f}G"
        )
    out = args.out or Path("benchmarks/results/checkpoints-replay.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps({"machine": platform.platform(), "cpus": psutil.cpu_count(), "results": rows}, indent=2) + "\n"
    )
    print(f"wrote {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=5, help="save/restore rounds per setup (default 5)")
    parser.add_argument("--dqn-steps", type=int, default=20_000, help="env steps DQN samples first (default 20000)")
    parser.add_argument("--quick", action="store_true", help="a smoke test: 2 rounds, 2000 DQN steps")
    parser.add_argument(
        "--out", type=Path, default=None, help="the JSON file written (default under benchmarks/results/)"
    )
    parser.add_argument("--replay", action="store_true", help="measure saves and restores of large replay buffers")
    parser.add_argument("--replay-gib", type=float, default=1.0, help="GiB of rows in each replay buffer (default 1)")
    parser.add_argument("--skip-old", action="store_true", help="with --replay: leave out the pickled way")
    parser.add_argument("--tmp", type=Path, default=None, help="where the checkpoints are written (default: $TMPDIR)")
    args = parser.parse_args()
    if args.replay:
        replay_main(args)
        return
    args.out = args.out or Path("benchmarks/results/checkpoints.json")
    reps, dqn_steps = (2, 2_000) if args.quick else (args.reps, args.dqn_steps)
    dqn = {"num_workers": 0, "seed": 0, "learning_starts": 1000, "timesteps_per_iteration": 1000}
    setups = [
        (
            "ppo, 2 remote workers",
            "ppo",
            {"num_workers": 2, "num_cpus_per_worker": 0.5, "train_batch_size": 2000, "seed": 0},
            3,
        ),
        (f"dqn, {dqn_steps} steps, replay saved", "dqn", dqn, dqn_steps // 1000),
        (
            f"dqn, {dqn_steps} steps, replay not saved",
            "dqn",
            {**dqn, "store_buffer_in_checkpoints": False},
            dqn_steps // 1000,
        ),
    ]
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
    try:
        rows = [measure(name, algo, config, iterations, reps) for name, algo, config, iterations in setups]
    finally:
        ray.shutdown()
    print(f"{'setup':<36} {'steps':>7} {'save s':>8} {'restore s':>10} {'load_policy s':>14} {'size':>10}")
    for row in rows:
        print(
            f"{row['setup']:<36} {row['timesteps_total']:>7} {row['save_s']:>8.3f} {row['restore_s']:>10.3f} "
            f"{row['load_policy_s']:>14.3f} {row['checkpoint_bytes'] / 1e6:>8.2f}MB"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"machine": platform.platform(), "reps": reps, "results": rows}, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
