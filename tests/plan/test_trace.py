"""flowrl trace RUN_DIR: the spans a run records for trace_iterations, merged into a Chrome /
Perfetto trace (flowrl.plan.trace)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flowrl.cli import main as cli
from flowrl.config import TrainerConfig
from flowrl.errors import ConfigError, RunError
from flowrl.plan.trace import build_trace, recorded_iterations
from flowrl.runs.run import start_run
from flowrl.storage.rundir import RunSpec

pytestmark = pytest.mark.unit

# Two tiny SGD batches per iteration: each training iteration takes milliseconds.
TINY = {"train_batch_size": 64, "rollout_fragment_length": 32, "seed": 0}


def train(results_dir: Path, **config: Any) -> Path:
    with start_run(
        RunSpec("pg", "CartPole-v1", {**TINY, **config}, stop={"training_iteration": 3}), results_dir=results_dir
    ) as run:
        run.train()
    return run.directory


@pytest.fixture(scope="module")
def remote_run(tmp_path_factory: pytest.TempPathFactory, ray_session: None) -> Iterator[Path]:
    """A 3-iteration PG run sampling on one remote rollout worker, tracing iterations 2 and 3."""
    yield train(tmp_path_factory.mktemp("remote"), num_workers=1, num_cpus_per_worker=0.5, trace_iterations="2:3")


def check_chrome_trace(trace: dict[str, Any]) -> list[dict[str, Any]]:
    """Assert ``trace`` is a valid Chrome trace (as JSON); return its complete ("X") events."""
    trace = json.loads(json.dumps(trace, allow_nan=False))
    assert isinstance(trace["traceEvents"], list) and trace["traceEvents"]
    for event in trace["traceEvents"]:
        assert {"ph", "ts", "pid", "tid", "name"} <= set(event), event
        assert event["ph"] in ("X", "M")
        assert all(isinstance(event[key], int) for key in ("pid", "tid"))
    spans = [event for event in trace["traceEvents"] if event["ph"] == "X"]
    assert all(event["dur"] >= 0 and event["ts"] >= 0 for event in spans)
    return spans


def inside(inner: dict[str, Any], outer: dict[str, Any]) -> bool:
    return outer["ts"] <= inner["ts"] and inner["ts"] + inner["dur"] <= outer["ts"] + outer["dur"]


def test_trace_iterations_is_checked() -> None:
    assert TrainerConfig.from_dict({}).trace_iterations == "2:2"
    for value in ("3", "2:4", "", None):
        assert TrainerConfig.from_dict({"trace_iterations": value}).trace_iterations == value
    with pytest.raises(ConfigError, match=r"trace_iterations='3:2': iterations start at 1 and A:B needs 1 <= A <= B"):
        TrainerConfig.from_dict({"trace_iterations": "3:2"})
    with pytest.raises(ConfigError, match=r"trace_iterations='two' is not 'A:B' \(iterations A to B, e.g. '2:3'\)"):
        TrainerConfig.from_dict({"trace_iterations": "two"})


def test_a_run_records_the_iterations_it_is_told_to(remote_run: Path) -> None:
    assert recorded_iterations(remote_run) == [2, 3]
    record = json.loads((remote_run / "trace" / "iteration_000002.json").read_text())
    assert record["iteration"] == 2 and record["workers_unreported"] == []
    assert record["start_ns"] <= min(op["start_ns"] for op in record["operators"])
    keys = list(json.loads((remote_run / "plan.json").read_text())["operators"])
    assert {op["operator"] for op in record["operators"]} <= {op["key"] for op in keys}
    assert record["samples"] and {sample["worker"] for sample in record["samples"]} == {1}
    assert all(
        sample["steps"] == 32 and sample["env_s"] > 0 and sample["inference_s"] > 0 for sample in record["samples"]
    )


def test_flowrl_trace_writes_operator_and_rollout_worker_spans(
    remote_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "trace.json"
    assert cli.main(["trace", str(remote_run), "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"{out}: iterations 2, 3 of {remote_run}" in printed and "hand-offs of 1 rollout worker" in printed
    trace = json.loads(out.read_text())
    spans = check_chrome_trace(trace)
    assert trace["otherData"]["iterations"] == [2, 3]
    iterations = {event["args"]["iteration"]: event for event in spans if event["cat"] == "iteration"}
    assert set(iterations) == {2, 3}
    driver = iterations[2]["pid"]
    train_steps = [event for event in spans if event["name"] == "for_each(TrainOneStep)"]
    assert len(train_steps) == 2 and all(event["cat"] == "operator" and event["pid"] == driver for event in train_steps)
    # Each operator's next() contains those of the operators it pulls from, and the iteration contains them all.
    for step in train_steps:
        assert inside(step, iterations[step["args"]["iteration"]])
    for concat in (event for event in spans if event["name"] == "combine(ConcatBatches)"):
        assert any(inside(concat, step) for step in train_steps if step["tid"] == concat["tid"])
    samples = [event for event in spans if event["name"] == "RolloutWorker.sample()"]
    assert samples and all(event["pid"] != driver and event["args"]["worker"] == 1 for event in samples)
    assert all(
        event["args"]["env_s"] > 0 and event["args"]["inference_s"] > 0 and event["args"]["other_s"] >= 0
        for event in samples
    )
    # Each fragment Ray serialized after a sample() follows it on the same worker thread.
    handoffs = [event for event in spans if event["name"] == "Ray hand-off (serialize + store)"]
    assert handoffs and all(event["pid"] == samples[0]["pid"] and event["dur"] > 0 for event in handoffs)
    assert all(any(s["tid"] == h["tid"] and s["ts"] + s["dur"] <= h["ts"] for s in samples) for h in handoffs)
    names = {(event["pid"], event["args"]["name"]) for event in trace["traceEvents"] if event["name"] == "process_name"}
    assert (driver, f"driver (pid {driver})") in names and any(
        name.startswith("RolloutWorker 1 (pid") for _, name in names
    )

    assert cli.main(["trace", str(remote_run), "-o", str(out), "--iterations", "3"]) == 0
    assert json.loads(out.read_text())["otherData"]["iterations"] == [3]


def test_samples_in_the_driver_nest_inside_the_operator_that_pulls_them(tmp_path: Path) -> None:
    run_dir = train(tmp_path, num_workers=0)  # trace_iterations: the default, 2:2
    assert recorded_iterations(run_dir) == [2]
    spans = check_chrome_trace(build_trace(run_dir))
    sources = [event for event in spans if event["name"] == "local_worker.sample()"]
    samples = [event for event in spans if event["name"] == "RolloutWorker.sample()"]
    assert len(samples) == len(sources) == 2  # two fragments of 32 steps per batch of 64
    for sample, source in zip(samples, sources):
        assert (sample["pid"], sample["tid"]) == (source["pid"], source["tid"]) and inside(sample, source)
        assert sample["args"]["worker"] == 0 and sample["args"]["steps"] == 32


def test_errors_name_the_traced_iterations_or_why_there_are_none(
    remote_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["trace", str(remote_run), "--iterations", "5:9", "-o", str(tmp_path / "t.json")]) == 2
    assert "no traced iteration among iterations 5 to 9; the traced iterations are 2, 3" in capsys.readouterr().err
    assert not (tmp_path / "t.json").exists()
    assert cli.main(["trace", str(tmp_path)]) == 2
    assert "is not a flowrl run directory: it has no params.json" in capsys.readouterr().err
    untraced = tmp_path / "untraced"
    untraced.mkdir()
    (untraced / "params.json").write_text(
        json.dumps({"algo": "pg", "env": "CartPole-v1", "config": {"trace_iterations": ""}})
    )
    with pytest.raises(
        RunError, match="no traced iteration; it traced none \\(its config: trace_iterations='', profile=None"
    ):
        build_trace(untraced)
    with pytest.raises(SystemExit):
        cli.main(["trace", str(remote_run), "--iterations", "0:1"])
    assert "iterations start at 1" in capsys.readouterr().err
