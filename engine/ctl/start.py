"""`headroom-ctl start`: a run of `python -m engine <flags>` started on this machine, detached
from the terminal or the ssh session that asked for it, so that the connection ending (a laptop
closed, Wi-Fi gone) never ends the training.

Over ssh (`headroom-ctl start HOST: -- <flags>`) this runs on the server. It first checks the
flags as the engine reads them (engine/declarations/run_flags.py, engine/run_config.py): bad
flags are one `error:` line and exit 2, and nothing is made or started. The run folder is the one given (--run-dir, or HOST:DIR), else a
new one under the server's runs root (engine/declarations/paths.py). The engine then starts

  - inside tmux when the server has it (`tmux new-session -d -s headroom-<name>`): a person on
    the server attaches to watch it; its output also goes to <run folder>/console.log;
  - else in a session of its own, SIGHUP ignored (`setsid nohup ... > console.log 2>&1 &`).

The command returns once the engine holds the run folder (its writer lock): the run has started
and `follow` can open it. An engine that ends before that (a task file that does not load) is
reported with its own error line, exit 2, and the folder made for it is removed again.

The tmux command line is a script file with a plain name (`sh /tmp/headroom-start-XXXX.sh`), so
no path, flag or value passes through the shell tmux runs, whatever that shell is; the script
quotes every word itself (POSIX sh). The engine inherits this process's environment, exported
by the script (a tmux server started earlier would otherwise give it its own).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional

from engine.declarations import limits
from engine.declarations.config import ConfigError
from engine.declarations.paths import default_run_dir
from engine.declarations.run_flags import build_parser
from engine.run_config import config_from_args
from engine.store import DB_NAME, runlock

from .local import run_path
from .protocol import EXIT_BAD_INPUT, CtlError

DETACH = ("auto", "tmux", "setsid")
WAIT_S = 120.0  # how long the engine may take to import torch, load the task and take its folder
POLL_S = 0.1
CONSOLE = "console.log"
SESSION_PREFIX = "headroom-"
# Variables the engine does not inherit from this process: the shell's own, tmux's of the caller,
# the terminal's (the pane has its own).
_NOT_EXPORTED = {"PWD", "OLDPWD", "SHLVL", "_", "TMUX", "TMUX_PANE", "TERM", "COLUMNS", "LINES"}
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_PLAIN = re.compile(r"[A-Za-z0-9_./-]+")


@dataclass
class EngineStart:
    """What to start: the engine's command line, its folder, and whether this made the folder."""
    argv: list[str]
    run_dir: str
    made: bool = False
    before: float = field(default_factory=time.time)  # a writer lock taken after this is our engine's


def engine_command() -> list[str]:
    """How this machine runs the engine: this python's `-m engine`, or in the packaged build
    (build_spec.spec) the headroom-train executable beside this one."""
    if getattr(sys, "frozen", False):
        return [os.path.join(os.path.dirname(sys.executable), "headroom-train")]
    return [sys.executable, "-m", "engine"]


def checked_start(flags: list[str]) -> EngineStart:
    """The engine's flags checked by its own parser, the run folder chosen and checked. CtlError
    (exit 2) for anything the engine would refuse as input; nothing is made."""
    check_flags(flags)
    # The engine's own parser and reading of its flags (torch-free: a --fork's checkpoint by name only).
    try:
        ns = engine_parser().parse_args(flags)
        config = config_from_args(ns)
    except ConfigError as e:
        raise CtlError(f"engine flags: {limits.one_line(e)}") from None
    except SystemExit:  # argparse's own exit (a flag it handles itself)
        raise CtlError("start: the engine's flags did not parse") from None
    argv = [*engine_command(), *flags]
    task = getattr(ns, "task", None)
    if task is not None:  # a path arrives unexpanded through ssh: the engine gets it as the shell would give it
        spec = os.path.expanduser(task)
        if spec.endswith(".py"):
            if not os.path.isfile(spec):
                raise CtlError(f"--task {task}: no such task file on this machine")
            argv.append(f"--task={os.path.abspath(spec)}")  # the last of a repeated flag wins
    if config.resume:
        run_dir = run_path(config.resume)
        if not os.path.isfile(os.path.join(run_dir, DB_NAME)):
            raise CtlError(f"--resume {config.resume}: not a run folder (no {DB_NAME})")
        argv.append(f"--resume={run_dir}")
    else:
        run_dir = run_path(config.run_dir) if config.run_dir else default_run_dir(config.task)
        if os.path.exists(run_dir) and not os.path.isdir(run_dir):
            raise CtlError(f"{run_dir}: exists and is not a folder")
        if os.path.isfile(os.path.join(run_dir, DB_NAME)):
            raise CtlError(f"{run_dir}: already holds a run (start with --resume {run_dir} to continue it)")
        argv.append(f"--run-dir={run_dir}")
    holder = runlock.holder(run_dir) if os.path.isdir(run_dir) else None
    if holder is not None:
        raise CtlError(f"{runlock.describe(run_dir, holder)}: a run folder has one writer")
    return EngineStart(argv, run_dir)


