"""``use_lstm`` around a feed-forward custom model: the custom model is each branch's step encoder (its first
output, built with ``num_outputs = lstm_cell_size``, is the step's features), acting step by step equals the
pass over sequences, what cannot be wrapped is a ConfigError, and PPO trains it on StatelessCartPole-v1."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.spaces.utils import flatdim
from torch import nn

import flowrl
from flowrl import Trainer
from flowrl.algorithms import get_algorithm
from flowrl.data import SampleBatch
from flowrl.engine.build import policy_specs
from flowrl.envs import get_env_creator
from flowrl.errors import ConfigError
from flowrl.policy import TorchPolicy
from flowrl.policy.custom_model import Q_VALUES, build_custom_model
from flowrl.policy.model_options import model_config
from flowrl.policy.recurrent import FirstOutput, RecurrentActorCritic
from flowrl.serve.export import export_policy

pytestmark = [
    pytest.mark.unit,
    pytest.mark.timeout(300),
    pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:DeprecationWarning"),
]

CELL = 8


class TinyActorCritic(nn.Module):
    """A feed-forward actor-critic: ``forward(obs) -> (outputs [B, num_outputs], values [B])``."""

    def __init__(self, obs_space: gym.Space, action_space: gym.Space, num_outputs: int, hidden: int = 16) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(flatdim(obs_space), hidden), nn.Tanh())
        self.out = nn.Linear(hidden, num_outputs)
        self.value = nn.Linear(hidden, 1)
        self.built_with = num_outputs

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features = self.body(obs)
        return torch.tanh(self.out(features)), self.value(features).squeeze(-1)


class LogitsOnly(TinyActorCritic):
    """The policy interface (PG): no values."""

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        return super().forward(obs)[0], None


class FixedWidth(TinyActorCritic):
    """Ignores ``num_outputs``: its first output is always 3 wide."""

    def __init__(self, obs_space: gym.Space, action_space: gym.Space, num_outputs: int) -> None:
        super().__init__(obs_space, action_space, 3)


class TinyGRU(nn.Module):
    """Recurrent itself: it declares its initial state."""

    def __init__(self, obs_space: gym.Space, action_space: gym.Space, num_outputs: int) -> None:
        super().__init__()
        self.gru = nn.GRU(flatdim(obs_space), 4, batch_first=True)

    def get_initial_state(self) -> list[torch.Tensor]:
        return [torch.zeros(4)]


class SeesTheDict(nn.Module):
    """Takes Dict observations as dicts of tensors (``custom_model_obs: structured``)."""

    def __init__(self, obs_space: gym.Space, action_space: gym.Space, num_outputs: int) -> None:
        super().__init__()
        self.net = nn.Linear(3 + 2, num_outputs + 1)

    def forward(self, obs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.net(torch.cat([obs["position"].flatten(1), obs["mode"]], dim=1))
        return out[:, :-1], out[:, -1]


def build(algo: str, model: dict[str, Any], obs_space: gym.Space | None = None) -> TorchPolicy[Any]:
    algorithm = get_algorithm(algo)
    options = {"use_lstm": True, "lstm_cell_size": CELL, "max_seq_len": 4, **model}
    config = algorithm.config_class.from_dict({"num_workers": 0, "seed": 0, "model": options}).frozen()
    if obs_space is None:
        [spec] = policy_specs(algorithm, config, get_env_creator("StatelessCartPole-v1")).values()
    else:
        spec = algorithm.make_policy(obs_space, gym.spaces.Discrete(2), config)
    policy = spec.build()
    assert isinstance(policy, TorchPolicy)
    return policy


def test_the_custom_model_is_each_branchs_step_encoder() -> None:
    policy = build("ppo", {"custom_model": TinyActorCritic, "custom_model_config": {"hidden": 12}})
    model = policy.model
    assert isinstance(model, RecurrentActorCritic) and policy.is_recurrent
    encoders = [model.branch.encoder, model.vf_branch.encoder]  # type: ignore[union-attr]
    assert all(isinstance(e, FirstOutput) and isinstance(e.module, TinyActorCritic) for e in encoders)
    # Built with num_outputs = lstm_cell_size; the value branch runs an instance of its own.
    assert [e.module.built_with for e in encoders] == [CELL, CELL]
    assert encoders[0].module is not encoders[1].module
    assert model.branch.lstm.input_size == CELL
    assert [s.shape for s in policy.get_initial_state()] == [(CELL,)] * 4
    shared = build("ppo", {"custom_model": TinyActorCritic, "vf_share_layers": True})
    assert shared.model.vf_branch is None and len(shared.get_initial_state()) == 2


@pytest.mark.parametrize("vf_share_layers", [False, True])
def test_acting_step_by_step_equals_the_pass_over_sequences(vf_share_layers: bool) -> None:
    policy = build(
        "ppo",
        {
            "custom_model": TinyActorCritic,
            "lstm_use_prev_action": True,
            "lstm_use_prev_reward": True,
            "vf_share_layers": vf_share_layers,
        },
    )
    B, T = 3, 5
    rng = np.random.default_rng(0)
    obs = rng.uniform(-1, 1, (B, T, 2)).astype(np.float32)
    prev_actions = rng.integers(0, 2, (B, T))
    prev_rewards = rng.normal(size=(B, T)).astype(np.float32)
    state = [np.repeat(s[None], B, axis=0) for s in policy.get_initial_state()]
    stepped_inputs, stepped_values = [], []
    for t in range(T):
        _, extra = policy.compute_actions(
            obs[:, t], explore=False, state=state, prev_actions=prev_actions[:, t], prev_rewards=prev_rewards[:, t]
        )
        stepped_inputs.append(extra[SampleBatch.ACTION_DIST_INPUTS])
        stepped_values.append(extra[SampleBatch.VF_PREDS])
        state = [extra[f"{SampleBatch.STATE_OUT}{k}"] for k in range(len(state))]
    initial = [torch.as_tensor(np.repeat(s[None], B, axis=0)) for s in policy.get_initial_state()]
    with torch.no_grad():
        dist_inputs, values, state_out = policy.model.forward_sequences(
            torch.as_tensor(obs), initial, torch.as_tensor(prev_actions), torch.as_tensor(prev_rewards)
        )
    np.testing.assert_allclose(np.stack(stepped_inputs, 1), dist_inputs.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.stack(stepped_values, 1), values.numpy(), rtol=1e-5, atol=1e-6)
    for got, want in zip(state, state_out):
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-6)
    # The previous action and reward reach the LSTM: other ones give other outputs.
    _, other = policy.compute_actions(
        obs[:, 0], state=state, prev_actions=1 - prev_actions[:, 0], prev_rewards=prev_rewards[:, 0] + 1
    )
    _, same = policy.compute_actions(
        obs[:, 0], state=state, prev_actions=prev_actions[:, 0], prev_rewards=prev_rewards[:, 0]
    )
    assert not np.allclose(other[SampleBatch.ACTION_DIST_INPUTS], same[SampleBatch.ACTION_DIST_INPUTS])


def test_a_policy_interface_model_and_structured_observations_are_wrapped() -> None:
    pg = build("pg", {"custom_model": LogitsOnly})
    assert isinstance(pg.model, RecurrentActorCritic) and isinstance(pg.model.branch.encoder.module, LogitsOnly)
    assert pg.compute_actions(np.zeros((2, 2), np.float32))[0].shape == (2,)
    space = gym.spaces.Dict({"position": gym.spaces.Box(-1, 1, (3, 1), np.float32), "mode": gym.spaces.Discrete(2)})
    structured = build("ppo", {"custom_model": SeesTheDict, "custom_model_obs": "structured"}, obs_space=space)
    assert structured.is_recurrent
    action = structured.compute_single_action({"mode": 1, "position": np.zeros((3, 1), np.float32)})
    assert action in (0, 1)


@pytest.mark.parametrize(
    ("algo", "model", "expected"),
    [
        ("ppo", {"custom_model": TinyGRU}, r"TinyGRU.* is recurrent \(it has get_initial_state\), and model.use_lstm"),
        ("ppo", {"custom_model": FixedWidth}, r"built with num_outputs=lstm_cell_size=8, does not implement the actor"),
        ("ppo", {"custom_model": TinyActorCritic, "use_lstm": False, "lstm_use_prev_action": True}, "use_lstm=True"),
        ("dqn", {"custom_model": TinyActorCritic}, "model.use_lstm=True: DQNConfig does not learn from sequences"),
    ],
)
def test_what_cannot_be_wrapped_is_a_config_error(algo: str, model: dict[str, Any], expected: str) -> None:
    with pytest.raises(ConfigError, match=expected):
        build(algo, model)


def test_a_q_values_model_is_not_wrapped() -> None:
    options = model_config({"custom_model": TinyActorCritic, "use_lstm": True})
    space = gym.spaces.Box(-1, 1, (2,), np.float32)
    with pytest.raises(ConfigError, match="Q-values models are not wrapped in an LSTM"):
        build_custom_model(Q_VALUES, space, gym.spaces.Discrete(2), 2, options)


def test_ppo_trains_a_wrapped_custom_model_on_stateless_cartpole(ray_session: None, tmp_path: Path) -> None:
    trainer = Trainer(
        "ppo",
        "StatelessCartPole-v1",
        {
            "num_workers": 0,
            "num_envs_per_worker": 4,
            "rollout_fragment_length": 64,
            "train_batch_size": 256,
            "sgd_minibatch_size": 64,
            "num_sgd_iter": 2,
            "seed": 0,
            "model": {
                "custom_model": TinyActorCritic,
                "use_lstm": True,
                "lstm_cell_size": 16,
                "max_seq_len": 8,
                "lstm_use_prev_action": True,
            },
        },
    )
    try:
        policy = trainer.workers.local_worker().get_policy()
        assert isinstance(policy, TorchPolicy) and isinstance(policy.model, RecurrentActorCritic)
        before = {k: v.copy() for k, v in policy.get_weights().items()}
        for _ in range(3):
            result = trainer.train()
        stats = result["info"]["learner"]["default_policy"]
        assert result["timesteps_total"] == 768 and np.isfinite([stats["policy_loss"], stats["vf_loss"]]).all()
        changed = {k for k, v in policy.get_weights().items() if not np.array_equal(before[k], v)}
        # The custom model's first output feeds the LSTM, so its layers learn; its value layer is not used.
        assert any(k.startswith("branch.encoder.module.body") for k in changed)
        assert not any(".module.value." in k for k in changed)
        batch = trainer.workers.local_worker().sample()
        assert batch[SampleBatch.SEQ_LENS].max() <= 8 and batch[SampleBatch.SEQ_LENS].sum() == batch.count
        assert batch[f"{SampleBatch.STATE_IN}3"].shape == (len(batch[SampleBatch.SEQ_LENS]), 16)
        path = trainer.save(tmp_path / "checkpoints")
    finally:
        trainer.stop()
    # Loaded and exported with its state and previous actions, it acts as the trained policy does.
    loaded = flowrl.load_policy(path, allow_imports=[__name__])  # the model class is this module's
    rng = np.random.default_rng(0)
    obs = rng.uniform(-1, 1, (6, 2)).astype(np.float32)
    state = [rng.normal(size=(6, 16)).astype(np.float32) for _ in range(4)]
    prev_actions = rng.integers(0, 2, 6)
    expected, extra = policy.compute_actions(obs, explore=False, state=state, prev_actions=prev_actions)
    actions, next_state = loaded.compute_actions(obs, state=state, prev_actions=prev_actions)
    np.testing.assert_array_equal(actions, expected)
    np.testing.assert_allclose(next_state[3], extra[f"{SampleBatch.STATE_OUT}3"], rtol=1e-6)
    model_file = export_policy(path, format="torchscript", out=tmp_path / "export", allow_imports=[__name__])
    with torch.no_grad():
        out = torch.jit.load(str(model_file))(
            torch.from_numpy(obs), *(torch.from_numpy(s) for s in state), torch.from_numpy(prev_actions)
        )
    np.testing.assert_array_equal(out[0].numpy(), expected)
