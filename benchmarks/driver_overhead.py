"""Benchmark the single driver's CPU cost per fragment, and the ceiling it puts on a run.

Every flowrl plan runs in one Python thread of the driver: however many rollout workers there
are, each fragment they sample costs that thread some CPU to receive, count, batch or forward.
This script measures that cost on flowrl's real operators and turns it into the most fragments
(and env steps) per second one driver could take in.

Data paths, each over 1, 2, 4 and 8 remote rollout workers (CartPole-v1, PPO's default policy,
``num_envs_per_worker=1``, ``num_cpus_per_worker=0.2`` so that 8 fit on 2 cores; one set of 8
workers per fragment size, the first N of them serving each count):

1. ``bulk_sync``: ``ParallelRollouts(workers, mode="bulk_sync").combine(ConcatBatches(4000))``,
   as PPO and A2C gather (4000: PPO's default ``train_batch_size``).
2. ``async``: ``ParallelRollouts(workers, mode="async", num_async=2)``, fragments as they
   arrive, as IMPALA gathers them (A3C's gather is the same with gradients in the items).
3. ``ray_floor`` (reference): the async gather written on Ray alone, ``sample.remote()`` with
   2 calls in flight per worker, ``ray.wait(num_returns=1)``, ``ray.get``: what Ray itself
   costs the driver per fragment, below which no iterator layer can go.
4. ``apex_store``: Ape-X's storing sub-flow alone: async rollouts -> ``StoreToReplayBuffer``
   into one ``ReplayActor`` shard -> ``SendWeightsToSource`` (every 200 steps per worker).
5. ``apex``: Ape-X's driver side whole, wired from its operators as
   ``flowrl/algorithms/apex.py`` wires them (less target-network updates and metrics): the
   storing sub-flow behind ``ThrottleSampling`` || ``Replay(actors=shards)`` -> ``Enqueue`` on
   a ``LearnerThread``'s inqueue || ``Dequeue`` of its results -> ``UpdatePriorities``, joined by
   ``Concurrently(mode="async")``, with Ape-X's defaults: ``train_batch_size`` 128 and
   ``training_intensity`` 4 (each sampled step is replayed 4 times on average), so each
   fragment of S steps brings ``4 x S / 128`` replayed batches through the driver with it.
   The learner's ``learn_fn`` sleeps ``--learner-step-ms`` (like a GPU step it holds neither a
   CPU nor the GIL) and returns priorities of 1: the figure is the data path's, not SGD's,
   and a learner slower than 4x sampling lets ``ThrottleSampling`` hold the replay ratio.

Method: the driver thread's CPU time (``time.thread_time()``) is read around pulling items
from a path for ``--rep-s`` seconds of wall time, after a warm-up, and divided by the
fragments pulled. Waiting on workers costs no CPU (flowrl blocks in ``ray.wait``), so the
figure does not depend on how fast the workers sample. Medians over ``--reps`` windows. The
whole driver process's CPU (``time.process_time()``: also Ray's C++ threads, which run beside
the plan's thread without the GIL, and the learner thread) is reported beside it.

Projection (the plan's thread is the serial bottleneck)::

    projected fragments/s = 1 / (thread CPU s per fragment)
    projected env steps/s = projected fragments/s x steps per fragment

for fragments of 50 and 500 steps, each measured (bigger fragments carry more bytes). The
workers here are slower than the driver, so the cost is measured below saturation; a
saturated driver finds several fragments ready per ``ray.wait`` and may pay a little less.
The footer compares each ceiling, at the most workers measured, with the RLlib paper's Ape-X
figure (about 160k env frames/s with 256 workers, ICML 2018), counting a frame as an env step.
Beside it: the least-squares growth of the cost per added worker over 1-8 workers (with its
standard error; on this machine the workers share the driver's 2 cores, so contention adds to
it) and the most growth per worker under which the ceiling would still cover the paper's rate
at 256 workers; a slope measured over 8 workers is no forecast for 256. CartPole fragments are
small (~4.7 KB per 50 steps); an Atari step is about 1000x larger, a per-byte cost this
benchmark leaves out.

Run from the repository root::

    python benchmarks/driver_overhead.py              # about three minutes
    python benchmarks/driver_overhead.py --quick      # a smoke test (~35 s): 1 and 2 workers
    python benchmarks/driver_overhead.py --reps 5 --out /tmp/driver_overhead.json

It starts its own local Ray instance (2 CPUs, no dashboard), prints a table and the
arithmetic, and writes the figures as JSON to ``--out`` (default
``benchmarks/results/driver_overhead.json``).
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import ray

from flowrl.actors import Learned, LearnerThread, ReplayShards, WorkerSet
from flowrl.actors.resources import replay_shards
from flowrl.algorithms import get_algorithm
from flowrl.data import DEFAULT_POLICY_ID, MultiAgentBatch, SampleBatch
from flowrl.data.replay_buffer import BATCH_INDEXES
from flowrl.engine.build import policy_specs
from flowrl.envs import get_env_creator
from flowrl.iterators import FromActor, LocalIterator
from flowrl.operators import (
    ConcatBatches,
    Concurrently,
    LearnInThread,
    ParallelRollouts,
    Replay,
    SendWeightsToSource,
    StoreToReplayBuffer,
    ThrottleSampling,
    UpdatePriorities,
)

ENV_ID = "CartPole-v1"
CPUS_PER_WORKER = 0.2
FRAGMENT_STEPS = (50, 500)
PATHS = ("bulk_sync", "async", "ray_floor", "apex_store", "apex")
NUM_ASYNC = 2  # requests in flight per worker, as IMPALA and Ape-X gather
#: The RLlib paper's (ICML 2018) Ape-X scaling figure: env frames per second with this many workers.
PAPER_FRAMES_PER_S = 160_000
PAPER_WORKERS = 256
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "driver_overhead.json"
Batch = SampleBatch | MultiAgentBatch
med = statistics.median


class FirstWorkers:
    """A :class:`~flowrl.actors.WorkerSet` seen through its first ``n`` remote workers.

    One set of 8 workers serves every worker count (8 actor starts instead of 15); the
    operators see a worker set in every other respect.
    """

    def __init__(self, workers: WorkerSet, n: int) -> None:
        self._workers = workers
        self._n = n

    def remote_workers(self) -> list[Any]:
        return self._workers.remote_workers()[: self._n]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._workers, name)


@dataclass
class Tally:
    """What a path delivered: fragments taken from the workers and, for Ape-X, replayed batches."""

    fragment_steps: int
    fragments: int = 0
    replayed: int = 0
    fragment_bytes: int = 0
    replayed_bytes: int = 0

    def add(self, item: Any) -> None:
        """Count a fragment, a train batch of whole fragments, or (Ape-X) a replayed batch put on the
        learner's queue."""
        if isinstance(item, FromActor):
            self.replayed += 1
            self.replayed_bytes = self.replayed_bytes or item.item.size_bytes()
        elif isinstance(item, (SampleBatch, MultiAgentBatch)):
            self.fragments += item.env_steps() // self.fragment_steps
            self.fragment_bytes = self.fragment_bytes or item.size_bytes() * self.fragment_steps // item.env_steps()
        # Learner results (Ape-X's third sub-flow) and not-ready markers count for nothing.


