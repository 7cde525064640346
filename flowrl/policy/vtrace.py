"""V-trace off-policy value targets and policy-gradient advantages (Espeholt et al. 2018, eq. 1).

Inputs are time-major ``[T, B]`` tensors of one trajectory piece per column. ``next_values``
is V(x_{t+1}) for each step, the value of the step's own next observation, so a truncated
episode bootstraps from its final observation. ``discounts`` is gamma where the episode
goes on after step t and 0 where it terminated; ``continues`` is 0 wherever the next row
of the column belongs to another episode (terminated or truncated), which cuts the
correction that otherwise flows back from later steps.

A recurrent policy's fragments come cut into sequences (never across a fragment's start or an
episode's end): :func:`fragment_outputs` runs the model over them from each sequence's recorded
``state_in_*`` (the fragment's initial state, or the reset state where an episode starts inside
the fragment), and bootstraps each sequence's last row from the state after it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, cast

import numpy as np

from flowrl.data import SampleBatch
from flowrl.deferred import nn, torch

if TYPE_CHECKING:
    from flowrl.policy.recurrent import SequenceModel
    from flowrl.policy.torch_policy import TorchPolicy


class VTraceConfig(Protocol):
    """The keys :func:`batch_vtrace` reads from a policy's config (IMPALA's and APPO's)."""

    rollout_fragment_length: int
    gamma: float
    vtrace_clip_rho_threshold: float
    vtrace_clip_pg_rho_threshold: float
    vtrace_clip_c_threshold: float


class VTraceReturns(NamedTuple):
    """``vs``: V-trace value targets; ``pg_advantages``: advantages for the policy gradient."""

    vs: torch.Tensor
    pg_advantages: torch.Tensor


def vtrace(
    log_rhos: torch.Tensor,
    discounts: torch.Tensor,
    rewards: torch.Tensor,
    values: torch.Tensor,
    next_values: torch.Tensor,
    continues: torch.Tensor,
    clip_rho_threshold: float | None = 1.0,
    clip_pg_rho_threshold: float | None = 1.0,
    clip_c_threshold: float | None = 1.0,
) -> VTraceReturns:
    """V-trace targets ``v_s`` and advantages ``rho_s (r_s + gamma v_{s+1} - V(x_s))``.

    ``log_rhos`` = log pi(a|x) - log mu(a|x) (target minus behaviour). The thresholds are
    rho-bar (for the targets), the policy-gradient rho clip, and c-bar; None disables one.
    """
    with torch.no_grad():  # targets: no gradient flows through them
        rhos = torch.exp(log_rhos)
        clipped_rhos = rhos if clip_rho_threshold is None else torch.clamp(rhos, max=clip_rho_threshold)
        cs = rhos if clip_c_threshold is None else torch.clamp(rhos, max=clip_c_threshold)
        deltas = clipped_rhos * (rewards + discounts * next_values - values)
        corrections = backward_recursion(deltas, discounts * cs * continues)
        vs = values + corrections
        # v_{s+1}: the next row's target while the episode goes on, else the bootstrap value.
        next_vs = next_values.clone()
        next_vs[:-1] = torch.where(continues[:-1].bool(), vs[1:], next_values[:-1])
        pg_rhos = rhos if clip_pg_rho_threshold is None else torch.clamp(rhos, max=clip_pg_rho_threshold)
        pg_advantages = pg_rhos * (rewards + discounts * next_vs - values)
        return VTraceReturns(vs=vs, pg_advantages=pg_advantages)


def backward_recursion(deltas: torch.Tensor, coeffs: torch.Tensor) -> torch.Tensor:
    """``acc_t = deltas_t + coeffs_t acc_{t+1}`` (``acc_T = 0``) over the time axis of ``[T, B]`` tensors.

    Here ``vs_t - V(x_t) = delta_t + gamma_t c_t (vs_{t+1} - V(x_{t+1}))``, cut where the episode
    ends. The loop runs in NumPy: one PyTorch op per step costs several times its arithmetic on
    a learner's small ``[B]`` rows, and V-trace needs no gradient.
    """
    d, k = deltas.detach().cpu().numpy(), coeffs.detach().cpu().numpy()
    out = np.empty_like(d)
    acc = np.zeros_like(d[0])
    for t in range(len(d) - 1, -1, -1):
        acc *= k[t]
        acc += d[t]
        out[t] = acc
    return torch.from_numpy(out).to(deltas.device)


