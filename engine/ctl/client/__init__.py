"""The client API of headroom-ctl: list, follow, steer and start runs on this machine or on a
server through the system's OpenSSH client, with typed records. The app imports only this
(an import-linter contract), and headroom-ctl's command line (engine/ctl/cli.py) is built on it.

- where: a run folder here, or `[user@]host:path` (text, or a `RemoteRun`): `is_remote`,
  `parse_target`; on the server, `remote_python` (default `default_python()`) runs engine.ctl;
  the ssh command is $HEADROOM_SSH_COMMAND (`SSH_ENV`), else `set_ssh_fallback`'s, else ssh;
- operations: `status`, `runs`, `steer` (a `SteerRequest`, or `request_for(command)`),
  `Following` (a follow, closable from another thread), `start` and `start_on` (detached there),
  `label` and `label_run` (a run's tags, note, archived: read or changed);
- records (records.py): `Status`, `RunListing`, `CommandAnswer`, `Started`, `Labelled`, and a
  follow's `Info`, `Rows`, `Scalars`, `Event`, `Rewind`, `CaughtUp`, `Heartbeat`, `End`; `Other` for a kind
  a newer engine added. Each keeps the protocol record it was read from (`raw`);
- failures: `CtlError` with the exit code (`EXIT_REMOTE`: the remote not reached, or the
  connection broke), `ProtocolError` (the other side speaks another protocol).

Torch-free and Qt-free: a laptop without torch follows a server's run.
"""
from __future__ import annotations

from ..protocol import EXIT_BAD_INPUT, EXIT_NOT_LIVE, EXIT_REFUSED, EXIT_REMOTE, PROTOCOL, CtlError, ProtocolError
from ..remote import PYTHON_ENV, SSH_ENV, RemoteRun, default_python, is_remote, parse_target, set_ssh_fallback
from .following import Following
from .labelling import label, label_run
from .operations import DETACH, START_WAIT_S, runs, start, start_on, status
from .records import (
                      AnyRecord,
                      CaughtUp,
                      CommandAnswer,
                      End,
                      Event,
                      Heartbeat,
                      Info,
                      Labelled,
                      Other,
                      Record,
                      Rewind,
                      Rows,
                      RunListing,
                      Scalars,
                      Started,
                      Status,
                      typed,
)
from .steering import ACTIONS, SteerRequest, request_for, steer
from .targets import Target

__all__ = [
    # where
    "Target", "RemoteRun", "is_remote", "parse_target", "default_python", "set_ssh_fallback", "SSH_ENV",
    "PYTHON_ENV",
    # operations
    "status", "runs", "steer", "SteerRequest", "request_for", "ACTIONS", "Following", "start", "start_on", "DETACH",
    "START_WAIT_S", "label", "label_run",
    # records
    "Record", "AnyRecord", "typed", "Status", "RunListing", "CommandAnswer", "Started", "Labelled", "Info", "Rows",
    "Scalars",
    "Event", "Rewind", "CaughtUp", "Heartbeat", "End", "Other",
    # failures
    "CtlError", "ProtocolError", "PROTOCOL", "EXIT_BAD_INPUT", "EXIT_REFUSED", "EXIT_NOT_LIVE", "EXIT_REMOTE",
]
