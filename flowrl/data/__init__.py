"""Experience data: sample batches, multi-agent batches and column compression."""

from flowrl.data.compression import CompressedColumn
from flowrl.data.sample_batch import DEFAULT_POLICY_ID, MultiAgentBatch, SampleBatch, concat_samples

__all__ = ["DEFAULT_POLICY_ID", "CompressedColumn", "MultiAgentBatch", "SampleBatch", "concat_samples"]
