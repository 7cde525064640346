"""Reading configs written for RLlib: its other names for flowrl's keys, and its keys that change nothing here.

flowrl keeps RLlib's key names, but RLlib renamed keys between versions (``min_iter_time_s`` ->
``min_time_s_per_reporting`` -> ``min_time_s_per_iteration``), nested some
(``optimizer: {num_replay_buffer_shards}``, ``replay_buffer_config: {capacity, ...}``,
``multiagent: {policies, ...}``) and has many that steer TensorFlow, logging or its own
internals. :func:`translate_rllib_config` turns such a config into flowrl's keys:

- a key RLlib renamed or nested becomes flowrl's key (:data:`RENAMED`, :data:`NESTED`), and
  ``framework: tf`` (or tf2, tfe) runs on PyTorch;
- a key that does not change what is learned (logging, TensorFlow sessions, reporting,
  debugging) is dropped (:data:`IGNORED`), and so is a key set to the value that leaves
  RLlib's computation as flowrl's (:data:`IGNORED_AT`: ``horizon: null``, ``clip_rewards: false``);
- a key that would change the math, which flowrl does not implement (:data:`NOT_IMPLEMENTED`,
  or :data:`IGNORED_AT` with another value), is a problem naming it;
- a config that is RLlib's (it has RLlib's :data:`RLLIB_MARKER` key, ``framework``) gets
  RLlib's defaults for the keys it leaves out, where they differ from flowrl's and change
  what is learned: each algorithm config declares them in its ``rllib_defaults``.

Only keys the algorithm's config does not declare are read this way, so a flowrl config
passes unchanged. :func:`read_rllib_keys`, which :meth:`flowrl.config.TrainerConfig.from_dict`
calls, also says what it did: one :class:`RLlibConfigNote` per mapping, one listing the
ignored keys and one listing RLlib's defaults applied, each text once per process
(``flowrl train`` prints them as ``flowrl: note: ...``).
docs/coming-from-rllib.md is the table for readers.
"""

from __future__ import annotations

import copy
import inspect
import keyword
import math
import threading
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

#: flowrl's name for a key RLlib renamed (flowrl keeps the names of RLlib's execution-plan era).
RENAMED: dict[str, str] = {
    "num_rollout_workers": "num_workers",
    "sample_batch_size": "rollout_fragment_length",
    "min_time_s_per_reporting": "min_iter_time_s",
    "min_time_s_per_iteration": "min_iter_time_s",
    "min_sample_timesteps_per_reporting": "timesteps_per_iteration",
    "min_sample_timesteps_per_iteration": "timesteps_per_iteration",
    "metrics_num_episodes_for_smoothing": "metrics_smoothing_episodes",
    "num_steps_sampled_before_learning_starts": "learning_starts",
    "sgd_stepsize": "lr",  # RLlib's first PPO; ARS declares sgd_stepsize itself, so it is never renamed there
    "noise_size": "noise_table_size",
    "min_q_weight": "cql_alpha",  # CQL's penalty weight
    # RLlib 2.x: its new API stack's EnvRunners and Learners, and the names used between the two stacks.
    "num_env_runners": "num_workers",
    "num_envs_per_env_runner": "num_envs_per_worker",
    "num_cpus_per_env_runner": "num_cpus_per_worker",
    "num_gpus_per_env_runner": "num_gpus_per_worker",
    "custom_resources_per_env_runner": "custom_resources_per_worker",
    "evaluation_num_env_runners": "evaluation_num_workers",
    "num_epochs": "num_sgd_iter",
    "num_learner_workers": "num_learners",
    "num_cpus_per_learner_worker": "num_cpus_per_learner",
    "num_gpus_per_learner_worker": "num_gpus_per_learner",
    "num_cpus_for_main_process": "num_cpus_for_driver",
    "num_cpus_for_local_worker": "num_cpus_for_driver",
    "restart_failed_env_runners": "recreate_failed_workers",
    "recreate_failed_env_runners": "recreate_failed_workers",
}

#: RLlib keys (its new API stack's) that count per learner, and flowrl's key, which counts over all learners:
#: flowrl's value is RLlib's times ``max(1, num_learners)`` (RLlib's ``total_train_batch_size``).
PER_LEARNER: dict[str, str] = {
    "train_batch_size_per_learner": "train_batch_size",
    "minibatch_size": "sgd_minibatch_size",
}

#: flowrl's key for a key RLlib kept inside a dict: ``{dict key: {sub-key: flowrl key}}``.
NESTED: dict[str, dict[str, str]] = {
    "optimizer": {"num_replay_buffer_shards": "num_replay_shards", "max_weight_sync_delay": "max_weight_sync_delay"},
    "replay_buffer_config": {
        "capacity": "buffer_size",
        "learning_starts": "learning_starts",
        "min_size_for_sampling": "learning_starts",
        "prioritized_replay": "prioritized_replay",
        "prioritized_replay_alpha": "prioritized_replay_alpha",
        "prioritized_replay_beta": "prioritized_replay_beta",
        "prioritized_replay_eps": "prioritized_replay_eps",
        "store_buffer_in_checkpoints": "store_buffer_in_checkpoints",
        "worker_side_prioritization": "worker_side_prioritization",
    },
    # SAC's: its three learning rates, and the hidden layers of its policy and Q models.
    "optimization": {
        "actor_learning_rate": "actor_lr",
        "critic_learning_rate": "critic_lr",
        "entropy_learning_rate": "alpha_lr",
    },
    "policy_model_config": {"fcnet_hiddens": "actor_hiddens"},
    "q_model_config": {"fcnet_hiddens": "critic_hiddens"},
    "multiagent": {
        "policies": "policies",
        "policy_mapping_fn": "policy_mapping_fn",
        "policies_to_train": "policies_to_train",
    },
}

