"""Models, TorchPolicy (acting, learning, weights, state) and exploration strategies."""

from __future__ import annotations

import copy
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn

from flowrl.config import TrainerConfig
from flowrl.data import SampleBatch
from flowrl.errors import FlowRLError
from flowrl.policy import (
    ActorCriticModel,
    Categorical,
    CNNEncoder,
    DiagGaussian,
    EpsilonGreedy,
    GaussianNoise,
    LinearSchedule,
    MLPEncoder,
    PolicySpec,
    StochasticSampling,
    TorchPolicy,
    model_config,
)
from flowrl.policy.distributions import Deterministic
from flowrl.policy.exploration import make_exploration
from flowrl.policy.model_options import DEFAULT_MODEL_CONFIG
from flowrl.policy.models import obs_to_tensor

pytestmark = pytest.mark.unit

CARTPOLE_OBS = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
CARTPOLE_ACT = gym.spaces.Discrete(2)
PENDULUM_OBS = gym.spaces.Box(np.array([-1.0, -1.0, -8.0], np.float32), np.array([1.0, 1.0, 8.0], np.float32))
PENDULUM_ACT = gym.spaces.Box(-2.0, 2.0, (1,), np.float32)
ATARI_OBS = gym.spaces.Box(0, 255, (84, 84, 4), np.uint8)
GRID_OBS = gym.spaces.Discrete(5)

SMALL_MODEL = {"fcnet_hiddens": [16, 16]}


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


TensorBatch = dict[str, torch.Tensor]


def bc_loss(policy: TorchPolicy, model: nn.Module, dist_class: type, batch: TensorBatch) -> tuple[torch.Tensor, dict]:
    """Behaviour cloning: maximise the log-likelihood of the batch's actions."""
    dist_inputs, _ = model(batch[SampleBatch.OBS])
    loss = -dist_class(dist_inputs).logp(batch[SampleBatch.ACTIONS]).mean()
    return loss, {"loss": float(loss.detach())}


def value_loss(
    policy: TorchPolicy, model: nn.Module, dist_class: type, batch: TensorBatch
) -> tuple[torch.Tensor, dict]:
    """Regress the value head alone onto the rewards."""
    _, values = model(batch[SampleBatch.OBS])
    loss = ((values - batch[SampleBatch.REWARDS]) ** 2).mean()
    return loss, {"vf_loss": float(loss.detach())}


def sgd(policy: TorchPolicy) -> torch.optim.Optimizer:
    return torch.optim.SGD(policy.model.parameters(), lr=policy.config.lr)


def make_policy(
    obs_space: gym.Space = CARTPOLE_OBS,
    action_space: gym.Space = CARTPOLE_ACT,
    config: dict[str, Any] | None = None,
    **kwargs: Any,
) -> TorchPolicy:
    cfg = {"model": SMALL_MODEL, **(config or {})}
    kwargs.setdefault("loss_fn", bc_loss)
    return TorchPolicy(obs_space, action_space, TrainerConfig.from_dict(cfg), **kwargs)


def bc_batch(n: int = 64, seed: int = 0) -> SampleBatch:
    rng = np.random.default_rng(seed)
    obs = rng.standard_normal((n, 4)).astype(np.float32)
    return SampleBatch(obs=obs, actions=(obs[:, 0] > 0).astype(np.int64), rewards=obs[:, 1].copy())


def weights_equal(a: dict[str, np.ndarray], b: dict[str, np.ndarray], exact: bool = True) -> bool:
    assert a.keys() == b.keys()
    if exact:
        return all(np.array_equal(a[k], b[k]) for k in a)
    return all(np.allclose(a[k], b[k], rtol=1e-6, atol=1e-7) for k in a)


def bc_eval_loss(policy: TorchPolicy, batch: SampleBatch) -> float:
    with torch.no_grad():
        loss, _ = bc_loss(policy, policy.model, policy.dist_class, policy.to_tensors(batch))
    return float(loss)


# -- compute_actions --------------------------------------------------------------------


