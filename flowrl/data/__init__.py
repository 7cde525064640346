"""Experience data: sample batches, multi-agent batches and column compression."""

from flowrl.data.compression import CompressedColumn
from flowrl.data.replay_buffer import (
    LocalReplayBuffer,
    PrioritizedReplayBuffer,
    ReplayBuffer,
    ReplayBufferError,
)
from flowrl.data.sample_batch import (
    DEFAULT_POLICY_ID,
    MultiAgentBatch,
    SampleBatch,
    as_policy_batches,
    concat_samples,
)
from flowrl.data.segment_tree import MinSegmentTree, SumSegmentTree

__all__ = [
    "DEFAULT_POLICY_ID",
    "CompressedColumn",
    "LocalReplayBuffer",
    "MinSegmentTree",
    "MultiAgentBatch",
    "PrioritizedReplayBuffer",
    "ReplayBuffer",
    "ReplayBufferError",
    "SampleBatch",
    "as_policy_batches",
    "SumSegmentTree",
    "concat_samples",
]
