"""The off-policy estimators on episodes whose target value is known analytically: a short chain where the
agent continues (reward 1) or stops (reward 0, the episode ends), truncated after three steps."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from flowrl.data import SampleBatch
from flowrl.policy.off_policy_estimation import (
    METHODS,
    Episodes,
    estimate,
    fitted_q_evaluation,
    whole_episodes,
)

pytestmark = pytest.mark.unit


@pytest.fixture
def one_thread() -> Iterator[None]:
    """Small MLPs fit fastest on one thread (a run sets its own: learner_threads)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


HORIZON = 3
GAMMA = 0.9
BEHAVIOR_CONTINUE = 0.5  # the recording policy continues with this probability
TARGET_CONTINUE = 0.8


def chain_value(p: float, steps: int = HORIZON) -> float:
    """The value of continuing with probability ``p`` for up to ``steps`` steps: sum_t gamma^t p^(t+1)."""
    return sum(GAMMA**t * p ** (t + 1) for t in range(steps))


def chain_q() -> np.ndarray:
    """The target policy's true Q at step t (rows) of (stop, continue)."""
    return np.array([[0.0, 1 + GAMMA * chain_value(TARGET_CONTINUE, HORIZON - t - 1)] for t in range(HORIZON)])


def chain_episodes(action_lists: list[list[int]]) -> tuple[Episodes, np.ndarray, np.ndarray]:
    """Episodes of the chain from their actions (1: continue), with the target's log-probs and probabilities."""
    obs, actions, rewards, starts = [], [], [], []
    for acts in action_lists:
        starts.append(len(actions))
        for t, action in enumerate(acts):
            obs.append(np.eye(HORIZON, dtype=np.float32)[t])
            actions.append(action)
            rewards.append(float(action))
    actions_array = np.array(actions)
    behavior = np.where(actions_array == 1, BEHAVIOR_CONTINUE, 1 - BEHAVIOR_CONTINUE)
    episodes = Episodes(np.array(obs), actions_array, np.array(rewards), np.log(behavior), np.array(starts))
    probs = np.tile([1 - TARGET_CONTINUE, TARGET_CONTINUE], (len(actions), 1))
    return episodes, np.log(probs[np.arange(len(actions)), actions_array]), probs