@dataclass
class DataPath:
    """A path to pull items from: ``pull()`` takes one and tallies it; ``close()`` lets it go."""

    pull: Callable[[], None]
    tally: Tally
    close: Callable[[], None] = lambda: None


def iterator_path(flow: LocalIterator[Any], fragment_steps: int) -> DataPath:
    """A flowrl flow as a path: each pull takes its next item."""
    iterator, tally = iter(flow), Tally(fragment_steps)
    return DataPath(lambda: tally.add(next(iterator)), tally)


def make_workers(num_workers: int, fragment_steps: int) -> WorkerSet:
    """``num_workers`` remote CartPole workers with PPO's default policy, one env each."""
    ppo = get_algorithm("ppo")
    config = ppo.config_class.from_dict(
        {
            "seed": 0,
            "num_workers": num_workers,
            "rollout_fragment_length": fragment_steps,
            "num_envs_per_worker": 1,
            "num_cpus_per_worker": CPUS_PER_WORKER,
        }
    )
    creator = get_env_creator(ENV_ID)
    return WorkerSet(
        env_creator=creator,
        policy_specs=policy_specs(ppo, config, creator),
        config=config,
        num_workers=num_workers,
        num_cpus_per_worker=CPUS_PER_WORKER,
    )


def ray_floor_path(workers: FirstWorkers, fragment_steps: int) -> DataPath:
    """The async gather on Ray alone: a fragment's cost to the driver below any iterator layer."""
    tally = Tally(fragment_steps)
    source = {actor.sample.remote(): actor for actor in workers.remote_workers() for _ in range(NUM_ASYNC)}

    def pull() -> None:
        (ref,), _ = ray.wait(list(source), num_returns=1)
        actor = source.pop(ref)
        tally.add(ray.get(ref))
        source[actor.sample.remote()] = actor

    def close() -> None:
        ray.wait(list(source), num_returns=len(source), timeout=30)  # the workers are idle before the next path

    return DataPath(pull, tally, close)


