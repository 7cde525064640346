"""MultiAgentSampler with recurrent policies: each agent carries its own state, reset at its episode's start,
through fragments and checkpoints of the sampler, and its pieces are cut into sequences (no Ray)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from gymnasium import spaces

from flowrl.actors.sampling.multi_agent import MultiAgentSampler
from flowrl.data import MultiAgentBatch, SampleBatch, concat_samples
from flowrl.envs import MultiAgentEnv

pytestmark = pytest.mark.unit

MAX_SEQ_LEN = 2


class TwoLivesEnv(MultiAgentEnv):
    """Agent 'a' lives 3 steps and 'b' 5; rewards 1 (a) and 2 (b) per step; obs = [agent's step, agent]."""

    LIFETIMES = {"a": 3, "b": 5}
    REWARDS = {"a": 1.0, "b": 2.0}

    def __init__(self) -> None:
        self.possible_agents = ["a", "b"]
        self.agents: list[str] = []
        self.t = 0

    def observation_space(self, agent: str) -> spaces.Space:
        return spaces.Box(-100.0, 100.0, (2,), np.float32)

    def action_space(self, agent: str) -> spaces.Space:
        return spaces.Discrete(3)

    def _obs(self, agent: str) -> np.ndarray:
        return np.array([self.t, self.possible_agents.index(agent)], np.float32)

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        self.t = 0
        self.agents = list(self.possible_agents)
        return {a: self._obs(a) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions: dict) -> tuple[dict, dict, dict, dict, dict]:
        self.t += 1
        obs = {a: self._obs(a) for a in self.agents}
        terminated = {a: self.t >= self.LIFETIMES[a] for a in self.agents}
        rewards = {a: self.REWARDS[a] for a in self.agents}
        self.agents = [a for a in self.agents if not terminated[a]]
        return obs, rewards, terminated, {a: False for a in obs}, {a: {} for a in obs}


class CountingPolicy:
    """A recurrent stand-in: its state counts the steps acted since it was reset; acts ``t % 3``; records the
    batches of states it was given."""

    action_space = spaces.Discrete(3)
    max_seq_len = MAX_SEQ_LEN

    def __init__(self) -> None:
        self.states_seen: list[np.ndarray] = []

    def get_initial_state(self) -> list[np.ndarray]:
        return [np.zeros(1, np.float32)]

    def compute_actions(
        self, obs: np.ndarray, *, state: list[np.ndarray] | None = None, **_: Any
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        assert state is not None and state[0].shape == (len(obs), 1)
        self.states_seen.append(state[0][:, 0].copy())
        return obs[:, 0].astype(np.int64) % 3, {f"{SampleBatch.STATE_OUT}0": state[0] + 1}

    def postprocess_trajectory(self, batch: SampleBatch) -> SampleBatch:
        assert SampleBatch.SEQ_LENS not in batch  # cut into sequences after postprocessing
        return batch


def assert_agent_sequences(batch: SampleBatch, reward: float) -> None:
    """Every sequence holds consecutive steps of one agent's episode, at most MAX_SEQ_LEN, and starts from a
    state that counted exactly that agent's steps so far; previous actions and rewards are its own."""
    bounds, t = batch.sequence_bounds(), batch[SampleBatch.T]
    assert (batch[SampleBatch.SEQ_LENS] <= MAX_SEQ_LEN).all() and bounds[-1] == batch.count
    assert f"{SampleBatch.STATE_OUT}0" not in batch
    np.testing.assert_array_equal(batch[f"{SampleBatch.STATE_IN}0"][:, 0], t[bounds[:-1]])
    for start, end in zip(bounds[:-1], bounds[1:]):
        assert len(set(batch[SampleBatch.EPS_ID][start:end])) == 1 and (np.diff(t[start:end]) == 1).all()
    np.testing.assert_array_equal(batch[SampleBatch.PREV_REWARDS], np.where(t > 0, reward, 0.0))
    np.testing.assert_array_equal(batch[SampleBatch.PREV_ACTIONS], np.where(t > 0, (t - 1) % 3, 0))


@pytest.mark.parametrize("shared", [False, True], ids=["a policy per agent", "one policy for both"])
def test_each_agent_carries_its_own_state_reset_at_its_episode_start(shared: bool) -> None:
    policies = {"pa": CountingPolicy(), "pb": CountingPolicy()}
    mapping = (lambda agent: "pa") if shared else (lambda agent: "pa" if agent == "a" else "pb")
    sampler = MultiAgentSampler([TwoLivesEnv(), TwoLivesEnv()], policies, mapping, fragment_length=4, seed=0)
    fragments = [sampler.sample() for _ in range(5)]
    assert all(isinstance(f, MultiAgentBatch) for f in fragments)
    batches = concat_samples([f.policy_batches["pa"] for f in fragments])
    agents = batches[SampleBatch.AGENT_INDEX]
    # Rows stay in sequence order: split each policy's rows by agent along sequence bounds.
    bounds = batches.sequence_bounds()
    for agent, reward, lifetime in ((0, 1.0, 3), (1, 2.0, 5)):
        if not shared and agent == 1:
            batch = concat_samples([f.policy_batches["pb"] for f in fragments])
        else:
            keep = [k for k, start in enumerate(bounds[:-1]) if agents[start] == agent]
            rows = np.concatenate([np.arange(bounds[k], bounds[k + 1]) for k in keep])
            batch = SampleBatch(
                {
                    key: value[keep]
                    if key.startswith(SampleBatch.STATE_IN) or key == SampleBatch.SEQ_LENS
                    else value[rows]
                    for key, value in batches.items()
                }
            )
        assert (batch[SampleBatch.AGENT_INDEX] == agent).all()
        assert batch[SampleBatch.T].max() == lifetime - 1
        assert_agent_sequences(batch, reward)
    # One forward pass per policy per step: the agents' states are stacked (both agents, both envs, at first).
    assert len(policies["pa"].states_seen[0]) == (4 if shared else 2)


def test_the_agents_states_survive_the_samplers_state() -> None:
    def make() -> MultiAgentSampler:
        policies = {"pa": CountingPolicy()}
        return MultiAgentSampler([TwoLivesEnv()], policies, lambda agent: "pa", fragment_length=2, seed=0)

    original = make()
    original.sample()  # mid-episode: 'a' at step 2, 'b' at step 2
    restored = make()
    restored.set_state(original.get_state())
    expected, got = original.sample().policy_batches["pa"], restored.sample().policy_batches["pa"]
    assert set(expected) == set(got)
    for key in expected:
        np.testing.assert_array_equal(got[key], expected[key])
    np.testing.assert_array_equal(got[f"{SampleBatch.STATE_IN}0"][:, 0], got[SampleBatch.T][got.sequence_bounds()[:-1]])
    assert got[SampleBatch.T].min() == 2  # the episode went on from its state, not from a fresh one
