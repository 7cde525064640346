"""The NumPy acting path matches the PyTorch forward pass it mirrors."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from flowrl.config import TrainerConfig
from flowrl.data import SampleBatch
from flowrl.policy import TorchPolicy
from flowrl.policy.numpy_inference import NumpyActorCritic

pytestmark = pytest.mark.unit


def no_loss(*args: Any) -> Any:
    raise AssertionError("not used")


def torch_only(policy: TorchPolicy) -> TorchPolicy:
    policy._numpy_model = None  # force the PyTorch path
    return policy


@pytest.mark.parametrize(
    ("obs_space", "action_space", "model"),
    [
        (gym.spaces.Box(-1, 1, (4,), np.float32), gym.spaces.Discrete(3), {}),
        (
            gym.spaces.Box(-1, 1, (3,), np.float32),
            gym.spaces.Box(-2, 2, (2,), np.float32),
            {"fcnet_activation": "relu"},
        ),
        (gym.spaces.Discrete(5), gym.spaces.Discrete(2), {"vf_share_layers": True}),
    ],
)
def test_numpy_path_matches_torch(obs_space: gym.Space, action_space: gym.Space, model: dict[str, Any]) -> None:
    fast = TorchPolicy(obs_space, action_space, TrainerConfig.from_dict({"model": model, "seed": 0}), loss_fn=no_loss)
    slow = torch_only(
        TorchPolicy(obs_space, action_space, TrainerConfig.from_dict({"model": model, "seed": 0}), loss_fn=no_loss)
    )
    slow.set_weights(fast.get_weights())
    obs = np.stack([obs_space.sample() for _ in range(16)])
    assert fast._numpy_twin() is not None
    a_fast, x_fast = fast.compute_actions(obs, explore=False)
    a_slow, x_slow = slow.compute_actions(obs, explore=False)
    np.testing.assert_allclose(a_fast, a_slow, rtol=1e-5, atol=1e-5)
    for key in (SampleBatch.ACTION_LOGP, SampleBatch.ACTION_DIST_INPUTS, SampleBatch.VF_PREDS):
        np.testing.assert_allclose(x_fast[key], x_slow[key], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(fast.value(obs), slow.value(obs), rtol=1e-4, atol=1e-5)
    # Sampled actions: their reported logp is the torch distribution's logp of them.
    actions, extra = fast.compute_actions(obs, explore=True)
    with torch.no_grad():
        dist = slow.dist_class(torch.as_tensor(extra[SampleBatch.ACTION_DIST_INPUTS]))
        expected = dist.logp(torch.as_tensor(actions)).numpy()
    np.testing.assert_allclose(extra[SampleBatch.ACTION_LOGP], expected, rtol=1e-4, atol=1e-5)


def test_numpy_twin_follows_weight_updates_in_place() -> None:
    space = gym.spaces.Box(-1, 1, (4,), np.float32)
    policy = TorchPolicy(space, gym.spaces.Discrete(2), TrainerConfig(), loss_fn=no_loss)
    obs = np.ones((2, 4), np.float32)
    before = policy.value(obs)
    with torch.no_grad():
        for p in policy.model.parameters():
            p.add_(0.1)
    assert not np.allclose(before, policy.value(obs))
    other = TorchPolicy(space, gym.spaces.Discrete(2), TrainerConfig(), loss_fn=no_loss)
    policy.set_weights(other.get_weights())
    np.testing.assert_allclose(policy.value(obs), torch_only(other).value(obs), rtol=1e-5)


def test_unsupported_models_use_torch() -> None:
    frames = gym.spaces.Box(0, 255, (84, 84, 4), np.uint8)
    assert (
        NumpyActorCritic.build(
            TorchPolicy(frames, gym.spaces.Discrete(2), TrainerConfig(), loss_fn=no_loss).model, frames
        )
        is None
    )
    elu_config = TrainerConfig.from_dict({"model": {"fcnet_activation": "elu"}})
    elu = TorchPolicy(gym.spaces.Box(-1, 1, (4,), np.float32), gym.spaces.Discrete(2), elu_config, loss_fn=no_loss)
    assert elu._numpy_twin() is None
    assert elu.compute_actions(np.zeros((3, 4), np.float32))[0].shape == (3,)
