"""Run on N GPUs: the torchrun command round-trips through the engine's flags, the action says why
it is disabled here, and a torchrun launch on CPU is attached, shown and stopped (through run.db,
else SIGTERM)."""
from __future__ import annotations

import os
import sys

import pytest
from app_helpers import wait_until


def test_torchrun_command_round_trips_through_the_engine_flags(tmp_path):
    from app.session.launch_command import torchrun_command
    from engine.cli import build_parser, config_from_args
    from engine.declarations.config import TrainConfig
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


@pytest.mark.slow
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


@pytest.mark.ddp
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


@pytest.mark.ddp
def test_launch_stop_falls_back_to_sigterm(qtbot, make_window, tmp_path, monkeypatch):
    from app_helpers import FAST

    import app.runner.launcher as launcher_mod
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
