"""Soft Actor-Critic (Haarnoja et al. 2018), continuous and discrete, on DQN's replay plan.

A stochastic actor maximises Q plus entropy; twin soft Q critics learn from targets that add the
next action's entropy bonus (min target Q - alpha log pi); the temperature alpha tunes itself
towards ``target_entropy``. Continuous actions: a tanh-squashed Gaussian into the Box bounds.
Discrete actions (Christodoulou 2019): a categorical actor, critics giving the Q-value of every
action, and exact expectations over the (legal) actions in place of sampled ones.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Mapping, NamedTuple

import gymnasium as gym
import numpy as np

from flowrl.algorithms.dqn import DQNConfig
from flowrl.algorithms.dqn import execution_plan as dqn_execution_plan
from flowrl.algorithms.dqn import make_resources as dqn_resources
from flowrl.algorithms.registry import Algorithm
from flowrl.config import cfg_field
from flowrl.data import SampleBatch
from flowrl.deferred import DeferredModule, nn, torch
from flowrl.errors import ConfigError
from flowrl.policy import LossOutput, PolicySpec, TorchPolicy, nstep_postprocess
from flowrl.policy.action_masks import mask_logits
from flowrl.policy.custom_model import ModelInterface, actor_and_critics, probe_observations
from flowrl.policy.distributions import DistFactory
from flowrl.policy.optimizers import FOLLOWS_LR, adam
from flowrl.policy.postprocessing import DISCOUNTS
from flowrl.policy.schedules import PiecewiseSchedule

if TYPE_CHECKING:
    from flowrl.policy import sac_networks
else:
    sac_networks = DeferredModule("flowrl.policy.sac_networks")  # torch modules: imported when a policy is built

#: ``target_entropy: "auto"`` for n discrete actions is this fraction of the largest entropy, log n.
#: Christodoulou (2019) used 0.98, which keeps a two-action policy near 60/40 (it cannot balance
#: CartPole); half the maximum leaves the policy free to prefer one action strongly (about 90/10 of
#: two) while alpha still keeps it from collapsing.
DISCRETE_ENTROPY_FRACTION = 0.5

#: What a custom model of SAC provides (see :mod:`flowrl.policy.custom_model`).
STOCHASTIC_ACTOR_CRITIC = ModelInterface(
    "stochastic actor-critic",
    "actor: flat obs [B, obs_dim] -> [B, 2 * action_dim] (Gaussian mean and log std, before the tanh into the "
    "bounds) or [B, n] logits (Discrete); critics: nn.ModuleList of [B, obs_dim + action_dim] -> [B, 1], or "
    "of [B, obs_dim] -> [B, n] (Discrete); two for twin_q",
)


@dataclass(kw_only=True)
class SACConfig(DQNConfig):
    """SAC settings: DQN's replay keys plus actor/critic sizes, learning rates and entropy tuning.

    Soft target updates (``tau``) after every training step (``target_network_update_freq`` 0).
    Until ``learning_starts`` env steps, actions are uniform (in the Box bounds, or over the legal
    discrete actions); then they are drawn from the policy. An empty ``exploration_config`` (the
    default) means exactly that; it may instead be a ``StochasticSampling`` with its own ``random_timesteps``.
    With ``entropy_coeff_schedule``, alpha is the schedule's value at the global timestep and tunes nothing.
    """

    defaults = {
        "rollout_fragment_length": 1,
        "train_batch_size": 256,
        "buffer_size": 1_000_000,
        "learning_starts": 1000,
        "lr": 3e-4,
        "n_step": 1,
        "prioritized_replay": False,
        "tau": 0.005,
        "target_network_update_freq": 0,
        "exploration_config": {},
        "grad_clip": None,
    }
    # RLlib 2.0-2.2's SAC (rllib/algorithms/sac/sac.py) where it differs from flowrl's: its
    # num_steps_sampled_before_learning_starts, and optimization's three rates (RLlib's SAC ignores lr).
    # Its models (fcnet_hiddens [256, 256], ReLU), tau, initial_alpha, target_entropy "auto", n_step,
    # twin_q, train_batch_size and buffer capacity are flowrl's defaults already.
    rllib_defaults = {
        "learning_starts": 1500,
        "actor_lr": 3e-4,
        "critic_lr": 3e-4,
        "alpha_lr": 3e-4,
    }

    actor_hiddens: list[int] = cfg_field([256, 256], "Hidden layer sizes of the actor (ReLU).", per_policy=True)
    critic_hiddens: list[int] = cfg_field([256, 256], "Hidden layer sizes of each critic (ReLU).", per_policy=True)
    actor_lr: float | None = cfg_field(
        None, "Adam learning rate of the actor (None: lr).", min=0, min_exclusive=True, per_policy=True
    )
    critic_lr: float | None = cfg_field(
        None, "Adam learning rate of the critic(s) (None: lr).", min=0, min_exclusive=True, per_policy=True
    )
    alpha_lr: float | None = cfg_field(
        None,
        "Adam learning rate of log alpha, the entropy temperature (None: lr).",
        min=0,
        min_exclusive=True,
        per_policy=True,
    )
    initial_alpha: float = cfg_field(
        1.0,
        "The entropy temperature alpha at the start (it then tunes itself).",
        min=0,
        min_exclusive=True,
        per_policy=True,
    )
    target_entropy: float | Literal["auto"] = cfg_field(
        "auto",
        "The policy entropy alpha steers towards, in nats. 'auto': -dim(A) for a Box of actions, "
        f"{DISCRETE_ENTROPY_FRACTION} * log(n) for n discrete actions (half the largest entropy).",
        per_policy=True,
    )
    twin_q: bool = cfg_field(True, "Two critics; targets and the actor use the smaller Q.", per_policy=True)

    @property
    def schedules_entropy(self) -> bool:
        # entropy_coeff_schedule sets alpha (which then tunes nothing).
        return True

    def check(self) -> list[str]:
        problems = super().check()
        kind = self.exploration_config.get("type")
        if self.exploration_config and kind != "StochasticSampling":
            problems.append(
                f"exploration_config type={kind!r}: SAC explores by sampling its policy, 'StochasticSampling' "
                "(or leave it empty: uniform actions until learning_starts, then the policy's)"
            )
        return problems


def target_entropy(config: SACConfig, action_space: gym.Space[Any]) -> float:
    """The entropy alpha steers towards: ``config.target_entropy``, or its ``"auto"`` value for ``action_space``."""
    if config.target_entropy != "auto":
        return float(config.target_entropy)
    if isinstance(action_space, gym.spaces.Discrete):
        return DISCRETE_ENTROPY_FRACTION * math.log(int(action_space.n))
    return -float(np.prod(action_space.shape or ()))


class SACTerms(NamedTuple):
    """One batch's three losses, and what the statistics report, whatever the action space."""

    critic_loss: torch.Tensor
    actor_loss: torch.Tensor
    alpha_loss: torch.Tensor
    logp: torch.Tensor  # E[log pi(a|s)] per row, detached: the entropy's negative
    alpha: torch.Tensor  # the temperature the losses used, detached
    q_taken: torch.Tensor  # the first critic's Q of the batch's actions
    q_target: torch.Tensor


