"""What both samplers share: their envs, finished-episode statistics, state, and the handling of faults.

:class:`FaultTolerantSampler` recreates an env that raised (dropping its episode), raises for
or drops an episode with bad data, caps the episodes of one env dropped in a row, and saves and
restores the sampler's progress with its envs.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import cloudpickle
import numpy as np

from flowrl.actors.sampling.checks import env_snapshot
from flowrl.actors.sampling.episode_hooks import EpisodeHooks
from flowrl.errors import BadObservationError, EnvError, FlowRLError

BAD_OBSERVATION_MODES = ("raise", "drop_episode")
#: Finished episodes a sampler keeps until they are collected (a worker nobody asks must not grow).
MAX_UNCOLLECTED_EPISODES = 10_000
#: Episodes of one env slot dropped in a row (env errors or bad data) before the sampler gives up on it:
#: dropping is meant for rare faults, and an env that fails every episode would otherwise spin forever.
MAX_DROPPED_IN_A_ROW = 100

logger = logging.getLogger(__name__)

EnvMaker = Callable[[int], Any]
"""Builds a new env for a vector index (the slot of the env it replaces)."""


@dataclass
class EpisodeStats:
    """Return and length (env steps) of one finished episode, and its custom metrics.

    In multi-agent episodes ``episode_reward`` sums every agent's rewards and
    ``policy_rewards`` lists each agent's return under the id of the policy it acted with.
    ``custom_metrics`` holds what callbacks and ``custom_metrics_from_info`` recorded.
    """

    episode_reward: float
    episode_length: int
    policy_rewards: dict[str, list[float]] = field(default_factory=dict)
    custom_metrics: dict[str, float] = field(default_factory=dict)


class FaultTolerantSampler:
    """What both samplers share: their envs, finished-episode statistics, and the handling of faults.

    ``env_maker(vector_index)`` (optional) builds a replacement for an env that raised in
    ``step`` or ``reset``: the old one is closed, the new one reset, the episode that was
    running is dropped and counted in ``num_faulty_episodes``. Without it the env's
    exception propagates unchanged. ``on_bad_observation`` says what a non-finite, wrongly
    shaped or out-of-space observation, or a non-finite reward, does: ``"raise"`` a
    :class:`~flowrl.errors.BadObservationError` naming the worker (``worker_index``), env,
    step, field, value and bound; ``"drop_episode"`` drops that episode, resets the env and
    counts it in ``num_bad_observations``. A dropped episode's rows are never returned and it
    is not a finished episode. Either counter is cumulative. An env slot whose episodes are
    dropped :data:`MAX_DROPPED_IN_A_ROW` times in a row raises.

    ``hooks`` (optional) follows each env's episode for the run's callbacks and custom metrics;
    the episodes in progress are saved with the sampler's state.
    """

    def __init__(
        self,
        envs: list[Any],
        *,
        env_maker: EnvMaker | None,
        on_bad_observation: str,
        worker_index: int,
        seed: int | None,
        hooks: EpisodeHooks | None = None,
    ) -> None:
        if on_bad_observation not in BAD_OBSERVATION_MODES:
            raise ValueError(f"on_bad_observation={on_bad_observation!r} is not one of {BAD_OBSERVATION_MODES}")
        # The caller's list, replaced in place: the rollout worker closes the envs the sampler holds.
        self.envs = envs
        self.env_maker = env_maker
        self.on_bad_observation = on_bad_observation
        self.worker_index = worker_index
        self.hooks = hooks
        self.num_faulty_episodes = 0
        self.num_bad_observations = 0
        #: ``output``: the worker's experience writer, given each fragment's rows (a multi-agent sampler's, each
        #: agent's piece with its policy and agent ids) as the policy saw them, before postprocessing.
        self.output: Callable[..., object] | None = None
        # Seconds spent stepping the envs and in the policies' forward passes (the X-ray), while ``timed``.
        self.timed = True
        self.env_s = 0.0
        self.inference_s = 0.0
        # Bounded: a worker whose statistics nobody collects must not grow without limit.
        self.finished: collections.deque[EpisodeStats] = collections.deque(maxlen=MAX_UNCOLLECTED_EPISODES)
        self._dropped_in_a_row = [0] * len(envs)
        # Seeds for recreated envs, derived from the sampler's seed: the same faults give the same run.
        self._reseed = None if seed is None else np.random.default_rng([seed & (2**64 - 1), 0x5EED])

    #: What, besides the envs, makes up the sampler's progress between two samples (subclasses add theirs).
    STATE_ATTRS: ClassVar[tuple[str, ...]] = (
        "num_faulty_episodes",
        "num_bad_observations",
        "finished",
        "_dropped_in_a_row",
        "_reseed",
    )

    def get_state(self) -> dict[str, Any]:
        """The envs, each pickled mid-episode (None where an env cannot be, see
        :func:`~flowrl.actors.sampling.checks.env_snapshot`), the episodes in progress, the fault
        counters and the seed stream: what resuming sampling exactly where it was needs."""
        state = copy.deepcopy({name: getattr(self, name) for name in self.STATE_ATTRS})
        episodes = None if self.hooks is None else self.hooks.get_state()
        return {**state, "envs": [env_snapshot(env) for env in self.envs], "episodes": episodes}

    def set_state(self, state: Mapping[str, Any]) -> list[int]:
        """Restore :meth:`get_state`'s output into a sampler with as many envs.

        Returns the vector indices of the envs whose state could not be restored: they start
        a new episode. An env saved without its state, or whose snapshot does not unpickle here
        (another version of the env's code), keeps the env it has. With a different number of
        envs nothing is restored and every env index is returned.
        """
        snapshots = state["envs"]
        if len(snapshots) != len(self.envs):
            return list(range(len(self.envs)))
        for name in self.STATE_ATTRS:
            setattr(self, name, copy.deepcopy(state[name]))
        if self.hooks is not None:
            self.hooks.set_state(state.get("episodes"))
        fresh = []
        for i, snapshot in enumerate(snapshots):
            if snapshot is None:
                fresh.append(i)
                continue
            try:
                env = cloudpickle.loads(snapshot)
            except Exception as e:  # noqa: BLE001 - one env's snapshot must not fail the whole restore
                logger.warning(
                    "%s; it starts a new episode",
                    self._where(i, f"its saved state does not load here ({type(e).__name__}: {e})"),
                )
                fresh.append(i)
                continue
            with contextlib.suppress(Exception):  # the replaced env's close must not stop the restore
                self.envs[i].close()
            self.envs[i] = env
        for i in fresh:
            self._restart_episode(i)
        return fresh

    def _restart_episode(self, index: int) -> None:
        """Start a new episode in env ``index``, dropping what the sampler holds of the one before."""
        raise NotImplementedError

    def pop_episode_stats(self) -> list[EpisodeStats]:
        """Episodes finished since the last call (the most recent ones, if very many).

        Safe while another thread samples: each episode is taken from the deque once.
        """
        popped: list[EpisodeStats] = []
        while True:
            try:
                popped.append(self.finished.popleft())
            except IndexError:
                return popped

    def _recreate_env(self, index: int, method: str, error: Exception) -> int | None:
        """Replace env ``index`` (there is an env maker), which raised ``error`` in ``method``.

        Returns the seed to reset the new env with (None for an unseeded sampler).
        """
        assert self.env_maker is not None
        with contextlib.suppress(Exception):  # a broken env may fail to close too; it is discarded anyway
            self.envs[index].close()
        self.num_faulty_episodes += 1
        failure = EnvError(self._where(index, f"{method} raised {type(error).__name__}: {error}"))
        self._count_dropped(index, failure, error)
        self.envs[index] = self.env_maker(index)
        return None if self._reseed is None else int(self._reseed.integers(2**31))

    def _bad_data(self, index: int, where: str, problem: str) -> None:
        """Raise for bad data from env ``index`` (``where``: the call and step), or count the episode to drop."""
        message = f"{self._where(index, where)} returned {problem}"
        if self.on_bad_observation == "raise":
            raise BadObservationError(
                f"{message} (on_bad_observation='raise'; 'drop_episode' drops such episodes and counts them)"
            )
        self.num_bad_observations += 1
        self._count_dropped(index, BadObservationError(message), None)

    def _count_dropped(self, index: int, last: FlowRLError, cause: Exception | None) -> None:
        """Count a dropped episode of env ``index``; raise (``last`` says why it was dropped) past the cap."""
        self._dropped_in_a_row[index] += 1
        if self._dropped_in_a_row[index] >= MAX_DROPPED_IN_A_ROW:
            message = f"{MAX_DROPPED_IN_A_ROW} episodes in a row of one env were dropped; the last: {last}"
            raise type(last)(message) from cause

    def _episode_kept(self, index: int) -> None:
        self._dropped_in_a_row[index] = 0

    def _where(self, index: int, what: str) -> str:
        return f"worker {self.worker_index}, env {index}: {what}"


def no_clock() -> float:
    """The clock of a sampler that times nothing (``timed`` off): always 0."""
    return 0.0
