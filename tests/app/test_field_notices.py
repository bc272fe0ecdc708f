"""A field says what it refused: a key the range does not allow is named with the range, in
a tooltip at the field, and a learning rate of 0 is said to train nothing."""
from __future__ import annotations

import pytest
from PySide6.QtWidgets import QToolTip


@pytest.mark.slow
def test_refused_keys_and_lr_zero_are_said_at_the_field(qtbot, make_window):
    w = make_window()
    c, notices = w.controls, w.field_notices
    c.lr.clear()
    c.lr.setFocus()
    qtbot.keyClicks(c.lr, "-")
    assert c.lr.text() == ""  # not taken, as before...
    assert "'-' not taken" in notices.last and "learning rate" in notices.last.lower()  # ...but said
    assert ">=" in notices.last or "0" in notices.last
    assert QToolTip.isVisible() and QToolTip.text() == notices.last
    qtbot.keyClicks(c.lr, "0.5abc")
    assert c.lr.text() == "0.5" and "'c' not taken" in notices.last  # each refused key is said
    c.accum.lineEdit().selectAll()
    qtbot.keyClicks(c.accum.lineEdit(), "x")
    assert "'x' not taken" in notices.last and "ccumulation" in notices.last
    c.lr.clear()
    qtbot.keyClicks(c.lr, "0")
    assert "will not change" in notices.last


def lr_zero_run(path) -> str:
    """A run folder whose run started with a learning rate of 0 (what Open shows in the form)."""
    from engine.declarations.config import TrainConfig
    from engine.declarations.events import StepMetrics
    from engine.store import RunStore
    path.mkdir(parents=True)
    store = RunStore(str(path))
    store.set_info(status="finished", task="mlp", device="cpu", config={**TrainConfig().to_dict(), "lr": 0.0})
    for s in range(1, 4):
        store.record(StepMetrics(s, 1, loss=1.0, grad_norm=1.0, clipped=False, lr=0.0, accum=1, clip=0.0,
                                 micro_batch=8, samples=8, tokens=8, step_time=0.01, throughput=800.0,
                                 nonfinite=False, scaler_skipped=False))
    store.close()
    return str(path)


def lr_zero_up() -> bool:
    from app.ui.shell.field_notices import LR_ZERO
    return QToolTip.isVisible() and QToolTip.text() == LR_ZERO


@pytest.mark.slow
def test_the_lr_zero_notice_follows_the_value_however_it_is_set(qtbot, make_window, tmp_path):
    w = make_window()
    c, notices = w.controls, w.field_notices
    gone = lambda: qtbot.waitUntil(lambda: not QToolTip.isVisible(), timeout=3000)  # noqa: E731 - Qt hides in 0.3 s
    c.lr.clear()
    qtbot.keyClicks(c.lr, "0")
    assert lr_zero_up()  # typed
    qtbot.keyClicks(c.lr, ".001")  # "0." and "0.00" are still 0; "0.001" is not
    assert c.lr.text() == "0.001"
    gone()
    c.lr.clear()
    qtbot.keyClicks(c.lr, "0")
    assert lr_zero_up()
    w.form_sync.banner.reset.click()  # Reset to defaults (no key or mouse event to hide a tooltip)
    assert float(c.lr.text()) > 0
    gone()  # the old notice stayed up, saying 0 of a field that held 0.001
    assert w.open_run(lr_zero_run(tmp_path / "lr0"))  # set by a loaded run
    assert c.lr.text() == "0" and lr_zero_up()  # the old notice was said on a keystroke only
    assert notices.shown == notices.last
    w.form_sync.banner.reset.click()
    gone()
    assert notices.shown == ""
