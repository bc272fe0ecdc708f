"""headroom-ctl over ssh, against a real OpenSSH sshd on 127.0.0.1 (tests/ctl/sshkit.py) and the
real `ssh` client: follow a live engine run and compare with its run.db row for row; set applied
and refused; the ssh client killed mid-stream, the follow on the server gone within seconds and
a reconnect from the cursor losing and repeating nothing; stop with a checkpoint; a folder named
like a shell command; an unknown host key refused; a remote too old for the protocol.

The "remote" is this machine reached through sshd: another process tree, another session, the
ssh client's quoting and sshd's pipes, exactly as on a server.
"""
from __future__ import annotations

import os
import signal
import sys

import pytest
import sshkit
from ctlkit import (
    Stream,
    ctl,
    db_events,
    db_rows,
    followed_live_run,
    hold_lock,
    one_error_line,
    records,
    replay,
    written_run,
)

from testkit import wait_until

sshd = sshkit.sshd  # the shared server fixture (tests/ctl/sshkit.py)

pytestmark = pytest.mark.slow


def remote(run_dir: str) -> str:
    return f"{sshkit.HOST}:{run_dir}"


@pytest.fixture(scope="module")
def live(sshd, tmp_path_factory):
    follow_over_ssh = lambda run_dir: Stream.follow(remote(run_dir), *sshd.ctl_args(), env=sshd.env)  # noqa: E731 - a one-line function, named where it is passed
    with followed_live_run(str(tmp_path_factory.mktemp("ctl-ssh") / "run"), follow_over_ssh) as run:
        yield run


def server_follows(run_dir: str, from_step: int) -> list[int]:
    """Pids of `engine.ctl follow` processes that sshd started for run_dir from `from_step`."""
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        if "engine.ctl" in args and "follow" in args and "--protocol" in args and run_dir in args \
                and args[args.index("--from-step") + 1] == str(from_step):
            pids.append(int(pid))
    return pids


