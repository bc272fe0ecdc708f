"""Controls: validators, effective batch, buttons by state, settings kept, shortcuts, themes, no-GPU plot."""
from __future__ import annotations

import pytest
from app_helpers import discard, run_button
from PySide6.QtGui import QValidator

from app.core.shortcuts import SHORTCUTS
from app.ui.controls.validators import DeviceValidator, FloatValidator
from engine.declarations.events import StepMetrics

A, I, X = QValidator.State.Acceptable, QValidator.State.Intermediate, QValidator.State.Invalid


def test_validators_keep_out_what_the_engine_refuses():
    v = FloatValidator(0.0, 10.0)
    for text, state in [("0.001", A), ("3e-4", A), ("0", A), ("", I), ("1e", I), (".", I), ("1e-", I),
                        ("-1", X), ("abc", X), ("nan", X), ("inf", X), ("1e999", X), ("11", X), ("1,5", X)]:
        assert v.validate(text, 0)[0] == state, text
    d = DeviceValidator()
    for text, state in [("cpu", A), ("cuda", A), ("cuda:1", A), ("auto", A), ("cu", I), ("cuda:", I),
                        ("gpu", X), ("cuda:x", X)]:
        assert d.validate(text, 0)[0] == state, text


@pytest.mark.slow
def test_typing_cannot_enter_an_invalid_lr(qtbot, make_window):
    w = make_window()
    lr = w.controls.lr
    lr.clear()
    qtbot.keyClicks(lr, "-abc0.5")
    assert lr.text() == "0.5"
    lr.clear()
    # The label and the range of the settings' declaration (engine/declarations/settings.py, limits.py).
    assert w.controls.values() == (None, "Learning rate: enter a finite number from 0 to 10000")
    assert not w.start_run() and w.last_error[1].startswith("Learning rate")


@pytest.mark.slow
def test_effective_batch_and_buttons(qtbot, make_window):
    w = make_window()
    c = w.controls
    c.micro_batch.setValue(16)
    c.accum.setValue(8)
    assert c.effective.text().startswith("128 ")
    assert run_button(w, "start").isEnabled()
    assert not (run_button(w, "stop").isEnabled() or run_button(w, "pause").isEnabled()
                or run_button(w, "resume").isEnabled() or c.apply_button.isEnabled())
    assert w.start_action.shortcut().toString() == SHORTCUTS["start"] == "F5"
    assert w.stop_action.shortcut().toString() == SHORTCUTS["stop"]
    assert w.pause_action.shortcut().toString() == SHORTCUTS["pause"]
    assert w.resume_action.shortcut().toString() == SHORTCUTS["resume"]


@pytest.mark.slow
def test_each_run_action_is_one_button_in_the_window(qtbot, make_window):
    """Start, Pause, Unpause and Stop are shown once as buttons (the toolbar), not again in the
    Controls panel; the Run menu has them too, as menus do."""
    from PySide6.QtWidgets import QAbstractButton, QToolButton
    w = make_window()
    w.show()
    qtbot.waitExposed(w)
    for name in ("start", "pause", "resume", "stop"):
        action = getattr(w.run_actions, name)
        shown = [b for b in w.findChildren(QAbstractButton) if b.isVisibleTo(w) and b.text() == action.text()]
        assert shown == [run_button(w, name)], (name, [type(b).__name__ for b in shown])
        assert isinstance(shown[0], QToolButton) and action in w.run_menu.actions()


@pytest.mark.slow
def test_settings_and_layout_are_kept(qtbot, make_window):
    w = make_window()
    w.controls.set_values({"micro_batch": 24, "accum": 3, "lr": 0.0025, "clip": 0.0, "epochs": 7,
                           "precision": "bf16", "lr_scaling": "sqrt"})
    w.set_theme("dark")
    w.log_action.setChecked(True)
    w.history_dock.raise_()
    discard(w)
    w2 = make_window(restore_settings=True)
    v, _ = w2.controls.values()
    assert (v["micro_batch"], v["accum"], v["lr"], v["clip"], v["epochs"], v["precision"], v["lr_scaling"]) == \
        (24, 3, 0.0025, 0.0, 7, "bf16", "sqrt")
    assert w2.theme == "dark" or w2.preferences.theme() == "dark"
    assert w2.log_action.isChecked() and w2.plots.log_box.isChecked()


def _steps(n, gpu):
    mem = dict(mem_allocated=2 * 2**30, mem_reserved=3 * 2**30, mem_peak=int(2.5 * 2**30), mem_used=6 * 2**30,
               mem_total=8 * 2**30) if gpu else {}
    return [StepMetrics(i, 1, loss=1.0 / i, grad_norm=2.0, clipped=True, lr=1e-3, accum=2, clip=1.0, micro_batch=8,
                        samples=16, tokens=16, step_time=0.01, throughput=1600.0, nonfinite=False,
                        scaler_skipped=False, **mem) for i in range(1, n + 1)]


@pytest.mark.slow
def test_memory_plot_says_no_gpu_plainly_on_cpu(qtbot, make_window):
    from app.model.runmodel import RunModel
    w = make_window()
    assert w.plots.gpu_mode() == "none"
    m = RunModel()
    m.info = {"device": "cpu"}
    m.ingest(_steps(10, gpu=False))
    w.model = m
    w.plots.set_model(m)
    assert w.plots.gpu_mode() == "cpu"
    line = w.plots.parts.fold.line  # one line under the plots, not an empty plot (app/ui/plots/fold.py)
    assert "no GPU" in line.text and line.isVisible() and not w.plots.parts.plot_set.mem.isVisible()
    assert "no GPU" in w.plots.parts.plot_set.mem.titleLabel.text
    assert not w.plots.parts.memory.used.isVisible()
    m2 = RunModel()
    m2.ingest(_steps(10, gpu=True))
    w.plots.set_model(m2)
    assert w.plots.gpu_mode() == "gpu" and w.plots.parts.memory.fill.isVisible()
    x, y = w.plots.curve_data("mem_used")
    assert list(y) == [6.0] * 10
    assert w.plots.parts.plot_set.mem.isVisible() and "GPU" not in w.plots.parts.fold.placement.line


@pytest.mark.slow
def test_theme_switch_keeps_the_data(qtbot, make_window):
    from app.model.runmodel import RunModel
    w = make_window()
    m = RunModel()
    m.ingest(_steps(30, gpu=False))
    w.model = m
    w.plots.set_model(m)
    before = w.plots.curve_data("loss")[1].copy()
    w.theme_action.setChecked(True)
    assert w.theme == "dark"
    assert w.plots.canvas.backgroundBrush().color().name() == "#111318"
    assert list(w.plots.curve_data("loss")[1]) == list(before)
    assert "#16181d" in w.styleSheet() or "#16181d" in w.window().styleSheet() or \
        "16181d" in __import__("PySide6.QtWidgets", fromlist=["QApplication"]).QApplication.instance().styleSheet()
    w.theme_action.setChecked(False)
    assert w.theme == "light"
