"""Execution plans as inspectable graphs: operator nodes, actor nodes and the edges between them.

A :class:`Plan` wraps the iterator an algorithm's ``execution_plan`` returns. Its graph
is read from the stage nodes the iterators recorded while the plan was built; actor
nodes come from the actors that gathers pull from and from what operators declare
through the operator protocol (:mod:`flowrl.operators.protocol`): links to actors,
actors feeding actors, actor counts, hidden plumbing. Stateful operators' state goes
into checkpoints under their declared ``state_key``. Per-stage statistics come from the
plan's metrics context. :mod:`flowrl.plan.render` draws the graph.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping

from flowrl.actors.placeholders import PlaceholderActor
from flowrl.errors import FlowRLError
from flowrl.iterators import LocalIterator, MetricsContext, StageNode, StageStats
from flowrl.operators.protocol import ActorFlow, Operator, StatefulOperator
from flowrl.plan.render import PlanView, render_dot, render_mermaid, render_text


def _actor_class(actor: Any) -> str:
    if isinstance(actor, PlaceholderActor):
        return actor.class_name
    descriptor = getattr(actor, "_ray_actor_creation_function_descriptor", None)
    name = getattr(descriptor, "class_name", None)
    return name if isinstance(name, str) and name else type(actor).__name__


def _hidden(stage: StageNode) -> bool:
    return isinstance(stage.fn, Operator) and stage.fn.plan_hidden


@dataclass
class PlanGraph:
    """Operator nodes (by stage id), actor groups, and labelled edges (source, target, label)."""

    operators: dict[int, StageNode] = field(default_factory=dict)
    actors: dict[str, int] = field(default_factory=dict)  # actor class -> how many
    edges: list[tuple[str, str, str]] = field(default_factory=list)
    #: Stage id -> result key, as a stored graph recorded them (runs written before operators were
    #: numbered from 1 keep their own keys); empty for a live graph, whose keys :meth:`operator_keys` makes.
    keys: dict[int, str] = field(default_factory=dict)

    @staticmethod
    def op_id(stage: StageNode) -> str:
        """The node id of an operator in text, Mermaid and DOT output."""
        return f"op{stage.id}"

    @staticmethod
    def actor_id(actor_class: str) -> str:
        """The node id of an actor group."""
        return f"actor_{actor_class}"

    def actor_label(self, actor_class: str) -> str:
        """``"RolloutWorker x2"``-style label of an actor group."""
        count = self.actors[actor_class]
        return actor_class if count <= 1 else f"{actor_class} x{count}"

    def operator_keys(self) -> dict[int, str]:
        """Stage id -> ``"<number>:<label>"``, how results (``result["plan"]["operators"]``) name the operators:
        numbered from 1 in dataflow order, as every rendering of the plan numbers them."""
        return {
            stage_id: self.keys.get(stage_id) or f"{number}:{stage.label}"
            for number, (stage_id, stage) in enumerate(self.operators.items(), start=1)
        }

    def to_dict(self) -> dict[str, Any]:
        """The graph as plain JSON data, independent of the process that built it.

        ``operators``: in dataflow order, each with its ``position`` (its index in this list, from 0),
        ``key`` (as in results, numbered from 1),
        ``label``, ``kind`` and the ``stage_id`` it had in the process that built it. ``actors``:
        ``{"class", "count"}`` each. ``edges``: ``{"source", "target", "label"}``, whose ends are
        ``{"operator": position}`` or ``{"actor": class}``. :func:`graph_from_dict` reads it back.
        """
        positions = {self.op_id(stage): position for position, stage in enumerate(self.operators.values())}
        keys = self.operator_keys()

        def end(node_id: str) -> dict[str, Any]:
            return (
                {"operator": positions[node_id]} if node_id in positions else {"actor": node_id.removeprefix("actor_")}
            )

        return {
            "operators": [
                {
                    "position": position,
                    "key": keys[stage.id],
                    "label": stage.label,
                    "kind": stage.kind,
                    "stage_id": stage.id,
                }
                for position, stage in enumerate(self.operators.values())
            ],
            "actors": [{"class": actor_class, "count": count} for actor_class, count in self.actors.items()],
            "edges": [
                {"source": end(source), "target": end(target), "label": label} for source, target, label in self.edges
            ],
        }


def graph_from_dict(data: Any) -> PlanGraph:
    """The graph :meth:`PlanGraph.to_dict` wrote, with its operators' stage ids (nodes without ``fn``,
    actors or inputs: for drawing, not running). Raises :class:`~flowrl.errors.FlowRLError` naming what
    is missing or malformed."""
    try:
        stages = [StageNode(str(op["kind"]), str(op["label"]), id=int(op["stage_id"])) for op in data["operators"]]
        graph = PlanGraph(
            operators={stage.id: stage for stage in stages},
            actors={str(actor["class"]): int(actor["count"]) for actor in data["actors"]},
            keys={stage.id: str(op["key"]) for stage, op in zip(stages, data["operators"]) if "key" in op},
        )

        def node(end: Mapping[str, Any]) -> str:
            if "operator" in end:
                return PlanGraph.op_id(stages[int(end["operator"])])
            if str(end["actor"]) not in graph.actors:
                raise KeyError(f"actor {end['actor']!r}")
            return PlanGraph.actor_id(str(end["actor"]))

        graph.edges = [(node(edge["source"]), node(edge["target"]), str(edge["label"])) for edge in data["edges"]]
    except (KeyError, IndexError, TypeError, ValueError) as e:
        raise FlowRLError(f"not a plan graph as PlanGraph.to_dict() writes it: {type(e).__name__}: {e}") from None
    return graph


def build_graph(output: StageNode) -> PlanGraph:
    """Walk the stages feeding ``output`` and collect operators, actors and edges."""
    graph = PlanGraph()
    seen: set[int] = set()

    def visible_inputs(stage: StageNode) -> list[StageNode]:
        found: list[StageNode] = []
        for parent in stage.inputs:
            found.extend(visible_inputs(parent) if _hidden(parent) else [parent])
        return found

    def visit(stage: StageNode) -> None:
        if stage.id in seen:
            return
        seen.add(stage.id)
        for parent in stage.inputs:
            visit(parent)
        if _hidden(stage):
            return
        graph.operators[stage.id] = stage
        for parent in visible_inputs(stage):
            graph.edges.append((PlanGraph.op_id(parent), PlanGraph.op_id(stage), ""))
        if stage.actors:
            counts: dict[str, int] = {}
            for actor in stage.actors:
                counts[_actor_class(actor)] = counts.get(_actor_class(actor), 0) + 1
            for actor_class, count in counts.items():
                graph.actors[actor_class] = max(graph.actors.get(actor_class, 0), count)
                graph.edges.append((PlanGraph.actor_id(actor_class), PlanGraph.op_id(stage), stage.kind))
        if not isinstance(stage.fn, Operator):
            return
        for actor_class, count in stage.fn.plan_actor_counts().items():
            graph.actors[actor_class] = max(graph.actors.get(actor_class, 0), count)
        for link in stage.fn.plan_links():
            if isinstance(link, ActorFlow):
                graph.edges.append((PlanGraph.actor_id(link.source), PlanGraph.actor_id(link.target), link.label))
            else:
                graph.edges.append((PlanGraph.op_id(stage), PlanGraph.actor_id(link.actor_class), link.label))

    visit(output)
    for source, target, _ in graph.edges:
        for node in (source, target):
            if node.startswith("actor_"):
                graph.actors.setdefault(node.removeprefix("actor_"), 1)
    return graph


class Plan:
    """A runnable execution plan with its graph and per-operator statistics.

    ``next(plan)`` runs one training iteration in this process (the items of the wrapped
    iterator are usually result dicts).
    """

    def __init__(self, iterator: LocalIterator[Any], name: str = "plan") -> None:
        if not isinstance(iterator, LocalIterator):
            raise FlowRLError(
                f"an execution plan must return a LocalIterator (of result dicts, e.g. from "
                f"StandardMetricsReporting), got {type(iterator).__name__}"
            )
        self.iterator = iterator
        self.name = name
        self.graph = build_graph(iterator.stage)
        # What stats() reported last, to report the next iteration's growth.
        self._last: dict[int, StageStats] = {}
        self._last_reported: dict[tuple[int, str], float] = {}

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        return next(self.iterator)

    def _stateful_operators(self) -> dict[str, StatefulOperator]:
        # Keyed by each operator's declared state_key (numbered when repeated, in dataflow order):
        # stage ids differ between processes, and class names may change between versions.
        found: dict[str, StatefulOperator] = {}
        seen: Counter[str] = Counter()
        for stage in self.graph.operators.values():
            if isinstance(stage.fn, StatefulOperator):
                key = stage.fn.state_key
                found[key if not seen[key] else f"{key}#{seen[key]}"] = stage.fn
                seen[key] += 1
        return found

    def state_keys(self) -> frozenset[str]:
        """The keys under which :meth:`get_state` keeps its operators' states."""
        return frozenset(self._stateful_operators())

    def get_state(self) -> dict[str, Any]:
        """Counters and info of the metrics context, and the state of operators that keep some."""
        return {
            "metrics": self.metrics.save(),
            "operators": {key: op.get_state() for key, op in self._stateful_operators().items()},
        }

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`get_state`'s output into a plan of the same shape."""
        self.metrics.restore(state["metrics"])
        operators = self._stateful_operators()
        for key, op_state in state.get("operators", {}).items():
            if key in operators:
                operators[key].set_state(op_state)

    @property
    def metrics(self) -> MetricsContext:
        """The metrics context shared by every operator of the plan."""
        return self.iterator.shared_metrics.get()

    def stats(self, iteration_s: float) -> dict[str, Any]:
        """What each operator did since the last call (one training iteration of ``iteration_s`` seconds),
        and the request-to-arrival latencies of the gathers' shards.

        ``operators`` is keyed ``"<number>:<label>"`` (:meth:`PlanGraph.operator_keys`); each entry has the items and
        bytes through the operator, its own seconds (``time_s`` = ``busy_s`` + ``wait_s`` for input +
        ``transfer_s`` + ``blocked_out_s``, blocked until what consumes its output had room), the
        seconds it held an item back while other operators ran (``held_out_s``: back-pressure that
        overlaps their time), its ``share`` of the iteration, rates per second, the items since the
        plan started (``items_total``) and the growth of what the operator reports itself
        (:meth:`~flowrl.operators.protocol.Operator.plan_stats`). ``latency_s`` maps
        ``"<parallel iterator>[<shard>]"`` to the count, median, 90th percentile and maximum.
        """
        stage_stats = self.metrics.stage_stats
        span = iteration_s if iteration_s > 0 else 1.0
        operators: dict[str, dict[str, float]] = {}
        keys = self.graph.operator_keys()
        for stage_id, stage in self.graph.operators.items():
            now = dataclasses.replace(stage_stats.get(stage_id) or StageStats())
            last, self._last[stage_id] = self._last.get(stage_id, StageStats()), now
            time_s, wait_s, transfer_s = (
                now.time_s - last.time_s,
                now.wait_s - last.wait_s,
                now.transfer_s - last.transfer_s,
            )
            blocked_s, held_s = now.blocked_s - last.blocked_s, now.held_s - last.held_s
            items, nbytes = now.items - last.items, now.bytes - last.bytes
            entry = {
                "items": items,
                "bytes": nbytes,
                "time_s": round(time_s, 6),
                "busy_s": round(max(0.0, time_s - wait_s - transfer_s - blocked_s), 6),
                "wait_s": round(wait_s, 6),
                "transfer_s": round(transfer_s, 6),
                "blocked_out_s": round(blocked_s, 6),
                "held_out_s": round(held_s, 6),
                "share": round(time_s / span, 4),
                "items_per_s": round(items / span, 3),
                "bytes_per_s": round(nbytes / span, 1),
                "items_total": now.items,
            }
            if isinstance(stage.fn, Operator):
                for key, value in stage.fn.plan_stats().items():
                    previous = self._last_reported.get((stage_id, key), 0.0)
                    self._last_reported[(stage_id, key)] = value
                    entry[key] = round(value - previous, 6)
            operators[keys[stage_id]] = entry
        latencies = self.metrics.latencies
        latency = {
            name: {
                "count": len(values),
                "p50": _percentile(values, 50),
                "p90": _percentile(values, 90),
                "max": round(max(values), 6),
            }
            for name, values in sorted(latencies.items())
            if values
        }
        latencies.clear()
        return {"operators": operators, "latency_s": latency}

    def _view(self) -> PlanView:
        """The graph as the renderers draw it: bare, without measured figures."""
        return PlanView(None, self.name, self.graph)

    def describe(self) -> str:
        """The graph as indented text: each operator, what it reads from, and the actors it touches."""
        return render_text(self._view())

    def to_mermaid(self) -> str:
        """The graph as a Mermaid flowchart (operators as boxes, actors as stadiums)."""
        return render_mermaid(self._view())

    def to_dot(self) -> str:
        """The graph in Graphviz DOT."""
        return render_dot(self._view())


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))], 6)
