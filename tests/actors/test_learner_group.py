"""Learner groups: 2 gloo learner actors take one learner's steps, survive a killed learner, and hand back their state."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import ray

from flowrl import Trainer
from flowrl.actors.learner_group import LearnerGroup
from flowrl.actors.learner_thread import learn_on_local_worker

pytestmark = [pytest.mark.usefixtures("ray_session"), pytest.mark.timeout(240)]

PPO = {"num_workers": 0, "seed": 0, "train_batch_size": 128, "rollout_fragment_length": 128, "model": {"fcnet_hiddens": [16, 16]}}
SGD = {"num_sgd_iter": 2, "sgd_minibatch_size": 64, "seed": 5}


def weights(trainer: Trainer) -> dict[str, np.ndarray]:
    return trainer.workers.local_worker().get_weights()["default_policy"]


def test_two_learners_take_the_single_learners_steps_and_survive_a_killed_one() -> None:
    with Trainer("ppo", "CartPole-v1", PPO) as single, Trainer("ppo", "CartPole-v1", PPO) as grouped:
        batch = single.workers.local_worker().sample()
        group = LearnerGroup(grouped.workers, ["default_policy"], 2, timeout_s=60, num_cpus=0.1)
        try:
            learned = group.learn(batch, **SGD)
            learn_on_local_worker(single.workers.local_worker(), batch, **SGD)
            assert learned.steps == batch.count and set(learned.info) == {"default_policy"}
            for name, value in weights(single).items():
                np.testing.assert_allclose(weights(grouped)[name], value, atol=1e-5, rtol=0, err_msg=name)

            ray.kill(group.actors[1])  # a learner lost mid-run: rebuilt from the driver's policy, batch learned again
            group.learn(batch, **SGD)
            learn_on_local_worker(single.workers.local_worker(), batch, **SGD)
            assert group.num_restarts == 1
            # The driver follows rank 0, optimizer moments included: it equals the single learner's policy.
            state: dict[str, Any] = grouped.workers.local_worker().get_policy().get_state()
            expected: dict[str, Any] = single.workers.local_worker().get_policy().get_state()
            for name, value in expected["weights"].items():
                np.testing.assert_allclose(state["weights"][name], value, atol=1e-5, rtol=0, err_msg=name)
            moments = [s["optimizer"]["state"][0]["exp_avg"].numpy() for s in (state, expected)]
            np.testing.assert_allclose(moments[0], moments[1], atol=1e-5, rtol=0)
        finally:
            group.stop()
