"""A run's progress as ``flowrl train`` shows it: a live display on a terminal, one line per iteration elsewhere.

On a terminal, :class:`ProgressDisplay` draws with rich a bar toward the stop criterion that
gives a total (``timesteps_total``, ``training_iteration`` or a time criterion; the one nearest
to being met), with the time elapsed and an ETA, and below it the iteration, the current and
best ``episode_reward_mean`` and the env steps per second. Without a terminal (CI, a log file, a
pipe) it writes one plain line per iteration instead, made by the caller's ``format_line``.
Verbosity ``"quiet"`` shows nothing per iteration; ``"verbose"`` adds, under each iteration's
line, the learner statistics per policy, the health counters and any evaluation or custom
metrics (:func:`format_details`)::

    with ProgressDisplay.for_run(run, format_line=format_iteration) as display:
        run.train(on_result=display.update)

:func:`format_iteration` makes the plain line ``flowrl train`` writes per iteration.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal, Protocol

from rich.console import Console, Group, RenderableType
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from flowrl.errors import ConfigError
from flowrl.storage.results import finite_number, flatten_result

if TYPE_CHECKING:
    from types import TracebackType

    from typing_extensions import Self

Verbosity = Literal["quiet", "normal", "verbose"]
VERBOSITIES: tuple[Verbosity, ...] = ("quiet", "normal", "verbose")

# Stop criteria whose values only count up, so that a bar toward them has a total.
COUNTED_STOP_KEYS = ("timesteps_total", "training_iteration", "time_total_s")
TIME_KEY = "time_total_s"  # its ETA is exact: the criterion itself is seconds of training

_BAR_WIDTH = 30
_DETAIL_GROUPS = ("evaluation", "custom_metrics")  # result keys verbose output shows whole, when a result has them


def _fmt(value: Any, spec: str = ".1f") -> str:
    number = finite_number(value)
    return "n/a" if number is None else format(number, spec)


def format_number(value: Any, spec: str = ".1f") -> str:
    """``value`` formatted with ``spec`` if it is a finite Python int or float (not a bool), else ``"n/a"``."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return format(value, spec)
    return "n/a"


def format_iteration(result: Mapping[str, Any], steps_this_iter: int) -> str:
    """One line per iteration: iteration, timesteps, reward mean (min/max), steps/s, total time,
    each policy's mean return per agent in multi-agent runs, the evaluation's mean reward on
    iterations that evaluate, and the faults absorbed so far (if any)."""
    elapsed = result.get("time_this_iter_s") or 0.0
    rate = steps_this_iter / elapsed if elapsed > 0 else float("nan")
    line = (
        f"iter {result.get('training_iteration', 0):>4}  "
        f"timesteps {result.get('timesteps_total', 0):>9}  "
        f"reward {format_number(result.get('episode_reward_mean')):>8} "
        f"(min {format_number(result.get('episode_reward_min'))}, "
        f"max {format_number(result.get('episode_reward_max'))})  "
        f"steps/s {format_number(rate, ',.0f'):>7}  "
        f"time {format_number(result.get('time_total_s'), '.2f'):>8}s"
    )
    per_policy = result.get("policy_reward_mean") or {}
    if per_policy:
        line += "  " + " ".join(f"{pid} {format_number(value)}" for pid, value in sorted(per_policy.items()))
    evaluation = result.get("evaluation")
    if isinstance(evaluation, Mapping):
        line += f"  evaluation {format_number(evaluation.get('episode_reward_mean'))}"
    faults = [f"{label} {result[key]}" for key, label in _FAULTS_SHOWN if result.get(key)]
    if faults:
        line += "  " + ", ".join(faults)
    return line


# Fault counters the iteration line shows once they are non-zero, with their labels.
_FAULTS_SHOWN = (
    ("num_worker_restarts", "restarts"),
    ("num_replay_shard_restarts", "replay shard restarts"),
    ("num_lost_replay_calls", "lost replay calls"),
    ("num_aggregator_restarts", "aggregator restarts"),
    ("num_evaluation_worker_restarts", "evaluation worker restarts"),
    ("num_faulty_episodes", "faulty episodes"),
    ("num_bad_observations", "bad observations"),
    ("num_nonfinite_updates", "non-finite updates"),
    ("num_late_fragments", "late fragments"),
)


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def progress_toward_stop(stop: Mapping[str, float], values: Mapping[str, Any]) -> tuple[str, float] | None:
    """``(key, fraction done)`` of the counted stop criterion nearest to being met, or None when ``stop`` has none.

    ``values`` holds the current values (a result); a missing one counts as 0. The fraction is
    clamped to [0, 1]. Only :data:`COUNTED_STOP_KEYS` with a finite positive bound count: an
    ``episode_reward_mean`` criterion gives no total.
    """
    best: tuple[str, float] | None = None
    for key in COUNTED_STOP_KEYS:
        bound = finite_number(stop.get(key))
        if bound is None or bound <= 0:
            continue
        fraction = min(1.0, max(0.0, (finite_number(values.get(key)) or 0.0) / bound))
        if best is None or fraction > best[1]:
            best = (key, fraction)
    return best


