"""--notify URL (Apprise): real runs send to a real HTTP server on 127.0.0.1 through Apprise's
json:// URL; an unreachable service costs the run nothing and is one notify_failed event; a
missing extra or a URL Apprise cannot read is one `error:` line, exit 2, nothing written."""
from __future__ import annotations

import builtins
import socket
import time
from pathlib import Path
from typing import Any

import pytest

import testkit
from engine.declarations.events import RunFinished, StepMetrics
from engine.store import RunReader
from engine.trainer import notify
from engine_in_process import engine

TASK = Path(__file__).with_name("diverging_task.py")
QUICK = ("--device", "cpu", "--epochs", "1", "--max-steps", "6", "--micro-batch", "8", "--accum", "1")


@pytest.fixture()
def server():
    """A real HTTP server on 127.0.0.1 keeping every JSON body posted (testkit.json_server)."""
    with testkit.json_server("headroom") as served:
        yield served


def closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound, then closed)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return int(port)


def kinds(run: Path) -> list[str]:
    return [e["kind"] for e in RunReader(str(run)).events()]


def test_a_completed_run_is_sent_with_its_folder_final_loss_and_duration(tmp_path, server):
    url, received = server
    run = tmp_path / "sent-run"
    r = engine(*QUICK, "--run-dir", run, "--notify", url)
    assert r.returncode == 0, r.stderr
    [body] = received  # one message: the end (no rollback, no out-of-memory)
    final = RunReader(str(run)).metrics()[-1]["loss"]
    assert body["title"] == "Headroom: run sent-run reached its step limit"
    assert f"final loss {final:.4f}" in body["message"]
    assert f":{run}" in body["message"] and f"Folder: {socket.gethostname()}:{run}" in body["message"]
    assert "at step 6 " in body["message"] and ", after " in body["message"]
    assert body["type"] == "success"
    assert "notify_failed" not in kinds(run)
    assert RunReader(str(run)).info()["config"]["notify"] == []  # the URL (a token, often) is not kept
    assert all(url.encode() not in p.read_bytes() for p in run.glob("run.db*"))
    assert all(url.encode() not in p.read_bytes() for p in (run / "checkpoints").iterdir() if p.is_file())


def test_headroom_notify_is_read_when_the_flag_is_not_given(tmp_path, server):
    url, received = server
    r = engine(*QUICK, "--run-dir", tmp_path / "by-env", env={notify.ENV: f"{url}  {url}?x=1"})
    assert r.returncode == 0, r.stderr
    assert len(received) == 2  # two URLs, separated by spaces: each got the end of the run
    assert all("by-env" in b["title"] for b in received)


def test_rollbacks_and_giving_up_are_sent(tmp_path, server):
    url, received = server
    run = tmp_path / "hopeless"
    r = engine("--device", "cpu", "--task", TASK, "--epochs", "3", "--micro-batch", "8", "--accum", "2",
               "--checkpoint-every", "2", "--task-arg", "always_bad=true", "--task-arg", "bad_from=5",
               "--nonfinite", "rollback", "--run-dir", run, "--notify", url)
    assert r.returncode == 1
    titles = [b["title"] for b in received]
    assert titles == ["Headroom: run hopeless rolled back"] * 3 + ["Headroom: run hopeless gave up"]
    assert "rolled back from step" in received[0]["message"] and received[-1]["type"] == "failure"
    assert "final loss" in received[-1]["message"]


def test_an_unreachable_service_neither_fails_nor_slows_the_run_and_is_said_once(tmp_path):
    def timed(*args: Any) -> float:
        start = time.monotonic()
        r = engine(*QUICK, "--max-steps", "40", *args)
        assert r.returncode == 0, r.stderr
        return time.monotonic() - start

    timed("--run-dir", tmp_path / "warm-up")  # the first run in this process pays for imports
    plain = timed("--run-dir", tmp_path / "plain")
    dead = f"json://127.0.0.1:{closed_port()}/x"
    unreachable = timed("--run-dir", tmp_path / "unreachable", "--notify", dead, "--notify", dead + "?y=1")
    assert unreachable < plain + 1.5, (plain, unreachable)
    events = RunReader(str(tmp_path / "unreachable")).events(kinds={"notify_failed"})
    assert len(events) == 1, events  # two services failed: said once
    assert "not delivered" in events[0]["message"] and "127.0.0.1" in events[0]["message"]
    assert "notify_failed" not in kinds(tmp_path / "plain")


