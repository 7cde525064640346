"""The HTML page of a run's plan: :func:`render_html`, the renderer family's fourth format.

It draws a :class:`~flowrl.plan.render.PlanView` with measured figures as one self-contained page:
the graph as inline SVG (operators top to bottom in dataflow order, actors in a column to their
right, each node coloured by its share), and tables of every figure (operators, driver steps,
unattributed time, actors, shard latencies, flows); no scripts, no external files. The figures as
text, the colour scale and the edges' rates come from :mod:`flowrl.plan.render`, which draws the
other formats.
"""

from __future__ import annotations

import html
from collections.abc import Mapping

from flowrl.plan.render import (
    PlanView,
    _edge_text,
    _figures,
    _ink,
    _iterations,
    _node_figure,
    _node_labels,
    _node_share,
    _percent,
    _rate,
    _seconds,
    actor_summary,
    as_number,
    share_colour,
)

_NODE_H, _GAP, _ACTOR_W, _MARGIN = 46, 36, 280, 24


def _svg(view: PlanView) -> str:
    """The graph as inline SVG: operators top to bottom in dataflow order, actors in a column to their right."""
    graph, labels = view.graph, _node_labels(view)
    op_w = max([len(stage.label) for stage in graph.operators.values()] + [30]) * 7 + 40
    ops = {graph.op_id(stage): position for position, stage in enumerate(graph.operators.values())}
    skipping = [(s, t, label) for s, t, label in graph.edges if s in ops and t in ops and ops[t] != ops[s] + 1]
    # Room on the left for the curves of edges that skip operators, and their labels.
    left = _MARGIN + max([len(_edge_text(view, *edge)) * 6 + 100 for edge in skipping] + [0])
    boxes: dict[str, tuple[float, float, float]] = {}  # node -> (x, y, width)
    for position, stage in enumerate(graph.operators.values()):
        boxes[graph.op_id(stage)] = (left, _MARGIN + position * (_NODE_H + _GAP), op_w)
    actor_x = left + op_w + 260
    wanted = []
    for actor_class in graph.actors:
        node = graph.actor_id(actor_class)
        ys = [boxes[other][1] for s, t, _ in graph.edges for other in (s, t) if node in (s, t) and other in boxes]
        wanted.append((sum(ys) / len(ys) if ys else _MARGIN, node))
    next_free = float(_MARGIN)
    for y, node in sorted(wanted):
        boxes[node] = (actor_x, max(y, next_free), _ACTOR_W)
        next_free = boxes[node][1] + _NODE_H + _GAP / 2
    height = max(y for _, y, _ in boxes.values()) + _NODE_H + _MARGIN if boxes else 2 * _MARGIN
    width = actor_x + _ACTOR_W + _MARGIN
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}" font-family="Helvetica, Arial, sans-serif" font-size="12">',
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7" '
        'orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#555"/></marker></defs>',
    ]
    for source, target, label in graph.edges:
        (x0, y0, w0), (x1, y1, w1) = boxes[source], boxes[target]
        text = _edge_text(view, source, target, label)
        if source in ops and target in ops and ops[target] == ops[source] + 1:
            path, tx, ty, anchor = (
                f"M{x0 + w0 / 2},{y0 + _NODE_H} L{x1 + w1 / 2},{y1}",
                x0 + w0 / 2 + 8,
                (y0 + _NODE_H + y1) / 2 + 4,
                "start",
            )
        elif source in ops and target in ops:
            bend = x0 - 40 - 14 * (skipping.index((source, target, label)) % 4)
            path = (
                f"M{x0},{y0 + _NODE_H / 2} C{bend},{y0 + _NODE_H / 2} {bend},{y1 + _NODE_H / 2} {x1},{y1 + _NODE_H / 2}"
            )
            # A cubic curve's farthest point from its ends is 3/4 of the way to its control points.
            tx, ty, anchor = x0 - 0.75 * (x0 - bend) - 6, (y0 + y1 + _NODE_H) / 2 + 4, "end"
        elif source.startswith("op") or target.startswith("op"):
            # Between the operators' column and the actors': from an operator's right side, an actor's left side.
            (sx, sy), (ex, ey) = _side(boxes, source), _side(boxes, target)
            path = f"M{sx},{sy} L{ex},{ey}"
            # The label starts beside the operator, just above the line (beside the actor it would crowd).
            (ox, oy), (ax, ay) = ((sx, sy), (ex, ey)) if source.startswith("op") else ((ex, ey), (sx, sy))
            tx, anchor = ox + 8, "start"
            ty = oy + (ay - oy) * 8 / max(1.0, ax - ox) - 5
        else:  # actor to actor: a curve to the right of the actors' column
            (sx, sy, sw), (ex, ey, ew) = boxes[source], boxes[target]
            sx, ex, sy, ey = sx + sw, ex + ew, sy + _NODE_H / 2, ey + _NODE_H / 2
            path = f"M{sx},{sy} C{sx + 60},{sy} {ex + 60},{ey} {ex},{ey}"
            tx, ty, anchor = sx + 48, (sy + ey) / 2, "start"
        title = html.escape(f"{labels[source]} -> {labels[target]}" + (f": {text}" if text else ""))
        parts.append(
            f'<path d="{path}" fill="none" stroke="#555" stroke-width="1.3" marker-end="url(#arrow)">'
            f"<title>{title}</title></path>"
        )
        if text:
            parts.append(
                f'<text x="{tx:.1f}" y="{ty:.1f}" text-anchor="{anchor}" font-size="10" fill="#333" '
                f'stroke="#fff" stroke-width="3" paint-order="stroke">'
                f"{html.escape(text)}</text>"
            )
    for node, (x, y, w) in boxes.items():
        share = _node_share(view, node)
        rounded = 22 if node.startswith("actor_") else 4
        parts.append(
            f"<g><title>{html.escape(labels[node])}</title>"
            f'<rect x="{x}" y="{y}" width="{w}" height="{_NODE_H}" rx="{rounded}" fill="{share_colour(share)}" '
            f'stroke="#555"/>'
            f'<text x="{x + w / 2}" y="{y + 19}" text-anchor="middle" fill="{_ink(share)}" font-weight="bold">'
            f"{html.escape(labels[node])}</text>"
            f'<text x="{x + w / 2}" y="{y + 36}" text-anchor="middle" fill="{_ink(share)}">'
            f"{html.escape(_node_figure(view, node))}</text></g>"
        )
    parts.append("</svg>")
    return "\n".join(parts)


