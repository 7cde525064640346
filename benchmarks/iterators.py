"""Benchmark flowrl's parallel-iterator gathers against hand-written Ray loops.

What it measures:

1. Throughput (items/s) of ``gather_async()`` and ``gather_sync()`` over two shard
   actors that produce small ints, next to a hand-written Ray loop doing the same work
   over the same actors:

   * async: one request in flight per actor, ``ray.wait(refs, num_returns=1)`` +
     ``ray.get`` + resubmit to the actor that answered;
   * sync: one request per actor per round, then ``ray.get(list)``.

   The actors inherit :class:`flowrl.iterators.ParallelIteratorWorker` (serving flowrl's
   streams) and also have a plain ``next_item()`` method (serving the hand-written loop);
   both draw from their own ``itertools.count()`` made by the same zero-argument callable.
   After a warm-up, flowrl and hand-written repetitions alternate (A B A B ...) so machine
   noise hits both alike; medians and the ratio flowrl / hand-written are reported
   (goal: >= 0.9).

2. Driver CPU seconds per wall second while waiting on slow sources (each item takes
   0.5 s): ``gather_async()`` over one slow shard, an async ``union`` of two such gathers
   and ``gather_sync()`` (goal: <= 0.05, i.e. no busy polling), next to an idle driver
   (``time.sleep``, the floor set by Ray's own threads) and a Ray 1.x style 1 ms polling
   loop for comparison.

Run from the repository root::

    python benchmarks/iterators.py                  # full run, about a minute
    python benchmarks/iterators.py --quick          # smaller sizes, a smoke test
    python benchmarks/iterators.py --reps 7 --out /tmp/iterators.json
    python benchmarks/iterators.py --demo           # only a small dataflow, checked: a check that Ray works

It starts its own local Ray instance (2 CPUs, no dashboard), prints a table and writes the
figures as JSON to ``--out`` (default ``benchmarks/results/iterators.json``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import os
import platform
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import ray

from flowrl.iterators import LocalIterator, ParallelIteratorWorker, from_actors, from_range

NUM_SHARDS = 2
SLOW_PERIOD_S = 0.5
THROUGHPUT_GOAL = 0.9
CPU_GOAL = 0.05
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "iterators.json"


def count_forever() -> Iterator[int]:
    """Small items as fast as the actor can hand them out."""
    return itertools.count()


def count_slowly() -> Iterator[int]:
    """One item every ``SLOW_PERIOD_S`` seconds."""
    for i in itertools.count():
        time.sleep(SLOW_PERIOD_S)
        yield i


@ray.remote(num_cpus=0)
class BenchShard(ParallelIteratorWorker):
    """A shard actor serving flowrl's streams and, through :meth:`next_item`, hand-written loops.

    Both draw from their own generator made by the same ``source`` callable, so the work
    per item is the same; what differs is flowrl's machinery around it.
    """

    def __init__(self, source: Callable[[], Iterable[int]]) -> None:
        super().__init__(source)
        self._plain = iter(source())

    def next_item(self) -> int:
        """The next item of this actor's own generator (the hand-written loops' request)."""
        return next(self._plain)

    def ready(self) -> None:
        """Return once the actor is up."""


# -- hand-written Ray loops ----------------------------------------------------------


def hand_written_async(actors: list[Any]) -> Iterator[int]:
    """One request in flight per actor; yield in completion order and resubmit."""
    pending = {actor.next_item.remote(): actor for actor in actors}
    while True:
        ready, _ = ray.wait(list(pending), num_returns=1)
        actor = pending.pop(ready[0])
        yield ray.get(ready[0])
        pending[actor.next_item.remote()] = actor


def hand_written_sync(actors: list[Any]) -> Iterator[int]:
    """One request per actor per round, then a ``ray.get`` of the whole round."""
    while True:
        yield from ray.get([actor.next_item.remote() for actor in actors])


def polling_1ms(actor: Any) -> Iterator[int]:
    """Ray 1.x style: poll with ``ray.wait(timeout=0)`` and sleep 1 ms between polls."""
    ref = actor.next_item.remote()
    while True:
        ready, _ = ray.wait([ref], timeout=0)
        if not ready:
            time.sleep(0.001)
            continue
        yield ray.get(ref)
        ref = actor.next_item.remote()


# -- 1. throughput -------------------------------------------------------------------


def consume(it: Iterator[Any], n: int) -> float:
    """Pull ``n`` items from ``it`` and return the wall seconds it took."""
    start = time.perf_counter()
    for _ in range(n):
        next(it)
    return time.perf_counter() - start


@dataclass
class ThroughputResult:
    """Items/s per repetition for flowrl and the hand-written loop (alternated)."""

    mode: str
    items_per_rep: int
    flowrl: list[float]
    hand_written: list[float]

    @property
    def ratio(self) -> float:
        """Median flowrl items/s over median hand-written items/s."""
        return statistics.median(self.flowrl) / statistics.median(self.hand_written)

    @property
    def met(self) -> bool:
        """Whether flowrl reaches the throughput goal."""
        return self.ratio >= THROUGHPUT_GOAL

    def to_json(self) -> dict[str, Any]:
        """The figures as a JSON-ready dict."""
        return {
            "items_per_rep": self.items_per_rep,
            "flowrl_items_per_s": statistics.median(self.flowrl),
            "hand_written_items_per_s": statistics.median(self.hand_written),
            "ratio": self.ratio,
            "flowrl_reps_items_per_s": self.flowrl,
            "hand_written_reps_items_per_s": self.hand_written,
            "goal": f"ratio >= {THROUGHPUT_GOAL}",
            "met": self.met,
        }


def measure_throughput(
    mode: str, flowrl_it: LocalIterator[Any], hand_it: Iterator[Any], reps: int, warmup_items: int, rep_seconds: float
) -> ThroughputResult:
    """Warm both up, size a repetition to ``rep_seconds`` of the hand-written loop, then alternate."""
    consume(flowrl_it, warmup_items)
    consume(hand_it, warmup_items)
    rate = warmup_items / consume(hand_it, warmup_items)
    n = max(100, int(rate * rep_seconds))
    result = ThroughputResult(mode, n, [], [])
    for _ in range(reps):
        result.flowrl.append(n / consume(flowrl_it, n))
        result.hand_written.append(n / consume(hand_it, n))
    return result


def run_throughput(reps: int, warmup_items: int, rep_seconds: float) -> list[ThroughputResult]:
    """Throughput of both gathers against their hand-written loops, over the same two actors."""
    actors = [BenchShard.remote(count_forever) for _ in range(NUM_SHARDS)]
    ray.get([actor.ready.remote() for actor in actors])
    pairs = [
        ("gather_async", from_actors(actors).gather_async(), hand_written_async(actors)),
        ("gather_sync", from_actors(actors).gather_sync(), hand_written_sync(actors)),
    ]
    results = [measure_throughput(*pair, reps, warmup_items, rep_seconds) for pair in pairs]
    for actor in actors:
        ray.kill(actor)
    return results


# -- 2. driver CPU while waiting -----------------------------------------------------


@dataclass
class CpuResult:
    """Driver CPU seconds over wall seconds while consuming slow items."""

    case: str
    items: int
    cpu_s: float
    wall_s: float
    has_goal: bool

    @property
    def cpu_per_wall(self) -> float:
        """Driver CPU seconds per wall second."""
        return self.cpu_s / self.wall_s

    @property
    def met(self) -> bool:
        """Whether the driver stays within the CPU goal."""
        return self.cpu_per_wall <= CPU_GOAL

    def to_json(self) -> dict[str, Any]:
        """The figures as a JSON-ready dict (with the goal only for flowrl's cases)."""
        out: dict[str, Any] = {
            "items": self.items,
            "cpu_s": self.cpu_s,
            "wall_s": self.wall_s,
            "cpu_per_wall": self.cpu_per_wall,
        }
        if self.has_goal:
            out["goal"] = f"cpu_per_wall <= {CPU_GOAL}"
            out["met"] = self.met
        return out


def driver_cpu(case: str, it: Iterator[Any], items: int, has_goal: bool) -> CpuResult:
    """Pull one item (start-up), then measure driver CPU/wall while pulling ``items`` more."""
    next(it)
    wall0, cpu0 = time.perf_counter(), time.process_time()
    for _ in range(items):
        next(it)
    return CpuResult(case, items, time.process_time() - cpu0, time.perf_counter() - wall0, has_goal)


def idle_driver(items: int) -> CpuResult:
    """The floor: the driver sleeping as long as ``items`` slow items take to arrive."""
    wall0, cpu0 = time.perf_counter(), time.process_time()
    time.sleep(items * SLOW_PERIOD_S)
    return CpuResult("idle driver (time.sleep)", items, time.process_time() - cpu0, time.perf_counter() - wall0, False)


def run_cpu(items: int) -> list[CpuResult]:
    """Driver CPU per wall second for each way of waiting on slow shards (fresh actors per case)."""

    def slow_actors(n: int) -> list[Any]:
        actors = [BenchShard.remote(count_slowly) for _ in range(n)]
        ray.get([actor.ready.remote() for actor in actors])
        return actors

    cases: list[tuple[str, Callable[[list[Any]], Iterator[Any]], int, bool]] = [
        ("gather_async (1 slow shard)", lambda a: from_actors(a).gather_async(), 1, True),
        (
            "union async (2 x gather_async)",
            lambda a: from_actors(a[:1]).gather_async().union(from_actors(a[1:]).gather_async(), deterministic=False),
            2,
            True,
        ),
        ("gather_sync (1 slow shard)", lambda a: from_actors(a).gather_sync(), 1, True),
        ("1 ms polling loop (Ray 1.x)", lambda a: polling_1ms(a[0]), 1, False),
    ]
    results = [idle_driver(items)]
    for case, make_iterator, num_actors, has_goal in cases:
        actors = slow_actors(num_actors)
        results.append(driver_cpu(case, make_iterator(actors), items * num_actors, has_goal))
        for actor in actors:
            ray.kill(actor)
    return results


# -- report ----------------------------------------------------------------------------


def machine_info() -> dict[str, Any]:
    """What the figures were measured on."""
    return {
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "ray": ray.__version__,
        "platform": platform.platform(),
    }


def print_report(machine: dict[str, Any], throughput: list[ThroughputResult], cpu: list[CpuResult]) -> None:
    """Print the figures as two tables."""
    print(f"\nmachine: {machine['cpu_count']} CPUs, Python {machine['python']}, Ray {machine['ray']}")
    goal = f"goal: flowrl/hand-written >= {THROUGHPUT_GOAL}"
    print(f"\nThroughput over {NUM_SHARDS} shard actors, median items/s ({goal})")
    print(f"{'gather':<14}{'items/rep':>10}{'flowrl':>12}{'hand-written':>14}{'ratio':>8}  met")
    for t in throughput:
        print(
            f"{t.mode:<14}{t.items_per_rep:>10}{statistics.median(t.flowrl):>12.0f}"
            f"{statistics.median(t.hand_written):>14.0f}{t.ratio:>8.3f}  {'yes' if t.met else 'NO'}"
        )
    print(f"\nDriver CPU while waiting on sources yielding every {SLOW_PERIOD_S} s (goal <= {CPU_GOAL} CPU s/wall s)")
    print(f"{'case':<34}{'items':>6}{'wall s':>8}{'cpu s':>8}{'cpu/wall':>10}  met")
    for c in cpu:
        met = ("yes" if c.met else "NO") if c.has_goal else "-"
        print(f"{c.case:<34}{c.items:>6}{c.wall_s:>8.2f}{c.cpu_s:>8.3f}{c.cpu_per_wall:>10.4f}  {met}")


def run_demo(items: int = 100_000, num_shards: int = 2, batch_size: int = 1000) -> bool:
    """Run a small dataflow over shard actors and check its answer; whether it was right.

    ``items`` numbers are squared inside ``num_shards`` shard actors, sent ``batch_size`` at a
    time, and summed in the driver. Needs a Ray instance.
    """

    def count_items(batch: list[int]) -> int:
        metrics = LocalIterator.get_metrics()
        metrics.counters["items"] += len(batch)
        return sum(batch)

    plan = (
        from_range(items, num_shards=num_shards)
        .for_each(lambda x: x * x)  # runs inside the shard actors
        .batch(batch_size)
        .gather_async()
        .for_each(count_items)  # runs here, in the driver
    )
    print(f"plan: {plan!r}")
    start = time.perf_counter()
    total = sum(plan)
    elapsed = time.perf_counter() - start
    expected = sum(x * x for x in range(items))
    print(f"sum of squares below {items}: {total} (expected {expected})")
    print(f"{items} items through {num_shards} shard actors in {elapsed:.2f}s ({items / elapsed:,.0f} items/s)")
    return total == expected


def main() -> None:
    """Parse options, run both benchmarks in a fresh local Ray instance, print and save the figures."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where to write the JSON figures")
    parser.add_argument("--reps", type=int, help="measured repetitions per throughput figure (default 5, quick 2)")
    parser.add_argument("--rep-seconds", type=float, help="target seconds per repetition (default 1.5, quick 0.3)")
    parser.add_argument("--slow-items", type=int, help="slow items consumed per CPU case (default 6, quick 2)")
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke test")
    parser.add_argument(
        "--demo",
        action="store_true",
        help="instead, only run a small dataflow over shard actors and check its answer (a check that Ray works)",
    )
    args = parser.parse_args()
    if args.demo:
        ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.ERROR)
        try:
            right = run_demo()
        finally:
            ray.shutdown()
        raise SystemExit(0 if right else 1)
    reps = args.reps or (2 if args.quick else 5)
    rep_seconds = args.rep_seconds or (0.3 if args.quick else 1.5)
    slow_items = args.slow_items or (2 if args.quick else 6)
    warmup_items = 200 if args.quick else 1000

    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.ERROR)
    try:
        machine = machine_info()
        throughput = run_throughput(reps, warmup_items, rep_seconds)
        cpu = run_cpu(slow_items)
    finally:
        ray.shutdown()

    print_report(machine, throughput, cpu)
    goals = [t.met for t in throughput] + [c.met for c in cpu if c.has_goal]
    report = {
        "machine": machine,
        "settings": {
            "quick": args.quick,
            "reps": reps,
            "rep_seconds": rep_seconds,
            "warmup_items": warmup_items,
            "num_shards": NUM_SHARDS,
            "slow_period_s": SLOW_PERIOD_S,
            "slow_items": slow_items,
        },
        "throughput": {t.mode: t.to_json() for t in throughput},
        "driver_cpu": {c.case: c.to_json() for c in cpu},
        "all_goals_met": all(goals),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nall goals met: {'yes' if all(goals) else 'NO'}; figures written to {args.out}")


if __name__ == "__main__":
    main()
