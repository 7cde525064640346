"""Small experience datasets written for the offline-data tests (imported as ``offline_files``).

:func:`episodes` builds the rows a single-agent sampler would give (whole episodes, one after the
other) without any env; :func:`write_dataset` writes them as an ``output`` directory would hold them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from flowrl.data import DEFAULT_POLICY_ID, SampleBatch
from flowrl.data.offline import ExperienceWriter, write_metadata
from flowrl.envs.spaces import space_to_json

_CARTPOLE = gym.make("CartPole-v1")
#: CartPole-v1's observation and action spaces, as a run on it has them.
CARTPOLE = _CARTPOLE.observation_space, _CARTPOLE.action_space


def episodes(
    count: int, length: int, *, obs_shape: Sequence[int] = (4,), continuous: bool = False, seed: int = 0
) -> SampleBatch:
    """``count`` episodes of ``length`` steps each (the last step terminated), CartPole-shaped by default;
    ``continuous``: one-dimensional float actions (Pendulum-shaped with ``obs_shape=(3,)``)."""
    rng = np.random.default_rng(seed)
    rows = count * length
    obs = rng.standard_normal((rows, *obs_shape)).astype(np.float32)
    if continuous:
        actions = rng.uniform(-2, 2, (rows, 1)).astype(np.float32)
    else:
        actions = rng.integers(0, 2, rows)
    ends = (np.arange(rows) % length) == length - 1
    return SampleBatch(
        {
            SampleBatch.OBS: obs,
            SampleBatch.NEW_OBS: np.roll(obs, -1, axis=0),
            SampleBatch.ACTIONS: actions,
            SampleBatch.REWARDS: np.ones(rows, np.float32),
            SampleBatch.TERMINATEDS: ends,
            SampleBatch.TRUNCATEDS: np.zeros(rows, bool),
            SampleBatch.EPS_ID: np.repeat(np.arange(count), length),
            SampleBatch.T: np.tile(np.arange(length), count),
        }
    )


def write_dataset(
    directory: Path,
    batch: Mapping[str, Any],
    *,
    spaces: tuple[gym.Space[Any], gym.Space[Any]] | None = CARTPOLE,
    files: int = 1,
) -> Path:
    """``batch`` written to ``directory`` as ``files`` Parquet files, with a ``metadata.json`` recording
    ``spaces`` (observation, action) for the default policy (none when ``spaces`` is None)."""
    rows = len(next(iter(batch.values())))
    bounds = np.linspace(0, rows, files + 1).astype(int)
    for index, (start, stop) in enumerate(zip(bounds[:-1], bounds[1:])):
        writer = ExperienceWriter(directory, worker_index=index)
        writer.write({k: np.asarray(v)[start:stop] for k, v in batch.items()})
        writer.close()
    if spaces is not None:
        recorded = {
            "observation_space": space_to_json(spaces[0], "observation_space"),
            "action_space": space_to_json(spaces[1], "action_space"),
        }
        write_metadata(directory, {"algorithm": "test", "policies": {DEFAULT_POLICY_ID: recorded}})
    return directory
