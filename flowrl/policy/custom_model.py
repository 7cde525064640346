"""Custom models: a user's ``torch.nn.Module`` in place of an algorithm's built-in model.

The ``model`` config names the class and its options::

    model: {custom_model: "my_package.models:MyNet", custom_model_config: {hidden: 128}}

The class is built as ``MyNet(obs_space, action_space, num_outputs, **custom_model_config)``;
``obs_space`` is the env's (a Dict stays a Dict) and ``num_outputs`` the size of the output the
algorithm needs. What the module must compute depends on the algorithm's family, its
:class:`ModelInterface`:

- actor-critic (PPO, A2C, A3C, IMPALA, APPO): ``forward(obs) -> (dist_inputs, values)``, shapes
  ``[B, num_outputs]`` and ``[B]``;
- policy (PG): ``forward(obs) -> (dist_inputs, None)``;
- Q-values (DQN, Ape-X DQN): ``forward(obs) -> (q_values, None)``, ``q_values`` ``[B, num_outputs]``
  (one per action);
- deterministic actor-critic (DDPG, TD3, Ape-X DDPG): submodules ``actor`` (flat observations
  ``[B, obs_dim]`` to ``[B, action_dim]`` before the tanh that maps them into the action bounds)
  and ``critics``, an ``nn.ModuleList`` (two for TD3) of modules mapping observations and
  actions concatenated (``[B, obs_dim + action_dim]``) to ``[B, 1]``.

An actor-critic model may be recurrent itself: it declares its initial state with
``get_initial_state()`` (a list of 1-d tensors, one env's state at an episode's start) and its
``forward(obs, state)`` runs ``[B, T, obs_dim]`` observations from ``state`` (one ``[B, size]`` tensor per
entry) to ``(dist_inputs [B, T, num_outputs], values [B, T], next state)``; the policy then carries its
state as it carries ``use_lstm``'s (see :mod:`flowrl.policy.recurrent_custom`), for the algorithms that
learn from sequences.

With ``use_lstm`` a feed-forward actor-critic or policy model is wrapped in an LSTM instead: it becomes
the step encoder of :class:`~flowrl.policy.recurrent.RecurrentActorCritic`. It is built with
``num_outputs = lstm_cell_size`` and checked against its interface as usual; its first output
(``[B, lstm_cell_size]``) is each step's features, which the LSTM reads (with the previous action and
reward when ``lstm_use_prev_action`` / ``lstm_use_prev_reward``), and its values are not used: the
policy's distribution inputs and values come from heads on the LSTM. Unless ``vf_share_layers``, the
value's LSTM reads an instance of its own. A recurrent custom model with ``use_lstm`` is a
:class:`~flowrl.errors.ConfigError`, and so is ``use_lstm`` around another family's model.

``obs`` is a float tensor of the observations flattened (Dict and Tuple ones with
``gymnasium.spaces.utils.flatten``, Discrete ones one-hot); with ``custom_model_obs:
"structured"`` a Dict or Tuple observation arrives as a dict or tuple of ``[B, ...]`` tensors
instead (Box parts in their shape, Discrete and MultiDiscrete parts one-hot).

The config checks the class up front (:func:`custom_model_problems`: importable, a
``torch.nn.Module``, a constructor that takes the options); building a policy runs one forward
pass on a batch of two observations and raises :class:`~flowrl.errors.ConfigError` naming the
class and the interface when the outputs do not fit (the Trainer builds its local policies
before any remote actor starts). Checkpoints record the ``"module:Class"`` path, so the class
must be importable wherever a checkpoint is restored or loaded with :func:`flowrl.load_policy`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.spaces.utils import flatdim

from flowrl.deferred import nn, torch
from flowrl.envs.flatten import ObsFlattener, is_structured
from flowrl.errors import ConfigError, FlowRLError
from flowrl.importing import import_callable

#: Builds the algorithm's model around the user's module: ``adapt(module, obs_space, action_space)``.
Adapter = Callable[["nn.Module", gym.Space[Any], gym.Space[Any]], "nn.Module"]


@dataclass(frozen=True)
class ModelInterface:
    """What a custom model must implement for one family of algorithms.

    ``contract`` says it in words (error messages quote it). Families whose loss calls
    ``forward`` are checked by a probe forward pass: ``dist_inputs`` of ``[B, num_outputs]``,
    and ``values`` of ``[B]`` when ``needs_values``. A family with an ``adapt`` function instead
    builds its own model from the user's module (and checks it there).
    """

    name: str
    contract: str
    needs_values: bool = False
    adapt: Adapter | None = None


ACTOR_CRITIC = ModelInterface(
    "actor-critic", "forward(obs) -> (dist_inputs [B, num_outputs], values [B])", needs_values=True
)
POLICY = ModelInterface("policy", "forward(obs) -> (dist_inputs [B, num_outputs], None)")
Q_VALUES = ModelInterface("Q-values", "forward(obs) -> (q_values [B, num_outputs], None), one Q-value per action")


def custom_model_class(value: Any) -> type[nn.Module]:
    """The ``torch.nn.Module`` subclass ``value`` names (the class or its ``"module:Class"`` path).

    Raises :class:`~flowrl.errors.FlowRLError` saying why it is not one.
    """
    found: Any = import_callable(value, key="model.custom_model") if isinstance(value, str) else value
    if not (isinstance(found, type) and issubclass(found, nn.Module)):
        shown = found.__qualname__ if isinstance(found, type) else f"a {type(found).__name__}"
        raise FlowRLError(f"{shown} is not a subclass of torch.nn.Module")
    return found


def is_recurrent_class(cls: type) -> bool:
    """Whether a custom model class is recurrent: it declares its initial state (``get_initial_state``)."""
    return callable(getattr(cls, "get_initial_state", None))


def recurrent_custom_model(model: Mapping[str, Any]) -> str | None:
    """The ``model.custom_model`` of a ``model`` dict shown as a string if it names a recurrent class, else None
    (also when it names no class: :func:`custom_model_problems` says why)."""
    custom = model.get("custom_model")
    if not isinstance(custom, (str, type)):
        return None
    try:
        cls = custom_model_class(custom)
    except FlowRLError:
        return None
    return (custom if isinstance(custom, str) else cls.__qualname__) if is_recurrent_class(cls) else None


def custom_model_problems(model: Mapping[str, Any]) -> list[str]:
    """What is wrong with the custom-model keys of a ``model`` dict, checked without spaces:
    the class (importable, a ``torch.nn.Module``) and whether its constructor takes the options."""
    custom, options = model.get("custom_model"), model.get("custom_model_config", {})
    problems = []
    if not isinstance(options, Mapping) or not all(isinstance(key, str) for key in options):
        problems.append(f"model.custom_model_config={options!r} must be a dict of keyword arguments (str keys)")
        options = {}
    if custom is None:
        if options or model.get("custom_model_obs", "flat") != "flat":
            problems.append(
                "model.custom_model_config and custom_model_obs apply to a custom model, but custom_model is None"
            )
        return problems
    if not isinstance(custom, (str, type)):
        return problems + [f"model.custom_model={custom!r} must be a torch.nn.Module subclass or a 'module:Class' path"]
    try:
        cls = custom_model_class(custom)
    except FlowRLError as e:
        return problems + [f"model.custom_model={custom!r}: {e}"]
    if model.get("use_lstm") and is_recurrent_class(cls):
        problems.append(
            f"model.custom_model={custom!r} is recurrent (it has get_initial_state), and model.use_lstm=True wraps "
            "only a feed-forward model in an LSTM: drop use_lstm (the model carries its own state), or "
            "get_initial_state"
        )
    try:
        inspect.signature(cls).bind(None, None, 0, **options)
    except TypeError as e:
        problems.append(
            f"model.custom_model={custom!r} cannot be built as {cls.__qualname__}(obs_space, action_space, "
            f"num_outputs, **custom_model_config) with custom_model_config={dict(options)!r}: {e}"
        )
    except ValueError:
        pass  # no signature to inspect (a C extension): building it will tell
    return problems


class StructuredObs:
    """A forward pre-hook giving a module Dict/Tuple observations as dicts/tuples of tensors.

    Observations are sampled flat (see :mod:`flowrl.envs.flatten`); this splits each row
    back: Box parts reshaped, Discrete, MultiDiscrete and MultiBinary parts as flattened.
    """

    def __init__(self, space: gym.Space[Any]) -> None:
        self.space = space

    def __call__(self, module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        return (unflatten_tensor(self.space, args[0]), *args[1:])


def unflatten_tensor(space: gym.Space[Any], flat: torch.Tensor) -> Any:
    """Rows ``[B, flatdim(space)]`` of flattened observations as the space's structure of ``[B, ...]`` tensors."""
    if isinstance(space, (gym.spaces.Dict, gym.spaces.Tuple)):
        parts, offset = [], 0
        for sub in space.spaces.values() if isinstance(space, gym.spaces.Dict) else space.spaces:
            size = flatdim(sub)
            parts.append(unflatten_tensor(sub, flat[:, offset : offset + size]))
            offset += size
        if isinstance(space, gym.spaces.Dict):
            return dict(zip(space.spaces, parts))
        return tuple(parts)
    if isinstance(space, (gym.spaces.Box, gym.spaces.MultiBinary)) and space.shape is not None:
        return flat.reshape(-1, *space.shape)  # -1: an exported model keeps its batch dimension free
    return flat


