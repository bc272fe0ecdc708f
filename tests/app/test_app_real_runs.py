"""The app for real runs (issue 11) and its fields' limits (issue 12), on real engine runs of
the built-in mlp task (4096 samples; FAST trains 128 per step, 32 steps an epoch):

- the x axis (steps, samples, tokens, wall time) for every plot and the Compare overlays;
- the current epoch's progress bar with an ETA from the first steps;
- the planned lr curve ahead of the run, with a marker where the peak changed;
- "Apply at: next step" sends at="step" and the accumulation changes inside the epoch;
- the Run panel's schedule, workers, token budget, micro-tokens and task arguments reach
  the engine's config;
- every number field keeps to engine/declarations/limits.py, and refuses with the engine's own line.
"""
from __future__ import annotations

import re

import numpy as np
import pytest
from app_helpers import LONG_EPOCHS, discard, run_to_end, start, wait_until

from app.model.epoch_progress import MIN_PACED, WARMUP_STEPS
from engine.declarations.commands import SetAccum
from engine.declarations.config import RANGES
from engine.store import RunReader
from testkit import run_cli

pytestmark = pytest.mark.slow  # real runs in the window


def _cum_samples(w) -> np.ndarray:
    return np.cumsum(w.model.metrics.view("samples"))


def test_x_axis_samples_seen_for_plots_and_overlays(qtbot, make_window, tmp_path):
    w = make_window()
    run_dir = str(tmp_path / "run")
    start(w, epochs=1, max_steps=12, accum=2, run_dir=run_dir)
    run_to_end(qtbot, w)
    x_steps, y = w.plots.curve_data("loss")
    assert list(x_steps) == list(range(1, 13))
    w.plots.x_axis_box.setCurrentIndex(w.plots.x_axis_box.findData("samples"))  # as a user picks it
    assert w.plots.axis == "samples"
    x, y2 = w.plots.curve_data("loss")
    cum = _cum_samples(w)
    assert cum[0] == 128 and len(cum) == 12
    np.testing.assert_array_equal(x, cum)
    np.testing.assert_array_equal(y2, y)
    assert w.plots.parts.plot_set.loss.getAxis("bottom").labelText == "samples seen"
    np.testing.assert_array_equal(w.plots.curve_data("grad_norm")[0], cum)  # every plot, not only the loss
    np.testing.assert_array_equal(w.plots.curve_data("lr")[0], cum)
    assert w.preferences.get_json("x_axis", None) == "samples"
    assert "samples seen" in w.history.compare_label.text()

    w.set_overlay(run_dir, True)  # the run history's Compare overlay follows the same axis
    _buf, item, _s = w.plots.overlays["run"]
    np.testing.assert_array_equal(item.xData, cum)
    w.plots.set_x_axis("tokens")  # mlp counts samples: tokens seen are the same sums
    np.testing.assert_array_equal(w.plots.curve_data("loss")[0], np.cumsum(w.model.metrics.view("tokens")))
    w.plots.set_x_axis("time")
    t = w.plots.curve_data("loss")[0]
    assert t[0] == 0 and np.all(np.diff(t) >= 0) and t[-1] > 0  # seconds since the first row

    discard(w)  # quitting saves no x axis (window_prefs.save): the choice was kept when made
    w2 = make_window(restore_settings=True)  # the choice is kept
    assert w2.plots.axis == "time" and w2.plots.x_axis_box.currentData() == "time"


