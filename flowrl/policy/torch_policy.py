"""A PyTorch policy driven by a loss function, so an algorithm writes only its loss."""

from __future__ import annotations

import copy
from typing import Any, Callable, Mapping

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from flowrl.data import SampleBatch
from flowrl.policy.distributions import ActionDistribution, dist_class_for
from flowrl.policy.exploration import StochasticSampling, make_exploration
from flowrl.policy.models import ActorCriticModel, model_config, obs_to_tensor
from flowrl.policy.numpy_inference import NumpyActorCritic, sample_numpy
from flowrl.policy.policy import ModelWeights, Policy

TensorBatch = dict[str, torch.Tensor]
LossFn = Callable[["TorchPolicy", nn.Module, type[ActionDistribution], TensorBatch], tuple[torch.Tensor, dict[str, float]]]
PostprocessFn = Callable[["TorchPolicy", SampleBatch], SampleBatch]
ModelFn = Callable[[gym.Space, gym.Space, int, Mapping[str, Any]], nn.Module]
OptimizerFn = Callable[["TorchPolicy"], torch.optim.Optimizer]
_NOT_BUILT = object()


def default_model(obs_space: gym.Space, action_space: gym.Space, num_outputs: int, config: Mapping[str, Any]) -> nn.Module:
    """An :class:`~flowrl.policy.models.ActorCriticModel` as configured."""
    return ActorCriticModel(obs_space, num_outputs, config)