def build_custom_model(
    interface: ModelInterface | None,
    obs_space: gym.Space[Any],
    action_space: gym.Space[Any],
    num_outputs: int,
    model_config: Mapping[str, Any],
) -> nn.Module:
    """The custom model ``model_config`` names, built and checked against ``interface``.

    ``interface`` None: the algorithm takes no custom model. Raises
    :class:`~flowrl.errors.ConfigError` naming the class when it cannot be built or its
    outputs do not fit the interface.
    """
    custom = model_config["custom_model"]
    shown = f"model.custom_model={custom if isinstance(custom, str) else getattr(custom, '__qualname__', custom)!r}"
    if interface is None:
        raise ConfigError([f"{shown}: this algorithm builds its own model and takes no custom model"])
    problems = custom_model_problems(model_config)
    if problems:
        raise ConfigError(problems)
    cls = custom_model_class(custom)
    structured = model_config["custom_model_obs"] == "structured"
    if structured and not is_structured(obs_space):
        raise ConfigError(
            [f"model.custom_model_obs='structured' needs a Dict or Tuple observation space, not {obs_space}"]
        )
    if structured and interface.adapt is not None:
        raise ConfigError([f"model.custom_model_obs='structured': {interface.name} models take flat observations"])
    if model_config["use_lstm"]:
        return _wrapped_in_lstm(cls, shown, interface, structured, obs_space, action_space, num_outputs, model_config)
    model = _construct(cls, shown, obs_space, action_space, num_outputs, model_config)
    if is_recurrent_class(cls):
        return _recurrent(model, shown, interface, structured, obs_space, num_outputs)
    if structured:
        model.register_forward_pre_hook(StructuredObs(obs_space))
    if interface.adapt is not None:
        return interface.adapt(model, obs_space, action_space)
    problem = _forward_problem(model, interface, obs_space, num_outputs)
    if problem is not None:
        raise ConfigError(
            [f"{shown} does not implement the {interface.name} interface {interface.contract}: {problem}"]
        )
    return model


