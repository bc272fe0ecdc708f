"""headroom-ctl against a run on another machine, RUN given as `[user@]host:path`.

The command runs there as `python3 -m engine.ctl <command> --json --protocol N ...` through the
system's OpenSSH client, so ~/.ssh/config, keys, the agent, ProxyJump and known_hosts work as in
a terminal. The ssh command is `ssh`, or HEADROOM_SSH_COMMAND split like a shell would (as git
reads GIT_SSH_COMMAND: `ssh -F ~/work/ssh_config`). Always with `-o BatchMode=yes`: no prompt
for a password or for an unknown host key, which is refused, never accepted. Nothing listens on
a port; nothing is stored.

The remote shell sees one command line: every word of it (the python, the path, each
KEY=VALUE) is quoted with shlex.quote, so a folder named `x; rm -rf ~` is a folder name. The
remote python is `exec`'d, so the follow's parent is the sshd session itself (it ends when that
session goes, engine/ctl/follow.py). Torch-free: a laptop follows a remote run without torch.
"""
from __future__ import annotations

import os
import queue
import re
import shlex
import subprocess
import threading
from collections import deque
from dataclasses import dataclass
from typing import IO, Any, Iterator, Optional

from .protocol import EXIT_REMOTE, PROTOCOL, CtlError, ProtocolError, check_hello, decode

SSH_ENV = "HEADROOM_SSH_COMMAND"
# The longest line a server may write, in characters: a `rows` record of follow's PAGE rows is
# about 1 MB; an endless line is read this far and no further (memory stays bounded).
MAX_LINE = 32 * 2**20
FIRST_LINE_S = 60.0  # a deadline's allowance for the first line (connecting, the remote python's start)
STDERR_LINE = 2000  # what is kept of one stderr line (the last few say why a command failed)
PYTHON_ENV = "HEADROOM_REMOTE_PYTHON"  # the default of --remote-python, for the CLI and the app


def default_python() -> str:
    return os.environ.get(PYTHON_ENV, "").strip() or "python3"


# A host as ssh takes it: [user@]name, no option (a leading '-'), no space or control character.
_HOST = re.compile(r"[^\s\x00-\x1f\x7f-][^\s\x00-\x1f\x7f]*")


@dataclass(frozen=True)
class RemoteRun:
    host: str  # [user@]host, as ssh takes it (a Host of ~/.ssh/config too)
    path: str  # on that machine; relative to the remote home, ~ expanded there

    def __str__(self) -> str:
        return f"{self.host}:{self.path}"


def parse_target(text: str) -> Optional[RemoteRun]:
    """`[user@]host:path` as a RemoteRun; None for a local path. As scp reads it: a colon
    before any slash makes it remote, unless a local file of that name exists."""
    head, sep, path = text.partition(":")
    if not sep or not head or "/" in head or os.path.exists(text):
        return None
    if not _HOST.fullmatch(head):
        raise CtlError(f"{text!r}: {head!r} is not a host name for ssh")
    return RemoteRun(head, path)


def is_remote(text: str) -> bool:
    """Whether RUN names a run on another machine (a malformed host too: opening it says why)."""
    try:
        return parse_target(text) is not None
    except CtlError:
        return True


# The ssh command when HEADROOM_SSH_COMMAND is not set: the app's preference (set_ssh_fallback).
_fallback = ""


def set_ssh_fallback(text: str) -> None:
    """The ssh command to use when HEADROOM_SSH_COMMAND is not set ('' : `ssh`). The app sets its
    "ssh command" preference here; the environment variable still wins, as for headroom-ctl."""
    global _fallback
    _fallback = (text or "").strip()


def ssh_command() -> list[str]:
    """The ssh client's command: HEADROOM_SSH_COMMAND split as a shell would, else the app's
    preference, else `ssh`."""
    env = os.environ.get(SSH_ENV, "").strip()
    text, source = (env, SSH_ENV) if env else (_fallback, "the ssh command preference")
    try:
        argv = shlex.split(text) if text else ["ssh"]
    except ValueError as e:
        raise CtlError(f"{source}: {e}") from None
    return argv or ["ssh"]


