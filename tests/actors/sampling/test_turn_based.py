"""MultiAgentSampler on turn-based envs: only the mover acts, each row waits for the agent's next turn (its
reward and next observation), every trajectory ends on the game's last step, and action masks are honoured."""

from __future__ import annotations

import warnings
from collections.abc import Hashable
from typing import Any

import numpy as np
import pytest
from gymnasium import spaces

from flowrl.actors.sampling.multi_agent import MultiAgentSampler
from flowrl.data import SampleBatch
from flowrl.envs import TicTacToe, TurnBasedEnv

pytestmark = pytest.mark.unit

pytest.importorskip("pettingzoo")
pytest.importorskip("pygame")  # imported by PettingZoo's classic games

from tally import Tally  # noqa: E402 - after the skips: it subclasses PettingZoo's AECEnv


class RandomLegalPolicy:
    """Picks uniformly among the legal actions it is given (every action without a mask); records the masks."""

    def __init__(self, n: int, *, honour_masks: bool = True, seed: int = 0) -> None:
        self.action_space = spaces.Discrete(n)
        self.honour_masks = honour_masks
        self.rng = np.random.default_rng(seed)
        self.masks: list[np.ndarray | None] = []

    def compute_actions(
        self, obs_batch: np.ndarray, *, action_mask: np.ndarray | None = None, **_: Any
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        self.masks.append(action_mask)
        scores = self.rng.random((len(obs_batch), self.action_space.n))
        if action_mask is not None and self.honour_masks:
            scores[~action_mask] = -1.0
        return scores.argmax(axis=1), {}

    def postprocess_trajectory(self, batch: SampleBatch) -> SampleBatch:
        return batch


def by_agent(agent: Hashable) -> str:
    return "pa" if agent == "a" else "pb"


def test_each_agent_acts_in_turn_and_its_rows_collect_what_it_earned_until_its_next_turn() -> None:
    policies = {"pa": RandomLegalPolicy(2), "pb": RandomLegalPolicy(2)}
    sampler = MultiAgentSampler([TurnBasedEnv(Tally())], policies, by_agent, fragment_length=4)
    batch = sampler.sample()
    a, b = batch.policy_batches["pa"], batch.policy_batches["pb"]
    assert a[SampleBatch.T].tolist() == [0, 2] and b[SampleBatch.T].tolist() == [1, 3]
    # a: 1 for its move and 10 for b's reply, twice; b: 10 for a's first move (before it acted, so in its first
    # row), then 1 + 10, and 1 for its last move.
    assert a[SampleBatch.REWARDS].tolist() == [11.0, 11.0] and b[SampleBatch.REWARDS].tolist() == [21.0, 1.0]
    assert a[SampleBatch.TERMINATEDS].tolist() == [False, True] and b[SampleBatch.TERMINATEDS].tolist() == [False, True]
    # A row's next observation is the one the agent acts on next (the board two moves later), or its last.
    assert a[SampleBatch.OBS].ravel().tolist() == [0.0, 2.0] and a[SampleBatch.NEW_OBS].ravel().tolist() == [2.0, 4.0]
    assert b[SampleBatch.OBS].ravel().tolist() == [1.0, 3.0] and b[SampleBatch.NEW_OBS].ravel().tolist() == [3.0, 4.0]
    assert batch.env_steps() == 4 and batch.agent_steps() == 4
    [episode] = sampler.pop_episode_stats()
    assert episode.policy_rewards == {"pa": [22.0], "pb": [22.0]} and episode.episode_length == 4


def test_a_row_waiting_for_its_agents_turn_at_the_end_of_a_fragment_goes_into_the_next() -> None:
    policies = {"pa": RandomLegalPolicy(2), "pb": RandomLegalPolicy(2)}
    sampler = MultiAgentSampler([TurnBasedEnv(Tally())], policies, by_agent, fragment_length=3)
    first, second = sampler.sample(), sampler.sample()
    # Moves 1-3: a's first row is complete at its second turn, b's at its second; a's second row waits.
    assert first.policy_batches["pa"][SampleBatch.T].tolist() == [0]
    assert first.policy_batches["pb"][SampleBatch.T].tolist() == [1]
    # Moves 4-6: the first game ends at move 4 (a's waiting row with it), a second starts.
    a, b = second.policy_batches["pa"], second.policy_batches["pb"]
    assert a[SampleBatch.T].tolist() == [2, 0] and a[SampleBatch.REWARDS].tolist() == [11.0, 11.0]
    assert a[SampleBatch.TERMINATEDS].tolist() == [True, False] and b[SampleBatch.T].tolist() == [3]


def test_the_mover_acts_within_its_mask_and_rows_carry_the_masks() -> None:
    policy = RandomLegalPolicy(9)
    envs = [TicTacToe() for _ in range(4)]
    sampler = MultiAgentSampler(envs, {"shared": policy}, lambda agent: "shared", fragment_length=50)
    batch = sampler.sample().policy_batches["shared"]
    assert sum(env.illegal_actions for env in envs) == 0
    assert all(mask is not None and mask.shape[1] == 9 for mask in policy.masks)
    actions, masks = batch[SampleBatch.ACTIONS], batch[SampleBatch.ACTION_MASK]
    assert masks[np.arange(len(actions)), actions].all()  # every action taken was legal where it was taken
    # A row's observation shows as many free cells as its mask has legal moves.
    free = 9 - batch[SampleBatch.OBS].reshape(len(actions), -1).sum(axis=1)
    assert (masks.sum(axis=1) == free).all()
    assert SampleBatch.NEXT_ACTION_MASK in batch and batch.count == 4 * 50 - sum(
        1 for trajectory in sampler.trajectories for t in trajectory.values() if t.open_row is not None
    )


def test_zero_illegal_moves_over_many_steps_and_many_without_the_masks() -> None:
    def illegal_moves(honour_masks: bool, steps: int) -> int:
        envs = [TicTacToe() for _ in range(8)]
        policy = RandomLegalPolicy(9, honour_masks=honour_masks)
        sampler = MultiAgentSampler(envs, {"shared": policy}, lambda agent: "shared", fragment_length=100)
        while sampler.steps_sampled < steps:
            sampler.sample()
        return sum(env.illegal_actions for env in envs)

    assert illegal_moves(True, 20_000) == 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PettingZoo warns of each illegal move
        assert illegal_moves(False, 2_000) > 100