class PacedLearner:
    """A learner step without SGD: sleeps ``step_s`` (holding no CPU, as a GPU step) and returns
    priorities of 1 for the replayed rows, so that the priority updates still flow."""

    def __init__(self, step_s: float) -> None:
        self.step_s = step_s

    def __call__(self, worker: Any, batch: Batch) -> Learned:
        time.sleep(self.step_s)
        rows = batch[BATCH_INDEXES]
        return Learned(None, {}, batch.env_steps(), {DEFAULT_POLICY_ID: (rows, np.ones(len(rows), np.float32))})


@dataclass
class ApexParts:
    """The Ape-X config, replay shard and learner thread, made once per worker set and shared by its cells."""

    config: Any
    shards: ReplayShards
    learner: LearnerThread

    @classmethod
    def create(cls, workers: WorkerSet, training_intensity: float, learner_step_s: float) -> ApexParts:
        config = get_algorithm("apex").config_class.from_dict({"seed": 0, "training_intensity": training_intensity})
        learner = LearnerThread(
            workers.local_worker(), inqueue_size=config.learner_queue_size, learn_fn=PacedLearner(learner_step_s)
        )
        learner.start()
        return cls(config, replay_shards(config, config.num_replay_shards), learner)

    def nominal_replayed_per_fragment(self, fragment_steps: int) -> float:
        return self.config.training_intensity * fragment_steps / self.config.train_batch_size

    def stop(self) -> None:
        self.learner.stop()
        self.shards.stop()


def apex_store_flow(workers: FirstWorkers, parts: ApexParts, throttle: bool) -> LocalIterator[Any]:
    """Ape-X's first sub-flow: async rollouts (throttled to the learner, or not) stored into the shards."""
    config = parts.config
    rollouts = ParallelRollouts(workers, mode="async", num_async=NUM_ASYNC)
    if throttle:
        rollouts = rollouts.transform(
            ThrottleSampling(config.training_intensity, config.learning_starts, replay_shards=parts.shards)
        )
    weights_back = SendWeightsToSource(parts.learner, workers, min_steps=config.max_weight_sync_delay)  # type: ignore[arg-type]
    return rollouts.for_each(StoreToReplayBuffer(actors=parts.shards)).zip_with_source_actor().for_each(weights_back)


