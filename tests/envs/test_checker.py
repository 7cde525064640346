"""check_env: each kind of broken env is rejected with a message naming method, field, value and bound."""

from __future__ import annotations

import gymnasium
import numpy as np
import pytest
from gymnasium import spaces

from flowrl.envs import check_env, make_env
from flowrl.errors import EnvCheckError

pytestmark = pytest.mark.unit


class ProbeEnv(gymnasium.Env):
    """A valid env: 4 floats in [-4.8, 4.8], 2 actions, 10-step episodes. Subclasses break one thing each."""

    episode_length = 10

    def __init__(self) -> None:
        self.observation_space = spaces.Box(-4.8, 4.8, (4,), np.float32)
        self.action_space = spaces.Discrete(2)
        self.t = 0
        self.num_steps = 0
        self.num_resets = 0

    def observe(self):
        return self.np_random.uniform(-1, 1, 4).astype(np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        self.num_resets += 1
        return self.observe(), {}

    def step(self, action):
        assert self.action_space.contains(action)
        self.t += 1
        self.num_steps += 1
        return self.observe(), 1.0, self.t >= self.episode_length, False, {}


def check_message(env: gymnasium.Env, **kwargs) -> str:
    with pytest.raises(EnvCheckError) as info:
        check_env(env, **kwargs)
    return str(info.value)


# ---- envs that pass


def test_probe_env_passes_and_is_stepped_and_reset() -> None:
    env = ProbeEnv()
    check_env(env, num_steps=50)
    assert env.num_steps == 50
    assert env.num_resets == 2 + 5  # two seeded resets, then one per finished 10-step episode


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_gymnasium_envs_pass(env_id: str) -> None:
    check_env(make_env(env_id), num_steps=100)


def test_value_exactly_at_a_float32_bound_passes_and_the_next_float_fails() -> None:
    # 4.8 is not a float32; space.high holds float32(4.8), and so does the observation. Comparing
    # against the float64 4.8 would wrongly reject it.
    class AtBound(ProbeEnv):
        value = np.float32(4.8)

        def observe(self):
            return np.array([0, 0, self.value, 0], dtype=np.float32)

    check_env(AtBound())

    class JustAbove(AtBound):
        value = np.nextafter(np.float32(4.8), np.float32(np.inf))

    message = check_message(JustAbove())
    assert "obs[2]=4.8000007 above observation_space.high[2]=4.8" in message


# ---- observations


def test_nan_in_a_step_observation() -> None:
    class NaNOnStep(ProbeEnv):
        def step(self, action):
            obs, *rest = super().step(action)
            if self.num_steps == 3:
                obs[1] = np.nan
            return (obs, *rest)

    message = check_message(NaNOnStep())
    assert message.startswith("env.step() returned observation with obs[1]=nan, which is not finite")
    assert "step 3 of check_env" in message


def test_inf_in_a_reset_observation() -> None:
    class InfOnReset(ProbeEnv):
        def observe(self):
            return np.array([np.inf, 0, 0, 0], dtype=np.float32)

    message = check_message(InfOnReset(), seed=5)
    assert message.startswith("env.reset(seed=5) returned observation with obs[0]=inf, which is not finite")


def test_wrong_shape_on_reset() -> None:
    class WrongShape(ProbeEnv):
        def observe(self):
            return np.zeros(3, dtype=np.float32)

    message = check_message(WrongShape())
    assert message.startswith("env.reset(seed=0) returned observation [0., 0., 0.] with shape (3,)")
    assert "but observation_space.shape is (4,)" in message


def test_wrong_shape_on_step_only() -> None:
    class ShapeOnStep(ProbeEnv):
        def step(self, action):
            _, *rest = super().step(action)
            return (np.zeros((4, 1), dtype=np.float32), *rest)

    message = check_message(ShapeOnStep())
    assert message.startswith("env.step() returned observation")
    assert "with shape (4, 1) but observation_space.shape is (4,)" in message


def test_wrong_dtype() -> None:
    class Float64(ProbeEnv):
        def observe(self):
            return np.zeros(4)

    message = check_message(Float64())
    assert "env.reset(seed=0) returned observation with dtype float64 but observation_space.dtype is float32" in message


def test_observation_that_is_not_an_array() -> None:
    class ListObs(ProbeEnv):
        def observe(self):
            return [0.0, 0.0, 0.0, 0.0]

    message = check_message(ListObs())
    assert "env.reset(seed=0) returned observation [0.0, 0.0, 0.0, 0.0] of type list" in message
    assert "must be a numpy array" in message


def test_observation_above_box_high() -> None:
    class Above(ProbeEnv):
        def observe(self):
            return np.array([0, 0, 7.5, 0], dtype=np.float32)

    message = check_message(Above())
    assert message == "env.reset(seed=0) returned observation with obs[2]=7.5 above observation_space.high[2]=4.8"


def test_observation_below_box_low_names_the_first_offending_index() -> None:
    class Below(ProbeEnv):
        def step(self, action):
            _, *rest = super().step(action)
            return (np.array([-9, 0, -10, 0], dtype=np.float32), *rest)

    message = check_message(Below())
    assert message.startswith("env.step() returned observation with obs[0]=-9.0 below observation_space.low[0]=-4.8")


def test_multidimensional_box_index() -> None:
    class Image(ProbeEnv):
        def __init__(self) -> None:
            super().__init__()
            self.observation_space = spaces.Box(0, 255, (2, 3), np.uint8)

        def observe(self):
            obs = np.zeros((2, 3), dtype=np.uint8)
            obs[1, 2] = 1
            return obs

    check_env(Image())
    # Bounds narrower than the dtype: a uint8 of 200 breaks high=100.
    narrow = Image()
    narrow.observation_space = spaces.Box(0, 100, (2, 3), np.uint8)
    narrow.observe = lambda: np.full((2, 3), 200, dtype=np.uint8)
    assert "obs[0, 0]=200 above observation_space.high[0, 0]=100" in check_message(narrow)


class DiscreteObsEnv(ProbeEnv):
    def __init__(self, value: object, space: spaces.Space) -> None:
        super().__init__()
        self.observation_space = space
        self.value = value

    def observe(self):
        return self.value


def test_discrete_observations() -> None:
    check_env(DiscreteObsEnv(np.int64(4), spaces.Discrete(5)))
    check_env(DiscreteObsEnv(3, spaces.Discrete(3, start=1)))
    message = check_message(DiscreteObsEnv(5, spaces.Discrete(5)))
    expected = "returned observation obs=5 above observation_space.start + observation_space.n - 1 = 4"
    assert message.startswith("env.reset(seed=0) ") and expected in message
    message = check_message(DiscreteObsEnv(0, spaces.Discrete(3, start=1)))
    assert "obs=0 below observation_space.start=1" in message
    message = check_message(DiscreteObsEnv(1.0, spaces.Discrete(5)))
    assert "returned observation 1.0 of type float" in message and "it must be an int" in message


def test_multidiscrete_observations() -> None:
    space = spaces.MultiDiscrete([2, 3])
    check_env(DiscreteObsEnv(np.array([1, 2]), space))
    message = check_message(DiscreteObsEnv(np.array([1, 3]), space))
    assert "obs[1]=3 above (observation_space.start + observation_space.nvec - 1)[1]=2" in message
    message = check_message(DiscreteObsEnv(np.array([-1, 0]), space))
    assert "obs[0]=-1 below observation_space.start[0]=0" in message
    message = check_message(DiscreteObsEnv(np.array([1, 2, 0]), space))
    assert "with shape (3,) but observation_space.shape is (2,)" in message


def test_multibinary_observations() -> None:
    space = spaces.MultiBinary(3)
    check_env(DiscreteObsEnv(np.array([0, 1, 1], dtype=np.int8), space))
    message = check_message(DiscreteObsEnv(np.array([0, 2, 1], dtype=np.int8), space))
    assert "obs[1]=2" in message and "values must be 0 or 1" in message
    message = check_message(DiscreteObsEnv(np.array([0, 1, 1]), space))
    assert "dtype int64 but observation_space.dtype is int8" in message


def test_dict_and_tuple_observations_are_checked_field_by_field() -> None:
    space = spaces.Dict({"pos": spaces.Box(-1, 1, (2,), np.float32), "mode": spaces.Discrete(3)})
    good = {"pos": np.zeros(2, np.float32), "mode": 2}
    check_env(DiscreteObsEnv(good, space))
    bad = {"pos": np.array([0, 1.5], np.float32), "mode": 2}
    message = check_message(DiscreteObsEnv(bad, space))
    assert "obs['pos'][1]=1.5 above observation_space['pos'].high[1]=1.0" in message
    message = check_message(DiscreteObsEnv({"pos": good["pos"]}, space))
    assert "keys ['pos']" in message and "keys ['mode', 'pos']" in message

    tuple_space = spaces.Tuple((spaces.Discrete(2), spaces.Box(0, 1, (1,), np.float32)))
    check_env(DiscreteObsEnv((1, np.ones(1, np.float32)), tuple_space))
    message = check_message(DiscreteObsEnv((1, np.full(1, np.nan, np.float32)), tuple_space))
    assert "obs[1][0]=nan, which is not finite" in message


def test_other_spaces_fall_back_to_contains() -> None:
    space = spaces.Text(max_length=3)
    check_env(DiscreteObsEnv("ab", space))
    message = check_message(DiscreteObsEnv("abcdef", space))
    assert "env.reset(seed=0) returned observation obs='abcdef' that is not in observation_space Text(" in message


# ---- reset and step APIs


def test_old_four_tuple_step_api() -> None:
    class OldStep(ProbeEnv):
        def step(self, action):
            obs, reward, terminated, truncated, info = super().step(action)
            return obs, reward, terminated or truncated, info

    message = check_message(OldStep())
    assert message.startswith("env.step() returned 4 values (obs, reward, done, info), the old Gym API")
    assert "Gymnasium's 5-tuple (obs, reward, terminated, truncated, info) is needed" in message


def test_reset_returning_a_bare_observation() -> None:
    class BareReset(ProbeEnv):
        def reset(self, *, seed=None, options=None):
            return super().reset(seed=seed)[0]

    message = check_message(BareReset())
    assert message.startswith("env.reset(seed=0) returned a bare observation [")
    assert "instead of the tuple (obs, info)" in message


def test_bare_reset_of_a_two_element_tuple_observation_is_recognised() -> None:
    space = spaces.Tuple((spaces.Discrete(2), spaces.Discrete(2)))

    class BareTupleReset(DiscreteObsEnv):
        def reset(self, *, seed=None, options=None):
            return super().reset(seed=seed)[0]

    assert "returned a bare observation (1, 0)" in check_message(BareTupleReset((1, 0), space))


def test_reset_info_must_be_a_dict() -> None:
    class ListInfo(ProbeEnv):
        def reset(self, *, seed=None, options=None):
            return super().reset(seed=seed)[0], []

    assert "env.reset(seed=0) returned info [] of type list; info must be a dict" in check_message(ListInfo())


@pytest.mark.parametrize(
    "reward, expected",
    [
        (float("nan"), "env.step() returned reward=nan; reward must be a finite real scalar"),
        (np.float32(np.inf), "env.step() returned reward=inf; reward must be a finite real scalar"),
        (np.array([1.0, 2.0]), "env.step() returned reward=[1., 2.] of type ndarray; reward must be a finite real"),
        (None, "env.step() returned reward=None of type NoneType"),
        (True, "env.step() returned reward=True of type bool"),
        (1 + 2j, "env.step() returned reward=(1+2j) of type complex"),
    ],
)
def test_reward_must_be_a_finite_real_scalar(reward: object, expected: str) -> None:
    class BadReward(ProbeEnv):
        def step(self, action):
            obs, _, terminated, truncated, info = super().step(action)
            return obs, reward, terminated, truncated, info

    assert expected in check_message(BadReward())


@pytest.mark.parametrize("reward", [1, np.int32(-2), np.float32(0.5), np.array(0.25)])
def test_real_scalar_rewards_pass(reward: object) -> None:
    class ScalarReward(ProbeEnv):
        def step(self, action):
            obs, _, terminated, truncated, info = super().step(action)
            return obs, reward, terminated, truncated, info

    check_env(ScalarReward())


@pytest.mark.parametrize("field", ["terminated", "truncated"])
def test_flags_must_be_bools(field: str) -> None:
    class IntFlags(ProbeEnv):
        def step(self, action):
            obs, reward, terminated, truncated, info = super().step(action)
            flags = {"terminated": terminated, "truncated": truncated}
            flags[field] = int(flags[field])
            return obs, reward, flags["terminated"], flags["truncated"], info

    message = check_message(IntFlags())
    assert f"env.step() returned {field}=0 of type int; {field} must be a bool" in message


def test_numpy_bool_flags_pass() -> None:
    class NumpyFlags(ProbeEnv):
        def step(self, action):
            obs, reward, terminated, truncated, info = super().step(action)
            return obs, reward, np.bool_(terminated), np.bool_(truncated), info

    check_env(NumpyFlags())


def test_step_info_must_be_a_dict() -> None:
    class NoInfo(ProbeEnv):
        def step(self, action):
            return (*super().step(action)[:4], None)

    assert "env.step() returned info None of type NoneType; info must be a dict" in check_message(NoInfo())


def test_reset_that_ignores_seed() -> None:
    class Unseeded(ProbeEnv):
        def __init__(self) -> None:
            super().__init__()
            self.rng = np.random.default_rng()

        def reset(self, *, seed=None, options=None):
            return self.rng.uniform(-1, 1, 4).astype(np.float32), {}

    message = check_message(Unseeded(), seed=3)
    assert message.startswith("env.reset(seed=3) ignores seed: two calls returned different first observations")


def test_reset_without_a_seed_keyword() -> None:
    class NoSeedKeyword(ProbeEnv):
        def reset(self):
            return self.observe(), {}

    message = check_message(NoSeedKeyword())
    assert message.startswith("env.reset() does not accept the keyword seed")
    assert "reset(*, seed=None, options=None) -> (obs, info)" in message


def test_step_that_raises_names_the_action() -> None:
    class Crashes(ProbeEnv):
        def step(self, action):
            raise KeyError("no such action")

    with pytest.raises(EnvCheckError) as info:
        check_env(Crashes())
    assert str(info.value).startswith("env.step(")
    assert "raised KeyError: 'no such action' (step 1 of check_env)" in str(info.value)
    assert isinstance(info.value.__cause__, KeyError)


@pytest.mark.parametrize("attribute", ["observation_space", "action_space"])
def test_spaces_must_be_gymnasium_spaces(attribute: str) -> None:
    env = ProbeEnv()
    setattr(env, attribute, [-1, 1])
    message = check_message(env)
    assert f"env.{attribute} is [-1, 1] of type list, but it must be a gymnasium.spaces.Space" in message
