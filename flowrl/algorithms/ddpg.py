"""DDPG and TD3: deterministic actor-critic for continuous actions, on DQN's replay plan.

TD3 (Fujimoto et al. 2018) is DDPG with twin critics (the smaller target Q), target policy
smoothing (clipped noise on the target action) and delayed actor updates. Both use soft
target updates (``tau``) after every training step.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Mapping

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
from flowrl.policy.custom_model import ModelInterface, actor_and_critics, probe_observations
from flowrl.policy.distributions import DistFactory
from flowrl.policy.optimizers import adam
from flowrl.policy.postprocessing import DISCOUNTS

if TYPE_CHECKING:
    from flowrl.policy import networks
else:
    networks = DeferredModule("flowrl.policy.networks")  # torch modules: imported when a policy is built

ACTOR_STEPS = "actor_steps"
#: What a custom model of DDPG and TD3 provides (see :mod:`flowrl.policy.custom_model`).
DETERMINISTIC_ACTOR_CRITIC = ModelInterface(
    "deterministic actor-critic",
    "actor: flat obs [B, obs_dim] -> [B, action_dim] (before tanh into the bounds); critics: nn.ModuleList of "
    "[B, obs_dim + action_dim] -> [B, 1] (two for twin_q)",
)


@dataclass(kw_only=True)
class DDPGConfig(DQNConfig):
    """DDPG settings: DQN's replay keys plus actor/critic sizes, learning rates and noise.

    Soft target updates (``tau``) after every training step (``target_network_update_freq`` 0).
    An empty ``exploration_config`` (the default) is derived from ``exploration_noise`` and
    ``learning_starts`` (uniform random actions until then, then Gaussian noise); it may instead
    name a ``GaussianNoise`` or an ``OrnsteinUhlenbeckNoise`` with its options.
    """

    #: RLlib's default exploration for this algorithm, into which an RLlib ``exploration_config``
    #: without a type is merged (see :mod:`flowrl.config.rllib`).
    rllib_exploration: ClassVar[Mapping[str, Any]] = {
        "type": "OrnsteinUhlenbeckNoise",
        "random_timesteps": 1000,
        "ou_base_scale": 0.1,
        "ou_theta": 0.15,
        "ou_sigma": 0.2,
        "initial_scale": 1.0,
        "final_scale": 0.02,
        "scale_timesteps": 10000,
    }

    defaults = {
        "rollout_fragment_length": 1,
        "train_batch_size": 128,
        "buffer_size": 100_000,
        "n_step": 1,
        "prioritized_replay": False,
        "gamma": 0.98,
        "tau": 0.005,
        "target_network_update_freq": 0,
        "exploration_config": {},
        "grad_clip": None,
    }
    # RLlib 2.0-2.1's DDPG (rllib/algorithms/ddpg/ddpg.py), whose keys RLlib's DDPG tuned example uses;
    # 1.13 (rllib/agents/ddpg/ddpg.py) had the same values, 2.2 made rollout_fragment_length 'auto'.
    rllib_defaults = {
        "train_batch_size": 256,
        "gamma": 0.99,
        "buffer_size": 50_000,
        "learning_starts": 1500,
        "prioritized_replay": True,
        "tau": 0.002,
        "actor_hiddens": [400, 300],
        "critic_hiddens": [400, 300],
        "l2_reg": 1e-6,
        "exploration_config": dict(rllib_exploration),
    }

    actor_hiddens: list[int] = cfg_field([256, 256], "Hidden layer sizes of the actor (ReLU).", per_policy=True)
    critic_hiddens: list[int] = cfg_field([256, 256], "Hidden layer sizes of each critic (ReLU).", per_policy=True)
    actor_lr: float = cfg_field(1e-3, "Adam learning rate of the actor.", min=0, min_exclusive=True, per_policy=True)
    critic_lr: float = cfg_field(
        1e-3, "Adam learning rate of the critic(s).", min=0, min_exclusive=True, per_policy=True
    )
    twin_q: bool = cfg_field(False, "Two critics; targets use the smaller (TD3).", per_policy=True)
    policy_delay: int = cfg_field(1, "Critic updates per actor update (TD3: 2).", min=1, per_policy=True)
    smooth_target_policy: bool = cfg_field(False, "Add clipped noise to target actions (TD3).", per_policy=True)
    target_noise: float = cfg_field(
        0.2, "Std of the target policy noise, in units of the action range's half-width.", min=0, per_policy=True
    )
    target_noise_clip: float = cfg_field(0.5, "Clip of the target policy noise (same units).", min=0, per_policy=True)
    exploration_noise: float = cfg_field(
        0.1, "Std of the Gaussian noise added to actions while sampling (action units).", min=0, per_policy=True
    )
    use_huber: bool = cfg_field(
        False, "Critic loss: the Huber loss of the TD error instead of its square.", per_policy=True
    )
    huber_threshold: float = cfg_field(
        1.0,
        "With use_huber: the TD error where the loss turns from quadratic to linear.",
        min=0,
        min_exclusive=True,
        per_policy=True,
    )
    l2_reg: float = cfg_field(
        0.0,
        "L2 regularization: l2_reg * sum(w^2) / 2 over the actor's weights (not biases) is added to its loss, "
        "and over the critics' to theirs. 0: none.",
        min=0,
        per_policy=True,
    )

    def check(self) -> list[str]:
        problems = super().check()
        kind = self.exploration_config.get("type")
        if self.exploration_config and kind not in ("GaussianNoise", "OrnsteinUhlenbeckNoise"):
            problems.append(
                f"exploration_config type={kind!r}: DDPG and TD3 explore with 'GaussianNoise' or "
                "'OrnsteinUhlenbeckNoise' (or leave it empty: Gaussian noise of exploration_noise)"
            )
        return problems


@dataclass(kw_only=True)
class TD3Config(DDPGConfig):
    """TD3: DDPG with twin critics, target policy smoothing and delayed actor updates."""

    defaults = {"twin_q": True, "policy_delay": 2, "smooth_target_policy": True}
    rllib_exploration: ClassVar[Mapping[str, Any]] = {
        "type": "GaussianNoise",
        "random_timesteps": 10000,
        "stddev": 0.1,
        "initial_scale": 1.0,
        "final_scale": 1.0,
        "scale_timesteps": 1,
    }
    # RLlib 2.0-2.1's TD3 (rllib/algorithms/td3/td3.py over DDPG's), whose keys RLlib's TD3 tuned example
    # uses; 1.13 (rllib/agents/ddpg/td3.py) had the same values, 2.2 made rollout_fragment_length 'auto'.
    rllib_defaults = {
        "train_batch_size": 100,
        "gamma": 0.99,
        "buffer_size": 1_000_000,
        "learning_starts": 10_000,
        "actor_hiddens": [400, 300],
        "critic_hiddens": [400, 300],
        "exploration_config": dict(rllib_exploration),
    }


def critic_target(policy: TorchPolicy[DDPGConfig], batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Each row's n-step critic target, without gradient: the reward plus the discounted (twin-min) target Q
    of the target actor's (smoothed, for TD3) next action, unless the episode terminated."""
    config, target = policy.config, policy.target_model
    assert isinstance(target, networks.ActorCritics)
    new_obs = batch[SampleBatch.NEW_OBS]
    with torch.no_grad():
        next_actions = target.act(new_obs)
        if config.smooth_target_policy:
            noise = (torch.randn_like(next_actions) * config.target_noise).clamp_(
                -config.target_noise_clip, config.target_noise_clip
            )
            next_actions = torch.addcmul(next_actions, noise, target.half_range).clamp_(target.low, target.high)
        next_q = functools.reduce(torch.minimum, target.q(new_obs, next_actions))
        # Bootstrap unless the episode terminated (a truncated one goes on).
        next_q = next_q.masked_fill(batch[SampleBatch.TERMINATEDS].bool(), 0.0)
        return torch.addcmul(batch[SampleBatch.REWARDS], batch[DISCOUNTS], next_q)