def sac_terms(policy: TorchPolicy[SACConfig], model: nn.Module, batch: dict[str, torch.Tensor]) -> SACTerms:
    """The critics' soft TD loss, the actor's ``E[alpha log pi - min Q]`` and alpha's
    ``-log alpha (log pi + target_entropy)``, whose gradients stay apart: the actor's term moves no
    critic, the critics' no actor, and only alpha's term moves alpha."""
    target = policy.target_model
    assert isinstance(model, sac_networks.SACModel) and isinstance(target, sac_networks.SACModel)
    alpha = _alpha(policy, model)
    critic_loss, actor_loss, logp, q_taken, q_target = (_discrete if model.discrete else _continuous)(
        model, target, batch, alpha
    )
    if policy.config.entropy_coeff_schedule is None:
        alpha_loss = -(model.log_alpha * (logp + target_entropy(policy.config, policy.action_space))).mean()
    else:  # alpha follows the schedule: log alpha learns nothing
        alpha_loss = torch.zeros((), device=logp.device)
    return SACTerms(critic_loss, actor_loss, alpha_loss, logp, alpha, q_taken, q_target)


def _alpha(policy: TorchPolicy[SACConfig], model: sac_networks.SACModel) -> torch.Tensor:
    """The temperature the losses use now: ``entropy_coeff_schedule``'s value at the global timestep when
    the config has one (alpha then tunes nothing), else the learned one (detached)."""
    points = policy.config.entropy_coeff_schedule
    if points is None:
        return model.log_alpha.detach().exp()
    return torch.tensor(PiecewiseSchedule(points).value(policy.global_timestep), device=model.log_alpha.device)


