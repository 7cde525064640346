"""Atari envs with the standard DQN-style preprocessing, built on Gymnasium's wrappers.

ale-py and OpenCV are optional dependencies (``pip install 'flowrl-ray[atari]'``); they are
imported only when an Atari env is asked for, so the rest of flowrl works without them.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

import gymnasium
from gymnasium.wrappers import AtariPreprocessing, FrameStackObservation

from flowrl.errors import EnvError, UnknownEnvError

MISSING_ALE_MESSAGE = "Atari envs need the optional dependency ale-py: pip install 'flowrl-ray[atari]'"
MISSING_OPENCV_MESSAGE = (
    "Atari preprocessing needs the optional dependency opencv-python (to resize frames): pip install 'flowrl-ray[atari]'"
)


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


def make_atari_env(
    env_id: str,
    *,
    frame_stack: int = 4,
    frame_skip: int = 4,
    screen_size: int = 84,
    noop_max: int = 30,
    terminal_on_life_loss: bool = False,
    scale_obs: bool = False,
    **make_kwargs: Any,
) -> gymnasium.Env:
    """Create ``env_id`` with 84x84 grayscale frames, frame skipping and a stack of the last frames.

    Observations are ``uint8`` arrays of shape ``(frame_stack, screen_size, screen_size)``
    (``float32`` in [0, 1] with ``scale_obs=True``; no stacking axis when ``frame_stack=1``).
    ``make_kwargs`` go to ``gymnasium.make`` (e.g. ``repeat_action_probability``).
    Raises :class:`EnvError` when ale-py or OpenCV is missing and :class:`UnknownEnvError` for an unknown id.
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
    if frame_stack > 1:
        env = FrameStackObservation(env, frame_stack)
    return env