def apex_flow(workers: FirstWorkers, parts: ApexParts) -> LocalIterator[Any]:
    """Ape-X's three driver sub-flows as its execution plan joins them."""
    replay_op, learned = LearnInThread(Replay(actors=parts.shards, num_async=4).zip_with_source_actor(), parts.learner)
    update_op = learned.for_each(UpdatePriorities(actors=parts.shards))
    return Concurrently([apex_store_flow(workers, parts, throttle=True), replay_op, update_op], mode="async")


def make_path(name: str, workers: FirstWorkers, parts: ApexParts, fragment_steps: int) -> DataPath:
    """The data path ``name`` (one of :data:`PATHS`) over ``workers``, built afresh."""
    if name == "bulk_sync":
        train_batch_size = get_algorithm("ppo").config_class.from_dict({}).train_batch_size
        return iterator_path(
            ParallelRollouts(workers, mode="bulk_sync").combine(ConcatBatches(train_batch_size)), fragment_steps
        )
    if name == "async":
        return iterator_path(ParallelRollouts(workers, mode="async", num_async=NUM_ASYNC), fragment_steps)
    if name == "ray_floor":
        return ray_floor_path(workers, fragment_steps)
    if name == "apex_store":
        return iterator_path(apex_store_flow(workers, parts, throttle=False), fragment_steps)
    return iterator_path(apex_flow(workers, parts), fragment_steps)


def measure(path: DataPath, warmup: Tally, reps: int, rep_s: float) -> dict[str, Any]:
    """Pull the ``warmup`` fragments and replayed batches, then ``reps`` windows of ``rep_s`` wall
    seconds: CPU per fragment."""
    tally = path.tally
    while tally.fragments < warmup.fragments or tally.replayed < warmup.replayed:
        path.pull()
    thread_ms, process_ms, fragments, replayed, wall = [], [], [], [], []
    for _ in range(reps):
        f0, r0 = tally.fragments, tally.replayed
        c0, p0, w0 = time.thread_time(), time.process_time(), time.perf_counter()
        while time.perf_counter() - w0 < rep_s or tally.fragments - f0 < 2:
            path.pull()
        c, p, w = time.thread_time() - c0, time.process_time() - p0, time.perf_counter() - w0
        n = tally.fragments - f0
        thread_ms.append(1e3 * c / n)
        process_ms.append(1e3 * p / n)
        fragments.append(n)
        replayed.append((tally.replayed - r0) / n)
        wall.append(n / w)
    return {
        "fragments_pulled": sum(fragments),
        "fragments_per_window": fragments,
        "fragment_bytes": tally.fragment_bytes,
        "thread_cpu_ms_per_fragment": med(thread_ms),
        "process_cpu_ms_per_fragment": med(process_ms),
        "windows_thread_cpu_ms_per_fragment": thread_ms,
        "replayed_batches_per_fragment": med(replayed),
        "replayed_batch_bytes": tally.replayed_bytes,
        "wall_fragments_per_s": med(wall),
    }


def run_fragment_size(
    fragment_steps: int, worker_counts: Sequence[int], args: argparse.Namespace
) -> list[dict[str, Any]]:
    """Every path at every worker count, over one set of workers sampling ``fragment_steps``-step fragments."""
    workers = make_workers(max(worker_counts), fragment_steps)
    parts = ApexParts.create(workers, args.training_intensity, args.learner_step_ms / 1e3)
    # Past the burst of learning_starts steps that ThrottleSampling lets a new flow sample freely,
    # and the learner's queue filled: the replay ratio is steady from there.
    burst = parts.config.learning_starts // fragment_steps
    rows: list[dict[str, Any]] = []
    try:
        for n in worker_counts:
            view = FirstWorkers(workers, n)
            for name in PATHS:
                path = make_path(name, view, parts, fragment_steps)
                if name == "apex":
                    warmup = Tally(
                        fragment_steps, fragments=burst + 2 * n + 2, replayed=2 * parts.config.learner_queue_size
                    )
                else:
                    warmup = Tally(fragment_steps, fragments=2 * n + 1)
                load = os.getloadavg()[0]
                figures = measure(path, warmup, args.reps, args.rep_s)
                path.close()
                del path
                gc.collect()  # closes the abandoned gathers' streams before the next path starts
                ms = figures["thread_cpu_ms_per_fragment"]
                row = {
                    "path": name,
                    "workers": n,
                    "fragment_steps": fragment_steps,
                    "loadavg_1min": load,
                    **figures,
                    "projected_fragments_per_s": 1e3 / ms,
                    "projected_env_steps_per_s": 1e3 / ms * fragment_steps,
                }
                if name == "apex":
                    row["nominal_replayed_batches_per_fragment"] = parts.nominal_replayed_per_fragment(fragment_steps)
                rows.append(row)
                print(
                    f"  {name:<10} {n} workers: {ms:.3f} ms/fragment over {row['fragments_pulled']} fragments",
                    flush=True,
                )
    finally:
        parts.stop()
        workers.stop()
    return rows


