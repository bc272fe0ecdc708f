"""The inlier EMA (app/model/inlier_ema.py) fed in pieces equals it computed at once, and holds
across a spike as the plain EMA holds across a non-finite step."""
from __future__ import annotations

import numpy as np

from app.model.metrics import INLIER_EMA, MetricsBuffer


def _feed(buf: MetricsBuffer, loss: np.ndarray, first_step: int) -> None:
    n = len(loss)
    buf.extend_columns({"step": np.arange(first_step, first_step + n, dtype=np.float64), "loss": loss})


def test_pieces_equal_the_whole_and_spikes_are_held():
    rng = np.random.default_rng(0)
    loss = 2.0 / (1 + np.arange(3000) / 300) + 0.05 * rng.standard_normal(3000)
    loss[1000:1004] = 1e30
    loss[1004] = np.nan
    whole = MetricsBuffer()
    _feed(whole, loss, 1)
    at_once = whole.view(INLIER_EMA).copy()
    pieces = MetricsBuffer()
    _feed(pieces, loss[:900], 1)
    pieces.view(INLIER_EMA)  # asked for early: kept up to date from here on
    for a in range(900, 3000, 137):
        _feed(pieces, loss[a:a + 137], a + 1)
    assert np.allclose(pieces.view(INLIER_EMA), at_once, rtol=1e-6)
    assert np.nanmax(at_once[1000:]) < 2.5  # the spike is held, not folded in
    assert np.allclose(at_once[1000:1005], at_once[999])
    assert whole.view("loss_ema")[1000:].max() > 1e20  # negative control: the plain EMA takes it
    pieces.truncate_after(1500)
    assert np.allclose(pieces.view(INLIER_EMA), at_once[:1500], rtol=1e-3)


def test_a_long_run_is_not_computed_again_on_every_batch(monkeypatch):
    """The fences move a little with every batch of a live run; a value near them then changes
    sides and the whole column was computed again (474 times in 1000 batches here: at a million
    steps 0.2-0.56 s a frame). The fences in use change only when they move by a quarter of
    their span. Spikes are still held."""
    import app.model.inlier_ema as ie
    rng = np.random.default_rng(1)
    n = 200_000
    loss = 2.0 / (1 + np.arange(n) / 3000) + 0.05 * rng.standard_normal(n)
    spikes = rng.integers(1000, n, 30)
    loss[spikes] = 50.0
    again = []
    rebuild = ie.InlierEma.rebuild
    monkeypatch.setattr(ie.InlierEma, "rebuild", lambda self, out, y: again.append(rebuild(self, out, y)) or again[-1])
    buf = MetricsBuffer()
    _feed(buf, loss[:1000], 1)
    buf.view(INLIER_EMA)
    for a in range(1000, n, 200):
        _feed(buf, loss[a:a + 200], a + 1)
        buf.view(INLIER_EMA)
    assert len(again) >= 995 and sum(again) <= 10, sum(again)
    ema = buf.view(INLIER_EMA)
    assert np.nanmax(ema[1000:]) < 2.5  # no spike of 50 folded in
    assert np.allclose(ema[spikes], ema[spikes - 1])  # held across each
