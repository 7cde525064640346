"""Names of the counters, timers and info entries that operators share through the metrics context."""

STEPS_SAMPLED_COUNTER = "num_steps_sampled"
STEPS_TRAINED_COUNTER = "num_steps_trained"
AGENT_STEPS_SAMPLED_COUNTER = "num_agent_steps_sampled"
AGENT_STEPS_TRAINED_COUNTER = "num_agent_steps_trained"
NUM_TARGET_UPDATES = "num_target_updates"
LAST_TARGET_UPDATE_TS = "last_target_update_ts"
NUM_WEIGHT_SYNCS = "num_weight_syncs"
NUM_LEARNER_UPDATES = "num_learner_updates"  # train batches a learner thread finished

SAMPLE_TIMER = "sample"
LEARN_ON_BATCH_TIMER = "learn"
COMPUTE_GRADS_TIMER = "compute_grads"
APPLY_GRADS_TIMER = "apply_grads"
WORKER_UPDATE_TIMER = "update"

LEARNER_INFO = "learner"
