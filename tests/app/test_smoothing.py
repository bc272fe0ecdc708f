"""The plots' one smoothing (app/model/smoothing.py): TensorBoard's debiased EMA, fed in pieces as
steps arrive, and the metrics buffer's smoothed columns following the user's weight."""
from __future__ import annotations

import math

import numpy as np
import pytest

from app.model.metrics import INLIER_EMA, MetricsBuffer
from app.model.smoothing import DEFAULT_WEIGHT, MAX_WEIGHT, Ema, clamp_weight, debiased_ema


def tensorboard(values, weight: float) -> list[float]:
    """TensorBoard's scalar smoothing, as its dashboard computes it, with non-finite values
    carrying the last smoothed value (NaN before the first finite one)."""
    last, n, out = 0.0, 0, []
    for y in values:
        if math.isfinite(y):
            last = last * weight + (1 - weight) * y
            n += 1
        out.append(last / (1 - weight ** n) if n else math.nan)
    return out


@pytest.mark.parametrize("weight", [0.0, 0.6, 0.9, 0.99, MAX_WEIGHT])
def test_the_ema_is_tensorboards_in_any_pieces(weight):
    rng = np.random.default_rng(3)
    y = 2.0 + rng.standard_normal(3000)
    y[[0, 5, 700, 701, 2999]] = [np.nan, np.inf, np.nan, -np.inf, np.nan]
    want = np.asarray(tensorboard(y, weight))
    assert np.allclose(debiased_ema(y, weight), want, equal_nan=True, rtol=1e-9)
    ema, got = Ema(weight), []
    for a in range(0, 3000, 131):  # as steps arrive
        got.append(ema.run(y[a:a + 131]))
    assert np.allclose(np.concatenate(got), want, equal_nan=True, rtol=1e-9)


def test_a_weight_is_clamped_to_the_sliders_range():
    assert clamp_weight(0.95) == 0.95 and clamp_weight(2) == MAX_WEIGHT and clamp_weight(-1) == 0.0
    assert clamp_weight("x") == clamp_weight(None) == clamp_weight(float("nan")) == DEFAULT_WEIGHT
    assert clamp_weight(0.12345) == 0.123


def _feed(buf: MetricsBuffer, loss: np.ndarray, first: int = 1) -> None:
    n = len(loss)
    buf.extend_columns({"step": np.arange(first, first + n, dtype=np.float64), "loss": loss,
                        "grad_norm": loss * 2, "throughput": loss * 10})


def test_the_buffers_smoothed_columns_follow_the_weight_and_stay_one_smoothing():
    rng = np.random.default_rng(0)
    loss = 1.0 + 0.3 * rng.standard_normal(2000)
    loss[1200] = 1e30  # an outlier for the inlier EMA
    buf = MetricsBuffer()
    _feed(buf, loss[:1500])
    buf.view(INLIER_EMA)  # as "Ignore outliers" asks for it
    buf.view("grad_norm_ema")  # as a compared run's gradient norm does
    assert buf.set_smoothing(0.6) and not buf.set_smoothing(0.6)
    _feed(buf, loss[1500:], 1501)  # later steps go on with the new weight
    assert np.allclose(buf.view("loss_ema"), tensorboard(loss, 0.6), rtol=1e-6)
    assert np.allclose(buf.view("grad_norm_ema"), tensorboard(loss * 2, 0.6), rtol=1e-6)
    assert np.allclose(buf.view("throughput_ema"), tensorboard(loss * 10, 0.6), rtol=1e-6)
    held = np.where(np.arange(2000) == 1200, np.nan, loss)
    assert np.allclose(buf.view(INLIER_EMA), tensorboard(held, 0.6), rtol=1e-5)
    buf.truncate_after(1000)  # a resume going back keeps the weight
    assert buf.smoothing == 0.6 and np.allclose(buf.view("loss_ema"), tensorboard(loss[:1000], 0.6), rtol=1e-6)
    assert buf.set_smoothing(0.0)
    assert np.allclose(buf.view("loss_ema"), loss[:1000])  # weight 0: the series itself
