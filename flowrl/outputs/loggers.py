"""What a run logs besides ``progress.jsonl``: TensorBoard event files, ``progress.csv``, and the opt-in trackers.

A logger takes each result dict of a run (:class:`ResultLogger`: ``log_result(result)``, then
``close()`` when the run ends). Nested keys are flattened into ``a/b`` names
(``info/learner/default_policy/policy_loss``, ``plan/operators/6:for_each(TrainOneStep)/time_s``):

- :class:`TensorBoardLogger` (every run): each finite number is a scalar, at step
  ``timesteps_total``; non-numeric and non-finite values are skipped.
- :class:`CSVLogger` (every run): ``progress.csv``, one row per iteration, a column per
  scalar key; a key first seen in a later iteration widens the header (the file is rewritten).
- :class:`WandbLogger` and :class:`MLflowLogger` (opt-in, the ``tracking`` extra):
  the run's parameters once, the same numbers as TensorBoard per iteration. Their run ids are
  kept in the run directory's ``trackers.json``, so that a resumed run goes on in the same
  tracker run.

:func:`open_loggers` opens the loggers of a run directory; :mod:`flowrl.runs.run` calls it when a run
starts or resumes and feeds every result to them.
"""

from __future__ import annotations

import contextlib
import csv
import importlib.util
import json
import numbers
import os
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from flowrl.errors import RunError, install_hint
from flowrl.storage.results import finite_number, flatten_result

if TYPE_CHECKING:  # the trackers are optional dependencies, imported only when a run asks for them
    from mlflow.tracking import MlflowClient

CSV_FILE = "progress.csv"
TRACKERS_FILE = "trackers.json"  # the W&B and MLflow run ids of a run directory, for resuming
TRACKING_EXTRA = "tracking"
# The step of every TensorBoard, W&B and MLflow point; runs without the key fall back to the iteration.
STEP_KEY = "timesteps_total"
MLFLOW_EXPERIMENT = "flowrl"  # the MLflow experiment runs go to, unless $MLFLOW_EXPERIMENT_NAME names another

_MLFLOW_BATCH = 1000  # MLflow takes at most 1000 metrics per log_batch call
_MLFLOW_PARAMS_BATCH = 100  # and at most 100 params
_MLFLOW_UNSAFE = re.compile(r"[^\w\-. /:]")  # the characters MLflow refuses in metric and param names


class ResultLogger(Protocol):
    """Something that records a run's results; a run calls ``log_result`` once per iteration, then ``close``."""

    def log_result(self, result: Mapping[str, Any]) -> None:
        """Record one training iteration's result dict."""

    def close(self) -> None:
        """Write out what is buffered and release files or tracker runs."""


# --- result dicts as flat keys ----------------------------------------------------------------------


def scalar_metrics(result: Mapping[str, Any]) -> dict[str, float]:
    """The finite numbers of ``result`` under their flattened keys: what TensorBoard and the trackers record."""
    metrics = {}
    for key, value in flatten_result(result).items():
        number = finite_number(value)
        if number is not None:
            metrics[key] = number
    return metrics


def result_step(result: Mapping[str, Any]) -> int:
    """The step a result is logged at: its ``timesteps_total`` (its ``training_iteration`` if it has none)."""
    for key in (STEP_KEY, "training_iteration"):
        number = finite_number(result.get(key))
        if number is not None:
            return int(number)
    return 0


# --- TensorBoard and progress.csv -------------------------------------------------------------------


class TensorBoardLogger:
    """TensorBoard event files in ``logdir``, written with tensorboardX.

    Each finite number of a result is a scalar under its flattened key, at step
    :func:`result_step` (``timesteps_total``). ``purge_step`` is for a resumed run: points
    from step ``purge_step`` on, written before the run was interrupted, are hidden, so that
    the iterations trained again after the checkpoint are not shown twice.
    """

    def __init__(self, logdir: str | os.PathLike[str], *, purge_step: int | None = None) -> None:
        # Imported here: tensorboardX imports torch, which a run loads anyway but `import flowrl.runs.run` need not.
        from tensorboardX import SummaryWriter  # type: ignore[import-untyped]

        # tensorboardX names files by the second they were opened in, and TensorBoard reads them in name
        # order: the nanoseconds keep a resumed run's file from overwriting, or sorting before, one
        # opened in the same second.
        self._writer = SummaryWriter(logdir=str(logdir), purge_step=purge_step, filename_suffix=f".{time.time_ns()}")

    def log_result(self, result: Mapping[str, Any]) -> None:
        step = result_step(result)
        for tag, value in scalar_metrics(result).items():
            self._writer.add_scalar(tag, value, global_step=step)
        self._writer.flush()  # TensorBoard shows a running run's iterations as they finish

    def close(self) -> None:
        self._writer.close()