def _construct(
    cls: type[nn.Module],
    shown: str,
    obs_space: gym.Space[Any],
    action_space: gym.Space[Any],
    num_outputs: int,
    model_config: Mapping[str, Any],
) -> nn.Module:
    try:
        return cls(obs_space, action_space, num_outputs, **model_config["custom_model_config"])
    except Exception as e:
        raise ConfigError([f"{shown}: building {cls.__qualname__}(...) raised {type(e).__name__}: {e}"]) from e


#: The interfaces whose models ``use_lstm`` wraps: their first output becomes the step's features.
WRAPPABLE = ("actor-critic", "policy")


def _wrapped_in_lstm(
    cls: type[nn.Module],
    shown: str,
    interface: ModelInterface,
    structured: bool,
    obs_space: gym.Space[Any],
    action_space: gym.Space[Any],
    num_outputs: int,
    model_config: Mapping[str, Any],
) -> nn.Module:
    """``use_lstm`` around a feed-forward custom model: each of the recurrent model's branches runs an instance
    of it (built with ``num_outputs = lstm_cell_size`` and checked against ``interface``) as its step encoder."""
    from flowrl.policy.recurrent import FirstOutput, RecurrentActorCritic

    if interface.name not in WRAPPABLE or interface.adapt is not None:
        raise ConfigError(
            [
                f"{shown} with model.use_lstm=True: {interface.name} models are not wrapped in an LSTM (only "
                f"{' and '.join(WRAPPABLE)} ones)"
            ]
        )
    features = int(model_config["lstm_cell_size"])

    def step_encoder() -> FirstOutput:
        model = _construct(cls, shown, obs_space, action_space, features, model_config)
        if structured:
            model.register_forward_pre_hook(StructuredObs(obs_space))
        problem = _forward_problem(model, interface, obs_space, features)
        if problem is not None:
            raise ConfigError(
                [
                    f"{shown}, wrapped by model.use_lstm=True and built with num_outputs=lstm_cell_size={features}, "
                    f"does not implement the {interface.name} interface {interface.contract}: {problem}"
                ]
            )
        return FirstOutput(model, features)

    return RecurrentActorCritic(obs_space, action_space, num_outputs, model_config, step_encoder)


