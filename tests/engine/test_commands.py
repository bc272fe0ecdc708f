"""Commands take effect exactly at the epoch boundary (settings, pause) or at the next step (stop),
whether they arrive through trainer.send (same thread or another one) or through run.db's
commands table; and command_from_json refuses anything unexpected."""
from __future__ import annotations

import json
import math
import sqlite3
import threading
import time

import pytest
import torch
from engine_helpers import RecordingSGD, make_task, run_trainer

from engine.checkpoints import files as ckpt
from engine.declarations.commands import (
    COMMANDS,
    Pause,
    SetAccum,
    SetClip,
    SetLr,
    SetLrScaling,
    SetMicroBatch,
    Stop,
    Unpause,
    command_from_json,
)
from engine.declarations.config import ConfigError
from engine.store import RunReader, send_command

N, MICRO, ACCUM, LR = 24, 2, 3, 0.1  # epoch 1: 4 steps of 6 samples
NEW_ACCUM, NEW_LR, NEW_CLIP = 2, 0.05, 0.2  # epoch 2: 6 steps of 4 samples


def in_thread(fn) -> None:
    """Run fn on another thread and wait for it (the sink blocks the training thread meanwhile)."""
    err: list[BaseException] = []

    def target():
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - the thread hands back whatever the call raised
            err.append(e)
    t = threading.Thread(target=target)
    t.start()
    t.join(timeout=30)
    assert not t.is_alive(), "sending the command hung"
    if err:
        raise err[0]


def settings_commands():
    return [SetAccum(NEW_ACCUM), SetLr(NEW_LR), SetClip(NEW_CLIP)]


@pytest.mark.parametrize("how", ["sink_at_epoch_end", "sink_mid_epoch", "other_thread", "run_db"])
def test_settings_apply_exactly_at_epoch_boundary(tmp_path, how):
    def on_event(e, trainer):
        at_end = e.kind == "epoch_end" and e.epoch == 1
        mid = e.kind == "step" and e.step == 2
        if how == "sink_at_epoch_end" and at_end:
            for c in settings_commands():
                trainer.send(c)
        elif how == "sink_mid_epoch" and mid:
            for c in settings_commands():
                trainer.send(c)
        elif how == "other_thread" and mid:
            in_thread(lambda: [trainer.send(c) for c in settings_commands()])
        elif how == "run_db" and mid:
            in_thread(lambda: [send_command(str(tmp_path / "run"), c) for c in settings_commands()])

    task = make_task(N, optimizer=RecordingSGD)
    run = run_trainer(task, tmp_path / "run", on_event=on_event, micro_batch=MICRO, accum=ACCUM, lr=LR, clip=0.0,
                      epochs=2)
    steps = run.steps
    assert [m.epoch for m in steps] == [1] * 4 + [2] * 6
    for m in steps[:4]:  # the whole first epoch keeps the old settings
        assert (m.accum, m.lr, m.clip, m.samples) == (ACCUM, LR, 0.0, MICRO * ACCUM)
    for m in steps[4:]:  # the first step of epoch 2 and every one after use the new ones
        assert (m.accum, m.lr, m.clip, m.samples) == (NEW_ACCUM, NEW_LR, NEW_CLIP, MICRO * NEW_ACCUM)
    # What the optimizer really used, and what it was given (clip 0.5 applies from step 5 on).
    opt = run.trainer.optimizer
    assert opt.lrs == [LR] * 4 + [NEW_LR] * 6
    norms = [math.sqrt(sum(float(g.pow(2).sum()) for g in gs)) for gs in opt.grads]
    for m, applied in zip(steps, norms):
        assert applied == pytest.approx(min(m.grad_norm, m.clip or math.inf), rel=1e-5)
    assert any(m.clipped for m in steps[4:]) and not any(m.clipped for m in steps[:4])

    (ev,) = run.of("settings_applied")
    assert (ev.step, ev.epoch) == (4, 2)
    assert set(ev.changes) == {("accum", ACCUM, NEW_ACCUM), ("lr", LR, NEW_LR), ("clip", 0.0, NEW_CLIP)}
    assert not run.of("lr_hint")  # the lr was set explicitly alongside the accumulation change

    reader = RunReader(run.run_dir)
    rows = reader.metrics()
    assert [r["step"] for r in rows] == list(range(1, 11))
    assert [(r["accum"], r["lr"], r["clip"]) for r in rows] == \
        [(ACCUM, LR, 0.0)] * 4 + [(NEW_ACCUM, NEW_LR, NEW_CLIP)] * 6
    (row,) = reader.events(kinds=["settings_applied"])
    assert (row["step"], row["epoch"]) == (4, 2)
    if how == "run_db":
        cmds = reader.commands()
        assert [c["kind"] for c in cmds] == ["set_accum", "set_lr", "set_clip"]
        assert all(c["status"] == "applied" and c["applied_step"] == 4 for c in cmds)


