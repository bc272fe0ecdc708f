"""Additions: Help > About, the micro-batch finder, the "what fits" readout, Run on N GPUs."""
from __future__ import annotations

import os
import subprocess
import sys

from app_helpers import ROOT, wait_until


# -- Help > About ----------------------------------------------------------------------------
def test_about_dialog_shows_the_versions(qtbot, make_window):
    import PySide6
    from PySide6.QtCore import qVersion

    import engine
    w = make_window()
    menus = {a.text().replace("&", ""): a.menu() for a in w.menuBar().actions()}
    assert w.about_action in menus["Help"].actions()
    w.about_action.trigger()
    dlg = w.about_dialog
    assert dlg.isVisible() and dlg.windowTitle() == "About Headroom"
    got = {k: lab.text() for k, lab in dlg.labels.items()}
    import pyqtgraph
    import torch
    assert got["Headroom"] == engine.__version__
    assert got["torch"] == torch.__version__
    assert got["CUDA"] == (torch.version.cuda or "none (CPU build)")
    assert got["Qt"] == qVersion() and got["PySide6"] == PySide6.__version__
    assert got["pyqtgraph"] == pyqtgraph.__version__
    assert got["Python"].startswith(sys.version.split()[0])
    try:
        import pynvml
        pynvml.nvmlInit()
        driver = pynvml.nvmlSystemGetDriverVersion()
        pynvml.nvmlShutdown()
        assert got["NVIDIA driver"] == (driver.decode() if isinstance(driver, bytes) else driver)
    except Exception:
        assert got["NVIDIA driver"].startswith("no NVIDIA driver")
    assert "CUDA: " in dlg.text() and "NVIDIA driver: " in dlg.text()
    dlg.close()


def test_about_is_torch_free_until_opened_and_desktop_file_name_is_set():
    code = ("import sys\n"
            "from PySide6.QtGui import QGuiApplication\n"
            "import app.window as w, app.ui.shell.about\n"
            "def show(self):\n"
            "    print('DESKTOP', QGuiApplication.desktopFileName(), 'torch' in sys.modules, flush=True)\n"
            "    raise SystemExit(0)\n"
            "w.MainWindow.show = show\n"
            "from app.main import main\n"
            "main([])\n")
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "DESKTOP headroom False" in r.stdout, r.stdout + r.stderr


# -- the micro-batch finder ------------------------------------------------------------------
def test_find_micro_batch_runs_the_finder_and_shows_what_it_chose(qtbot, make_window):
    from app_helpers import run_to_end, start
    w = make_window()
    w.controls.find_micro_batch.setChecked(True)
    values, _ = w.controls.values()
    assert values["find_micro_batch"] is True and values["effective_batch"] == 16 * 4
    start(w, micro_batch=64, accum=2, max_steps=3, find_micro_batch=True)  # effective batch 128
    assert not w.controls.find_micro_batch.isEnabled()  # a start-time option
    out = run_to_end(qtbot, w)
    assert out["status"] == "finished", out
    cfg = w.model.config
    assert cfg["find_micro_batch"] is True and cfg["effective_batch"] == 128
    found = [n for n in w.model.notes if n.kind == "micro_batch_found"]
    assert len(found) == 1
    mb, acc, probes = found[0].data["micro_batch"], found[0].data["accum"], found[0].data["probes"]
    assert mb * acc >= 128 and probes >= 1
    assert (w.controls.micro_batch.value(), w.controls.accum.value()) == (mb, acc)
    text = w.controls.finder_status.text()
    assert w.controls.finder_status.isVisible()
    assert f"micro-batch {mb}" in text and f"accumulation {acc}" in text and f"{probes} probes" in text
    rows = [r for r in w.alerts.rows() if r[0] == "micro_batch_found"]
    assert rows and f"{probes} probes" in rows[0][2]
    assert w.controls.fits.text() == "fits: no GPU"  # a CPU run


def test_find_micro_batch_unticked_sends_no_finder_flags(make_window):
    w = make_window()
    values, _ = w.controls.values()
    assert values["find_micro_batch"] is False and "effective_batch" not in values


# -- "what fits" -----------------------------------------------------------------------------
def test_memory_forecast_event_shows_what_fits(qtbot, make_window):
    from engine.declarations.events import MemoryForecast, RunStarted

    from app.session.sources import LiveSource
    w = make_window()
    assert w.controls.fits.text() == "fits: shown during a GPU run"
    # the path the engine's EventBuffer drains into
    w.controller.publish(w.session.begin(LiveSource(w.runner.buffer, lambda _c: None)))
    w.runner.buffer.put(RunStarted(0, 1, run_dir="", task="mlp", device="cpu", device_name="x86_64",
                                   torch_version="", world_size=1, resumed=False, config={}))
    w.tick()
    assert w.controls.fits.text() == "fits: no GPU"
    w.runner.buffer.put(RunStarted(0, 1, run_dir="", task="mlp", device="cuda:0", device_name="H100",
                                   torch_version="", world_size=1, resumed=False, config={}))
    w.tick()
    assert w.controls.fits.text().startswith("fits: measuring")
    w.runner.buffer.put(MemoryForecast(5, 1, micro_batch_max=29, accum_for_effective=3, effective_batch=64,
                                       capacity=16 * 2**30, fixed_bytes=2 * 2**30, per_sample_bytes=410 * 2**20,
                                       precision="bf16"))
    w.tick()
    assert w.controls.fits.text() == "fits: micro-batch up to 29 (\u00d73 for 64) \u00b7 410 MiB/sample in bf16"
    assert "16,384 MiB usable" in w.controls.fits.toolTip()
    assert "memory_forecast" not in w.alerts.kinds()  # a readout, not an alert