def ddpg_td_error(policy: TorchPolicy[DDPGConfig], batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Each row's n-step TD error of the (first) critic, as the loss computes it, without its side effects
    (it counts actor steps): worker-side priorities."""
    model = policy.model
    assert isinstance(model, networks.ActorCritics)
    with torch.no_grad():
        q = model.q(batch[SampleBatch.OBS], batch[SampleBatch.ACTIONS].float())[0]
    return q - critic_target(policy, batch)


def ddpg_loss(
    policy: TorchPolicy[DDPGConfig],
    model: nn.Module,
    dist_class: DistFactory,
    batch: dict[str, torch.Tensor],
) -> LossOutput:
    """Critic: n-step TD on (twin-min) target Q; actor (every ``policy_delay`` steps): maximise Q(s, pi(s)).

    TD errors come back only with prioritized replay: nothing else reads them.
    """
    config = policy.config
    assert isinstance(model, networks.ActorCritics)
    obs = batch[SampleBatch.OBS]
    q_target = critic_target(policy, batch)
    q_values = model.q(obs, batch[SampleBatch.ACTIONS].float())
    if config.use_huber:
        errors = [
            nn.functional.huber_loss(q, q_target, reduction="none", delta=config.huber_threshold) for q in q_values
        ]
    else:
        errors = [(q - q_target).square() for q in q_values]
    weights = batch.get(SampleBatch.WEIGHTS)
    critic_loss = functools.reduce(torch.add, [(e if weights is None else weights * e).mean() for e in errors])
    if config.l2_reg:
        critic_loss = critic_loss + _l2(model.critics, config.l2_reg)
    loss = critic_loss
    reported = {"critic_loss": critic_loss, "mean_q": q_values[0].mean()}
    policy.coeffs[ACTOR_STEPS] = policy.coeffs.get(ACTOR_STEPS, 0) + 1
    if int(policy.coeffs[ACTOR_STEPS]) % config.policy_delay == 0:
        # The actor's gradient must not move the critic: its weights take no gradient while
        # Q(s, pi(s)) is recorded (the critic loss above was recorded with them taking one).
        critic = model.critics[0]
        trainable = [p for p in critic.parameters() if p.requires_grad]
        for p in trainable:
            p.requires_grad_(False)
        try:
            actor_loss = -critic(torch.cat([obs.flatten(1), model.act(obs)], dim=1)).mean()
        finally:
            for p in trainable:
                p.requires_grad_(True)
        if config.l2_reg:
            actor_loss = actor_loss + _l2(model.actor, config.l2_reg)
        loss = loss + actor_loss
        reported["actor_loss"] = actor_loss
    stats = dict(
        zip(reported, torch.stack(list(reported.values())).detach().tolist())
    )  # one conversion, not an .item() each
    td_error = q_values[0] - q_target if config.prioritized_replay else None
    return LossOutput(loss, stats, td_error)


def _l2(module: nn.Module, coeff: float) -> torch.Tensor | float:
    """``coeff * sum(w^2) / 2`` over the weights (not the biases) of ``module`` (RLlib's DDPG l2_reg)."""
    return coeff * 0.5 * sum(p.pow(2).sum() for name, p in module.named_parameters() if not name.endswith("bias"))


def _sizes(config: DDPGConfig) -> dict[str, Any]:
    """The network sizes :class:`~flowrl.policy.networks.ActorCritics` takes, read from the config."""
    return {"actor_hiddens": config.actor_hiddens, "critic_hiddens": config.critic_hiddens, "twin_q": config.twin_q}


class _ModelFactory:
    """Builds :class:`~flowrl.policy.networks.ActorCritics` with the policy's sizes (picklable, unlike a closure)."""

    def __init__(self, config: DDPGConfig) -> None:
        self.config = config

    def __call__(
        self, obs_space: gym.Space[Any], action_space: gym.Space[Any], num_outputs: int, model_config: Mapping[str, Any]
    ) -> nn.Module:
        assert isinstance(action_space, gym.spaces.Box)  # make_ddpg_policy refuses other action spaces
        return networks.ActorCritics(obs_space, action_space, **_sizes(self.config))


class _CustomActorCritics:
    """Builds :class:`~flowrl.policy.networks.ActorCritics` around a custom model's ``actor`` and
    ``critics`` (the DDPG model interface), checking their outputs on a probe batch."""

    def __init__(self, config: DDPGConfig) -> None:
        self.config = config

    def __call__(self, custom: nn.Module, obs_space: gym.Space[Any], action_space: gym.Space[Any]) -> nn.Module:
        assert isinstance(action_space, gym.spaces.Box)  # make_ddpg_policy refuses other action spaces
        shown = f"model.custom_model {type(custom).__qualname__}"
        actor, critics = actor_and_critics(custom, DETERMINISTIC_ACTOR_CRITIC, self.config.twin_q)
        wanted = len(critics)
        model = networks.ActorCritics(obs_space, action_space, **_sizes(self.config), actor=actor, critics=critics)
        batch, act_dim = 2, int(np.prod(action_space.shape))
        try:
            with torch.random.fork_rng(devices=[]), torch.no_grad():
                obs = probe_observations(obs_space, batch)
                shapes = [tuple(model.actor(obs.flatten(1)).shape)] + [
                    tuple(q.shape) for q in model.q(obs, model.act(obs))
                ]
        except Exception as e:  # noqa: BLE001 - whatever the user's modules raise is the answer
            raise ConfigError([f"{shown}: its actor or critics raised {type(e).__name__}: {e}"]) from e
        if shapes != [(batch, act_dim)] + [(batch,)] * wanted:
            raise ConfigError(
                [
                    f"{shown}: for a batch of {batch}, its actor gives {list(shapes[0])} (wanted [{batch}, {act_dim}]) "
                    f"and its critics {[list(s) for s in shapes[1:]]} after squeezing (wanted [{batch}, 1] each)"
                ]
            )
        return model


def _optimizer(policy: TorchPolicy[DDPGConfig]) -> torch.optim.Optimizer:
    model = policy.model
    assert isinstance(model, networks.ActorCritics)
    return adam(
        [
            {"params": model.actor.parameters(), "lr": policy.config.actor_lr},
            {"params": model.critics.parameters(), "lr": policy.config.critic_lr},
        ],
        policy.device,
    )


def make_ddpg_policy(obs_space: gym.Space[Any], action_space: gym.Space[Any], config: DDPGConfig) -> PolicySpec:
    """A TorchPolicy with an actor, critic(s), their targets, and deterministic acting plus Gaussian noise."""
    if not isinstance(action_space, gym.spaces.Box):
        raise ConfigError(f"DDPG and TD3 need a continuous (Box) action space, got {action_space}")
    kwargs = {
        "loss_fn": ddpg_loss,
        "postprocess_fn": nstep_postprocess,
        "make_model": _ModelFactory(config),
        "model_interface": dataclasses.replace(DETERMINISTIC_ACTOR_CRITIC, adapt=_CustomActorCritics(config)),
        "make_optimizer": _optimizer,
        "dist_kind": "deterministic",
        "target_network": True,
        "td_error_fn": ddpg_td_error,
        "exploration_config": dict(config.exploration_config)
        or {
            "type": "GaussianNoise",
            "stddev": config.exploration_noise,
            "random_timesteps": config.learning_starts,
        },
    }
    return PolicySpec(TorchPolicy, obs_space, action_space, config, kwargs)


DDPG = Algorithm(
    "ddpg",
    "deep deterministic policy gradient",
    DDPGConfig,
    make_ddpg_policy,
    dqn_execution_plan,
    make_resources=dqn_resources,
    mixed_input=True,
    learner_group=True,
)
TD3 = Algorithm(
    "td3",
    "twin delayed DDPG",
    TD3Config,
    make_ddpg_policy,
    dqn_execution_plan,
    make_resources=dqn_resources,
    mixed_input=True,
    learner_group=True,
)
ALGORITHM = DDPG