def check_flags(flags: list[str]) -> None:
    """The engine's flags as a person gave them (before a DIR adds --run-dir), checked the same
    way wherever they come from (the command line, the app, a server's start): none, or a
    request for help, is refused."""
    if any(f in ("-h", "--help") for f in flags):
        raise CtlError("start: the engine's flags are listed by `python -m engine --help`")
    if not flags:
        raise CtlError("start: give the engine's flags after --, e.g. -- --task mlp --epochs 3")


def engine_parser() -> argparse.ArgumentParser:
    """The engine's parser, taking each flag only as spelt in full: an abbreviation (`--hel`,
    `--run-d`) is an unknown flag, never another one (argparse would print help into the
    protocol stream, or take `--run-d` for a --run-dir that with_run_dir does not see)."""
    p = build_parser()
    p.allow_abbrev = False
    return p


def with_run_dir(flags: list[str], path: str, where: str = "") -> list[str]:
    """The engine's flags with the run folder of DIR or HOST:DIR as its --run-dir (given once)."""
    check_flags(flags)
    if not path:
        return list(flags)
    if any(f == "--run-dir" or f.startswith("--run-dir=") for f in flags):
        raise CtlError(f"start: the run folder is given twice ({where or path} and --run-dir): give one")
    return [*flags, f"--run-dir={path}"]  # with `=`: a folder named like an option stays a folder


def request(flags: list[str], how: str = "auto", wait_s: Optional[float] = None) -> list[str]:
    """engine.ctl's words for `start` on another machine (the app sends these too)."""
    from .protocol import PROTOCOL
    out = ["start", "--json", "--protocol", str(PROTOCOL), "--detach", how]
    return out + (["--timeout", repr(wait_s)] if wait_s is not None else []) + ["--", *flags]


# -- detaching ---------------------------------------------------------------------------------
class Detached:
    """An engine started away from this process: whether it has ended yet."""
    how = ""
    session: Optional[str] = None

    def ended(self) -> bool:
        raise NotImplementedError


class _Setsid(Detached):
    how = "setsid"

    def __init__(self, p: EngineStart, console: str) -> None:
        nohup = shutil.which("nohup")
        with open(console, "ab") as log:  # the child has its own descriptor; ours closes here
            self.proc = subprocess.Popen([nohup, *p.argv] if nohup else p.argv, stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                         preexec_fn=None if nohup else _ignore_hangup)

    def ended(self) -> bool:
        return self.proc.poll() is not None


def _ignore_hangup() -> None:
    signal.signal(signal.SIGHUP, signal.SIG_IGN)


class _Tmux(Detached):
    how = "tmux"

    def __init__(self, tmux: str, p: EngineStart, console: str) -> None:
        self.tmux = tmux
        self.session = _free_session(tmux, SESSION_PREFIX + os.path.basename(p.run_dir.rstrip(os.sep)))
        fd, self.script = tempfile.mkstemp(prefix="headroom-start-", suffix=".sh")
        with os.fdopen(fd, "w") as f:
            f.write(script(p.argv, console))
        word = self.script if _PLAIN.fullmatch(self.script) else shlex.quote(self.script)
        r = _tmux_run(tmux, "new-session", "-d", "-s", self.session, f"sh {word}")
        if r.returncode != 0:
            _remove(self.script)
            raise OSError(f"tmux new-session failed: {limits.one_line(r.stderr or r.returncode)}")

    def ended(self) -> bool:
        return _tmux_run(self.tmux, "has-session", "-t", f"={self.session}").returncode != 0


def script(argv: list[str], console: str) -> str:
    """The POSIX sh script tmux runs: this process's environment, its folder, then the engine with
    its output both in the pane and in console.log. It removes itself first (sh has it open)."""
    env = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in sorted(os.environ.items())
                  if _NAME.fullmatch(k) and k not in _NOT_EXPORTED)
    return (f'rm -f -- "$0"\n{env}cd -- {shlex.quote(os.getcwd())} || exit 1\n'
            f"{' '.join(map(shlex.quote, argv))} 2>&1 | tee -a -- {shlex.quote(console)}\n")


