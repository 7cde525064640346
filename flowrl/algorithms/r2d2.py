"""R2D2: recurrent experience replay in distributed RL (Kapturowski et al. 2019).

A recurrent Q-network (:class:`~flowrl.policy.recurrent_q.RecurrentQModel`) learns from replayed
sequences of ``replay_sequence_length`` steps, each stored with the recurrent state the workers acted
from, overlapping by half, and prioritized by ``eta * max + (1 - eta) * mean`` of their absolute TD
errors. The loss runs the first ``replay_burn_in`` steps of each sequence through the online and
target networks without gradient, to warm their states, then learns n-step double-Q targets with
the value rescaling ``h(x) = sign(x) (sqrt(|x| + 1) - 1) + epsilon x`` on the other steps.

Plan: Ape-X's (rollout workers store into replay shards || shards feed a learner thread || its
priorities go back), with sequences as the replay's items; with ``num_workers: 0`` DQN's in one
process (store || replay -> train -> priorities -> target updates, round robin).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import gymnasium as gym

from flowrl.actors import PlanResources, WorkerSet
from flowrl.actors.placement import BundleRequest
from flowrl.algorithms import apex, dqn
from flowrl.algorithms.registry import Algorithm
from flowrl.config import cfg_field
from flowrl.data import SampleBatch
from flowrl.deferred import DeferredModule, nn, torch
from flowrl.iterators import LocalIterator
from flowrl.policy import LossOutput, PolicySpec, TorchPolicy
from flowrl.policy.distributions import DistFactory
from flowrl.policy.recurrent_q_policy import RecurrentQPolicy, dueling_recurrent_q_model, recurrent_q_model

if TYPE_CHECKING:
    from flowrl.policy import recurrent, recurrent_q
else:  # torch modules: imported when a policy is built or a loss runs
    recurrent = DeferredModule("flowrl.policy.recurrent")
    recurrent_q = DeferredModule("flowrl.policy.recurrent_q")


@dataclass(kw_only=True)
class R2D2Config(apex.ApexConfig):
    """R2D2 settings: Ape-X's keys (DQN's plus the replay tier) and the replay of sequences.

    ``train_batch_size`` counts steps: each replay draws ``train_batch_size // replay_sequence_length``
    sequences. ``target_network_update_freq`` counts steps trained. The model is always an LSTM
    (``model.lstm_cell_size``, ``lstm_use_prev_action``, ``lstm_use_prev_reward`` apply; ``use_lstm``
    and ``max_seq_len`` are not read).
    """

    defaults = {
        "num_envs_per_worker": 1,
        "rollout_fragment_length": 40,
        "train_batch_size": 320,
        "lr": 1e-3,
        "gamma": 0.99,
        "learning_starts": 1000,
        "target_network_update_freq": 32_000,
        "timesteps_per_iteration": 1000,
        "model": {"fcnet_hiddens": [64], "lstm_cell_size": 64},
        "exploration_config": {
            "type": "EpsilonGreedy",
            "initial_epsilon": 1.0,
            "final_epsilon": 0.02,
            "epsilon_timesteps": 10_000,
        },
        "worker_side_prioritization": False,
    }
    # RLlib's R2D2 defaults are not recorded (nor Ape-X's inherited): an RLlib config runs on flowrl's.
    rllib_defaults = {}
    learns_from_sequences = True

    num_workers: int = cfg_field(
        2,
        "Remote rollout workers (the Ape-X plan, with replay shards and a learner thread); "
        "0: sample and learn in one process (DQN's plan).",
        min=0,
    )
    buffer_size: int = cfg_field(10_000, "Replay capacity in sequences (split over the replay shards).", min=1)
    replay_sequence_length: int = cfg_field(
        20,
        "Steps per replayed sequence; the sequences start every replay_sequence_length // 2 steps of an "
        "episode (overlapping by half), and never span two episodes or two sampled fragments.",
        min=2,
    )
    replay_burn_in: int = cfg_field(
        0,
        "Steps at the start of each sequence that only warm the networks' states (no loss, no gradient); "
        "a sequence that starts its episode has none (its stored state is the episode's initial one).",
        min=0,
    )
    zero_init_states: bool = cfg_field(
        False,
        "Start each replayed sequence from a zero state instead of the state the worker acted from.",
    )
    use_h_function: bool = cfg_field(
        True, "Rescale values with h(x) = sign(x) (sqrt(|x| + 1) - 1) + eps x in the TD targets."
    )
    h_function_epsilon: float = cfg_field(1e-3, "The eps of h(x).", min=0, min_exclusive=True)
    priority_eta: float = cfg_field(
        0.9,
        "A sequence's priority is eta * max + (1 - eta) * mean of its steps' absolute TD errors.",
        min=0,
        max=1,
    )

    def check(self) -> list[str]:
        problems = super().check()
        length = self.replay_sequence_length
        if self.replay_burn_in >= length:
            problems.append(
                f"replay_burn_in={self.replay_burn_in} >= replay_sequence_length={length}: "
                "no step of a sequence would be learned"
            )
        if self.rollout_fragment_length < length:
            problems.append(
                f"rollout_fragment_length={self.rollout_fragment_length} < replay_sequence_length={length}: "
                "a sequence never spans two fragments, so none would be that long"
            )
        if self.worker_side_prioritization:
            problems.append(
                "worker_side_prioritization=True is not available for r2d2: a sequence's priority mixes the TD "
                "errors of its steps after a burn-in through the recurrent state, which only the learner computes "
                "(sequences enter replay at the max priority); set worker_side_prioritization: false"
            )
        if self.num_workers == 0 and self.exploration_config.get("type") == "PerWorkerEpsilonGreedy":
            problems.append(
                "exploration_config type 'PerWorkerEpsilonGreedy' with num_workers=0 never explores (the local "
                "worker acts greedily); use 'EpsilonGreedy' or num_workers >= 1"
            )
        return problems

    def _recurrent_problems(self) -> list[str]:
        # R2D2's model is always recurrent, whatever model.use_lstm says.
        unsupported = []
        if self.policies:
            unsupported.append("multi-agent policies are not recurrent yet (single-agent envs are)")
        return [f"r2d2 (a recurrent Q-network): {why}" for why in unsupported]


def value_rescale(x: torch.Tensor, eps: float) -> torch.Tensor:
    """``h(x) = sign(x) (sqrt(|x| + 1) - 1) + eps x`` (Pohlen et al. 2018): squashes large returns."""
    return torch.sign(x) * (torch.sqrt(x.abs() + 1) - 1) + eps * x


def inverse_value_rescale(x: torch.Tensor, eps: float) -> torch.Tensor:
    """``h^-1``, the inverse of :func:`value_rescale` (``eps > 0``)."""
    root = (torch.sqrt(1 + 4 * eps * (x.abs() + 1 + eps)) - 1) / (2 * eps)
    return torch.sign(x) * (root.pow(2) - 1)


def sequence_priorities(abs_td: torch.Tensor, mask: torch.Tensor, eta: float) -> torch.Tensor:
    """Each sequence's priority ``eta * max + (1 - eta) * mean`` of ``abs_td`` (``[B, T]``) over its
    ``mask``ed steps; 0 for a sequence with none."""
    masked = abs_td * mask
    mean = masked.sum(1) / mask.sum(1).clamp(min=1)
    return eta * masked.max(1).values + (1 - eta) * mean


def _steps_then(rows: torch.Tensor, after: torch.Tensor, seq_lens: torch.Tensor, T: int) -> torch.Tensor:
    """``rows`` padded to ``[B, T + 1, ...]`` with ``after`` (one per sequence) right after each sequence's end."""
    padded = recurrent.pad(rows, seq_lens, T + 1)
    padded[torch.arange(len(seq_lens), device=rows.device), seq_lens] = after
    return padded


