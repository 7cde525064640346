"""A strict check of a multi-agent env against PettingZoo's Parallel API, run before training starts.

The multi-agent counterpart of :mod:`flowrl.envs.checker`, whose observation, reward and flag checks
it shares: each problem raises :class:`EnvCheckError` naming the method called, the agent and field
at fault, the value seen and the bound it broke.
"""

from __future__ import annotations

from typing import Any

import gymnasium
from gymnasium import spaces

from flowrl.envs.checker import (
    _check_obs,
    _check_reset_accepts_seed,
    _check_reward,
    _check_step_arity,
    _checked_flag,
    _same,
    abbreviate,
    sample_legal,
)
from flowrl.envs.flatten import action_mask_of, mask_field
from flowrl.envs.multi_agent import AgentID, acting_agents, is_turn_based, seed_action_spaces
from flowrl.envs.turn_based import wrap_turn_based
from flowrl.errors import EnvCheckError, EnvError

_PARALLEL_API = "reset(seed=None, options=None) -> (obs, infos)"
_STEP_API = "(obs, rewards, terminations, truncations, infos)"
_STEP_FIELDS = ("obs", "rewards", "terminations", "truncations", "infos")


def check_multi_agent_env(env: Any, *, num_steps: int = 50, seed: int = 0) -> None:
    """Check a Parallel-API env's agents, spaces, ``reset`` and ``num_steps`` random ``step`` calls.

    The multi-agent counterpart of :func:`flowrl.envs.check_env`: resets twice with ``seed`` (the
    first observations must match), then steps with actions sampled from each acting agent's action
    space (seeded from ``seed``; legal ones where the observation carries an action mask), resetting
    when ``agents`` becomes empty. A turn-based env gets an action for its ``agent_selection`` only
    (:func:`~flowrl.envs.multi_agent.acting_agents`), and a PettingZoo AEC env is checked as
    :class:`~flowrl.envs.turn_based.TurnBasedEnv` wraps it. The env is left open.
    Raises :class:`EnvCheckError` on the first problem, naming the method, agent, field and bound.
    """
    if isinstance(env, gymnasium.Env):
        raise EnvCheckError(
            f"env is a gymnasium.Env ({type(env).__name__}), a single-agent env; check it with flowrl.envs.check_env"
        )
    try:
        env = wrap_turn_based(env)
    except EnvError as exc:
        raise EnvCheckError(str(exc)) from exc
    possible_agents = _checked_possible_agents(env)
    observation_spaces = {agent: _agent_space(env, "observation_space", agent) for agent in possible_agents}
    action_spaces = {agent: _agent_space(env, "action_space", agent) for agent in possible_agents}
    for method in ("reset", "step"):
        if not callable(getattr(env, method, None)):
            raise EnvCheckError(f"env has no {method}() method; the Parallel API needs reset() and step()")
    _check_reset_accepts_seed(env, api=f"PettingZoo's Parallel API is {_PARALLEL_API}")

    first_obs, _, first_agents = _checked_reset(env, observation_spaces, seed)
    again_obs, infos, again_agents = _checked_reset(env, observation_spaces, seed)
    if first_agents != again_agents or not _same(first_obs, again_obs):
        raise EnvCheckError(
            f"env.reset(seed={seed}) ignores seed: two calls returned different first observations "
            f"{abbreviate(first_obs)} and {abbreviate(again_obs)} (agents {first_agents} and {again_agents}); "
            f"reset must seed every source of randomness in the env"
        )

    seed_action_spaces(env, seed)

    obs = first_obs
    finished: set = set()
    for step in range(1, num_steps + 1):
        where = f" (step {step} of check_multi_agent_env)"
        live = list(env.agents)
        _check_mover(env, f"before step {step} of check_multi_agent_env")
        actions = {
            agent: _sample_action(agent, action_spaces[agent], observation_spaces[agent], obs, infos, step)
            for agent in acting_agents(env)
        }
        try:
            result = env.step(actions)
        except Exception as exc:
            raise EnvCheckError(f"env.step({abbreviate(actions)}) raised {type(exc).__name__}: {exc}{where}") from exc
        obs, infos, done = _check_step_result(env, result, live, possible_agents, observation_spaces, finished, where)
        finished |= done
        if not env.agents:
            obs, infos, _ = _checked_reset(env, observation_spaces, None)
            finished = set()


def _check_mover(env: Any, when: str) -> None:
    """A turn-based env's ``agent_selection`` must be one of its live agents (the one that acts next)."""
    if not is_turn_based(env):
        return
    mover = getattr(env, "agent_selection", None)
    if mover not in env.agents:
        raise EnvCheckError(
            f"{when}, env.agent_selection is {abbreviate(mover)}, which is not in env.agents "
            f"{abbreviate(list(env.agents))}; a turn-based env (turn_based = True) names the agent to move there"
        )


