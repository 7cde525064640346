"""Benchmark learner groups: samples trained per second by 1 learner and by 2 data-parallel learners.

The workload is IMPALA's on Pong (``tuned_examples/pong-impala.yaml``): the Nature CNN on 84x84x4
frame stacks, V-trace on fragments of 20 steps, one PyTorch thread per learner. Train batches are
sampled once, in this process, from ``PongNoFrameskip-v4``; then, alternating within each
repetition, the same batch is learned for ``--seconds`` of wall time by

1. one learner: the driver's policy (``num_learners: 0``, what a run does by default), and
2. a learner group of 2 actors (``num_learners: 2``, one Ray CPU each, gloo): each takes half
   of every batch and their gradients are averaged with one all-reduce per update.

Reported per batch size: samples (env steps) trained per second, medians over repetitions, and
the ratio 2 learners / 1. On this project's 2-core machine the two learners have a core each, so
the ideal ratio is 2. ``--gpu`` puts the single learner on the first GPU and each group learner on a
GPU Ray gives it (NCCL; needs a machine with at least 2 GPUs; the two never learn at the same time).
Run from the repository root::

    python benchmarks/learner_scaling.py             # about three minutes
    python benchmarks/learner_scaling.py --quick     # a smoke test (~1 minute)
    python benchmarks/learner_scaling.py --batches 640 2560 --reps 5 --out /tmp/learners.json

It prints a table and writes the figures as JSON to ``--out`` (default
``benchmarks/results/learner_scaling.json``). Needs the atari extra (``pip install 'flowrl-ray[atari]'``).
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
from typing import Any, Callable

import ray
import torch
import yaml

from flowrl.actors import WorkerSet
from flowrl.actors.learner_group import learner_group
from flowrl.actors.learner_thread import learn_on_local_worker
from flowrl.actors.placement import learner_request
from flowrl.algorithms import get_algorithm
from flowrl.data import SampleBatch, concat_samples
from flowrl.engine.build import policy_specs, validated_config
from flowrl.envs import get_env_creator

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "learner_scaling.json"
ENV_ID = "PongNoFrameskip-v4"


def learner_config(gpu: bool) -> dict[str, Any]:
    """The Pong tuned example's learning keys, a group of 2 learners of one CPU (and a GPU each with ``gpu``)."""
    config = dict(yaml.safe_load((ROOT / "tuned_examples" / "pong-impala.yaml").read_text())["config"])
    config.update(
        {
            "num_workers": 1,
            "num_learners": 2,
            "num_cpus_per_learner": 1,
            "learner_threads": 1,
            "seed": 0,
            "num_gpus": 1 if gpu else 0,
            "num_gpus_per_learner": 1 if gpu else 0,
        }
    )
    return config


def sample_batch(workers: WorkerSet, steps: int) -> SampleBatch:
    """``steps`` env steps sampled by the local worker, whole fragments."""
    fragments = []
    while sum(f.count for f in fragments) < steps:
        fragments.append(workers.local_worker().sample())
    return concat_samples(fragments).slice(0, steps)


def rate(learn: Callable[[], Any], steps: int, seconds: float) -> float:
    """Samples trained per second by repeated ``learn()`` calls on a batch of ``steps`` over at least ``seconds``."""
    learn()  # warm-up
    updates, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        learn()
        updates += 1
    return updates * steps / (time.perf_counter() - start)


def measure(batch_sizes: list[int], reps: int, seconds: float, gpu: bool) -> dict[str, Any]:
    algorithm = get_algorithm("impala")
    config = validated_config(algorithm, learner_config(gpu))
    creator = get_env_creator(ENV_ID)
    # The local worker samples and is the single learner; the group's 2 actors have a bundle each.
    workers = WorkerSet(
        env_creator=creator,
        policy_specs=policy_specs(algorithm, config, creator),
        config=config,
        num_workers=0,
        bundles=[learner_request(config)],
    )
    group = learner_group(workers, config)
    assert group is not None
    sequence = config.rollout_fragment_length
    figures: dict[str, Any] = {}
    try:
        for steps in batch_sizes:
            batch = sample_batch(workers, steps)
            one: list[float] = []
            two: list[float] = []
            for _ in range(reps):  # alternating, so that a load change hits both
                one.append(
                    rate(
                        lambda: learn_on_local_worker(workers.local_worker(), batch, sequence_length=sequence),
                        steps,
                        seconds,
                    )
                )
                two.append(rate(lambda: group.learn(batch, sequence_length=sequence), steps, seconds))
            figures[str(steps)] = {
                "one_learner_samples_per_s": statistics.median(one),
                "two_learners_samples_per_s": statistics.median(two),
                "ratio": statistics.median(two) / statistics.median(one),
                "reps_one": one,
                "reps_two": two,
            }
            print(
                f"  batch {steps}: 1 learner {statistics.median(one):.0f}, "
                f"2 learners {statistics.median(two):.0f} samples/s",
                flush=True,
            )
    finally:
        group.stop()
        workers.stop()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, nargs="+", default=[640, 2560], help="train batch sizes (env steps)")
    parser.add_argument("--seconds", type=float, default=10.0, help="measured window of each rate")
    parser.add_argument("--reps", type=int, default=3, help="repetitions per figure (medians are reported)")
    parser.add_argument("--gpu", action="store_true", help="each learner on a GPU of its own (needs 2 GPUs)")
    parser.add_argument("--quick", action="store_true", help="short windows, one batch size: a smoke test")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where to write the JSON figures")
    args = parser.parse_args()
    batches, seconds, reps = ([640], 3.0, 1) if args.quick else (args.batches, args.seconds, args.reps)
    torch.set_num_threads(1)  # the single learner as a run's driver learns (learner_threads: 1)
    load = os.getloadavg()[0]
    ray.init(
        num_cpus=2,
        num_gpus=torch.cuda.device_count() if args.gpu else 0,
        include_dashboard=False,
        logging_level=logging.ERROR,
        log_to_driver=False,
    )
    try:
        figures = measure(batches, reps, seconds, args.gpu)
    finally:
        ray.shutdown()
    report = {
        "machine": {
            "cpu_count": os.cpu_count(),
            "gpus": torch.cuda.device_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "torch": torch.__version__,
            "ray": ray.__version__,
            "load_avg_1m_before": load,
        },
        "settings": {
            "env": ENV_ID,
            "model": "Nature CNN (pong-impala.yaml)",
            "device": "cuda" if args.gpu else "cpu",
            "seconds": seconds,
            "reps": reps,
        },
        "batches": figures,
    }
    print(
        f"\nIMPALA's learner on {ENV_ID} (Nature CNN, 84x84x4), {report['settings']['device']}, "
        "samples trained per second "
        f"(medians of {reps}; 1-min load before: {load:.1f})"
    )
    print(f"{'batch':>8}{'1 learner':>12}{'2 learners':>12}{'2 / 1':>8}")
    for steps, f in figures.items():
        print(
            f"{steps:>8}{f['one_learner_samples_per_s']:>12.0f}{f['two_learners_samples_per_s']:>12.0f}{f['ratio']:>8.2f}"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(f"\nfigures written to {args.out}")


if __name__ == "__main__":
    main()
