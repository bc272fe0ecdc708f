"""The run table as a person uses it over a day of runs: columns read from what each run
recorded (and the same size `headroom-ctl runs` prints), a filter, tags and a note written to
the run folder from the window and read back by headroom-ctl (and the other way), archive and
delete behind a question (never a run that trains), the columns and the sort kept across a
relaunch, a run training in another process listed as running then as finished, the
checkpoints' right-click, and a relaunch that opens the run viewed last."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from app_helpers import wait_until
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QMessageBox

import testkit
from app.ui.runs.run_columns import INDEX as COL
from engine.ctl import client, local
from engine.store import RunReader, labels, runlock
from engine_in_process import trained

pytestmark = pytest.mark.slow  # three real runs, shared by the module

RUNS = {"a": ("--epochs", "2"), "b": ("--epochs", "1", "--lr", "0.01", "--accum", "4"),
        "c": ("--fork", "{a}@epoch-1", "--lr", "0.003", "--epochs", "2")}


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """Three runs of the seed MLP: a, b (another lr and accumulation) and c, a fork of a's epoch 1."""
    base = tmp_path_factory.mktemp("table")
    for name, flags in RUNS.items():
        args = [f.format(a=base / "a") for f in flags]
        trained(base, "--task", "mlp", "--micro-batch", "64", "--device", "cpu", *args, "--run-dir", base / name)
    return base


@pytest.fixture
def runs(made):
    """The runs copied into this test's runs folder (conftest's `isolated` sets HEADROOM_RUNS).
    A fork names its parent by path: c's record is pointed at the copy of a."""
    root = os.environ["HEADROOM_RUNS"]
    os.makedirs(root, exist_ok=True)
    for name in RUNS:
        shutil.copytree(made / name, os.path.join(root, name), ignore=shutil.ignore_patterns(".writer.lock"))
    import sqlite3
    db = sqlite3.connect(os.path.join(root, "c", "run.db"))
    (raw,) = db.execute("SELECT value FROM run WHERE key = 'parent'").fetchone()
    db.execute("UPDATE run SET value = ? WHERE key = 'parent'", (raw.replace(str(made / "a"), os.path.join(root, "a")),))
    db.commit()
    db.close()
    return root


def table(qtbot, make_window, **kw):
    w = make_window(**kw)
    w.history_dock.raise_()
    w.history.refresh()
    return w


def cell(w, path, key):
    return w.history.item_for(path).text(COL[key])


def files_bytes(folder):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _s, fs in os.walk(folder) for f in fs
               if not os.path.islink(os.path.join(d, f)))


def test_each_row_shows_what_its_run_recorded_and_the_size_headroom_ctl_prints(qtbot, make_window, runs):
    w = table(qtbot, make_window)
    ctl = {r["name"]: r for r in local.runs(runs)}
    for name in RUNS:
        path = os.path.join(runs, name)
        with RunReader(path) as reader:
            cfg, epochs, last = reader.info()["config"], reader.epochs(), reader.last_metrics(1)[0]
        assert cell(w, path, "lr") == f"{cfg['lr']:.3g}"
        assert cell(w, path, "accum") == str(cfg["accum"])
        assert cell(w, path, "effective_batch") == f"{64 * cfg['accum']:,}"
        assert cell(w, path, "steps") == f"{last['step']:,}"
        assert cell(w, path, "best_val") == f"{min(e['val_loss'] for e in epochs):.4g}"
        assert cell(w, path, "status") == "Completed"
        size = labels.fmt_bytes(files_bytes(path))
        assert cell(w, path, "size") == size == labels.fmt_bytes(ctl[name]["size"])
    assert cell(w, os.path.join(runs, "b"), "lr") != cell(w, os.path.join(runs, "a"), "lr")  # not one row copied
    fork = w.history.item_for(os.path.join(runs, "c"))
    assert fork.parent() is w.history.item_for(os.path.join(runs, "a")) and "lr" in fork.text(COL["change"])


def answer(w, text=None):
    """Accept the question the run table opened (typing `text` into an input dialog first)."""
    dlg = w.tree.folder_actions.dialog
    assert dlg is not None and dlg.isVisible()
    if isinstance(dlg, QMessageBox):
        dlg.button(QMessageBox.StandardButton.Yes).click()
    else:
        dlg.setTextValue(text)
        dlg.accept()


def menu_action(menu, text):
    (act,) = [a for a in menu.actions() if a.text() == text]
    return act


