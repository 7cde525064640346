"""How a run saves its checkpoints: when, what happens after a save (rotation, the ``best`` copy), a save that fails,
the two-stage save after a signal, and the warning that the checkpoints will not fit on the disk.

:class:`RunSaving` belongs to a :class:`~flowrl.runs.run.Run`, which calls it after each iteration and when
training ends:

- A *periodic* save (``checkpoint_freq``, ``checkpoint_interval_s``, an evaluation that beats the kept
  best) that fails on the disk (``OSError``: ``ENOSPC``, ``EIO``...), on the checkpoint files
  (:class:`~flowrl.errors.CheckpointError`) or on a replay shard that gives no state in time
  (:class:`~flowrl.errors.ReplayShardError`) never ends the run: it is a :class:`~flowrl.errors.RunWarning`,
  counted in ``num_failed_checkpoints`` (in every later result and kept in checkpoints), the earlier
  checkpoints stay (rotation runs only after a save that succeeded) and the write leaves nothing behind.
- The *final* save, when a stop criterion is met, raises what it raises, as the emergency save after an error does.
- After a *signal* (:meth:`RunSaving.save_on_signal`), a checkpoint of weights and counters comes first
  (:meth:`~flowrl.engine.state.TrainerState.save_weights`: no actor is asked, no replay buffer pickled, so it is
  complete moments after the signal), then the full state, which replaces it under the same name, if
  ``preemption_grace_s`` (counted from the signal) leaves time: a ``SIGALRM`` timer abandons a full save still
  going when it runs out, and a second signal abandons it too; either way the weights checkpoint stays the latest.
  Ctrl-C takes the same two steps with no time limit (nothing kills a run after Ctrl-C).
"""

from __future__ import annotations

import difflib
import logging
import shutil
import signal
import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from flowrl.errors import CheckpointError, ReplayShardError, RunWarning
from flowrl.runs.signals import DeadlinePassed, deadline
from flowrl.storage.checkpoints import (
    WEIGHTS_KIND,
    checkpoint_kind,
    copy_checkpoint,
    latest_checkpoint,
    list_checkpoints,
    prune_checkpoints,
)
from flowrl.storage.results import finite_number, result_value
from flowrl.storage.rundir import BEST_CHECKPOINT, CHECKPOINTS_DIR, EVALUATION_KEY_PREFIX, RunSpec, kept_best_value

if TYPE_CHECKING:  # the Trainer imports torch: load it only when a run starts
    from flowrl.engine.trainer import Trainer

logger = logging.getLogger(__name__)

#: The failures of a periodic save that the run absorbs (counted in ``num_failed_checkpoints``).
SAVE_ERRORS: tuple[type[Exception], ...] = (OSError, CheckpointError, ReplayShardError)

# Per replay row besides its two observations: action, reward, done flags, priority, indices.
_ROW_EXTRA_BYTES = 64


