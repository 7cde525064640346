"""Fault injection for chaos tests: an env wrapper that raises, hangs, kills its process, slows down or
corrupts its output on chosen workers, at chosen steps, a chosen number of times.

:class:`FaultInjectEnv` wraps any single-agent env (a Gymnasium id, a registered flowrl name or a
creator) and reads its faults from ``env_config``, so a run under test needs no code of its own::

    from flowrl import Trainer
    from flowrl.envs.testing import FaultInjectEnv, faults_fired, release_fault_counters

    trainer = Trainer(algo="ppo", env=FaultInjectEnv, config={
        "num_workers": 2,
        "env_config": {
            "env": "CartPole-v1",
            "fault_counter": "chaos",
            "faults": [
                # Remote worker 1 dies at its 300th step, once in the whole run (not again after its restart).
                {"kind": "exit", "name": "crash", "worker_indices": [1], "at_step": 300, "times": 1},
                # Every remote worker's env returns NaN observations at steps 500..509 (of each env instance).
                {"kind": "nan_obs", "steps": [500, 510]},
            ],
        },
    })
    try:
        for _ in range(5):
            result = trainer.train()
        assert faults_fired("chaos") == {"crash": 1}
    finally:
        trainer.stop()
        release_fault_counters()

``env_config`` keys: ``env`` (required: what to wrap), ``env_config`` (the wrapped env's; its creator
gets it as a plain dict, without the worker's place), ``faults`` (a list of fault dicts, below;
default none) and ``fault_counter`` (the name of the counter that enforces ``times``; default
``"default"``: give concurrent runs distinct names).

A fault dict: ``kind`` (required), one of

- ``"raise"``: ``step`` (or ``reset``) raises :class:`InjectedFault`;
- ``"hang"``: ``step`` (or ``reset``) blocks for ``hang_s`` seconds (default 10**6: for ever), then goes on;
- ``"exit"``: the process dies at once (``os._exit(1)``), as a crash or OOM kill would end it;
- ``"slow"``: ``step`` sleeps ``delay_s`` seconds (default 0.01) before stepping the wrapped env;
- ``"hold_gil"``: ``step`` computes for ``hold_s`` seconds (default 15) in one C call that holds the GIL
  (``sum`` over a ``range``), as a C extension's long computation does: no other thread of the process,
  such as a rollout worker's control thread, runs meanwhile;
- ``"nan_obs"``: the observation is NaN (float64 where the space's dtype is an integer);
- ``"out_of_space_obs"``: one element of the observation is outside its space: for a ``Box``, the
  first element with a finite bound (CartPole: the cart position, above 4.8), so a ``Box`` needs
  one finite bound; a ``Discrete(n, start)`` gives ``start + n``;
- ``"wrong_shape_obs"``: the observation's last axis has one extra element (a scalar becomes two);
- ``"nan_reward"``: the reward is NaN.

For a ``Dict`` or ``Tuple`` observation space the observation faults corrupt its first entry.
Where and when a fault fires:

- ``worker_indices``: list of worker indices (default: every remote worker, ``worker_index >= 1``;
  the driver's local worker 0, which also makes the env that flowrl checks before training, only
  when listed); ``vector_indices``: list (default: all);
- ``steps: [start, stop]``: the step window ``start <= k < stop`` (``stop`` may be None), where
  ``k`` counts this env instance's ``step`` calls since it was created (0: the first); or
  ``at_step: N`` for ``[N, N + 1]``; default: every step;
- ``on_reset: true`` (``raise``, ``hang``, ``exit`` only): fire in ``reset`` instead; the window
  then counts this instance's ``reset`` calls (0: the first);
- ``skip_recreated: true``: never fire in a worker that replaced a failed one;
- ``times: N``: fire at most N times in total, across every process and worker restart (default:
  no limit); ``name``: the fault's name in messages and counts (default ``"<kind>#<position>"``).

Counting ``times`` is atomic across processes: a :class:`FaultCounter` Ray actor, named after
``fault_counter`` in the namespace ``"flowrl"``. Its lifetime: it is *detached*, so it outlives
the worker whose fault kills it (a non-detached actor dies with the process that created it, and
the count would restart with the next worker). Every ``FaultInjectEnv`` with a ``times`` fault
creates the counter if it does not exist yet; under a :class:`~flowrl.Trainer` that is the driver,
whose own envs (the env check, the local worker) are made before any remote worker. A detached actor
lasts until Ray shuts down (the embedded Ray a Trainer starts does at ``stop``): on a cluster you
joined, call :func:`release_fault_counters` (the counters this process created or used) or
:func:`remove_fault_counter`. Without Ray initialized, counters are per process.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import logging
import os
import sys
import threading
import time
from typing import Any, Callable, Mapping, Sequence, SupportsFloat

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from flowrl.envs.registry import make_env
from flowrl.errors import EnvError, FlowRLError

logger = logging.getLogger(__name__)

FAULT_KINDS = (
    "raise",
    "hang",
    "exit",
    "slow",
    "hold_gil",
    "nan_obs",
    "out_of_space_obs",
    "wrong_shape_obs",
    "nan_reward",
)
OBSERVATION_KINDS = ("nan_obs", "out_of_space_obs", "wrong_shape_obs")
RESET_KINDS = ("raise", "hang", "exit")
# Kinds that act before the wrapped env steps (the others change what it returned).
_DISRUPTION_KINDS = ("raise", "hang", "exit", "slow", "hold_gil")
COUNTER_NAMESPACE = "flowrl"
# A counter that does not answer in this time is lost (its node died): report it, never wait for ever.
COUNTER_TIMEOUT_S = 30.0

_FAULT_KEYS = (
    "kind",
    "name",
    "worker_indices",
    "vector_indices",
    "steps",
    "at_step",
    "on_reset",
    "skip_recreated",
    "times",
    "hang_s",
    "delay_s",
    "hold_s",
)
# Options of one kind only: given with another kind they are a mistake, not a no-op.
_KIND_OPTIONS = {"hang_s": "hang", "delay_s": "slow", "hold_s": "hold_gil"}
_ENV_CONFIG_KEYS = ("env", "env_config", "faults", "fault_counter")


class InjectedFault(Exception):
    """The exception a ``"raise"`` fault raises; its message names the fault, worker, vector index and step.

    Deliberately not a :class:`~flowrl.errors.FlowRLError`: it stands for a bug in a user's env,
    and flowrl must handle it as it handles any exception an env raises.
    """


@dataclasses.dataclass(frozen=True)
class Fault:
    """One validated fault of a :class:`FaultInjectEnv` (its dict form is in the module docstring)."""

    kind: str
    """One of :data:`FAULT_KINDS`."""
    name: str
    """Its name in messages and in :func:`faults_fired` (default ``"<kind>#<position in faults>"``)."""
    worker_indices: frozenset[int] | None = None
    """Workers it fires in; None: every remote worker (``worker_index >= 1``)."""
    vector_indices: frozenset[int] | None = None
    """Env slots (``vector_index``) it fires in; None: all."""
    start: int = 0
    """First step (or reset, with ``on_reset``) of its window, counted from 0 per env instance."""
    stop: int | None = None
    """End of its window, excluded; None: no end."""
    on_reset: bool = False
    """Fire in ``reset`` instead of ``step`` (kinds ``raise``, ``hang``, ``exit``)."""
    skip_recreated: bool = False
    """Never fire in a worker that replaced a failed one."""
    times: int | None = None
    """Most firings in the whole run, across processes and restarts; None: no limit."""
    hang_s: float = 10.0**6
    """Seconds a ``hang`` blocks."""
    delay_s: float = 0.01
    """Seconds a ``slow`` fault adds to each step."""
    hold_s: float = 15.0
    """Seconds a ``hold_gil`` fault holds the GIL."""

    def applies_to(self, worker_index: int, vector_index: int, recreated_worker: bool) -> bool:
        """Whether this fault may fire in the env at ``worker_index`` / ``vector_index``."""
        if self.skip_recreated and recreated_worker:
            return False
        if self.worker_indices is None:
            in_worker = worker_index >= 1
        else:
            in_worker = worker_index in self.worker_indices
        return in_worker and (self.vector_indices is None or vector_index in self.vector_indices)

    def in_window(self, count: int) -> bool:
        """Whether step (or reset) number ``count`` of an env instance is in this fault's window."""
        return self.start <= count and (self.stop is None or count < self.stop)


