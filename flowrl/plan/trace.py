"""A run's iterations as a Chrome / Perfetto trace: the plan's operators and the rollout workers' samples on a timeline.

Recording. A run (:class:`flowrl.runs.run.Run`) traces the training iterations its config's
``trace_iterations`` names (``"2:2"`` by default; needs ``profile: true``) with
:func:`traced_iteration`: while the iteration runs, every measured stage of the plan records
each ``next()`` call (:class:`~flowrl.iterators.metrics.Span`, through the plan's metrics
context) and every rollout worker each :meth:`~flowrl.actors.RolloutWorker.sample` call
(:class:`~flowrl.actors.rollout_worker.SampleSpan`) and Ray's hand-off of each fragment it returned
(:class:`~flowrl.iterators.HandOffSpan`: serializing and storing it). The run writes one file per traced
iteration, ``<run_dir>/trace/iteration_<n>.json``::

    {"iteration": 2, "start_ns": ..., "end_ns": ...,          # the training iteration, wall clock
     "driver": {"pid": 4242, "thread_id": 4242},              # the process and thread that ran it
     "operators": [{"operator": "6:for_each(TrainOneStep)", "thread_id": ..., "start_ns": ...,
                    "end_ns": ..., "ready": true}, ...],      # each next() call, keyed as in result["plan"]
     "samples": [{"worker": 1, "pid": ..., "thread_id": ..., "start_ns": ..., "duration_ns": ...,
                  "env_s": ..., "inference_s": ..., "steps": 64}, ...],
     "handoffs": [{"worker": 1, "pid": ..., "thread_id": ..., "start_ns": ..., "duration_ns": ...}, ...],
                                                              # Ray serializing and storing each returned fragment
     "workers_unreported": []}                                # rollout workers that did not answer

A run calls :func:`train_iteration` for each iteration (with :func:`traced_window`'s iterations) and
:func:`write_plan` for its ``plan.json``; each takes a :class:`TracedTrainer`, the part of the Trainer they use.

Times are ``time.time_ns()`` of the process that recorded them: the wall clock, so that spans of
the driver and of the workers line up (as well as the nodes' clocks agree).

Reading. :func:`build_trace` merges the recorded iterations of a window into one trace in the
Chrome trace event format (``{"traceEvents": [...]}``: complete events ``"ph": "X"`` with ``ts``
and ``dur`` in microseconds, and metadata events naming processes and threads), which
https://ui.perfetto.dev and ``chrome://tracing`` open. An operator's span contains the spans of
the operators it pulls from, and a rollout worker sampling in the driver (``num_workers: 0``)
shows its ``sample()`` inside the operator that called it. ``flowrl trace RUN_DIR`` writes it.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from flowrl.config import parse_iteration_window
from flowrl.deferred import ray
from flowrl.errors import RunError
from flowrl.storage.rundir import PLAN_FILE, TRACE_DIR, _write_json, read_run_spec

if TYPE_CHECKING:  # the actors import torch: load them only when a run starts
    from flowrl.actors import WorkerSet
    from flowrl.actors.rollout_worker import TracedWork
    from flowrl.config import TrainerConfig
    from flowrl.plan.graph import Plan

#: Longest wait for the rollout workers to start or stop recording their samples (their control
#: threads answer even mid-sample); a worker that does not answer in time is listed as unreported.
WORKER_CALL_TIMEOUT_S = 10.0

_FILE_PREFIX, _FILE_SUFFIX = "iteration_", ".json"


class TracedTrainer(Protocol):
    """What recording a run's iterations uses of a :class:`~flowrl.engine.trainer.Trainer`."""

    @property
    def config(self) -> TrainerConfig: ...

    @property
    def plan(self) -> Plan: ...

    @property
    def workers(self) -> WorkerSet: ...

    @property
    def iteration(self) -> int: ...

    def train(self) -> dict[str, Any]: ...


def trace_file(run_dir: str | os.PathLike[str], iteration: int) -> Path:
    """Where a run directory keeps the spans of training iteration ``iteration``."""
    return Path(run_dir) / TRACE_DIR / f"{_FILE_PREFIX}{iteration:06d}{_FILE_SUFFIX}"


# --- recording ---------------------------------------------------------------------------------------


def write_plan(run_dir: str | os.PathLike[str], trainer: TracedTrainer) -> None:
    """Write ``plan.json`` into ``run_dir``: the graph of the plan ``trainer`` runs (read by
    ``flowrl plan RUN_DIR``)."""
    _write_json(Path(run_dir) / PLAN_FILE, trainer.plan.graph.to_dict())


def traced_window(trainer: TracedTrainer) -> tuple[int, int] | None:
    """The iterations whose spans a run of ``trainer`` records (its config's ``trace_iterations``): None when
    ``profile`` is off, which measures no operator."""
    return parse_iteration_window(trainer.config.trace_iterations) if trainer.config.profile else None


