"""Policies exported for serving: a TorchScript or ONNX model from a checkpoint, loadable without flowrl.

:func:`export_policy` rebuilds one policy from a checkpoint's portable files (``policies.json`` and
``policies.safetensors``, through :func:`flowrl.load_policy`; ``state.pkl`` is never opened) and
writes a model that maps a batch of observations to the greedy actions
:meth:`~flowrl.serve.inference.InferencePolicy.compute_actions` gives, followed by what the action was
chosen from:

- categorical policies (PG, A2C, A3C, PPO, IMPALA, APPO; ES and ARS on Discrete actions):
  ``actions`` (the argmax), ``logits``;
- Q-networks (DQN, Ape-X, dueling or not): ``actions`` (the argmax), ``q_values``;
- diagonal Gaussians (the policy-gradient family on Box actions): ``actions`` (the mean,
  clipped to the bounds), ``mean``, ``log_std``;
- deterministic actors (DDPG, TD3, Ape-X DDPG; ES and ARS on Box actions): ``actions``
  (clipped to the bounds).

Loading it needs only ``torch`` (TorchScript: ``torch.jit.load``) or only ``onnxruntime`` (ONNX);
the batch dimension is dynamic. The run's observation filter is inside the model, and
observations of a Dict or Tuple space go in flattened. A policy of a masked observation space (a Dict
of ``"observations"`` and ``"action_mask"``) takes two inputs: the flattened ``"observations"`` part as
``obs``, and ``action_mask`` (``[batch, n]`` bools, True: legal); its actions are legal ones. A recurrent
policy (``model.use_lstm``, or a recurrent custom model) also takes its state as ``state_in_0``, ``state_in_1``,
... (zeros at an episode's start) and, if its model reads them, ``prev_actions`` and ``prev_rewards`` (zeros
at an episode's start), and returns the next state as ``state_out_0``, ... after the other outputs: the
caller feeds them back as the next step's ``state_in_*``. Beside
the model, ``<model file>.json`` describes its inputs (name, dtype, shape), its outputs and the spaces,
so a server can check what it is handed::

    path = export_policy("flowrl_results/ppo_CartPole-v1_20240101-120000", format="onnx")
    # .../exports/checkpoint_000010/default_policy.onnx (+ default_policy.onnx.json)

ONNX export needs the ``export`` extra (:func:`~flowrl.errors.install_hint`; onnx, onnxscript for
PyTorch's exporter, and onnxruntime, with which every export is checked before it is kept).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import logging
import os
import re
import warnings
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.spaces.utils import flatdim

from flowrl._version import __version__
from flowrl.data import DEFAULT_POLICY_ID
from flowrl.envs.flatten import action_mask_of, flatten_observation, is_masked, is_structured, model_space
from flowrl.envs.spaces import space_to_json
from flowrl.errors import RunError, install_hint
from flowrl.policy import TorchPolicy
from flowrl.policy.model_options import is_image_space
from flowrl.serve.greedy import BATCH, GreedyPolicyModule, RecurrentInputs, _dims, _greedy_module, _Output
from flowrl.serve.inference import POLICIES_JSON, InferencePolicy, checkpoint_dir, load_policy
from flowrl.storage.rundir import CHECKPOINTS_DIR, PARAMS_FILE

FORMATS = ("torchscript", "onnx")
EXPORT_EXTRA = "export"
DESCRIPTION_FORMAT = "flowrl-export"
DESCRIPTION_VERSION = 1
EXPORTS_DIR = "exports"
INPUT_NAME = "obs"
MASK_INPUT_NAME = "action_mask"
STATE_INPUT_PREFIX = "state_in_"
PREV_ACTIONS_INPUT = "prev_actions"
PREV_REWARDS_INPUT = "prev_rewards"
_SUFFIXES = {"torchscript": ".pt", "onnx": ".onnx"}
# The batch the model is traced with: neither 0 nor 1, which torch.export would treat as fixed sizes.
_TRACE_BATCH = 3
_CHECK_BATCH = 17


def export_policy(
    path: str | os.PathLike[str],
    format: str = "torchscript",
    out: str | os.PathLike[str] | None = None,
    policy_id: str | None = None,
    checkpoint: int | None = None,
    allow_imports: Iterable[str] | None = None,
) -> Path:
    """Export one policy of a checkpoint as a TorchScript (``.pt``) or ONNX (``.onnx``) model; returns its path.

    ``path``: a run directory (its latest checkpoint, or ``checkpoint_<checkpoint>`` when
    ``checkpoint`` is given), a checkpoint directory or a Tune trial directory (its best
    checkpoint). ``format``: ``"torchscript"`` or ``"onnx"``. ``out``: the directory to write into
    (default ``exports/<checkpoint name>`` in the run directory; for a checkpoint outside a run
    directory, in the current directory).
    ``policy_id``: which policy (needed when the checkpoint holds several). The model is written
    as ``<policy_id>.pt`` or ``.onnx``, with its description in ``<model file>.json``.
    ``allow_imports``: the modules the checkpoint may name and have imported, as for
    :func:`~flowrl.serve.inference.load_policy` (by default none).

    Raises :class:`~flowrl.errors.CheckpointError` for a checkpoint that is missing, damaged,
    lacks the policy or names a module not allowed, and :class:`~flowrl.errors.RunError` for an
    unknown format, a missing optional dependency, or a policy whose model or spaces cannot be
    exported (saying why).
    """
    if format not in FORMATS:
        raise RunError(f"export format {format!r} is not one of {', '.join(FORMATS)}")
    if format == "onnx":
        _check_onnx_dependencies()
    directory = find_checkpoint(path, checkpoint)
    policy_id = _choose_policy(directory, policy_id)
    inference = load_policy(directory, policy_id, allow_imports=allow_imports)
    policy = inference.policy
    what = f"policy {policy_id!r} of {str(directory)!r} ({inference.algo})"
    if not isinstance(policy, TorchPolicy):
        raise RunError(f"{what} is a {type(policy).__name__}, not a TorchPolicy: only PyTorch models can be exported")
    module, outputs = _greedy_module(policy, inference.observation_filter, what)
    example = _inputs(module, policy.observation_space, policy.action_space, _TRACE_BATCH)
    target = Path(out) if out is not None else _default_out(directory)
    target.mkdir(parents=True, exist_ok=True)
    model_file = target / f"{_file_stem(policy_id)}{_SUFFIXES[format]}"
    with _quiet_exporters():
        if format == "torchscript":
            _write_torchscript(module, example, model_file, what)
        else:
            _write_onnx(module, example, [output.name for output in outputs], model_file, what)
    _check_export(module, model_file, format, policy, outputs, what)
    description = _describe(inference, directory, format, model_file, outputs, module)
    description_file = model_file.with_name(model_file.name + ".json")
    description_file.write_text(json.dumps(description, indent=2) + "\n", encoding="utf-8")
    return model_file


def find_checkpoint(path: str | os.PathLike[str], checkpoint: int | None = None) -> Path:
    """The checkpoint directory ``path`` names, as :func:`~flowrl.serve.inference.checkpoint_dir` resolves it: itself,
    a run directory's latest (or ``checkpoint_<checkpoint>``), or a Tune trial directory's best."""
    return checkpoint_dir(Path(path), checkpoint)


def _choose_policy(directory: Path, policy_id: str | None) -> str:
    if policy_id is not None:
        return policy_id
    try:
        ids = sorted(json.loads((directory / POLICIES_JSON).read_text(encoding="utf-8"))["policies"])
    except (OSError, ValueError, KeyError, TypeError):
        return DEFAULT_POLICY_ID  # load_policy reports what is wrong with the file
    if len(ids) > 1:
        raise RunError(
            f"checkpoint {str(directory)!r} holds the policies {ids}: choose the one to export "
            "(policy_id=..., flowrl export --policy ID)"
        )
    return ids[0] if ids else DEFAULT_POLICY_ID


def _input_shape(space: gym.Space[Any]) -> list[int | str]:
    """The exported model's input shape: Discrete indices, flattened Dict/Tuple observations, or the Box's shape."""
    space = model_space(space)
    if isinstance(space, gym.spaces.Discrete):
        return [BATCH]
    if is_structured(space):
        return [BATCH, int(flatdim(space))]
    return [BATCH, *_dims(space)]


def _input_dtype(space: gym.Space[Any]) -> np.dtype[Any]:
    space = model_space(space)
    if isinstance(space, gym.spaces.Discrete):
        return np.dtype(np.int64)
    if is_image_space(space) and space.dtype == np.uint8:
        return np.dtype(np.uint8)
    return np.dtype(np.float32)


def _inputs(
    module: GreedyPolicyModule, space: gym.Space[Any], action_space: gym.Space[Any], n: int, seed: int = 0
) -> tuple[torch.Tensor, ...]:
    """``module``'s inputs for ``n`` observations drawn from ``space`` (seeded, from a copy: the policy's
    space keeps its RNG): the observations, for a masked module their action masks, for a recurrent one
    random states and previous actions and rewards."""
    space = copy.deepcopy(space)
    space.seed(seed)
    samples = [space.sample() for _ in range(n)]
    rows = [np.asarray(flatten_observation(space, sample)) for sample in samples]
    inputs = [torch.as_tensor(np.stack(rows).astype(_input_dtype(space)))]
    if module.masked:
        inputs.append(torch.as_tensor(np.stack([np.asarray(action_mask_of(sample)) != 0 for sample in samples])))
    recurrent = module.recurrent
    if recurrent is not None:
        rng = np.random.default_rng(seed)
        inputs += [torch.as_tensor(rng.normal(size=(n, size)).astype(np.float32)) for size in recurrent.state_sizes]
        if recurrent.prev_action:
            actions = copy.deepcopy(action_space)
            actions.seed(seed)
            inputs.append(torch.as_tensor(np.stack([actions.sample() for _ in range(n)])))
        if recurrent.prev_reward:
            inputs.append(torch.as_tensor(rng.normal(size=n).astype(np.float32)))
    return tuple(inputs)


def _check_onnx_dependencies() -> None:
    for package in ("onnx", "onnxscript", "onnxruntime"):
        try:
            __import__(package)
        except ImportError as e:
            raise RunError(
                f"exporting to ONNX needs the optional dependency {package} ({e}): {install_hint(EXPORT_EXTRA)}"
            ) from None


@contextlib.contextmanager
def _quiet_exporters() -> Iterator[None]:
    """Hold back what PyTorch's exporters print that says nothing about this export: TorchScript's
    deprecation, and the ONNX exporter's notes on optional packages it skips."""
    loggers = [logging.getLogger("torch.onnx"), logging.getLogger("torch.export")]
    levels = [logger.level for logger in loggers]
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"torch\.")
        warnings.filterwarnings("ignore", category=FutureWarning)
        # An LSTM's checks of its input sizes, which the exported model repeats for every batch size anyway.
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning, module=r"torch\.nn\.modules\.rnn")
        # The ONNX exporter's notes on an LSTM's weight list and on the one batch axis that several inputs share.
        warnings.filterwarnings("ignore", message=r"The tensor attributes .*_flat_weights", category=UserWarning)
        warnings.filterwarnings("ignore", message=r".*axis name: batch will not be used", category=UserWarning)
        for logger in loggers:
            logger.setLevel(logging.ERROR)
        try:
            yield
        finally:
            for logger, level in zip(loggers, levels):
                logger.setLevel(level)


