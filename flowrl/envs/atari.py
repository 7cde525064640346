"""Atari envs with the DQN-style preprocessing, built on ale-py's envs and Gymnasium's wrappers.

:func:`make_atari_env` stacks, from the emulator up:

1. ale-py's env for the id, with ``frameskip=1`` (frames are skipped by the next step);
2. Gymnasium's ``AtariPreprocessing``: up to ``noop_max`` random no-ops after each game reset,
   ``frame_skip`` emulator frames per step (max-pooled over the last two), ``screen_size`` x
   ``screen_size`` grayscale frames;
3. Gymnasium's ``RecordEpisodeStatistics``: the game's score and length, recorded here, below
   the wrappers that change rewards and episode ends, so that results report game scores
   (see :func:`flowrl.envs.episodes.records_episodes`);
4. :class:`EpisodicLife` (``episodic_life``): a lost life ends the training episode, the game goes on;
5. :class:`FireReset` (``fire_reset``): FIRE after each reset in games that have it (Breakout
   waits for it to launch the ball);
6. Gymnasium's ``ClipReward`` (``clip_rewards``): training rewards clipped to [-1, 1];
7. Gymnasium's ``FrameStackObservation``: the last ``frame_stack`` frames.

ale-py and OpenCV are optional dependencies (the ``atari`` extra); they are
imported only when an Atari env is asked for, so the rest of flowrl works without them.
"""

from __future__ import annotations

import atexit
import importlib
import weakref
from types import ModuleType
from typing import Any, SupportsFloat

import gymnasium
from gymnasium.utils import RecordConstructorArgs
from gymnasium.wrappers import AtariPreprocessing, ClipReward, FrameStackObservation, RecordEpisodeStatistics

from flowrl.errors import EnvError, UnknownEnvError, install_hint

MISSING_ALE_MESSAGE = f"Atari envs need the optional dependency ale-py: {install_hint('atari')}"
MISSING_OPENCV_MESSAGE = (
    f"Atari preprocessing needs the optional dependency opencv-python (to resize frames): {install_hint('atari')}"
)
#: ALE's action 0 in every game's minimal action set.
NOOP = 0

# Every env make_atari_env returned that is still alive: their emulators are released at exit (see below).
_ATARI_ENVS: weakref.WeakSet[gymnasium.Env[Any, Any]] = weakref.WeakSet()


def release_emulator(env: gymnasium.Env[Any, Any]) -> None:
    """Close ``env`` and drop its emulator (ale-py's ``ALEInterface``), held by the base env and by
    ``AtariPreprocessing``; ale-py's ``close`` keeps it, and one still held when Python exits is
    reported by nanobind as a leaked instance (18 lines per run). The env is unusable afterwards."""
    try:
        env.close()
    finally:
        layer: Any = env
        while layer is not None:
            getattr(layer, "__dict__", {}).pop("ale", None)
            layer = getattr(layer, "env", None)


@atexit.register
def _release_emulators() -> None:
    """Release the emulators of the Atari envs still alive at exit (a run's rollout workers hold theirs)."""
    for env in list(_ATARI_ENVS):
        try:
            release_emulator(env)
        except Exception:  # noqa: BLE001 - exiting: one env's failing close must not keep the others' emulators
            pass


def is_atari_id(env_id: object) -> bool:
    """Whether ``env_id`` names an Atari env: the ``ALE/`` namespace or a ``*NoFrameskip-v4`` id."""
    return isinstance(env_id, str) and (env_id.startswith("ALE/") or env_id.endswith("NoFrameskip-v4"))


def require_ale_py() -> ModuleType:
    """Import ale-py and register its envs with Gymnasium; raise :class:`EnvError` if it is missing."""
    try:
        ale_py = importlib.import_module("ale_py")
    except ImportError as exc:
        raise EnvError(MISSING_ALE_MESSAGE) from exc
    # Gymnasium >= 1.0 no longer discovers plugin envs by itself; ale-py's ids exist only once registered.
    gymnasium.register_envs(ale_py)
    return ale_py


def require_atari_dependencies() -> None:
    """Check that ale-py and OpenCV (used by ``AtariPreprocessing``) import; raise :class:`EnvError` if not."""
    require_ale_py()
    try:
        importlib.import_module("cv2")
    except ImportError as exc:
        raise EnvError(MISSING_OPENCV_MESSAGE) from exc


class EpisodicLife(gymnasium.Wrapper[Any, Any, Any, Any], RecordConstructorArgs):
    """Ends the episode when a life is lost, but not the game: the ``reset`` that follows plays on.

    Learning then treats a lost life as the end of a return, as the DQN, Ape-X and IMPALA
    papers trained; the game itself resets once it is over. Any other reset (mid-episode,
    or with a ``seed``) starts a new game. Reads the ``lives`` ale-py puts in every ``info``.
    """

    def __init__(self, env: gymnasium.Env[Any, Any]) -> None:
        RecordConstructorArgs.__init__(self)  # so that env.spec lists this wrapper and make() rebuilds it
        gymnasium.Wrapper.__init__(self, env)
        self._lives = 0
        self._life_lost = False

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        lives = int(info["lives"])
        # The last life's loss ends the game itself (terminated); a truncated game is over too.
        self._life_lost = 0 < lives < self._lives and not (terminated or truncated)
        self._lives = lives
        return obs, reward, terminated or self._life_lost, truncated, info

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        if self._life_lost and seed is None and options is None:
            # A no-op step moves on to the next life of the same game.
            obs, _, terminated, truncated, info = self.env.step(NOOP)
            if terminated or truncated:
                obs, info = self.env.reset()
        else:
            obs, info = self.env.reset(seed=seed, options=options)
        self._life_lost = False
        self._lives = int(info["lives"])
        return obs, info


