"""Cross-key checks of :class:`~flowrl.config.TrainerConfig`'s dict- and callable-valued keys (``model``,
``exploration_config``, ``policies``, ``policy_mapping_fn``, ``custom_metrics_from_info``), its schedules
(``lr_schedule``, ``entropy_coeff_schedule``) and the iteration window of ``trace_iterations``
(:func:`parse_iteration_window`): each a ``cfg_field`` validator returning problem messages.
"""

from __future__ import annotations

import inspect
import keyword
import warnings
from typing import Any, Mapping

from flowrl.config.fields import _check_value, _specs, _suggestion
from flowrl.errors import FlowRLError
from flowrl.importing import import_callable
from flowrl.policy.schedules import schedule_problems

# --- validators of dict-valued keys ------------------------------------------------------------


def schedule_field_problems(name: str, points: Any) -> list[str]:
    """What is wrong with ``points`` as the value of schedule key ``name`` (``lr_schedule``,
    ``entropy_coeff_schedule``): its format, a negative value, and for ``lr_schedule`` no positive one."""
    problems = schedule_problems(name, points)
    if problems or points is None:
        return problems
    values = [float(v) for _, v in points]
    if min(values) < 0:
        problems.append(f"{name}={points!r}: values must be >= 0, got {min(values):g}")
    elif name == "lr_schedule" and max(values) == 0:
        problems.append(f"{name}={points!r}: every learning rate is 0; give at least one positive value")
    return problems


def model_problems(model: dict[str, Any]) -> list[str]:
    """Unknown keys (with the closest names) and bad values of a ``model`` dict."""
    if not model:
        return []
    from flowrl.policy.custom_model import custom_model_problems
    from flowrl.policy.model_options import DEFAULT_MODEL_CONFIG, model_config

    problems = []
    known = {}
    for key, value in model.items():
        if key in DEFAULT_MODEL_CONFIG:
            known[key] = value
            continue
        hint = _suggestion(str(key), list(DEFAULT_MODEL_CONFIG))
        if not hint:
            hint = f"; valid model keys are {', '.join(repr(k) for k in DEFAULT_MODEL_CONFIG)}"
        problems.append(f"unknown model key {key!r}{hint}")
    if known:
        try:
            model_config(known)
        except FlowRLError as e:  # e.g. an activation that does not exist
            problems.append(str(e))
        problems += custom_model_problems(known)
    return problems


def exploration_problems(exploration_config: dict[str, Any]) -> list[str]:
    """An unknown exploration ``type`` (with the closest names), or options it does not take."""
    if "type" not in exploration_config:
        return []
    from flowrl.policy.exploration import EXPLORATIONS

    name = exploration_config["type"]
    known = sorted(EXPLORATIONS)
    if not isinstance(name, str) or name not in EXPLORATIONS:
        hint = _suggestion(name, known) if isinstance(name, str) else ""
        return [
            f"exploration_config['type']={name!r} is not a known exploration{hint} "
            f"(known: {', '.join(map(repr, known))})"
        ]
    params = inspect.signature(EXPLORATIONS[name]).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return []
    # make_exploration passes the action space and the seed itself.
    accepted = [p for p in params if p not in ("action_space", "seed")]
    problems = []
    for option in exploration_config:
        if option != "type" and option not in accepted:
            hint = _suggestion(str(option), accepted) or (
                f"; it takes {', '.join(map(repr, accepted))}" if accepted else "; it takes no options"
            )
            problems.append(f"exploration_config option {option!r} is not an option of {name}{hint}")
    return problems


_POLICY_SPEC_KEYS = ("observation_space", "action_space", "config")


def policies_problems(policies: dict[str, Any]) -> list[str]:
    """Policy ids that are not strings and specs that are not dicts of the known keys."""
    problems = []
    for pid, spec in policies.items():
        if not isinstance(pid, str) or not pid:
            problems.append(f"policies: policy ids must be non-empty strings, got {pid!r}")
        if spec is None:
            continue
        if not isinstance(spec, Mapping):
            problems.append(f"policies[{pid!r}]={spec!r} must be a dict with keys among {_POLICY_SPEC_KEYS} (or None)")
            continue
        for key in spec:
            if key not in _POLICY_SPEC_KEYS:
                hint = (
                    _suggestion(str(key), _POLICY_SPEC_KEYS)
                    or f"; valid keys are {', '.join(map(repr, _POLICY_SPEC_KEYS))}"
                )
                problems.append(f"policies[{pid!r}] has the unknown key {key!r}{hint}")
        if "config" in spec and not isinstance(spec["config"], Mapping):
            problems.append(f"policies[{pid!r}]['config']={spec['config']!r} must be a dict of config overrides")
    return problems


def policy_mapping_fn_problems(fn: Any) -> list[str]:
    """A mapping that is neither callable nor the ``"module:function"`` path of one."""
    if callable(fn):
        return []
    if isinstance(fn, str):
        try:
            import_callable(fn, key="policy_mapping_fn")
        except FlowRLError as e:
            return [f"policy_mapping_fn={fn!r}: {e}"]
        return []
    return [
        f"policy_mapping_fn={fn!r} must be a callable agent_id -> policy id, a 'module:function' path to one, or None"
    ]


