"""The engine's CLI under torchrun with each rank's own flags, as two nodes started by hand would
have them: `torchrun ... tests/ddp/rank_cli.py` runs `python -m engine` with the flags of
HEADROOM_TEST_RANK_ARGS (JSON: a list of argument lists, one per rank) and exits with its code."""
from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from engine.cli import main  # noqa: E402 - after the sys.path set-up above

if __name__ == "__main__":
    sys.exit(main(json.loads(os.environ["HEADROOM_TEST_RANK_ARGS"])[int(os.environ["RANK"])]))
