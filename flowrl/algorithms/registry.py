"""The algorithm registry: names to :class:`Algorithm` specs, imported on first use.

Importing it loads neither PyTorch, Gymnasium nor Ray (what each algorithm's module imports),
so that ``flowrl list`` stays instant: the built-in algorithms' names and descriptions are
listed here, and a module is imported when its algorithm is asked for.
"""

from __future__ import annotations

import difflib
import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, NamedTuple

from flowrl.errors import FlowRLError, UnknownAlgorithmError

if TYPE_CHECKING:
    import gymnasium as gym

    from flowrl.actors import PlanResources, WorkerSet
    from flowrl.actors.placement import BundleRequest
    from flowrl.config import TrainerConfig
    from flowrl.iterators import LocalIterator
    from flowrl.policy import PolicySpec

    ExecutionPlan = Callable[[WorkerSet, Any, PlanResources], LocalIterator[dict[str, Any]]]
    ResourceFactory = Callable[[WorkerSet, Any], PlanResources]
    BundleFactory = Callable[[Any], list[BundleRequest]]
    PolicyFactory = Callable[[gym.Space[Any], gym.Space[Any], Any], PolicySpec]
    MultiPolicyFactory = Callable[[dict[str, tuple[gym.Space[Any], gym.Space[Any]]], Any], dict[str, PolicySpec]]


def _learner_resources(workers: WorkerSet, config: Any) -> PlanResources:
    """The declaration of algorithms whose plans wire only rollout workers and the learner group the config
    asks for (:func:`flowrl.actors.learner_resources`)."""
    from flowrl.actors import learner_resources  # imported here: the actors load PyTorch and Ray

    return learner_resources(workers, config)


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
    make_resources: ResourceFactory = _learner_resources
    #: What ``make_resources``'s actors ask Ray for (replay shards, aggregators), reserved with the workers'.
    bundles: BundleFactory = no_bundles
    #: Config keys a running trainer can change (:meth:`~flowrl.Trainer.update_config`, PBT): read by
    #: the learner's loss or optimizer at each update, never by rollout workers or plan operators.
    live_keys: frozenset[str] = frozenset()
    #: Whether the plan trains while samples arrive asynchronously (A3C, IMPALA, APPO, Ape-X): evaluation
    #: actors then play an iteration's evaluation while it trains, instead of after it.
    asynchronous: bool = False
    #: Whether the plan learns from the experiences ``input`` names (bc, marwil, cql); the others refuse them.
    offline: bool = False
    #: Whether the plan mixes recorded experiences into its sampled ones (``input: {"sampler": f, DIR: 1 - f}``).
    mixed_input: bool = False
    #: Whether the plan trains through ``resources.learners`` when the config asks for a learner group
    #: (``num_learners >= 2``); other algorithms refuse the key.
    learner_group: bool = False


class _BuiltIn(NamedTuple):
    module: str
    attribute: str  # the module's attribute holding the Algorithm
    description: str  # the Algorithm's own, for `flowrl list` without importing the module


_MODULES: dict[str, _BuiltIn] = {
    "pg": _BuiltIn("flowrl.algorithms.pg", "ALGORITHM", "vanilla policy gradient (REINFORCE)"),
    "a2c": _BuiltIn("flowrl.algorithms.a2c", "ALGORITHM", "synchronous advantage actor-critic"),
    "a3c": _BuiltIn("flowrl.algorithms.a3c", "ALGORITHM", "asynchronous advantage actor-critic"),
    "ppo": _BuiltIn("flowrl.algorithms.ppo", "ALGORITHM", "proximal policy optimisation"),
    "dqn": _BuiltIn(
        "flowrl.algorithms.dqn", "ALGORITHM", "deep Q-network (double, dueling, n-step, prioritized replay)"
    ),
    "apex": _BuiltIn("flowrl.algorithms.apex", "ALGORITHM", "Ape-X DQN: distributed prioritized replay"),
    "apex_ddpg": _BuiltIn("flowrl.algorithms.apex", "APEX_DDPG", "Ape-X DDPG: DDPG on distributed prioritized replay"),
    "ddpg": _BuiltIn("flowrl.algorithms.ddpg", "DDPG", "deep deterministic policy gradient"),
    "td3": _BuiltIn("flowrl.algorithms.ddpg", "TD3", "twin delayed DDPG"),
    "sac": _BuiltIn("flowrl.algorithms.sac", "ALGORITHM", "soft actor-critic (continuous and discrete actions)"),
    "r2d2": _BuiltIn(
        "flowrl.algorithms.r2d2",
        "ALGORITHM",
        "R2D2: recurrent Q-learning on distributed prioritized replay of sequences",
    ),
    "impala": _BuiltIn("flowrl.algorithms.impala", "ALGORITHM", "IMPALA: async actor-learner with V-trace"),
    "appo": _BuiltIn(
        "flowrl.algorithms.appo", "ALGORITHM", "APPO: IMPALA with a clipped surrogate around a target network"
    ),
    "ppo_dqn": _BuiltIn(
        "flowrl.algorithms.ppo_dqn",
        "ALGORITHM",
        "PPO and DQN policies trained side by side on one multi-agent rollout stream",
    ),
    "bc": _BuiltIn("flowrl.algorithms.marwil", "BC", "behaviour cloning of offline experiences"),
    "marwil": _BuiltIn(
        "flowrl.algorithms.marwil", "ALGORITHM", "MARWIL: advantage-weighted imitation of offline experiences"
    ),
    "cql": _BuiltIn(
        "flowrl.algorithms.cql", "ALGORITHM", "conservative Q-learning from offline experiences (over DQN or SAC)"
    ),
    "es": _BuiltIn(
        "flowrl.algorithms.es", "ALGORITHM", "evolution strategies (antithetic perturbations, centered ranks)"
    ),
    "ars": _BuiltIn("flowrl.algorithms.ars", "ALGORITHM", "augmented random search (V2-t, linear policy)"),
}
_REGISTERED: dict[str, Algorithm] = {}


