"""The metrics buffer: growable arrays that double, the EMA, resume truncation, the peak pyramid."""
from __future__ import annotations

import math

import numpy as np

from app.model.decimate import FACTOR, PeakPyramid
from app.model.growable import GrowableArray
from app.model.metrics import EMA_BETA, MetricsBuffer


def test_growable_array_doubles_and_keeps_values():
    a = GrowableArray(4)
    a.extend([1, 2, 3])
    first = a.view()
    a.extend([4, 5])
    assert a.capacity == 8 and list(a.view()) == [1, 2, 3, 4, 5]
    assert list(first) == [1, 2, 3]  # an old view stays valid after regrowth
    for i in range(6, 40):
        a.append(i)
    assert a.capacity == 64 and len(a) == 39 and a.view()[-1] == 39


def _rows(steps, loss=None, **kw):
    out = []
    for i, s in enumerate(steps):
        r = {"step": s, "epoch": 1, "loss": (loss[i] if loss is not None else 1.0), "grad_norm": 1.0, "lr": 1e-3,
             "accum": 1, "clip": 1.0, "micro_batch": 1, "samples": 1, "tokens": 1, "clipped": 0, "nonfinite": 0,
             "throughput": 1.0, "step_time": 0.1, "time": 0.0}
        r.update(kw)
        out.append(r)
    return out


def test_ema_skips_non_finite_and_resume_truncates():
    b = MetricsBuffer(2)
    losses = [2.0, 1.0, float("nan"), 0.5]
    b.extend_records(_rows([1, 2, 3, 4], losses, nonfinite=0), dict.get)
    ema, n, want = 0.0, 0, []
    for v in losses:
        if math.isfinite(v):
            ema, n = EMA_BETA * ema + (1 - EMA_BETA) * v, n + 1
        want.append(ema / (1 - EMA_BETA ** n))
    assert np.allclose(b.view("loss_ema"), want)
    # A resumed run logs from step 3 again: steps 3.. are superseded.
    b.extend_records(_rows([3, 4, 5], [0.4, 0.3, 0.2]), dict.get)
    assert list(b.view("step")) == [1, 2, 3, 4, 5]
    assert list(b.view("loss")) == [2.0, 1.0, 0.4, 0.3, 0.2]
    assert b.view("clip_line")[0] == 1.0


def test_pyramid_matches_brute_force_under_random_appends():
    rng = np.random.default_rng(1)
    g = GrowableArray(8)
    p = PeakPyramid(g)
    values = rng.standard_normal(50_000)
    values[[7, 999, 4000]] = np.nan
    i = 0
    while i < len(values):
        m = int(rng.integers(1, 3000))
        g.extend(values[i:i + m])
        i += m
        p.update()
    assert p.levels
    for k, (lo, hi) in enumerate(p.levels):
        b = FACTOR ** (k + 1)
        nb = -(-len(values) // b)
        padded = np.concatenate([values, np.full(nb * b - len(values), np.nan)]).reshape(nb, b)
        assert np.array_equal(lo.view(), np.fmin.reduce(padded, axis=1), equal_nan=True)
        assert np.array_equal(hi.view(), np.fmax.reduce(padded, axis=1), equal_nan=True)
    idx, y = p.decimate(0, len(values), 1000)
    assert len(y) <= 1000
    assert np.nanmax(y) == np.nanmax(values) and np.nanmin(y) == np.nanmin(values)
    idx, y = p.decimate(100, 400, 1000)  # small spans come back raw
    assert np.array_equal(idx, np.arange(100, 400))
