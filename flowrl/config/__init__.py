"""Typed configs: the field machinery (``cfg_field``), cross-key checks, :class:`TrainerConfig` and the
table of RLlib's keys.

An algorithm's config derives from :class:`TrainerConfig` and declares its keys with :func:`cfg_field`.
"""

from __future__ import annotations

from flowrl.config.checks import parse_iteration_window
from flowrl.config.fields import cfg_field, field_default
from flowrl.config.trainer_config import TrainerConfig

__all__ = ["TrainerConfig", "cfg_field", "field_default", "parse_iteration_window"]
