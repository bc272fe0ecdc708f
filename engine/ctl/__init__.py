"""headroom-ctl: a run's state, its steering and its live stream, from a terminal or from the app,
for a run folder here or on another machine through ssh.

- protocol: the versioned JSON-lines records every command writes with --json;
- local: status, set, pause, unpause, stop and runs on a run folder (through engine.store);
- follow: the stream of rows and events from a step on, until the run ends;
- remote: the same commands on `[user@]host:path` through the system's OpenSSH client;
- client: the client API, here or through ssh, with typed records: what the app imports (the
  only part of engine.ctl it may, an import-linter contract) and what the command line is built on;
- output: records as JSON lines or as lines for a person;
- cli: the command line (`headroom-ctl`, `python -m engine.ctl`).

Torch-free (an import-linter contract): a laptop with no GPU and no torch follows a remote run.
"""
from .protocol import PROTOCOL, CtlError

__all__ = ["PROTOCOL", "CtlError"]
