"""Policies for inference, loaded from a checkpoint without Ray, a Trainer or unpickling.

Beside its pickled state a checkpoint holds two files anyone can read:

- ``policies.safetensors``: every policy's weights, one tensor per parameter, keyed
  ``"<policy_id>/<parameter name>"`` (safetensors stores raw arrays and a JSON header; loading
  it runs no code);
- ``policies.json``: what rebuilds each policy, laid out as::

    {"format": "flowrl-policies", "format_version": 1, "flowrl_version": "0.1.0",
     "algo": "ppo", "weights_file": "policies.safetensors",
     "policies": {"<policy_id>": {
         "observation_space": {"type": "Box", "dtype": "float32", "shape": [4], "low": [...], "high": [...]},
         "action_space": {"type": "Discrete", "n": 2, "start": 0, "dtype": "int64"},
         "config": {...the algorithm's config keys, as the policy's builder gets them...},
         "global_timestep": 12000,
         "observation_filter": {"type": "MeanStdFilter", "count": 12000, "mean": [...], "std": [...]},
         "tensors": {"<parameter name>": {"key": "<policy_id>/<parameter name>",
                                          "dtype": "float32", "shape": [64, 4]}}}}}

Spaces are described as :mod:`flowrl.envs.spaces` says. :func:`policy_files` writes both files'
contents; :func:`load_policy` rebuilds one policy from them with its algorithm's own builder.
``observation_filter`` is there only for a run with ``observation_filter: MeanStdFilter``: the
statistics (of flattened observations) the policy's inputs are normalized with, which
:class:`InferencePolicy` applies too.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import safetensors.numpy

from flowrl._version import __version__
from flowrl.config import TrainerConfig
from flowrl.data import DEFAULT_POLICY_ID
from flowrl.deferred import torch
from flowrl.envs.spaces import space_from_json, space_to_json
from flowrl.errors import CheckpointError, FlowRLError
from flowrl.importing import ImportNotAllowedError, allowed_imports
from flowrl.policy import Policy
from flowrl.policy.filters import MeanStdFilter
from flowrl.serve.inference_policy import InferencePolicy
from flowrl.storage.checkpoints import latest_checkpoint, list_checkpoints
from flowrl.storage.results import finite_number, result_value
from flowrl.storage.rundir import CHECKPOINTS_DIR, EXPERIMENT_FILE, read_results

POLICIES_JSON = "policies.json"
POLICIES_WEIGHTS = "policies.safetensors"
FORMAT = "flowrl-policies"
FORMAT_VERSION = 1
#: Config keys that describe the run, not a policy: not written (they may hold functions or
#: env objects that JSON cannot carry), so a rebuilt policy's config has their defaults.
_RUN_ONLY_KEYS = ("policy_mapping_fn", "env_config", "callbacks", "evaluation_config")


# -- writing -------------------------------------------------------------------------------


def policy_files(
    policy_map: Mapping[str, Policy[Any]],
    algo: str,
    config: TrainerConfig,
    observation_filter: MeanStdFilter | None = None,
) -> dict[str, bytes]:
    """The contents of ``policies.safetensors`` and ``policies.json`` for a checkpoint of ``policy_map``.

    ``algo`` is the algorithm's registered name and ``config`` the Trainer's config; each
    policy's entry records the config its builder got (with its ``policies[pid]["config"]``
    overrides applied), and ``observation_filter`` (the run's, if any) its statistics. Returns
    ``{file name: bytes}``. A space or config value JSON cannot
    describe raises :class:`~flowrl.errors.CheckpointError` naming it. Call it where no other
    thread changes the weights (under the local worker's ``lock`` while a learner thread runs).
    """
    from flowrl.algorithms import get_algorithm

    algorithm = get_algorithm(algo)
    tensors: dict[str, np.ndarray] = {}
    entries: dict[str, Any] = {}
    for pid, policy in policy_map.items():
        listing: dict[str, Any] = {}
        for name, value in policy.get_weights().items():
            array = np.require(value, requirements="C")  # not ascontiguousarray: it makes scalars 1-d
            key = f"{pid}/{name}"
            tensors[key] = array
            listing[name] = {"key": key, "dtype": array.dtype.name, "shape": list(array.shape)}
        entries[pid] = {
            "observation_space": space_to_json(policy.observation_space, f"policy {pid!r}: its observation space"),
            "action_space": space_to_json(policy.action_space, f"policy {pid!r}: its action space"),
            "config": _config_to_json(_policy_config(algorithm.make_policies is not None, config, pid)),
            "global_timestep": int(policy.global_timestep),
            "tensors": listing,
        }
        if observation_filter is not None:
            entries[pid]["observation_filter"] = observation_filter.to_json()
    document = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "flowrl_version": __version__,
        "algo": algorithm.name,
        "weights_file": POLICIES_WEIGHTS,
        "policies": entries,
    }
    try:
        text = json.dumps(document, indent=2, allow_nan=True)
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"cannot write {POLICIES_JSON}: {e}") from None
    return {POLICIES_WEIGHTS: safetensors.numpy.save(tensors), POLICIES_JSON: text.encode()}


def _policy_config(shared_builder: bool, config: TrainerConfig, pid: str) -> TrainerConfig:
    """The config a policy's builder gets: the whole config for an algorithm that builds all
    its policies together (``make_policies``), else the config with the policy's overrides
    (as :func:`flowrl.engine.build.policy_specs` applies them)."""
    return config if shared_builder else config.for_policy(pid)


def _config_to_json(config: TrainerConfig) -> dict[str, Any]:
    values = config.to_dict()
    for key in _RUN_ONLY_KEYS:
        values.pop(key, None)
    if "policies" in values:
        # The ids only: spaces are written per policy, and the overrides are already applied.
        values["policies"] = {pid: None for pid in values["policies"]}
    for key, value in values.items():
        try:
            json.dumps(value)
        except (TypeError, ValueError) as e:
            raise CheckpointError(
                f"cannot write {POLICIES_JSON}: config key {key!r}={value!r} is not JSON ({e})"
            ) from None
    return values


# -- reading -------------------------------------------------------------------------------


def load_policy(
    checkpoint: str | os.PathLike[str],
    policy_id: str = DEFAULT_POLICY_ID,
    allow_imports: Iterable[str] | None = None,
) -> InferencePolicy:
    """The policy ``policy_id`` of a checkpoint, rebuilt for inference from its ``policies.json`` and
    ``policies.safetensors`` alone: no Ray, no Trainer, nothing unpickled (``state.pkl`` is never opened).

    ``checkpoint`` is a checkpoint directory, a run directory (its latest checkpoint is used) or a
    Tune trial directory (its best checkpoint), as :func:`checkpoint_dir` resolves them.
    Raises :class:`~flowrl.errors.CheckpointError` if the files are missing or damaged, the
    policy id is not among the checkpoint's, or a weight does not fit the rebuilt model.
    Nothing the checkpoint names is imported (a custom model, callbacks or a mapping function,
    as ``"module:name"``) unless ``allow_imports`` lists its module or a package holding it
    (``["my_pkg"]`` allows ``my_pkg.models``); a module not allowed raises ``CheckpointError``
    naming the config key and the module, before it is imported.
    """
    path = checkpoint_dir(Path(checkpoint))
    document = read_policies_document(path)
    policies = document["policies"]
    if policy_id not in policies:
        known = sorted(policies)
        raise CheckpointError(f"checkpoint {str(path)!r} has no policy {policy_id!r}; its policies are {known}")
    algo = document["algo"]
    policy = _build_policy(path, algo, policies, policy_id, allow_imports)
    _load_weights(path, document, policy, policy_id)
    observation_filter = _read_filter(path, policies[policy_id])
    for module in (getattr(policy, "model", None), getattr(policy, "target_model", None)):
        if isinstance(module, torch.nn.Module):
            module.eval()  # dropout and batch norm in inference behaviour
            module.requires_grad_(False)
    return InferencePolicy(policy, policy_id, algo, observation_filter)


def _read_filter(path: Path, entry: Mapping[str, Any]) -> MeanStdFilter | None:
    """The observation filter a policy's entry describes (None when it has none)."""
    description = entry.get("observation_filter")
    if description is None:
        return None
    try:
        return MeanStdFilter.from_json(description)
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(
            f"{str(path / POLICIES_JSON)!r} is corrupt: its observation_filter: {type(e).__name__}: {e}"
        ) from None


def checkpoint_dir(path: Path, checkpoint: int | None = None) -> Path:
    """The checkpoint directory ``path`` names, the one resolver of ``load_policy``, ``flowrl evaluate`` and ``export``.

    ``path`` is a checkpoint directory (itself), a run directory (its latest checkpoint under
    ``checkpoints/``), a directory of ``checkpoint_<iteration>`` directories (its latest), or a
    ``flowrl tune`` trial directory, whose Tune ``checkpoint_*`` directories each hold a flowrl
    checkpoint: the best by the experiment's metric and mode (in the experiment directory's
    ``spec.json``, scored with the trial's ``progress.jsonl``), else the latest. ``checkpoint``
    picks the checkpoint of that iteration instead. Raises :class:`~flowrl.errors.CheckpointError`
    naming what is there instead.
    """
    if (path / POLICIES_JSON).is_file():
        if checkpoint is not None:
            raise CheckpointError(
                f"{str(path)!r} is a checkpoint directory; checkpoint {checkpoint} picks one of "
                "a run directory's checkpoints: give the run directory"
            )
        return path
    if not path.is_dir():
        raise CheckpointError(f"checkpoint {str(path)!r} does not exist or is not a directory")
    found = list_checkpoints(path / CHECKPOINTS_DIR) or list_checkpoints(path)
    in_trial = [] if found else [latest for tune in _tune_checkpoints(path) if (latest := latest_checkpoint(tune))]
    if not found and not in_trial:
        if (path / CHECKPOINTS_DIR).is_dir():
            where = str(path / CHECKPOINTS_DIR)
            raise CheckpointError(f"run directory {str(path)!r} has no complete checkpoint under {where!r}")
        old = (
            " (it holds state.pkl: written by a flowrl older than policies.json; "
            "restore it with Trainer.from_checkpoint and save it again)"
        )
        raise CheckpointError(
            f"checkpoint {str(path)!r} has no {POLICIES_JSON}{old if (path / 'state.pkl').is_file() else ''}; "
            "give a checkpoint directory, a run directory with a checkpoints/ folder or a Tune trial directory"
        )
    if checkpoint is not None:
        numbered = {_iteration(p): p for p in found or in_trial}
        if checkpoint not in numbered:
            raise CheckpointError(
                f"run directory {str(path)!r} has no complete checkpoint {checkpoint}; "
                f"its checkpoints are {sorted(numbered)}"
            )
        return numbered[checkpoint]
    return found[-1] if found else _best_of_trial(path, in_trial)


def _iteration(checkpoint: Path) -> int:
    """The iteration a ``checkpoint_<iteration>`` directory's name gives."""
    return int(checkpoint.name.rpartition("_")[2])


def _tune_checkpoints(trial: Path) -> list[Path]:
    """A Tune trial directory's ``checkpoint_<index>`` directories, by index."""
    return sorted(
        (entry for entry in trial.glob("checkpoint_*") if entry.is_dir() and entry.name[11:].isdigit()),
        key=_iteration,
    )


def _best_of_trial(trial: Path, checkpoints: list[Path]) -> Path:
    """The best of a Tune trial's flowrl ``checkpoints`` (by iteration) by the metric and mode its experiment
    recorded, scored by the trial's results at each one's iteration; the latest when none can be scored."""
    try:
        experiment = json.loads((trial.parent / EXPERIMENT_FILE).read_text(encoding="utf-8"))
        metric, mode = str(experiment["metric"]), experiment["mode"]
        results = read_results(trial)
    except (OSError, ValueError, KeyError, TypeError, FlowRLError):
        return checkpoints[-1]
    by_iteration = {result.get("training_iteration"): finite_number(result_value(result, metric)) for result in results}
    scored = [(value, _iteration(c), c) for c in checkpoints if (value := by_iteration.get(_iteration(c))) is not None]
    if not scored or mode not in ("max", "min"):
        return checkpoints[-1]
    sign = 1.0 if mode == "max" else -1.0
    return max(scored, key=lambda entry: (sign * entry[0], entry[1]))[2]


def read_policies_document(path: Path) -> dict[str, Any]:
    """The parsed ``policies.json`` of the checkpoint directory ``path`` (CheckpointError if missing or bad)."""
    file = path / POLICIES_JSON
    if not file.is_file():
        raise CheckpointError(f"checkpoint {str(path)!r} has no {POLICIES_JSON}")
    try:
        document = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise CheckpointError(f"{str(file)!r} is corrupt: {type(e).__name__}: {e}") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise CheckpointError(f"{str(file)!r} is corrupt: not a {FORMAT} document")
    version = document.get("format_version")
    if version != FORMAT_VERSION:
        raise CheckpointError(
            f"{str(file)!r} has format_version {version!r}; this flowrl reads version {FORMAT_VERSION}"
        )
    if not isinstance(document.get("algo"), str) or not isinstance(document.get("policies"), dict):
        raise CheckpointError(f"{str(file)!r} is corrupt: it needs 'algo' (a string) and 'policies' (an object)")
    return document


def refused_import_error(where: str, refused: ImportNotAllowedError) -> CheckpointError:
    """The error for a checkpoint (``where``) naming a module that loading it was not allowed to import."""
    key = f"its config key {refused.key!r}" if refused.key else "its config"
    return CheckpointError(
        f"{where}: {key} names the module {refused.module!r}, and loading a checkpoint imports nothing it names "
        f"(importing runs the module's code); if you trust it, allow it: allow_imports=[{refused.module!r}], "
        f"or --allow-import {refused.module} for flowrl evaluate and flowrl export"
    )


def _build_policy(
    path: Path, algo: str, policies: Mapping[str, Any], policy_id: str, allow_imports: Iterable[str] | None
) -> Policy[Any]:
    """The policy built by the algorithm's own builder from the spaces and config in ``policies.json``,
    importing only the modules ``allow_imports`` allows."""
    from flowrl.algorithms import get_algorithm

    where = f"{str(path / POLICIES_JSON)!r}"
    try:
        algorithm = get_algorithm(algo)
    except FlowRLError as e:
        raise CheckpointError(
            f"{where} was written by algorithm {algo!r}, which this process does not know ({e}); "
            "register it with flowrl.algorithms.register_algorithm first"
        ) from None
    try:
        spaces = {
            pid: (space_from_json(entry["observation_space"]), space_from_json(entry["action_space"]))
            for pid, entry in policies.items()
        }
        config_values = policies[policy_id]["config"]
        global_timestep = int(policies[policy_id].get("global_timestep", 0))
    except (KeyError, TypeError, ValueError, AttributeError, AssertionError) as e:
        raise CheckpointError(f"{where} is corrupt: {type(e).__name__}: {e}") from None
    failure: FlowRLError | None = None
    with allowed_imports(allow_imports) as restriction:
        try:
            config = algorithm.config_class.from_dict(config_values)
            if algorithm.make_policies is not None:
                spec = algorithm.make_policies(spaces, config)[policy_id]
            else:
                spec = algorithm.make_policy(*spaces[policy_id], config)
            policy = spec.build()
        except FlowRLError as e:
            failure = e
    # A refusal first, even one a config check turned into a problem message, or one a builder absorbed.
    if restriction.refused:
        raise refused_import_error(where, restriction.refused[0]) from None
    if failure is not None:
        raise CheckpointError(
            f"{where}: policy {policy_id!r} of algorithm {algo!r} cannot be rebuilt: {failure}"
        ) from failure
    # Explorations that follow a schedule (epsilon-greedy, action noise) go on from where training left them.
    policy.global_timestep = global_timestep
    return policy


def _load_weights(path: Path, document: Mapping[str, Any], policy: Policy[Any], policy_id: str) -> None:
    """Set the policy's weights from the safetensors file, after checking every name and shape."""
    weights_file = document.get("weights_file", POLICIES_WEIGHTS)
    if not isinstance(weights_file, str) or Path(weights_file).name != weights_file:  # beside policies.json only
        raise CheckpointError(
            f"{str(path / POLICIES_JSON)!r} is corrupt: weights_file={weights_file!r} is not a file name"
        )
    file = path / weights_file
    if not file.is_file():
        raise CheckpointError(f"checkpoint {str(path)!r} has no {file.name}")
    try:
        stored = safetensors.numpy.load_file(file)
    except Exception as e:  # noqa: BLE001 - safetensors raises its own error types for a damaged file
        raise CheckpointError(f"{str(file)!r} is corrupt: {type(e).__name__}: {e}") from None
    try:
        entries = document["policies"][policy_id]["tensors"].items()
        listing = {name: str(entry["key"]) for name, entry in entries}
    except (KeyError, TypeError, AttributeError) as e:
        where = str(path / POLICIES_JSON)
        raise CheckpointError(f"{where!r} is corrupt: policy {policy_id!r} has no valid 'tensors' ({e})") from None
    expected = {name: value.shape for name, value in policy.get_weights().items()}
    problems = []
    weights: dict[str, np.ndarray] = {}
    for name, shape in expected.items():
        if name not in listing:
            problems.append(f"the rebuilt model's weight {name!r} {tuple(shape)} is not in the checkpoint")
        elif listing[name] not in stored:
            problems.append(f"weight {name!r} is listed as {listing[name]!r}, which {file.name} does not hold")
        elif stored[listing[name]].shape != shape:
            problems.append(
                f"weight {name!r} has shape {tuple(stored[listing[name]].shape)} in {file.name}, "
                f"but the model rebuilt from {POLICIES_JSON} has {tuple(shape)}"
            )
        else:
            weights[name] = stored[listing[name]]
    unknown = [name for name in listing if name not in expected]
    problems += [f"the checkpoint's weight {name!r} is not in the rebuilt model" for name in unknown]
    if problems:
        details = "\n".join(f"  - {p}" for p in problems)
        raise CheckpointError(
            f"checkpoint {str(path)!r}: the weights of policy {policy_id!r} do not fit its model:\n{details}"
        )
    policy.set_weights(weights)
