"""`headroom-ctl mcp`: the Model Context Protocol over stdio, for agents (Claude, Cursor, ...), with
the official MCP SDK (the `mcp` extra): tools that list, read and steer runs through the client
API (engine/ctl/client), here or on a server through OpenSSH, validated as `headroom-ctl set`
validates, and recorded as sent by an agent. tools.py is what they do; server.py the SDK's side."""
from __future__ import annotations

import importlib.util

from ..protocol import CtlError

MISSING_EXTRA = "headroom-ctl mcp needs the mcp extra (pip install 'headroom[mcp]')"


def serve() -> None:
    """Serve until the client goes; CtlError (exit 2) when the mcp package is not installed."""
    if importlib.util.find_spec("mcp") is None:
        raise CtlError(MISSING_EXTRA)
    from .server import serve as serve_stdio  # the SDK, only now
    serve_stdio()


__all__ = ["serve", "MISSING_EXTRA"]
