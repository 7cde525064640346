"""The Policy interface (the RLlib paper's "policy graph") and how to describe one to an actor."""

from __future__ import annotations

import abc
import time
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Generic, NamedTuple, Protocol, TypeVar

import gymnasium as gym
import numpy as np

from flowrl.data import SampleBatch
from flowrl.envs.flatten import action_mask_of, flatten_observation
from flowrl.errors import ConfigError, NonFiniteUpdateError
from flowrl.policy.model_options import model_config
from flowrl.policy.schedules import ending_schedules, scheduled_value

ModelWeights = dict[str, np.ndarray]
#: Learner statistic of an update skipped for a non-finite loss or gradient: 1.0 (over several updates,
#: e.g. minibatch SGD's epochs, the fraction of them skipped). Absent when every update was applied.
NONFINITE_UPDATE = "nonfinite_update"
C = TypeVar("C", bound="PolicyConfig")
ConfigT = TypeVar("ConfigT", bound="PolicyConfig")


class PolicyConfig(Protocol):
    """What a policy reads from its algorithm's config object.

    Policies receive the algorithm's whole (frozen) config, e.g. a ``PPOConfig``, and read
    typed attributes from it; :class:`~flowrl.config.TrainerConfig` has all of these, so every
    algorithm config satisfies this protocol without naming it.
    """

    @property
    def lr(self) -> float | None: ...
    @property
    def lr_schedule(self) -> list[list[float]] | None: ...
    @property
    def gamma(self) -> float: ...
    @property
    def grad_clip(self) -> float | None: ...
    @property
    def model(self) -> Mapping[str, Any]: ...
    @property
    def explore(self) -> bool: ...
    @property
    def exploration_config(self) -> Mapping[str, Any]: ...
    @property
    def num_gpus(self) -> float: ...
    @property
    def seed(self) -> int | None: ...
    @property
    def num_workers(self) -> int: ...
    @property
    def max_consecutive_nonfinite_updates(self) -> int: ...
    @property
    def profile(self) -> bool: ...

    def replace(self: C, **changes: Any) -> C:
        """A copy with ``changes`` applied, validated."""
        ...


class LearnOutput(NamedTuple):
    """What one gradient step of a policy produced.

    ``stats``: learner statistics (scalars, reported in ``result["info"]["learner"]``).
    ``td_error``: per-row TD errors of the batch, for the replay priorities of value-based
    policies (None for the others).
    """

    stats: dict[str, float]
    td_error: np.ndarray | None = None


class LearnTimes:
    """Seconds a policy spent learning since it was built, by phase: ``load_s`` getting batches ready
    (minibatch shuffles and slices, decompression, conversion to tensors on the device, padding a
    recurrent policy's sequences) and ``update_s`` updating on them (the loss's forward pass,
    backpropagation, gradient clipping and checks, the optimizer step). The plan's X-ray reports
    their growth per iteration; with ``timed`` off (``profile: false``) the blocks run untimed and
    both stay 0."""

    __slots__ = ("load_s", "update_s", "timed")

    def __init__(self, timed: bool = True) -> None:
        self.load_s = 0.0
        self.update_s = 0.0
        self.timed = timed

    def add(self, load_s: float, update_s: float) -> None:
        """Count phases measured elsewhere (a learner group's rank 0 learning for this policy)."""
        self.load_s += load_s
        self.update_s += update_s

    def loading(self) -> AbstractContextManager[None]:
        """Time a block that gets a batch ready."""
        return self._loading() if self.timed else _UNTIMED

    def updating(self) -> AbstractContextManager[None]:
        """Time a block that learns: its seconds outside :meth:`loading` blocks are updating."""
        return self._updating() if self.timed else _UNTIMED

    @contextmanager
    def _loading(self) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.load_s += time.perf_counter() - started

    @contextmanager
    def _updating(self) -> Iterator[None]:
        started, loaded = time.perf_counter(), self.load_s
        try:
            yield
        finally:
            self.update_s += time.perf_counter() - started - (self.load_s - loaded)


_UNTIMED = nullcontext()


def check_policy_config(config: Any) -> None:
    """Raise :class:`~flowrl.errors.ConfigError` unless ``config`` is a config object (not a dict)."""
    if isinstance(config, Mapping):
        raise ConfigError(
            [
                f"a policy takes its algorithm's config object, not a {type(config).__name__} "
                f"of keys {sorted(config)}; "
                "build one, e.g. flowrl.config.TrainerConfig(lr=0.01) or PPOConfig.from_dict({...})"
            ]
        )


