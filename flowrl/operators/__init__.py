"""The RL dataflow vocabulary built on ``flowrl.iterators``: rollouts, training, replay, concurrency, metrics.

Each operator is a small callable (or a function returning an iterator) that can be
tested without a cluster. What the plan graph and checkpoints read from an operator is
declared through :mod:`flowrl.operators.protocol`; the items flowing between operators
are named tuples (:class:`Trained`, :class:`~flowrl.actors.Learned`,
:class:`ComputedGradients`, :class:`~flowrl.iterators.FromActor`). The settings an operator may
read from an algorithm's config are small Protocols (:class:`SGDConfig`,
:class:`TargetNetworkConfig`); what it uses of the plan's stateful pieces it reads from the
:class:`~flowrl.actors.PlanResources` it is given.
"""

from flowrl.operators.concurrency_ops import Concurrently, Dequeue, Enqueue
from flowrl.operators.learner_ops import (
    LearnerFlows,
    LearnInThread,
    RecordLearnerResults,
    SendWeightsToSource,
    record_learner_results,
)
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
    NUM_LEARNER_UPDATES,
    NUM_TARGET_UPDATES,
    STEPS_SAMPLED_COUNTER,
    STEPS_TRAINED_COUNTER,
)
from flowrl.operators.offline_ops import MixInput, ReadOffline
from flowrl.operators.perturbation_ops import (
    BroadcastWeights,
    CollectPerturbations,
    PerturbationRollouts,
    PerturbationSearch,
    PerturbationUpdate,
    SearchRounds,
    UpdateObservationFilter,
    centered_ranks,
)
from flowrl.operators.protocol import ActorFlow, ActorLink, HiddenOperator, Operator, StatefulOperator
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
    ComputedGradients,
    ComputeGradients,
    SGDConfig,
    TargetNetworkConfig,
    Trained,
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
    "NUM_LEARNER_UPDATES",
    "NUM_TARGET_UPDATES",
    "STEPS_SAMPLED_COUNTER",
    "STEPS_TRAINED_COUNTER",
    "ActorFlow",
    "ActorLink",
    "AggregatedRollouts",
    "ApplyGradients",
    "AsyncGradients",
    "AverageGradients",
    "BroadcastWeights",
    "CollectMetrics",
    "CollectPerturbations",
    "ComputeGradients",
    "ComputedGradients",
    "ConcatBatches",
    "Concurrently",
    "Dequeue",
    "Enqueue",
    "HiddenOperator",
    "LearnInThread",
    "LearnerFlows",
    "MixInReplay",
    "MixInput",
    "OncePerTimeInterval",
    "OncePerTimestepsElapsed",
    "Operator",
    "ParallelRollouts",
    "PerturbationRollouts",
    "PerturbationSearch",
    "PerturbationUpdate",
    "ReadOffline",
    "RecordLearnerResults",
    "Replay",
    "SGDConfig",
    "SearchRounds",
    "SelectExperiences",
    "SendWeightsToSource",
    "StandardMetricsReporting",
    "StandardizeFields",
    "StatefulOperator",
    "StoreToReplayBuffer",
    "TargetNetworkConfig",
    "ThrottleSampling",
    "TrainOneStep",
    "Trained",
    "UpdateKL",
    "UpdateObservationFilter",
    "UpdatePriorities",
    "UpdateTargetNetwork",
    "centered_ranks",
    "record_learner_results",
]