def _detail_line(label: str, values: Mapping[str, Any]) -> list[str]:
    """``["  label: key value, ..."]`` for the finite numbers of ``values``, or no line if it has none."""
    shown = ", ".join(
        f"{key} {_fmt(value, '.4g')}" for key, value in values.items() if finite_number(value) is not None
    )
    return [f"  {label}: {shown}"] if shown else []


def format_details(result: Mapping[str, Any]) -> list[str]:
    """The extra lines of verbose output: learner statistics per policy, health counters, evaluation, custom metrics."""
    flat = flatten_result(result)
    lines = []
    info = result.get("info")
    learner = info.get("learner") if isinstance(info, Mapping) else None
    if isinstance(learner, Mapping):  # {policy id: {stat: value}}
        for policy, stats in sorted(learner.items()):
            if isinstance(stats, Mapping):
                lines += _detail_line(f"learner {policy}", flatten_result(stats))
    lines += _detail_line(
        "counters", {key: value for key, value in result.items() if key.startswith("num_") and isinstance(value, int)}
    )
    for group in _DETAIL_GROUPS:
        prefix = group + "/"
        values = {key[len(prefix) :]: value for key, value in flat.items() if key.startswith(prefix)}
        lines += _detail_line(group, values)
    return lines


class _RunSpecView(Protocol):
    """What a display reads of a run's spec (:class:`~flowrl.storage.rundir.RunSpec`)."""

    @property
    def algo(self) -> str: ...

    @property
    def env(self) -> str: ...

    @property
    def stop(self) -> Mapping[str, float]: ...


class _TrainerView(Protocol):
    """What a display reads of a run's trainer (:class:`~flowrl.engine.trainer.Trainer`)."""

    @property
    def iteration(self) -> int: ...


class RunView(Protocol):
    """What :meth:`ProgressDisplay.for_run` reads of a run (:class:`~flowrl.runs.run.Run`)."""

    @property
    def spec(self) -> _RunSpecView: ...

    @property
    def trainer(self) -> _TrainerView: ...

    @property
    def timesteps_total(self) -> int: ...

    @property
    def best(self) -> tuple[float, int] | None: ...


