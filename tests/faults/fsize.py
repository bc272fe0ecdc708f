"""`python fsize.py LIMIT ARGS...`: the engine's command line (`python -m engine ARGS...`) with no
file allowed to grow past LIMIT bytes (RLIMIT_FSIZE: a write past it fails with EFBIG, as a full
disk fails with ENOSPC; Python ignores SIGXFSZ). Exits with the engine's exit code."""
from __future__ import annotations

import resource
import subprocess
import sys

if __name__ == "__main__":
    limit = int(sys.argv[1])

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    sys.exit(subprocess.run([sys.executable, "-m", "engine", *sys.argv[2:]], preexec_fn=cap).returncode)
