"""The end of a run: the commands left unread, and the run's parts let go.

The Trainer calls these from `_finish` for every ending (completed, stopped, failed), so a
run folder is always left the same way: no command row "received", the lock released only
after run.db closed, the data workers, memory sampler and process group gone.
"""
from __future__ import annotations

import logging

from engine import distributed
from engine.steering.inbox import CommandInbox

from .setup import RunParts

log = logging.getLogger("headroom.trainer")


def close_inbox(inbox: CommandInbox, ctx: distributed.DistContext, step: int, epoch: int) -> None:
    """No command row is left "received": those sent since the last look are read (one
    process only: other ranks may be gone, and this is no place for a collective), and what
    is still pending is refused as sent too late."""
    try:
        if not ctx.enabled:
            inbox.poll(step, epoch, epoch, force=True)
        inbox.close(step, epoch)
    except Exception as e:  # noqa: BLE001 - the store's own trouble is reported where it writes
        log.warning("could not mark the commands left at the end: %s", e)


def release(parts: RunParts, ctx: distributed.DistContext, clean: bool) -> None:
    """Everything the run held, after run.db closed (the folder is then free for the next writer)."""
    if parts.lock is not None:
        parts.lock.release()
    parts.probe.close()
    parts.snapshots.stop()
    parts.feeder.close()
    # the DDP wrapper first, while the world still holds the group: DDP's reducer holds it too,
    # and a reducer that drops the last reference runs the group's destructor with the GIL held,
    # which joins gloo's threads while one of them waits for the GIL (a hang, seen in CI)
    parts.window.strategy.release()
    distributed.shutdown(ctx, clean=clean)