class TorchPolicy(Policy):
    """A policy whose learning is given by ``loss_fn(policy, model, dist_class, batch)``.

    ``loss_fn`` returns ``(loss, stats)``; ``batch`` maps column names to tensors on the
    policy's device. ``postprocess_fn(policy, trajectory)`` adds derived columns.
    ``make_model(obs_space, action_space, num_outputs, model_config)`` must return a module
    whose ``forward(obs)`` gives ``(dist_inputs, values)`` (values may be ``None``).

    Config keys read: ``lr`` (5e-4), ``model`` (see :mod:`flowrl.policy.models`),
    ``grad_clip`` (None: no clipping), ``explore`` (True), ``exploration_config``
    (``{"type": "StochasticSampling"}``), ``num_gpus`` (0), ``seed``.
    Algorithm-owned scalars that must survive checkpoints (e.g. PPO's KL coefficient)
    live in ``policy.coeffs``. With ``target_network=True`` the policy keeps a frozen copy
    of its model in ``target_model``, moved by :meth:`update_target` (DQN, DDPG, TD3).
    """

    def __init__(
        self,
        observation_space: gym.Space,
        action_space: gym.Space,
        config: Mapping[str, Any],
        *,
        loss_fn: LossFn,
        postprocess_fn: PostprocessFn | None = None,
        make_model: ModelFn = default_model,
        make_optimizer: OptimizerFn | None = None,
        dist_kind: str = "auto",
        coeffs: Mapping[str, float] | None = None,
        target_network: bool = False,
    ) -> None:
        super().__init__(observation_space, action_space, config)
        use_gpu = float(self.config.get("num_gpus", 0)) > 0 and torch.cuda.is_available()
        self.device = torch.device("cuda" if use_gpu else "cpu")
        self.dist_class, num_outputs = dist_class_for(action_space, dist_kind)
        self.model = make_model(observation_space, action_space, num_outputs, model_config(self.config.get("model"))).to(self.device)
        self.target_model: nn.Module | None = None
        if target_network:
            self.target_model = copy.deepcopy(self.model)
            self.target_model.requires_grad_(False)
        self.loss_fn = loss_fn
        self.postprocess_fn = postprocess_fn
        self.optimizer = (make_optimizer or self._default_optimizer)(self)
        self.exploration = make_exploration(
            action_space,
            self.config.get("exploration_config"),
            self.config.get("seed"),
            worker_index=int(self.config.get("worker_index", 0)),
            num_workers=int(self.config.get("num_workers", 0)),
        )
        self.explore = bool(self.config.get("explore", True))
        self.coeffs: dict[str, float] = dict(coeffs or {})
        self._numpy_model: NumpyActorCritic | None | object = _NOT_BUILT
        self._np_rng = np.random.default_rng(self.config.get("seed"))

    @staticmethod
    def _default_optimizer(policy: "TorchPolicy") -> torch.optim.Optimizer:
        return torch.optim.Adam(policy.model.parameters(), lr=float(policy.config.get("lr", 5e-4)))

    # -- acting ----------------------------------------------------------------------

    def _forward(self, obs_batch: np.ndarray) -> tuple[torch.Tensor, torch.Tensor | None]:
        out = self.model(obs_to_tensor(obs_batch, self.observation_space, self.device))
        return out if isinstance(out, tuple) else (out, None)

    def _numpy_twin(self) -> NumpyActorCritic | None:
        if self._numpy_model is _NOT_BUILT:
            self._numpy_model = NumpyActorCritic.build(self.model, self.observation_space)
        return self._numpy_model  # type: ignore[return-value]

    def compute_actions(
        self, obs_batch: np.ndarray, *, explore: bool | None = None, timestep: int | None = None
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        explore = self.explore if explore is None else explore
        timestep = self.global_timestep if timestep is None else timestep
        twin = self._numpy_twin() if type(self.exploration) is StochasticSampling else None
        if twin is not None:
            # Small MLP policies act faster in NumPy than through PyTorch's dispatch.
            dist_inputs_np, values_np = twin.forward(obs_batch)
            sampled = sample_numpy(self.dist_class, dist_inputs_np, explore, self._np_rng)
            if sampled is not None:
                self.exploration.last_timestep = timestep
                actions_np, logp_np = sampled
                extra = {SampleBatch.ACTION_LOGP: logp_np, SampleBatch.ACTION_DIST_INPUTS: dist_inputs_np}
                if values_np is not None:
                    extra[SampleBatch.VF_PREDS] = values_np
                return actions_np, extra
        with torch.inference_mode():
            dist_inputs, values = self._forward(obs_batch)
            actions, logp = self.exploration.get_action(self.dist_class(dist_inputs), timestep=timestep, explore=explore)
            extra = {
                SampleBatch.ACTION_LOGP: logp.cpu().numpy(),
                SampleBatch.ACTION_DIST_INPUTS: dist_inputs.cpu().numpy(),
            }
            if values is not None:
                extra[SampleBatch.VF_PREDS] = values.cpu().numpy()
            return actions.cpu().numpy(), extra

    def value(self, obs_batch: np.ndarray) -> np.ndarray:
        """State values for a batch of observations (models with a value head)."""
        twin = self._numpy_twin()
        if twin is not None and twin.value_head is not None:
            return twin.value(obs_batch)
        with torch.inference_mode():
            _, values = self._forward(obs_batch)
        if values is None:
            raise TypeError(f"{type(self.model).__name__} has no value head")
        return values.cpu().numpy()

    def postprocess_trajectory(self, batch: SampleBatch) -> SampleBatch:
        return self.postprocess_fn(self, batch) if self.postprocess_fn is not None else batch

    # -- learning --------------------------------------------------------------------

    def to_tensors(self, batch: SampleBatch) -> TensorBatch:
        """The batch's columns as tensors on the policy's device (observations preprocessed)."""
        batch.decompress_if_needed()
        tensors: TensorBatch = {}
        for key, value in batch.items():
            if not value.flags.writeable:
                value = value.copy()  # batches from Ray's object store are read-only; torch needs writable memory
            if key in (SampleBatch.OBS, SampleBatch.NEW_OBS):
                tensors[key] = obs_to_tensor(value, self.observation_space, self.device)
            elif value.dtype.kind in "biuf":
                tensors[key] = torch.as_tensor(value, device=self.device)
        return tensors

    def _loss(self, batch: SampleBatch) -> tuple[torch.Tensor, dict[str, float]]:
        self.model.train()
        loss, stats = self.loss_fn(self, self.model, self.dist_class, self.to_tensors(batch))
        self.optimizer.zero_grad()
        loss.backward()
        stats = dict(stats)
        grad_clip = self.config.get("grad_clip")
        if grad_clip is not None:
            stats["grad_gnorm"] = float(nn.utils.clip_grad_norm_(self.model.parameters(), float(grad_clip)))
        return loss, stats

    def learn_on_batch(self, batch: SampleBatch) -> dict[str, float]:
        _, stats = self._loss(batch)
        self.optimizer.step()
        return stats

    def compute_gradients(self, batch: SampleBatch) -> tuple[list[np.ndarray], dict[str, float]]:
        _, stats = self._loss(batch)
        grads = [
            p.grad.detach().cpu().numpy().copy() if p.grad is not None else np.zeros(tuple(p.shape), np.float32)
            for p in self.model.parameters()
        ]
        return grads, stats

    def apply_gradients(self, gradients: list[np.ndarray]) -> None:
        params = list(self.model.parameters())
        if len(gradients) != len(params):
            raise ValueError(f"got {len(gradients)} gradients for {len(params)} parameters")
        for p, g in zip(params, gradients):
            p.grad = torch.tensor(g, device=self.device).reshape(p.shape)  # a copy: Ray hands out read-only arrays
        self.optimizer.step()

    def update_target(self, tau: float = 1.0) -> None:
        """Move the target network towards the model: copy it (``tau=1``) or blend by ``tau``."""
        if self.target_model is None:
            raise TypeError("this policy was built without a target network (target_network=True)")
        with torch.no_grad():
            for target, source in zip(self.target_model.state_dict().values(), self.model.state_dict().values()):
                if tau >= 1.0 or not target.is_floating_point():
                    target.copy_(source)
                else:
                    target.lerp_(source, tau)

    # -- state -----------------------------------------------------------------------

    def get_weights(self) -> ModelWeights:
        return {k: v.detach().cpu().numpy().copy() for k, v in self.model.state_dict().items()}

    def set_weights(self, weights: ModelWeights) -> None:
        # torch.tensor copies: arrays from Ray's object store are read-only.
        self.model.load_state_dict({k: torch.tensor(v) for k, v in weights.items()})

    def get_state(self) -> dict[str, Any]:
        return {
            **super().get_state(),
            # A snapshot: the optimizer updates its state tensors in place.
            "optimizer": copy.deepcopy(self.optimizer.state_dict()),
            "exploration": self.exploration.get_state(),
            "coeffs": dict(self.coeffs),
            "np_rng": copy.deepcopy(self._np_rng.bit_generator.state),
            "target": None if self.target_model is None else copy.deepcopy(self.target_model.state_dict()),
        }

    def set_state(self, state: Mapping[str, Any]) -> None:
        super().set_state(state)
        self.optimizer.load_state_dict(state["optimizer"])
        self.exploration.set_state(state["exploration"])
        self.coeffs = dict(state["coeffs"])
        if "np_rng" in state:
            self._np_rng.bit_generator.state = state["np_rng"]
        if self.target_model is not None and state.get("target") is not None:
            self.target_model.load_state_dict(state["target"])
