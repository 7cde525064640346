"""Benchmark flowrl's sampling: one rollout worker, remote workers over Ray, and LZ4 on Atari frames.

1. Env steps/s of ONE :class:`flowrl.actors.RolloutWorker` in this process (CartPole-v1,
   default MLP actor-critic model, ``num_envs_per_worker=8``, ``rollout_fragment_length=100``,
   GAE postprocessing, ``torch.set_num_threads(1)`` as in a rollout actor) against a raw
   Gymnasium loop on ONE ``gymnasium.make("CartPole-v1")`` env with random actions.
   Repetitions alternate (A B A B ...) after a warm-up; medians and flowrl / raw are
   reported (goal: >= 0.5), also per CPU second of this thread (less moved by other load).
   Beside it: one env step's time split into ``policy.compute_actions``, ``env.step`` and
   the rest, timed in the real sampling loop by wrapping the worker's own policy and envs; a
   ``num_envs_per_worker`` sweep (1, 8, 32); flowrl's cost per ``compute_actions`` call on
   a real 8-env batch on its NumPy path (taken for small MLP policies) and its PyTorch path
   (forced with ``policy._numpy_model = None``); and the top of a cProfile (printed only).

2. Over Ray (started here: 2 CPUs, no dashboard): a :class:`flowrl.actors.WorkerSet` with 2
   remote workers against 1 (one CPU each), pulled through
   ``from_actors(workers.remote_workers()).gather_async(num_async=2)`` for a fixed wall time after a
   warm-up, a fresh WorkerSet per repetition, sizes alternating: env steps/s and 2 / 1
   (goal: >= 1.6). The 1-worker set's local worker also samples here for as long, giving
   1 remote / in-process (Ray's transport cost). Each remote worker's CPU s per wall s
   (read inside it), the driver's, and the 1-min load average before every section are
   saved: on a shared machine they explain noisy figures.

3. LZ4 on 84x84 uint8 frames stacked by 4: real ALE/Pong-v5 frames (``make_atari_env``,
   random actions, channels-last) when ale-py and cv2 import, else SYNTHETIC Pong-like
   frames (walls, paddles, a ball, anti-aliased), as printed and saved. ``compress_array`` /
   ``decompress_array`` of :mod:`flowrl.data.compression` on ``[200, 84, 84, 4]`` columns,
   one thread: ratio and MB (10**6 bytes) of raw data per CPU second of the thread
   (goal: ratio >= 10 at >= 500 MB/s compress).

With ``--envpool``, only this instead (the envpool extra; ``--out`` defaults to
``benchmarks/results/sampling_envpool.json``): one rollout worker in this process with a
remote worker's settings (one PyTorch thread, ``worker_index=1``), its envs stepped by
``env_backend: gymnasium`` against ``envpool`` with 1 and 2 C++ threads (``num_cpus_per_worker``
1 and 2), at 8, 16, 32 and 64 envs per worker, for CartPole-v1 (the default MLP, fragments of
100) and PongNoFrameskip-v4 (the Nature CNN, fragments of 20): env steps per wall second and
per CPU second of the whole process (EnvPool's threads included), backends alternating.

Run from the repository root::

    python benchmarks/sampling.py                  # full run, about two minutes
    python benchmarks/sampling.py --envpool        # EnvPool against Gymnasium envs, about four minutes
    python benchmarks/sampling.py --quick          # smaller sizes, a smoke test (~40 s)
    python benchmarks/sampling.py --reps 7 --out /tmp/sampling.json

It prints tables and writes the figures as JSON to ``--out`` (default
``benchmarks/results/sampling.json``).
"""

from __future__ import annotations

import argparse
import cProfile
import itertools
import json
import logging
import os
import platform
import pstats
import statistics
import time
from pathlib import Path
from typing import Any, Callable

import gymnasium as gym
import lz4
import numpy as np
import ray
import torch

from flowrl.actors import RolloutWorker, WorkerSet
from flowrl.config import TrainerConfig
from flowrl.data import DEFAULT_POLICY_ID, SampleBatch
from flowrl.data.compression import compress_array, decompress_array
from flowrl.envs import get_env_creator
from flowrl.iterators import from_actors
from flowrl.policy import PolicySpec, TorchPolicy, bootstrap_value, compute_advantages

