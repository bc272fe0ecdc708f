"""The window's title for the run shown: its folder's name, and for a run on several processes
how many and how they share the model ("Headroom - run - 2 GPUs, fsdp"). The engine records
both when a run starts (run_started: world_size and config; the run table: strategy too)."""
from __future__ import annotations

import os
from typing import Any

from .stored import whole


def window_title(run_dir: str, info: dict[str, Any]) -> str:
    """'Headroom', 'Headroom - NAME' or 'Headroom - NAME - 2 GPUs, fsdp' (processes on a CPU)."""
    if not run_dir:
        return "Headroom"
    title = f"Headroom - {os.path.basename(os.path.normpath(run_dir))}"
    world = whole(info.get("world_size") or 1, 1)  # a damaged run table: no count to show
    if world < 2:
        return title
    cfg = info.get("config") if isinstance(info.get("config"), dict) else {}
    strategy = cfg.get("strategy") or info.get("strategy")  # runs from before --strategy: none recorded
    units = "GPUs" if str(info.get("device") or "").startswith("cuda") else "processes"
    return f"{title} - {world} {units}" + (f", {strategy}" if isinstance(strategy, str) and strategy else "")