@pytest.mark.parametrize("rule, expected_lr", [("none", LR), ("linear", 2 * LR), ("sqrt", math.sqrt(2) * LR)])
def test_lr_scaling_follows_accumulation(tmp_path, rule, expected_lr):
    def on_event(e, trainer):
        if e.kind == "epoch_end" and e.epoch == 1:
            trainer.send(SetAccum(2 * ACCUM))

    run = run_trainer(make_task(N, optimizer=RecordingSGD), tmp_path / "run", on_event=on_event,
                      micro_batch=MICRO, accum=ACCUM, lr=LR, lr_scaling=rule, epochs=2)
    assert run.steps[-1].lr == pytest.approx(expected_lr, rel=1e-12)
    assert run.trainer.optimizer.lrs[-1] == pytest.approx(expected_lr, rel=1e-12)
    assert run.steps[-1].accum == 2 * ACCUM and run.steps[-1].samples == 2 * MICRO * ACCUM
    hints = run.of("lr_hint")
    if rule == "none":
        (hint,) = hints
        assert hint.suggested_lr == pytest.approx(2 * LR) and (hint.accum_old, hint.accum_new) == (ACCUM, 2 * ACCUM)
    else:
        assert not hints


def test_set_micro_batch_and_lr_scaling_command(tmp_path):
    def on_event(e, trainer):
        if e.kind == "epoch_end" and e.epoch == 1:
            trainer.send(SetLrScaling("linear"))
            trainer.send(SetMicroBatch(4))  # window 6 -> 12: linear rule doubles the lr

    run = run_trainer(make_task(N), tmp_path / "run", on_event=on_event, micro_batch=MICRO, accum=ACCUM, lr=LR,
                      epochs=2)
    last = run.steps[-1]
    assert (last.micro_batch, last.samples, last.lr) == (4, 12, pytest.approx(2 * LR))
    (ev,) = run.of("settings_applied")
    assert ("micro_batch", MICRO, 4) in ev.changes and ("lr_scaling", "none", "linear") in ev.changes


def test_pause_waits_at_boundary_until_unpause(tmp_path):
    def on_event(e, trainer):
        if e.kind == "epoch_end" and e.epoch == 1:
            trainer.send(Pause())
        elif e.kind == "paused":
            def later():
                time.sleep(0.3)
                trainer.send(SetLr(0.02))
                trainer.send(Unpause())
            threading.Thread(target=later, daemon=True).start()

    t0 = time.monotonic()
    run = run_trainer(make_task(N), tmp_path / "run", on_event=on_event, micro_batch=MICRO, accum=ACCUM, lr=LR,
                      epochs=2)
    kinds = [e.kind for e in run.events if e.kind in ("epoch_end", "paused", "unpaused", "settings_applied", "step")]
    i = kinds.index("paused")
    assert kinds[i - 1] == "epoch_end" and kinds[i + 1:i + 4] == ["unpaused", "settings_applied", "step"]
    paused = run.of("paused")[0]
    assert (paused.step, paused.epoch) == (4, 1)
    assert [m.lr for m in run.steps] == [LR] * 4 + [0.02] * 4
    assert time.monotonic() - t0 >= 0.3
    assert run.result.reason == "completed"