def children(pid: int, name: str) -> list[int]:
    out = []
    for child in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{child}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        comm, rest = stat[stat.index("(") + 1: stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
        if comm == name and int(rest[1]) == pid:
            out.append(int(child))
    return out


def test_status_through_ssh(sshd, live):
    r = ctl("status", remote(live.run_dir), "--json", *sshd.ctl_args(), env=sshd.env)
    assert r.returncode == 0, r.stderr
    hello, status = records(r.stdout)
    assert hello["protocol"] == 1 and status["live"] and status["run_dir"] == live.run_dir


def test_set_through_ssh_is_applied_at_the_next_step_and_a_refusal_says_why(sshd, live):
    r = ctl("set", remote(live.run_dir), "lr=5e-4", "clip=0.5", "--at", "step", "--wait", *sshd.ctl_args(),
            env=sshd.env, timeout=180)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count(": applied from step") == 2, r.stdout
    start = int(r.stdout.split("applied from step ")[1].split()[0])
    wait_until(lambda: start in {m["step"] for m in db_rows(live.run_dir)}, what="the step with the new lr")
    rows = {m["step"]: m for m in db_rows(live.run_dir)}
    assert (rows[start]["lr"], rows[start]["clip"]) == (pytest.approx(5e-4), 0.5)
    assert rows[start - 1]["lr"] == pytest.approx(1e-3)
    r = ctl("set", remote(live.run_dir), "precision=fp16", "--at", "step", "--wait", *sshd.ctl_args(),
            env=sshd.env, timeout=180)
    assert r.returncode == 3 and "refused: precision changes when the run restarts" in r.stdout, r.stdout + r.stderr
    r = ctl("set", remote(live.run_dir), "accum=0", *sshd.ctl_args(), env=sshd.env)  # validated on the server
    assert r.returncode == 2 and "accum" in one_error_line(r)


def test_a_killed_ssh_client_ends_the_server_follow_and_a_reconnect_loses_nothing(sshd, live):
    first = Stream.follow(remote(live.run_dir), "--from-step", 1, *sshd.ctl_args(), env=sshd.env)
    wait_until(lambda: len(first.rows()) >= 3, timeout=120, what="rows through ssh")
    on_server = server_follows(live.run_dir, 1)
    assert len(on_server) == 1  # the probe finds it (so "gone" below means something)
    (client,) = children(first.proc.pid, "ssh")
    os.kill(client, signal.SIGKILL)  # the laptop's Wi-Fi is gone
    assert first.finish() == 5
    assert "--from-step" in one_error_line(first)  # says how to go on
    # OpenSSH sends no signal to a command without a terminal: the follow finds out by itself.
    wait_until(lambda: not server_follows(live.run_dir, 1), timeout=10, what="the server's follow to end")
    step, event = first.cursor()
    args = ["--from-step", step] + (["--after-event", event] if event is not None else [])
    second = Stream.follow(remote(live.run_dir), *args, *sshd.ctl_args(), env=sshd.env)
    wait_until(lambda: len(second.rows()) >= 2, timeout=120, what="rows after the reconnect")
    live.restarted = (first, second)


def test_a_follow_of_an_idle_run_ends_on_the_server_when_its_client_goes(sshd, tmp_path):
    """Nothing to write, so no failed write would tell it: the heartbeat and the parent's end do."""
    run_dir = written_run(str(tmp_path / "idle"), 3, status="running")
    holder = hold_lock(run_dir)  # live, and writing nothing
    try:
        stream = Stream.follow(remote(run_dir), *sshd.ctl_args(), env=sshd.env)
        wait_until(lambda: len(stream.rows()) == 3 and server_follows(run_dir, 0), timeout=60, what="the follow")
        (client,) = children(stream.proc.pid, "ssh")
        os.kill(client, signal.SIGKILL)
        assert stream.finish() == 5
        wait_until(lambda: not server_follows(run_dir, 0), timeout=10, what="the server's follow to end")
    finally:
        holder.kill()
        holder.wait()


def test_stop_through_ssh_writes_a_checkpoint(sshd, live):
    r = ctl("stop", remote(live.run_dir), "--wait", *sshd.ctl_args(), env=sshd.env, timeout=180)
    assert r.returncode == 0, r.stderr
    assert live.proc.wait(timeout=60) == 0
    assert os.path.exists(os.path.join(live.run_dir, "checkpoints", "last.pt"))


def test_follow_through_ssh_equals_run_db_row_for_row(live):
    assert live.whole.finish() == 0, live.whole.stderr
    assert live.whole.records[-1] == {"kind": "end", "status": "finished", "step": db_rows(live.run_dir)[-1]["step"],
                                      "last_event": db_events(live.run_dir)[-1]["id"]}
    rows, events = replay(live.whole.records)
    assert rows == db_rows(live.run_dir) and events == db_events(live.run_dir)
    first, second = live.restarted
    assert second.finish() == 0, second.stderr
    assert first.rows() + second.rows() == [m for m in db_rows(live.run_dir) if m["step"] >= 1]
    assert replay(first.records)[1] + replay(second.records)[1] == \
        [e for e in db_events(live.run_dir) if e["step"] >= 1]


def test_a_folder_named_like_a_shell_command_is_a_folder_name(sshd, tmp_path):
    canary = f"headroom-canary-{os.getpid()}"  # what a quoting mistake would create in the remote home
    run_dir = written_run(str(tmp_path / f"run x; rm -rf 'q' $(touch {canary}) `touch {canary}`"), 4)
    try:
        r = ctl("status", remote(run_dir), "--json", *sshd.ctl_args(), env=sshd.env)
        assert r.returncode == 0, r.stderr
        assert records(r.stdout)[-1]["run_dir"] == run_dir
        r = ctl("follow", remote(run_dir), "--json", *sshd.ctl_args(), env=sshd.env)
        assert r.returncode == 0, r.stderr
        assert replay(records(r.stdout))[0] == db_rows(run_dir)
        r = ctl("runs", f"{sshkit.HOST}:{tmp_path}", "--json", *sshd.ctl_args(), env=sshd.env)
        assert [x["path"] for x in records(r.stdout) if x["kind"] == "run"] == [run_dir]
    finally:
        assert not os.path.exists(os.path.join(os.path.expanduser("~"), canary))
    assert os.path.isdir(run_dir)


def test_an_unknown_host_key_is_refused_never_accepted(sshd, tmp_path):
    run_dir = written_run(str(tmp_path / "run"), 2)
    r = ctl("status", f"{sshkit.STRANGER}:{run_dir}", *sshd.ctl_args(), env=sshd.env)
    assert r.returncode == 5
    line = one_error_line(r)
    assert "host key" in line and "known_hosts" in line and sshkit.STRANGER in line
    assert (sshd.folder / "empty_known_hosts").read_text() == ""  # nothing was added


def test_a_remote_speaking_another_protocol_is_named(sshd, tmp_path):
    old = tmp_path / "old_ctl.py"  # an engine.ctl of protocol 0
    old.write_text('print(\'{"kind": "hello", "protocol": 0, "engine": "0.0.9"}\')\n')
    r = ctl("status", f"{sshkit.HOST}:/x", "--remote-python", f"{sys.executable} {old}", env=sshd.env)
    assert r.returncode == 5
    line = one_error_line(r)
    assert "protocol 0" in line and "protocol 1" in line and "0.0.9" in line


def test_a_remote_engine_without_engine_ctl_is_named(sshd, tmp_path):
    (tmp_path / "engine").mkdir()  # Headroom from before headroom-ctl: an engine package, no engine.ctl
    (tmp_path / "engine" / "__init__.py").write_text("__version__ = '0.0.1'\n")
    # -S: without site, so an editable install of this tree (its import hook) cannot lend it engine.ctl
    r = ctl("follow", f"{sshkit.HOST}:/x", "--remote-python", f"env PYTHONPATH={tmp_path} {sys.executable} -S",
            env=sshd.env)
    assert r.returncode == 5
    line = one_error_line(r)
    assert "no engine.ctl" in line and "protocol 1" in line
