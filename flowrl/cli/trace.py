"""``flowrl trace``: a run's traced iterations merged into one Chrome / Perfetto trace file."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from flowrl.cli.args import RUN_DIR_HELP, add_command, iteration_window
from flowrl.cli.exits import EXIT_OK

if TYPE_CHECKING:
    from flowrl.cli.args import Subparsers


def run(args: argparse.Namespace) -> int:
    """``flowrl trace RUN_DIR``: write the trace file and say what is in it."""
    from flowrl.plan.trace import write_trace

    trace = write_trace(args.run_dir, args.output, args.iterations)
    events = trace["traceEvents"]
    operators = sum(1 for event in events if event.get("cat") == "operator")
    actor_spans = [event for event in events if event.get("cat") == "actor"]
    samples = sum(1 for event in actor_spans if event["name"] == "RolloutWorker.sample()")
    workers = len({event["args"]["worker"] for event in actor_spans})
    iterations = trace["otherData"]["iterations"]
    shown = f"iteration {iterations[0]}" if len(iterations) == 1 else f"iterations {', '.join(map(str, iterations))}"
    print(
        f"{args.output}: {shown} of {args.run_dir}: {operators} operator calls, {samples} samples "
        f"and {len(actor_spans) - samples} hand-offs of {workers} rollout worker{'s' if workers != 1 else ''}"
    )
    print("open it in https://ui.perfetto.dev or chrome://tracing")
    return EXIT_OK


HELP = "write a run's traced iterations as a Chrome / Perfetto trace"
DESCRIPTION = (
    "Merge the spans a run recorded (trace/iteration_<n>.json, for the iterations its "
    "config's trace_iterations names) into one Chrome trace file: the plan's operators "
    "nested as they pull from each other, and the rollout workers' sample() calls "
    "with their env and inference seconds."
)


def add_parser(subparsers: Subparsers) -> None:
    """Register ``flowrl trace`` and its flags."""
    tracer = add_command(subparsers, "trace", run, help=HELP, description=DESCRIPTION, run_dir=RUN_DIR_HELP)
    tracer.add_argument(
        "-o", "--output", default="trace.json", metavar="FILE.json", help="the trace file to write (default trace.json)"
    )
    tracer.add_argument(
        "--iterations",
        type=iteration_window,
        metavar="A:B",
        help="the traced iterations from A to B (or N alone) to include (default: every one recorded)",
    )
