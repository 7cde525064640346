"""The episode side of callbacks inside a sampler: one :class:`~flowrl.callbacks.Episode` per env,
its hooks, and the custom metrics a finished episode reports.

A sampler holds an :class:`EpisodeHooks` only when the run asks for it (a callbacks class that
overrides an episode hook, or ``custom_metrics_from_info``), so runs without callbacks pay
nothing per step.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from flowrl.callbacks import Callbacks, Episode, checked_metrics, run_hook
from flowrl.errors import EnvError


class EpisodeHooks:
    """Tracks the episode of each of a sampler's ``num_envs`` envs and runs ``callbacks``' episode hooks.

    ``info_keys`` (config ``custom_metrics_from_info``) are read from the info dict of each
    episode's last step; a key the last info lacks gives no value for that episode (in a
    multi-agent env each agent's latest info is read, and the metric is ``"<agent>/<key>"``).
    An episode that ended waits until the sampler publishes it (:meth:`publish`): only then,
    once it counts in the results, do ``on_episode_end`` and its metrics run.
    """

    def __init__(
        self,
        callbacks: Callbacks,
        info_keys: Sequence[str],
        *,
        worker_index: int,
        num_envs: int,
        multi_agent: bool = False,
    ) -> None:
        self.callbacks = callbacks
        self.info_keys = tuple(info_keys)
        self.worker_index = worker_index
        self.multi_agent = multi_agent
        self.episodes: list[Episode | None] = [None] * num_envs
        # Episodes that ended in the sample call in progress, by episode id, until published or dropped.
        self._ended: dict[int, Episode] = {}

    def _where(self, episode: Episode) -> str:
        return f"worker {self.worker_index}, env {episode.env_index}, episode {episode.episode_id}"

    def start(self, env_index: int, episode_id: int, obs: Any, info: Any) -> None:
        """A new episode in env ``env_index``, from its ``reset`` (what it held before is dropped)."""
        episode = Episode(episode_id, env_index, self.worker_index, last_obs=obs, last_info=info)
        if self.multi_agent:
            episode.agent_infos = _agent_infos(info)
        self.episodes[env_index] = episode
        run_hook(self.callbacks, "on_episode_start", episode, where=self._where(episode))

    def step(self, env_index: int, obs: Any, reward: float, info: Any) -> None:
        """Env ``env_index`` took a step of its episode."""
        episode = self.episodes[env_index]
        assert episode is not None, "a step before the episode started"
        episode.length += 1
        episode.total_reward += reward
        episode.last_obs, episode.last_info = obs, info
        if self.multi_agent:
            episode.agent_infos.update(_agent_infos(info))
        run_hook(self.callbacks, "on_episode_step", episode, where=self._where(episode))

    def end(self, env_index: int) -> None:
        """The episode of env ``env_index`` is over; it waits for :meth:`publish`."""
        episode = self.episodes[env_index]
        assert episode is not None, "an end before the episode started"
        self._ended[episode.episode_id] = episode
        self.episodes[env_index] = None

    def publish(self, episode_ids: Sequence[int]) -> list[dict[str, float]]:
        """Run ``on_episode_end`` for the ended episodes that count (``episode_ids``, in order) and
        return each one's custom metrics; ended episodes not named were dropped and are forgotten."""
        metrics = []
        for episode_id in episode_ids:
            episode = self._ended.pop(episode_id)
            episode.custom_metrics.update(self._info_metrics(episode))
            where = self._where(episode)
            run_hook(self.callbacks, "on_episode_end", episode, where=where)
            metrics.append(checked_metrics(episode.custom_metrics, where))
        self._ended.clear()
        return metrics

    def _info_metrics(self, episode: Episode) -> dict[str, float]:
        """The ``info_keys`` values of the episode's last step (each agent's latest info in a multi-agent env)."""
        if not self.info_keys:
            return {}
        if self.multi_agent:
            sources = {f"{agent}/": info for agent, info in episode.agent_infos.items()}
        else:
            sources = {"": episode.last_info if isinstance(episode.last_info, dict) else {}}
        found = {}
        for prefix, info in sources.items():
            for key in self.info_keys:
                if key in info:
                    found[prefix + key] = _info_number(info[key], key, self._where(episode))
        return found

    def get_state(self) -> list[Episode | None]:
        """The episodes in progress (a copy), for checkpoints."""
        return copy.deepcopy(self.episodes)

    def set_state(self, episodes: list[Episode | None] | None) -> None:
        """Restore :meth:`get_state`'s output; None (a state saved without hooks) keeps the episodes held now."""
        if episodes is not None and len(episodes) == len(self.episodes):
            self.episodes = copy.deepcopy(episodes)


def _agent_infos(infos: Any) -> dict[Any, dict[str, Any]]:
    """The per-agent info dicts of a multi-agent ``reset`` or ``step``."""
    return {agent: info for agent, info in infos.items() if isinstance(info, dict)}


def _info_number(value: Any, key: str, where: str) -> float:
    try:
        if not isinstance(value, (str, bytes)):
            return float(value)
    except (TypeError, ValueError):
        pass
    raise EnvError(
        f"custom_metrics_from_info: the last step's info[{key!r}]={value!r} ({where}) is not a real number; "
        "custom metrics are numbers"
    )
