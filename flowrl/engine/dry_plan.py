"""An algorithm's execution plan built for its graph alone: over placeholder actors, without Ray.

:func:`dry_plan` goes through the Trainer's build (policies, the local worker, the algorithm's
resources, its ``execution_plan``) inside :func:`~flowrl.actors.placeholders.placeholder_actors`,
so the remote rollout workers, replay shards and aggregators are placeholders of their
classes: the graph has the operators, actors and edges a real build records, and no Ray
instance, actor or placement group is started. ``flowrl plan`` prints it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flowrl.actors.placeholders import placeholder_actors
from flowrl.algorithms import get_algorithm
from flowrl.config import TrainerConfig
from flowrl.engine.build import EnvSpec, build_plan, make_workers, plan_bundles, validated_config
from flowrl.envs import get_env_creator
from flowrl.plan.graph import Plan


def dry_plan(algo: str, env: EnvSpec, config: Mapping[str, Any] | TrainerConfig | None = None) -> Plan:
    """The plan ``Trainer(algo, env, config)`` would run, built over placeholder actors: for its graph
    (``describe()``, ``to_mermaid()``, ``to_dot()``), not to run.

    The config is validated as the Trainer validates it (:class:`~flowrl.errors.ConfigError`)
    and the env is made and checked; the local worker's envs are closed and a learner thread
    the plan declares is stopped before this returns.
    """
    algorithm = get_algorithm(algo)
    settings = validated_config(algorithm, config)
    with placeholder_actors():
        workers = make_workers(algorithm, settings, get_env_creator(env), plan_bundles(algorithm, settings))
        try:
            resources = algorithm.make_resources(workers, settings)
            try:
                return build_plan(algorithm, workers, settings, resources)
            finally:
                if resources.learner is not None:
                    resources.learner.stop()
        finally:
            workers.local_worker().stop()
