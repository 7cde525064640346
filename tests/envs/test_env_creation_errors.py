"""Env creation failures as one line naming what to do: a missing dependency (also through the
Trainer's policy specs and ``flowrl train``, exit 2), and a Gymnasium ``VectorEnv`` given as an env."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any, Iterator

import gymnasium
import numpy as np
import pytest

from flowrl.actors.sampling.checks import reward_problem
from flowrl.algorithms import get_algorithm
from flowrl.cli.main import main
from flowrl.engine.build import policy_specs
from flowrl.envs import check_env, get_env_creator, make_env
from flowrl.envs.checker import VECTOR_ENV_HINT
from flowrl.envs.context import EnvContext
from flowrl.errors import EnvCheckError, EnvError

pytestmark = pytest.mark.unit

MISSING_ID = "FlowrlTestNeedsMissingDep-v0"
GYMNASIUM_MESSAGE = 'MuJoCo is not installed, run `pip install "gymnasium[mujoco]"`'


def needs_a_missing_dependency(**kwargs: Any) -> gymnasium.Env:
    """An entry point as Gymnasium's MuJoCo envs have one where MuJoCo is not installed."""
    raise gymnasium.error.DependencyNotInstalled(GYMNASIUM_MESSAGE)


@pytest.fixture
def missing_dependency_env() -> Iterator[str]:
    gymnasium.register(MISSING_ID, entry_point=needs_a_missing_dependency)
    yield MISSING_ID
    del gymnasium.registry[MISSING_ID]


def test_make_env_reports_a_missing_dependency_in_one_line_naming_it(missing_dependency_env: str) -> None:
    with pytest.raises(EnvError) as info:
        make_env(missing_dependency_env)
    assert str(info.value) == f"env {MISSING_ID!r} needs a package that is not installed: {GYMNASIUM_MESSAGE}"
    assert isinstance(info.value.__cause__, gymnasium.error.DependencyNotInstalled)


def test_a_creator_missing_a_module_is_reported_naming_the_module() -> None:
    def creator(env_config: dict) -> gymnasium.Env:
        importlib.import_module("flowrl_no_such_simulator")  # the simulator this env needs is not installed

        raise AssertionError("unreachable")

    with pytest.raises(
        EnvError, match="needs a package that is not installed: no module named 'flowrl_no_such_simulator'"
    ):
        make_env(creator)


def test_the_trainers_policy_specs_report_a_missing_dependency_as_an_env_error(missing_dependency_env: str) -> None:
    """The Trainer's first env is made for its policy specs: that one used to escape as a raw traceback."""
    algorithm = get_algorithm("ppo")
    with pytest.raises(EnvError, match=f"env {MISSING_ID!r} needs a package that is not installed: MuJoCo"):
        policy_specs(algorithm, algorithm.config_class.from_dict({}), get_env_creator(missing_dependency_env))


def test_flowrl_train_prints_one_error_line_and_exits_2(
    missing_dependency_env: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["train", "--algo", "ppo", "--env", MISSING_ID, "--num-workers", "0", "--results-dir", str(tmp_path)]
    assert main(argv) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "Traceback" in line or "error" in line]
    assert errors == [f"flowrl: error: env {MISSING_ID!r} needs a package that is not installed: {GYMNASIUM_MESSAGE}"]


def vector_env(env_config: dict) -> Any:
    return gymnasium.make_vec("CartPole-v1", num_envs=2)


def test_a_vector_env_creator_is_told_to_give_one_env_and_num_envs_per_worker() -> None:
    with pytest.raises(EnvError) as info:
        make_env(vector_env)
    assert str(info.value).endswith(f"returned CartPoleVectorEnv: {VECTOR_ENV_HINT}")
    assert "num_envs_per_worker" in VECTOR_ENV_HINT and "env_backend: envpool" in VECTOR_ENV_HINT
    algorithm = get_algorithm("ppo")  # the Trainer's first env: its policy specs'
    with pytest.raises(EnvError, match="num_envs_per_worker"):
        policy_specs(algorithm, algorithm.config_class.from_dict({}), vector_env)


def test_the_env_checks_name_a_vector_env_for_what_it_is() -> None:
    env = vector_env(EnvContext())
    try:
        with pytest.raises(EnvCheckError, match="env is a CartPoleVectorEnv: a Gymnasium VectorEnv"):
            check_env(env)
    finally:
        env.close()
    assert reward_problem(np.array([1.0, 1.0])) == (
        f"reward=[1., 1.] of type ndarray, which is not one real number; {VECTOR_ENV_HINT}"
    )
    assert reward_problem(1.0) is None and reward_problem(float("nan")) == "reward=nan, which is not finite"
