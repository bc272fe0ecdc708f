"""The app on a laptop, a run on a server: "Open remote run" / `--open user@host:path` through a
real sshd on 127.0.0.1 (tests/ctl/sshkit.py) and the real ssh client. The window shows the same
steps as the run's run.db; a live run is steered from it, survives the connection dropping
(reconnecting, from the last step received: nothing lost, nothing twice) and stops."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import numpy as np
import pytest
from app_helpers import ROOT
from PySide6.QtCore import Qt

sys.path.insert(0, os.path.join(ROOT, "tests", "ctl"))
import sshkit  # noqa: E402 - after the sys.path set-up above
from ctlkit import LiveRun, db_rows, written_run  # noqa: E402 - after the sys.path set-up above

from engine.store import labels  # noqa: E402 - after the sys.path set-up above
from engine.store.summary import summarize  # noqa: E402 - after the sys.path set-up above

sshd = sshkit.sshd  # the shared server fixture (tests/ctl/sshkit.py)

pytestmark = pytest.mark.slow


@pytest.fixture
def over_ssh(sshd, monkeypatch):
    monkeypatch.setenv("HEADROOM_SSH_COMMAND", sshd.env["HEADROOM_SSH_COMMAND"])
    monkeypatch.setenv("HEADROOM_REMOTE_PYTHON", sshd.remote_python)
    return sshd


def shown_steps(w) -> list[int]:
    return [int(s) for s in w.model.metrics.view("step")]


def test_the_window_shows_a_remote_run_as_its_run_db_holds_it(qtbot, make_window, over_ssh, tmp_path):
    run_dir = written_run(str(tmp_path / "run on server"), 700)
    w = make_window()
    assert w.open_run(f"{sshkit.HOST}:{run_dir}")
    rows = db_rows(run_dir)
    assert shown_steps(w) == [m["step"] for m in rows]
    np.testing.assert_array_equal(w.model.metrics.view("loss"), [m["loss"] for m in rows])
    assert w.session.state.value == "finished"


def test_app_open_host_path_offscreen(over_ssh, tmp_path):
    run_dir = written_run(str(tmp_path / "run"), 50)
    shot = tmp_path / "remote.png"
    r = subprocess.run([sys.executable, "-m", "app", "--open", f"{sshkit.HOST}:{run_dir}", "--screenshot", str(shot),
                        "--quit-when-done"], cwd=ROOT, env=dict(os.environ, QT_QPA_PLATFORM="offscreen"),
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    assert shot.stat().st_size > 10_000
    r = subprocess.run([sys.executable, "-m", "app", "--open", f"{sshkit.STRANGER}:{run_dir}", "--quit-when-done"],
                       cwd=ROOT, env=dict(os.environ, QT_QPA_PLATFORM="offscreen"), capture_output=True, text=True,
                       timeout=180)
    assert r.returncode != 0 and "host key" in r.stderr  # never accepted blindly, said in one line


def test_a_live_remote_run_steered_through_a_dropped_connection(qtbot, make_window, over_ssh, tmp_path):
    run = LiveRun(str(tmp_path / "live"))
    try:
        run.wait_live(rows=3)
        w = make_window()
        assert w.open_run(f"{sshkit.HOST}:{run.run_dir}")
        src = w.session.source
        assert w.session.remote and src.running
        qtbot.waitUntil(lambda: len(shown_steps(w)) >= 5, timeout=60_000)
        w.driver.apply({"lr": 5e-4}, "step")  # through headroom-ctl set over ssh
        qtbot.waitUntil(lambda: any(abs(v - 5e-4) < 1e-12 for v in w.model.metrics.view("lr")), timeout=60_000)
        before = len(shown_steps(w))
        os.kill(src._following.ssh_pid, signal.SIGKILL)  # the ssh client dies: Wi-Fi gone
        qtbot.waitUntil(lambda: src.connection == "reconnecting", timeout=10_000)
        assert "reconnecting" in w.session.live_text()
        qtbot.waitUntil(lambda: src.connection == "connected" and len(shown_steps(w)) > before + 3, timeout=60_000)
        w.stop_run()
        assert run.proc.wait(timeout=90) == 0
        qtbot.waitUntil(lambda: w.session.state.value == "finished", timeout=60_000)
        assert shown_steps(w) == [m["step"] for m in db_rows(run.run_dir)]  # nothing lost, nothing twice
        assert os.path.exists(os.path.join(run.run_dir, "checkpoints", "last.pt"))
    finally:
        run.end()


def test_run_history_lists_the_hosts_runs_and_compare_overlays_one_with_a_local_run(qtbot, make_window, over_ssh,
                                                                                      monkeypatch, tmp_path):
    """A remote run open: "Runs on HOST" in the run history (its runs root, and the folder of the
    run opened); ticking Compare on one of them overlays its loss, read through its follow, beside
    a local run's."""
    server_runs = tmp_path / "server-runs"  # the server's runs root (HEADROOM_RUNS there)
    monkeypatch.setenv("HEADROOM_REMOTE_PYTHON", over_ssh.python_with(HEADROOM_RUNS=str(server_runs)))
    a, b = written_run(str(server_runs / "a"), 30), written_run(str(server_runs / "b; 'b'"), 20)
    shown = written_run(str(tmp_path / "elsewhere" / "c"), 10)
    local = written_run(str(tmp_path / "runs" / "here"), 15)  # this machine's runs root
    w = make_window()
    assert w.open_run(f"{sshkit.HOST}:{shown}")
    qtbot.waitUntil(lambda: w.history.remote is not None and w.history.remote[2] == "", timeout=60_000)
    host, runs, _note = w.history.remote
    assert host == sshkit.HOST
    assert sorted(r.path for r in runs) == sorted(f"{sshkit.HOST}:{p}" for p in (a, b, shown))
    assert {r.name: r.steps for r in runs} == {"a": 30, "b; 'b'": 20, "c": 10}
    listed = [it.data(1, Qt.ItemDataRole.UserRole) for it in w.history.items()]
    assert f"{sshkit.HOST}:{b}" in listed and local in listed  # this machine's runs, and the host's

    # The refresh button lists the host's runs again (a run written since, a tag given there), each
    # row the server's own summary of the folder: the status, size and tags it reads there.
    d = written_run(str(server_runs / "d"), 5)
    labels.change(a, add=["on-server"])
    w.history.refresh_button.click()
    qtbot.waitUntil(lambda: any(r.name == "d" for r in w.history.remote[1]), timeout=60_000)
    rows = {r.name: r for r in w.history.remote[1]}
    there = summarize(a)
    assert (rows["a"].labels.tags, rows["a"].size, rows["a"].status) == (("on-server",), there.size, there.status)
    assert rows["d"].steps == 5 and w.history.item_for(f"{sshkit.HOST}:{d}") is not None
    dlg = w.tree.run_action("tags", f"{sshkit.HOST}:{a}")  # right-click > Edit tags... on a host's run
    dlg.setTextValue("on-server, from-laptop")
    dlg.accept()
    qtbot.waitUntil(lambda: labels.read(a).tags == ("on-server", "from-laptop"), timeout=60_000)
    qtbot.waitUntil(lambda: not w.tree.background.busy(), timeout=60_000)  # the list again, with the new tags
    assert {r.name: r.labels.tags for r in w.history.remote[1]}["a"] == ("on-server", "from-laptop")

    w.history.set_checked(f"{sshkit.HOST}:{b}", True)
    w.history.set_checked(local, True)
    name = f"{sshkit.HOST}:b; 'b'"
    qtbot.waitUntil(lambda: name in w.plots.overlays and "here" in w.plots.overlays, timeout=60_000)
    np.testing.assert_array_equal(w.plots.overlays[name][0].view("loss"), [m["loss"] for m in db_rows(b)])
    np.testing.assert_array_equal(w.plots.overlays["here"][0].view("loss"), [m["loss"] for m in db_rows(local)])
    w.history.set_checked(f"{sshkit.HOST}:{b}", False)
    assert name not in w.plots.overlays

    w.history.open_requested.emit(f"{sshkit.HOST}:{a}")  # View / double-click on a host's run
    assert shown_steps(w) == list(range(1, 31))


