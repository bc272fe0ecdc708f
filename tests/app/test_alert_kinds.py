"""Every event kind the engine or an integration writes is shown by the alerts panel or listed as
shown elsewhere (app/model/notes.py NOT_SHOWN); a new kind in neither list fails here. A run
folder written through engine.integrations says where its checkpoints are, not "damaged"."""
from __future__ import annotations

import dataclasses
import gc
from typing import ClassVar

import engine.declarations.events as ev
import engine.integrations.loop  # noqa: F401 - the integrations' own kinds (loss_weighting, step_skipped)
from app.model.notes import ALERT_KINDS, NOT_SHOWN
from app.ui.alerts import SEVERITY, TITLES


def written_kinds() -> set[str]:
    """Every Event subclass's kind (the engine's events.py and the integrations')."""
    kinds, todo = set(), [ev.Event]
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if cls is not ev.Event:
            kinds.add(cls.kind)
    return kinds


def unplaced(kinds: set[str]) -> list[str]:
    return sorted(k for k in kinds if (k in ALERT_KINDS) == (k in NOT_SHOWN))  # in neither, or in both


def test_every_kind_is_shown_or_listed_as_shown_elsewhere():
    kinds = written_kinds()
    assert {"loss_weighting", "step_skipped", "nonfinite", "store_problem", "settings_applied"} <= kinds
    assert unplaced(kinds) == []
    assert {"loss_weighting", "step_skipped"} <= set(ALERT_KINDS)
    assert all(k in TITLES and k in SEVERITY for k in ALERT_KINDS)  # each shown kind has a title and weight
    assert set(NOT_SHOWN) <= kinds  # nothing listed that no one writes


def test_a_new_kind_in_neither_list_fails():
    @dataclasses.dataclass(frozen=True)
    class BrandNew(ev.Event):
        kind: ClassVar[str] = "brand_new_kind"

    try:
        assert unplaced(written_kinds()) == ["brand_new_kind"]  # the negative control: the check can fail
    finally:
        del BrandNew
        gc.collect()  # Event.__subclasses__ holds it weakly: gone for the tests after this one
    assert "brand_new_kind" not in written_kinds()


def test_a_plain_loop_run_is_not_called_damaged(tmp_path):
    import torch

    from app.session.sources import FolderSource
    from engine.integrations.loop import headroom_run

    with headroom_run(str(tmp_path / "run")) as run:
        run.log_step(loss=torch.tensor(1.0), accum=1, micro_batch=4)
        run.checkpoint_saved(str(tmp_path / "mine" / "ckpt-1.pt"))
    src = FolderSource(str(tmp_path / "run"))
    [note] = src.problems()
    src.close()
    assert note.kind == "framework_checkpoints" and note.is_alert
    assert "Your training loop keeps" in note.message and str(tmp_path / "mine" / "ckpt-1.pt") in note.message
