"""What `headroom-ctl ... --wait` says once the engine answers: a setting holds from the step after
the one it was applied at ("applied from step N"); a stop, pause or unpause changes no setting and
says what happened where ("stop: stopped at step 2801", the run's last step: it said "applied from
step 2802" for a run that ended at 2801). The record keeps from_step for settings only. Qt-free
and engine-free: the records are built from command rows as the engine marks them (the live stop
is in test_ctl_local.py)."""
from __future__ import annotations

import pytest

from engine.ctl.local import _command_record
from engine.ctl.output import render
from engine.declarations.commands import Pause, SetLr, Stop, Unpause


def answered(cmd, step: int, status: str = "applied", note: str = "") -> dict:
    return _command_record(7, cmd, {"status": status, "applied_step": step, "note": note})


@pytest.mark.parametrize("cmd,said", [
    (Stop(), "stop: stopped at step 2801"),
    (Pause(), "pause: paused after step 2801"),
    (Unpause(), "unpause: resumed at step 2801"),
])
def test_a_stop_pause_or_unpause_says_what_happened_at_its_step(cmd, said):
    record = answered(cmd, 2801)
    assert record["applied_step"] == 2801 and record["from_step"] is None
    assert render(record) == said


def test_a_setting_says_the_first_step_it_holds_for():
    record = answered(SetLr(5e-4, at="step"), 2801)
    assert record["from_step"] == 2802
    assert render(record) == "set_lr lr=0.0005 (at step): applied from step 2802"


def test_a_stop_without_a_checkpoint_says_so_and_a_refusal_gives_its_reason():
    assert render(answered(Stop(), 40, note="no checkpoint")) == "stop: stopped at step 40 (no checkpoint)"
    refused = answered(Unpause(), 40, "refused", "nothing is paused")
    assert refused["from_step"] is None and render(refused) == "unpause: refused: nothing is paused"
    assert render(answered(Stop(), None, "pending")).startswith("stop: sent")
