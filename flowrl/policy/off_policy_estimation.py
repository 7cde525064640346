"""Off-policy estimation: the value of a target policy from episodes another (behaviour) policy recorded.

Every estimator takes whole episodes (:class:`Episodes`: rows in order, episode after episode, with the
behaviour policy's log-probability of each recorded action) and the target policy's log-probability of
the same actions, and returns an :class:`Estimate` of the expected discounted return
``sum_t gamma**t * r_t`` of an episode played by the target policy:

- ``is``: per-decision importance sampling (Precup et al. 2000): reward ``t`` weighted by the product of
  the ratios ``pi(a_k|s_k) / mu(a_k|s_k)`` for ``k <= t``. Unbiased.
- ``wis``: per-decision weighted importance sampling: the same products divided by their mean over the
  episodes at step ``t`` (an episode that ended keeps its last product, as if it stayed in an absorbing
  state with reward 0). Biased, consistent, and of much lower variance.
- ``dm``: the direct method: ``V(s_0) = sum_a pi(a|s_0) Q(s_0, a)`` of each episode's first state, with a
  Q-function of the target policy (:func:`fitted_q_evaluation` fits one on the episodes).
- ``dr``: per-decision doubly robust (Jiang and Li 2016): DM corrected along each episode by the
  importance-weighted errors of Q; unbiased whatever Q is, and exact for deterministic episodes given the
  true Q.

An episode's last row is its end, whether it terminated or was truncated: the value estimated is that of
episodes as long as the recorded ones could be. The standard errors are those of the mean over episodes
of each episode's term (for ``wis``, with the normalisers held fixed).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from flowrl.data import SampleBatch
from flowrl.deferred import torch

if TYPE_CHECKING:
    from flowrl.policy.torch_policy import TorchPolicy

#: The estimators, by the names ``off_policy_estimation_methods`` takes.
METHODS = ("is", "wis", "dm", "dr")
#: The estimators that need a Q-function of the target policy (and so its probabilities of every action).
Q_METHODS = ("dm", "dr")


class Episodes(NamedTuple):
    """Whole episodes, their rows in order, one episode after another; ``starts[i]``: episode ``i``'s first row."""

    obs: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    #: The recording policy's log-probability of each action (None: the data has none; only ``dm`` works then).
    behavior_logp: np.ndarray | None
    starts: np.ndarray

    @property
    def num_episodes(self) -> int:
        """The number of episodes."""
        return len(self.starts)

    def padded(self, values: np.ndarray) -> np.ndarray:
        """Per-row ``values`` as ``[episodes, longest episode]``, zeros after each episode's end."""
        lengths = np.diff(np.append(self.starts, len(self.rewards)))
        out = np.zeros((self.num_episodes, int(lengths.max())), dtype=np.float64)
        rows = np.repeat(np.arange(self.num_episodes), lengths)
        steps = np.arange(len(self.rewards)) - np.repeat(self.starts, lengths)
        out[rows, steps] = values
        return out

    @property
    def last_rows(self) -> np.ndarray:
        """Whether each row is its episode's last."""
        last = np.zeros(len(self.rewards), dtype=bool)
        last[np.append(self.starts[1:], len(self.rewards)) - 1] = True
        return last


class Estimate(NamedTuple):
    """One estimator's figures: the recorded episodes' mean discounted return (``v_behavior``), the
    estimate for the target policy (``v_target``), their ratio (``v_gain``), and ``v_target``'s standard error."""

    v_behavior: float
    v_target: float
    v_gain: float
    v_target_std_error: float


def whole_episodes(batches: Iterable[SampleBatch], max_episodes: int) -> Episodes | None:
    """The first ``max_episodes`` whole episodes among rows in file order (None if there is none).

    An episode is whole when its rows run from ``t == 0`` without a gap to a row that terminated or was
    truncated; rows of episodes cut by the start or end of the recording (or interleaved with a gap) are
    left out. Rows need ``obs``, ``actions``, ``rewards``, ``terminateds``, ``truncateds``, ``eps_id``,
    ``t``, and ``action_logp`` for the estimators that weigh actions (all but ``dm``).
    """
    columns = [SampleBatch.OBS, SampleBatch.ACTIONS, SampleBatch.REWARDS, SampleBatch.ACTION_LOGP]
    open_rows: dict[int, list[tuple[SampleBatch, int, int]]] = {}  # eps_id -> its pieces so far
    next_t: dict[int, int] = {}
    done: list[list[tuple[SampleBatch, int, int]]] = []
    for batch in batches:
        if SampleBatch.ACTION_LOGP not in batch:
            columns = columns[:3]
        ids = np.asarray(batch[SampleBatch.EPS_ID])
        steps = np.asarray(batch[SampleBatch.T])
        ends = np.asarray(batch[SampleBatch.TERMINATEDS]) | np.asarray(batch[SampleBatch.TRUNCATEDS])
        cuts = np.flatnonzero((ids[1:] != ids[:-1]) | ends[:-1]) + 1
        for start, stop in zip([0, *cuts.tolist()], [*cuts.tolist(), batch.count]):
            eps = int(ids[start])
            if steps[start] == 0:
                open_rows[eps], next_t[eps] = [], 0
            if next_t.get(eps) != steps[start] or np.any(np.diff(steps[start:stop]) != 1):
                open_rows.pop(eps, None)
                next_t.pop(eps, None)
                continue
            open_rows[eps].append((batch, start, stop))
            next_t[eps] = int(steps[stop - 1]) + 1
            if ends[stop - 1]:
                done.append(open_rows.pop(eps))
                del next_t[eps]
                if len(done) == max_episodes:
                    return _join(done, columns)
    return _join(done, columns) if done else None


