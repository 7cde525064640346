"""Drawing a plan: the one renderer family, for text, Mermaid, DOT and HTML.

What is drawn is a :class:`PlanView`: a plan's graph under a name and, for a run's plan, its
X-ray averaged over some iterations (the figures; :mod:`flowrl.plan.views` loads them from a run
directory). Without figures, a bare graph is drawn as :meth:`Plan.describe() <flowrl.plan.graph.Plan.describe>`,
``to_mermaid()``, ``to_dot()`` and ``flowrl plan --algo X`` print it: operators, actors and the labelled
edges. With them, each operator is coloured by its share of the iteration (white to red) and each edge
into an operator is labelled with the rate of what flows along it:

- :func:`render_text`: a bare graph as indented text (each operator, what it reads from, the actors it
  touches); with figures, the operators with their share, own seconds (busy, waiting for input,
  fetching results) and rates; the driver's steps; the unattributed rest, and the total; the
  actors (rollout workers' env, inference, other and idle time, the learner thread, the replay
  shards); the latency of each gather's shards; the flows along the edges;
- :func:`render_mermaid` and :func:`render_dot`: the graph; with figures, fills by share (actors by how
  busy they were) and the figures in the labels;
- :func:`~flowrl.plan.html.render_html` (in :mod:`flowrl.plan.html`): (with figures only) one
  self-contained page (an inline SVG of the graph and tables of every figure; no scripts, no
  external files).

:func:`flowrl.plan.views.render` picks one of them by format name.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from flowrl.errors import FlowRLError
from flowrl.iterators import StageNode
from flowrl.storage.results import finite_number

# The colour scale of shares: white (0) to red (1).
_WHITE, _RED = (255, 255, 255), (214, 39, 40)


class Graph(Protocol):
    """What the renderers read of a plan graph (:class:`flowrl.plan.graph.PlanGraph` has it)."""

    @property
    def operators(self) -> Mapping[int, StageNode]: ...

    @property
    def actors(self) -> Mapping[str, int]: ...

    @property
    def edges(self) -> Sequence[tuple[str, str, str]]: ...

    def op_id(self, stage: StageNode) -> str: ...

    def actor_id(self, actor_class: str) -> str: ...

    def actor_label(self, actor_class: str) -> str: ...

    def operator_keys(self) -> dict[int, str]: ...


@dataclass(frozen=True)
class PlanView:
    """A plan's graph, drawn under ``name``, and a run's X-ray averaged over ``iterations``.

    ``figures`` is None for a bare graph (nothing measured; ``run_dir`` None too). Otherwise it has
    the shape of ``result["plan"]`` (``operators`` by key, ``actors``, ``latency_s``, ``driver``,
    ``iteration_s``, ``unattributed_s``), each number the mean over the iterations, plus
    ``driver_share`` (per driver step) and ``unattributed_share``: shares of the iteration that add
    up to 1 with the operators' ``share`` (when nothing overlaps).
    """

    run_dir: Path | None
    name: str
    graph: Graph
    iterations: tuple[int, ...] = ()
    figures: dict[str, Any] | None = None

    def operator(self, stage_id: int) -> Mapping[str, Any]:
        """The averaged figures of an operator of :attr:`graph` (empty if the results have none)."""
        key = self.graph.operator_keys()[stage_id]
        entry: Mapping[str, Any] = (self.figures or {}).get("operators", {}).get(key, {})
        return entry

    def actor(self, actor_class: str) -> Mapping[str, Any]:
        """The averaged figures of an actor group (empty if the X-ray reports none for it)."""
        entry: Mapping[str, Any] = (self.figures or {}).get("actors", {}).get(actor_class, {})
        return entry

    def total_share(self) -> float:
        """The operators', the driver steps' and the unattributed shares, summed (about 1)."""
        figures = _figures(self)
        operators = sum(as_number(entry.get("share")) for entry in figures.get("operators", {}).values())
        driver: float = sum(figures.get("driver_share", {}).values())
        return operators + driver + as_number(figures.get("unattributed_share"))


def _figures(view: PlanView) -> dict[str, Any]:
    """The view's figures, for what only a measured plan has (the X-ray's tables, the HTML page)."""
    if view.figures is None:
        raise FlowRLError(f"plan {view.name}: this view of its graph has no measured figures (a run's plan has them)")
    return view.figures


# --- figures as text ----------------------------------------------------------------------------------


def as_number(value: Any) -> float:
    """A figure as a float: 0 for a missing or non-finite one."""
    number = finite_number(value)
    return 0.0 if number is None else number


def _percent(share: Any) -> str:
    return f"{100 * as_number(share):.1f}%"


def _seconds(value: Any) -> str:
    seconds = as_number(value)
    return f"{seconds:.2f} s" if seconds >= 1 else f"{1000 * seconds:.2f} ms"


def _rate(entry: Mapping[str, Any]) -> str:
    return f"{as_number(entry.get('items_per_s')):,.1f} items/s, {as_number(entry.get('bytes_per_s')) / 1e6:.2f} MB/s"


def share_colour(share: float) -> str:
    """The fill of a node with this share of the iteration (or busy share of an actor): white at 0 to red at 1."""
    s = min(1.0, max(0.0, share)) if math.isfinite(share) else 0.0
    return "#" + "".join(f"{round(w + (r - w) * s):02x}" for w, r in zip(_WHITE, _RED))


def _ink(share: float) -> str:
    """A text colour readable on :func:`share_colour`'s fill."""
    return "#ffffff" if share > 0.6 else "#111111"


