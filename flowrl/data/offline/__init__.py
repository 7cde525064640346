"""Experience files: sample batches written to Parquet by rollout workers and read back as datasets.

The layout (one row per step, NumPy columns as Arrow columns, ``metadata.json`` beside the files)
is :mod:`flowrl.data.offline.columns`; :class:`ExperienceWriter` writes it, :class:`OfflineData`
checks and streams it.
"""

from flowrl.errors import OfflineDataError, install_hint

try:
    import pyarrow  # noqa: F401 - checked here: every module of the package needs it
except ImportError as error:  # pragma: no cover - the dev extra installs it
    raise OfflineDataError(
        f"experience files (input, output) need PyArrow and Ray Data: {install_hint('offline')}"
    ) from error

from flowrl.data.offline.columns import AGENT_ID, POLICY_ID, batch_to_table, table_to_batch
from flowrl.data.offline.reader import BackgroundReader, OfflineData, ShuffleBuffer, resolve_files
from flowrl.data.offline.writer import (
    COMPRESSIONS,
    FORMAT,
    FORMAT_VERSION,
    METADATA_FILE,
    ExperienceWriter,
    write_metadata,
)

__all__ = [
    "AGENT_ID",
    "BackgroundReader",
    "COMPRESSIONS",
    "FORMAT",
    "FORMAT_VERSION",
    "METADATA_FILE",
    "POLICY_ID",
    "ExperienceWriter",
    "OfflineData",
    "ShuffleBuffer",
    "batch_to_table",
    "resolve_files",
    "table_to_batch",
    "write_metadata",
]
