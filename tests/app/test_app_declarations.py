"""The app's form is the engine's declaration of the settings (engine/declarations/settings.py):
every setting with a label is a field of the Controls panel under that label, every live one a
field of the live group that Apply sends, with the engine's range; old spellings (a saved form
or config with `warmup`, a run.db row of kind "resumed", a receipt with {"steps": N}) still work."""
from __future__ import annotations

import pytest
from PySide6.QtWidgets import QAbstractButton, QFormLayout

from app.model.notes import Note
from app.model.pending import ChangeStatus, PendingChanges
from app.model.state import RunState
from app.session.session import RunSession
from engine.declarations.commands import SetAccum
from engine.declarations.config import RANGES
from engine.declarations.events import CommandReceived, Paused
from engine.declarations.settings import LAUNCH_GROUP, LIVE_SETTINGS, SETTINGS


def form_label(widget) -> str:
    """The label a form row shows for `widget` (a check box shows it as its own text)."""
    if isinstance(widget, QAbstractButton):
        return widget.text()
    form = widget.parentWidget().layout()
    assert isinstance(form, QFormLayout)
    label = form.labelForField(widget)
    return label.text() if label is not None else ""


def test_every_labelled_setting_is_a_form_field_with_its_label_tooltip_and_range(qtbot, make_window):
    w = make_window()
    c = w.controls
    values, err = c.values()
    assert err == ""
    labelled = [s for s in SETTINGS if s.label and s.group != LAUNCH_GROUP]  # those: the Run on N GPUs dialog
    assert {s.name for s in LIVE_SETTINGS} <= {s.name for s in labelled}  # every live setting is in the form
    for s in labelled:
        widget = c.setting_widgets[s.name]
        assert form_label(widget) == s.label, s.name
        assert widget.toolTip(), s.name
        assert s.name in values, s.name  # Start sends it
        if s.name in RANGES and hasattr(widget, "range"):
            assert widget.range is RANGES[s.name]  # the engine's bounds
    assert list(c.fields) == [s.name for s in LIVE_SETTINGS]  # the live group: the live settings, in order
    for s in LIVE_SETTINGS:
        assert c.fields[s.name] is c.setting_widgets[s.name] is getattr(c, s.name)


def test_a_live_setting_edited_in_the_form_is_sent_as_its_command(qtbot, make_window):
    w = make_window()
    c = w.controls
    c.set_state("training")
    c.pending.set_engine({s.name: s.default for s in LIVE_SETTINGS})
    c.checkpointing.setChecked(True)  # the switch the "what fits" table also sends
    c.accum.setValue(8)
    assert c.edits() == {"accum": 8, "checkpointing": True}


def test_an_old_saved_form_with_warmup_fills_the_two_warmup_fields(qtbot, make_window):
    w = make_window()
    w.controls.set_values({"lr_schedule": "cosine", "warmup": 0.1})
    v, _ = w.controls.values()
    assert (v["lr_schedule"], v["warmup_fraction"], v["warmup_samples"]) == ("cosine", 0.1, 0)
    w.controls.set_values({"warmup": 256})
    v, _ = w.controls.values()
    assert (v["warmup_fraction"], v["warmup_samples"]) == (0.0, 256)
    assert "warmup 256 samples" in w.controls.schedule.summary()


@pytest.mark.slow
def test_both_warmups_in_the_form_cannot_start(qtbot, make_window):
    w = make_window()
    w.controls.warmup_samples.setText("100")
    w.controls.warmup_fraction.setText("0.1")
    assert not w.start_run() and "give one" in w.last_error[1]


def test_the_app_reads_the_old_flags(tmp_path):
    from app.main import parse_args
    _ns, base = parse_args(["--checkpointing", "on", "--warmup", "0.2"])
    assert base["checkpointing"] is True and (base["warmup_fraction"], base["warmup_samples"]) == (0.2, 0)
    _ns, base = parse_args(["--activation-checkpointing", "off", "--warmup-samples", "64"])
    assert base["checkpointing"] is False and base["warmup_samples"] == 64


def test_an_old_resumed_row_unpauses_like_unpaused():
    for kind in ("unpaused", "resumed"):
        s = RunSession()

        class Source:
            live, run_dir, step_get = True, None, staticmethod(getattr)
            items: list = []

            def poll(self, force=False):
                out, self.items = self.items, []
                return out

            def send(self, command):
                pass

            def close(self):
                pass

        src = Source()
        s.begin(src, engine=True)
        src.items = [Paused(2, 1)]
        s.poll()
        assert s.state is RunState.PAUSED
        src.items = [Note(kind, 2, 2, kind)]  # as run.db holds it
        s.poll()
        assert s.state is RunState.TRAINING, kind


def test_a_receipt_with_the_old_field_name_matches_the_change_sent():
    p = PendingChanges()
    p.set_engine({"accum": 2})
    p.sent("accum", 8, epoch=1)
    old = CommandReceived(3, 1, command="set_accum", payload={"steps": 8, "at": "epoch"}, applies="epoch",
                          target_epoch=2)
    assert p.received(old.command, old.payload, old.applies, old.target_epoch, paused=False) == ["accum"]
    assert p.get("accum").status is ChangeStatus.RECEIVED
    p.sent("accum", 4, epoch=1)
    new = SetAccum(4)
    assert p.received(new.kind, {"accum": 4, "at": "epoch"}, "epoch", 2, paused=False) == ["accum"]