ENV_ID = "CartPole-v1"
NUM_ENVS = 8
# Two requests in flight per worker: the next fragment is already queued when one is returned,
# so a worker does not sit idle for the driver's round trip (what async plans configure).
NUM_ASYNC = 2
FRAGMENT_LENGTH = 100
RAW_GOAL = 0.5
SCALING_GOAL = 1.6
LZ4_RATIO_GOAL = 10.0
LZ4_MBPS_GOAL = 500.0
ATARI_ID = "ALE/Pong-v5"
COLUMN_ROWS = 200
LZ4_REP_CPU_S = 0.1
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "sampling.json"
med = statistics.median


# -- the policy and workers under test ---------------------------------------------------


def bc_loss(policy: TorchPolicy, model: torch.nn.Module, dist_class: Any, batch: dict[str, torch.Tensor]) -> Any:
    """A behaviour-cloning loss: sampling never calls it, but a TorchPolicy needs one."""
    logits, _ = model(batch[SampleBatch.OBS])
    return -dist_class(logits).logp(batch[SampleBatch.ACTIONS]).mean(), {}


def gae(policy: TorchPolicy, batch: SampleBatch) -> SampleBatch:
    """GAE postprocessing, bootstrapped from the value head, as PPO/A2C use it."""
    return compute_advantages(batch, bootstrap_value(batch, policy.value), gamma=0.99, lambda_=0.95)


def worker_args(num_envs: int = NUM_ENVS) -> dict[str, Any]:
    """RolloutWorker / WorkerSet arguments: the default-model TorchPolicy, vectorised envs, truncated fragments."""
    env = gym.make(ENV_ID)
    spec = PolicySpec(
        TorchPolicy,
        env.observation_space,
        env.action_space,
        TrainerConfig(),
        {"loss_fn": bc_loss, "postprocess_fn": gae},
    )
    return {
        "env_creator": get_env_creator(ENV_ID),
        "policy_specs": {DEFAULT_POLICY_ID: spec},
        "config": {"seed": 0, "num_envs_per_worker": num_envs, "rollout_fragment_length": FRAGMENT_LENGTH},
    }


def worker_samples(worker: RolloutWorker, n: int) -> tuple[int, float]:
    """``n`` calls of ``worker.sample()``; returns (env steps, wall seconds)."""
    steps = 0
    start = time.perf_counter()
    for _ in range(n):
        steps += worker.sample().count
    return steps, time.perf_counter() - start


def sample_for(worker: RolloutWorker, seconds: float) -> tuple[float, float]:
    """Two warm-up ``sample()`` calls, then ~``seconds`` of them: env steps per wall s and per CPU s of this thread."""
    worker_samples(worker, 2)
    steps, start, cpu0 = 0, time.perf_counter(), time.thread_time()
    while time.perf_counter() - start < seconds:
        steps += worker.sample().count
    return steps / (time.perf_counter() - start), steps / (time.thread_time() - cpu0)


# -- 1. one worker in-process against a raw Gymnasium loop ----------------------------------


def raw_gym_steps(env: gym.Env, n: int) -> float:
    """``n`` random-action steps of one env, resetting at episode end; returns wall seconds."""
    space = env.action_space
    start = time.perf_counter()
    for _ in range(n):
        _, _, terminated, truncated, _ = env.step(space.sample())
        if terminated or truncated:
            env.reset()
    return time.perf_counter() - start


def run_in_process(reps: int, rep_seconds: float) -> dict[str, Any]:
    """Warm both up, size each repetition to ``rep_seconds``, then alternate flowrl and raw."""
    worker = RolloutWorker(**worker_args())
    env = gym.make(ENV_ID)
    env.reset(seed=0)
    env.action_space.seed(0)
    steps, seconds = worker_samples(worker, 3)
    raw_gym_steps(env, 2000)
    raw_n = max(1000, int(5000 / raw_gym_steps(env, 5000) * rep_seconds))
    samples = max(1, round(rep_seconds / (seconds / 3)))
    wall: dict[str, list[float]] = {"flowrl": [], "raw": []}
    cpu: dict[str, list[float]] = {"flowrl": [], "raw": []}
    for _ in range(reps):
        cpu0 = time.thread_time()
        n, s = worker_samples(worker, samples)
        cpu["flowrl"].append(n / (time.thread_time() - cpu0))
        wall["flowrl"].append(n / s)
        cpu0 = time.thread_time()
        wall["raw"].append(raw_n / raw_gym_steps(env, raw_n))
        cpu["raw"].append(raw_n / (time.thread_time() - cpu0))
    numpy_path = worker.get_policy()._numpy_twin() is not None
    worker.stop()
    env.close()
    ratio = med(wall["flowrl"]) / med(wall["raw"])
    return {
        "setup": f"{ENV_ID}, {NUM_ENVS} envs, fragment {FRAGMENT_LENGTH} ({steps // 3} steps/sample), default model"
        f" (64x64 tanh MLPs), GAE, torch threads {torch.get_num_threads()}",
        "acting_path": "numpy" if numpy_path else "torch",
        "flowrl_steps_per_s": med(wall["flowrl"]),
        "raw_gym_steps_per_s": med(wall["raw"]),
        "ratio": ratio,
        "flowrl_steps_per_cpu_s": med(cpu["flowrl"]),
        "raw_gym_steps_per_cpu_s": med(cpu["raw"]),
        "ratio_per_cpu_s": med(cpu["flowrl"]) / med(cpu["raw"]),
        "reps_steps_per_s": wall,
        "goal": f"ratio >= {RAW_GOAL}",
        "met": ratio >= RAW_GOAL,
    }


