"""EnvPool as a rollout worker's envs (config ``env_backend: envpool``): all of a worker's
``num_envs_per_worker`` envs step together, in one call, in EnvPool's C++ thread pool.

EnvPool runs its own builds of the envs it has (Atari, classic control, ...), under the ids
Gymnasium uses for them: ``ALE/Pong-v5`` and ``PongNoFrameskip-v4`` are EnvPool's
``Pong-v5``, ``CartPole-v1`` is ``CartPole-v1``. An Atari id gets the same preprocessing
options as :func:`flowrl.envs.make_atari_env` (same names and defaults, read from
``env_config``), applied by EnvPool in C++. What differs from the Gymnasium backend:

- EnvPool seeds env ``i`` of a worker once, at creation, with ``seed + i``; a reset takes no seed.
- An env's state lives in C++: checkpoints cannot save episodes in progress, so a restored
  worker starts new ones (``Trainer.restore_report["envs_restarted"]`` lists them).
- Faults are the whole pool's: an exception from EnvPool fails the worker, which
  ``recreate_failed_workers`` replaces; ``restart_failed_sub_environments`` (one env at a
  time) does not apply. ``on_bad_observation`` checks EnvPool's observations and rewards as any others.

envpool is an optional dependency (the ``envpool`` extra), imported only when
``env_backend: envpool`` is asked for.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import Any, NoReturn

import gymnasium as gym
import numpy as np

from flowrl.envs.atari import is_atari_id
from flowrl.envs.registry import GymnasiumCreator
from flowrl.errors import EnvError, install_hint

MISSING_ENVPOOL_MESSAGE = f"env_backend 'envpool' needs the optional dependency envpool: {install_hint('envpool')}"

#: flowrl's Atari options (:func:`flowrl.envs.make_atari_env`) as EnvPool's keyword arguments, with flowrl's defaults.
ATARI_OPTIONS: dict[str, tuple[str, Any]] = {
    "frame_stack": ("stack_num", 4),
    "frame_skip": ("frame_skip", 4),
    "noop_max": ("noop_max", 30),
    "episodic_life": ("episodic_life", True),
    "fire_reset": ("use_fire_reset", True),
    "clip_rewards": ("reward_clip", True),
    "full_action_space": ("full_action_space", False),
    "repeat_action_probability": ("repeat_action_probability", None),  # None: the id's default
}


def require_envpool() -> ModuleType:
    """Import envpool; raise :class:`EnvError` with the extra to install if it is missing."""
    try:
        return importlib.import_module("envpool")
    except ImportError as exc:
        raise EnvError(MISSING_ENVPOOL_MESSAGE) from exc


def envpool_task(env_id: str, env_config: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """EnvPool's task id for the Gymnasium id ``env_id`` and its keyword arguments for ``env_config``.

    Atari ids map flowrl's options (:data:`ATARI_OPTIONS`, ``screen_size``,
    ``max_num_frames_per_episode``) to EnvPool's; other ids pass ``env_config`` on as it is.
    Raises :class:`EnvError` for an id EnvPool does not have or an Atari option it cannot apply.
    """
    envpool = require_envpool()
    if env_id.startswith("ALE/"):
        task = env_id.removeprefix("ALE/")
    elif env_id.endswith("NoFrameskip-v4"):
        task = env_id.removesuffix("NoFrameskip-v4") + "-v5"
    else:
        task = env_id
    known = envpool.list_all_envs()
    if task not in known:
        raise EnvError(
            f"env_backend 'envpool' cannot step {env_id!r}: EnvPool has no {task!r} "
            f"(envpool.list_all_envs() lists the {len(known)} it has; use env_backend 'gymnasium' for this env)"
        )
    if not is_atari_id(env_id):
        return task, dict(env_config)
    config = dict(env_config)
    options = {name: config.pop(key, default) for key, (name, default) in ATARI_OPTIONS.items()}
    if options["repeat_action_probability"] is None:
        # Gymnasium's defaults: sticky actions for ALE/*-v5 ids, none for *NoFrameskip-v4 ones (EnvPool's own is 0).
        options["repeat_action_probability"] = 0.25 if env_id.startswith("ALE/") else 0.0
    screen_size = config.pop("screen_size", 84)
    options["img_height"] = options["img_width"] = screen_size
    frames = config.pop("max_num_frames_per_episode", None)
    if frames is not None:
        options["max_episode_steps"] = int(frames) // int(options["frame_skip"])
    if config:
        valid = sorted([*ATARI_OPTIONS, "screen_size", "max_num_frames_per_episode"])
        raise EnvError(
            f"env_backend 'envpool' cannot apply env_config keys {sorted(config)} to {env_id!r}; "
            f"EnvPool's Atari envs take {valid} (use env_backend 'gymnasium' for the others)"
        )
    return task, options


class EnvPoolVector:
    """``num_envs`` envs of the Gymnasium id ``env_id`` in one EnvPool, stepped together.

    ``env_config`` as :func:`envpool_task` reads it; env ``i`` is seeded ``seed + i`` (None:
    a random seed); ``num_threads`` C++ threads step them. Keeps each env's running game
    return (unclipped: EnvPool's ``info["reward"]`` where it reports one) and length, so that
    :meth:`step` can say which ended games score what. Raises :class:`EnvError` when envpool
    is missing, lacks the id, or fails to create the envs.
    """

    def __init__(
        self, env_id: str, num_envs: int, env_config: Mapping[str, Any], *, seed: int | None, num_threads: int
    ) -> None:
        envpool = require_envpool()
        task, options = envpool_task(env_id, env_config)
        if seed is None:
            seed = int(np.random.SeedSequence().generate_state(1)[0] >> 1)
        try:
            with warnings.catch_warnings():
                # EnvPool builds classic-control Box spaces from float64 bounds; Gymnasium warns on the cast to float32.
                warnings.filterwarnings("ignore", message=".*precision lowered by casting", category=UserWarning)
                self._pool = envpool.make(
                    task,
                    env_type="gymnasium",
                    num_envs=num_envs,
                    batch_size=num_envs,
                    seed=seed,
                    num_threads=num_threads,
                    **options,
                )
                self.observation_space: gym.Space[Any] = self._pool.observation_space
                self.action_space: gym.Space[Any] = self._pool.action_space
        except Exception as exc:
            raise EnvError(
                f"creating {num_envs} EnvPool envs {task!r} (for {env_id!r}) with {options} failed: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        self.env_id = env_id
        self.num_envs = num_envs
        self._returns = np.zeros(num_envs, dtype=np.float64)
        self._lengths = np.zeros(num_envs, dtype=np.int64)
        self._info: dict[str, Any] = {}
        # Envs whose game ended in the last step, reset then: first observation and info, until asked for.
        self._reset_ahead: dict[int, tuple[np.ndarray, dict[str, Any]]] = {}
        self._closed = False

    def step(
        self, actions: np.ndarray, obs: np.ndarray, rewards: np.ndarray, terminateds: np.ndarray, truncateds: np.ndarray
    ) -> dict[int, tuple[float, int] | None]:
        """Step every env once with ``actions``, writing what they return into the rows ``obs``,
        ``rewards``, ``terminateds`` and ``truncateds``.

        Returns, for each env whose training episode ended, its game's ``(return, length)``, or
        None when the game goes on (a lost life under ``episodic_life``). The envs whose game
        ended are reset here, all in one call; :meth:`reset` hands out their first observations.
        """
        self._reset_ahead.clear()  # a reset nobody asked for before this step is stale
        obs[:], rewards[:], terminateds[:], truncateds[:], self._info = self._pool.step(actions)
        self._returns += self._info.get("reward", rewards)
        self._lengths += 1
        ended = np.flatnonzero(terminateds | truncateds)
        if not len(ended):
            return {}
        # EnvPool's Atari envs say in info["terminated"] whether the game (not only a life) ended.
        game_over = terminateds | truncateds
        if "terminated" in self._info:
            game_over = truncateds | self._info["terminated"].astype(bool)
        games = {i: (float(self._returns[i]), int(self._lengths[i])) if game_over[i] else None for i in ended.tolist()}
        over = [i for i, game in games.items() if game is not None]
        if over:
            first, info = self._start_games(over)
            self._reset_ahead = {i: (first[k], _row(info, k)) for k, i in enumerate(over)}
        return games

    def reset(self, index: int) -> tuple[np.ndarray, dict[str, Any]]:
        """Start a new game in env ``index`` (or take the one :meth:`step` started): its first observation and info."""
        ahead = self._reset_ahead.pop(index, None)
        if ahead is not None:
            return ahead
        obs, info = self._start_games([index])
        return obs[0], _row(info, 0)

    def _start_games(self, indices: list[int]) -> tuple[np.ndarray, dict[str, Any]]:
        """Reset the envs ``indices`` in one call: their first observations and (batched) info."""
        obs, info = self._pool.reset(env_id=np.array(indices))
        self._returns[indices], self._lengths[indices] = 0.0, 0
        return obs, info

    def info(self, index: int) -> dict[str, Any]:
        """Env ``index``'s info from the last :meth:`step`."""
        return _row(self._info, index)

    def close(self) -> None:
        """Close the pool (once; later calls do nothing)."""
        if not self._closed:
            self._closed = True
            self._pool.close()


def _row(info: Mapping[str, Any], index: int) -> dict[str, Any]:
    """One env's entries of EnvPool's batched info (arrays with one row per env)."""
    return {key: value[index] for key, value in info.items() if isinstance(value, np.ndarray)}


class PoolEnv:
    """Env ``index`` of an :class:`EnvPoolVector`, where flowrl holds envs one by one (a worker's
    and a sampler's list of envs): spaces, ``reset`` and ``close``. Stepping goes through the
    vector, all envs at once (a sampler finds it with :func:`shared_vector`)."""

    def __init__(self, vector: EnvPoolVector, index: int) -> None:
        self.vector = vector
        self.index = index
        self.observation_space = vector.observation_space
        self.action_space = vector.action_space

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """A new game (``seed`` is not used: EnvPool seeds its envs once, when it creates them)."""
        return self.vector.reset(self.index)

    def close(self) -> None:
        """Close the whole pool (this env's siblings with it)."""
        self.vector.close()

    def __reduce__(self) -> NoReturn:
        # Its state lives in EnvPool's C++ envs: a checkpoint records no snapshot and the episode restarts.
        raise TypeError("an EnvPool env cannot be pickled")

    def __repr__(self) -> str:
        return f"PoolEnv({self.vector.env_id!r}, index={self.index})"


def pool_env_id(env_creator: Any) -> str:
    """The Gymnasium id that ``env_creator`` (from :func:`flowrl.envs.get_env_creator`) makes; EnvPool
    steps only ids."""
    if isinstance(env_creator, GymnasiumCreator):
        return env_creator.env_id
    raise EnvError(
        "env_backend 'envpool' steps EnvPool's own builds of Gymnasium ids "
        "(e.g. 'CartPole-v1', 'PongNoFrameskip-v4'); "
        f"the env is {env_creator!r}, not such an id: use env_backend 'gymnasium' for it"
    )


def make_pool_envs(
    env_id: str, num_envs: int, env_config: Mapping[str, Any], *, seed: int | None, num_threads: int
) -> list[PoolEnv]:
    """A worker's ``num_envs`` envs of ``env_id`` in one :class:`EnvPoolVector`, one :class:`PoolEnv` each."""
    vector = EnvPoolVector(env_id, num_envs, env_config, seed=seed, num_threads=num_threads)
    return [PoolEnv(vector, i) for i in range(num_envs)]


def shared_vector(envs: Sequence[Any]) -> EnvPoolVector | None:
    """The :class:`EnvPoolVector` that ``envs`` are, in order, the envs of; None for other envs."""
    first = envs[0] if envs else None
    if not isinstance(first, PoolEnv):
        return None
    vector = first.vector
    if all(isinstance(env, PoolEnv) and env.vector is vector and env.index == i for i, env in enumerate(envs)):
        if len(envs) == vector.num_envs:
            return vector
    return None
