"""`headroom-ctl mcp` through the MCP SDK's own stdio client against a real `python -m engine.ctl mcp`
and a live engine run: the tool list, a live run read, a change that run.db shows applied and
recorded as sent by an agent, and refusals that come back as tool errors with nothing sent."""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from typing import Any, Optional

import pytest
import sshkit
from ctlkit import LiveRun, ctl, db_events, one_error_line, written_run

from engine.ctl.remote import PYTHON_ENV
from engine.declarations.commands import SetPrecision
from engine.store import RunReader
from testkit import ROOT, subprocess_env

mcp = pytest.importorskip("mcp")
from mcp import ClientSession  # noqa: E402  # after the skip: the extra may be absent
from mcp.client.stdio import StdioServerParameters, stdio_client  # noqa: E402  # the same

pytestmark = pytest.mark.slow
sshd = sshkit.sshd  # the shared server fixture (tests/ctl/sshkit.py)

TOOLS = {"list_runs", "run_status", "set_settings", "pause", "unpause", "stop", "fork"}


def commands(run_dir: str) -> list[dict[str, Any]]:
    reader = RunReader(run_dir)
    try:
        return reader.commands()
    finally:
        reader.close()


def text(result: Any) -> str:
    return "".join(getattr(c, "text", "") for c in result.content)


async def _session(calls: list[tuple[str, dict[str, Any]]], env: dict[str, str]) -> tuple[list[str], list[Any]]:
    params = StdioServerParameters(command=sys.executable, args=["-m", "engine.ctl", "mcp"], cwd=str(ROOT),
                                   env=subprocess_env(env))
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            names = [t.name for t in (await session.list_tools()).tools]
            results = [await session.call_tool(name, args) for name, args in calls]
    return names, results


def session(*calls: tuple[str, dict[str, Any]], env: Optional[dict[str, str]] = None) -> tuple[list[str], list[Any]]:
    """The SDK's stdio client against `python -m engine.ctl mcp`: the tool names, each call's result."""
    return asyncio.run(asyncio.wait_for(_session(list(calls), env or {}), 300))


def test_an_agent_lists_reads_and_steers_a_live_run(tmp_path):
    (tmp_path / "runs").mkdir()
    run_dir = str(tmp_path / "runs" / "live")
    fork_dir, bad_fork = str(tmp_path / "runs" / "fork"), str(tmp_path / "runs" / "bad")
    live = LiveRun(run_dir)
    try:
        live.wait_live(rows=12)
        names, (listed, status, applied, invalid, unknown, not_sent, engine_refused, passed, stopped, bad,
                forked) = session(
            ("list_runs", {"where": str(tmp_path / "runs")}),
            ("run_status", {"run": run_dir, "rows": 10}),
            ("set_settings", {"run": run_dir, "changes": {"lr": 0.0005}, "at": "step", "timeout_s": 120}),
            ("set_settings", {"run": run_dir, "changes": {"accum": 0}, "at": "step"}),
            ("set_settings", {"run": run_dir, "changes": {"seed": 3}}),
            ("set_settings", {"run": run_dir, "changes": {"lr": 0.001, "clip": -1}}),
            ("set_settings", {"run": run_dir, "changes": {"precision": "bf16"}, "at": "step", "timeout_s": 120}),
            ("set_settings", {"run": run_dir, "changes": {"max_steps": 1}, "at": "step", "timeout_s": 120}),
            ("stop", {"run": run_dir, "timeout_s": 120}),
            ("fork", {"run": run_dir, "changes": {"accum": 0}, "run_dir": bad_fork}),
            ("fork", {"run": run_dir, "checkpoint": "last", "changes": {"accum": 4, "lr": 0.0002},
                      "run_dir": fork_dir}),
        )
        assert TOOLS <= set(names), names

        assert not listed.is_error, text(listed)
        runs = json.loads(text(listed))["runs"]
        assert [r["path"] for r in runs] == [run_dir] and runs[0]["live"] is True

        assert not status.is_error, text(status)
        read = status.structured_content
        assert read["status"]["live"] is True and read["status"]["state"] == "running"
        assert 1 <= len(read["rows"]) <= 10 and read["loss"]["count"] == len(read["rows"])
        assert read["loss"]["min"] <= read["loss"]["last"] <= read["loss"]["max"]
        steps = [r["step"] for r in read["rows"]]
        assert steps == sorted(steps) and steps[-1] >= 12

        # Applied: the engine's answer, run.db's row applied and saying who sent it.
        assert not applied.is_error, text(applied)
        answer = applied.structured_content["commands"]
        assert [(a["command"], a["status"]) for a in answer] == [("set_lr", "applied")]
        rows = commands(run_dir)  # the calls all ran: the engine-refused precision is the second row
        assert (rows[0]["kind"], rows[0]["status"]) == ("set_lr", "applied")
        assert json.loads(rows[0]["payload"]) == {"lr": 0.0005, "at": "step", "sent_by": "agent"}
        received = [e for e in db_events(run_dir) if e["kind"] == "command_received"]
        assert [e["message"] for e in received][:1] == ["set_lr received (sent by an agent): applies at the next step"]
        assert any(e["kind"] == "settings_applied" and "lr" in e["message"] for e in db_events(run_dir))

        # Invalid as `headroom-ctl set` finds them: its reason, word for word, as the tool error; nothing sent.
        for result, word in ((invalid, "accum=0"), (unknown, "seed=3"), (not_sent, "clip=-1")):
            said = ctl("set", run_dir, "lr=0.001", word)
            assert said.returncode == 2
            reason = one_error_line(said).removeprefix("error: ")
            assert result.is_error and text(result) == f"Error executing tool set_settings: {reason}"
        assert "accum must be an integer from 1" in text(invalid)
        assert "'seed' is not a setting a run changes while it trains" in text(unknown)
        assert "clip (0 = off) must be a finite number from 0" in text(not_sent)

        # Refused by the engine (sent, answered refused): the engine's reason, as set --wait's exit 3.
        assert engine_refused.is_error and SetPrecision.refusal in text(engine_refused), text(engine_refused)
        rows = commands(run_dir)
        assert [(r["kind"], r["status"]) for r in rows][:2] == [("set_lr", "applied"), ("set_precision", "refused")]
        assert json.loads(rows[1]["payload"])["sent_by"] == "agent"
        # A run length it has passed (the run is past step 12): the engine's reason, nothing changed.
        assert passed.is_error and "max_steps=1 refused: the run has done" in text(passed), text(passed)
        assert (rows[2]["kind"], rows[2]["status"]) == ("set_max_steps", "refused")

        # Stopped with a checkpoint, then forked from it with changes; an invalid change starts nothing.
        assert not stopped.is_error and [a["status"] for a in stopped.structured_content["commands"]] == ["applied"]
        assert [(r["kind"], r["status"]) for r in commands(run_dir)][3:] == [("stop", "applied")]
        assert live.proc.wait(timeout=60) == 0
        assert bad.is_error and "set accum: set_accum accum must be an integer from 1" in text(bad), text(bad)
        assert not os.path.exists(bad_fork)
        assert not forked.is_error, text(forked)
        assert forked.structured_content["run_dir"] == fork_dir and forked.structured_content["started"] is True
        assert ["--fork", f"{run_dir}@last", "--accum", "4", "--lr", "0.0002"] == \
            [w for w in forked.structured_content["command"] if w in ("--fork", f"{run_dir}@last", "--accum", "4",
                                                                    "--lr", "0.0002")]
        said = ctl("stop", fork_dir, "--wait", "--json", timeout=180)
        assert said.returncode == 0, said.stderr
        reader = RunReader(fork_dir)
        try:
            config = reader.info()["config"]
        finally:
            reader.close()
        assert (config["accum"], config["lr"]) == (4, 0.0002)
    finally:
        live.end()