def test_epoch_progress_bar_moves_and_shows_an_eta_from_the_first_steps(qtbot, make_window, tmp_path):
    w = make_window()
    start(w, epochs=2, run_dir=str(tmp_path / "run"))
    bar = w.status.epoch_bar
    seen: list[tuple[int, int, str]] = []

    def look() -> bool:
        w.views.update_status()
        if bar.isVisible() and w.session.state.is_live:
            seen.append((bar.value(), bar.maximum(), w.status.epoch_text.text()))
        # The ETA comes once the pace is known: MIN_PACED steps past the warm-up (app/model/epoch_progress.py).
        return len(seen) >= 2 and seen[-1][0] > max(seen[0][0], WARMUP_STEPS + MIN_PACED) and w.model.epoch == 1

    wait_until(qtbot, lambda: look() or w.model.epoch > 1, 90, "the bar to move in epoch 1")
    assert seen, "no progress shown while the run went"
    value, maximum, text = seen[-1]
    assert maximum == 4096 // 128  # the epoch's plan: the data set over the samples per step
    assert seen[-1][0] > seen[0][0]
    assert re.fullmatch(r"epoch 1: \d+% · ETA <?\d+:\d\d", text), text
    first_eta = next(t for v, _m, t in seen if "ETA" in t)
    assert seen[0][0] <= WARMUP_STEPS + MIN_PACED + 1 or "ETA" in first_eta  # from the first steps, not after epoch 1
    assert w.status.eta.text() != "ETA after epoch 1"  # the run's ETA is known from the plan
    run_to_end(qtbot, w)
    w.views.update_status()
    assert bar.value() == bar.maximum() and w.status.epoch_text.text() == "epoch 2: 100%"


def test_cosine_schedule_draws_the_planned_lr_ahead_of_the_run(qtbot, make_window, tmp_path):
    w = make_window()
    w.controls.set_values({"lr_schedule": "cosine", "warmup": 0.1, "min_lr_ratio": 0.05})
    w.plots.set_x_axis("samples")
    start(w, epochs=2, run_dir=str(tmp_path / "run"))
    wait_until(qtbot, lambda: w.model.step >= 4, 90, "a few steps")
    w.controls.set_apply_when("step")
    w.controls.lr.setText("0.002")
    w.apply_changes()
    wait_until(qtbot, lambda: len(w.plots.curve_data("lr_peak_changes")[0]) == 1 or not w.session.state.is_live,
               90, "the new peak's plan")
    w.plots.refresh(force=True)
    x, y = w.plots.curve_data("lr_planned")
    last = _cum_samples(w)[-1]
    assert len(x) > 5 and x[-1] == 2 * 4096 and (x > last).sum() >= 3  # the plan ahead of the last trained sample
    peak = int(np.argmax(y))  # the plan may start inside the warmup (a loaded machine trains slower)
    assert np.all(np.diff(y[:peak + 1]) >= -1e-12) and np.all(np.diff(y[peak:]) <= 1e-12)  # up, then only down
    assert abs(y[-1] - 0.05 * 0.002) < 1e-9  # to min ratio x the new peak
    px, py = w.plots.curve_data("lr_peak_changes")
    assert len(px) == 1 and px[0] <= last and 0 < py[0] <= 0.002
    title = w.plots.parts.plot_set.lr.titleLabel.text
    assert "planned" in title and "peak changed" in title
    pen = w.plots.parts.planned.item.opts["pen"]
    assert pen.style().name in ("DashLine", "CustomDashLine")  # dashed
    w.plots.set_x_axis("step")  # ahead of the run at its current rate: steps after the last one
    sx, _ = w.plots.curve_data("lr_planned")
    assert sx[0] >= w.model.metrics.last_step() - 1 and sx[-1] > w.model.metrics.last_step()
    if w.session.state.is_live:  # what the plan draws is checked: the rest of the two epochs is not needed
        w.stop_run()
    run_to_end(qtbot, w)


