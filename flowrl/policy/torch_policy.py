"""A PyTorch policy driven by a loss function, so an algorithm writes only its loss."""

from __future__ import annotations

import copy
import math
from typing import TYPE_CHECKING, Any, Mapping, Sequence, cast

import gymnasium as gym
import numpy as np

from flowrl.data import SampleBatch
from flowrl.deferred import DeferredModule, nn, torch
from flowrl.envs.flatten import model_space
from flowrl.errors import ConfigError
from flowrl.policy.custom_model import ACTOR_CRITIC, ModelInterface, build_custom_model
from flowrl.policy.devices import on_cpu
from flowrl.policy.distributions import DistFactory, dist_class_for
from flowrl.policy.exploration import StochasticSampling, make_exploration
from flowrl.policy.model_options import model_config
from flowrl.policy.optimizers import LearningRates, adam
from flowrl.policy.policy import NONFINITE_UPDATE, ConfigT, LearnOutput, ModelWeights, Policy
from flowrl.policy.torch_hooks import (
    GradientSync,
    LossFn,
    LossOutput,
    ModelFn,
    OptimizerFn,
    PostprocessFn,
    TDErrorFn,
    TensorBatch,
)

# LossOutput lives in torch_hooks; it is still importable from here, where it was first.
__all__ = ["RECURRENT_ALGORITHMS", "LossOutput", "TorchPolicy", "default_model"]

if TYPE_CHECKING:
    from flowrl.policy import models, numpy_inference, recurrent
    from flowrl.policy import target_network as target_network_module
    from flowrl.policy.numpy_inference import NumpyActorCritic, NumpyRecurrentActorCritic
else:  # torch modules: imported when the first policy is built
    models = DeferredModule("flowrl.policy.models")
    numpy_inference = DeferredModule("flowrl.policy.numpy_inference")
    recurrent = DeferredModule("flowrl.policy.recurrent")
    target_network_module = DeferredModule("flowrl.policy.target_network")

_NOT_BUILT = object()
#: The algorithms that learn with a recurrent model (``model.use_lstm``): their losses read sequences.
RECURRENT_ALGORITHMS = ("ppo", "pg", "a2c", "a3c", "impala", "appo")


def default_model(
    obs_space: gym.Space[Any], action_space: gym.Space[Any], num_outputs: int, config: Mapping[str, Any]
) -> nn.Module:
    """An :class:`~flowrl.policy.models.ActorCriticModel` as configured."""
    return models.ActorCriticModel(obs_space, num_outputs, config)