def test_stop_applies_at_next_step_with_checkpoint(tmp_path):
    def on_event(e, trainer):
        if e.kind == "step" and e.step == 2:
            trainer.send(Stop())

    run = run_trainer(make_task(N), tmp_path / "run", on_event=on_event, micro_batch=MICRO, accum=ACCUM, lr=LR,
                      epochs=2)
    assert run.result.reason == "stopped" and [m.step for m in run.steps] == [1, 2]
    state = torch.load(ckpt.last_path(run.run_dir), weights_only=True)
    assert (state["step"], state["epoch"], state["window"]) == (2, 1, 2)
    assert run.of("run_finished")[0].reason == "stopped"


def test_stop_while_paused_ends_the_run(tmp_path):
    def on_event(e, trainer):
        if e.kind == "epoch_end" and e.epoch == 1:
            trainer.send(Pause())
        elif e.kind == "paused":
            threading.Thread(target=lambda: (time.sleep(0.1), trainer.send(Stop())), daemon=True).start()

    run = run_trainer(make_task(N), tmp_path / "run", on_event=on_event, micro_batch=MICRO, accum=ACCUM, lr=LR,
                      epochs=3)
    assert run.result.reason == "stopped" and run.result.steps == 4


def test_invalid_command_row_is_refused(tmp_path):
    """A malformed row in run.db's commands table is refused with an event; training goes on."""
    def on_event(e, trainer):
        if e.kind == "step" and e.step == 1:
            def insert():
                db = sqlite3.connect(str(tmp_path / "run" / "run.db"), timeout=10)
                db.execute("INSERT INTO commands (time, kind, payload) VALUES (?,?,?)",
                           (time.time(), "set_accum", json.dumps({"steps": 0})))
                db.execute("INSERT INTO commands (time, kind, payload) VALUES (?,?,?)",
                           (time.time(), "rm_rf", "{}"))
                db.commit()
                db.close()
            in_thread(insert)

    run = run_trainer(make_task(N), tmp_path / "run", on_event=on_event, micro_batch=MICRO, accum=ACCUM, lr=LR,
                      epochs=2)
    assert run.result.reason == "completed" and len(run.of("command_refused")) == 2
    assert all(m.accum == ACCUM for m in run.steps)
    cmds = RunReader(run.run_dir).commands()
    assert [c["status"] for c in cmds] == ["refused", "refused"]


# -- command_from_json -------------------------------------------------------------------------------
@pytest.mark.parametrize("cmd", [SetAccum(3), SetMicroBatch(8), SetClip(0.0), SetClip(2.5), SetLr(0.0), SetLr(3e-4),
                                 SetLrScaling("sqrt"), Pause(), Unpause(), Stop()])
def test_command_json_round_trip(cmd):
    assert command_from_json(cmd.kind, cmd.to_json()) == cmd
    assert COMMANDS[cmd.kind] is type(cmd)


@pytest.mark.parametrize("kind, payload", [
    ("no_such_command", "{}"),
    ("__import__", "{}"),
    ("set_accum", "not json"),
    ("set_accum", "[3]"),
    ("set_accum", "3"),
    ("set_accum", "{}"),                      # missing field
    ("set_accum", '{"steps": 0}'),
    ("set_accum", '{"steps": -2}'),
    ("set_accum", '{"steps": 2.5}'),
    ("set_accum", '{"steps": true}'),
    ("set_accum", '{"steps": "4"}'),
    ("set_accum", '{"steps": 2, "extra": 1}'),
    ("set_accum", '{"accum": 0}'),
    ("set_accum", '{"accum": 2, "steps": 3}'),  # the old name beside the new one: not a field any more
    ("set_micro_batch", '{"size": 0}'),
    ("set_lr", '{"lr": -1}'),
    ("set_lr", '{"lr": NaN}'),
    ("set_lr", '{"lr": Infinity}'),
    ("set_lr", '{"lr": "0.1"}'),
    ("set_clip", '{"norm": -0.5}'),
    ("set_clip", '{"norm": Infinity}'),
    ("set_lr_scaling", '{"rule": "cubic"}'),
    ("stop", '{"now": true}'),
])
def test_command_from_json_rejects(kind, payload):
    with pytest.raises(ConfigError) as info:
        command_from_json(kind, payload)
    assert "\n" not in str(info.value)


