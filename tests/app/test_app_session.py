"""The run session's state machine, on its own (no Qt, no engine thread): events from a fake
source move it, commands go out through the source, and one rule says what the user may do."""
from __future__ import annotations

from typing import Any

from app.model.state import RunState
from app.session.rules import allowed
from app.session.session import RunSession, receipt_cut
from app.session.sources import FolderSource
from engine.declarations.commands import Pause, Resume, SetAccum, Stop
from engine.declarations.events import (
    CommandReceived,
    CommandRefused,
    Paused,
    Resumed,
    RunFailed,
    RunFinished,
    RunStarted,
    SettingsApplied,
    StepMetrics,
)

CONFIG = {"micro_batch": 64, "accum": 2, "lr": 1e-3, "clip": 1.0, "lr_scaling": "none", "epochs": 3}


class FakeSource:
    live = True
    run_dir = None
    step_get = staticmethod(getattr)

    def __init__(self) -> None:
        self.items: list[Any] = []
        self.sent: list[Any] = []
        self.stopped = False

    def poll(self, force: bool = False) -> list[Any]:
        out, self.items = self.items, []
        return out

    def send(self, command: Any) -> None:
        self.sent.append(command)

    def stop(self) -> None:
        self.stopped = True

    def close(self) -> None:
        pass


class DeadFolder(FolderSource):
    """A run folder whose run.db says 'running' but whose process is gone."""

    step_get = staticmethod(getattr)

    def __init__(self, steps: list[Any]) -> None:  # no run.db: the session only reads these
        self.run_dir = "/nowhere"
        self.info = {"status": "running", "pid": -1}
        self.running = False
        self._steps = steps

    def poll(self, force: bool = False) -> list[Any]:
        out, self._steps = self._steps, []
        return out

    def problems(self) -> list[Any]:
        return []

    def close(self) -> None:
        pass


def step(i: int, epoch: int = 1, accum: int = 2) -> StepMetrics:
    return StepMetrics(i, epoch, loss=1.0, grad_norm=1.0, clipped=False, lr=1e-3, accum=accum, clip=1.0,
                       micro_batch=64, samples=128, tokens=128, step_time=0.01, throughput=1.0, nonfinite=False,
                       scaler_skipped=False)


def started() -> RunStarted:
    return RunStarted(0, 1, run_dir="", task="mlp", device="cpu", device_name="cpu", torch_version="",
                      world_size=1, resumed=False, config=dict(CONFIG))


def live_session() -> tuple[RunSession, FakeSource]:
    s, src = RunSession(), FakeSource()
    s.begin(src, engine=True)
    src.items = [started(), step(1), step(2)]
    s.poll()
    return s, src


def test_a_run_goes_through_its_states_on_commands_and_the_engines_word():
    s, src = RunSession(), FakeSource()
    u = s.begin(src, engine=True)
    assert s.state is RunState.STARTING and s.busy and u.reset and u.state
    src.items = [started(), step(1)]
    s.poll()
    assert s.state is RunState.TRAINING and s.state == "training" and s.model.state is RunState.TRAINING
    assert s.pending.engine == {k: CONFIG[k] for k in ("micro_batch", "accum", "lr", "clip", "lr_scaling", "epochs")}
    s.pause()
    assert s.state is RunState.PAUSING
    src.items = [step(2), Paused(2, 1)]  # the pause comes after the steps of its epoch
    s.poll()
    assert s.state is RunState.PAUSED
    s.resume()
    assert s.state is RunState.PAUSED  # until the engine says it resumed
    src.items = [Resumed(2, 2), step(3, epoch=2)]
    s.poll()
    assert s.state is RunState.TRAINING
    s.stop()
    assert s.state is RunState.STOPPING and src.stopped
    src.items = [RunFinished(3, 2, reason="stopped")]
    s.poll()
    assert s.state is RunState.FINISHED and s.model.finish_reason == "stopped"
    assert s.busy  # the engine thread is still ending: no new run yet
    s.engine_stopped()
    assert not s.busy and s.state is RunState.FINISHED and s.view_state() == "idle"
    assert [type(c.command) for c in s.sent] == [Pause, Resume, Stop] and src.sent == [Pause(), Resume()]


def test_a_stop_before_the_run_starts_holds_and_a_run_that_never_said_it_ended_is_idle():
    s, src = RunSession(), FakeSource()
    s.begin(src, engine=True)
    s.stop()
    src.items = [started()]
    s.poll()
    assert s.state is RunState.STOPPING  # run_started does not undo the Stop
    s.engine_stopped()
    assert s.state is RunState.IDLE and not s.busy