def _tmux_run(tmux: str, *args: str) -> subprocess.CompletedProcess[str]:
    # Never this process's stdout: a tmux server it starts must not hold the ssh channel open.
    return subprocess.run([tmux, *args], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True, timeout=30)


def _free_session(tmux: str, base: str) -> str:
    """A tmux session name not in use: the run folder's name, in the characters tmux allows."""
    base = re.sub(r"[^A-Za-z0-9_-]+", "-", base).strip("-")[:60] or "headroom-run"
    name, n = base, 1
    while _tmux_run(tmux, "has-session", "-t", f"={name}").returncode == 0:
        n += 1
        name = f"{base}-{n}"
    return name


def detach(p: EngineStart, how: str, console: str) -> Detached:
    tmux = shutil.which("tmux") if how in ("auto", "tmux") else None
    if how == "tmux" and tmux is None:
        raise CtlError("--detach tmux: tmux is not installed on this machine")
    if tmux is not None:
        try:
            return _Tmux(tmux, p, console)
        except (OSError, subprocess.SubprocessError) as e:
            if how == "tmux":
                raise CtlError(f"--detach tmux: {limits.one_line(e)}", EXIT_BAD_INPUT) from None
    return _Setsid(p, console)


# -- the command -------------------------------------------------------------------------------
def start(flags: list[str], how: str = "auto", wait_s: float = WAIT_S) -> Iterator[dict[str, Any]]:
    """Start the engine detached and yield one `started` record once it holds its run folder (or,
    after wait_s, still starting). CtlError for flags the engine refuses (exit 2, nothing left)."""
    p = checked_start(flags)
    try:
        os.makedirs(p.run_dir)
        p.made = True
    except FileExistsError:
        pass
    except OSError as e:
        raise CtlError(f"{p.run_dir}: cannot make the run folder: {e.strerror or e}") from None
    console = os.path.join(p.run_dir, CONSOLE)
    try:
        d = detach(p, how, console)
    except (OSError, CtlError) as e:
        _undo(p, console)
        raise e if isinstance(e, CtlError) else CtlError(f"cannot start the engine: {e}", EXIT_BAD_INPUT) from None
    deadline = time.monotonic() + wait_s
    while True:
        held = runlock.holder(p.run_dir)
        if held is None and d.ended():
            held = _took_folder(p)  # it started, and a short run has ended already
            if held is None:
                line = _last_error(console)
                _undo(p, console)
                raise CtlError(f"the engine did not start: {line}", EXIT_BAD_INPUT)
        if held is not None or time.monotonic() > deadline:
            yield _record(p, d, console, held)
            return
        time.sleep(POLL_S)


def _record(p: EngineStart, d: Detached, console: str, held: Optional[dict[str, Any]]) -> dict[str, Any]:
    return {"kind": "started", "run_dir": p.run_dir, "started": held is not None,
            "pid": (held or {}).get("pid"), "host": (held or {}).get("host"), "detach": d.how,
            "session": d.session, "console": console, "command": p.argv}


def _took_folder(p: EngineStart) -> Optional[dict[str, Any]]:
    """The writer lock's record, if an engine took the folder after we started ours."""
    try:
        with open(runlock.lock_path(p.run_dir), encoding="utf-8") as f:
            info = json.load(f)
    except (OSError, ValueError):
        return None
    started = info.get("started") if isinstance(info, dict) else None
    return info if isinstance(started, (int, float)) and started >= p.before - 1 else None


def _last_error(console: str) -> str:
    """What the engine said last (its `error:` line), for the one line this command prints."""
    try:
        with open(console, encoding="utf-8", errors="replace") as f:
            lines = [ln.strip() for ln in f.read()[-20_000:].splitlines() if ln.strip()]
    except OSError:
        lines = []
    said = next((ln for ln in reversed(lines) if ln.startswith("error:")), lines[-1] if lines else "")
    return limits.one_line(said.removeprefix("error:").strip() or "it ended without a word (see its console)")


def _undo(p: EngineStart, console: str) -> None:
    """A start that did not happen leaves nothing: the folder it made, if the console (and an
    empty checkpoints folder) is all that is in it."""
    if not p.made:
        return
    _remove(console)
    for folder in (os.path.join(p.run_dir, "checkpoints"), p.run_dir):
        try:
            os.rmdir(folder)
        except OSError:
            pass  # not there, or something else is in it: not ours to remove


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


__all__ = ["DETACH", "WAIT_S", "CONSOLE", "EngineStart", "checked_start", "start", "script", "with_run_dir", "request"]
