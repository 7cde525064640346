"""One Ray placement group for everything a plan runs: its reservation as a unit.

A plan's actors — the rollout workers, and the replay shards and aggregators its algorithm
declares — and the driver, whose process holds the local worker and the learner, each ask
for resources. :class:`Reservation` asks Ray for all of them at once, as one placement group
with a bundle per actor laid out by ``placement_strategy``: a run gets everything it asked for
or, within ``worker_startup_timeout_s``, a :class:`~flowrl.errors.ResourceUnavailableError`
naming what it wanted. The driver's bundle is pinned to the driver's own node (Ray does not
schedule the driver; the bundle keeps other actors off the CPUs and GPUs its learner uses).
An actor and each of its replacements run in the same bundle, which Ray moves to another
node when the one holding it is lost.

Under Ray Tune the trial's placement group is the reservation: Tune reserves
:func:`trial_bundles` (the trainable, i.e. the driver, in the first bundle) before the trial
starts, and a :class:`Reservation` made inside the trial adopts it instead of asking again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from flowrl.config import TrainerConfig
from flowrl.deferred import ray
from flowrl.errors import ConfigError, FlowRLError, ResourceUnavailableError

if TYPE_CHECKING:
    from ray.util.placement_group import PlacementGroup
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

DRIVER, WORKER, REPLAY_SHARD, AGGREGATOR, LEARNER = "driver", "worker", "replay_shard", "aggregator", "learner"

#: The Ray node label every node carries: its id (what pins a bundle to the driver's node).
NODE_ID_LABEL = "ray.io/node-id"


@dataclass(frozen=True)
class BundleRequest:
    """``count`` bundles of ``resources`` for the actors of one ``role`` (0-based ``index`` in it).

    ``keys`` names the config key behind each resource and ``count_key`` the one behind
    ``count``, for error messages. With ``on_driver_node`` the bundles must be on the driver's
    node. Resources of amount 0 are left out; a request left with none reserves nothing (its
    actors are scheduled as they ask).
    """

    role: str
    count: int
    resources: Mapping[str, float]
    keys: Mapping[str, str]
    count_key: str = ""
    on_driver_node: bool = False

    @classmethod
    def from_config(
        cls, role: str, config: object, count_key: str, keys: Mapping[str, str], *, on_driver_node: bool = False
    ) -> "BundleRequest":
        """``config.<count_key>`` bundles of the resources that the config keys in ``keys`` (resource to key) give."""
        resources = {name: getattr(config, key) for name, key in keys.items()}
        return cls(role, getattr(config, count_key), resources, dict(keys), count_key, on_driver_node)

    def term(self, name: str) -> str:
        """How much of resource ``name`` the request asks for, in config keys:
        ``num_workers=4 x num_cpus_per_worker=1``."""
        each = f"{self.keys[name]}={self.bundle()[name]:g}"
        return f"{self.count_key or 'count'}={self.count} x {each}" if self.count_key or self.count > 1 else each

    def bundle(self) -> dict[str, float]:
        """One bundle of this request: its non-zero resources."""
        return {name: float(amount) for name, amount in self.resources.items() if amount > 0}


def driver_request(config: TrainerConfig) -> BundleRequest:
    """The driver's bundle: ``num_cpus_for_driver`` CPUs and, on a node with GPUs, the learner's ``num_gpus``."""
    resources = {"CPU": config.num_cpus_for_driver}
    if config.num_gpus > 0 and _driver_node_resources().get("GPU", 0.0) > 0:
        # Without a GPU on the driver's node the learner runs on CPU (the config warns): nothing to reserve.
        resources["GPU"] = config.num_gpus
    return BundleRequest(DRIVER, 1, resources, {"CPU": "num_cpus_for_driver", "GPU": "num_gpus"}, on_driver_node=True)


def worker_request(config: TrainerConfig, num_workers: int, num_cpus_per_worker: float) -> BundleRequest:
    """One bundle per remote rollout worker: its CPUs, GPUs and custom resources."""
    resources = {"CPU": num_cpus_per_worker, "GPU": config.num_gpus_per_worker, **config.custom_resources_per_worker}
    keys = {
        "CPU": "num_cpus_per_worker",
        "GPU": "num_gpus_per_worker",
        **{name: f"custom_resources_per_worker[{name!r}]" for name in config.custom_resources_per_worker},
    }
    return BundleRequest(WORKER, num_workers, resources, keys, count_key="num_workers")


def learner_request(config: TrainerConfig) -> BundleRequest:
    """One bundle per learner actor of a learner group (none unless ``num_learners >= 2``)."""
    count = config.num_learners if config.num_learners >= 2 else 0
    return BundleRequest(
        LEARNER,
        count,
        {"CPU": config.num_cpus_per_learner, "GPU": config.num_gpus_per_learner},
        {"CPU": "num_cpus_per_learner", "GPU": "num_gpus_per_learner"},
        count_key="num_learners",
    )


def asks_for_actors(num_workers: int, requests: Sequence[BundleRequest]) -> bool:
    """Whether a plan with ``num_workers`` remote rollout workers and its other actors' ``requests``
    (replay shards, aggregators, evaluation workers) starts any actor, and so needs Ray.

    A request counts its actors even when they ask for no resources (zero-CPU replay shards).
    """
    return num_workers > 0 or any(r.count > 0 for r in requests if r.role != DRIVER)


def _driver_node_resources() -> dict[str, float]:
    here = ray.get_runtime_context().get_node_id()
    return next((dict(node["Resources"]) for node in ray.nodes() if node["NodeID"] == here), {})


def _describe(request: BundleRequest) -> str:
    wanted = ", ".join(f"{amount:g} {name}" for name, amount in request.bundle().items())
    return f"{request.count} x {request.role} ({wanted}{', on the driver node' if request.on_driver_node else ''})"


def check_resources(requests: Sequence[BundleRequest], strategy: str) -> None:
    """Raise :class:`~flowrl.errors.ConfigError` if the requests cannot fit the Ray cluster as it is now.

    Checks, before any actor starts: each resource's total against the whole cluster's, the
    driver's bundles against the driver's node, ``STRICT_SPREAD`` (one bundle per node) against
    the number of nodes, and ``STRICT_PACK`` (all on one node) against the largest node.
    """
    requests = [r for r in requests if r.count and r.bundle()]
    if not requests:
        return
    problems = []
    total = ray.cluster_resources()
    for name in sorted({name for r in requests for name in r.bundle()}):
        asking = [r for r in requests if name in r.bundle()]
        need = sum(r.count * r.bundle()[name] for r in asking)
        if need > total.get(name, 0.0) + 1e-9:
            terms = " + ".join(r.term(name) for r in asking)
            problems.append(
                f"{terms} needs {need:g} {name}, but the Ray cluster has {total.get(name, 0.0):g} in all; "
                "lower them or add nodes"
            )
    here = _driver_node_resources()
    for r in requests:
        if r.on_driver_node:
            for name, amount in r.bundle().items():
                if r.count * amount > here.get(name, 0.0) + 1e-9:
                    problems.append(
                        f"{r.term(name)} on the driver's node needs {r.count * amount:g} {name}, "
                        f"but that node has {here.get(name, 0.0):g}"
                    )
    nodes = [node["Resources"] for node in ray.nodes() if node.get("Alive")]
    count = sum(r.count for r in requests)
    if strategy == "STRICT_SPREAD" and count > len(nodes):
        problems.append(
            f"placement_strategy='STRICT_SPREAD' puts each of {count} bundles ({'; '.join(map(_describe, requests))}) "
            f"on its own node, but the Ray cluster has {len(nodes)} nodes; use SPREAD or add nodes"
        )
    if strategy == "STRICT_PACK":
        sums = {name: sum(r.count * r.bundle().get(name, 0.0) for r in requests) for name in total}
        short = [
            f"{amount:g} {name}"
            for name, amount in sums.items()
            if amount > 0 and not any(amount <= node.get(name, 0.0) + 1e-9 for node in nodes)
        ]
        if short:
            problems.append(
                f"placement_strategy='STRICT_PACK' puts every bundle on one node, but no node has "
                f"{' and '.join(short)}; use PACK or ask for less"
            )
    if problems:
        raise ConfigError(problems)


def trial_bundles(requests: Sequence[BundleRequest], driver: Mapping[str, float]) -> list[dict[str, float]]:
    """The bundles of a Tune trial running these requests: ``driver`` (the trainable's, which
    Tune wants first and not empty) and then, in order, those of every other role."""
    return [dict(driver)] + [r.bundle() for r in requests if r.role != DRIVER for _ in range(r.count) if r.bundle()]


class Reservation:
    """A plan's resources, reserved together as one Ray placement group (see the module docs).

    ``requests`` say what each role needs; :meth:`scheduling` gives the strategy that puts
    actor ``index`` of a role in its own bundle (None for a role that reserved nothing).
    Raises :class:`~flowrl.errors.ResourceUnavailableError` if Ray cannot reserve every
    bundle within ``timeout_s`` (the partial reservation is released). Made inside a
    placement group laid out as :func:`trial_bundles` (a Tune trial's), it uses that group,
    whose owner releases it. With no requests (a plan that starts no actor) it reserves
    nothing and never calls Ray.
    """

    def __init__(self, requests: Sequence[BundleRequest], strategy: str, timeout_s: float) -> None:
        self.strategy = strategy
        self.requests = [r for r in requests if r.count and r.bundle()]
        if len({r.role for r in self.requests}) != len(self.requests):
            raise FlowRLError(f"Reservation: two requests for one role in {[r.role for r in self.requests]}")
        self._counts = {r.role: r.count for r in self.requests}
        self._group: PlacementGroup | None = None
        self._owned = False
        self._first: dict[str, int] = {}
        if not requests:  # a plan that starts no actor reserves nothing, and needs no Ray
            return
        current = ray.util.get_current_placement_group()
        if current is not None and _same_bundles(current.bundle_specs[1:], trial_bundles(self.requests, {})[1:]):
            self._adopt(current)
            return
        bundles: list[dict[str, float]] = []
        selectors: list[dict[str, str]] = []
        driver_node = ray.get_runtime_context().get_node_id()
        for r in self.requests:
            self._first[r.role] = len(bundles)
            bundles += [r.bundle() for _ in range(r.count)]
            selectors += [{NODE_ID_LABEL: driver_node} if r.on_driver_node else {} for _ in range(r.count)]
        if not bundles:
            return
        group = ray.util.placement_group(bundles, strategy=strategy, bundle_label_selector=selectors)
        try:
            ray.get(group.ready(), timeout=timeout_s)
        except ray.exceptions.GetTimeoutError:
            ray.util.remove_placement_group(group)
            nodes = [node for node in ray.nodes() if node.get("Alive")]
            raise ResourceUnavailableError(
                f"Ray could not reserve the run's resources within worker_startup_timeout_s={timeout_s:g}: "
                f"{'; '.join(map(_describe, self.requests))} with placement_strategy={strategy!r}; the cluster's "
                f"{len(nodes)} nodes have {ray.available_resources()} available now "
                "(other runs or actors may hold the rest)"
            ) from None
        self._group, self._owned = group, True

    def _adopt(self, group: PlacementGroup) -> None:
        """Use ``group``, laid out by :func:`trial_bundles`: the driver in bundle 0, then the other roles."""
        self._group = group
        self._first = {DRIVER: 0}
        first = 1
        for r in self.requests:
            if r.role != DRIVER:
                self._first[r.role] = first
                first += r.count
        self._counts.setdefault(DRIVER, 1)
        self.requests = [
            BundleRequest(DRIVER, 1, group.bundle_specs[0], {}),
            *(r for r in self.requests if r.role != DRIVER),
        ]

    @property
    def placement_group(self) -> PlacementGroup | None:
        """The Ray placement group (None when nothing was reserved)."""
        return self._group

    def reserved(self, role: str) -> bool:
        """Whether actors of ``role`` have bundles."""
        return self._group is not None and role in self._first

    def scheduling(self, role: str, index: int) -> PlacementGroupSchedulingStrategy | None:
        """The strategy that runs actor ``index`` of ``role`` in its bundle; None if the role reserved nothing."""
        if self._group is None or role not in self._first:
            return None
        if not 0 <= index < self._counts[role]:
            raise FlowRLError(f"Reservation: {role} {index} has no bundle (the role has {self._counts[role]})")
        return ray.util.scheduling_strategies.PlacementGroupSchedulingStrategy(
            self._group, placement_group_bundle_index=self._first[role] + index
        )

    def options(self, role: str, index: int) -> dict[str, Any]:
        """Keyword arguments of ``ActorClass.options`` that put actor ``index`` of ``role`` in its bundle
        ({} if none)."""
        strategy = self.scheduling(role, index)
        return {} if strategy is None else {"scheduling_strategy": strategy}

    def layout(self) -> list[dict[str, Any]]:
        """Each bundle: its role, index in the role, resources and the Ray node holding it now (None while unplaced)."""
        if self._group is None:
            return []
        nodes = ray.util.placement_group_table(self._group).get("bundles_to_node_id", {})
        return [
            {"role": r.role, "index": i, "resources": r.bundle(), "node_id": nodes.get(self._first[r.role] + i)}
            for r in self.requests
            for i in range(r.count)
        ]

    def release(self) -> None:
        """Give the reservation back to Ray (actors still in it are killed by Ray); an adopted one stays its owner's."""
        if self._group is not None and self._owned:
            ray.util.remove_placement_group(self._group)
        self._group = None


def _same_bundles(have: Sequence[Mapping[str, float]], want: Sequence[Mapping[str, float]]) -> bool:
    return len(have) == len(want) and all(
        set(a) == set(b) and all(abs(float(a[k]) - float(b[k])) < 1e-9 for k in a) for a, b in zip(have, want)
    )
