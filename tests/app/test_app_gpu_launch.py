"""The Run on N GPUs dialog (issue 20): processes, --strategy, FSDP's gradient reduction and CPU
offload, labelled and explained by the settings' declarations; the command it shows is the one
the launch runs and the engine reads it back as those settings; the window's title says how a
distributed run shares the model. The launch itself on CPU (2 gloo processes, fsdp): the run
folder's sharded checkpoints are listed by the app as a single process's files are."""
from __future__ import annotations

import os
import time

import pytest
from app_helpers import FAST, wait_until

from app.ui.controls.run_fields import setting_tip
from engine.declarations.events import RunStarted
from engine.declarations.settings import LAUNCH_GROUP, SETTINGS
from engine.store import RunStore


def _dialog(w, gpus: int = 4):
    """The real dialog, as the Run menu opens it, with `gpus` GPUs said to be here."""
    w.launcher.gpu_count_known.emit(gpus, "")  # the count the GPU check reports (a plain signal)
    d = w.run_on_gpus_dialog()
    assert d is not None and d.isVisible()
    return d


def _flag(cmd: list[str], flag: str):
    return cmd[cmd.index(flag) + 1] if flag in cmd else None


@pytest.mark.slow
def test_the_dialog_offers_the_launch_settings_with_their_declared_labels_and_help(qtbot, make_window):
    w = make_window()
    w.controls.set_values(FAST)
    d = _dialog(w)
    form = d.layout().itemAt(0).layout()
    launch = [s for s in SETTINGS if s.group == LAUNCH_GROUP]
    assert [s.name for s in launch] == ["strategy", "fsdp_reduce", "cpu_offload"]
    for s in launch:
        widget = getattr(d, s.name)
        label = widget.text() if s.name == "cpu_offload" else form.labelForField(widget).text()
        assert label == s.label and s.label  # the declaration's, not written again
        assert widget.toolTip() == setting_tip(s) and s.help[1:] in widget.toolTip()  # the --help line
        if s.choices:
            assert [widget.itemText(i) for i in range(widget.count())] == list(s.choices)
    assert (d.processes.minimum(), d.processes.maximum(), d.processes.value()) == (2, 4, 4)
    # ddp: FSDP's settings cannot be chosen, and the command has none of them
    assert d.strategy.currentText() == "ddp" and not d.fsdp_reduce.isEnabled() and not d.cpu_offload.isEnabled()
    assert d.choices() == {"strategy": "ddp"}
    cmd = d.command()
    assert _flag(cmd, "--strategy") == "ddp" and "--fsdp-reduce" not in cmd and "--cpu-offload" not in cmd
    d.strategy.setCurrentText("fsdp")
    assert d.fsdp_reduce.isEnabled() and d.cpu_offload.isEnabled()
    d.reject()


