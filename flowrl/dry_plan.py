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

from flowrl.actors import WorkerSet
from flowrl.actors.placeholders import placeholder_actors
from flowrl.algorithms import get_algorithm
from flowrl.config import TrainerConfig
from flowrl.envs import get_env_creator
from flowrl.plan import Plan
from flowrl.trainer import EnvSpec, policy_specs


def dry_plan(algo: str, env: EnvSpec, config: Mapping[str, Any] | TrainerConfig | None = None) -> Plan:
    """The plan ``Trainer(algo, env, config)`` would run, built over placeholder actors: for its graph
    (``describe()``, ``to_mermaid()``, ``to_dot()``), not to run.

    The config is validated as the Trainer validates it (:class:`~flowrl.errors.ConfigError`)
    and the env is made and checked; the local worker's envs are closed and a learner thread
    the plan declares is stopped before this returns.
    """
    algorithm = get_algorithm(algo)
    if isinstance(config, TrainerConfig):
        config = config.to_dict(jsonable=False)
    settings = algorithm.config_class.from_dict(config).frozen()
    env_creator = get_env_creator(env)
    with placeholder_actors():
        specs = policy_specs(algorithm, settings, env_creator)
        workers = WorkerSet(
            env_creator=env_creator,
            policy_specs=specs,
            config=settings,
            num_workers=settings.num_workers,
            num_cpus_per_worker=settings.num_cpus_per_worker,
            recreate_failed_workers=settings.recreate_failed_workers,
            check_env=settings.check_env,
            bundles=algorithm.bundles(settings),
        )
        try:
            resources = algorithm.make_resources(workers, settings)
            try:
                return Plan(algorithm.execution_plan(workers, settings, resources), name=algorithm.name)
            finally:
                if resources.learner is not None:
                    resources.learner.stop()
        finally:
            workers.local_worker().stop()
