"""flowrl plan RUN_DIR: a run's plan.json and its X-ray drawn as text, Mermaid, DOT and HTML
(flowrl.plan.views, flowrl.plan.render, flowrl.plan.html)."""

from __future__ import annotations

import io
import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from event_files import event_scalars
from fakes import progress

from flowrl.cli import main as cli
from flowrl.errors import FlowRLError, RunError
from flowrl.plan.graph import PlanGraph, graph_from_dict
from flowrl.plan.html import render_html
from flowrl.plan.render import render_dot, render_mermaid, render_text, share_colour
from flowrl.plan.views import NoXRayError, average_xray, load_view, read_plan_graph, render_run, watch_run, xray_window
from flowrl.runs.resume import find_resume_point, resume_run
from flowrl.runs.run import start_run
from flowrl.storage.rundir import RunSpec

pytestmark = pytest.mark.unit

# One process, two tiny SGD batches per iteration: each training iteration takes milliseconds.
TINY = {"num_workers": 0, "train_batch_size": 64, "rollout_fragment_length": 32, "seed": 0}
PERCENT = re.compile(r"\s(\d+\.\d)%\s")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A finished 4-iteration PG run (sampling in the driver), with its live plan graph checked against plan.json."""
    with start_run(
        RunSpec("pg", "CartPole-v1", TINY, stop={"training_iteration": 4}), results_dir=tmp_path_factory.mktemp("runs")
    ) as run:
        run.train()
        live = run.trainer.plan.graph.to_dict()
    assert json.loads((run.directory / "plan.json").read_text()) == live
    yield run.directory


def fake_run(directory: Path, results: list[dict[str, Any]], plan: dict[str, Any] | None = None) -> Path:
    """A run directory written by hand: params.json, progress.jsonl and (unless None) plan.json."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "params.json").write_text(json.dumps({"algo": "pg", "env": "CartPole-v1", "config": {}}))
    (directory / "progress.jsonl").write_text("".join(json.dumps(r) + "\n" for r in results))
    if plan is not None:
        (directory / "plan.json").write_text(json.dumps(plan))
    return directory


# --- plan.json ---------------------------------------------------------------------------------------


def test_plan_json_reads_back_as_the_runs_graph_and_a_resume_rewrites_it(run_dir: Path, tmp_path: Path) -> None:
    written = json.loads((run_dir / "plan.json").read_text())
    graph = read_plan_graph(run_dir)
    assert graph.to_dict() == written
    assert [op["key"] for op in written["operators"]] == list(progress(run_dir)[-1]["plan"]["operators"])
    assert [op["position"] for op in written["operators"]] == list(range(len(written["operators"])))
    assert {"class": "RolloutWorker", "count": 1} in written["actors"]
    assert {"source": {"operator": 3}, "target": {"actor": "RolloutWorker"}, "label": "broadcast weights"} in written[
        "edges"
    ]

    copy = shutil.copytree(run_dir, tmp_path / run_dir.name)  # the other tests read the run as it was
    with resume_run(find_resume_point(copy, stop={"training_iteration": 5})) as resumed:
        resumed.train()
        live = resumed.trainer.plan.graph
    rewritten = read_plan_graph(copy)
    assert list(rewritten.operators) == list(live.operators)  # this process's stage ids
    assert rewritten.edges == live.edges and rewritten.actors == live.actors
    assert [s.label for s in rewritten.operators.values()] == [s.label for s in live.operators.values()]


def test_graph_from_dict_names_what_is_malformed() -> None:
    graph = PlanGraph(actors={"RolloutWorker": 2})
    assert graph_from_dict(graph.to_dict()).to_dict() == {
        "operators": [],
        "actors": [{"class": "RolloutWorker", "count": 2}],
        "edges": [],
    }
    with pytest.raises(FlowRLError, match="not a plan graph .*KeyError: 'operators'"):
        graph_from_dict({"actors": []})
    with pytest.raises(FlowRLError, match="KeyError: \"actor 'Nobody'\""):
        graph_from_dict(
            {"operators": [], "actors": [], "edges": [{"source": {"actor": "Nobody"}, "target": {}, "label": ""}]}
        )


# --- the figures ---------------------------------------------------------------------------------------