def test_failure_refusal_to_start_and_a_dead_run_folder():
    s, src = live_session()
    src.items = [RunFailed(2, 1, error="boom")]
    s.poll()
    assert s.state is RunState.FAILED and s.model.finish_reason == "boom" and not s.state.is_live
    s2 = RunSession()
    s2.begin(FakeSource(), engine=True)
    s2.not_started()
    assert s2.state is RunState.IDLE
    s3 = RunSession()
    s3.open(DeadFolder([step(1), step(2)]))
    assert s3.state is RunState.INTERRUPTED and s3.view_state() == "viewing" and s3.model.step == 2


def test_one_rule_for_the_run_actions():
    def ok(state: RunState, busy: bool = True, edits: bool = False, gpus: int = 0) -> tuple:
        a = allowed(state, busy, edits, gpus, 2)
        return a.start, a.pause, a.resume, a.stop, a.apply, a.launch

    assert ok(RunState.IDLE, busy=False, gpus=2) == (True, False, False, False, False, True)
    assert ok(RunState.IDLE, busy=False, gpus=1) == (True, False, False, False, False, False)
    assert ok(RunState.STARTING) == (False, False, False, True, False, False)
    assert ok(RunState.TRAINING) == (False, True, False, True, False, False)
    assert ok(RunState.TRAINING, edits=True) == (False, True, False, True, True, False)
    assert ok(RunState.PAUSING, edits=True) == (False, False, True, True, True, False)
    assert ok(RunState.PAUSED) == (False, False, True, True, False, False)
    assert ok(RunState.STOPPING, edits=True) == (False, False, False, False, False, False)
    assert ok(RunState.FINISHED, busy=True) == (False, False, False, False, False, False)  # thread still ending


def test_a_change_shows_the_engines_receipt_for_a_frame_before_its_outcome():
    s, src = live_session()
    u, err = s.apply({"accum": 4})
    assert not err and u.pending == ["accum"] and src.sent == [SetAccum(4)]
    assert s.pending.text("accum") == "pending: 4 (sent)"
    received = CommandReceived(2, 1, command="set_accum", payload={"steps": 4}, applies="epoch", target_epoch=2)
    src.items = [received, SettingsApplied(2, 2, changes=(("accum", 2, 4),)), step(3, epoch=2, accum=4)]
    assert receipt_cut(src.items) == 1
    s.poll()
    assert s.pending.text("accum") == "pending: 4 applies at epoch 2" and s.model.step == 2
    s.poll()
    assert s.pending.text("accum") == "applied: 4 from epoch 2, after step 2" and s.model.step == 3


def test_receipt_while_paused_refusal_and_a_run_that_ends_first():
    s, src = live_session()
    src.items = [Paused(2, 1)]
    s.poll()
    s.apply({"accum": 4, "clip": 0.5})
    src.items = [CommandReceived(2, 1, command="set_accum", payload={"steps": 4}, applies="epoch", target_epoch=2)]
    s.poll()
    assert s.pending.text("accum") == "pending: 4 applies at epoch 2 (now: the run is paused)"
    src.items = [CommandRefused(2, 1, command="set_accum", reason="accumulation is set by --token-budget")]
    s.poll()
    assert s.pending.text("accum") == "refused: accumulation is set by --token-budget"
    assert s.pending.engine["accum"] == 2
    u, _ = s.apply({"accum": 0})  # the form let a bad value through: refused here, nothing sent
    assert s.pending.text("accum").startswith("refused: ") and "got 0" in s.pending.text("accum")
    assert u.pending == ["accum"]
    src.items = [RunFinished(2, 1, reason="stopped")]
    u = s.poll()
    assert "clip" in u.pending and s.pending.text("clip") == "not applied: the run ended first (0.5)"


def test_no_commands_without_a_live_run():
    s, src = live_session()
    s.stop()
    u, _ = s.apply({"accum": 4})
    assert u.pending == [] and src.sent == []  # stopping: changes no longer go out
    assert not s.pause().state and not s.resume().state
    idle = RunSession()
    assert not idle.stop().state and idle.apply({"accum": 4})[0].pending == [] and idle.state is RunState.IDLE


def test_steps_drained_at_once_keep_the_time_the_engine_emitted_each():
    """A busy GUI (or a fast run) drains many steps in one tick: the wall-time axis must
    still space them as the engine emitted them, not stamp them all with the drain's time."""
    import time

    import numpy as np

    from app.session.sources import LiveSource
    from engine.declarations.events import EventBuffer

    buf = EventBuffer()
    emitted = []
    for i in range(1, 5):
        emitted.append(time.time())
        buf.put(step(i))
        time.sleep(0.02)
    s = RunSession()
    src = LiveSource(buf, lambda _c: None)
    s.begin(src)
    s.poll(flush=True)  # one drain takes all four
    t = s.model.metrics.view("time")
    assert len(t) == 4
    assert np.all(np.diff(t) >= 0.015)  # a drain-time stamp would give diffs of 0
    np.testing.assert_allclose(t, emitted, atol=0.01)