def test_compute_actions_discrete_cartpole() -> None:
    p = make_policy()
    obs = np.random.default_rng(0).standard_normal((7, 4)).astype(np.float32)
    actions, extra = p.compute_actions(obs)
    assert actions.shape == (7,)
    assert actions.dtype.kind == "i"
    assert set(actions.tolist()) <= {0, 1}
    assert set(extra) == {SampleBatch.ACTION_LOGP, SampleBatch.ACTION_DIST_INPUTS, SampleBatch.VF_PREDS}
    assert extra[SampleBatch.ACTION_LOGP].shape == (7,)
    assert extra[SampleBatch.ACTION_DIST_INPUTS].shape == (7, 2)
    assert extra[SampleBatch.VF_PREDS].shape == (7,)
    assert all(isinstance(v, np.ndarray) for v in extra.values())
    # The reported log-probability is that of the returned action under the returned inputs.
    expected = Categorical(torch.as_tensor(extra[SampleBatch.ACTION_DIST_INPUTS])).logp(torch.as_tensor(actions))
    np.testing.assert_allclose(extra[SampleBatch.ACTION_LOGP], expected.numpy(), rtol=1e-5)
    np.testing.assert_allclose(extra[SampleBatch.VF_PREDS], p.value(obs), rtol=1e-5)
    # Small initial policy outputs: roughly uniform.
    assert np.all(np.abs(extra[SampleBatch.ACTION_LOGP] - np.log(0.5)) < 0.1)


def test_compute_actions_box_pendulum() -> None:
    p = make_policy(PENDULUM_OBS, PENDULUM_ACT)
    assert p.dist_class is DiagGaussian
    obs = np.random.default_rng(0).uniform(-1, 1, (5, 3)).astype(np.float32)
    actions, extra = p.compute_actions(obs)
    assert actions.shape == (5, 1)
    assert actions.dtype == np.float32
    assert extra[SampleBatch.ACTION_LOGP].shape == (5,)
    assert extra[SampleBatch.ACTION_DIST_INPUTS].shape == (5, 2)
    assert extra[SampleBatch.VF_PREDS].shape == (5,)
    expected = DiagGaussian(torch.as_tensor(extra[SampleBatch.ACTION_DIST_INPUTS])).logp(torch.as_tensor(actions))
    np.testing.assert_allclose(extra[SampleBatch.ACTION_LOGP], expected.numpy(), rtol=1e-5)


def test_compute_actions_image_observations_use_cnn() -> None:
    p = make_policy(ATARI_OBS, gym.spaces.Discrete(6))
    assert isinstance(p.model.encoder, CNNEncoder)
    assert isinstance(p.model.vf_encoder, CNNEncoder)
    obs = np.random.default_rng(0).integers(0, 256, (3, 84, 84, 4), dtype=np.uint8)
    actions, extra = p.compute_actions(obs)
    assert actions.shape == (3,)
    assert set(actions.tolist()) <= set(range(6))
    assert extra[SampleBatch.ACTION_DIST_INPUTS].shape == (3, 6)
    assert extra[SampleBatch.VF_PREDS].shape == (3,)
    assert extra[SampleBatch.ACTION_LOGP].shape == (3,)
    # uint8 frames are scaled to [0, 1]: feeding the same frames as floats / 255 gives the same outputs.
    with torch.no_grad():
        as_uint8, _ = p.model(torch.as_tensor(obs))
        as_float, _ = p.model(torch.as_tensor(obs, dtype=torch.float32) / 255.0)
    torch.testing.assert_close(as_uint8, as_float)
    torch.testing.assert_close(as_uint8.numpy(), extra[SampleBatch.ACTION_DIST_INPUTS])


def test_compute_actions_discrete_observations_are_one_hot() -> None:
    p = make_policy(GRID_OBS, CARTPOLE_ACT)
    assert isinstance(p.model.encoder, MLPEncoder)
    assert p.model.encoder.net[0].in_features == 5
    obs = np.array([0, 3, 4, 3])
    actions, extra = p.compute_actions(obs, explore=False)
    assert actions.shape == (4,)
    assert extra[SampleBatch.ACTION_DIST_INPUTS].shape == (4, 2)
    vf = extra[SampleBatch.VF_PREDS]
    assert vf.shape == (4,)
    assert vf[1] == vf[3] and vf[0] != vf[1]
    one_hot = obs_to_tensor(obs, GRID_OBS, torch.device("cpu"))
    torch.testing.assert_close(one_hot, torch.eye(5)[[0, 3, 4, 3]])
    assert p.compute_single_action(3, explore=False) == actions[1]


def test_compute_single_action_box() -> None:
    p = make_policy(PENDULUM_OBS, PENDULUM_ACT)
    a = p.compute_single_action(np.zeros(3, np.float32), explore=False)
    assert a.shape == (1,)