class FireReset(gymnasium.Wrapper[Any, Any, Any, Any], RecordConstructorArgs):
    """Presses FIRE after every reset (a new game, or a new life under :class:`EpisodicLife`).

    Games such as Breakout wait for FIRE before play starts; an agent that has not learnt to
    press it would otherwise sit idle for the whole game. ``fire_action`` is FIRE's index in
    the game's action set.
    """

    def __init__(self, env: gymnasium.Env[Any, Any], fire_action: int) -> None:
        RecordConstructorArgs.__init__(self, fire_action=fire_action)
        gymnasium.Wrapper.__init__(self, env)
        self.fire_action = fire_action

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        self.env.reset(seed=seed, options=options)
        obs, _, terminated, truncated, info = self.env.step(self.fire_action)
        if terminated or truncated:
            obs, info = self.env.reset(seed=seed, options=options)
        return obs, info


def fire_action(env: gymnasium.Env[Any, Any]) -> int | None:
    """FIRE's index in ``env``'s action set, or None for a game without it."""
    meanings = list(env.unwrapped.get_action_meanings())  # type: ignore[attr-defined]
    return meanings.index("FIRE") if "FIRE" in meanings else None


def make_atari_env(
    env_id: str,
    *,
    frame_stack: int = 4,
    frame_skip: int = 4,
    screen_size: int = 84,
    noop_max: int = 30,
    episodic_life: bool = True,
    fire_reset: bool = True,
    clip_rewards: bool = True,
    terminal_on_life_loss: bool = False,
    scale_obs: bool = False,
    **make_kwargs: Any,
) -> gymnasium.Env:
    """Create ``env_id`` with the DQN-style preprocessing (see the module's docstring for the stack).

    Observations are ``uint8`` arrays of shape ``(frame_stack, screen_size, screen_size)``
    (``float32`` in [0, 1] with ``scale_obs=True``; no stacking axis when ``frame_stack=1``).
    ``episodic_life``, ``fire_reset`` (in games with a FIRE action) and ``clip_rewards`` shape
    what learning sees; the env still records each whole game's unclipped score and length
    (``info["episode"]`` at the game's end), which is what results report.
    ``terminal_on_life_loss`` is Gymnasium's other take on lives: the episode ends at a lost
    life *and* the next reset starts a new game; it excludes ``episodic_life``.
    ``make_kwargs`` go to ``gymnasium.make`` (e.g. ``repeat_action_probability``: ``ALE/*-v5``
    ids default to 0.25, sticky actions; ``*NoFrameskip-v4`` ids to 0, as the papers played).
    Raises :class:`EnvError` when ale-py or OpenCV is missing or options conflict, and
    :class:`UnknownEnvError` for an unknown id.
    """
    require_atari_dependencies()
    if "-ram" in env_id:
        raise EnvError(
            f"make_atari_env preprocesses screen images, but {env_id!r} observes the console's RAM; "
            f"use the image id {env_id.replace('-ram', '')!r}, or register_env a creator that calls "
            f"gymnasium.make({env_id!r}) after importing ale_py"
        )
    if make_kwargs.get("frameskip", 1) != 1:
        # AtariPreprocessing skips frames itself; skipping inside the emulator too would multiply the two.
        raise EnvError(
            f"make_atari_env got frameskip={make_kwargs['frameskip']!r}; the emulator must run with "
            f"frameskip=1 because frame skipping is done by the preprocessing (frame_skip={frame_skip})"
        )
    if frame_stack < 1:
        raise EnvError(f"make_atari_env got frame_stack={frame_stack!r}; it must be >= 1")
    if terminal_on_life_loss and episodic_life:
        raise EnvError(
            "make_atari_env got terminal_on_life_loss=True and episodic_life=True; both end episodes at a lost life: "
            "episodic_life plays on with the same game, terminal_on_life_loss (Gymnasium's) starts a new one. "
            "Set episodic_life=False to use terminal_on_life_loss"
        )
    make_kwargs["frameskip"] = 1
    try:
        env = gymnasium.make(env_id, **make_kwargs)
    except (gymnasium.error.NameNotFound, gymnasium.error.VersionNotFound, gymnasium.error.NamespaceNotFound) as exc:
        raise UnknownEnvError(f"unknown Atari env {env_id!r}: {exc}") from exc
    env = AtariPreprocessing(
        env,
        noop_max=noop_max,
        frame_skip=frame_skip,
        screen_size=screen_size,
        terminal_on_life_loss=terminal_on_life_loss,
        grayscale_obs=True,
        scale_obs=scale_obs,
    )
    env = RecordEpisodeStatistics(env)
    if episodic_life:
        env = EpisodicLife(env)
    fire = fire_action(env) if fire_reset else None
    if fire is not None:
        env = FireReset(env, fire)
    if clip_rewards:
        env = ClipReward(env, -1.0, 1.0)
    if frame_stack > 1:
        env = FrameStackObservation(env, frame_stack)
    _ATARI_ENVS.add(env)
    return env