def _join(episodes: list[list[tuple[SampleBatch, int, int]]], columns: Sequence[str]) -> Episodes:
    parts = [piece for episode in episodes for piece in episode]
    values = {c: np.concatenate([np.asarray(b[c])[start:stop] for b, start, stop in parts]) for c in columns}
    lengths = [sum(stop - start for _, start, stop in episode) for episode in episodes]
    return Episodes(
        obs=values[SampleBatch.OBS],
        actions=values[SampleBatch.ACTIONS],
        rewards=values[SampleBatch.REWARDS].astype(np.float64),
        behavior_logp=values[SampleBatch.ACTION_LOGP].astype(np.float64) if SampleBatch.ACTION_LOGP in values else None,
        starts=np.cumsum([0, *lengths[:-1]]),
    )


def estimate(
    method: str,
    episodes: Episodes,
    target_logp: np.ndarray,
    gamma: float,
    *,
    q_values: np.ndarray | None = None,
    target_probs: np.ndarray | None = None,
) -> Estimate:
    """``method``'s estimate of the target policy's value (see the module docs).

    ``target_logp``: the target policy's log-probability of each recorded action. ``dm`` and ``dr`` also
    take ``q_values`` (``[rows, actions]``: the target policy's Q of every action at each row's state) and
    ``target_probs`` (``[rows, actions]``: its probability of each action there).
    """
    if method not in METHODS:
        raise ValueError(f"unknown off-policy estimator {method!r}; the estimators are {list(METHODS)}")
    rewards = episodes.padded(episodes.rewards)
    discounts = gamma ** np.arange(rewards.shape[1])
    if episodes.behavior_logp is None:
        if method != "dm":
            raise ValueError(f"the {method!r} estimator needs the recording policy's action_logp")
        weights = np.ones_like(rewards)
    else:
        # Products of the ratios up to each step; after an episode's end the padding's zero log-ratios hold the last.
        log_ratios = np.asarray(target_logp, np.float64) - episodes.behavior_logp
        weights = np.exp(np.cumsum(episodes.padded(log_ratios), 1))
    if method in Q_METHODS:
        if q_values is None or target_probs is None:
            raise ValueError(f"the {method!r} estimator needs q_values and target_probs")
        state_values = np.sum(np.asarray(target_probs) * q_values, axis=1)
        if method == "dm":
            per_episode = state_values[episodes.starts]
        else:
            chosen = np.take_along_axis(q_values, np.asarray(episodes.actions).reshape(-1, 1).astype(np.int64), 1)
            before = np.concatenate([np.ones((episodes.num_episodes, 1)), weights[:, :-1]], axis=1)
            terms = weights * (rewards - episodes.padded(chosen[:, 0])) + before * episodes.padded(state_values)
            per_episode = np.sum(discounts * terms, axis=1)
    elif method == "is":
        per_episode = np.sum(discounts * weights * rewards, axis=1)
    else:
        # A step where no episode's actions are ones the target policy takes contributes nothing.
        means = weights.mean(axis=0)
        normalised = np.divide(weights, means, out=np.zeros_like(weights), where=means > 0)
        per_episode = np.sum(discounts * normalised * rewards, axis=1)
    v_behavior = float(np.mean(np.sum(discounts * rewards, axis=1)))
    v_target = float(np.mean(per_episode))
    std_error = (
        float(np.std(per_episode, ddof=1) / np.sqrt(episodes.num_episodes)) if episodes.num_episodes > 1 else 0.0
    )
    gain = v_target / v_behavior if v_behavior else float("nan")
    return Estimate(v_behavior, v_target, gain, std_error)