def timed(fn: Callable[..., Any], acc: list[float]) -> Callable[..., Any]:
    """``fn``, adding its wall seconds to ``acc[0]`` and one to ``acc[1]`` per call."""
    clock = time.perf_counter

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = clock()
        out = fn(*args, **kwargs)
        acc[0] += clock() - start
        acc[1] += 1
        return out

    return wrapper


def time_split(samples: int) -> dict[str, Any]:
    """Microseconds per env step in ``policy.compute_actions``, ``env.step`` and the rest of ``sample()``.

    Timed inside the real sampling loop of a fresh worker whose own policy and envs have
    those methods wrapped (instance attributes; flowrl's code is untouched). The rest is
    everything else: resets, the stepping loop's bookkeeping, cutting trajectory pieces,
    postprocessing and concatenation (the cProfile shows its parts). Timers add a little.
    """
    worker = RolloutWorker(**worker_args())
    worker.sample()
    policy = worker.get_policy()
    w = {"compute_actions": [0.0, 0.0], "env_step": [0.0, 0.0]}  # [seconds, calls]
    policy.compute_actions = timed(policy.compute_actions, w["compute_actions"])  # type: ignore[method-assign]
    for env in worker.envs:
        env.step = timed(env.step, w["env_step"])  # type: ignore[method-assign]
    steps, seconds = worker_samples(worker, samples)
    worker.stop()
    us = {name: sec * 1e6 / steps for name, (sec, _) in w.items()}
    total = seconds * 1e6 / steps
    return {
        "env_steps": steps,
        "us_per_env_step": total,
        "split_us_per_env_step": {
            "policy.compute_actions": us["compute_actions"],
            "env.step": us["env_step"],
            "rest": total - us["compute_actions"] - us["env_step"],
        },
        "us_per_call": {name: sec * 1e6 / max(calls, 1) for name, (sec, calls) in w.items()},
    }


def compute_actions_cost(calls: int, reps: int) -> dict[str, Any]:
    """Microseconds (wall and CPU of this thread) per ``policy.compute_actions`` call on a real ``[8, 4]`` batch.

    The same policy as flowrl runs it (the NumPy twin of its MLP) and forced onto its
    PyTorch path (``policy._numpy_model = None``): ``reps`` blocks of ``calls`` calls per
    path, alternating, after one warm-up block each.
    """
    worker = RolloutWorker(**worker_args())
    policy = worker.get_policy()
    obs = worker.sampler.obs.copy()
    twin = policy._numpy_twin()
    wall: dict[str, list[float]] = {"numpy": [], "torch": []}
    cpu: dict[str, list[float]] = {"numpy": [], "torch": []}
    for rep in range(reps + 1):
        for path, model in (("numpy", twin), ("torch", None)):
            policy._numpy_model = model
            start, cpu0 = time.perf_counter(), time.thread_time()
            for _ in range(calls):
                policy.compute_actions(obs)
            if rep:
                cpu[path].append((time.thread_time() - cpu0) * 1e6 / calls)
                wall[path].append((time.perf_counter() - start) * 1e6 / calls)
    worker.stop()
    return {
        "batch": list(obs.shape),
        "numpy_path_built": twin is not None,
        "us_per_call": {path: med(v) for path, v in wall.items()},
        "torch_over_numpy": med(wall["torch"]) / med(wall["numpy"]),
        "cpu_us_per_call": {path: med(v) for path, v in cpu.items()},
        "torch_over_numpy_cpu": med(cpu["torch"]) / med(cpu["numpy"]),
        "reps_us_per_call": wall,
    }


