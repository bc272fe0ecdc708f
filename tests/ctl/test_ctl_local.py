"""headroom-ctl on a run folder of this machine, against a real engine run: status, set applied
at the next step and refused with the reason, stop with a checkpoint, no live run, follow equal
to run.db row for row, a follow cut and restarted losing and repeating nothing, bad input.

One engine run serves the module (starting one costs seconds): the tests run in file order,
and the ones after `test_stop...` see the run ended.
"""
from __future__ import annotations

import os
import signal
import subprocess

import pytest
from ctlkit import Stream, ctl, db_events, db_rows, followed_live_run, one_error_line, records, replay, written_run

from engine.ctl.output import render
from testkit import ROOT, wait_until

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    with followed_live_run(str(tmp_path_factory.mktemp("ctl") / "run"), Stream.follow) as run:
        yield run


def test_status_of_a_live_run_as_json(live):
    r = ctl("status", live.run_dir, "--json")
    assert r.returncode == 0, r.stderr
    hello, status = records(r.stdout)
    assert hello["kind"] == "hello" and hello["protocol"] == 1
    assert status["kind"] == "status" and status["live"] and status["state"] == "running"
    assert status["writer"]["pid"] == live.proc.pid
    assert status["step"] >= 3 and status["settings"]["accum"] == 2 and status["settings"]["micro_batch"] == 8
    assert isinstance(status["loss"], float) and status["task"] == "mlp"
    r = ctl("status", live.run_dir)  # for a person
    assert r.returncode == 0 and "running" in r.stdout and "accum 2" in r.stdout


def test_set_is_applied_at_the_next_step_and_said_so(live):
    r = ctl("set", live.run_dir, "lr=3e-4", "--at", "step", "--wait", "--json", timeout=180)
    assert r.returncode == 0, r.stderr
    answers = [x for x in records(r.stdout) if x["kind"] == "command"]
    assert [a["status"] for a in answers] == ["pending", "applied"]
    start = answers[-1]["from_step"]
    wait_until(lambda: start in {m["step"] for m in db_rows(live.run_dir)}, what="the first step with the new lr")
    rows = {m["step"]: m for m in db_rows(live.run_dir)}
    assert rows[start]["lr"] == pytest.approx(3e-4) and rows[start - 1]["lr"] == pytest.approx(1e-3)


def test_a_refused_change_exits_3_with_the_engines_reason(live):
    r = ctl("set", live.run_dir, "precision=bf16", "--at", "step", "--wait", timeout=180)
    assert r.returncode == 3, r.stdout + r.stderr
    assert "refused: precision changes when the run restarts" in r.stdout


def test_a_follow_cut_and_restarted_from_its_cursor_loses_and_repeats_nothing(live):
    first = Stream.follow(live.run_dir)
    wait_until(lambda: len(first.rows()) >= 5, timeout=120, what="rows of the first follow")
    first.proc.send_signal(signal.SIGKILL)  # the reader goes away mid-stream
    first.finish()
    step, event = first.cursor()
    args = ["--from-step", step] + (["--after-event", event] if event is not None else [])
    second = Stream.follow(live.run_dir, *args)
    wait_until(lambda: len(second.rows()) >= 3, timeout=120, what="rows of the second follow")
    live.restarted = (first, second)  # compared with run.db once the run has ended


def test_stop_writes_a_checkpoint_and_the_run_ends(live):
    r = ctl("stop", live.run_dir, "--wait", "--json", timeout=180)
    assert r.returncode == 0, r.stderr
    answer = [x for x in records(r.stdout) if x["kind"] == "command"][-1]
    assert live.proc.wait(timeout=60) == 0
    # What happened, at the run's last step: not "applied from step" the step after it (issue 28).
    last = max(m["step"] for m in db_rows(live.run_dir))
    assert answer["status"] == "applied" and answer["applied_step"] == last and answer["from_step"] is None
    assert render(answer) == f"stop: stopped at step {last}"
    assert os.path.exists(os.path.join(live.run_dir, "checkpoints", "last.pt"))
    status = records(ctl("status", live.run_dir, "--json").stdout)[-1]
    assert not status["live"] and status["state"] == "finished" and status["reason"] == "stopped"
    assert status["checkpoint"]


def test_a_set_with_no_live_run_exits_4(live):
    r = ctl("set", live.run_dir, "lr=0.01", "--wait")
    assert r.returncode == 4
    assert "no live run" in one_error_line(r)


def test_follow_from_the_first_step_to_the_end_equals_run_db(live):
    assert live.whole.finish() == 0, live.whole.stderr
    rows, events = replay(live.whole.records)
    assert live.whole.records[0]["kind"] == "hello" and live.whole.records[-1]["kind"] == "end"
    assert live.whole.records[-1]["status"] == "finished"
    on_disk = db_rows(live.run_dir)
    assert len(on_disk) > 5 and rows == on_disk  # row for row, every column
    assert events == db_events(live.run_dir)
    kinds = [e["kind"] for e in events]
    assert "settings_applied" in kinds and "command_refused" in kinds and kinds[-1] == "run_finished"