#: RLlib's R2D2 keys, read as flowrl's where the config declares flowrl's key (a config that replays
#: sequences: R2D2's), and as :data:`IGNORED_AT` or :data:`NESTED_IGNORED` say elsewhere. ``burn_in`` is
#: RLlib 1.x's top-level name; 2.x nested both in ``replay_buffer_config``, where its replay buffer reads
#: ``replay_zero_init_states`` and its tuned example writes ``zero_init_states``.
SEQUENCE_KEYS: dict[str, str] = {"burn_in": "replay_burn_in"}
RLLIB_BURN_IN_KEYS = ("burn_in", "replay_buffer_config.replay_burn_in")
SEQUENCE_NESTED: dict[str, str] = {
    "replay_sequence_length": "replay_sequence_length",
    "replay_burn_in": "replay_burn_in",
    "zero_init_states": "zero_init_states",
    "replay_zero_init_states": "zero_init_states",
}

#: RLlib's ``replay_buffer_config.storage_unit`` that a config replaying sequences reads as its own.
SEQUENCES_UNIT = "sequences"

#: RLlib's default ``model.max_seq_len``: its R2D2 replayed that many steps after the burn-in.
RLLIB_MAX_SEQ_LEN = 20

#: ``replay_buffer_config.type`` values and the ``prioritized_replay`` they mean.
REPLAY_BUFFER_TYPES: dict[str, bool] = {
    "ReplayBuffer": False,
    "MultiAgentReplayBuffer": False,
    "PrioritizedReplayBuffer": True,
    "MultiAgentPrioritizedReplayBuffer": True,
}

#: RLlib keys that change nothing flowrl computes, and why.
IGNORED: dict[str, str] = {
    # TensorFlow and RLlib's internals.
    "eager_tracing": "TensorFlow only",
    "eager_max_retraces": "TensorFlow only",
    "tf_session_args": "TensorFlow only",
    "local_tf_session_args": "TensorFlow only",
    "_tf_policy_handles_more_than_one_loss": "TensorFlow only",
    "simple_optimizer": "TensorFlow only",
    "enable_connectors": "RLlib's connector pipeline; flowrl's samplers filter observations themselves",
    "_disable_execution_plan_api": "flowrl always runs execution plans",
    "_disable_preprocessor_api": "RLlib's preprocessors",
    "_disable_action_flattening": "RLlib's action flattening",
    "_fake_gpus": "RLlib's GPU emulation for tests",
    "sample_collector": "RLlib's sample collector class",
    "preprocessor_pref": "RLlib's preprocessors (flowrl wraps Atari envs itself)",
    "normalize_actions": "flowrl's policies act within the action space's bounds",
    "no_done_at_end": (
        "Gymnasium's terminated/truncated flags replace it (RLlib 2.3 dropped it too): flowrl bootstraps at truncations"
    ),
    "create_env_on_driver": "flowrl makes envs where it needs them",
    "remote_worker_envs": "envs run in the rollout workers",
    "remote_env_batch_wait_ms": "envs run in the rollout workers",
    "extra_python_environs_for_driver": "process environment",
    "extra_python_environs_for_worker": "process environment",
    "ignore_worker_failures": "flowrl replaces or drops failed workers (recreate_failed_workers)",
    "ignore_env_runner_failures": "flowrl replaces or drops failed workers (recreate_failed_workers)",
    "enable_rl_module_and_learner": "RLlib's API stack switch; flowrl has one stack",
    "enable_env_runner_and_connector_v2": "RLlib's API stack switch; flowrl has one stack",
    "create_local_env_runner": "flowrl makes envs where it needs them",
    "create_env_on_local_worker": "flowrl makes envs where it needs them",
    "max_requests_in_flight_per_env_runner": "how many samples are requested at once",
    "delay_between_env_runner_restarts_s": "flowrl restarts a failed worker at once, within max_worker_restarts",
    "env_runner_health_probe_timeout_s": "flowrl's worker_unresponsive_timeout_s bounds a worker's silence",
    "evaluation_sample_timeout_s": "flowrl's sample_timeout_s bounds evaluation too",
    "metrics_episode_collection_timeout_s": "flowrl's timeouts bound metric collection",
    "collect_metrics_timeout": "flowrl's timeouts bound metric collection",
    # Logging, reporting and debugging.
    "log_level": "logging",
    "log_sys_usage": "logging",
    "logger_config": "logging",
    "monitor": "recording",
    "record_env": "recording (flowrl: evaluation_video)",
    "render_env": "rendering",
    "keep_per_episode_custom_metrics": "reporting",
    "always_attach_evaluation_results": "reporting",
    "evaluation_parallel_to_training": "scheduling of evaluation",
    "in_evaluation": "set by RLlib itself",
    "report_length": "reporting",
    "input_evaluation": "RLlib 1.x's off-policy estimates (flowrl: off_policy_estimation_methods)",
    "output_config": "writing experiences",
    "output_compress_columns": "writing experiences",
    "actions_in_input_normalized": "reading experiences",
    "replay_buffer_shards_colocated_with_driver": "placement of replay shards",
    "max_sample_requests_in_flight_per_worker": "how many samples are requested at once",
    "learner_queue_timeout": "flowrl's learner_timeout_s bounds the learner",
    "num_multi_gpu_tower_stacks": "GPU data loading",
    "minibatch_buffer_size": "GPU data loading",
    "_lr_vf": "only with _separate_vf_optimizer",
    "decay": "RMSProp's, only with opt_type: rmsprop",
    "momentum": "RMSProp's, only with opt_type: rmsprop",
    "epsilon": "RMSProp's, only with opt_type: rmsprop",
    "v_min": "only with num_atoms > 1",
    "v_max": "only with num_atoms > 1",
    "sigma0": "only with noisy: true",
    "input_config": "reading experiences",
    "shuffle_sequences": "flowrl shuffles minibatches",
    "lagrangian_thresh": "CQL's target gap for lagrangian, which flowrl does not implement",
}

