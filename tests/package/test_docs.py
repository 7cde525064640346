"""The documentation's examples run, and the pages agree with the code they describe.

Every ```python block of each page in ``DOC_PATHS`` runs, in order, in one namespace, so a later
block may use what an earlier one defined. Ray is initialised by the ``ray_session`` fixture, so
pages only mention ``ray.init()`` in a comment. Only blocks fenced exactly as ```python are run;
use another tag (```text, ```bash, ```py) for anything that must not be. To check another page,
add it to ``DOC_PATHS``.

The tests after ``test_doc_examples_run`` read the pages themselves and check what they state
(tables of defaults, tuned examples, plan lines, printed plans, code listings) against the code
base, so that the pages can show only what a reader would type.
"""

from __future__ import annotations

import ast
import inspect
import keyword
import re
import sys
import traceback
from pathlib import Path

import pytest
import yaml

from flowrl import Trainer
from flowrl.algorithms import dqn, get_algorithm, list_algorithms, ppo, ppo_dqn

pytestmark = pytest.mark.unit

REPO_ROOT = Path(__file__).resolve().parents[2]

# Pages whose python blocks must run, relative to the repository root.
DOC_PATHS = [
    "docs/iterators.md",
    "docs/multi-agent.md",
    "docs/concepts.md",
    "docs/writing-an-algorithm.md",
    "docs/algorithms.md",
    "docs/fault-tolerance.md",
    "docs/checkpoints.md",
    "docs/tracking-and-evaluation.md",
    "docs/offline.md",
]


def fenced_blocks(text: str, tag: str) -> list[tuple[int, str]]:
    """Return ``(line, code)`` for each block of a Markdown ``text`` fenced exactly as ```tag.

    ``line`` is the 1-based line of the block's first code line, so errors can point into the page.
    """
    # A fence opening with exactly the tag, its body, and the closing fence at the same indent.
    fence = re.compile(
        rf"^(?P<indent>[ \t]*)```{re.escape(tag)}[ \t]*\n(?P<body>.*?)^(?P=indent)```[ \t]*$",
        re.DOTALL | re.MULTILINE,
    )
    blocks = []
    for match in fence.finditer(text):
        first_line = text.count("\n", 0, match.start("body")) + 1
        indent = match.group("indent")
        lines = match.group("body").splitlines()
        code = "\n".join(line[len(indent) :] if line.startswith(indent) else line for line in lines)
        blocks.append((first_line, code + "\n"))
    return blocks


def python_blocks(text: str) -> list[tuple[int, str]]:
    """Return ``(line, code)`` for each ```python block of a Markdown ``text``."""
    return fenced_blocks(text, "python")


def test_python_blocks_finds_only_python_fences() -> None:
    text = "intro\n```python\nx = 1\n```\n```text\nnot code\n```\n\n```python\ny = x + 1\n```\n"
    assert python_blocks(text) == [(3, "x = 1\n"), (10, "y = x + 1\n")]


@pytest.mark.parametrize("doc_path", DOC_PATHS)
def test_doc_examples_run(doc_path: str, ray_session: None) -> None:
    path = REPO_ROOT / doc_path
    blocks = python_blocks(path.read_text(encoding="utf-8"))
    assert blocks, f"{doc_path} has no ```python blocks to run"
    # A module name that is not importable, so cloudpickle ships functions and classes the
    # examples define to Ray actors by value rather than by reference.
    namespace: dict[str, object] = {"__name__": f"__doc_{path.stem}__"}
    try:
        for index, (line, code) in enumerate(blocks):
            # Leading newlines make tracebacks report line numbers of the Markdown file itself.
            # dont_inherit: the docs' code must not pick up this file's __future__ imports.
            compiled = compile("\n" * (line - 1) + code, str(path), "exec", dont_inherit=True)
            try:
                exec(compiled, namespace)
            except Exception as err:
                first = next((c for c in code.splitlines() if c.strip()), "")
                pytest.fail(
                    f"{doc_path}: python block {index} (starting at line {line}: {first.strip()!r}) "
                    f"failed with {type(err).__name__}: {err}\n\n{traceback.format_exc()}",
                    pytrace=False,
                )
    finally:
        # Drop the examples' iterators and actor handles so their actors exit with this test.
        namespace.clear()


# --- Checks of what the pages state against the code base ---------------------------------------


def read_page(doc_path: str) -> str:
    return (REPO_ROOT / doc_path).read_text(encoding="utf-8")


