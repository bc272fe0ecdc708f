"""What a server or a run folder says is input (issue 31, round 4), for headroom-ctl and its
channel: a server's lines are bounded and its text reaches a terminal without the sequences a
terminal acts on; the engine's flags are taken only as spelt in full, and none at all is refused
however they come; a run folder's odd event rows are read, never a traceback."""
from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys

import pytest
from ctlkit import PACED_MLP, LiveRun, ctl, db_rows, one_error_line, records

from engine_in_process import trained
from testkit import ROOT, subprocess_env, wait_until

pytestmark = pytest.mark.slow

HOSTILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hostile_server.py")
# What a terminal acts on: ESC, BEL, CR, backspace, C1 (0x9b is CSI), the bidirectional overrides.
ACTED_ON = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def hostile_env(mode: str, **more: str) -> dict[str, str]:
    return {"HEADROOM_SSH_COMMAND": f"{sys.executable} {HOSTILE}", "HOSTILE": mode, **more}


# -- 1: a server's lines are bounded; its text is printed without what a terminal acts on -------
def test_an_endless_line_from_a_server_is_refused():
    """A 200 MiB line: one error line naming the limit, exit 5 (before: read whole, then 'not a
    headroom-ctl record')."""
    r = ctl("follow", "srv:/run", env=hostile_env("long"))
    assert r.returncode == 5, r.stderr
    assert "longer than 32 MiB" in one_error_line(r)


def test_peak_memory_of_a_refused_endless_line(tmp_path):
    """The same, measured: run headroom-ctl as a child of a small python that reports its peak
    resident size (ru_maxrss of the one child it waited for)."""
    probe = ("import os, resource, subprocess, sys\n"
             "p = subprocess.Popen([sys.executable, '-m', 'engine.ctl', 'follow', 'srv:/run'],"
             " stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
             "_, status, usage = os.wait4(p.pid, 0)\n"
             "print(os.waitstatus_to_exitcode(status), usage.ru_maxrss)\n")
    r = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=subprocess_env(hostile_env("long")),
                       capture_output=True, text=True, timeout=180)
    code, peak_kib = map(int, r.stdout.split())
    assert code == 5
    assert peak_kib < 150 * 1024, f"headroom-ctl peaked at {peak_kib // 1024} MiB reading a 200 MiB line"


def test_a_servers_text_reaches_the_terminal_without_escape_sequences():
    """Event text, a status, a command's note, the end and the error line: printed with nothing a
    terminal would act on (window title, screen clear, OSC 52 clipboard, 8-bit CSI, CR, bidi)."""
    r = ctl("follow", "srv:/run", env=hostile_env("escapes"))
    assert r.returncode == 4, r.stderr
    assert "evil" in r.stdout and "pwned" not in r.stdout  # text is shown as text; a window title is not text
    assert "cm0gLXJmIH4=" not in r.stdout  # an OSC 52 payload goes with its sequence
    assert not ACTED_ON.search(r.stdout.replace("\n", "").replace("\t", "")), repr(r.stdout)
    line = one_error_line(r)
    assert "broke" in line and not ACTED_ON.search(line), repr(line)
    # --json relays the server's records as they came (escaped inside JSON strings, for a program)
    r = ctl("follow", "srv:/run", "--json", env=hostile_env("escapes"))
    assert not ACTED_ON.search(r.stdout.replace("\n", ""))
    assert any(rec["kind"] == "event" and rec["event"]["message"].startswith("\x1b]0;pwned") for rec in records(r.stdout))


# -- 5: the engine's flags as spelt in full; none is refused however they come -----------------
def test_start_takes_no_abbreviation_of_an_engine_flag(tmp_path):
    r = ctl("start", "--json", "--", "--hel")  # argparse printed 144 lines of help into the stream
    assert r.returncode == 2
    recs = records(r.stdout)
    assert [x["kind"] for x in recs] == ["hello", "error"] and "--hel" in recs[1]["message"]
    one_error_line(r)
    run = tmp_path / "a"
    r = ctl("start", run, "--", "--task", "mlp", "--run-d", tmp_path / "b")  # was silently dropped
    assert r.returncode == 2 and "--run-d" in one_error_line(r)
    assert not run.exists() and not (tmp_path / "b").exists()


def test_start_with_no_engine_flags_is_refused_with_or_without_a_folder(tmp_path):
    bare = ctl("start", "--")
    with_dir = ctl("start", tmp_path / "run", "--")  # started the mlp demo, exit 0
    assert bare.returncode == with_dir.returncode == 2
    assert one_error_line(bare) == one_error_line(with_dir)
    assert not (tmp_path / "run").exists()


