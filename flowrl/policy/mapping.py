"""Which policy acts for an agent of a multi-agent env: the config's ``policy_mapping_fn``, resolved."""

from __future__ import annotations

from collections.abc import Callable, Hashable

from flowrl.errors import FlowRLError
from flowrl.importing import import_callable

PolicyMappingFn = Callable[[Hashable], str]


class _OnlyPolicy:
    """The mapping of a multi-agent env with one policy: every agent to it (picklable, unlike a lambda)."""

    def __init__(self, policy_id: str) -> None:
        self.policy_id = policy_id

    def __call__(self, agent_id: Hashable) -> str:
        return self.policy_id


def policy_mapping(policy_mapping_fn: PolicyMappingFn | str | None, policy_ids: list[str]) -> PolicyMappingFn:
    """``policy_mapping_fn`` (imported if a ``"module:function"`` path), or for None the
    mapping of every agent to the only policy.

    Raises a :class:`~flowrl.errors.FlowRLError` if it is None with several policies.
    """
    if isinstance(policy_mapping_fn, str):
        return import_callable(policy_mapping_fn, key="policy_mapping_fn")
    if policy_mapping_fn is not None:
        return policy_mapping_fn
    if len(policy_ids) != 1:
        raise FlowRLError(
            f"with several policies {sorted(policy_ids)}, the config needs a policy_mapping_fn(agent_id) -> policy id"
        )
    return _OnlyPolicy(policy_ids[0])
