"""Start on server: the form's settings as the engine's flags (every declared setting, as a
launch on N GPUs writes them: launch_command.engine_flags), with a task file already on the
server, started there by `headroom-ctl start` over ssh (engine/ctl/client): detached from
the connection, so closing the app leaves it training. The window then opens the run it
started as any remote run (remote_source.py). Qt-free; `start` blocks until the engine holds
its folder (the window calls it off the GUI thread).
"""
from __future__ import annotations

import dataclasses
import shlex
from dataclasses import dataclass
from typing import Union

from engine.ctl import client
from engine.declarations.config import ConfigError, TrainConfig

from .launch_command import engine_flags


@dataclass(frozen=True)
class ServerRun:
    """Where and how a run starts on a server."""
    host: str  # [user@]host, as ssh takes it
    remote_python: str  # the python with Headroom there
    task: str  # the task on the server: a file path there, or a built-in name
    run_dir: str = ""  # on the server; '': a new folder under its runs root

    def check(self) -> "ServerRun":
        """Itself, stripped; ConfigError naming what is missing or malformed."""
        run = ServerRun(self.host.strip(), self.remote_python.strip(), self.task.strip(), self.run_dir.strip())
        if not run.host:
            raise ConfigError("give the server, as [user@]host")
        try:
            target = client.parse_target(f"{run.host}:x")
        except client.CtlError as e:
            raise ConfigError(str(e)) from None
        if target is None or target.host != run.host:
            raise ConfigError(f"{run.host!r} is not a host name for ssh")
        if not run.task:
            raise ConfigError("give the task: a task file on the server, or a built-in name")
        if not run.remote_python:
            raise ConfigError("give the python that has Headroom on the server")
        return run


def server_flags(config: Union[TrainConfig, dict], task: str) -> list[str]:
    """The engine's flags for the form's settings, the task being the one on the server (raises
    ConfigError). The run folder is not among them: it is the server's (ServerRun.run_dir)."""
    cfg = config if isinstance(config, TrainConfig) else TrainConfig.from_dict(dict(config))
    return engine_flags(dataclasses.replace(cfg, task=task, run_dir=None, resume=None, fork=None))


def command_line(run: ServerRun, flags: list[str]) -> str:
    """What the window runs, as a person would type it."""
    return shlex.join(["headroom-ctl", "start", f"{run.host}:{run.run_dir}", "--remote-python", run.remote_python,
                       "--", *flags])


def start(run: ServerRun, flags: list[str]) -> str:
    """Start it, and return the run as `host:run folder`, for the window to open. Blocks until
    the engine holds its folder (torch loading, the task building); CtlError says why not."""
    started = client.start_on(client.RemoteRun(run.host, run.run_dir), flags, remote_python=run.remote_python)
    return f"{run.host}:{started.run_dir}"