def test_headroom_ctls_own_flags_are_taken_only_in_full(tmp_path):
    r = ctl("follow", tmp_path, "--from", "3")
    assert r.returncode == 2 and "--from" in one_error_line(r)


# -- 8: odd event rows are read, whatever their shape ---------------------------------------------
@pytest.fixture(scope="module")
def odd_run(tmp_path_factory):
    """A real run of the engine, then event rows of every odd shape added to its run.db."""
    folder = tmp_path_factory.mktemp("odd")
    run = folder / "run"
    trained(folder, "--task", "mlp", "--max-steps", "3", "--micro-batch", "16", "--run-dir", run)
    huge = "1" + "0" * 400  # an int past 64 bits (JSON allows it)
    odd = [("run_started", "[1, 2]", 10**30), ("settings_applied", '"lr"', None),
           ("settings_applied", '{"changes": "lr"}', None), ("settings_applied", '{"changes": [["lr"], 1, 2]}', None),
           ("settings_applied", '{"changes": [[["lr"], 1, 2], [{"a": 1}, 1, 2], ["lr", 1]]}', None),
           ("settings_applied", '{"changes": [["lr", 0.001, ' + huge + '], ["clip", 1, ' + huge + '.5]]}', None),
           ("paused", "null", None), ("resumed", "5", None), ("run_failed", '{"reason": {"a": 1}, "error": [1]}', None),
           ("run_finished", '{"reason": ' + huge + '}', None), ("run_finished", '"done"', None),
           ("rolled_back", '{"to_step": ' + huge + '}', None), ("rolled_back", '{"to_step": "2"}', None)]
    db = sqlite3.connect(run / "run.db")
    with db:
        for kind, data, t in odd:
            db.execute("INSERT INTO events (time, step, epoch, kind, message, data) VALUES (?, ?, ?, ?, ?, ?)",
                       (float(t) if t else 1e300, 3, 0, kind, "odd \x1b]0;t\x07row", data))
        db.execute("INSERT INTO events (time, step, epoch, kind, message, data) VALUES ('x', 'y', NULL, 7, 8, 9)")
    db.close()
    return run


def test_status_reads_event_data_of_any_shape(odd_run):
    for args in ((), ("--json",)):
        r = ctl("status", odd_run, *args)
        assert r.returncode == 0, r.stderr
        assert "Traceback" not in r.stderr
    status = records(ctl("status", odd_run, "--json").stdout)[-1]
    assert status["kind"] == "status" and status["step"] == 3
    assert isinstance(status["reason"], (str, type(None)))


def test_follow_and_runs_read_odd_event_rows(odd_run):
    r = ctl("follow", odd_run)
    assert r.returncode == 0, r.stderr
    assert "odd row" in r.stdout and "\x1b" not in r.stdout
    r = ctl("runs", odd_run.parent)
    assert r.returncode == 0, r.stderr


def test_the_app_and_headroom_ctl_read_stored_values_with_one_reader():
    from app.model import stored as app_stored
    from engine.store import stored
    assert app_stored.number is stored.number and app_stored.whole is stored.whole
    assert stored.number(10**400, None) is None and stored.event_data({"data": [1]}) == {}


# -- 6: a sharded run's checkpoint is seen -------------------------------------------------------
@pytest.mark.ddp
def test_stop_wait_and_status_see_a_sharded_runs_checkpoint(tmp_path):
    """2 ranks under torchrun, --strategy fsdp: the checkpoint is the folder checkpoints/last/.
    `stop --wait` says the run stopped (no "(no checkpoint)"), `status` says checkpoint true."""
    run = tmp_path / "run"
    log = open(tmp_path / "torchrun.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                             "-m", "engine", "--task", PACED_MLP, "--strategy", "fsdp", "--device", "cpu",
                             "--micro-batch", "8", "--accum", "2", "--epochs", "200", "--run-dir", str(run)],
                            cwd=ROOT, env=subprocess_env(), stdout=log, stderr=subprocess.STDOUT)
    try:
        def live() -> bool:
            said = (tmp_path / "torchrun.log").read_text().splitlines()
            assert proc.poll() is None, "\n".join(ln for ln in said if "rror" in ln)[-3000:]
            try:
                return (run / "run.db").exists() and len(db_rows(str(run))) >= 1
            except Exception:  # run.db made, its tables not yet
                return False
        wait_until(live, timeout=300, what="a live fsdp run", interval=0.2)
        r = ctl("stop", run, "--wait", "--timeout", "240", timeout=300)
        assert r.returncode == 0, r.stderr
        assert "stopped" in r.stdout and "no checkpoint" not in r.stdout, r.stdout
        assert proc.wait(timeout=120) == 0
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=60)
        log.close()
    assert (run / "checkpoints" / "last").is_dir() and not (run / "checkpoints" / "last.pt").exists()
    status = records(ctl("status", run, "--json").stdout)[-1]
    assert status["checkpoint"] is True


