"""Envs whose action mask allows no action at a chosen step, single- and multi-agent (the mask in the
observation or in the info), and policies that act within masks: shared by the sampler and env-checker tests."""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces

from flowrl.data import SampleBatch
from flowrl.envs import MaskedCartPole, MultiAgentEnv


class EmptyMaskAt(MaskedCartPole):
    """MaskedCartPole whose first episode to last ``at_step`` steps (0: at ``reset``) then observes a mask that
    allows no action, once; with ``ends``, the step that brings it ends the episode (terminated)."""

    def __init__(self, mask: str = "info", *, at_step: int, ends: bool = False) -> None:
        super().__init__({"mask": mask})
        self.at_step, self.ends = at_step, ends
        self.emptied = False  # whether the empty mask was given (it is given once)
        self.empty_now = False

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = super().step(action)
        return obs, reward, terminated or (self.ends and self.empty_now), truncated, info

    def _observe(self, obs: np.ndarray, info: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        observed, info = super()._observe(obs, info)
        self.empty_now = not self.emptied and self._steps == self.at_step
        if self.empty_now:
            self.emptied = True
            self._mask[:] = 0
            (observed if self.mask_place == "observation" else info)["action_mask"][:] = 0
        return observed, info


class MaskedPair(MultiAgentEnv[str]):
    """Agents 'a' and 'b' with three actions each, of which 0 and 1 are legal (the mask in each agent's info, or
    in a masked Dict observation); episodes last 6 steps. In the first episode to last ``at_step`` steps (0: at
    ``reset``; None: never), 'b''s mask then allows no action, once. An illegal action raises with ``strict``,
    else is counted."""

    LENGTH = 6

    def __init__(self, mask: str = "info", *, at_step: int | None = None, strict: bool = False) -> None:
        self.possible_agents = ["a", "b"]
        self.agents: list[str] = []
        self.mask_place, self.at_step, self.strict = mask, at_step, strict
        box = spaces.Box(-10.0, 10.0, (1,), np.float32)
        mask_space = spaces.Box(0, 1, (3,), np.int8)
        self._observation_space: spaces.Space[Any] = (
            box if mask == "info" else spaces.Dict({"observations": box, "action_mask": mask_space})
        )
        self._action_space = spaces.Discrete(3)
        self.t = 0
        self.emptied = False  # whether the empty mask was given (it is given once)
        self.masks: dict[str, np.ndarray] = {}
        self.illegal_actions = 0

    def observation_space(self, agent: str) -> spaces.Space[Any]:
        return self._observation_space

    def action_space(self, agent: str) -> spaces.Space[Any]:
        return self._action_space

    def _observe(self) -> tuple[dict[str, Any], dict[str, Any]]:
        empty = not self.emptied and self.t == self.at_step
        self.emptied = self.emptied or empty
        self.masks = {
            agent: np.array([0, 0, 0] if empty and agent == "b" else [1, 1, 0], np.int8) for agent in self.agents
        }
        obs: dict[str, Any] = {}
        infos: dict[str, Any] = {}
        for agent in self.agents:
            value, mask = np.array([self.t], np.float32), self.masks[agent].copy()
            if self.mask_place == "info":
                obs[agent], infos[agent] = value, {"action_mask": mask}
            else:
                obs[agent], infos[agent] = {"observations": value, "action_mask": mask}, {}
        return obs, infos

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        self.t = 0
        self.agents = list(self.possible_agents)
        return self._observe()

    def step(self, actions: dict) -> tuple[dict, dict, dict, dict, dict]:
        for agent, action in actions.items():
            if not self.masks[agent][int(action)]:
                if self.strict:
                    raise ValueError(f"illegal action {action} of agent {agent!r} at step {self.t}")
                self.illegal_actions += 1
        self.t += 1
        done = self.t >= self.LENGTH
        obs, infos = self._observe()
        rewards = {agent: 1.0 for agent in self.agents}
        terminations = {agent: done for agent in self.agents}
        truncations = {agent: False for agent in self.agents}
        if done:
            self.agents = []
        return obs, rewards, terminations, truncations, infos


class FirstLegal:
    """A stand-in policy over ``n`` actions that picks the first legal one (action 0 without a mask)."""

    postprocesses = True

    def __init__(self, n: int) -> None:
        self.action_space = spaces.Discrete(n)

    def compute_actions(self, obs: np.ndarray, **kwargs: Any) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        mask = kwargs.get("action_mask")
        if mask is None:
            return np.zeros(len(obs), np.int64), {}
        return np.argmax(mask, axis=1).astype(np.int64), {}

    def postprocess_trajectory(self, batch: SampleBatch) -> SampleBatch:
        return batch