def test_apply_at_next_step_changes_accumulation_within_the_epoch(qtbot, make_window, tmp_path):
    w = make_window()
    texts: list[str] = []
    w.driver.signals.pending_changed.connect(lambda names: texts.append(w.controls.status_text("accum")))
    start(w, epochs=1, **LONG_EPOCHS, accum=2, run_dir=str(tmp_path / "run"))
    wait_until(qtbot, lambda: w.model.step >= 3, 90, "a few steps")
    w.controls.apply_at.setCurrentIndex(w.controls.apply_at.findData("step"))  # "Apply at: next step"
    w.controls.accum.setValue(1)
    assert "applies at the next step" in w.controls.apply_hint.text()
    w.apply_changes()
    sent = [s.command for s in w.session.sent if isinstance(s.command, SetAccum)]
    assert sent == [SetAccum(1, at="step")]
    run_to_end(qtbot, w)
    assert any("pending: 1 applies at the next step" in t for t in texts), texts
    epoch, accum = w.model.metrics.view("epoch"), w.model.metrics.view("accum")
    assert set(epoch) == {1}  # one epoch...
    assert accum[0] == 2 and accum[-1] == 1  # ...and the accumulation changed inside it
    changed_at = int(np.argmax(accum == 1))
    assert np.all(accum[:changed_at] == 2) and np.all(accum[changed_at:] == 1)
    assert w.controls.status_text("accum").startswith("applied: 1")
    assert w.preferences.get_json("apply_at", None) == "step"


TASK_WITH_ARGS = '''
from engine.tasks.builtin.mlp import build_task as _mlp

def build_task(seed, hidden=128, note=""):
    task = _mlp(seed)
    task.sample_length = lambda sample: 1  # every sample counts 1: a token budget in samples
    return task
'''


