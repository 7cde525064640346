"""A run's plan with its X-ray: loading it, averaging it, watching it.

A run directory holds its plan's graph (``plan.json``, written when the run starts or resumes)
and, in every result of ``progress.jsonl``, the plan X-ray (``result["plan"]``, see
:mod:`flowrl.plan.xray`). :func:`load_view` reads both and averages the X-ray over the run's last
iterations (the first iteration, a warm-up, is left out when there are others) into a
:class:`~flowrl.plan.render.PlanView`, which :mod:`flowrl.plan.render` draws as text, Mermaid or DOT
and :mod:`flowrl.plan.html` as HTML (:func:`render` picks one by format name; :func:`render_run`);
:func:`watch_run` redraws the text as a running run goes on.

``flowrl plan RUN_DIR [--format text|mermaid|dot|html] [--last N] [--live]`` prints them.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TextIO

from flowrl.errors import FlowRLError, RunError
from flowrl.plan.graph import PlanGraph, graph_from_dict
from flowrl.plan.html import render_html
from flowrl.plan.render import PlanView, as_number, render_dot, render_mermaid, render_text
from flowrl.storage.results import finite_number
from flowrl.storage.rundir import PLAN_FILE, PROGRESS_FILE, RunSpec, read_results, read_run_spec

DEFAULT_LAST = 5

Format = Literal["text", "mermaid", "dot", "html"]


class NoXRayError(RunError):
    """A run directory with no result holding X-ray figures (yet): no finished iteration, or ``profile: false``."""


# --- reading ------------------------------------------------------------------------------------------


def read_plan_graph(run_dir: str | os.PathLike[str]) -> PlanGraph:
    """The graph in a run directory's ``plan.json``.

    Raises :class:`~flowrl.errors.RunError` for a directory that is not a run directory, or a
    run without ``plan.json`` (started by a flowrl that did not write it) or with a damaged one.
    """
    directory = Path(run_dir)
    return _read_graph(directory, read_run_spec(directory))


def _read_graph(directory: Path, spec: RunSpec) -> PlanGraph:
    path = directory / PLAN_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RunError(
            f"run directory {str(directory)!r} has no {PLAN_FILE}: it was started by an older flowrl, which "
            f"did not record the plan's graph; `flowrl plan --algo {spec.algo} --env {spec.env}` prints "
            f"the graph without figures"
        ) from None
    except (OSError, ValueError) as e:
        raise RunError(f"cannot read {str(path)!r} ({e})") from None
    try:
        return graph_from_dict(data)
    except FlowRLError as e:
        raise RunError(f"{str(path)!r}: {e}") from None


def xray_window(results: Sequence[Mapping[str, Any]], last: int = DEFAULT_LAST) -> list[Mapping[str, Any]]:
    """The last ``last`` results holding X-ray figures, leaving out the run's first iteration when there are others."""
    measured = [
        r for r in results if isinstance(r.get("plan"), Mapping) and isinstance(r["plan"].get("operators"), Mapping)
    ]
    if len(measured) > 1 and measured[0].get("training_iteration") == 1:
        measured = measured[1:]
    return measured[-last:] if last > 0 else []


def average_xray(plans: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The mean of X-rays (``result["plan"]`` dicts), number by number, with the driver's and the
    unattributed shares of each iteration added (``driver_share``, ``unattributed_share``)."""
    shared = []
    for plan in plans:
        span = as_number(plan.get("iteration_s")) or 1.0
        shared.append(
            {
                **plan,
                "driver_share": {key: as_number(value) / span for key, value in plan.get("driver", {}).items()},
                "unattributed_share": as_number(plan.get("unattributed_s")) / span,
            }
        )
    return _mean_tree(shared)


def _mean_tree(trees: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Nested dicts averaged leaf by leaf (over the dicts holding each key); what is not a number keeps
    its last value."""
    averaged: dict[str, Any] = {}
    for key in dict.fromkeys(key for tree in trees for key in tree):
        values = [tree[key] for tree in trees if key in tree]
        if all(isinstance(value, Mapping) for value in values):
            averaged[key] = _mean_tree(values)
        elif all(finite_number(value) is not None for value in values):
            averaged[key] = sum(float(value) for value in values) / len(values)
        else:
            averaged[key] = values[-1]
    return averaged


def load_view(run_dir: str | os.PathLike[str], last: int = DEFAULT_LAST) -> PlanView:
    """A run's graph and its X-ray averaged over its last ``last`` measured iterations (see :func:`xray_window`).

    Raises :class:`~flowrl.errors.RunError` as :func:`read_plan_graph` does, and
    :class:`NoXRayError` when no result has X-ray figures yet.
    """
    directory = Path(run_dir)
    spec = read_run_spec(directory)
    graph = _read_graph(directory, spec)
    results = read_results(directory)
    window = xray_window(results, last)
    if not window:
        if not results:
            why = f"no iteration has finished yet ({PROGRESS_FILE} holds no result)"
        else:
            why = (
                f"none of its {len(results)} results has X-ray figures (its config has profile: false, which "
                f"measures nothing; train with --set profile=true)"
            )
        raise NoXRayError(f"run directory {str(directory)!r}: {why}")
    iterations = tuple(int(r.get("training_iteration") or 0) for r in window)
    return PlanView(directory, spec.algo, graph, iterations, average_xray([r["plan"] for r in window]))


_RENDERERS: dict[str, Callable[[PlanView], str]] = {
    "text": render_text,
    "mermaid": render_mermaid,
    "dot": render_dot,
    "html": render_html,
}


def render(view: PlanView, fmt: Format = "text") -> str:
    """``view`` drawn in format ``fmt``."""
    return _RENDERERS[fmt](view)


def render_run(run_dir: str | os.PathLike[str], fmt: Format = "text", last: int = DEFAULT_LAST) -> str:
    """A run's plan with its X-ray, averaged over its last ``last`` measured iterations, in format ``fmt``."""
    return render(load_view(run_dir, last), fmt)


CLEAR_SCREEN = "\x1b[H\x1b[2J"


def watch_run(
    run_dir: str | os.PathLike[str], *, last: int = DEFAULT_LAST, interval_s: float = 2.0, stream: TextIO | None = None
) -> None:
    """Redraw :func:`render_run`'s text every ``interval_s`` seconds until Ctrl-C (the ``KeyboardInterrupt``
    propagates), re-reading the run each time: a running run appends to its ``progress.jsonl``.

    On a terminal each drawing replaces the last. Until the run has X-ray figures it says so and
    waits; any other error (not a run directory, no ``plan.json``) is raised at once.
    """
    out = stream if stream is not None else sys.stdout
    read_plan_graph(run_dir)
    clear = CLEAR_SCREEN if out.isatty() else ""
    while True:
        try:
            text = render_run(run_dir, "text", last)
        except NoXRayError as e:
            text = f"{e}; waiting for one"
        out.write(f"{clear}{text}\n\n{time.strftime('%H:%M:%S')}: redrawn every {interval_s:g} s; Ctrl-C to stop\n")
        out.flush()
        time.sleep(interval_s)
