"""Learning tests of the offline algorithms: each learns CartPole-v1 from experiences recorded here.

The expert is PPO trained with ``tuned_examples/cartpole-ppo.yaml`` to a mean of 475; its episodes are
recorded greedily with :func:`flowrl.engine.record.record_checkpoint`, as ``flowrl record`` does. The
random policy is the same run's policy before training, recorded exploring (near-uniform actions).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from flowrl import Trainer
from flowrl.engine.record import record_checkpoint

pytestmark = [pytest.mark.learning, pytest.mark.usefixtures("ray_session"), pytest.mark.timeout(600)]

TUNED = Path(__file__).resolve().parents[2] / "tuned_examples"


def tuned(example: str) -> dict[str, Any]:
    spec: dict[str, Any] = yaml.safe_load((TUNED / example).read_text())
    return spec


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``expert``: 40 greedy episodes of a PPO policy that solved CartPole (20,000 rows); ``mixed``: 20 of them
    and as many rows of a random policy's episodes (about 450 episodes), in one dataset."""
    root = tmp_path_factory.mktemp("offline")
    spec = tuned("cartpole-ppo.yaml")
    trainer = Trainer(spec["algo"], spec["env"], {**spec["config"], "seed": 0})
    try:
        untrained = trainer.save(root / "untrained")
        while trainer.train()["episode_reward_mean"] < 475:
            assert trainer.iteration < 500, "the expert did not learn"
        expert = trainer.save(root / "expert")
    finally:
        trainer.stop()
    record_checkpoint(expert, root / "expert_data", episodes=40, seed=0)
    record_checkpoint(expert, root / "mixed" / "expert", episodes=20, seed=100)
    record_checkpoint(untrained, root / "mixed" / "random", episodes=450, seed=200, explore=True)
    return {"expert": root / "expert_data", "mixed": root / "mixed"}


def evaluate_until(example: str, data: Path, threshold: float | None = None) -> tuple[float, int, list[float]]:
    """Train the tuned example on ``data`` to its stop criteria (or only its budget when ``threshold`` is None):
    the best evaluation mean, the rows read then, and the evaluation curve."""
    spec = tuned(example)
    budget = spec["stop"]["timesteps_total"]
    threshold = spec["stop"]["evaluation/episode_reward_mean"] if threshold is None else threshold
    trainer = Trainer(spec["algo"], spec["env"], {**spec["config"], "input": str(data), "seed": 0})
    curve: list[float] = []
    try:
        while True:
            result = trainer.train()
            curve.append(round(result["evaluation"]["episode_reward_mean"], 1))
            if curve[-1] >= threshold or result["timesteps_total"] >= budget:
                return max(curve), result["timesteps_total"], curve
    finally:
        trainer.stop()


def test_bc_learns_cartpole_from_an_experts_episodes(recorded: dict[str, Path]) -> None:
    # "cartpole-bc.yaml": 450.0 within 500_000 rows read (500 at 301,056 with seed 0; about 8 s).
    reward, rows, curve = evaluate_until("cartpole-bc.yaml", recorded["expert"])
    assert reward >= 450.0, f"bc: best evaluation {reward} < 450 after {rows} rows; curve {curve}"
    assert rows <= 500_000


def test_marwil_learns_from_mixed_data_where_bc_does_not(recorded: dict[str, Path]) -> None:
    # "cartpole-marwil.yaml": 400.0 within 600_000 rows read (500 at 501,760 with seed 0); BC on the same rows
    # peaks at 147 within its 500,000 (both runs about 7 s).
    marwil, rows, curve = evaluate_until("cartpole-marwil.yaml", recorded["mixed"])
    assert marwil >= 400.0, f"marwil: best evaluation {marwil} < 400 after {rows} rows; curve {curve}"
    assert rows <= 600_000
    spec = tuned("cartpole-marwil.yaml")
    bc, _, bc_curve = evaluate_until("cartpole-bc.yaml", recorded["mixed"], threshold=float("inf"))
    assert bc < marwil, f"bc's best evaluation {bc} (curve {bc_curve}) >= marwil's {marwil} on the mixed data"
    assert spec["config"]["beta"] == 1.0
