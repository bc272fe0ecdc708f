"""`headroom-ctl start HOST: -- <engine flags>` through a real sshd on 127.0.0.1 and the real ssh
client (tests/ctl/sshkit.py): the run starts detached on the "server" (in tmux, or setsid), the
command returns at once, and the run goes on training after the ssh connection has ended, to
its end; flags the engine refuses are refused on the server with exit 2 and nothing made; a run
folder named like a shell command is a folder name.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import time

import pytest
import sshkit
from ctlkit import PACED_MLP, ctl, db_rows, one_error_line, records, replay

from engine.store import RunReader
from testkit import wait_until

sshd = sshkit.sshd  # the shared server fixture (tests/ctl/sshkit.py)

pytestmark = pytest.mark.slow

FLAGS = ("--task", PACED_MLP, "--micro-batch", "8", "--accum", "2", "--seed", "3")  # the mlp, paced (ctlkit)


@pytest.fixture(scope="module")
def server(sshd, tmp_path_factory):
    """The server's runs root and tmux socket folder (a tmux server of its own), set for the
    remote python as a user's --remote-python would set them."""
    folder = tmp_path_factory.mktemp("server")
    runs, tmux_dir = folder / "runs", folder / "tmux"
    tmux_dir.mkdir()
    python = sshd.python_with(HEADROOM_RUNS=str(runs), TMUX_TMPDIR=str(tmux_dir), OMP_NUM_THREADS="1")
    yield sshd, runs, ["--remote-python", python]
    subprocess.run(["tmux", "kill-server"], env=dict(os.environ, TMUX_TMPDIR=str(tmux_dir)), capture_output=True)


def finished(run_dir: str) -> bool:
    try:
        reader = RunReader(run_dir)
    except Exception:
        return False
    try:
        return reader.info().get("status") == "finished"
    finally:
        reader.close()


def test_bad_flags_are_refused_on_the_server_and_nothing_is_made(server, tmp_path):
    sshd, runs, python = server
    for flags, said in ((["--task", "mlp", "--accum", "0"], "--accum"),
                        (["--task", "mlp", "--no-such-flag"], "--no-such-flag"),
                        (["--task", str(tmp_path / "missing.py")], "no such task file")):
        r = ctl("start", f"{sshkit.HOST}:", *python, "--", *flags, env=sshd.env)
        assert r.returncode == 2, r.stderr
        assert said in one_error_line(r)
    r = ctl("start", f"{sshkit.HOST}:", *python, "--task", "mlp", env=sshd.env)  # the flags without --
    assert r.returncode == 2 and "after --" in one_error_line(r)
    assert not runs.exists() or not os.listdir(runs)


def test_a_task_that_fails_to_build_is_refused_and_its_folder_is_not_left(server, tmp_path):
    """The engine's own refusal (after the parser's check passed): exit 2, its error line."""
    sshd, runs, python = server
    task = tmp_path / "broken_task.py"
    task.write_text("def build_task(seed=0):\n    raise ValueError('no data here')\n")
    r = ctl("start", f"{sshkit.HOST}:", *python, "--detach", "setsid", "--", "--task", str(task), env=sshd.env)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "did not start" in one_error_line(r) and "no data here" in r.stderr
    assert not runs.exists() or not os.listdir(runs)


def test_started_in_tmux_it_trains_on_after_the_connection_ends_in_a_folder_named_like_a_command(server, tmp_path):
    sshd, _runs, python = server
    canary = f"headroom-canary-{os.getpid()}"
    run_dir = str(tmp_path / f"run x; rm -rf 'q' $(touch {canary})")
    r = ctl("start", f"{sshkit.HOST}:{run_dir}", "--json", *python, "--", *FLAGS, "--epochs", "200", env=sshd.env)
    returned = time.time()  # the ssh client has ended: the connection is gone
    assert r.returncode == 0, r.stderr
    (started,) = [x for x in records(r.stdout) if x["kind"] == "started"]
    assert started["started"] and started["run_dir"] == run_dir and started["target"] == f"{sshkit.HOST}:{run_dir}"
    if shutil.which("tmux"):  # else it started the setsid way (auto)
        assert started["detach"] == "tmux" and started["session"].startswith("headroom-run-x")
    # Training on after the start command and its connection ended (it runs until stopped).
    wait_until(lambda: any(m["time"] > returned + 1 for m in db_rows(run_dir)), timeout=180,
               what="rows committed after the connection ended")
    s = ctl("stop", f"{sshkit.HOST}:{run_dir}", "--wait", *python, env=sshd.env, timeout=180)
    assert s.returncode == 0, s.stderr
    wait_until(lambda: finished(run_dir), timeout=120, what="the run to finish")
    assert os.path.exists(os.path.join(run_dir, "checkpoints", "last.pt"))
    assert os.path.getsize(os.path.join(run_dir, "console.log")) > 0  # the engine's output, also in the pane
    assert not os.path.exists(os.path.join(os.path.expanduser("~"), canary))


def test_started_with_setsid_under_the_runs_root_and_followed_to_its_end(server):
    sshd, runs, python = server
    r = ctl("start", f"{sshkit.HOST}:", "--detach", "setsid", *python, "--", *FLAGS, "--max-steps", "40",
            env=sshd.env)
    assert r.returncode == 0, r.stderr
    assert "started: " in r.stdout and "follow it: headroom-ctl follow" in r.stdout
    (run_dir,) = [str(p) for p in runs.iterdir()]  # a new folder under the server's runs root
    assert r.stdout.splitlines()[0].startswith(f"started: {sshkit.HOST}:{run_dir} (pid ")
    f = ctl("follow", f"{sshkit.HOST}:{run_dir}", "--json", *python, env=sshd.env, timeout=240)
    assert f.returncode == 0, f.stderr
    assert records(f.stdout)[-1]["kind"] == "end" and records(f.stdout)[-1]["status"] == "finished"
    assert replay(records(f.stdout))[0] == db_rows(run_dir) and len(db_rows(run_dir)) == 40
    with open(os.path.join(run_dir, "console.log")) as log:
        assert "run max_steps: 40 steps" in log.read()
