"""Episodes played in this process with a set of policies, without Ray: their statistics.

:func:`evaluate_policies` plays them with policies at hand (``Trainer.evaluate``,
:func:`~flowrl.engine.build.evaluate_checkpoint`), through the one episode loop
(:func:`~flowrl.actors.evaluation.run_episodes`) evaluation during training uses too.

:func:`evaluate_policy_files` is what ``flowrl evaluate`` runs: the policies come from
``policies.json`` and ``policies.safetensors``, read as :func:`~flowrl.serve.inference.load_policy`
reads them, the env and its ``env_config`` (and a multi-agent run's ``policy_mapping_fn``) from
``metadata.json``. Nothing is unpickled (``state.pkl`` is never opened), and no module the
checkpoint names is imported unless ``allow_imports`` allows it: a custom model, callbacks, a
mapping function, or the module of an env id ``"module:EnvId"``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from flowrl.actors.evaluation import episode_seeds, run_episodes
from flowrl.config import TrainerConfig
from flowrl.envs import get_env_creator
from flowrl.envs.registry import EnvSpec
from flowrl.errors import CheckpointError, FlowRLError
from flowrl.importing import allowed_imports
from flowrl.operators.metric_ops import summarize_episodes
from flowrl.policy import Policy
from flowrl.policy.filters import MeanStdFilter
from flowrl.serve.inference import checkpoint_dir, load_policy, read_policies_document, refused_import_error
from flowrl.storage.checkpoints import METADATA_FILE, read_metadata

#: A ``"module:function"`` path, as a run's JSON metadata keeps a mapping given by name (a Python
#: function given as itself is written as its repr, which names nothing importable).
_PATH = re.compile(r"[\w.]+:[\w.]+")


def evaluate_policies(
    policy_map: Mapping[str, Policy[Any]],
    env: EnvSpec,
    config: TrainerConfig,
    num_episodes: int,
    seed: int | None = None,
    *,
    explore: bool = False,
    video_dir: str | os.PathLike[str] | None = None,
    obs_filter: MeanStdFilter | None = None,
) -> dict[str, Any]:
    """Episode statistics of the policies playing ``num_episodes`` episodes of ``env`` in this process.

    Episode i resets with ``seed + i`` (unseeded without ``seed``); actions are deterministic
    unless ``explore``, and legal ones by each observation's or info's action mask. A Gymnasium
    env acts with ``default_policy``; in a multi-agent env each agent acts with the policy
    ``config.policy_mapping_fn`` maps it to (``config.env_config`` makes the env). With
    ``video_dir``, every episode is recorded there as an MP4 file (it needs the ``video`` extra).
    ``obs_filter``: the run's observation filter (see :mod:`flowrl.policy.filters`), applied
    without updating it. Returns the statistics of :func:`~flowrl.operators.metric_ops.summarize_episodes`
    and ``episodes``.
    """
    episodes = run_episodes(
        policy_map,
        get_env_creator(env),
        config,
        episode_seeds(seed, num_episodes),
        explore=explore,
        video_dir=None if video_dir is None else Path(video_dir),
        record=num_episodes if video_dir is not None else 0,
        obs_filter=obs_filter,
    )
    return {**summarize_episodes(episodes), "episodes": num_episodes}


def evaluate_policy_files(
    checkpoint: str | os.PathLike[str],
    num_episodes: int = 10,
    seed: int | None = None,
    *,
    video_dir: str | os.PathLike[str] | None = None,
    allow_imports: Iterable[str] | None = None,
) -> dict[str, Any]:
    """Episode statistics of a checkpoint's policies playing ``num_episodes`` episodes of its env, greedily.

    ``checkpoint``: a checkpoint directory or a run directory (its latest checkpoint). Episode i
    resets with ``seed + i`` (unseeded without ``seed``); with ``video_dir`` each episode is
    recorded there as an MP4 file. ``allow_imports``: the modules (and their submodules) the
    checkpoint may name and have imported, as for :func:`~flowrl.serve.inference.load_policy`.
    Returns the statistics plus the checkpoint's ``algo``, ``env`` and ``iteration``. Raises
    :class:`~flowrl.errors.CheckpointError` for a missing or damaged checkpoint or a module not allowed.
    """
    allowed = list(allow_imports or ())
    path = checkpoint_dir(Path(checkpoint))
    policy_ids = sorted(read_policies_document(path)["policies"])
    metadata = read_metadata(path)
    env, config_values = metadata.get("env"), metadata.get("config")
    if not isinstance(env, str) or not isinstance(config_values, dict):
        raise CheckpointError(
            f"{str(path / METADATA_FILE)!r} needs 'env' (a string) and 'config' (an object) to evaluate the checkpoint"
        )
    inference = {pid: load_policy(path, pid, allow_imports=allowed) for pid in policy_ids}
    policy_map: dict[str, Policy[Any]] = {pid: loaded.policy for pid, loaded in inference.items()}
    mapping = config_values.get("policy_mapping_fn")
    if len(policy_map) > 1 and not (isinstance(mapping, str) and _PATH.fullmatch(mapping)):
        raise CheckpointError(
            f"checkpoint {str(path)!r}: its run mapped agents to its policies {policy_ids} with "
            f"policy_mapping_fn={mapping!r}, which {METADATA_FILE} cannot carry (give it as a 'module:function' "
            "path to evaluate the checkpoint from its JSON files)"
        )
    where = repr(str(path / METADATA_FILE))
    with allowed_imports(allowed) as restriction:
        try:
            # With one policy every agent plays it: the run's mapping is not needed (nor imported).
            config = TrainerConfig.from_dict(
                {
                    "env_config": config_values.get("env_config") or {},
                    "policy_mapping_fn": mapping if len(policy_map) > 1 else None,
                }
            )
            first = inference[policy_ids[0]]
            stats = evaluate_policies(
                policy_map, env, config, num_episodes, seed, video_dir=video_dir, obs_filter=first.observation_filter
            )
        except FlowRLError:
            if restriction.refused:
                raise refused_import_error(where, restriction.refused[0]) from None
            raise
    return {**stats, "algo": first.algo, "env": env, "iteration": metadata.get("iteration")}
