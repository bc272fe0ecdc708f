"""An ETA that holds still from the first steps: none until the pace is known (MIN_PACED steps past
a segment's warm-up), then the median pace of the last steps, rows that reached run.db together
sharing the time between the batches. Early ETAs swung from 0:48 to 7:35:13: the first step's
warm-up (40 s of allocation and compilation here) taken for the pace, and rows written a second
at a time taken for a second a step each.

The steps: the first takes 40 s, then 0.2 s each, give or take 10%; a reader of the run folder
sees them written a batch a second (five rows with one time). 1,000 steps are planned."""
from __future__ import annotations

import math
from typing import Optional

import numpy as np
import pytest

from app.model.epoch_progress import MIN_PACED, WARMUP_STEPS, ProgressTracker, seconds_per_window
from app.model.notes import Note
from app.model.runmodel import RunModel
from app.model.state import RunState

PLANNED, PACE, T0 = 1000, 0.2, 1_000_000.0


def step_times(n: int) -> np.ndarray:
    return np.r_[40.0, PACE * (1 + 0.1 * np.sin(np.arange(1, n)))]


def rows(step_time: np.ndarray, first: int = 1, t0: float = T0) -> list[dict]:
    done = t0 + np.cumsum(step_time)
    written = np.ceil(done)  # committed once a second: the rows of that second share its time
    return [{"step": first + i, "epoch": 1, "loss": 1.0, "grad_norm": 1.0, "lr": 1e-3, "accum": 1, "clip": 0.0,
             "micro_batch": 10, "samples": 10, "tokens": 10, "step_time": float(st), "nonfinite": 0,
             "time": float(w)} for i, (st, w) in enumerate(zip(step_time, written))]


def started_model(t0: float = T0) -> RunModel:
    m = RunModel()
    m.ingest([Note("run_started", 0, 1, "", {"config": {"epochs": 1, "max_steps": PLANNED, "micro_batch": 10,
                                                         "accum": 1}}, t0),
              Note("lr_planned", 0, 1, "", {"total_samples": PLANNED * 10}, t0)])
    return m


def batches(steps: list[dict]) -> list[list[dict]]:
    """The rows as a reader of run.db gets them: those written together (one time) at once."""
    out: list[list[dict]] = []
    for r in steps:
        if out and out[-1][-1]["time"] == r["time"]:
            out[-1].append(r)
        else:
            out.append([r])
    return out


def etas(model: RunModel, steps: list[dict]) -> list[tuple[int, Optional[float]]]:
    """(the last step, the run's ETA) as each batch of rows comes (as the status bar asks)."""
    tracker, out = ProgressTracker(), []
    for batch in batches(steps):
        model.ingest(batch, dict.get)
        prog = tracker.progress(model)
        out.append((batch[-1]["step"], prog.run_eta if prog is not None else None))
    return out


def check(seen: list[tuple[int, Optional[float]]], first_step: int = 1) -> None:
    """None until MIN_PACED steps past the warm-up, then near the truth, without jumps."""
    known = first_step - 1 + WARMUP_STEPS + MIN_PACED
    assert all(eta is None for step, eta in seen if step < known), seen  # was an ETA from the 40 s step on
    later = [(step, eta) for step, eta in seen if step >= known]
    assert later and all(eta is not None for _s, eta in later), seen
    for step, eta in later:
        truth = (PLANNED - step) * PACE
        assert abs(eta - truth) <= 0.1 * truth, (step, eta, truth)  # was 5x: a second a step
    ratios = [b / a for (_s, a), (_t, b) in zip(later, later[1:])]
    assert max(ratios) < 1.02 and min(ratios) > 0.95  # no jumps: a batch less to go, about the same pace


def test_no_eta_until_the_pace_is_known_then_close_to_the_truth_and_steady():
    check(etas(started_model(), rows(step_times(120))))


def test_a_continued_run_paces_its_new_segment_past_its_warm_up():
    m = started_model()
    m.ingest(rows(step_times(60)), dict.get)
    resumed = T0 + 3600.0  # continued an hour later: a new engine, a new warm-up
    m.ingest([Note("run_started", 60, 1, "", dict(m.info, resumed=True), resumed)])
    check(etas(m, rows(step_times(60), first=61, t0=resumed)), first_step=61)
    assert seconds_per_window(m, resumed) == pytest.approx(PACE, rel=0.1)


@pytest.mark.slow
def test_the_status_bar_says_no_eta_until_it_holds(qtbot, make_window):
    w = make_window()
    m = started_model()
    said = []
    for batch in batches(rows(step_times(40))):
        m.ingest(batch, dict.get)
        w.status.update_from(m, RunState.TRAINING, "Training")
        said.append((batch[-1]["step"], w.status.eta.text()))
    known = WARMUP_STEPS + MIN_PACED
    assert all(text == "ETA after the first steps" for step, text in said if step < known), said
    for step, text in said[-4:]:
        minutes, seconds = text.removeprefix("ETA ").split(":")
        left = int(minutes) * 60 + int(seconds)
        assert math.isclose(left, (PLANNED - step) * PACE, rel_tol=0.15), (step, text)
