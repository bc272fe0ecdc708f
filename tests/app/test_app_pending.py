"""The pending-changes model, on its own (no Qt, no engine): what each setting's line says as
the engine takes a change in, applies it or refuses it."""
from __future__ import annotations

from app.model.pending import ChangeStatus, PendingChanges

ENGINE = {"micro_batch": 64, "accum": 2, "lr": 1e-3, "clip": 1.0, "lr_scaling": "none"}


def _model() -> PendingChanges:
    p = PendingChanges()
    p.set_engine(ENGINE)
    return p


def test_a_change_goes_sent_received_applied_with_the_engines_words():
    p = _model()
    assert p.sent("accum", 8, epoch=2) == ["accum"]
    assert p.text("accum") == "pending: 8 (sent)" and p.is_pending("accum")
    assert p.received("set_accum", {"steps": 8}, "epoch", 3, paused=False) == ["accum"]
    assert p.text("accum") == "pending: 8 applies at epoch 3"
    assert p.get("accum").style == "pending"
    assert p.applied([("accum", 2, 8)], step=64, epoch=3) == ["accum"]
    assert p.text("accum") == "applied: 8 from epoch 3, after step 64"
    assert not p.is_pending("accum") and p.engine["accum"] == 8 and p.get("accum").style == "applied"


def test_when_it_applies_is_what_the_engine_said():
    p = _model()
    p.sent("lr", 0.002, epoch=1)
    p.received("set_lr", {"lr": 0.002}, "step", None, paused=False)
    assert p.text("lr") == "pending: 0.002 applies at the next step"
    p.sent("clip", 0.5, epoch=1)
    p.received("set_clip", {"norm": 0.5}, "epoch", 2, paused=True)
    assert p.text("clip") == "pending: 0.5 applies at epoch 2 (now: the run is paused)"
    assert p.get("clip").target_epoch == 2  # taken from the engine, not worked out here


def test_an_older_commands_receipt_does_not_confirm_a_newer_value():
    p = _model()
    p.sent("accum", 4, epoch=1)
    p.sent("accum", 8, epoch=1)  # changed again before the engine took the first in
    assert p.received("set_accum", {"steps": 4}, "epoch", 2, paused=False) == []
    assert p.get("accum").status is ChangeStatus.SENT
    assert p.received("set_accum", {"steps": 8}, "epoch", 2, paused=False) == ["accum"]
    assert p.received("set_accum", {"steps": 8, "at": "epoch"}, "epoch", 2, paused=False) == []  # already in


def test_a_refusal_names_the_reason_and_keeps_the_engines_value():
    p = _model()
    p.sent("accum", 8, epoch=1)
    p.received("set_accum", {"steps": 8}, "epoch", 2, paused=False)
    assert p.refused("set_accum", "accumulation is set by --token-budget") == ["accum"]
    assert p.text("accum") == "refused: accumulation is set by --token-budget"
    assert p.get("accum").style == "refused" and p.engine["accum"] == 2
    assert p.refused("row 7", "payload is not JSON") == []  # not a setting: the alerts show it


def test_a_no_op_change_settles_once_its_epoch_is_reached():
    p = _model()
    p.sent("clip", 0.5, epoch=1)
    p.sent("clip", 1.0, epoch=1)  # back to what the engine has: the engine will change nothing
    p.received("set_clip", {"norm": 1.0}, "epoch", 3, paused=False)
    assert p.epoch_reached(2) == [] and p.is_pending("clip")
    assert p.epoch_reached(3) == ["clip"]
    assert p.text("clip") == "unchanged: 1" and p.get("clip").style == "applied"


def test_the_lr_scaling_rule_is_named_and_equal_values_settle_on_apply():
    p = _model()
    p.sent("accum", 4, epoch=1)
    p.sent("micro_batch", 64, epoch=1)  # the same as the engine's
    touched = p.applied([("accum", 2, 4), ("lr", 1e-3, 2e-3)], step=32, epoch=2, by_rule=["lr"])
    assert set(touched) == {"accum", "lr", "micro_batch"}
    assert p.text("lr") == "applied: 0.002 from epoch 2, after step 32 (by the lr scaling rule)"
    assert p.text("accum") == "applied: 4 from epoch 2, after step 32"
    assert p.text("micro_batch") == "unchanged: 64"


