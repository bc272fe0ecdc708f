"""Steering a run: what `set`, `pause`, `unpause` and `stop` send, as one typed request, from
headroom-ctl's words or from a command the app built (engine/declarations/commands.py). The
request goes to the run folder's store here (engine/ctl/local.py) or, as KEY=VALUE words, to
engine.ctl on a server, which validates them as headroom-ctl here does. Torch-free."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterator, Literal, Optional

from engine.declarations.commands import Command, Pause, SetPrecision, Stop, Unpause, setting_change
from engine.declarations.config import ConfigError

from .. import local
from ..protocol import CtlError
from .records import AnyRecord, typed
from .targets import Remote, Target, run_target, words

Action = Literal["set", "pause", "unpause", "stop"]
ACTIONS: tuple[Action, ...] = ("set", "pause", "unpause", "stop")


@dataclass(frozen=True)
class SteerRequest:
    """`set` with KEY=VALUE changes applied at the next step or epoch, or pause, unpause, stop.
    `client`: who sends it ("agent": headroom-ctl mcp), kept in each command row (Command.sent_by)."""
    action: Action
    changes: tuple[str, ...] = ()
    at: Literal["step", "epoch"] = "epoch"
    client: str = ""


def _value_word(value: object) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return repr(value) if isinstance(value, float) else str(value)


def request_for(command: Command) -> SteerRequest:
    """The request that sends `command` (CtlError for one headroom-ctl does not send)."""
    if isinstance(command, Pause):
        return SteerRequest("pause")
    if isinstance(command, Unpause):
        return SteerRequest("unpause")
    if isinstance(command, Stop):
        return SteerRequest("stop")
    change = setting_change(command)
    if change is not None:
        setting, value = change
        name = setting.name
    elif isinstance(command, SetPrecision):
        name, value = "precision", command.precision
    else:
        raise CtlError(f"{command.kind} cannot be sent to a remote run")
    at = getattr(command, "at", "epoch")
    return SteerRequest("set", (f"{name}={_value_word(value)}",), "step" if at == "step" else "epoch")


def steer(target: Target, request: SteerRequest, *, wait: bool = False, timeout: Optional[float] = None,
          remote_python: Optional[str] = None) -> Iterator[AnyRecord]:
    """Send the request to the run's live engine: a `CommandAnswer` for each command sent, and
    with `wait` again as the engine answers it. CtlError: bad input (exit 2, nothing sent), no
    live run (4), the remote not reached (5)."""
    remote, path = run_target(target)
    if remote is not None:
        options = ["--at", request.at] if request.action == "set" else []
        options += ["--wait"] if wait else []
        options += ["--timeout", repr(timeout)] if timeout is not None else []
        options += ["--sent-by", request.client] if request.client else []
        yield from Remote(remote, words(request.action, *options, "--", path, *request.changes),
                          remote_python).records()
        return
    if request.action == "set":
        commands = local.parse_changes(list(request.changes), request.at)
    else:
        commands = [local.action(request.action)]
    if request.client:
        try:
            commands = [replace(c, sent_by=request.client) for c in commands]
        except ConfigError as e:
            raise CtlError(f"{request.action}: {e}") from None
    for record in local.send(path, commands, wait, timeout):
        yield typed(record)


__all__ = ["Action", "ACTIONS", "SteerRequest", "request_for", "steer"]