def _write_torchscript(module: GreedyPolicyModule, example: tuple[torch.Tensor, ...], file: Path, what: str) -> None:
    try:
        with torch.no_grad():
            traced = torch.jit.trace(module, example)
        traced.save(str(file))
    except Exception as e:  # noqa: BLE001 - tracing a user's model can fail in many ways; say which model
        raise RunError(f"{what}: its model cannot be traced to TorchScript: {type(e).__name__}: {e}") from e


def _write_onnx(
    module: GreedyPolicyModule, example: tuple[torch.Tensor, ...], names: Sequence[str], file: Path, what: str
) -> None:
    batch = torch.export.Dim(BATCH)  # one dimension: the observations and their masks come in the same batch
    try:
        torch.onnx.export(
            module,
            example,
            str(file),
            input_names=_input_names(module),
            output_names=list(names),
            dynamic_shapes=_dynamic_shapes(len(example), batch),
            dynamo=True,
            external_data=False,
            verbose=False,
        )
    except Exception as e:  # noqa: BLE001 - as for TorchScript: the exporter raises many error types
        raise RunError(f"{what}: its model cannot be exported to ONNX: {type(e).__name__}: {e}") from e


def _dynamic_shapes(count: int, batch: Any) -> tuple[Any, ...]:
    """The batch dimension of ``forward(obs, *extra)``'s ``count`` inputs, laid out as torch.export reads them:
    the observations', then (if there are others) a tuple of the others'."""
    return ({0: batch}, tuple({0: batch} for _ in range(count - 1))) if count > 1 else ({0: batch},)


