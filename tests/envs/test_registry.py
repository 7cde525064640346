"""Env creation: registered names, Gymnasium ids, creator callables, errors and suggestions."""

from __future__ import annotations

import pickle
from typing import Any, cast

import gymnasium
import numpy as np
import pytest
from gymnasium import spaces

from flowrl.envs import check_env, env_spaces, get_env_creator, make_env, register_env, registry
from flowrl.errors import EnvError, UnknownEnvError

pytestmark = pytest.mark.unit


class ConfigEnv(gymnasium.Env):
    """A tiny valid env that remembers the env_config it was created with."""

    def __init__(self, env_config: dict) -> None:
        self.env_config = env_config
        self.closed = False
        size = env_config.get("size", 3)
        self.observation_space = spaces.Box(-1.0, 1.0, (size,), np.float32)
        self.action_space = spaces.Discrete(4)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self.np_random.uniform(-1, 1, self.observation_space.shape).astype(np.float32), {}

    def step(self, action):
        obs = self.np_random.uniform(-1, 1, self.observation_space.shape).astype(np.float32)
        return obs, 0.5, bool(self.np_random.random() < 0.1), False, {}

    def close(self) -> None:
        self.closed = True


@pytest.fixture(autouse=True)
def empty_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts with an empty flowrl registry and cannot leak names into others."""
    monkeypatch.setattr(registry, "_REGISTRY", {})


def test_registered_creator_gets_a_copy_of_env_config() -> None:
    config = {"size": 5, "extra": [1]}
    register_env("config-env", ConfigEnv)
    env = make_env("config-env", config)
    assert isinstance(env, ConfigEnv)
    assert env.env_config == {"size": 5, "extra": [1]}
    assert env.env_config is not config  # a creator that pops keys must not change the caller's config
    assert env.observation_space.shape == (5,)


def test_missing_env_config_is_an_empty_dict() -> None:
    register_env("config-env", ConfigEnv)
    assert make_env("config-env").env_config == {}


def test_re_registering_replaces_the_creator() -> None:
    register_env("config-env", lambda cfg: ConfigEnv({"size": 1}))
    register_env("config-env", lambda cfg: ConfigEnv({"size": 2}))
    assert make_env("config-env").observation_space.shape == (2,)


def test_registered_name_shadows_a_gymnasium_id() -> None:
    register_env("CartPole-v1", ConfigEnv)
    assert isinstance(make_env("CartPole-v1"), ConfigEnv)


def test_registered_custom_env_passes_the_checker() -> None:
    register_env("config-env", ConfigEnv)
    check_env(make_env("config-env", {"size": 2}))


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_gymnasium_ids_make_envs_that_pass_the_checker(env_id: str) -> None:
    env = make_env(env_id)
    assert env.spec is not None and env.spec.id == env_id
    check_env(env)


def test_env_config_becomes_gymnasium_make_kwargs() -> None:
    env = make_env("Pendulum-v1", {"g": 3.0})
    assert env.unwrapped.g == 3.0


def test_module_qualified_gymnasium_id() -> None:
    env = make_env("gymnasium.envs.classic_control:CartPole-v1")
    assert env.spec.id == "CartPole-v1"
    with pytest.raises(UnknownEnvError, match="cannot import module 'no_such_module_flowrl'"):
        make_env("no_such_module_flowrl:Foo-v0")


def test_callable_creator_is_used_directly() -> None:
    env = make_env(ConfigEnv, {"size": 4})
    assert isinstance(env, ConfigEnv) and env.env_config == {"size": 4}


def test_seed_seeds_the_action_space_but_does_not_reset() -> None:
    first = make_env("CartPole-v1", seed=7)
    second = make_env("CartPole-v1", seed=7)
    assert [first.action_space.sample() for _ in range(20)] == [second.action_space.sample() for _ in range(20)]
    assert first.unwrapped.state is None  # CartPole sets its state on reset: the caller resets, not make_env


def test_unknown_gymnasium_id_suggests_the_closest_name_first() -> None:
    with pytest.raises(UnknownEnvError) as info:
        make_env("CartPol-v1")
    message = str(info.value)
    assert message.startswith("unknown env 'CartPol-v1'; did you mean 'CartPole-v1'?")
    assert "register_env" in message and "gymnasium.registry" in message


def test_unknown_name_matches_case_insensitively_and_suggests_registered_names() -> None:
    register_env("my-probe-env", ConfigEnv)
    with pytest.raises(UnknownEnvError, match=r"did you mean 'CartPole-v1'\?"):
        make_env("cartpole-v1")
    with pytest.raises(UnknownEnvError, match=r"unknown env 'my-prob-env'; did you mean 'my-probe-env'\?"):
        make_env("my-prob-env")


def test_unknown_name_without_close_match_says_so() -> None:
    with pytest.raises(UnknownEnvError, match="unknown env 'zzzqqq'; no registered flowrl env or Gymnasium id is c"):
        make_env("zzzqqq")


def test_creator_that_raises_is_wrapped_with_the_env_name_and_cause() -> None:
    boom = ValueError("boom: bad size")

    def broken(env_config: dict) -> gymnasium.Env:
        raise boom

    register_env("broken-env", broken)
    with pytest.raises(EnvError) as info:
        make_env("broken-env", {"size": -1})
    assert not isinstance(info.value, UnknownEnvError)
    assert "creating env 'broken-env'" in str(info.value)
    assert "env_config={'size': -1}" in str(info.value)
    assert "ValueError: boom: bad size" in str(info.value)
    assert info.value.__cause__ is boom


def test_bad_gymnasium_kwargs_are_wrapped() -> None:
    with pytest.raises(EnvError, match="creating env 'CartPole-v1' with env_config=\\{'bogus': 1\\} failed") as info:
        make_env("CartPole-v1", {"bogus": 1})
    assert isinstance(info.value.__cause__, TypeError)


def test_creator_must_return_a_gymnasium_env() -> None:
    register_env("not-an-env", lambda cfg: "hello")
    with pytest.raises(EnvError, match="env 'not-an-env' returned 'hello' of type str; it must return a gymnasium.Env"):
        make_env("not-an-env")


def test_env_of_the_wrong_type_is_rejected() -> None:
    with pytest.raises(EnvError, match="got 42 of type int"):
        make_env(cast(Any, 42))


@pytest.mark.parametrize("name, creator", [("", ConfigEnv), (3, ConfigEnv), ("x", "not callable")])
def test_register_env_validates_its_arguments(name: object, creator: object) -> None:
    with pytest.raises(EnvError):
        register_env(name, cast(Any, creator))


def test_env_spaces_reads_spaces_and_closes_the_env() -> None:
    made: list[ConfigEnv] = []

    def creator(env_config: dict) -> ConfigEnv:
        made.append(ConfigEnv(env_config))
        return made[-1]

    obs_space, action_space = env_spaces(creator, {"size": 6})
    assert obs_space == spaces.Box(-1.0, 1.0, (6,), np.float32)
    assert action_space == spaces.Discrete(4)
    assert len(made) == 1 and made[0].closed


def test_get_env_creator_resolves_without_creating() -> None:
    register_env("config-env", ConfigEnv)
    assert get_env_creator("config-env") is ConfigEnv
    assert get_env_creator(ConfigEnv) is ConfigEnv
    with pytest.raises(UnknownEnvError, match="did you mean 'Pendulum-v1'"):
        get_env_creator("Pendulun-v1")


def test_gymnasium_creator_is_picklable_and_takes_env_config() -> None:
    creator = pickle.loads(pickle.dumps(get_env_creator("Pendulum-v1")))
    env = creator({"g": 2.0})
    assert env.spec.id == "Pendulum-v1" and env.unwrapped.g == 2.0
    # The creator works in a process where nothing was registered: it only needs flowrl and gymnasium.
    assert make_env(creator).spec.id == "Pendulum-v1"