def num_envs_sweep(counts: list[int], seconds: float) -> dict[str, dict[str, float]]:
    """In-process steps per wall and per CPU second for several ``num_envs_per_worker`` (one measurement each)."""
    out = {}
    for n in counts:
        worker = RolloutWorker(**worker_args(n))
        wall, cpu = sample_for(worker, seconds)
        out[str(n)] = {"steps_per_s": wall, "steps_per_cpu_s": cpu}
        worker.stop()
    return out


def profile_sample(calls: int) -> None:
    """Print the top 15 functions by own time over ``calls`` calls of ``sample()`` (after one warm-up call)."""
    worker = RolloutWorker(**worker_args())
    worker.sample()
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        worker.sample()
    profiler.disable()
    worker.stop()
    print(f"\ncProfile of {calls} RolloutWorker.sample() calls ({calls * NUM_ENVS * FRAGMENT_LENGTH} env steps)")
    pstats.Stats(profiler).strip_dirs().sort_stats("tottime").print_stats(15)


# -- 2. remote workers over Ray --------------------------------------------------------------


def pull_for(it: Any, seconds: float) -> tuple[int, float, float]:
    """Pull batches from ``it`` for ``seconds``; returns (env steps, wall s, driver CPU s)."""
    steps = 0
    cpu0, start = time.process_time(), time.perf_counter()
    while time.perf_counter() - start < seconds:
        steps += next(it).count
    return steps, time.perf_counter() - start, time.process_time() - cpu0


def worker_clock(worker: RolloutWorker) -> tuple[float, float]:
    """Inside a worker: (monotonic wall seconds, this process's CPU seconds)."""
    return time.monotonic(), time.process_time()


def run_remote(reps: int, warmup_s: float, window_s: float) -> dict[str, Any]:
    """Alternate fresh 1- and 2-worker WorkerSets; each warms up, then is pulled for ``window_s``."""
    rate: dict[str, list[float]] = {"1": [], "2": [], "in_process": []}
    worker_cpu: dict[str, list[float]] = {"1": [], "2": []}
    driver_cpu: dict[str, list[float]] = {"1": [], "2": []}
    local_per_cpu_s: list[float] = []
    for _ in range(reps):
        for key in ("1", "2"):
            workers = WorkerSet(**worker_args(), num_workers=int(key), num_cpus_per_worker=1)
            ray.get([w.ping.remote() for w in workers.remote_workers()])
            it = from_actors(workers.remote_workers()).gather_async(num_async=NUM_ASYNC)
            pull_for(it, warmup_s)
            before = workers.foreach_worker(worker_clock, local=False)
            steps, wall, cpu = pull_for(it, window_s)
            after = workers.foreach_worker(worker_clock, local=False)
            rate[key].append(steps / wall)
            driver_cpu[key].append(cpu / wall)
            shares = [(c1 - c0) / (w1 - w0) for (w0, c0), (w1, c1) in zip(before, after, strict=True)]
            worker_cpu[key].append(sum(shares) / len(shares))
            del it  # closes the gather's streams while the actors still live
            if key == "1":  # the remote worker idles now: its next request goes out on the next pull
                wall, cpu = sample_for(workers.local_worker(), window_s)
                rate["in_process"].append(wall)
                local_per_cpu_s.append(cpu)
            workers.stop()
    scaling = med(rate["2"]) / med(rate["1"])
    per_cpu = {k: med(s / (int(k) * c) for s, c in zip(rate[k], worker_cpu[k], strict=True)) for k in ("1", "2")}
    return {
        "setup": (
            "ray.init(num_cpus=2), num_cpus_per_worker=1, "
            f"from_actors(remote_workers()).gather_async(num_async={NUM_ASYNC})"
        ),
        "window_s": window_s,
        "warmup_s": warmup_s,
        "steps_per_s": {k: med(v) for k, v in rate.items()},
        "ratio_two_over_one": scaling,
        "ratio_one_remote_over_in_process": med(rate["1"]) / med(rate["in_process"]),
        "remote_worker_cpu_per_wall": {k: med(v) for k, v in worker_cpu.items()},
        "driver_cpu_per_wall": {k: med(v) for k, v in driver_cpu.items()},
        "steps_per_worker_cpu_s": {**per_cpu, "in_process": med(local_per_cpu_s)},
        "reps_steps_per_s": rate,
        "goal": f"ratio_two_over_one >= {SCALING_GOAL}",
        "met": scaling >= SCALING_GOAL,
    }


# -- 3. LZ4 on Atari frames --------------------------------------------------------------------


