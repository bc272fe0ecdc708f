"""The plain-loop API (engine.integrations.loop): the writer under all three adapters."""
from __future__ import annotations

import math
import os
import sqlite3
import subprocess
import sys
import threading
import time

import pytest
import torch
from integ_helpers import ROOT

from engine.declarations.commands import Pause, Resume, SetAccum, SetClip, SetLr, Stop
from engine.integrations.loop import HeadroomRun, IntegrationError, headroom_run, set_lr
from engine.store import RunReader, send_command


def _mlp() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    return m, torch.optim.SGD(m.parameters(), lr=0.1)


def _window(m: torch.nn.Module, opt: torch.optim.Optimizer, clip: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = torch.randn(16, 8), torch.randint(0, 3, (16,))
    loss = torch.nn.functional.cross_entropy(m(x), y)
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(m.parameters(), clip)
    opt.step()
    opt.zero_grad()
    return loss.detach(), norm


def _list_runs():
    from app.core.runs import list_runs  # the app's runs list
    return list_runs


def test_rows_epochs_and_run_table(tmp_path):
    list_runs = _list_runs()
    m, opt = _mlp()
    logged = []
    with headroom_run(config={"lr": 0.1, "epochs": 2, "accum": 4}, task="my-loop") as run:
        assert os.path.dirname(run.run_dir) == str(tmp_path / "runs")  # the runs root, like the engine
        for epoch in range(2):
            for _ in range(3):
                loss, norm = _window(m, opt)
                run.log_step(loss=loss, grad_norm=norm, lr=opt.param_groups[0]["lr"], accum=4, micro_batch=4,
                             clip=1.0)
                logged.append((float(loss), float(norm)))
            run.log_epoch(val_loss=0.25 + epoch)
    r = RunReader(run.run_dir)
    rows = r.metrics()
    assert [x["step"] for x in rows] == [1, 2, 3, 4, 5, 6]
    assert [x["epoch"] for x in rows] == [1, 1, 1, 2, 2, 2]
    assert [x["loss"] for x in rows] == pytest.approx([l for l, _ in logged])
    assert [x["grad_norm"] for x in rows] == pytest.approx([n for _, n in logged])
    assert all(x["lr"] == 0.1 and x["accum"] == 4 and x["micro_batch"] == 4 and x["samples"] == 16 for x in rows)
    assert all(x["step_time"] > 0 and x["throughput"] > 0 for x in rows)
    assert [x["clipped"] for x in rows] == [int(n > 1.0) for _, n in logged]
    eps = r.epochs()
    assert [(e["epoch"], e["step"], e["val_loss"]) for e in eps] == [(1, 3, 0.25), (2, 6, 1.25)]
    assert eps[0]["train_loss"] == pytest.approx(sum(l for l, _ in logged[:3]) / 3)
    info = r.info()
    assert info["status"] == "finished" and info["pid"] == os.getpid() and info["task"] == "my-loop"
    assert info["integration"] == "loop" and info["config"]["epochs"] == 2 and info["step"] == 6
    assert isinstance(info["started"], float)
    kinds = [e["kind"] for e in r.events()]
    assert kinds[0] == "run_started" and kinds[-1] == "run_finished" and kinds.count("epoch_end") == 2
    assert r.events(kinds=["run_finished"])[0]["data"]["reason"] == "completed"
    [listed] = list_runs(str(tmp_path / "runs"))
    assert (listed.task, listed.status, listed.steps) == ("my-loop", "finished", 6)


def test_set_lr_applies_next_step_and_unhandled_is_refused(tmp_path):
    m, opt = _mlp()
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    with headroom_run(tmp_path / "r", poll_interval=0) as run:  # read run.db at every poll
        for step in range(1, 6):
            for cmd in run.poll():  # at the top of a step: what is due applies to this step
                if cmd.kind == "set_lr":
                    run.apply(cmd, lr=set_lr(opt, cmd.lr, sched))
            lr = opt.param_groups[0]["lr"]
            _window(m, opt)
            sched.step()
            run.log_step(loss=1.0, lr=lr)
            if step == 2:
                send_command(run.run_dir, SetLr(0.5, at="step"))
                send_command(run.run_dir, SetAccum(3, at="step"))
                db = sqlite3.connect(os.path.join(run.run_dir, "run.db"))  # what no app would send
                db.execute("INSERT INTO commands (time, kind, payload) VALUES (0, 'set_lr', '{\"lr\": -1}')")
                db.commit()
                db.close()
    r = RunReader(run.run_dir)
    lrs = [x["lr"] for x in r.metrics()]
    assert lrs[:2] == pytest.approx([0.1, 0.05])
    assert lrs[2] == pytest.approx(0.5)  # sent after step 2: step 3 uses it
    assert lrs[3:] == pytest.approx([0.5 * 3 / 4, 0.5 * 3 / 5])  # the schedule goes on: its 1/(1+s) shape
    import json
    cmds = {(c["kind"], json.loads(c["payload"]).get("lr")): c for c in r.commands()}
    assert cmds[("set_lr", 0.5)]["status"] == "applied"
    accum = cmds[("set_accum", None)]
    assert accum["status"] == "refused" and "does not apply" in accum["note"]
    bad = cmds[("set_lr", -1)]
    assert bad["status"] == "refused" and "lr" in bad["note"]
    refused = r.events(kinds=["command_refused"])
    assert {e["data"]["command"] for e in refused} >= {"set_accum"} and len(refused) == 2
    assert r.events(kinds=["settings_applied"])[0]["data"]["changes"] == [["lr", pytest.approx(1 / 30), 0.5]]


def test_an_epoch_setting_waits_for_the_next_epoch(tmp_path):
    with headroom_run(tmp_path / "r", poll_interval=0) as run:
        clip, seen = 1.0, []
        for epoch in range(2):
            for i in range(3):
                for cmd in run.poll():
                    run.apply(cmd, clip=(clip, cmd.norm))
                    clip = cmd.norm
                run.log_step(loss=1.0, grad_norm=0.5, clip=clip)
                seen.append(clip)
                if epoch == 0 and i == 0:
                    send_command(run.run_dir, SetClip(0.25))  # the app's default: at="epoch"
            run.log_epoch()
    assert seen == [1.0, 1.0, 1.0, 0.25, 0.25, 0.25]
    r = RunReader(str(tmp_path / "r"))
    [rx] = r.events(kinds=["command_received"])
    assert (rx["data"]["applies"], rx["data"]["target_epoch"], rx["step"]) == ("epoch", 2, 1)
    [applied] = r.events(kinds=["settings_applied"])
    assert (applied["step"], applied["epoch"], applied["data"]["changes"]) == (3, 2, [["clip", 1.0, 0.25]])
    assert (applied["data"]["at"], applied["data"]["from_step"]) == ("epoch", 4)  # the first step it trained


def test_step_settings_say_so_and_the_engines_watchers_see_the_rows(tmp_path):
    """A change applied between steps is at="step" from the next step; an accumulation change with
    the lr left as it was gets the engine's lr hint; 50 steps all clipped raise clip saturation."""
    with headroom_run(tmp_path / "r", poll_interval=0) as run:
        accum, clip = 2, 0.3
        for step in range(1, 56):
            for cmd in run.poll():
                if cmd.kind == "set_clip":
                    run.apply(cmd, clip=(clip, cmd.norm))
                    clip = cmd.norm
                elif cmd.kind == "set_accum":
                    run.apply(cmd, accum=(accum, cmd.accum))
                    accum = cmd.accum
            run.log_step(loss=1.0, grad_norm=1.0, clip=clip, lr=0.01, accum=accum, micro_batch=4)
            if step == 2:
                send_command(run.run_dir, SetClip(0.2, at="step"))
                send_command(run.run_dir, SetAccum(4, at="step"))
    r = RunReader(str(tmp_path / "r"))
    applied = r.events(kinds=["settings_applied"])
    assert [(e["step"], e["data"]["changes"][0][0], e["data"]["at"], e["data"]["from_step"]) for e in applied] == [
        (2, "clip", "step", 3), (2, "accum", "step", 3)]
    [hint] = r.events(kinds=["lr_hint"])
    assert (hint["data"]["accum_old"], hint["data"]["accum_new"]) == (2, 4)
    assert hint["data"]["suggested_lr"] == pytest.approx(0.02)
    [sat] = r.events(kinds=["clip_saturation"])
    assert sat["step"] == 50 and sat["data"]["clip"] == pytest.approx(0.2)


def test_pause_blocks_poll_until_resume_and_stop_ends_the_run(tmp_path):
    with headroom_run(tmp_path / "r", poll_interval=0) as run:
        run.log_step(loss=1.0)
        send_command(run.run_dir, Pause())
        threading.Timer(0.4, send_command, (run.run_dir, Resume())).start()
        t0 = time.monotonic()
        assert run.poll() == []
        waited = time.monotonic() - t0
        assert not run.paused and waited >= 0.35
        run.log_step(loss=0.5)
        send_command(run.run_dir, Stop())
        run.poll()
        assert run.stop_requested
    r = RunReader(run.run_dir)
    kinds = [e["kind"] for e in r.events()]
    assert kinds.index("paused") < kinds.index("unpaused")
    assert r.events(kinds=["run_finished"])[0]["data"]["reason"] == "stopped"
    assert all(c["status"] == "applied" for c in r.commands())
    assert r.metrics()[1]["step_time"] < 0.3  # the pause is not counted as training time


def test_poll_reads_run_db_at_most_every_poll_interval(tmp_path):
    with headroom_run(tmp_path / "r", poll_interval=0.3) as run:
        assert run.poll() == []  # the first read
        send_command(run.run_dir, SetLr(0.5, at="step"))
        t0 = time.monotonic()
        got = run.poll()
        while not got:
            time.sleep(0.01)
            got = run.poll()
        assert time.monotonic() - t0 >= 0.25 and [c.kind for c in got] == ["set_lr"]
        run.refuse(got[0], "not today")
    assert RunReader(str(tmp_path / "r")).commands()[0]["note"] == "not today"


def test_an_exception_fails_the_run_and_propagates(tmp_path):
    with pytest.raises(ZeroDivisionError):
        with headroom_run(tmp_path / "r") as run:
            run.log_step(loss=1.0)
            raise ZeroDivisionError("division by zero")
    r = RunReader(str(tmp_path / "r"))
    assert r.info()["status"] == "failed"
    assert "ZeroDivisionError" in r.events(kinds=["run_failed"])[0]["message"]


def test_nonfinite_step_is_an_event(tmp_path):
    with headroom_run(tmp_path / "r") as run:
        run.log_step(loss=float("nan"), grad_norm=2.0, bad_params=("w",), nonfinite_action="skipped")
        run.log_step(loss=1.0, grad_norm=float("inf"))
        run.log_step(loss=1.0, grad_norm=0.5)
    r = RunReader(str(tmp_path / "r"))
    assert [x["nonfinite"] for x in r.metrics()] == [1, 1, 0]
    ev = r.events(kinds=["nonfinite"])
    assert len(ev) == 2 and ev[0]["data"]["params"] == ["w"] and "skipped" in ev[0]["message"]
    assert ev[0]["data"]["loss_finite"] is False and ev[1]["data"]["loss_finite"] is True
    assert r.epochs() == []


def test_bad_arguments_say_what_is_wrong(tmp_path):
    with pytest.raises(TypeError, match="run_dir"):
        HeadroomRun(123)
    with pytest.raises(TypeError, match="config"):
        HeadroomRun(config=["lr", 1])
    with pytest.raises(TypeError, match="world_size"):
        HeadroomRun(world_size=0)
    with headroom_run(tmp_path / "r") as run:
        with pytest.raises(IntegrationError, match="loss"):
            run.log_step(loss="low")
        with pytest.raises(IntegrationError, match="accum"):
            run.log_step(loss=1.0, accum=0)
        with pytest.raises(IntegrationError, match="not a command handed out"):
            run.apply(SetLr(0.1))
    with pytest.raises(IntegrationError, match="already holds a run"):
        HeadroomRun(tmp_path / "r").start()
    (tmp_path / "file").write_text("x")
    with pytest.raises(IntegrationError, match="not a folder"):
        HeadroomRun(tmp_path / "file").start()
    with pytest.raises(RuntimeError, match="not started"):
        HeadroomRun(tmp_path / "new").log_step(loss=1.0)
    m, opt = _mlp()
    with pytest.raises(IntegrationError, match="positive"):
        set_lr(opt, -1.0)
    assert not (tmp_path / "new").exists()  # nothing written for a run that never started


@pytest.mark.parametrize("make", ["lambda", "onecycle", "sequential", "cosine"])
def test_set_lr_keeps_the_schedules_shape(make):
    """After set_lr(x) at step 4, every later lr is the untouched schedule's times one factor."""
    def build():
        p = [torch.nn.Parameter(torch.zeros(2))]
        opt = torch.optim.SGD([{"params": p, "lr": 0.1}, {"params": [torch.nn.Parameter(torch.zeros(1))], "lr": 0.02}])
        S = torch.optim.lr_scheduler
        if make == "lambda":
            s = S.LambdaLR(opt, lambda t: 0.9 ** t)
        elif make == "onecycle":
            s = S.OneCycleLR(opt, max_lr=[0.1, 0.02], total_steps=20)
        elif make == "sequential":
            s = S.SequentialLR(opt, [S.LinearLR(opt, 0.1, 1.0, total_iters=5), S.ExponentialLR(opt, 0.8)],
                               milestones=[5])
        else:
            s = S.CosineAnnealingLR(opt, T_max=30)
        return opt, s

    a, sa = build()
    b, sb = build()
    for _ in range(4):
        for o, s in ((a, sa), (b, sb)):
            o.step()
            s.step()
    old, new = set_lr(b, 0.05, sb)
    assert new == pytest.approx(0.05) and old == pytest.approx(a.param_groups[0]["lr"])
    factor = 0.05 / old
    for _ in range(10):
        for i in range(2):
            assert b.param_groups[i]["lr"] == pytest.approx(a.param_groups[i]["lr"] * factor, rel=1e-6)
        assert sb.get_last_lr()[0] == pytest.approx(b.param_groups[0]["lr"])
        for o, s in ((a, sa), (b, sb)):
            o.step()
            s.step()


def test_importing_engine_and_the_app_loads_no_framework():
    code = ("import sys, engine, engine.integrations, engine.integrations.loop, engine.store, app.main_window\n"
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('transformers', 'lightning', "
            "'pytorch_lightning', 'accelerate'))\n"
            "assert not bad, bad\n"
            "assert 'PySide6' not in str([m for m in sys.modules if m.startswith('engine')])\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT), QT_QPA_PLATFORM="offscreen")
    r = subprocess.run([sys.executable, "-c", code], cwd=str(ROOT), env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]


@pytest.mark.slow
def test_readme_plain_loop_example_runs(tmp_path):
    """The README's plain-loop example, as printed, trains and writes a run the reader reads."""
    import re
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    section = readme.split("## Already have a training script?", 1)[1].split("\n## ", 1)[0]
    [example] = [b for b in re.findall(r"```python\n(.*?)```", section, flags=re.S) if "with headroom_run(" in b]
    script = tmp_path / "loop.py"
    script.write_text(example)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, str(script)], cwd=str(tmp_path), env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    [run_dir] = [os.path.join(tmp_path / "runs", d) for d in os.listdir(tmp_path / "runs")]
    rows = RunReader(run_dir).metrics()
    assert len(rows) >= 10 and all(x["grad_norm"] is not None and x["lr"] > 0 for x in rows)
    assert math.isfinite(rows[-1]["loss"])


def test_lr_scale_close_and_the_decorator(tmp_path):
    """A loop that sets its lr every iteration keeps the app's change through run.lr_scale; the
    close() form and the decorator end the run as the with-block does."""
    m, opt = _mlp()
    run = headroom_run(tmp_path / "r", poll_interval=0).start()  # no with: the loop is not re-indented
    schedule = [0.1, 0.08, 0.06, 0.04, 0.02]
    for it, base in enumerate(schedule):
        lr = base * run.lr_scale
        for cmd in run.poll():
            run.apply(cmd, lr=(lr, cmd.lr))
            lr = cmd.lr
        for g in opt.param_groups:
            g["lr"] = lr
        _window(m, opt)
        run.log_step(loss=1.0, lr=lr)
        if it == 1:
            send_command(run.run_dir, SetLr(0.03, at="step"))  # half of step 3's scheduled 0.06
    run.close()
    run.close()  # idempotent
    r = RunReader(str(tmp_path / "r"))
    assert [x["lr"] for x in r.metrics()] == pytest.approx([0.1, 0.08, 0.03, 0.02, 0.01])  # the schedule, halved
    assert run.lr_scale == pytest.approx(0.5)
    assert r.info()["status"] == "finished" and r.events(kinds=["run_finished"])[0]["data"]["reason"] == "completed"

    run2 = headroom_run(tmp_path / "r2")

    @run2
    def train(n: int) -> int:
        for _ in range(n):
            run2.log_step(loss=1.0)
        raise ValueError("diverged")

    with pytest.raises(ValueError, match="diverged"):
        train(2)
    r2 = RunReader(str(tmp_path / "r2"))
    assert len(r2.metrics()) == 2 and r2.info()["status"] == "failed"
    assert "ValueError: diverged" in r2.events(kinds=["run_failed"])[0]["data"]["error"]
