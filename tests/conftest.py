"""Test-session fixtures: one Ray session shared by every test that needs it."""

from __future__ import annotations

import logging
from typing import Iterator

import pytest
import ray


@pytest.fixture(scope="session")
def ray_session() -> Iterator[None]:
    """Start one local Ray instance (2 CPUs, no dashboard) for the whole test session."""
    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level=logging.ERROR)
    yield
    ray.shutdown()
