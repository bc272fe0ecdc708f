"""The window's title for the run shown: its folder's name, and for a run on several processes
how many and how they share the model ("run - 2 GPUs, fsdp - Headroom"). The engine records
both when a run starts (run_started: world_size and config; the run table: strategy too).

The app's name comes last, as the platforms write "document - application": Qt under X11 (and
Wayland, Windows) appends the application display name to a window title that does not already
end with it, which made "Headroom - run — Headroom" of a title that began with it."""
from __future__ import annotations

import os
from typing import Any

from .stored import whole

APP_NAME = "Headroom"  # app/main.py sets it as the application display name too


def window_title(run_dir: str, info: dict[str, Any]) -> str:
    """'Headroom', 'NAME - Headroom' or 'NAME - 2 GPUs, fsdp - Headroom' (processes on a CPU)."""
    if not run_dir:
        return APP_NAME
    parts = [os.path.basename(os.path.normpath(run_dir))]
    world = whole(info.get("world_size") or 1, 1)  # a damaged run table: no count to show
    if world >= 2:
        raw = info.get("config")
        cfg = raw if isinstance(raw, dict) else {}
        strategy = cfg.get("strategy") or info.get("strategy")  # runs from before --strategy: none recorded
        units = "GPUs" if str(info.get("device") or "").startswith("cuda") else "processes"
        parts.append(f"{world} {units}" + (f", {strategy}" if isinstance(strategy, str) and strategy else ""))
    return " - ".join([*parts, APP_NAME])
