"""Atari ids, the missing-ale-py error, and (when ale-py is installed) the preprocessed envs."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

from flowrl.envs import check_env, get_env_creator, is_atari_id, make_atari_env, make_env
from flowrl.envs.atari import MISSING_ALE_MESSAGE, MISSING_OPENCV_MESSAGE
from flowrl.errors import EnvError, UnknownEnvError

pytestmark = pytest.mark.unit


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
    assert MISSING_ALE_MESSAGE == (
        "Atari envs need the optional dependency ale-py: pip install -e '.[atari]' in a clone of flowrl "
        "(pip install 'flowrl-ray[atari]' once published)"
    )
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


# ---- each preprocessing option, on real ALE frames


def frame_number(env) -> int:
    """The emulator's frame count since its last game reset."""
    return int(env.unwrapped.ale.getEpisodeFrameNumber())


def play(env, actions, *, until_done: bool = True):
    """Step ``env`` with ``actions`` (an iterable); return every step's
    ``(obs, reward, terminated, truncated, info)``."""
    steps = []
    for action in actions:
        steps.append(env.step(action))
        if until_done and (steps[-1][2] or steps[-1][3]):
            break
    return steps


def test_atari_defaults_are_the_dqn_preprocessing(ale_py) -> None:
    env = make_atari_env("ALE/Breakout-v5")
    names = [type(env).__name__]
    layer = env
    while names[-1] != "AtariPreprocessing":
        layer = layer.env
        names.append(type(layer).__name__)
    assert names == [
        "FrameStackObservation",
        "ClipReward",
        "FireReset",
        "EpisodicLife",
        "RecordEpisodeStatistics",
        "AtariPreprocessing",
    ]
    preprocessing = env.get_wrapper_attr("noop_max"), env.get_wrapper_attr("frame_skip")
    assert preprocessing == (30, 4)
    env.close()


def test_frame_skip_advances_the_emulator_that_many_frames_per_step(ale_py) -> None:
    for skip in (4, 2):
        env = make_atari_env(
            "ALE/Pong-v5", frame_skip=skip, noop_max=0, fire_reset=False, repeat_action_probability=0.0
        )
        env.reset(seed=0)
        start = frame_number(env)
        for k in range(1, 6):
            env.step(0)
            assert frame_number(env) == start + skip * k
        env.close()


def test_frames_are_84x84_grayscale_max_pooled_over_the_last_two_emulator_frames(ale_py) -> None:
    import cv2
    import gymnasium

    raw = gymnasium.make("ALE/Pong-v5", frameskip=1, repeat_action_probability=0.0)
    env = make_atari_env("ALE/Pong-v5", noop_max=0, fire_reset=False, repeat_action_probability=0.0)
    raw.reset(seed=3)
    obs, _ = env.reset(seed=3)

    def shrink(screen: np.ndarray) -> np.ndarray:
        return cv2.resize(screen, (84, 84), interpolation=cv2.INTER_AREA)

    assert obs.shape == (4, 84, 84) and obs.dtype == np.uint8
    np.testing.assert_array_equal(obs[-1], shrink(raw.unwrapped.ale.getScreenGrayscale()))
    for action in [2, 3, 2, 2, 3, 0, 1] * 4:
        screens = []
        for _ in range(4):
            raw.step(action)
            screens.append(raw.unwrapped.ale.getScreenGrayscale())
        obs, *_ = env.step(action)
        np.testing.assert_array_equal(obs[-1], shrink(np.maximum(screens[-2], screens[-1])))
    raw.close()
    env.close()


def test_the_last_four_frames_are_stacked_oldest_first(ale_py) -> None:
    env = make_atari_env("ALE/Pong-v5", repeat_action_probability=0.0)
    obs, _ = env.reset(seed=0)
    assert all(np.array_equal(frame, obs[-1]) for frame in obs)  # a reset fills the stack with its frame
    previous = obs
    for action in [2, 3] * 10:
        obs, *_ = env.step(action)
        np.testing.assert_array_equal(obs[:-1], previous[1:])
        previous = obs
    assert not np.array_equal(obs[0], obs[-1])  # the paddles moved: the stack holds different frames
    env.close()