# RLlib's "automatic" values are spelled None; a key set to one of these values computes what flowrl does.
_NONE = (None,)
_NONE_OR_FALSE = (None, False)


@dataclass(frozen=True)
class Conditional:
    """An RLlib key that changes nothing at ``values`` (why: ``why``) and would change the math otherwise (``what``)."""

    values: tuple[Any, ...]
    why: str
    what: str


#: RLlib keys that change nothing at some values and that flowrl does not implement at the others.
IGNORED_AT: dict[str, Conditional] = {
    "horizon": Conditional(
        _NONE, "no horizon", "cuts episodes after that many steps; wrap the env in gymnasium's TimeLimit"
    ),
    "soft_horizon": Conditional((False,), "off", "resets the horizon without ending episodes"),
    "clip_rewards": Conditional(_NONE_OR_FALSE, "off", "clips (or signs) every reward"),
    "env_task_fn": Conditional(_NONE, "none", "sets curriculum tasks"),
    "fake_sampler": Conditional((False,), "off", "replays one sample for ever"),
    "sample_async": Conditional((False,), "off", "samples in a background thread of each worker"),
    "synchronize_filters": Conditional(
        (True,), "flowrl always sends the merged filter back", "keeps each worker's own filter"
    ),
    "custom_eval_function": Conditional(_NONE, "none", "runs a custom evaluation"),
    "evaluation_duration_unit": Conditional(
        ("episodes",), "flowrl evaluates episodes", "evaluates for a number of timesteps"
    ),
    "postprocess_inputs": Conditional((False,), "off", "postprocesses offline data"),
    "lagrangian": Conditional(
        (False,), "off", "tunes CQL's penalty weight by dual gradient descent towards lagrangian_thresh"
    ),
    "use_critic": Conditional((True,), "flowrl's actor-critics use their critic", "drops the value baseline"),
    "vtrace": Conditional((True,), "IMPALA and APPO use V-trace", "uses plain advantages"),
    "vtrace_drop_last_ts": Conditional(
        (False,), "flowrl's V-trace uses every timestep", "drops each fragment's last step"
    ),
    "opt_type": Conditional(("adam",), "flowrl's optimizer is Adam", "picks another optimizer"),
    "_separate_vf_optimizer": Conditional((False,), "off", "adds a second optimizer for the value function"),
    "after_train_step": Conditional(_NONE, "none", "runs a custom step after training"),
    "before_learn_on_batch": Conditional(_NONE, "none", "runs a custom step before learning"),
    "num_atoms": Conditional((1,), "plain Q-values", "learns distributional Q-values"),
    "noisy": Conditional((False,), "off", "adds noisy layers"),
    "hiddens": Conditional(
        ([],),
        "flowrl's Q head is one linear layer",
        "adds hidden layers to the Q head; give them in model.fcnet_hiddens",
    ),
    "adam_epsilon": Conditional((1e-8,), "Adam's default", "changes Adam's epsilon"),
    "worker_side_prioritization": Conditional(
        (False,),
        "off",
        "computes priorities on the workers (flowrl's DQN, Ape-X, DDPG, TD3 and Ape-X DDPG read it as their own key)",
    ),
    "replay_sequence_length": Conditional((1,), "single steps", "replays sequences, as flowrl's r2d2 does"),
    "burn_in": Conditional((0,), "no burn-in", "warms each replayed sequence's state on its first steps"),
    "use_state_preprocessor": Conditional((False,), "off", "puts a model in front of DDPG's actor and critic"),
    "actor_hidden_activation": Conditional(("relu",), "flowrl's DDPG uses ReLU", "picks another activation"),
    "critic_hidden_activation": Conditional(("relu",), "flowrl's DDPG uses ReLU", "picks another activation"),
    "_deterministic_loss": Conditional((False,), "off", "trains SAC's actor on its mean action"),
    "_use_beta_distribution": Conditional((False,), "off", "uses a Beta distribution for SAC's actions"),
    "action_noise_std": Conditional((0, 0.0), "off", "adds noise to ES/ARS actions"),
    "return_proc_mode": Conditional(("centered_rank",), "flowrl's ES ranks returns", "processes returns otherwise"),
    "offset": Conditional((0,), "none", "offsets ARS rewards"),
}

