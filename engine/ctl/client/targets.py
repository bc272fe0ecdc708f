"""Where a client operation goes: a run folder on this machine, or a `RemoteRun` (`[user@]host:path`)
reached through the system's OpenSSH client (engine/ctl/remote.py); and the one transport for
the latter, whose records arrive typed. Torch-free."""
from __future__ import annotations

from typing import Iterator, Optional, Union

from ..protocol import PROTOCOL, CtlError
from ..remote import RemoteCommand, RemoteRun, default_python, parse_target
from .records import AnyRecord, typed

# A run folder or runs folder here, `[user@]host:path` as text, or a RemoteRun.
Target = Union[str, RemoteRun]


def remote_of(target: Target) -> Optional[RemoteRun]:
    """The RemoteRun a target names; None for a folder on this machine (CtlError: a bad host)."""
    return target if isinstance(target, RemoteRun) else parse_target(target)


def run_target(target: Target) -> tuple[Optional[RemoteRun], str]:
    """A run's target: (the remote, or None) and the run folder's path; CtlError when a remote
    target names no folder (`host:`)."""
    remote = remote_of(target)
    if remote is None:
        return None, str(target)
    if not remote.path:
        raise CtlError(f"{remote}: give the run folder's path after the colon")
    return remote, remote.path


def words(command: str, *options: str) -> list[str]:
    """engine.ctl's words for a command on the remote: --json and this side's protocol first."""
    return [command, "--json", "--protocol", str(PROTOCOL), *options]


class Remote:
    """One engine.ctl command on a remote through ssh, its records typed; `close` ends it from
    another thread (a follow the window stops reading)."""

    def __init__(self, remote: RemoteRun, ctl_args: list[str], remote_python: Optional[str] = None,
                 silence_s: Optional[float] = None) -> None:
        self.command = RemoteCommand(remote.host, remote_python or default_python(), ctl_args, silence_s)

    def records(self) -> Iterator[AnyRecord]:
        for record in self.command.records():
            yield typed(record)

    @property
    def pid(self) -> Optional[int]:
        """The ssh client's process id once it started (None before)."""
        proc = self.command.proc
        return proc.pid if proc is not None else None

    def close(self) -> None:
        self.command.close()


__all__ = ["Target", "remote_of", "run_target", "words", "Remote"]