def train_iteration(
    trainer: TracedTrainer, run_dir: str | os.PathLike[str], traced: tuple[int, int] | None
) -> dict[str, Any]:
    """One training iteration of ``trainer``; when ``traced`` (first, last) holds it, its spans are recorded and
    written to ``<run_dir>/trace/iteration_<n>.json`` (see :mod:`flowrl.plan.trace`)."""
    iteration = trainer.iteration + 1
    if traced is None or not traced[0] <= iteration <= traced[1]:
        return trainer.train()
    result, record = traced_iteration(trainer)
    path = trace_file(run_dir, iteration)
    path.parent.mkdir(exist_ok=True)
    _write_json(path, record)
    return result


def traced_iteration(trainer: TracedTrainer) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run one training iteration (``trainer.train()``) with its spans recorded: its result, and its
    trace record (the contents of its ``trace/iteration_<n>.json``, see the module docstring).

    An error in the iteration propagates; the recording is switched off first (without waiting
    for the remote workers' answers).
    """
    metrics = trainer.plan.metrics
    unreported = _tell_workers(trainer.workers, True)[1]
    metrics.spans = []
    start_ns = time.time_ns()
    try:
        result = trainer.train()
    except BaseException:
        metrics.spans = None
        _tell_workers(trainer.workers, False, wait=False)
        raise
    end_ns = time.time_ns()
    spans, metrics.spans = metrics.spans, None
    work, unreported_at_end = _tell_workers(trainer.workers, False)
    keys = trainer.plan.graph.operator_keys()  # stages hidden from the graph (plumbing) are left out
    record = {
        "iteration": trainer.iteration,
        "start_ns": start_ns,
        "end_ns": end_ns,
        "driver": {"pid": os.getpid(), "thread_id": threading.get_native_id()},
        "operators": [
            {
                "operator": keys[span.stage_id],
                "thread_id": span.thread_id,
                "start_ns": span.start_ns,
                "end_ns": span.end_ns,
                "ready": span.ready,
            }
            for span in spans
            if span.stage_id in keys
        ],
        "samples": [{"worker": index, **span._asdict()} for index, traced in work for span in traced.samples],
        "handoffs": [
            {"worker": index, "pid": traced.pid, **span._asdict()} for index, traced in work for span in traced.handoffs
        ],
        "workers_unreported": sorted(set(unreported) | set(unreported_at_end)),
    }
    return result, record


def _tell_workers(workers: WorkerSet, on: bool, *, wait: bool = True) -> tuple[list[tuple[int, TracedWork]], list[int]]:
    """Switch the recording of every rollout worker on or off: ``(worker index, what it recorded)``, and the
    indices of the remote workers that did not answer within the timeout."""
    from flowrl.actors.rollout_worker import control_call

    spans = [(0, workers.local_worker().trace_samples(on))]
    remote = workers.remote_workers()
    if not remote:
        return spans, []
    refs = {
        control_call(worker, "trace_samples", on): index
        for worker, index in zip(remote, workers.remote_worker_indices())
    }
    if not wait:
        return spans, []
    ready, pending = ray.wait(list(refs), num_returns=len(refs), timeout=WORKER_CALL_TIMEOUT_S)
    unreported = [refs[ref] for ref in pending]
    for ref in ready:
        try:
            spans.append((refs[ref], ray.get(ref)))
        except ray.exceptions.RayError:  # a dead worker: its replacement records from the next iteration
            unreported.append(refs[ref])
    return spans, sorted(unreported)


# --- reading -----------------------------------------------------------------------------------------


def recorded_iterations(run_dir: str | os.PathLike[str]) -> list[int]:
    """The iterations whose spans a run directory holds, in order."""
    found = []
    for path in (Path(run_dir) / TRACE_DIR).glob(f"{_FILE_PREFIX}*{_FILE_SUFFIX}"):
        number = path.name.removeprefix(_FILE_PREFIX).removesuffix(_FILE_SUFFIX)
        if number.isdigit():
            found.append(int(number))
    return sorted(found)


def build_trace(run_dir: str | os.PathLike[str], iterations: tuple[int, int] | None = None) -> dict[str, Any]:
    """The recorded iterations of ``run_dir`` from ``iterations[0]`` to ``iterations[1]`` (None: all of
    them) as one Chrome trace (a JSON object with ``traceEvents``).

    Raises :class:`~flowrl.errors.RunError` for a directory that is not a run directory, and
    when none of the iterations asked for was recorded (naming the ones that were).
    """
    directory = Path(run_dir)
    spec = read_run_spec(directory)
    recorded = recorded_iterations(directory)
    chosen = [n for n in recorded if iterations is None or iterations[0] <= n <= iterations[1]]
    if not chosen:
        asked = "" if iterations is None else f" among iterations {iterations[0]} to {iterations[1]}"
        if recorded:
            held = f"the traced iterations are {', '.join(map(str, recorded))}"
        else:
            config = spec.config
            held = (
                f"it traced none (its config: trace_iterations={config.get('trace_iterations')!r}, "
                f"profile={config.get('profile')!r}; runs started before flowrl recorded traces have none)"
            )
        raise RunError(f"run directory {str(directory)!r}: no traced iteration{asked}; {held}")
    records = [_read_record(trace_file(directory, n)) for n in chosen]
    return chrome_trace(records, run_dir=str(directory))


def _read_record(path: Path) -> dict[str, Any]:
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise RunError(f"cannot read the trace file {str(path)!r} ({e})") from None
    if not isinstance(record, dict) or not all(key in record for key in ("iteration", "start_ns", "end_ns", "driver")):
        raise RunError(
            f"{str(path)!r} is not a trace file written by a flowrl run (no iteration, start_ns, end_ns, driver)"
        )
    return record


def chrome_trace(records: Sequence[Mapping[str, Any]], *, run_dir: str = "") -> dict[str, Any]:
    """Trace records (:func:`traced_iteration`'s) as one Chrome trace: an ``iteration <n>`` span on the
    driver's thread, a span per operator ``next()`` call named by the operator's label (``args``: its
    key, whether it gave an item), a ``RolloutWorker.sample()`` span per sample (``args``: worker,
    env steps, env, inference and other seconds) and a hand-off span per fragment Ray serialized and
    stored after it, on each recording process and thread."""
    origin = min(
        int(entry["start_ns"])
        for record in records
        for entry in (record, *record.get("operators", ()), *record.get("samples", ()), *record.get("handoffs", ()))
    )
    events: list[dict[str, Any]] = []
    processes: dict[int, str] = {}
    threads: dict[tuple[int, int], str] = {}

    def span(name: str, category: str, pid: int, tid: int, start_ns: int, end_ns: int, args: dict[str, Any]) -> None:
        events.append(
            {
                "ph": "X",
                "name": name,
                "cat": category,
                "pid": pid,
                "tid": tid,
                "ts": (start_ns - origin) / 1000,
                "dur": max(0, end_ns - start_ns) / 1000,
                "args": args,
            }
        )

    for record in records:
        iteration, pid, main = (
            int(record["iteration"]),
            int(record["driver"]["pid"]),
            int(record["driver"]["thread_id"]),
        )
        processes[pid] = f"driver (pid {pid})"
        threads[(pid, main)] = "training loop"
        span(
            f"iteration {iteration}",
            "iteration",
            pid,
            main,
            int(record["start_ns"]),
            int(record["end_ns"]),
            {"iteration": iteration, "workers_unreported": record.get("workers_unreported", [])},
        )
        for op in record.get("operators", ()):
            tid = int(op["thread_id"])
            threads.setdefault((pid, tid), f"thread {tid}")
            label = str(op["operator"]).partition(":")[2]
            span(
                label,
                "operator",
                pid,
                tid,
                int(op["start_ns"]),
                int(op["end_ns"]),
                {"operator": op["operator"], "ready": op["ready"], "iteration": iteration},
            )
        for sample in record.get("samples", ()):
            worker_pid, tid, start = int(sample["pid"]), int(sample["thread_id"]), int(sample["start_ns"])
            processes.setdefault(worker_pid, f"RolloutWorker {sample['worker']} (pid {worker_pid})")
            threads.setdefault((worker_pid, tid), "sample")
            env_s, inference_s = float(sample["env_s"]), float(sample["inference_s"])
            duration_s = int(sample["duration_ns"]) / 1e9
            span(
                "RolloutWorker.sample()",
                "actor",
                worker_pid,
                tid,
                start,
                start + int(sample["duration_ns"]),
                {
                    "worker": sample["worker"],
                    "steps": sample["steps"],
                    "env_s": env_s,
                    "inference_s": inference_s,
                    "other_s": round(max(0.0, duration_s - env_s - inference_s), 9),
                    "iteration": iteration,
                },
            )
        for handoff in record.get("handoffs", ()):
            worker_pid, tid, start = int(handoff["pid"]), int(handoff["thread_id"]), int(handoff["start_ns"])
            processes.setdefault(worker_pid, f"RolloutWorker {handoff['worker']} (pid {worker_pid})")
            threads.setdefault((worker_pid, tid), "sample")
            span(
                "Ray hand-off (serialize + store)",
                "actor",
                worker_pid,
                tid,
                start,
                start + int(handoff["duration_ns"]),
                {"worker": handoff["worker"], "iteration": iteration},
            )
    metadata = [
        {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "ts": 0, "args": {"name": name}}
        for pid, name in processes.items()
    ]
    metadata += [
        {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "ts": 0, "args": {"name": name}}
        for (pid, tid), name in threads.items()
    ]
    return {
        "traceEvents": metadata + events,
        "displayTimeUnit": "ms",
        "otherData": {
            "run_dir": run_dir,
            "iterations": [int(record["iteration"]) for record in records],
            "clock": "time.time_ns() of each process, from the earliest span",
        },
    }


def write_trace(
    run_dir: str | os.PathLike[str], out: str | os.PathLike[str], iterations: tuple[int, int] | None = None
) -> dict[str, Any]:
    """Write :func:`build_trace`'s trace to ``out`` (JSON); returns it."""
    trace = build_trace(run_dir, iterations)
    path = Path(out)
    try:
        path.write_text(json.dumps(trace) + "\n", encoding="utf-8")
    except OSError as e:
        raise RunError(f"cannot write the trace to {str(path)!r} ({e})") from None
    return trace
