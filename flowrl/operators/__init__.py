"""The RL dataflow vocabulary built on ``flowrl.iterators``: rollouts, training, concurrency, metrics.

Each operator is a small callable (or a function returning an iterator) that can be
tested without a cluster.
"""

from flowrl.operators.concurrency_ops import Concurrently, Dequeue, Enqueue
from flowrl.operators.learner_ops import SendWeightsToSource, record_learner_results
from flowrl.operators.metric_ops import (
    CollectMetrics,
    OncePerTimeInterval,
    OncePerTimestepsElapsed,
    StandardMetricsReporting,
)
from flowrl.operators.names import (
    AGENT_STEPS_SAMPLED_COUNTER,
    AGENT_STEPS_TRAINED_COUNTER,
    LAST_TARGET_UPDATE_TS,
    LEARNER_INFO,
    NUM_TARGET_UPDATES,
    STEPS_SAMPLED_COUNTER,
    STEPS_TRAINED_COUNTER,
)
from flowrl.operators.perturbation_ops import (
    BroadcastWeights,
    CollectPerturbations,
    NoiseTable,
    PerturbationResult,
    PerturbationRollouts,
    UpdateObservationFilter,
    centered_ranks,
)
from flowrl.operators.replay_ops import (
    MixInReplay,
    Replay,
    StoreToReplayBuffer,
    ThrottleSampling,
    UpdatePriorities,
)
from flowrl.operators.rollout_ops import (
    AggregatedRollouts,
    AsyncGradients,
    ConcatBatches,
    ParallelRollouts,
    SelectExperiences,
    StandardizeFields,
)
from flowrl.operators.train_ops import (
    KL_COEFF,
    ApplyGradients,
    AverageGradients,
    ComputeGradients,
    TrainOneStep,
    UpdateKL,
    UpdateTargetNetwork,
)

__all__ = [
    "AGENT_STEPS_SAMPLED_COUNTER",
    "AGENT_STEPS_TRAINED_COUNTER",
    "KL_COEFF",
    "LAST_TARGET_UPDATE_TS",
    "LEARNER_INFO",
    "NUM_TARGET_UPDATES",
    "STEPS_SAMPLED_COUNTER",
    "STEPS_TRAINED_COUNTER",
    "AggregatedRollouts",
    "ApplyGradients",
    "AsyncGradients",
    "AverageGradients",
    "BroadcastWeights",
    "CollectMetrics",
    "CollectPerturbations",
    "ComputeGradients",
    "ConcatBatches",
    "Concurrently",
    "Dequeue",
    "Enqueue",
    "MixInReplay",
    "NoiseTable",
    "OncePerTimeInterval",
    "OncePerTimestepsElapsed",
    "ParallelRollouts",
    "PerturbationResult",
    "PerturbationRollouts",
    "Replay",
    "SelectExperiences",
    "SendWeightsToSource",
    "StandardMetricsReporting",
    "StandardizeFields",
    "StoreToReplayBuffer",
    "ThrottleSampling",
    "TrainOneStep",
    "UpdateKL",
    "UpdateObservationFilter",
    "UpdatePriorities",
    "UpdateTargetNetwork",
    "centered_ranks",
    "record_learner_results",
]