#: RLlib's SAC model sub-keys besides ``fcnet_hiddens``, and the values at which they change nothing.
_SAC_MODEL_IGNORED: dict[str, str | Conditional] = {
    "fcnet_activation": Conditional(("relu",), "flowrl's SAC uses ReLU", "picks another activation"),
    "post_fcnet_hiddens": Conditional(([],), "none", "adds layers after the fcnet"),
    "post_fcnet_activation": "only with post_fcnet_hiddens",
    "custom_model": Conditional(_NONE, "none", "builds a custom model (flowrl's: model.custom_model)"),
    "custom_model_config": "only with custom_model",
}

#: RLlib sub-keys of ``NESTED`` dicts that change nothing here, and why (unconditionally, or at some values).
NESTED_IGNORED: dict[str, dict[str, str | Conditional]] = {
    "optimizer": {"debug": "debugging"},
    "replay_buffer_config": {
        "_enable_replay_buffer_api": "RLlib's internals",
        "no_local_replay_buffer": "RLlib's internals",
        "replay_buffer_shards_colocated_with_driver": "placement of replay shards",
        "storage_unit": Conditional(
            ("timesteps",), "flowrl stores timesteps", "stores sequences or episodes; flowrl's r2d2 stores sequences"
        ),
        "worker_side_prioritization": IGNORED_AT["worker_side_prioritization"],
        "replay_sequence_length": IGNORED_AT["replay_sequence_length"],
        "replay_burn_in": IGNORED_AT["burn_in"],
        "zero_init_states": "a replayed single step has no recurrent state to start",
        "replay_zero_init_states": "a replayed single step has no recurrent state to start",
        "replay_mode": Conditional(("independent",), "independent", "replays all policies in lockstep"),
    },
    "policy_model_config": _SAC_MODEL_IGNORED,
    "q_model_config": _SAC_MODEL_IGNORED,
    "multiagent": {
        "policy_map_capacity": "RLlib's policy cache",
        "policy_map_cache": "RLlib's policy cache",
        "count_steps_by": Conditional(("env_steps",), "flowrl counts env steps", "counts agent steps"),
        "observation_fn": Conditional(_NONE, "none", "rewrites the agents' observations"),
        "replay_mode": Conditional(("independent",), "independent", "replays all policies in lockstep"),
    },
}

#: RLlib ``model`` keys flowrl's models lack, and the values at which they change nothing.
MODEL_IGNORED: dict[str, str | Conditional] = {
    "post_fcnet_hiddens": Conditional(([],), "none", "adds layers after the fcnet"),
    "post_fcnet_activation": "only with post_fcnet_hiddens",
    "free_log_std": Conditional((False,), "off", "learns a state-independent log std"),
    "no_final_linear": Conditional((False,), "off", "uses the last hidden layer as the output"),
    "use_attention": Conditional((False,), "off", "wraps the model in attention layers"),
    "_time_major": "RLlib's tensor layout (flowrl lays sequences out itself)",
    "custom_action_dist": Conditional(_NONE, "none", "uses a custom action distribution"),
    "custom_preprocessor": Conditional(_NONE, "none", "uses a custom preprocessor"),
    "conv_filters": Conditional(_NONE, "flowrl's default filters", ""),  # a list is flowrl's own key
    "dim": "RLlib's Atari preprocessor (flowrl wraps Atari envs itself)",
    "grayscale": "RLlib's Atari preprocessor (flowrl wraps Atari envs itself)",
    "zero_mean": "RLlib's Atari preprocessor (flowrl wraps Atari envs itself)",
    "framestack": "RLlib's Atari preprocessor (flowrl wraps Atari envs itself)",
    "_use_default_native_models": "RLlib's internals",
    "_disable_preprocessor_api": "RLlib's internals",
    "_disable_action_flattening": "RLlib's internals",
}

#: RLlib 1.x's ``model`` key for feeding both the previous action and reward to the LSTM.
OLD_PREV_ACTION_REWARD = "lstm_use_prev_action_reward"

#: RLlib keys that change the math in ways flowrl does not implement, whatever their value.
NOT_IMPLEMENTED: dict[str, str] = {
    "exploration_fraction": "set 0.x's epsilon schedule; use exploration_config: {epsilon_timesteps, final_epsilon}",
    "exploration_final_eps": "set 0.x's epsilon schedule; use exploration_config: {epsilon_timesteps, final_epsilon}",
    "schedule_max_timesteps": "set 0.x's schedules; use exploration_config",
    "per_worker_exploration": "set 0.x's Ape-X exploration; use exploration_config: {type: PerWorkerEpsilonGreedy}",
}