def time_major(x: torch.Tensor, horizon: int) -> torch.Tensor:
    """Rows of whole fragments (one env's ``horizon`` steps after another) as ``[horizon, num_fragments, ...]``."""
    return x.reshape(-1, horizon, *x.shape[1:]).transpose(0, 1)


def next_state_values(
    model: nn.Module, batch: dict[str, torch.Tensor], values: torch.Tensor, horizon: int
) -> torch.Tensor:
    """V(x_{t+1}) for each row of a batch of whole ``horizon``-row fragments, without gradient.

    ``values`` are the model's values of the batch's observations. Where the episode goes
    on in the next row, the row's next observation is that row's observation, so its value
    is read from ``values``; only the last row of each fragment and truncated rows (whose
    final observation starts no row) run the model, on their ``new_obs``. After a terminated
    row the value does not count (its discount is 0).
    """
    next_values = torch.empty_like(values, requires_grad=False)
    next_values[:-1] = values[1:].detach()
    own = batch[SampleBatch.TRUNCATEDS].bool().clone()
    own[horizon - 1 :: horizon] = True
    rows = own.nonzero().squeeze(1)
    with torch.no_grad():
        _, bootstrap = model(batch[SampleBatch.NEW_OBS][rows])
    next_values[rows] = bootstrap
    return next_values


class FragmentOutputs(NamedTuple):
    """A model's outputs for each row of a batch of whole fragments: distribution inputs, values
    (with gradient) and V(x_{t+1}) (without)."""

    dist_inputs: torch.Tensor
    values: torch.Tensor
    next_values: torch.Tensor


def fragment_outputs(
    policy: TorchPolicy[Any], model: nn.Module, batch: dict[str, torch.Tensor], horizon: int
) -> FragmentOutputs:
    """``model``'s outputs for a batch of whole ``horizon``-row fragments, what V-trace reads.

    A batch cut into sequences runs through the recurrent model from each sequence's ``state_in_*``
    with one more step after each sequence's last row: its ``new_obs`` from the state after that row
    gives the row's next value (a fragment's end, a truncation, or a cut at ``max_seq_len``), and
    inside a sequence the next row's value is the next value; padding reaches no output.
    """
    if SampleBatch.SEQ_LENS not in batch:
        dist_inputs, values = policy.model_outputs(model, batch)
        assert values is not None, "V-trace needs a model with a value head"
        return FragmentOutputs(dist_inputs, values, next_state_values(model, batch, values, horizon))
    recurrent = cast("SequenceModel", model)
    dist_inputs, values, bootstrap = recurrent.forward_rows_and_bootstrap(batch, policy.learn_times.loading)
    next_values = torch.empty_like(values, requires_grad=False)
    next_values[:-1] = values[1:].detach()
    next_values[torch.cumsum(batch[SampleBatch.SEQ_LENS].long(), 0) - 1] = bootstrap.detach()
    return FragmentOutputs(dist_inputs, values, next_values)


def batch_vtrace(
    config: VTraceConfig,
    batch: dict[str, torch.Tensor],
    target_logp: torch.Tensor,
    values: torch.Tensor,
    next_values: torch.Tensor,
) -> VTraceReturns:
    """V-trace targets (time-major) of a batch of whole fragments for a target policy's log-probabilities.

    ``target_logp``, ``values`` and ``next_values`` are per row; no gradient flows through them.
    The fragments are ``config.rollout_fragment_length`` rows each.
    """
    horizon = config.rollout_fragment_length
    terminated = batch[SampleBatch.TERMINATEDS].float()
    ended = torch.maximum(terminated, batch[SampleBatch.TRUNCATEDS].float())

    def tm(x: torch.Tensor) -> torch.Tensor:
        return time_major(x.detach(), horizon)

    return vtrace(
        log_rhos=tm(target_logp - batch[SampleBatch.ACTION_LOGP]),
        discounts=tm(config.gamma * (1.0 - terminated)),
        rewards=tm(batch[SampleBatch.REWARDS].float()),
        values=tm(values),
        next_values=tm(next_values),
        continues=tm(1.0 - ended),
        clip_rho_threshold=config.vtrace_clip_rho_threshold,
        clip_pg_rho_threshold=config.vtrace_clip_pg_rho_threshold,
        clip_c_threshold=config.vtrace_clip_c_threshold,
    )