class TorchPolicy(Policy[ConfigT]):
    """A policy whose learning is given by ``loss_fn(policy, model, dist_class, batch)``.

    ``loss_fn`` returns a :class:`LossOutput` (or ``(loss, stats)``) and reads its
    hyperparameters from ``policy.config``, the algorithm's config object; ``batch`` maps
    column names to tensors on the policy's device. ``postprocess_fn(policy, trajectory)``
    adds derived columns. ``make_model(obs_space, action_space, num_outputs, model_config)``
    must return a module whose ``forward(obs)`` gives ``(dist_inputs, values)`` (values may be ``None``).
    A config ``model.custom_model`` replaces ``make_model``'s module with the user's, which must
    implement ``model_interface`` (see :mod:`flowrl.policy.custom_model`; None: the algorithm
    takes no custom model).

    Config keys read (see :class:`~flowrl.policy.policy.PolicyConfig`): ``lr`` and ``lr_schedule``
    (see :mod:`flowrl.policy.optimizers`), ``model``
    (see :mod:`flowrl.policy.models`), ``grad_clip``, ``explore``, ``exploration_config``
    (unless ``exploration_config`` is given here: an exploration the algorithm derives),
    ``num_gpus``, ``seed`` and ``num_workers``. Algorithm-owned scalars that must survive
    checkpoints (e.g. PPO's KL coefficient) live in ``policy.coeffs``. With
    ``target_network=True`` the policy keeps a frozen copy of its model in ``target_model``,
    moved by :meth:`update_target` (DQN, DDPG, TD3). ``td_error_fn`` gives each row's TD error
    without learning (see :data:`~flowrl.policy.torch_hooks.TDErrorFn`): worker-side replay priorities.

    Models see ``model_observation_space``: the ``"observations"`` part of a masked Dict observation
    space (see :mod:`flowrl.envs.flatten`). Given action masks (``compute_actions(action_mask=...)``,
    a batch's ``action_mask`` column), the distribution (and exploration) gives illegal actions no
    probability: a loss's ``dist_class`` has the batch's mask bound (``Categorical.with_action_mask``, a
    ``functools.partial``: call it, do not subclass or compare it).
    """

    def __init__(
        self,
        observation_space: gym.Space[Any],
        action_space: gym.Space[Any],
        config: ConfigT,
        *,
        worker_index: int = 0,
        loss_fn: LossFn,
        postprocess_fn: PostprocessFn | None = None,
        make_model: ModelFn = default_model,
        model_interface: ModelInterface | None = ACTOR_CRITIC,
        make_optimizer: OptimizerFn | None = None,
        dist_kind: str = "auto",
        coeffs: Mapping[str, float] | None = None,
        target_network: bool = False,
        td_error_fn: TDErrorFn | None = None,
        exploration_config: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(observation_space, action_space, config, worker_index=worker_index)
        use_gpu = config.num_gpus > 0 and torch.cuda.is_available()
        self.device = torch.device("cuda" if use_gpu else "cpu")
        self.dist_class, num_outputs = dist_class_for(action_space, dist_kind)
        #: What the model sees of observations (a masked Dict's "observations" part).
        self.model_observation_space = space = model_space(observation_space)
        options = model_config(config.model)
        if options["custom_model"] is not None:
            model = build_custom_model(model_interface, space, action_space, num_outputs, options)
        elif options["use_lstm"]:
            if make_model is not default_model:
                raise ConfigError(
                    [
                        f"model.use_lstm=True: {type(config).__name__}'s model cannot be wrapped in an LSTM yet; "
                        f"use_lstm works with {', '.join(RECURRENT_ALGORITHMS)}"
                    ]
                )
            model = recurrent.RecurrentActorCritic(space, action_space, num_outputs, options)
        else:
            model = make_model(space, action_space, num_outputs, options)
        self.model = model.to(self.device)
        # The recurrent models (use_lstm's, a recurrent custom model's adapter) run batches of sequences by rows.
        self._initial_state = model.initial_state() if isinstance(model, recurrent.SequenceModel) else []
        #: The target network (its weights and version travel to rollout workers that compute priorities).
        self.target_network = target_network_module.TargetNetwork(self.model) if target_network else None
        self.target_model: nn.Module | None = None if self.target_network is None else self.target_network.model
        self.td_error_fn = td_error_fn
        self.loss_fn = loss_fn
        self.postprocess_fn = postprocess_fn
        if make_optimizer is None and config.lr is None:
            raise ConfigError([f"{type(config).__name__} has lr=None: give the policy its own make_optimizer"])
        self._make_optimizer = make_optimizer or self._default_optimizer
        self._rates: LearningRates | None = None
        self.exploration = make_exploration(
            action_space,
            config.exploration_config if exploration_config is None else exploration_config,
            config.seed,
            worker_index=worker_index,
            num_workers=config.num_workers,
        )
        self.explore = config.explore
        self.coeffs: dict[str, float] = dict(coeffs or {})
        #: Set on the replicas of a learner group: ``(model, rows, loss_finite) -> all_finite`` averages the
        #: gradients over the replicas after each backward pass (see :mod:`flowrl.policy.data_parallel`).
        self.gradient_sync: GradientSync | None = None
        self._numpy_model: NumpyActorCritic | NumpyRecurrentActorCritic | None | object = _NOT_BUILT
        self._np_rng = np.random.default_rng(config.seed)

    @staticmethod
    def _default_optimizer(policy: "TorchPolicy[Any]") -> torch.optim.Optimizer:
        return adam(policy.model.parameters(), policy.device, lr=policy.config.lr)

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """The model's optimizer, made on first use: a policy that only acts (a rollout worker's) never
        makes one, which spares its process PyTorch's optimizer machinery (about a second to import)."""
        return self.learning_rates.optimizer

    @property
    def learning_rates(self) -> LearningRates:
        """The optimizer's learning rates, set before each step (``lr``, or ``lr_schedule``'s value at the
        global timestep: see :mod:`flowrl.policy.optimizers` for a custom ``make_optimizer``'s groups)."""
        if self._rates is None:
            from_lr = self._make_optimizer is TorchPolicy._default_optimizer
            self._rates = LearningRates(self._make_optimizer(self), from_lr=from_lr)
        return self._rates

    # -- acting ----------------------------------------------------------------------

    def _forward(self, obs_batch: np.ndarray) -> tuple[torch.Tensor, torch.Tensor | None]:
        out = self.model(models.obs_to_tensor(obs_batch, self.model_observation_space, self.device))
        return out if isinstance(out, tuple) else (out, None)

    def _forward_step(
        self,
        obs_batch: np.ndarray,
        state: list[np.ndarray] | None,
        prev_actions: np.ndarray | None,
        prev_rewards: np.ndarray | None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, list[torch.Tensor]]:
        """One step of the recurrent model for each row, from ``state`` (None: the initial state)."""
        state = [np.repeat(s[None], len(obs_batch), axis=0) for s in self._initial_state] if state is None else state
        obs = models.obs_to_tensor(obs_batch, self.model_observation_space, self.device)
        return _as_recurrent(self.model).step(obs, state, prev_actions, prev_rewards)

    def get_initial_state(self) -> list[np.ndarray]:
        return [s.copy() for s in self._initial_state]

    @property
    def is_recurrent(self) -> bool:
        return bool(self._initial_state)  # read on every step: no new arrays

    def model_outputs(self, model: nn.Module, batch: TensorBatch) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``model``'s distribution inputs and values for every row of ``batch`` (what a loss calls):
        a batch cut into sequences goes through the recurrent model padded (padding counts as loading),
        its padding left out."""
        if SampleBatch.SEQ_LENS in batch:
            return _as_recurrent(model).forward_rows(batch, self.learn_times.loading)
        result = model(batch[SampleBatch.OBS])
        return result if isinstance(result, tuple) else (result, None)

    def _numpy_twin(self) -> NumpyActorCritic | NumpyRecurrentActorCritic | None:
        if self._numpy_model is _NOT_BUILT:
            twin = numpy_inference.NumpyRecurrentActorCritic if self.is_recurrent else numpy_inference.NumpyActorCritic
            self._numpy_model = twin.build(self.model, self.model_observation_space)
        return self._numpy_model  # type: ignore[return-value]

    def compute_actions(
        self,
        obs_batch: np.ndarray,
        *,
        explore: bool | None = None,
        timestep: int | None = None,
        action_mask: np.ndarray | None = None,
        state: list[np.ndarray] | None = None,
        prev_actions: np.ndarray | None = None,
        prev_rewards: np.ndarray | None = None,
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        explore = self.explore if explore is None else explore
        timestep = self.global_timestep if timestep is None else timestep
        if self.is_recurrent:
            return self._compute_recurrent_actions(
                obs_batch, explore, timestep, action_mask, state, prev_actions, prev_rewards
            )
        sampling = type(self.exploration) is StochasticSampling and not self.exploration.is_random(timestep)
        twin = self._numpy_twin() if sampling else None
        if twin is not None:
            # Small MLP policies act faster in NumPy than through PyTorch's dispatch.
            outputs = cast("NumpyActorCritic", twin).forward(obs_batch)
            acted = numpy_inference.act(self.dist_class, *outputs, action_mask, explore, self._np_rng)
            if acted is not None:
                self.exploration.last_timestep = timestep
                return acted
        with torch.inference_mode():
            dist_inputs, values = self._forward(obs_batch)
            return self._act(dist_inputs, values, action_mask, explore, timestep)

    def _act(
        self, dist_inputs: torch.Tensor, values: torch.Tensor | None, action_mask: Any, explore: bool, timestep: int
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Explore from a forward pass's outputs (within ``action_mask``): the actions and their extras."""
        mask = None if action_mask is None else torch.as_tensor(action_mask, device=self.device)
        dist = self.dist_class(dist_inputs, action_mask=mask)
        actions, logp = self.exploration.get_action(dist, timestep=timestep, explore=explore)
        extra = {SampleBatch.ACTION_LOGP: logp.cpu().numpy(), SampleBatch.ACTION_DIST_INPUTS: dist.inputs.cpu().numpy()}
        if values is not None:
            extra[SampleBatch.VF_PREDS] = values.cpu().numpy()
        return actions.cpu().numpy(), extra

    def _compute_recurrent_actions(
        self,
        obs_batch: np.ndarray,
        explore: bool,
        timestep: int,
        action_mask: np.ndarray | None,
        state: list[np.ndarray] | None,
        prev_actions: np.ndarray | None,
        prev_rewards: np.ndarray | None,
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        prev = (prev_actions, prev_rewards)
        twin = self._numpy_twin() if type(self.exploration) is StochasticSampling else None
        step = None if twin is None else cast("NumpyRecurrentActorCritic", twin).step(obs_batch, state, *prev)
        if step is not None:  # a step of a small LSTM is several times faster in NumPy than in PyTorch
            acted = numpy_inference.act(self.dist_class, step[0], step[1], action_mask, explore, self._np_rng)
            if acted is not None:
                self.exploration.last_timestep = timestep
                acted[1].update({f"{SampleBatch.STATE_OUT}{k}": s for k, s in enumerate(step[2])})
                return acted
        with torch.inference_mode():
            dist_inputs, values, state_out = self._forward_step(obs_batch, state, *prev)
            actions, extra = self._act(dist_inputs, values, action_mask, explore, timestep)
            for k, s in enumerate(state_out):
                extra[f"{SampleBatch.STATE_OUT}{k}"] = s.cpu().numpy()
            return actions, extra

    def value(
        self,
        obs_batch: np.ndarray,
        state: list[np.ndarray] | None = None,
        prev_actions: np.ndarray | None = None,
        prev_rewards: np.ndarray | None = None,
    ) -> np.ndarray:
        """State values for a batch of observations (models with a value head); a recurrent
        policy's from each row's ``state`` (and previous action and reward, if its model reads them)."""
        twin, prev = self._numpy_twin(), (prev_actions, prev_rewards)
        if self.is_recurrent:
            values_np = None if twin is None else cast("NumpyRecurrentActorCritic", twin).value(obs_batch, state, *prev)
            if values_np is None:
                with torch.inference_mode():
                    values = self._forward_step(obs_batch, state, *prev)[1]
                if values is None:
                    raise TypeError(f"{type(self.model).__name__} has no value head")
                values_np = values.cpu().numpy()
            return values_np
        if isinstance(twin, numpy_inference.NumpyActorCritic) and twin.value_head is not None:
            return twin.value(obs_batch)
        with torch.inference_mode():
            _, values = self._forward(obs_batch)
        if values is None:
            raise TypeError(f"{type(self.model).__name__} has no value head")
        return values.cpu().numpy()

    def postprocess_trajectory(self, batch: SampleBatch) -> SampleBatch:
        return self.postprocess_fn(self, batch) if self.postprocess_fn is not None else batch

    @property
    def postprocesses(self) -> bool:
        return (
            self.postprocess_fn is not None
            or type(self).postprocess_trajectory is not TorchPolicy.postprocess_trajectory
        )

    # -- learning --------------------------------------------------------------------

    def to_tensors(self, batch: SampleBatch) -> TensorBatch:
        """The batch's columns as tensors on the policy's device (observations preprocessed)."""
        batch.decompress_if_needed()
        tensors: TensorBatch = {}
        for key, value in batch.items():
            if not value.flags.writeable:
                value = value.copy()  # batches from Ray's object store are read-only; torch needs writable memory
            if key in (SampleBatch.OBS, SampleBatch.NEW_OBS):
                tensors[key] = models.obs_to_tensor(value, self.model_observation_space, self.device)
            elif value.dtype.kind in "biuf":
                tensors[key] = torch.as_tensor(value, device=self.device)
        return tensors

    def _loss(self, batch: SampleBatch) -> tuple[LearnOutput, str | None]:
        """Run the loss and backpropagate it.

        Returns the statistics (with the gradient norm when clipped) and TD errors, and what
        was not finite (the loss or a gradient), or None if everything was.
        """
        if not self.model.training:  # train() walks every submodule: not on every minibatch
            self.model.train()
        with self.learn_times.loading():
            tensors = self.to_tensors(batch)
        mask = tensors.get(SampleBatch.ACTION_MASK)
        dist_class: DistFactory = self.dist_class if mask is None else self.dist_class.with_action_mask(mask)
        out = LossOutput(*self.loss_fn(self, self.model, dist_class, tensors))
        cur_lr = self.learning_rates.set(self.config, self.global_timestep)
        self.optimizer.zero_grad()
        out.loss.backward()
        loss = float(out.loss.detach())
        loss_finite = math.isfinite(loss)
        if self.gradient_sync is not None:  # a replica of a learner group: average with the others first
            loss_finite = self.gradient_sync(self.model, batch.count, loss_finite)
        stats = {**out.stats, "cur_lr": cur_lr}
        if self.config.grad_clip is not None:
            grad_norm = float(nn.utils.clip_grad_norm_(self.model.parameters(), self.config.grad_clip))
            stats["grad_gnorm"] = grad_norm
        else:
            grads = [p.grad for p in self.model.parameters() if p.grad is not None]
            grad_norm = float(nn.utils.get_total_norm(grads)) if grads else 0.0
        td_error = None if out.td_error is None else out.td_error.detach().cpu().numpy()
        # The norm is finite only if every gradient is: one number to test instead of every tensor.
        if loss_finite and math.isfinite(grad_norm):
            return LearnOutput(stats, td_error), None
        named = self.model.named_parameters()
        culprit = next((name for name, p in named if p.grad is not None and not p.grad.isfinite().all()), None)
        where = f", first in the gradient of {culprit}" if culprit is not None else ""
        return LearnOutput(stats, td_error), f"loss={loss:.6g} and gradient norm={grad_norm:.6g}{where}"

    def learn(self, batch: SampleBatch) -> LearnOutput:
        """One optimizer step on ``batch``; skipped if the loss or a gradient is not finite (see :class:`Policy`).

        A skipped update's statistics hold ``nonfinite_update: 1.0``, and it gives no TD
        errors (replay priorities stay as they were).
        """
        with self.learn_times.updating():
            out, nonfinite = self._loss(batch)
            self.record_update(nonfinite)
            if nonfinite is not None:
                self.optimizer.zero_grad()
                return LearnOutput({**out.stats, NONFINITE_UPDATE: 1.0})
            self.optimizer.step()
            return out

    def compute_gradients(self, batch: SampleBatch) -> tuple[list[np.ndarray], dict[str, float]]:
        """Gradients of the loss on ``batch``, not applied, and the learner statistics.

        If the loss or a gradient is not finite, every gradient is NaN (so that whoever applies
        them skips the update, even when only the loss was not finite) and the statistics hold
        ``nonfinite_update: 1.0``.
        """
        with self.learn_times.updating():
            out, nonfinite = self._loss(batch)
            grads = [
                p.grad.detach().cpu().numpy().copy() if p.grad is not None else np.zeros(tuple(p.shape), np.float32)
                for p in self.model.parameters()
            ]
        if nonfinite is None:
            return grads, out.stats
        return [np.full_like(g, np.nan) for g in grads], {**out.stats, NONFINITE_UPDATE: 1.0}

    def apply_gradients(self, gradients: list[np.ndarray]) -> None:
        """One optimizer step with ``gradients``; skipped if one is not finite (see :class:`Policy`)."""
        named = list(self.model.named_parameters())
        if len(gradients) != len(named):
            raise ValueError(f"got {len(gradients)} gradients for {len(named)} parameters")
        bad = _first_nonfinite(gradients)
        self.record_update(
            None if bad is None else f"a non-finite gradient of {named[bad][0]} given to apply_gradients"
        )
        if bad is not None:
            return
        with self.learn_times.updating():
            for (_, p), g in zip(named, gradients):
                p.grad = torch.tensor(g, device=self.device).reshape(p.shape)  # a copy: Ray hands out read-only arrays
            self.learning_rates.set(self.config, self.global_timestep)
            self.optimizer.step()

    def update_target(self, tau: float = 1.0) -> None:
        """Move the target network towards the model: copy it (``tau=1``) or blend by ``tau``."""
        if self.target_network is None:
            raise TypeError("this policy was built without a target network (target_network=True)")
        self.target_network.update(tau)

    # -- state -----------------------------------------------------------------------

    def get_weights(self) -> ModelWeights:
        return models.module_weights(self.model)

    def set_weights(self, weights: ModelWeights) -> None:
        models.load_module_weights(self.model, weights)

    def update_config(self, changes: Mapping[str, Any]) -> None:
        """Change config keys of a live policy; a new ``lr`` also goes to the optimizer (keeping its moments)
        and ends an ``lr_schedule`` (see :meth:`Policy.update_config`)."""
        super().update_config(changes)
        if "lr" in changes and self.config.lr is not None:
            self.learning_rates.set_live(self.config.lr)

    def get_state(self) -> dict[str, Any]:
        return {
            **super().get_state(),
            **self.get_sampling_state(),
            "optimizer": self.learning_rates.state(),
            "coeffs": dict(self.coeffs),
            "target": None if self.target_model is None else on_cpu(self.target_model.state_dict()),
        }

    def set_state(self, state: Mapping[str, Any]) -> None:
        super().set_state(state)
        self.load_optimizer_state(state["optimizer"])
        self.coeffs = dict(state["coeffs"])
        # Checkpoints older than the policy's own RNG in its state keep the current one.
        self.set_sampling_state({"np_rng": self._np_rng.bit_generator.state, **state})
        if self.target_network is not None and state.get("target") is not None:
            self.target_network.load(state["target"])

    def load_optimizer_state(self, state: dict[str, Any]) -> None:
        """Load an optimizer ``state_dict`` (see :meth:`LearningRates.load_state`: its settings stay this policy's)."""
        self.learning_rates.load_state(state)

    def get_sampling_state(self) -> dict[str, Any]:
        return {
            **super().get_sampling_state(),
            "exploration": self.exploration.get_state(),
            "np_rng": copy.deepcopy(self._np_rng.bit_generator.state),
        }

    def set_sampling_state(self, state: Mapping[str, Any]) -> None:
        super().set_sampling_state(state)
        self.exploration.set_state(state["exploration"])
        self._np_rng.bit_generator.state = state["np_rng"]


def _as_recurrent(model: nn.Module) -> recurrent.SequenceModel:
    """``model`` (built by ``model.use_lstm``, or a recurrent custom model) as the recurrent model it is."""
    return cast("recurrent.SequenceModel", model)


def _first_nonfinite(arrays: Sequence[np.ndarray]) -> int | None:
    """The index of the first array holding a NaN or infinity, or None."""
    # One sum per array, finite only if every element is; an overflowing sum gets the closer look.
    for k, array in enumerate(arrays):
        if not math.isfinite(np.add.reduce(array, axis=None)) and not np.isfinite(array).all():
            return k
    return None