def remote_line(remote_python: str, ctl_args: list[str]) -> str:
    """The one command line the remote shell runs, every word quoted."""
    try:
        python = shlex.split(remote_python)
    except ValueError as e:
        raise CtlError(f"--remote-python: {e}") from None
    if not python:
        raise CtlError("--remote-python: empty")
    return "exec " + " ".join([*map(_home_word, python), *(shlex.quote(w) for w in ["-m", "engine.ctl", *ctl_args])])


def _home_word(word: str) -> str:
    """A word of --remote-python, quoted; a leading ~/ stays the remote home ("$HOME", which the
    remote shell expands inside double quotes and nothing else does)."""
    if word == "~":
        return '"$HOME"'
    if word.startswith("~/"):
        return '"$HOME"/' + shlex.quote(word[2:])
    return shlex.quote(word)


# ssh's own check that the server still answers (a connection that went silent: a laptop asleep,
# a NAT that forgot it): ends ssh (exit 255) after about 45 s of no answer. An option given in
# HEADROOM_SSH_COMMAND comes first and so wins (ssh takes the first value of an option).
KEEPALIVE = ("-o", "ServerAliveInterval=15", "-o", "ServerAliveCountMax=3")


def ssh_argv(host: str, remote_python: str, ctl_args: list[str]) -> list[str]:
    return [*ssh_command(), "-o", "BatchMode=yes", *KEEPALIVE, "--", host, remote_line(remote_python, ctl_args)]