@pytest.mark.parametrize(
    "spaces", [(CARTPOLE_OBS, CARTPOLE_ACT), (PENDULUM_OBS, PENDULUM_ACT)], ids=["discrete", "box"]
)
def test_explore_false_is_deterministic_and_greedy(spaces: tuple[gym.Space, gym.Space]) -> None:
    p = make_policy(*spaces)
    # Make the policy outputs non-trivial so "greedy" is meaningful.
    with torch.no_grad():
        p.model.policy_head.weight.normal_()
    obs = np.random.default_rng(1).uniform(-1, 1, (200, spaces[0].shape[0])).astype(np.float32)
    a1, e1 = p.compute_actions(obs, explore=False)
    a2, _ = p.compute_actions(obs, explore=False)
    np.testing.assert_array_equal(a1, a2)
    inputs = e1[SampleBatch.ACTION_DIST_INPUTS]
    if isinstance(spaces[1], gym.spaces.Discrete):
        np.testing.assert_array_equal(a1, inputs.argmax(-1))
    else:
        np.testing.assert_allclose(a1, inputs[:, :1])
    # Exploring actually samples.
    s1, _ = p.compute_actions(obs, explore=True)
    s2, _ = p.compute_actions(obs, explore=True)
    assert not np.array_equal(s1, s2)


def test_config_explore_false_is_the_default_for_compute_actions() -> None:
    p = make_policy(PENDULUM_OBS, PENDULUM_ACT, {"explore": False})
    obs = np.zeros((50, 3), np.float32)
    a1, _ = p.compute_actions(obs)
    a2, _ = p.compute_actions(obs)
    np.testing.assert_array_equal(a1, a2)
    a3, _ = p.compute_actions(obs, explore=True)
    assert not np.array_equal(a1, a3)


# -- models -----------------------------------------------------------------------------


def test_vf_share_layers_true_shares_the_encoder() -> None:
    p = make_policy(config={"model": {**SMALL_MODEL, "vf_share_layers": True}})
    assert p.model.vf_encoder is None
    # Training the value head alone moves the shared encoder, hence the policy outputs.
    p2 = make_policy(config={"model": {**SMALL_MODEL, "vf_share_layers": True}, "lr": 0.05}, loss_fn=value_loss)
    obs = bc_batch()["obs"]
    before = p2.compute_actions(obs, explore=False)[1][SampleBatch.ACTION_DIST_INPUTS]
    for _ in range(3):
        p2.learn_on_batch(bc_batch())
    after = p2.compute_actions(obs, explore=False)[1][SampleBatch.ACTION_DIST_INPUTS]
    assert not np.allclose(before, after)


def test_vf_share_layers_false_builds_a_separate_value_encoder() -> None:
    p = make_policy(config={"model": {**SMALL_MODEL, "vf_share_layers": False}, "lr": 0.05}, loss_fn=value_loss)
    assert isinstance(p.model.vf_encoder, MLPEncoder)
    assert p.model.vf_encoder is not p.model.encoder
    enc = {id(t) for t in p.model.encoder.parameters()}
    assert enc.isdisjoint(id(t) for t in p.model.vf_encoder.parameters())
    assert any(k.startswith("vf_encoder.") for k in p.get_weights())
    # A value-only loss leaves the policy outputs untouched.
    obs = bc_batch()["obs"]
    before = p.compute_actions(obs, explore=False)[1][SampleBatch.ACTION_DIST_INPUTS]
    vf_before = p.value(obs)
    for _ in range(3):
        p.learn_on_batch(bc_batch())
    after = p.compute_actions(obs, explore=False)[1][SampleBatch.ACTION_DIST_INPUTS]
    np.testing.assert_array_equal(before, after)
    assert not np.allclose(vf_before, p.value(obs))


def test_default_model_is_separate_vf() -> None:
    assert DEFAULT_MODEL_CONFIG["vf_share_layers"] is False
    assert make_policy().model.vf_encoder is not None


def test_model_config_overrides_layer_sizes() -> None:
    p = make_policy(config={"model": {"fcnet_hiddens": [8, 5], "fcnet_activation": "relu"}})
    linears = [m for m in p.model.encoder.net if isinstance(m, nn.Linear)]
    assert [(layer.in_features, layer.out_features) for layer in linears] == [(4, 8), (8, 5)]
    assert any(isinstance(m, nn.ReLU) for m in p.model.encoder.net)
    assert p.model.policy_head.in_features == 5


def test_model_config_rejects_unknown_keys_naming_valid_ones() -> None:
    with pytest.raises(FlowRLError) as info:
        model_config({"fcnet_hidden": [32], "fcnet_hiddens": [32]})
    msg = str(info.value)
    assert "fcnet_hidden" in msg
    for key in DEFAULT_MODEL_CONFIG:
        assert key in msg
    config = TrainerConfig()
    config.model["layers"] = [3]  # changed in place after validation: the policy still checks it
    with pytest.raises(FlowRLError, match="conv_filters"):
        TorchPolicy(CARTPOLE_OBS, CARTPOLE_ACT, config, loss_fn=bc_loss)


def test_model_config_rejects_unknown_activation() -> None:
    with pytest.raises(FlowRLError, match="fcnet_activation.*sigmoidal"):
        model_config({"fcnet_activation": "sigmoidal"})


