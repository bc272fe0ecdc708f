"""Leaving a process group: together after a refusal every rank reached, and, after a failure,
with this rank's own error left where rank 0 (which writes run.db) can read it.

A run refused while it is built, after the group started (the ranks disagree on a flag, on
their data sets, on their models; a checkpoint that does not fit), is refused by every rank
alike: once all of them say so in the job's store, every rank leaves in order: a barrier (no
rank closes its connections while another still sends), then destroy_process_group (gloo's
threads end here, not at the interpreter's exit, where one that sees its peer's socket close
throws and aborts the process: "terminate called", exit -6). Then SIGTERM is ignored until the
process exits: torchrun's agent sends it to every other rank the moment the first one exits,
which turned the slower rank's exit 2 into -15.

A failure is this rank's alone: its peers learn of it only as a closed connection ("another
rank died"). Before it leaves, the failing rank writes its message and traceback to the job's
key-value store (torchrun's, which outlives every rank), and rank 0, failing on the closed
connection, reads them from there: run.db says what failed, on which rank.
"""
from __future__ import annotations

import datetime
import json
import signal
import time
from typing import TYPE_CHECKING, Optional

import torch.distributed as dist
from torch.distributed import distributed_c10d

if TYPE_CHECKING:
    from engine.distributed import DistContext

_KEY = "headroom/failed/"  # + rank: {"message": ..., "detail": ...}
_REFUSED = "headroom/refused"  # how many ranks refused the run while building it
REFUSAL_WAIT_S = 10.0  # ranks that refuse the same input get there within this of each other
STORE_TIMEOUT_S = 3.0  # a store that does not answer (its host gone) costs a failing rank this much at most


def leave_refused(ctx: DistContext) -> None:
    """After a run was refused while it was built (setup raised), on this rank: if every rank
    refused it too (they say so in the job's store, which no collective in flight can block),
    leave the group together, then ignore SIGTERM until this process exits. A refusal this rank
    alone reached leaves the group as a failure does (a peer may be inside a collective)."""
    if not (ctx.enabled and dist.is_initialized()):
        return
    store = _store()
    if store is None or not _all_refused(store, ctx.world):
        return
    dist.barrier()  # every rank is here, out of any other collective
    dist.destroy_process_group()
    if ctx.launched:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # leaving now, with exit 2: not -15


def _all_refused(store: dist.Store, world: int) -> bool:
    """Count this rank in, then wait (REFUSAL_WAIT_S at most) until every rank has."""
    try:
        count = store.add(_REFUSED, 1)
        deadline = time.monotonic() + REFUSAL_WAIT_S
        while count < world and time.monotonic() < deadline:
            time.sleep(0.05)
            count = store.add(_REFUSED, 0)
        return count >= world
    except Exception:  # noqa: BLE001 - the store is gone: the peers are too
        return False


def _store() -> Optional[dist.Store]:
    if not dist.is_initialized():
        return None
    try:
        store = distributed_c10d._get_default_store()  # the default group's keys in torchrun's store
        store.set_timeout(datetime.timedelta(seconds=STORE_TIMEOUT_S))
        return store
    except Exception:  # noqa: BLE001 - no store to reach: the peers learn only that this rank left
        return None


def tell_rank0(message: str, detail: str, ctx: DistContext) -> None:
    """Leave this rank's failure where rank 0 reads it (rank 0 says its own)."""
    if not ctx.enabled or ctx.is_main:
        return
    store = _store()
    if store is None:
        return
    try:
        store.set(_KEY + str(ctx.rank), json.dumps({"message": message, "detail": detail}))
    except Exception:  # noqa: BLE001 - the store's host is gone too: nothing more to do
        pass


def failed_peer(ctx: DistContext) -> Optional[tuple[int, str, str]]:
    """(rank, message, traceback) of the lowest rank that failed and said so, if any."""
    if not ctx.enabled:
        return None
    store = _store()
    if store is None:
        return None
    for rank in range(ctx.world):
        if rank == ctx.rank:
            continue
        try:
            if not store.check([_KEY + str(rank)]):
                continue
            said = json.loads(store.get(_KEY + str(rank)).decode())
            return rank, str(said["message"]), str(said["detail"])
        except Exception:  # noqa: BLE001 - the store is gone or the value unreadable: as if unsaid
            return None
    return None
