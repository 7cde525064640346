"""Names of the counters, timers and info entries that operators share through the metrics context."""

#: Counter of env steps sampled (in a ``MultiAgentBatch``, env steps, not agent steps).
STEPS_SAMPLED_COUNTER = "num_steps_sampled"
#: Counter of env steps trained on.
STEPS_TRAINED_COUNTER = "num_steps_trained"
#: Counter of agent steps sampled: one per agent acting in an env step.
AGENT_STEPS_SAMPLED_COUNTER = "num_agent_steps_sampled"
#: Counter of agent steps trained on.
AGENT_STEPS_TRAINED_COUNTER = "num_agent_steps_trained"
#: Counter of target-network updates (``UpdateTargetNetwork``).
NUM_TARGET_UPDATES = "num_target_updates"
#: Counter holding the steps count at the last target-network update.
LAST_TARGET_UPDATE_TS = "last_target_update_ts"
NUM_WEIGHT_SYNCS = "num_weight_syncs"
#: Counter of train batches a learner thread finished.
NUM_LEARNER_UPDATES = "num_learner_updates"

SAMPLE_TIMER = "sample"
LEARN_ON_BATCH_TIMER = "learn"
COMPUTE_GRADS_TIMER = "compute_grads"
APPLY_GRADS_TIMER = "apply_grads"
WORKER_UPDATE_TIMER = "update"

#: The metrics-context info entry (and ``result["info"]`` key) holding the learner statistics.
LEARNER_INFO = "learner"
