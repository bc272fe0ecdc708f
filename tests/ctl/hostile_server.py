"""A server that does not play fair, as HEADROOM_SSH_COMMAND: whatever ssh's arguments, it writes
the hello and then what HOSTILE names (its words are what a real server's engine.ctl could be
made to write by a run folder, or by a server that is not Headroom at all)."""
from __future__ import annotations

import json
import os
import sys
import time

ESCAPES = "\x1b]0;pwned\x07\x1b[2J\x1b[H\x1b]52;c;cm0gLXJmIH4=\x07\x9b31m\x1bPq#\x1b\\\r\x08\u202eevil"


def line(record: dict) -> None:
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


def main() -> None:
    mode = os.environ["HOSTILE"]
    if os.environ.get("HOSTILE_ARGV"):  # what the client asked ssh for, for the test to read
        with open(os.environ["HOSTILE_ARGV"], "w") as f:
            json.dump(sys.argv[1:], f)
    line({"kind": "hello", "protocol": 1, "engine": "0.1.0"})
    if mode == "long":  # one endless line, written a MiB at a time (this process stays small)
        chunk = "x" * 2**20
        try:
            for _ in range(int(os.environ.get("HOSTILE_MIB", "200"))):
                sys.stdout.write(chunk)
            sys.stdout.write("\n")
            sys.stdout.flush()
        except BrokenPipeError:
            os._exit(0)
    elif mode == "escapes":
        line({"kind": "info", "info": {"status": "running"}, "live": True, "writer": None})
        line({"kind": "event", "event": {"id": 1, "step": 3, "kind": "nonfinite" + ESCAPES, "message": ESCAPES}})
        line({"kind": "status", "run_dir": "/r" + ESCAPES, "live": False, "state": "finished" + ESCAPES,
              "reason": ESCAPES, "task": ESCAPES, "settings": {"lr": ESCAPES}})
        line({"kind": "command", "command": "stop", "payload": {"x": ESCAPES}, "status": "refused", "note": ESCAPES})
        line({"kind": "end", "status": "finished" + ESCAPES, "step": 3, "last_event": 1})
        line({"kind": "error", "message": "broke" + ESCAPES, "exit": 4})
        sys.exit(4)
    elif mode == "shapes":  # every field of another shape than the protocol says
        huge = 10**400
        for record in ({"kind": "info", "info": [1], "live": "yes", "writer": "me"},
                       {"kind": "rows", "columns": "step", "rows": "many"}, {"kind": "rows", "columns": ["step"],
                                                                            "rows": [5, [huge], ["x"]]},
                       {"kind": "scalars", "columns": 3, "rows": {"a": 1}}, {"kind": "event", "event": [1, 2]},
                       {"kind": "event", "event": {"id": huge, "step": [1], "kind": {}, "message": huge}},
                       {"kind": "status", "writer": "w", "settings": [1], "eta_s": huge, "live": True, "state": 5},
                       {"kind": "command", "payload": "lr", "status": "applied", "applied_step": "x"},
                       {"kind": "heartbeat", "time": huge}, {"kind": "rewind", "to_step": "x"},
                       {"kind": "started", "command": 5, "started": True, "target": 7},
                       {"kind": "labels", "tags": "abc", "note": 5},
                       {"kind": "end", "status": "finished", "step": 3, "last_event": huge}):
            line(record)
    elif mode == "silent":  # alive, holding the connection, saying nothing more
        time.sleep(float(os.environ.get("HOSTILE_SLEEP", "120")))
    elif mode == "freezes":  # a live run's follow that catches up, then freezes (each connection)
        line({"kind": "info", "info": {"status": "running"}, "live": True, "writer": {"pid": 1}})
        line({"kind": "caught_up", "step": None})
        time.sleep(float(os.environ.get("HOSTILE_SLEEP", "120")))


if __name__ == "__main__":
    main()
