"""Test-session fixtures and test tiers: one Ray session shared by every test that needs it, and
every test in a tier (``setup.cfg`` lists them; ``.ci/tiers.py`` runs each as a CI stage).

How a test gets its tier:

- a test that uses the ``ray_session`` fixture (itself, through another fixture or through
  ``usefixtures``) is ``integration``, marked here;
- a test that starts Ray some other way or a subprocess is marked ``integration`` (or a heavier
  tier: ``learning``, ``cluster``, ``tune``, ``atari``) in its module;
- ``unit`` in a module's ``pytestmark`` is the default of its tests: one that is ``integration``
  or in a heavier tier by the rules above is not ``unit``;
- a test with no tier, or one marked ``unit`` on itself that is also in another tier, fails the
  collection, naming the test.

A ``unit`` test must not start Ray or a process: while one runs, ``ray.init``, ``subprocess.Popen``,
``os.fork`` and ``multiprocessing`` raise, and the test fails naming what it started.
"""

from __future__ import annotations

import logging
import multiprocessing.process
import os
import platform
import signal
import subprocess
from typing import Any, Iterator, NoReturn

import pytest
import ray

UNIT = "unit"
TIERS = (UNIT, "integration", "learning", "cluster", "tune", "atari")

# The standard library runs `uname -p` once per process, on the first platform.platform() or
# processor() (mlflow calls it on import): done here, it is not a process a unit test started.
platform.processor()


@pytest.fixture(scope="session")
def ray_session() -> Iterator[None]:
    """Start one local Ray instance (2 CPUs, no dashboard) for the whole test session."""
    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level=logging.ERROR)
    yield
    ray.shutdown()


@pytest.fixture
def sighup_default() -> Iterator[None]:
    """SIGHUP with its default action, as a terminal's session has it: a session started under ``nohup``
    ignores SIGHUP, and a run rightly keeps ignoring it (see ``flowrl.runs.signals``), so a test that
    sends SIGHUP sets the disposition it relies on."""
    previous = signal.signal(signal.SIGHUP, signal.SIG_DFL)
    try:
        yield
    finally:
        signal.signal(signal.SIGHUP, signal.SIG_DFL if previous is None else previous)


def _heavier_than_unit(item: pytest.Item) -> bool:
    return any(item.get_closest_marker(tier) for tier in TIERS[1:])


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by these marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark Ray-session tests ``integration``, make a module's ``unit`` a default, and refuse
    a collection with a test in no tier or in ``unit`` and another tier at once."""
    for item in items:
        if "ray_session" in getattr(item, "fixturenames", ()) and not item.get_closest_marker("integration"):
            item.add_marker(pytest.mark.integration)
    # A `unit` mark on a module (or class) moves onto those of its tests that are in no other tier.
    holders = {
        id(node): node
        for item in items
        for node in item.listchain()[:-1]
        if any(mark.name == UNIT for mark in node.own_markers)
    }
    for node in holders.values():
        node.own_markers[:] = [mark for mark in node.own_markers if mark.name != UNIT]
    contradictions = []
    for item in items:
        heavier = _heavier_than_unit(item)
        if item.get_closest_marker(UNIT) and heavier:
            contradictions.append(item.nodeid)
        elif not heavier and any(id(node) in holders for node in item.listchain()[:-1]):
            item.add_marker(pytest.mark.unit)
    untiered = [item.nodeid for item in items if not any(item.get_closest_marker(tier) for tier in TIERS)]
    problems = []
    if untiered:
        problems.append(
            f"{len(untiered)} test(s) in no tier: mark each (or its module's pytestmark) with one of "
            f"{', '.join(TIERS)} (setup.cfg says what each means):\n  " + "\n  ".join(untiered)
        )
    if contradictions:
        problems.append(
            f"{len(contradictions)} test(s) marked unit on themselves but also integration (they use ray_session "
            "or are marked so) or in a heavier tier: keep one tier:\n  " + "\n  ".join(contradictions)
        )
    if problems:
        raise pytest.UsageError("\n".join(problems))


class StartedInUnitTest(RuntimeError):
    """A unit test started Ray or a process."""


@pytest.fixture(autouse=True)
def _unit_tests_start_no_ray_and_no_process(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    """In a ``unit`` test, starting Ray or a process raises, and the test fails even where the error was caught."""
    if request.node.get_closest_marker(UNIT) is None:
        yield
        return
    started: list[str] = []

    def refuse(what: str) -> NoReturn:
        started.append(what)
        raise StartedInUnitTest(f"a unit test started {what}: mark {request.node.nodeid} integration")

    def refuse_popen(self: subprocess.Popen[Any], args: Any, *rest: Any, **kwargs: Any) -> None:
        refuse(f"a process ({args!r:.200})")

    def refuse_ray(*args: Any, **kwargs: Any) -> NoReturn:
        refuse("Ray (ray.init)")

    monkeypatch.setattr(ray, "init", refuse_ray)  # what Ray's auto-init (an actor's .remote(), ray.put) calls too
    monkeypatch.setattr(subprocess.Popen, "__init__", refuse_popen)
    monkeypatch.setattr(os, "fork", lambda: refuse("a process (os.fork)"))
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", lambda self: refuse(f"a process ({self!r})"))
    yield
    if started:
        pytest.fail(f"a unit test started {'; '.join(started)}: mark {request.node.nodeid} integration", pytrace=False)
