"""What a checkpoint must match before it is restored into a Trainer, checked before anything changes.

A restore compares the checkpoint's :class:`Layout` with the target trainer's. A
*mismatch* (another algorithm or env, other observation or action spaces, other model
parameter shapes or policies) means the checkpoint cannot be restored there at all. A
*partial* restore (a different number of replay shards, an operator state or a target
network the checkpoint lacks or this plan lacks) would lose part of the checkpoint or of
the plan's state: it is refused unless the caller allows it, and then reported. A checkpoint of
weights and counters only (``"kind": "weights"``) has no replay state by design: its replay
buffers are never a partial restore (the Trainer warns that they start empty).
Config values that differ are *overrides*: the trainer's own values win.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import gymnasium as gym
import numpy as np

from flowrl.storage.checkpoints import KIND_KEY, WEIGHTS_KIND


@dataclass(frozen=True)
class Layout:
    """The parts of a trainer (or of a saved trainer state) a restore must agree on.

    ``spaces`` is None for a state written before checkpoints recorded them, and
    ``operators`` for one written before every stateful operator was saved; ``env`` is None
    when the env is a creator function rather than a registered id. ``weights_only``: a saved
    state of weights and counters only, without replay buffers.
    """

    algo: str
    env: str | None
    spaces: Mapping[str, tuple[gym.Space, gym.Space]] | None
    weight_shapes: Mapping[str, Mapping[str, tuple[int, ...]]]
    target_networks: frozenset[str]
    operators: frozenset[str] | None
    replay_shards: int
    replay_buffer: bool
    weights_only: bool = False


def state_layout(state: Mapping[str, Any]) -> Layout:
    """The layout of a saved trainer state (``Trainer.get_state``'s output, current version)."""
    policies = state["worker"]["policies"]
    resources = state.get("resources", {})
    return Layout(
        algo=state["algo"],
        env=state["env"] if isinstance(state["env"], str) else None,
        spaces=state.get("spaces"),
        weight_shapes={
            pid: {name: tuple(np.shape(w)) for name, w in p["weights"].items()} for pid, p in policies.items()
        },
        target_networks=frozenset(pid for pid, p in policies.items() if p.get("target") is not None),
        # Before version 3 some operators' state was not saved: which ones a plan had is unknown.
        operators=frozenset(state["plan"].get("operators", {})) if state.get("upgraded_from", 3) >= 3 else None,
        replay_shards=len(resources.get("replay_shards", [])),
        replay_buffer="replay_buffer" in resources,
        weights_only=state.get(KIND_KEY) == WEIGHTS_KIND,
    )


@dataclass(frozen=True)
class RestoreCheck:
    """What comparing a checkpoint's layout and config with a trainer's found."""

    mismatches: list[str]
    partial: list[str]
    overrides: dict[str, dict[str, Any]]


def check_restore(
    saved: Layout, target: Layout, saved_config: Mapping[str, Any], config: Mapping[str, Any]
) -> RestoreCheck:
    """Compare a checkpoint (``saved``) with the trainer it would be restored into (``target``)."""
    mismatches: list[str] = []
    if saved.algo != target.algo:
        mismatches.append(f"algorithm: the checkpoint's is {saved.algo!r}, this trainer's {target.algo!r}")
    if saved.env is not None and target.env is not None and saved.env != target.env:
        mismatches.append(f"env: the checkpoint's is {saved.env!r}, this trainer's {target.env!r}")
    if set(saved.weight_shapes) != set(target.weight_shapes):
        mismatches.append(
            f"policies: the checkpoint has {sorted(saved.weight_shapes)}, this trainer {sorted(target.weight_shapes)}"
        )
    for pid in sorted(set(saved.weight_shapes) & set(target.weight_shapes)):
        if saved.spaces is not None and target.spaces is not None and pid in saved.spaces and pid in target.spaces:
            for kind, mine, theirs in zip(("observation", "action"), target.spaces[pid], saved.spaces[pid]):
                if mine != theirs:
                    mismatches.append(
                        f"policy {pid!r}: the checkpoint's {kind} space is {theirs}, this trainer's {mine}"
                    )
        mismatches += _shape_mismatches(pid, saved.weight_shapes[pid], target.weight_shapes[pid])
    partial: list[str] = []
    # A weights checkpoint saved no replay state: the buffers start empty whatever their shape.
    if not saved.weights_only and saved.replay_shards != target.replay_shards:
        partial.append(
            f"replay shards: the checkpoint holds {saved.replay_shards}, this trainer has {target.replay_shards}; "
            "their contents would not be restored (restore with the checkpoint's num_replay_shards to keep them)"
        )
    if not saved.weights_only and saved.replay_buffer != target.replay_buffer:
        partial.append(
            f"replay buffer: the checkpoint {'has' if saved.replay_buffer else 'has none'}, this trainer "
            f"{'has one' if target.replay_buffer else 'has none'}"
        )
    if saved.operators is not None and target.operators is not None:
        for key in sorted(saved.operators - target.operators):
            partial.append(f"operator state {key!r} is in the checkpoint but this plan has no such operator")
        for key in sorted(target.operators - saved.operators):
            partial.append(
                f"operator state {key!r}: this plan's operator has no state in the checkpoint and would start afresh"
            )
    for pid in sorted((target.target_networks - saved.target_networks) & set(saved.weight_shapes)):
        partial.append(f"policy {pid!r}: the checkpoint has no target network; it would start as a copy of the model")
    return RestoreCheck(mismatches, partial, config_overrides(saved_config, config))


def _shape_mismatches(
    pid: str, saved: Mapping[str, tuple[int, ...]], target: Mapping[str, tuple[int, ...]]
) -> list[str]:
    found = []
    if set(saved) != set(target):
        only_saved, only_target = sorted(set(saved) - set(target)), sorted(set(target) - set(saved))
        found.append(
            f"policy {pid!r}: model parameters differ: only in the checkpoint {only_saved}, "
            f"only in this trainer {only_target}"
        )
    for name in sorted(set(saved) & set(target)):
        if saved[name] != target[name]:
            found.append(
                f"policy {pid!r}: parameter {name!r} has shape {list(saved[name])} in the checkpoint, "
                f"{list(target[name])} in this trainer (check model.fcnet_hiddens and the other model keys)"
            )
    return found


def config_overrides(saved_config: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The config keys whose value differs between a checkpoint and a trainer:
    ``{key: {"checkpoint": ..., "now": ...}}``."""
    overrides = {}
    for key, value in config.items():
        old = saved_config.get(key, value)
        if not _same(old, value):
            overrides[key] = {"checkpoint": old, "now": value}
    return overrides


def _same(a: Any, b: Any) -> bool:
    # Functions (a policy_mapping_fn, an env creator) come back from a pickle as new objects.
    if callable(a) and callable(b):
        return bool(getattr(a, "__qualname__", a) == getattr(b, "__qualname__", b))
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - values whose == is ambiguous (arrays) count as different
        return False