def test_model_config_defaults_are_not_shared_mutably() -> None:
    cfg = model_config()
    assert cfg == DEFAULT_MODEL_CONFIG
    cfg["fcnet_activation"] = "relu"
    assert DEFAULT_MODEL_CONFIG["fcnet_activation"] == "tanh"


def test_actor_critic_forward_shapes() -> None:
    m = ActorCriticModel(PENDULUM_OBS, 2, model_config(SMALL_MODEL))
    out, v = m(torch.zeros(6, 3))
    assert out.shape == (6, 2) and v.shape == (6,)
    policy_only = ActorCriticModel(PENDULUM_OBS, 2, model_config(SMALL_MODEL), value_head=False)
    out, v = policy_only(torch.zeros(6, 3))
    assert out.shape == (6, 2) and v is None


# -- learning ---------------------------------------------------------------------------


def test_learn_on_batch_reduces_behaviour_cloning_loss() -> None:
    p = make_policy(config={"lr": 0.02})
    batch = bc_batch()
    first = bc_eval_loss(p, batch)
    stats = [p.learn_on_batch(batch) for _ in range(20)]
    last = bc_eval_loss(p, batch)
    assert stats[0]["loss"] == pytest.approx(first, rel=1e-5)
    assert last < 0.6 * first
    assert stats[-1]["loss"] < stats[0]["loss"]


def test_learn_on_batch_with_box_actions_reduces_loss() -> None:
    rng = np.random.default_rng(0)
    obs = rng.uniform(-1, 1, (64, 3)).astype(np.float32)
    batch = SampleBatch(obs=obs, actions=obs[:, :1] * 2.0)
    p = make_policy(PENDULUM_OBS, PENDULUM_ACT, {"lr": 0.02})
    first = bc_eval_loss(p, batch)
    for _ in range(20):
        p.learn_on_batch(batch)
    assert bc_eval_loss(p, batch) < first - 0.3


def test_compute_then_apply_gradients_elsewhere_equals_learn_on_batch() -> None:
    learner = make_policy(config={"lr": 0.1}, make_optimizer=sgd)
    worker = make_policy(config={"lr": 0.1}, make_optimizer=sgd)
    applier = make_policy(config={"lr": 0.1}, make_optimizer=sgd)
    init = learner.get_weights()
    worker.set_weights(init)
    applier.set_weights(init)
    assert not weights_equal(init, make_policy().get_weights())  # the copies really differ from a fresh policy
    for step in range(3):
        batch = bc_batch(seed=step)
        before = worker.get_weights()
        grads, stats = worker.compute_gradients(batch)
        assert weights_equal(before, worker.get_weights())  # computing does not apply
        assert len(grads) == len(list(worker.model.parameters()))
        assert all(isinstance(g, np.ndarray) for g in grads)
        assert "loss" in stats
        applier.apply_gradients(grads)
        learner.learn_on_batch(batch)
        worker.set_weights(applier.get_weights())
        assert weights_equal(applier.get_weights(), learner.get_weights(), exact=False)
    assert not weights_equal(applier.get_weights(), init)


def test_gradients_match_autograd_and_are_copies() -> None:
    p = make_policy()
    batch = bc_batch()
    grads, _ = p.compute_gradients(batch)
    p.model.zero_grad()
    loss, _ = bc_loss(p, p.model, p.dist_class, p.to_tensors(batch))
    loss.backward()
    for g, param in zip(grads, p.model.parameters()):
        expected = param.grad.numpy() if param.grad is not None else np.zeros(param.shape, np.float32)
        np.testing.assert_allclose(g, expected, rtol=1e-5, atol=1e-7)
    # The value head does not enter the BC loss: its gradient is reported as zeros, not dropped.
    names = [n for n, _ in p.model.named_parameters()]
    vf_idx = names.index("value_head.weight")
    np.testing.assert_array_equal(grads[vf_idx], 0.0)
    grads[0][...] = 1e6  # mutating a returned gradient must not touch the model's grad
    assert float(next(p.model.parameters()).grad.abs().max()) < 1e6


def test_apply_gradients_rejects_wrong_count() -> None:
    p = make_policy()
    grads, _ = p.compute_gradients(bc_batch())
    with pytest.raises(ValueError, match=f"{len(grads) - 1} gradients for {len(grads)} parameters"):
        p.apply_gradients(grads[:-1])


def test_grad_clip_bounds_the_gradient_norm() -> None:
    p = make_policy(config={"grad_clip": 1e-3})
    grads, stats = p.compute_gradients(bc_batch())
    assert stats["grad_gnorm"] > 1e-3  # the norm before clipping is reported
    total = float(np.sqrt(sum(float((g.astype(np.float64) ** 2).sum()) for g in grads)))
    assert total <= 1e-3 * 1.001