def _iterations(view: PlanView) -> str:
    its = view.iterations
    shown = f"iteration {its[0]}" if len(its) == 1 else f"iterations {its[0]}-{its[-1]} ({len(its)} averaged)"
    return f"{shown}, {_seconds(_figures(view).get('iteration_s'))} per iteration"


def actor_summary(actor_class: str, figures: Mapping[str, Any]) -> str:
    """One line on what an actor group did: its busy share and where its time went (``"no figures"`` without any)."""
    if not figures:
        return "no figures (the X-ray does not measure it)"
    busy = f"busy {_percent(figures.get('busy_share'))}"
    if actor_class == "RolloutWorker":
        where = " (sampling in the driver)" if figures.get("in_driver") else ""
        # A worker in the driver hands its fragments to no one: there is no serialization to show.
        serializing = "" if figures.get("in_driver") else f"serializing {_seconds(figures.get('serialize_s'))}, "
        return (
            f"{busy}{where}; env {_seconds(figures.get('env_s'))}, inference {_seconds(figures.get('inference_s'))}, "
            f"other {_seconds(figures.get('other_s'))}, {serializing}idle {_seconds(figures.get('idle_s'))}"
        )
    if actor_class == "LearnerThread":
        return (
            f"{busy}; learning {_seconds(figures.get('learn_s'))}, "
            f"waiting for batches {_seconds(figures.get('wait_s'))}; "
            f"in-queue {as_number(figures.get('inqueue_size_mean')):.1f} of {figures.get('inqueue_capacity')}"
        )
    if actor_class == "ReplayActor":
        return (
            f"{busy}; adding {_seconds(figures.get('add_s'))}, replaying {_seconds(figures.get('sample_s'))}, "
            f"serializing {_seconds(figures.get('serialize_s'))}"
        )
    return busy + "; " + ", ".join(f"{key} {value}" for key, value in figures.items() if key != "busy_share")


def _node_labels(view: PlanView) -> dict[str, str]:
    graph = view.graph
    labels = {graph.op_id(stage): stage.label for stage in graph.operators.values()}
    labels.update({graph.actor_id(actor_class): graph.actor_label(actor_class) for actor_class in graph.actors})
    return labels


def edge_rate(view: PlanView, source: str, target: str) -> str | None:
    """The rate along an edge into an operator: what the operator feeding it yields (from an operator),
    or what the operator it feeds yields (from actors, e.g. a gather); None for edges into actors."""
    ops = {view.graph.op_id(stage): stage.id for stage in view.graph.operators.values()}
    if target not in ops:
        return None
    entry = view.operator(ops[source] if source in ops else ops[target])
    return _rate(entry) if entry else None


def _edge_text(view: PlanView, source: str, target: str, label: str) -> str:
    return " | ".join(part for part in (label, edge_rate(view, source, target)) if part)