def test_commands_validate_on_creation():
    for bad in (lambda: SetAccum(0), lambda: SetLr(float("nan")), lambda: SetClip(-1.0),
                lambda: SetMicroBatch(False), lambda: SetLrScaling("x")):
        with pytest.raises(ConfigError):
            bad()


def test_engine_never_holds_the_run_db_write_lock_between_writes(tmp_path):
    """Another process must be able to queue a command at any time, however slow a step is:
    after a non-step event (here a NaN skip), after a command row is marked received, and
    after settings apply, the engine has committed, so a writer with no wait at all gets in."""
    from test_nonfinite import poisoned_loss
    run_dir = tmp_path / "run"
    probes: list[tuple[int, str]] = []

    def probe() -> str:
        db = sqlite3.connect(str(run_dir / "run.db"), timeout=0)
        try:
            db.execute("BEGIN IMMEDIATE")
            db.rollback()
            return "free"
        except sqlite3.OperationalError as e:
            return str(e)
        finally:
            db.close()

    def on_event(e, trainer):
        if e.kind in ("step", "settings_applied", "nonfinite", "epoch_end", "checkpoint"):
            got: list[str] = []
            in_thread(lambda: got.append(probe()))
            probes.append((e.step, e.kind, got[0]))
        if e.kind == "step" and e.step == 3:
            in_thread(lambda: send_command(str(run_dir), SetLr(0.05)))  # read after this step (db_interval=0)

    run = run_trainer(make_task(N, loss=poisoned_loss((2,))), run_dir, on_event=on_event, micro_batch=MICRO,
                      accum=ACCUM, lr=LR, epochs=2, db_interval=0)
    assert run.result.nonfinite_steps == 1 and run.steps[-1].lr == 0.05
    assert [c["status"] for c in RunReader(str(run_dir)).commands()] == ["applied"]
    locked = [p for p in probes if p[2] != "free"]
    assert not locked, locked


def test_no_command_row_is_left_received(tmp_path):
    """Pause and unpause rows from run.db say what became of them; an unpause while nothing is
    paused is refused with the reason; a stop is applied; a setting sent as the run ends is
    refused saying so (each stayed "received" for ever)."""
    run_dir = tmp_path / "run"

    def on_event(e, trainer):
        if e.kind == "step" and e.step == 1:
            in_thread(lambda: send_command(str(run_dir), Unpause()))  # nothing is paused
        elif e.kind == "epoch_end" and e.epoch == 1:
            in_thread(lambda: send_command(str(run_dir), Pause()))
        elif e.kind == "paused":
            in_thread(lambda: send_command(str(run_dir), Unpause()))
        elif e.kind == "step" and e.step == 6:
            in_thread(lambda: [send_command(str(run_dir), c) for c in (SetLr(0.03), Stop())])

    run = run_trainer(make_task(N), run_dir, on_event=on_event, micro_batch=MICRO, accum=ACCUM, lr=LR, epochs=3,
                      db_interval=0)
    assert run.result.reason == "stopped"
    cmds = RunReader(str(run_dir)).commands()
    by = [(c["kind"], c["status"]) for c in cmds]
    assert by == [("unpause", "refused"), ("pause", "applied"), ("unpause", "applied"), ("set_lr", "refused"),
                  ("stop", "applied")], by
    assert "nothing is paused" in cmds[0]["note"] and "ended" in cmds[3]["note"]
    refused = [e.reason for e in run.of("command_refused")]
    assert any("nothing is paused" in r for r in refused)
