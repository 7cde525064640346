"""A custom model that is recurrent itself (declares get_initial_state): checked when built, carried by the
policy as use_lstm's model is, trained by PPO from sequences, and loaded and exported with its state."""

from __future__ import annotations

import json
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
from flowrl.algorithms.ppo import PPOConfig
from flowrl.data import SampleBatch
from flowrl.engine.build import policy_specs
from flowrl.envs import get_env_creator
from flowrl.errors import ConfigError
from flowrl.policy import TorchPolicy
from flowrl.serve.export import export_policy

pytestmark = [
    pytest.mark.unit,
    pytest.mark.timeout(300),
    pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:DeprecationWarning"),
]


class TinyGRU(nn.Module):
    """A GRU actor-critic over ``[B, T]`` sequences; its state is the GRU's hidden state."""

    def __init__(self, obs_space: gym.Space, action_space: gym.Space, num_outputs: int, hidden: int = 16) -> None:
        super().__init__()
        self.hidden = hidden
        self.gru = nn.GRU(flatdim(obs_space), hidden, batch_first=True)
        self.logits = nn.Linear(hidden, num_outputs)
        self.value = nn.Linear(hidden, 1)

    def get_initial_state(self) -> list[torch.Tensor]:
        return [torch.zeros(self.hidden)]

    def forward(
        self, obs: torch.Tensor, state: list[torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        out, h = self.gru(obs, state[0].unsqueeze(0))
        return self.logits(out), self.value(out).squeeze(-1), [h.squeeze(0)]


class ForgetsTheTimeAxis(TinyGRU):
    def forward(
        self, obs: torch.Tensor, state: list[torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        logits, values, h = super().forward(obs, state)
        return logits[:, -1], values, h


def build(algo: str, model: dict[str, Any], num_workers: int = 0) -> Any:
    algorithm = get_algorithm(algo)
    config = algorithm.config_class.from_dict({"num_workers": num_workers, "seed": 0, "model": model}).frozen()
    [spec] = policy_specs(algorithm, config, get_env_creator("StatelessCartPole-v1")).values()
    return spec.build()


def test_a_recurrent_custom_model_makes_a_recurrent_policy() -> None:
    policy = build("ppo", {"custom_model": TinyGRU, "custom_model_config": {"hidden": 8}})
    assert isinstance(policy, TorchPolicy) and policy.is_recurrent
    [initial] = policy.get_initial_state()
    assert initial.shape == (8,) and not initial.any()
    obs = np.zeros((5, 2), np.float32)
    _, extra = policy.compute_actions(obs, state=[np.ones((5, 8), np.float32)])
    assert extra[f"{SampleBatch.STATE_OUT}0"].shape == (5, 8)
    _, from_initial = policy.compute_actions(obs)
    assert not np.allclose(extra[SampleBatch.ACTION_DIST_INPUTS], from_initial[SampleBatch.ACTION_DIST_INPUTS])


@pytest.mark.parametrize(
    ("algo", "model", "expected"),
    [
        ("ppo", {"custom_model": ForgetsTheTimeAxis}, r"its dist_inputs are \[2, 2\], not \[2, 3, 2\]"),
        ("ppo", {"custom_model": TinyGRU, "use_lstm": True}, "wraps only a feed-forward model in an LSTM"),
        ("dqn", {"custom_model": TinyGRU}, r"custom_model='TinyGRU' is recurrent: DQNConfig does not learn from"),
    ],
)
def test_recurrent_custom_models_that_cannot_be_used_are_config_errors(
    algo: str, model: dict[str, Any], expected: str
) -> None:
    with pytest.raises(ConfigError, match=expected):
        build(algo, model)


def test_a_recurrent_custom_model_is_refused_only_by_algorithms_that_do_not_learn_from_sequences() -> None:
    PPOConfig.from_dict(
        {"model": {"custom_model": TinyGRU}, "evaluation_interval": 1, "policies": {"a": None}, "num_learners": 2}
    )
    get_algorithm("impala").config_class.from_dict({"model": {"custom_model": TinyGRU}})
    with pytest.raises(ConfigError, match="is recurrent: DQNConfig does not learn from sequences"):
        get_algorithm("dqn").config_class.from_dict({"model": {"custom_model": TinyGRU}})


def test_ppo_trains_a_recurrent_custom_model_and_exports_it_with_its_state(ray_session: None, tmp_path: Path) -> None:
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
            "evaluation_interval": 1,
            "evaluation_num_episodes": 2,
            "model": {"custom_model": TinyGRU, "custom_model_config": {"hidden": 16}, "max_seq_len": 8},
        },
    )
    try:
        policy = trainer.workers.local_worker().get_policy()
        before = {k: v.copy() for k, v in policy.get_weights().items()}
        for _ in range(3):
            result = trainer.train()
        stats = result["info"]["learner"]["default_policy"]
        assert result["timesteps_total"] == 768 and np.isfinite([stats["policy_loss"], stats["vf_loss"]]).all()
        assert result["evaluation"]["episodes"] == 2 and result["evaluation"]["episode_len_mean"] > 0
        assert any(not np.array_equal(before[k], v) for k, v in policy.get_weights().items())
        batch = trainer.workers.local_worker().sample()
        assert batch[SampleBatch.SEQ_LENS].max() <= 8 and batch[SampleBatch.SEQ_LENS].sum() == batch.count
        path = trainer.save(tmp_path / "checkpoints")
    finally:
        trainer.stop()
    loaded = flowrl.load_policy(path, allow_imports=[__name__])  # the model class is this module's
    obs = np.random.default_rng(0).uniform(-1, 1, (6, 2)).astype(np.float32)
    state = [np.random.default_rng(1).normal(size=(6, 16)).astype(np.float32)]
    expected, extra = policy.compute_actions(obs, explore=False, state=state)
    actions, next_state = loaded.compute_actions(obs, state=state)
    np.testing.assert_array_equal(actions, expected)
    np.testing.assert_allclose(next_state[0], extra[f"{SampleBatch.STATE_OUT}0"], rtol=1e-6)
    model_file = export_policy(path, format="torchscript", out=tmp_path / "export", allow_imports=[__name__])
    description = json.loads(model_file.with_name(model_file.name + ".json").read_text())
    assert [spec["name"] for spec in description["recurrent_inputs"]] == ["state_in_0"]
    with torch.no_grad():
        out = torch.jit.load(str(model_file))(torch.from_numpy(obs), torch.from_numpy(state[0]))
    np.testing.assert_array_equal(out[0].numpy(), expected)
    np.testing.assert_allclose(out[-1].numpy(), next_state[0], rtol=1e-5, atol=1e-6)


def test_impala_learns_from_a_recurrent_custom_models_sequences() -> None:
    """V-trace runs the custom model over each sequence from its state_in, bootstrapping from the state after it."""
    policy = build("impala", {"custom_model": TinyGRU}, num_workers=1)
    n = policy.config.rollout_fragment_length
    rng = np.random.default_rng(0)
    batch = SampleBatch(
        {
            SampleBatch.OBS: rng.uniform(-1, 1, (n, 2)).astype(np.float32),
            SampleBatch.NEW_OBS: rng.uniform(-1, 1, (n, 2)).astype(np.float32),
            SampleBatch.ACTIONS: rng.integers(0, 2, n),
            SampleBatch.REWARDS: np.ones(n, np.float32),
            SampleBatch.TERMINATEDS: np.arange(n) == 9,
            SampleBatch.TRUNCATEDS: np.zeros(n, bool),
            SampleBatch.ACTION_LOGP: np.full(n, np.log(0.5), np.float32),
            f"{SampleBatch.STATE_IN}0": rng.normal(size=(2, 16)).astype(np.float32),
            SampleBatch.SEQ_LENS: np.array([10, n - 10], np.int32),
        }
    )
    before = policy.get_weights()
    stats = policy.learn(batch).stats
    assert np.isfinite(stats["policy_loss"]) and np.isfinite(stats["vf_loss"])
    assert any(not np.array_equal(before[k], v) for k, v in policy.get_weights().items())
