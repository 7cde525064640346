"""A learner policy on a CUDA device (``num_gpus``, as a LearnerActor builds it) learns what the same policy learns
on the CPU, and its weights and state move between the devices: checkpoints of a GPU run resume on a CPU machine.

Each algorithm learns on a real fragment, sampled and postprocessed on the CPU by a local RolloutWorker (and
replayed as its plan replays it). PPO, IMPALA, DQN and LSTM-PPO learn deterministically: gradients, statistics
and weights must equal the CPU's. SAC and TD3 draw random numbers in their losses (CUDA's generator is not the
CPU's), so on the GPU they must learn (finite weights, a falling critic loss) and act greedily as the CPU does.

Without CUDA the module is skipped; ``FLOWRL_GPU_REHEARSAL=1`` runs it anyway with ``num_gpus`` giving the CPU,
which rehearses every check's logic on a machine without a GPU.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from gpu_marks import DEVICE, GPU_MARKS

from flowrl.actors import RolloutWorker
from flowrl.actors.resources import local_replay_buffer
from flowrl.algorithms import get_algorithm
from flowrl.data import DEFAULT_POLICY_ID, SampleBatch, concat_samples
from flowrl.engine.build import policy_specs
from flowrl.envs import get_env_creator
from flowrl.operators import StandardizeFields
from flowrl.policy import PolicySpec, TorchPolicy
from flowrl.policy.sgd import minibatch_sgd

pytestmark = [*GPU_MARKS, pytest.mark.unit]

SMALL = {"fcnet_hiddens": [32, 32]}
SMALL_ACTOR_CRITIC = {"actor_hiddens": [32, 32], "critic_hiddens": [32, 32]}


@dataclass(frozen=True)
class Case:
    """An algorithm on an env, with settings small enough for a unit test, and how its plan learns."""

    algo: str
    env: str
    overrides: dict[str, Any] = field(default_factory=dict)
    #: "sgd": minibatch epochs over the fragment (PPO, IMPALA); "replay": one step on a replayed batch.
    learn: str = "sgd"
    #: Whether the loss draws no random numbers, so that the GPU must learn exactly what the CPU learns.
    deterministic: bool = True


CASES = {
    "ppo": Case(
        "ppo",
        "CartPole-v1",
        {"train_batch_size": 200, "sgd_minibatch_size": 64, "num_sgd_iter": 2, "lr": 1e-3, "model": SMALL},
    ),
    "impala": Case(
        "impala",
        "CartPole-v1",
        {
            "num_workers": 1,
            "rollout_fragment_length": 50,
            "train_batch_size": 100,
            "sgd_minibatch_size": 50,
            "model": SMALL,
        },
    ),
    "dqn": Case("dqn", "CartPole-v1", {"n_step": 3, "model": SMALL}, learn="replay"),
    "lstm_ppo": Case(
        "ppo",
        "StatelessCartPole-v1",
        {
            "train_batch_size": 200,
            "sgd_minibatch_size": 64,
            "num_sgd_iter": 2,
            "lr": 1e-3,
            "model": {"use_lstm": True, "lstm_cell_size": 16, "max_seq_len": 10, "fcnet_hiddens": [16]},
        },
    ),
    "sac": Case("sac", "Pendulum-v1", {"lr": 3e-3, **SMALL_ACTOR_CRITIC}, learn="replay", deterministic=False),
    "sac_discrete": Case("sac", "CartPole-v1", {"lr": 3e-3, **SMALL_ACTOR_CRITIC}, learn="replay", deterministic=False),
    "td3": Case(
        "td3",
        "Pendulum-v1",
        {"actor_lr": 3e-3, "critic_lr": 3e-3, **SMALL_ACTOR_CRITIC},
        learn="replay",
        deterministic=False,
    ),
}
# Replay plans: fragments of 200 steps stored, batches of 64 replayed from the start.
REPLAY = {"rollout_fragment_length": 200, "train_batch_size": 64, "learning_starts": 0}
DETERMINISTIC = [name for name, case in CASES.items() if case.deterministic]
RANDOM = [name for name, case in CASES.items() if not case.deterministic]


@dataclass
class Setup:
    """A case's config, a train batch as its plan builds one, and its policy built for the CPU and for the GPU
    (the GPU one holding the CPU one's state, so both start equal)."""

    case: Case
    config: Any  # the algorithm's own config class
    batch: SampleBatch
    spec: PolicySpec
    cpu: TorchPolicy[Any]
    gpu: TorchPolicy[Any]

    def learn(self, policy: TorchPolicy[Any]) -> dict[str, float]:
        """One training step of the plan on ``batch``: the config's minibatch epochs, or one update."""
        config = self.config
        if self.case.learn == "replay":
            return policy.learn(self.batch).stats
        # IMPALA's learner keeps fragments whole (V-trace reads them time-major); PPO cuts none.
        length = config.rollout_fragment_length if self.case.algo == "impala" else 1
        return minibatch_sgd(policy, self.batch, config.num_sgd_iter, config.sgd_minibatch_size, config.seed, length)

    def updates(self) -> int:
        """The optimizer steps of one :meth:`learn`."""
        if self.case.learn == "replay":
            return 1
        minibatch = self.config.sgd_minibatch_size or self.batch.count
        return self.config.num_sgd_iter * -(-self.batch.count // minibatch)

    def observations(self, n: int = 64) -> np.ndarray:
        return np.asarray(self.batch[SampleBatch.OBS][:n])


@pytest.fixture(autouse=True, scope="module")
def _exact_float32_on_one_thread() -> Iterator[None]:
    """Full float32 matrix products on the GPU (TF32 rounds to 10 bits), so that its results can equal the CPU's;
    one CPU thread, the fastest for these small nets (on a busy machine a second one stalls every step)."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.get_num_threads()
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    torch.set_num_threads(1)
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved[:2]
    torch.set_num_threads(saved[2])


def prepare(name: str) -> Setup:
    case = CASES[name]
    algorithm = get_algorithm(case.algo)
    overrides = {**(REPLAY if case.learn == "replay" else {}), **case.overrides}
    config: Any = algorithm.config_class.from_dict({"num_workers": 0, "seed": 0, **overrides}).frozen()  # its own class
    creator = get_env_creator(case.env)
    specs = policy_specs(algorithm, config, creator)
    worker = RolloutWorker(env_creator=creator, policy_specs=specs, config=config)
    fragments = [worker.sample()]
    while sum(f.count for f in fragments) < config.train_batch_size:
        fragments.append(worker.sample())
    batch = concat_samples(fragments)
    assert isinstance(batch, SampleBatch)
    if case.learn == "replay":  # the plan's Replay: importance weights and indexes with prioritized replay
        buffer = local_replay_buffer(config)
        buffer.add_batch(batch)
        replayed = buffer.replay()
        assert isinstance(replayed, SampleBatch)
        batch = replayed
    elif case.algo == "ppo":
        batch = StandardizeFields([SampleBatch.ADVANTAGES])(batch)
    assert isinstance(batch, SampleBatch)
    spec = specs[DEFAULT_POLICY_ID]
    cpu, gpu = spec.build(), spec.build({"num_gpus": 1})
    assert isinstance(cpu, TorchPolicy) and isinstance(gpu, TorchPolicy)
    cpu.set_weights(worker.get_policy(DEFAULT_POLICY_ID).get_weights())  # the learner's weights sampled the batch
    gpu.set_state(cpu.get_state())
    return Setup(case, config, batch, spec, cpu, gpu)


def greedy(policy: TorchPolicy[Any], obs: np.ndarray) -> np.ndarray:
    return policy.compute_actions(obs, explore=False)[0]


def assert_same_actions(got: np.ndarray, expected: np.ndarray) -> None:
    if got.dtype.kind == "f":
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    else:
        np.testing.assert_array_equal(got, expected)


def tensors_off_the_cpu(value: Any, path: str = "state") -> list[str]:
    """Where ``value`` (nested dicts, lists, tuples) holds a tensor that is not on the CPU."""
    if isinstance(value, torch.Tensor):
        return [f"{path} on {value.device}"] if value.device.type != "cpu" else []
    if isinstance(value, dict):
        return [where for key, item in value.items() for where in tensors_off_the_cpu(item, f"{path}[{key!r}]")]
    if isinstance(value, (list, tuple)):
        return [where for k, item in enumerate(value) for where in tensors_off_the_cpu(item, f"{path}[{k}]")]
    return []


def assert_weights_close(got: dict[str, np.ndarray], expected: dict[str, np.ndarray], lr: float, steps: int) -> None:
    """Weights learned on two devices agree. Adam's first steps move each weight by about ``lr`` whatever the
    size of its gradient, so one whose gradient is near 0 and differs in sign by rounding lands up to
    ``2 lr`` per step away; the weights as a whole agree to rounding's size."""
    assert got.keys() == expected.keys()
    for key in expected:
        difference = np.abs(got[key] - expected[key])
        assert difference.max() <= 2 * lr * steps + 1e-5, (key, difference.max())
        assert difference.mean() <= 1e-5 + 1e-3 * np.abs(expected[key]).mean(), (key, difference.mean())


@pytest.mark.parametrize("name", list(CASES))
def test_the_policy_is_on_the_device_num_gpus_gives(name: str) -> None:
    s = prepare(name)
    assert s.cpu.device.type == "cpu"
    assert s.gpu.device.type == DEVICE
    assert {p.device.type for p in s.gpu.model.parameters()} == {DEVICE}
    if s.gpu.target_model is not None:
        assert {p.device.type for p in s.gpu.target_model.parameters()} == {DEVICE}
    weights = s.gpu.get_weights()
    assert all(isinstance(w, np.ndarray) for w in weights.values())
    for key, expected in s.cpu.get_weights().items():
        np.testing.assert_array_equal(weights[key], expected)  # set_state gave the GPU policy the CPU's weights


@pytest.mark.parametrize("name", list(CASES))
def test_compute_actions_gives_numpy_arrays_of_the_action_space(name: str) -> None:
    s = prepare(name)
    obs, space = s.observations(16), s.gpu.action_space
    dtype = np.int64 if isinstance(space, gym.spaces.Discrete) else np.float32
    for explore, timestep in [(False, 0), (True, 0), (True, 10**9)]:  # 10**9: past any random warm-up
        actions, extra = s.gpu.compute_actions(obs, explore=explore, timestep=timestep)
        assert isinstance(actions, np.ndarray) and actions.shape == (16, *(space.shape or ())), (explore, actions)
        assert actions.dtype == dtype
        assert all(space.contains(a) for a in actions.astype(space.dtype)), actions
        assert all(isinstance(v, np.ndarray) and len(v) == 16 for v in extra.values()), extra
    assert_same_actions(greedy(s.gpu, obs), greedy(s.cpu, obs))
    if s.case.algo in ("ppo", "impala"):  # models with a value head: postprocessing's bootstrap values
        values = s.gpu.value(obs)
        assert isinstance(values, np.ndarray) and values.shape == (16,)
        np.testing.assert_allclose(values, s.cpu.value(obs), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", DETERMINISTIC)
def test_the_gpu_learns_what_the_cpu_learns(name: str) -> None:
    s = prepare(name)
    cpu_grads, cpu_stats = s.cpu.compute_gradients(s.batch)
    gpu_grads, gpu_stats = s.gpu.compute_gradients(s.batch)
    assert all(isinstance(g, np.ndarray) for g in gpu_grads)
    for got, expected in zip(gpu_grads, cpu_grads):
        np.testing.assert_allclose(got, expected, rtol=1e-3, atol=1e-5)
    assert gpu_stats.keys() == cpu_stats.keys()
    np.testing.assert_allclose(list(gpu_stats.values()), list(cpu_stats.values()), rtol=1e-4, atol=1e-5)
    cpu_learned, gpu_learned = s.learn(s.cpu), s.learn(s.gpu)
    assert gpu_learned.keys() == cpu_learned.keys()
    np.testing.assert_allclose(list(gpu_learned.values()), list(cpu_learned.values()), rtol=1e-3, atol=1e-4)
    if s.case.learn == "replay":  # the new priorities of the replayed rows
        td_cpu, td_gpu = s.cpu.learn(s.batch).td_error, s.gpu.learn(s.batch).td_error
        assert isinstance(td_gpu, np.ndarray) and isinstance(td_cpu, np.ndarray)
        np.testing.assert_allclose(td_gpu, td_cpu, rtol=1e-3, atol=1e-3)
    steps = s.updates() + (s.case.learn == "replay")
    assert_weights_close(s.gpu.get_weights(), s.cpu.get_weights(), float(s.config.lr or 0), steps)


@pytest.mark.parametrize("name", RANDOM)
def test_the_gpu_learns_despite_its_own_random_numbers(name: str) -> None:
    s = prepare(name)
    obs = s.observations()
    assert_same_actions(greedy(s.gpu, obs), greedy(s.cpu, obs))
    losses = []
    for _ in range(40):
        losses.append(s.gpu.learn(s.batch).stats["critic_loss"])
        s.gpu.update_target(s.config.tau)  # the plan moves the target after every step (target_network_update_freq 0)
    assert all(np.isfinite(w).all() for w in s.gpu.get_weights().values())
    assert np.isfinite(losses).all()
    assert np.mean(losses[-5:]) < 0.5 * np.mean(losses[:5]), losses


@pytest.mark.parametrize("name", list(CASES))
def test_state_moves_between_the_gpu_and_the_cpu(name: str) -> None:
    """A GPU policy's state (weights, optimizer moments, target network) holds no CUDA tensor, so that a checkpoint
    unpickles on a machine without one; a CPU policy given it acts and learns as the GPU policy does, and back."""
    s = prepare(name)
    s.learn(s.gpu)  # optimizer moments to carry
    if s.gpu.target_network is not None:
        s.gpu.update_target(0.5)  # and a target network that is neither the start's nor the model's
    state = s.gpu.get_state()
    assert tensors_off_the_cpu(state) == []
    restored = s.spec.build()
    assert isinstance(restored, TorchPolicy)
    restored.set_state(pickle.loads(pickle.dumps(state)))  # what a checkpoint does to it
    obs = s.observations()
    assert_same_actions(greedy(restored, obs), greedy(s.gpu, obs))
    if s.gpu.target_network is not None:
        assert restored.target_network is not None
        for key, expected in s.gpu.target_network.get_weights().items():
            np.testing.assert_array_equal(restored.target_network.get_weights()[key], expected)
    # Back to a fresh GPU policy from the CPU's state: both learn one more step from there.
    back = s.spec.build({"num_gpus": 1})
    assert isinstance(back, TorchPolicy)
    back.set_state(pickle.loads(pickle.dumps(restored.get_state())))
    assert back.device.type == DEVICE
    s.learn(restored)
    s.learn(back)
    assert all(np.isfinite(w).all() for w in back.get_weights().values())
    if s.case.deterministic:
        assert_weights_close(back.get_weights(), restored.get_weights(), float(s.config.lr or 0), s.updates())
