"""Env creation from a flowrl name, a Gymnasium id or a creator function.

A *creator* is a callable ``env_config -> gymnasium.Env``. Names resolve in this order:
names given to :func:`register_env`, then Atari ids (through :func:`make_atari_env`), then
Gymnasium ids (``gymnasium.registry``, or ``"package.module:EnvId"`` to import a plugin first).

The registry is per process: a creator registered in the driver is unknown inside Ray actor
processes. Resolve the name once in the driver with :func:`get_env_creator` and ship the
returned callable to the actors (Ray pickles it with cloudpickle), which pass it to
:func:`make_env`; or register the creator in the actor processes too.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
from typing import Any, Callable, Union

import gymnasium

from flowrl.envs.atari import is_atari_id, make_atari_env, require_ale_py, require_atari_dependencies
from flowrl.errors import EnvError, FlowRLError, UnknownEnvError

EnvCreator = Callable[[dict], gymnasium.Env]
EnvSpec = Union[str, EnvCreator]

_REGISTRY: dict[str, EnvCreator] = {}


def register_env(name: str, creator: EnvCreator) -> None:
    """Register ``creator`` (``env_config -> gymnasium.Env``) under ``name`` in this process.

    Re-registering a name replaces its creator. A registered name shadows a Gymnasium id of
    the same name.
    """
    if not isinstance(name, str) or not name:
        raise EnvError(f"register_env needs a non-empty string name; got {name!r}")
    if not callable(creator):
        raise EnvError(
            f"register_env({name!r}, ...) needs a callable env_config -> gymnasium.Env; "
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


def get_env_creator(env: EnvSpec) -> EnvCreator:
    """Resolve a name or creator to a creator, without creating an env.

    Registered names give their registered creator; Gymnasium and Atari ids give a picklable
    :class:`GymnasiumCreator`; a callable is returned unchanged. Raises :class:`UnknownEnvError`
    (with the closest valid names) for an unknown name, and :class:`EnvError` when an Atari id
    is asked for without its optional dependencies (ale-py, OpenCV) installed.
    """
    if isinstance(env, str):
        if env in _REGISTRY:
            return _REGISTRY[env]
        if is_atari_id(env):
            require_atari_dependencies()  # reports a missing optional dependency here, in the driver
        if _is_gymnasium_id(env):
            return GymnasiumCreator(env)
        raise UnknownEnvError(_unknown_env_message(env))
    if callable(env):
        return env
    raise EnvError(
        f"env must be a registered flowrl name, a Gymnasium id or a callable env_config -> gymnasium.Env; "
        f"got {env!r} of type {type(env).__name__}"
    )


def make_env(env: EnvSpec, env_config: dict | None = None, *, seed: int | None = None) -> gymnasium.Env:
    """Create an env from a registered name, a Gymnasium id or a creator, passing it ``env_config``.

    The creator receives a copy of ``env_config`` (``{}`` when None). With ``seed``, the action
    space is seeded so that sampled actions are reproducible; the env itself is *not* reset,
    the caller resets it with ``env.reset(seed=seed)``. Raises :class:`UnknownEnvError` for
    an unknown name and :class:`EnvError` (chaining the original) when the creator fails.
    """
    creator = get_env_creator(env)
    config = dict(env_config or {})
    label = env if isinstance(env, str) else _describe_creator(creator)
    config_text = repr(config)  # taken now: the creator may pop keys from its copy
    try:
        instance = creator(config)
    except FlowRLError:
        raise  # already says what went wrong (e.g. a missing optional dependency)
    except Exception as exc:
        raise EnvError(
            f"creating env {label!r} with env_config={config_text} failed: {type(exc).__name__}: {exc}"
        ) from exc
    if not isinstance(instance, gymnasium.Env):
        raise EnvError(
            f"the creator of env {label!r} returned {instance!r} of type {type(instance).__name__}; "
            f"it must return a gymnasium.Env"
        )
    if seed is not None:
        instance.action_space.seed(seed)
    return instance


def env_spaces(env: EnvSpec, env_config: dict | None = None) -> tuple[gymnasium.spaces.Space, gymnasium.spaces.Space]:
    """Create the env once to read its ``(observation_space, action_space)``, then close it."""
    instance = make_env(env, env_config)
    try:
        return instance.observation_space, instance.action_space
    finally:
        instance.close()


def _is_gymnasium_id(env_id: str) -> bool:
    module, sep, name = env_id.rpartition(":")
    if sep:
        # "package.module:EnvId": gymnasium.make imports the module, which registers EnvId; do the same
        # here so the id can be validated in the driver (actors import it again inside gymnasium.make).
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise UnknownEnvError(f"unknown env {env_id!r}: cannot import module {module!r} ({exc})") from exc
        return name in gymnasium.registry
    return env_id in gymnasium.registry


def _describe_creator(creator: Any) -> str:
    if isinstance(creator, GymnasiumCreator):
        return creator.env_id
    return getattr(creator, "__qualname__", None) or repr(creator)


def _unknown_env_message(name: str) -> str:
    try:
        require_ale_py()  # so that Atari ids can be suggested when ale-py is installed
    except EnvError:
        pass
    registered = sorted(_REGISTRY)
    candidates = registered + sorted(set(gymnasium.registry) - set(registered))
    # Match case-insensitively: "cartpole-v1" should still find "CartPole-v1".
    by_lower: dict[str, str] = {}
    for candidate in candidates:
        by_lower.setdefault(candidate.lower(), candidate)
    matches = [by_lower[m] for m in difflib.get_close_matches(name.lower(), list(by_lower), n=4, cutoff=0.6)]
    shown = ", ".join(repr(n) for n in registered[:10]) + (", ..." if len(registered) > 10 else "")
    valid = (
        f"a valid env is a name given to flowrl.envs.register_env (registered: {shown or 'none'}), "
        f"one of the {len(gymnasium.registry)} ids in gymnasium.registry, or a callable env_config -> gymnasium.Env"
    )
    if not matches:
        return f"unknown env {name!r}; no registered flowrl env or Gymnasium id is close ({valid})"
    others = f"other close names: {', '.join(repr(m) for m in matches[1:])}; " if len(matches) > 1 else ""
    return f"unknown env {name!r}; did you mean {matches[0]!r}? ({others}{valid})"
