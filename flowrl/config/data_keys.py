"""The values of ``input``, the key that says where training experience comes from: the sampler, or
experiences on disk (checked for their shape here; the files when a run opens them)."""

from __future__ import annotations

from typing import Any

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


def offline_only_problems(value: Any, algorithm: str) -> list[str]:
    """What is wrong with ``input`` for an algorithm that learns from experiences alone (bc, marwil, cql)."""
    if isinstance(value, dict):
        return [
            f"input={value!r}: {algorithm} learns from recorded experiences alone, not mixed with "
            "the sampler; name a directory, .parquet file, glob or list of them"
        ]
    return []
