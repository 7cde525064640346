"""A state whose action mask allows no action, where the policy must act, is a bad observation: the samplers
raise BadObservationError naming the worker, env, step and mask, or (on_bad_observation="drop_episode") drop
the episode and count it in num_bad_observations. A mask that allows nothing in a state that ends the episode
(or of an agent that does not act) is no fault."""

from __future__ import annotations

import numpy as np
import pytest
from masked_envs import EmptyMaskAt, FirstLegal, MaskedPair

from flowrl import Trainer
from flowrl.actors import VectorSampler
from flowrl.actors.sampling.multi_agent import MultiAgentSampler
from flowrl.data import SampleBatch
from flowrl.errors import BadObservationError

pytestmark = pytest.mark.unit

MASK_FIELDS = {"observation": r"new_obs\['action_mask'\]", "info": r"info\['action_mask'\]"}


@pytest.mark.parametrize("mask", ["observation", "info"])
def test_a_step_to_a_state_with_no_legal_action_raises_naming_the_mask(mask: str) -> None:
    sampler = VectorSampler([EmptyMaskAt(mask, at_step=3)], FirstLegal(4), fragment_length=10, seed=0)
    expected = (
        rf"worker 0, env 0: env\.step\(\) at step 2 of its episode \(vector step 2\) returned {MASK_FIELDS[mask]}="
        r"\[0, 0, 0, 0\], which allows no action"
    )
    with pytest.raises(BadObservationError, match=expected):
        sampler.sample()


def test_a_reset_to_a_state_with_no_legal_action_raises() -> None:
    with pytest.raises(
        BadObservationError,
        match=r"worker 0, env 1: env\.reset\(\) \(vector step 0\) returned obs\['action_mask'\]=\[0, 0, 0, 0\]",
    ):
        VectorSampler(
            [EmptyMaskAt("observation", at_step=-1), EmptyMaskAt("observation", at_step=0)],
            FirstLegal(4),
            fragment_length=10,
            seed=0,
        )


@pytest.mark.parametrize("at_step", [0, 3])
def test_drop_episode_drops_the_episode_and_counts_it(at_step: int) -> None:
    envs = [EmptyMaskAt("info", at_step=at_step), EmptyMaskAt("info", at_step=-1)]
    sampler = VectorSampler([*envs], FirstLegal(4), fragment_length=30, seed=0, on_bad_observation="drop_episode")
    first_episode = int(sampler.eps_ids[0])
    batch = sampler.sample()
    assert sampler.num_bad_observations == 1 and sum(env.illegal_actions for env in envs) == 0
    legal = batch[SampleBatch.ACTION_MASK]
    assert legal.any(axis=1).all() and legal[np.arange(batch.count), batch[SampleBatch.ACTIONS]].all()
    if at_step == 0:  # found at the first reset, which is made again: nothing was played yet
        assert batch.count == 60
    else:  # the episode's 3 steps are left out
        assert batch.count == 57 and first_episode not in batch[SampleBatch.EPS_ID].tolist()


def test_no_legal_action_in_a_state_that_ends_the_episode_is_no_fault() -> None:
    sampler = VectorSampler([EmptyMaskAt("info", at_step=3, ends=True)], FirstLegal(4), fragment_length=20, seed=0)
    batch = sampler.sample()
    assert sampler.num_bad_observations == 0 and batch.count == 20
    assert batch[SampleBatch.TERMINATEDS][2] and not batch[SampleBatch.NEXT_ACTION_MASK][2].any()
    assert sampler.pop_episode_stats()[0].episode_length == 3


def test_a_trainer_counts_the_dropped_episode_in_num_bad_observations() -> None:
    config = {
        "num_workers": 0,
        "seed": 0,
        "rollout_fragment_length": 20,
        "train_batch_size": 20,
        "sgd_minibatch_size": 20,
        "num_sgd_iter": 1,
        "on_bad_observation": "drop_episode",
        "check_env": False,  # which would refuse the env before training (see tests/envs/test_action_masks.py)
    }
    trainer = Trainer("ppo", lambda env_config: EmptyMaskAt("observation", at_step=2), config)
    try:
        result = trainer.train()
    finally:
        trainer.stop()
    assert result["num_bad_observations"] == 1


# --- multi-agent ------------------------------------------------------------------------------------------


def multi_agent_sampler(env: MaskedPair, on_bad_observation: str = "raise") -> MultiAgentSampler:
    policies = {"shared": FirstLegal(3)}
    return MultiAgentSampler(
        [env], policies, lambda agent: "shared", fragment_length=12, on_bad_observation=on_bad_observation
    )


@pytest.mark.parametrize(
    ("mask", "field"), [("info", r"infos\['b'\]\['action_mask'\]"), ("observation", r"new_obs\['b'\]\['action_mask'\]")]
)
def test_an_acting_agent_with_no_legal_action_raises_naming_it(mask: str, field: str) -> None:
    expected = (
        rf"worker 0, env 0: env\.step\(\) at step 2 of its episode \(vector step 2\) returned {field}=\[0, 0, 0\], "
        "which allows no action"
    )
    with pytest.raises(BadObservationError, match=expected):
        multi_agent_sampler(MaskedPair(mask, at_step=3)).sample()
    with pytest.raises(
        BadObservationError, match=r"env\.reset\(\) \(vector step 0\) returned .*\['b'\]\['action_mask'\]"
    ):
        multi_agent_sampler(MaskedPair(mask, at_step=0))


def test_multi_agent_drop_episode_drops_the_episode_and_counts_it() -> None:
    env = MaskedPair("info", at_step=3)
    sampler = multi_agent_sampler(env, on_bad_observation="drop_episode")
    fragment = sampler.sample()
    assert sampler.num_bad_observations == 1 and env.illegal_actions == 0
    # 12 steps: the first episode dropped at its 3rd, the second played whole (6 steps), the third begun (3).
    assert fragment.env_steps() == 12 - 3
    batch = fragment.policy_batches["shared"]
    assert batch[SampleBatch.T].tolist() == [0, 1, 2, 3, 4, 5] * 2 + [0, 1, 2] * 2
    assert batch[SampleBatch.ACTION_MASK].any(axis=1).all()
    [episode] = sampler.pop_episode_stats()
    assert episode.episode_length == MaskedPair.LENGTH