def test_to_tensors_preprocesses_obs_and_skips_non_numeric_columns() -> None:
    p = make_policy(GRID_OBS, CARTPOLE_ACT)
    batch = SampleBatch(
        obs=np.array([1, 2]),
        new_obs=np.array([2, 3]),
        actions=np.array([0, 1]),
        infos=np.array([{"a": 1}, {}], dtype=object),
        terminateds=np.array([False, True]),
    )
    t = p.to_tensors(batch)
    assert t["obs"].shape == (2, 5) and t["new_obs"].shape == (2, 5)
    assert "infos" not in t
    assert t["terminateds"].dtype == torch.bool


def test_learn_on_compressed_batch() -> None:
    p = make_policy(ATARI_OBS, gym.spaces.Discrete(3), {"model": {"conv_filters": [(4, 8, 4), (4, 4, 2)]}})
    rng = np.random.default_rng(0)
    batch = SampleBatch(obs=rng.integers(0, 256, (4, 84, 84, 4), dtype=np.uint8), actions=np.array([0, 1, 2, 0]))
    batch.compress()
    stats = p.learn_on_batch(batch)
    assert np.isfinite(stats["loss"])


# -- weights and state ------------------------------------------------------------------


def test_get_set_weights_round_trip() -> None:
    a, b = make_policy(), make_policy()
    w = a.get_weights()
    assert all(isinstance(v, np.ndarray) for v in w.values())
    assert set(w) == set(a.model.state_dict())
    assert not weights_equal(w, b.get_weights())
    b.set_weights(w)
    assert weights_equal(b.get_weights(), w)
    obs = bc_batch()["obs"]
    np.testing.assert_array_equal(
        a.compute_actions(obs, explore=False)[1][SampleBatch.ACTION_DIST_INPUTS],
        b.compute_actions(obs, explore=False)[1][SampleBatch.ACTION_DIST_INPUTS],
    )


def test_get_weights_returns_copies() -> None:
    p = make_policy(config={"lr": 0.05})
    w = p.get_weights()
    snapshot = copy.deepcopy(w)
    for _ in range(3):
        p.learn_on_batch(bc_batch())
    assert weights_equal(w, snapshot)  # training did not write into the returned arrays
    assert not weights_equal(p.get_weights(), snapshot)
    w2 = p.get_weights()
    for v in w2.values():
        v[...] = 0.0  # writing into returned arrays does not touch the model
    assert not weights_equal(p.get_weights(), w2)


def test_set_weights_does_not_alias_the_given_arrays() -> None:
    a, b = make_policy(), make_policy()
    w = a.get_weights()
    b.set_weights(w)
    for v in w.values():
        v[...] = 7.0
    assert not weights_equal(b.get_weights(), w)


EPS_CONFIG = {"type": "EpsilonGreedy", "initial_epsilon": 1.0, "final_epsilon": 0.05, "epsilon_timesteps": 1000}


def test_get_state_set_state_round_trip_into_fresh_policy() -> None:
    cfg = {"lr": 0.01, "exploration_config": EPS_CONFIG, "seed": 1}
    a = make_policy(config=cfg)
    for step in range(3):
        a.learn_on_batch(bc_batch(seed=step))
    a.on_global_var_update({"timestep": 400})
    a.coeffs["kl_coeff"] = 0.3
    obs = np.zeros((64, 4), np.float32)
    a.compute_actions(obs)  # advance the exploration rng
    state = pickle.loads(pickle.dumps(a.get_state()))  # as a checkpoint would
    a.coeffs["kl_coeff"] = 99.0  # later changes must not leak into the saved state
    assert state["coeffs"] == {"kl_coeff": 0.3}

    b = make_policy(config={**cfg, "seed": 2})
    b.set_state(state)
    a.coeffs["kl_coeff"] = 0.3
    assert weights_equal(a.get_weights(), b.get_weights())
    assert b.global_timestep == 400
    assert b.coeffs == {"kl_coeff": 0.3}
    assert b.exploration.last_timestep == a.exploration.last_timestep == 400
    # Optimizer state (Adam moments and step counts) restored.
    sa, sb = a.optimizer.state_dict(), b.optimizer.state_dict()
    assert sa["state"].keys() == sb["state"].keys() and sa["state"]
    for k in sa["state"]:
        for name, value in sa["state"][k].items():
            torch.testing.assert_close(sb["state"][k][name], value)
    # Exploration rng continues identically: same actions, then same weights after a step.
    for _ in range(3):
        np.testing.assert_array_equal(a.compute_actions(obs)[0], b.compute_actions(obs)[0])
    a.learn_on_batch(bc_batch(seed=9))
    b.learn_on_batch(bc_batch(seed=9))
    assert weights_equal(a.get_weights(), b.get_weights(), exact=False)


