"""`--resume DIR` with new setting flags applies them (at the next epoch boundary)."""
from __future__ import annotations

import pytest

from engine.cli import main
from engine.store import RunReader


def test_resume_with_new_lr_and_accum_applies_them(tmp_path, capsys):
    run_dir = str(tmp_path / "run")
    assert main(["--task", "mlp", "--epochs", "1", "--micro-batch", "32", "--accum", "4", "--run-dir", run_dir]) == 0
    assert main(["--resume", run_dir, "--epochs", "2", "--lr", "0.0005", "--accum", "2"]) == 0
    capsys.readouterr()
    reader = RunReader(run_dir)
    applied = reader.events(kinds={"settings_applied"})
    assert len(applied) == 1 and applied[0]["step"] == 32
    changes = {c[0]: (c[1], c[2]) for c in applied[0]["data"]["changes"]}
    assert changes == {"accum": (4, 2), "lr": (0.001, 0.0005)}
    rows = reader.metrics()
    assert {(r["accum"], r["lr"]) for r in rows if r["epoch"] == 1} == {(4, 0.001)}
    assert {(r["accum"], r["lr"]) for r in rows if r["epoch"] == 2} == {(2, 0.0005)}


@pytest.mark.slow
def test_resume_without_flags_keeps_the_runs_settings(tmp_path, capsys):
    run_dir = str(tmp_path / "run")
    assert main(["--task", "mlp", "--epochs", "1", "--lr", "0.002", "--run-dir", run_dir]) == 0
    assert main(["--resume", run_dir, "--epochs", "2"]) == 0
    capsys.readouterr()
    reader = RunReader(run_dir)
    assert not reader.events(kinds={"settings_applied"})
    assert {r["lr"] for r in reader.metrics()} == {0.002}
