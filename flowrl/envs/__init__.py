"""Env creation (flowrl names, Gymnasium ids, creator functions), env checks and Atari preprocessing.

See :mod:`flowrl.envs.registry` for how names resolve and how creators reach Ray actors.
"""

from flowrl.envs.atari import is_atari_id, make_atari_env
from flowrl.envs.checker import check_env
from flowrl.envs.registry import env_spaces, get_env_creator, make_env, register_env

__all__ = [
    "check_env",
    "env_spaces",
    "get_env_creator",
    "is_atari_id",
    "make_atari_env",
    "make_env",
    "register_env",
]
