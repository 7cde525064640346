"""Where an env runs: the ``env_config`` an env creator receives, with its worker's place in the run."""

from __future__ import annotations

from typing import Any, Mapping


class EnvContext(dict):  # type: ignore[type-arg]  # keys are the user's env_config, of any type
    """The user's ``env_config`` (its keys, unchanged) plus where this env runs, as attributes.

    ``worker_index``: 0 for the driver's local worker, i >= 1 for remote worker i.
    ``vector_index``: this env's position among its worker's ``num_envs_per_worker`` envs.
    ``num_workers``: the run's remote rollout workers. ``recreated_worker``: True in a
    worker that replaces one that failed (e.g. to skip a fault that already fired).
    The names are RLlib's; a creator can give each worker its own seed, port or file::

        def make(env_config):
            return MyEnv(port=9000 + env_config.worker_index * 8 + env_config.vector_index)

    The extras are attributes, not keys, so ``gymnasium.make(id, **env_config)`` still works.
    """

    def __init__(
        self,
        env_config: Mapping[str, Any] | None = None,
        *,
        worker_index: int = 0,
        vector_index: int = 0,
        num_workers: int = 0,
        recreated_worker: bool = False,
    ) -> None:
        super().__init__(env_config or {})
        self.worker_index = worker_index
        self.vector_index = vector_index
        self.num_workers = num_workers
        self.recreated_worker = recreated_worker

    def copy_with(self, **changes: Any) -> "EnvContext":
        """A copy (keys and context) with some context attributes changed, e.g. ``vector_index``."""
        context = {**vars(self), **changes}
        return EnvContext(self, **context)

    def __repr__(self) -> str:
        return (
            f"EnvContext({dict(self)!r}, worker_index={self.worker_index}, vector_index={self.vector_index}, "
            f"num_workers={self.num_workers}, recreated_worker={self.recreated_worker})"
        )
