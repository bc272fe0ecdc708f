"""Checkpoints load with torch.load(weights_only=True) and hold what resume needs; `import engine`
loads no Qt, and its light modules load no torch."""
from __future__ import annotations

import os
import pickle
import re
import subprocess
import sys

import pytest
import torch
from engine_helpers import ROOT, adamw, assert_same_tree, make_task, run_trainer

from engine.checkpoints import files as ckpt
from engine.declarations.commands import Stop

N, MICRO, ACCUM = 24, 2, 3  # 4 steps per epoch


def test_checkpoints_at_epoch_ends_load_weights_only(tmp_path):
    snaps = {}

    def on_event(e, trainer):
        if e.kind == "epoch_end":
            snaps[e.epoch] = {k: v.clone() for k, v in trainer.model.state_dict().items()}

    run = run_trainer(make_task(N, optimizer=adamw), tmp_path / "run", on_event=on_event, micro_batch=MICRO,
                      accum=ACCUM, epochs=2)
    folder = tmp_path / "run" / "checkpoints"
    assert sorted(os.listdir(folder)) == ["epoch-1.pt", "epoch-2.pt", "last.pt"]  # no temporary files left
    for name, epoch_done in (("epoch-1.pt", 1), ("epoch-2.pt", 2), ("last.pt", 2)):
        state = torch.load(folder / name, weights_only=True)
        assert {"model", "optimizer", "step", "epoch"} <= set(state)
        assert state["step"] == 4 * epoch_done
        assert (state["epoch"], state["window"]) == (epoch_done + 1, 0)  # resumes at the next epoch's start
        assert_same_tree(state["model"], snaps[epoch_done])
        assert state["optimizer"]["state"] and state["optimizer"]["param_groups"][0]["lr"] == 0.1
        model = make_task(N).model
        model.load_state_dict(state["model"])  # a plain model takes the weights as they are
    assert_same_tree(torch.load(folder / "last.pt", weights_only=True)["model"],
                     dict(run.trainer.model.state_dict()))
    assert [e.path for e in run.of("checkpoint")] == [str(folder / "last.pt")] * 2


def test_stop_writes_checkpoint_no_checkpoint_before_first_step(tmp_path):
    def on_event(e, trainer):
        if e.kind == "run_started":
            trainer.send(Stop())

    run = run_trainer(make_task(N), tmp_path / "run", on_event=on_event, micro_batch=MICRO, accum=ACCUM)
    assert run.result.reason == "stopped" and run.result.steps == 0
    assert not os.path.exists(ckpt.last_path(str(tmp_path / "run")))  # nothing to save before the first step


def test_checkpoint_load_refuses_code_and_damage(tmp_path):
    class Evil:
        def __reduce__(self):
            return (os.system, ("true",))

    evil = tmp_path / "evil.pt"
    with open(evil, "wb") as f:
        pickle.dump({"model": Evil(), "step": 1}, f, protocol=2)
    with pytest.raises(ckpt.CheckpointError):
        ckpt.load(str(evil))
    torch.save({"model": {}, "step": 1, "x": Evil()}, tmp_path / "evil2.pt")
    with pytest.raises(ckpt.CheckpointError, match="refused"):
        ckpt.load(str(tmp_path / "evil2.pt"))
    good = tmp_path / "good.pt"
    ckpt.save_atomic({"model": {"w": torch.ones(3)}, "step": 2}, str(good))
    data = good.read_bytes()
    (tmp_path / "cut.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(ckpt.CheckpointError, match="damaged or truncated"):
        ckpt.load(str(tmp_path / "cut.pt"))
    torch.save({"weights": 1}, tmp_path / "other.pt")
    with pytest.raises(ckpt.CheckpointError, match="not a Headroom checkpoint"):
        ckpt.load(str(tmp_path / "other.pt"))
    with pytest.raises(ckpt.CheckpointError, match="no such file"):
        ckpt.load(str(tmp_path / "missing.pt"))
    assert ckpt.load(str(good))["step"] == 2


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


@pytest.mark.slow
def test_import_engine_loads_no_qt_and_light_modules_no_torch():
    p = _python(
        "import sys\n"
        "import engine, engine.declarations.config, engine.declarations.events, engine.declarations.commands, engine.store\n"
        "from engine import TrainConfig, EventBuffer, SetAccum, Stop\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('PySide6', 'shiboken6', 'pyqtgraph', 'app', 'torch'))\n"
        "assert not bad, bad\n"
        "engine.Trainer  # the lazy attribute loads torch, still no Qt\n"
        "assert 'torch' in sys.modules\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('PySide6', 'shiboken6', 'pyqtgraph', 'app'))\n"
        "assert not bad, bad\n"
        "print('ok')\n")
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stderr


def test_engine_sources_never_import_qt():
    engine_dir = os.path.join(ROOT, "engine")
    for folder, _, files in os.walk(engine_dir):
        for name in files:
            if name.endswith(".py"):
                text = open(os.path.join(folder, name), encoding="utf-8").read()
                for word in (r"\bPySide6\b", r"\bpyqtgraph\b", r"\bfrom app\b", r"\bimport app\b"):  # not apprise
                    assert not re.search(word, text), f"{name} mentions {word}"
