"""Which epoch checkpoints a run keeps (--keep-epoch-checkpoints N|all, default 3), and removing
the others.

The rule, one pure function (`epochs_to_remove`): of the run's epoch-N checkpoints, keep the
newest N, the one with the best (lowest finite) validation loss, and every one named in
`spared` (what a rollback may still pick, what a fork of this run continues from); remove the
rest. N = None keeps them all. last.pt (or a sharded run's last/) is never an epoch checkpoint,
so it is never removed. Step-S checkpoints keep their own rotation (run_state.prune_step_checkpoints)
with the same `spared` names.

Torch-free: names and numbers only; removing is unlink, or rmtree for a sharded checkpoint's
folder (sharded.py).
"""
from __future__ import annotations

import math
import os
import re
import shutil
from typing import Collection, Iterable, Mapping, Optional

from engine.declarations.checkpoint_names import name_of

_EPOCH = re.compile(r"epoch-(\d{1,18})")


def epoch_of(path: str) -> Optional[int]:
    """'.../epoch-12.pt' or '.../epoch-12' -> 12; None for any other checkpoint."""
    m = _EPOCH.fullmatch(name_of(path))
    return int(m.group(1)) if m else None


def best_epoch(epochs: Iterable[int], val_losses: Mapping[int, Optional[float]]) -> Optional[int]:
    """The epoch of the lowest finite validation loss among `epochs` (the newer on a tie: it
    trained longer for the same loss); None when none has one (a task without val data)."""
    scored = [(loss, -e, e) for e in epochs
              if isinstance(loss := val_losses.get(e), (int, float)) and math.isfinite(loss)]
    return min(scored)[2] if scored else None


def epochs_to_remove(paths: Iterable[str], val_losses: Mapping[int, Optional[float]], keep: Optional[int],
                     spared: Collection[str] = ()) -> list[str]:
    """The epoch checkpoints among `paths` to remove, oldest first. Kept: the newest `keep`
    (None: all), the best by `val_losses` (epoch -> its validation loss) among those on disk,
    and every one whose name (epoch-N) or path is in `spared`. Paths that are not epoch
    checkpoints (last, step-S) are never returned."""
    if keep is None:
        return []
    by_epoch = {e: p for p in paths if (e := epoch_of(p)) is not None}
    newest = sorted(by_epoch)[-keep:] if keep > 0 else []
    kept = set(newest)
    best = best_epoch(by_epoch, val_losses)
    if best is not None:
        kept.add(best)
    names = {name_of(s) for s in spared}
    return [p for e, p in sorted(by_epoch.items()) if e not in kept and name_of(p) not in names]


def remove(paths: Iterable[str]) -> list[str]:
    """Remove checkpoints (a file, or a sharded checkpoint's folder); the ones that went. One
    that cannot be removed (gone already, a read-only folder) stays, and training goes on."""
    gone = []
    for p in paths:
        try:
            if os.path.isdir(p):
                shutil.rmtree(p)
            else:
                os.unlink(p)
            gone.append(p)
        except OSError:
            pass
    return gone
