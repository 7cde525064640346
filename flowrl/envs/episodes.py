"""Running whole episodes of one env outside a sampler (evaluation, perturbation searches), and the
episodes an env records itself.

An env wrapped in Gymnasium's ``RecordEpisodeStatistics`` records its own episodes: when one
ends, the step's ``info["episode"]`` holds its return ``"r"`` and length ``"l"``. flowrl then
reports those episodes rather than counting rewards itself. Placed below wrappers that change
rewards or end episodes early (as :func:`flowrl.envs.make_atari_env` places it, under reward
clipping and episodic life), it makes results show what the game scored: a training episode
that ends with no ``info["episode"]`` (a lost life) is part of the recorded episode still running.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.wrappers import RecordEpisodeStatistics


def records_episodes(env: Any) -> bool:
    """Whether ``env`` is, or wraps, Gymnasium's ``RecordEpisodeStatistics``."""
    while isinstance(env, gym.Wrapper):
        if isinstance(env, RecordEpisodeStatistics):
            return True
        env = env.env
    return False


def recorded_episode(info: Any) -> tuple[float, int] | None:
    """``(return, length)`` of the episode a recording env ended in this step's ``info``; None if none ended."""
    episode = info.get("episode") if isinstance(info, dict) else None
    return None if episode is None else (float(episode["r"]), int(episode["l"]))


def run_episode(
    env: gym.Env,
    actor: Callable[[Any, dict[str, Any]], Any],
    seed: int | None,
    observations: list[np.ndarray] | None = None,
    on_step: Callable[[float, bool], object] | None = None,
) -> tuple[float, int]:
    """One episode of ``actor`` from ``env.reset(seed=seed)``: its return and length.

    ``actor(obs, info)`` gets each observation with the info returned beside it (which may hold its
    action mask, see :mod:`flowrl.envs.flatten`) and returns the action. For an env that records
    its own episodes (:func:`records_episodes`) that is the recorded episode, played through the
    training episodes it holds (an Atari game through its lives). Appends every observation acted
    on to ``observations`` when given. ``on_step(reward, ended)``, when given, is called after each step
    with its reward and whether an episode of ``env`` ended there (a recorded episode's inner ones too):
    what an actor with a recurrent state reads.
    """
    recording = records_episodes(env)
    obs, info = env.reset(seed=seed)
    total, length = 0.0, 0
    while True:
        if observations is not None:
            observations.append(obs)
        obs, reward, terminated, truncated, info = env.step(actor(obs, info))
        total += float(reward)
        length += 1
        if on_step is not None:
            on_step(float(reward), bool(terminated or truncated))
        if terminated or truncated:
            if not recording:
                return total, length
            recorded = recorded_episode(info)
            if recorded is not None:
                return recorded
            obs, info = env.reset()  # a training episode ended inside the recorded one (a lost life): play on
