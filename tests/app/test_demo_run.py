"""`make run`'s demo: long enough to follow the README's tour by hand on a laptop CPU, quiet
(its defaults raise no alert), and Stop ends it cleanly with a checkpoint."""
from __future__ import annotations

import math
import re
import shlex

import pytest
from app_helpers import ROOT, run_to_end, wait_until

from app.main import parse_args
from engine.declarations.config import TrainConfig

MLP_SAMPLES = 4096  # engine/tasks/builtin/mlp.py
# Measured on a laptop CPU (the report): 5 epochs of micro-batch 16 in about 2 s,
# 1,280 micro-batches: about 640 micro-batches a second.
LAPTOP_MICRO_BATCHES_PER_S = 640.0


def demo_config() -> tuple[object, dict]:
    """(the parsed namespace, every run setting: the flags given over the defaults)."""
    ns, base = parse_args(demo_flags())
    return ns, TrainConfig.from_dict(base).to_dict()


def demo_flags() -> list[str]:
    """The app's flags in the Makefile's `run` recipe."""
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    recipe = re.search(r"^run:.*\n\t(.+)$", text, re.MULTILINE)
    assert recipe, "no run target"
    words = shlex.split(recipe.group(1))
    return words[words.index("app") + 1:]


def test_the_demo_lasts_minutes_on_a_laptop_cpu():
    ns, base = demo_config()
    assert ns.autostart and base["task"] == "mlp"
    micro_batches = base["epochs"] * math.ceil(MLP_SAMPLES / base["micro_batch"])
    seconds = micro_batches / LAPTOP_MICRO_BATCHES_PER_S
    assert seconds >= 120, f"the demo lasts about {seconds:.0f} s on a laptop"


@pytest.mark.slow
def test_the_demo_raises_no_alert_and_stops_cleanly(qtbot, make_window, tmp_path):
    _ns, base = demo_config()
    # The same windows in one micro-batch each (exact accumulation: the same gradient, so the same
    # norms against the same clip), to reach the clip-saturation window (50 steps) in seconds.
    cfg = {**base, "micro_batch": base["micro_batch"] * base["accum"], "accum": 1, "device": "cpu",
           "run_dir": str(tmp_path / "demo")}
    w = make_window(cfg)
    assert w.start_run(), w.last_error
    wait_until(qtbot, lambda: w.model.step >= 60, 120, "60 steps")
    w.stop_run()
    outcome = run_to_end(qtbot, w, 60)
    assert outcome["status"] == "finished" and outcome["reason"] == "stopped"
    assert (tmp_path / "demo" / "checkpoints" / "last.pt").exists()
    assert "clip_saturation" not in w.alerts.by_kind, w.alerts.by_kind
    assert len(w.model.metrics.clipped_x.view()) > 0  # the clip line still means something: the first steps