def sampled_actions(n: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    episodes = []
    for _ in range(n):
        acts = []
        for _ in range(HORIZON):
            acts.append(int(rng.random() < BEHAVIOR_CONTINUE))
            if not acts[-1]:
                break
        episodes.append(acts)
    return episodes


# Every episode of the behaviour policy (continue with probability 1/2) as often as its probability in eighths.
EXACT = [[0]] * 4 + [[1, 0]] * 2 + [[1, 1, 0], [1, 1, 1]]


def test_is_and_wis_over_the_behaviour_policys_whole_distribution_give_the_target_value_exactly() -> None:
    episodes, target_logp, _ = chain_episodes(EXACT)
    for method in ("is", "wis"):
        result = estimate(method, episodes, target_logp, GAMMA)
        assert result.v_target == pytest.approx(chain_value(TARGET_CONTINUE))
        assert result.v_behavior == pytest.approx(chain_value(BEHAVIOR_CONTINUE))
        assert result.v_gain == pytest.approx(chain_value(TARGET_CONTINUE) / chain_value(BEHAVIOR_CONTINUE))


def test_with_the_true_q_dm_and_dr_are_exact_and_dr_on_any_episode() -> None:
    episodes, target_logp, probs = chain_episodes(sampled_actions(50, seed=1))
    q = chain_q()[np.argmax(episodes.obs, axis=1)]
    for method in ("dm", "dr"):
        result = estimate(method, episodes, target_logp, GAMMA, q_values=q, target_probs=probs)
        assert result.v_target == pytest.approx(chain_value(TARGET_CONTINUE))
        assert result.v_target_std_error == pytest.approx(0.0, abs=1e-9)  # deterministic chain: every episode's term


def test_dr_is_unbiased_whatever_q_is() -> None:
    episodes, target_logp, probs = chain_episodes(EXACT)
    wrong_q = np.full((len(episodes.rewards), 2), 3.0)
    result = estimate("dr", episodes, target_logp, GAMMA, q_values=wrong_q, target_probs=probs)
    assert result.v_target == pytest.approx(chain_value(TARGET_CONTINUE))
    dm = estimate("dm", episodes, target_logp, GAMMA, q_values=wrong_q, target_probs=probs)
    assert dm.v_target == pytest.approx(3.0)  # the direct method is only as good as its Q


def test_on_sampled_episodes_is_lies_within_its_standard_error_and_wis_close() -> None:
    episodes, target_logp, _ = chain_episodes(sampled_actions(4000, seed=2))
    truth = chain_value(TARGET_CONTINUE)
    result = estimate("is", episodes, target_logp, GAMMA)
    assert 0 < result.v_target_std_error < 0.05 * truth
    assert abs(result.v_target - truth) < 3 * result.v_target_std_error
    assert estimate("wis", episodes, target_logp, GAMMA).v_target == pytest.approx(truth, rel=0.05)


@pytest.mark.usefixtures("one_thread")
def test_fitted_q_evaluation_learns_the_target_policys_q() -> None:
    episodes, target_logp, probs = chain_episodes(sampled_actions(500, seed=3))
    q = fitted_q_evaluation(episodes, probs, GAMMA, steps=400, seed=0)
    true_q = chain_q()[np.argmax(episodes.obs, axis=1)]
    continued = episodes.actions == 1  # Q of stopping at a step never followed by another is what the data shows
    assert np.abs(q - true_q)[:, 1].max() < 0.1 * true_q[:, 1].max()
    assert np.abs(q - true_q)[~continued, 0].max() < 0.1
    dm = estimate("dm", episodes, target_logp, GAMMA, q_values=q, target_probs=probs)
    assert dm.v_target == pytest.approx(chain_value(TARGET_CONTINUE), rel=0.05)


def test_estimators_refuse_what_they_cannot_compute() -> None:
    episodes, target_logp, _ = chain_episodes(EXACT)
    with pytest.raises(ValueError, match=r"unknown off-policy estimator 'snis'.*'is', 'wis', 'dm', 'dr'"):
        estimate("snis", episodes, target_logp, GAMMA)
    with pytest.raises(ValueError, match="'dr' estimator needs q_values and target_probs"):
        estimate("dr", episodes, target_logp, GAMMA)
    without_logp = episodes._replace(behavior_logp=None)
    with pytest.raises(ValueError, match="'wis' estimator needs the recording policy's action_logp"):
        estimate("wis", without_logp, target_logp, GAMMA)
    assert METHODS == ("is", "wis", "dm", "dr")


def rows(eps_id: int, steps: range, end: str | None) -> SampleBatch:
    """Rows of episode ``eps_id`` at steps ``steps``, its last ending as ``end`` says."""
    n = len(steps)
    last = np.arange(n) == n - 1
    return SampleBatch(
        {
            SampleBatch.OBS: np.full((n, 2), eps_id, np.float32),
            SampleBatch.ACTIONS: np.zeros(n, np.int64),
            SampleBatch.REWARDS: np.ones(n, np.float32),
            SampleBatch.TERMINATEDS: last & (end == "terminated"),
            SampleBatch.TRUNCATEDS: last & (end == "truncated"),
            SampleBatch.EPS_ID: np.full(n, eps_id),
            SampleBatch.T: np.array(steps),
            SampleBatch.ACTION_LOGP: np.full(n, -0.5, np.float32),
        }
    )


def concat(*pieces: SampleBatch) -> SampleBatch:
    return SampleBatch({k: np.concatenate([p[k] for p in pieces]) for k in pieces[0]})


def test_whole_episodes_keeps_only_episodes_recorded_from_start_to_end() -> None:
    batches = [
        concat(rows(1, range(5, 8), "terminated"), rows(2, range(0, 2), None)),  # 1 began before the recording
        concat(rows(3, range(0, 3), None), rows(2, range(2, 4), "truncated")),  # 2 goes on, 3 interleaves
        concat(rows(3, range(3, 4), "terminated"), rows(4, range(0, 2), None), rows(4, range(3, 5), "terminated")),
        rows(5, range(0, 3), None),  # 4 has a gap; the recording stops in 5
    ]
    episodes = whole_episodes(batches, max_episodes=10)
    assert episodes is not None
    assert episodes.num_episodes == 2 and episodes.starts.tolist() == [0, 4]
    assert episodes.obs[:, 0].tolist() == [2.0] * 4 + [3.0] * 4
    assert episodes.behavior_logp is not None and episodes.behavior_logp.tolist() == [-0.5] * 8
    first = whole_episodes(batches, max_episodes=1)
    assert first is not None and first.num_episodes == 1 and len(first.rewards) == 4
    assert whole_episodes([rows(1, range(5, 8), "terminated")], max_episodes=10) is None


def test_whole_episodes_without_action_logp_serves_the_direct_method() -> None:
    batch = rows(1, range(0, 3), "terminated")
    del batch[SampleBatch.ACTION_LOGP]
    episodes = whole_episodes([batch], max_episodes=10)
    assert episodes is not None and episodes.behavior_logp is None
    q = np.ones((3, 1))
    result = estimate("dm", episodes, np.zeros(3), GAMMA, q_values=q, target_probs=np.ones((3, 1)))
    assert result.v_target == 1.0 and result.v_behavior == pytest.approx(1 + GAMMA + GAMMA**2)


@pytest.mark.parametrize("method", METHODS)
def test_every_estimator_reports_its_figures(method: str) -> None:
    episodes, target_logp, probs = chain_episodes(list(itertools.islice(itertools.cycle(EXACT), 16)))
    q = chain_q()[np.argmax(episodes.obs, axis=1)]
    result = estimate(method, episodes, target_logp, GAMMA, q_values=q, target_probs=probs)
    assert set(result._asdict()) == {"v_behavior", "v_target", "v_gain", "v_target_std_error"}
    assert all(np.isfinite(list(result)))


def test_a_deterministic_target_is_estimated_and_one_the_data_never_follows_is_worth_nothing() -> None:
    episodes, _, _ = chain_episodes(EXACT)
    always_continue = np.where(episodes.actions == 1, 0.0, -np.inf)
    for method in ("is", "wis"):
        assert estimate(method, episodes, always_continue, GAMMA).v_target == pytest.approx(chain_value(1.0))
    continuing, _, _ = chain_episodes([[1, 1, 1]] * 4)
    always_stop = np.full(len(continuing.actions), -np.inf)
    assert estimate("wis", continuing, always_stop, GAMMA).v_target == 0.0