def _paint(canvas: np.ndarray, y: float, x: float, h: float, w: float, value: float) -> None:
    """Draw a rectangle at fractional coordinates, blending partly covered pixels (like INTER_AREA)."""
    y0, y1 = max(0, int(np.floor(y))), min(canvas.shape[0], int(np.ceil(y + h)))
    x0, x1 = max(0, int(np.floor(x))), min(canvas.shape[1], int(np.ceil(x + w)))
    if y0 >= y1 or x0 >= x1:
        return
    r, c = np.arange(y0, y1), np.arange(x0, x1)
    cov_y, cov_x = np.minimum(r + 1, y + h) - np.maximum(r, y), np.minimum(c + 1, x + w) - np.maximum(c, x)
    cov = np.outer(np.clip(cov_y, 0, 1), np.clip(cov_x, 0, 1))
    canvas[y0:y1, x0:x1] = canvas[y0:y1, x0:x1] * (1 - cov) + value * cov


def synthetic_frames(n: int, seed: int = 0) -> np.ndarray:
    """``n`` stacked Pong-like frames ``[n, 84, 84, 4]`` (uint8), frame i stacking frames i..i+3.

    Layout and grey levels follow AtariPreprocessing's Pong output: background 87, walls 236
    (with 147/176 edges), two 2x8 paddles following a 2x2 ball (no score digits); objects
    move at fractional speeds so their edges blend as after resizing.
    """
    rng = np.random.default_rng(seed)
    base = np.full((84, 84), 87.0)
    base[9], base[10:13], base[13], base[77], base[78:] = 147, 236, 176, 147, 236
    ball, velocity, paddles = np.array([45.0, 42.0]), np.array([rng.uniform(-1.2, 1.2), 1.6]), np.array([40.0, 40.0])
    singles = np.empty((n + 3, 84, 84), dtype=np.uint8)
    for t in range(n + 3):
        ball += velocity
        for axis, (low, high) in enumerate(((14, 75), (9, 73))):  # bounce off the walls and the goal lines
            if not low <= ball[axis] <= high:
                velocity[axis], ball[axis] = -velocity[axis], np.clip(ball[axis], low, high)
        paddles = np.clip(paddles + np.clip(ball[0] - 4 + rng.normal(0, 2, 2) - paddles, -1.3, 1.3), 14, 69)
        frame = base.copy()
        for y, x, h, w, value in ((paddles[0], 8, 8, 2, 123), (paddles[1], 74, 8, 2, 147), (*ball, 2, 1.3, 236)):
            _paint(frame, y, x, h, w, value)
        singles[t] = np.rint(frame)
    return np.ascontiguousarray(np.lib.stride_tricks.sliding_window_view(singles, 4, axis=0))  # [n, 84, 84, 4]


def real_frames(n: int) -> np.ndarray | None:
    """``n`` stacked ALE/Pong-v5 frames (random actions) as ``[n, 84, 84, 4]``, or None without ale-py and cv2."""
    try:
        import ale_py  # noqa: F401
        import cv2  # noqa: F401
    except ImportError:
        return None
    from flowrl.envs import make_atari_env

    env = make_atari_env(ATARI_ID)
    obs, _ = env.reset(seed=0)
    env.action_space.seed(0)
    frames = np.empty((n, *obs.shape), dtype=np.uint8)
    for i in range(n):
        frames[i], _, terminated, truncated, _ = env.step(env.action_space.sample())
        if terminated or truncated:
            env.reset()
    env.close()
    return np.ascontiguousarray(np.moveaxis(frames, 1, -1))  # [n, 4, 84, 84] -> [n, 84, 84, 4]


def run_lz4(num_frames: int, reps: int) -> dict[str, Any]:
    """Compress and decompress every ``COLUMN_ROWS``-row column, ``reps`` times of ~``LZ4_REP_CPU_S`` CPU s each."""
    frames = real_frames(num_frames)
    synthetic = frames is None
    source = "SYNTHETIC Pong-like frames (ale-py/cv2 not importable)" if synthetic else f"real {ATARI_ID} frames"
    if frames is None:
        frames = synthetic_frames(num_frames)
    columns = [frames[i : i + COLUMN_ROWS] for i in range(0, len(frames) - COLUMN_ROWS + 1, COLUMN_ROWS)]
    speed = lz4_speed(columns, reps)
    return {
        "source": source,
        "frames_are_synthetic": synthetic,
        **speed,
        "goal": f"ratio >= {LZ4_RATIO_GOAL:g} and compress >= {LZ4_MBPS_GOAL:g} MB/s",
        "met": speed["ratio"] >= LZ4_RATIO_GOAL and speed["compress_mb_per_cpu_s"] >= LZ4_MBPS_GOAL,
    }