class RunSaving:
    """The checkpoints of one run: ``checkpoint`` is the latest complete one (None until one is saved),
    ``resumed_from`` the one the run resumed from (never rotated away), ``weights_only`` whether
    ``checkpoint`` holds weights and counters only (see the module docstring)."""

    def __init__(self, directory: Path, spec: RunSpec, trainer: Trainer, checkpoint: Path | None) -> None:
        self.directory = directory
        self.checkpoints = directory / CHECKPOINTS_DIR
        self.spec = spec
        self.trainer = trainer
        self.checkpoint = checkpoint
        self.resumed_from = checkpoint
        self.weights_only = False
        # A resumed run starts from its checkpoint: there is nothing new to save until it trains.
        self._saved_iteration = trainer.iteration if checkpoint is not None else None
        self._kept_best = kept_best_value(self.checkpoints, spec.keep_best)
        self._last_result: Mapping[str, Any] | None = None
        self._last_save_time = time.monotonic()
        self._metric_seen = False
        self._warned_metric = False

    # -- when ------------------------------------------------------------------------------------

    def start(self) -> None:
        """Training (re)starts: the interval to the next save starts now, and the disk space is checked."""
        self._last_save_time = time.monotonic()
        check_disk_space(self.directory, self.trainer, self.spec.keep_checkpoints)

    def unsaved(self) -> bool:
        """Whether a finished iteration is not in a checkpoint yet."""
        return self.trainer.iteration > 0 and self.trainer.iteration != self._saved_iteration

    def observe(self, result: Mapping[str, Any]) -> None:
        """Take note of an iteration's result (for ``keep_best``)."""
        self._last_result = result
        metric = self.spec.keep_best
        self._metric_seen = self._metric_seen or (metric is not None and result_value(result, metric) is not None)

    def due(self, result: Mapping[str, Any]) -> bool:
        """Whether a periodic save is due after ``result``'s iteration."""
        freq, interval = self.spec.checkpoint_freq, self.spec.checkpoint_interval_s
        if freq and self.trainer.iteration % freq == 0:
            return True
        if interval > 0 and time.monotonic() - self._last_save_time >= interval:
            return True
        return self._evaluation_improved(result)

    def _evaluation_improved(self, result: Mapping[str, Any]) -> bool:
        """Whether ``result``'s evaluation beats the kept best checkpoint's (kept by a key under ``evaluation/``)."""
        metric = self.spec.keep_best
        if metric is None or not metric.startswith(EVALUATION_KEY_PREFIX):
            return False
        value = finite_number(result_value(result, metric))
        return value is not None and (self._kept_best is None or value > self._kept_best)

    # -- saving ----------------------------------------------------------------------------------

    def save(self) -> None:
        """Save the last finished iteration in full, then keep the best copy and rotate (only once it is saved)."""
        metric = self.spec.keep_best
        value = None
        if metric is not None:
            self._warn_if_metric_unseen(metric)
            if self._last_result is not None and self._last_result.get("training_iteration") == self.trainer.iteration:
                value = finite_number(result_value(self._last_result, metric))
        best = value is not None and (self._kept_best is None or value > self._kept_best)
        metadata = {"keep_best": {"metric": metric, "value": value}} if best else None
        path = Path(self.trainer.save(self.checkpoints, metadata=metadata))
        self._saved(path, weights_only=False)
        if best:
            copy_checkpoint(path, self.checkpoints / BEST_CHECKPOINT)
            self._kept_best = value
        protect = [self.resumed_from] if self.resumed_from is not None else []
        prune_checkpoints(self.checkpoints, self.spec.keep_checkpoints, protect=protect)

    def save_periodic(self) -> None:
        """:meth:`save`, absorbing :data:`SAVE_ERRORS`: a :class:`~flowrl.errors.RunWarning`, counted in
        ``num_failed_checkpoints``; the next save is due as if this one had succeeded."""
        try:
            self.save()
        except SAVE_ERRORS as error:
            self._last_save_time = time.monotonic()
            self._failed(error, f"the checkpoint of iteration {self.trainer.iteration}")

    def save_on_signal(self, received: signal.Signals, received_at: float) -> bool:
        """Save the last finished iteration after the signal ``received`` (at ``received_at``,
        :func:`time.monotonic`): weights and counters first, then the full state within ``preemption_grace_s``
        (no limit for Ctrl-C). Returns whether a second signal cut the full save short.

        A failure or a second signal while the weights checkpoint is written propagates, as for the final
        save; a full save that fails (:data:`SAVE_ERRORS`) or runs out of time is a
        :class:`~flowrl.errors.RunWarning`, and the weights checkpoint stays the latest.
        """
        path = Path(self.trainer.save_weights(self.checkpoints))
        self._saved(path, weights_only=True)
        at = None if received == signal.SIGINT else received_at + self.trainer.config.preemption_grace_s
        if at is not None and time.monotonic() >= at:
            self._warn_full_state_not_saved(received, "left no time for the full state")
            return False
        try:
            with deadline(at) as alarm:
                self.save()
        except KeyboardInterrupt as interrupt:
            self.weights_only = self._kind_is_weights(path)  # the full save may have landed just before
            if isinstance(interrupt, DeadlinePassed) or alarm.passed:
                if self.weights_only:
                    self._warn_full_state_not_saved(received, "ran out while the full state was being saved")
                return False
            return self.weights_only
        except SAVE_ERRORS as error:
            self._failed(
                error, f"the full state of iteration {self.trainer.iteration} after {received.name}", ending=True
            )
        return False

    def _saved(self, path: Path, *, weights_only: bool) -> None:
        self.checkpoint = path
        self.weights_only = weights_only
        self._saved_iteration = self.trainer.iteration
        self._last_save_time = time.monotonic()

    def _kind_is_weights(self, path: Path) -> bool:
        try:
            return checkpoint_kind(path) == WEIGHTS_KIND
        except CheckpointError:
            return True

    def _failed(self, error: Exception, what: str, *, ending: bool = False) -> None:
        """Warn that saving ``what`` failed; ``ending``: the full save after a signal, once the weights checkpoint
        (:attr:`checkpoint`) is written, and the run ends after it."""
        self.trainer.num_failed_checkpoints += 1
        if ending:
            outcome = (
                f"the run ends and its weights checkpoint {self.checkpoint} stays the latest (resuming from it starts "
                f"with empty replay buffers and new episodes)"
            )
        elif self.checkpoint:
            outcome = f"training goes on and the latest checkpoint is still {self.checkpoint}"
        else:
            outcome = "training goes on and there is no checkpoint yet"
        warnings.warn(
            f"saving {what} failed ({type(error).__name__}: {error}); {outcome} "
            f"(num_failed_checkpoints={self.trainer.num_failed_checkpoints})",
            RunWarning,
            stacklevel=3,
        )

    def _warn_full_state_not_saved(self, received: signal.Signals, why: str) -> None:
        grace = self.trainer.config.preemption_grace_s
        warnings.warn(
            f"{received.name}: saved weights and counters only in {self.checkpoint} (preemption_grace_s={grace:g} s "
            f"{why}); resuming from it starts with empty replay buffers and new episodes",
            RunWarning,
            stacklevel=3,
        )

    def _warn_if_metric_unseen(self, metric: str) -> None:
        if self._metric_seen or self._warned_metric or self._last_result is None:
            return
        interval = self.trainer.config.evaluation_interval
        if metric.startswith(EVALUATION_KEY_PREFIX) and interval and self.trainer.iteration < interval:
            return  # the first evaluation is still to come
        self._warned_metric = True
        close = difflib.get_close_matches(metric, [str(key) for key in self._last_result], n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        warnings.warn(
            f"keep_best={metric!r} is not a key of any result so far (up to iteration {self.trainer.iteration}); "
            f"no checkpoint is kept as best until it appears{hint}",
            RunWarning,
            stacklevel=3,
        )


# --- will the checkpoints fit? ---------------------------------------------------------------------


def checkpoint_bytes(path: Path) -> int:
    """The size of the files of the checkpoint directory ``path``."""
    return sum(f.stat().st_size for f in path.iterdir() if f.is_file())


def estimate_checkpoint_bytes(trainer: Trainer) -> int:
    """A cheap estimate of one checkpoint's size before any was written.

    Four times the policies' weights (the weights, an optimizer's two moments and a target network:
    Adam's case), plus, when checkpoints keep the replay contents (``store_buffer_in_checkpoints``),
    ``buffer_size`` rows of two observations each (bytes from the largest observation space's shape
    and dtype) and 64 bytes for the rest of a row. Envs and counters are left out: they are small.
    """
    local = trainer.workers.local_worker()
    weights = sum(
        int(np.asarray(w).nbytes) for policy in local.policy_map.values() for w in policy.get_weights().values()
    )
    replay = 0
    if trainer.resources.checkpoint_replay_contents:
        obs = max((_space_bytes(p.observation_space) for p in local.policy_map.values()), default=0)
        replay = int(getattr(trainer.config, "buffer_size", 0) or 0) * (2 * obs + _ROW_EXTRA_BYTES)
    return 4 * weights + replay


def _space_bytes(space: Any) -> int:
    shape, dtype = getattr(space, "shape", None), getattr(space, "dtype", None)
    if shape is None or dtype is None:  # Dict, Tuple: their flattened size at 4 bytes
        import gymnasium as gym

        return 4 * int(gym.spaces.flatdim(space))
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize


def _size(n: float) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


def disk_space_problem(directory: Path, each: int, source: str, keep: int) -> str | None:
    """Why ``keep`` checkpoints of about ``each`` bytes (estimated from ``source``), plus one being written,
    will not fit on ``directory``'s disk (the run's checkpoints already there count as available), or None."""
    checkpoints = directory / CHECKPOINTS_DIR
    existing = sum(checkpoint_bytes(path) for path in list_checkpoints(checkpoints))
    free = shutil.disk_usage(checkpoints if checkpoints.is_dir() else directory).free
    needed = each * (keep + 1)
    if needed <= free + existing:
        return None
    there = f" plus the {_size(existing)} of the run's checkpoints already there" if existing else ""
    return (
        f"the run's checkpoints may not fit on the disk of {str(directory)!r}: keep_checkpoints={keep} + 1 being "
        f"written = {keep + 1} x {_size(each)} ({source}) = {_size(needed)}, but the disk has {_size(free)} free"
        f"{there}. Free space, lower keep_checkpoints, or save no replay contents (store_buffer_in_checkpoints=false); "
        "a save that fails is counted in num_failed_checkpoints and training goes on"
    )


def check_disk_space(directory: Path, trainer: Trainer, keep: int) -> None:
    """Warn (:class:`~flowrl.errors.RunWarning`) if the run's checkpoints will not fit on its disk: each
    the size of the latest checkpoint if there is one, else :func:`estimate_checkpoint_bytes`."""
    latest = latest_checkpoint(directory / CHECKPOINTS_DIR)
    try:
        if latest is not None:
            each, source = checkpoint_bytes(latest), f"the size of {latest.name}"
        else:
            each, source = estimate_checkpoint_bytes(trainer), "estimated from the weights and the replay buffer"
        problem = disk_space_problem(directory, each, source, keep)
    except OSError as e:  # a disk that cannot be measured is not a reason to stop
        logger.warning("could not check the free disk space for %s: %s", directory, e)
        return
    if problem is not None:
        warnings.warn(problem, RunWarning, stacklevel=3)