def test_a_silent_service_never_holds_the_training_thread(tmp_path):
    """A service that accepts the connection and never answers: handing events over takes no time,
    the run's end waits at most its bound, and the failure says so."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # never accepted: connect succeeds, the answer never comes
    try:
        n = notify.Notifier([f"json://127.0.0.1:{silent.getsockname()[1]}/x"], str(tmp_path / "r"))
        start = time.monotonic()
        for step in range(1, 200):
            n.on_event(StepMetrics(step, 1, loss=1.0, grad_norm=1.0, lr=1e-3, accum=1, clip=1.0, micro_batch=8,
                                   samples=8 * step, tokens=8, step_time=0.01, nonfinite=False, clipped=False,
                                   throughput=800.0, scaler_skipped=False))
        n.on_event(RunFinished(199, 1, reason="completed"))
        handed = time.monotonic() - start
        n.close(wait=0.5)
        closed = time.monotonic() - start
    finally:
        silent.close()
    assert handed < 0.2, handed
    assert closed < 1.5, closed
    failed = n.failure(199, 1)
    assert failed is not None and "not delivered within 0.5 s" in failed.reason
    assert n.failure(199, 1) is None  # once


def test_a_url_apprise_cannot_read_is_refused_before_anything_is_written(tmp_path):
    run = tmp_path / "never"
    r = engine(*QUICK, "--run-dir", run, "--notify", "nosuchservice://x")
    assert r.returncode == 2
    assert r.stderr.strip() == ("error: --notify nosuchservice://x: not a URL Apprise can send to (see "
                                "https://github.com/caronc/apprise/wiki for the services and their URLs)")
    assert not run.exists()


def test_a_bad_url_in_headroom_notify_is_named_as_such(tmp_path):
    run = tmp_path / "never"
    r = engine(*QUICK, "--run-dir", run, env={notify.ENV: "bogus://"})
    assert (r.returncode, r.stderr.strip().splitlines()[-1][:40]) == (2, "error: HEADROOM_NOTIFY bogus://: not a U")
    assert not run.exists()


def test_without_the_extra_notify_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    real_import = builtins.__import__

    def without_apprise(name: str, *args: Any, **kw: Any) -> Any:
        if name == "apprise" or name.startswith("apprise."):
            raise ImportError("No module named 'apprise'")
        return real_import(name, *args, **kw)

    monkeypatch.setattr(builtins, "__import__", without_apprise)  # the extra not installed
    run = tmp_path / "never"
    r = engine(*QUICK, "--run-dir", run, "--notify", "json://127.0.0.1:9/x")
    assert (r.returncode, r.stderr.strip()) == (2, "error: --notify needs the notify extra "
                                                   "(pip install 'headroom[notify]')")
    assert not run.exists()
    monkeypatch.undo()
    assert engine(*QUICK, "--run-dir", tmp_path / "without", "--max-steps", "1").returncode == 0  # no URL: no need


def test_a_plain_loops_run_sends_its_first_loss_weighting_alert_and_its_end(server, tmp_path):
    """The integrations write their own events (HeadroomRun's store): the notifier listens to the
    store, so a hand-written loop's first loss-weighting alert (its framework loss 2x the
    count-weighted one) and its end reach the service, each once, naming the run."""
    from engine.integrations.loop import HeadroomRun
    url, received = server
    run_dir = tmp_path / "my-loop"
    with HeadroomRun(str(run_dir), task="my-loop", notify=[url], device="cpu") as run:
        for _ in range(4):
            run.log_step(loss=1.0, framework_loss=2.0, accum=2, micro_batch=4)
    titles = [r["title"] for r in received]
    assert titles == ["Headroom: run my-loop has a loss weighting alert", "Headroom: run my-loop completed"], titles
    assert "final loss 1.0000" in received[-1]["message"] and str(run_dir) in received[-1]["message"]
    # two alerts in run.db (the first step's and the epoch's summary), one message
    assert kinds(run_dir).count("loss_weighting") == 2 and "notify_failed" not in kinds(run_dir)


def test_a_plain_loop_with_a_url_apprise_cannot_read_writes_nothing(tmp_path):
    from engine.declarations.config import ConfigError
    from engine.integrations.loop import HeadroomRun
    with pytest.raises(ConfigError, match="not a URL Apprise can send to"):
        HeadroomRun(str(tmp_path / "r"), notify=["nosuchservice://x"], device="cpu")
    assert not (tmp_path / "r").exists()
