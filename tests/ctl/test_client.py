"""The client API (engine/ctl/client): typed records read from every kind of the protocol, the
app's commands as headroom-ctl's words, each operation on a run folder here, and an import
without torch or Qt (what a laptop following a server's run loads)."""
from __future__ import annotations

import dataclasses
import math
import os
import subprocess
import sys
from typing import ClassVar

import pytest

from engine import Pause, Resume, SetAccum, SetLr, Stop, Unpause
from engine.ctl import client
from engine.declarations.commands import Command, SetCheckpointing, SetPrecision
from testkit import ROOT, subprocess_env


def test_every_kind_reads_as_its_record_and_keeps_what_was_written():
    rows = client.typed({"kind": "rows", "columns": ["step", "loss"], "rows": [[0, 1.5], [1, math.nan]]})
    assert isinstance(rows, client.Rows) and rows.last_step == 1 and rows.dicts()[0] == {"step": 0, "loss": 1.5}
    event = client.typed({"kind": "event", "event": {"id": 7, "step": 3, "kind": "paused"}})
    assert isinstance(event, client.Event) and event.id == 7
    info = client.typed({"kind": "info", "info": {"status": "running"}, "live": True, "writer": {"pid": 5}})
    assert isinstance(info, client.Info) and info.live and info.writer == {"pid": 5}
    assert client.typed({"kind": "rewind", "to_step": 4}) == client.Rewind(4, raw={})
    assert client.typed({"kind": "caught_up", "step": None}) == client.CaughtUp(None, raw={})
    end = client.typed({"kind": "end", "status": "finished", "step": 9, "last_event": 12})
    assert end == client.End("finished", 9, 12, raw={})
    run = client.typed({"kind": "run", "path": "/r/a", "name": "a", "status": "finished", "live": False,
                        "step": 3, "task": "mlp", "started": 1.0, "loss": 0.5})
    assert isinstance(run, client.RunListing) and (run.name, run.step, run.loss, run.finished) == ("a", 3, 0.5, None)
    started = client.typed({"kind": "started", "run_dir": "/r/b", "started": True, "pid": 9, "detach": "tmux",
                            "session": "headroom-b", "console": "/r/b/console.log", "command": ["python", "-m"]})
    assert isinstance(started, client.Started) and started.command == ("python", "-m") and started.target is None
    answer = client.typed({"kind": "command", "id": 2, "command": "set_lr", "payload": {"lr": 0.1},
                           "status": "applied", "applied_step": 4, "from_step": 5, "note": ""})
    assert isinstance(answer, client.CommandAnswer) and (answer.status, answer.from_step) == ("applied", 5)
    newer = {"kind": "from_a_newer_engine", "x": 1}
    other = client.typed(newer)
    assert isinstance(other, client.Other) and other.raw is newer and other.kind == "from_a_newer_engine"
    status = client.typed({"kind": "status", "run_dir": "/r", "live": False, "state": "finished", "extra": 1})
    assert isinstance(status, client.Status) and status.settings == {} and status.raw["extra"] == 1


@pytest.mark.parametrize("command,request_", [
    (Pause(), client.SteerRequest("pause")),
    (Unpause(), client.SteerRequest("unpause")),
    (Stop(), client.SteerRequest("stop")),
    (SetLr(0.1, at="step"), client.SteerRequest("set", ("lr=0.1",), "step")),
    (SetAccum(4), client.SteerRequest("set", ("accum=4",), "epoch")),
    (SetCheckpointing(True), client.SteerRequest("set", ("checkpointing=on",), "epoch")),
    (SetPrecision("bf16"), client.SteerRequest("set", ("precision=bf16",), "epoch")),
])
def test_a_command_of_the_app_is_the_request_headroom_ctl_sends(command, request_):
    assert client.request_for(command) == request_
    if request_.action == "set":  # what headroom-ctl's own `set` reads back: the same command
        from engine.ctl.local import parse_changes
        assert parse_changes(list(request_.changes), request_.at) == [command]


def test_a_command_headroom_ctl_does_not_send_is_refused():
    assert client.request_for(Resume()) == client.SteerRequest("unpause")  # Resume is Unpause's other name

    @dataclasses.dataclass(frozen=True)
    class NotASetting(Command):
        kind: ClassVar[str] = "not_a_setting"
    with pytest.raises(client.CtlError, match="cannot be sent"):
        client.request_for(NotASetting())


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> str:
    from engine.cli import main
    run_dir = str(tmp_path_factory.mktemp("client") / "run-a")
    assert main(["--task", "mlp", "--epochs", "1", "--max-steps", "6", "--run-dir", run_dir]) == 0
    return run_dir


def test_the_operations_on_a_finished_run_here(finished_run):
    (status,) = client.status(finished_run)
    assert isinstance(status, client.Status) and not status.live and status.step == 6
    listed = [r for r in client.runs(os.path.dirname(finished_run)) if isinstance(r, client.RunListing)]
    assert [r.name for r in listed] == ["run-a"] and listed[0].status == status.state
    following = client.Following(finished_run, 3)
    records = list(following.records())
    steps = [s for r in records if isinstance(r, client.Rows) for s in (row["step"] for row in r.dicts())]
    assert steps == [3, 4, 5, 6] and isinstance(records[-1], client.End) and records[-1].step == 6
    with pytest.raises(client.CtlError) as refused:
        list(client.steer(finished_run, client.request_for(SetLr(0.1))))
    assert refused.value.code == client.EXIT_NOT_LIVE
    with pytest.raises(client.CtlError) as bad:
        list(client.steer(finished_run, client.SteerRequest("set", ("no_such=1",))))
    assert bad.value.code == client.EXIT_BAD_INPUT


def test_a_remote_target_without_a_folder_is_bad_input():
    with pytest.raises(client.CtlError, match="give the run folder's path"):
        list(client.status("gpu-box:"))


def test_the_client_imports_without_torch_or_qt():
    code = ("import sys, engine.ctl.client\n"
            "print(sorted(m for m in ('torch', 'numpy', 'PySide6', 'engine.cli') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=subprocess_env(), capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stderr
