"""``input: "minari:<name>"``: a Minari dataset of the local Minari root, converted once into experience files."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from flowrl import Trainer
from flowrl.actors.minari_input import DONE, minari_cache
from flowrl.data import SampleBatch
from flowrl.data.offline import OfflineData
from flowrl.errors import OfflineDataError

minari = pytest.importorskip("minari")
from minari.data_collector.episode_buffer import EpisodeBuffer  # noqa: E402 - after the skip

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


@pytest.fixture
def minari_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A Minari root with ``cartpole/random-v0`` (20 random episodes), and flowrl's cache under ``tmp_path``."""
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    env = gym.make("CartPole-v1")
    rng = np.random.default_rng(0)
    episodes = []
    for index in range(20):
        obs, _ = env.reset(seed=index)
        observations, actions, rewards, terminations, truncations = [obs], [], [], [], []
        done = False
        while not done:
            action = int(rng.integers(2))
            obs, reward, terminated, truncated, _ = env.step(action)
            observations.append(obs)
            actions.append(action)
            rewards.append(reward)
            terminations.append(terminated)
            truncations.append(truncated)
            done = terminated or truncated
        episodes.append(
            EpisodeBuffer(
                id=index,
                observations=np.array(observations),
                actions=np.array(actions),
                rewards=rewards,
                terminations=terminations,
                truncations=truncations,
            )
        )
    minari.create_dataset_from_buffers("cartpole/random-v0", episodes, env=env, data_format="arrow")
    return tmp_path


def test_a_minari_dataset_is_converted_once_and_learned_from(minari_root: Path) -> None:
    dataset = minari.load_dataset("cartpole/random-v0")
    trainer = Trainer(
        "bc",
        "CartPole-v1",
        {
            "num_workers": 0,
            "input": "minari:cartpole/random-v0",
            "timesteps_per_iteration": 1024,
            "evaluation_num_episodes": 1,
        },
    )
    try:
        result = trainer.train()
    finally:
        trainer.stop()
    assert result["timesteps_total"] >= 1024
    converted = minari_cache("cartpole/random-v0")
    assert (converted / DONE).read_text() == str(dataset.total_steps)
    data = OfflineData(converted)
    assert data.num_rows == dataset.total_steps
    assert data.metadata is not None and data.metadata["source"] == "minari:cartpole/random-v0"
    rows = next(data.iter_batches(10_000))
    first = next(iter(dataset.iterate_episodes()))
    steps = len(first.actions)
    np.testing.assert_array_equal(rows[SampleBatch.OBS][:steps], first.observations[:-1])
    np.testing.assert_array_equal(rows[SampleBatch.NEW_OBS][:steps], first.observations[1:])
    assert rows[SampleBatch.TERMINATEDS][steps - 1] and not rows[SampleBatch.TERMINATEDS][: steps - 1].any()


def test_a_minari_dataset_that_is_not_local_is_named_with_the_local_ones(minari_root: Path) -> None:
    with pytest.raises(OfflineDataError, match=r"no Minari dataset 'cartpole/expert-v0'.*\['cartpole/random-v0'\]"):
        Trainer("bc", "CartPole-v1", {"num_workers": 0, "input": "minari:cartpole/expert-v0"})
