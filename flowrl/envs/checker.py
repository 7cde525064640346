"""A strict check of an env against the Gymnasium API, run before training starts.

Each problem raises :class:`EnvCheckError` with a message naming the method called, the
field at fault, the value seen and the bound it broke, because these mistakes otherwise
surface much later as NaN losses or silently wrong returns. The observation, reward and
step-result checks here are shared with :func:`flowrl.envs.check_multi_agent_env`.
"""

from __future__ import annotations

import inspect
import math
import numbers
from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces

from flowrl.envs.flatten import action_mask_of, legal_actions, mask_field, no_legal_action
from flowrl.errors import EnvCheckError, EnvError

_STEP_API = "(obs, reward, terminated, truncated, info)"

#: What to do instead of giving flowrl a Gymnasium ``VectorEnv`` (whose rewards are arrays).
VECTOR_ENV_HINT = (
    "a Gymnasium VectorEnv steps several envs at once, which flowrl's workers do themselves; give a creator "
    "of one env and set num_envs_per_worker, or use env_backend: envpool"
)


def check_env(env: gymnasium.Env, *, num_steps: int = 50, seed: int = 0) -> None:
    """Check ``env``'s spaces, ``reset`` and ``num_steps`` random ``step`` calls; raise on the first problem.

    Resets twice with ``seed`` (the first observations must match), then steps with actions
    sampled from the action space seeded with ``seed`` (legal ones where an observation or its info
    carries an action mask, see :mod:`flowrl.envs.flatten`), resetting when an episode ends.
    The env is left open; the caller owns it. Raises :class:`EnvCheckError`.
    """
    if isinstance(env, gymnasium.vector.VectorEnv):
        raise EnvCheckError(f"env is a {type(env).__name__}: {VECTOR_ENV_HINT}")
    observation_space = _space(env, "observation_space")
    action_space = _space(env, "action_space")
    _check_reset_accepts_seed(env)

    method = f"env.reset(seed={seed})"
    first_obs, _ = _checked_reset(env, method, observation_space, seed=seed)
    again_obs, info = _checked_reset(env, method, observation_space, seed=seed)
    if not _same(first_obs, again_obs):
        raise EnvCheckError(
            f"{method} ignores seed: two calls returned different first observations "
            f"{abbreviate(first_obs)} and {abbreviate(again_obs)}; reset must seed the env's RNG "
            f"(call super().reset(seed=seed) and draw randomness from self.np_random)"
        )

    action_space.seed(seed)
    obs = again_obs
    for step in range(1, num_steps + 1):
        action = _sample_action(action_space, observation_space, obs, info, step)
        try:
            result = env.step(action)
        except Exception as exc:
            raise EnvCheckError(
                f"env.step({abbreviate(action)}) raised {type(exc).__name__}: {exc} (step {step} of check_env)"
            ) from exc
        terminated, truncated = _check_step_result(result, observation_space, step)
        obs, info = result[0], result[4]
        if terminated or truncated:
            obs, info = _checked_reset(env, "env.reset()", observation_space)


def _sample_action(space: spaces.Space, observation_space: spaces.Space, obs: Any, info: Any, step: int) -> Any:
    """A random action of ``space``: a legal one where ``obs`` or ``info`` carries an action mask."""
    mask = action_mask_of(obs, info)
    if mask is None:
        return space.sample()
    where = f" (the observation before step {step} of check_env)"
    if not isinstance(space, spaces.Discrete):
        raise EnvCheckError(
            f"an observation carries an action_mask, but the action space {space} is not Discrete{where}"
        )
    return sample_legal(space, mask, mask_field(observation_space, "obs"), where)


def sample_legal(space: spaces.Discrete, mask: Any, field: str, where: str = "") -> int:
    """A random action of ``space`` among those ``mask`` allows, for a state the env goes on from.

    Raises :class:`EnvCheckError` naming the mask's ``field`` (and ``where``) for a mask of the wrong
    form, or one that allows no action (see :func:`~flowrl.envs.flatten.no_legal_action`).
    """
    try:
        legal = legal_actions(mask, int(space.n), field)
    except EnvError as exc:
        raise EnvCheckError(f"{exc}{where}") from None
    if not legal.any():
        raise EnvCheckError(f"{no_legal_action(legal, field)}{where}")
    return int(space.sample(mask=legal.astype(np.int8)))