def _input_names(module: GreedyPolicyModule) -> list[str]:
    """The exported model's input names: the observations, then (a masked policy's) the action masks, then (a
    recurrent policy's) its state and the previous actions and rewards its model reads."""
    names = [INPUT_NAME, *([MASK_INPUT_NAME] if module.masked else [])]
    recurrent = module.recurrent
    if recurrent is not None:
        names += [f"{STATE_INPUT_PREFIX}{k}" for k in range(recurrent.state_entries)]
        names += [PREV_ACTIONS_INPUT] if recurrent.prev_action else []
        names += [PREV_REWARDS_INPUT] if recurrent.prev_reward else []
    return names


def _run_exported(file: Path, format: str, inputs: tuple[torch.Tensor, ...], names: list[str]) -> list[np.ndarray]:
    if format == "torchscript":
        with _quiet_exporters(), torch.no_grad():
            loaded = torch.jit.load(str(file))
            return [t.numpy() for t in loaded(*inputs)]
    import onnxruntime  # type: ignore[import-untyped]

    session = onnxruntime.InferenceSession(str(file), providers=["CPUExecutionProvider"])
    feed = {name: tensor.numpy() for name, tensor in zip(names, inputs)}
    return list(session.run(None, feed))


def _check_export(
    module: GreedyPolicyModule,
    file: Path,
    format: str,
    policy: TorchPolicy[Any],
    outputs: Sequence[_Output],
    what: str,
) -> None:
    """Run the written model on a batch of another size than the traced one; it must give what ``module`` gives.

    Catches a model whose trace fixed the batch size or followed one branch of a data-dependent
    condition; the file is removed and a :class:`~flowrl.errors.RunError` says how it differed.
    """
    inputs = _inputs(module, policy.observation_space, policy.action_space, _CHECK_BATCH, seed=1)
    with torch.no_grad():
        expected = [t.numpy() for t in module(*inputs)]
    try:
        got = _run_exported(file, format, inputs, _input_names(module))
        problems = _differences(outputs, expected, got, module.kind)
    except Exception as e:  # noqa: BLE001 - a model traced for one batch size fails in its runtime's own ways
        problems = [f"running it raised {type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"]
    if problems:
        file.unlink(missing_ok=True)
        raise RunError(
            f"{what}: the exported {format} model does not compute what the policy does on a batch of "
            f"{_CHECK_BATCH} observations ({'; '.join(problems)}); a model whose computation depends on "
            "the batch size or branches on values cannot be exported"
        )


