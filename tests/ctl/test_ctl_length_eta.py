"""headroom-ctl status's ETA follows a run whose length changed while it trains (issue 32):
the steps left are counted to the max steps (or epochs) the engine applied last, not to the
config's. Qt-free: a run folder written by the store (test_ctl_eta's continued run)."""
from __future__ import annotations

import pytest
from test_ctl_eta import PACE, PLANNED, continued_run

from engine.ctl.local import ETA_ROWS, _eta
from engine.declarations.events import SettingsApplied
from engine.store import RunReader, RunStore, summary


def eta_now(run_dir: str, since: float):
    """As `headroom-ctl status` counts it: the live settings (the config's, then each change applied)."""
    reader = RunReader(run_dir)
    try:
        info, tail = reader.info(), reader.last_metrics(ETA_ROWS)
        settings = summary.live_settings(info, reader.events(kinds=("settings_applied",)), tail[-1])
        return _eta(info, reader, tail, since, settings)
    finally:
        reader.close()


def test_the_eta_counts_to_the_length_the_run_has_now(tmp_path):
    run_dir, resumed = continued_run(tmp_path / "run", 30)
    assert eta_now(run_dir, resumed) == pytest.approx((PLANNED - 30) * PACE)  # before: the config's 1000 steps
    store = RunStore(run_dir)
    store.record(SettingsApplied(30, 1, changes=(("max_steps", PLANNED, 2 * PLANNED),), at="step", from_step=31))
    store.close()
    assert eta_now(run_dir, resumed) == pytest.approx((2 * PLANNED - 30) * PACE)
