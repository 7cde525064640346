"""Typed, documented, validated trainer configs.

A config is a keyword-only dataclass whose every field is declared with :func:`cfg_field`,
so each key carries its doc (meaning, units, default) and its valid range or choices.
:class:`TrainerConfig` holds the keys every algorithm shares, with RLlib's names; an
algorithm's config subclasses it, adds its own keys, changes inherited defaults in its
``defaults`` mapping (the key keeps its type, doc and bounds, declared once), and adds
cross-field checks in :meth:`TrainerConfig.check`::

    @dataclass(kw_only=True)
    class PPOConfig(TrainerConfig):
        defaults = {"train_batch_size": 4000, "lr": 3e-4}

        sgd_minibatch_size: int = cfg_field(128, "Minibatch size (steps) for each SGD step.", min=1)

        def check(self) -> list[str]:
            problems = super().check()
            if self.sgd_minibatch_size > self.train_batch_size:
                problems.append(
                    f"sgd_minibatch_size={self.sgd_minibatch_size} > train_batch_size={self.train_batch_size}"
                )
            return problems

:meth:`TrainerConfig.from_dict` reports every problem at once in one
:class:`~flowrl.errors.ConfigError`: unknown keys (with the closest valid names), wrong
types, values out of range, bad choices and the cross-field checks, for example::

    invalid config (3 problems):
      - unknown config key 'lrr'; did you mean 'lr'?
      - gamma=1.5 must be <= 1
      - sgd_minibatch_size=512 > train_batch_size=256

A key redeclared with ``cfg_field`` instead may change its doc, bounds or choices too.
Keys a loss or a policy reads are declared ``per_policy=True``: a multi-agent config may
override them for one policy (``policies[pid]["config"]``). Policies receive the whole
config object, frozen (:meth:`TrainerConfig.frozen`), and read typed attributes from it.

Types come from the annotations: ``int``, ``float``, ``bool``, ``str``, ``dict``, ``list``
(and their parametrised forms), ``Any``, ``Literal[...]`` (the choices) and unions of
these with ``None``. Ints are accepted (and converted) for float fields; bools are never
accepted as numbers; strings are never parsed (the CLI converts ``--set lr=1e-3``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Mapping, TypeVar

from flowrl.callbacks import callbacks_problems
from flowrl.config.checks import (
    exploration_problems,
    info_keys_problems,
    iteration_window_problems,
    model_problems,
    policies_problems,
    policy_mapping_fn_problems,
    schedule_field_problems,
    shared_key_problems,
)
from flowrl.config.data_keys import SAMPLER, estimator_problems, input_problems, off_policy_problems, pretrain_problems
from flowrl.config.fields import BaseConfig, cfg_field
from flowrl.errors import install_hint

__all__ = ["TrainerConfig"]

C = TypeVar("C", bound="TrainerConfig")


@dataclass(kw_only=True)
class TrainerConfig(BaseConfig):
    """The keys every algorithm shares (RLlib's names). Build with :meth:`from_dict`.

    Constructing one directly also validates it (``ConfigError`` on any problem), and so
    does :meth:`replace`. Fields may be assigned afterwards; call :meth:`validate` then.
    :meth:`frozen` gives a copy that refuses assignments (what policies and workers get).
    Subclasses defining ``__post_init__`` call ``super().__post_init__()`` last.
    """

    #: RLlib's defaults (execution-plan era) of the keys where flowrl's default differs and the
    #: difference changes what is learned: a config carrying RLlib's ``framework`` key takes them
    #: for the keys it leaves out (see :mod:`flowrl.config.rllib`). A ``model`` entry fills the
    #: model keys left out one by one, as RLlib merged a ``model`` into its model defaults. Each
    #: algorithm config declares its own whole mapping (they are not inherited key by key).
    rllib_defaults: ClassVar[Mapping[str, Any]] = {}
    #: Whether the algorithm's model applies ``observation_filter`` itself (ES and ARS keep the
    #: statistics in the model's buffers): the rollout workers then hand it raw observations.
    filters_observations_in_model: ClassVar[bool] = False
    #: Whether the algorithm's loss learns from sequences, so that it takes a recurrent model (``model.use_lstm``).
    learns_from_sequences: ClassVar[bool] = False

    @property
    def schedules_entropy(self) -> bool:
        """Whether the loss reads an entropy coefficient (``entropy_coeff``) that ``entropy_coeff_schedule`` sets."""
        return hasattr(self, "entropy_coeff")

    # Workers and sampling.
    num_workers: int = cfg_field(
        2, "Remote rollout-worker actors. 0: sample in the driver's local worker (the same plan, one process).", min=0
    )
    num_envs_per_worker: int = cfg_field(
        1,
        "Envs each worker steps together; a sample call returns rollout_fragment_length x num_envs_per_worker steps.",
        min=1,
    )
    rollout_fragment_length: int = cfg_field(
        200, "Steps per env per sample call (env steps; whole episodes may add more in complete_episodes mode).", min=1
    )
    batch_mode: Literal["truncate_episodes", "complete_episodes"] = cfg_field(
        "truncate_episodes",
        "'truncate_episodes': each fragment is exactly rollout_fragment_length steps per env, cutting episodes "
        "(values bootstrap at the cut). 'complete_episodes': only whole episodes, at least that many steps; "
        "unfinished ones carry over to the next call.",
    )
    train_batch_size: int = cfg_field(4000, "Steps (env transitions) per training batch.", min=1)
    # Learning.
    lr: float = cfg_field(
        5e-4, "Learning rate of the policy's optimizer (Adam).", min=0, min_exclusive=True, per_policy=True
    )
    lr_schedule: list[Any] | None = cfg_field(
        None,
        "Learning rate by env steps sampled: [[timestep, lr], ...], linear in between, flat outside (RLlib's "
        "format); it replaces lr. Rates of an algorithm's own keys (actor_lr, critic_lr, stepsize) are each scaled "
        "by schedule(t) / the schedule's largest value. A live lr (PBT) ends it. None: lr throughout.",
        validator=functools.partial(schedule_field_problems, "lr_schedule"),
        per_policy=True,
    )
    entropy_coeff_schedule: list[Any] | None = cfg_field(
        None,
        "Entropy coefficient by env steps sampled, [[timestep, coeff], ...] as lr_schedule; it replaces "
        "entropy_coeff (algorithms with an entropy bonus). A live entropy_coeff ends it. None: entropy_coeff.",
        validator=functools.partial(schedule_field_problems, "entropy_coeff_schedule"),
        per_policy=True,
    )
    gamma: float = cfg_field(0.99, "Discount factor per env step, in [0, 1].", min=0, max=1, per_policy=True)
    grad_clip: float | None = cfg_field(
        None,
        "Clip the global L2 norm of the gradients to this before each step. None: no clipping.",
        min=0,
        min_exclusive=True,
        per_policy=True,
    )
    model: dict[str, Any] = cfg_field(
        {},
        "Options overriding the model defaults (flowrl.policy.model_options: fcnet_hiddens, fcnet_activation, "
        "conv_filters, conv_activation, vf_share_layers). custom_model: a torch.nn.Module subclass or its "
        "'module:Class' path, built as Class(obs_space, action_space, num_outputs, **custom_model_config), used "
        "instead (its interface per algorithm: flowrl.policy.custom_model); custom_model_obs: 'flat' (default) or "
        "'structured' (Dict/Tuple observations as dicts/tuples of tensors). {}: every default.",
        validator=model_problems,
        per_policy=True,
    )
    explore: bool = cfg_field(True, "Explore while sampling (False: greedy / deterministic actions).", per_policy=True)
    exploration_config: dict[str, Any] = cfg_field(
        {},
        "Exploration: 'type' names one of flowrl.policy.exploration.EXPLORATIONS (default StochasticSampling); "
        "the other keys are its options (e.g. EpsilonGreedy's initial_epsilon).",
        validator=exploration_problems,
        per_policy=True,
    )
    # Multi-agent.
    policies: dict[str, Any] = cfg_field(
        {},
        "Multi-agent envs: policy id -> None or a dict with optional 'observation_space', 'action_space' (default: "
        "those of the agents mapped to it) and 'config' (this algorithm's keys, overridden for that policy). "
        "{}: one policy, default_policy, shared by every agent.",
        validator=policies_problems,
    )
    policy_mapping_fn: Any | None = cfg_field(
        None,
        "Multi-agent envs: agent_id -> policy id, called once per agent and episode; a callable or a "
        "'module:function' path. None: every agent acts with the only policy.",
        validator=policy_mapping_fn_problems,
    )
    policies_to_train: list[str] | None = cfg_field(
        None, "Ids of the policies to train; the others only act. None: all."
    )
    # Environment.
    env_config: dict[str, Any] = cfg_field({}, "Passed to the env creator (each env gets its own copy).")
    check_env: bool = cfg_field(True, "Check one env against the Gymnasium API before any worker actor starts.")
    clip_actions: bool = cfg_field(True, "Clip actions sent to env.step to a Box action space's bounds.")
    env_backend: Literal["gymnasium", "envpool"] = cfg_field(
        "gymnasium",
        "How a worker steps its num_envs_per_worker envs: 'gymnasium', one env object after another; 'envpool', "
        "all in one call in EnvPool's C++ threads (one per CPU of the worker), for the Gymnasium and Atari ids "
        f"EnvPool has ({install_hint('envpool')}; faults fail the whole worker).",
    )
    compress_observations: bool = cfg_field(
        False, "LZ4-compress the observation columns of sampled batches on the worker (for image observations)."
    )
    observation_filter: Literal["NoFilter", "MeanStdFilter"] = cfg_field(
        "NoFilter",
        "'MeanStdFilter': the policy sees observations normalized by the running mean and std of all observations "
        "sampled so far (each worker's new statistics are merged in the driver once per iteration and sent back; "
        "kept in checkpoints and applied by evaluation and load_policy). Single-agent Box observations only. "
        "'NoFilter': raw observations.",
    )
    # Resources and faults.
    seed: int | None = cfg_field(
        None,
        "Random seed; worker i seeds torch, numpy and its envs from seed + 10000*i. None: unseeded runs.",
        per_policy=True,
    )
    num_gpus: float = cfg_field(
        0.0,
        "GPUs for the learner policy in the driver (fractions share one); without CUDA it runs on CPU.",
        min=0,
        per_policy=True,
    )
    num_cpus_per_worker: float = cfg_field(
        1.0, "CPUs Ray reserves for each remote rollout worker (fractions allowed).", min=0
    )
    num_cpus_for_driver: float = cfg_field(
        0.0,
        "CPUs Ray reserves on the driver's node for the driver (local worker and learner), in the run's placement "
        "group, so that no other actor takes them. 0: none reserved (an embedded Ray counts this machine's CPUs); "
        "set it when runs share a cluster.",
        min=0,
    )
    learner_threads: int = cfg_field(
        1,
        "PyTorch threads for learning in the driver (process-wide). 1 suits small models and machines shared "
        "with rollout workers; raise it for large models on many cores.",
        min=1,
    )
    recreate_failed_workers: bool = cfg_field(
        True,
        "Replace a remote rollout worker that died, raised or hung, in place (plan and counters survive); "
        "False: drop it and go on with the rest.",
    )
    max_worker_restarts: int = cfg_field(
        1000,
        "Most rollout-worker restarts within restart_window_s seconds; one more failure raises a "
        "WorkerFailureError naming the worker. Replay shards and aggregators have the same cap, each kind its "
        "own count. While an actor's replacements fail to start, each next attempt is made 1, 2, 4 ... (at most "
        "30) seconds later while the run goes on (a replay shard's: at most 4 s later, waited for). A resumed run "
        "may raise it (flowrl train --resume RUN --set max_worker_restarts=N).",
        min=0,
    )
    restart_window_s: float = cfg_field(
        3600.0,
        "Seconds over which max_worker_restarts counts restarts (a sliding window, kept in checkpoints): a "
        "restart older than this no longer counts, so a long run that loses an actor now and then never runs out.",
        min=0,
        min_exclusive=True,
    )
    restart_failed_sub_environments: bool = cfg_field(
        False,
        "An env that raises in reset or step is recreated alone and its episode dropped (num_faulty_episodes); "
        "False: the error fails the whole worker, which is restarted.",
    )
    sample_timeout_s: float | None = cfg_field(
        600.0,
        "Seconds a remote worker may go without an env step while a sample is requested; past it the worker is "
        "killed and replaced and the iteration goes on with the others. A slow worker that keeps stepping is "
        "never killed (see slow_worker_factor). None: no limit (a hung env then stalls synchronous plans for ever).",
        min=0,
        min_exclusive=True,
    )
    worker_unresponsive_timeout_s: float = cfg_field(
        60.0,
        "Seconds a remote worker's control thread may go without answering (an env step holding the GIL) before "
        "the worker counts as hung; a worker process stopped on the driver's node (state T) counts at once.",
        min=0,
        min_exclusive=True,
    )
    slow_worker_factor: float = cfg_field(
        5.0,
        "A remote worker whose seconds per fragment exceed this many times its siblings' median is reported "
        "(num_slow_workers, and a warning with the seconds measured); it is not restarted.",
        min=1,
    )
    min_healthy_workers: int = cfg_field(
        1,
        "Fewest remote workers in service a run goes on with while lost ones wait for room to restart "
        "(capped at num_workers); below it, once a replacement has waited worker_startup_timeout_s, a "
        "WorkerFailureError ends the run.",
        min=0,
    )
    sample_min_fraction: float = cfg_field(
        1.0,
        "Synchronous sampling: a round ends once this fraction of the workers delivered; fragments that "
        "arrive later join the next round (num_late_fragments). 1.0: wait for every worker.",
        min=0,
        max=1,
        min_exclusive=True,
    )
    worker_startup_timeout_s: float = cfg_field(
        120.0,
        "Seconds the run's placement group may take to be reserved, and its remote workers to start (Ray must find "
        "their CPUs, GPUs and custom resources); past it a FlowRLError names what is missing. A replacement that "
        "finds no room within it is warned about, and the run goes on without it until it starts.",
        min=0,
        min_exclusive=True,
    )
    placement_strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = cfg_field(
        "PACK",
        "How the run's bundles (one per remote worker, replay shard or aggregator that asks for resources, and "
        "the driver's), reserved together as one Ray placement group, are laid out on the cluster's nodes: PACK "
        "(as few nodes as possible), SPREAD (as many as possible), STRICT_PACK (one node), "
        "STRICT_SPREAD (a node each).",
    )
    num_gpus_per_worker: float = cfg_field(0.0, "GPUs Ray reserves for each remote rollout worker.", min=0)
    num_learners: int = cfg_field(
        0,
        "Learner actors training replicas of the policies data-parallel (torch.distributed: gloo on CPU, NCCL on "
        "GPU): each batch is split among them and their gradients averaged, so every replica takes the same step. "
        "0 or 1: the learner is the driver.",
        min=0,
    )
    num_cpus_per_learner: float = cfg_field(1.0, "CPUs Ray reserves for each learner actor (num_learners >= 2).", min=0)
    num_gpus_per_learner: float = cfg_field(
        0.0,
        "GPUs Ray reserves for each learner actor (num_learners >= 2): 1 puts each on its own GPU, with NCCL.",
        min=0,
    )
    custom_resources_per_worker: dict[str, float] = cfg_field(
        {}, "Custom Ray resources (name -> amount) reserved for each remote rollout worker."
    )
    on_bad_observation: Literal["raise", "drop_episode"] = cfg_field(
        "raise",
        "What the sampler does with a non-finite, wrongly shaped or out-of-space observation or a non-finite "
        "reward: 'raise' names worker, env, step, field and value; 'drop_episode' drops that episode and "
        "counts it in num_bad_observations.",
    )
    max_consecutive_nonfinite_updates: int = cfg_field(
        10,
        "Updates in a row whose loss or gradients are not finite (each skipped, weights unchanged, counted in "
        "num_nonfinite_updates) before a FlowRLError ends the run.",
        min=1,
        per_policy=True,
    )
    learner_timeout_s: float = cfg_field(
        600.0,
        "Seconds a learner thread holding work may go without finishing a batch before it is reported as an error; "
        "also the longest wait on a learner group's actors (num_learners >= 2).",
        min=0,
        min_exclusive=True,
    )
    preemption_grace_s: float = cfg_field(
        25.0,
        "Seconds after SIGTERM or SIGHUP a run may spend saving: it first writes a small checkpoint of weights and "
        "counters (within moments), then, if this budget allows, the full state (replay buffers, envs), which "
        "replaces it; a full save still going when the budget runs out is abandoned. Keep it below the platform's "
        "grace period (Kubernetes 30 s; ray job stop 3 s). 0: the weights checkpoint only.",
        min=0,
    )
    # Reporting.
    metrics_smoothing_episodes: int = cfg_field(
        100, "Most recent episodes averaged into episode_reward_mean/min/max and episode_len_mean.", min=1
    )
    min_iter_time_s: float = cfg_field(
        0.0, "Minimum seconds per train() call; it runs plan steps until then. 0: none.", min=0
    )
    timesteps_per_iteration: int = cfg_field(
        0, "Minimum env steps sampled per train() call; it runs plan steps until then. 0: none.", min=0
    )
    profile: bool = cfg_field(
        True,
        "The plan X-ray (result['plan']): time every operator, the rollout workers' env steps and inference, "
        "the learner and the replay shards, and each fragment's latency. false: none of it is measured.",
    )
    trace_iterations: str | None = cfg_field(
        "2:2",
        "Training iterations whose spans a run records for `flowrl trace` (<run_dir>/trace/iteration_<n>.json): "
        "each operator's next() calls in the driver and each rollout worker's sample() calls. 'A:B': iterations A "
        "to B; 'N': iteration N; '' or None: none. Needs profile: true.",
        validator=iteration_window_problems,
    )
    # Callbacks and custom metrics.
    callbacks: Any | None = cfg_field(
        None,
        "A subclass of flowrl.callbacks.Callbacks, or its 'package.module:ClassName' path: its episode hooks and "
        "on_sample_end run in the rollout workers, on_train_result and on_checkpoint in the driver. Its "
        "episode.custom_metrics are reported as custom_metrics/<name>_mean|_min|_max. None: no callbacks.",
        validator=callbacks_problems,
    )
    custom_metrics_from_info: list[str] = cfg_field(
        [],
        "Env info keys reported as custom metrics (custom_metrics/<key>_mean|_min|_max over the same episodes as "
        "episode_reward_mean): each episode's value is the key's value in the info of its last step (an episode "
        "whose last info lacks the key gives none). Multi-agent envs: each agent's latest info, as '<agent>/<key>'.",
        validator=info_keys_problems,
    )
    # Offline data.
    input: Any = cfg_field(
        SAMPLER,
        "Where training experience comes from: 'sampler' (the rollout workers' envs), or experiences on disk "
        "(a directory written by output or flowrl record, a .parquet file, a glob, or a list of these), read as a "
        "stream, or a mix {source: fraction} such as {'sampler': 0.5, 'data/': 0.5}. Offline algorithms (bc, "
        "marwil, cql) need experiences; the rollout workers then only evaluate.",
        validator=input_problems,
    )
    input_reader: Literal["arrow", "ray_data"] = cfg_field(
        "arrow",
        "How input's files are read: 'arrow', by a thread of the driver with PyArrow, a row group at a time; "
        "'ray_data', as a Ray Dataset whose read tasks run on the cluster (for files on shared storage).",
    )
    shuffle_buffer_size: int = cfg_field(
        50_000,
        "Rows of offline input mixed together before training batches are drawn from them (0: file order).",
        min=0,
    )
    output: str | None = cfg_field(
        None,
        "A directory every rollout worker writes its sampled experiences to, as Parquet files (all columns, "
        "before postprocessing) with a metadata.json; None: nothing is written.",
    )
    output_max_file_size: int = cfg_field(
        64 * 2**20, "Bytes after which a worker closes its experience file and starts a new one.", min=1
    )
    output_compression: Literal["zstd", "snappy", "lz4", "gzip", "brotli", "none"] = cfg_field(
        "zstd", "Parquet compression of the experience files output writes."
    )
    pretrain: dict[str, Any] | None = cfg_field(
        None,
        "Offline pretraining before this run's own learning, in the same run: {algo: bc|marwil|cql, input: DIR, "
        "iterations: N, config: {...}} trains that algorithm N iterations on the experiences with this config's "
        "model, and hands its weights to this run's policies after each; then this algorithm's plan starts.",
        validator=pretrain_problems,
    )
    replay_prefill: str | None = cfg_field(
        None,
        "Recorded experiences (a directory, .parquet file or glob) added to the replay buffer before the first "
        "training iteration, as if sampled (algorithms with a local replay buffer: dqn, sac, ddpg, td3).",
    )
    off_policy_estimation_methods: list[str] = cfg_field(
        [],
        "Estimators of the policy's value on the input's recorded episodes, reported at each evaluation under "
        "evaluation/off_policy_estimation/<method>/: is, wis, dm, dr (see docs/offline.md).",
        validator=estimator_problems,
    )
    # Evaluation.
    evaluation_interval: int | None = cfg_field(
        None,
        "Evaluate every this many training iterations: iteration n's result then has result['evaluation'] "
        "(episode_reward_mean/min/max, episode_len_mean, episodes) when n is a multiple of it. None or 0: never.",
        min=0,
    )
    evaluation_num_episodes: int = cfg_field(
        10,
        "Episodes per evaluation (split among the evaluation workers); they never count as training episodes.",
        min=1,
    )
    evaluation_num_workers: int = cfg_field(
        0,
        "Evaluation actors of their own (each reserved num_cpus_per_worker CPUs in the run's placement group); "
        "for asynchronous algorithms they evaluate while the iteration trains. "
        "0: the driver evaluates after the iteration.",
        min=0,
    )
    evaluation_config: dict[str, Any] = cfg_field(
        {},
        "Config keys overriding this config for evaluation (e.g. env_config, explore, seed); evaluation acts "
        "deterministically (explore: False) unless it sets explore: True. Episode i of every evaluation resets "
        "with seed + i (unseeded without a seed).",
    )
    evaluation_video: bool = cfg_field(
        False,
        "Record the first episode of each evaluation as MP4 (a run writes <run_dir>/videos/iteration_<n>.mp4); "
        f"needs {install_hint('video')}.",
    )

    @property
    def reads_offline(self) -> bool:
        """Whether ``input`` names experiences on disk (alone or mixed with the sampler)."""
        return bool(self.input != SAMPLER)

    def check(self) -> list[str]:
        """Cross-field problems, one message each with the arithmetic (``"a=512 > b=256"``).

        Runs only on values that are each valid; algorithm configs extend it and call
        ``super().check()``. Conditions that flowrl works around (``num_gpus > 0`` without
        CUDA: the policy runs on CPU) are warnings, not problems.
        """
        return shared_key_problems(self) + off_policy_problems(self)

    def for_policy(self: C, policy_id: str) -> C:
        """The config policy ``policy_id`` is built with: this one with its
        ``policies[policy_id]["config"]`` overrides."""
        overrides = (self.policies.get(policy_id) or {}).get("config", {})
        return self.replace(**overrides) if overrides else self
