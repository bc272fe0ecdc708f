"""Numbers a run folder stores are input (a damaged or hand-edited run table, a parent record,
an event row): each reader of one gives a number or its default, never an exception. One
reading, app/model/stored.py, for all of them (CI's fuzz found int(inf) raising in one)."""
from __future__ import annotations

import math

import pytest

from app.model import lineage, stored
from app.model.notes import Note
from app.model.title import window_title

ODD = [None, "x", "", float("inf"), float("-inf"), float("nan"), [1], {"a": 1}, 10**400]


@pytest.mark.parametrize("v", ODD)
def test_a_number_or_the_default(v):
    assert stored.whole(v, 7) in (7, 10**400)
    n = stored.number(v, -1.0)
    assert n == -1.0 or (n is not None and math.isfinite(n))
    m = stored.measured(v)
    assert isinstance(m, float)


def test_what_a_number_reads_as():
    assert stored.whole("3") == 3 and stored.whole(3.9) == 3 and stored.whole(True) == 0  # a bool is no number: the default
    assert stored.number("2.5") == 2.5 and stored.number(float("inf"), None) is None
    assert math.isinf(stored.measured(float("inf")))  # a non-finite loss is data
    assert math.isnan(stored.measured(None)) and math.isnan(stored.measured("x"))


@pytest.mark.parametrize("v", ODD)
def test_the_app_reads_any_stored_number(v):
    assert lineage.Parent.from_info({"parent": {"run_dir": "/r", "step": v}}).step in (0, 10**400)
    title = window_title("/runs/a", {"world_size": v})
    assert title.startswith("a - ") and title.endswith(" - Headroom")
    note = Note.from_row({"kind": "epoch_end", "step": v, "epoch": v, "time": v})
    assert isinstance(note.step, int) and isinstance(note.epoch, int) and math.isfinite(note.time)