def test_noop_reset_plays_between_1_and_noop_max_noops_after_a_game_reset(ale_py) -> None:
    env = make_atari_env("ALE/Pong-v5", noop_max=30, fire_reset=False, repeat_action_probability=0.0)
    starts = set()
    env.reset(seed=0)
    for _ in range(12):
        env.step(0)  # a reset mid-game starts a new game
        env.reset()
        starts.add(frame_number(env))  # one emulator frame per no-op
    assert starts <= set(range(1, 31)) and len(starts) > 3
    env.close()
    env = make_atari_env("ALE/Pong-v5", noop_max=0, fire_reset=False, repeat_action_probability=0.0)
    env.reset(seed=0)
    env.step(0)
    env.reset()
    assert frame_number(env) == 0
    env.close()


def test_fire_reset_launches_the_ball_after_each_reset(ale_py) -> None:
    def lives_lost_doing_nothing(fire_reset: bool) -> tuple[int, int]:
        env = make_atari_env("ALE/Breakout-v5", fire_reset=fire_reset, noop_max=0, repeat_action_probability=0.0)
        env.reset(seed=0)
        after_reset = frame_number(env)
        ends = 0
        for _ in range(400):
            *_, terminated, truncated, _ = env.step(0)  # NOOP only: the agent never presses FIRE itself
            if terminated or truncated:
                ends += 1
                env.reset()
        env.close()
        return after_reset, ends

    after_reset, ends = lives_lost_doing_nothing(fire_reset=True)
    assert after_reset == 4  # one FIRE step of 4 frames
    assert ends >= 3  # the ball is relaunched after each lost life, and missed
    assert lives_lost_doing_nothing(fire_reset=False) == (0, 0)  # the ball never comes into play
    pong = make_atari_env("ALE/Pong-v5", repeat_action_probability=0.0)
    assert type(pong.env.env).__name__ == "FireReset"  # Pong has FIRE too, as baselines' wrappers found
    pong.close()


def test_episodic_life_ends_the_episode_at_a_lost_life_and_plays_the_same_game_on(ale_py) -> None:
    env = make_atari_env("ALE/Breakout-v5", noop_max=0, repeat_action_probability=0.0)
    env.reset(seed=0)
    lives_seen = []
    for life in range(5):
        *_, info = play(env, [0] * 500)[-1]
        lives_seen.append(info["lives"])
        if life < 4:
            assert "episode" not in info  # the game goes on
            frames = frame_number(env)
            _, reset_info = env.reset()
            assert reset_info["lives"] == info["lives"] and frame_number(env) > frames  # no new game
    assert lives_seen == [4, 3, 2, 1, 0]
    assert info["episode"]["l"] > 5 * 20  # the whole game, recorded at its end
    _, info = env.reset()
    assert info["lives"] == 5 and frame_number(env) == 4  # a new game (and its FIRE)
    env.close()
    env = make_atari_env("ALE/Breakout-v5", episodic_life=False, noop_max=0, repeat_action_probability=0.0)
    env.reset(seed=0)
    steps = play(env, np.random.default_rng(0).integers(0, 4, 5000))  # FIRE among them: no reset relaunches the ball
    assert steps[-1][2] and steps[-1][4]["lives"] == 0 and "episode" in steps[-1][4]
    assert all(info["lives"] > 0 for *_, info in steps[:-1])
    env.close()


def test_training_rewards_are_clipped_while_the_recorded_game_score_is_not(ale_py) -> None:
    def game(clip_rewards: bool):
        env = make_atari_env(
            "ALE/SpaceInvaders-v5", clip_rewards=clip_rewards, episodic_life=False, repeat_action_probability=0.0
        )
        env.reset(seed=1)
        actions = np.random.default_rng(0).integers(0, env.action_space.n, 5000)
        steps = play(env, actions)
        env.close()
        return [float(reward) for _, reward, *_ in steps], steps[-1][4]["episode"]

    clipped, recorded = game(clip_rewards=True)
    raw, raw_recorded = game(clip_rewards=False)
    assert len(clipped) == len(raw)  # the same game, step for step
    assert set(clipped) <= {0.0, 1.0} and max(raw) > 1  # Space Invaders scores 5 to 30 per invader
    assert recorded["r"] == raw_recorded["r"] == sum(raw) > sum(clipped)
    assert recorded["l"] == len(raw) + 1  # with the FIRE step of the reset


def test_conflicting_life_options_are_rejected(ale_py) -> None:
    with pytest.raises(EnvError, match="terminal_on_life_loss=True and episodic_life=True"):
        make_atari_env("ALE/Breakout-v5", terminal_on_life_loss=True)
    env = make_atari_env("ALE/Breakout-v5", terminal_on_life_loss=True, episodic_life=False)
    env.close()
