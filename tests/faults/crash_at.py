"""`python crash_at.py KIND CONFIG_JSON`: train a run in this process (engine.Trainer) and die at
once, as a crash would (os._exit, nothing flushed or closed), when the first event of KIND is
emitted. The engine writes an event to run.db before it shows it, and saves a checkpoint before
its `checkpoint` event: what a crash at that moment leaves on disk is what the test reads."""
from __future__ import annotations

import json
import os
import sys

from engine.declarations.config import TrainConfig
from engine.trainer.trainer import Trainer

CRASHED = 9

if __name__ == "__main__":
    kind, config = sys.argv[1], json.loads(sys.argv[2])

    def sink(event):
        if event.kind == kind:
            os._exit(CRASHED)

    Trainer(TrainConfig(**config), sink=sink).run()
    sys.exit(0)  # the event never came
