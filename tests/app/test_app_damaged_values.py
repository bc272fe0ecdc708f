"""A run.db whose values are not what the engine wrote (text in REAL columns, NULLs, odd event
rows) opens, shows what it can and never raises; one that is not SQLite at all is one error line."""
from __future__ import annotations

import math
import os
import subprocess
import sys

import numpy as np
import pytest
from app_folders import damaged_run
from app_helpers import ROOT

pytestmark = pytest.mark.slow  # the app on a whole damaged run, in process and in a subprocess

APP = [sys.executable, "-m", "app"]


@pytest.mark.parametrize("lazy_above", [1 << 30, 5], ids=["whole-read", "large-read"])
def test_opening_a_damaged_run_db_shows_it_and_never_raises(qtbot, make_window, tmp_path, monkeypatch, lazy_above):
    from app.session import sources
    monkeypatch.setattr(sources, "LAZY_ABOVE", lazy_above, raising=False)  # a long run's path, on a short one
    run_dir = damaged_run(tmp_path / "damaged")
    w = make_window()
    assert w.open_run(str(run_dir))
    w.tick()
    m = w.model.metrics
    assert len(m) == 40 and w.model.step == 40 and w.model.state == "finished"
    loss = m.view("loss")
    assert math.isnan(loss[2]) and loss[3] == pytest.approx(0.5)
    assert math.isnan(m.view("grad_norm")[3]) and math.isnan(m.view("lr")[3]) and math.isnan(m.view("time")[3])
    assert math.isnan(m.view("epoch")[4]) and math.isnan(m.view("step_time")[4])
    assert math.isnan(m.view("accum")[0]) and m.view("accum")[2] == 2
    assert w.model.step_values(0) == {"lr": 1e-3, "clip": 1.0, "micro_batch": None, "accum": None}
    assert np.all(np.isfinite(m.view("samples_seen"))) and m.view("samples_seen")[-1] == 39 * 128
    assert len(w.model.epochs) == 2
    rows = list(m.rows())
    assert len(rows) == 40
    assert w.last_error is None
    w.plots.refresh(force=True)


def test_a_damaged_run_opened_with_quit_when_done_exits(tmp_path):
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    run_dir = damaged_run(tmp_path / "damaged")
    r = subprocess.run(APP + ["--open", str(run_dir), "--quit-when-done"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=90)
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    garbage = tmp_path / "garbage"  # a run that cannot be shown: non-zero, one line
    garbage.mkdir()
    (garbage / "run.db").write_bytes(os.urandom(8192))
    r = subprocess.run(APP + ["--open", str(garbage), "--quit-when-done"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=90)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode != 0 and len(lines) == 1 and lines[0].startswith("error: "), r.stderr