def parse_faults(faults: Any) -> list[Fault]:
    """Validate the ``faults`` list of an env_config; raise :class:`EnvError` listing every problem."""
    if not isinstance(faults, (list, tuple)):
        raise EnvError(
            f"FaultInjectEnv env_config['faults'] must be a list of fault dicts; got {faults!r} "
            f"of type {type(faults).__name__}"
        )
    problems: list[str] = []
    parsed = [_parse_fault(spec, index, problems) for index, spec in enumerate(faults)]
    names = [fault.name for fault in parsed if fault is not None]
    for name in sorted({name for name in names if names.count(name) > 1}):
        problems.append(f"fault name {name!r} is used more than once; fault names key the counts")
    if problems:
        count = len(problems)
        lines = "\n".join(f"  - {problem}" for problem in problems)
        raise EnvError(f"invalid FaultInjectEnv faults ({count} problem{'' if count == 1 else 's'}):\n{lines}")
    return [fault for fault in parsed if fault is not None]


def _parse_fault(spec: Any, index: int, problems: list[str]) -> Fault | None:
    """The :class:`Fault` of ``faults[index]``, or None with its problems appended to ``problems``."""
    where = f"faults[{index}]"
    if not isinstance(spec, Mapping):
        problems.append(f"{where} must be a dict with at least a 'kind'; got {spec!r} of type {type(spec).__name__}")
        return None
    count = len(problems)
    for key in spec:
        if key not in _FAULT_KEYS:
            suggestion = _did_you_mean(key, _FAULT_KEYS)
            problems.append(f"{where}: unknown key {key!r}{suggestion}; valid keys: {', '.join(_FAULT_KEYS)}")
    kind: Any = spec.get("kind")
    if kind not in FAULT_KINDS:
        problems.append(f"{where}['kind']={kind!r} is not a fault kind; valid kinds: {', '.join(FAULT_KINDS)}")
    for key, owner in _KIND_OPTIONS.items():
        if key in spec and kind in FAULT_KINDS and kind != owner:
            problems.append(f"{where}['{key}'] is an option of kind {owner!r} only; this fault's kind is {kind!r}")
    name = spec.get("name", f"{kind}#{index}")
    if not isinstance(name, str) or not name:
        problems.append(f"{where}['name']={name!r} must be a non-empty string")
    worker_indices = _indices(spec, "worker_indices", where, problems)
    vector_indices = _indices(spec, "vector_indices", where, problems)
    start, stop = _window(spec, where, problems)
    on_reset = _flag(spec, "on_reset", where, problems)
    if on_reset and kind in FAULT_KINDS and kind not in RESET_KINDS:
        problems.append(f"{where}['on_reset']=True is for kinds {', '.join(RESET_KINDS)}; kind {kind!r} fires in step")
    skip_recreated = _flag(spec, "skip_recreated", where, problems)
    times = spec.get("times")
    if times is not None and (not _is_int(times) or times < 1):
        problems.append(f"{where}['times']={times!r} must be an integer >= 1, or None for no limit")
    hang_s = spec.get("hang_s", Fault.hang_s)
    if not _is_number(hang_s) or hang_s <= 0:
        problems.append(f"{where}['hang_s']={hang_s!r} must be a number of seconds > 0")
    delay_s = spec.get("delay_s", Fault.delay_s)
    if not _is_number(delay_s) or delay_s < 0:
        problems.append(f"{where}['delay_s']={delay_s!r} must be a number of seconds >= 0")
    hold_s = spec.get("hold_s", Fault.hold_s)
    if not _is_number(hold_s) or hold_s <= 0:
        problems.append(f"{where}['hold_s']={hold_s!r} must be a number of seconds > 0")
    if len(problems) > count:
        return None
    return Fault(
        kind=kind,
        name=name,
        worker_indices=worker_indices,
        vector_indices=vector_indices,
        start=start,
        stop=stop,
        on_reset=on_reset,
        skip_recreated=skip_recreated,
        times=times,
        hang_s=float(hang_s),
        delay_s=float(delay_s),
        hold_s=float(hold_s),
    )


