"""No empty run is left in the history by a window closed while its task loads, and the clean-up
removes an empty run folder and nothing else, ever."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from app_folders import LOCKER, tree
from app_helpers import ROOT, start, wait_until
from app_tasks import loading_mark, slow_task

from engine.declarations.events import StepMetrics
from engine.store import RunStore, runlock


# -- no empty run left by a window closed while its task loads ------------------------------------
@pytest.mark.slow
def test_closing_while_the_task_loads_leaves_no_empty_run_in_the_history(qtbot, make_window, tmp_path):
    from app.core.runs import list_runs
    runs = tmp_path / "runs"  # HEADROOM_RUNS (the isolated fixture): where the engine names new folders
    w = make_window()
    # Loading takes well over the close's JOIN_S (2 s) from when it starts. The plots are built
    # first: built by the event loop during the wait for the mark, they delayed the close.
    assert w.plots is not None
    start(w, task=slow_task(tmp_path, 4.0))  # no --run-dir: a new folder under the runs folder
    wait_until(qtbot, loading_mark(tmp_path).exists, 60, "the engine thread to be in build_task")
    assert not w.close()  # hidden until the thread ends
    with qtbot.waitSignal(w.closed, timeout=60_000):
        pass
    assert w.run_outcome["reason"] == "stopped"
    assert list_runs(str(runs)) == []
    assert not runs.exists() or os.listdir(runs) == []


def _engine_folder(path: Path, rows: int = 0, discarded: int = 0, checkpoint: bool = False, extra: str = "") -> Path:
    """A run folder as the engine leaves it before (or after) its first steps."""
    os.makedirs(path / "checkpoints")
    lock = runlock.acquire(str(path))
    store = RunStore(str(path))
    store.set_info(status="finished", task="mlp")
    for s in range(1, rows + discarded + 1):
        store.record(StepMetrics(s, 1, loss=1.0, grad_norm=1.0, clipped=False, lr=1e-3, accum=1, clip=0.0,
                                 micro_batch=1, samples=1, tokens=1, step_time=0.1, throughput=10.0,
                                 nonfinite=False, scaler_skipped=False))
    if discarded:
        store.discard_after(rows, "superseded")
    store.close()
    lock.release()
    if checkpoint:
        (path / "checkpoints" / "last.pt").write_bytes(b"weights")
    if extra:
        (path / extra).write_text("the user's")
    return path


def test_an_empty_run_folder_is_removed_and_nothing_else_ever_is(tmp_path):
    from app.core.runs import remove_if_empty
    assert remove_if_empty(str(_engine_folder(tmp_path / "empty")))
    assert not (tmp_path / "empty").exists()
    kept = {"one-row": _engine_folder(tmp_path / "one-row", rows=1),
            "discarded-row": _engine_folder(tmp_path / "discarded-row", discarded=1),
            "checkpoint": _engine_folder(tmp_path / "checkpoint", checkpoint=True),
            "user-file": _engine_folder(tmp_path / "user-file", extra="notes.txt")}
    for name, path in kept.items():
        before = tree(path)
        assert not remove_if_empty(str(path)), name
        assert tree(path) == before, name
    held = _engine_folder(tmp_path / "held")  # empty, but another process holds its writer lock: never
    locker = subprocess.Popen([sys.executable, "-c", LOCKER, str(held), str(ROOT)], stdout=subprocess.PIPE, text=True)
    try:
        assert locker.stdout.readline().strip() == "locked"
        before = tree(held)
        assert not remove_if_empty(str(held)) and tree(held) == before
    finally:
        locker.kill()
        locker.wait()
    assert remove_if_empty(str(held), keep_folder=True) and held.is_dir() and os.listdir(held) == []