def info_keys_problems(keys: list[Any]) -> list[str]:
    """Entries of ``custom_metrics_from_info`` that are not info keys (strings)."""
    return [
        f"custom_metrics_from_info[{i}]={key!r} must be an info key (a str)"
        for i, key in enumerate(keys)
        if not isinstance(key, str)
    ]


def parse_iteration_window(text: str | None) -> tuple[int, int] | None:
    """``"A:B"`` (iterations A to B, both included), ``"N"`` (iteration N alone), or ``""``/None (none):
    ``(A, B)`` or None. Raises ``ValueError`` saying what is wrong with any other text."""
    if text is None or not text.strip():
        return None
    first, sep, last = text.partition(":")
    try:
        window = (int(first), int(last) if sep else int(first))
    except ValueError:
        raise ValueError(
            f"{text!r} is not 'A:B' (iterations A to B, e.g. '2:3'), 'N' (iteration N alone) or '' (none)"
        ) from None
    if window[0] < 1 or window[1] < window[0]:
        raise ValueError(f"{text!r}: iterations start at 1 and A:B needs 1 <= A <= B")
    return window


def iteration_window_problems(text: str) -> list[str]:
    try:
        parse_iteration_window(text)
    except ValueError as e:
        return [f"trace_iterations={e}"]
    return []


def recurrent_problems(config: Any) -> list[str]:
    """``model.use_lstm`` or a recurrent custom model where what is built cannot carry a recurrent state yet."""
    from flowrl.policy.custom_model import recurrent_custom_model

    if config.model.get("use_lstm"):
        what = "model.use_lstm=True"
    elif (custom := recurrent_custom_model(config.model)) is not None:
        what = f"model.custom_model={custom!r} is recurrent"
    else:
        return []
    unsupported = []
    if not config.learns_from_sequences:
        unsupported.append(
            f"{type(config).__name__} does not learn from sequences yet (PPO, PG, A2C, A3C, IMPALA and APPO do)"
        )
    return [f"{what}: {why}" for why in unsupported]


def evaluation_config_problems(config: Any) -> list[str]:
    """``evaluation_config`` keys that are not keys of this config or have invalid values; a video
    without evaluation."""
    problems = []
    specs = {spec.name: spec for spec in _specs(type(config))}
    for key, value in config.evaluation_config.items():
        name = f"{key}_" if isinstance(key, str) and keyword.iskeyword(key) and f"{key}_" in specs else key
        if isinstance(name, str) and name.startswith("evaluation_"):
            problems.append(f"evaluation_config sets {key!r}: evaluation keys go at the top level of the config")
        elif name not in specs:
            problems.append(f"evaluation_config: {config._unknown_key_problem(key)}")
        else:
            problems += [f"evaluation_config: {problem}" for problem in _check_value(specs[name], value)[1]]
    if config.evaluation_video and not config.evaluation_interval:
        problems.append(
            f"evaluation_video=True records evaluation episodes, but evaluation_interval="
            f"{config.evaluation_interval!r} turns evaluation off; set it to how often to evaluate"
        )
    return problems


def shared_key_problems(config: Any) -> list[str]:
    """The cross-key problems of the keys every algorithm shares (:meth:`TrainerConfig.check`); warns of
    what flowrl works around (``num_gpus > 0`` without CUDA: the policy runs on CPU)."""
    problems = []
    known = list(config.policies) or ["default_policy"]
    for pid in config.policies_to_train or []:
        if pid not in known:
            problems.append(f"policies_to_train names {pid!r}, which is not a policy; the policies are {known}")
    problems += evaluation_config_problems(config)
    if config.entropy_coeff_schedule is not None and not config.schedules_entropy:
        problems.append(
            f"entropy_coeff_schedule is set, but {type(config).__name__}'s loss has no entropy bonus (no "
            "entropy_coeff); the algorithms with one are a2c, a3c, ppo, impala, appo and sac (its alpha): "
            "drop the key"
        )
    problems += recurrent_problems(config)
    if config.env_backend == "envpool" and config.restart_failed_sub_environments:
        problems.append(
            "restart_failed_sub_environments=True recreates one failing env, but env_backend='envpool' runs a "
            "worker's envs in one pool that fails as a whole; a failing pool fails its worker, which "
            "recreate_failed_workers replaces: set restart_failed_sub_environments=False"
        )
    if config.num_learners >= 2 and config.num_gpus_per_learner % 1:
        problems.append(
            f"num_gpus_per_learner={config.num_gpus_per_learner:g}: each learner of a group needs whole GPUs "
            "of its own (NCCL puts one rank on one device); use 0 (CPU, gloo), 1 or more"
        )
    if config.num_gpus > 0:
        import torch

        if not torch.cuda.is_available():
            warnings.warn(
                f"num_gpus={config.num_gpus} but CUDA is not available; the policy will run on CPU", stacklevel=3
            )
    return problems