def _csv_cell(value: Any) -> Any:
    """A result value as a CSV cell; None when it is not one (a list, a non-finite number: an empty cell)."""
    if value is None or isinstance(value, (str, bool)):
        return value
    number = finite_number(value)
    return int(number) if number is not None and isinstance(value, numbers.Integral) else number


class CSVLogger:
    """``progress.csv`` at ``path``: one row per result, one column per flattened scalar key.

    Columns are in the order keys were first seen. A result with a key no earlier row had (an
    evaluation every N iterations, a custom metric) rewrites the file with the wider header, so
    that no column is lost; rows without a key leave its cell empty. Lists and non-finite numbers
    are left empty too. The file starts with ``previous_results`` (a resumed run's results so far).
    """

    def __init__(self, path: str | os.PathLike[str], previous_results: Sequence[Mapping[str, Any]] = ()) -> None:
        self.path = Path(path)
        self._columns: list[str] = []
        rows = [self._row(result) for result in previous_results]
        for row in rows:
            self._add_columns(row)
        self._rewrite(rows)

    def log_result(self, result: Mapping[str, Any]) -> None:
        row = self._row(result)
        if self._add_columns(row):
            with open(self.path, newline="", encoding="utf-8") as f:
                rows: list[Mapping[str, Any]] = list(csv.DictReader(f))
            self._rewrite([*rows, row])
            return
        with open(self.path, "a", newline="", encoding="utf-8") as f:
            csv.DictWriter(f, self._columns).writerow(row)

    def close(self) -> None:
        """Nothing to do: each row is written when it is logged."""

    @staticmethod
    def _row(result: Mapping[str, Any]) -> dict[str, Any]:
        flat = flatten_result(result)
        return {key: _csv_cell(value) for key, value in flat.items() if not isinstance(value, (list, tuple))}

    def _add_columns(self, row: Mapping[str, Any]) -> bool:
        """Add ``row``'s keys that are not columns yet; whether there were any."""
        known = set(self._columns)
        new = [key for key in row if key not in known]
        self._columns.extend(new)
        return bool(new)

    def _rewrite(self, rows: Sequence[Mapping[str, Any]]) -> None:
        # Through a temporary file and a rename: a reader (or a crash) never sees half a file.
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        with open(tmp, "w", newline="", encoding="utf-8") as f:
            if self._columns:
                writer = csv.DictWriter(f, self._columns)
                writer.writeheader()
                writer.writerows(rows)
        os.replace(tmp, self.path)


# --- trackers ---------------------------------------------------------------------------------------


def check_trackers(wandb_project: str | None, mlflow_tracking_uri: str | None) -> None:
    """Raise :class:`~flowrl.errors.RunError` if a tracker is asked for and its package is not installed."""
    missing = []
    if wandb_project is not None and importlib.util.find_spec("wandb") is None:
        missing.append(f"logging to Weights & Biases (project {wandb_project!r}) needs the wandb package")
    if mlflow_tracking_uri is not None and importlib.util.find_spec("mlflow") is None:
        missing.append(f"logging to MLflow ({mlflow_tracking_uri!r}) needs the MLflow tracking client")
    if missing:
        raise RunError(f"{'; '.join(missing)}: {install_hint(TRACKING_EXTRA)}")


