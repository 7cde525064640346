"""Exploration strategies and the schedules that anneal them over global timesteps.

An exploration turns a batch of distribution inputs into actions (and their
log-probabilities). Its state (e.g. the timestep it has reached) is part of a policy's
state, so checkpoints restore it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import gymnasium as gym
import numpy as np

from flowrl.deferred import torch
from flowrl.errors import FlowRLError
from flowrl.policy.action_masks import random_legal_actions
from flowrl.policy.distributions import ActionDistribution


@dataclass(frozen=True)
class LinearSchedule:
    """Moves linearly from ``initial`` to ``final`` over ``timesteps``, then stays at ``final``."""

    initial: float
    final: float
    timesteps: int

    def value(self, t: int) -> float:
        """The scheduled value at global timestep ``t``."""
        if self.timesteps <= 0:
            return self.final
        frac = min(max(t, 0) / self.timesteps, 1.0)
        return self.initial + frac * (self.final - self.initial)


class Exploration:
    """Chooses actions from a distribution; ``explore=False`` gives the greedy action."""

    def __init__(self, action_space: gym.Space[Any]) -> None:
        self.action_space = action_space
        self.last_timestep = 0

    def get_action(
        self, dist: ActionDistribution, *, timestep: int, explore: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Actions and their log-probabilities under the behaviour policy."""
        raise NotImplementedError

    def get_state(self) -> dict[str, Any]:
        """What a checkpoint must hold to resume exploration where it was."""
        return {"last_timestep": self.last_timestep}

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`get_state`'s output."""
        self.last_timestep = int(state["last_timestep"])


def uniform_discrete(
    space: gym.spaces.Discrete, dist: ActionDistribution, batch: int, rng: np.random.Generator
) -> np.ndarray:
    """``batch`` uniformly random actions of ``space``, within the action mask bound to ``dist`` if it has one."""
    if dist.action_mask is None:
        return rng.integers(0, int(space.n), batch)
    return random_legal_actions(dist.action_mask.reshape(batch, -1).cpu().numpy(), rng)