def test_a_remote_runs_scalars_reach_the_scalars_plot_through_its_follow(qtbot, make_window, over_ssh, tmp_path):
    """What a framework logged on the server (run.db's scalars) comes through the follow
    (headroom-ctl's `scalars` records) into the window's Scalars plot: the values the server's
    run.db holds, from the follow, not from a run.db read on this machine."""
    from engine.integrations.loop import HeadroomRun
    run_dir = tmp_path / "server-runs" / "logged"
    accuracy = [0.5, 0.6, 0.75, 0.8]
    with HeadroomRun(str(run_dir), task="logged", device="cpu") as run:
        for i, acc in enumerate(accuracy, start=1):
            run.log_step(loss=1.0 / i, accum=1, micro_batch=4)
            run.log_scalars({"eval_accuracy": acc}, step=i)
    w = make_window()
    assert w.open_run(f"{sshkit.HOST}:{run_dir}")
    qtbot.waitUntil(lambda: w.model.pushed_scalars is not None and
                    len(w.model.pushed_scalars.arrays("eval_accuracy")[1]) == len(accuracy), timeout=60_000)
    w.plots.refresh(force=True)
    plot = w.plots.scalars
    assert plot.scalars is w.model.pushed_scalars  # the follow's, not a reader of the folder here
    steps, values = plot.scalars.arrays("eval_accuracy")
    assert list(steps) == [1, 2, 3, 4] and list(values) == accuracy
    assert plot.picked == ["eval_accuracy"] and plot.isVisibleTo(w.plots)