# -- 4: set --wait says what the run holds for each command ---------------------------------------
def _answers(text: str) -> list[dict]:
    return [r for r in records(text) if r["kind"] == "command" and r["status"] != "pending"]


def test_concurrent_set_wait_says_which_change_holds(tmp_path):
    """Six `set lr=... --wait` at once, and three lr changes in one `set --at step --wait`: of
    those applied at the same step, one says applied (the lr the rows then show), the others
    superseded, naming the one that holds. Before, all said "applied from step N"."""
    run = LiveRun(str(tmp_path / "run"))
    try:
        run.wait_live(2)
        values = [f"{0.001 * (i + 2):.3f}" for i in range(6)]
        procs = [subprocess.Popen([sys.executable, "-m", "engine.ctl", "set", run.run_dir, f"lr={v}", "--wait",
                                   "--json", "--timeout", "200"], cwd=ROOT, env=subprocess_env(),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for v in values]
        answers = []
        for p in procs:
            out, err = p.communicate(timeout=300)
            assert p.returncode == 0, err
            answers += _answers(out)
        r = ctl("set", run.run_dir, "lr=0.011", "lr=0.012", "lr=0.013", "--at", "step", "--wait", "--json")
        assert r.returncode == 0, r.stderr
        answers += _answers(r.stdout)
        shown = ctl("set", run.run_dir, "lr=0.021", "lr=0.022", "--at", "step", "--wait")
        assert shown.returncode == 0 and "superseded: lr=0.022" in shown.stdout, shown.stdout
        run.wait_live(len(db_rows(run.run_dir)) + 3)
    finally:
        run.end()
    lr_at = {row["step"]: row["lr"] for row in db_rows(run.run_dir)}
    by_step: dict[int, list[dict]] = {}
    for a in answers:
        by_step.setdefault(a["applied_step"], []).append(a)
    assert any(len(group) > 1 for group in by_step.values())  # commands that met at one boundary
    for step, group in by_step.items():
        applied = [a for a in group if a["status"] == "applied"]
        assert len(applied) == 1, group
        assert applied[0]["from_step"] == step + 1
        assert lr_at[step + 1] == pytest.approx(applied[0]["payload"]["lr"])
        for a in group:
            if a is not applied[0]:
                assert a["status"] == "superseded" and a["from_step"] is None, a
                assert f"lr={applied[0]['payload']['lr']}" in a["note"]


# -- 2: a silent connection ends a follow, with a clear line ---------------------------------------
def test_a_silent_server_ends_a_follow_with_a_line_to_go_on(tmp_path):
    """The server frozen after its hello (no heartbeat): the follow ends within its deadline, exit
    5, one line that says so and where to go on; ssh is asked to check the server is alive."""
    argv_file = tmp_path / "argv.json"
    r = ctl("follow", "srv:/run", env=hostile_env("silent", HOSTILE_ARGV=str(argv_file), HOSTILE_SLEEP="65"), timeout=60)
    assert r.returncode == 5, r.stderr
    line = one_error_line(r)
    assert "no word from srv for 20 s" in line and "follow --from-step 0" in line
    asked = " ".join(json.loads(argv_file.read_text()))
    assert "ServerAliveInterval=" in asked and "ServerAliveCountMax=" in asked


def test_the_client_apis_follow_has_a_deadline(monkeypatch):
    """What the app's RemoteSource reads (and reconnects on, as on any broken connection)."""
    import time

    from engine.ctl import client
    for key, value in hostile_env("silent").items():
        monkeypatch.setenv(key, value)
    started = time.monotonic()
    with pytest.raises(client.CtlError) as broke:
        for _ in client.Following("srv:/run", silence_s=2).records():
            pass
    assert broke.value.code == client.EXIT_REMOTE and time.monotonic() - started < 30


# -- 3: a follow that goes on after a crash and a resume is told of the rows the resume discarded --
def test_a_follow_after_a_crash_and_a_resume_rewinds_the_discarded_rows(tmp_path):
    """A run killed mid-way (its rows past the last checkpoint are then discarded by the resume):
    the follow that goes on from its cursor gets a rewind, so the client ends with run.db's rows,
    not the crashed run's. Before: the old rows stayed (steps past the checkpoint, old times)."""
    from ctlkit import Stream, replay
    run = LiveRun(str(tmp_path / "run"), "--checkpoint-every", "50")
    run.wait_live(1)
    stream = Stream.follow(run.run_dir)
    try:
        wait_until(lambda: len(stream.rows()) >= 60, timeout=120, what="60 rows followed")
        run.proc.kill()  # a crash: no checkpoint at the end
        run.proc.wait(timeout=60)
        assert stream.finish() == 0
    finally:
        run.end()
        if stream.proc.poll() is None:
            stream.kill()
    step, event = stream.cursor()
    resumed = subprocess.run([sys.executable, "-m", "engine", "--resume", run.run_dir, "--max-steps", str(step + 4)],
                             cwd=ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    from engine.store import RunReader
    reader = RunReader(run.run_dir)
    try:
        assert any(r["step"] < step for r in reader.discarded())  # rows the client holds were discarded
    finally:
        reader.close()
    args = ["--from-step", str(step)] + (["--after-event", str(event)] if event is not None else [])
    again = records(ctl("follow", run.run_dir, "--json", *args).stdout)
    assert any(r["kind"] == "rewind" for r in again)
    rows, _ = replay(stream.records + again)
    assert rows == db_rows(run.run_dir)


# -- 7: the end says the run's step; follow carries what a framework logged ------------------------
def test_follow_past_the_end_says_the_runs_last_step(odd_run):
    r = ctl("follow", odd_run, "--from-step", "100000")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "run ended: finished at step 3"  # was "at step 99999"
    end = records(ctl("follow", odd_run, "--json", "--from-step", "100000").stdout)[-1]
    assert end["kind"] == "end" and end["step"] == 3


def test_follow_carries_the_scalars_a_framework_logged(tmp_path):
    """run.db's scalars table (what HeadroomCallback and headroom_run log) in `scalars` records,
    in the order logged; a follow that goes on from step N gets those at N or later."""
    from ctlkit import written_run

    from engine.ctl.client import Scalars, typed
    from engine.store import RunStore
    run = written_run(str(tmp_path / "run"), 4)
    store = RunStore(run)
    for step in (2, 4):
        store.log_scalars(step, 1, {"eval_accuracy": 0.5 + step / 10, "eval_f1": step / 10})
    store.close()
    recs = records(ctl("follow", run, "--json").stdout)
    scalars = [typed(r) for r in recs if r["kind"] == "scalars"]
    got = [row for r in scalars if isinstance(r, Scalars) for row in r.dicts()]
    assert [(g["step"], g["name"], g["value"]) for g in got] == [
        (2, "eval_accuracy", 0.7), (2, "eval_f1", 0.2), (4, "eval_accuracy", 0.9), (4, "eval_f1", 0.4)]
    assert scalars and all(isinstance(r, Scalars) for r in scalars)
    later = records(ctl("follow", run, "--json", "--from-step", "3").stdout)
    assert [row[0] for r in later if r["kind"] == "scalars" for row in r["rows"]] == [4, 4]
    shown = ctl("follow", run).stdout
    assert "step 4  [scalar] eval_accuracy 0.9" in shown


def test_records_of_any_shape_from_a_server_are_shown_or_left_out(tmp_path):
    """A server's record with fields of the wrong shape (a list for the event, text for the rows,
    ints past 64 bits) prints what it can, never a traceback."""
    r = ctl("follow", "srv:/run", env=hostile_env("shapes"))
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr and r.stdout.strip().endswith("run ended: finished at step 3")


def test_the_app_reconnects_when_a_followed_server_freezes(monkeypatch):
    """The window's RemoteSource: a server that caught up and then froze is 'reconnecting' once the
    follow's deadline passes (before: 'connected' for good, waiting on a silent connection)."""
    import time

    from app.session.remote_source import RemoteSource
    for key, value in hostile_env("freezes", HOSTILE_SLEEP="60").items():
        monkeypatch.setenv(key, value)
    source = RemoteSource("srv:/run", timeout=60)
    try:
        assert source.connection == "connected"
        deadline = time.monotonic() + 50
        while source.connection != "reconnecting" and time.monotonic() < deadline:
            time.sleep(0.2)
        assert source.connection == "reconnecting"
    finally:
        source.close()