def block_starting(text: str, tag: str, start: str) -> str:
    """The one ```tag block of ``text`` whose code starts with ``start``."""
    [code] = [code for _, code in fenced_blocks(text, tag) if code.startswith(start)]
    return code


def table_rows(text: str, first_header: str) -> list[tuple[list[str], list[list[str]]]]:
    """Every Markdown table of ``text`` whose first header cell is ``first_header``: (header, rows) of cells."""
    tables, lines = [], text.splitlines()
    for i, line in enumerate(lines):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0] == first_header:
            rows = []
            for row in lines[i + 2 :]:  # past the header and the |---| line
                if not row.startswith("|"):
                    break
                rows.append([c.strip() for c in row.strip().strip("|").split("|")])
            tables.append((cells, rows))
    return tables


def unquote(cell: str) -> str:
    return cell.strip().strip("`")


def without_stage_ids(described: str) -> list[str]:
    """The lines of a ``plan.describe()`` text without the ``[n] `` stage ids, which count up per process."""
    # Anchored after the indent: "duplicate[0]" is a label, not a stage id.
    return [re.sub(r"^(\s*)\[\d+\] ", r"\1", line.rstrip()) for line in described.strip().splitlines()]


def built_in_algorithms() -> list[str]:
    """The algorithms flowrl ships: those a page registers with ``register_algorithm`` are left out."""
    return [
        name
        for name in list_algorithms()
        if get_algorithm(name).execution_plan.__module__.startswith("flowrl.algorithms.")
    ]


ALGORITHMS_PAGE = "docs/algorithms.md"


def test_algorithms_page_lists_every_built_in_algorithm() -> None:
    [(_, overview)] = table_rows(read_page(ALGORITHMS_PAGE), "name")
    assert sorted(unquote(row[0]) for row in overview) == built_in_algorithms()


def test_algorithms_page_tuned_examples_match_their_files_and_learning_tests() -> None:
    """Each tuned example of the overview names its row's algorithm, and its threshold and budget
    are the file's ``stop`` criteria and those the learning tests use."""
    [(_, overview)] = table_rows(read_page(ALGORITHMS_PAGE), "name")
    learning_tests = "".join(
        (REPO_ROOT / "tests" / "algorithms" / test).read_text(encoding="utf-8")
        for test in ("test_learning.py", "test_es_ars.py", "test_offline_learning.py", "test_cql.py")
    )
    for name, _, example, threshold_cell, budget_cell in overview:
        spec = yaml.safe_load((REPO_ROOT / unquote(example)).read_text(encoding="utf-8"))
        assert spec["algo"] == unquote(name), (example, spec["algo"])
        threshold = float(re.match(r"-?[\d.]+", threshold_cell).group())
        budget = int(re.match(r"[\d,]+", budget_cell).group().replace(",", ""))  # "500,000 (rows read)" too
        assert spec["stop"]["timesteps_total"] == budget, example
        # ppo_dqn's file has no reward stop: its threshold is per policy, which no stop key expresses.
        assert spec["stop"].get("episode_reward_mean", threshold) == threshold, example
        file_name = unquote(example).split("/")[-1]
        for text in (f'"{file_name}"', f"{threshold:.1f}", f"{budget:_}"):
            assert text in learning_tests, (example, text)


def test_algorithms_page_other_tuned_examples_name_their_algorithm() -> None:
    [(_, variations)] = table_rows(read_page(ALGORITHMS_PAGE), "example")
    for example, algo, _ in variations:
        spec = yaml.safe_load((REPO_ROOT / unquote(example)).read_text(encoding="utf-8"))
        assert spec["algo"] == unquote(algo), example


def test_algorithms_page_names_every_tuned_example() -> None:
    named = set(re.findall(r"tuned_examples/[\w.-]+\.yaml", read_page(ALGORITHMS_PAGE)))
    assert named == {f"tuned_examples/{path.name}" for path in (REPO_ROOT / "tuned_examples").glob("*.yaml")}


def algorithms_page_plan_lines() -> list[tuple[str, str]]:
    """``(algorithm, chain)`` for each one-line plan in the page's text blocks, e.g. ``apex, apex_ddpg: A -> B``."""
    plan_line = re.compile(r"^([a-z0-9_]+(?:, [a-z0-9_]+)*):\s+(.*->.*)$")
    lines = []
    for _, block in fenced_blocks(read_page(ALGORITHMS_PAGE), "text"):
        for line in block.splitlines():
            match = plan_line.match(line.split("  #")[0])  # without the trailing "# with microbatch_size"
            if match:
                lines += [(name, match.group(2)) for name in match.group(1).split(", ")]
    return lines