def test_the_restarted_follow_together_equals_run_db(live):
    first, second = live.restarted
    assert second.finish() == 0, second.stderr
    rows = first.rows() + second.rows()
    events = replay(first.records)[1] + replay(second.records)[1]
    assert rows == db_rows(live.run_dir)
    assert events == db_events(live.run_dir)


def test_follow_of_a_finished_run_from_a_step_ends_at_once(live):
    r = ctl("follow", live.run_dir, "--json", "--from-step", "4")
    assert r.returncode == 0, r.stderr
    rows, events = replay(records(r.stdout))
    assert rows == [m for m in db_rows(live.run_dir) if m["step"] >= 4]
    assert events == [e for e in db_events(live.run_dir) if e["step"] >= 4]
    r = ctl("follow", live.run_dir)  # for a person
    assert r.returncode == 0 and "run ended: finished" in r.stdout.splitlines()[-1]


def test_runs_lists_the_folder_with_its_state(live):
    r = ctl("runs", os.path.dirname(live.run_dir), "--json")
    assert r.returncode == 0, r.stderr
    (run,) = [x for x in records(r.stdout) if x["kind"] == "run"]
    assert run["path"] == live.run_dir and run["status"] == "finished" and not run["live"]


@pytest.mark.parametrize("argv,words", [
    (["set", "{run}", "accum=0"], "accum"),
    (["set", "{run}", "accum=many"], "not an integer"),
    (["set", "{run}", "warmup=3"], "not a setting a run changes"),
    (["set", "{run}", "lr"], "KEY=VALUE"),
    (["set", "{run}", "lr=1", "--at", "never"], "invalid choice"),
    (["status", "{tmp}/nothing-here"], "no such run folder"),
    (["status", "{tmp}"], "not a run folder"),
    (["follow", "{run}", "--from-step", "-1"], "0 or more"),
    (["launch", "{run}"], "invalid choice"),
    (["status", "--", "-oProxyCommand=x:/run"], "not a host name"),  # never an option of ssh
    (["status", "bad host:/run"], "not a host name"),
])
def test_bad_input_is_one_error_line_and_exit_2_with_nothing_sent(tmp_path, argv, words):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    from engine.store import RunStore
    store = RunStore(str(run_dir))
    store.set_info(status="running", pid=os.getpid())  # a live-looking run: nothing may reach it
    store.close()
    r = ctl(*[a.format(run=run_dir, tmp=tmp_path) for a in argv])
    assert r.returncode == 2, r.stdout + r.stderr
    assert words in one_error_line(r)
    assert db_commands(str(run_dir)) == []


def db_commands(run_dir: str) -> list:
    from engine.store import RunReader
    reader = RunReader(run_dir)
    try:
        return reader.commands()
    finally:
        reader.close()


def test_headroom_ctl_runs_without_torch(tmp_path):
    """The laptop needs no torch: with torch and numpy made unimportable, status and follow of a
    run folder work."""
    fake = tmp_path / "no-torch"
    for name in ("torch", "numpy"):
        (fake / name).mkdir(parents=True)
        (fake / name / "__init__.py").write_text(f"raise ImportError('{name} is not on this laptop')\n")
    run_dir = written_run(str(tmp_path / "run"), 3)
    env = {"PYTHONPATH": f"{fake}{os.pathsep}{ROOT}"}
    r = ctl("follow", run_dir, "--json", env=env)
    assert r.returncode == 0, r.stderr
    assert [m["step"] for m in replay(records(r.stdout))[0]] == [1, 2, 3]
    assert ctl("status", run_dir, env=env).returncode == 0
    r = subprocess.run([os.sys.executable, "-c", "import torch"], env=dict(os.environ, **env), capture_output=True)
    assert r.returncode != 0  # the negative control: torch really is not importable there


def test_start_refuses_bad_input_before_anything_is_made(tmp_path):
    """headroom-ctl start checks the engine's flags and the run folder first (no engine starts)."""
    old = written_run(str(tmp_path / "old"), 2)
    for args, said in (([tmp_path / "a", "--", "--task", "mlp", "--run-dir", tmp_path / "b"], "given twice"),
                       ([tmp_path / "a", "--task", "mlp"], "after --"),
                       ([tmp_path / "a", "--", "--task", "mlp", "--epochs", "0"], "--epochs"),
                       ([old, "--", "--task", "mlp"], "already holds a run")):
        r = ctl("start", *args)
        assert r.returncode == 2 and said in one_error_line(r), r.stderr
    assert sorted(os.listdir(tmp_path)) == ["old"]
