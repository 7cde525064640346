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

import copy
import keyword
import dataclasses
import difflib
import functools
import inspect
import numbers
import textwrap
import types
import typing
import warnings
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Literal, Mapping, Sequence, TypeVar, Union

from flowrl.callbacks import callbacks_problems
from flowrl.errors import ConfigError, FlowRLError, FrozenConfigError
from flowrl.importing import import_callable
from flowrl.config.rllib import read_rllib_keys

__all__ = ["ConfigError", "FrozenConfigError", "TrainerConfig", "cfg_field"]

C = TypeVar("C", bound="TrainerConfig")

_META_KEY = "flowrl"
# How many valid keys an unknown key's message lists when no valid key is close to it.
_KEYS_SHOWN = 5


@dataclass(frozen=True)
class _FieldMeta:
    doc: str
    min: float | None
    max: float | None
    min_exclusive: bool
    choices: tuple[Any, ...] | None
    validator: Callable[[Any], list[str]] | None
    per_policy: bool = False


def _dataclass_field(default: Any, meta: _FieldMeta) -> Any:
    metadata = {_META_KEY: meta}
    if isinstance(default, (dict, list)):
        return dataclasses.field(default_factory=functools.partial(copy.deepcopy, default), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def cfg_field(
    default: Any,
    doc: str,
    *,
    min: float | None = None,
    max: float | None = None,
    min_exclusive: bool = False,
    choices: Sequence[Any] | None = None,
    validator: Callable[[Any], list[str]] | None = None,
    per_policy: bool = False,
) -> Any:
    """A config dataclass field with its doc and its valid values.

    ``default``: the default value (dicts and lists are deep-copied for each config).
    ``doc``: what the key means, its units and default, shown by :meth:`TrainerConfig.describe`.
    ``min``/``max``: inclusive bounds for numbers (``min_exclusive=True``: the value must be
    strictly greater than ``min``). ``choices``: the allowed values. ``validator(value)``:
    more checks of a value that has the right type, returning problem messages.
    ``per_policy``: a policy reads it, so a multi-agent config may set it for one policy.
    """
    if not doc or not doc.strip():
        raise TypeError("cfg_field needs a non-empty doc")
    allowed = tuple(choices) if choices is not None else None
    return _dataclass_field(default, _FieldMeta(doc.strip(), min, max, min_exclusive, allowed, validator, per_policy))


# --- field specs: what each annotation and cfg_field allow ---------------------------------------

_KIND_NAMES = {int: "an int", float: "a float", bool: "a bool", str: "a str", dict: "a dict", list: "a list"}


@dataclass(frozen=True)
class _Spec:
    """One field's type, bounds and doc, resolved from its annotation and cfg_field metadata."""

    name: str
    kinds: tuple[Any, ...]  # int, float, bool, str, dict, list or Any
    literals: tuple[Any, ...]  # Literal[...] values, accepted as they are
    allows_none: bool
    meta: _FieldMeta
    default: Any

    @property
    def choices(self) -> tuple[Any, ...]:
        return self.literals + (self.meta.choices or ())


def _parse_annotation(cls_name: str, name: str, annotation: Any) -> tuple[tuple[Any, ...], tuple[Any, ...], bool]:
    if typing.get_origin(annotation) in (Union, types.UnionType):
        alternatives = typing.get_args(annotation)
    else:
        alternatives = (annotation,)
    kinds: list[Any] = []
    literals: list[Any] = []
    allows_none = False
    for alt in alternatives:
        origin = typing.get_origin(alt)
        if alt is type(None):
            allows_none = True
        elif origin is Literal:
            literals.extend(typing.get_args(alt))
        elif alt in _KIND_NAMES or alt is Any:
            kinds.append(alt)
        elif origin in (dict, list):
            kinds.append(origin)
        else:
            raise TypeError(f"{cls_name}.{name}: unsupported config annotation {annotation!r}")
    return tuple(kinds), tuple(literals), allows_none


def field_default(f: dataclasses.Field[Any]) -> Any:
    """A config field's default value (a fresh copy for dict and list defaults)."""
    # Not "is not dataclasses.MISSING": a config class that cloudpickle ships by value (one
    # defined in a script or notebook) arrives in a worker with a copy of that sentinel.
    return f.default_factory() if callable(f.default_factory) else f.default


# Resolved once per config class: annotations and metadata do not change after the class exists.
_SPECS: dict[type, tuple[_Spec, ...]] = {}


def _specs(cls: type) -> tuple[_Spec, ...]:
    if cls not in _SPECS:
        _SPECS[cls] = _resolve_specs(cls)
    return _SPECS[cls]


def _resolve_specs(cls: type) -> tuple[_Spec, ...]:
    hints = typing.get_type_hints(cls, include_extras=False)
    specs = []
    for f in dataclasses.fields(cls):
        meta = f.metadata.get(_META_KEY)
        if meta is None:
            raise TypeError(f"{cls.__name__}.{f.name} must be declared with cfg_field(default, doc)")
        kinds, literals, allows_none = _parse_annotation(cls.__name__, f.name, hints[f.name])
        default = field_default(f)
        spec = _Spec(f.name, kinds, literals, allows_none, meta, default)
        # A bad default is a bug in the config class, not the user's fault: fail at first use.
        default, found = _check_value(spec, default)
        if found:
            raise TypeError(f"{cls.__name__}.{f.name} has an invalid default: {'; '.join(found)}")
        specs.append(dataclasses.replace(spec, default=default))
    return tuple(specs)


def _coerce_kind(kind: Any, value: Any) -> tuple[bool, Any]:
    """Whether ``value`` is of ``kind``, and the value converted to the plain Python type."""
    if kind is Any:
        return True, value
    if kind is bool:
        return isinstance(value, bool), value
    if isinstance(value, bool):  # bool is an int subclass, but True is not a batch size
        return False, value
    if kind is int:
        return (True, int(value)) if isinstance(value, numbers.Integral) else (False, value)
    if kind is float:
        return (True, float(value)) if isinstance(value, numbers.Real) else (False, value)
    if kind is str:
        return isinstance(value, str), value
    if kind is dict:  # a plain dict stays the same object: validate() must not detach a caller's reference
        return (True, value if type(value) is dict else dict(value)) if isinstance(value, Mapping) else (False, value)
    if kind is list:
        return (True, value if type(value) is list else list(value)) if isinstance(value, (list, tuple)) else (False, value)
    raise AssertionError(kind)


def _fmt_number(x: float) -> str:
    return repr(int(x)) if isinstance(x, float) and x.is_integer() else repr(x)


def _one_of(values: Sequence[Any]) -> str:
    return "one of " + ", ".join(repr(v) for v in values)


def _expected(spec: _Spec) -> str:
    parts = [_KIND_NAMES.get(k, "any value") for k in spec.kinds]
    if spec.literals:
        parts.append(_one_of(spec.literals))
    if spec.allows_none:
        parts.append("None")
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " or " + parts[-1]


def _check_value(spec: _Spec, value: Any) -> tuple[Any, list[str]]:
    """``value`` converted for ``spec``'s field, and the problems with it (type, range, choices)."""
    shown = f"{spec.name}={value!r}"
    if value is None:
        return value, ([] if spec.allows_none else [f"{shown} must be {_expected(spec)}, got None"])
    if any(value == lit and type(value) is type(lit) for lit in spec.literals):
        return value, []
    for kind in spec.kinds:
        ok, converted = _coerce_kind(kind, value)
        if ok:
            break
    else:
        if not spec.kinds:  # only Literal choices (and maybe None): say which values are valid
            return value, [f"{shown} must be {_expected(spec)}"]
        return value, [f"{shown} must be {_expected(spec)}, got {type(value).__name__}"]
    meta = spec.meta
    if meta.choices is not None and converted not in meta.choices:
        return converted, [f"{shown} must be {_one_of(meta.choices)}"]
    if isinstance(converted, (int, float)) and not isinstance(converted, bool):
        # Written as "not (x >= bound)" so that NaN fails every bound.
        if meta.min is not None:
            if meta.min_exclusive and not converted > meta.min:
                return converted, [f"{shown} must be > {_fmt_number(meta.min)}"]
            if not meta.min_exclusive and not converted >= meta.min:
                return converted, [f"{shown} must be >= {_fmt_number(meta.min)}"]
        if meta.max is not None and not converted <= meta.max:
            return converted, [f"{shown} must be <= {_fmt_number(meta.max)}"]
    if meta.validator is not None:
        return converted, list(meta.validator(converted))
    return converted, []


def _suggestion(key: str, valid: Sequence[str]) -> str:
    """``"; did you mean 'x'?"`` naming the valid names closest to ``key`` (case-insensitive), or ``""``."""
    typed = str(key).lower()
    by_lower = {name.lower(): name for name in valid}
    close: list[str] = []
    if len(typed) >= 4:
        # A part of a long name ('num_envs' for 'num_envs_per_worker') scores low as a whole. Names
        # it begins ('num_workers' for 'num_worker') go before those it is inside ('evaluation_num_workers').
        containing = [name for lower, name in by_lower.items() if typed in lower]
        close = sorted([name for name in containing if name.lower().startswith(typed)] or containing, key=len)[:3]
    if not close:
        scored = sorted(
            ((difflib.SequenceMatcher(None, typed, lower).ratio(), name) for lower, name in by_lower.items()), reverse=True
        )
        # Only names about as close as the best one: a typo has one intended key, rarely three.
        close = [name for score, name in scored[:3] if score >= 0.6 and score >= scored[0][0] - 0.1]
    if not close:
        return ""
    names = [repr(name) for name in close]
    return "; did you mean " + (names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]) + "?"