class WandbLogger:
    """A Weights & Biases run in ``project``: ``config`` once, the numbers of each result.

    W&B's own files go under ``<run_dir>/wandb``. Every metric is plotted against
    ``timesteps_total``. ``run_id`` continues that W&B run (a resumed flowrl run); None starts
    a new one, named ``name``. W&B's environment variables apply (``WANDB_MODE=offline``,
    ``WANDB_ENTITY``, ``WANDB_API_KEY``).
    """

    def __init__(
        self,
        project: str,
        *,
        run_dir: str | os.PathLike[str],
        name: str,
        config: Mapping[str, Any],
        run_id: str | None = None,
    ) -> None:
        import wandb

        # create_new: a run of the user's own script, or of another flowrl run in this process, stays untouched.
        # allow_val_change: a resumed run may have new stop criteria, checkpoint settings or num_workers.
        self._run = wandb.init(
            project=project,
            name=name,
            dir=str(run_dir),
            config=dict(config),
            id=run_id,
            resume="allow" if run_id else None,
            reinit="create_new",
            allow_val_change=True,
        )
        self._run.define_metric(STEP_KEY)
        self._run.define_metric("*", step_metric=STEP_KEY)
        self.run_id: str = self._run.id

    def log_result(self, result: Mapping[str, Any]) -> None:
        self._run.log(scalar_metrics(result))

    def close(self) -> None:
        self._run.finish()


def mlflow_key(key: str) -> str:
    """``key`` with the characters MLflow refuses in names (parentheses, commas...) replaced by ``_``."""
    return _MLFLOW_UNSAFE.sub("_", key)