def lz4_speed(columns: list[np.ndarray], reps: int) -> dict[str, Any]:
    """LZ4's ratio on ``columns`` and its MB per CPU second compressing and decompressing them, one thread:
    medians of ``reps``, each looping over the columns for about ``LZ4_REP_CPU_S`` of CPU (round trip checked)."""
    columns = [np.ascontiguousarray(c) for c in columns]
    raw = sum(c.nbytes for c in columns)
    packed = [compress_array(c) for c in columns]
    if not all(np.array_equal(decompress_array(p), c) for p, c in zip(packed, columns, strict=True)):
        raise AssertionError("LZ4 round trip changed the frames")
    start = time.thread_time()
    for c in columns:
        compress_array(c)
    loops = max(1, round(LZ4_REP_CPU_S / max(time.thread_time() - start, 1e-6)))
    mbps: dict[str, list[float]] = {"compress": [], "decompress": []}
    for _ in range(reps):
        for name, fn, inputs in (("compress", compress_array, columns), ("decompress", decompress_array, packed)):
            start = time.thread_time()
            for _ in range(loops):
                for x in inputs:
                    fn(x)  # type: ignore[operator]
            mbps[name].append(loops * raw / 1e6 / (time.thread_time() - start))
    return {
        "column_shape": list(columns[0].shape),
        "columns": len(columns),
        "raw_mb": raw / 1e6,
        "loops_over_columns_per_rep": loops,
        "ratio": raw / sum(p.nbytes for p in packed),
        "compress_mb_per_cpu_s": med(mbps["compress"]),
        "decompress_mb_per_cpu_s": med(mbps["decompress"]),
        "reps_mb_per_cpu_s": mbps,
    }


# -- 4. (--envpool) EnvPool against Gymnasium envs --------------------------------------------------

ENVPOOL_ENVS = {"CartPole-v1": 100, "PongNoFrameskip-v4": 20}  # env -> rollout_fragment_length
ENVPOOL_COUNTS = (8, 16, 32, 64)
ENVPOOL_BACKENDS = {
    "gymnasium": ("gymnasium", 1.0),
    "envpool 1 thread": ("envpool", 1.0),
    "envpool 2 threads": ("envpool", 2.0),
}
DEFAULT_ENVPOOL_OUT = DEFAULT_OUT.with_name("sampling_envpool.json")


def backend_worker(env_id: str, num_envs: int, backend: str, cpus: float) -> RolloutWorker:
    """A worker with a remote worker's settings (worker_index 1) and the default model, stepping ``backend``'s envs."""
    env = get_env_creator(env_id)({})
    spec = PolicySpec(
        TorchPolicy,
        env.observation_space,
        env.action_space,
        TrainerConfig(),
        {"loss_fn": bc_loss, "postprocess_fn": gae},
    )
    env.close()
    config = {
        "seed": 0,
        "num_envs_per_worker": num_envs,
        "rollout_fragment_length": ENVPOOL_ENVS[env_id],
        "env_backend": backend,
        "num_cpus_per_worker": cpus,
    }
    return RolloutWorker(
        env_creator=get_env_creator(env_id),
        policy_specs={DEFAULT_POLICY_ID: spec},
        config=config,
        worker_index=1,
        num_workers=1,
    )


def run_envpool(seconds: float, reps: int) -> dict[str, Any]:
    """Env steps per wall and per process CPU second of each backend, alternating, for each env and env count."""
    figures: dict[str, Any] = {}
    for env_id in ENVPOOL_ENVS:
        figures[env_id] = {}
        for n in ENVPOOL_COUNTS:
            workers = {name: backend_worker(env_id, n, *args) for name, args in ENVPOOL_BACKENDS.items()}
            wall: dict[str, list[float]] = {name: [] for name in workers}
            cpu: dict[str, list[float]] = {name: [] for name in workers}
            for worker in workers.values():
                worker_samples(worker, 1)
            for _ in range(reps):
                for name, worker in workers.items():
                    steps, start, cpu0 = 0, time.perf_counter(), time.process_time()
                    while time.perf_counter() - start < seconds:
                        steps += worker.sample().count
                    wall[name].append(steps / (time.perf_counter() - start))
                    cpu[name].append(steps / (time.process_time() - cpu0))
            for worker in workers.values():
                worker.stop()
            row = {name: {"steps_per_s": med(wall[name]), "steps_per_cpu_s": med(cpu[name])} for name in workers}
            figures[env_id][str(n)] = row
            print(
                f"  {env_id} x {n}: " + ", ".join(f"{k} {v['steps_per_s']:.0f}/s" for k, v in row.items()), flush=True
            )
    return figures