class RemoteCommand:
    """One `python -m engine.ctl ...` on the remote through ssh: its records, checked."""

    def __init__(self, host: str, remote_python: str, ctl_args: list[str], silence_s: Optional[float] = None) -> None:
        """`silence_s`: the longest wait for the next line (a follow, whose server writes a
        heartbeat every second): longer is a frozen server or connection, CtlError (exit 5)."""
        self.host = host
        self.silence_s = silence_s
        self.remote_python = remote_python
        self.argv = ssh_argv(host, remote_python, ctl_args)
        self.stderr: "deque[str]" = deque(maxlen=40)
        self.proc: Optional[subprocess.Popen[str]] = None

    def records(self) -> Iterator[dict[str, Any]]:
        """The remote's records after its hello (checked); CtlError for whatever went wrong
        on the way (ssh refused, an older engine, an error there, the stream cut)."""
        try:
            self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, text=True, encoding="utf-8", errors="replace")
        except OSError as e:
            raise CtlError(f"cannot run the ssh client {self.argv[0]!r}: {e.strerror or e} (set {SSH_ENV})",
                           EXIT_REMOTE) from None
        drain = threading.Thread(target=self._read_stderr, daemon=True)
        drain.start()
        try:
            assert self.proc.stdout is not None
            lines = self._lines(self.proc.stdout)
            if self.silence_s is not None:
                lines = self._in_time(lines, self.silence_s)
            first = next(lines, "")
            if not first:
                self._wait(drain)
                raise self._failure()
            check_hello(first, self.host)
            failed: Optional[CtlError] = None
            for line in lines:
                record = decode(line)
                if record["kind"] == "error":
                    failed = CtlError(f"{self.host}: {record.get('message')}", int(record.get("exit") or EXIT_REMOTE))
                    continue
                yield record
            code = self._wait(drain)
            if failed is not None:
                raise failed
            if code not in (0, 3):  # 3: set --wait with a refusal, which its records say
                raise self._failure()
        finally:
            self.close()

    def _lines(self, stream: IO[str]) -> Iterator[str]:
        """The server's lines, each at most MAX_LINE characters: a longer one is a ProtocolError
        once that much has been read, never a line held whole in memory."""
        while True:
            line = stream.readline(MAX_LINE + 1)
            if not line:
                return
            if len(line) > MAX_LINE and not line.endswith("\n"):
                raise ProtocolError(f"{self.host} wrote a line longer than {MAX_LINE // 2**20} MiB: not a "
                                    f"headroom-ctl record (the connection is closed)")
            yield line

    def _in_time(self, lines: Iterator[str], silence_s: float) -> Iterator[str]:
        """`lines`, read on a thread of their own, each within `silence_s` of the one before."""
        box: "queue.Queue[tuple[str, Any]]" = queue.Queue(maxsize=4)  # a few lines ahead, no more
        done = threading.Event()

        def read() -> None:
            try:
                for line in lines:
                    while not _put(box, ("line", line), done):
                        pass
                _put(box, ("end", None), done)
            except Exception as e:  # the line that was too long; a read that failed as ssh ended
                _put(box, ("error", e), done)

        threading.Thread(target=read, name="ctl-remote-read", daemon=True).start()
        wait = max(silence_s, FIRST_LINE_S)  # the hello: ssh connects and the server's python starts first
        try:
            while True:
                try:
                    what, value = box.get(timeout=wait)
                except queue.Empty:
                    raise CtlError(f"no word from {self.host} for {wait:g} s (a follow hears from the server "
                                   f"every second): the server or the connection is frozen", EXIT_REMOTE) from None
                wait = silence_s
                if what == "line":
                    yield value
                elif what == "error":
                    raise value
                else:
                    return
        finally:
            done.set()

    def _read_stderr(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        for line in self._stderr_lines(self.proc.stderr):
            if line.strip():
                self.stderr.append(line.rstrip()[:STDERR_LINE])

    @staticmethod
    def _stderr_lines(stream: IO[str]) -> Iterator[str]:
        """What the server writes on stderr, in pieces of at most STDERR_LINE (kept for the error line)."""
        while True:
            piece = stream.readline(STDERR_LINE)
            if not piece:
                return
            yield piece

    def _wait(self, drain: threading.Thread) -> int:
        assert self.proc is not None
        code = self.proc.wait()
        drain.join(timeout=2)
        return code

    def _failure(self) -> CtlError:
        """What went wrong, said for a person: ssh's own failures (exit 255), a remote without
        engine.ctl, a python that is not there."""
        code = self.proc.returncode if self.proc is not None else None
        said = "\n".join(self.stderr)
        last = next((ln for ln in reversed(self.stderr) if ln.strip()), "")
        if code == 255:
            if "Host key verification failed" in said or "REMOTE HOST IDENTIFICATION HAS CHANGED" in said:
                return CtlError(f"ssh refused {self.host}: its host key is not in known_hosts, or it changed "
                                f"(Host key verification failed); headroom-ctl never accepts a host key "
                                f"blindly: check it, then connect once with ssh to add it", EXIT_REMOTE)
            return CtlError(f"ssh could not reach {self.host}: {last or 'ssh failed (exit 255)'}", EXIT_REMOTE)
        if "No module named" in said:
            return ProtocolError(f"{self.host}: {self.remote_python} has no engine.ctl ({last}): Headroom there is "
                                 f"missing or too old for headroom-ctl protocol {PROTOCOL}; install the same "
                                 f"version there, or name its python with --remote-python")
        if code == 127:
            return CtlError(f"{self.host}: {self.remote_python}: command not found ({last}); name the python "
                            f"that has Headroom with --remote-python", EXIT_REMOTE)
        if code is not None and code < 0:
            return CtlError(f"the connection to {self.host} was cut (ssh ended by signal {-code})", EXIT_REMOTE)
        return CtlError(f"the connection to {self.host} ended before the command did (exit {code})"
                        + (f": {last}" if last else ""), EXIT_REMOTE)

    def close(self) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=3)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _put(box: "queue.Queue[tuple[str, Any]]", item: tuple[str, Any], done: threading.Event) -> bool:
    """Put `item` unless the reader is done: True when put or no longer wanted (False: full, try again)."""
    if done.is_set():
        return True
    try:
        box.put(item, timeout=0.5)
        return True
    except queue.Full:
        return False


def records(target: RemoteRun, remote_python: str, ctl_args: list[str]) -> Iterator[dict[str, Any]]:
    """The records of `python -m engine.ctl <ctl_args>` run on target's host."""
    yield from RemoteCommand(target.host, remote_python, ctl_args).records()