def _recurrent(
    model: nn.Module,
    shown: str,
    interface: ModelInterface,
    structured: bool,
    obs_space: gym.Space[Any],
    num_outputs: int,
) -> nn.Module:
    """A recurrent custom model adapted to a recurrent policy, its forward over ``[B, T]`` checked."""
    from flowrl.policy.recurrent_custom import RecurrentCustomModel, sequence_problem

    if interface is not ACTOR_CRITIC or structured:
        why = "custom_model_obs='structured'" if structured else f"the {interface.name} interface"
        raise ConfigError([f"{shown} is recurrent (it has get_initial_state), which {why} does not take yet"])
    try:
        adapted = RecurrentCustomModel(model)
    except Exception as e:
        raise ConfigError([f"{shown}: get_initial_state() raised {type(e).__name__}: {e}"]) from e
    B, T = 2, 3
    obs = probe_observations(obs_space, B * T)
    training = model.training
    try:
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            model.eval()
            problem = sequence_problem(adapted, obs.reshape(B, T, *obs.shape[1:]), num_outputs)
    finally:
        model.train(training)
    if problem is not None:
        raise ConfigError(
            [
                f"{shown} is recurrent (it has get_initial_state) but does not implement forward(obs [B, T, ...], "
                f"state) -> (dist_inputs [B, T, num_outputs], values [B, T], next state): {problem}"
            ]
        )
    return adapted


def actor_and_critics(custom: nn.Module, interface: ModelInterface, twin_q: bool) -> tuple[nn.Module, nn.ModuleList]:
    """A custom actor-critic model's ``actor`` module and its ``critics`` (two with ``twin_q``, else one), the
    attributes the off-policy actor-critics (DDPG, TD3, SAC) build their model around; a ConfigError if absent."""
    actor, critics = getattr(custom, "actor", None), getattr(custom, "critics", None)
    wanted = 2 if twin_q else 1
    if not isinstance(actor, nn.Module) or not isinstance(critics, nn.ModuleList) or len(critics) != wanted:
        raise ConfigError(
            [
                f"model.custom_model {type(custom).__qualname__} does not implement the {interface.name} interface "
                f"({interface.contract}): it needs an nn.Module attribute actor and an nn.ModuleList critics of "
                f"{wanted} (twin_q={twin_q})"
            ]
        )
    return actor, critics


def probe_observations(obs_space: gym.Space[Any], batch_size: int = 2) -> torch.Tensor:
    """A batch of all-zero observations of ``obs_space`` as a model receives them (flat, on the CPU)."""
    from flowrl.policy.models import obs_to_tensor  # the torch modules' module

    if is_structured(obs_space):
        space: gym.Space[Any] = ObsFlattener(obs_space).space
    else:
        space = obs_space
    shape = () if space.shape is None else space.shape
    zeros = np.zeros((batch_size, *shape), dtype=space.dtype)
    return obs_to_tensor(zeros, obs_space, torch.device("cpu"))


def _forward_problem(
    model: nn.Module, interface: ModelInterface, obs_space: gym.Space[Any], num_outputs: int
) -> str | None:
    """What is wrong with ``model``'s outputs on a probe batch, or None (the RNG and train mode are left
    as they were)."""
    batch = 2
    training = model.training
    try:
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            model.eval()
            out = model(probe_observations(obs_space, batch))
    except Exception as e:  # noqa: BLE001 - whatever the user's forward raises is the answer
        return f"forward raised {type(e).__name__}: {e}"
    finally:
        model.train(training)
    if not (isinstance(out, tuple) and len(out) == 2):
        return f"forward returned {_describe(out)}, not a pair"
    dist_inputs, values = out
    if not (isinstance(dist_inputs, torch.Tensor) and tuple(dist_inputs.shape) == (batch, num_outputs)):
        return f"for a batch of {batch}, its first output is {_describe(dist_inputs)}, not [{batch}, {num_outputs}]"
    if interface.needs_values and not (isinstance(values, torch.Tensor) and tuple(values.shape) == (batch,)):
        return f"for a batch of {batch}, its values are {_describe(values)}, not [{batch}]"
    return None


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {list(value.shape)}"
    if isinstance(value, tuple):
        return f"a tuple of {len(value)}"
    return f"a {type(value).__name__}"