def test_tags_and_a_note_from_the_window_reach_the_folder_and_headroom_ctl_and_back(qtbot, make_window, runs):
    w = table(qtbot, make_window)
    a, b, c = (os.path.join(runs, n) for n in "abc")
    menu_action(w.history.run_menu(w.history.summary_of(b)), "Edit tags...").trigger()
    answer(w, "baseline, lr sweep")
    menu_action(w.history.run_menu(w.history.summary_of(b)), "Edit note...").trigger()
    answer(w, "lr 10x: diverges late\nsecond line")
    assert labels.read(b) == labels.Labels(("baseline", "lr sweep"), "lr 10x: diverges late\nsecond line")
    listed = {r["name"]: r["labels"] for r in local.runs(runs)}
    assert listed["b"]["tags"] == ["baseline", "lr sweep"] and listed["a"]["tags"] == []
    assert cell(w, b, "tags") == "baseline, lr sweep"

    # From the terminal: the table follows within its refresh, no button pressed.
    client.label_run(a, add=["keep"], note="the reference")
    wait_until(qtbot, lambda: cell(w, a, "tags") == "keep", 10, "headroom-ctl's tag in the table")

    box = w.history.filter_box
    for text, shown in (("sweep", [b]), ("DIVERGES", [b]), ("reference", [a]), ("completed mlp", [b, a, c]),
                        ("nothing-like-this", [])):
        box.setText(text)
        assert sorted(w.history.shown_paths()) == sorted(shown), text
    labels.change(c, add=["forked-one"])
    w.history.refresh()
    box.setText("forked-one")  # a fork that matches keeps the run it came from shown
    assert w.history.shown_paths() == [a, c]
    box.clear()
    assert len(w.history.shown_paths()) == 3


def test_archive_and_delete_ask_first_and_a_run_that_trains_is_not_deleted(qtbot, make_window, runs):
    w = table(qtbot, make_window)
    a, b = os.path.join(runs, "a"), os.path.join(runs, "b")
    menu_action(w.history.run_menu(w.history.summary_of(b)), "Archive...").trigger()
    assert os.path.isdir(b) and w.history.item_for(b) is not None  # nothing before the answer
    answer(w)
    assert w.history.item_for(b) is None and labels.read(b).archived and os.path.isdir(b)
    w.history.show_archived.setChecked(True)
    assert w.history.item_for(b) is not None
    menu_action(w.history.run_menu(w.history.summary_of(b)), "Show again").trigger()
    w.history.show_archived.setChecked(False)
    assert w.history.item_for(b) is not None and not labels.read(b).archived

    lock = runlock.acquire(a)  # a writer holds it: a run that trains
    try:
        w.history.refresh()
        assert not menu_action(w.history.run_menu(w.history.summary_of(a)), "Delete...").isEnabled()
        assert w.tree.run_action("delete", a) is None
        assert os.path.isdir(a) and "training" in w.last_error[1]
    finally:
        lock.release()
    w.history.refresh()
    menu_action(w.history.run_menu(w.history.summary_of(b)), "Delete...").trigger()
    w.tree.folder_actions.dialog.button(QMessageBox.StandardButton.Cancel).click()
    assert os.path.isdir(b)
    menu_action(w.history.run_menu(w.history.summary_of(b)), "Delete...").trigger()
    answer(w)
    assert not os.path.exists(b) and w.history.item_for(b) is None
    trash = os.path.join(os.environ["XDG_DATA_HOME"], "Trash", "files")
    assert "b" in os.listdir(trash) and os.path.isfile(os.path.join(trash, "b", "run.db"))  # to the trash, not gone


@pytest.mark.parametrize("size", [(1024, 640), (1440, 900)])
def test_the_columns_chosen_and_the_sort_come_back_after_a_relaunch(qtbot, make_window, runs, size):
    w = table(qtbot, make_window, restore_settings=True)
    w.resize(*size)
    qtbot.wait(50)
    panel = w.history
    assert panel.filter_box.isVisible() and panel.refresh_button.isVisible()
    for wid in (panel.filter_box, panel.refresh_button, panel.fork_button):  # above the fold of the dock
        bottom = wid.mapTo(panel, wid.rect().bottomLeft()).y()
        assert 0 <= bottom <= panel.height(), wid
    menu = panel._column_menu(panel.tree.header().rect().center())
    menu_action(menu, "Note").setChecked(True)
    menu_action(menu, "Steps").setChecked(False)
    menu.close()
    panel.tree.header().setSortIndicator(COL["size"], Qt.SortOrder.AscendingOrder)
    order = panel.shown_paths()
    assert not panel.tree.isColumnHidden(COL["note"]) and panel.tree.isColumnHidden(COL["steps"])
    assert w.close()
    w2 = table(qtbot, make_window, restore_settings=True)
    assert not w2.history.tree.isColumnHidden(COL["note"]) and w2.history.tree.isColumnHidden(COL["steps"])
    assert w2.history.tree.header().sortIndicatorSection() == COL["size"]
    assert w2.history.shown_paths() == order
    w3 = table(qtbot, make_window)  # restore_settings off: the defaults
    assert w3.history.tree.isColumnHidden(COL["note"]) and not w3.history.tree.isColumnHidden(COL["steps"])