def sac_td_error(policy: TorchPolicy[SACConfig], batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Each row's n-step soft TD error of the first critic, as the loss computes it (its next actions drawn
    afresh from the policy), without gradient: worker-side priorities."""
    model, target = policy.model, policy.target_model
    assert isinstance(model, sac_networks.SACModel) and isinstance(target, sac_networks.SACModel)
    obs, new_obs = batch[SampleBatch.OBS], batch[SampleBatch.NEW_OBS]
    with torch.no_grad():
        alpha = _alpha(policy, model)
        next_inputs = model.dist_inputs(new_obs)
        if model.discrete:
            q_target = _discrete_target(target, batch, alpha, next_inputs)
            q_taken = model.q_all(obs)[0].gather(1, batch[SampleBatch.ACTIONS].long().unsqueeze(1)).squeeze(1)
        else:
            q_target = _continuous_target(target, batch, alpha, *model.sample(next_inputs))
            q_taken = model.q(obs, batch[SampleBatch.ACTIONS].float())[0]
    return q_taken - q_target


def sac_loss(
    policy: TorchPolicy[SACConfig],
    model: nn.Module,
    dist_class: DistFactory,
    batch: dict[str, torch.Tensor],
) -> LossOutput:
    """The sum of :func:`sac_terms`' three losses (one backward pass, one optimizer with a group each).

    TD errors come back only with prioritized replay: nothing else reads them.
    """
    terms = sac_terms(policy, model, batch)
    reported = {
        "critic_loss": terms.critic_loss,
        "actor_loss": terms.actor_loss,
        "alpha_loss": terms.alpha_loss,
        "alpha": terms.alpha,
        "entropy": -terms.logp.mean(),
        "mean_q": terms.q_taken.mean(),
    }
    stats = dict(zip(reported, torch.stack(list(reported.values())).detach().tolist()))  # one conversion
    td_error = terms.q_taken - terms.q_target if policy.config.prioritized_replay else None
    return LossOutput(terms.critic_loss + terms.actor_loss + terms.alpha_loss, stats, td_error)


def _critic_loss(q_values: list[torch.Tensor], q_target: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Half the (importance-weighted) mean squared TD error of each critic, summed over the critics."""
    weights = batch.get(SampleBatch.WEIGHTS)
    errors = [(q - q_target).square() for q in q_values]
    return 0.5 * functools.reduce(torch.add, [(e if weights is None else weights * e).mean() for e in errors])


def _bootstrap(batch: dict[str, torch.Tensor], next_value: torch.Tensor) -> torch.Tensor:
    """The n-step target: rewards plus the discounted next value, unless the episode terminated
    (a truncated one goes on)."""
    next_value = next_value.masked_fill(batch[SampleBatch.TERMINATEDS].bool(), 0.0)
    return torch.addcmul(batch[SampleBatch.REWARDS], batch[DISCOUNTS], next_value)


def _continuous(
    model: sac_networks.SACModel, target: sac_networks.SACModel, batch: dict[str, torch.Tensor], alpha: torch.Tensor
) -> tuple[torch.Tensor, ...]:
    obs, new_obs = batch[SampleBatch.OBS], batch[SampleBatch.NEW_OBS]
    # One actor pass over the observations and the next ones together.
    actions, logp = model.sample(model.dist_inputs(torch.cat([obs, new_obs])))
    (actions, next_actions), (logp, next_logp) = actions.chunk(2), logp.chunk(2)
    with torch.no_grad():
        q_target = _continuous_target(target, batch, alpha, next_actions, next_logp)
    q_values = model.q(obs, batch[SampleBatch.ACTIONS].float())
    # The actor's gradient must not move the critics: their weights take no gradient while
    # Q(s, a ~ pi) is recorded (the critic loss above was recorded with them taking one).
    trainable = [p for p in model.critics.parameters() if p.requires_grad]
    for p in trainable:
        p.requires_grad_(False)
    try:
        q_pi = functools.reduce(torch.minimum, model.q(obs, actions))
    finally:
        for p in trainable:
            p.requires_grad_(True)
    actor_loss = (alpha * logp - q_pi).mean()
    return _critic_loss(q_values, q_target, batch), actor_loss, logp.detach(), q_values[0], q_target