def _side(boxes: Mapping[str, tuple[float, float, float]], node: str) -> tuple[float, float]:
    """Where an edge between the two columns meets a node: an operator's right side, an actor's left side."""
    x, y, w = boxes[node]
    return (x + w if node.startswith("op") else x), y + _NODE_H / 2


def _cell(text: str, share: float | None = None) -> str:
    if share is None:
        return f"<td>{html.escape(text)}</td>"
    return f'<td style="background:{share_colour(share)};color:{_ink(share)}">{html.escape(text)}</td>'


def render_html(view: PlanView) -> str:
    """One self-contained HTML page: the graph (inline SVG, coloured by share) and tables of every figure
    (a view with figures only: raises :class:`~flowrl.errors.FlowRLError` for a bare graph)."""
    graph, figures, labels = view.graph, _figures(view), _node_labels(view)
    rows = []
    for number, stage in enumerate(graph.operators.values(), start=1):
        entry = view.operator(stage.id)
        share = as_number(entry.get("share"))
        rows.append(
            "<tr>"
            + _cell(str(number))
            + _cell(stage.label)
            + _cell(_percent(share), share)
            + "".join(
                _cell(_seconds(entry.get(key)))
                for key in ("busy_s", "wait_s", "transfer_s", "blocked_out_s", "held_out_s")
            )
            + _cell(_rate(entry) if entry else "no figures")
            + "</tr>"
        )
    for key, share in figures.get("driver_share", {}).items():
        rows.append(
            "<tr>"
            + _cell("")
            + _cell(f"driver: {key.removesuffix('_s')}")
            + _cell(_percent(share), share)
            + _cell(_seconds(figures["driver"].get(key)))
            + _cell("") * 5
            + "</tr>"
        )
    unattributed = as_number(figures.get("unattributed_share"))
    rows.append(
        "<tr>"
        + _cell("")
        + _cell("unattributed")
        + _cell(_percent(unattributed), unattributed)
        + _cell(_seconds(figures.get("unattributed_s")))
        + _cell("") * 5
        + "</tr>"
    )
    rows.append(
        "<tr class=total>"
        + _cell("")
        + _cell("total")
        + _cell(_percent(view.total_share()))
        + _cell(_seconds(figures.get("iteration_s")))
        + _cell("") * 5
        + "</tr>"
    )
    actors = []
    for actor_class in dict.fromkeys([*graph.actors, *figures.get("actors", {})]):
        found = view.actor(actor_class)
        busy = as_number(found.get("busy_share"))
        label = graph.actor_label(actor_class) if actor_class in graph.actors else actor_class
        per_worker = ", ".join(
            f"{index}: {_percent(entry.get('busy_share'))}" for index, entry in (found.get("per_worker") or {}).items()
        )
        actors.append(
            "<tr>"
            + _cell(label)
            + _cell(_percent(busy) if found else "n/a", busy if found else None)
            + _cell(actor_summary(actor_class, found))
            + _cell(per_worker)
            + "</tr>"
        )
    latency = [
        (
            "<tr>"
            + _cell(name)
            + _cell(f"{as_number(entry.get('count')):.1f}")
            + "".join(_cell(_seconds(entry.get(key))) for key in ("p50", "p90", "max"))
            + "</tr>"
        )
        for name, entry in (figures.get("latency_s") or {}).items()
    ]
    flows = [
        "<tr>"
        + _cell(labels[source])
        + _cell(labels[target])
        + _cell(_edge_text(view, source, target, label) or "-")
        + "</tr>"
        for source, target, label in graph.edges
    ]
    scale = ", ".join(share_colour(s / 4) for s in range(5))
    title = html.escape(f"plan {view.name}: {view.run_dir}")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font-family: Helvetica, Arial, sans-serif; margin: 24px; color: #111; }}