def _indices(spec: Mapping[str, Any], key: str, where: str, problems: list[str]) -> frozenset[int] | None:
    value = spec.get(key)
    if value is None:
        return None
    if not isinstance(value, (list, tuple)) or not all(_is_int(i) and i >= 0 for i in value):
        problems.append(f"{where}['{key}']={value!r} must be a list of integers >= 0 (or None for the default)")
        return None
    return frozenset(value)


def _window(spec: Mapping[str, Any], where: str, problems: list[str]) -> tuple[int, int | None]:
    if "steps" in spec and "at_step" in spec:
        problems.append(f"{where} gives both 'steps' and 'at_step'; give one ('at_step': N means 'steps': [N, N + 1])")
        return 0, None
    if "at_step" in spec:
        at_step = spec["at_step"]
        if not _is_int(at_step) or at_step < 0:
            problems.append(f"{where}['at_step']={at_step!r} must be an integer >= 0")
            return 0, None
        return at_step, at_step + 1
    steps = spec.get("steps")
    if steps is None:
        return 0, None
    valid = (
        isinstance(steps, (list, tuple))
        and len(steps) == 2
        and _is_int(steps[0])
        and steps[0] >= 0
        and (steps[1] is None or (_is_int(steps[1]) and steps[1] > steps[0]))
    )
    if not valid:
        problems.append(
            f"{where}['steps']={steps!r} must be [start, stop]: integers 0 <= start < stop "
            f"(the window start <= step < stop), or stop None for no end"
        )
        return 0, None
    return steps[0], steps[1]


