"""The action masks a sampler reads from its envs (the convention: :mod:`flowrl.envs.flatten`).

:class:`ActionMasks` holds one mask per env of a single-agent sampler, :class:`AgentMasks` one per
agent of each env of a multi-agent sampler; both read a mask with :func:`read_mask`.
"""

from __future__ import annotations

import copy
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from flowrl.data import SampleBatch
from flowrl.envs.flatten import action_mask_of, is_masked, legal_actions, mask_field, no_legal_action


def read_mask(obs: Any, info: Any, num_actions: int, where: str) -> np.ndarray | None:
    """The legal actions (``num_actions`` bools) a raw observation or its info gives, or None when neither
    holds a mask; raises :class:`~flowrl.errors.EnvError`, naming ``where``, for a mask of the wrong form."""
    mask = action_mask_of(obs, info)
    return None if mask is None else legal_actions(mask, num_actions, where)


class ActionMasks:
    """Each of ``num_envs`` envs' legal actions now, read from its observations or infos.

    Envs of a Discrete action space are masked when their observation space is a masked Dict, or
    once an observation's info holds ``"action_mask"`` (from ``reset`` on, so that the first fragment
    has the mask columns). ``current`` is every action until an env gives a mask; None for other
    action spaces.
    """

    def __init__(self, env: Any, num_envs: int, worker_index: int = 0) -> None:
        space = getattr(env, "action_space", None)
        self.num_actions = int(space.n) if isinstance(space, gym.spaces.Discrete) else 0
        self.current = np.ones((num_envs, self.num_actions), dtype=bool) if self.num_actions else None
        self.observation_space = getattr(env, "observation_space", None)
        self.masked = self.current is not None and is_masked(self.observation_space)
        self.worker_index = worker_index

    def problem(self, legal: np.ndarray, obs_field: str) -> str:
        """What is wrong with ``legal``, one env's legal actions (as :meth:`read` wrote them) that allow none, for a
        state the policy must act in. The message names the mask by ``obs_field`` (``obs_field['action_mask']``
        of a masked Dict observation, else ``info['action_mask']``)."""
        return no_legal_action(legal, mask_field(self.observation_space, obs_field))

    def empty_problem(self, i: int, obs_field: str) -> str | None:
        """:meth:`problem` for env ``i``'s current mask if it allows no action; None if it allows one."""
        legal = self.current
        return None if legal is None or legal[i].any() else self.problem(legal[i], obs_field)

    def get_state(self) -> tuple[np.ndarray | None, bool]:
        """Each env's current mask and whether the envs gave masks, for a sampler's checkpoint."""
        return copy.deepcopy(self.current), self.masked

    def set_state(self, state: tuple[np.ndarray | None, bool]) -> None:
        """Restore :meth:`get_state`'s output."""
        current, self.masked = state
        self.current = copy.deepcopy(current)

    def columns(self, length: int) -> dict[str, np.ndarray]:
        """A fragment's ``action_mask`` and ``next_action_mask`` columns of ``length`` rows (all legal until
        written); none while the envs give no masks."""
        if not self.masked or self.current is None:
            return {}
        shape = (length, *self.current.shape)
        return {key: np.ones(shape, dtype=bool) for key in (SampleBatch.ACTION_MASK, SampleBatch.NEXT_ACTION_MASK)}

    def read(self, i: int, obs: Any, info: Any, into: np.ndarray | None = None) -> None:
        """Write env ``i``'s legal actions, from its (raw) observation or its info, into row ``i`` of ``into``
        (default: ``current``); every action where it gives no mask."""
        rows = self.current if into is None else into
        if rows is None:
            return
        mask = read_mask(obs, info, self.num_actions, f"worker {self.worker_index}, env {i}: action_mask")
        if mask is None:
            rows[i] = True
            return
        rows[i] = mask
        self.masked = True


class AgentMasks:
    """Each agent's legal actions now, in each of ``num_envs`` multi-agent envs like ``env``.

    Agents of a Discrete action space are masked by their observation's ``"action_mask"`` or their
    info's; ``masked`` is True once any agent's observation space is a masked Dict or any observation
    or info has given a mask. An agent without a mask has every action legal.
    """

    def __init__(self, env: Any, num_envs: int, worker_index: int = 0) -> None:
        self.num_actions: dict[Hashable, int] = {}
        self.masked = False
        for agent in env.possible_agents:
            space = env.action_space(agent)
            if isinstance(space, gym.spaces.Discrete):
                self.num_actions[agent] = int(space.n)
                self.masked = self.masked or is_masked(env.observation_space(agent))
        self.current: list[dict[Hashable, np.ndarray]] = [{} for _ in range(num_envs)]
        self.worker_index = worker_index

    def read(self, i: int, obs: Mapping[Hashable, Any], infos: Mapping[Hashable, Any]) -> None:
        """Take the masks of env ``i``'s agents that ``obs`` (raw, by agent) holds, from each agent's
        observation or info (an agent in ``obs`` without a mask has every action legal now)."""
        if not self.num_actions:
            return
        current = self.current[i]
        for agent, agent_obs in obs.items():
            n = self.num_actions.get(agent)
            if n is None:
                continue
            where = f"worker {self.worker_index}, env {i}: action_mask of agent {agent!r}"
            mask = read_mask(agent_obs, infos.get(agent), n, where)
            if mask is None:
                current.pop(agent, None)
            else:
                current[agent] = mask
                self.masked = True

    def clear(self, i: int) -> None:
        """Forget env ``i``'s masks (its episode is over)."""
        self.current[i] = {}

    def of(self, i: int, agent: Hashable) -> np.ndarray | None:
        """Agent ``agent``'s legal actions in env ``i`` (all True without a mask); None for a non-Discrete agent."""
        n = self.num_actions.get(agent)
        if n is None:
            return None
        mask = self.current[i].get(agent)
        return np.ones(n, dtype=bool) if mask is None else mask

    def batch(self, members: Sequence[tuple[int, Hashable]]) -> np.ndarray | None:
        """The ``[B, n]`` masks of ``members`` (env index, agent), all of one Discrete action space; None while
        no mask has been seen, or for agents of other action spaces."""
        if not self.masked or not members or members[0][1] not in self.num_actions:
            return None
        rows = [self.of(i, agent) for i, agent in members]
        return np.stack([row for row in rows if row is not None])