def test_without_the_mcp_extra_one_line_and_exit_2():
    # -S: the interpreter without its site-packages, where the SDK is installed
    r = subprocess.run([sys.executable, "-S", "-m", "engine.ctl", "mcp"], cwd=ROOT, env=subprocess_env(),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr == "error: headroom-ctl mcp needs the mcp extra (pip install 'headroom[mcp]')\n"


def test_a_finished_run_is_read_and_not_steered(tmp_path):
    run_dir = written_run(str(tmp_path / "done"), steps=30)
    names, (read, paused, missing) = session(("run_status", {"run": run_dir, "rows": 5}),
                                             ("pause", {"run": run_dir}),
                                             ("run_status", {"run": str(tmp_path / "nope")}))
    assert not read.is_error, text(read)
    got = read.structured_content
    assert (got["status"]["live"], got["status"]["state"]) == (False, "finished")
    assert [r["step"] for r in got["rows"]] == [26, 27, 28, 29, 30]
    assert got["loss"]["min"] == pytest.approx(1 / 30) and got["loss"]["max"] == pytest.approx(1 / 26)
    assert got["loss"]["trend"] < 0  # falling
    assert paused.is_error and text(paused) == ("Error executing tool pause: no live run: nothing is writing "
                                                f"{run_dir} (run.db says finished)")
    assert not commands(run_dir)  # nothing queued for a run nobody trains
    assert missing.is_error and text(missing).endswith(f"{tmp_path / 'nope'}: no such run folder")


def test_an_agent_steers_a_run_on_a_server_through_ssh(sshd, tmp_path):
    (tmp_path / "runs").mkdir()
    run_dir = str(tmp_path / "runs" / "remote")
    there = f"{sshkit.HOST}:{run_dir}"
    live = LiveRun(run_dir)
    try:
        live.wait_live(rows=5)
        _, (listed, read, applied, invalid) = session(
            ("list_runs", {"where": f"{sshkit.HOST}:{tmp_path / 'runs'}"}),
            ("run_status", {"run": there, "rows": 3}),
            ("set_settings", {"run": there, "changes": {"clip": 0.5}, "at": "step", "timeout_s": 120}),
            ("set_settings", {"run": there, "changes": {"micro_batch": 0}}),
            env={**sshd.env, PYTHON_ENV: sshd.remote_python})
        assert [r["path"] for r in listed.structured_content["runs"]] == [run_dir], text(listed)
        assert read.structured_content["status"]["live"] is True and len(read.structured_content["rows"]) == 3
        assert [a["status"] for a in applied.structured_content["commands"]] == ["applied"], text(applied)
        rows = commands(run_dir)  # written on the server by its engine.ctl, told who sent it
        assert [(r["kind"], r["status"], json.loads(r["payload"]).get("sent_by")) for r in rows] == \
            [("set_clip", "applied", "agent")]
        assert invalid.is_error and "set micro_batch: " in text(invalid), text(invalid)  # the server's validation
        assert len(commands(run_dir)) == 1
    finally:
        live.end()


def test_a_sender_is_short_text_in_a_row_from_another_program():
    from engine.declarations.commands import Pause, command_from_json
    from engine.declarations.config import ConfigError
    assert command_from_json("pause", '{"sent_by": "agent"}') == Pause(sent_by="agent")
    assert Pause().to_json() == "{}"  # no sender: the row an older engine reads
    for bad in ('{"sent_by": 5}', '{"sent_by": "' + "x" * 41 + '"}'):
        with pytest.raises(ConfigError, match="sent_by must be text of at most 40 characters"):
            command_from_json("pause", bad)
