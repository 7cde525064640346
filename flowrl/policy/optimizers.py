"""A policy's optimizer: Adam as flowrl makes it, and the learning rates of its parameter groups, set
before each step from the config (``lr``, or ``lr_schedule``'s value at the global timestep).

One rule covers optimizers of one rate and of several (:class:`LearningRates`): groups made at the
config's ``lr`` (:class:`~flowrl.policy.TorchPolicy`'s default optimizer, and a custom optimizer's
groups marked ``"follows_lr": True``, as SAC's are when they have no rate of their own) take the
schedule's value, as RLlib's ``lr_schedule`` replaces ``lr``, and a live ``lr``; groups an algorithm
made at rates of its own keys (DDPG's and TD3's ``actor_lr`` and ``critic_lr``, SAC's, ES's
``stepsize``) keep their proportions: each is its own rate times ``schedule(t) / max(schedule)``, so
the configured rates are those at the schedule's peak (its first value for a decay; a warm-up from 0
works too), and a live ``lr`` leaves them be.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from flowrl.deferred import torch
from flowrl.policy.devices import on_cpu
from flowrl.policy.schedules import PiecewiseSchedule

if TYPE_CHECKING:
    from flowrl.policy.policy import PolicyConfig

#: The parameter-group key (a custom optimizer's) that marks a group made at the config's ``lr``.
FOLLOWS_LR = "follows_lr"


def adam(params: Any, device: torch.device, **settings: Any) -> torch.optim.Adam:
    """``torch.optim.Adam`` over ``params`` (tensors or param groups) on ``device``, fused where PyTorch
    has a fused kernel (CPU, CUDA): one kernel per step instead of a Python loop over the tensors."""
    return torch.optim.Adam(params, fused=device.type in ("cpu", "cuda"), **settings)


class LearningRates:
    """The learning rates of ``optimizer``'s parameter groups (see the module docs for the rule).

    ``from_lr``: the groups were made at the config's ``lr`` (unless a group says otherwise with
    :data:`FOLLOWS_LR`), so a schedule gives their rate itself; otherwise each group's rate when the
    optimizer was made is its own rate, which a schedule scales.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, *, from_lr: bool) -> None:
        self.optimizer = optimizer
        #: Whether each group's rate is the config's ``lr`` (scheduled or live) rather than one of its own.
        self.follows_lr = [bool(group.get(FOLLOWS_LR, from_lr)) for group in optimizer.param_groups]
        #: Each group's rate as made: what a schedule scales when the group was not made at ``lr``.
        self.own_rates = [float(group["lr"]) for group in optimizer.param_groups]

    def scheduled(self, points: list[list[float]], timestep: float) -> list[float]:
        """Each group's rate at global timestep ``timestep`` under schedule ``points``."""
        schedule = PiecewiseSchedule(points)
        value = schedule.value(timestep)
        return [
            value if follows else rate * value / max(schedule.values)
            for follows, rate in zip(self.follows_lr, self.own_rates)
        ]

    def set(self, config: PolicyConfig, timestep: float) -> float:
        """Set each group's rate for ``timestep`` (without an ``lr_schedule`` the rates stay as they are);
        returns the first group's rate (``cur_lr``)."""
        groups = self.optimizer.param_groups
        if config.lr_schedule is not None:
            for group, rate in zip(groups, self.scheduled(config.lr_schedule, timestep)):
                group["lr"] = rate
        return self.current

    @property
    def current(self) -> float:
        """The first group's rate now (what results report as ``cur_lr``)."""
        return float(self.optimizer.param_groups[0]["lr"])

    def set_live(self, lr: float) -> None:
        """A live ``lr`` (PBT, ``Trainer.update_config``): every group made at ``lr`` takes it, its state
        (moments) kept; groups with rates of their own keep them."""
        for group, follows in zip(self.optimizer.param_groups, self.follows_lr):
            if follows:
                group["lr"] = lr

    def load_state(self, state: dict[str, Any]) -> None:
        """Load an optimizer ``state_dict``: its state (moments, step counts) is taken, its settings
        (learning rates, betas) stay this optimizer's, from its policy's config, which may override the state's."""
        settings = [{k: v for k, v in group.items() if k != "params"} for group in self.optimizer.param_groups]
        self.optimizer.load_state_dict(state)
        for group, own in zip(self.optimizer.param_groups, settings):
            group.update(own)

    def state(self) -> dict[str, Any]:
        """A snapshot of the optimizer's ``state_dict`` (the optimizer updates its tensors in place), its tensors
        on the CPU (see :func:`~flowrl.policy.devices.on_cpu`); loading moves them to the parameters' device."""
        state: dict[str, Any] = on_cpu(self.optimizer.state_dict())
        return state