#: The ``framework`` values: flowrl runs them all on PyTorch.
FRAMEWORKS = ("torch", "tf", "tf2", "tfe")

#: RLlib's partial ``exploration_config`` (no ``type``) is merged into its algorithm's default one.
EXPLORATION_KEY = "exploration_config"

#: The key that marks a config as RLlib's: every RLlib tuned example and most RLlib configs set
#: it, and flowrl's own configs have no such key. Such a config gets RLlib's defaults for the keys
#: it leaves out (the config class's ``rllib_defaults``). The tuned-example layout (``run:``) does
#: not count: flowrl's own experiment files use it too.
RLLIB_MARKER = "framework"

#: The ``model`` key of ``rllib_defaults``: RLlib merged a config's ``model`` into its model defaults
#: key by key, so these fill only the model keys a config leaves out.
MODEL_KEY = "model"


class RLlibConfigNote(UserWarning):
    """How flowrl read an RLlib key: renamed, nested, ignored or run on PyTorch (shown once per process)."""


@dataclass
class Translation:
    """An RLlib config read as flowrl's: the ``values``, a note per key mapped, the ``ignored`` keys
    (key -> why) and the ``problems`` (RLlib keys flowrl does not implement, contradictions)."""

    values: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    ignored: dict[str, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def messages(self) -> list[str]:
        """The notes, then one note listing the ignored keys."""
        if not self.ignored:
            return list(self.notes)
        listed = ", ".join(f"{key} ({why})" for key, why in self.ignored.items())
        return [*self.notes, f"RLlib keys ignored here, as they change nothing flowrl computes: {listed}"]


def translate_rllib_config(config_class: type, values: Mapping[str, Any], defaults: Mapping[str, Any]) -> Translation:
    """``values`` with RLlib's keys read as flowrl's, for ``config_class`` (whose keys and defaults are ``defaults``).

    Keys ``defaults`` has pass unchanged, except RLlib-only values of them (``framework`` aside:
    ``rollout_fragment_length: auto``, an ``exploration_config`` without ``type``,
    ``observation_filter: ConcurrentMeanStdFilter``, RLlib's ``model`` keys). Pure: it warns of nothing.
    """
    reader = _Reader(config_class, defaults)
    for key, value in values.items():
        reader.read(key, value)
    reader.finish()
    return reader.result


class _Reader:
    """One translation in progress (see :func:`translate_rllib_config`)."""

    def __init__(self, config_class: type, defaults: Mapping[str, Any]) -> None:
        self.config_class = config_class
        self.defaults = defaults
        self.result = Translation({})
        self.sources: dict[str, str] = {}  # flowrl key -> the RLlib key that set it
        self.is_rllib = False  # the config has RLLIB_MARKER: RLlib's defaults fill the keys it leaves out
        self.per_learner: dict[str, Any] = {}  # PER_LEARNER keys given, read in finish()
        # R2D2's config: RLlib's sequence keys are its own (SEQUENCE_KEYS); -1 or none asks for RLlib's length.
        self.replays_sequences = "replay_sequence_length" in defaults

    def read(self, key: Any, value: Any) -> None:
        if not isinstance(key, str):
            self.result.values[key] = value  # from_dict says keys must be str
        elif key in self.defaults:
            self._set_own(key, value)
        elif key == RLLIB_MARKER:
            self.is_rllib = True
            self._framework(value)
        elif key in RENAMED:
            self._map(key, RENAMED[key], _renamed_value(key, value))
        elif key in SEQUENCE_KEYS and self.replays_sequences:
            self._map(key, SEQUENCE_KEYS[key], value)
        elif key in PER_LEARNER:
            self.per_learner[key] = value  # finish(): the total needs num_learners, which may come later
        elif key in NESTED:
            self._nested(key, value)
        elif key == "evaluation_duration":
            self._map(key, "evaluation_num_episodes", value)
        elif key == "disable_env_checking" and isinstance(value, bool):
            self._map(
                key, "check_env", not value, f"RLlib key disable_env_checking={value} is check_env={not value} here"
            )
        elif key in IGNORED:
            self.result.ignored[key] = IGNORED[key]
        elif key in IGNORED_AT:
            self._conditional(key, value, IGNORED_AT[key])
        elif key in NOT_IMPLEMENTED:
            self._not_implemented(key, value, NOT_IMPLEMENTED[key])
        else:
            self.result.values[key] = value  # unknown to both: from_dict names the closest keys

    def _set_own(self, key: Any, value: Any) -> None:
        """A key the config declares, with RLlib's spellings of some values read as flowrl's."""
        if key == "observation_filter" and value == "ConcurrentMeanStdFilter":
            self._note(
                "RLlib's observation_filter='ConcurrentMeanStdFilter' is 'MeanStdFilter' here (it is thread-safe)"
            )
            value = "MeanStdFilter"
        elif key == EXPLORATION_KEY and isinstance(value, Mapping) and value and "type" not in value:
            value = self._exploration(dict(value))
        elif key == "model" and isinstance(value, Mapping):
            value = self._model(value)
        self._put(key, value, key)  # rollout_fragment_length 'auto' needs the batch size and worker counts: finish()

    def _framework(self, value: Any) -> None:
        if value == "torch":
            return
        if value in FRAMEWORKS:
            self._note(
                f"RLlib key framework={value!r} is ignored: flowrl trains PyTorch policies only, "
                "so this config runs on PyTorch"
            )
            return
        self.result.problems.append(
            f"RLlib key framework={value!r} must be one of {', '.join(map(repr, FRAMEWORKS))} "
            "(flowrl runs every one of them on PyTorch)"
        )

    def _map(self, rllib_key: str, key: str, value: Any, note: str | None = None) -> None:
        """Set flowrl's ``key`` from ``rllib_key``; a problem if the config lacks ``key`` or another key
        set it otherwise."""
        if key not in self.defaults:
            self.result.problems.append(
                f"RLlib key {rllib_key} is {key} in flowrl, which {self.config_class.__name__} has no key for"
            )
            return
        self._note(note or f"RLlib key {rllib_key} is {key} here")
        self._put(key, value, rllib_key)

    def _put(self, key: str, value: Any, source: str) -> None:
        """Set ``key`` (from ``source``, a key of the config given); a problem if another key set it otherwise."""
        values = self.result.values
        if key in values and not _same(values[key], value):
            self.result.problems.append(
                f"{self.sources[key]}={values[key]!r} and {source}={value!r} both set {key}; keep one"
            )
            return
        values[key] = value
        self.sources[key] = source

    def _nested(self, key: str, value: Any) -> None:
        if not isinstance(value, Mapping):
            self.result.problems.append(f"RLlib key {key}={value!r} must be a dict")
            return
        for sub, sub_value in value.items():
            name = f"{key}.{sub}"
            ignored = NESTED_IGNORED.get(key, {}).get(sub)
            own = NESTED[key].get(sub)
            # A key flowrl's config lacks is read as NESTED_IGNORED says, if it says (worker_side_prioritization).
            if own is not None and (own in self.defaults or ignored is None):
                self._map(name, own, sub_value)
            elif key == "replay_buffer_config" and self.replays_sequences and sub in SEQUENCE_NESTED:
                self._map(name, SEQUENCE_NESTED[sub], sub_value)
            elif key == "replay_buffer_config" and self.replays_sequences and sub == "storage_unit":
                self._storage_unit(sub_value)
            elif key == "replay_buffer_config" and sub == "type":
                self._replay_type(sub_value)
            elif isinstance(ignored, str):
                self.result.ignored[name] = ignored
            elif isinstance(ignored, Conditional):
                self._conditional(name, sub_value, ignored)
            elif name in NOT_IMPLEMENTED:
                self._not_implemented(name, sub_value, NOT_IMPLEMENTED[name])
            else:
                self.result.problems.append(
                    f"RLlib key {name} is not one flowrl reads; {key} may hold "
                    f"{', '.join(sorted([*NESTED[key], *NESTED_IGNORED.get(key, {})]))}"
                )

    def _storage_unit(self, value: Any) -> None:
        """A config that replays sequences (R2D2's) stores sequences: RLlib's ``storage_unit: sequences``, no other."""
        if value == SEQUENCES_UNIT:
            self.result.ignored["replay_buffer_config.storage_unit"] = "R2D2's replay stores sequences"
        else:
            self._not_implemented(
                "replay_buffer_config.storage_unit",
                value,
                f"stores {value} instead of sequences; R2D2's replay stores only '{SEQUENCES_UNIT}'",
            )

    def _replay_type(self, value: Any) -> None:
        if value not in REPLAY_BUFFER_TYPES:
            self._not_implemented(
                "replay_buffer_config.type",
                value,
                "picks another replay buffer; flowrl has uniform "
                "and prioritized replay (" + ", ".join(REPLAY_BUFFER_TYPES) + ")",
            )
            return
        prioritized = REPLAY_BUFFER_TYPES[value]
        self._map(
            "replay_buffer_config.type",
            "prioritized_replay",
            prioritized,
            f"RLlib key replay_buffer_config.type={value!r} is prioritized_replay={prioritized} here",
        )

    def _conditional(self, key: str, value: Any, rule: Conditional) -> None:
        if any(_same(value, ok) for ok in rule.values):
            self.result.ignored[key] = rule.why
        else:
            self._not_implemented(key, value, rule.what)

    def _not_implemented(self, key: str, value: Any, what: str) -> None:
        """``what``: what the key does in RLlib, as a verb phrase ("cuts episodes ...")."""
        self.result.problems.append(f"RLlib key {key}={value!r} is not implemented by flowrl (in RLlib it {what})")

    def _exploration(self, partial: dict[str, Any]) -> dict[str, Any]:
        """RLlib merged an ``exploration_config`` without ``type`` into its algorithm's default one."""
        base: Mapping[str, Any] = (
            getattr(self.config_class, "rllib_exploration", None) or self.defaults.get(EXPLORATION_KEY) or {}
        )
        if "type" not in base:
            return partial  # nothing to merge into: the config's own check says what is wrong
        merged = {**base, **partial}
        self._note(
            f"RLlib's exploration_config without a type is merged into the default {base['type']} exploration, "
            f"as RLlib did: {merged}"
        )
        return merged

    def _model(self, model: Mapping[str, Any]) -> dict[str, Any]:
        """RLlib's ``model`` with the keys flowrl's models lack read as :data:`MODEL_IGNORED` says."""
        own = dict(model)
        for sub, sub_value in model.items():
            if sub == OLD_PREV_ACTION_REWARD:
                del own[sub]
                if sub_value:  # RLlib 1.x's one key for both inputs
                    own.update(lstm_use_prev_action=True, lstm_use_prev_reward=True)
                    self._note(f"model.{sub}=True is model.lstm_use_prev_action and lstm_use_prev_reward in flowrl")
                continue
            rule = MODEL_IGNORED.get(sub)
            if rule is None or (sub == "conv_filters" and sub_value is not None):
                continue  # flowrl's own model key (or an unknown one, which the config's check names)
            del own[sub]
            if isinstance(rule, Conditional):
                self._conditional(f"model.{sub}", sub_value, rule)
            else:
                self.result.ignored[f"model.{sub}"] = rule
        return own

    def _rllib_defaults(self) -> None:
        """RLlib's defaults (the config class's ``rllib_defaults``) for the keys an RLlib config leaves out."""
        values = self.result.values
        applied: list[str] = []
        for key, default in (getattr(self.config_class, "rllib_defaults", None) or {}).items():
            if key == MODEL_KEY:
                applied += self._rllib_model_defaults(default)
            elif key not in values:
                values[key] = copy.deepcopy(default)
                self.sources[key] = "RLlib's default"
                applied.append(f"{_rllib_name(key)}={default!r}")
        if applied:
            self._note(
                f"RLlib config (it has a {RLLIB_MARKER} key): the keys it leaves out take RLlib's defaults "
                f"where flowrl's differ: {', '.join(applied)}"
            )

    def _rllib_model_defaults(self, defaults: Mapping[str, Any]) -> list[str]:
        """RLlib's ``model`` defaults for the model keys the config leaves out; returns what was applied
        (``model.key=value``)."""
        values = self.result.values
        given = values.get(MODEL_KEY, {})
        if not isinstance(given, Mapping) or given.get("custom_model") is not None:
            return []  # a bad model is the config check's to name; a custom model builds its own layers
        missing = {sub: copy.deepcopy(value) for sub, value in defaults.items() if sub not in given}
        if not missing:
            return []
        values[MODEL_KEY] = {**missing, **given}
        self.sources.setdefault(MODEL_KEY, "RLlib's default")
        return [f"{MODEL_KEY}.{sub}={value!r}" for sub, value in missing.items()]

    def finish(self) -> None:
        """What needs several keys: RLlib's defaults, ``rollout_fragment_length: auto``, RLlib's mapping functions."""
        self._per_learner()  # first: the batch size it sets is what 'auto' divides
        if self.is_rllib:
            self._rllib_defaults()  # before 'auto': it may be RLlib's default, and it needs the batch size
        values = self.result.values
        if values.get("rollout_fragment_length") == "auto":
            batch, workers, envs = (
                values.get(key, self.defaults.get(key))
                for key in ("train_batch_size", "num_workers", "num_envs_per_worker")
            )
            if isinstance(batch, int) and isinstance(workers, int) and isinstance(envs, int) and envs > 0:
                length = max(1, math.ceil(batch / ((workers or 1) * envs)))
                values["rollout_fragment_length"] = length
                self._note(
                    f"RLlib's rollout_fragment_length='auto' is rollout_fragment_length={length} here "
                    "(train_batch_size / (num_workers or 1) / num_envs_per_worker, rounded up)"
                )
        if self.replays_sequences:
            self._sequence_length()
        if "policies" in values and self.sources.get("policies") == "multiagent.policies":
            values["policies"] = _policies(values["policies"])
        mapping = values.get("policy_mapping_fn")
        if (
            self.sources.get("policy_mapping_fn") == "multiagent.policy_mapping_fn"
            and callable(mapping)
            and _takes_episode(mapping)
        ):
            values["policy_mapping_fn"] = RLlibPolicyMapping(mapping)

    def _sequence_length(self) -> None:
        """RLlib's R2D2 replayed sequences of ``model.max_seq_len + burn-in`` steps, which it computed itself
        (``replay_sequence_length: -1``): flowrl's ``replay_sequence_length`` counts the burn-in too. An RLlib
        config's start state: RLlib started them from zeros unless ``zero_init_states: false``."""
        values = self.result.values
        model = values.get(MODEL_KEY)
        model = model if isinstance(model, Mapping) else {}
        length = values.get("replay_sequence_length")
        # An RLlib config that sets neither the model's sequence length nor a burn-in replays flowrl's default.
        if length == -1 or (
            length is None and self.is_rllib and ("max_seq_len" in model or "replay_burn_in" in values)
        ):
            steps = model.get("max_seq_len", RLLIB_MAX_SEQ_LEN)
            burn_in = values.get("replay_burn_in", self.defaults.get("replay_burn_in", 0))
            if isinstance(steps, int) and isinstance(burn_in, int):  # else the config's check names the bad value
                values["replay_sequence_length"] = steps + burn_in
                self.sources["replay_sequence_length"] = "model.max_seq_len"
                self._note(
                    "RLlib's R2D2 replays sequences of model.max_seq_len + burn-in steps: replay_sequence_length="
                    f"{steps + burn_in} here (model.max_seq_len={steps} + replay_burn_in={burn_in})"
                )
        burn_in = values.get("replay_burn_in")
        if self.sources.get("replay_burn_in") in RLLIB_BURN_IN_KEYS and isinstance(burn_in, int) and burn_in > 0:
            self._note(
                "RLlib's R2D2 burned in on the steps before each replayed sequence (zeros where none were stored), "
                f"so it learned every step; flowrl's replay_burn_in={burn_in} is the first {burn_in} steps "
                "of each sequence: a sequence that starts its episode is learned whole, but the first "
                f"{burn_in} steps of a sampled fragment that continues an episode are not learned"
            )
        if self.is_rllib and "zero_init_states" not in values:
            self._note(
                "RLlib's R2D2 started replayed sequences from zeros unless zero_init_states=False; flowrl's "
                f"default zero_init_states={self.defaults.get('zero_init_states')!r} starts them from the stored "
                "state (set zero_init_states: true for RLlib's)"
            )

    def _per_learner(self) -> None:
        """The :data:`PER_LEARNER` keys given, as flowrl's totals over ``max(1, num_learners)`` learners."""
        learners = self.result.values.get("num_learners", self.defaults.get("num_learners", 0))
        factor = max(1, learners) if isinstance(learners, int) and not isinstance(learners, bool) else 1
        for rllib_key, value in self.per_learner.items():
            key = PER_LEARNER[rllib_key]
            total = value * factor if isinstance(value, int) and not isinstance(value, bool) else value
            self._map(
                rllib_key,
                key,
                total,
                f"RLlib key {rllib_key}={value!r} is {key}={total!r} here: RLlib's counts per learner, "
                f"flowrl's {key} is shared by all learners ({value!r} x max(1, num_learners={learners!r}))",
            )

    def _note(self, text: str) -> None:
        if text not in self.result.notes:
            self.result.notes.append(text)


def _rllib_name(key: str) -> str:
    """RLlib's spelling of a flowrl key: Python keywords lose the trailing underscore (``lambda_``: ``lambda``)."""
    return key[:-1] if key.endswith("_") and keyword.iskeyword(key[:-1]) else key


def _renamed_value(key: str, value: Any) -> Any:
    """RLlib spells "no minimum" None where flowrl's keys take 0."""
    if value is None and key.startswith("min_"):
        return 0
    return value


def _same(a: Any, b: Any) -> bool:
    """Equal values of the same kind (``False`` is not ``0``, and ``1`` is ``1.0``)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - arrays and other values without a plain ==
        return False


def _policies(policies: Any) -> Any:
    """RLlib's ``multiagent.policies`` as flowrl's ``policies``: ids (a list or set) or ``(cls, obs_space,
    act_space, config)`` tuples, with no class, become ``{id: None or {observation_space, action_space, config}}``."""
    if isinstance(policies, (list, tuple, set, frozenset)):
        return {pid: None for pid in policies}
    if not isinstance(policies, Mapping):
        return policies
    converted: dict[Any, Any] = {}
    for pid, spec in policies.items():
        if isinstance(spec, (list, tuple)) and len(spec) == 4 and spec[0] is None:
            entry = {
                name: part for name, part in zip(("observation_space", "action_space", "config"), spec[1:]) if part
            }
            converted[pid] = entry or None
        else:
            converted[pid] = spec
    return converted


def _takes_episode(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` needs more than the agent id (RLlib's ``(agent_id, episode, worker, **kwargs)``)."""
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    required = [
        p for p in parameters if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    return len(required) > 1


class RLlibPolicyMapping:
    """An RLlib ``policy_mapping_fn(agent_id, episode, worker, **kwargs)`` as flowrl's ``agent_id -> policy id``
    (called with ``episode=None, worker=None``)."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn

    def __call__(self, agent_id: Any) -> Any:
        return self.fn(agent_id, None, None)

    def __repr__(self) -> str:
        return f"RLlibPolicyMapping({self.fn!r})"


# Notes already shown in this process: each is shown once, however many configs are read.
_shown: set[str] = set()
_shown_lock = threading.Lock()


def read_rllib_keys(
    config_class: type, values: Mapping[str, Any], defaults: Mapping[str, Any]
) -> tuple[dict[str, Any], list[str]]:
    """:func:`translate_rllib_config`, with each note not shown yet in this process warned as a
    :class:`RLlibConfigNote`; returns the translated values and the problems."""
    translation = translate_rllib_config(config_class, values, defaults)
    for message in translation.messages():
        with _shown_lock:
            new = message not in _shown
            _shown.add(message)
        if new:
            warnings.warn(message, RLlibConfigNote, stacklevel=3)
    return translation.values, translation.problems
