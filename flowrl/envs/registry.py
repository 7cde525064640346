"""Env creation from a flowrl name, a Gymnasium id or a creator function.

A *creator* is a callable ``env_config -> env``, where the env is a ``gymnasium.Env``, a
multi-agent env with PettingZoo's Parallel API (see :mod:`flowrl.envs.multi_agent`) or a PettingZoo
AEC (turn-based) env, which is wrapped in :class:`~flowrl.envs.turn_based.TurnBasedEnv`. Names resolve
in this order: names given to :func:`register_env`, then flowrl's built-in multi-agent envs
(``MultiAgentCartPole``, ``CooperativeMatching``, ``TicTacToe``), then Atari ids (through
:func:`make_atari_env`), then Gymnasium ids (``gymnasium.registry``, or ``"package.module:EnvId"`` to
import a plugin first).

The registry is per process: a creator registered in the driver is unknown inside Ray actor
processes. Resolve the name once in the driver with :func:`get_env_creator` and ship the
returned callable to the actors (Ray pickles it with cloudpickle), which pass it to
:func:`make_env`; or register the creator in the actor processes too.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import logging
from typing import Any, Callable, Union, cast

import gymnasium

from flowrl.envs.atari import is_atari_id, make_atari_env, require_ale_py, require_atari_dependencies
from flowrl.envs.checker import VECTOR_ENV_HINT
from flowrl.envs.mujoco import is_mujoco_id, require_mujoco
from flowrl.envs.multi_agent import (
    AgentID,
    MultiAgentEnv,
    _is_aec_env,
    is_multi_agent_env,
    multi_agent_spaces,
    seed_action_spaces,
)
from flowrl.envs.multi_agent_envs import BUILTIN_MULTI_AGENT_ENVS
from flowrl.envs.turn_based import wrap_turn_based
from flowrl.errors import EnvError, FlowRLError, UnknownEnvError
from flowrl.importing import check_import_allowed

logger = logging.getLogger(__name__)

# A multi-agent env need not subclass MultiAgentEnv (PettingZoo envs don't); is_multi_agent_env decides.
AnyEnv = Union[gymnasium.Env, MultiAgentEnv[Any]]
EnvCreator = Callable[[dict], AnyEnv]
EnvSpec = Union[str, EnvCreator]

_REGISTRY: dict[str, EnvCreator] = {}


def register_env(name: str, creator: EnvCreator) -> None:
    """Register ``creator`` (``env_config -> env``, single- or multi-agent) under ``name`` in this process.

    Re-registering a name replaces its creator. A registered name shadows a built-in name or a
    Gymnasium id of the same name.
    """
    if not isinstance(name, str) or not name:
        raise EnvError(f"register_env needs a non-empty string name; got {name!r}")
    if not callable(creator):
        raise EnvError(
            f"register_env({name!r}, ...) needs a callable env_config -> gymnasium.Env or multi-agent env; "
            f"got {creator!r} of type {type(creator).__name__}"
        )
    _REGISTRY[name] = creator


@dataclasses.dataclass(frozen=True)
class GymnasiumCreator:
    """A picklable creator for a Gymnasium id: ``env_config`` becomes ``gymnasium.make`` keyword arguments.

    Atari ids go through :func:`make_atari_env`, which also accepts its preprocessing options
    (``frame_stack``, ``frame_skip``, ...) from ``env_config``.
    """

    env_id: str

    def __call__(self, env_config: dict) -> gymnasium.Env:
        kwargs = dict(env_config or {})
        if is_atari_id(self.env_id):
            return make_atari_env(self.env_id, **kwargs)
        return gymnasium.make(self.env_id, **kwargs) if kwargs else gymnasium.make(self.env_id)


@dataclasses.dataclass(frozen=True)
class TurnBasedCreator:
    """A picklable creator that wraps the PettingZoo AEC (turn-based) envs ``creator`` returns in
    :class:`~flowrl.envs.turn_based.TurnBasedEnv`; any other env is returned as it is."""

    creator: EnvCreator

    def __call__(self, env_config: dict) -> AnyEnv:
        env: AnyEnv = wrap_turn_based(self.creator(env_config))
        return env


def accepting_turn_based(creator: EnvCreator) -> EnvCreator:
    """``creator`` as a :class:`TurnBasedCreator`, unless it cannot return an AEC env (a Gymnasium or
    flowrl env class, a :class:`GymnasiumCreator`) or already is one."""
    if isinstance(creator, (TurnBasedCreator, GymnasiumCreator)):
        return creator
    if isinstance(creator, type) and issubclass(creator, (gymnasium.Env, MultiAgentEnv)):
        return creator
    return TurnBasedCreator(cast(EnvCreator, creator))


def get_env_creator(env: EnvSpec) -> EnvCreator:
    """Resolve a name or creator to a creator, without creating an env.

    Registered names give their registered creator; built-in multi-agent names give their env
    class (picklable; the class is the creator); Gymnasium and Atari ids give a picklable
    :class:`GymnasiumCreator`; a callable is returned unchanged. A registered creator or a callable
    that may return a PettingZoo AEC env (any but a Gymnasium or flowrl env class) comes as a
    :class:`TurnBasedCreator`, which wraps such envs. Raises :class:`UnknownEnvError`
    (with the closest valid names) for an unknown name, and :class:`EnvError` when an Atari id
    is asked for without its optional dependencies (ale-py, OpenCV) installed, or a MuJoCo id
    (``Hopper-v5``, ...) without ``mujoco``.
    """
    if isinstance(env, str):
        if env in _REGISTRY:
            return accepting_turn_based(_REGISTRY[env])
        if env in BUILTIN_MULTI_AGENT_ENVS:
            return BUILTIN_MULTI_AGENT_ENVS[env]
        if is_atari_id(env):
            require_atari_dependencies()  # reports a missing optional dependency here, in the driver
        if is_mujoco_id(env):
            require_mujoco()
        if _is_gymnasium_id(env):
            return GymnasiumCreator(env)
        raise UnknownEnvError(_unknown_env_message(env))
    if callable(env):
        return accepting_turn_based(env)
    raise EnvError(
        f"env must be a registered flowrl name, a built-in flowrl env, a Gymnasium id or a callable "
        f"env_config -> env (a gymnasium.Env or a multi-agent env); "
        f"got {env!r} of type {type(env).__name__}"
    )


def close_env(env: Any) -> None:
    """Close an env made only to be inspected (a probe), logging instead of raising if its ``close`` fails.

    Training envs are closed by their worker, which reports such errors when it stops.
    """
    try:
        env.close()
    except Exception:  # noqa: BLE001 - a probe's close must not fail what it was made for
        logger.warning("closing a probe env of type %s raised", type(env).__name__, exc_info=True)


def make_env(env: EnvSpec, env_config: dict | None = None, *, seed: int | None = None) -> AnyEnv:
    """Create an env from a registered or built-in name, a Gymnasium id or a creator, passing it ``env_config``.

    The creator receives a copy of ``env_config`` (``{}`` when None) and must return a
    ``gymnasium.Env``, a multi-agent env (:func:`is_multi_agent_env`) or a PettingZoo AEC env (wrapped
    in :class:`~flowrl.envs.turn_based.TurnBasedEnv`). With ``seed``, the action
    space is seeded so that sampled actions are reproducible (for a multi-agent env, the action
    space of the ``i``-th possible agent gets ``seed + i``); the env itself is *not* reset, the
    caller resets it with ``env.reset(seed=seed)``. Raises :class:`UnknownEnvError` for an
    unknown name and :class:`EnvError` (chaining the original) when the creator fails.
    """
    creator = get_env_creator(env)
    instance = create_env(creator, dict(env_config or {}), env if isinstance(env, str) else None)
    if seed is not None:
        if isinstance(instance, gymnasium.Env):
            instance.action_space.seed(seed)
        else:
            seed_action_spaces(instance, seed)
    return instance


def create_env(creator: EnvCreator, env_config: dict, label: str | None = None) -> AnyEnv:
    """``creator(env_config)`` (``env_config`` passed as it is, e.g. an
    :class:`~flowrl.envs.context.EnvContext`), checked to be a ``gymnasium.Env`` or a multi-agent env
    (a PettingZoo AEC env is wrapped in :class:`~flowrl.envs.turn_based.TurnBasedEnv`).

    Every failure is one :class:`EnvError` line naming the env (``label``, else the creator): a
    missing package (Gymnasium's ``DependencyNotInstalled``, a ``ModuleNotFoundError``) with what to
    install, any other exception with its type and message (chained), and a returned object that is
    no env, a Gymnasium ``VectorEnv`` included, with what to give instead.
    """
    label = label or _describe_creator(creator)
    config_text = repr(dict(env_config))  # taken now: the creator may pop keys from its copy
    try:
        instance = creator(env_config)
    except FlowRLError:
        raise  # already says what went wrong (e.g. a missing optional dependency)
    except (gymnasium.error.DependencyNotInstalled, ModuleNotFoundError) as exc:
        raise EnvError(f"env {label!r} needs a package that is not installed: {_missing_package(exc)}") from exc
    except Exception as exc:
        raise EnvError(
            f"creating env {label!r} with env_config={config_text} failed: {type(exc).__name__}: {exc}"
        ) from exc
    if _is_aec_env(instance):
        instance = wrap_turn_based(instance)  # raises, saying why, for one that cannot be wrapped
    if isinstance(instance, gymnasium.Env) or is_multi_agent_env(instance):
        return instance
    if isinstance(instance, gymnasium.vector.VectorEnv):
        raise EnvError(f"the creator of env {label!r} returned {type(instance).__name__}: {VECTOR_ENV_HINT}")
    raise EnvError(
        f"the creator of env {label!r} returned {instance!r} of type {type(instance).__name__}; "
        f"it must return a gymnasium.Env or a multi-agent env with PettingZoo's Parallel API "
        f"(possible_agents, observation_space(agent), action_space(agent), reset, step) or its AEC (turn-based) API"
    )


def _missing_package(error: BaseException) -> str:
    """What a creator's missing-package error says: Gymnasium's own message names the package and the
    command that installs it; a ``ModuleNotFoundError`` names the module."""
    if isinstance(error, ModuleNotFoundError) and error.name:
        return f"no module named {error.name!r} ({error}); install the package that provides it"
    return str(error) or type(error).__name__


def env_spaces(env: EnvSpec, env_config: dict | None = None) -> tuple[gymnasium.spaces.Space, gymnasium.spaces.Space]:
    """Create a single-agent env once to read its ``(observation_space, action_space)``, then close it.

    Raises :class:`EnvError` for a multi-agent env, whose spaces are per agent: use
    :func:`multi_agent_env_spaces` for those.
    """
    instance = make_env(env, env_config)
    try:
        if not isinstance(instance, gymnasium.Env):
            label = env if isinstance(env, str) else _describe_creator(env)
            raise EnvError(
                f"env {label!r} is a multi-agent env with agents {_short_list(instance.possible_agents)}: "
                f"it has one observation and action space per agent, not one pair; "
                f"use flowrl.envs.multi_agent_env_spaces(env) -> {{agent: (observation_space, action_space)}}"
            )
        return instance.observation_space, instance.action_space
    finally:
        close_env(instance)


def multi_agent_env_spaces(
    env: EnvSpec | MultiAgentEnv[Any], env_config: dict | None = None
) -> dict[AgentID, tuple[gymnasium.spaces.Space, gymnasium.spaces.Space]]:
    """``{agent: (observation_space, action_space)}`` for every possible agent of a multi-agent env.

    ``env`` is a name or creator (the env is created once and closed) or an existing multi-agent
    env (read, left open). Raises :class:`EnvError` for a single-agent env (use :func:`env_spaces`).
    """
    if is_multi_agent_env(env):
        return multi_agent_spaces(env)
    if isinstance(env, MultiAgentEnv):
        # A subclass that does not follow the API it names (is_multi_agent_env is duck-typed).
        raise EnvError(
            f"env {env!r} of type {type(env).__name__} subclasses MultiAgentEnv but does not follow "
            f"the Parallel API (is possible_agents set in __init__?); see flowrl.envs.is_multi_agent_env"
        )
    instance = make_env(env, env_config)
    try:
        if isinstance(instance, gymnasium.Env):
            label = env if isinstance(env, str) else _describe_creator(env)
            raise EnvError(
                f"env {label!r} is a single-agent gymnasium.Env; use flowrl.envs.env_spaces(env) -> "
                f"(observation_space, action_space)"
            )
        return multi_agent_spaces(instance)
    finally:
        close_env(instance)


def _short_list(items: Any, limit: int = 6) -> str:
    items = list(items)
    shown = ", ".join(repr(item) for item in items[:limit])
    return f"[{shown}{', ...' if len(items) > limit else ''}]"


def _is_gymnasium_id(env_id: str) -> bool:
    module, sep, name = env_id.rpartition(":")
    if sep:
        # "package.module:EnvId": gymnasium.make imports the module, which registers EnvId; do the same
        # here so the id can be validated in the driver (actors import it again inside gymnasium.make).
        # Within allowed_imports (evaluating a checkpoint) the module must be allowed first.
        check_import_allowed(module, key="env")
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise UnknownEnvError(f"unknown env {env_id!r}: cannot import module {module!r} ({exc})") from exc
        return name in gymnasium.registry
    return env_id in gymnasium.registry


def _describe_creator(creator: Any) -> str:
    if isinstance(creator, TurnBasedCreator):
        return _describe_creator(creator.creator)
    if isinstance(creator, GymnasiumCreator):
        return creator.env_id
    return getattr(creator, "__qualname__", None) or repr(creator)


def _unknown_env_message(name: str) -> str:
    try:
        require_ale_py()  # so that Atari ids can be suggested when ale-py is installed
    except EnvError:
        pass
    registered = sorted(_REGISTRY)
    builtin = sorted(set(BUILTIN_MULTI_AGENT_ENVS) - set(registered))
    candidates = registered + builtin + sorted(set(gymnasium.registry) - set(registered) - set(builtin))
    # Match case-insensitively: "cartpole-v1" should still find "CartPole-v1".
    by_lower: dict[str, str] = {}
    for candidate in candidates:
        by_lower.setdefault(candidate.lower(), candidate)
    matches = [by_lower[m] for m in difflib.get_close_matches(name.lower(), list(by_lower), n=4, cutoff=0.6)]
    shown = ", ".join(repr(n) for n in registered[:10]) + (", ..." if len(registered) > 10 else "")
    valid = (
        f"a valid env is a name given to flowrl.envs.register_env (registered: {shown or 'none'}), "
        f"a built-in flowrl multi-agent env ({', '.join(repr(n) for n in sorted(BUILTIN_MULTI_AGENT_ENVS))}), "
        f"one of the {len(gymnasium.registry)} ids in gymnasium.registry, or a callable env_config -> env"
    )
    if not matches:
        return f"unknown env {name!r}; no registered flowrl env or Gymnasium id is close ({valid})"
    others = f"other close names: {', '.join(repr(m) for m in matches[1:])}; " if len(matches) > 1 else ""
    return f"unknown env {name!r}; did you mean {matches[0]!r}? ({others}{valid})"