def _checked_possible_agents(env: Any) -> list:
    if not hasattr(env, "possible_agents"):
        raise EnvCheckError("env has no possible_agents; it must list every agent id the env can have, set in __init__")
    possible = env.possible_agents
    if not isinstance(possible, (list, tuple)) or not possible:
        raise EnvCheckError(
            f"env.possible_agents is {abbreviate(possible)} of type {type(possible).__name__}; "
            f"it must be a non-empty list of agent ids"
        )
    for agent in possible:
        try:
            hash(agent)
        except TypeError:
            raise EnvCheckError(
                f"env.possible_agents holds {abbreviate(agent)} of type {type(agent).__name__}, which is not hashable; "
                f"agent ids key dicts (use ints or strings)"
            ) from None
    if len(set(possible)) != len(possible):
        repeated = sorted({repr(a) for a in possible if list(possible).count(a) > 1})
        raise EnvCheckError(f"env.possible_agents repeats the agent ids {', '.join(repeated)}; ids must be unique")
    return list(possible)


def _agent_space(env: Any, method: str, agent: AgentID) -> spaces.Space:
    call = f"env.{method}({agent!r})"
    if not callable(getattr(env, method, None)):
        raise EnvCheckError(
            f"env.{method} is not a method; the Parallel API has {method}(agent) -> gymnasium.spaces.Space"
        )
    try:
        space = getattr(env, method)(agent)
        again = getattr(env, method)(agent)
    except Exception as exc:
        raise EnvCheckError(
            f"{call} raised {type(exc).__name__}: {exc} (agent {agent!r} is in possible_agents)"
        ) from exc
    if not isinstance(space, spaces.Space):
        raise EnvCheckError(
            f"{call} returned {abbreviate(space)} of type {type(space).__name__}, "
            f"but it must be a gymnasium.spaces.Space (e.g. gymnasium.spaces.Box)"
        )
    if again != space:
        raise EnvCheckError(
            f"{call} returned {abbreviate(space)} and then {abbreviate(again)}; an agent's space must not change"
        )
    return space


def _checked_reset(env: Any, observation_spaces: dict, seed: int | None) -> tuple[dict, dict, list]:
    method, kwargs = (f"env.reset(seed={seed})", {"seed": seed}) if seed is not None else ("env.reset()", {})
    try:
        result = env.reset(**kwargs)
    except Exception as exc:
        raise EnvCheckError(f"{method} raised {type(exc).__name__}: {exc}") from exc
    if not (isinstance(result, tuple) and len(result) == 2):
        raise EnvCheckError(
            f"{method} returned {abbreviate(result)} of type {type(result).__name__}; "
            f"the Parallel API's reset returns the pair (obs, infos) of dicts keyed by agent"
        )
    obs, infos = result
    for field, value in (("obs", obs), ("infos", infos)):
        if not isinstance(value, dict):
            raise EnvCheckError(
                f"{method} returned {field} {abbreviate(value)} of type {type(value).__name__}; "
                f"{field} must be a dict keyed by agent"
            )
    agents = _checked_agents(env, method, set(observation_spaces), "")
    if not agents:
        raise EnvCheckError(f"{method} left env.agents empty; reset must set env.agents to the live agents")
    _check_keys(method, "obs", obs, agents, "")
    _check_info_keys(method, infos, agents, "")
    for agent in agents:
        _check_agent_obs(obs[agent], agent, observation_spaces[agent], method, "")
    return obs, infos, agents


def _checked_agents(env: Any, method: str, possible: set, where: str) -> list:
    agents = getattr(env, "agents", None)
    if not isinstance(agents, (list, tuple)):
        raise EnvCheckError(
            f"after {method}, env.agents is {abbreviate(agents)} of type {type(agents).__name__}; "
            f"it must be the list of live agent ids{where}"
        )
    strangers = [agent for agent in agents if agent not in possible]
    if strangers:
        raise EnvCheckError(
            f"after {method}, env.agents holds {abbreviate(strangers)}, not in env.possible_agents "
            f"{abbreviate(sorted(possible, key=repr))}{where}"
        )
    if len(set(agents)) != len(agents):
        raise EnvCheckError(f"after {method}, env.agents {abbreviate(list(agents))} repeats an agent{where}")
    return list(agents)


def _keyed_by(method: str, expected: list) -> str:
    who = "the live agents (env.agents)" if method.startswith("env.reset") else "the agents that acted"
    return f"{who}, {abbreviate(expected)}"


