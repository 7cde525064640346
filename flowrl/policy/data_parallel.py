"""Data-parallel learning: N replicas of a policy, each on its shard of every minibatch.

Each replica (one process of a ``torch.distributed`` group: gloo on CPU, NCCL on GPU) runs the
same minibatch loop with the same shuffles, takes its :class:`Shard` of each minibatch, and
before each optimizer step :func:`synchronize_gradients` replaces its gradients by the average
over every replica's rows. Losses that are means over rows then give every replica exactly the
step one learner would take on the whole minibatch, so the replicas stay equal.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from flowrl.data import SampleBatch
from flowrl.deferred import dist, nn, torch


class Shard(NamedTuple):
    """Replica ``rank`` of ``size``: which rows of a minibatch it learns on."""

    rank: int
    size: int

    def rows(self, batch: SampleBatch, sequence_length: int = 1) -> SampleBatch:
        """This replica's contiguous share of ``batch``, in whole runs of ``sequence_length`` rows.

        Shares differ by at most one run; each replica must get at least one (ValueError otherwise).
        A batch cut into sequences (a recurrent policy's) is shared in whole sequences (and whole
        runs): each replica's share starts at the last place it may be cut at or before the start of
        its even share of the rows (as runs do), so shares are as even as the sequences allow.
        """
        if SampleBatch.SEQ_LENS in batch:
            return self._sequences(batch, sequence_length)
        runs = batch.count // sequence_length
        if runs < self.size:
            raise ValueError(
                f"a minibatch of {batch.count} rows ({runs} runs of {sequence_length}) "
                f"cannot be shared by {self.size} learners: "
                "each needs at least one run"
            )
        start = runs * self.rank // self.size * sequence_length
        end = runs * (self.rank + 1) // self.size * sequence_length
        return batch.slice(start, end)

    def _sequences(self, batch: SampleBatch, sequence_length: int) -> SampleBatch:
        bounds = batch.sequence_bounds()
        cuts = bounds[bounds % sequence_length == 0]  # where a sequence and a run both start (and the end)
        pieces = len(cuts) - 1
        if pieces < self.size:
            raise ValueError(
                f"a minibatch of {batch.count} rows in {len(bounds) - 1} sequences ({pieces} pieces of whole "
                f"sequences and runs of {sequence_length}) cannot be shared by {self.size} learners: "
                "each needs at least one piece"
            )
        # Each replica's first piece: the last cut at or before its even share of the rows, after the
        # previous replica's first piece and leaving every later replica at least one.
        starts = [0]
        for rank in range(1, self.size):
            wanted = int(np.searchsorted(cuts, batch.count * rank / self.size, side="right")) - 1
            starts.append(max(min(wanted, pieces - (self.size - rank)), starts[-1] + 1))
        starts.append(pieces)
        return batch.slice(int(cuts[starts[self.rank]]), int(cuts[starts[self.rank + 1]]))


def synchronize_gradients(
    model: nn.Module, rows: int, loss_finite: bool, group: dist.ProcessGroup | None = None
) -> bool:
    """Average ``model``'s gradients over the process group's replicas, weighted by their ``rows``.

    One all-reduce of a flat buffer carries every gradient (scaled by this replica's rows),
    which parameters have one, the row count and whether the loss was finite, so replicas with
    unequal shards still average exactly, all of them skip an update that any of them found
    non-finite, and a parameter no replica's loss reached keeps no gradient (an optimizer then
    leaves it alone, as one learner's would). Returns whether every replica's loss was finite.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    has_grad = [0.0 if p.grad is None else 1.0 for p in params]
    flat = torch.cat(
        [g.reshape(-1) * rows for g in grads]
        + [grads[0].new_tensor([*has_grad, float(rows), 0.0 if loss_finite else 1.0])]
    )
    dist.all_reduce(flat, group=group)
    reached, total_rows, nonfinite = flat[-2 - len(params) : -2].tolist(), flat[-2], flat[-1]
    # No rows anywhere (a loss that learned no step of its batch): zero gradients, as one learner's.
    averaged = flat[: -2 - len(params)] / total_rows.clamp(min=1)
    offset = 0
    for p, g, any_grad in zip(params, grads, reached):
        view = averaged[offset : offset + g.numel()].view_as(g)
        offset += g.numel()
        if not any_grad:
            p.grad = None
        elif p.grad is None:
            p.grad = view.clone()
        else:
            p.grad.copy_(view)
    return bool(nonfinite == 0)