def _jsonable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (types.FunctionType, type)):
        return f"{value.__module__}:{value.__qualname__}"  # importable again unless it is a lambda or local
    return value


# --- validators of dict-valued keys ------------------------------------------------------------


def _model_problems(model: dict[str, Any]) -> list[str]:
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


def _exploration_problems(exploration_config: dict[str, Any]) -> list[str]:
    """An unknown exploration ``type`` (with the closest names), or options it does not take."""
    if "type" not in exploration_config:
        return []
    from flowrl.policy.exploration import EXPLORATIONS

    name = exploration_config["type"]
    known = sorted(EXPLORATIONS)
    if not isinstance(name, str) or name not in EXPLORATIONS:
        hint = _suggestion(name, known) if isinstance(name, str) else ""
        return [f"exploration_config['type']={name!r} is not a known exploration{hint} (known: {', '.join(map(repr, known))})"]
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
                hint = _suggestion(str(key), _POLICY_SPEC_KEYS) or f"; valid keys are {', '.join(map(repr, _POLICY_SPEC_KEYS))}"
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
            import_callable(fn)
        except FlowRLError as e:
            return [f"policy_mapping_fn={fn!r}: {e}"]
        return []
    return [f"policy_mapping_fn={fn!r} must be a callable agent_id -> policy id, a 'module:function' path to one, or None"]