def _flag(spec: Mapping[str, Any], key: str, where: str, problems: list[str]) -> bool:
    value = spec.get(key, False)
    if not isinstance(value, bool):
        problems.append(f"{where}['{key}']={value!r} must be True or False")
        return False
    return value


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)


def _did_you_mean(key: Any, valid: Sequence[str]) -> str:
    matches = difflib.get_close_matches(str(key), valid, n=1)
    return f" (did you mean {matches[0]!r}?)" if matches else ""


class FaultInjectEnv(gym.Wrapper[Any, Any, Any, Any]):
    """A single-agent env (``env_config["env"]``) with the faults of ``env_config["faults"]`` injected.

    ``env_config`` is an :class:`~flowrl.envs.context.EnvContext` (its ``worker_index``,
    ``vector_index`` and ``recreated_worker`` place this env) or a plain dict (worker 0, slot 0).
    The spaces are the wrapped env's. ``fired`` counts this instance's firings by fault name.
    Raises :class:`EnvError` for an invalid config, a multi-agent env, or an observation fault
    the observation space cannot show (e.g. ``out_of_space_obs`` for an unbounded ``Box``).
    See the module docstring for the config format.
    """

    def __init__(self, env_config: Mapping[str, Any] | None = None) -> None:
        config = dict(env_config or {})
        unknown = [key for key in config if key not in _ENV_CONFIG_KEYS]
        if unknown:
            raise EnvError(
                f"FaultInjectEnv env_config has unknown key(s) {', '.join(repr(k) for k in unknown)}"
                f"{_did_you_mean(unknown[0], _ENV_CONFIG_KEYS)}; valid keys: {', '.join(_ENV_CONFIG_KEYS)} "
                f"(the wrapped env's own config goes in 'env_config')"
            )
        if "env" not in config:
            raise EnvError(
                "FaultInjectEnv env_config needs 'env': the env to wrap (a Gymnasium id, a registered "
                "flowrl name or a creator), e.g. {'env': 'CartPole-v1', 'faults': [...]}"
            )
        counter = config.get("fault_counter", "default")
        if not isinstance(counter, str) or not counter:
            raise EnvError(f"FaultInjectEnv env_config['fault_counter']={counter!r} must be a non-empty string")
        self.faults = parse_faults(config.get("faults", []))
        inner = make_env(config["env"], config.get("env_config"))
        if not isinstance(inner, gym.Env):
            inner.close()
            raise EnvError(f"FaultInjectEnv wraps single-agent gymnasium envs; {config['env']!r} is a multi-agent env")
        try:
            # Built now, also for faults that never fire here: a fault the space cannot show is
            # reported by the env flowrl checks in the driver, not later in a remote worker.
            self._corrupters = {
                fault.name: _corrupter(fault.kind, inner.observation_space, fault.name)
                for fault in self.faults
                if fault.kind in OBSERVATION_KINDS
            }
        except EnvError:
            inner.close()
            raise
        super().__init__(inner)
        self.fault_counter = counter
        self.worker_index: int = getattr(env_config, "worker_index", 0)
        self.vector_index: int = getattr(env_config, "vector_index", 0)
        recreated: bool = getattr(env_config, "recreated_worker", False)
        self._active = [f for f in self.faults if f.applies_to(self.worker_index, self.vector_index, recreated)]
        self.fired: dict[str, int] = {}
        self._exhausted: set[str] = set()
        self._steps = 0
        self._resets = 0
        if any(fault.times is not None for fault in self.faults) and _ray_initialized():
            # Created here so that, under a Trainer, the driver's envs create it before any worker can die.
            _counter_actor(counter)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        count = self._resets
        self._resets += 1
        for fault in self._active:
            if fault.on_reset and self._fires(fault, "reset", count):
                self._disrupt(fault, f"reset {count}")
        return self.env.reset(seed=seed, options=options)

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        count = self._steps
        self._steps += 1
        for fault in self._active:
            if fault.kind in _DISRUPTION_KINDS and not fault.on_reset and self._fires(fault, "step", count):
                self._disrupt(fault, f"step {count}")
        obs, reward, terminated, truncated, info = self.env.step(action)
        for fault in self._active:
            if fault.kind in OBSERVATION_KINDS and self._fires(fault, "step", count):
                obs = self._corrupters[fault.name](obs)
            elif fault.kind == "nan_reward" and self._fires(fault, "step", count):
                reward = float("nan")
        return obs, reward, terminated, truncated, info

    def _fires(self, fault: Fault, phase: str, count: int) -> bool:
        """Whether ``fault`` fires at ``phase`` ("step" or "reset") number ``count``; counts it if it does."""
        if not fault.in_window(count) or fault.name in self._exhausted:
            return False
        if fault.times is not None and not _take(self.fault_counter, fault.name, fault.times):
            # Counts only grow: never ask the counter actor again (a round trip on every step of the window).
            self._exhausted.add(fault.name)
            return False
        fired = self.fired.get(fault.name, 0)
        self.fired[fault.name] = fired + 1
        if not fired:
            # Once per instance: a chaos run's log must show each fault, not every step of its window.
            logger.warning("%s at %s %d", self._describe(fault), phase, count)
        return True

    def _disrupt(self, fault: Fault, at: str) -> None:
        """Act out a fault of one of the kinds in ``_DISRUPTION_KINDS``."""
        if fault.kind == "raise":
            raise InjectedFault(f"{self._describe(fault)} at {at}")
        if fault.kind == "hang":
            time.sleep(fault.hang_s)
        elif fault.kind == "slow":
            time.sleep(fault.delay_s)
        elif fault.kind == "hold_gil":
            hold_gil(fault.hold_s)
        elif fault.kind == "exit":
            # os._exit skips every cleanup, as a crash would; flush so the warning above is not lost.
            sys.stderr.flush()
            os._exit(1)

    def _describe(self, fault: Fault) -> str:
        return (
            f"injected fault {fault.name!r} (kind {fault.kind!r}) in worker {self.worker_index}, "
            f"vector index {self.vector_index}"
        )


