"""V(x_{t+1}) read from the next row's value within an episode, the model run only where it must be."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from flowrl.data import SampleBatch
from flowrl.policy.vtrace import next_state_values

pytestmark = pytest.mark.unit

HORIZON = 6


class CountingModel(nn.Module):
    """``(logits, values)`` of a small random MLP; records how many rows each call saw."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 3))
        self.rows_seen: list[int] = []

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.rows_seen.append(len(obs))
        out = self.net(obs)
        return out[:, :2], out[:, 2]


def fragments(num_fragments: int, seed: int) -> dict[str, torch.Tensor]:
    """Whole fragments of one env each: ``new_obs`` is the next row's ``obs`` unless the episode ended."""
    rng = np.random.default_rng(seed)
    n = num_fragments * HORIZON
    terminated = rng.random(n) < 0.15
    truncated = (rng.random(n) < 0.15) & ~terminated
    obs = rng.normal(size=(n, 3)).astype(np.float32)
    new_obs = np.roll(obs, -1, axis=0)
    ends = terminated | truncated
    new_obs[ends] = rng.normal(size=(int(ends.sum()), 3))  # final observations start no row
    last = np.arange(n) % HORIZON == HORIZON - 1
    new_obs[last] = rng.normal(size=(int(last.sum()), 3))  # the fragment goes on in a later one
    columns = {
        SampleBatch.OBS: obs,
        SampleBatch.NEW_OBS: new_obs,
        SampleBatch.TERMINATEDS: terminated,
        SampleBatch.TRUNCATEDS: truncated,
    }
    return {k: torch.as_tensor(v) for k, v in columns.items()}


def test_next_values_equal_the_models_values_of_new_obs_wherever_they_count() -> None:
    torch.manual_seed(0)
    model = CountingModel()
    batch = fragments(num_fragments=5, seed=0)
    terminated, truncated = batch[SampleBatch.TERMINATEDS], batch[SampleBatch.TRUNCATEDS]
    assert terminated.any() and truncated.any()
    _, values = model(batch[SampleBatch.OBS])
    next_values = next_state_values(model, batch, values, HORIZON)
    with torch.no_grad():
        _, expected = model(batch[SampleBatch.NEW_OBS])
    # After a terminated row the value is multiplied by a discount of 0: any finite number will do.
    counted = ~terminated
    torch.testing.assert_close(next_values[counted], expected[counted])
    assert torch.isfinite(next_values).all()
    assert not next_values.requires_grad


def test_the_model_runs_only_on_fragment_ends_and_truncated_rows() -> None:
    torch.manual_seed(1)
    model = CountingModel()
    batch = fragments(num_fragments=4, seed=1)
    _, values = model(batch[SampleBatch.OBS])
    next_state_values(model, batch, values, HORIZON)
    last = torch.arange(len(values)) % HORIZON == HORIZON - 1
    assert model.rows_seen[1:] == [int((batch[SampleBatch.TRUNCATEDS] | last).sum())]
