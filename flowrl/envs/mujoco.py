"""Gymnasium's MuJoCo envs (``Hopper-v5``, ``HalfCheetah-v5``, ``Walker2d-v5``, ...): the check that their
optional dependency is installed.

Gymnasium registers its MuJoCo ids whether or not the ``mujoco`` package is installed, and fails only
inside ``gymnasium.make``, which flowrl may first call in a rollout worker. The ids are recognised here
by their entry point, so that a missing ``mujoco`` is reported in the driver, when the env is asked
for, with the extra that installs it (``mujoco``, which is ``gymnasium[mujoco]``).
"""

from __future__ import annotations

import importlib

import gymnasium

from flowrl.errors import EnvError, install_hint

MISSING_MUJOCO_MESSAGE = "MuJoCo envs need the optional dependency mujoco: " + install_hint("mujoco")
# Where Gymnasium's MuJoCo env classes live (the entry point of every MuJoCo id it registers).
_MUJOCO_ENTRY_POINTS = "gymnasium.envs.mujoco"


def is_mujoco_id(env_id: object) -> bool:
    """Whether ``env_id`` is a Gymnasium id whose env is one of Gymnasium's MuJoCo envs."""
    if not isinstance(env_id, str) or env_id not in gymnasium.registry:
        return False
    entry_point = gymnasium.registry[env_id].entry_point
    return isinstance(entry_point, str) and entry_point.startswith(_MUJOCO_ENTRY_POINTS + ".")


def require_mujoco() -> None:
    """Check that the ``mujoco`` package imports; raise :class:`EnvError` naming the extra if it does not."""
    try:
        importlib.import_module("mujoco")
    except ImportError as exc:
        raise EnvError(f"{MISSING_MUJOCO_MESSAGE} ({exc})") from exc