def _check_keys(method: str, field: str, value: dict, expected: list, where: str) -> None:
    missing = [agent for agent in expected if agent not in value]
    if missing:
        raise EnvCheckError(
            f"{method} returned {field} without agent {missing[0]!r}; {field} must be keyed by "
            f"{_keyed_by(method, expected)}{where}"
        )
    if len(value) != len(expected):
        extra = [key for key in value if key not in set(expected)]
        raise EnvCheckError(
            f"{method} returned {field} for agent {extra[0]!r}, which is not live; {field} must be keyed by "
            f"{_keyed_by(method, expected)}{where}"
        )


def _check_info_keys(method: str, infos: dict, expected: list, where: str) -> None:
    # An agent may have no info entry (an empty info is often left out), but no entry for a stranger.
    allowed = set(expected)
    for agent, info in infos.items():
        if agent not in allowed:
            raise EnvCheckError(
                f"{method} returned infos for agent {agent!r}, which is not live; infos must be keyed by "
                f"{_keyed_by(method, expected)}{where}"
            )
        if not isinstance(info, dict):
            raise EnvCheckError(
                f"{method} returned infos[{agent!r}]={abbreviate(info)} of type {type(info).__name__}; "
                f"each agent's info must be a dict{where}"
            )


def _check_agent_obs(obs: Any, agent: AgentID, space: spaces.Space, method: str, where: str) -> None:
    _check_obs(obs, space, method, f"obs[{agent!r}]", f"observation_space({agent!r})", f" for agent {agent!r}{where}")


def _check_step_result(
    env: Any,
    result: Any,
    live: list,
    possible_agents: list,
    observation_spaces: dict,
    finished: set,
    where: str,
) -> tuple[dict, dict, set]:
    """Check one step's return and the agents' bookkeeping; return the obs, the infos and the agents that finished."""
    method = "env.step()"
    _check_step_arity(
        result,
        method,
        f"the Parallel API's 5-tuple of dicts {_STEP_API}",
        "(obs, rewards, dones, infos), the old API",
        where,
    )
    for field, value in zip(_STEP_FIELDS, result):
        if not isinstance(value, dict):
            raise EnvCheckError(
                f"{method} returned {field} {abbreviate(value)} of type {type(value).__name__}; "
                f"{field} must be a dict keyed by agent{where}"
            )
    obs, rewards, terminations, truncations, infos = result

    agents_after = _checked_agents(env, method, set(possible_agents), where)
    revived = [agent for agent in agents_after if agent in finished]
    if revived:
        raise EnvCheckError(
            f"after {method}, env.agents holds agent {revived[0]!r}, which finished earlier in the episode; "
            f"a finished agent cannot come back before reset(){where}"
        )
    live_set = set(live)
    acted = live + [agent for agent in agents_after if agent not in live_set]  # joined during the step
    for field, value in zip(_STEP_FIELDS[:4], result[:4]):
        _check_keys(method, field, value, acted, where)
    _check_info_keys(method, infos, acted, where)

    after = set(agents_after)
    done: set = set()
    for agent in acted:
        _check_agent_obs(obs[agent], agent, observation_spaces[agent], method, where)
        _check_reward(rewards[agent], method, f"rewards[{agent!r}]", "each reward", where)
        flags = [
            _checked_flag(value[agent], method, f"{field}[{agent!r}]", f"each entry of {field}", where)
            for field, value in (("terminations", terminations), ("truncations", truncations))
        ]
        if any(flags) and agent in after:
            field = "terminations" if flags[0] else "truncations"
            raise EnvCheckError(
                f"after {method} returned {field}[{agent!r}]=True, agent {agent!r} is still in env.agents "
                f"{abbreviate(agents_after)}; step must remove a finished agent from env.agents{where}"
            )
        if not any(flags) and agent not in after:
            raise EnvCheckError(
                f"after {method}, agent {agent!r} left env.agents although terminations[{agent!r}] and "
                f"truncations[{agent!r}] are False; an agent leaves only by terminating or truncating{where}"
            )
        if any(flags):
            done.add(agent)
    return obs, infos, done


def _sample_action(
    agent: AgentID, space: spaces.Space, observation_space: spaces.Space, obs: dict, infos: dict, step: int
) -> Any:
    """A random action of acting agent ``agent``: for a Discrete action space, a legal one where its observation
    or its info carries an action mask (one that allows no action raises)."""
    mask = action_mask_of(obs.get(agent), infos.get(agent))
    if mask is None or not isinstance(space, spaces.Discrete):
        return space.sample()
    field = mask_field(observation_space, f"obs[{agent!r}]", f"infos[{agent!r}]")
    return sample_legal(space, mask, field, f" (agent {agent!r} acts at step {step} of check_multi_agent_env)")
