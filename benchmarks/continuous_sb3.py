"""Stable-Baselines3's side of ``benchmarks/continuous.py``: its TD3 and SAC on Pendulum-v1 with
rl-baselines3-zoo's settings, one gradient update per env step, sizes chosen by the caller.

A trial times the steady phase: from the first env step past ``learning_starts`` (where updates
begin) to the end of ``learn()``, ``measure_steps`` steps later.
"""

from __future__ import annotations

import time
from typing import Any

from off_policy import steady_window_callback  # benchmarks/ is on the path
from time_to_solve import loadavg

# rl-baselines3-zoo's Pendulum-v1 entries of hyperparams/td3.yml and sac.yml (SB3 2.x): one update per env step.
SB3_ZOO: dict[str, dict[str, Any]] = {
    "td3": {
        "n_timesteps": 20_000,
        "policy": "MlpPolicy",
        "gamma": 0.98,
        "buffer_size": 200_000,
        "learning_starts": 10_000,
        "noise_type": "normal",
        "noise_std": 0.1,
        "gradient_steps": 1,
        "train_freq": 1,
        "learning_rate": 1e-3,
        "policy_kwargs": {"net_arch": [400, 300]},
    },
    # The zoo sets only n_timesteps, the policy and learning_rate; the rest are SAC's defaults (buffer
    # 1e6, batch 256, tau 0.005, gamma 0.99, ent_coef "auto", [256, 256] nets). learning_starts is
    # flowrl's tuned example's 1000 instead of SB3's 100, so both sides time the same steady phase.
    "sac": {
        "n_timesteps": 20_000,
        "policy": "MlpPolicy",
        "learning_rate": 1e-3,
        "learning_starts": 1000,
        "gradient_steps": 1,
        "train_freq": 1,
        "policy_kwargs": {"net_arch": [256, 256]},
    },
}
#: The zoo's network sizes and SB3's default batch size of each algorithm (``--zoo-sizes``).
ZOO_SIZES = {"td3": {"hiddens": [400, 300], "batch_size": 256}, "sac": {"hiddens": [256, 256], "batch_size": 256}}


def sb3_trial(
    algo: str, env_id: str, seed: int, sizes: dict[str, Any], measure_steps: int, torch_threads: int
) -> dict[str, Any]:
    """SB3's ``algo`` (td3 or sac) with the zoo's settings and ``sizes`` (actor_hiddens, critic_hiddens,
    batch_size) for ``learning_starts + measure_steps`` env steps."""
    load_start = loadavg()
    import numpy as np
    import stable_baselines3
    import torch
    from stable_baselines3 import SAC, TD3
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.noise import NormalActionNoise

    torch.set_num_threads(torch_threads)
    zoo = SB3_ZOO[algo]
    actor, critic, batch_size = sizes["actor_hiddens"], sizes["critic_hiddens"], sizes["batch_size"]
    start_at = zoo["learning_starts"]

    env = make_vec_env(env_id, n_envs=1, seed=seed)
    common = {
        "learning_rate": zoo["learning_rate"],
        "learning_starts": start_at,
        "batch_size": batch_size,
        "train_freq": zoo["train_freq"],
        "gradient_steps": zoo["gradient_steps"],
        "policy_kwargs": {"net_arch": {"pi": actor, "qf": critic}},
        "device": "cpu",
        "seed": seed,
        "verbose": 0,
    }
    if algo == "td3":
        n_actions = env.action_space.shape[0]
        noise = NormalActionNoise(np.zeros(n_actions), zoo["noise_std"] * np.ones(n_actions))
        model: Any = TD3(
            zoo["policy"], env, buffer_size=zoo["buffer_size"], gamma=zoo["gamma"], action_noise=noise, **common
        )
    else:
        model = SAC(zoo["policy"], env, **common)
    callback = steady_window_callback(start_at)
    model.learn(total_timesteps=start_at + measure_steps, callback=callback)
    done, cpu_done = time.perf_counter(), time.process_time()
    env.close()
    assert callback.started is not None
    window_steps = int(model.num_timesteps) - start_at - 1
    episodes = model.ep_info_buffer
    return {
        "kind": "sb3",
        "algo": algo,
        "seed": seed,
        "env_steps_per_s": window_steps / (done - callback.started),
        "window_steps": window_steps,
        "window_s": done - callback.started,
        "env_steps_per_cpu_s": window_steps / (cpu_done - callback.cpu_started),
        "final_reward_mean": float(np.mean([e["r"] for e in episodes])) if episodes else None,
        "env_steps": int(model.num_timesteps),
        "sizes": {"actor_hiddens": actor, "critic_hiddens": critic, "batch_size": batch_size},
        "updates_per_env_step": zoo["gradient_steps"] / zoo["train_freq"],
        "learning_starts": start_at,
        "torch_threads": torch.get_num_threads(),
        "device": str(model.device),
        "sb3_version": stable_baselines3.__version__,
        "loadavg_start_end": [load_start, loadavg()],
    }
