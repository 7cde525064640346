"""MuJoCo ids: recognised by their Gymnasium entry point, and reported in the driver, naming the extra,
when the mujoco package is missing."""

from __future__ import annotations

import sys

import gymnasium
import pytest

from flowrl.envs import get_env_creator, make_env
from flowrl.envs.mujoco import is_mujoco_id
from flowrl.envs.registry import GymnasiumCreator
from flowrl.errors import EnvError

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("env_id", ["Hopper-v5", "HalfCheetah-v5", "Walker2d-v5", "Ant-v4", "InvertedPendulum-v5"])
def test_gymnasium_s_mujoco_ids_are_recognised(env_id: str) -> None:
    assert is_mujoco_id(env_id)


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1", "ALE/Pong-v5", "Hopper-v99", "", None, 3])
def test_other_ids_and_values_are_not_mujoco_ids(env_id: object) -> None:
    assert not is_mujoco_id(env_id)


def test_a_mujoco_id_without_mujoco_names_the_extra_that_installs_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "mujoco", None)  # `import mujoco` raises ImportError, as when it is missing
    needs_the_extra = r"MuJoCo envs need the optional dependency mujoco: pip install -e '\.\[mujoco\]'"
    with pytest.raises(EnvError, match=needs_the_extra):
        get_env_creator("Hopper-v5")
    assert isinstance(get_env_creator("CartPole-v1"), GymnasiumCreator)  # other ids do not need it


@pytest.mark.integration  # importing mujoco starts a process (glfw asks a child for the library's version)
def test_hopper_is_made_with_its_spaces_when_mujoco_is_installed() -> None:
    pytest.importorskip("mujoco")
    assert get_env_creator("Hopper-v5") == GymnasiumCreator("Hopper-v5")
    env = make_env("Hopper-v5", seed=0)
    try:
        obs, _ = env.reset(seed=0)
        assert obs.shape == (11,)
        assert isinstance(env.action_space, gymnasium.spaces.Box) and env.action_space.shape == (3,)
    finally:
        env.close()
