"""Conservative Q-learning (Kumar et al. 2020), from offline experiences: DQN's or SAC's TD loss plus a
penalty that lowers the Q-values of the actions the data does not take and raises those it does.

Plan: ReadOffline (n-step transitions per episode piece, shuffled) -> TrainOneStep -> UpdateTargetNetwork
-> metrics; the rollout workers' envs only evaluate. Discrete actions compose DQN (its Q network, double
Q, dueling heads, n-step Huber loss); the penalty is ``logsumexp_a Q(s, a) - Q(s, a_data)``, exact over the
(legal) actions. Continuous actions compose SAC (its actor, twin critics, alpha); each critic's
``logsumexp_a Q(s, a)`` is estimated from ``num_actions`` uniform actions and as many of the policy's at
``s`` and at ``s'``, each weighted by its density (the paper's CQL(H)); the actor may first clone the data's
actions for ``bc_iters`` updates. ``cql_alpha`` weights the penalty; ``temperature`` softens the logsumexp.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import gymnasium as gym

from flowrl.actors import PlanResources, WorkerSet
from flowrl.actors.offline_input import offline_resources
from flowrl.algorithms.dqn import dqn_loss, make_dqn_policy
from flowrl.algorithms.registry import Algorithm
from flowrl.algorithms.sac import SACConfig, make_sac_policy, sac_terms
from flowrl.config import cfg_field
from flowrl.config.data_keys import offline_only_problems
from flowrl.data import SampleBatch
from flowrl.deferred import DeferredModule, nn, torch
from flowrl.iterators import LocalIterator
from flowrl.operators import StandardMetricsReporting, TrainOneStep, UpdateTargetNetwork
from flowrl.operators.offline_ops import ReadOffline
from flowrl.policy import LossOutput, PolicySpec, TorchPolicy
from flowrl.policy.action_masks import mask_logits
from flowrl.policy.distributions import DistFactory

if TYPE_CHECKING:
    from flowrl.policy import sac_networks
else:
    sac_networks = DeferredModule("flowrl.policy.sac_networks")  # torch modules: imported when a loss runs

#: The policy coefficient counting the continuous learner's updates (``bc_iters``; saved in checkpoints).
UPDATES = "cql_updates"
#: The columns the losses read from the experiences, and why.
COLUMNS = [SampleBatch.OBS, SampleBatch.ACTIONS, SampleBatch.REWARDS, SampleBatch.NEW_OBS, SampleBatch.TERMINATEDS]
WHY = "CQL learns Q-values from (observation, action, reward, next observation, termination) transitions"


@dataclass(kw_only=True)
class CQLConfig(SACConfig):
    """CQL settings: SAC's (and through it DQN's) keys plus the conservative penalty's; ``input`` names the
    experiences.

    Discrete actions take DQN's network keys (``model.fcnet_hiddens``, ``dueling``, ``double_q``) and
    ``lr``; continuous ones SAC's (``actor_hiddens``, ``critic_hiddens``, ``twin_q``, the three rates,
    alpha's). ``target_network_update_freq`` counts rows read (0: a soft update by ``tau`` after each
    training step). The replay and exploration keys change nothing: the experiences are the replay.
    """

    #: The name errors give the algorithm by.
    algorithm_name: ClassVar[str] = "cql"

    defaults = {
        "timesteps_per_iteration": 25_600,
        "evaluation_interval": 1,
        "evaluation_num_episodes": 10,
    }
    # RLlib 2.0-2.2's CQL (rllib/algorithms/cql/cql.py over SAC): SAC's three rates, its min_q_weight
    # (cql_alpha here) and its behaviour-cloning warm-up of 20k updates.
    rllib_defaults = {
        "actor_lr": 3e-4,
        "critic_lr": 3e-4,
        "alpha_lr": 3e-4,
        "cql_alpha": 5.0,
        "bc_iters": 20_000,
    }

    cql_alpha: float = cfg_field(
        1.0,
        "Weight of the conservative penalty (logsumexp of Q over actions minus Q of the data's action), per "
        "critic. RLlib's min_q_weight.",
        min=0,
        per_policy=True,
    )
    temperature: float = cfg_field(
        1.0,
        "Temperature of the penalty's logsumexp (T * logsumexp(Q / T)): smaller values approach the max Q.",
        min=0,
        min_exclusive=True,
        per_policy=True,
    )
    num_actions: int = cfg_field(
        10,
        "Continuous actions: actions drawn per row from each of the uniform distribution, the policy at s "
        "and the policy at s' to estimate the logsumexp.",
        min=1,
        per_policy=True,
    )
    bc_iters: int = cfg_field(
        0,
        "Continuous actions: updates during which the actor clones the data's actions (maximises their "
        "log-likelihood) instead of maximising Q; the critics learn throughout.",
        min=0,
        per_policy=True,
    )

    def check(self) -> list[str]:
        return super().check() + offline_only_problems(self.input, self.algorithm_name)


def discrete_penalty(
    q_values: torch.Tensor, actions: torch.Tensor, temperature: float, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Each row's ``T * logsumexp_a(Q(s, a) / T) - Q(s, a_data)`` over the legal actions (``mask``, None:
    all), shape ``[B]``: never below ``-T log n``, and 0 when every other action's Q is ``-inf``."""
    legal = q_values if mask is None else mask_logits(q_values, mask)
    taken = q_values.gather(1, actions.long().unsqueeze(1)).squeeze(1)
    return temperature * torch.logsumexp(legal / temperature, dim=1) - taken


