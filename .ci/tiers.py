"""Run the test suite tier by tier, as CI does: ``python .ci/tiers.py [STAGE ...] [-- PYTEST ARGS]``.

The tiers are pytest marks (``setup.cfg`` says what each means, ``tests/conftest.py`` how a test
gets one). Each stage below runs one tier in its own pytest process and prints its 25 slowest
tests. Before any stage runs, one ``--collect-only`` lists every test with its marks, and each
stage's mark expression is applied to them: a test that no stage selects, or that two stages select,
fails the run before anything is tested. The run exits 1 if any stage fails (exit 5, no test
selected, passes only for a stage whose collection was empty), 2 if the check fails. Its last
line counts the tests of every stage together: ``tiers: N passed, N failed, N skipped``.

Name stages to run only those (``python .ci/tiers.py unit``); arguments after ``--`` go to
every pytest (``python .ci/tiers.py integration -- -x -k trainer``).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import NoReturn

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("learning", "cluster", "tune", "atari")
# Each heavy stage leaves out the heavy tiers of the stages before it, so that no test runs twice.
STAGES: dict[str, str] = {
    "unit": "unit",
    "integration": f"integration and not ({' or '.join(HEAVY)})",
    **{tier: tier if not HEAVY[:i] else f"{tier} and not ({' or '.join(HEAVY[:i])})" for i, tier in enumerate(HEAVY)},
}
NO_TESTS_COLLECTED = 5


def fail(message: str) -> NoReturn:
    """Stop before (or instead of) the stages: exit 2 with ``message``."""
    print(f"tiers: {message}", file=sys.stderr)
    sys.exit(2)


def pytest_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "pytest", *args]


# Run in a pytest process of its own: every collected test's node id and the names of its marks, one per line.
_MARKS_OF_EVERY_TEST = """
import sys, pytest
class Marks:
    def pytest_collection_finish(self, session):
        for item in session.items:
            print("MARKS", item.nodeid, ",".join(sorted({m.name for m in item.iter_markers()})), sep="\\t")
sys.exit(pytest.main(sys.argv[1:], plugins=[Marks()]))
"""


def collect_marks(extra: list[str]) -> dict[str, set[str]]:
    """Every test's node id and mark names, from one ``--collect-only`` (exits 2 if collection fails)."""
    command = [sys.executable, "-c", _MARKS_OF_EVERY_TEST, *extra, "--collect-only", "-q", "-p", "no:cacheprovider"]
    proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        sys.stdout.write(proc.stdout[-20000:] + proc.stderr[-5000:])
        fail(f"collecting the tests failed (pytest exit {proc.returncode})")
    lines = [line.split("\t") for line in proc.stdout.splitlines() if line.startswith("MARKS\t")]
    return {node_id: set(filter(None, marks.split(","))) for _, node_id, marks in lines}


def selects(mark_expression: str, marks: set[str]) -> bool:
    """Whether ``pytest -m mark_expression`` selects a test with these mark names (the expressions of
    STAGES use only ``and``, ``or``, ``not``, parentheses and tier names, which read the same in Python)."""
    names = {tier: tier in marks for tier in ("unit", "integration", *HEAVY)}
    return bool(eval(mark_expression, {"__builtins__": {}}, names))  # noqa: S307 - our own STAGES strings


def check_every_test_is_in_one_stage(extra: list[str]) -> dict[str, int]:
    """Compare the stages' selections with the whole collection; the number of tests in each stage."""
    everything = collect_marks(extra)
    if not everything:
        fail("pytest collected no tests")
    selected = {name: [t for t, marks in everything.items() if selects(mark, marks)] for name, mark in STAGES.items()}
    stages_of: dict[str, list[str]] = {}
    for name, ids in selected.items():
        for node_id in ids:
            stages_of.setdefault(node_id, []).append(name)
    missing = [node_id for node_id in everything if node_id not in stages_of]
    twice = {node_id: names for node_id, names in stages_of.items() if len(names) > 1}
    for name, ids in selected.items():
        print(f"tiers: {name:<12} {len(ids):5d} tests  (-m {STAGES[name]!r})")
    print(f"tiers: {'all':<12} {len(everything):5d} tests")
    if missing or twice:
        for node_id in missing:
            print(f"tiers: in no stage: {node_id}")
        for node_id, names in twice.items():
            print(f"tiers: in {len(names)} stages ({', '.join(names)}): {node_id}")
        fail(
            f"{len(missing)} test(s) in no stage, {len(twice)} in more than one: "
            "give each one tier (tests/conftest.py says how)"
        )
    return {name: len(ids) for name, ids in selected.items()}


def totals(reports: Path) -> tuple[int, int, int]:
    """Tests passed, failed (failures and errors) and skipped over the stages' JUnit reports."""
    passed = failed = skipped = 0
    for report in sorted(reports.glob("*.xml")):
        for suite in ElementTree.parse(report).getroot().iter("testsuite"):
            tests, skips = int(suite.get("tests", 0)), int(suite.get("skipped", 0))
            failures = int(suite.get("failures", 0)) + int(suite.get("errors", 0))
            passed, failed, skipped = passed + tests - failures - skips, failed + failures, skipped + skips
    return passed, failed, skipped


def main(argv: list[str]) -> int:
    names, extra = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    unknown = [name for name in names if name not in STAGES]
    if unknown:
        fail(f"unknown stage(s) {', '.join(unknown)}; the stages are {', '.join(STAGES)}")
    start = time.monotonic()
    counts = check_every_test_is_in_one_stage(extra)
    print(f"tiers: every test is in one stage (checked in {time.monotonic() - start:.0f} s)")
    outcomes: list[tuple[str, str, float]] = []
    reports = Path(tempfile.mkdtemp(prefix="flowrl-tiers-"))
    for name in names or list(STAGES):
        print(f"\n===== tiers: stage {name}: pytest -m {STAGES[name]!r} ({counts[name]} tests) =====", flush=True)
        start = time.monotonic()
        report = f"--junitxml={reports / name}.xml"
        code = subprocess.run(
            pytest_command("-m", STAGES[name], "--durations=25", report, *extra), cwd=REPO, check=False
        ).returncode
        if code == 0 or (code == NO_TESTS_COLLECTED and counts[name] == 0):
            outcome = "passed" if code == 0 else "empty"
        else:
            outcome = f"FAILED (pytest exit {code})"
        outcomes.append((name, outcome, time.monotonic() - start))
    print("\n===== tiers: summary =====")
    for name, outcome, seconds in outcomes:
        print(f"tiers: {name:<12} {counts[name]:5d} tests  {seconds:7.1f} s  {outcome}")
    passed, failed, skipped = totals(reports)
    shutil.rmtree(reports, ignore_errors=True)
    print(f"tiers: {passed} passed, {failed} failed, {skipped} skipped")
    return 1 if any(outcome.startswith("FAILED") for _, outcome, _ in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
