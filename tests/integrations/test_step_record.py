"""A step record, passed once: the flags a step's numbers imply are one rule
(engine.declarations.step_flags), a loop's step is one StepRecord (engine.integrations._step_record)
that HeadroomRun passes to its rows as it is, and the rule is not written again anywhere."""
from __future__ import annotations

import inspect
import math
import re

import pytest

from engine.declarations.step_flags import step_flags
from engine.integrations._step_record import StepRecord, loop_step
from engine.integrations.loop import HeadroomRun, IntegrationError, headroom_run
from engine.store import RunReader
from testkit import ROOT


@pytest.mark.parametrize("loss, norm, clip, skipped, clipped, nonfinite", [
    (1.0, 2.0, 1.0, False, True, False),  # above the clip
    (1.0, 0.5, 1.0, False, False, False),
    (1.0, 2.0, 0.0, False, False, False),  # no clip in force
    (1.0, None, 1.0, False, False, False),  # norm not measured
    (1.0, math.inf, 1.0, False, False, True),  # a non-finite norm is not "clipped"
    (math.nan, 0.5, 1.0, False, False, True),
    (1.0, math.inf, 1.0, True, False, False),  # the fp16 scaler's overflow: not a non-finite step
])
def test_the_flags_of_a_step(loss, norm, clip, skipped, clipped, nonfinite):
    assert step_flags(loss, norm, clip, skipped) == (clipped, nonfinite)
    record = StepRecord(step=1, epoch=1, loss=loss, grad_norm=norm, lr=0.1, accum=1, clip=clip, micro_batch=1,
                        samples=1, tokens=1, step_time=0.1, scaler_skipped=skipped)
    assert (record.clipped, record.nonfinite) == (clipped, nonfinite)


def test_what_a_loop_says_wins_over_the_derived_flags_and_defaults_fill_the_rest():
    record = loop_step(2.0, grad_norm=5.0, lr=None, accum=4, micro_batch=None, samples=64, tokens=None, clip=1.0,
                       clipped=False, step_time=None, nonfinite=None, scaler_skipped=False, epoch=None, step=None,
                       framework_loss=None, bad_params=(), nonfinite_action="x", last_step=9, this_epoch=2,
                       world_size=2, elapsed=0.25)
    assert (record.step, record.epoch, record.micro_batch, record.tokens, record.step_time) == (10, 2, 8, 64, 0.25)
    assert record.clipped is False and record.nonfinite is False
    with pytest.raises(IntegrationError, match="accum"):
        loop_step(2.0, grad_norm=None, lr=None, accum=0, micro_batch=None, samples=None, tokens=None, clip=0.0,
                  clipped=None, step_time=None, nonfinite=None, scaler_skipped=False, epoch=None, step=None,
                  framework_loss=None, bad_params=(), nonfinite_action="x", last_step=0, this_epoch=1,
                  world_size=1, elapsed=0.0)


def test_a_record_is_written_as_it_is_and_log_step_writes_the_same_row(tmp_path):
    with headroom_run(str(tmp_path / "r"), device="cpu") as run:
        run.log_step(2.0, grad_norm=3.0, lr=0.1, accum=2, micro_batch=4, clip=1.0, step_time=0.5)
        run.record_step(StepRecord(step=2, epoch=1, loss=2.0, grad_norm=3.0, lr=0.1, accum=2, clip=1.0,
                                   micro_batch=4, samples=8, tokens=8, step_time=0.5))
    reader = RunReader(str(tmp_path / "r"))
    try:
        first, second = reader.metrics()
    finally:
        reader.close()
    assert {k: v for k, v in first.items() if k not in ("step", "time")} == \
        {k: v for k, v in second.items() if k not in ("step", "time")}
    assert first["clipped"] == 1 and first["samples"] == 8


def test_the_step_is_passed_once_and_the_clipped_rule_is_written_once():
    assert list(inspect.signature(HeadroomRun.record_step).parameters) == ["self", "record", "check"]
    rule = re.compile(r"clip\w*\s*>\s*0\s+and")  # the "clipped" rule's first test, however the clip is named
    where = [str(p.relative_to(ROOT)) for p in sorted((ROOT / "engine").rglob("*.py")) if rule.search(p.read_text())]
    assert where == ["engine/declarations/step_flags.py"]
    rows = (ROOT / "engine/integrations/_loop_rows.py").read_text() + \
        (ROOT / "engine/integrations/_loop_steering.py").read_text()
    assert "run._store" not in rows and "run._rows" not in rows and "run._need_store" not in rows