def continuous_penalty(
    model: sac_networks.SACModel, batch: dict[str, torch.Tensor], num_actions: int, temperature: float
) -> list[torch.Tensor]:
    """Each critic's rows' ``T * log mean_i(exp((Q(s, a_i) - log p(a_i)) / T)) - Q(s, a_data)``, shape ``[B]``,
    over ``num_actions`` actions from each of: uniform in the bounds, the policy at s, the policy at s'
    (drawn without gradient: the penalty moves the critics only)."""
    obs, new_obs = batch[SampleBatch.OBS], batch[SampleBatch.NEW_OBS]
    rows, n = obs.shape[0], num_actions
    obs_n = obs.repeat_interleave(n, 0)  # row b's n draws are rows b*n .. b*n + n-1
    with torch.no_grad():
        drawn, drawn_logp = model.sample(model.dist_inputs(torch.cat([obs_n, new_obs.repeat_interleave(n, 0)])))
        span = model.high - model.low
        uniform = torch.addcmul(model.low, torch.rand(rows * n, span.numel(), device=obs.device), span)
        uniform_logp = (-torch.log(span).sum()).expand(rows * n)
        log_density = torch.cat([uniform_logp, drawn_logp]).view(3, rows, n)
    # One pass of each critic: the 3n drawn actions of every row at s, then the data's actions.
    q_all = model.q(
        torch.cat([obs_n, obs_n, obs_n, obs]), torch.cat([uniform, drawn, batch[SampleBatch.ACTIONS].float()])
    )
    penalties = []
    for q in q_all:
        q_drawn, q_data = q[: 3 * rows * n].view(3, rows, n), q[3 * rows * n :]
        weighted = ((q_drawn - log_density) / temperature).permute(1, 0, 2).reshape(rows, 3 * n)
        penalties.append(temperature * (torch.logsumexp(weighted, dim=1) - math.log(3 * n)) - q_data)
    return penalties