def render_text(view: PlanView) -> str:
    """The plan as text: a bare graph as :func:`_graph_text` writes it; with figures, the X-ray (operators,
    driver steps, unattributed time and total, actors, shard latencies, flows)."""
    if view.figures is None:
        return _graph_text(view)
    graph, figures = view.graph, view.figures
    names = [f"  [{number}] {stage.label}" for number, stage in enumerate(graph.operators.values(), start=1)]
    width = max(len(name) for name in [*names, "operators (dataflow order)"]) + 2
    lines = [
        f"plan {view.name} of {view.run_dir}: {_iterations(view)}",
        "",
        f"{'operators (dataflow order)':<{width}} {'share':>7} {'busy':>11} {'wait':>11} {'transfer':>11} "
        f"{'blocked':>11} {'held':>11}   rates",
    ]
    for name, stage in zip(names, graph.operators.values()):
        entry = view.operator(stage.id)
        if not entry:
            lines.append(f"{name:<{width}} {'n/a':>7}   (no figures in the results)")
            continue
        lines.append(
            f"{name:<{width}} {_percent(entry.get('share')):>7} {_seconds(entry.get('busy_s')):>11} "
            f"{_seconds(entry.get('wait_s')):>11} {_seconds(entry.get('transfer_s')):>11} "
            f"{_seconds(entry.get('blocked_out_s')):>11} {_seconds(entry.get('held_out_s')):>11}   {_rate(entry)}"
        )
    lines.append("driver (the Trainer's steps around the plan)")
    for key, share in figures.get("driver_share", {}).items():
        lines.append(
            f"{'  ' + key.removesuffix('_s'):<{width}} {_percent(share):>7} {_seconds(figures['driver'].get(key)):>11}"
        )
    lines.append(
        f"{'unattributed':<{width}} {_percent(figures.get('unattributed_share')):>7} "
        f"{_seconds(figures.get('unattributed_s')):>11}"
    )
    lines.append(f"{'total':<{width}} {_percent(view.total_share()):>7} {_seconds(figures.get('iteration_s')):>11}")
    lines += ["", "actors"]
    for actor_class in dict.fromkeys([*graph.actors, *figures.get("actors", {})]):
        label = graph.actor_label(actor_class) if actor_class in graph.actors else actor_class
        lines.append(f"  {label}: {actor_summary(actor_class, view.actor(actor_class))}")
        per_worker = view.actor(actor_class).get("per_worker") or {}
        if per_worker:
            lines.append(
                "    busy per worker: "
                + ", ".join(f"{index} {_percent(entry.get('busy_share'))}" for index, entry in per_worker.items())
            )
    learner = figures.get("learner")
    if learner:
        lines.append(
            "  learner: "
            + ", ".join(
                f"{key.removesuffix('_s').replace('_', ' ')} {_seconds(value)}" for key, value in learner.items()
            )
        )
    lag = figures.get("policy_lag")
    if lag:
        lines.append(
            f"  policy lag: {as_number(lag.get('mean_updates')):.2f} learner updates on average "
            "between the weights a batch was sampled with and its arrival"
        )
    latency = figures.get("latency_s") or {}
    if latency:
        heading = "latency per shard (request to arrival)"
        shard_width = max(len(name) + 2 for name in [*latency, heading]) + 2
        lines += ["", f"{heading:<{shard_width}} {'count':>7} {'p50':>11} {'p90':>11} {'max':>11}"]
        for name, entry in latency.items():
            lines.append(
                f"{'  ' + name:<{shard_width}} {as_number(entry.get('count')):>7.1f} {_seconds(entry.get('p50')):>11} "
                f"{_seconds(entry.get('p90')):>11} {_seconds(entry.get('max')):>11}"
            )
    labels = _node_labels(view)
    lines += ["", "flows (edges; into an operator: the rate of what flows along it)"]
    for source, target, label in graph.edges:
        lines.append(f"  {labels[source]} -> {labels[target]}: {_edge_text(view, source, target, label) or '-'}")
    return "\n".join(lines)


