"""What a failed run says: one line naming the cause and where it was raised (run_failed's
message and the console's `error:` line, built here for both), and the full traceback
(run_failed's detail in run.db). Under torchrun the rank that failed leaves both for rank 0,
which writes run.db (failure_report, engine/distributed/leaving.py).

An exception raised in a DataLoader worker reaches the training process as a copy whose
message is the worker's whole traceback as text ("Caught ValueError in DataLoader worker
process 1. Original Traceback ..."): its cause is that traceback's last exception, and
where it happened is the innermost frame in the task's own code, not torch's or Python's.
"""
from __future__ import annotations

import os
import re
import sysconfig
import traceback
from dataclasses import dataclass
from typing import Iterable, Optional

from engine import distributed
from engine.declarations.config import ConfigError

DETAIL_CHARS = 20_000  # run_failed's traceback in run.db: its end (the cause) is kept
_WORKER = re.compile(r"Caught \w+ in DataLoader worker process (\d+)")
_FRAME = re.compile(r'^  File "(.+)", line (\d+), in (.+)$')


@dataclass(frozen=True)
class Frame:
    path: str
    line: int
    func: str

    def __str__(self) -> str:
        return f"{_shown_path(self.path)}:{self.line} in {self.func}"


def failure_message(e: BaseException, ctx: distributed.DistContext, user_errors: tuple[type, ...]) -> str:
    """One line for run_failed and the console: the user's message for our own errors, else
    the exception (a worker's own, for one raised in a DataLoader worker) and where it was raised."""
    if isinstance(e, KeyboardInterrupt):
        return "interrupted"
    if ctx.enabled and isinstance(e, RuntimeError) and is_peer_failure(e):
        peer = distributed.failed_peer(ctx)
        if peer is not None:  # the rank that failed said why before it left
            return f"rank {peer[0]} of this {ctx.world}-process job failed: {peer[1]}"
        first = str(e).strip().splitlines()[0][:200]
        return f"another rank of this {ctx.world}-process job died or stopped answering ({first})"
    if isinstance(e, user_errors + (ConfigError,)) and e.args:
        return str(e.args[0])
    worker = worker_error(str(e))
    if worker is not None:
        return worker
    frame = innermost(_frames_of(e))
    return f"{type(e).__name__}: {e}" + (f" (at {frame})" if frame else "")


def failure_report(e: BaseException, ctx: distributed.DistContext, user_errors: tuple[type, ...]) -> tuple[str, str]:
    """run_failed's message and traceback. Under torchrun a rank's own failure is also left for
    rank 0 (which alone writes run.db), and rank 0, failing because a peer left, reports that
    peer's message and traceback (above its own)."""
    message, detail = failure_message(e, ctx, user_errors), failure_detail(e)
    peer = distributed.failed_peer(ctx) if ctx.enabled and isinstance(e, RuntimeError) and is_peer_failure(e) else None
    if peer is not None:
        detail = _capped(f"rank {peer[0]}:\n{peer[2]}\nrank {ctx.rank} (which then lost it):\n{detail}")
    elif not (isinstance(e, RuntimeError) and is_peer_failure(e)):
        distributed.tell_rank0(message, detail, ctx)
    return message, detail


def failure_detail(e: BaseException) -> str:
    """The full traceback (with a worker's own inside its message), capped at its end."""
    try:
        text = "".join(traceback.format_exception(e))
    except Exception:  # a message that cannot be formatted
        text = f"{type(e).__name__}"
    return _capped(text)


def _capped(text: str) -> str:
    return text if len(text) <= DETAIL_CHARS else "…" + text[-DETAIL_CHARS:]


def worker_error(text: str) -> Optional[str]:
    """'ValueError: sample 13 is corrupt (DataLoader worker 1, at task.py:12 in helper)' for the
    text of an exception re-raised from a worker; None for any other."""
    m = _WORKER.search(text)
    if m is None or "Original Traceback" not in text:
        return None
    last = text.rsplit("Traceback (most recent call last):", 1)[-1].splitlines()
    frames, cause_at = [], 0
    for k, line in enumerate(last):
        f = _FRAME.match(line)
        if f:
            frames.append(Frame(f.group(1), int(f.group(2)), f.group(3)))
            cause_at = k + 1
        elif frames and line.startswith("    "):  # the frame's source line, its ^^^ marks
            cause_at = k + 1
    cause = " ".join(ln.strip() for ln in last[cause_at:] if ln.strip()) or "an error"
    frame = innermost(frames)
    return f"{cause} (DataLoader worker {m.group(1)}" + (f", at {frame})" if frame else ")")


def innermost(frames: list[Frame]) -> Optional[Frame]:
    """The innermost frame in the task's own code; else the innermost frame at all."""
    for f in reversed(frames):
        if _is_users(f.path):
            return f
    return frames[-1] if frames else None


def is_peer_failure(e: BaseException) -> bool:
    text = str(e).lower()
    return any(k in text for k in ("connection closed by peer", "connection reset", "broken pipe", "nccl",
                                   "timed out", "socket", "gloo"))


def _frames_of(e: BaseException) -> list[Frame]:
    return [Frame(fs.filename, fs.lineno or 0, fs.name) for fs in traceback.extract_tb(e.__traceback__)]


def _library_folders() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    folders = {paths.get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    folders.add(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the engine itself
    return tuple(os.path.join(os.path.abspath(f), "") for f in folders if f)


_LIBRARIES = _library_folders()


def _is_users(path: str) -> bool:
    if path.startswith("<"):  # <frozen ...>, <string>
        return False
    full = os.path.abspath(path)
    parts: Iterable[str] = full.split(os.sep)
    return not (full.startswith(_LIBRARIES) or "site-packages" in parts or "dist-packages" in parts)


def _shown_path(path: str) -> str:
    """A path under the current folder relative to it (shorter), else as the traceback gave it."""
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return rel if not rel.startswith("..") else path
