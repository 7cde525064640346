"""``input: "minari:<name>"``: a Minari dataset of the local Minari root, as flowrl experience files.

On first use the dataset's episodes are converted, one at a time, into Parquet files (one row per step:
``obs``, ``new_obs``, ``actions``, ``rewards``, ``terminateds``, ``truncateds``, ``eps_id``, ``t``) with a
``metadata.json`` holding its spaces, under flowrl's cache (``$XDG_CACHE_HOME/flowrl/minari/``, else
``~/.cache/flowrl/minari/``); later runs read the converted files. Needs the ``minari`` extra.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from flowrl.config.data_keys import MINARI_PREFIX
from flowrl.data import DEFAULT_POLICY_ID, SampleBatch
from flowrl.data.offline import ExperienceWriter, write_metadata
from flowrl.envs.spaces import space_to_json
from flowrl.errors import CheckpointError, OfflineDataError, install_hint

#: The file that marks a finished conversion (a partial one is redone).
DONE = "converted"


def minari_cache(name: str) -> Path:
    """Where the converted files of Minari dataset ``name`` go."""
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return root / "flowrl" / "minari" / name.replace("/", "__")


def minari_files(source: str) -> Path:
    """The directory of flowrl experience files of ``source`` (``"minari:<name>"``), converting the dataset
    on first use. Raises :class:`~flowrl.errors.OfflineDataError` without the minari package, for a dataset
    the local Minari root lacks, and for observations or actions that are not arrays."""
    name = source[len(MINARI_PREFIX) :]
    try:
        import minari
    except ImportError as error:
        raise OfflineDataError(
            f"input {source!r} reads a Minari dataset, which needs {install_hint('minari')}"
        ) from error
    try:
        dataset = minari.load_dataset(name)
    except Exception as error:  # noqa: BLE001 - Minari raises several kinds for a dataset it cannot find
        local = sorted(minari.list_local_datasets())
        raise OfflineDataError(
            f"input {source!r}: no Minari dataset {name!r} in the local Minari root ({error}); the local ones are "
            f"{local}; download one with `minari download NAME`"
        ) from error
    target = minari_cache(name)
    if (target / DONE).is_file():
        return target
    staging = target.with_name(target.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    writer = ExperienceWriter(staging, prefix="minari")
    for episode in dataset.iterate_episodes():
        writer.write(_episode_rows(source, episode))
    writer.close()
    write_metadata(staging, {"source": source, "env": _env_id(dataset), "policies": _spaces(dataset)})
    (staging / DONE).write_text(str(dataset.total_steps))
    shutil.rmtree(target, ignore_errors=True)
    os.replace(staging, target)
    return target


def _episode_rows(source: str, episode: Any) -> SampleBatch:
    observations, actions = episode.observations, episode.actions
    if not isinstance(observations, np.ndarray) or not isinstance(actions, np.ndarray):
        raise OfflineDataError(
            f"input {source!r}: its observations or actions are {type(observations).__name__}/"
            f"{type(actions).__name__}, not arrays; flowrl reads Minari datasets of Box or Discrete spaces"
        )
    steps = len(actions)
    return SampleBatch(
        {
            SampleBatch.OBS: observations[:-1],
            SampleBatch.NEW_OBS: observations[1:],
            SampleBatch.ACTIONS: actions,
            SampleBatch.REWARDS: np.asarray(episode.rewards, dtype=np.float32),
            SampleBatch.TERMINATEDS: np.asarray(episode.terminations, dtype=bool),
            SampleBatch.TRUNCATEDS: np.asarray(episode.truncations, dtype=bool),
            SampleBatch.EPS_ID: np.full(steps, int(episode.id), dtype=np.int64),
            SampleBatch.T: np.arange(steps, dtype=np.int64),
        }
    )


def _spaces(dataset: Any) -> dict[str, dict[str, Any]]:
    try:
        spaces = {
            "observation_space": space_to_json(dataset.spec.observation_space, "observation_space"),
            "action_space": space_to_json(dataset.spec.action_space, "action_space"),
        }
    except CheckpointError:
        spaces = {}
    return {DEFAULT_POLICY_ID: spaces}


def _env_id(dataset: Any) -> str | None:
    env_spec = dataset.spec.env_spec
    return None if env_spec is None else str(env_spec.id)
