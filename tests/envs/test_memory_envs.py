"""The built-in envs that need memory: StatelessCartPole-v1 hides CartPole's velocities, and in TMaze-v0 only a
policy that remembers the first observation can earn more than 0 on average."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env as gymnasium_check_env

from flowrl.envs import StatelessCartPole, TMaze, check_env, make_env
from flowrl.errors import EnvError

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("env_id", ["StatelessCartPole-v1", "TMaze-v0"])
def test_both_pass_the_checkers_and_are_made_by_name(env_id: str) -> None:
    env = make_env(env_id)
    check_env(env)
    gymnasium_check_env(gym.make(env_id).unwrapped)


def test_stateless_cartpole_observes_position_and_angle_of_the_same_dynamics() -> None:
    stateless, full = gym.make("StatelessCartPole-v1"), gym.make("CartPole-v1")
    assert stateless.observation_space.shape == (2,) and stateless.spec.max_episode_steps == 500
    a, _ = stateless.reset(seed=3)
    b, _ = full.reset(seed=3)
    for action in [0, 1, 1, 0, 1]:
        np.testing.assert_array_equal(a, b[[0, 2]])
        a, *_ = stateless.step(action)
        b, *_ = full.step(action)
    assert isinstance(stateless.unwrapped, StatelessCartPole)


def episode_return(env: TMaze, seed: int, turn: int | None) -> float:
    """One episode: ``turn`` at the junction (None: the cue's side, remembered from the first observation)."""
    obs, _ = env.reset(seed=seed)
    cue = int(np.argmax(obs[:2]))
    total, done = 0.0, False
    while not done:
        action = (cue if turn is None else turn) if obs[2] else 0
        obs, reward, terminated, truncated, _ = env.step(action)
        total, done = total + reward, terminated or truncated
    return total


def test_tmaze_pays_the_remembered_cue_and_nothing_on_average_without_memory() -> None:
    env = TMaze({"length": 4})
    assert all(episode_return(env, seed, None) == 1.0 for seed in range(50))
    # Without memory the junction looks the same whichever the cue: a fixed turn earns about 0.
    assert abs(np.mean([episode_return(env, seed, 0) for seed in range(400)])) < 0.15
    obs, _ = env.reset(seed=0)
    steps = 0
    while True:
        obs, _, terminated, _, _ = env.step(0)
        steps += 1
        if terminated:
            break
    assert steps == 5  # length + 1


@pytest.mark.parametrize("config", [{"length": 0}, {"length": "3"}, {"size": 3}])
def test_tmaze_names_its_one_key_for_a_bad_config(config: dict[str, object]) -> None:
    with pytest.raises(EnvError, match="TMaze-v0 takes env_config"):
        TMaze(config)