@dataclass
class PolicySpec:
    """Everything an actor needs to build a policy: its class, spaces and its algorithm's config object.

    ``kwargs`` are extra constructor arguments (e.g. the loss function of a
    :class:`~flowrl.policy.TorchPolicy`); they must be picklable, so pass module-level
    functions rather than lambdas.
    """

    policy_class: type["Policy[Any]"]
    observation_space: gym.Space[Any]
    action_space: gym.Space[Any]
    config: PolicyConfig
    kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_policy_config(self.config)

    def build(self, config_overrides: Mapping[str, Any] | None = None, *, worker_index: int = 0) -> "Policy[Any]":
        """Construct the policy (``config_overrides``, e.g. a worker's own seed, replace config keys).

        ``worker_index`` places the policy among the rollout workers (0: the local worker),
        for explorations that differ per worker.
        """
        config = self.config.replace(**config_overrides) if config_overrides else self.config
        return self.policy_class(
            self.observation_space, self.action_space, config, worker_index=worker_index, **self.kwargs
        )


class Policy(abc.ABC, Generic[ConfigT]):
    """Maps observations to actions, learns from batches, and holds its own state.

    ``config`` is the algorithm's config object (see :class:`PolicyConfig`).
    ``global_timestep`` is the number of env steps sampled by the whole run, pushed in by
    :meth:`on_global_var_update`; schedules (learning rate, exploration) read it.

    An update whose loss or gradients are not finite must be skipped, weights and optimizer
    state untouched (implementations call :meth:`record_update`): ``num_nonfinite_updates``
    counts them (cumulative, checkpointed), and ``config.max_consecutive_nonfinite_updates``
    of them in a row raise :class:`~flowrl.errors.NonFiniteUpdateError`.
    """

    def __init__(
        self, observation_space: gym.Space[Any], action_space: gym.Space[Any], config: ConfigT, *, worker_index: int = 0
    ) -> None:
        check_policy_config(config)
        self.observation_space = observation_space
        self.action_space = action_space
        self.config = config
        self.worker_index = worker_index
        self.global_timestep = 0
        self.num_nonfinite_updates = 0
        self._nonfinite_in_a_row = 0
        #: Where its learning time went (see :class:`LearnTimes`).
        self.learn_times = LearnTimes(timed=config.profile)

    @abc.abstractmethod
    def compute_actions(
        self,
        obs_batch: np.ndarray,
        *,
        explore: bool | None = None,
        timestep: int | None = None,
        action_mask: np.ndarray | None = None,
        state: list[np.ndarray] | None = None,
        prev_actions: np.ndarray | None = None,
        prev_rewards: np.ndarray | None = None,
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Actions for a batch of observations, and extra per-row outputs (e.g. ``action_logp``).

        Observations of a Dict or Tuple space come flattened, as the samplers store them
        (:func:`flowrl.envs.flatten.flatten_observation`; a masked Dict's ``"observations"`` part).
        ``action_mask`` (``[B, n]``, nonzero: legal) restricts each row's action to its legal ones.

        A recurrent policy (one whose :meth:`get_initial_state` is not empty) takes each row's
        ``state`` (one ``[B, ...]`` array per entry of the initial state) and, if its model reads
        them, the ``prev_actions`` and ``prev_rewards`` of each row; the extras then hold the next
        state as ``state_out_0``, ``state_out_1``, ... A feed-forward policy ignores all three.
        """

    def get_initial_state(self) -> list[np.ndarray]:
        """The recurrent state of one env at an episode's start (a list of arrays); ``[]`` for a
        feed-forward policy."""
        return []

    @property
    def is_recurrent(self) -> bool:
        """Whether the policy carries a recurrent state from step to step."""
        return bool(self.get_initial_state())

    @property
    def max_seq_len(self) -> int:
        """Steps per training sequence of a recurrent policy (``model.max_seq_len``)."""
        return int(model_config(self.config.model)["max_seq_len"])

    def compute_single_action(
        self, obs: Any, *, explore: bool | None = None, action_mask: np.ndarray | None = None
    ) -> Any:
        """The action for one observation (a Dict or Tuple one as the env returns it: it is flattened here).

        A masked Dict observation's own mask applies; else ``action_mask`` (e.g. ``info["action_mask"]``) if given.
        """
        mask = action_mask_of(obs, {"action_mask": action_mask})
        obs = flatten_observation(self.observation_space, obs)
        masks = None if mask is None else np.asarray(mask)[None]
        actions, _ = self.compute_actions(np.asarray(obs)[None], explore=explore, action_mask=masks)
        return actions[0]

    def postprocess_trajectory(self, batch: SampleBatch) -> SampleBatch:
        """Add derived columns (advantages, n-step returns) to one trajectory piece."""
        return batch

    @property
    def postprocesses(self) -> bool:
        """Whether :meth:`postprocess_trajectory` changes pieces; when it does not, a sampler hands
        each fragment on whole instead of cutting it into per-episode pieces."""
        return type(self).postprocess_trajectory is not Policy.postprocess_trajectory

    @abc.abstractmethod
    def learn(self, batch: SampleBatch) -> LearnOutput:
        """One gradient step on ``batch``: learner statistics and, for value-based policies, TD errors."""

    def learn_on_batch(self, batch: SampleBatch) -> dict[str, float]:
        """One gradient step on ``batch``; returns its learner statistics (RLlib's name for :meth:`learn`)."""
        return self.learn(batch).stats

    @abc.abstractmethod
    def compute_gradients(self, batch: SampleBatch) -> tuple[list[np.ndarray], dict[str, float]]:
        """Gradients of the loss on ``batch`` (not applied) and learner statistics."""

    @abc.abstractmethod
    def apply_gradients(self, gradients: list[np.ndarray]) -> None:
        """Apply gradients computed by :meth:`compute_gradients` (possibly elsewhere)."""

    @abc.abstractmethod
    def get_weights(self) -> ModelWeights:
        """The model parameters as NumPy arrays."""

    @abc.abstractmethod
    def set_weights(self, weights: ModelWeights) -> None:
        """Load parameters from :meth:`get_weights`."""

    def record_update(self, nonfinite: str | None) -> None:
        """Note an update: applied (``nonfinite`` None) or skipped, ``nonfinite`` saying which value was not finite.

        Raises :class:`~flowrl.errors.NonFiniteUpdateError` when this makes
        ``config.max_consecutive_nonfinite_updates`` skipped updates in a row.
        """
        if nonfinite is None:
            self._nonfinite_in_a_row = 0
            return
        self.num_nonfinite_updates += 1
        self._nonfinite_in_a_row += 1
        cap = self.config.max_consecutive_nonfinite_updates
        if self._nonfinite_in_a_row >= cap:
            raise NonFiniteUpdateError(
                f"{type(self).__name__} on worker {self.worker_index}: {self._nonfinite_in_a_row} updates in a row "
                f"were skipped because a value was not finite (max_consecutive_nonfinite_updates={cap}); the last "
                f"had {nonfinite}. Look for NaN/inf in the batch (rewards, observations) or lower the learning rate."
            )

    def update_config(self, changes: Mapping[str, Any]) -> None:
        """Change config keys of a live policy (validated); losses read them at their next call.

        A scheduled key changed live (``lr``, ``entropy_coeff``) ends its schedule: the new value holds from now on.
        """
        self.config = self.config.replace(**ending_schedules(self.config, changes))

    def scheduled(self, key: str) -> float:
        """The config's ``key`` now: its schedule's value at :attr:`global_timestep` (``entropy_coeff_schedule``
        for ``entropy_coeff``...) when the config has one, else its own value. What losses read."""
        return scheduled_value(self.config, key, self.global_timestep)

    def get_state(self) -> dict[str, Any]:
        """Everything needed to resume: weights and counters (subclasses add optimizer state)."""
        return {
            "weights": self.get_weights(),
            "global_timestep": self.global_timestep,
            "num_nonfinite_updates": self.num_nonfinite_updates,
        }

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`get_state`'s output."""
        self.set_weights(state["weights"])
        self.global_timestep = int(state["global_timestep"])
        self.num_nonfinite_updates = int(state.get("num_nonfinite_updates", 0))  # absent in older checkpoints

    def get_sampling_state(self) -> dict[str, Any]:
        """What acting needs besides the weights (a sampling copy gets those from the learner):
        the global timestep here; subclasses add their exploration and RNG state."""
        return {"global_timestep": self.global_timestep}

    def set_sampling_state(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`get_sampling_state`'s output."""
        self.global_timestep = int(state["global_timestep"])

    def on_global_var_update(self, global_vars: Mapping[str, Any]) -> None:
        """Receive run-wide variables; ``global_vars["timestep"]`` is the env steps sampled so far."""
        self.global_timestep = int(global_vars["timestep"])