class ProgressDisplay:
    """Shows each result of a run as it comes (:meth:`update`, an ``on_result`` callback); use it as a context manager.

    ``stop`` is the run's stop criteria; ``format_line(result, steps_this_iter)`` makes the
    plain line written per iteration without a terminal (and, when verbose, on one).
    ``console`` is where it all goes (None: standard output, live only if it is a terminal).
    ``title`` names the run on the bar; ``iteration``, ``timesteps`` and ``best`` (``(reward,
    iteration)``) are where the run stands before this session's first iteration, for a resumed run.
    ``clock`` gives the seconds that the elapsed time and the ETA count.
    """

    def __init__(
        self,
        stop: Mapping[str, float],
        *,
        format_line: Callable[[Mapping[str, Any], int], str],
        verbosity: Verbosity = "normal",
        console: Console | None = None,
        title: str = "",
        iteration: int = 0,
        timesteps: int = 0,
        best: tuple[float, int] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if verbosity not in VERBOSITIES:
            raise ConfigError(f"verbosity={verbosity!r} must be one of {', '.join(VERBOSITIES)}")
        # Decided on standard output itself, not on rich's guess (which FORCE_COLOR and the like change):
        # a pipe or a log file gets the plain lines that scripts parse.
        self.console = console if console is not None else Console(force_terminal=sys.stdout.isatty())
        self.stop = dict(stop)
        self.verbosity = verbosity
        self.title = title
        self._format_line = format_line
        self._clock = clock
        self._timesteps = timesteps
        self._best = best
        self._start = {"training_iteration": float(iteration), "timesteps_total": float(timesteps)}
        self._started_at = clock()
        self._last: Mapping[str, Any] | None = None
        self._rate: float | None = None  # env steps per second in the last iteration
        self._eta_at: float | None = None  # monotonic time the run should meet a stop criterion
        self._live: Any = None  # rich.live.Live while the display is on

    @classmethod
    def for_run(
        cls,
        run: RunView,
        *,
        format_line: Callable[[Mapping[str, Any], int], str],
        verbosity: Verbosity = "normal",
        console: Console | None = None,
    ) -> Self:
        """A display of ``run`` from where it stands (a resumed run's iteration, timesteps and best reward)."""
        return cls(
            run.spec.stop,
            format_line=format_line,
            verbosity=verbosity,
            console=console,
            title=f"{run.spec.algo} on {run.spec.env}",
            iteration=run.trainer.iteration,
            timesteps=run.timesteps_total,
            best=run.best,
        )

    @property
    def live(self) -> bool:
        """Whether the display is drawn live (a terminal, not quiet) rather than written as lines."""
        return self.verbosity != "quiet" and self.console.is_terminal and not self.console.is_dumb_terminal

    def __enter__(self) -> Self:
        if self.live:
            from rich.live import Live

            self._started_at = self._clock()
            self._live = Live(console=self.console, get_renderable=self._render, refresh_per_second=4)
            self._live.start(refresh=True)  # the frame that waits for the first iteration
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._live is not None:
            self._live.stop()  # the last frame stays on screen, above what is printed next
            self._live = None

    def update(self, result: Mapping[str, Any]) -> None:
        """Show one iteration's result."""
        steps = int(finite_number(result.get("timesteps_total")) or self._timesteps)
        steps_this_iter, self._timesteps = steps - self._timesteps, steps
        elapsed = finite_number(result.get("time_this_iter_s"))
        self._rate = steps_this_iter / elapsed if elapsed else None
        reward = finite_number(result.get("episode_reward_mean"))
        if reward is not None and (self._best is None or reward > self._best[0]):
            self._best = (reward, int(result.get("training_iteration") or 0))
        self._last = result
        self._eta_at = self._estimate_end(result)
        if self.verbosity == "quiet":
            return
        if self._live is not None:
            if self.verbosity == "verbose":
                self._live.console.print(
                    Text("\n".join([self._format_line(result, steps_this_iter), *format_details(result)]))
                )
            self._live.refresh()
            return
        lines = [self._format_line(result, steps_this_iter)]
        if self.verbosity == "verbose":
            lines += format_details(result)
        self.console.file.write("".join(line + "\n" for line in lines))
        self.console.file.flush()

    def _estimate_end(self, result: Mapping[str, Any]) -> float | None:
        """When the first stop criterion with a total should be met, from this session's pace so far."""
        now = self._clock()
        remaining = []
        for key in COUNTED_STOP_KEYS:
            bound, value = finite_number(self.stop.get(key)), finite_number(result.get(key))
            if bound is None or value is None:
                continue
            if key == TIME_KEY:
                remaining.append(max(0.0, bound - value))
                continue
            done = value - self._start[key]
            if done > 0 and now > self._started_at:
                remaining.append(max(0.0, bound - value) * (now - self._started_at) / done)
        return now + min(remaining) if remaining else None

    def _render(self) -> RenderableType:
        """Three lines: the bar and the ETA; the stop criterion, time elapsed and pace; the last result."""
        now = self._clock()
        result = self._last or {}
        toward = progress_toward_stop(self.stop, result)
        if toward is None:
            bar = ProgressBar(total=None, width=_BAR_WIDTH, pulse=True, animation_time=now)
            done, target = "", "no stop criterion with a total"
        else:
            key, fraction = toward
            bar = ProgressBar(total=1.0, completed=fraction, width=_BAR_WIDTH)
            done, target = (
                f"{fraction:4.0%}",
                f"{key} {finite_number(result.get(key)) or 0.0:,.0f}/{self.stop[key]:,.0f}",
            )
        eta = "-:--:--" if self._eta_at is None else _duration(max(0.0, self._eta_at - now))
        head = Table.grid(padding=(0, 1))
        head.add_row(Text(self.title, style="bold"), bar, Text(f"{done}  ETA {eta}".strip()))
        progress = Text(f"{target}  elapsed {_duration(now - self._started_at)}  steps/s {_fmt(self._rate, ',.0f')}")
        if self._last is None:
            return Group(head, progress, Text("waiting for the first iteration...", style="dim"))
        best = "n/a" if self._best is None else f"{self._best[0]:.1f} (iteration {self._best[1]})"
        stats = Text(
            f"iteration {result.get('training_iteration', 0)}  "
            f"timesteps {int(finite_number(result.get('timesteps_total')) or 0):,}  "
            f"reward {_fmt(result.get('episode_reward_mean'))}  best {best}"
        )
        return Group(head, progress, stats)
