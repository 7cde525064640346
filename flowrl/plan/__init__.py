"""A plan as something to look at: its graph and statistics, the renderers (text, Mermaid, DOT, HTML),
the X-ray of where an iteration's time goes, run views, traces and the doctor's verdict.

``Plan`` and ``PlanGraph`` are imported from :mod:`flowrl.plan.graph` on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from flowrl.deferred import deferred_attributes

if TYPE_CHECKING:
    from flowrl.plan.graph import Plan, PlanGraph

__all__ = ["Plan", "PlanGraph"]

__getattr__ = deferred_attributes(__name__, {"flowrl.plan.graph": ["Plan", "PlanGraph"]})
