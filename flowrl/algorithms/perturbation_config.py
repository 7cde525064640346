"""The config keys the perturbation searches (ES, ARS) share."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from flowrl.config import TrainerConfig, cfg_field


@dataclass(kw_only=True)
class PerturbationConfig(TrainerConfig):
    """Keys shared by the perturbation searches (ES, ARS); see :class:`~flowrl.config.TrainerConfig` for the rest."""

    filters_observations_in_model: ClassVar[bool] = (
        True  # the observation statistics live in the PerturbableModel's buffers
    )

    num_envs_per_worker: int = cfg_field(
        1, "Each worker runs one episode at a time in one env: must be 1.", min=1, max=1
    )
    noise_stdev: float = cfg_field(
        0.02, "sigma: std of the parameter perturbations theta +- sigma * eps.", min=0, min_exclusive=True
    )
    noise_table_size: int = cfg_field(
        25_000_000,
        "float32 values in the shared noise table (4 bytes each, in Ray's object store once); must be at least "
        "the number of policy parameters.",
        min=1,
    )
    eval_prob: float = cfg_field(
        0.1,
        "Probability, after each antithetic pair, of one episode of the unperturbed weights; those episodes are "
        "what episode_reward_mean reports. 0: never (it stays NaN).",
        min=0,
        max=1,
    )
    observation_filter: Literal["NoFilter", "MeanStdFilter"] = cfg_field(
        "MeanStdFilter",
        "'MeanStdFilter': normalize observations by the running mean and std of those seen in perturbed episodes "
        "(kept in the model's buffers, so checkpoints and evaluation use it). 'NoFilter': raw observations.",
    )
    explore: bool = cfg_field(
        False, "Must stay False: ES and ARS act deterministically; the perturbations explore.", per_policy=True
    )
    # ES and ARS have their own step sizes; None keeps TrainerConfig's lr from applying to them.
    lr: float | None = cfg_field(  # type: ignore[assignment]
        None,
        "Not used: ES steps with stepsize, ARS with sgd_stepsize; leave unset.",
        min=0,
        min_exclusive=True,
        per_policy=True,
    )

    def check(self) -> list[str]:
        problems = super().check()
        if self.explore:
            problems.append(
                "explore=True: ES and ARS act deterministically (the weight perturbations explore); set explore=False"
            )
        if self.lr is not None:
            problems.append(f"lr={self.lr} is not used by {type(self).__name__}; set its step size key instead")
        return problems