def _space(env: Any, attribute: str) -> spaces.Space:
    if not hasattr(env, attribute):
        raise EnvCheckError(f"env has no {attribute}; it must be a gymnasium.spaces.Space set in __init__")
    space = getattr(env, attribute)
    if not isinstance(space, spaces.Space):
        raise EnvCheckError(
            f"env.{attribute} is {abbreviate(space)} of type {type(space).__name__}, "
            f"but it must be a gymnasium.spaces.Space (e.g. gymnasium.spaces.Box)"
        )
    return space


def _check_reset_accepts_seed(
    env: Any, *, api: str = "Gymnasium's API is reset(*, seed=None, options=None) -> (obs, info)"
) -> None:
    """Raise unless ``env.reset`` takes the keyword ``seed``; ``api`` says which reset signature is expected."""
    try:
        parameters = inspect.signature(env.reset).parameters.values()
    except (TypeError, ValueError):
        return  # no introspectable signature (e.g. a C extension); calling it will tell
    if not any(p.name == "seed" or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        raise EnvCheckError(
            f"env.reset() does not accept the keyword seed; {api}, and flowrl seeds every env through it"
        )


def _checked_reset(env: Any, method: str, observation_space: spaces.Space, **kwargs: Any) -> tuple[Any, dict]:
    try:
        result = env.reset(**kwargs)
    except Exception as exc:
        raise EnvCheckError(f"{method} raised {type(exc).__name__}: {exc}") from exc
    if not (isinstance(result, tuple) and len(result) == 2) or (
        # A 2-tuple whose second item is no dict may be a bare observation of a 2-element Tuple space.
        not isinstance(result[1], dict)
        and isinstance(observation_space, spaces.Tuple)
        and observation_space.contains(result)
    ):
        raise EnvCheckError(
            f"{method} returned a bare observation {abbreviate(result)} instead of the tuple (obs, info); "
            f"Gymnasium's reset returns (obs, info)"
        )
    obs, info = result
    if not isinstance(info, dict):
        raise EnvCheckError(
            f"{method} returned info {abbreviate(info)} of type {type(info).__name__}; info must be a dict"
        )
    _check_obs(obs, observation_space, method, "obs", "observation_space")
    return obs, info


def _check_step_result(result: Any, observation_space: spaces.Space, step: int) -> tuple[bool, bool]:
    method = "env.step()"
    where = f" (step {step} of check_env)"
    _check_step_arity(
        result, method, f"Gymnasium's 5-tuple {_STEP_API}", "(obs, reward, done, info), the old Gym API", where
    )
    obs, reward, terminated, truncated, info = result
    _check_obs(obs, observation_space, method, "obs", "observation_space", where)
    _check_reward(reward, method, "reward", "reward", where)
    terminated = _checked_flag(terminated, method, "terminated", "terminated", where)
    truncated = _checked_flag(truncated, method, "truncated", "truncated", where)
    if not isinstance(info, dict):
        raise EnvCheckError(
            f"{method} returned info {abbreviate(info)} of type {type(info).__name__}; info must be a dict{where}"
        )
    return terminated, truncated


def _check_step_arity(result: Any, method: str, api: str, old_api: str, where: str) -> None:
    """Raise unless ``step`` returned a 5-tuple.

    ``api`` names the 5-tuple expected (e.g. "Gymnasium's 5-tuple (obs, ...)") and ``old_api`` the
    4 values of the older API that a 4-tuple most likely comes from.
    """
    if not isinstance(result, tuple):
        raise EnvCheckError(
            f"{method} returned {abbreviate(result)} of type {type(result).__name__}; it must return {api}{where}"
        )
    if len(result) == 4:
        raise EnvCheckError(f"{method} returned 4 values {old_api}; {api} is needed{where}")
    if len(result) != 5:
        raise EnvCheckError(f"{method} returned {len(result)} values; {api} is needed{where}")


def _check_reward(reward: Any, method: str, name: str, subject: str, where: str) -> None:
    """Raise unless ``reward`` is a finite real scalar; ``name`` spells where it was returned,
    ``subject`` the rule's subject."""
    if not _is_real_scalar(reward):
        vectorized = f"; {VECTOR_ENV_HINT}" if np.ndim(reward) > 0 and np.size(reward) > 1 else ""
        raise EnvCheckError(
            f"{method} returned {name}={abbreviate(reward)} of type {type(reward).__name__}; "
            f"{subject} must be a finite real scalar (a float){where}{vectorized}"
        )
    if not math.isfinite(float(reward)):
        raise EnvCheckError(f"{method} returned {name}={float(reward)}; {subject} must be a finite real scalar{where}")


def _checked_flag(flag: Any, method: str, name: str, subject: str, where: str) -> bool:
    """``flag`` (a termination or truncation) as a bool; raise unless it is a Python or numpy bool."""
    if not isinstance(flag, (bool, np.bool_)):
        raise EnvCheckError(
            f"{method} returned {name}={abbreviate(flag)} of type {type(flag).__name__}; "
            f"{subject} must be a bool{where}"
        )
    return bool(flag)


def _is_real_scalar(value: Any) -> bool:
    # bool is an int subclass, but a bool reward is almost always terminated/reward swapped.
    if isinstance(value, (bool, np.bool_)):
        return False
    if isinstance(value, np.ndarray):
        return value.ndim == 0 and (np.issubdtype(value.dtype, np.integer) or np.issubdtype(value.dtype, np.floating))
    return isinstance(value, numbers.Real) or isinstance(value, (np.integer, np.floating))


def _check_obs(obs: Any, space: spaces.Space, method: str, obs_name: str, space_name: str, where: str = "") -> None:
    """Check ``obs`` against ``space``; ``obs_name``/``space_name`` spell the path for nested spaces."""

    def fail(problem: str) -> EnvCheckError:
        return EnvCheckError(f"{method} returned observation {problem}{where}")

    if isinstance(space, spaces.Box):
        _check_array(obs, space, fail, obs_name, space_name, integer=False)
        array = np.asarray(obs)
        if np.issubdtype(array.dtype, np.floating) or np.issubdtype(array.dtype, np.complexfloating):
            bad = np.argwhere(~np.isfinite(array))
            if len(bad):
                index = tuple(bad[0])
                raise fail(
                    f"with {element_name(obs_name, index)}={abbreviate(array[index])}, which is not finite; "
                    f"observations must be finite numbers (NaN/inf poison training)"
                )
        # Both sides have the space's dtype here, so the comparison is exact (no float32 rounding surprise).
        _check_bounds(array, space.low, space.high, fail, obs_name, f"{space_name}.low", f"{space_name}.high")
    elif isinstance(space, spaces.Discrete):
        if isinstance(obs, (bool, np.bool_)) or not (
            isinstance(obs, (int, np.integer))
            or (isinstance(obs, np.ndarray) and obs.ndim == 0 and np.issubdtype(obs.dtype, np.integer))
        ):
            raise fail(
                f"{abbreviate(obs)} of type {type(obs).__name__}, but {space_name} is {space}; it must be an int"
            )
        value, low, high = int(obs), int(space.start), int(space.start + space.n - 1)
        if value < low:
            raise fail(f"{obs_name}={value} below {space_name}.start={low}")
        if value > high:
            raise fail(f"{obs_name}={value} above {space_name}.start + {space_name}.n - 1 = {high}")
    elif isinstance(space, spaces.MultiDiscrete):
        _check_array(obs, space, fail, obs_name, space_name, integer=True)
        _check_bounds(
            np.asarray(obs),
            space.start,
            space.start + space.nvec - 1,
            fail,
            obs_name,
            f"{space_name}.start",
            f"({space_name}.start + {space_name}.nvec - 1)",
        )
    elif isinstance(space, spaces.MultiBinary):
        _check_array(obs, space, fail, obs_name, space_name, integer=True)
        array = np.asarray(obs)
        bad = np.argwhere((array != 0) & (array != 1))
        if len(bad):
            index = tuple(bad[0])
            shown = abbreviate(array[index])
            raise fail(
                f"with {element_name(obs_name, index)}={shown}, but {space_name} is {space}: values must be 0 or 1"
            )
    elif isinstance(space, spaces.Dict):
        if not isinstance(obs, dict) or set(obs) != set(space.spaces):
            keys = sorted(map(str, obs)) if isinstance(obs, dict) else None
            raise fail(
                f"{abbreviate(obs)} of type {type(obs).__name__} (keys {keys}), but {space_name} is a Dict "
                f"with keys {sorted(map(str, space.spaces))}"
            )
        for key, subspace in space.spaces.items():
            _check_obs(obs[key], subspace, method, f"{obs_name}[{key!r}]", f"{space_name}[{key!r}]", where)
    elif isinstance(space, spaces.Tuple):
        if not isinstance(obs, tuple) or len(obs) != len(space.spaces):
            raise fail(
                f"{abbreviate(obs)} of type {type(obs).__name__}, but {space_name} is a Tuple of {len(space.spaces)}"
            )
        for i, subspace in enumerate(space.spaces):
            _check_obs(obs[i], subspace, method, f"{obs_name}[{i}]", f"{space_name}[{i}]", where)
    elif not space.contains(obs):
        raise fail(f"{obs_name}={abbreviate(obs)} that is not in {space_name} {space}")


def _check_array(obs: Any, space: spaces.Space, fail: Any, obs_name: str, space_name: str, *, integer: bool) -> None:
    if not isinstance(obs, (np.ndarray, np.generic)):
        raise fail(
            f"{abbreviate(obs)} of type {type(obs).__name__}, but {space_name} is {space}; "
            f"{obs_name} must be a numpy array"
        )
    array = np.asarray(obs)
    if array.shape != space.shape:
        raise fail(f"{abbreviate(array)} with shape {array.shape} but {space_name}.shape is {space.shape}")
    if array.dtype != space.dtype:
        raise fail(
            f"with dtype {array.dtype} but {space_name}.dtype is {space.dtype} "
            f"(cast it, e.g. {obs_name}.astype(np.{space.dtype}))"
        )
    if integer and not np.issubdtype(array.dtype, np.integer):
        raise fail(f"with dtype {array.dtype}; {space_name} is {space}, which needs an integer dtype")


def _check_bounds(
    array: np.ndarray, low: np.ndarray, high: np.ndarray, fail: Any, obs_name: str, low_name: str, high_name: str
) -> None:
    low = np.broadcast_to(low, array.shape)
    high = np.broadcast_to(high, array.shape)
    for bad, bound, bound_name, relation in (
        (array < low, low, low_name, "below"),
        (array > high, high, high_name, "above"),
    ):
        offending = np.argwhere(bad)
        if len(offending):
            index = tuple(offending[0])
            value, limit = abbreviate(array[index]), abbreviate(bound[index])
            raise fail(
                f"with {element_name(obs_name, index)}={value} {relation} {element_name(bound_name, index)}={limit}"
            )


def element_name(name: str, index: tuple) -> str:
    """``name`` with an element's index, e.g. ``obs[0, 2]`` (just ``name`` for a scalar)."""
    if not index:
        return name
    return f"{name}[{', '.join(str(int(i)) for i in index)}]"


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    try:
        return bool(np.array_equal(np.asarray(a), np.asarray(b)))
    except (TypeError, ValueError):
        return a == b


def abbreviate(value: Any, limit: int = 80) -> str:
    """``value`` shortened for an error message (arrays summarised, at most ``limit`` characters)."""
    if isinstance(value, np.ndarray):
        text = np.array2string(value, threshold=8, edgeitems=2, precision=4, separator=", ")
    elif isinstance(value, np.generic):
        text = str(value)  # numpy 2's repr adds "np.float32(...)", noise in a message
    else:
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