def _differences(
    outputs: Sequence[_Output], expected: Sequence[np.ndarray], got: Sequence[np.ndarray], kind: str
) -> list[str]:
    """How the exported model's outputs differ from the module's; actions chosen by argmax count only where the
    best two scores are not tied."""
    problems = []
    if len(got) != len(expected):
        problems.append(f"{len(got)} outputs instead of {len(expected)}")
    for output, want, have in zip(outputs, expected, got):
        if have.shape != want.shape or have.dtype != want.dtype:
            problems.append(f"{output.name}: {have.dtype}{list(have.shape)} instead of {want.dtype}{list(want.shape)}")
        elif want.dtype.kind == "f" and not np.allclose(
            have, want, rtol=1e-3, atol=1e-3 * max(1.0, float(np.abs(want).max()))
        ):
            problems.append(f"{output.name}: values differ by up to {float(np.abs(have - want).max()):.3g}")
    if kind in ("categorical", "q_values") and not problems:
        scores = np.sort(expected[1], axis=-1)
        clear = (scores[:, -1] - scores[:, -2]) > 1e-4 if scores.shape[-1] > 1 else np.ones(len(scores), bool)
        if not np.array_equal(got[0][clear], expected[0][clear]):
            problems.append("actions: the exported model picks other actions")
    return problems


