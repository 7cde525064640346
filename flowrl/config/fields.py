"""The field machinery of typed configs: :func:`cfg_field`, each field's spec (type, bounds, doc) resolved
from its annotation, coercion and checks of values, key suggestions, and :class:`BaseConfig`, what every
config dataclass declared with ``cfg_field`` does (``from_dict``, ``validate``, ``replace``, ``frozen``,
``to_dict``, ``describe``, defaults redeclared in ``defaults``).

Types come from the annotations: ``int``, ``float``, ``bool``, ``str``, ``dict``, ``list``
(and their parametrised forms), ``Any``, ``Literal[...]`` (the choices) and unions of
these with ``None``. Ints are accepted (and converted) for float fields; bools are never
accepted as numbers; strings are never parsed (the CLI converts ``--set lr=1e-3``).
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import keyword
import numbers
import textwrap
import types
import typing
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Literal, Mapping, Sequence, TypeVar, Union

from flowrl.config.rllib import read_rllib_keys
from flowrl.errors import ConfigError, FrozenConfigError

C = TypeVar("C", bound="BaseConfig")

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
        return (
            (True, value if type(value) is list else list(value))
            if isinstance(value, (list, tuple))
            else (False, value)
        )
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
            ((difflib.SequenceMatcher(None, typed, lower).ratio(), name) for lower, name in by_lower.items()),
            reverse=True,
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


# --- what every config class does ----------------------------------------------------------------


class BaseConfig:
    """The generic behaviour of a keyword-only config dataclass whose fields are declared with
    :func:`cfg_field`: building and checking it, redeclaring inherited defaults, freezing it and
    viewing it. :class:`~flowrl.config.TrainerConfig` derives from it and adds the shared keys and
    their cross-field checks.
    """

    #: Inherited keys whose default a subclass changes: ``{key: new default}``. The key keeps
    #: its type, doc and bounds from the base class; the new default is checked like any value.
    defaults: ClassVar[Mapping[str, Any]] = {}

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
        values = {
            (f"{k}_" if isinstance(k, str) and keyword.iskeyword(k) and f"{k}_" in specs else k): v
            for k, v in values.items()
        }
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
        """Cross-field problems, one message each; none here (subclasses add theirs)."""
        return []

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