def fitted_q_evaluation(
    episodes: Episodes,
    target_probs: np.ndarray,
    gamma: float,
    *,
    hiddens: Sequence[int] = (64, 64),
    steps: int = 2000,
    batch_size: int = 256,
    target_update_freq: int = 10,
    lr: float = 1e-3,
    seed: int | None = 0,
) -> np.ndarray:
    """The target policy's Q of every (discrete) action at each row's state, ``[rows, actions]``, fitted on the
    episodes by fitted Q evaluation (Le et al. 2019): a small MLP regressed, for ``steps`` Adam steps on random
    rows, on ``r + gamma * sum_a' pi(a'|s') Q'(s', a')``, ``s'`` the next row's state (nothing after an
    episode's last row) and ``Q'`` a copy of the MLP refreshed every ``target_update_freq`` steps.
    ``target_probs``: the target policy's probability of each action at each row's state."""
    from flowrl.policy.models import mlp  # imported here: the estimators without Q need no PyTorch

    generator = torch.Generator().manual_seed(seed or 0)
    obs = torch.as_tensor(np.asarray(episodes.obs, np.float32).reshape(len(episodes.rewards), -1))
    probs = torch.as_tensor(np.asarray(target_probs, np.float32))
    actions = torch.as_tensor(np.asarray(episodes.actions, np.int64))
    rewards = torch.as_tensor(episodes.rewards, dtype=torch.float32)
    nonterminal = torch.as_tensor(~episodes.last_rows, dtype=torch.float32)
    following = torch.clamp(torch.arange(len(rewards)) + 1, max=len(rewards) - 1)
    # Values up to sum_t gamma**t * max|r|: the net learns them in units of that scale.
    scale = max(float(rewards.abs().max()), 1e-8) / (1 - gamma) if gamma < 1 else float(rewards.abs().sum())
    with torch.random.fork_rng():
        torch.manual_seed(seed or 0)
        net = mlp(obs.shape[1], hiddens, "relu", probs.shape[1])
    frozen = mlp(obs.shape[1], hiddens, "relu", probs.shape[1])
    optimizer = torch.optim.Adam(net.parameters(), lr=lr)
    targets = torch.zeros_like(rewards)
    for step in range(steps):
        if step % target_update_freq == 0:
            frozen.load_state_dict(net.state_dict())
            with torch.no_grad():
                next_values = (probs * frozen(obs)).sum(1)[following]
                targets = rewards / scale + gamma * nonterminal * next_values
        rows = torch.randint(len(rewards), (batch_size,), generator=generator)
        predicted = net(obs[rows]).gather(1, actions[rows, None])[:, 0]
        loss = torch.nn.functional.mse_loss(predicted, targets[rows])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        return np.asarray(net(obs).numpy(), dtype=np.float64) * scale


def target_outputs(
    policy: TorchPolicy[Any], episodes: Episodes, chunk: int = 4096
) -> tuple[np.ndarray, np.ndarray | None]:
    """``policy``'s log-probability of each recorded action, and (discrete actions) its probability of every
    action at each row's state, ``[rows, actions]`` (None for other action spaces). Actions as the policy
    samples them: the value estimated is that of its action distribution, not of its greedy actions."""
    from flowrl.policy.distributions import Categorical  # imported here: PyTorch only once estimates are asked for
    from flowrl.policy.models import obs_to_tensor

    logps, probs = [], []
    with torch.no_grad():
        for start in range(0, len(episodes.rewards), chunk):
            obs = obs_to_tensor(episodes.obs[start : start + chunk], policy.model_observation_space, policy.device)
            inputs, _ = policy.model_outputs(policy.model, {SampleBatch.OBS: obs})
            dist = policy.dist_class(inputs)
            actions = torch.as_tensor(np.asarray(episodes.actions[start : start + chunk]), device=policy.device)
            logps.append(dist.logp(actions).cpu().numpy())
            if isinstance(dist, Categorical):
                probs.append(dist.log_probs.exp().cpu().numpy())
    return np.concatenate(logps).astype(np.float64), np.concatenate(probs).astype(np.float64) if probs else None


def off_policy_estimates(
    policy: TorchPolicy[Any], episodes: Episodes, methods: Sequence[str], gamma: float, *, seed: int | None = 0
) -> dict[str, dict[str, float]]:
    """Each of ``methods``' :class:`Estimate` of ``policy``'s value on ``episodes``, as a dict of its figures;
    ``dm`` and ``dr`` share one :func:`fitted_q_evaluation` (discrete actions only)."""
    target_logp, target_probs = target_outputs(policy, episodes)
    q_values = None
    if any(method in Q_METHODS for method in methods):
        if target_probs is None:
            raise ValueError(f"the estimators {list(Q_METHODS)} fit a Q-function of discrete actions only")
        q_values = fitted_q_evaluation(episodes, target_probs, gamma, seed=seed)
    return {
        method: estimate(method, episodes, target_logp, gamma, q_values=q_values, target_probs=target_probs)._asdict()
        for method in methods
    }
