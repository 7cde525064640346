"""Recording an env's episodes as MP4 files with Gymnasium's ``RecordVideo`` wrapper.

Recording is optional: ``RecordVideo`` writes with moviepy, and Gymnasium's classic-control
envs render their frames with pygame (the ``video`` extra installs both). They are
imported only when a recording is asked for; without them :func:`require_video_dependencies`
raises an :class:`~flowrl.errors.EnvError` naming the pip command.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import gymnasium as gym

from flowrl.envs.registry import GymnasiumCreator
from flowrl.errors import EnvError, install_hint

VIDEO_EXTRA_HINT = install_hint("video")
#: How ``RecordVideo`` names the files it writes: ``<prefix>-episode-<n>.mp4``.
VIDEO_SUFFIX = ".mp4"
_RENDER_MODE = "rgb_array"


def require_video_dependencies() -> None:
    """Check that moviepy (which ``RecordVideo`` writes MP4 files with) imports; raise :class:`EnvError` if not."""
    try:
        importlib.import_module("moviepy")
    except ImportError as e:
        raise EnvError(f"recording video needs the optional dependency moviepy ({e}): {VIDEO_EXTRA_HINT}") from e


def rendering_env_config(creator: Callable[..., Any], env_config: dict[str, Any]) -> dict[str, Any]:
    """The ``env_config`` that makes ``creator``'s env render frames: a Gymnasium id's gets
    ``render_mode="rgb_array"`` (unless it names one); a creator of your own is left to set it."""
    if isinstance(creator, GymnasiumCreator):
        return {"render_mode": _RENDER_MODE, **env_config}
    return env_config


def record_episodes(env: Any, directory: str | Path, num_episodes: int, name_prefix: str = "evaluation") -> gym.Env:
    """``env`` wrapped so that its first ``num_episodes`` episodes are written as MP4 files under ``directory``.

    Each file is written when its episode ends (or when the env closes). Raises
    :class:`EnvError` for a multi-agent env, an env that does not render ``rgb_array``
    frames, or a missing moviepy.
    """
    require_video_dependencies()
    if not isinstance(env, gym.Env):
        raise EnvError(f"recording video needs a Gymnasium env; {type(env).__name__} is a multi-agent env")
    if env.render_mode != _RENDER_MODE:
        raise EnvError(
            f"recording video needs an env that renders frames: its render_mode is {env.render_mode!r}, not "
            f"{_RENDER_MODE!r}; a Gymnasium id gets it by itself, an env creator of your own must pass "
            f"render_mode='{_RENDER_MODE}' to the env it makes"
        )
    # Rendering needs no window: SDL (under pygame) must not look for a display.
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    return gym.wrappers.RecordVideo(
        env, str(directory), episode_trigger=lambda episode: episode < num_episodes, name_prefix=name_prefix
    )


@contextmanager
def missing_renderer_reported() -> Iterator[None]:
    """Turn Gymnasium's error for a missing renderer (pygame for classic control) into an
    :class:`EnvError` naming the pip command."""
    try:
        yield
    except gym.error.DependencyNotInstalled as e:
        raise EnvError(f"recording video: the env cannot render its frames ({e}): {VIDEO_EXTRA_HINT}") from e


def video_files(directory: str | Path) -> list[Path]:
    """The MP4 files under ``directory``, by name."""
    return sorted(Path(directory).glob(f"*{VIDEO_SUFFIX}"))