@pytest.mark.slow
def test_the_command_carries_the_choices_and_the_engine_reads_them_back(qtbot, make_window):
    from engine.cli import build_parser, config_from_args
    w = make_window(base_config={"max_steps": 3})
    w.controls.set_values(FAST)
    d = _dialog(w)
    d.processes.setValue(3)
    d.strategy.setCurrentText("fsdp")
    d.fsdp_reduce.setCurrentText("every")
    d.cpu_offload.setChecked(True)
    cmd = d.command()
    assert cmd[:6] == [cmd[0], "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "3"]
    assert (_flag(cmd, "--strategy"), _flag(cmd, "--fsdp-reduce"), _flag(cmd, "--cpu-offload")) == \
        ("fsdp", "every", "on")
    assert cmd[-2:] == ["--run-dir", d.run_dir] and d.run_dir.endswith("-3proc")
    assert "--cpu-offload on" in d.command_text.text() and d.buttons.isEnabled()
    cfg = config_from_args(build_parser().parse_args(cmd[cmd.index("engine") + 1:]))
    assert (cfg.strategy, cfg.fsdp_reduce, cfg.cpu_offload, cfg.max_steps, cfg.micro_batch) == \
        ("fsdp", "every", True, 3, FAST["micro_batch"])
    d.strategy.setCurrentText("ddp")  # back to ddp: FSDP's choices are not sent (the engine refuses them)
    cfg = config_from_args(build_parser().parse_args(d.command()[d.command().index("engine") + 1:]))
    assert (cfg.strategy, cfg.fsdp_reduce, cfg.cpu_offload) == ("ddp", "last", False)
    # a form that cannot start: the dialog says why and Start is off
    w.controls.warmup_samples.setText("100")
    w.controls.warmup_fraction.setText("0.1")
    d.processes.setValue(2)
    assert d.command() == [] and d.command_text.text().startswith("Cannot start") and not d.buttons.button(
        d.buttons.StandardButton.Ok).isEnabled()
    d.reject()


def test_every_declared_setting_reaches_the_launched_engine(tmp_path):
    """The launch writes every setting the form or the flags hold (a schedule, task arguments,
    step checkpoints...), not a fixed list: the engine reads the command back as the same config."""
    from app.session.launch_command import NOT_LAUNCHED, torchrun_command
    from engine.cli import build_parser, config_from_args
    from engine.declarations.config import TrainConfig
    cfg = TrainConfig(task="charlm", micro_batch=8, accum=3, lr=3e-4, clip=0.5, epochs=2, max_steps=7, seed=5,
                      lr_scaling="sqrt", precision="bf16", device="cuda", optimizer="sgd", nonfinite="stop",
                      token_budget=512, micro_tokens=128, find_micro_batch=True, effective_batch=96,
                      memory_margin=0.1, oom_recovery=False, vram_limit=3 * 2**30, lr_schedule="cosine",
                      warmup_samples=64, min_lr_ratio=0.2, workers=2, task_args={"n": 3, "name": "a b", "f": [1.5]},
                      checkpointing=True, memory_snapshot="on-oom", checkpoint_every=5, keep_checkpoints=2,
                      keep_epoch_checkpoints=None, rollback_lr_factor=0.25, reference_batch=64, strategy="fsdp",
                      fsdp_reduce="every", cpu_offload=True, notify=("json://127.0.0.1:9/a", "ntfy://topic"))
    # what fsdp refuses, and the other warmup (one at a time), in a ddp run
    both = (cfg, cfg.with_(strategy="ddp", fsdp_reduce="last", cpu_offload=False, nonfinite="rollback",
                           spike_factor=4.0, warmup_samples=0, warmup_fraction=0.1, keep_epoch_checkpoints=5))
    differs = {s.name for c in both for s in SETTINGS if getattr(c, s.name) != s.default}
    assert differs == {s.name for s in SETTINGS} - set(NOT_LAUNCHED)  # the check covers every setting
    run_dir = str(tmp_path / "r")
    for c in both:
        cmd = torchrun_command(c, 2, run_dir)
        assert config_from_args(build_parser().parse_args(cmd[8:])) == c.with_(run_dir=run_dir)
    plain = torchrun_command(TrainConfig(), 2, run_dir)  # defaults: the basics only
    assert "--task-arg" not in plain and "--lr-schedule" not in plain and _flag(plain, "--strategy") == "ddp"
    assert config_from_args(build_parser().parse_args(plain[8:])) == TrainConfig(run_dir=run_dir)


@pytest.mark.slow
def test_the_dialog_starts_from_the_windows_strategy_flags(qtbot, make_window):
    w = make_window(base_config={"strategy": "fsdp", "fsdp_reduce": "every"})
    w.controls.set_values(FAST)
    d = _dialog(w, gpus=2)
    assert (d.strategy.currentText(), d.fsdp_reduce.currentText(), d.cpu_offload.isChecked()) == \
        ("fsdp", "every", False)
    assert d.processes.value() == 2
    d.reject()
    w.launcher.gpu_count_known.emit(1, "")
    assert w.run_on_gpus_dialog() is None  # one GPU: no dialog


def _run_folder(path, world: int, strategy: str, device: str = "cuda:0") -> str:
    """A run folder as the engine writes one under torchrun (the run table and run_started)."""
    os.makedirs(path / "checkpoints")
    store = RunStore(str(path))
    cfg = {**FAST, "epochs": 1, "strategy": strategy, "device": device.split(":")[0]}
    store.set_info(config=cfg, task="mlp", device=device, device_name="NVIDIA H200", world_size=world,
                   strategy=strategy, status="finished", pid=1, started=time.time() - 60)
    store.record(RunStarted(0, 1, run_dir=str(path), task="mlp", device=device, device_name="NVIDIA H200",
                            torch_version="-", world_size=world, resumed=False, config=cfg))
    store.close()
    return str(path)


@pytest.mark.slow
def test_the_title_of_a_distributed_run_names_its_gpus_and_strategy(qtbot, make_window, tmp_path):
    w = make_window()
    assert w.open_run(_run_folder(tmp_path / "sharded", 2, "fsdp"))
    assert w.windowTitle() == "sharded - 2 GPUs, fsdp - Headroom"
    assert w.open_run(_run_folder(tmp_path / "single", 1, "ddp"))
    assert w.windowTitle() == "single - Headroom"  # one process: nothing about sharing
    assert w.open_run(_run_folder(tmp_path / "cpu", 4, "ddp", device="cpu"))
    assert w.windowTitle() == "cpu - 4 processes, ddp - Headroom"


@pytest.mark.ddp
@pytest.mark.slow
def test_an_fsdp_launch_from_the_dialog_is_titled_and_its_sharded_checkpoints_are_listed_and_forked(
        qtbot, make_window, tmp_path):
    """Through the dialog on CPU: 2 gloo processes, --strategy fsdp, 2 steps with a step checkpoint
    every step (folders written by the real engine); the run history lists them and a fork from one
    trains in this window's engine, in one process."""
    from app_helpers import run_to_end

    from app.model import lineage
    w = make_window(base_config={"max_steps": 2, "checkpoint_every": 1})
    w.controls.set_values(FAST)
    d = _dialog(w, gpus=2)
    d.strategy.setCurrentText("fsdp")
    cmd, run_dir = d.command(), d.run_dir
    d.accept()
    ln = w.launch
    assert ln is not None and ln.command == cmd and ln.run_dir == run_dir  # what the dialog showed runs
    try:
        wait_until(qtbot, lambda: ln.exit_code is not None, 240, "the 2-process fsdp run to end")
        assert ln.exit_code == 0, open(ln.log_path).read()[-3000:]
        wait_until(qtbot, lambda: w.model.state == "finished" and w.model.info.get("world_size") == 2, 30,
                   "run_finished from run.db")
    finally:
        if ln.alive():
            ln.process.kill()
            ln.process.waitForFinished(10_000)
    name = os.path.basename(run_dir)
    assert w.windowTitle() == f"{name} - 2 processes, fsdp - Headroom"
    ckpts = os.path.join(run_dir, "checkpoints")
    assert sorted(os.listdir(ckpts)) == ["last", "step-1"]  # folders, no .pt file (last: at step 2)
    assert all(os.path.isdir(os.path.join(ckpts, n)) for n in os.listdir(ckpts))
    cps = lineage.checkpoints(run_dir)
    assert [(c.name, c.step) for c in cps] == [("step-1", 1), ("last", 2)]
    assert not [n for n in w.model.notes if n.kind == "run_damaged"]  # its last checkpoint is there
    w.history.refresh()
    w.history.select(run_dir)
    shown = w.history.checkpoints_shown()
    assert [c.name for c in shown] == ["last", "step-1"] and shown[0].label == "last (step 2)"
    w.history.checkpoint_list.setCurrentRow(1)  # step-1
    w.history.fork_button.click()
    dlg = w.tree.forks.dialog
    assert "step-1" in dlg.where.text()
    dlg.ok_button.click()
    run_to_end(qtbot, w)
    child = w.model.info["run_dir"]
    assert w.model.step == 2 and w.model.info.get("world_size") == 1
    assert lineage.Parent.from_info(lineage.read_info(child)).checkpoint == "step-1"
