"""Building a Trainer's parts from an algorithm and a config: the validated config, the bundles the plan's
actors ask Ray for, the rollout workers and their policy specs (multi-agent spaces included), the plan;
and the Ray-free evaluation of a checkpoint, whose policies are built the same way."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping

import gymnasium as gym

from flowrl._version import __version__
from flowrl.actors import PlanResources, WorkerSet
from flowrl.actors.evaluation import evaluation_request
from flowrl.actors.placement import BundleRequest, learner_request
from flowrl.algorithms import Algorithm, get_algorithm, list_algorithms
from flowrl.config import TrainerConfig
from flowrl.data import DEFAULT_POLICY_ID
from flowrl.data.offline import write_metadata
from flowrl.envs import get_env_creator, is_multi_agent_env
from flowrl.envs.context import EnvContext
from flowrl.envs.registry import EnvCreator, close_env, create_env
from flowrl.envs.spaces import space_to_json
from flowrl.errors import CheckpointError, ConfigError, FlowRLError
from flowrl.plan.graph import Plan
from flowrl.policy import PolicySpec
from flowrl.policy.filters import MeanStdFilter
from flowrl.policy.mapping import policy_mapping
from flowrl.serve.evaluate import evaluate_policies
from flowrl.storage.checkpoints import read_checkpoint

EnvSpec = str | Callable[[dict[str, Any]], gym.Env]


def validated_config(algorithm: Algorithm, config: Mapping[str, Any] | TrainerConfig | None) -> TrainerConfig:
    """``config`` as ``algorithm``'s frozen config (every problem in one :class:`~flowrl.errors.ConfigError`)."""
    if isinstance(config, TrainerConfig):
        config = config.to_dict(jsonable=False)
    settings = algorithm.config_class.from_dict(config).frozen()
    if settings.num_learners >= 2 and not algorithm.learner_group:
        able = [name for name in list_algorithms() if get_algorithm(name).learner_group]
        raise ConfigError(
            [
                f"num_learners={settings.num_learners}: {algorithm.name!r} does not train in a learner group "
                f"(its plan learns in the driver or on the rollout workers); algorithms that do: {', '.join(able)}"
            ]
        )
    mixes = isinstance(settings.input, dict) and "sampler" in settings.input
    if settings.reads_offline and not algorithm.offline and not (mixes and algorithm.mixed_input):
        able = [name for name in list_algorithms() if get_algorithm(name).offline]
        mixing = [name for name in list_algorithms() if get_algorithm(name).mixed_input]
        raise ConfigError(
            [
                f"input={settings.input!r}: {algorithm.name!r} learns from the envs it samples, not from recorded "
                f"experiences; algorithms that learn from them: {', '.join(able)}; that mix them with sampling "
                f"({{'sampler': 0.5, DIR: 0.5}}): {', '.join(mixing)} (or leave input as 'sampler')"
            ]
        )
    if settings.pretrain is not None and algorithm.offline:
        raise ConfigError(
            [f"pretrain: {algorithm.name!r} learns from recorded experiences already; pretrain online algorithms"]
        )
    return settings


def write_output_metadata(
    algorithm: Algorithm,
    env: EnvSpec,
    config: TrainerConfig,
    policy_specs: Mapping[str, PolicySpec],
    *,
    multi_agent: bool,
    extra: Mapping[str, Any] | None = None,
) -> None:
    """``output``'s ``metadata.json``: the run's algorithm, env, policies and their spaces, whether the env is
    ``multi_agent`` (its rows carry policy and agent ids, even with one policy), flowrl's version (and the
    ``extra`` entries, such as where recorded episodes came from)."""
    assert config.output is not None
    policies = {}
    for pid, spec in policy_specs.items():
        try:
            spaces = {
                "observation_space": space_to_json(spec.observation_space, "observation_space"),
                "action_space": space_to_json(spec.action_space, "action_space"),
            }
        except CheckpointError:
            spaces = {}  # a space JSON cannot describe: the files' shapes still say what the rows hold
        policies[pid] = spaces
    write_metadata(
        config.output,
        {
            "algorithm": algorithm.name,
            "env": env if isinstance(env, str) else getattr(env, "__name__", repr(env)),
            "gamma": config.gamma,
            "policies": policies,
            "multi_agent": multi_agent,
            "flowrl_version": __version__,
            **(extra or {}),
        },
    )


def plan_bundles(algorithm: Algorithm, config: TrainerConfig) -> list[BundleRequest]:
    """What the plan's actors besides the rollout workers ask Ray for: the algorithm's (replay shards,
    aggregators), the learner group's and the evaluation workers'."""
    return [*algorithm.bundles(config), learner_request(config), evaluation_request(config)]


def make_workers(
    algorithm: Algorithm, config: TrainerConfig, env_creator: EnvCreator, bundles: list[BundleRequest]
) -> WorkerSet:
    """The run's rollout workers: a local one and ``config.num_workers`` remote ones, reserved with ``bundles``."""
    return WorkerSet(
        env_creator=env_creator,
        policy_specs=policy_specs(algorithm, config, env_creator),
        config=config,
        num_workers=config.num_workers,
        num_cpus_per_worker=config.num_cpus_per_worker,
        recreate_failed_workers=config.recreate_failed_workers,
        check_env=config.check_env,
        bundles=bundles,
    )


def build_plan(algorithm: Algorithm, workers: WorkerSet, config: TrainerConfig, resources: PlanResources) -> Plan:
    """``algorithm``'s execution plan over ``workers`` and ``resources``, with its graph recorded."""
    return Plan(algorithm.execution_plan(workers, config, resources), name=algorithm.name)