def line_fit(rows: Sequence[dict[str, Any]]) -> dict[str, float] | None:
    """Least squares of thread CPU ms per fragment (the medians) against workers: intercept, slope and
    the slope's standard error; None under 3 worker counts."""
    if len(rows) < 3:
        return None
    x = np.array([r["workers"] for r in rows], float)
    y = np.array([r["thread_cpu_ms_per_fragment"] for r in rows])
    (slope, intercept), cov = np.polyfit(x, y, 1, cov="unscaled" if len(rows) == 3 else True)
    return {"intercept": float(intercept), "slope_per_worker": float(slope), "slope_stderr": float(np.sqrt(cov[0, 0]))}


def summarize(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per path and fragment size: the ceiling at the most workers measured, and against the paper's Ape-X."""
    out: dict[str, Any] = {}
    for name in PATHS:
        for steps in FRAGMENT_STEPS:
            cell = [r for r in rows if r["path"] == name and r["fragment_steps"] == steps]
            if not cell:
                continue
            top = max(cell, key=lambda r: r["workers"])
            needed = PAPER_FRAMES_PER_S / steps
            entry: dict[str, Any] = {
                "workers": top["workers"],
                "thread_cpu_ms_per_fragment": top["thread_cpu_ms_per_fragment"],
                "projected_fragments_per_s": top["projected_fragments_per_s"],
                "projected_env_steps_per_s": top["projected_env_steps_per_s"],
                "paper_fragments_per_s_needed": needed,
                "covers_paper": top["projected_fragments_per_s"] >= needed,
            }
            fit = line_fit(cell)
            if fit is not None:
                entry["fit_ms"] = fit
            # The growth per added worker (ms) under which the ceiling would still cover the paper's rate at its scale.
            entry[f"max_slope_ms_per_worker_to_cover_at_{PAPER_WORKERS}"] = (
                1e3 / needed - top["thread_cpu_ms_per_fragment"]
            ) / (PAPER_WORKERS - top["workers"])
            if name == "apex":
                store = next(
                    r
                    for r in rows
                    if r["path"] == "apex_store" and r["fragment_steps"] == steps and r["workers"] == top["workers"]
                )
                replayed = top["replayed_batches_per_fragment"]
                entry["replayed_batches_per_fragment"] = replayed
                entry["nominal_replayed_batches_per_fragment"] = top["nominal_replayed_batches_per_fragment"]
                entry["store_ms_per_fragment"] = store["thread_cpu_ms_per_fragment"]
                # What each replayed batch costs on top of storing its share of a fragment.
                entry["ms_per_replayed_batch"] = (
                    top["thread_cpu_ms_per_fragment"] - store["thread_cpu_ms_per_fragment"]
                ) / max(replayed, 1e-9)
            out[f"{name}/{steps}"] = entry
    return out


def si(x: float) -> str:
    """1234 -> '1.23k', 1_190_000 -> '1.19M'."""
    for div, unit in ((1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:.3g}{unit}"
    return f"{x:.3g}"


def print_report(rows: Sequence[dict[str, Any]], summary: dict[str, Any], training_intensity: float) -> None:
    print(
        f"\n{'path':<11}{'workers':>7}{'steps':>6}{'frags':>7}{'KB/frag':>8}{'thread ms':>10}{'proc ms':>9}"
        f"{'repl/frag':>10}{'wall frag/s':>12}{'proj frag/s':>12}{'proj steps/s':>13}"
    )
    for r in rows:
        replayed = f"{r['replayed_batches_per_fragment']:.2f}" if r["path"] == "apex" else "-"
        print(
            f"{r['path']:<11}{r['workers']:>7}{r['fragment_steps']:>6}{r['fragments_pulled']:>7}"
            f"{r['fragment_bytes'] / 1e3:>8.1f}{r['thread_cpu_ms_per_fragment']:>10.3f}"
            f"{r['process_cpu_ms_per_fragment']:>9.3f}"
            f"{replayed:>10}{r['wall_fragments_per_s']:>12.0f}{r['projected_fragments_per_s']:>12,.0f}"
            f"{si(r['projected_env_steps_per_s']):>13}"
        )
    print(
        "thread ms: the driver thread's CPU ms per fragment (median of the windows); "
        "proc ms: the whole driver process's;\n"
        "repl/frag: replayed batches enqueued per fragment stored; wall frag/s: what these 2 cores delivered; "
        "proj: 1 / thread ms"
    )
    print("\nThe ceiling of one driver thread, at the most workers measured:")
    for key, s in summary.items():
        name, steps = key.split("/")
        print(
            f"  {name:<10} {s['workers']} workers: 1 / {s['thread_cpu_ms_per_fragment'] / 1e3:.6f} s = "
            f"{s['projected_fragments_per_s']:>7,.0f} fragments/s"
            f" x {steps:>3} steps = {si(s['projected_env_steps_per_s']):>6} env steps/s"
        )
        if name == "apex":
            print(
                f"{'':23}= {s['store_ms_per_fragment']:.3f} ms storing it (apex_store) + "
                f"{s['replayed_batches_per_fragment']:.2f} replayed batches x {s['ms_per_replayed_batch']:.3f} ms "
                f"(nominal {s['nominal_replayed_batches_per_fragment']:.2f} "
                f"at training_intensity {training_intensity:g})"
            )
    floor = {steps: summary.get(f"ray_floor/{steps}") for steps in FRAGMENT_STEPS}
    ratios = [
        f"{name} {summary[f'{name}/{steps}']['thread_cpu_ms_per_fragment'] / f['thread_cpu_ms_per_fragment']:.2f}x"
        f" ({steps} steps)"
        for name in ("async", "bulk_sync")
        for steps, f in floor.items()
        if f is not None and f"{name}/{steps}" in summary
    ]
    print(f"  flowrl's gathers against Ray alone (ray_floor), CPU per fragment: {', '.join(ratios)}")
    print(
        f"\nAgainst the RLlib paper's Ape-X, {si(PAPER_FRAMES_PER_S)} env frames/s with {PAPER_WORKERS} workers "
        "(a frame counted as an env step; at Atari's frame skip of 4 the need is a quarter):"
    )
    for key, s in summary.items():
        name, steps = key.split("/")
        needed = s["paper_fragments_per_s_needed"]
        verdict = "covers it" if s["covers_paper"] else "falls SHORT"
        line = (
            f"  {name:<10} {steps:>3}-step fragments: needs {needed:,.0f} fragments/s; "
            f"ceiling {s['projected_fragments_per_s']:,.0f}"
            f" ({s['projected_fragments_per_s'] / needed:.2f}x): {verdict}"
        )
        fit = s.get("fit_ms")
        if fit is not None:
            room = 1e3 * s[f"max_slope_ms_per_worker_to_cover_at_{PAPER_WORKERS}"]
            line += (
                f"; cost per added worker {1e3 * fit['slope_per_worker']:+.1f} +- {1e3 * fit['slope_stderr']:.1f} us, "
                + (f"must stay under {room:+.1f} us to cover it at {PAPER_WORKERS}" if room > 0 else "")
            ).rstrip(", ")
        print(line)
    for steps in FRAGMENT_STEPS:
        s = summary.get(f"apex/{steps}")
        if s is None:
            continue
        # The replay ratio at which one driver would just take in the paper's rate with these fragments.
        budget_ms = 1e3 * steps / PAPER_FRAMES_PER_S - s["store_ms_per_fragment"]
        per_step = (
            s["ms_per_replayed_batch"] * s["nominal_replayed_batches_per_fragment"] / (training_intensity * steps)
        )
        if budget_ms <= 0:
            print(
                f"  apex with {steps}-step fragments: storing alone exceeds the paper's rate, whatever the replay ratio"
            )
        elif per_step > 0:
            print(
                f"  apex with {steps}-step fragments: reaches the paper's rate up to training_intensity "
                f"{budget_ms / (per_step * steps):.2f} ({budget_ms:.3f} ms per fragment left after storing it)"
            )


def machine_info() -> dict[str, Any]:
    """What the figures were measured on."""
    return {
        "cpu_count": os.cpu_count(),
        "loadavg_1min": os.getloadavg()[0],
        "python": platform.python_version(),
        "ray": ray.__version__,
        "numpy": np.__version__,
        "platform": platform.platform(),
    }


def main() -> None:
    """Parse options, run the benchmark, print and save the figures."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where to write the JSON figures")
    parser.add_argument("--reps", type=int, help="measured windows per path and worker count (default 3, quick 2)")
    parser.add_argument("--rep-s", type=float, help="wall seconds per window (default 0.6, quick 0.3)")
    parser.add_argument(
        "--training-intensity", type=float, default=4.0, help="Ape-X: steps replayed per step sampled (default 4)"
    )
    parser.add_argument(
        "--learner-step-ms", type=float, default=2.0, help="Ape-X: the learner's sleep per batch (default 2)"
    )
    parser.add_argument("--quick", action="store_true", help="1 and 2 workers, short windows: a smoke test")
    args = parser.parse_args()
    args.reps = args.reps or (2 if args.quick else 3)
    args.rep_s = args.rep_s or (0.3 if args.quick else 0.6)
    worker_counts = (1, 2) if args.quick else (1, 2, 4, 8)
    machine = machine_info()
    settings = {
        "quick": args.quick,
        "reps": args.reps,
        "rep_s": args.rep_s,
        "worker_counts": list(worker_counts),
        "fragment_steps": list(FRAGMENT_STEPS),
        "num_cpus_per_worker": CPUS_PER_WORKER,
        "training_intensity": args.training_intensity,
        "learner_step_ms": args.learner_step_ms,
        "env": ENV_ID,
    }
    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.ERROR)
    try:
        rows: list[dict[str, Any]] = []
        for steps in FRAGMENT_STEPS:
            print(f"{steps}-step fragments:", flush=True)
            rows += run_fragment_size(steps, worker_counts, args)
    finally:
        ray.shutdown()
    machine["loadavg_1min_after"] = os.getloadavg()[0]
    summary = summarize(rows)
    print(
        f"\nmachine: {machine['cpu_count']} CPUs, 1-min load {machine['loadavg_1min']:.2f} "
        f"-> {machine['loadavg_1min_after']:.2f}"
    )
    print_report(rows, summary, args.training_intensity)
    report = {
        "machine": machine,
        "settings": settings,
        "paper": {
            "frames_per_s": PAPER_FRAMES_PER_S,
            "workers": PAPER_WORKERS,
            "source": "RLlib (ICML 2018), Ape-X scaling",
        },
        "rows": rows,
        "summary": summary,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nfigures written to {args.out}")


if __name__ == "__main__":
    main()