def _chunks(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


class MLflowLogger:
    """An MLflow run at ``tracking_uri``: ``params`` once (flattened), the numbers of each result.

    Metrics are logged at step ``timesteps_total``; names keep the flattened keys, with the
    characters MLflow refuses replaced by ``_`` (:func:`mlflow_key`). The run goes to the
    experiment ``$MLFLOW_EXPERIMENT_NAME`` (default ``flowrl``), created if needed. ``run_id``
    continues that MLflow run (a resumed flowrl run) if the server has it; else a new one,
    named ``name``, starts.
    """

    def __init__(self, tracking_uri: str, *, name: str, params: Mapping[str, Any], run_id: str | None = None) -> None:
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient

        self._client: MlflowClient = MlflowClient(tracking_uri=tracking_uri)
        if run_id is not None:
            try:
                self._client.update_run(run_id, status="RUNNING")
            except MlflowException:  # not on this server (deleted, or another URI): a new run
                run_id = None
        if run_id is None:
            run_id = self._start_run(name, params)
        self.run_id: str = run_id

    def _start_run(self, name: str, params: Mapping[str, Any]) -> str:
        from mlflow.entities import Param

        experiment_name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or MLFLOW_EXPERIMENT
        experiment = self._client.get_experiment_by_name(experiment_name)
        if experiment is not None:
            experiment_id = experiment.experiment_id
        else:
            experiment_id = self._client.create_experiment(experiment_name)
        run_id: str = self._client.create_run(experiment_id, run_name=name).info.run_id
        flat = [
            Param(mlflow_key(key), json.dumps(value) if isinstance(value, (list, tuple)) else str(value))
            for key, value in flatten_result(params).items()
        ]
        for chunk in _chunks(flat, _MLFLOW_PARAMS_BATCH):
            self._client.log_batch(run_id, params=list(chunk))
        return run_id

    def log_result(self, result: Mapping[str, Any]) -> None:
        from mlflow.entities import Metric

        timestamp, step = int(time.time() * 1000), result_step(result)
        metrics = [Metric(mlflow_key(key), value, timestamp, step) for key, value in scalar_metrics(result).items()]
        for chunk in _chunks(metrics, _MLFLOW_BATCH):
            self._client.log_batch(self.run_id, metrics=list(chunk))

    def close(self) -> None:
        self._client.set_terminated(self.run_id)


# --- the loggers of a run directory -----------------------------------------------------------------


def _read_tracker_ids(run_dir: Path) -> dict[str, Any]:
    """``trackers.json``: ``{"wandb": {"project", "run_id"}, "mlflow": {"tracking_uri", "run_id"}}`` (empty if none)."""
    with contextlib.suppress(OSError, ValueError):
        ids = json.loads((run_dir / TRACKERS_FILE).read_text(encoding="utf-8"))
        if isinstance(ids, dict):
            return ids
    return {}


def offline_wandb_runs(run_dir: str | os.PathLike[str]) -> list[Path]:
    """The offline W&B runs a run directory holds for its W&B run (``wandb/offline-run-<time>-<run id>``,
    one per session of a resumed run), oldest first; empty when W&B logged online or not at all.
    ``wandb sync`` uploads them."""
    entry = _read_tracker_ids(Path(run_dir)).get("wandb")
    run_id = entry.get("run_id") if isinstance(entry, Mapping) else None
    if not isinstance(run_id, str) or not run_id:
        return []
    return sorted(path for path in (Path(run_dir) / "wandb").glob(f"offline-run-*-{run_id}") if path.is_dir())


def _previous_id(ids: Mapping[str, Any], tracker: str, setting: str, value: str) -> str | None:
    """The run id ``trackers.json`` has for ``tracker`` if it was logging with the same ``setting`` (project, URI)."""
    entry = ids.get(tracker)
    if isinstance(entry, Mapping) and entry.get(setting) == value and isinstance(entry.get("run_id"), str):
        return str(entry["run_id"])
    return None


def open_loggers(
    run_dir: str | os.PathLike[str],
    params: Mapping[str, Any],
    *,
    wandb_project: str | None = None,
    mlflow_tracking_uri: str | None = None,
    previous_results: Sequence[Mapping[str, Any]] | None = None,
    resumed_at_step: int | None = None,
) -> list[ResultLogger]:
    """Open the loggers of a run directory: TensorBoard and ``progress.csv``, and the trackers asked for.

    ``params`` is what the trackers record as the run's parameters (``params.json``'s
    contents, JSON data). A new run passes ``previous_results=None``. A resumed run passes its
    results so far (``progress.csv`` is rewritten from them) and ``resumed_at_step``, the
    ``timesteps_total`` of its checkpoint (TensorBoard hides the points logged after it), and
    goes on in the W&B and MLflow runs of ``trackers.json`` when it logs to the same project
    and tracking URI. Raises :class:`~flowrl.errors.RunError` when a tracker's package is
    missing or its run cannot be started; nothing stays open then.
    """
    directory = Path(run_dir)
    check_trackers(wandb_project, mlflow_tracking_uri)
    loggers: list[ResultLogger] = []
    ids = _read_tracker_ids(directory) if previous_results is not None else {}
    try:
        purge_step = None if resumed_at_step is None else resumed_at_step + 1
        loggers.append(TensorBoardLogger(directory, purge_step=purge_step))
        loggers.append(CSVLogger(directory / CSV_FILE, previous_results or ()))
        new_ids: dict[str, Any] = {}
        if wandb_project is not None:
            try:
                wandb_logger = WandbLogger(
                    wandb_project,
                    run_dir=directory,
                    name=directory.name,
                    config=params,
                    run_id=_previous_id(ids, "wandb", "project", wandb_project),
                )
            except Exception as e:  # noqa: BLE001 - W&B raises many kinds (not logged in, no network)
                raise RunError(
                    f"cannot start a Weights & Biases run in project {wandb_project!r}: {type(e).__name__}: {e}"
                ) from e
            loggers.append(wandb_logger)
            new_ids["wandb"] = {"project": wandb_project, "run_id": wandb_logger.run_id}
        if mlflow_tracking_uri is not None:
            try:
                mlflow_logger = MLflowLogger(
                    mlflow_tracking_uri,
                    name=directory.name,
                    params=params,
                    run_id=_previous_id(ids, "mlflow", "tracking_uri", mlflow_tracking_uri),
                )
            except Exception as e:  # noqa: BLE001 - MLflow's errors, and its HTTP client's
                raise RunError(f"cannot start an MLflow run at {mlflow_tracking_uri!r}: {type(e).__name__}: {e}") from e
            loggers.append(mlflow_logger)
            new_ids["mlflow"] = {"tracking_uri": mlflow_tracking_uri, "run_id": mlflow_logger.run_id}
        if new_ids:
            tmp = directory / f".{TRACKERS_FILE}.tmp"
            tmp.write_text(json.dumps({**ids, **new_ids}, indent=2) + "\n", encoding="utf-8")
            os.replace(tmp, directory / TRACKERS_FILE)
    except BaseException:
        for logger in loggers:
            with contextlib.suppress(Exception):
                logger.close()
        raise
    return loggers
