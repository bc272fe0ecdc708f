"""The MCP server: the agent's tools (tools.py) served over stdio with the official MCP SDK's
MCPServer. A CtlError (a value refused, no live run, a host not reached) is a tool error whose
text is the reason, as `headroom-ctl` would print it; nothing was sent. Imports the SDK: only
`headroom-ctl mcp` loads this (engine/ctl/agent/__init__.py checks the extra first)."""
from __future__ import annotations

from typing import Any, Callable, Literal, Optional, TypeVar

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from engine.declarations import limits

from ..local import SETTABLE
from ..protocol import CtlError
from . import tools
from .tools import At, Value

INSTRUCTIONS = (
    "Headroom training runs: list them (here, or on a server as host: through ssh), read one (its status, "
    "recent rows, the loss's range and trend, its alerts), change its live settings at the next optimizer "
    "step or epoch, pause, unpause or stop it, or fork it from a checkpoint with changes. RUN is a run "
    "folder, or [user@]host:path. Every value is checked as `headroom-ctl set` checks it: a refused one is "
    f"an error with the reason, and nothing is sent. Settings: {', '.join(SETTABLE)}.")

T = TypeVar("T")


def _reason(call: Callable[[], T]) -> T:
    """The tool's result, or its CtlError as a tool error (the reason, one line)."""
    try:
        return call()
    except CtlError as e:
        raise ToolError(limits.one_line(str(e), 2000)) from None


def build() -> MCPServer[Any]:
    # WARNING: a refused value is the agent's answer, not a line for the client's log
    server: MCPServer[Any] = MCPServer("headroom", instructions=INSTRUCTIONS, log_level="WARNING")

    @server.tool(description="The runs under a runs folder, newest first: '' is this machine's runs root, a "
                             "folder, or 'host:' / 'host:DIR' for a server reached with ssh.")
    def list_runs(where: str = "") -> dict[str, Any]:
        return {"runs": _reason(lambda: tools.list_runs(where))}

    @server.tool(description="A run's state (live, paused, finished...; step, epoch, settings, ETA), its last "
                             "`rows` metrics rows, the loss's min/max/first/last and trend over them (the change "
                             "from the first half's mean to the second's, relative; negative is falling), its "
                             "alerts and its last `events` events.")
    def run_status(run: str, rows: int = 20, events: int = 10) -> dict[str, Any]:
        return _reason(lambda: tools.recent(run, rows, events))

    @server.tool(description="Change live settings of a training run, e.g. {\"lr\": 0.0005, \"accum\": 8}, "
                             f"applied at the next optimizer step or the next epoch (`at`). Settings: "
                             f"{', '.join(SETTABLE)}. Validated as `headroom-ctl set` validates them: an invalid "
                             "value is an error and nothing is sent. With `wait`, returns once the engine "
                             "applied each (applied_step, from_step), or an error with the engine's reason.")
    def set_settings(run: str, changes: dict[str, Value], at: At = "epoch", wait: bool = True,
                     timeout_s: float = tools.WAIT_S) -> dict[str, Any]:
        return {"commands": _reason(lambda: tools.set_settings(run, changes, at, wait, timeout_s))}

    def action(name: Literal["pause", "unpause", "stop"], what: str) -> None:
        def run_action(run: str, wait: bool = True, timeout_s: float = tools.WAIT_S) -> dict[str, Any]:
            return {"commands": _reason(lambda: tools.act(run, name, wait, timeout_s))}
        server.add_tool(run_action, name=name, description=what)

    action("pause", "Pause the run at the next epoch boundary (it keeps its memory and waits).")
    action("unpause", "Let a paused run go on.")
    action("stop", "Stop the run at the next micro-batch, writing a checkpoint it can be resumed or forked "
                   "from; with `wait`, returns once it ended.")

    @server.tool(description="Fork a run from one of its checkpoints ('last', 'epoch-N' or 'step-S') with "
                             "changed settings, started detached on the machine that holds the run; `run_dir` "
                             "is the new run's folder there (default: a new one under its runs root).")
    def fork(run: str, checkpoint: str = "last", changes: Optional[dict[str, Value]] = None,
             run_dir: str = "") -> dict[str, Any]:
        return _reason(lambda: tools.fork(run, checkpoint, changes, run_dir))

    return server


def serve() -> None:
    """Serve the tools over stdio until the client closes the connection."""
    build().run("stdio")