def test_set_state_restores_gaussian_noise_generator() -> None:
    cfg = {"exploration_config": {"type": "GaussianNoise", "stddev": 0.5}, "seed": 3}
    a = make_policy(PENDULUM_OBS, PENDULUM_ACT, cfg, dist_kind="deterministic")
    obs = np.zeros((16, 3), np.float32)
    a.compute_actions(obs)
    state = a.get_state()
    b = make_policy(PENDULUM_OBS, PENDULUM_ACT, {**cfg, "seed": 4}, dist_kind="deterministic")
    b.set_state(state)
    np.testing.assert_array_equal(a.compute_actions(obs)[0], b.compute_actions(obs)[0])


def test_get_state_is_a_snapshot_of_optimizer_state() -> None:
    a = make_policy(config={"lr": 0.01})
    ref = make_policy(config={"lr": 0.01})
    ref.set_weights(a.get_weights())
    for step in range(2):
        a.learn_on_batch(bc_batch(seed=step))
        ref.learn_on_batch(bc_batch(seed=step))
    state = a.get_state()
    for step in range(2, 5):  # keep training after the snapshot
        a.learn_on_batch(bc_batch(seed=step))
    a.set_state(state)
    assert weights_equal(a.get_weights(), ref.get_weights())
    a.learn_on_batch(bc_batch(seed=9))
    ref.learn_on_batch(bc_batch(seed=9))
    assert weights_equal(a.get_weights(), ref.get_weights(), exact=False)


def test_policy_spec_builds_with_overrides() -> None:
    config = TrainerConfig.from_dict({"model": SMALL_MODEL, "lr": 0.1})
    spec = PolicySpec(TorchPolicy, CARTPOLE_OBS, CARTPOLE_ACT, config, {"loss_fn": bc_loss})
    p = spec.build({"lr": 0.2})
    assert isinstance(p, TorchPolicy)
    assert p.config.lr == 0.2
    assert spec.config.lr == 0.1
    spec2 = pickle.loads(pickle.dumps(spec))
    assert spec2.build().config.lr == 0.1


# -- exploration ------------------------------------------------------------------------


def test_linear_schedule() -> None:
    s = LinearSchedule(1.0, 0.05, 1000)
    assert s.value(0) == 1.0
    assert s.value(-5) == 1.0
    assert s.value(500) == pytest.approx(0.525)
    assert s.value(1000) == pytest.approx(0.05)
    assert s.value(10**9) == pytest.approx(0.05)
    assert LinearSchedule(1.0, 0.1, 0).value(0) == 0.1


def non_greedy_fraction(p: TorchPolicy, timestep: int | None = None) -> float:
    obs = np.zeros((20_000, 4), np.float32)
    greedy, _ = p.compute_actions(obs[:1], explore=False)
    actions, extra = p.compute_actions(obs, timestep=timestep)
    np.testing.assert_array_equal(extra[SampleBatch.ACTION_LOGP], 0.0)
    return float(np.mean(actions != greedy[0]))


def test_on_global_var_update_drives_epsilon_schedule() -> None:
    p = make_policy(config={"exploration_config": EPS_CONFIG, "seed": 0})
    assert isinstance(p.exploration, EpsilonGreedy)
    assert p.global_timestep == 0
    # Two actions: a random action differs from the greedy one half of the time.
    for t, eps in [(0, 1.0), (500, 0.525), (1000, 0.05), (5000, 0.05)]:
        p.on_global_var_update({"timestep": t})
        assert p.global_timestep == t
        assert p.exploration.epsilon(p.global_timestep) == pytest.approx(eps)
        assert non_greedy_fraction(p) == pytest.approx(eps / 2, abs=0.015)
        assert p.exploration.last_timestep == t
    # An explicit timestep overrides the global one.
    assert non_greedy_fraction(p, timestep=0) == pytest.approx(0.5, abs=0.015)
    # explore=False is always greedy.
    p.on_global_var_update({"timestep": 0})
    actions, _ = p.compute_actions(np.zeros((500, 4), np.float32), explore=False)
    assert len(set(actions.tolist())) == 1


def test_epsilon_greedy_fixed_epsilon_overrides_schedule() -> None:
    e = EpsilonGreedy(gym.spaces.Discrete(4), epsilon=0.2, seed=0)
    assert e.epsilon(0) == 0.2 and e.epsilon(10**6) == 0.2
    dist = Categorical(torch.tensor([[0.0, 0.0, 5.0, 0.0]]).expand(20_000, 4))
    actions, logp = e.get_action(dist, timestep=0, explore=True)
    assert float((actions != 2).float().mean()) == pytest.approx(0.2 * 3 / 4, abs=0.015)
    assert set(actions.tolist()) == {0, 1, 2, 3}
    assert logp.shape == (20_000,)


