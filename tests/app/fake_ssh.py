"""A stand-in for the ssh client, for the app's tests of runs on another machine without an sshd:
HEADROOM_SSH_COMMAND="python fake_ssh.py" runs the remote command line here, in a shell, as
sshd would run it there (the same headroom-ctl protocol, the same quoting). While the file named
by FAKE_SSH_DOWN exists it fails as ssh does when the network is gone (exit 255). A real sshd
is tests/ctl/sshkit.py (slower: the app's remote tests that need ssh itself use it)."""
from __future__ import annotations

import os
import sys


def main(argv: list[str]) -> int:
    if "--" not in argv or len(argv) < argv.index("--") + 3:
        sys.stderr.write("fake_ssh: expected [options] -- HOST COMMAND\n")
        return 255
    host, line = argv[argv.index("--") + 1], argv[argv.index("--") + 2]
    down = os.environ.get("FAKE_SSH_DOWN", "")
    if down and os.path.exists(down):
        sys.stderr.write(f"ssh: connect to host {host} port 22: Network is unreachable\n")
        return 255
    os.execvp("sh", ["sh", "-c", line])  # the follow is this process: killing it cuts the stream
    return 255


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
