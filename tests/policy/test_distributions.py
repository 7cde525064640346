"""Action distributions against torch.distributions, squashing, and dist_class_for."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import distributions as td

from flowrl.errors import FlowRLError
from flowrl.policy import Categorical, Deterministic, DiagGaussian, SquashedGaussian, dist_class_for

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


# -- Categorical ------------------------------------------------------------------------


def test_categorical_logp_entropy_kl_match_torch() -> None:
    logits = torch.randn(64, 5) * 3
    other_logits = torch.randn(64, 5) * 3
    actions = torch.randint(0, 5, (64,))
    ours, ref = Categorical(logits), td.Categorical(logits=logits)
    ref_other = td.Categorical(logits=other_logits)
    torch.testing.assert_close(ours.logp(actions), ref.log_prob(actions))
    torch.testing.assert_close(ours.entropy(), ref.entropy())
    expected_kl = td.kl_divergence(ref, ref_other)
    torch.testing.assert_close(ours.kl(Categorical(other_logits)), expected_kl, atol=1e-5, rtol=1e-5)
    assert ours.logp(actions).shape == (64,)


def test_categorical_logp_accepts_float_actions() -> None:
    logits = torch.randn(8, 3)
    actions = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    torch.testing.assert_close(Categorical(logits).logp(actions.float()), Categorical(logits).logp(actions))


def test_categorical_kl_with_itself_is_zero() -> None:
    logits = torch.randn(16, 4)
    torch.testing.assert_close(Categorical(logits).kl(Categorical(logits)), torch.zeros(16), atol=1e-6, rtol=0)


def test_categorical_sample_shape_range_and_frequencies() -> None:
    probs = torch.tensor([0.1, 0.6, 0.3])
    logits = probs.log().expand(20_000, 3)
    s = Categorical(logits).sample()
    assert s.shape == (20_000,)
    assert s.dtype == torch.int64
    assert int(s.min()) >= 0 and int(s.max()) <= 2
    freq = torch.bincount(s, minlength=3).float() / 20_000
    torch.testing.assert_close(freq, probs, atol=0.02, rtol=0)


def test_categorical_deterministic_sample_is_argmax() -> None:
    logits = torch.randn(32, 6)
    torch.testing.assert_close(Categorical(logits).deterministic_sample(), logits.argmax(-1))


# -- DiagGaussian -----------------------------------------------------------------------


def test_diag_gaussian_logp_entropy_kl_match_torch() -> None:
    mean, log_std = torch.randn(64, 3), torch.randn(64, 3) * 0.5
    mean2, log_std2 = torch.randn(64, 3), torch.randn(64, 3) * 0.5
    actions = torch.randn(64, 3) * 2
    ours = DiagGaussian(torch.cat([mean, log_std], -1))
    other = DiagGaussian(torch.cat([mean2, log_std2], -1))
    ref = td.Independent(td.Normal(mean, log_std.exp()), 1)
    ref_other = td.Independent(td.Normal(mean2, log_std2.exp()), 1)
    torch.testing.assert_close(ours.logp(actions), ref.log_prob(actions))
    torch.testing.assert_close(ours.entropy(), ref.entropy())
    torch.testing.assert_close(ours.kl(other), td.kl_divergence(ref, ref_other), rtol=1e-5, atol=1e-5)
    assert ours.logp(actions).shape == ours.entropy().shape == (64,)


def test_diag_gaussian_sample_shape_and_moments() -> None:
    mean = torch.tensor([1.0, -2.0])
    log_std = torch.tensor([0.0, math.log(0.5)])
    inputs = torch.cat([mean, log_std]).expand(50_000, 4)
    s = DiagGaussian(inputs).sample()
    assert s.shape == (50_000, 2)
    torch.testing.assert_close(s.mean(0), mean, atol=0.03, rtol=0)
    torch.testing.assert_close(s.std(0), log_std.exp(), atol=0.03, rtol=0)


def test_diag_gaussian_deterministic_sample_is_mean() -> None:
    inputs = torch.randn(10, 4)
    torch.testing.assert_close(DiagGaussian(inputs).deterministic_sample(), inputs[:, :2])


# -- Deterministic ----------------------------------------------------------------------


def test_deterministic_distribution() -> None:
    inputs = torch.randn(5, 2)
    d = Deterministic(inputs)
    torch.testing.assert_close(d.sample(), inputs)
    torch.testing.assert_close(d.deterministic_sample(), inputs)
    assert d.logp(inputs).shape == (5,)
    assert d.entropy().shape == (5,)
    assert Deterministic.deterministic_only


# -- SquashedGaussian -------------------------------------------------------------------


def squashed(low: float, high: float) -> type[SquashedGaussian]:
    return SquashedGaussian.for_bounds(np.array([low], np.float32), np.array([high], np.float32))


def test_squashed_samples_within_bounds_and_logp_finite() -> None:
    low, high = np.array([-2.0, 0.0, -1.0], np.float32), np.array([2.0, 1.0, 3.0], np.float32)
    cls = SquashedGaussian.for_bounds(low, high)
    # Means from moderate to saturating so samples reach the bounds.
    mean = torch.randn(4000, 3) * 5
    log_std = torch.randn(4000, 3).clamp(-3, 1)
    d = cls(torch.cat([mean, log_std], -1))
    s = d.sample()
    assert s.shape == (4000, 3)
    assert bool((s >= torch.as_tensor(low)).all()) and bool((s <= torch.as_tensor(high)).all())
    assert bool(torch.isfinite(d.logp(s)).all())
    det = d.deterministic_sample()
    assert bool((det >= torch.as_tensor(low)).all()) and bool((det <= torch.as_tensor(high)).all())
    # Exactly at the bounds the log-density is still finite (clamped, not inf/nan).
    edges = torch.stack([torch.as_tensor(low), torch.as_tensor(high)])
    assert bool(torch.isfinite(cls(torch.zeros(2, 6)).logp(edges)).all())


def test_squashed_saturated_samples_stay_inside_box() -> None:
    space = gym.spaces.Box(np.float32(-0.3), np.float32(1.1), (1,), np.float32)
    cls, _ = dist_class_for(space, "squashed")
    d = cls(torch.tensor([[60.0, -3.0], [-60.0, -3.0]]))
    for a in [*d.sample().numpy(), *d.deterministic_sample().numpy()]:
        assert space.contains(a), f"{a!r} outside {space}"


def test_squashed_logp_matches_change_of_variables_1d() -> None:
    low, high = -1.5, 2.5
    mu, sigma = 0.3, 0.7
    cls = squashed(low, high)
    d = cls(torch.tensor([[mu, math.log(sigma)]]).expand(9, 2))
    actions = torch.linspace(low + 0.2, high - 0.2, 9)[:, None]
    # a = low + (tanh(u) + 1) * (high - low) / 2  =>  u = atanh(2 (a - low) / (high - low) - 1),
    # log p(a) = log N(u; mu, sigma) - log((high - low) / 2 * (1 - tanh(u)^2)).
    u = torch.atanh(2 * (actions[:, 0].double() - low) / (high - low) - 1)
    expected = td.Normal(torch.tensor(mu).double(), torch.tensor(sigma).double()).log_prob(u) - torch.log(
        (high - low) / 2 * (1 - torch.tanh(u) ** 2)
    )
    torch.testing.assert_close(d.logp(actions).double(), expected, atol=2e-4, rtol=1e-4)


def test_squashed_density_integrates_to_one() -> None:
    low, high = -2.0, 2.0
    cls = squashed(low, high)
    grid = torch.linspace(low, high, 200_001)[1:-1, None]
    d = cls(torch.tensor([[0.4, math.log(0.6)]]).expand(len(grid), 2))
    density = d.logp(grid).double().exp()
    total = torch.trapezoid(density, grid[:, 0].double())
    assert float(total) == pytest.approx(1.0, abs=2e-3)


def test_squashed_monte_carlo_mean_matches_density_mean() -> None:
    low, high = 0.0, 1.0
    cls = squashed(low, high)
    d = cls(torch.tensor([[-0.5, math.log(0.8)]]).expand(200_000, 2))
    mc_mean = d.sample().mean()
    grid = torch.linspace(low, high, 100_001)[1:-1, None]
    dens = cls(torch.tensor([[-0.5, math.log(0.8)]]).expand(len(grid), 2)).logp(grid).double().exp()
    num_mean = torch.trapezoid(dens * grid[:, 0].double(), grid[:, 0].double())
    assert float(mc_mean) == pytest.approx(float(num_mean), abs=3e-3)


def test_squashed_deterministic_sample_is_squashed_mean() -> None:
    cls = squashed(-2.0, 2.0)
    d = cls(torch.tensor([[0.0, 0.0], [100.0, 0.0], [0.5, 0.0]]))
    torch.testing.assert_close(d.deterministic_sample()[:, 0], torch.tensor([0.0, 2.0, 2.0 * math.tanh(0.5)]))


def test_squashed_has_no_entropy_or_kl() -> None:
    d = squashed(-1.0, 1.0)(torch.zeros(2, 2))
    with pytest.raises(FlowRLError):
        d.entropy()
    with pytest.raises(FlowRLError):
        d.kl(d)


# -- dist_class_for ---------------------------------------------------------------------


def test_dist_class_for_discrete() -> None:
    cls, n = dist_class_for(gym.spaces.Discrete(7))
    assert cls is Categorical and n == 7


def test_dist_class_for_box() -> None:
    space = gym.spaces.Box(-2.0, 2.0, (3,), np.float32)
    assert dist_class_for(space) == (DiagGaussian, 6)
    assert dist_class_for(space, "deterministic") == (Deterministic, 3)
    cls, n = dist_class_for(space, "squashed")
    assert issubclass(cls, SquashedGaussian) and n == 6
    torch.testing.assert_close(torch.as_tensor(cls.low), torch.full((3,), -2.0))
    torch.testing.assert_close(torch.as_tensor(cls.high), torch.full((3,), 2.0))
    # The bounds are bound into a subclass: the base class keeps [-1, 1].
    assert SquashedGaussian.low == -1.0 and SquashedGaussian.high == 1.0


@pytest.mark.parametrize(
    "space,kind",
    [
        (gym.spaces.MultiDiscrete([3, 4]), "auto"),
        (gym.spaces.MultiBinary(4), "auto"),
        (gym.spaces.Box(-1.0, 1.0, (2, 2), np.float32), "auto"),
        (gym.spaces.Discrete(3), "squashed"),
        (gym.spaces.Box(-1.0, 1.0, (2,), np.float32), "bogus"),
    ],
)
def test_dist_class_for_unsupported_raises_naming_space(space: gym.Space, kind: str) -> None:
    with pytest.raises(FlowRLError) as info:
        dist_class_for(space, kind)
    msg = str(info.value)
    assert str(space) in msg
    assert repr(kind) in msg
    assert "Discrete" in msg and "Box" in msg


def test_dist_class_for_multidiscrete_message() -> None:
    with pytest.raises(FlowRLError, match=r"MultiDiscrete\(\[3 4\]\)"):
        dist_class_for(gym.spaces.MultiDiscrete([3, 4]))
