"""The ``flowrl`` command."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Sequence

from flowrl.ray_runtime import ray_session


def _demo(args: argparse.Namespace) -> int:
    """Run a small dataflow over shard actors and check its answer."""
    from flowrl.iterators import LocalIterator, from_range

    def count_items(batch: list[int]) -> int:
        metrics = LocalIterator.get_metrics()
        metrics.counters["items"] += len(batch)
        return sum(batch)

    with ray_session(address=args.address):
        plan = (
            from_range(args.items, num_shards=args.num_shards)
            .for_each(lambda x: x * x)  # runs inside the shard actors
            .batch(args.batch_size)
            .gather_async()
            .for_each(count_items)  # runs here, in the driver
        )
        print(f"plan: {plan!r}")
        start = time.perf_counter()
        total = sum(plan)
        elapsed = time.perf_counter() - start
    expected = sum(x * x for x in range(args.items))
    print(f"sum of squares below {args.items}: {total} (expected {expected})")
    print(f"{args.items} items through {args.num_shards} shard actors in {elapsed:.2f}s "
          f"({args.items / elapsed:,.0f} items/s)")
    return 0 if total == expected else 1


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``flowrl`` command."""
    parser = argparse.ArgumentParser(prog="flowrl", description="Distributed RL as dataflow execution plans.")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run a small dataflow over Ray shard actors")
    demo.add_argument("--items", type=int, default=100_000, help="numbers to square and sum (default 100000)")
    demo.add_argument("--num-shards", type=int, default=2, help="shard actors (default 2)")
    demo.add_argument("--batch-size", type=int, default=1000, help="items per message from a shard (default 1000)")
    demo.add_argument("--address", default=None, help="Ray cluster to join (default: start an embedded one)")
    demo.set_defaults(func=_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``flowrl`` console script."""
    args = build_parser().parse_args(argv)
    for name in ("items", "num_shards", "batch_size"):
        if getattr(args, name, 1) < 1:
            print(f"flowrl: error: --{name.replace('_', '-')}={getattr(args, name)} must be >= 1", file=sys.stderr)
            return 2
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
