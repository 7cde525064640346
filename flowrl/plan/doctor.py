"""``flowrl doctor``: which resource bounds a run, read from its plan X-ray, in plain words.

:func:`diagnose` averages the X-ray (``result["plan"]``, see :mod:`flowrl.plan.xray`) of a run's last
iterations and splits each iteration's seconds into what they were spent on:

- ``learner``: training: the plan's learning operators in the driver (``TrainOneStep``,
  ``ApplyGradients``, the ES/ARS updates), or a learner thread kept busy;
- ``env`` and ``inference``: waiting for the rollout workers' samples (or sampling in the
  driver), shared out by the workers' own split between stepping envs and the policy's forward
  pass;
- ``transfer``: moving experience: fetching arrived fragments (Ray's deserialization),
  concatenating them into batches in the driver, and the workers' time building fragments and
  handing them to Ray (serialization);
- ``driver``: every other operator's own work in the driver (not its waits for a learner thread,
  replay shards or sibling branches, which are reported apart), the Trainer's steps around the
  plan and what no operator accounts for.

A learner thread (IMPALA, APPO, Ape-X) learns beside the driver, so in those plans the parts can
add up to more than the iteration.

The verdict is the largest part, unless one rollout worker's fragments take far longer than its
siblings' (``straggler``: the others wait for it; read from the workers' own seconds per fragment,
else from the gathers' fragment latencies). Each verdict names the config keys to turn.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from flowrl.errors import FlowRLError
from flowrl.storage.rundir import read_results, read_run_spec

#: What the doctor can say bounds a run.
VERDICTS = ("env-bound", "inference-bound", "learner-bound", "transfer-bound", "driver-bound", "straggler")

#: Operators whose own time is the learner's (synchronous plans learn in the driver).
LEARNING_OPERATORS = ("TrainOneStep", "ApplyGradients", "ESUpdate", "ARSUpdate", "PerturbationUpdate")
#: Operators whose own work is moving experience: concatenating fragments into batches (copies).
MOVING_OPERATORS = ("concat_samples", "ConcatBatches")
#: Operators whose waiting is for the rollout workers' samples, and the driver's own sampling source.
SAMPLING_SOURCES = ("rollout_workers", "local_worker.sample()", "local_worker.evaluate_perturbations()")
#: One worker's median fragment latency this many times its siblings' median makes it a straggler.
STRAGGLER_RATIO = 3.0

_ADVICE = {
    "env-bound": [
        "num_workers: more rollout workers, if the machine has idle cores",
        "env_backend: envpool steps a worker's envs in C++ threads (Atari, classic control)",
        "make the env's step cheaper (wrappers, rendering, preprocessing)",
    ],
    "inference-bound": [
        "num_envs_per_worker: more envs per worker share each policy forward pass (batched inference)",
        "model: a smaller network (model.fcnet_hiddens, conv_filters)",
        "num_gpus_per_worker: inference on a GPU",
    ],
    "learner-bound": [
        "num_sgd_iter / sgd_minibatch_size / training_intensity: less computation per sampled step",
        "num_learners: a data-parallel learner group; num_gpus: learn on a GPU",
        "learner_queue_size: a bigger queue only smooths bursts; it cannot make the learner faster",
    ],
    "transfer-bound": [
        "compress_observations: true (LZ4 on observation columns)",
        "rollout_fragment_length: fewer, larger fragments per call",
        "smaller observations (preprocess in the env: crop, downscale, frame-stack in the model)",
    ],
    "driver-bound": [
        "move work out of the driver: callbacks and custom operators that run per iteration",
        "min_iter_time_s / timesteps_per_iteration: more work per iteration for the fixed per-iteration costs",
        "metrics_smoothing_episodes and evaluation settings: less per-iteration bookkeeping",
    ],
    "straggler": [
        "sample_min_fraction < 1: bulk-synchronous rounds stop waiting for the slowest worker",
        "sample_timeout_s: a worker past it is restarted",
        "check that worker's node and env (a slow or overloaded machine, an env instance that degraded)",
    ],
}


@dataclass
class Diagnosis:
    """What bounds a run: the ``verdict`` (one of :data:`VERDICTS`), a one-line ``summary`` with the
    numbers behind it, the ``shares`` of the iteration time per part, other ``figures`` read, and the
    config knobs to turn (``advice``)."""

    run_dir: str
    algo: str
    env: str
    iterations: list[int]
    verdict: str
    summary: str
    shares: dict[str, float]
    figures: dict[str, Any] = field(default_factory=dict)
    advice: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The diagnosis as JSON-friendly data."""
        return asdict(self)

    def report(self) -> str:
        """The diagnosis as a short report in plain words."""
        first, last = self.iterations[0], self.iterations[-1]
        lines = [
            f"flowrl doctor: {self.run_dir} ({self.algo} on {self.env}, iterations {first}-{last})",
            f"verdict: {self.verdict}: {self.summary}",
            "where each iteration's time went:",
        ]
        names = {
            "learner": "learner (training)",
            "env": "rollout workers stepping envs",
            "inference": "rollout workers' policy inference",
            "transfer": "moving experience (serialize, fetch, build, concatenate)",
            "driver": "driver (other operators, unattributed)",
        }
        width = max(len(names.get(part, part)) for part in self.shares) + 2
        for part, share in sorted(self.shares.items(), key=lambda kv: -kv[1]):
            lines.append(f"  {names.get(part, part):<{width}}{100 * share:6.1f}%")
        for key, value in self.figures.items():
            lines.append(f"  {key}: {value}")
        lines.append("what to turn:")
        lines.extend(f"  - {advice}" for advice in self.advice)
        return "\n".join(lines)


