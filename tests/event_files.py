"""Reading TensorBoard event files back as TensorBoard does: shared by the logger and X-ray view tests."""

from __future__ import annotations

from pathlib import Path


def event_scalars(logdir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar tag of the event files in ``logdir``, as TensorBoard reads them: ``{tag: [(step, value)]}``."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(logdir), size_guidance={"scalars": 0})  # 0: keep every point
    accumulator.Reload()
    return {
        tag: [(event.step, event.value) for event in accumulator.Scalars(tag)] for tag in accumulator.Tags()["scalars"]
    }