def _graph_text(view: PlanView) -> str:
    """The graph as indented text: each operator, what it reads from, and the actors it touches."""
    graph, labels = view.graph, _node_labels(view)
    lines = [f"plan {view.name}:", "  operators (in dataflow order):"]
    for number, stage in enumerate(graph.operators.values(), start=1):
        sources = [labels[src] for src, dst, _ in graph.edges if dst == graph.op_id(stage)]
        reads = f"  <- {', '.join(sources)}" if sources else ""
        lines.append(f"    [{number}] {stage.label}{reads}")
    lines.append("  actors:")
    for actor_class in graph.actors:
        lines.append(f"    {graph.actor_label(actor_class)}")
    links = [(labels[s], labels[d], lbl) for s, d, lbl in graph.edges if lbl and d.startswith("actor_")]
    if links:
        lines.append("  links to actors:")
        lines.extend(f"    {src} --{lbl}--> {dst}" for src, dst, lbl in links)
    return "\n".join(lines)


# --- the graph drawn ----------------------------------------------------------------------------------


def _node_share(view: PlanView, node_id: str) -> float:
    """What colours a node: an operator's share of the iteration, an actor group's busy share."""
    for stage in view.graph.operators.values():
        if view.graph.op_id(stage) == node_id:
            return as_number(view.operator(stage.id).get("share"))
    return as_number(view.actor(node_id.removeprefix("actor_")).get("busy_share"))


def _node_figure(view: PlanView, node_id: str) -> str:
    """The short figure under a node's name: ``"27.1% of the iteration"`` or ``"busy 18.0%"``."""
    if node_id.startswith("actor_"):
        figures = view.actor(node_id.removeprefix("actor_"))
        return f"busy {_percent(figures.get('busy_share'))}" if figures else "no figures"
    return f"{_percent(_node_share(view, node_id))} of the iteration"


def render_mermaid(view: PlanView) -> str:
    """The graph as a Mermaid flowchart (operators as boxes, actors as stadiums); with figures, fills by share
    (``style`` lines), figures in the labels, rates on the edges."""
    labels, measured = _node_labels(view), view.figures is not None
    lines = ["flowchart TD"]
    for node, label in labels.items():
        text = _quote(label) + (f"<br/>{_node_figure(view, node)}" if measured else "")
        lines.append(f'    {node}(["{text}"])' if node.startswith("actor_") else f'    {node}["{text}"]')
    for source, target, label in view.graph.edges:
        text = _edge_text(view, source, target, label)
        lines.append(f'    {source} -->|"{_quote(text)}"| {target}' if text else f"    {source} --> {target}")
    if measured:
        for node in labels:
            share = _node_share(view, node)
            lines.append(f"    style {node} fill:{share_colour(share)},color:{_ink(share)},stroke:#555555")
    return "\n".join(lines)


def _quote(text: str) -> str:
    return text.replace('"', "'")


def _dot_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _dot_quoted(text: str) -> str:
    """A bare graph's DOT string: its double quotes become single ones."""
    return f'"{_quote(text)}"'


def render_dot(view: PlanView) -> str:
    """The graph in Graphviz DOT; with figures, ``fillcolor`` by share, figures in the labels, rates on the edges."""
    labels, measured = _node_labels(view), view.figures is not None
    quoted = _dot_string if measured else _dot_quoted
    lines = [f"digraph {quoted(view.name)} {{", "    rankdir=TB;"]
    if measured:
        lines.append('    node [style=filled, fontname="Helvetica"];')
    for node, label in labels.items():
        shape = "ellipse" if node.startswith("actor_") else "box"
        if measured:
            share = _node_share(view, node)
            lines.append(
                f'    {node} [shape={shape}, fillcolor="{share_colour(share)}", '
                f'fontcolor="{_ink(share)}", label={quoted(label + chr(10) + _node_figure(view, node))}];'
            )
        else:
            lines.append(f"    {node} [shape={shape}, label={quoted(label)}];")
    for source, target, label in view.graph.edges:
        text = _edge_text(view, source, target, label)
        text = text.replace(" | ", chr(10)) if measured else text
        lines.append(f"    {source} -> {target}" + (f" [label={quoted(text)}];" if text else ";"))
    lines.append("}")
    return "\n".join(lines)
