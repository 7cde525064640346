"""Plans built over placeholder actors (``flowrl plan``): the same graph as a real build, nothing started.

Each built-in algorithm (and the variants whose actors differ: DQN with remote workers,
IMPALA with aggregators) is built twice with one config: by a real Trainer in the test
session's Ray, and by :func:`flowrl.engine.dry_plan.dry_plan`. Their graphs must be equal, stage ids
aside. That no Ray starts for a dry build is tested in a fresh process in test_without_ray.py.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from flowrl import Trainer
from flowrl.actors.placeholders import PlaceholderActor, PlaceholderLocalWorker, placeholder_actors
from flowrl.algorithms import get_algorithm, list_algorithms
from flowrl.data import DEFAULT_POLICY_ID, SampleBatch
from flowrl.data.offline import ExperienceWriter
from flowrl.engine.build import make_workers, validated_config
from flowrl.engine.dry_plan import dry_plan
from flowrl.envs import get_env_creator
from flowrl.errors import ConfigError, FlowRLError
from flowrl.plan.graph import Plan, PlanGraph
from flowrl.policy import TorchPolicy

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("ray_session"), pytest.mark.timeout(240)]

# Small reservations, so that every real build fits the test session's 2 CPUs.
SMALL = {"num_cpus_per_worker": 0.1}
ENVS = {
    "ddpg": "Pendulum-v1",
    "td3": "Pendulum-v1",
    "sac": "Pendulum-v1",
    "apex_ddpg": "Pendulum-v1",
    "ppo_dqn": "MultiAgentCartPole",
}


def fewest_workers(name: str) -> dict[str, Any]:
    """The algorithm's default config, with one remote worker where it has some (each real one starts a process)."""
    default = get_algorithm(name).config_class.from_dict({}).num_workers
    return {"num_workers": min(default, 1)}


# case -> (algorithm, config beyond SMALL): every built-in algorithm, plus the variants whose
# actors differ: several remote workers, and aggregators.
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    **{name: (name, fewest_workers(name)) for name in list_algorithms()},
    "dqn_remote_workers": ("dqn", {"num_workers": 2}),
    "impala_aggregators": ("impala", {"num_workers": 2, "num_aggregation_workers": 1, "num_cpus_per_aggregator": 0.1}),
    # Learner groups: TrainOneStep's, a learner thread's, and target networks moved on the replicas.
    "ppo_learners": ("ppo", {"num_workers": 0, "num_learners": 2, "num_cpus_per_learner": 0.1}),
    "impala_learners": ("impala", {"num_workers": 1, "num_learners": 2, "num_cpus_per_learner": 0.1}),
    "dqn_learners": ("dqn", {"num_workers": 0, "num_learners": 2, "num_cpus_per_learner": 0.1}),
}


def without_stage_ids(described: str) -> list[str]:
    """``plan.describe()`` lines without the ``[n] `` stage ids, which count up per process."""
    return [re.sub(r"^(\s*)\[\d+\] ", r"\1", line.rstrip()) for line in described.strip().splitlines()]


def shape(plan: Plan) -> tuple[list[str], dict[str, int], list[tuple[str, str, str]]]:
    """The graph with each operator named by its position in dataflow order instead of its stage id."""
    graph = plan.graph
    position = {PlanGraph.op_id(stage): f"op#{i}" for i, stage in enumerate(graph.operators.values())}
    edges = [(position.get(src, src), position.get(dst, dst), label) for src, dst, label in graph.edges]
    return [stage.label for stage in graph.operators.values()], dict(graph.actors), edges


def test_every_built_in_algorithm_has_a_case() -> None:
    # Algorithms other tests register (docs examples) are not built in.
    built_in = {
        name
        for name in list_algorithms()
        if get_algorithm(name).execution_plan.__module__.startswith("flowrl.algorithms.")
    }
    assert {algorithm for algorithm, _ in CASES.values()} == built_in


@pytest.fixture(scope="module")
def cartpole_experiences(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Four rows of CartPole-shaped experiences, for the offline algorithms' real builds (which open them)."""
    out = tmp_path_factory.mktemp("experiences")
    writer = ExperienceWriter(out)
    rng = np.random.default_rng(0)
    writer.write(
        {
            SampleBatch.OBS: rng.normal(size=(4, 4)).astype(np.float32),
            SampleBatch.NEW_OBS: rng.normal(size=(4, 4)).astype(np.float32),
            SampleBatch.ACTIONS: np.array([0, 1, 0, 1]),
            SampleBatch.REWARDS: np.ones(4, np.float32),
            SampleBatch.TERMINATEDS: np.array([False, False, False, True]),
            SampleBatch.EPS_ID: np.zeros(4, np.int64),
        }
    )
    writer.close()
    return out


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_dry_graph_is_the_real_graph(case: str, cartpole_experiences: Path) -> None:
    algorithm, overrides = CASES[case]
    env = ENVS.get(algorithm, "CartPole-v1")
    config = {**SMALL, **overrides}
    if get_algorithm(algorithm).offline:  # a real build opens its experiences
        config["input"] = str(cartpole_experiences)
    dry = dry_plan(algorithm, env, config)
    with Trainer(algorithm, env, config) as trainer:
        real = trainer.plan
        assert without_stage_ids(dry.describe()) == without_stage_ids(real.describe())
        assert shape(dry) == shape(real)
        assert dry.name == real.name == get_algorithm(algorithm).name
        real_actors = [actor for stage in real.graph.operators.values() for actor in stage.actors]
    dry_actors = [actor for stage in dry.graph.operators.values() for actor in stage.actors]
    assert len(dry_actors) == len(real_actors)
    assert all(isinstance(actor, PlaceholderActor) for actor in dry_actors)


def test_a_dry_plan_cannot_run() -> None:
    plan = dry_plan("ppo", "CartPole-v1", {"num_workers": 1})
    with pytest.raises(FlowRLError, match="placeholder actors"):
        next(plan)


def test_a_dry_plan_validates_the_config_as_a_trainer_does() -> None:
    with pytest.raises(ConfigError, match="num_workers"):
        dry_plan("apex", "CartPole-v1", {"num_workers": 0})


def test_the_local_worker_of_a_dry_plan_builds_a_policy_only_when_asked() -> None:
    """The placeholder local worker serves the classes and specs a plan's build reads; a policy is built
    on request (loading PyTorch), and what only a running plan reads raises."""
    with placeholder_actors():
        workers = make_workers(
            get_algorithm("dqn"), validated_config(get_algorithm("dqn"), {}), get_env_creator("CartPole-v1"), []
        )
    local = workers.local_worker()
    assert isinstance(local, PlaceholderLocalWorker) and not local.multi_agent
    assert local.policy_class() is TorchPolicy and workers.trainable_policies() == [DEFAULT_POLICY_ID]
    assert isinstance(local.get_policy(), TorchPolicy) and local.get_policy() is local.get_policy()
    with pytest.raises(
        FlowRLError, match="local worker's 'sample' was read while building a plan over placeholder actors"
    ):
        local.sample()


def test_a_dry_perturbation_search_checks_the_noise_table_without_building_the_policy() -> None:
    with pytest.raises(ConfigError, match="noise_table_size=100 < 1282, the number of policy parameters"):
        dry_plan("es", "CartPole-v1", {"noise_table_size": 100})