def test_the_window_leaves_out_the_first_iteration_when_there_are_more_and_averages_number_by_number() -> None:
    results = [{"training_iteration": n, "plan": {"operators": {}, "iteration_s": float(n)}} for n in (1, 2, 3, 4)]
    assert [r["training_iteration"] for r in xray_window(results, last=5)] == [2, 3, 4]
    assert [r["training_iteration"] for r in xray_window(results, last=2)] == [3, 4]
    assert [r["training_iteration"] for r in xray_window(results[:1], last=5)] == [1]
    assert xray_window([{"training_iteration": 2, "plan": {"profile": False, "iteration_s": 1.0}}]) == []
    averaged = average_xray(
        [
            {
                "iteration_s": 1.0,
                "operators": {"0:a": {"share": 0.5}},
                "driver": {"x_s": 0.1},
                "unattributed_s": 0.4,
                "profile": True,
            },
            {
                "iteration_s": 2.0,
                "operators": {"0:a": {"share": 0.7}},
                "driver": {"x_s": 0.2},
                "unattributed_s": 0.2,
                "profile": True,
            },
        ]
    )
    assert averaged["operators"]["0:a"]["share"] == pytest.approx(0.6)
    assert averaged["driver_share"]["x_s"] == pytest.approx(0.1)
    assert averaged["unattributed_share"] == pytest.approx(0.25)  # 0.4 of 1 s, 0.2 of 2 s
    assert averaged["profile"] is True


def test_share_colours_run_from_white_to_red() -> None:
    assert share_colour(0.0) == "#ffffff"
    assert share_colour(1.0) == "#d62728"
    assert (
        share_colour(2.0) == "#d62728" and share_colour(-1.0) == "#ffffff" and share_colour(float("nan")) == "#ffffff"
    )
    reds = [int(share_colour(s)[3:5], 16) for s in (0.1, 0.4, 0.8)]  # green falls as the share grows
    assert reds == sorted(reds, reverse=True)


def test_text_shows_every_operator_and_shares_that_add_up_with_unattributed_to_100(run_dir: Path) -> None:
    view = load_view(run_dir)
    assert view.iterations == (2, 3, 4)  # iteration 1 is left out
    text = render_text(view)
    graph = read_plan_graph(run_dir)
    table = text.split("\nactors\n")[0]
    for number, stage in enumerate(graph.operators.values(), start=1):
        assert f"[{number}] {stage.label}" in table
    rows = [line for line in table.splitlines()[3:] if not line.startswith(("driver (", "total"))]
    shares = [float(PERCENT.search(line + " ").group(1)) for line in rows]
    assert (
        len(shares) == len(graph.operators) + len(view.figures["driver"]) + 1
    )  # operators, driver steps, unattributed
    assert rows[-1].startswith("unattributed")
    assert sum(shares) == pytest.approx(100.0, abs=0.1 * len(shares))
    assert re.search(r"^total\s+(99\.\d|100\.\d)%", table, re.MULTILINE)
    assert "RolloutWorker: busy " in text and "(sampling in the driver)" in text
    actors = text.split("\nactors\n")[1]
    for phase in ("env ", "inference ", "other ", "idle "):
        assert phase in actors
    assert "serializing" not in actors  # a worker in the driver hands its fragments to no Ray call
    assert re.search(r"learner: learn [\d.]+ ms, weight sync [\d.]+ ms, load [\d.]+ ms, update [\d.]+ ms", actors)
    assert "local_worker.sample() -> for_each(count_steps_sampled): " in text and "items/s" in text


def test_mermaid_and_dot_fill_every_node_by_its_share(run_dir: Path) -> None:
    view = load_view(run_dir)
    mermaid, dot = render_mermaid(view), render_dot(view)
    nodes = [PlanGraph.op_id(stage) for stage in view.graph.operators.values()] + ["actor_RolloutWorker"]
    for node in nodes:
        fill = re.search(rf"^    style {node} fill:(#[0-9a-f]{{6}}),", mermaid, re.MULTILINE)
        assert fill is not None, node
        assert re.search(rf'^    {node} \[.*fillcolor="{fill.group(1)}"', dot, re.MULTILINE), node
    # The operator with the largest share has the reddest fill, the colour of its share.
    busiest = max(view.graph.operators.values(), key=lambda stage: view.operator(stage.id)["share"])
    colour = share_colour(view.operator(busiest.id)["share"])
    assert f"style {PlanGraph.op_id(busiest)} fill:{colour}," in mermaid
    assert f"{busiest.label}<br/>{100 * view.operator(busiest.id)['share']:.1f}% of the iteration" in mermaid
    assert re.search(r'op\d+ -> op\d+ \[label="[\d,.]+ items/s, [\d.]+ MB/s"\];', dot)
    assert re.search(r'op\d+ -->\|"[\d,.]+ items/s, [\d.]+ MB/s"\| op\d+', mermaid)


