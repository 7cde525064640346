"""The NumPy acting path matches the PyTorch forward pass it mirrors."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from flowrl.algorithms.ppo import PPOConfig
from flowrl.config import TrainerConfig
from flowrl.data import SampleBatch
from flowrl.policy import TorchPolicy
from flowrl.policy.numpy_inference import SINGLE_THREAD_PRODUCT, NumpyActorCritic, NumpyRecurrentActorCritic

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


LSTM = {"use_lstm": True, "lstm_cell_size": 16, "fcnet_hiddens": [8]}


@pytest.mark.parametrize(
    ("action_space", "model"),
    [
        (gym.spaces.Discrete(3), {}),
        (gym.spaces.Discrete(2), {"vf_share_layers": True, "lstm_use_prev_action": True, "lstm_use_prev_reward": True}),
        (gym.spaces.Box(-2, 2, (2,), np.float32), {"fcnet_activation": "relu", "lstm_use_prev_action": True}),
    ],
)
def test_recurrent_numpy_step_matches_torch(action_space: gym.Space, model: dict[str, Any]) -> None:
    obs_space = gym.spaces.Box(-1, 1, (3,), np.float32)
    config = PPOConfig.from_dict({"model": {**LSTM, **model}, "seed": 0})
    fast = TorchPolicy(obs_space, action_space, config, loss_fn=no_loss)
    slow = torch_only(TorchPolicy(obs_space, action_space, config, loss_fn=no_loss))
    slow.set_weights(fast.get_weights())
    assert isinstance(fast._numpy_twin(), NumpyRecurrentActorCritic)
    rng = np.random.default_rng(0)
    state: list[np.ndarray] | None = None  # the initial state first, then the state each step moved to
    prev_actions = np.stack([action_space.sample() for _ in range(5)])
    prev_rewards = rng.normal(size=5).astype(np.float32)
    for _ in range(6):  # the state threads through steps: differences would grow
        obs = rng.uniform(-1, 1, (5, 3)).astype(np.float32)
        inputs = {"state": state, "prev_actions": prev_actions, "prev_rewards": prev_rewards}
        a_fast, x_fast = fast.compute_actions(obs, explore=False, **inputs)
        a_slow, x_slow = slow.compute_actions(obs, explore=False, **inputs)
        np.testing.assert_allclose(a_fast, a_slow, rtol=1e-5, atol=1e-5)
        keys = [k for k in x_slow if k != SampleBatch.ACTION_LOGP or isinstance(action_space, gym.spaces.Discrete)]
        assert set(x_fast) == set(x_slow) and len(keys) >= 5  # logits, values, logp and the state's [h, c]
        for key in keys:
            np.testing.assert_allclose(x_fast[key], x_slow[key], rtol=1e-4, atol=1e-5, err_msg=key)
        np.testing.assert_allclose(fast.value(obs, **inputs), slow.value(obs, **inputs), rtol=1e-4, atol=1e-5)
        state = [x_fast[f"{SampleBatch.STATE_OUT}{k}"] for k in range(len(fast.get_initial_state()))]
        prev_actions, prev_rewards = a_fast, rng.normal(size=5).astype(np.float32)


def test_recurrent_numpy_twin_follows_weight_updates_and_leaves_cnns_to_torch() -> None:
    space = gym.spaces.Box(-1, 1, (3,), np.float32)
    config = PPOConfig.from_dict({"model": LSTM, "seed": 0})
    policy = TorchPolicy(space, gym.spaces.Discrete(2), config, loss_fn=no_loss)
    obs = np.ones((2, 3), np.float32)
    before = policy.value(obs)
    with torch.no_grad():
        for p in policy.model.parameters():
            p.add_(0.1)
    assert policy._numpy_twin() is not None and not np.allclose(before, policy.value(obs))
    frames = gym.spaces.Box(0, 255, (42, 42, 4), np.uint8)
    cnn = TorchPolicy(frames, gym.spaces.Discrete(2), config, loss_fn=no_loss)
    assert NumpyRecurrentActorCritic.build(cnn.model, frames) is None and cnn._numpy_twin() is None
    actions, extra = cnn.compute_actions(np.zeros((3, 42, 42, 4), np.uint8))
    assert actions.shape == (3,) and extra[f"{SampleBatch.STATE_OUT}0"].shape == (3, 16)


def test_a_recurrent_step_too_big_for_one_blas_thread_runs_in_torch() -> None:
    space = gym.spaces.Box(-1, 1, (3,), np.float32)
    config = PPOConfig.from_dict({"model": {**LSTM, "lstm_cell_size": 128}, "seed": 0})
    fast = TorchPolicy(space, gym.spaces.Discrete(2), config, loss_fn=no_loss)
    slow = torch_only(TorchPolicy(space, gym.spaces.Discrete(2), config, loss_fn=no_loss))
    slow.set_weights(fast.get_weights())
    twin = fast._numpy_twin()
    assert isinstance(twin, NumpyRecurrentActorCritic)
    assert twin.max_rows == SINGLE_THREAD_PRODUCT // (4 * 128 * 128)  # the largest weight: the LSTM's w_hh
    for rows in (twin.max_rows, twin.max_rows + 1):  # in NumPy, then in PyTorch
        obs = np.random.default_rng(rows).uniform(-1, 1, (rows, 3)).astype(np.float32)
        assert (twin.step(obs, None, None, None) is None) == (rows > twin.max_rows)
        assert (twin.value(obs, None, None, None) is None) == (rows > twin.max_rows)
        _, x_fast = fast.compute_actions(obs, explore=False)
        _, x_slow = slow.compute_actions(obs, explore=False)
        for key in (SampleBatch.ACTION_DIST_INPUTS, SampleBatch.VF_PREDS, f"{SampleBatch.STATE_OUT}1"):
            np.testing.assert_allclose(x_fast[key], x_slow[key], rtol=1e-4, atol=1e-5, err_msg=key)
        np.testing.assert_allclose(fast.value(obs), slow.value(obs), rtol=1e-4, atol=1e-5)
