"""One operator numbering everywhere: ``flowrl plan --algo``, ``flowrl plan RUN_DIR``, the HTML X-ray and the
result keys (and so the TensorBoard tags ``plan/operators/<n>:...``) number operators from 1 in dataflow
order; a run written when results numbered them from 0 still reads with its own keys."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from fakes import progress

from flowrl.cli import main as cli

pytestmark = pytest.mark.unit

TINY = ["--num-workers", "0", "--set", "train_batch_size=64", "--set", "rollout_fragment_length=32"]
NUMBERED = re.compile(r"^\s+\[(\d+)\] (\S+)")


def numbered(text: str) -> list[tuple[int, str]]:
    """The ``[n] label`` lines of a printed plan."""
    return [(int(m[1]), m[2]) for line in text.splitlines() if (m := NUMBERED.match(line))]


@pytest.fixture
def run_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    argv = ["train", "--algo", "pg", "--env", "CartPole-v1", "--results-dir", str(tmp_path), "--name", "run"]
    assert cli.main([*argv, *TINY, "--stop-iters", "2", "--quiet"]) == 0
    capsys.readouterr()
    return tmp_path / "run"


def test_the_graph_the_xray_and_the_results_number_operators_alike(
    run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["plan", "--algo", "pg", "--env", "CartPole-v1", *TINY]) == 0
    graph = numbered(capsys.readouterr().out)
    assert cli.main(["plan", str(run_dir)]) == 0
    xray = numbered(capsys.readouterr().out)
    assert [n for n, _ in graph] == list(range(1, len(graph) + 1))
    assert xray == graph and (4, "for_each(TrainOneStep)") in graph
    for result in progress(run_dir):
        assert list(result["plan"]["operators"]) == [f"{n}:{label}" for n, label in graph]
    assert [op["key"] for op in json.loads((run_dir / "plan.json").read_text())["operators"]] == [
        f"{n}:{label}" for n, label in graph
    ]
    assert cli.main(["plan", str(run_dir), "--format", "html"]) == 0
    assert "<tr><td>1</td><td>local_worker.sample()</td>" in capsys.readouterr().out


def test_a_run_keyed_from_0_shows_its_figures_numbered_from_1(
    run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["plan", str(run_dir)]) == 0
    shown = capsys.readouterr().out

    def from_0(key: str) -> str:
        number, _, label = key.partition(":")
        return f"{int(number) - 1}:{label}"

    plan = json.loads((run_dir / "plan.json").read_text())
    for op in plan["operators"]:
        op["key"] = from_0(op["key"])
    (run_dir / "plan.json").write_text(json.dumps(plan))
    results = progress(run_dir)
    for result in results:
        result["plan"]["operators"] = {from_0(key): entry for key, entry in result["plan"]["operators"].items()}
    (run_dir / "progress.jsonl").write_text("".join(json.dumps(result) + "\n" for result in results))

    assert cli.main(["plan", str(run_dir)]) == 0
    assert capsys.readouterr().out == shown
