"""The plan X-ray: where each second of a training iteration went, per operator and per actor.

Each iteration the Trainer puts :meth:`XRay.report` into ``result["plan"]``:

- ``operators``: per operator of the plan (``"<number>:<label>"``, from 1 in dataflow order), what it did in
  the iteration: items and bytes through it, its own seconds split into ``busy_s`` (its code in
  the driver), ``wait_s`` (waiting for input: actors, threads, queues), ``transfer_s``
  (fetching arrived results) and ``blocked_out_s`` (blocked on its output in place: replay
  shards at ``max_in_flight``); ``held_out_s``, outside its own seconds (back-pressure while the
  plan ran other branches: a full learner queue, a sibling behind); its ``share`` of the
  iteration, rates, and figures it reports itself (``plan_stats``, e.g. policy lag);
- ``latency_s``: per shard of each gather, request-to-arrival seconds (median, p90, max): a
  straggler's are far above its siblings';
- ``policy_lag`` (asynchronous plans that send weights to each batch's source: IMPALA, APPO,
  Ape-X): the learner updates made since the weights a batch was sampled with were sent, on
  average over the iteration's batches;
- ``actors``: ``RolloutWorker`` (env steps, inference, the rest of sampling, Ray's serialization
  of the fragments returned, idle time, busy share, per worker), ``LearnerThread`` (learning vs
  waiting for batches, queue depth) and ``ReplayActor`` (storing vs replaying vs serializing the
  replayed batches);
- ``learner``: the driver's learning split by its timers: learning on batches (``learn_s``), or
  computing and applying gradients (A3C), and sending weights to the workers (``weight_sync_s``);
  and the trained policies' own split of their learning (in the driver, a learner thread, or a
  learner group's rank 0): getting batches ready (``load_s``: minibatch slices, decompression,
  tensors, a recurrent policy's sequences padded) and updating (``update_s``: forward pass,
  backpropagation, optimizer step; for A3C, whose workers compute the gradients, only the
  driver's applying them);
- ``driver``: the Trainer's own steps around the plan (observation filter sync, evaluation, the
  ``on_train_result`` callback, whose seconds count into ``iteration_s``);
- ``attributed_s`` / ``unattributed_s``: the operators' and the driver steps' seconds, and the
  rest of ``iteration_s``, never hidden.

``profile: false`` in the config turns all of it off (``result["plan"]`` then holds only
``iteration_s`` and ``profile``). :mod:`flowrl.plan.doctor` reads these figures back from a run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from flowrl.operators.names import APPLY_GRADS_TIMER, COMPUTE_GRADS_TIMER, LEARN_ON_BATCH_TIMER, WORKER_UPDATE_TIMER
from flowrl.plan.graph import Plan
from flowrl.policy import LearnTimes

#: The driver's learning timers the X-ray splits the learner's time by: what each is reported as.
LEARNER_TIMERS = {
    LEARN_ON_BATCH_TIMER: "learn_s",
    COMPUTE_GRADS_TIMER: "compute_grads_s",
    APPLY_GRADS_TIMER: "apply_grads_s",
    WORKER_UPDATE_TIMER: "weight_sync_s",
}


class XRay:
    """Builds one iteration's ``result["plan"]`` from the plan's statistics and the actors' reports."""

    def __init__(self, plan: Plan, *, profile: bool = True) -> None:
        self.plan = plan
        self.profile = profile
        plan.metrics.profile = profile
        # Cumulative totals (timers, the learner thread's, the replay shards') as last read, by name.
        self._totals: dict[str, float] = {}

    def report(
        self,
        iteration_s: float,
        reported: Mapping[str, Any],
        info: Mapping[str, Any],
        driver: Mapping[str, float],
        learn_times: Sequence[LearnTimes] = (),
    ) -> dict[str, Any]:
        """The iteration's X-ray. ``reported``: what the plan's own result said of the actors (the rollout
        workers' phases from ``CollectMetrics``); ``info``: the resources' statistics (``learner_thread``,
        ``replay_shards``); ``driver``: seconds of the Trainer's own steps; ``learn_times``: the trained
        policies' learning phases (cumulative)."""
        if not self.profile:
            return {"profile": False, "iteration_s": round(iteration_s, 6)}
        stats = self.plan.stats(iteration_s)
        actors = dict(reported.get("actors", {}))
        thread = info.get("learner_thread")
        if thread is not None:
            actors["LearnerThread"] = self._learner(thread, iteration_s)
        shards = info.get("replay_shards")
        if shards:
            actors["ReplayActor"] = self._shards(shards, iteration_s)
        attributed = sum(entry["time_s"] for entry in stats["operators"].values()) + sum(driver.values())
        span = iteration_s if iteration_s > 0 else 1.0
        learner = self._driver_learner() | self._learn_phases(learn_times)
        if learner:
            stats["learner"] = learner
        received = sum(entry.get("batches_received", 0) for entry in stats["operators"].values())
        if received:
            lag = sum(entry.get("policy_lag_total", 0) for entry in stats["operators"].values())
            stats["policy_lag"] = {"mean_updates": round(lag / received, 3), "batches": int(received)}
        return {
            "profile": True,
            "iteration_s": round(iteration_s, 6),
            **stats,
            "actors": actors,
            "driver": {key: round(value, 6) for key, value in driver.items()},
            "attributed_s": round(attributed, 6),
            "unattributed_s": round(max(0.0, iteration_s - attributed), 6),
            "attributed_share": round(min(1.0, attributed / span), 4),
        }

    def add_driver_time(self, report: dict[str, Any], key: str, seconds: float) -> None:
        """Count ``seconds`` the driver spent on ``key`` after the report was made (the ``on_train_result``
        callback) into the iteration: ``iteration_s`` grows, and the shares are of the longer iteration."""
        if not report.get("profile"):
            return
        before = report["iteration_s"]
        after = before + seconds
        scale = before / after if after > 0 else 1.0
        for entry in report["operators"].values():
            entry["share"] = round(entry["share"] * scale, 4)
        report["driver"][key] = round(seconds, 6)
        report["iteration_s"] = round(after, 6)
        report["attributed_s"] = round(report["attributed_s"] + seconds, 6)
        report["attributed_share"] = round(min(1.0, report["attributed_s"] / after), 4) if after > 0 else 0.0

    def _grown(self, name: str, total: float) -> float:
        """How much the cumulative ``total`` called ``name`` grew since it was last read; a total that
        starts again (a replaced replay shard) counts from 0, never as a negative."""
        last, self._totals[name] = self._totals.get(name, 0.0), total
        return total - last if total >= last else total

    def _driver_learner(self) -> dict[str, float]:
        """The iteration's seconds of the learning timers the plan's operators keep (learning on a batch,
        computing and applying gradients, sending weights to the workers); the ones that ran."""
        timers = self.plan.metrics.timers
        grown = {key: self._grown(name, timers[name].total_s) for name, key in LEARNER_TIMERS.items() if name in timers}
        return {key: round(seconds, 6) for key, seconds in grown.items() if seconds > 0}

    def _learn_phases(self, learn_times: Sequence[LearnTimes]) -> dict[str, float]:
        """The iteration's seconds of the policies' learning phases (wherever they learned: in the driver, a
        learner thread or, for a learner group, its rank 0), the ones that ran."""
        grown = {
            "load_s": self._grown("policies.load", sum(times.load_s for times in learn_times)),
            "update_s": self._grown("policies.update", sum(times.update_s for times in learn_times)),
        }
        return {key: round(seconds, 6) for key, seconds in grown.items() if seconds > 0}

    def _learner(self, learner: Mapping[str, Any], iteration_s: float) -> dict[str, Any]:
        learn_s = self._grown("learner_thread.learn", float(learner["learn_time_total_s"]))
        wait_s = self._grown("learner_thread.wait", float(learner["queue_wait_total_s"]))
        return {
            "learn_s": round(learn_s, 6),
            "wait_s": round(wait_s, 6),
            "busy_share": round(min(1.0, learn_s / iteration_s), 4) if iteration_s > 0 else 0.0,
            "inqueue_size_mean": round(float(learner["inqueue_size_mean"]), 3),
            "inqueue_capacity": learner["inqueue_capacity"],
        }

    def _shards(self, shards: list[Mapping[str, Any]], iteration_s: float) -> dict[str, Any]:
        def grown(phase: str) -> float:
            return sum(
                self._grown(f"replay_shard[{i}].{phase}", float(s.get(f"{phase}_time_total_s", 0.0)))
                for i, s in enumerate(shards)
            )

        add_s, sample_s, serialize_s = grown("add"), grown("sample"), grown("serialize")
        busy = (add_s + sample_s + serialize_s) / (iteration_s * len(shards)) if iteration_s > 0 else 0.0
        return {
            "count": len(shards),
            "add_s": round(add_s, 6),
            "sample_s": round(sample_s, 6),
            "serialize_s": round(serialize_s, 6),
            "busy_share": round(min(1.0, busy), 4),
        }
