"""The import paths DESIGN.md promises users are importable, with the promised constant values."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.unit


def test_every_contract_name_imports() -> None:
    from flowrl import Trainer  # noqa: F401
    from flowrl.actors import LearnerThread, ReplayActor, RolloutWorker, WorkerSet  # noqa: F401
    from flowrl.algorithms import get_algorithm, list_algorithms  # noqa: F401
    from flowrl.data import (  # noqa: F401
        DEFAULT_POLICY_ID,
        LocalReplayBuffer,
        MultiAgentBatch,
        PrioritizedReplayBuffer,
        ReplayBuffer,
        SampleBatch,
    )
    from flowrl.iterators import (  # noqa: F401
        LocalIterator,
        MetricsContext,
        NextValueNotReady,
        ParallelIterator,
        ParallelIteratorWorker,
        SharedMetrics,
        from_actors,
        from_items,
        from_iterators,
        from_range,
    )
    from flowrl.operators import (  # noqa: F401
        ApplyGradients,
        AsyncGradients,
        AverageGradients,
        CollectMetrics,
        ComputeGradients,
        ConcatBatches,
        Concurrently,
        Dequeue,
        Enqueue,
        MixInReplay,
        OncePerTimeInterval,
        OncePerTimestepsElapsed,
        ParallelRollouts,
        Replay,
        SelectExperiences,
        StandardizeFields,
        StandardMetricsReporting,
        StoreToReplayBuffer,
        TrainOneStep,
        UpdateTargetNetwork,
    )


def test_counter_names() -> None:
    from flowrl.operators import STEPS_SAMPLED_COUNTER, STEPS_TRAINED_COUNTER

    assert (STEPS_SAMPLED_COUNTER, STEPS_TRAINED_COUNTER) == ("num_steps_sampled", "num_steps_trained")


def _modules_loaded_by(code: str) -> set[str]:
    """Top-level module names a fresh interpreter holds after running ``code``."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport sys; print(' '.join(sorted(sys.modules)))"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout.split("\n")[-2]
    return {name.split(".")[0] for name in out.split()}


@pytest.mark.integration
def test_the_iterator_substrate_imports_neither_torch_nor_gymnasium() -> None:
    loaded = _modules_loaded_by("import flowrl.iterators")
    assert "torch" not in loaded and "gymnasium" not in loaded


@pytest.mark.integration
def test_flowrl_help_does_not_import_torch() -> None:
    loaded = _modules_loaded_by(
        "import contextlib, io\n"
        "from flowrl.cli import main as cli\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        "    cli.main(['--help'])"
    )
    assert "flowrl" in loaded and "torch" not in loaded