def cql_dqn_loss(
    policy: TorchPolicy[Any], model: nn.Module, dist_class: DistFactory, batch: dict[str, torch.Tensor]
) -> LossOutput:
    """DQN's n-step Huber loss plus ``cql_alpha`` times the mean :func:`discrete_penalty`."""
    config: CQLConfig = policy.config  # the policy is DQN's (TorchPolicy's config type is invariant)
    base = dqn_loss(policy, model, dist_class, batch)
    q_values, _ = model(batch[SampleBatch.OBS])
    penalty = discrete_penalty(
        q_values, batch[SampleBatch.ACTIONS], config.temperature, batch.get(SampleBatch.ACTION_MASK)
    ).mean()
    stats = {**base.stats, "cql_penalty": float(penalty.detach())}
    return LossOutput(base.loss + config.cql_alpha * penalty, stats, base.td_error)


def cql_sac_loss(
    policy: TorchPolicy[Any], model: nn.Module, dist_class: DistFactory, batch: dict[str, torch.Tensor]
) -> LossOutput:
    """SAC's three losses plus ``cql_alpha`` times each critic's mean :func:`continuous_penalty`; for the
    first ``bc_iters`` updates the actor's loss is ``-log pi(a_data | s)`` instead."""
    config: CQLConfig = policy.config  # the policy is SAC's
    terms = sac_terms(policy, model, batch)
    assert isinstance(model, sac_networks.SACModel)
    penalty = functools.reduce(
        torch.add, [p.mean() for p in continuous_penalty(model, batch, config.num_actions, config.temperature)]
    )
    updates = policy.coeffs[UPDATES]
    policy.coeffs[UPDATES] = updates + 1
    actor_loss = terms.actor_loss
    if updates < config.bc_iters:
        obs, actions = batch[SampleBatch.OBS], batch[SampleBatch.ACTIONS].float()
        actor_loss = -model.logp(model.dist_inputs(obs), actions).mean()
    reported = {
        "critic_loss": terms.critic_loss,
        "actor_loss": actor_loss,
        "alpha_loss": terms.alpha_loss,
        "alpha": terms.alpha,
        "entropy": -terms.logp.mean(),
        "mean_q": terms.q_taken.mean(),
        "cql_penalty": penalty,
    }
    stats = dict(zip(reported, torch.stack(list(reported.values())).detach().tolist()))  # one conversion
    loss = terms.critic_loss + config.cql_alpha * penalty + actor_loss + terms.alpha_loss
    return LossOutput(loss, stats)


def make_cql_policy(obs_space: gym.Space[Any], action_space: gym.Space[Any], config: CQLConfig) -> PolicySpec:
    """DQN's policy with :func:`cql_dqn_loss` for Discrete actions; SAC's with :func:`cql_sac_loss` otherwise."""
    if isinstance(action_space, gym.spaces.Discrete):
        spec, loss = make_dqn_policy(obs_space, action_space, config), cql_dqn_loss
    else:
        spec, loss = make_sac_policy(obs_space, action_space, config), cql_sac_loss
    return dataclasses.replace(spec, kwargs={**spec.kwargs, "loss_fn": loss, "coeffs": {UPDATES: 0.0}})


def make_resources(workers: WorkerSet, config: CQLConfig) -> PlanResources:
    """The experiences of ``input``, opened and checked against the run, and the learner group the config asks for."""
    return offline_resources(workers, config, algorithm=config.algorithm_name, columns=COLUMNS, why=WHY)


def execution_plan(workers: WorkerSet, config: CQLConfig, resources: PlanResources) -> LocalIterator[dict[str, Any]]:
    """ReadOffline (n-step transitions, shuffled) -> TrainOneStep -> UpdateTargetNetwork -> metrics."""
    batches = ReadOffline(resources.offline, workers, config)
    train = batches.for_each(TrainOneStep(workers, resources=resources))
    train = train.for_each(UpdateTargetNetwork(workers, config, resources=resources))
    return StandardMetricsReporting(train, workers, config)


ALGORITHM = Algorithm(
    "cql",
    "conservative Q-learning from offline experiences (over DQN or SAC)",
    CQLConfig,
    make_cql_policy,
    execution_plan,
    make_resources=make_resources,
    live_keys=frozenset({"lr", "tau", "cql_alpha"}),
    learner_group=True,
    offline=True,
)
