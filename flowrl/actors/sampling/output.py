"""A rollout worker's experience writer (``output``): its sampler hands it every fragment's rows as sampled."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from flowrl.data.offline import ExperienceWriter


def experience_writer(config: Any, worker_index: int) -> ExperienceWriter | None:
    """The writer of ``config.output`` for worker ``worker_index`` (its own files); None when nothing is written."""
    if config.output is None:
        return None
    from flowrl.data.offline import ExperienceWriter  # imported here: PyArrow only where experiences are written

    return ExperienceWriter(
        config.output,
        worker_index=worker_index,
        max_file_size=config.output_max_file_size,
        compression=config.output_compression,
    )
