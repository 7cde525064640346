"""What the off-policy benchmarks (continuous.py, mujoco.py) share: flowrl's updates per env step, and the
SB3 callback that marks where SB3's steady training phase (after ``learning_starts``) starts."""

from __future__ import annotations

import time
from typing import Any


def flowrl_updates_per_env_step(config: Any) -> float:
    """Gradient updates per env step of DQN's replay plan (which DDPG, TD3 and SAC run)."""
    from flowrl.algorithms.dqn import round_robin_weights

    store, replay = round_robin_weights(config)
    return replay / (store * config.sampled_per_round())


def steady_window_callback(start_at: int) -> Any:
    """An SB3 callback that notes the wall and CPU time of the first env step after ``start_at`` env steps
    (``started``, ``cpu_started``; ``started`` stays None until then)."""
    from stable_baselines3.common.callbacks import BaseCallback

    class SteadyWindow(BaseCallback):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.started: float | None = None
            self.cpu_started = 0.0

        def _on_step(self) -> bool:
            if self.started is None and self.model.num_timesteps > start_at:
                self.started, self.cpu_started = time.perf_counter(), time.process_time()
            return True

    return SteadyWindow()