def test_html_is_one_self_contained_page_with_every_operator_and_actor(run_dir: Path) -> None:
    view = load_view(run_dir)
    page = render_html(view)
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert "<script" not in page and "<link" not in page and "src=" not in page and "@import" not in page
    for stage in view.graph.operators.values():
        assert page.count(f">{stage.label}<") >= 2, stage.label  # in the drawing and in the table
        assert share_colour(view.operator(stage.id)["share"]) in page
    for actor_class in view.graph.actors:
        assert page.count(f">{actor_class}<") >= 2, actor_class
    assert "unattributed" in page and "<svg" in page


def test_flowrl_plan_run_dir_prints_each_format_and_keeps_the_settings_form_apart(
    run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for fmt, expected in (
        ("text", "operators (dataflow order)"),
        ("mermaid", "flowchart TD"),
        ("dot", "digraph"),
        ("html", "<!DOCTYPE html>"),
    ):
        assert cli.main(["plan", str(run_dir), "--format", fmt, "--last", "2"]) == 0
        out = capsys.readouterr().out
        assert expected in out and out == render_run(run_dir, fmt, last=2) + "\n"
    assert cli.main(["plan", str(run_dir), "--algo", "pg"]) == 2
    assert "--algo cannot be used with RUN_DIR" in capsys.readouterr().err
    assert cli.main(["plan", "--algo", "pg", "--env", "CartPole-v1", "--format", "html"]) == 2
    assert "--format html: only for a run's plan with its measured figures; give RUN_DIR" in capsys.readouterr().err
    assert cli.main(["plan", str(run_dir), "--live", "--format", "dot"]) == 2
    assert "--live redraws the text view" in capsys.readouterr().err


def test_live_redraws_until_ctrl_c(
    run_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    naps: list[float] = []

    def sleep(seconds: float) -> None:
        naps.append(seconds)
        if len(naps) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr("flowrl.plan.views.time.sleep", sleep)
    stream = io.StringIO()
    with pytest.raises(KeyboardInterrupt):
        watch_run(run_dir, interval_s=0.5, stream=stream)
    assert naps == [0.5, 0.5]
    assert stream.getvalue().count("operators (dataflow order)") == 2 and "redrawn every 0.5 s" in stream.getvalue()
    naps.clear()
    assert cli.main(["plan", str(run_dir), "--live", "--interval", "0.25"]) == 0  # Ctrl-C ends a live view
    assert naps == [0.25, 0.25] and capsys.readouterr().out.count("operators (dataflow order)") == 2


# --- errors ----------------------------------------------------------------------------------------------


def test_errors_name_a_non_run_directory_an_older_run_and_a_run_without_figures(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["plan", str(tmp_path)]) == 2
    assert "is not a flowrl run directory: it has no params.json" in capsys.readouterr().err

    older = fake_run(tmp_path / "older", progress(run_dir))
    with pytest.raises(
        RunError, match="has no plan.json: it was started by an older flowrl.*flowrl plan --algo pg --env CartPole-v1"
    ):
        load_view(older)

    plan = json.loads((run_dir / "plan.json").read_text())
    unprofiled = fake_run(
        tmp_path / "unprofiled",
        [{"training_iteration": n, "plan": {"profile": False, "iteration_s": 0.1}} for n in (1, 2)],
        plan,
    )
    with pytest.raises(NoXRayError, match="none of its 2 results has X-ray figures .*profile: false"):
        load_view(unprofiled)
    with pytest.raises(NoXRayError, match="no iteration has finished yet"):
        load_view(fake_run(tmp_path / "starting", [], plan))
    assert cli.main(["plan", str(unprofiled)]) == 2
    assert "profile: false" in capsys.readouterr().err

    damaged = fake_run(tmp_path / "damaged", [], {"operators": [{"label": "x"}]})
    with pytest.raises(RunError, match="plan.json.*not a plan graph"):
        read_plan_graph(damaged)


# --- TensorBoard --------------------------------------------------------------------------------------


def test_every_operators_share_is_a_tensorboard_scalar(run_dir: Path) -> None:
    scalars = event_scalars(run_dir)
    results = progress(run_dir)
    for op in json.loads((run_dir / "plan.json").read_text())["operators"]:
        # TensorBoard keeps letters, digits and _ . / - in tags: "0:local_worker.sample()" -> "0_local_worker.sample__".
        points = scalars[re.sub(r"[^\w./-]", "_", f"plan/operators/{op['key']}/share")]
        expected = [(r["timesteps_total"], r["plan"]["operators"][op["key"]]["share"]) for r in results]
        assert [step for step, _ in points] == [step for step, _ in expected]
        assert [value for _, value in points] == pytest.approx([value for _, value in expected], abs=1e-6)