def r2d2_loss(
    policy: TorchPolicy[R2D2Config],
    model: nn.Module,
    dist_class: DistFactory,
    batch: dict[str, torch.Tensor],
) -> LossOutput:
    """n-step double-Q loss on replayed sequences after a burn-in, with value rescaling, masked to the
    learned steps; the TD errors give each sequence's priority (repeated on its rows)."""
    config = policy.config
    seq_lens = batch[SampleBatch.SEQ_LENS].long()
    # At least one step after the burn-in, so a batch of sequences no longer than it (short episodes) learns
    # nothing instead of slicing empty time axes.
    T = max(int(seq_lens.max()), config.replay_burn_in + 1)
    last = torch.cumsum(seq_lens, 0) - 1
    # Each sequence's steps and the observation after its last one (bootstraps the steps near its end).
    obs = _steps_then(batch[SampleBatch.OBS], batch[SampleBatch.NEW_OBS][last], seq_lens, T)
    inputs: list[torch.Tensor | None] = [obs]
    for key, after in (
        (SampleBatch.PREV_ACTIONS, SampleBatch.ACTIONS),
        (SampleBatch.PREV_REWARDS, SampleBatch.REWARDS),
    ):
        inputs.append(_steps_then(batch[key], batch[after][last], seq_lens, T) if key in batch else None)
    state = [batch[f"{SampleBatch.STATE_IN}{k}"] for k in range(2)]
    if config.zero_init_states:
        state = [torch.zeros_like(s) for s in state]
    burn = min(config.replay_burn_in, T)
    starts = last - seq_lens + 1
    # A sequence that starts its episode starts from the episode's own initial state, which needs no
    # warming: all its steps are learned (else no episode's first replay_burn_in steps ever would be).
    from_start = batch[SampleBatch.T][starts] == 0 if burn and SampleBatch.T in batch else None
    net = recurrent_q.RecurrentQModel

    def q_over_steps(q_model: recurrent_q.RecurrentQModel) -> torch.Tensor:
        """Q-values of steps 0..T (``[B, T + 1, A]``): from step ``burn`` on, from the state warmed on the
        steps before it without gradient; a sequence that starts its episode, from its first step."""
        if not burn:
            return q_model.forward_sequences(*_time_slice(inputs, 0, T + 1, state))[0]
        with torch.no_grad():
            _, _, warm = q_model.forward_sequences(*_time_slice(inputs, 0, burn, state))
        warmed = q_model.forward_sequences(*_time_slice(inputs, burn, T + 1, warm))[0]
        q = torch.cat([warmed.new_zeros((len(seq_lens), burn, warmed.shape[-1])), warmed], 1)
        if from_start is None or not bool(from_start.any()):
            return q
        # Only the sequences that start their episode run again, whole, from their stored state.
        rows = from_start.nonzero().squeeze(1)
        picked = [None if x is None else x[rows] for x in inputs]
        whole = q_model.forward_sequences(*_time_slice(picked, 0, T + 1, [s[rows] for s in state]))[0]
        return q.index_copy(0, rows, whole)

    online: recurrent_q.RecurrentQModel = model  # type: ignore[assignment]
    assert isinstance(online, net) and isinstance(policy.target_model, net)
    q_values = q_over_steps(online)
    steps = torch.arange(T, device=seq_lens.device)[None, :]
    with torch.no_grad():
        q_target = q_over_steps(policy.target_model)
        rewards = recurrent.pad(batch[SampleBatch.REWARDS].float(), seq_lens, T + config.n_step)
        returns = sum(config.gamma**k * rewards[:, k : k + T] for k in range(config.n_step))
        # Step t sums m = min(n, len - t) rewards and bootstraps from step t + m (len: the observation after
        # the sequence), unless that is the end of an episode that terminated.
        summed = (seq_lens[:, None] - steps).clamp(min=0, max=config.n_step)
        boot = (steps + summed).clamp(max=T)
        terminated = batch[SampleBatch.TERMINATEDS][last].bool()[:, None] & (steps + summed == seq_lens[:, None])
        chooser = q_values if config.double_q else q_target
        best = chooser.gather(1, boot[..., None].expand(-1, -1, chooser.shape[-1])).argmax(-1, keepdim=True)
        q_boot = q_target.gather(1, boot[..., None].expand(-1, -1, q_target.shape[-1])).gather(2, best).squeeze(-1)
        eps = config.h_function_epsilon
        if config.use_h_function:
            q_boot = inverse_value_rescale(q_boot, eps)
        target = returns + config.gamma**summed * (~terminated) * q_boot
        if config.use_h_function:
            target = value_rescale(target, eps)
    actions = recurrent.pad(batch[SampleBatch.ACTIONS].long(), seq_lens, T)
    q_taken = q_values[:, :T].gather(2, actions[..., None]).squeeze(-1)
    learned_step = steps >= burn if from_start is None else (steps >= burn) | from_start[:, None]
    mask = ((steps < seq_lens[:, None]) & learned_step).float()
    weights = batch[SampleBatch.WEIGHTS][starts] if SampleBatch.WEIGHTS in batch else torch.ones_like(mask[:, 0])
    per_step = nn.functional.smooth_l1_loss(q_taken, target, reduction="none") * mask
    learned = mask.sum().clamp(min=1)
    loss = (weights[:, None] * per_step).sum() / learned
    priorities = sequence_priorities((q_taken - target).detach().abs(), mask, config.priority_eta)
    mean_loss, mean_q = torch.stack([loss, (q_taken * mask).sum() / learned]).detach().tolist()
    stats = {"loss": mean_loss, "mean_q": mean_q, "learned_steps": float(mask.sum())}
    return LossOutput(loss, stats, torch.repeat_interleave(priorities, seq_lens))


