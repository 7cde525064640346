"""Policies as a Trainer would build them, with random weights, and their portable files: shared by
the inference and export tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from flowrl.algorithms import get_algorithm
from flowrl.config import TrainerConfig
from flowrl.engine.build import policy_specs
from flowrl.envs import get_env_creator
from flowrl.policy import Policy, TorchPolicy
from flowrl.serve.inference import policy_files


def build_policies(
    algo: str, env: str, overrides: dict[str, Any] | None = None, seed: int = 0
) -> tuple[dict[str, Policy[Any]], TrainerConfig]:
    """The policies a Trainer would build for ``env``, with random weights (seeded) so greedy actions vary."""
    algorithm = get_algorithm(algo)
    config = algorithm.config_class.from_dict({"num_workers": 0, "seed": 0, **(overrides or {})}).frozen()
    policy_map = {pid: spec.build() for pid, spec in policy_specs(algorithm, config, get_env_creator(env)).items()}
    rng = np.random.default_rng(seed)
    for policy in policy_map.values():
        # Parameters only: buffers hold constants (DDPG's action bounds, which share memory with its action space).
        assert isinstance(policy, TorchPolicy), policy
        parameters = {name for name, _ in policy.model.named_parameters()}
        weights = policy.get_weights()
        policy.set_weights(
            {k: rng.normal(0, 1.0, v.shape).astype(v.dtype) if k in parameters else v for k, v in weights.items()}
        )
    return policy_map, config


def write_files(directory: Path, policy_map: dict[str, Policy[Any]], algo: str, config: TrainerConfig) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name, data in policy_files(policy_map, algo, config).items():
        (directory / name).write_bytes(data)
    return directory


def observations(space: gym.Space[Any], n: int = 1000, seed: int = 0) -> np.ndarray:
    """``n`` observations sampled from ``space``, its infinite bounds narrowed to +-5 (finite network inputs)."""
    assert isinstance(space, gym.spaces.Box)
    bounded = gym.spaces.Box(np.maximum(space.low, -5), np.minimum(space.high, 5), dtype=space.dtype, seed=seed)
    return np.stack([bounded.sample() for _ in range(n)])


def lstm_policies(
    model: dict[str, Any], algo: str = "ppo", seed: int = 3
) -> tuple[dict[str, Policy[Any]], TrainerConfig]:
    """``algo``'s policies (PPO's by default) for StatelessCartPole-v1 with random weights (``seed``) of half
    the usual scale and no biases (larger ones saturate the LSTM, and a random head bias picks one action,
    whatever the observations)."""
    policy_map, config = build_policies(algo, "StatelessCartPole-v1", {"model": model}, seed=seed)
    for policy in policy_map.values():
        policy.set_weights({k: v * 0 if "bias" in k else v * 0.5 for k, v in policy.get_weights().items()})
    return policy_map, config
