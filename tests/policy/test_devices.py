"""State leaving a policy's device: CPU copies that later steps leave be (tests/policy/test_gpu.py checks a GPU's)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from policy_files import build_policies

from flowrl.data import DEFAULT_POLICY_ID, SampleBatch
from flowrl.policy import TorchPolicy
from flowrl.policy.devices import on_cpu
from flowrl.policy.postprocessing import DISCOUNTS

pytestmark = pytest.mark.unit


def test_on_cpu_copies_every_tensor_and_keeps_the_structure() -> None:
    tensor = torch.ones(3)
    state = {"state": {0: {"step": torch.tensor(2.0), "exp_avg": tensor}}, "param_groups": [{"betas": (0.9, 0.99)}]}
    copied = on_cpu(state)
    tensor.add_(1.0)  # an optimizer's in-place step
    assert torch.equal(copied["state"][0]["exp_avg"], torch.ones(3))
    assert copied["state"][0]["step"].device.type == "cpu" and float(copied["state"][0]["step"]) == 2.0
    assert copied["param_groups"] == [{"betas": (0.9, 0.99)}] and copied["param_groups"] is not state["param_groups"]
    assert isinstance(copied["param_groups"][0]["betas"], tuple)


def test_on_cpu_without_copy_keeps_the_cpu_tensors_themselves_and_the_structure() -> None:
    tensor = torch.ones(3)
    state = {"state": {0: {"exp_avg": tensor}}, "param_groups": [{"betas": (0.9, 0.99)}]}
    moved = on_cpu(state, copy=False)
    # What an actor's reply serializes at once needs no copy: the same storage.
    assert moved["state"][0]["exp_avg"].data_ptr() == tensor.data_ptr()
    assert on_cpu(state)["state"][0]["exp_avg"].data_ptr() != tensor.data_ptr()
    assert moved["param_groups"] == [{"betas": (0.9, 0.99)}]


def test_a_policys_state_is_a_snapshot_that_later_updates_leave_be() -> None:
    policy_map, _ = build_policies("dqn", "CartPole-v1", {"model": {"fcnet_hiddens": [8]}})
    policy = policy_map[DEFAULT_POLICY_ID]
    assert isinstance(policy, TorchPolicy) and policy.target_network is not None
    rng = np.random.default_rng(0)
    batch = SampleBatch(
        {
            SampleBatch.OBS: rng.normal(size=(8, 4)).astype(np.float32),
            SampleBatch.NEW_OBS: rng.normal(size=(8, 4)).astype(np.float32),
            SampleBatch.ACTIONS: rng.integers(0, 2, 8),
            SampleBatch.REWARDS: np.ones(8, np.float32),
            SampleBatch.TERMINATEDS: np.zeros(8, bool),
            DISCOUNTS: np.full(8, 0.99, np.float32),
        }
    )
    policy.learn(batch)
    state = policy.get_state()
    moments = {k: v.clone() for k, v in state["optimizer"]["state"][0].items()}
    target = {k: v.clone() for k, v in state["target"].items()}
    policy.learn(batch)
    policy.update_target(0.5)
    for key, value in moments.items():
        assert torch.equal(state["optimizer"]["state"][0][key], value), key
    for key, value in target.items():
        assert torch.equal(state["target"][key], value), key
    assert not all(torch.equal(state["target"][k], v) for k, v in policy.target_network.model.state_dict().items())