class _Instead(NamedTuple):
    use: tuple[str, ...]  # built-in algorithms to use instead, best first
    why: str  # what they share with the one asked for


#: Well-known algorithms flowrl does not have, with the built-in ones that serve the same purpose:
#: an unknown name is answered by purpose when it is here, by spelling otherwise.
NOT_IMPLEMENTED: dict[str, _Instead] = {
    "rainbow": _Instead(
        ("dqn", "apex"), "DQN with double Q, dueling, n-step and prioritized replay, no C51 or noisy nets"
    ),
    "ddppo": _Instead(("ppo",), "PPO with num_learners >= 2 learns data-parallel"),
    "trpo": _Instead(("ppo",), "a trust-region policy gradient"),
    "acktr": _Instead(("a2c", "ppo"), "synchronous actor-critic"),
    "mappo": _Instead(("ppo",), "PPO trains multi-agent envs, one policy per policies entry"),
    "ippo": _Instead(("ppo",), "PPO trains multi-agent envs, one policy per policies entry"),
    "qmix": _Instead(("dqn", "ppo_dqn"), "per-agent Q-learning on a multi-agent env, without the mixing network"),
    "maddpg": _Instead(("ppo",), "multi-agent envs with continuous actions, one policy per policies entry"),
    "crr": _Instead(("cql", "marwil"), "offline learning: conservative Q-learning, advantage-weighted imitation"),
    "iql": _Instead(("cql", "marwil"), "offline learning: conservative Q-learning, advantage-weighted imitation"),
    "alphazero": _Instead(("ppo",), "model-free policy learning; no tree search"),
    "muzero": _Instead(("ppo", "impala"), "model-free learning; no learned model or tree search"),
    "dreamer": _Instead(("ppo", "impala"), "model-free learning; no world model"),
    "dreamerv3": _Instead(("ppo", "impala"), "model-free learning; no world model"),
    "maml": _Instead(("ppo",), "the inner-loop learner; no meta-learning"),
    "mbmpo": _Instead(("ppo",), "the policy learner; no learned dynamics models"),
    "slateq": _Instead(("dqn",), "Q-learning over flat discrete actions"),
}


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


def algorithm_descriptions() -> dict[str, str]:
    """Every available algorithm's one-line description, by name (sorted); built-in algorithms are not imported."""
    described = {name: builtin.description for name, builtin in _MODULES.items()}
    described.update({name: algorithm.description for name, algorithm in _REGISTERED.items()})
    return dict(sorted(described.items()))


def get_algorithm(name: str) -> Algorithm:
    """The algorithm called ``name`` (case-insensitive); unknown names raise with the closest ones."""
    key = name.lower() if isinstance(name, str) else name
    if key in _REGISTERED:
        return _REGISTERED[key]
    if key in _MODULES:
        builtin = _MODULES[key]
        algorithm: Algorithm = getattr(importlib.import_module(builtin.module), builtin.attribute)
        _REGISTERED[key] = algorithm
        return algorithm
    names = list_algorithms()
    if key in NOT_IMPLEMENTED:
        instead = NOT_IMPLEMENTED[key]
        raise UnknownAlgorithmError(
            f"algorithm {name!r} is not implemented in flowrl; use {' or '.join(map(repr, instead.use))} "
            f"({instead.why}); available: {', '.join(names)}"
        )
    close = difflib.get_close_matches(str(key), names, n=3, cutoff=0.4)
    hint = f"did you mean {', '.join(repr(c) for c in close)}? " if close else ""
    raise UnknownAlgorithmError(f"unknown algorithm {name!r}; {hint}available: {', '.join(names)}")