def _continuous_target(
    target: sac_networks.SACModel,
    batch: dict[str, torch.Tensor],
    alpha: torch.Tensor,
    next_actions: torch.Tensor,
    next_logp: torch.Tensor,
) -> torch.Tensor:
    """The soft n-step target from the policy's next actions: twin-min target Q minus alpha log pi."""
    next_q = functools.reduce(torch.minimum, target.q(batch[SampleBatch.NEW_OBS], next_actions))
    return _bootstrap(batch, next_q - alpha * next_logp)


def _discrete_target(
    target: sac_networks.SACModel, batch: dict[str, torch.Tensor], alpha: torch.Tensor, next_logits: torch.Tensor
) -> torch.Tensor:
    """The soft n-step target: the exact expectation over the next state's legal actions of twin-min target Q
    minus alpha log pi; a state with no legal action is worth 0."""
    next_mask = batch.get(SampleBatch.NEXT_ACTION_MASK)
    next_probs, next_logp_all = _legal_probs(next_logits, next_mask)
    next_q = functools.reduce(torch.minimum, target.q_all(batch[SampleBatch.NEW_OBS]))
    next_value = (next_probs * (next_q - alpha * next_logp_all)).sum(-1)
    if next_mask is not None:
        next_value = torch.where(next_mask.bool().any(-1), next_value, torch.zeros_like(next_value))
    return _bootstrap(batch, next_value)


def _discrete(
    model: sac_networks.SACModel, target: sac_networks.SACModel, batch: dict[str, torch.Tensor], alpha: torch.Tensor
) -> tuple[torch.Tensor, ...]:
    obs, new_obs = batch[SampleBatch.OBS], batch[SampleBatch.NEW_OBS]
    logits, next_logits = model.dist_inputs(torch.cat([obs, new_obs])).chunk(2)
    probs, logp_all = _legal_probs(logits, batch.get(SampleBatch.ACTION_MASK))
    with torch.no_grad():
        q_target = _discrete_target(target, batch, alpha, next_logits)
    q_all = model.q_all(obs)
    actions = batch[SampleBatch.ACTIONS].long().unsqueeze(1)
    q_values = [q.gather(1, actions).squeeze(1) for q in q_all]
    # The critics' values enter the actor's term detached: it moves the actor only.
    min_q = functools.reduce(torch.minimum, q_all).detach()
    actor_loss = (probs * (alpha * logp_all - min_q)).sum(-1).mean()
    logp = (probs * logp_all).sum(-1).detach()
    return _critic_loss(q_values, q_target, batch), actor_loss, logp, q_values[0], q_target


