"""A trained policy ready to act outside training: :class:`InferencePolicy`, as :func:`~flowrl.load_policy` builds it.

A recurrent policy (``model.use_lstm``, or a recurrent custom model) carries a state from step to step:
:meth:`InferencePolicy.get_initial_state` is one episode's first, and ``compute_action(obs, state)``
returns the action with the next state, which the caller hands back at the next step of the same
episode (and replaces by the initial state, or None, when an episode starts).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from flowrl.data import SampleBatch
from flowrl.deferred import torch
from flowrl.envs.flatten import action_mask_of, flatten_observation, is_masked, is_structured, no_legal_action
from flowrl.errors import BadObservationError, EnvError
from flowrl.policy import Policy
from flowrl.policy.filters import MeanStdFilter
from flowrl.policy.model_options import model_config


class InferencePolicy:
    """A trained policy ready to act: observations in, actions as the env takes them out.

    Built by :func:`~flowrl.load_policy`. Actions of a Box action space are clipped to its bounds when
    the policy's config has ``clip_actions`` (as the samplers clip what they send to the env).
    ``explore=True`` acts as the policy did while sampling at the checkpoint's timestep
    (stochastic sampling, epsilon-greedy or action noise); the default acts greedily.
    ``observation_filter``: the run's filter (MeanStdFilter), applied to observations before the
    policy sees them, its statistics frozen. A recurrent policy (:attr:`is_recurrent`) also takes and
    returns its state (see :meth:`compute_action`).
    """

    def __init__(
        self, policy: Policy[Any], policy_id: str, algo: str, observation_filter: MeanStdFilter | None = None
    ) -> None:
        self._policy = policy
        self._policy_id = policy_id
        self._algo = algo
        self._filter = observation_filter
        space = policy.action_space
        clip = bool(getattr(policy.config, "clip_actions", True))
        self._clip = (space.low, space.high) if clip and isinstance(space, gym.spaces.Box) else None
        self._initial_state = policy.get_initial_state()

    @property
    def policy(self) -> Policy[Any]:
        """The underlying flowrl policy (a TorchPolicy's ``policy.model`` is its PyTorch module, in eval mode)."""
        return self._policy

    @property
    def policy_id(self) -> str:
        """The id of the policy in its checkpoint (``"default_policy"`` for a single-agent env)."""
        return self._policy_id

    @property
    def algo(self) -> str:
        """The name of the algorithm that trained it."""
        return self._algo

    @property
    def observation_space(self) -> gym.Space[Any]:
        """The space of the observations it takes."""
        return self._policy.observation_space

    @property
    def observation_filter(self) -> MeanStdFilter | None:
        """The filter its observations go through first (``normalization()`` of its ``stats()``), or None."""
        return self._filter

    @property
    def action_space(self) -> gym.Space[Any]:
        """The space of the actions it gives."""
        return self._policy.action_space

    @property
    def is_recurrent(self) -> bool:
        """Whether it carries a state from step to step (then :meth:`compute_action` returns the next one)."""
        return bool(self._initial_state)

    @property
    def reads_prev_action_reward(self) -> tuple[bool, bool]:
        """Whether its model reads the previous action and the previous reward (``model.lstm_use_prev_action``
        and ``lstm_use_prev_reward``): then give them to :meth:`compute_action` at every step after the first."""
        options = model_config(self._policy.config.model)
        return bool(options["lstm_use_prev_action"]), bool(options["lstm_use_prev_reward"])

    def get_initial_state(self) -> list[np.ndarray]:
        """One episode's state at its start (a list of arrays, one per entry of the model's state); ``[]`` for a
        feed-forward policy."""
        return [s.copy() for s in self._initial_state]

    def compute_actions(
        self,
        obs_batch: Any,
        explore: bool = False,
        action_mask: Any = None,
        state: list[np.ndarray] | None = None,
        prev_actions: Any = None,
        prev_rewards: Any = None,
    ) -> np.ndarray | tuple[np.ndarray, list[np.ndarray]]:
        """Actions for a batch of observations (first axis: the batch), one row each.

        For a Dict or Tuple observation space, a sequence of observations as the env returns them.
        Each action is a legal one: for a masked Dict observation space (keys ``"observations"`` and
        ``"action_mask"``), by each observation's own mask; else by ``action_mask`` (``[B, n]``, nonzero:
        legal, e.g. the envs' ``info["action_mask"]``) if given. A mask of another shape raises
        :class:`~flowrl.errors.EnvError`, and one that allows no action
        :class:`~flowrl.errors.BadObservationError` (no action there is right).

        A recurrent policy returns ``(actions, next_state)``: ``state`` holds each row's state (one
        ``[B, ...]`` array per entry of :meth:`get_initial_state`; None: every row at an episode's start),
        ``next_state`` is laid out alike. ``prev_actions`` and ``prev_rewards`` (``[B, ...]``; None: zeros, as
        at an episode's start) are each row's previous action and reward, read by a model that uses them
        (:attr:`reads_prev_action_reward`). A feed-forward policy returns the actions alone.
        """
        space = self.observation_space
        if is_masked(space):
            action_mask = np.stack([np.asarray(action_mask_of(obs)) for obs in obs_batch])
        if is_structured(space):
            obs_batch = [flatten_observation(space, obs) for obs in obs_batch]
        obs = np.asarray(obs_batch)
        if self._filter is not None:
            obs = self._filter(obs, update=False)
        masks = None if action_mask is None else self._legal(action_mask, len(obs))
        recurrent = self._recurrent_inputs(len(obs), state, prev_actions, prev_rewards) if self.is_recurrent else {}
        with torch.no_grad():
            actions, extra = self._policy.compute_actions(obs, explore=explore, action_mask=masks, **recurrent)
        if self._clip is not None:
            actions = np.clip(actions, *self._clip)
        if not self.is_recurrent:
            return actions
        return actions, [extra[f"{SampleBatch.STATE_OUT}{k}"] for k in range(len(self._initial_state))]

    def _recurrent_inputs(
        self, rows: int, state: list[np.ndarray] | None, prev_actions: Any, prev_rewards: Any
    ) -> dict[str, Any]:
        """``compute_actions``' keyword arguments for a recurrent policy, None filled with an episode's start."""
        if state is None:
            state = [np.repeat(s[None], rows, axis=0) for s in self._initial_state]
        elif len(state) != len(self._initial_state) or any(
            np.shape(s) != (rows, *initial.shape) for s, initial in zip(state, self._initial_state)
        ):
            want = [[rows, *initial.shape] for initial in self._initial_state]
            raise ValueError(
                f"state of shapes {[list(np.shape(s)) for s in state]} does not fit this policy's state {want} "
                f"for {rows} observations (give the next_state compute_actions returned, or None at an episode's start)"
            )
        space = self.action_space
        if prev_actions is None:
            dtype = space.dtype if space.dtype is not None else np.float32
            prev_actions = np.zeros((rows, *(space.shape or ())), dtype=dtype)
        if prev_rewards is None:
            prev_rewards = np.zeros(rows, dtype=np.float32)
        return {
            "state": [np.asarray(s, dtype=np.float32) for s in state],
            "prev_actions": np.asarray(prev_actions),
            "prev_rewards": np.asarray(prev_rewards, dtype=np.float32),
        }

    def _legal(self, action_mask: Any, rows: int) -> np.ndarray:
        """``action_mask`` as ``[rows, n]`` bools, checked (see :meth:`compute_actions`)."""
        masks = np.asarray(action_mask)
        space = self.action_space
        if not isinstance(space, gym.spaces.Discrete):
            return masks != 0
        n = int(space.n)
        if masks.shape != (rows, n) or masks.dtype.kind not in "biuf":
            raise EnvError(
                f"action_mask of shape {masks.shape} and dtype {masks.dtype} must hold one 0/1 number per action of "
                f"the Discrete({n}) action space for each of the {rows} observations (shape ({rows}, {n}))"
            )
        legal = masks != 0
        empty = np.flatnonzero(~legal.any(axis=1))
        if len(empty):
            raise BadObservationError(no_legal_action(legal[empty[0]], f"action_mask[{int(empty[0])}]"))
        return legal

    def compute_action(
        self,
        obs: Any,
        state: list[np.ndarray] | None = None,
        explore: bool = False,
        action_mask: Any = None,
        prev_action: Any = None,
        prev_reward: float | None = None,
    ) -> Any:
        """The action for one observation (for a Discrete action space, a NumPy integer), a legal one by the
        observation's own action mask or ``action_mask`` (e.g. ``info["action_mask"]``) if given; a mask
        that allows no action raises :class:`~flowrl.errors.BadObservationError`.

        A recurrent policy returns ``(action, next_state)``: ``state`` is the state the previous step of the
        episode returned (None: the episode's first step), and ``prev_action`` and ``prev_reward`` that step's
        action and reward, if its model reads them. A feed-forward policy returns the action alone::

            state = None
            obs, _ = env.reset()
            while True:
                action, state = policy.compute_action(obs, state)
                obs, reward, terminated, truncated, _ = env.step(action)
        """
        batch = [obs] if is_structured(self.observation_space) else np.asarray(obs)[None]
        masks = None if action_mask is None else np.asarray(action_mask)[None]
        if not self.is_recurrent:
            return self.compute_actions(batch, explore=explore, action_mask=masks)[0]
        out = self.compute_actions(
            batch,
            explore=explore,
            action_mask=masks,
            state=None if state is None else [np.asarray(s)[None] for s in state],
            prev_actions=None if prev_action is None else np.asarray(prev_action)[None],
            prev_rewards=None if prev_reward is None else np.asarray([prev_reward], dtype=np.float32),
        )
        assert isinstance(out, tuple)
        actions, next_state = out
        return actions[0], [s[0] for s in next_state]

    def __repr__(self) -> str:
        return (
            f"InferencePolicy(algo={self._algo!r}, policy_id={self._policy_id!r}, "
            f"observation_space={self.observation_space}, action_space={self.action_space})"
        )
