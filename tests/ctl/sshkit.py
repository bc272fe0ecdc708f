"""A real OpenSSH server on 127.0.0.1 for the tests, as the current user: a generated host key
and user key, a known_hosts file that holds the host key, and an ssh_config the client uses
through HEADROOM_SSH_COMMAND="ssh -F <config>" (as a user's ~/.ssh/config would). Nothing else
on the machine is touched but /run/sshd (sshd's privilege-separation folder, made when running
as root and missing). `.ci/run` installs openssh-server and openssh-client."""
from __future__ import annotations

import getpass
import os
import shlex
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import pytest

from testkit import ROOT

HOST = "headroom-test"  # the server, its host key known
STRANGER = "headroom-stranger"  # the same server, its host key not in known_hosts


@dataclass
class Sshd:
    proc: subprocess.Popen
    folder: Path
    port: int
    env: dict[str, str]  # HEADROOM_SSH_COMMAND for headroom-ctl
    remote_python: str  # this tree's engine on the "remote" (the same machine, another process tree)

    def ctl_args(self) -> list[str]:
        return ["--remote-python", self.remote_python]

    def python_with(self, **env: str) -> str:
        """The remote python with these variables set on the server (sshd passes on none of the
        client's: a test's HEADROOM_RUNS reaches the server this way, as it would in a user's
        --remote-python)."""
        return " ".join(["env", f"PYTHONPATH={ROOT}", *(shlex.quote(f"{k}={v}") for k, v in env.items()),
                         sys.executable])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _program(name: str) -> Optional[str]:
    return shutil.which(name) or next((p for p in (f"/usr/sbin/{name}", f"/usr/bin/{name}") if os.path.exists(p)),
                                      None)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(folder: Path) -> tuple[Optional[Sshd], str]:
    """The server, or None and why it cannot run here."""
    sshd, ssh, keygen = _program("sshd"), _program("ssh"), _program("ssh-keygen")
    if not (sshd and ssh and keygen):
        return None, "OpenSSH is not installed (apt-get install openssh-server openssh-client; .ci/run does)"
    for key in ("host_key", "user_key"):
        subprocess.run([keygen, "-q", "-t", "ed25519", "-N", "", "-f", str(folder / key)], check=True)
    (folder / "authorized_keys").write_text((folder / "user_key.pub").read_text())
    os.chmod(folder / "authorized_keys", 0o600)
    port = _free_port()
    root = os.geteuid() == 0
    (folder / "sshd_config").write_text("\n".join([
        f"Port {port}", "ListenAddress 127.0.0.1", f"HostKey {folder / 'host_key'}", f"PidFile {folder / 'sshd.pid'}",
        f"AuthorizedKeysFile {folder / 'authorized_keys'}", "StrictModes no", "UsePAM no",
        "PubkeyAuthentication yes", "PasswordAuthentication no", "KbdInteractiveAuthentication no",
        f"PermitRootLogin {'prohibit-password' if root else 'no'}",  # keys only
        "X11Forwarding no", "AllowTcpForwarding no", "PrintMotd no", "LogLevel ERROR", ""]))
    host_key = (folder / "host_key.pub").read_text().strip()
    (folder / "known_hosts").write_text(f"[127.0.0.1]:{port} {host_key}\n")
    (folder / "empty_known_hosts").write_text("")
    user = getpass.getuser()

    def host(alias: str, known: str) -> list[str]:
        return [f"Host {alias}", "  HostName 127.0.0.1", f"  Port {port}", f"  User {user}",
                f"  IdentityFile {folder / 'user_key'}", "  IdentitiesOnly yes", f"  UserKnownHostsFile {folder / known}",
                "  GlobalKnownHostsFile /dev/null", "  StrictHostKeyChecking yes", "  LogLevel ERROR", ""]
    (folder / "ssh_config").write_text("\n".join(host(HOST, "known_hosts") + host(STRANGER, "empty_known_hosts")))
    if root and not os.path.isdir("/run/sshd"):
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
    log = open(folder / "sshd.log", "w")
    proc = subprocess.Popen([sshd, "-D", "-e", "-f", str(folder / "sshd_config")], stdout=log, stderr=log)
    server = Sshd(proc, folder, port, {"HEADROOM_SSH_COMMAND": f"{ssh} -F {folder / 'ssh_config'}"},
                  f"env PYTHONPATH={ROOT} {sys.executable}")
    deadline = time.monotonic() + 20
    while True:
        if proc.poll() is not None:
            return None, f"sshd did not start: {(folder / 'sshd.log').read_text()[-500:]}"
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if time.monotonic() > deadline:
                server.stop()
                return None, "sshd did not listen within 20 s"
            time.sleep(0.1)
    probe = subprocess.run([ssh, "-F", str(folder / "ssh_config"), "-o", "BatchMode=yes", HOST, "true"],
                           capture_output=True, text=True, timeout=60)
    if probe.returncode != 0:  # the server runs: a failure from here on is the test's to report
        server.stop()
        raise RuntimeError(f"ssh to the test sshd failed: {probe.stderr.strip()[-500:]}")
    return server, ""


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    """The server for a test module (import this fixture into the module: `from sshkit import sshd`)."""
    server, why = start(tmp_path_factory.mktemp("sshd"))
    if server is None:
        pytest.skip(why)
    yield server
    server.stop()
