"""`python -m app --fork DIR@CHECKPOINT` trains what `python -m engine --fork` does: the
parent's settings under the flags given (it started from the window's form: another
effective batch, recorded as changes nobody asked for); a field edited in the form before
Start is recorded as a change too."""
from __future__ import annotations

import pytest
from app_helpers import run_to_end

import testkit
from engine.store import RunReader
from engine_in_process import engine
from testkit import isolated_env

pytestmark = pytest.mark.slow  # the app in a subprocess; the engine's runs in this process (engine_in_process)


@pytest.fixture(scope="module")
def parent(tmp_path_factory) -> str:
    base = tmp_path_factory.mktemp("fork")
    path = base / "parent"
    r = engine("--task", "mlp", "--epochs", "1", "--micro-batch", "64", "--accum", "3", "--lr", "0.002",
               "--max-steps", "4", "--device", "cpu", "--run-dir", str(path), env=isolated_env(base))
    assert r.returncode == 0, r.stderr
    return str(path)


def _child(path) -> tuple[dict, dict]:
    reader = RunReader(str(path))
    info, first = reader.info(), reader.metrics()[0]
    reader.close()
    return info, first


def test_the_apps_fork_flag_trains_the_engines_fork(parent, tmp_path):
    app_child, engine_child = tmp_path / "app", tmp_path / "engine"
    r = testkit.run_app("--fork", f"{parent}@last", "--max-steps", "6", "--autostart", "--quit-when-done",
                        "--run-dir", app_child, timeout=240)
    assert r.returncode == 0, r.stderr
    r = engine("--fork", f"{parent}@last", "--max-steps", "6", "--run-dir", engine_child)
    assert r.returncode == 0, r.stderr
    (a_info, a_row), (e_info, e_row) = _child(app_child), _child(engine_child)
    assert a_info["parent"]["changed"] == e_info["parent"]["changed"] == {"max_steps": 6}
    for key in ("task", "micro_batch", "accum", "lr", "epochs"):
        assert a_info["config"][key] == e_info["config"][key], key
    assert (a_row["micro_batch"], a_row["accum"], a_row["lr"]) == (64, 3, 0.002)
    assert a_row["loss"] == e_row["loss"]  # the same fork, bit for bit


def test_a_form_edit_before_start_is_a_recorded_change(parent, tmp_path, qtbot, make_window):
    from app.main import parse_args
    _ns, base = parse_args(["--fork", f"{parent}@last", "--max-steps", "6", "--run-dir", str(tmp_path / "c")])
    w = make_window(base)
    assert w.controls.values()[0]["micro_batch"] == 64  # the form holds the parent's settings
    w.controls.lr.setText("0.004")
    assert w.start_run(), w.last_error
    run_to_end(qtbot, w, 120)
    info, row = _child(tmp_path / "c")
    assert info["parent"]["changed"] == {"max_steps": 6, "lr": 0.004} and row["lr"] == 0.004