def _info_keys_problems(keys: list[Any]) -> list[str]:
    """Entries of ``custom_metrics_from_info`` that are not info keys (strings)."""
    return [
        f"custom_metrics_from_info[{i}]={key!r} must be an info key (a str)" for i, key in enumerate(keys) if not isinstance(key, str)
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
        raise ValueError(f"{text!r} is not 'A:B' (iterations A to B, e.g. '2:3'), 'N' (iteration N alone) or '' (none)") from None
    if window[0] < 1 or window[1] < window[0]:
        raise ValueError(f"{text!r}: iterations start at 1 and A:B needs 1 <= A <= B")
    return window


def _iteration_window_problems(text: str) -> list[str]:
    try:
        parse_iteration_window(text)
    except ValueError as e:
        return [f"trace_iterations={e}"]
    return []


def _redeclared(cls: type, name: str, default: Any) -> tuple[Any, Any]:
    """The annotation and field of the key ``name`` that ``cls`` inherits, with a new ``default``.

    Raises ``TypeError`` (at import, when ``cls`` is defined) if no base declares the key or
    the default is not a valid value of it.
    """
    # The nearest base declaring it, in method resolution order: the field @dataclass would inherit.
    for base in cls.__mro__[1:]:
        inherited = {f.name: f for f in dataclasses.fields(base)} if dataclasses.is_dataclass(base) else {}
        if name in inherited:
            break
    else:
        raise TypeError(f"{cls.__name__}.defaults names {name!r}, which no base config declares")
    meta = inherited[name].metadata[_META_KEY]
    annotation = typing.get_type_hints(base)[name]
    kinds, literals, allows_none = _parse_annotation(cls.__name__, name, annotation)
    _, problems = _check_value(_Spec(name, kinds, literals, allows_none, meta, default), default)
    if problems:
        raise TypeError(f"{cls.__name__}.defaults[{name!r}] is invalid: {'; '.join(problems)}")
    return annotation, _dataclass_field(default, meta)


# --- the shared config ----------------------------------------------------------------------------


@dataclass(kw_only=True)
class TrainerConfig:
    """The keys every algorithm shares (RLlib's names). Build with :meth:`from_dict`.

    Constructing one directly also validates it (``ConfigError`` on any problem), and so
    does :meth:`replace`. Fields may be assigned afterwards; call :meth:`validate` then.
    :meth:`frozen` gives a copy that refuses assignments (what policies and workers get).
    Subclasses defining ``__post_init__`` call ``super().__post_init__()`` last.
    """

    #: Inherited keys whose default a subclass changes: ``{key: new default}``. The key keeps
    #: its type, doc and bounds from the base class; the new default is checked like any value.
    defaults: ClassVar[Mapping[str, Any]] = {}
    #: RLlib's defaults (execution-plan era) of the keys where flowrl's default differs and the
    #: difference changes what is learned: a config carrying RLlib's ``framework`` key takes them
    #: for the keys it leaves out (see :mod:`flowrl.config.rllib`). A ``model`` entry fills the
    #: model keys left out one by one, as RLlib merged a ``model`` into its model defaults. Each
    #: algorithm config declares its own whole mapping (they are not inherited key by key).
    rllib_defaults: ClassVar[Mapping[str, Any]] = {}
    #: Whether the algorithm's model applies ``observation_filter`` itself (ES and ARS keep the
    #: statistics in the model's buffers): the rollout workers then hand it raw observations.
    filters_observations_in_model: ClassVar[bool] = False

    # Workers and sampling.
    num_workers: int = cfg_field(
        2, "Remote rollout-worker actors. 0: sample in the driver's local worker (the same plan, one process).", min=0
    )
    num_envs_per_worker: int = cfg_field(
        1, "Envs each worker steps together; a sample call returns rollout_fragment_length x num_envs_per_worker steps.", min=1
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
    lr: float = cfg_field(5e-4, "Learning rate of the policy's optimizer (Adam).", min=0, min_exclusive=True, per_policy=True)
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
        validator=_model_problems,
        per_policy=True,
    )
    explore: bool = cfg_field(True, "Explore while sampling (False: greedy / deterministic actions).", per_policy=True)
    exploration_config: dict[str, Any] = cfg_field(
        {},
        "Exploration: 'type' names one of flowrl.policy.exploration.EXPLORATIONS (default StochasticSampling); "
        "the other keys are its options (e.g. EpsilonGreedy's initial_epsilon).",
        validator=_exploration_problems,
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
    policies_to_train: list[str] | None = cfg_field(None, "Ids of the policies to train; the others only act. None: all.")
    # Environment.
    env_config: dict[str, Any] = cfg_field({}, "Passed to the env creator (each env gets its own copy).")
    check_env: bool = cfg_field(True, "Check one env against the Gymnasium API before any worker actor starts.")
    clip_actions: bool = cfg_field(True, "Clip actions sent to env.step to a Box action space's bounds.")
    env_backend: Literal["gymnasium", "envpool"] = cfg_field(
        "gymnasium",
        "How a worker steps its num_envs_per_worker envs: 'gymnasium', one env object after another; 'envpool', "
        "all in one call in EnvPool's C++ threads (one per CPU of the worker), for the Gymnasium and Atari ids "
        "EnvPool has (pip install 'flowrl-ray[envpool]'; faults fail the whole worker).",
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
        None, "Random seed; worker i seeds torch, numpy and its envs from seed + 10000*i. None: unseeded runs.", per_policy=True
    )
    num_gpus: float = cfg_field(
        0.0, "GPUs for the learner policy in the driver (fractions share one); without CUDA it runs on CPU.", min=0, per_policy=True
    )
    num_cpus_per_worker: float = cfg_field(1.0, "CPUs Ray reserves for each remote rollout worker (fractions allowed).", min=0)
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
        "Most rollout-worker restarts in a run; one more failure raises a FlowRLError naming the worker. "
        "While a worker's replacements fail to start, each next attempt waits 1, 2, 4 ... (at most 30) seconds.",
        min=0,
    )
    restart_failed_sub_environments: bool = cfg_field(
        False,
        "An env that raises in reset or step is recreated alone and its episode dropped (num_faulty_episodes); "
        "False: the error fails the whole worker, which is restarted.",
    )
    sample_timeout_s: float | None = cfg_field(
        600.0,
        "Seconds a remote worker may take to deliver a requested sample; past it the worker is probed, killed "
        "and replaced and the iteration goes on with the others. Keep it well above one fragment's sampling "
        "time. None: no limit (a hung env then stalls synchronous plans for ever).",
        min=0,
        min_exclusive=True,
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
        "their CPUs, GPUs and custom resources); past it a FlowRLError names what is missing.",
        min=0,
        min_exclusive=True,
    )
    placement_strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = cfg_field(
        "PACK",
        "How the run's bundles (one per remote worker, replay shard or aggregator that asks for resources, and "
        "the driver's), reserved together as one Ray placement group, are laid out on the cluster's nodes: PACK "
        "(as few nodes as possible), SPREAD (as many as possible), STRICT_PACK (one node), STRICT_SPREAD (a node each).",
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
        0.0, "GPUs Ray reserves for each learner actor (num_learners >= 2): 1 puts each on its own GPU, with NCCL.", min=0
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
    # Reporting.
    metrics_smoothing_episodes: int = cfg_field(
        100, "Most recent episodes averaged into episode_reward_mean/min/max and episode_len_mean.", min=1
    )
    min_iter_time_s: float = cfg_field(0.0, "Minimum seconds per train() call; it runs plan steps until then. 0: none.", min=0)
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
        validator=_iteration_window_problems,
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
        validator=_info_keys_problems,
    )
    # Evaluation.
    evaluation_interval: int | None = cfg_field(
        None,
        "Evaluate every this many training iterations: iteration n's result then has result['evaluation'] "
        "(episode_reward_mean/min/max, episode_len_mean, episodes) when n is a multiple of it. None or 0: never.",
        min=0,
    )
    evaluation_num_episodes: int = cfg_field(
        10, "Episodes per evaluation (split among the evaluation workers); they never count as training episodes.", min=1
    )
    evaluation_num_workers: int = cfg_field(
        0,
        "Evaluation actors of their own (each reserved num_cpus_per_worker CPUs in the run's placement group); "
        "for asynchronous algorithms they evaluate while the iteration trains. 0: the driver evaluates after the iteration.",
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
        "needs pip install 'flowrl-ray[video]'.",
    )

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # Runs before @dataclass processes the subclass: each ``defaults`` entry becomes a
        # redeclaration of the inherited field, with the base's annotation and metadata.
        annotations = cls.__dict__.get("__annotations__")
        if annotations is None:
            annotations = {}
            cls.__annotations__ = annotations
        for name, default in (cls.__dict__.get("defaults") or {}).items():
            if name in annotations:
                raise TypeError(f"{cls.__name__}.{name} is declared in the class body and in defaults; keep one")
            annotations[name], field = _redeclared(cls, name, default)
            setattr(cls, name, field)

    def __post_init__(self) -> None:
        self.validate()

    def __setattr__(self, name: str, value: Any) -> None:
        if self.__dict__.get("_frozen"):
            raise FrozenConfigError(
                f"{type(self).__name__} is frozen: it was handed to policies and workers; "
                f"build a new one with replace({name}=...)"
            )
        super().__setattr__(name, value)

    # --- building and checking ---

    @classmethod
    def from_dict(cls: type[C], values: Mapping[str, Any] | None) -> C:
        """A validated config from ``values`` (missing keys take their defaults).

        Raises :class:`ConfigError` listing every problem: unknown keys, wrong types,
        values out of range or not among the choices, and :meth:`check`'s cross-field
        problems (run once every value is valid on its own, since they compare values).
        """
        if values is None:
            values = {}
        if not isinstance(values, Mapping):
            raise ConfigError(f"config must be a mapping of key to value, got {type(values).__name__}")
        specs = {spec.name: spec for spec in _specs(cls)}
        # RLlib's key names that are Python keywords live in fields with a trailing underscore.
        values = {(f"{k}_" if isinstance(k, str) and keyword.iskeyword(k) and f"{k}_" in specs else k): v for k, v in values.items()}
        # RLlib's other names for keys, and its keys that change nothing here, become flowrl's (each noted once).
        values, problems = read_rllib_keys(cls, values, {name: spec.default for name, spec in specs.items()})
        for key in values:
            if key not in specs:
                problems.append(cls._unknown_key_problem(key))
        field_problems: list[str] = []
        kwargs: dict[str, Any] = {}
        for name, spec in specs.items():
            if name in values:
                # A copy of a dict or list value, so later changes to the caller's do not reach the config.
                kwargs[name], found = _check_value(spec, copy.copy(values[name]))
                field_problems += found
        problems += field_problems
        if field_problems:
            raise ConfigError(problems)
        try:
            config = cls(**kwargs)  # __post_init__ runs validate(), hence check()
        except ConfigError as e:
            raise ConfigError(problems + e.problems) from None
        if problems:
            raise ConfigError(problems)
        return config

    @classmethod
    def _unknown_key_problem(cls, key: Any) -> str:
        if not isinstance(key, str):
            return f"config keys must be str, got {key!r} ({type(key).__name__})"
        names = [spec.name for spec in _specs(cls)]
        hint = _suggestion(key, names)
        if not hint:
            shown = ", ".join(repr(n) for n in names[:_KEYS_SHOWN])
            hint = f"; valid keys include {shown}, ... ({cls.__name__}.describe() lists all {len(names)})"
        return f"unknown config key {key!r}{hint}"

    def check(self) -> list[str]:
        """Cross-field problems, one message each with the arithmetic (``"a=512 > b=256"``).

        Runs only on values that are each valid; algorithm configs extend it and call
        ``super().check()``. Conditions that flowrl works around (``num_gpus > 0`` without
        CUDA: the policy runs on CPU) are warnings, not problems.
        """
        problems = []
        known = list(self.policies) or ["default_policy"]
        for pid in self.policies_to_train or []:
            if pid not in known:
                problems.append(f"policies_to_train names {pid!r}, which is not a policy; the policies are {known}")
        problems += self._evaluation_problems()
        if self.env_backend == "envpool" and self.restart_failed_sub_environments:
            problems.append(
                "restart_failed_sub_environments=True recreates one failing env, but env_backend='envpool' runs a "
                "worker's envs in one pool that fails as a whole; a failing pool fails its worker, which "
                "recreate_failed_workers replaces: set restart_failed_sub_environments=False"
            )
        if self.num_learners >= 2 and self.num_gpus_per_learner % 1:
            problems.append(f"num_gpus_per_learner={self.num_gpus_per_learner:g}: each learner of a group needs whole GPUs "
                            "of its own (NCCL puts one rank on one device); use 0 (CPU, gloo), 1 or more")
        if self.num_gpus > 0:
            import torch

            if not torch.cuda.is_available():
                warnings.warn(f"num_gpus={self.num_gpus} but CUDA is not available; the policy will run on CPU", stacklevel=2)
        return problems

    def _evaluation_problems(self) -> list[str]:
        """``evaluation_config`` keys that are not keys of this config or have invalid values; a video without evaluation."""
        problems = []
        specs = {spec.name: spec for spec in _specs(type(self))}
        for key, value in self.evaluation_config.items():
            name = f"{key}_" if isinstance(key, str) and keyword.iskeyword(key) and f"{key}_" in specs else key
            if isinstance(name, str) and name.startswith("evaluation_"):
                problems.append(f"evaluation_config sets {key!r}: evaluation keys go at the top level of the config")
            elif name not in specs:
                problems.append(f"evaluation_config: {self._unknown_key_problem(key)}")
            else:
                problems += [f"evaluation_config: {problem}" for problem in _check_value(specs[name], value)[1]]
        if self.evaluation_video and not self.evaluation_interval:
            problems.append(f"evaluation_video=True records evaluation episodes, but evaluation_interval="
                            f"{self.evaluation_interval!r} turns evaluation off; set it to how often to evaluate")
        return problems

    def validate(self) -> None:
        """Check every field (type, range, choices) and :meth:`check`; raise one ``ConfigError`` with all problems.

        Values are normalised in place as :meth:`from_dict` does (ints in float fields become floats).
        """
        problems: list[str] = []
        for spec in _specs(type(self)):
            value, found = _check_value(spec, getattr(self, spec.name))
            if not found and not self.is_frozen:  # a frozen config was normalised before it froze
                setattr(self, spec.name, value)
            problems += found
        if not problems:
            problems = self.check()
        if problems:
            raise ConfigError(problems)

    def replace(self: C, **changes: Any) -> C:
        """A new validated config with ``changes`` applied (unknown keys get suggestions); frozen if this one is."""
        values = {spec.name: getattr(self, spec.name) for spec in _specs(type(self))}
        config = type(self).from_dict({**values, **changes})
        return config.frozen() if self.is_frozen else config

    def frozen(self: C) -> C:
        """A copy whose keys can no longer be assigned (``FrozenConfigError``); itself if already frozen."""
        if self.is_frozen:
            return self
        config = copy.deepcopy(self)
        config.__dict__["_frozen"] = True
        return config

    @property
    def is_frozen(self) -> bool:
        """Whether assignments to the keys raise."""
        return bool(self.__dict__.get("_frozen"))

    def for_policy(self: C, policy_id: str) -> C:
        """The config policy ``policy_id`` is built with: this one with its ``policies[policy_id]["config"]`` overrides."""
        overrides = (self.policies.get(policy_id) or {}).get("config", {})
        return self.replace(**overrides) if overrides else self

    @classmethod
    def per_policy_keys(cls) -> frozenset[str]:
        """Keys a policy reads, which a multi-agent config may override per policy (``policies[pid]["config"]``)."""
        return frozenset(spec.name for spec in _specs(cls) if spec.meta.per_policy)

    # --- views ---

    def to_dict(self, *, jsonable: bool = True) -> dict[str, Any]:
        """Every key and its value, as plain dicts and lists.

        With ``jsonable`` (for params.json and metadata), functions and classes become their
        ``"module:name"`` paths; without it values are kept as they are (for checkpoints,
        which pickle them, so a lambda ``policy_mapping_fn`` survives a restore).
        """
        if jsonable:
            return {spec.name: _jsonable(getattr(self, spec.name)) for spec in _specs(type(self))}
        return {spec.name: copy.deepcopy(getattr(self, spec.name)) for spec in _specs(type(self))}

    @classmethod
    def describe(cls, doc_width: int = 60) -> str:
        """A text table of every key: name, type, default, valid values and doc."""
        rows = [("key", "type", "default", "valid", "doc")]
        for spec in _specs(cls):
            rows.append((spec.name, _type_name(spec), repr(spec.default), _valid_values(spec), spec.meta.doc))
        widths = [max(len(row[i]) for row in rows) for i in range(4)]
        indent = sum(widths) + 2 * 4
        lines = []
        for row in rows:
            head = "  ".join(cell.ljust(width) for cell, width in zip(row[:4], widths))
            doc_lines = textwrap.wrap(row[4], doc_width) or [""]
            lines.append(f"{head}  {doc_lines[0]}".rstrip())
            lines += [" " * indent + more for more in doc_lines[1:]]
        return "\n".join(lines)


def _type_name(spec: _Spec) -> str:
    parts = [getattr(k, "__name__", "any") if k is not Any else "any" for k in spec.kinds]
    if spec.literals:
        parts.append(" | ".join(sorted({type(v).__name__ for v in spec.literals})))
    if spec.allows_none:
        parts.append("None")
    return " | ".join(parts)


def _valid_values(spec: _Spec) -> str:
    meta = spec.meta
    if spec.choices:
        return " | ".join(repr(c) for c in spec.choices)
    bounds = []
    if meta.min is not None:
        bounds.append(f"{'>' if meta.min_exclusive else '>='} {_fmt_number(meta.min)}")
    if meta.max is not None:
        bounds.append(f"<= {_fmt_number(meta.max)}")
    return ", ".join(bounds)