def plan_source(name: str) -> str:
    """The source of the algorithm's plan module, of the flowrl.algorithms modules it uses (APPO's
    plan is IMPALA's, DDPG's is DQN's), and of the composite operators (functions of
    flowrl.operators, e.g. PerturbationSearch, LearnInThread) those modules call."""
    module = sys.modules[get_algorithm(name).execution_plan.__module__]
    modules = {module}
    for value in vars(module).values():
        used = value if inspect.ismodule(value) else inspect.getmodule(value)
        if used is not None and used.__name__.startswith("flowrl.algorithms."):
            modules.add(used)
    composites = {
        value
        for m in modules
        for value in vars(m).values()
        if inspect.isfunction(value) and value.__module__.startswith("flowrl.operators.")
    }
    return "\n".join([*(inspect.getsource(m) for m in modules), *(inspect.getsource(f) for f in composites)])


def test_algorithms_page_has_a_plan_line_for_every_algorithm() -> None:
    assert sorted({name for name, _ in algorithms_page_plan_lines()}) == built_in_algorithms()


def test_algorithms_page_plan_lines_name_operators_of_the_plan() -> None:
    for name, chain in algorithms_page_plan_lines():
        source = plan_source(name)
        for stage in re.split(r"->|\|\|", chain):
            operator = re.match(r"[A-Za-z_][\w.]*", stage.strip(" []()")).group()
            assert operator in source, (name, operator)


def test_algorithms_page_key_tables_show_the_config_defaults() -> None:
    checked = 0
    for header, rows in table_rows(read_page(ALGORITHMS_PAGE), "key"):
        algorithms = [unquote(cell) for cell in header[1:-1]]  # between "key" and "what it does"
        defaults = {name: get_algorithm(name).config_class.from_dict({}) for name in algorithms}
        for row in rows:
            key = unquote(row[0])
            field = f"{key}_" if keyword.iskeyword(key) else key  # "lambda" lives in the field lambda_
            for name, cell in zip(algorithms, row[1:-1]):
                if cell != "—":  # the algorithm has no such key
                    assert getattr(defaults[name], field) == ast.literal_eval(unquote(cell)), (name, key, cell)
                    checked += 1
    assert checked > 150  # every table was found and read


def test_algorithms_page_impala_aggregator_plan_is_describe(ray_session: None) -> None:
    impala = Trainer(
        "impala",
        "CartPole-v1",
        config={
            "num_workers": 2,
            "num_cpus_per_worker": 0.1,
            "num_aggregation_workers": 1,
            "num_cpus_per_aggregator": 0.1,
            "num_envs_per_worker": 1,
            "rollout_fragment_length": 10,
            "train_batch_size": 20,
            "seed": 0,
        },
    )
    try:
        shown = block_starting(read_page(ALGORITHMS_PAGE), "text", "plan impala:")
        assert without_stage_ids(impala.plan.describe()) == without_stage_ids(shown)
    finally:
        impala.stop()


WRITING_PAGE = "docs/writing-an-algorithm.md"


def test_writing_page_ppo_listing_is_the_code_of_ppo_py() -> None:
    listing = block_starting(read_page(WRITING_PAGE), "py", "def training_flow(")
    source = inspect.getsource(ppo.training_flow) + inspect.getsource(ppo.execution_plan)
    for step in (
        'ParallelRollouts(workers, mode="bulk_sync")',
        ".combine(ConcatBatches(config.train_batch_size))",
        ".for_each(StandardizeFields([SampleBatch.ADVANTAGES]))",
        ".for_each(TrainOneStep(workers, policies, config, resources=resources))",
        ".for_each(UpdateKL(workers))",
        "return StandardMetricsReporting(training_flow(rollouts, workers, config, resources), workers, config)",
    ):
        assert step in listing, step
        assert step in source, step