table {{ border-collapse: collapse; margin: 8px 0 24px; font-size: 13px; }}
th, td {{ border: 1px solid #ccc; padding: 4px 8px; text-align: left; }}
th {{ background: #f3f3f3; }}
tr.total td {{ font-weight: bold; }}
.scale {{ display: inline-block; width: 200px; height: 12px; border: 1px solid #999; vertical-align: middle;
          background: linear-gradient(to right, {scale}); }}
</style></head>
<body>
<h1>{title}</h1>
<p>{html.escape(_iterations(view))}. Operators are coloured by their share of the iteration, actors by how busy
they were: 0% <span class="scale"></span> 100%. Edges into an operator carry the rate of what flows along them.</p>
{_svg(view)}
<h2>Operators, driver steps and unattributed time</h2>
<table><tr><th>#</th><th>operator</th><th>share</th><th>busy</th><th>wait</th><th>transfer</th>\
<th>blocked on output</th><th>held back</th><th>rates</th></tr>
{chr(10).join(rows)}
</table>
<h2>Actors</h2>
<table><tr><th>actor</th><th>busy</th><th>where the time went</th><th>busy per worker</th></tr>
{chr(10).join(actors)}
</table>
<h2>Latency per shard (request to arrival)</h2>
<table><tr><th>shard</th><th>count</th><th>p50</th><th>p90</th><th>max</th></tr>
{chr(10).join(latency) or '<tr><td colspan="5">no gathers over actors</td></tr>'}
</table>
<h2>Flows</h2>
<table><tr><th>from</th><th>to</th><th>label and rate</th></tr>
{chr(10).join(flows)}
</table>
</body></html>
"""