# -- Run on N GPUs (torchrun) ----------------------------------------------------------------
def test_torchrun_command_round_trips_through_the_engine_flags(tmp_path):
    from engine.cli import build_parser, config_from_args
    from engine.declarations.config import TrainConfig

    from app.session.launch_command import torchrun_command
    cfg = TrainConfig(task="charlm", micro_batch=8, accum=3, lr=3e-4, clip=0.5, epochs=2, max_steps=7,
                      precision="bf16", device="cuda", seed=5, lr_scaling="sqrt", find_micro_batch=True,
                      effective_batch=96, vram_limit=3 * 2**30, oom_recovery=False, optimizer="sgd")
    run_dir = str(tmp_path / "r")
    cmd = torchrun_command(cfg, 4, run_dir, python="/py")
    assert cmd[:8] == ["/py", "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4", "-m", "engine"]
    assert cmd[-2:] == ["--run-dir", run_dir]
    assert config_from_args(build_parser().parse_args(cmd[8:])) == cfg.with_(run_dir=run_dir)
    import pytest
    with pytest.raises(ValueError):
        torchrun_command(cfg, 0, run_dir)
    from engine.declarations.config import ConfigError
    with pytest.raises(ConfigError):
        torchrun_command({"task": "mlp", "accum": 0}, 2, run_dir)


def test_run_on_gpus_is_disabled_here_with_the_reason(qtbot, make_window):
    import torch
    w = make_window()
    assert not w.torchrun_action.isEnabled()
    assert w.run_menu.toolTipsVisible()
    w.run_menu.aboutToShow.emit()  # the check runs when the Run menu opens, off the GUI thread
    wait_until(qtbot, lambda: w.launcher.gpu_count is not None, 60, "the GPU count")
    assert w.launcher.gpu_count == torch.cuda.device_count()
    if w.launcher.gpu_count < 2:
        assert not w.torchrun_action.isEnabled()
        assert w.torchrun_action.toolTip().startswith("Needs 2 or more CUDA GPUs")
        assert f"sees {w.launcher.gpu_count} GPU" in w.torchrun_action.toolTip()
    else:
        assert w.torchrun_action.isEnabled()


def test_launch_torchrun_on_cpu_attaches_shows_metrics_and_stops(qtbot, make_window, tmp_path):
    from app_helpers import FAST
    w = make_window()
    w.controls.set_values({**FAST, "epochs": 50})
    run_dir = tmp_path / "ddp"
    assert w.launch_torchrun(2, run_dir=str(run_dir))
    ln = w.launch
    assert ln.command[:6] == [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    assert w.ui_state() == "starting" and not w.start_action.isEnabled() and w.stop_action.isEnabled()
    try:
        wait_until(qtbot, lambda: ln.attached, 120, "run.db from the torchrun launch")
        assert w.session.remote and w.controls.remote
        wait_until(qtbot, lambda: w.model.step >= 2, 120, "steps from the 2 processes")
        assert w.model.info.get("world_size") == 2 and w.controls.world_size == 2
        assert len(w.model.metrics) >= 2 and w.ui_state() == "training"
        assert w.open_log_action.isEnabled() and os.path.isfile(ln.log_path)
        w.stop_run()
        assert w.ui_state() == "stopping"
        wait_until(qtbot, lambda: not ln.alive(), 60, "torchrun to end after Stop")
        assert not ln.terminated, "Stop through run.db should end it before the SIGTERM fallback"
        assert ln.exit_code == 0, open(ln.log_path).read()[-3000:]
        wait_until(qtbot, lambda: w.model.state == "finished", 30, "run_finished from run.db")
        assert w.model.finish_reason == "stopped"
        assert (run_dir / "checkpoints").is_dir()
        assert not w.session.busy and w.start_action.isEnabled()
        assert w.run_outcome and w.run_outcome["exit_code"] == 0
    finally:
        if ln.alive():
            ln.process.kill()
            ln.process.waitForFinished(10_000)


def test_launch_stop_falls_back_to_sigterm(qtbot, make_window, tmp_path, monkeypatch):
    import app.session.launcher as launcher_mod
    from app_helpers import FAST
    monkeypatch.setattr(launcher_mod, "LAUNCH_STOP_S", 0.0)  # SIGTERM at once after Stop
    w = make_window()
    w.controls.set_values({**FAST, "epochs": 50})
    assert w.launch_torchrun(2, run_dir=str(tmp_path / "ddp"))
    ln = w.launch
    try:
        wait_until(qtbot, lambda: w.model.step >= 1, 120, "steps from the 2 processes")
        w.stop_run()
        wait_until(qtbot, lambda: not ln.alive(), 60, "torchrun to end after SIGTERM")
        assert ln.terminated
    finally:
        if ln.alive():
            ln.process.kill()
            ln.process.waitForFinished(10_000)