def test_writing_page_ppo_plan_graph_is_describe_and_mermaid(ray_session: None) -> None:
    """The page's printed PPO graph and its Mermaid diagram show what the live plan gives; the
    page's trainer has 2 remote workers, and so has this one."""
    trainer = Trainer(
        "ppo",
        "CartPole-v1",
        config={
            "num_workers": 2,
            "num_cpus_per_worker": 0.1,
            "rollout_fragment_length": 10,
            "train_batch_size": 20,
            "sgd_minibatch_size": 10,
            "seed": 0,
        },
    )
    try:
        page = read_page(WRITING_PAGE)
        shown = [line.strip() for line in without_stage_ids(block_starting(page, "text", "plan ppo:"))]
        described = [line.strip() for line in without_stage_ids(trainer.plan.describe())]
        assert described[0] == "plan ppo:"
        for line in (
            "batch_across_shards(rollout_workers)  <- RolloutWorker x2",
            "for_each(TrainOneStep)  <- for_each(StandardizeFields)",
            "for_each(UpdateKL)  <- for_each(TrainOneStep)",
            "for_each(TrainOneStep) --broadcast weights--> RolloutWorker x2",
        ):
            assert line in described, line
            assert line in shown, line

        shown_mermaid = block_starting(page, "mermaid", "flowchart TD")
        mermaid = trainer.plan.to_mermaid()
        assert mermaid.startswith("flowchart TD")
        for fragment in ('(["RolloutWorker x2"])', '-->|"broadcast weights"| actor_RolloutWorker'):
            assert fragment in mermaid, fragment
            assert fragment in shown_mermaid, fragment
        assert trainer.plan.to_dot().startswith('digraph "ppo" {')
    finally:
        trainer.stop()


MULTI_AGENT_PAGE = "docs/multi-agent.md"


def test_multi_agent_page_ppo_dqn_listing_is_the_code_of_ppo_dqn_py() -> None:
    listing = block_starting(read_page(MULTI_AGENT_PAGE), "py", "def execution_plan(")
    source = inspect.getsource(ppo_dqn.execution_plan)
    for line in (
        'ppo_rollouts, dqn_rollouts = ParallelRollouts(workers, mode="bulk_sync").duplicate(2)',
        "dqn_experience = dqn_rollouts.for_each(SelectExperiences([DQN_POLICY]))",
        "dqn.training_flow(dqn_experience, workers, config.dqn_config(), resources, [DQN_POLICY])",
        "ppo.training_flow(ppo_experience, workers, config.ppo_config(), resources, [PPO_POLICY])",
        'return StandardMetricsReporting(Concurrently([ppo_op, dqn_op], mode="async"), workers, config)',
    ):
        assert line in listing, line
        assert line in source, line
    # The page calls the two policies by these ids, in its prose, config table and printed plan.
    assert (ppo_dqn.PPO_POLICY, ppo_dqn.DQN_POLICY) == ("ppo_policy", "dqn_policy")


def test_multi_agent_page_training_flows_train_only_the_policies_given() -> None:
    """The page says each sub-flow's TrainOneStep trains and broadcasts only the policies passed to it."""
    for flow in (dqn.training_flow, ppo.training_flow):
        assert "TrainOneStep(workers,policies" in re.sub(r"\s", "", inspect.getsource(flow)), flow.__module__


def test_multi_agent_page_composed_plan_graph_is_describe(ray_session: None) -> None:
    """The lines of the printed ppo_dqn graph that make it a composition are in the live plan's."""
    composed = Trainer("ppo_dqn", "MultiAgentCartPole", {"num_workers": 2, "num_cpus_per_worker": 0.1, "seed": 0})
    try:
        shown = [
            line.strip()
            for line in without_stage_ids(block_starting(read_page(MULTI_AGENT_PAGE), "text", "plan ppo_dqn:"))
        ]
        described = [line.strip() for line in without_stage_ids(composed.plan.describe())]
        for line in (
            "duplicate[0]  <- for_each(count_steps_sampled)",
            "duplicate[1]  <- for_each(count_steps_sampled)",
            "for_each(SelectExperiences)  <- duplicate[0]",
            "for_each(SelectExperiences)  <- duplicate[1]",
            "for_each(StoreToReplayBuffer)  <- for_each(SelectExperiences)",
            "union[deterministic]  <- for_each(StoreToReplayBuffer), for_each(UpdateTargetNetwork)",
            "union[async]  <- for_each(UpdateKL), union[deterministic]",
            "filter(OncePerTimestepsElapsed)  <- union[async]",
            # Each sub-flow sends only its own policy's weights.
            "for_each(TrainOneStep) --broadcast weights of ppo_policy--> RolloutWorker x2",
            "for_each(TrainOneStep) --broadcast weights of dqn_policy--> RolloutWorker x2",
        ):
            assert line in described, line
            assert line in shown, line
    finally:
        composed.stop()
