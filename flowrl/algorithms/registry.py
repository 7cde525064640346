"""The algorithm registry: names to :class:`Algorithm` specs, imported on first use."""

from __future__ import annotations

import difflib
import importlib
from dataclasses import dataclass
from typing import Any, Callable

import gymnasium as gym

from flowrl.actors import PlanResources, WorkerSet, no_resources
from flowrl.actors.placement import BundleRequest
from flowrl.config import TrainerConfig
from flowrl.errors import FlowRLError, UnknownAlgorithmError
from flowrl.iterators import LocalIterator
from flowrl.policy import PolicySpec

ExecutionPlan = Callable[[WorkerSet, Any, PlanResources], LocalIterator[dict[str, Any]]]
ResourceFactory = Callable[[WorkerSet, Any], PlanResources]
BundleFactory = Callable[[Any], list[BundleRequest]]
PolicyFactory = Callable[[gym.Space, gym.Space, Any], PolicySpec]
MultiPolicyFactory = Callable[[dict[str, tuple[gym.Space, gym.Space]], Any], dict[str, PolicySpec]]


def no_bundles(config: Any) -> list[BundleRequest]:
    """The bundles of algorithms whose resources start no actor that asks for resources."""
    return []


@dataclass(frozen=True)
class Algorithm:
    """An algorithm: its config class, how to build its policy, its execution plan, and the
    stateful resources its plan wires (replay, a learner thread, aggregators).

    The Trainer reserves ``bundles(config)`` with the driver's and the rollout workers'
    resources (one placement group) and builds the workers, then ``make_resources(workers,
    config)``, which starts the resources' actors in their bundles (``workers.reservation``),
    then ``execution_plan(workers, config, resources)``, which only wires iterators over them.
    """

    name: str
    description: str
    config_class: type[TrainerConfig]
    make_policy: PolicyFactory
    execution_plan: ExecutionPlan
    #: Whether the plan trains the policies of multi-agent envs (``MultiAgentBatch`` samples).
    multi_agent: bool = False
    #: For algorithms whose policies differ by id (compositions such as ``ppo_dqn``):
    #: ``{policy_id: (observation_space, action_space)}, config -> {policy_id: PolicySpec}``.
    make_policies: MultiPolicyFactory | None = None
    #: The long-lived resources the plan wires besides the workers, created (and released) by the Trainer.
    make_resources: ResourceFactory = no_resources
    #: What ``make_resources``'s actors ask Ray for (replay shards, aggregators), reserved with the workers'.
    bundles: BundleFactory = no_bundles
    #: Config keys a running trainer can change (:meth:`~flowrl.Trainer.update_config`, PBT): read by
    #: the learner's loss or optimizer at each update, never by rollout workers or plan operators.
    live_keys: frozenset[str] = frozenset()
    #: Whether the plan trains while samples arrive asynchronously (A3C, IMPALA, APPO, Ape-X): evaluation
    #: actors then play an iteration's evaluation while it trains, instead of after it.
    asynchronous: bool = False


# name -> (module, attribute holding its Algorithm); imported lazily so `flowrl list` stays fast.
_MODULES: dict[str, tuple[str, str]] = {
    "pg": ("flowrl.algorithms.pg", "ALGORITHM"),
    "a2c": ("flowrl.algorithms.a2c", "ALGORITHM"),
    "a3c": ("flowrl.algorithms.a3c", "ALGORITHM"),
    "ppo": ("flowrl.algorithms.ppo", "ALGORITHM"),
    "dqn": ("flowrl.algorithms.dqn", "ALGORITHM"),
    "apex": ("flowrl.algorithms.apex", "ALGORITHM"),
    "apex_ddpg": ("flowrl.algorithms.apex", "APEX_DDPG"),
    "ddpg": ("flowrl.algorithms.ddpg", "DDPG"),
    "td3": ("flowrl.algorithms.ddpg", "TD3"),
    "impala": ("flowrl.algorithms.impala", "ALGORITHM"),
    "appo": ("flowrl.algorithms.appo", "ALGORITHM"),
    "ppo_dqn": ("flowrl.algorithms.ppo_dqn", "ALGORITHM"),
    "es": ("flowrl.algorithms.es", "ALGORITHM"),
    "ars": ("flowrl.algorithms.ars", "ALGORITHM"),
}
_REGISTERED: dict[str, Algorithm] = {}


def register_algorithm(algorithm: Algorithm, *, replace: bool = False) -> None:
    """Make ``algorithm`` available to :func:`get_algorithm` and the Trainer under its name (case-insensitive).

    Registering a name that is taken raises unless ``replace=True``.
    """
    key = algorithm.name.lower()
    if not replace and (key in _MODULES or key in _REGISTERED):
        raise FlowRLError(f"an algorithm named {key!r} is already registered; pass replace=True to replace it")
    _REGISTERED[key] = algorithm


def list_algorithms() -> list[str]:
    """Names of every available algorithm, sorted."""
    return sorted(set(_MODULES) | set(_REGISTERED))


def get_algorithm(name: str) -> Algorithm:
    """The algorithm called ``name`` (case-insensitive); unknown names raise with the closest ones."""
    key = name.lower() if isinstance(name, str) else name
    if key in _REGISTERED:
        return _REGISTERED[key]
    if key in _MODULES:
        module, attribute = _MODULES[key]
        algorithm = getattr(importlib.import_module(module), attribute)
        _REGISTERED[key] = algorithm
        return algorithm
    names = list_algorithms()
    close = difflib.get_close_matches(str(key), names, n=3, cutoff=0.4)
    hint = f"did you mean {', '.join(repr(c) for c in close)}? " if close else ""
    raise UnknownAlgorithmError(f"unknown algorithm {name!r}; {hint}available: {', '.join(names)}")