def test_the_lr_scaling_rule_is_named_only_where_the_run_says_it_made_the_change():
    """An lr change nobody here sent is another client's (headroom-ctl), or an older run's with no
    word on it: never put down to the rule unless the settings_applied event names it."""
    p = _model()
    assert p.received("set_lr", {"lr": 5e-4}, "step", None, paused=False) == ["lr"]  # headroom-ctl's command
    assert p.text("lr") == "pending: 0.0005 applies at the next step (sent by another client)"
    p.applied([("lr", 1e-3, 5e-4)], step=8, epoch=1)
    assert p.text("lr") == "applied: 0.0005 from epoch 1, after step 8 (sent by another client)"
    p.applied([("lr", 5e-4, 2e-4)], step=9, epoch=1)  # an older run's event: no receipt, no by_rule
    assert p.text("lr") == "applied: 0.0002 from epoch 1, after step 9"


def test_a_change_of_this_windows_is_not_taken_over_by_another_clients_receipt():
    p = _model()
    p.sent("accum", 8, epoch=1)
    p.received("set_accum", {"steps": 8}, "epoch", 2, paused=False)
    assert p.received("set_accum", {"steps": 16}, "step", None, paused=False) == []
    assert p.text("accum") == "pending: 8 applies at epoch 2"


def test_damaged_settings_applied_rows_are_passed_over():
    p = _model()
    assert p.applied([("accum", 2), "lr", None, ("clip", 1.0, 2.0), (3, 1, 2)], step=5, epoch=1) == ["clip"]
    assert p.applied("accum", step=5, epoch=1, by_rule="lr") == []  # not a list of changes at all
    assert p.engine["clip"] == 2.0 and p.engine["accum"] == 2


def test_set_engine_returns_only_news():
    p = _model()
    assert p.set_engine(dict(ENGINE)) == {}
    assert p.set_engine({"accum": 4, "lr": 1e-3 * (1 + 1e-12), "clip": None}) == {"accum": 4}


def test_edits_are_what_differs_from_the_engine_and_is_not_on_its_way():
    p = _model()
    form = dict(ENGINE, accum=4, lr=0.001 * (1 + 1e-12))  # lr equal within the form's rounding
    assert p.edits(form) == {"accum": 4}
    p.sent("accum", 4, epoch=1)
    assert p.edits(form) == {}
    assert p.edits(dict(form, accum=2)) == {"accum": 2}  # back to the engine's value cancels the change
    assert PendingChanges().edits(form) == {}  # nothing known of the engine yet: nothing to send


def test_the_run_ending_first_drops_what_was_on_its_way():
    p = _model()
    p.sent("accum", 8, epoch=1)
    p.sent("lr", 0.01, epoch=1)
    p.applied([("lr", 1e-3, 0.01)], step=10, epoch=2)
    assert p.run_ended() == ["accum"]
    assert p.text("accum") == "not applied: the run ended first (8)" and p.get("accum").style == "refused"
    assert p.text("lr").startswith("applied")
    assert p.clear() == ["accum", "lr"] and p.text("accum") == "" and p.engine == {}


def test_a_change_an_agent_sent_says_so_and_another_clients_does_not():
    """headroom-ctl mcp's command rows name their sender ("sent_by": "agent"): the Controls panel
    says "sent by an agent" from receipt to applied; a row without it stays another client's."""
    p = _model()
    p.received("set_lr", {"lr": 5e-4, "sent_by": "agent"}, "step", None, paused=False)
    assert p.text("lr") == "pending: 0.0005 applies at the next step (sent by an agent)"
    p.applied([("lr", 1e-3, 5e-4)], step=8, epoch=1)
    assert p.text("lr") == "applied: 0.0005 from epoch 1, after step 8 (sent by an agent)"
    p.received("set_clip", {"clip": 2.0, "sent_by": ["agent"]}, "step", None, paused=False)  # any shape stored
    assert p.text("clip").endswith("(sent by another client)")