def diagnose_run(run_dir: str | os.PathLike[str], *, last: int = 5) -> Diagnosis:
    """Diagnose the run in ``run_dir`` from the X-ray of its last ``last`` iterations."""
    spec = read_run_spec(run_dir)
    return diagnose(read_results(run_dir), last=last, run_dir=str(run_dir), algo=spec.algo, env=str(spec.env))


def diagnose(
    results: Sequence[Mapping[str, Any]], *, last: int = 5, run_dir: str = "", algo: str = "", env: str = ""
) -> Diagnosis:
    """Diagnose a run from its results (``progress.jsonl``'s dicts): the last ``last`` that carry an X-ray,
    leaving out the first iteration (start-up) when there are more."""
    rayed = [
        r
        for r in results
        if isinstance(r.get("plan"), Mapping) and r["plan"].get("profile") and r["plan"].get("operators")
    ]
    if not rayed:
        raise FlowRLError(
            f"{run_dir or 'the results'}: no iteration carries a plan X-ray (result['plan'] with operators); "
            "was the run made with profile: false, or by a flowrl before the X-ray?"
        )
    if len(rayed) > 1 and rayed[0].get("training_iteration") == 1:
        rayed = rayed[1:]
    window = rayed[-last:]
    shares, figures, stragglers = _parts(window)
    verdict, summary = _verdict(shares, figures, stragglers)
    return Diagnosis(
        run_dir=run_dir,
        algo=algo,
        env=env,
        iterations=[int(r.get("training_iteration", 0)) for r in window],
        verdict=verdict,
        summary=summary,
        shares={part: round(share, 4) for part, share in shares.items()},
        figures=figures,
        advice=list(_ADVICE[verdict]),
    )


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _parts(window: Sequence[Mapping[str, Any]]) -> tuple[dict[str, float], dict[str, Any], dict[str, float]]:
    """Shares of the iteration time per part, averaged over ``window``; figures; each rollout worker's median
    seconds per fragment."""
    per_iteration: list[dict[str, float]] = []
    latencies: dict[str, list[float]] = {}
    per_fragment: dict[str, list[float]] = {}
    driver_waiting: list[float] = []
    busy: list[float] = []
    learner_busy: list[float] = []
    top_driver: dict[str, float] = {}
    for result in window:
        plan = result["plan"]
        span = float(plan.get("iteration_s") or 0.0) or 1e-9
        learner = sampling = transfer = driver = idle = 0.0
        for key, op in plan["operators"].items():
            label = key.partition(":")[2]
            if any(name in label for name in LEARNING_OPERATORS):
                learner += op["time_s"]
            elif any(source in label for source in SAMPLING_SOURCES):
                waited = op["busy_s"] if "local_worker" in label else op["wait_s"]
                sampling += waited
                transfer += op["transfer_s"]
                driver += op["time_s"] - waited - op["transfer_s"]
            elif any(name in label for name in MOVING_OPERATORS):
                transfer += op["time_s"]
            else:  # its waits are for the learner thread, replay shards or siblings: the driver idles then
                transfer += op["transfer_s"]
                driver += op["busy_s"]
                # Blocked in place is part of time_s; runs from before held_out_s had only a queue's held time there.
                idle += op["wait_s"] + (op["blocked_out_s"] if "held_out_s" in op else 0.0)
                top_driver[label] = top_driver.get(label, 0.0) + op["busy_s"]
        driver += plan.get("unattributed_s", 0.0) + sum(plan.get("driver", {}).values())
        actors = plan.get("actors", {})
        workers = actors.get("RolloutWorker")
        env_part = inference_part = 0.0
        if workers:
            # Ray serializing the fragments in the workers is part of what the driver waits for (older runs lack it).
            phases = {k: workers.get(k, 0.0) for k in ("env_s", "inference_s", "other_s", "serialize_s")}
            total = sum(phases.values()) or 1e-9
            env_part = sampling * phases["env_s"] / total
            inference_part = sampling * phases["inference_s"] / total
            transfer += sampling * (phases["other_s"] + phases["serialize_s"]) / total
            busy.append(workers["busy_share"])
            for index, worker in workers.get("per_worker", {}).items():
                if worker.get("sample_s_per_fragment") is not None:
                    per_fragment.setdefault(f"worker {index}", []).append(worker["sample_s_per_fragment"])
        else:
            env_part = sampling  # no phases reported: sampling counts as the env's
        thread = actors.get("LearnerThread")
        if thread:
            learner_busy.append(thread["busy_share"])
            learner = max(learner, thread["busy_share"] * span)
        per_iteration.append(
            {
                part: value / span
                for part, value in {
                    "learner": learner,
                    "env": env_part,
                    "inference": inference_part,
                    "transfer": transfer,
                    "driver": driver,
                }.items()
            }
        )
        driver_waiting.append(idle / span)
        for shard, latency in plan.get("latency_s", {}).items():
            if shard.startswith("rollout_workers["):
                latencies.setdefault(shard, []).append(latency["p50"])
    shares = {part: _mean([it[part] for it in per_iteration]) for part in per_iteration[0]}
    figures: dict[str, Any] = {"iteration_s (mean)": round(_mean([float(r["plan"]["iteration_s"]) for r in window]), 4)}
    if any(driver_waiting):
        figures["driver waiting on the learner, replay or other branches (mean share)"] = round(
            _mean(driver_waiting), 3
        )
    if busy:
        figures["rollout workers busy (mean share)"] = round(_mean(busy), 3)
    if learner_busy:
        figures["learner thread busy (mean share)"] = round(_mean(learner_busy), 3)
    if top_driver:
        name, seconds = max(top_driver.items(), key=lambda kv: kv[1])
        figures["busiest driver operator"] = f"{name} ({seconds / len(window):.3f} s per iteration)"
    # A worker's own seconds per fragment tell a straggler even where a bulk-synchronous round makes every
    # fragment arrive with the slowest; the gathers' latencies serve where workers report no phases.
    slowness = per_fragment if len(per_fragment) >= 2 else latencies
    return shares, figures, {name: statistics.median(values) for name, values in slowness.items()}