def _time_slice(
    inputs: list[torch.Tensor | None], start: int, end: int, state: list[torch.Tensor]
) -> tuple[Any, list[torch.Tensor], Any, Any]:
    """The arguments of ``forward_sequences`` for steps ``start..end`` of ``[obs, prev_actions, prev_rewards]``
    (each ``[B, T, ...]``, or None) from ``state``."""
    obs, prev_actions, prev_rewards = (None if x is None else x[:, start:end] for x in inputs)
    return obs, state, prev_actions, prev_rewards


def make_r2d2_policy(obs_space: gym.Space[Any], action_space: gym.Space[Any], config: R2D2Config) -> PolicySpec:
    """A recurrent Q policy with a target network and the R2D2 loss (no postprocessing: n-step
    returns are made in the loss, from whole sequences)."""
    kwargs = {
        "loss_fn": r2d2_loss,
        "make_model": dueling_recurrent_q_model if config.dueling else recurrent_q_model,
        "model_interface": None,
        "target_network": True,
    }
    return PolicySpec(RecurrentQPolicy, obs_space, action_space, config, kwargs)


def bundles(config: R2D2Config) -> list[BundleRequest]:
    """Ape-X's replay shard bundles; none in one process."""
    return apex.bundles(config) if config.num_workers else []


def make_resources(workers: WorkerSet, config: R2D2Config) -> PlanResources:
    """Ape-X's replay shards and learner thread, or with ``num_workers: 0`` DQN's local replay buffer."""
    return apex.make_resources(workers, config) if config.num_workers else dqn.make_resources(workers, config)


def execution_plan(workers: WorkerSet, config: R2D2Config, resources: PlanResources) -> LocalIterator[dict[str, Any]]:
    """Ape-X's plan over replayed sequences, or with ``num_workers: 0`` DQN's."""
    plan = apex.execution_plan if config.num_workers else dqn.execution_plan
    return plan(workers, config, resources)


ALGORITHM = Algorithm(
    "r2d2",
    "R2D2: recurrent Q-learning on distributed prioritized replay of sequences",
    R2D2Config,
    make_r2d2_policy,
    execution_plan,
    make_resources=make_resources,
    bundles=bundles,
    live_keys=frozenset({"lr"}),
    asynchronous=True,
    learner_group=True,
)
