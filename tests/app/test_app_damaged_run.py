"""Opening a damaged run folder shows what can be read and says what cannot."""
from __future__ import annotations

import os
import shutil

import pytest

from engine_in_process import trained

pytestmark = pytest.mark.slow  # real runs, then damaged


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """One finished run the module's tests copy and damage, trained in this process (engine_in_process)."""
    base = tmp_path_factory.mktemp("runs")
    run_dir = base / "done"
    trained(base, "--task", "mlp", "--epochs", "1", "--device", "cpu", "--run-dir", run_dir)
    return run_dir


def copy_run(src, dst):
    shutil.copytree(src, dst)
    return dst


def alert_texts(w):
    return [(kind, msg) for kind, _step, msg in w.alerts.rows()]


def test_truncated_run_db_shows_the_readable_part(qtbot, make_window, finished_run, tmp_path):
    run_dir = copy_run(finished_run, tmp_path / "cut")
    db = run_dir / "run.db"
    data = db.read_bytes()
    db.write_bytes(data[: int(len(data) * 0.9) // 4096 * 4096])  # a copy cut short
    w = make_window()
    assert w.open_run(str(run_dir))
    assert 0 < w.model.step < 64  # some of the steps, not all of them
    texts = " ".join(m for _, m in alert_texts(w))
    assert "damaged" in texts and "metrics: only the first" in texts
    assert w.last_error is None  # an alert row, not a dialog


def test_missing_checkpoints_are_named(qtbot, make_window, finished_run, tmp_path):
    run_dir = copy_run(finished_run, tmp_path / "nockpt")
    shutil.rmtree(run_dir / "checkpoints")
    w = make_window()
    assert w.open_run(str(run_dir))
    assert w.model.step == 64  # every metric is still shown
    texts = " ".join(m for _, m in alert_texts(w))
    assert "no checkpoint" in texts and "cannot be resumed" in texts


def test_intact_run_has_no_damage_alert(qtbot, make_window, finished_run):
    w = make_window()
    assert w.open_run(str(finished_run))
    assert not [k for k, _ in alert_texts(w) if "damaged" in k.lower()]
    assert w.model.step == 64


def test_unreadable_file_is_one_dialog_and_the_app_stays_usable(qtbot, make_window, finished_run, tmp_path):
    run_dir = tmp_path / "garbage"
    run_dir.mkdir()
    (run_dir / "run.db").write_bytes(os.urandom(8192))
    w = make_window()
    assert not w.open_run(str(run_dir))
    assert w.last_error is not None and "cannot be read" in w.last_error[1]
    assert w.open_run(str(finished_run))  # still usable