def print_envpool(report: dict[str, Any]) -> None:
    """Print the ``--envpool`` figures as a table."""
    names = list(ENVPOOL_BACKENDS)
    print(
        f"\nOne worker's env steps per wall s (per process CPU s), by env_backend; 1-min load average before:"
        f" {report['machine']['loadavg']:.2f}"
    )
    print(f"{'env':<20}{'envs':>5}" + "".join(f"{name:>24}" for name in names) + f"{'envpool 1 / gym':>17}")
    for env_id, rows in report["envpool"].items():
        for n, row in rows.items():
            cells = "".join(f"{row[k]['steps_per_s']:>12.0f} ({row[k]['steps_per_cpu_s']:>8.0f})" for k in names)
            ratio = row["envpool 1 thread"]["steps_per_s"] / row["gymnasium"]["steps_per_s"]
            print(f"{env_id:<20}{n:>5}{cells}{ratio:>17.2f}")


# -- report ----------------------------------------------------------------------------------------


def machine_info() -> dict[str, Any]:
    """What the figures were measured on."""
    versions = {m.__name__: m.__version__ for m in (ray, torch, gym, np, lz4)}
    return {
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        **versions,
        "platform": platform.platform(),
    }


def print_report(report: dict[str, Any]) -> None:
    """Print the figures of ``report`` as tables."""
    yes = {True: "yes", False: "NO"}
    local, split, cost, remote, lz = (
        report[k] for k in ("in_process", "time_split", "compute_actions", "remote_workers", "lz4")
    )
    total = split["us_per_env_step"]
    print(f"\nOne env step inside RolloutWorker.sample() ({local['setup']}): {total:.1f} us with timers")
    print(f"  (policy.compute_actions: {split['us_per_call']['compute_actions']:.1f} us per call in the loop)")
    for name, value in split["split_us_per_env_step"].items():
        print(f"  {name:<40}{value:>8.2f} us{value / total:>8.1%}")
    us, cpu_us = cost["us_per_call"], cost["cpu_us_per_call"]
    print(
        f"policy.compute_actions on a {cost['batch']} batch, us per call (CPU us): NumPy path {us['numpy']:.1f}"
        f" ({cpu_us['numpy']:.1f}), PyTorch path {us['torch']:.1f} ({cpu_us['torch']:.1f}); PyTorch / NumPy"
        f" {cost['torch_over_numpy']:.2f} ({cost['torch_over_numpy_cpu']:.2f})"
    )
    sweep = ", ".join(
        f"{k}: {v['steps_per_s']:.0f} ({v['steps_per_cpu_s']:.0f})" for k, v in report["num_envs_sweep"].items()
    )
    print(f"in-process steps per wall s (per CPU s) by num_envs_per_worker: {sweep}")
    machine = report["machine"]
    print(f"\nmachine: {machine['cpu_count']} CPUs, Python {machine['python']}, Ray {machine['ray']}")
    print("1-min load average before each section: " + ", ".join(f"{k} {v:.2f}" for k, v in machine["loadavg"].items()))
    print(
        f"\n1. One RolloutWorker in-process (acting in {local['acting_path']})"
        f" vs raw Gymnasium loop (1 env, random actions); median env steps/s (goal: ratio >= {RAW_GOAL})"
    )
    print(f"{'flowrl':>12}{'raw gym':>12}{'ratio':>8}  met   (per CPU s of this thread: flowrl, raw, ratio)")
    print(
        f"{local['flowrl_steps_per_s']:>12.0f}{local['raw_gym_steps_per_s']:>12.0f}{local['ratio']:>8.3f}"
        f"  {yes[local['met']]:<4}  ({local['flowrl_steps_per_cpu_s']:.0f}, {local['raw_gym_steps_per_cpu_s']:.0f},"
        f" {local['ratio_per_cpu_s']:.3f})"
    )
    rate, cpu, drv, per = (
        remote[k]
        for k in ("steps_per_s", "remote_worker_cpu_per_wall", "driver_cpu_per_wall", "steps_per_worker_cpu_s")
    )
    print(
        f"\n2. Remote rollout workers through gather_async(num_async={NUM_ASYNC}), "
        f"{remote['window_s']:g} s windows after"
        f" {remote['warmup_s']:g} s warm-up; median env steps/s (goal: 2 / 1 >= {SCALING_GOAL})"
    )
    print(f"{'in-process':>12}{'1 remote':>12}{'2 remote':>12}{'2 / 1':>8}{'1 remote / in-proc':>20}  met")
    print(
        f"{rate['in_process']:>12.0f}{rate['1']:>12.0f}{rate['2']:>12.0f}{remote['ratio_two_over_one']:>8.3f}"
        f"{remote['ratio_one_remote_over_in_process']:>20.3f}  {yes[remote['met']]}"
    )
    print(
        f"   CPU s per wall s of each remote worker: 1 worker {cpu['1']:.2f}, 2 workers {cpu['2']:.2f};"
        f" driver {drv['1']:.2f}, {drv['2']:.2f}; steps per worker CPU s: in-process {per['in_process']:.0f},"
        f" 1 remote {per['1']:.0f}, 2 remote {per['2']:.0f}"
    )
    print(
        f"\n3. LZ4 on {lz['columns']} columns of {lz['column_shape']} uint8, one thread, MB per CPU s"
        f" (goal: ratio >= {LZ4_RATIO_GOAL:g} at >= {LZ4_MBPS_GOAL:g} MB/s compress)"
    )
    print(f"{'frames':<56}{'ratio':>7}{'compress':>10}{'decompress':>12}  met")
    print(
        f"{lz['source']:<56}{lz['ratio']:>7.1f}{lz['compress_mb_per_cpu_s']:>10.0f}"
        f"{lz['decompress_mb_per_cpu_s']:>12.0f}  {yes[lz['met']]}"
    )