def _describe(
    inference: InferencePolicy,
    checkpoint: Path,
    format: str,
    model_file: Path,
    outputs: Sequence[_Output],
    module: GreedyPolicyModule,
) -> dict[str, Any]:
    """The exported model's description: its inputs (observations, an ``action_mask`` where the module is
    ``masked``, a recurrent module's state and previous action and reward), outputs and spaces."""
    policy, policy_id, obs_filter = inference.policy, inference.policy_id, inference.observation_filter
    obs_space = policy.observation_space
    dtype = _input_dtype(obs_space)
    observed = model_space(obs_space)
    if isinstance(observed, gym.spaces.Discrete):
        meaning = "observation indices (the model one-hot encodes them)"
    elif is_structured(observed):
        meaning = (
            "observations flattened with gymnasium.spaces.utils.flatten(observation_space, obs): the parts in "
            "the space's order (a Dict's keys as it lists them), Box parts flattened, Discrete parts one-hot"
        )
    else:
        cast = (
            "" if np.dtype(observed.dtype) == dtype else f" (the observation space's {observed.dtype} cast to {dtype})"
        )
        meaning = "observations as the env returns them" + cast
    if is_masked(obs_space):
        meaning = f"the 'observations' part of each observation: {meaning}"
    if obs_filter is not None:
        meaning += "; the model normalizes them with the run's observation filter (observation_filter below)"
    takes_mask = module.masked
    names = _input_names(module)
    args, feed = ", ".join(names), ", ".join(f"'{name}': {name}" for name in names)
    loading = (
        f"torch.jit.load(path); model({args}) returns the outputs as a tuple, in this order"
        if format == "torchscript"
        else f"onnxruntime.InferenceSession(path).run(None, {{{feed}}}) returns the outputs in this order"
    )
    return {
        "format": DESCRIPTION_FORMAT,
        "format_version": DESCRIPTION_VERSION,
        "flowrl_version": __version__,
        "model_format": format,
        "model_file": model_file.name,
        "loading": loading,
        "algo": inference.algo,
        "policy_id": policy_id,
        "checkpoint": str(checkpoint.resolve()),
        "global_timestep": int(policy.global_timestep),
        "input": {"name": INPUT_NAME, "dtype": dtype.name, "shape": _input_shape(obs_space), "description": meaning},
        **({"action_mask_input": _mask_input(policy.action_space)} if takes_mask else {}),
        **({"recurrent_inputs": _recurrent_inputs(module.recurrent, policy.action_space)} if module.recurrent else {}),
        "outputs": [dataclasses.asdict(output) for output in outputs],
        "observation_filter": None if obs_filter is None else obs_filter.to_json(),
        "observation_space": space_to_json(obs_space, f"policy {policy_id!r}: its observation space"),
        "action_space": space_to_json(policy.action_space, f"policy {policy_id!r}: its action space"),
    }


def _mask_input(action_space: gym.Space[Any]) -> dict[str, Any]:
    """The description of a masked policy's second input."""
    return {
        "name": MASK_INPUT_NAME,
        "dtype": "bool",
        "shape": [BATCH, *_dims(action_space)],
        "description": "each row's legal actions (True: legal), e.g. the observation's action_mask cast to bool",
    }


def _recurrent_inputs(recurrent: RecurrentInputs, action_space: gym.Space[Any]) -> list[dict[str, Any]]:
    """The descriptions of a recurrent policy's inputs after the observations (and mask), in their order."""
    inputs: list[dict[str, Any]] = [
        {
            "name": f"{STATE_INPUT_PREFIX}{k}",
            "dtype": "float32",
            "shape": [BATCH, size],
            "description": f"entry {k} of each row's recurrent state: zeros at an episode's start, then the "
            f"state_out_{k} of the row's previous step",
        }
        for k, size in enumerate(recurrent.state_sizes)
    ]
    if recurrent.prev_action:
        discrete = isinstance(action_space, gym.spaces.Discrete)
        inputs.append(
            {
                "name": PREV_ACTIONS_INPUT,
                "dtype": "int64" if discrete else "float32",
                "shape": [BATCH] if discrete else [BATCH, *_dims(action_space)],
                "description": "each row's previous action (zeros at an episode's start)",
            }
        )
    if recurrent.prev_reward:
        inputs.append(
            {
                "name": PREV_REWARDS_INPUT,
                "dtype": "float32",
                "shape": [BATCH],
                "description": "each row's previous reward (zero at an episode's start)",
            }
        )
    return inputs


def _default_out(checkpoint: Path) -> Path:
    """``exports/<checkpoint name>`` in the checkpoint's run directory, else in the current directory."""
    parent = checkpoint.resolve().parent
    if parent.name == CHECKPOINTS_DIR:
        return parent.parent / EXPORTS_DIR / checkpoint.name
    if (parent.parent / PARAMS_FILE).is_file():  # a Tune trial directory: <trial>/checkpoint_<index>/checkpoint_<n>
        return parent.parent / EXPORTS_DIR / checkpoint.name
    return Path(EXPORTS_DIR) / checkpoint.name


def _file_stem(policy_id: str) -> str:
    # A policy id is any string; a file name must not hold separators.
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", policy_id).strip(".") or "policy"
