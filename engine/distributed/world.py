"""A run continued on another number of ranks keeps its effective batch.

The windows are micro-batch x accumulation x world size samples; a checkpoint written by
2 ranks and resumed by 1 process (or by 4) trains the same windows if the accumulation (and,
where it must, the micro-batch) changes by the ratio. Token-budget windows hold a budget of
counted items whatever the world size: nothing changes there.
"""
from __future__ import annotations

from typing import Any, Optional

from engine.declarations.config import ConfigError
from engine.declarations.events import SettingsApplied
from engine.declarations.settings import LiveSettings


def shape_for(micro_batch: int, accum: int, old_world: int, new_world: int) -> tuple[int, int]:
    """(micro_batch, accum) with micro_batch x accum x new_world = the old effective batch: the
    same micro-batch if it divides, else the largest smaller one that does."""
    effective = micro_batch * accum * old_world
    if effective % new_world:
        raise ConfigError(f"the checkpoint's effective batch is {effective} samples ({micro_batch} x {accum} x "
                          f"{old_world} ranks): it does not split over {new_world} ranks; continue on a number of "
                          f"ranks that divides {effective}")
    per_rank = effective // new_world
    micro = next(m for m in range(min(micro_batch, per_rank), 0, -1) if per_rank % m == 0)
    return micro, per_rank // micro


def keep_effective_batch(settings: LiveSettings, state: dict[str, Any], world: int, token_budget: Optional[int],
                         fixed: tuple[str, ...], step: int, epoch: int) -> tuple[LiveSettings, Optional[SettingsApplied]]:
    """The settings a checkpoint of `state["world_size"]` ranks continues with on `world`
    ranks, and the event that says so (None: nothing changed). `fixed`: the settings the user
    set for this run (a fork's changes), left as given."""
    old = int(state.get("world_size") or world)
    if old == world or token_budget is not None or {"micro_batch", "accum"} & set(fixed):
        return settings, None
    micro, accum = shape_for(settings.micro_batch, settings.accum, old, world)
    changes = [("world_size", old, world)]
    changes += [(n, getattr(settings, n), v) for n, v in (("micro_batch", micro), ("accum", accum))
                if getattr(settings, n) != v]
    return (settings.with_(micro_batch=micro, accum=accum),
            SettingsApplied(step, epoch, changes=tuple(changes), at="start", from_step=step + 1))