def hold_gil(seconds: float) -> None:
    """Compute for about ``seconds`` (more on a loaded machine) in one C call that never releases the GIL
    (``sum`` over a ``range``, its rate measured first)."""
    fastest = float("inf")
    for _ in range(3):  # the fastest of three: a run the scheduler interrupted measures too slow a rate
        started = time.perf_counter()
        sum(range(1_000_000))
        fastest = min(fastest, time.perf_counter() - started)
    sum(range(int(1_000_000 / max(fastest, 1e-9) * seconds)))


def _corrupter(kind: str, space: spaces.Space[Any], fault: str) -> Callable[[Any], Any]:
    """How an observation fault of ``kind`` turns an observation of ``space`` into a bad one."""
    if isinstance(space, spaces.Dict) and len(space.spaces):
        key = next(iter(space.spaces))
        corrupt_entry = _corrupter(kind, space.spaces[key], fault)
        return lambda obs: {**obs, key: corrupt_entry(obs[key])}
    if isinstance(space, spaces.Tuple) and len(space.spaces):
        corrupt_first = _corrupter(kind, space.spaces[0], fault)
        return lambda obs: (corrupt_first(obs[0]), *obs[1:])
    if not isinstance(space, (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)):
        raise EnvError(
            f"fault {fault!r} (kind {kind!r}) cannot corrupt observations of {space}: observation faults "
            f"support Box, Discrete, MultiDiscrete and MultiBinary spaces (and Dict or Tuple of them)"
        )
    if kind == "nan_obs":
        floating = space.dtype is not None and np.issubdtype(space.dtype, np.floating)
        dtype = space.dtype if floating else np.float64
        return lambda obs: np.full(np.shape(obs), np.nan, dtype=dtype)
    if kind == "wrong_shape_obs":
        return _one_element_more
    index, value = _out_of_space_element(space, fault)
    if isinstance(space, spaces.Discrete):
        return lambda obs: np.int64(value)

    def out_of_space(obs: Any) -> Any:
        bad = np.array(obs, dtype=space.dtype)
        bad.flat[index] = value
        return bad

    return out_of_space


