"""Episodes an env records itself (Gymnasium's RecordEpisodeStatistics): what results report when training
episodes end earlier (a lost life) and train on clipped rewards. A scripted game with lives, then real ALE."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.wrappers import ClipReward, RecordEpisodeStatistics

from flowrl.actors.sampling.episode_hooks import EpisodeHooks
from flowrl.actors.sampling.vector import VectorSampler
from flowrl.callbacks import Callbacks
from flowrl.data import SampleBatch
from flowrl.envs.atari import EpisodicLife
from flowrl.envs.episodes import records_episodes, run_episode

pytestmark = pytest.mark.unit


class LivesGame(gym.Env):
    """A game of 3 lives of 4 steps each, reward 2 per step (the no-op that starts a life is one of them).

    ``obs = [steps played in this game]``; ``info["lives"]`` as ale-py reports it.
    """

    observation_space = spaces.Box(0.0, 1000.0, (1,), np.float32)
    action_space = spaces.Discrete(2)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self.t, self.lives, self.in_life = 0, 3, 0
        return self._obs(), {"lives": self.lives}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        self.t += 1
        self.in_life += 1
        if self.in_life == 4:
            self.lives, self.in_life = self.lives - 1, 0
        return self._obs(), 2.0, self.lives == 0, False, {"lives": self.lives}

    def _obs(self) -> np.ndarray:
        return np.array([self.t], np.float32)


def game(*, record: bool = True) -> gym.Env:
    """The game as make_atari_env stacks its wrappers: recorded below episodic life and clipping."""
    env: gym.Env = LivesGame()
    if record:
        env = RecordEpisodeStatistics(env)
    return ClipReward(EpisodicLife(env), -1.0, 1.0)


class ActsZero:
    postprocesses = True  # the sampler cuts its fragments into pieces, as for a postprocessing policy

    def compute_actions(self, obs: np.ndarray, **_: Any) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        return np.zeros(len(obs), np.int64), {}

    def postprocess_trajectory(self, batch: SampleBatch) -> SampleBatch:
        return batch


def sampler(env: gym.Env, fragment_length: int, **kwargs: Any) -> VectorSampler:
    """A seeded sampler of ``env`` acting 0."""
    return VectorSampler([env], ActsZero(), fragment_length=fragment_length, seed=0, **kwargs)


# A game: life 1 has 4 sampled steps; the no-op that starts each later life is one of its 4 steps, so 3 sampled
# steps each: 10 rows, 12 game steps, 24 points (unclipped).
GAME_ROWS, GAME_STEPS, GAME_SCORE = 10, 12, 24.0


def test_records_episodes_finds_the_recorder_anywhere_in_the_wrappers() -> None:
    assert records_episodes(game()) and records_episodes(RecordEpisodeStatistics(LivesGame()))
    assert not records_episodes(game(record=False)) and not records_episodes(LivesGame())


def test_results_report_recorded_games_while_batches_hold_lives_and_clipped_rewards() -> None:
    game_sampler = sampler(game(), 25)
    batch = game_sampler.sample()
    assert batch.count == 25
    assert set(batch[SampleBatch.REWARDS].tolist()) == {1.0}  # learning sees clipped rewards
    # Every lost life ends a training episode: rows 3, 6, 9 end game 1, rows 13, 16, 19 game 2.
    assert np.flatnonzero(batch[SampleBatch.TERMINATEDS]).tolist() == [3, 6, 9, 13, 16, 19, 23]
    stats = game_sampler.pop_episode_stats()
    assert [(s.episode_reward, s.episode_length) for s in stats] == [(GAME_SCORE, GAME_STEPS)] * 2
    # One episode id per game, its step count running on through the lives.
    eps = batch[SampleBatch.EPS_ID]
    assert len(set(eps[:GAME_ROWS].tolist())) == 1 and eps[GAME_ROWS] != eps[0]
    assert batch[SampleBatch.T][:GAME_ROWS].tolist() == list(range(GAME_ROWS))
    # Each life's first observation follows on from the game's last one (the no-op step in between).
    assert batch[SampleBatch.OBS][4, 0] == batch[SampleBatch.NEW_OBS][3, 0] + 1


def test_without_a_recorder_each_training_episode_is_reported() -> None:
    lives_sampler = sampler(game(record=False), GAME_ROWS)
    lives_sampler.sample()
    assert [(s.episode_reward, s.episode_length) for s in lives_sampler.pop_episode_stats()] == [
        (4.0, 4),
        (3.0, 3),
        (3.0, 3),
    ]


def test_complete_episodes_mode_returns_lives_and_reports_games() -> None:
    whole_lives = sampler(game(), 8, batch_mode="complete_episodes")
    batch = whole_lives.sample()  # two fragments of 8: whole lives ending on rows 3, 6, 9 and 13 (game 2's first)
    assert batch.count == 14 and np.flatnonzero(batch[SampleBatch.TERMINATEDS]).tolist() == [3, 6, 9, 13]
    assert [(s.episode_reward, s.episode_length) for s in whole_lives.pop_episode_stats()] == [(GAME_SCORE, GAME_STEPS)]


class CountsEpisodes(Callbacks):
    def __init__(self) -> None:
        self.started, self.ended = 0, []

    def on_episode_start(self, episode: Any) -> None:
        self.started += 1

    def on_episode_end(self, episode: Any) -> None:
        self.ended.append((episode.length, episode.total_reward))


def test_callbacks_see_one_episode_per_recorded_game() -> None:
    callbacks = CountsEpisodes()
    hooks = EpisodeHooks(callbacks, [], worker_index=0, num_envs=1)
    sampler(game(), 2 * GAME_ROWS, hooks=hooks).sample()
    # The callbacks' episode is the game (its sampled steps and their training rewards).
    assert callbacks.ended == [(GAME_ROWS, float(GAME_ROWS))] * 2 and callbacks.started == 3


def test_run_episode_plays_a_recorded_game_through_its_lives() -> None:
    assert run_episode(game(), lambda obs, info: 0, seed=0) == (GAME_SCORE, GAME_STEPS)
    assert run_episode(game(record=False), lambda obs, info: 0, seed=0) == (4.0, 4)


# ---- real ALE games, through both env backends


@pytest.fixture
def ale() -> None:
    pytest.importorskip("cv2")
    pytest.importorskip("ale_py")


def breakout_envs(backend: str, num_envs: int) -> list[Any]:
    options = {"repeat_action_probability": 0.0}
    if backend == "gymnasium":
        from flowrl.envs import make_atari_env

        return [make_atari_env("ALE/Breakout-v5", **options) for _ in range(num_envs)]
    pytest.importorskip("envpool")
    from flowrl.envs.envpool_backend import make_pool_envs

    return make_pool_envs("ALE/Breakout-v5", num_envs, options, seed=0, num_threads=1)


class ActsRandomly:
    postprocesses = True  # the sampler cuts its fragments into pieces, as for a postprocessing policy

    def __init__(self) -> None:
        self.rng = np.random.default_rng(0)

    def compute_actions(self, obs: np.ndarray, **_: Any) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        return self.rng.integers(0, 4, len(obs)), {}

    def postprocess_trajectory(self, batch: SampleBatch) -> SampleBatch:
        return batch


@pytest.mark.parametrize("backend", ["gymnasium", "envpool"])
def test_breakout_trains_on_lives_and_reports_whole_games(ale: None, backend: str) -> None:
    envs = breakout_envs(backend, 2)
    breakout = VectorSampler(envs, ActsRandomly(), fragment_length=400, seed=0)
    batch = breakout.sample()
    games = breakout.pop_episode_stats()
    lives_lost = int(batch[SampleBatch.TERMINATEDS].sum())
    assert games and lives_lost >= 4 * len(games)  # 5 lives a game: most training episodes end a life only
    rewards = batch[SampleBatch.REWARDS]
    assert set(rewards.tolist()) <= {0.0, 1.0} and all(g.episode_length > 100 for g in games)
    for env in envs:
        env.close()
