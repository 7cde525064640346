"""Recording a trained policy's episodes as experience files (``flowrl record``), without Ray.

The checkpoint's policy acts in envs made here (greedy unless ``explore``), sampled as a rollout worker
samples, and the rows of the first ``episodes`` episodes to finish are written whole, episode by
episode, with the columns sampling gives them (action log-probabilities and distribution inputs
included) and a ``metadata.json`` naming the checkpoint.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from flowrl.actors.sampling.vector import VectorSampler
from flowrl.algorithms import get_algorithm
from flowrl.data import DEFAULT_POLICY_ID, SampleBatch, concat_samples
from flowrl.data.offline import ExperienceWriter
from flowrl.engine.build import policy_specs, write_output_metadata
from flowrl.envs import get_env_creator, is_multi_agent_env
from flowrl.envs.context import EnvContext
from flowrl.envs.registry import close_env
from flowrl.errors import CheckpointError, OfflineDataError
from flowrl.policy.filters import MeanStdFilter
from flowrl.storage.checkpoints import read_checkpoint


def record_checkpoint(
    checkpoint_path: str | Path,
    out: str | Path,
    *,
    episodes: int,
    explore: bool = False,
    seed: int | None = None,
    num_envs: int = 8,
    max_file_size: int = 64 * 2**20,
) -> dict[str, Any]:
    """Write ``episodes`` whole episodes of the checkpoint's policy to ``out`` (Parquet files and ``metadata.json``).

    Returns ``episodes``, ``steps``, ``episode_reward_mean``, ``files`` and the checkpoint's ``algo`` and ``env``.
    Raises :class:`~flowrl.errors.OfflineDataError` for a multi-agent env or an ``out`` that holds experiences.
    """
    if episodes < 1:
        raise OfflineDataError(f"episodes={episodes}: record at least 1 episode")
    target = Path(out)
    if target.exists() and any(target.rglob("*.parquet")):
        raise OfflineDataError(
            f"{str(target)!r} already holds experience files: record into a new directory (nothing was overwritten)"
        )
    state, _ = read_checkpoint(checkpoint_path)
    for key in ("algo", "env", "config", "worker"):
        if key not in state:
            raise CheckpointError(
                f"checkpoint {str(checkpoint_path)!r} has no {key!r}: not a flowrl Trainer checkpoint"
            )
    algorithm = get_algorithm(state["algo"])
    config = algorithm.config_class.from_dict({**state["config"], "explore": explore, "output": str(target)})
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
    write_output_metadata(algorithm, state["env"], config, specs)
    writer = ExperienceWriter(target, max_file_size=max_file_size, prefix="recorded")
    for start in range(0, rows.count, 10_000):  # row groups of at most 10k rows: readers stream them
        writer.write(rows.slice(start, min(start + 10_000, rows.count)))
    writer.close()
    ends = rows[SampleBatch.TERMINATEDS] | rows[SampleBatch.TRUNCATEDS]
    return {
        "algo": state["algo"],
        "env": state["env"],
        "episodes": int(ends.sum()),
        "steps": rows.count,
        "episode_reward_mean": float(rows[SampleBatch.REWARDS].sum() / max(1, int(ends.sum()))),
        "files": [str(p) for p in writer.files_written],
    }


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
