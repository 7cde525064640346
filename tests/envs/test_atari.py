"""Atari ids, the missing-ale-py error, and (when ale-py is installed) the preprocessed envs."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

from flowrl.envs import check_env, get_env_creator, is_atari_id, make_atari_env, make_env
from flowrl.envs.atari import MISSING_ALE_MESSAGE, MISSING_OPENCV_MESSAGE
from flowrl.errors import EnvError, UnknownEnvError


@pytest.mark.parametrize(
    "env_id, expected",
    [
        ("ALE/Pong-v5", True),
        ("ALE/Breakout-ram-v5", True),
        ("PongNoFrameskip-v4", True),
        ("BreakoutNoFrameskip-v4", True),
        ("Pong-v5", False),
        ("CartPole-v1", False),
        ("ale/Pong-v5", False),
        (None, False),
    ],
)
def test_is_atari_id(env_id: object, expected: bool) -> None:
    assert is_atari_id(env_id) is expected


@pytest.fixture
def no_ale_py(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``import ale_py`` fail, whether or not it is installed."""
    monkeypatch.setitem(sys.modules, "ale_py", None)


def test_missing_ale_py_is_reported_with_the_extra_to_install(no_ale_py: None) -> None:
    assert MISSING_ALE_MESSAGE == "Atari envs need the optional dependency ale-py: pip install 'flowrl-ray[atari]'"
    with pytest.raises(EnvError) as info:
        make_atari_env("ALE/Pong-v5")
    assert str(info.value) == MISSING_ALE_MESSAGE
    assert isinstance(info.value.__cause__, ImportError)


@pytest.mark.parametrize("env_id", ["ALE/Pong-v5", "PongNoFrameskip-v4"])
def test_make_env_reports_missing_ale_py_before_creating_anything(no_ale_py: None, env_id: str) -> None:
    for resolve in (make_env, get_env_creator):
        with pytest.raises(EnvError) as info:
            resolve(env_id)
        assert str(info.value) == MISSING_ALE_MESSAGE
        assert not isinstance(info.value, UnknownEnvError)


def test_missing_opencv_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    # A stand-in ale_py lets this run where ale-py is not installed; registering it is a no-op for Gymnasium.
    monkeypatch.setitem(sys.modules, "ale_py", types.ModuleType("ale_py"))
    monkeypatch.setitem(sys.modules, "cv2", None)
    for make in (make_atari_env, make_env):
        with pytest.raises(EnvError) as info:
            make("ALE/Pong-v5")
        assert str(info.value) == MISSING_OPENCV_MESSAGE
        assert "opencv-python" in str(info.value) and "pip install 'flowrl-ray[atari]'" in str(info.value)


# ---- the real thing, only where ale-py and OpenCV are installed


@pytest.fixture
def ale_py():
    pytest.importorskip("cv2")
    return pytest.importorskip("ale_py")


def test_make_atari_env_preprocesses_and_stacks_frames(ale_py) -> None:
    env = make_atari_env("ALE/Pong-v5")
    assert env.observation_space.shape == (4, 84, 84)
    assert env.observation_space.dtype == np.uint8
    # frame_skip is done by the preprocessing, so the emulator itself must not skip frames.
    assert env.unwrapped._frameskip == 1
    obs, info = env.reset(seed=0)
    assert obs.shape == (4, 84, 84) and obs.dtype == np.uint8
    check_env(env, num_steps=20)
    env.close()


def test_make_env_routes_atari_ids_and_passes_env_config(ale_py) -> None:
    env = make_env("PongNoFrameskip-v4", {"frame_stack": 2, "screen_size": 64}, seed=0)
    assert env.observation_space.shape == (2, 64, 64)
    env.close()
    env = make_env("ALE/Pong-v5", {"frame_stack": 1})
    assert env.observation_space.shape == (84, 84)
    env.close()


def test_atari_options_are_validated(ale_py) -> None:
    with pytest.raises(EnvError, match="frameskip=4"):
        make_atari_env("ALE/Pong-v5", frameskip=4)
    with pytest.raises(EnvError, match="observes the console's RAM; use the image id 'ALE/Pong-v5'"):
        make_atari_env("ALE/Pong-ram-v5")
    with pytest.raises(UnknownEnvError, match="unknown env 'ALE/Pongg-v5'; did you mean 'ALE/Pong-v5'"):
        make_env("ALE/Pongg-v5")
    with pytest.raises(UnknownEnvError):
        make_atari_env("ALE/Pongg-v5")
