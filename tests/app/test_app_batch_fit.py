"""What micro-batch fits: the micro-batch finder (a start-time option, its choice shown) and the
"what fits" readout fed by the engine's memory forecast."""
from __future__ import annotations

import pytest


# -- the micro-batch finder ------------------------------------------------------------------
@pytest.mark.slow
def test_find_micro_batch_runs_the_finder_and_shows_what_it_chose(qtbot, make_window):
    from app_helpers import run_to_end, start
    w = make_window()
    w.controls.find_micro_batch.setChecked(True)
    values, _ = w.controls.values()
    assert values["find_micro_batch"] is True and values["effective_batch"] == 16 * 4
    start(w, micro_batch=64, accum=2, max_steps=3, find_micro_batch=True)  # effective batch 128
    assert not w.controls.find_micro_batch.isEnabled()  # a start-time option
    out = run_to_end(qtbot, w)
    assert out["status"] == "finished", out
    cfg = w.model.config
    assert cfg["find_micro_batch"] is True and cfg["effective_batch"] == 128
    found = [n for n in w.model.notes if n.kind == "micro_batch_found"]
    assert len(found) == 1
    mb, acc, probes = found[0].data["micro_batch"], found[0].data["accum"], found[0].data["probes"]
    assert mb * acc >= 128 and probes >= 1
    assert (w.controls.micro_batch.value(), w.controls.accum.value()) == (mb, acc)
    text = w.controls.finder_status.text()
    assert w.controls.finder_status.isVisible()
    assert f"micro-batch {mb}" in text and f"accumulation {acc}" in text and f"{probes} probes" in text
    rows = [r for r in w.alerts.rows() if r[0] == "micro_batch_found"]
    assert rows and f"{probes} probes" in rows[0][2]
    assert w.controls.fits.text() == "fits: no GPU"  # a CPU run


@pytest.mark.slow
def test_find_micro_batch_unticked_sends_no_finder_flags(make_window):
    w = make_window()
    values, _ = w.controls.values()
    assert values["find_micro_batch"] is False and "effective_batch" not in values


# -- "what fits" -----------------------------------------------------------------------------
@pytest.mark.slow
def test_memory_forecast_event_shows_what_fits(qtbot, make_window):
    from app.session.sources import LiveSource
    from engine.declarations.events import MemoryForecast, RunStarted
    w = make_window()
    assert w.controls.fits.text() == "fits: shown during a GPU run"
    # the path the engine's EventBuffer drains into
    w.driver.publish(w.session.begin(LiveSource(w.runner.buffer, lambda _c: None)))
    w.runner.buffer.put(RunStarted(0, 1, run_dir="", task="mlp", device="cpu", device_name="x86_64",
                                   torch_version="", world_size=1, resumed=False, config={}))
    w.tick()
    assert w.controls.fits.text() == "fits: no GPU"
    w.runner.buffer.put(RunStarted(0, 1, run_dir="", task="mlp", device="cuda:0", device_name="H100",
                                   torch_version="", world_size=1, resumed=False, config={}))
    w.tick()
    assert w.controls.fits.text().startswith("fits: measuring")
    w.runner.buffer.put(MemoryForecast(5, 1, micro_batch_max=29, accum_for_effective=3, effective_batch=64,
                                       capacity=16 * 2**30, fixed_bytes=2 * 2**30, per_sample_bytes=410 * 2**20,
                                       precision="bf16"))
    w.tick()
    assert w.controls.fits.text() == "fits: micro-batch up to 29 (\u00d73 for 64) \u00b7 410 MiB/sample in bf16"
    assert "16,384 MiB usable" in w.controls.fits.toolTip()
    assert "memory_forecast" not in w.alerts.kinds()  # a readout, not an alert
