"""The validation loss at an epoch's end: a token-weighted mean over the whole val set."""
from __future__ import annotations

from typing import Optional

import torch

from engine import distributed
from engine.accumulation import sampling
from engine.distributed.devices import to_device
from engine.distributed.strategy import Local

from .setup import RunParts


@torch.no_grad()
def validation_loss(parts: RunParts, micro_batch: int) -> Optional[float]:
    val = parts.task.val_data
    if val is None or len(val) == 0:
        return None
    model = parts.model
    model.eval()
    strategy = parts.window.strategy  # fsdp: the parameters gathered once for the pass
    try:
        with strategy.whole_model():
            loss, count = _sums(parts, strategy, micro_batch).tolist()  # a sync, once per epoch
        return loss / count if count else None
    finally:
        parts.modes.train_mode(model)  # back to training, frozen parts still in eval


def _sums(parts: RunParts, strategy: Local, micro_batch: int) -> torch.Tensor:
    """This rank's share of the val set: loss sum and count, then summed over ranks."""
    val, dev, ctx = parts.task.val_data, parts.device, parts.ctx
    shard = sampling.rank_share(list(range(len(val))), ctx.rank, ctx.world)
    total = torch.zeros(2, device=dev, dtype=torch.float64 if dev.type == "cpu" else torch.float32)
    for idx in sampling.micro_batches(shard, max(1, micro_batch)):
        batch = to_device(parts.collate([val[j] for j in idx]), dev)
        with parts.autocast():
            loss_sum, count = strategy.eval_forward(parts.task.loss, batch)
        total[0] += loss_sum.detach()
        total[1] += count
    distributed.all_reduce_sum(total, ctx)
    return total