def _legal_probs(logits: torch.Tensor, mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The probabilities and log-probabilities of each action within ``mask`` (None: all legal); illegal
    actions' log-probabilities are 0 (their probabilities are), so that products with them stay finite."""
    if mask is None:
        logp = nn.functional.log_softmax(logits, dim=-1)
        return logp.exp(), logp
    legal = mask.reshape(logits.shape).bool()
    logp = nn.functional.log_softmax(mask_logits(logits, legal), dim=-1)
    logp = torch.where(legal, logp, torch.zeros_like(logp))
    return torch.where(legal, logp.exp(), torch.zeros_like(logp)), logp


def _sizes(config: SACConfig) -> dict[str, Any]:
    """The sizes and settings :class:`~flowrl.policy.sac_networks.SACModel` takes, read from the config."""
    return {
        "actor_hiddens": config.actor_hiddens,
        "critic_hiddens": config.critic_hiddens,
        "twin_q": config.twin_q,
        "initial_alpha": config.initial_alpha,
    }


class _ModelFactory:
    """Builds :class:`~flowrl.policy.sac_networks.SACModel` with the policy's sizes (picklable, unlike a closure)."""

    def __init__(self, config: SACConfig) -> None:
        self.config = config

    def __call__(
        self, obs_space: gym.Space[Any], action_space: gym.Space[Any], num_outputs: int, model_config: Mapping[str, Any]
    ) -> nn.Module:
        return sac_networks.SACModel(obs_space, action_space, **_sizes(self.config))


class _CustomSACModel:
    """Builds :class:`~flowrl.policy.sac_networks.SACModel` around a custom model's ``actor`` and
    ``critics`` (the SAC model interface), checking their outputs on a probe batch."""

    def __init__(self, config: SACConfig) -> None:
        self.config = config

    def __call__(self, custom: nn.Module, obs_space: gym.Space[Any], action_space: gym.Space[Any]) -> nn.Module:
        shown = f"model.custom_model {type(custom).__qualname__}"
        actor, critics = actor_and_critics(custom, STOCHASTIC_ACTOR_CRITIC, self.config.twin_q)
        wanted = len(critics)
        model = sac_networks.SACModel(obs_space, action_space, **_sizes(self.config), actor=actor, critics=critics)
        batch = 2
        wanted_shapes: list[tuple[int, ...]]
        if isinstance(action_space, gym.spaces.Discrete):
            wanted_shapes = [(batch, int(action_space.n))] * (1 + wanted)
        else:
            wanted_shapes = [(batch, 2 * int(np.prod(action_space.shape or ())))] + [(batch,)] * wanted
        try:
            with torch.random.fork_rng(devices=[]), torch.no_grad():
                obs = probe_observations(obs_space, batch)
                inputs = model.actor(obs.flatten(1))
                shapes = [tuple(inputs.shape)]
                if shapes == wanted_shapes[:1]:  # the critics are probed with the actor's actions
                    critics_out = model.q_all(obs) if model.discrete else model.q(obs, model.sample(inputs)[0])
                    shapes += [tuple(q.shape) for q in critics_out]
        except Exception as e:  # noqa: BLE001 - whatever the user's modules raise is the answer
            raise ConfigError([f"{shown}: its actor or critics raised {type(e).__name__}: {e}"]) from e
        if shapes != wanted_shapes:
            raise ConfigError(
                [
                    f"{shown}: for a batch of {batch}, its actor gives {list(shapes[0])} and its critics "
                    f"{[list(s) for s in shapes[1:]] or 'were not probed'} (wanted {list(wanted_shapes[0])} "
                    f"and {[list(s) for s in wanted_shapes[1:]]}; continuous critics' [B, 1] squeezed)"
                ]
            )
        return model


def _optimizer(policy: TorchPolicy[SACConfig]) -> torch.optim.Optimizer:
    """One Adam with a group each for the actor, the critics and log alpha, at ``actor_lr``, ``critic_lr``
    and ``alpha_lr``; a group without its own rate follows ``lr`` (its schedule, a live change)."""
    model, config = policy.model, policy.config
    assert isinstance(model, sac_networks.SACModel)
    groups = [model.actor.parameters(), model.critics.parameters(), [model.log_alpha]]
    rates = (config.actor_lr, config.critic_lr, config.alpha_lr)
    return adam(
        [
            {"params": params, "lr": config.lr if rate is None else rate, FOLLOWS_LR: rate is None}
            for params, rate in zip(groups, rates)
        ],
        policy.device,
    )


def make_sac_policy(obs_space: gym.Space[Any], action_space: gym.Space[Any], config: SACConfig) -> PolicySpec:
    """A policy with a stochastic actor, soft Q critic(s), their targets and alpha; it acts by sampling."""
    box = isinstance(action_space, gym.spaces.Box) and len(action_space.shape) == 1
    if (
        isinstance(action_space, gym.spaces.Box)
        and box
        and not np.isfinite([action_space.low, action_space.high]).all()
    ):
        raise ConfigError(
            f"SAC squashes its actions into the bounds of the action space, which must be finite; got {action_space}"
        )
    if not box and not isinstance(action_space, gym.spaces.Discrete):
        raise ConfigError(f"SAC needs a 1-D Box or a Discrete action space, got {action_space}")
    kwargs = {
        "loss_fn": sac_loss,
        "postprocess_fn": nstep_postprocess,
        "make_model": _ModelFactory(config),
        "model_interface": dataclasses.replace(STOCHASTIC_ACTOR_CRITIC, adapt=_CustomSACModel(config)),
        "make_optimizer": _optimizer,
        "td_error_fn": sac_td_error,
        "dist_kind": "squashed" if box else "auto",
        "target_network": True,
        "exploration_config": dict(config.exploration_config)
        or {"type": "StochasticSampling", "random_timesteps": config.learning_starts},
    }
    return PolicySpec(TorchPolicy, obs_space, action_space, config, kwargs)


ALGORITHM = Algorithm(
    "sac",
    "soft actor-critic (continuous and discrete actions)",
    SACConfig,
    make_sac_policy,
    dqn_execution_plan,
    make_resources=dqn_resources,
    mixed_input=True,
    live_keys=frozenset({"lr", "tau", "target_entropy"}),
    learner_group=True,
)
