"""Experiences that cannot serve a run fail when the Trainer is built, before any training (and without Ray),
with an error naming the path or column and what would be valid (issue 36, point 6)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from offline_files import episodes, write_dataset

from flowrl import Trainer
from flowrl.data import SampleBatch
from flowrl.data.offline import batch_to_table
from flowrl.errors import ConfigError, OfflineDataError

pytestmark = pytest.mark.unit

PENDULUM = gym.spaces.Box(-8.0, 8.0, (3,), np.float32), gym.spaces.Box(-2.0, 2.0, (1,), np.float32)


def build(algo: str, source: Any, **config: Any) -> Trainer:
    return Trainer(algo=algo, env="CartPole-v1", config={"input": source, "num_workers": 0, **config})


def test_good_data_builds_a_trainer(tmp_path: Path) -> None:
    """The cases below fail for their one reason: the same data, right, builds."""
    trainer = build("marwil", str(write_dataset(tmp_path, episodes(4, 10))))
    trainer.stop()


def test_a_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(OfflineDataError, match=r"input '.*/nowhere' does not exist: give a directory of experiences"):
        build("bc", str(tmp_path / "nowhere"))


def test_a_directory_without_parquet_files(tmp_path: Path) -> None:
    (tmp_path / "readme.txt").write_text("no experiences here")
    with pytest.raises(OfflineDataError, match=r"is an empty dataset: the directory holds no \.parquet file"):
        build("bc", str(tmp_path))


def test_parquet_files_without_rows(tmp_path: Path) -> None:
    pq.write_table(batch_to_table(episodes(1, 5)).slice(0, 0), tmp_path / "empty.parquet")
    with pytest.raises(OfflineDataError, match="is an empty dataset: its files hold no rows"):
        build("bc", str(tmp_path))


def test_a_file_that_is_not_parquet(tmp_path: Path) -> None:
    path = tmp_path / "experiences.parquet"
    path.write_text("obs,actions\n0.1,1\n")
    with pytest.raises(OfflineDataError, match=r"experiences\.parquet' is not a readable Parquet file"):
        build("bc", str(path))


def test_files_with_different_columns(tmp_path: Path) -> None:
    write_dataset(tmp_path, episodes(2, 5))
    other = dict(episodes(2, 5))
    other[SampleBatch.ACTION_LOGP] = np.zeros(10, np.float32)
    pq.write_table(batch_to_table(SampleBatch(other)), tmp_path / "zz-more-columns.parquet")
    with pytest.raises(OfflineDataError, match=r"has the columns \[.*'action_logp'.*\], but .* has \[.*one dataset"):
        build("bc", str(tmp_path))


def test_pendulum_experiences_for_a_cartpole_run_by_their_metadata(tmp_path: Path) -> None:
    write_dataset(tmp_path, episodes(2, 5, obs_shape=(3,), continuous=True), spaces=PENDULUM)
    with pytest.raises(
        OfflineDataError, match=r"was recorded with the observation_space .*'shape': \[3\].* this run's env has .*\[4\]"
    ):
        build("bc", str(tmp_path))


def test_pendulum_experiences_for_a_cartpole_run_by_their_shapes(tmp_path: Path) -> None:
    write_dataset(tmp_path, episodes(2, 5, obs_shape=(3,), continuous=True), spaces=None)  # no metadata.json
    with pytest.raises(
        OfflineDataError, match=r"observations have the shape \(3,\), but .* has \(4,\): use experiences"
    ):
        build("bc", str(tmp_path))


def test_marwil_needs_rewards_and_says_why(tmp_path: Path) -> None:
    data = dict(episodes(2, 5))
    del data[SampleBatch.REWARDS]
    write_dataset(tmp_path, data)
    with pytest.raises(
        OfflineDataError, match=r"lacks the column\(s\) \['rewards'\], needed because MARWIL weights actions by returns"
    ):
        build("marwil", str(tmp_path))
    build("bc", str(tmp_path)).stop()  # behaviour cloning reads observations and actions only


def test_multi_agent_experiences_for_a_single_agent_run(tmp_path: Path) -> None:
    pq.write_table(
        batch_to_table(episodes(2, 5)).append_column(SampleBatch.POLICY_ID, pa.array(["p0"] * 10)),
        tmp_path / "multi.parquet",
    )
    with pytest.raises(OfflineDataError, match=r"holds multi-agent experiences \(a policy_id column\), but this run"):
        build("bc", str(tmp_path))


def test_input_for_an_online_algorithm_names_the_offline_ones(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"'ppo' learns from the envs it samples.*learn from them: bc, cql, marwil"):
        build("ppo", str(write_dataset(tmp_path, episodes(2, 5))))


def test_an_offline_algorithm_without_input(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"bc learns from recorded experiences: set input to a directory"):
        build("bc", "sampler")
    with pytest.raises(ConfigError, match=r"marwil learns from recorded experiences alone, not mixed with the sampler"):
        build("marwil", {"sampler": 0.5, str(tmp_path): 0.5})


def test_an_offline_algorithm_on_a_multi_agent_env(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"'bc' trains single-agent envs, but MultiAgentCartPole is multi-agent"):
        Trainer(
            algo="bc",
            env="MultiAgentCartPole",
            config={"input": str(write_dataset(tmp_path, episodes(2, 5))), "num_workers": 0},
        )
