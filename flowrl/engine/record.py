"""Recording a trained policy's episodes as experience files (``flowrl record``), without Ray.

The checkpoint's policy acts in envs made here (greedy unless ``explore``), sampled as a rollout worker
samples, and the rows of the first ``episodes`` episodes to finish are written whole, episode by
episode, with the columns sampling gives them (action log-probabilities and distribution inputs
included) and a ``metadata.json`` naming the checkpoint. The files are written into a hidden directory
beside ``out`` and moved into place at the end: an error leaves ``out`` as it was.
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from flowrl.actors.sampling.vector import VectorSampler
from flowrl.algorithms import get_algorithm
from flowrl.data import DEFAULT_POLICY_ID, SampleBatch, concat_samples
from flowrl.data.offline import METADATA_FILE, ExperienceWriter
from flowrl.engine.build import policy_specs, write_output_metadata
from flowrl.envs import get_env_creator, is_multi_agent_env
from flowrl.envs.context import EnvContext
from flowrl.envs.registry import close_env
from flowrl.errors import CheckpointError, OfflineDataError
from flowrl.policy.filters import MeanStdFilter
from flowrl.serve.inference import checkpoint_dir
from flowrl.storage.checkpoints import read_checkpoint

#: Rows handed to the writer at a time (it gathers them into row groups of its ``row_group_bytes``).
ROW_GROUP_ROWS = 10_000


def record_checkpoint(
    path: str | Path,
    out: str | Path,
    *,
    episodes: int,
    checkpoint: int | None = None,
    explore: bool = False,
    seed: int | None = None,
    num_envs: int = 8,
    max_file_size: int = 64 * 2**20,
) -> dict[str, Any]:
    """Write ``episodes`` whole episodes of a checkpoint's policy to ``out`` (Parquet files and ``metadata.json``).

    ``path``: a checkpoint directory, or a run directory (its latest checkpoint, or ``checkpoint_<checkpoint>``
    when ``checkpoint`` is given) or a Tune trial directory (its best), as ``flowrl evaluate`` resolves them.
    ``explore``: sample actions as in training instead of taking the greedy ones. ``seed``: seeds the envs'
    resets and the sampling. Returns ``episodes``, ``steps``, ``episode_reward_mean``, ``files`` (their final
    paths), ``checkpoint`` and the checkpoint's ``algo`` and ``env``. Raises
    :class:`~flowrl.errors.CheckpointError` for a path without a checkpoint and
    :class:`~flowrl.errors.OfflineDataError` for a multi-agent env, an ``out`` that holds experiences or one that
    cannot be written.
    """
    if episodes < 1:
        raise OfflineDataError(f"episodes={episodes}: record at least 1 episode")
    target = Path(out)
    _check_target(target)
    directory = checkpoint_dir(Path(path), checkpoint)
    state, _ = read_checkpoint(directory)
    for key in ("algo", "env", "config", "worker"):
        if key not in state:
            raise CheckpointError(f"checkpoint {str(directory)!r} has no {key!r}: not a flowrl Trainer checkpoint")
    algorithm = get_algorithm(state["algo"])
    staging = target.parent / f".{target.name}.recording-{uuid.uuid4().hex[:8]}"
    config = algorithm.config_class.from_dict({**state["config"], "explore": explore, "output": str(staging)})
    env_creator = get_env_creator(state["env"])
    specs = policy_specs(algorithm, config, env_creator)
    if set(specs) != {DEFAULT_POLICY_ID}:
        raise OfflineDataError(f"recording covers single-agent envs; {state['env']!r} is multi-agent")
    policy = specs[DEFAULT_POLICY_ID].build()
    policy.set_state(state["worker"]["policies"][DEFAULT_POLICY_ID])
    obs_filter = None
    if state["worker"].get("obs_filter") is not None:  # the run filtered observations: its policy acts on those
        obs_filter = MeanStdFilter()
        obs_filter.set_state(state["worker"]["obs_filter"])
    envs = [env_creator(EnvContext(config.env_config, vector_index=i)) for i in range(num_envs)]
    try:
        if is_multi_agent_env(envs[0]):
            raise OfflineDataError(f"recording covers single-agent envs; {state['env']!r} is multi-agent")
        rows = _sample_episodes(envs, policy, episodes, seed, obs_filter, config.clip_actions)
    finally:
        for env in envs:
            close_env(env)
    recorded = {"checkpoint": str(directory), "episodes": episodes, "explore": explore, "seed": seed}
    try:
        write_output_metadata(
            algorithm, state["env"], config, specs, multi_agent=False, extra={"recorded_from": recorded}
        )
        writer = ExperienceWriter(staging, max_file_size=max_file_size, prefix="recorded")
        for start in range(0, rows.count, ROW_GROUP_ROWS):
            writer.write(rows.slice(start, min(start + ROW_GROUP_ROWS, rows.count)))
        writer.close()
        files = _publish(staging, target)
    except OSError as error:  # a full disk, a directory that cannot be written: said as such, nothing left
        raise OfflineDataError(f"cannot write experiences to {str(target)!r}: {error}") from error
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # gone already when published
    ends = rows[SampleBatch.TERMINATEDS] | rows[SampleBatch.TRUNCATEDS]
    return {
        "algo": state["algo"],
        "env": state["env"],
        "checkpoint": str(directory),
        "episodes": int(ends.sum()),
        "steps": rows.count,
        "episode_reward_mean": float(rows[SampleBatch.REWARDS].sum() / max(1, int(ends.sum()))),
        "files": [str(f) for f in files if f.suffix == ".parquet"],
    }


def _check_target(target: Path) -> None:
    """Refuse an ``out`` that is a file or already holds experiences (nothing there is overwritten)."""
    if target.exists() and not target.is_dir():
        raise OfflineDataError(f"--out {str(target)!r} is a file: record into a new or empty directory")
    if target.is_dir() and ((target / METADATA_FILE).exists() or any(target.rglob("*.parquet"))):
        raise OfflineDataError(
            f"{str(target)!r} already holds experiences (.parquet files or a {METADATA_FILE}): record into a new "
            "or empty directory (nothing was overwritten)"
        )


def _publish(staging: Path, target: Path) -> list[Path]:
    """Move the recorded files from ``staging`` into ``target``; their final paths."""
    names = sorted(p.name for p in staging.iterdir())
    if not target.exists():
        os.replace(staging, target)  # one rename: the directory appears complete
    else:
        for name in names:
            os.replace(staging / name, target / name)
    return [target / name for name in names]


def _sample_episodes(
    envs: list[Any], policy: Any, episodes: int, seed: int | None, obs_filter: MeanStdFilter | None, clip: bool
) -> SampleBatch:
    """The rows of the first ``episodes`` episodes to finish, episode after episode."""
    sampled: list[SampleBatch] = []
    sampler = VectorSampler(envs, policy, fragment_length=100, seed=seed, clip_actions=clip, obs_filter=obs_filter)
    sampler.output = sampled.append
    finished: list[int] = []  # episode ids, in the order they ended
    while len(finished) < episodes:
        sampler.sample()
        latest = sampled[-1]
        ends = latest[SampleBatch.TERMINATEDS] | latest[SampleBatch.TRUNCATEDS]
        finished.extend(int(e) for e in latest[SampleBatch.EPS_ID][ends])
    rows = concat_samples(sampled)
    keep = finished[:episodes]
    rank = {eps_id: k for k, eps_id in enumerate(keep)}
    ids = rows[SampleBatch.EPS_ID]
    order = np.array([rank.get(int(e), -1) for e in ids])
    selected = np.flatnonzero(order >= 0)
    selected = selected[np.argsort(order[selected], kind="stable")]  # episode by episode, steps in order
    return SampleBatch({k: np.asarray(v)[selected] for k, v in rows.items()})