def _verdict(shares: Mapping[str, float], figures: dict[str, Any], stragglers: Mapping[str, float]) -> tuple[str, str]:
    if len(stragglers) >= 2:
        shard, slowest = max(stragglers.items(), key=lambda kv: kv[1])
        others = statistics.median([p50 for name, p50 in stragglers.items() if name != shard])
        figures["seconds per fragment, median per worker"] = {
            name: round(p50, 4) for name, p50 in sorted(stragglers.items())
        }
        if others > 0 and slowest >= STRAGGLER_RATIO * others:
            return "straggler", (
                f"{shard} takes {slowest / others:.1f}x its siblings' median per fragment "
                f"({slowest:.3f} s against {others:.3f} s), and the others wait for it"
            )
    part = max(shares, key=lambda p: shares[p])
    verdict = {
        "learner": "learner-bound",
        "env": "env-bound",
        "inference": "inference-bound",
        "transfer": "transfer-bound",
        "driver": "driver-bound",
    }[part]
    what = {
        "learner": "training takes",
        "env": "waiting for the rollout workers' env steps takes",
        "inference": "waiting for the rollout workers' policy forward passes takes",
        "transfer": "moving experience (serializing and fetching fragments, building and concatenating batches) takes",
        "driver": "the driver's own work (operators other than learning and sampling) takes",
    }[part]
    runner_up = sorted(shares.values())[-2] if len(shares) > 1 else 0.0
    return verdict, f"{what} {100 * shares[part]:.0f}% of each iteration (next largest part: {100 * runner_up:.0f}%)"