def main() -> None:
    """Parse options, run the benchmarks, print and save the figures."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where to write the JSON figures")
    parser.add_argument("--reps", type=int, help="repetitions per figure (default 5, quick 2; WorkerSets: half)")
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke test")
    parser.add_argument("--envpool", action="store_true", help="only compare env_backend gymnasium and envpool")
    args = parser.parse_args()
    quick = args.quick
    if args.envpool:
        torch.set_num_threads(1)
        report_envpool: dict[str, Any] = {"machine": {**machine_info(), "loadavg": os.getloadavg()[0]}}
        report_envpool["envpool"] = run_envpool(0.5 if quick else 2.0, args.reps or (1 if quick else 3))
        print_envpool(report_envpool)
        out = DEFAULT_ENVPOOL_OUT if args.out == DEFAULT_OUT else args.out
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report_envpool, indent=2) + "\n")
        print(f"\nfigures written to {out}")
        return
    reps = args.reps or (2 if quick else 5)
    settings: dict[str, Any] = {
        "quick": quick,
        "reps": reps,
        "rep_seconds": 0.4 if quick else 1.5,
        "ray_reps_per_size": (reps + 1) // 2,
        "window_s": 1.0 if quick else 4.0,
        "warmup_s": 0.3 if quick else 1.5,
        "frames": 400 if quick else 2000,
        "split_sample_calls": 10 if quick else 50,
        "compute_actions_calls_per_rep": 1000 if quick else 3000,
        "sweep_s": 0.25 if quick else 1.0,
        "profile_sample_calls": 10 if quick else 50,
    }
    torch.set_num_threads(1)  # as a rollout actor does
    marks: list[tuple[str, float, float]] = []  # (section starting, wall clock, 1-min load average)

    def section(name: str) -> None:
        marks.append((name, time.perf_counter(), os.getloadavg()[0]))

    report: dict[str, Any] = {"machine": machine_info(), "settings": settings}
    section("in_process")
    report["in_process"] = run_in_process(reps, settings["rep_seconds"])
    section("details")
    report["time_split"] = time_split(settings["split_sample_calls"])
    report["compute_actions"] = compute_actions_cost(settings["compute_actions_calls_per_rep"], reps)
    report["num_envs_sweep"] = num_envs_sweep([1, 8, 32], settings["sweep_s"])
    profile_sample(settings["profile_sample_calls"])
    section("remote")
    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.ERROR)
    try:
        report["remote_workers"] = run_remote(settings["ray_reps_per_size"], settings["warmup_s"], settings["window_s"])
    finally:
        ray.shutdown()
    section("lz4")
    report["lz4"] = run_lz4(settings["frames"], reps)
    section("end")
    report["machine"]["loadavg"] = {name: load for name, _, load in marks}
    settings["section_wall_s"] = {a[0]: b[1] - a[1] for a, b in itertools.pairwise(marks)}
    met = report["all_goals_met"] = all(report[k]["met"] for k in ("in_process", "remote_workers", "lz4"))
    print_report(report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nall goals met: {'yes' if met else 'NO'}; figures written to {args.out}")


if __name__ == "__main__":
    main()
