"""resources/example_task.py: a complete task a user can copy, and it trains in the app."""
from __future__ import annotations

import pytest
from app_helpers import ROOT, run_to_end, start

pytestmark = pytest.mark.slow  # a real run in the window


def test_example_task_loads_and_trains_in_the_window(qtbot, make_window, tmp_path):
    from engine.tasks.loader import load_task
    path = str(ROOT / "resources" / "example_task.py")
    task = load_task(path, seed=0)
    assert task.name == "example" and task.sample_length is not None and task.val_data is not None
    w = make_window()
    start(w, task=path, epochs=1, max_steps=4, lr=1e-2, micro_batch=32, accum=2, run_dir=str(tmp_path / "run"))
    outcome = run_to_end(qtbot, w)
    assert outcome["reason"] == "max_steps" and w.model.step == 4
    # tokens are counted, not samples: the throughput plot says tokens/s
    assert w.model.metrics.counts_tokens()
    assert w.plots.parts.plot_set.tput.getAxis("left").labelText == "tokens/s"