def _one_element_more(obs: Any) -> np.ndarray:
    obs = np.asarray(obs)
    if obs.ndim == 0:
        return np.stack([obs, obs])
    return np.concatenate([obs, obs[..., :1]], axis=-1)


def _out_of_space_element(space: spaces.Space[Any], fault: str) -> tuple[int, Any]:
    """``(flat index, value)``: setting that element of an observation puts it outside ``space``."""
    if isinstance(space, spaces.Discrete):
        return 0, int(space.start) + int(space.n)
    if isinstance(space, spaces.MultiDiscrete):
        return 0, int(space.start.flat[0]) + int(space.nvec.flat[0])
    if isinstance(space, spaces.MultiBinary):
        return 0, 2
    assert isinstance(space, spaces.Box)
    low, high = space.low.reshape(-1), space.high.reshape(-1)
    above: list[tuple[int, float]]  # ints for an integer Box
    below: list[tuple[int, float]]
    if np.issubdtype(space.dtype, np.integer):
        info = np.iinfo(space.dtype)
        # The value must fit the dtype, or numpy would wrap it back inside the bounds.
        above = [(i, int(h) + 1) for i, h in enumerate(high) if h < info.max]
        below = [(i, int(lo) - 1) for i, lo in enumerate(low) if lo > info.min]
    else:
        # high + |high| also leaves a large bound behind, where high + 1 rounds back to high in float32.
        above = [(i, float(h) + max(1.0, abs(float(h)))) for i, h in enumerate(high) if np.isfinite(h)]
        below = [(i, float(lo) - max(1.0, abs(float(lo)))) for i, lo in enumerate(low) if np.isfinite(lo)]
    if above or below:
        return (above or below)[0]
    raise EnvError(
        f"fault {fault!r} (kind 'out_of_space_obs') needs an observation element with a bound its dtype "
        f"can exceed; {space} has none (an unbounded Box has no observation outside it)"
    )


class FaultCounter:
    """How many times each fault fired; :meth:`take` lets a fault fire only while it is under its limit.

    Run as a named Ray actor (see :func:`fault_counter`), whose calls run one at a time, so that a
    ``times`` limit holds across every process of a run; a plain instance serves a process without Ray.
    """

    def __init__(self) -> None:
        self._fired: dict[str, int] = {}
        # For the plain instance, which envs on several threads of one process may share.
        self._lock = threading.Lock()

    def take(self, fault: str, times: int) -> bool:
        """Count one firing of ``fault`` and return True if it fired fewer than ``times`` times; else False."""
        with self._lock:
            fired = self._fired.get(fault, 0)
            if fired >= times:
                return False
            self._fired[fault] = fired + 1
            return True

    def fired(self) -> dict[str, int]:
        """Firings so far, by fault name (faults with a ``times`` limit only)."""
        with self._lock:
            return dict(self._fired)