def test_epsilon_greedy_seeded_rng_is_reproducible_and_state_round_trips() -> None:
    space = gym.spaces.Discrete(3)
    dist = Categorical(torch.zeros(50, 3))
    e1, e2 = EpsilonGreedy(space, seed=5), EpsilonGreedy(space, seed=5)
    a1, _ = e1.get_action(dist, timestep=0, explore=True)
    a2, _ = e2.get_action(dist, timestep=0, explore=True)
    torch.testing.assert_close(a1, a2)
    state = e1.get_state()
    next1, _ = e1.get_action(dist, timestep=7, explore=True)
    e3 = EpsilonGreedy(space, seed=99)
    e3.set_state(state)
    next3, _ = e3.get_action(dist, timestep=7, explore=True)
    torch.testing.assert_close(next1, next3)
    assert e3.last_timestep == 7


def test_epsilon_greedy_needs_discrete_actions() -> None:
    with pytest.raises(FlowRLError, match="Discrete"):
        EpsilonGreedy(PENDULUM_ACT)


class _ConstDist(Deterministic):
    pass


def test_gaussian_noise_clips_to_bounds() -> None:
    space = gym.spaces.Box(np.array([-2.0, 0.0], np.float32), np.array([2.0, 1.0], np.float32))
    e = GaussianNoise(space, stddev=5.0, seed=0)
    dist = _ConstDist(torch.tensor([[1.5, 0.5]]).expand(10_000, 2))
    actions, logp = e.get_action(dist, timestep=0, explore=True)
    assert actions.shape == (10_000, 2)
    assert logp.shape == (10_000,)
    low, high = torch.as_tensor(space.low), torch.as_tensor(space.high)
    assert bool((actions >= low).all()) and bool((actions <= high).all())
    # Large noise: many actions land exactly on each bound.
    assert float((actions[:, 0] == 2.0).float().mean()) > 0.3
    assert float((actions[:, 1] == 0.0).float().mean()) > 0.3
    # Without exploring the deterministic action is clipped too.
    far = _ConstDist(torch.tensor([[10.0, -10.0]]))
    torch.testing.assert_close(e.get_action(far, timestep=0, explore=False)[0], torch.tensor([[2.0, 0.0]]))


def test_gaussian_noise_scale_schedule() -> None:
    space = gym.spaces.Box(-100.0, 100.0, (1,), np.float32)
    e = GaussianNoise(space, stddev=1.0, initial_scale=2.0, final_scale=0.5, scale_timesteps=100, seed=0)
    dist = _ConstDist(torch.zeros(40_000, 1))
    assert float(e.get_action(dist, timestep=0, explore=True)[0].std()) == pytest.approx(2.0, rel=0.03)
    assert float(e.get_action(dist, timestep=50, explore=True)[0].std()) == pytest.approx(1.25, rel=0.03)
    assert float(e.get_action(dist, timestep=1000, explore=True)[0].std()) == pytest.approx(0.5, rel=0.03)


def test_gaussian_noise_uniform_during_random_timesteps() -> None:
    space = gym.spaces.Box(np.array([-2.0, 0.0], np.float32), np.array([2.0, 1.0], np.float32))
    e = GaussianNoise(space, stddev=0.01, random_timesteps=100, seed=0)
    dist = _ConstDist(torch.tensor([[1.9, 0.9]]).expand(40_000, 2))  # far from the middle
    actions, _ = e.get_action(dist, timestep=99, explore=True)
    a = actions.numpy()
    assert a.min(0).tolist() >= [-2.0, 0.0] and a.max(0).tolist() <= [2.0, 1.0]
    np.testing.assert_allclose(a.mean(0), [0.0, 0.5], atol=0.03)
    np.testing.assert_allclose(a.std(0), [4 / np.sqrt(12), 1 / np.sqrt(12)], rtol=0.03)
    hist, _ = np.histogram(a[:, 0], bins=4, range=(-2, 2))
    np.testing.assert_allclose(hist / len(a), 0.25, atol=0.02)
    # After the random phase: the deterministic action plus small noise.
    actions, _ = e.get_action(dist, timestep=100, explore=True)
    np.testing.assert_allclose(actions.numpy().mean(0), [1.9, 0.9], atol=0.01)


