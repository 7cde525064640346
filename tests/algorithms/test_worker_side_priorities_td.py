"""Worker-side priorities: a worker's TD errors equal the driver's for the same rows, weights and target;
the target networks' weights and versions."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from flowrl.algorithms import get_algorithm
from flowrl.algorithms.ddpg import ACTOR_STEPS, ddpg_loss
from flowrl.data import DEFAULT_POLICY_ID, LocalReplayBuffer, SampleBatch
from flowrl.policy.postprocessing import DISCOUNTS, adjust_nstep
from flowrl.policy.worker_priorities import (
    add_td_errors,
    computes_priorities,
    load_target_weights,
    target_versions,
    target_weights,
)

pytestmark = pytest.mark.unit

CARTPOLE = gym.make("CartPole-v1")
PENDULUM = gym.make("Pendulum-v1")


def policy_of(algo: str, env: gym.Env, seed: int, **config: Any) -> Any:
    algorithm = get_algorithm(algo)
    small = {"model": {"fcnet_hiddens": [16]}} if algo == "dqn" else {"actor_hiddens": [8], "critic_hiddens": [8]}
    cfg = algorithm.config_class.from_dict(
        {"seed": seed, "prioritized_replay": True, "worker_side_prioritization": True, **small, **config}
    )
    return algorithm.make_policy(env.observation_space, env.action_space, cfg).build()


def fragment(env: gym.Env, n: int, n_step: int, gamma: float) -> SampleBatch:
    """``n`` random transitions of one episode piece that terminates at its last step, made n-step."""
    rng = np.random.default_rng(1)
    obs = rng.normal(size=(n + 1, *env.observation_space.shape)).astype(np.float32)
    if isinstance(env.action_space, gym.spaces.Discrete):
        actions = rng.integers(env.action_space.n, size=n)
    else:
        actions = rng.uniform(-2, 2, size=(n, 1)).astype(np.float32)
    terminateds = np.zeros(n, dtype=bool)
    terminateds[-1] = True
    batch = SampleBatch(
        {
            SampleBatch.OBS: obs[:-1],
            SampleBatch.NEW_OBS: obs[1:],
            SampleBatch.ACTIONS: actions,
            SampleBatch.REWARDS: rng.normal(size=n).astype(np.float32),
            SampleBatch.TERMINATEDS: terminateds,
            SampleBatch.TRUNCATEDS: np.zeros(n, dtype=bool),
        }
    )
    return adjust_nstep(batch, n_step, gamma)


def learner_and_worker(algo: str, env: gym.Env, **config: Any) -> tuple[Any, Any]:
    """A learner whose target lags its model, and a worker (built apart) given its weights and target."""
    learner, worker = policy_of(algo, env, 0, **config), policy_of(algo, env, 7, **config)
    with torch.no_grad():
        for p in learner.model.parameters():
            p.add_(0.1 * torch.randn_like(p))  # the model moves away from the target
    worker.set_weights(learner.get_weights())
    load_target_weights({DEFAULT_POLICY_ID: worker}, target_weights({DEFAULT_POLICY_ID: learner}))
    return learner, worker


def test_dqn_worker_priority_is_the_drivers_nstep_td_error() -> None:
    learner, worker = learner_and_worker("dqn", CARTPOLE, n_step=3, double_q=True)
    batch = fragment(CARTPOLE, 12, 3, learner.config.gamma)
    add_td_errors({DEFAULT_POLICY_ID: worker}, batch)
    # The driver's TD errors, by hand: Q(s, a) - (n-step reward + gamma^m Q_target(s', argmax_a Q(s', a)))
    t = learner.to_tensors(SampleBatch({k: v for k, v in batch.items() if k != SampleBatch.TD_ERROR}))
    with torch.no_grad():
        q = learner.model(t[SampleBatch.OBS])[0].gather(1, t[SampleBatch.ACTIONS].long()[:, None])[:, 0]
        best = learner.model(t[SampleBatch.NEW_OBS])[0].argmax(1, keepdim=True)
        next_q = learner.target_model(t[SampleBatch.NEW_OBS])[0].gather(1, best)[:, 0]
        target = t[SampleBatch.REWARDS] + t[DISCOUNTS] * (~t[SampleBatch.TERMINATEDS]) * next_q
    expected = (q - target).numpy()
    np.testing.assert_allclose(batch[SampleBatch.TD_ERROR], expected, rtol=1e-5, atol=1e-6)
    assert batch[DISCOUNTS][0] == pytest.approx(learner.config.gamma**3)  # the n-step rows were used
    # The loss reports the same TD errors for the same rows.
    loss_td = learner.loss_fn(learner, learner.model, learner.dist_class, t).td_error.detach().numpy()
    np.testing.assert_allclose(batch[SampleBatch.TD_ERROR], loss_td, rtol=1e-5, atol=1e-6)
    # A prioritized buffer stores the rows at |TD error| + eps, without the column.
    buffer = LocalReplayBuffer(100, 0, 4, prioritized_replay_eps=1e-3, seed=0)
    buffer.add_batch(batch)
    stored = buffer.buffers[DEFAULT_POLICY_ID]
    np.testing.assert_allclose(stored.priorities(), np.abs(expected) + 1e-3, rtol=1e-5)
    assert SampleBatch.TD_ERROR not in stored.columns


def test_ddpg_worker_priority_is_the_drivers_td_error_without_counting_an_actor_step() -> None:
    learner, worker = learner_and_worker("ddpg", PENDULUM, n_step=2)
    batch = fragment(PENDULUM, 10, 2, learner.config.gamma)
    add_td_errors({DEFAULT_POLICY_ID: worker}, batch)
    assert ACTOR_STEPS not in worker.coeffs  # no loss ran on the worker
    t = learner.to_tensors(SampleBatch({k: v for k, v in batch.items() if k != SampleBatch.TD_ERROR}))
    loss_td = ddpg_loss(learner, learner.model, learner.dist_class, t).td_error
    assert loss_td is not None
    np.testing.assert_allclose(batch[SampleBatch.TD_ERROR], loss_td.detach().numpy(), rtol=1e-5, atol=1e-5)
    assert np.abs(batch[SampleBatch.TD_ERROR]).min() > 0


def test_a_policy_without_the_key_adds_no_td_errors() -> None:
    policy = policy_of("dqn", CARTPOLE, 0, worker_side_prioritization=False)
    batch = fragment(CARTPOLE, 5, 1, 0.99)
    add_td_errors({DEFAULT_POLICY_ID: policy}, batch)
    assert SampleBatch.TD_ERROR not in batch
    assert not computes_priorities(policy) and target_versions({DEFAULT_POLICY_ID: policy}) == {}


def test_target_versions_count_updates_and_loads() -> None:
    policy = policy_of("dqn", CARTPOLE, 0)
    policies = {DEFAULT_POLICY_ID: policy}
    assert target_versions(policies) == {DEFAULT_POLICY_ID: 0}
    policy.update_target()
    policy.update_target(0.5)
    assert target_versions(policies) == {DEFAULT_POLICY_ID: 2}
    policy.set_state(policy.get_state())  # a restore loads the target
    assert target_versions(policies) == {DEFAULT_POLICY_ID: 3}