def test_a_run_training_in_another_process_is_listed_running_then_finished(qtbot, make_window, runs):
    w = table(qtbot, make_window)
    path = os.path.join(runs, "live")
    paced = str(testkit.ROOT / "tests" / "ctl" / "paced_mlp.py")  # a step every ~40 ms: seconds of "running"
    proc = subprocess.Popen([sys.executable, "-m", "engine", "--task", paced, "--device", "cpu", "--max-steps", "200",
                             "--micro-batch", "64", "--accum", "2", "--run-dir", path], env=testkit.subprocess_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(qtbot, lambda: w.history.item_for(path) is not None and cell(w, path, "status") == "Running",
                   60, "the new run listed as running")
        first = cell(w, path, "steps")
        wait_until(qtbot, lambda: cell(w, path, "steps") != first, 30, "its steps to move on")
        assert proc.wait(120) == 0
        wait_until(qtbot, lambda: cell(w, path, "status") == "Completed", 10, "the run listed as finished")
    finally:
        proc.kill()


def test_a_checkpoints_right_click_forks_continues_from_the_newest_and_exports(qtbot, make_window, runs, tmp_path):
    import torch
    w = table(qtbot, make_window)
    a = os.path.join(runs, "a")
    w.history.select(a)
    pane = w.history.checkpoints
    names = [c.name for c in pane.shown()]
    assert names[0] == "last" and "epoch-1" in names
    menu = pane.menu()
    assert menu_action(menu, "Continue from here").isEnabled()  # the newest
    pane.list.setCurrentRow(names.index("epoch-1"))
    menu = pane.menu()
    assert not menu_action(menu, "Continue from here").isEnabled()  # a run continues from its newest
    menu_action(menu, "Fork from here...").trigger()
    assert w.tree.forks.dialog is not None and w.tree.forks.dialog.isVisible()
    w.tree.forks.dialog.close()
    out = tmp_path / "a-epoch-1.pt"
    with qtbot.waitSignal(w.tree.folder_actions.exported, timeout=60000):
        w.tree.folder_actions.export_weights(a, pane.selected(), str(out))
    state = torch.load(out, weights_only=True)
    assert set(state["model"]) and all(torch.isfinite(v).all() for v in state["model"].values())


def test_a_relaunch_opens_the_run_viewed_last_or_the_one_that_trains(qtbot, make_window, runs):
    a, b, c = (os.path.join(runs, n) for n in "abc")
    w = table(qtbot, make_window, restore_settings=True)
    assert w.open_run(b)
    assert w.close()
    w2 = make_window(restore_settings=True)
    assert w2.tree.open_last_run(w2.preferences) == b and w2.views.shown_dir == b
    assert w2.tree.open_last_run(w2.preferences) == ""  # something is shown: nothing replaces it
    lock = runlock.acquire(c)
    try:
        w3 = make_window(restore_settings=True)
        assert w3.tree.open_last_run(w3.preferences) == c  # the run still training comes first
    finally:
        lock.release()


def test_a_run_started_or_continued_in_the_window_is_listed_running_while_it_trains(qtbot, make_window, runs):
    from app_helpers import LONG_EPOCHS, run_to_end, start
    w = table(qtbot, make_window)
    path = os.path.join(runs, "new")
    start(w, run_dir=path, epochs=20, **LONG_EPOCHS)
    wait_until(qtbot, lambda: w.history.item_for(path) is not None and cell(w, path, "status") == "Running", 90,
               "the window's new run listed as running")
    w.stop_run()
    run_to_end(qtbot, w)
    assert cell(w, path, "status") == "Stopped"
    menu_action(w.history.run_menu(w.history.summary_of(path)), "Continue").trigger()  # right-click > Continue
    wait_until(qtbot, lambda: cell(w, path, "status") == "Running", 90, "the continued run listed as running")
    assert len([p for p in w.history.shown_paths() if p == path]) == 1  # one row, not one per segment
    w.stop_run()
    run_to_end(qtbot, w)