def test_gaussian_noise_in_a_policy_respects_bounds() -> None:
    p = make_policy(
        PENDULUM_OBS,
        PENDULUM_ACT,
        {"exploration_config": {"type": "GaussianNoise", "stddev": 3.0, "random_timesteps": 10}},
        dist_kind="deterministic",
    )
    assert isinstance(p.exploration, GaussianNoise)
    assert p.dist_class is Deterministic
    obs = np.zeros((2000, 3), np.float32)
    for t in (0, 50):
        actions, extra = p.compute_actions(obs, timestep=t)
        assert actions.shape == (2000, 1)
        assert actions.min() >= -2.0 and actions.max() <= 2.0
        assert extra[SampleBatch.ACTION_DIST_INPUTS].shape == (2000, 1)
    with torch.no_grad():
        p.model.policy_head.bias.fill_(50.0)
    actions, _ = p.compute_actions(obs, explore=False)
    np.testing.assert_array_equal(actions, 2.0)


def test_gaussian_noise_needs_box_actions() -> None:
    with pytest.raises(FlowRLError, match="Box"):
        GaussianNoise(CARTPOLE_ACT)


def test_default_exploration_is_stochastic_sampling() -> None:
    assert isinstance(make_policy().exploration, StochasticSampling)
    assert isinstance(make_exploration(CARTPOLE_ACT, None), StochasticSampling)
    assert isinstance(make_exploration(CARTPOLE_ACT, {"type": "StochasticSampling"}), StochasticSampling)


def test_unknown_exploration_type_raises_naming_valid_types() -> None:
    with pytest.raises(FlowRLError) as info:
        make_policy(config={"exploration_config": {"type": "Curiosity"}})
    msg = str(info.value)
    assert "Curiosity" in msg
    for name in ("EpsilonGreedy", "GaussianNoise", "StochasticSampling"):
        assert name in msg


def test_bad_exploration_options_raise_flowrl_error() -> None:
    with pytest.raises(FlowRLError, match="StochasticSampling"):
        make_exploration(CARTPOLE_ACT, {"type": "StochasticSampling", "epsilon": 0.1})
    with pytest.raises(FlowRLError, match="EpsilonGreedy"):
        make_exploration(CARTPOLE_ACT, {"type": "EpsilonGreedy", "epsilon_steps": 10})


@pytest.mark.parametrize("shape", [(84, 84, 4), (4, 84, 84), (84, 84)])
def test_image_frames_get_a_cnn_in_either_channel_layout(shape: tuple[int, ...]) -> None:
    space = gym.spaces.Box(0, 255, shape, np.uint8)
    p = TorchPolicy(space, gym.spaces.Discrete(6), TrainerConfig(), loss_fn=bc_loss)
    assert type(p.model.encoder).__name__ == "CNNEncoder"
    assert p.model.encoder.fc[0].in_features == 7 * 7 * 64
    actions, _ = p.compute_actions(np.zeros((2, *shape), np.uint8))
    assert actions.shape == (2,)


ACT_THEN_LEARN = """
import sys
import numpy as np
from flowrl.config import TrainerConfig
from flowrl.policy import TorchPolicy
import gymnasium as gym
sys.path.insert(0, sys.argv[1])
from test_models_and_policy import bc_batch, bc_loss
policy = TorchPolicy(
    gym.spaces.Box(-1, 1, (4,), np.float32),
    gym.spaces.Discrete(2),
    TrainerConfig.from_dict({"lr": 0.01}),
    loss_fn=bc_loss,
)
policy.compute_actions(np.zeros((3, 4), np.float32))
acting = "torch._dynamo" in sys.modules
policy.learn(bc_batch())
fused = policy.optimizer.defaults["fused"]
print(acting, "torch._dynamo" in sys.modules, policy.optimizer.param_groups[0]["lr"], fused)
"""


@pytest.mark.integration
def test_a_policy_that_only_acts_makes_no_optimizer() -> None:
    # A rollout worker's policy never learns: making an optimizer would import PyTorch's compiler
    # stack (torch._dynamo, about a second) in every worker process. The first update makes it.
    proc = subprocess.run(
        [sys.executable, "-c", ACT_THEN_LEARN, str(Path(__file__).parent)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["False", "True", "0.01", "True"]


def test_update_target_blends_or_copies_and_follows_loaded_weights() -> None:
    policy = make_policy(target_network=True)
    assert policy.target_model is not None
    before = {k: v.clone() for k, v in policy.target_model.state_dict().items()}
    new = {k: v + 1.0 for k, v in policy.get_weights().items()}
    policy.set_weights(new)  # loaded in place: update_target must see these weights
    policy.update_target(tau=0.25)
    for name, value in policy.target_model.state_dict().items():
        np.testing.assert_allclose(value.numpy(), 0.75 * before[name].numpy() + 0.25 * new[name], rtol=1e-6, atol=1e-6)
    policy.update_target()
    assert weights_equal({k: v.numpy() for k, v in policy.target_model.state_dict().items()}, new)
