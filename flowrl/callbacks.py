"""Callbacks: user code that runs at fixed points of a run, and the episode view its hooks read.

A run's ``callbacks`` config key names a subclass of :class:`Callbacks` (the class itself, or
its ``"package.module:ClassName"`` path); every method of the base class does nothing, so a
subclass overrides only the hooks it needs::

    class CountEpisodes(Callbacks):
        def on_episode_end(self, episode):
            episode.custom_metrics["pole_angle"] = abs(float(episode.last_obs[2]))

Each process of a run builds one instance: the driver (whose local worker runs the episode
hooks when ``num_workers`` is 0) and each remote rollout worker. The episode hooks and
:meth:`Callbacks.on_sample_end` run inside the rollout workers; :meth:`Callbacks.on_train_result`
and :meth:`Callbacks.on_checkpoint` run in the driver. A hook that raises fails the iteration
with a :class:`~flowrl.errors.CallbackError` naming the class, the hook and where it ran.

This module needs nothing above :mod:`flowrl.errors` and :mod:`flowrl.importing`, so that the
config can check a ``callbacks`` value and rollout workers can run the hooks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from flowrl.errors import CallbackError, FlowRLError
from flowrl.importing import import_callable

if TYPE_CHECKING:  # for annotations only
    from flowrl.data import MultiAgentBatch, SampleBatch


class RolloutWorkerView(Protocol):
    """What a hook sees of the rollout worker it runs in (a :class:`~flowrl.actors.RolloutWorker`).

    A Protocol, because the workers sit in a layer above this module; the worker passed is the
    whole RolloutWorker, this names the part a hook can count on.
    """

    worker_index: int  # 0: the driver's local worker
    policy_map: dict[str, Any]  # policy id -> Policy

    def get_weights(self) -> Any: ...


class TrainerView(Protocol):
    """What a driver hook sees of the :class:`~flowrl.Trainer` that runs it (the whole Trainer is
    passed; this names the part a hook can count on, since the Trainer sits in a layer above)."""

    iteration: int  # training iterations done
    config: Any  # the validated, frozen config (a TrainerConfig)

    def save(self, checkpoint_dir: Any, metadata: Any = None) -> str: ...


#: The hooks that run for every episode; a sampler tracks episodes only when one is overridden.
EPISODE_HOOKS = ("on_episode_start", "on_episode_step", "on_episode_end")


@dataclass
class Episode:
    """One episode of one env, as the episode hooks see it.

    ``episode_id`` is unique in the run; ``env_index`` is the env's slot in its worker
    (``vector_index``) and ``worker_index`` the worker (0: the driver's local worker).
    ``length`` (env steps) and ``total_reward`` count the steps taken so far (in a
    multi-agent env the reward sums every agent's). ``last_obs`` and ``last_info`` are what
    the last ``reset`` or ``step`` returned, as the env returned them (a Dict observation is
    a dict; in a multi-agent env both are keyed by agent); ``agent_infos`` holds each agent's
    latest info dict (multi-agent envs only). Values put in ``custom_metrics[name]`` (real
    numbers) are reported as ``custom_metrics/<name>_mean|_min|_max`` when the episode ends;
    ``user_data`` keeps anything across the episode's steps. Episodes in progress are saved in
    checkpoints, so both dicts must hold picklable values.
    """

    episode_id: int
    env_index: int
    worker_index: int
    length: int = 0
    total_reward: float = 0.0
    last_obs: Any = None
    last_info: dict[Any, Any] = field(default_factory=dict)
    agent_infos: dict[Any, dict[str, Any]] = field(default_factory=dict)
    custom_metrics: dict[str, float] = field(default_factory=dict)
    user_data: dict[str, Any] = field(default_factory=dict)


class Callbacks:
    """Base class of a run's callbacks; every hook does nothing until a subclass overrides it.

    Subclasses are built with no arguments, once per process of the run.
    """

    def on_episode_start(self, episode: Episode) -> None:
        """After an env's ``reset`` started ``episode`` (in its rollout worker); ``last_obs`` is its
        first observation."""

    def on_episode_step(self, episode: Episode) -> None:
        """After each ``step`` of ``episode``'s env; ``episode.last_obs``/``last_info`` are what the step returned."""

    def on_episode_end(self, episode: Episode) -> None:
        """Once per finished episode that the results count (episodes dropped for a fault never end here).

        Runs when the sampler hands the episode over, after its data passed the sampler's
        checks: with several envs per worker, possibly after the next episode of the same env started.
        """

    def on_sample_end(self, batch: SampleBatch | MultiAgentBatch, worker: RolloutWorkerView) -> None:
        """After ``worker`` sampled ``batch`` (which the hook may change in place), before it is returned."""

    def on_train_result(self, trainer: TrainerView, result: dict[str, Any]) -> None:
        """In the driver, after each training iteration; keys added to ``result`` are reported with it."""

    def on_checkpoint(self, trainer: TrainerView, path: str) -> None:
        """In the driver, after ``trainer`` saved a complete checkpoint at ``path``."""


def callbacks_class(value: Any) -> type[Callbacks]:
    """The :class:`Callbacks` subclass a ``callbacks`` config value names (a class or a ``"module:Class"`` path).

    Raises :class:`~flowrl.errors.FlowRLError` saying why it is not one.
    """
    found: Any = value
    if isinstance(value, str):
        found = import_callable(value, key="callbacks")
    if not (isinstance(found, type) and issubclass(found, Callbacks)):
        shown = found.__qualname__ if isinstance(found, type) else f"a {type(found).__name__}"
        raise FlowRLError(f"{shown} is not a subclass of flowrl.callbacks.Callbacks")
    return found


def callbacks_problems(value: Any) -> list[str]:
    """The config validator of ``callbacks``: why the value does not name a Callbacks subclass, if it does not."""
    if value is None:
        return []
    if not isinstance(value, (str, type)):
        return [f"callbacks={value!r} must be a Callbacks subclass, a 'package.module:ClassName' path to one, or None"]
    try:
        callbacks_class(value)
    except FlowRLError as e:
        return [f"callbacks={value!r}: {e}"]
    return []


def make_callbacks(value: Any) -> Callbacks:
    """A new instance of the callbacks ``value`` names (None: the no-op base class).

    Raises :class:`~flowrl.errors.CallbackError` if its constructor raises.
    """
    cls = Callbacks if value is None else callbacks_class(value)
    try:
        return cls()
    except Exception as e:
        raise CallbackError(f"building the callbacks {cls.__qualname__}() raised {type(e).__name__}: {e}") from e


def overrides(callbacks: Callbacks, hooks: tuple[str, ...]) -> bool:
    """Whether ``callbacks`` overrides any of ``hooks`` (the base class's do nothing, so calling them
    can be skipped)."""
    return any(getattr(type(callbacks), hook) is not getattr(Callbacks, hook) for hook in hooks)


def run_hook(callbacks: Callbacks, hook: str, *args: Any, where: str) -> None:
    """Call ``callbacks.<hook>(*args)``; an exception becomes a :class:`~flowrl.errors.CallbackError`
    naming the class, the hook and ``where`` it ran."""
    try:
        getattr(callbacks, hook)(*args)
    except Exception as e:
        raise CallbackError(f"{type(callbacks).__qualname__}.{hook} raised {type(e).__name__}: {e} ({where})") from e


def checked_metrics(metrics: dict[str, Any], where: str) -> dict[str, float]:
    """``episode.custom_metrics`` as floats; a name that is not a string or a value that is not a
    real number raises :class:`~flowrl.errors.CallbackError` (``where`` names the episode)."""
    checked = {}
    for name, value in metrics.items():
        number = _real(value)
        if not isinstance(name, str) or number is None:
            raise CallbackError(
                f"episode.custom_metrics[{name!r}]={value!r} ({where}): custom metrics map names (str) to real numbers"
            )
        checked[name] = number
    return checked


def _real(value: Any) -> float | None:
    if isinstance(value, (str, bytes)):  # float() would parse "1.5": a string is a mistake here
        return None
    try:
        return float(value)  # numpy scalars and bools too (a flag's mean: the fraction of episodes)
    except (TypeError, ValueError):
        return None