def test_run_panel_fields_reach_the_engine_config(qtbot, make_window, tmp_path):
    task = tmp_path / "task_with_args.py"
    task.write_text(TASK_WITH_ARGS)
    w = make_window()
    c = w.controls
    c.set_task(str(task))
    c.set_values({"device": "cpu", "micro_batch": 64, "accum": 2})
    c.lr_schedule.setCurrentIndex(c.lr_schedule.findData("linear"))
    c.warmup_fraction.setText("0.25")
    c.min_lr_ratio.setText("0.3")
    c.workers.setValue(0)
    c.token_budget.setText("128")
    c.micro_tokens.setText("32")
    c.task_args.setText("hidden=64 note='two words'")
    run_dir = tmp_path / "run"
    w.base_config.update({"max_steps": 3, "run_dir": str(run_dir)})
    assert w.start_run(), w.last_error
    assert run_to_end(qtbot, w)["status"] == "finished"
    cfg = RunReader(str(run_dir)).info()["config"]
    assert (cfg["lr_schedule"], cfg["warmup_fraction"], cfg["min_lr_ratio"], cfg["workers"]) == ("linear", 0.25, 0.3, 0)
    assert (cfg["token_budget"], cfg["micro_tokens"]) == (128, 32)
    assert cfg["task_args"] == {"hidden": 64, "note": "two words"}
    assert set(w.model.metrics.view("accum")) == {128 // 32}  # micro-tokens bounded the micro-batches
    discard(w)
    w2 = make_window(restore_settings=True)  # kept in the preferences
    v, err = w2.controls.values()
    assert err == "" and (v["lr_schedule"], v["warmup_fraction"], v["min_lr_ratio"], v["workers"], v["micro_tokens"],
                          v["task_args"]) == ("linear", 0.25, 0.3, 0, 32, {"hidden": 64, "note": "two words"})
    w2.controls.workers.setValue(w2.controls.workers.minimum())
    assert w2.controls.workers.text() == "auto" and w2.controls.values()[0]["workers"] is None


def _cli_error(module: str, *args: str) -> tuple[int, str]:
    p = run_cli(module, *args, timeout=120)
    return p.returncode, p.stderr.strip()


def test_fields_keep_to_the_engine_limits_and_refuse_with_its_line(qtbot, make_window):
    w = make_window()
    c = w.controls
    for name in ("micro_batch", "accum", "epochs"):
        assert (getattr(c, name).minimum(), getattr(c, name).maximum()) == (RANGES[name].low, RANGES[name].high)
    assert c.workers.maximum() == RANGES["workers"].high and c.workers.specialValueText() == "auto"
    assert c.accum.maximum() == 2**20  # was 100000
    c.set_values({"lr": 20})  # SGD takes lr 20; so does the engine
    assert c.values()[0]["lr"] == 20.0

    rc, line = _cli_error("engine", "--accum", "3000000000", "--device", "cpu")
    assert rc == 2 and line.startswith("error: ") and "\n" not in line
    c.set_values({"accum": 3_000_000_000})  # from elsewhere (saved preferences, a script): not clamped
    assert c.accum.value() == 4 and c.accum.property("invalid")
    assert c.values() == (None, line.removeprefix("error: "))
    assert not w.start_run() and w.last_error[1] == line.removeprefix("error: ")
    c.accum.setValue(8)  # an edit clears it
    assert c.values()[0]["accum"] == 8 and not c.accum.property("invalid")

    rc, line = _cli_error("engine", "--lr", "20000", "--device", "cpu")
    assert rc == 2
    c.lr.setText("20000")
    assert c.values() == (None, line.removeprefix("error: "))
    c.lr.setText("0.001")
    for name, text in (("warmup_fraction", "-1"), ("min_lr_ratio", "1.5"), ("micro_tokens", "0")):
        getattr(c, name).setText(text)
        v, err = c.values()
        assert v is None and err.startswith(f"{RANGES[name].flag} must be {RANGES[name].describe()}"), err
        getattr(c, name).setText("" if name == "micro_tokens" else "0.1")
    assert c.values()[1] == ""

    # Given to the app on its command line: the engine's one line and exit 2, no traceback.
    for args in (["--accum", "3000000000"], ["--epochs", "1e20"], ["--workers", "65"], ["--min-lr-ratio", "2"]):
        rc_e, engine_line = _cli_error("engine", *args, "--device", "cpu")
        rc_a, app_line = _cli_error("app", *args, "--autostart", "--quit-when-done")
        assert rc_e == rc_a == 2 and app_line == engine_line and "Traceback" not in app_line, (args, app_line)


def test_scripted_demo_flags_take_the_readme_screenshot(tmp_path):
    """--x-axis, --apply-at, --change and --screenshot-step: the README's screenshot, scripted."""
    shot, run_dir = tmp_path / "shot.png", tmp_path / "run"
    # 30 epochs of ~63 steps: far more than the run goes on between the screenshot and the stop
    # (the engine does not wait for the picture: CI saw 3 to 57 more steps, by load).
    rc, err = _cli_error("app", "--task", "mlp", "--device", "cpu", "--epochs", "30", "--micro-batch", "64",
                         "--accum", "2", "--lr-schedule", "cosine", "--warmup", "0.1", "--x-axis", "samples",
                         "--apply-at", "step", "--change", "5:accum=1", "--screenshot-step", "20",
                         "--screenshot", str(shot), "--run-dir", str(run_dir), "--autostart", "--quit-when-done")
    assert rc == 0, err
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    reader = RunReader(str(run_dir))
    rows = reader.metrics()
    finished = [e for e in reader.events() if e["kind"] == "run_finished"]
    assert finished and finished[-1]["data"]["reason"] == "stopped"  # stopped after the screenshot ...
    assert 20 <= rows[-1]["step"] < 30 * 63  # ... at step 20 or after, long before its end
    accum = [r["accum"] for r in rows]
    assert accum[0] == 2 and accum[-1] == 1
    applied = [e for e in reader.events() if e["kind"] == "settings_applied"]
    assert applied and applied[0]["data"]["at"] == "step"
    rc, err = _cli_error("app", "--change", "3:accum=3000000000", "--autostart")
    assert rc == 2 and err == "error: set_accum accum must be an integer from 1 to 1048576, got 3000000000", err
    rc, err = _cli_error("app", "--change", "3:warmup=2", "--autostart")
    assert rc == 2 and "not a live setting" in err