class StochasticSampling(Exploration):
    """Samples from the action distribution (greedy when not exploring).

    For the first ``random_timesteps`` global timesteps, exploring actions are uniform instead: in the
    bounds of a Box (which must be finite), over the legal actions of a Discrete space (SAC's warm-up).
    """

    def __init__(self, action_space: gym.Space[Any], random_timesteps: int = 0, seed: int | None = None) -> None:
        super().__init__(action_space)
        if random_timesteps and not (
            isinstance(action_space, gym.spaces.Discrete)
            or (isinstance(action_space, gym.spaces.Box) and np.isfinite([action_space.low, action_space.high]).all())
        ):
            raise FlowRLError(
                f"StochasticSampling random_timesteps={random_timesteps} needs a Discrete action space or a Box "
                f"with finite bounds, got {action_space}"
            )
        self.random_timesteps = random_timesteps
        self.rng = np.random.default_rng(seed)

    def is_random(self, timestep: int) -> bool:
        """Whether exploring actions at ``timestep`` are uniform rather than drawn from the distribution."""
        return timestep < self.random_timesteps

    def get_action(
        self, dist: ActionDistribution, *, timestep: int, explore: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        self.last_timestep = timestep
        if explore and self.is_random(timestep):
            actions = torch.as_tensor(self._uniform(dist), device=dist.inputs.device)
        else:
            actions = dist.sample() if explore else dist.deterministic_sample()
        return actions, dist.logp(actions)

    def _uniform(self, dist: ActionDistribution) -> np.ndarray:
        batch, space = dist.inputs.shape[0], self.action_space
        if isinstance(space, gym.spaces.Discrete):
            return uniform_discrete(space, dist, batch, self.rng)
        assert isinstance(space, gym.spaces.Box)
        return self.rng.uniform(space.low, space.high, (batch, *space.shape)).astype(np.float32)

    def get_state(self) -> dict[str, Any]:
        return {**super().get_state(), "rng": self.rng.bit_generator.state}

    def set_state(self, state: Mapping[str, Any]) -> None:
        super().set_state(state)
        if "rng" in state:  # checkpoints from before random_timesteps keep the current generator
            self.rng.bit_generator.state = state["rng"]


class EpsilonGreedy(Exploration):
    """With probability epsilon a uniformly random action, else the argmax of the inputs (Q-values).

    With an action mask bound to the distribution, both are legal: the random action is uniform
    over the legal ones, the argmax is over the masked inputs.

    Epsilon anneals linearly from ``initial_epsilon`` to ``final_epsilon`` over
    ``epsilon_timesteps`` global timesteps. A fixed ``epsilon`` (Ape-X's per-worker
    values) overrides the schedule.
    """

    action_space: gym.spaces.Discrete  # checked in __init__

    def __init__(
        self,
        action_space: gym.Space[Any],
        initial_epsilon: float = 1.0,
        final_epsilon: float = 0.05,
        epsilon_timesteps: int = 10_000,
        epsilon: float | None = None,
        seed: int | None = None,
    ) -> None:
        super().__init__(action_space)
        if not isinstance(action_space, gym.spaces.Discrete):
            raise FlowRLError(f"EpsilonGreedy needs a Discrete action space, got {action_space}")
        self.schedule = LinearSchedule(initial_epsilon, final_epsilon, epsilon_timesteps)
        self.fixed_epsilon = epsilon
        self.rng = np.random.default_rng(seed)

    def epsilon(self, timestep: int) -> float:
        """The epsilon in force at ``timestep``."""
        return self.fixed_epsilon if self.fixed_epsilon is not None else self.schedule.value(timestep)

    def get_action(
        self, dist: ActionDistribution, *, timestep: int, explore: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        self.last_timestep = timestep
        greedy = dist.deterministic_sample()
        if explore:
            batch = greedy.shape[0]
            random_rows = self.rng.random(batch) < self.epsilon(timestep)
            if random_rows.any():
                random_actions = torch.as_tensor(uniform_discrete(self.action_space, dist, batch, self.rng))
                # Every operand on the greedy actions' device (a GPU policy's): a CPU mask does not mix with them.
                rows = torch.as_tensor(random_rows, device=greedy.device)
                greedy = torch.where(rows, random_actions.to(greedy.device), greedy)
        return greedy, torch.zeros(greedy.shape[0])

    def get_state(self) -> dict[str, Any]:
        return {**super().get_state(), "rng": self.rng.bit_generator.state}

    def set_state(self, state: Mapping[str, Any]) -> None:
        super().set_state(state)
        self.rng.bit_generator.state = state["rng"]


class PerWorkerEpsilonGreedy(EpsilonGreedy):
    """Epsilon-greedy with a fixed epsilon per rollout worker (Ape-X, Horgan et al. 2018).

    Remote worker ``i`` of ``N`` uses ``0.4 ** (1 + 7 * (i - 1) / (N - 1))`` (0.4 when N is 1),
    so a few workers explore a lot and the rest almost not at all; the local worker
    (index 0, which learns and evaluates) acts greedily.
    """

    def __init__(
        self, action_space: gym.Space[Any], worker_index: int = 0, num_workers: int = 0, seed: int | None = None
    ) -> None:
        super().__init__(action_space, epsilon=self.epsilon_for(worker_index, num_workers), seed=seed)

    @staticmethod
    def epsilon_for(worker_index: int, num_workers: int) -> float:
        """The epsilon of remote worker ``worker_index`` (1-based) among ``num_workers``."""
        if worker_index <= 0:
            return 0.0
        if num_workers <= 1:
            return 0.4
        epsilon: float = 0.4 ** (1 + 7 * (worker_index - 1) / (num_workers - 1))
        return epsilon


class GaussianNoise(Exploration):
    """The deterministic action plus Gaussian noise, clipped to the action bounds.

    For the first ``random_timesteps`` actions are uniform in the bounds; then the noise
    scale anneals from ``initial_scale`` to ``final_scale`` over ``scale_timesteps`` (RLlib's schedule).
    """

    def __init__(
        self,
        action_space: gym.Space[Any],
        stddev: float = 0.1,
        initial_scale: float = 1.0,
        final_scale: float = 1.0,
        scale_timesteps: int = 1,
        random_timesteps: int = 0,
        seed: int | None = None,
    ) -> None:
        super().__init__(action_space)
        if not isinstance(action_space, gym.spaces.Box):
            raise FlowRLError(f"GaussianNoise needs a Box action space, got {action_space}")
        self.stddev = stddev
        self.schedule = LinearSchedule(initial_scale, final_scale, scale_timesteps)
        self.random_timesteps = random_timesteps
        self.low = torch.as_tensor(action_space.low, dtype=torch.float32)
        self.high = torch.as_tensor(action_space.high, dtype=torch.float32)
        self.generator = torch.Generator().manual_seed(seed if seed is not None else 0)

    def get_action(
        self, dist: ActionDistribution, *, timestep: int, explore: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        self.last_timestep = timestep
        actions = dist.deterministic_sample()
        if explore:
            if timestep < self.random_timesteps:
                u = torch.rand(actions.shape, generator=self.generator)
                actions = self.low + u * (self.high - self.low)
            else:
                actions = actions + self.noise(actions.shape, self.scale(timestep)).to(actions.device)
        actions = torch.maximum(torch.minimum(actions, self.high.to(actions.device)), self.low.to(actions.device))
        return actions, torch.zeros(actions.shape[0])

    def scale(self, timestep: int) -> float:
        """The noise scale at ``timestep``: annealed over the ``scale_timesteps`` after the random ones."""
        return self.schedule.value(timestep - self.random_timesteps)

    def noise(self, shape: torch.Size, scale: float) -> torch.Tensor:
        """Noise to add to actions of ``shape``."""
        return torch.randn(shape, generator=self.generator) * self.stddev * scale

    def get_state(self) -> dict[str, Any]:
        return {**super().get_state(), "generator": self.generator.get_state()}

    def set_state(self, state: Mapping[str, Any]) -> None:
        super().set_state(state)
        self.generator.set_state(state["generator"])


class OrnsteinUhlenbeckNoise(GaussianNoise):
    """:class:`GaussianNoise`'s random start and scale schedule, with temporally correlated noise (DDPG's).

    One Ornstein-Uhlenbeck state per action component, shared by the batch, moves by
    ``ou_theta * -state + ou_sigma * scale * N(0, 1)`` each step; the noise added is
    ``scale * ou_base_scale * state * (high - low)`` (RLlib's process, with its defaults). The
    state is checkpointed with the policy.
    """

    def __init__(
        self,
        action_space: gym.Space[Any],
        ou_theta: float = 0.15,
        ou_sigma: float = 0.2,
        ou_base_scale: float = 0.1,
        initial_scale: float = 1.0,
        final_scale: float = 0.02,
        scale_timesteps: int = 10_000,
        random_timesteps: int = 1000,
        seed: int | None = None,
    ) -> None:
        super().__init__(action_space, 1.0, initial_scale, final_scale, scale_timesteps, random_timesteps, seed)
        self.ou_theta, self.ou_sigma, self.ou_base_scale = ou_theta, ou_sigma, ou_base_scale
        self.ou_state = torch.zeros(self.low.shape)
        span = self.high - self.low
        self.span = torch.where(torch.isinf(span), torch.ones_like(span), span)

    def noise(self, shape: torch.Size, scale: float) -> torch.Tensor:
        gaussian = scale * torch.randn(self.ou_state.shape, generator=self.generator)
        self.ou_state = self.ou_state + self.ou_theta * -self.ou_state + self.ou_sigma * gaussian
        return (scale * self.ou_base_scale * self.ou_state * self.span).expand(shape)

    def get_state(self) -> dict[str, Any]:
        return {**super().get_state(), "ou_state": self.ou_state.clone()}

    def set_state(self, state: Mapping[str, Any]) -> None:
        super().set_state(state)
        self.ou_state = state["ou_state"].clone()


EXPLORATIONS: dict[str, type[Exploration]] = {
    "StochasticSampling": StochasticSampling,
    "EpsilonGreedy": EpsilonGreedy,
    "PerWorkerEpsilonGreedy": PerWorkerEpsilonGreedy,
    "GaussianNoise": GaussianNoise,
    "OrnsteinUhlenbeckNoise": OrnsteinUhlenbeckNoise,
}


def make_exploration(
    action_space: gym.Space[Any],
    config: Mapping[str, Any] | None,
    seed: int | None = None,
    worker_index: int = 0,
    num_workers: int = 0,
) -> Exploration:
    """Build the exploration named by ``config["type"]`` (default ``StochasticSampling``).

    ``worker_index`` and ``num_workers`` place the policy among the rollout workers, for
    explorations that differ per worker.
    """
    options = dict(config or {})
    name = options.pop("type", "StochasticSampling")
    if name not in EXPLORATIONS:
        raise FlowRLError(f"exploration_config type={name!r} is not one of {sorted(EXPLORATIONS)}")
    cls = EXPLORATIONS[name]
    if cls is PerWorkerEpsilonGreedy:
        options.update(worker_index=worker_index, num_workers=num_workers)
    try:
        return cls(action_space, seed=seed, **options)  # type: ignore[call-arg]
    except TypeError as e:
        raise FlowRLError(f"exploration_config for {name}: {e}") from e
