"""A run's status, the runs of a folder, and a detached start, here or on a server through ssh.
Each operation yields typed records (records.py); CtlError carries the exit code a command
line leaves with. Torch-free: `start` on this machine checks the engine's flags without torch."""
from __future__ import annotations

from typing import Iterator, Optional

from .. import local
from .. import start as starting
from ..protocol import EXIT_REMOTE, CtlError
from ..remote import RemoteRun
from .records import AnyRecord, Started, typed
from .targets import Remote, Target, remote_of, run_target, words

DETACH = starting.DETACH  # how a started run outlives the connection: auto, tmux, setsid
START_WAIT_S = starting.WAIT_S  # how long a start waits for the engine to hold its folder


def status(target: Target, *, remote_python: Optional[str] = None) -> Iterator[AnyRecord]:
    """The run's `Status`: live or not, step, epoch, settings, last loss, ETA."""
    remote, path = run_target(target)
    if remote is not None:
        yield from Remote(remote, words("status", "--", path), remote_python).records()
        return
    yield typed(local.status(path))


def runs(where: Target = "", *, remote_python: Optional[str] = None) -> Iterator[AnyRecord]:
    """A `RunListing` for each run under a runs folder, newest first: `where` here, or on a host
    (`host:` alone: that machine's runs root); '' is this machine's runs root."""
    remote = remote_of(where) if where else None
    if remote is not None:
        yield from Remote(remote, words("runs", *(["--", remote.path] if remote.path else [])),
                          remote_python).records()
        return
    for record in local.runs(str(where)):
        yield typed(record)


def start(flags: list[str], where: Target = "", *, detach: str = "auto", wait_s: Optional[float] = None,
          remote_python: Optional[str] = None) -> Iterator[AnyRecord]:
    """Start `python -m engine FLAGS` detached (in tmux when there is one), here or on a host,
    in the run folder `where` names (or a new one under that machine's runs root); a `Started`
    once the engine holds its folder. CtlError (exit 2) for flags the engine refuses: nothing
    is made or started."""
    remote = remote_of(where) if where else None
    folder = remote.path if remote is not None else str(where)
    flags = starting.with_run_dir(flags, folder, str(where))
    if remote is None:
        for record in starting.start(flags, detach, wait_s or START_WAIT_S):
            yield typed(record)
        return
    for answer in Remote(remote, starting.request(flags, detach, wait_s), remote_python).records():
        if isinstance(answer, Started):  # named as this side reaches it
            answer = typed(dict(answer.raw, target=f"{remote.host}:{answer.run_dir}"))
        yield answer


def start_on(server: RemoteRun, flags: list[str], *, remote_python: Optional[str] = None) -> Started:
    """Start a run on a server (its run folder `server.path`, or a new one there when empty) and
    return it once the engine holds its folder; CtlError says why not."""
    for answer in start(flags, server, remote_python=remote_python):
        if isinstance(answer, Started):
            return answer
    raise CtlError(f"{server.host}: headroom-ctl start said nothing about the run it started", EXIT_REMOTE)


__all__ = ["DETACH", "START_WAIT_S", "status", "runs", "start", "start_on"]
