"""The values of ``input``, the key that says where training experience comes from: the sampler, or
experiences on disk (checked for their shape here; the files when a run opens them); and
``off_policy_estimation_methods``, the estimators run on them."""

from __future__ import annotations

from typing import Any

from flowrl.policy.off_policy_estimation import METHODS

#: The ``input`` value that samples the envs (the default).
SAMPLER = "sampler"
MINARI_PREFIX = "minari:"


def input_problems(value: Any) -> list[str]:
    """What is wrong with an ``input`` value's shape (the files themselves are checked when the run starts)."""
    valid = (
        "'sampler', a directory, a .parquet file, a glob, a list of these, or {source: fraction} "
        "(e.g. {'sampler': 0.5, 'data/': 0.5})"
    )
    if isinstance(value, str):
        return [] if value.strip() else [f"input={value!r} is empty: use {valid}"]
    if isinstance(value, list):
        bad = [item for item in value if not isinstance(item, str) or item == SAMPLER or not item.strip()]
        if not value or bad:
            return [f"input={value!r}: a list names files, directories or globs of experiences; use {valid}"]
        return []
    if isinstance(value, dict):
        problems = []
        for source, fraction in value.items():
            if not isinstance(source, str) or not source.strip():
                problems.append(f"input: the source {source!r} must be 'sampler' or a path or glob of experiences")
            if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or fraction <= 0:
                problems.append(f"input[{source!r}]={fraction!r} must be a fraction > 0 of the batches")
        if not value:
            problems.append(f"input={{}} names no source; use {valid}")
        elif not problems and abs(sum(value.values()) - 1.0) > 1e-6:
            problems.append(f"input: the fractions {list(value.values())} sum to {sum(value.values()):g}, not 1")
        return problems
    return [f"input={value!r} ({type(value).__name__}): use {valid}"]


#: The algorithms a ``pretrain`` phase can run, and the keys its dict takes.
PRETRAIN_ALGORITHMS = ("bc", "marwil", "cql")
PRETRAIN_KEYS = ("algo", "input", "iterations", "config")


def pretrain_problems(value: Any) -> list[str]:
    """What is wrong with a ``pretrain`` value: ``{algo, input, iterations}`` and optionally ``config``."""
    shape = "pretrain={algo: bc|marwil|cql, input: DIR, iterations: N} (and optionally config: {...})"
    if not isinstance(value, dict):
        return [f"pretrain={value!r}: use {shape}"]
    problems = [
        f"pretrain: unknown key {key!r}; the keys are {list(PRETRAIN_KEYS)}"
        for key in value
        if key not in PRETRAIN_KEYS
    ]
    problems += [f"pretrain needs {key!r}: use {shape}" for key in ("algo", "input", "iterations") if key not in value]
    if "algo" in value and value["algo"] not in PRETRAIN_ALGORITHMS:
        problems.append(f"pretrain['algo']={value['algo']!r} must be one of {list(PRETRAIN_ALGORITHMS)}")
    if "input" in value and (
        value["input"] == SAMPLER or input_problems(value["input"]) or isinstance(value["input"], dict)
    ):
        problems.append(
            f"pretrain['input']={value['input']!r} must name recorded experiences (a directory, file, glob or list)"
        )
    iterations = value.get("iterations", 1)
    if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 1:
        problems.append(f"pretrain['iterations']={iterations!r} must be an int >= 1")
    if not isinstance(value.get("config", {}), dict):
        problems.append(f"pretrain['config']={value['config']!r} must be a dict of the pretraining algorithm's keys")
    return problems


def estimator_problems(value: list[str]) -> list[str]:
    """What is wrong with an ``off_policy_estimation_methods`` value: unknown or repeated estimators."""
    unknown = [name for name in value if name not in METHODS]
    if unknown:
        return [f"off_policy_estimation_methods: unknown estimator(s) {unknown}; the estimators are {list(METHODS)}"]
    if len(set(value)) != len(value):
        return [f"off_policy_estimation_methods={value!r} names an estimator twice"]
    return []


def off_policy_problems(config: Any) -> list[str]:
    """Off-policy estimators asked for where they have nothing to estimate on, or are never reported."""
    methods = config.off_policy_estimation_methods
    if not methods:
        return []
    problems = []
    if not config.reads_offline:
        problems.append(
            f"off_policy_estimation_methods={methods!r} estimates the policy's value on recorded episodes, but "
            f"input={config.input!r} reads none: set input to experiences written with action_logp (output: DIR "
            "or flowrl record) and train an offline algorithm (bc, marwil), or drop the key"
        )
    if not config.evaluation_interval:
        problems.append(
            f"off_policy_estimation_methods={methods!r} reports at each evaluation, but evaluation_interval="
            f"{config.evaluation_interval!r} never evaluates: set evaluation_interval to 1 or more"
        )
    return problems


def offline_only_problems(value: Any, algorithm: str) -> list[str]:
    """What is wrong with ``input`` for an algorithm that learns from experiences alone (bc, marwil, cql)."""
    if isinstance(value, dict):
        return [
            f"input={value!r}: {algorithm} learns from recorded experiences alone, not mixed with "
            "the sampler; name a directory, .parquet file, glob or list of them"
        ]
    return []