_LOCAL_COUNTERS: dict[str, FaultCounter] = {}
# Counters this process created or used as actors, for release_fault_counters.
_USED_COUNTERS: set[str] = set()


def counter_actor_name(counter: str) -> str:
    """The Ray actor name (in namespace ``"flowrl"``) of the fault counter ``counter``."""
    return f"flowrl_fault_counter:{counter}"


def fault_counter(name: str = "default") -> Any:
    """The counter actor ``name`` (a Ray actor handle), created detached and with no CPU if it does not exist.

    Create it in the driver before training to choose when it exists; an env with a ``times``
    fault also creates it. Raises :class:`FlowRLError` when Ray is not initialized.
    """
    if not _ray_initialized():
        raise FlowRLError(
            f"fault_counter({name!r}) needs Ray: call ray.init() (or create the Trainer) first; "
            f"without Ray, FaultInjectEnv counts in each process"
        )
    return _counter_actor(name)


def faults_fired(name: str = "default") -> dict[str, int]:
    """How many times each ``times``-limited fault counted by counter ``name`` fired, across the run.

    ``{}`` when the counter does not exist. Uses the counter actor when Ray is initialized, else
    this process's counter.
    """
    if not _ray_initialized():
        counter = _LOCAL_COUNTERS.get(name)
        return counter.fired() if counter is not None else {}
    import ray

    try:
        actor = ray.get_actor(counter_actor_name(name), namespace=COUNTER_NAMESPACE)
    except ValueError:
        return {}
    fired: dict[str, int] = ray.get(actor.fired.remote(), timeout=COUNTER_TIMEOUT_S)
    return fired


def remove_fault_counter(name: str = "default") -> None:
    """Kill the counter ``name`` (whichever process created it), so that its counts start again at zero."""
    _LOCAL_COUNTERS.pop(name, None)
    _USED_COUNTERS.discard(name)
    if not _ray_initialized():
        return
    import ray

    try:
        actor = ray.get_actor(counter_actor_name(name), namespace=COUNTER_NAMESPACE)
    except ValueError:
        return
    ray.kill(actor)


def release_fault_counters() -> None:
    """Kill every counter this process created or used (they are detached: nothing else ends them
    before Ray shuts down), and drop this process's Ray-free counters."""
    for name in sorted(_USED_COUNTERS | set(_LOCAL_COUNTERS)):
        remove_fault_counter(name)


def _take(counter: str, fault: str, times: int) -> bool:
    """Count a firing of ``fault`` in counter ``counter`` if it is under ``times``; True if it may fire."""
    if not _ray_initialized():
        return _LOCAL_COUNTERS.setdefault(counter, FaultCounter()).take(fault, times)
    import ray

    try:
        taken: bool = ray.get(_counter_actor(counter).take.remote(fault, times), timeout=COUNTER_TIMEOUT_S)
    except ray.exceptions.GetTimeoutError as exc:
        raise EnvError(
            f"fault counter {counter!r} did not answer within {COUNTER_TIMEOUT_S:.0f} s; "
            f"cannot tell whether fault {fault!r} may fire again"
        ) from exc
    return taken


def _counter_actor(name: str) -> Any:
    actor = (
        _counter_actor_class()
        .options(
            name=counter_actor_name(name),
            namespace=COUNTER_NAMESPACE,
            lifetime="detached",  # it must outlive the worker that creates it, which a fault may kill
            get_if_exists=True,  # atomic: workers racing to create it all get the same actor
            num_cpus=0,
        )
        .remote()
    )
    _USED_COUNTERS.add(name)
    return actor


@functools.cache
def _counter_actor_class() -> Any:
    # Ray is imported on first use so that importing flowrl.envs stays free of Ray.
    import ray

    return ray.remote(FaultCounter)


def _ray_initialized() -> bool:
    # An unimported Ray cannot be initialized; don't import it just to ask.
    return "ray" in sys.modules and sys.modules["ray"].is_initialized()