def policy_specs(
    algorithm: Algorithm, config: TrainerConfig, env_creator: Callable[[dict[str, Any]], Any]
) -> dict[str, PolicySpec]:
    """The policies to build for ``env_creator``'s env: ``default_policy`` for a Gymnasium env; for
    a multi-agent env, ``config.policies`` with spaces from the agents mapped to each.

    Problems a user can cause (a mapping to an unknown policy, agents of one policy with
    different spaces, ``policies`` on a single-agent env) raise one :class:`~flowrl.errors.ConfigError`.
    """
    probe: Any = create_env(env_creator, EnvContext(config.env_config, num_workers=config.num_workers))
    try:
        if not is_multi_agent_env(probe):
            if config.policies:
                raise ConfigError(
                    [
                        f"policies={sorted(config.policies)} needs a multi-agent env, but {type(probe).__name__} "
                        "is a single-agent Gymnasium env"
                    ]
                )
            return {DEFAULT_POLICY_ID: algorithm.make_policy(probe.observation_space, probe.action_space, config)}
        if not algorithm.multi_agent:
            able = [name for name in list_algorithms() if get_algorithm(name).multi_agent]
            raise ConfigError(
                [
                    f"algorithm {algorithm.name!r} trains single-agent envs, "
                    f"but {type(probe).__name__} is multi-agent; "
                    f"algorithms for multi-agent envs: {', '.join(able)}"
                ]
            )
        spaces = multi_agent_policy_spaces(probe, config)
    finally:
        close_env(probe)
    if algorithm.make_policies is not None:
        return algorithm.make_policies(spaces, config)
    policy_keys = config.per_policy_keys()
    problems = [
        f"policies[{pid!r}]['config'] sets {key!r}, which is not a policy key; "
        f"per-policy keys are {sorted(policy_keys)}"
        for pid, spec in config.policies.items()
        for key in (spec or {}).get("config", {})
        if key not in policy_keys
    ]
    if problems:
        raise ConfigError(problems)
    specs = {}
    for pid, (observation_space, action_space) in spaces.items():
        specs[pid] = algorithm.make_policy(observation_space, action_space, config.for_policy(pid))
    return specs


def multi_agent_policy_spaces(env: Any, config: TrainerConfig) -> dict[str, tuple[gym.Space, gym.Space]]:
    """Each policy's (observation space, action space): given in ``config.policies``, else those of
    the agents ``config.policy_mapping_fn`` maps to it, which must all agree."""
    policy_ids = list(config.policies) or [DEFAULT_POLICY_ID]
    problems: list[str] = []
    try:
        mapping = policy_mapping(config.policy_mapping_fn, policy_ids)
    except FlowRLError as e:
        raise ConfigError([str(e)]) from None
    found: dict[str, tuple[gym.Space, gym.Space, Any]] = {}
    for pid in policy_ids:
        given = config.policies.get(pid) or {}
        if "observation_space" in given and "action_space" in given:
            found[pid] = (given["observation_space"], given["action_space"], "its policies entry")
    for agent in env.possible_agents:
        pid = mapping(agent)
        if pid not in policy_ids:
            problems.append(
                f"policy_mapping_fn({agent!r}) returned {pid!r}, which is not a policy; the policies are {policy_ids}"
            )
            continue
        agent_spaces = (env.observation_space(agent), env.action_space(agent))
        if pid not in found:
            found[pid] = (*agent_spaces, f"agent {agent!r}")
            continue
        for kind, mine, theirs in (
            ("observation", agent_spaces[0], found[pid][0]),
            ("action", agent_spaces[1], found[pid][1]),
        ):
            if mine != theirs:
                problems.append(
                    f"the {kind} space of agent {agent!r}, {mine}, does not match that of policy {pid!r}, "
                    f"{theirs} (from {found[pid][2]})"
                )
    mapping_failed = bool(problems)
    for pid in policy_ids:
        if pid not in found and not mapping_failed:  # after a bad mapping this would only add noise
            problems.append(
                f"no agent maps to policy {pid!r}: give its 'observation_space' and 'action_space' in policies[{pid!r}]"
            )
    if problems:
        raise ConfigError(problems)
    return {pid: (found[pid][0], found[pid][1]) for pid in policy_ids}


def evaluate_checkpoint(
    checkpoint_path: str | Path, num_episodes: int = 10, seed: int | None = None, *, video_dir: str | Path | None = None
) -> dict[str, Any]:
    """Evaluate a Trainer checkpoint's policy without Ray or rollout workers (deterministic actions).

    Returns the episode statistics plus the checkpoint's ``algo``, ``env`` and ``iteration``.
    With ``video_dir``, each episode is recorded there as an MP4 file (it needs the ``video`` extra).
    """
    state, _ = read_checkpoint(checkpoint_path)
    for key in ("algo", "env", "config", "worker"):
        if key not in state:
            raise CheckpointError(
                f"checkpoint {str(checkpoint_path)!r} has no {key!r}: not a flowrl Trainer checkpoint"
            )
    algorithm = get_algorithm(state["algo"])
    config = algorithm.config_class.from_dict(state["config"])
    policy_map = {}
    for pid, spec in policy_specs(algorithm, config, get_env_creator(state["env"])).items():
        policy_map[pid] = spec.build()
        policy_map[pid].set_state(state["worker"]["policies"][pid])
    obs_filter = None
    if state["worker"].get("obs_filter") is not None:  # the run filtered observations: so does its evaluation
        obs_filter = MeanStdFilter()
        obs_filter.set_state(state["worker"]["obs_filter"])
    stats = evaluate_policies(
        policy_map, state["env"], config, num_episodes, seed, video_dir=video_dir, obs_filter=obs_filter
    )
    return {**stats, "algo": state["algo"], "env": state["env"], "iteration": state["iteration"]}
