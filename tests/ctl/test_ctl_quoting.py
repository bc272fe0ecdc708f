"""What headroom-ctl hands the remote shell and the ssh client, checked through a real POSIX shell:
every word arrives as it was given, whatever it holds; ~/ in --remote-python is the remote home;
the ssh command is HEADROOM_SSH_COMMAND's words plus BatchMode, never a blind host key."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from engine.ctl.protocol import CtlError
from engine.ctl.remote import parse_target, remote_line, ssh_argv

NASTY = ["run x; rm -rf 'q'", "$(touch pwned)", "`touch pwned`", "a\"b", "-rf", "*", "line\nbreak", "", "~/x",
         "lr=3e-4", "tab\there", "back\\slash", "it's"]


def test_every_word_reaches_the_remote_python_as_given(tmp_path):
    printer = tmp_path / "home" / "bin" / "printargs"
    printer.parent.mkdir(parents=True)
    printer.write_text(f"#!{sys.executable}\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    printer.chmod(0o755)
    line = remote_line("~/bin/printargs", ["status", "--", *NASTY])
    r = subprocess.run(["sh", "-c", line], cwd=tmp_path, env=dict(os.environ, HOME=str(tmp_path / "home")),
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == ["-m", "engine.ctl", "status", "--", *NASTY]
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "q").exists()


def test_the_negative_control_a_line_joined_without_quoting_runs_what_the_name_says(tmp_path):
    subprocess.run(["sh", "-c", "true " + " ".join(["run x;", "touch pwned"])], cwd=tmp_path, timeout=30)
    assert (tmp_path / "pwned").exists()


def test_the_ssh_command_is_the_users_plus_batch_mode(monkeypatch):
    monkeypatch.setenv("HEADROOM_SSH_COMMAND", "ssh -F '/home/me/work dir/ssh_config' -o ProxyJump=bastion")
    argv = ssh_argv("me@gpu-box", "python3", ["status", "--", "/runs/a"])
    assert argv[:5] == ["ssh", "-F", "/home/me/work dir/ssh_config", "-o", "ProxyJump=bastion"]
    assert argv[5:13] == ["-o", "BatchMode=yes", "-o", "ServerAliveInterval=15", "-o", "ServerAliveCountMax=3", "--",
                          "me@gpu-box"]  # ssh ends a connection whose server stopped answering
    assert not any("StrictHostKeyChecking" in a for a in argv)
    monkeypatch.delenv("HEADROOM_SSH_COMMAND")
    assert ssh_argv("h", "python3", ["runs"])[0] == "ssh"
    monkeypatch.setenv("HEADROOM_SSH_COMMAND", "ssh -F 'unclosed")
    with pytest.raises(CtlError, match="HEADROOM_SSH_COMMAND"):
        ssh_argv("h", "python3", ["runs"])


@pytest.mark.parametrize("text,host,path", [
    ("gpu-box:runs/exp1", "gpu-box", "runs/exp1"),
    ("me@10.0.0.2:/data/runs/a b", "me@10.0.0.2", "/data/runs/a b"),
    ("gpu-box:", "gpu-box", ""),
    ("runs/exp1", None, None),
    ("./a:b", None, None),
    ("/abs/a:b", None, None),
])
def test_run_is_remote_as_scp_reads_it(text, host, path):
    target = parse_target(text)
    assert (target.host, target.path) == (host, path) if host else target is None


def test_a_local_folder_named_with_a_colon_stays_local(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "exp:1").mkdir()
    assert parse_target("exp:1") is None
    assert parse_target("exp:2") is not None


def test_the_tmux_script_runs_the_engine_command_word_for_word(tmp_path, monkeypatch):
    """`start` in tmux: the script tmux runs (engine/ctl/start.py) gives the engine every word and
    this process's environment as they are, whatever the shell would make of them."""
    from engine.ctl.start import script
    printer = tmp_path / "printargs"
    printer.write_text(f"#!{sys.executable}\nimport json, os, sys\n"
                       "print(json.dumps([sys.argv[1:], os.environ.get('HEADROOM_ODD')]))\n")
    printer.chmod(0o755)
    monkeypatch.setenv("HEADROOM_ODD", "a'b $(touch pwned) \"c\"")
    console = tmp_path / "run x; 'q'" / "console.log"
    console.parent.mkdir()
    path = tmp_path / "start.sh"
    path.write_text(script([str(printer), *NASTY], str(console)))
    r = subprocess.run(["sh", str(path)], cwd=tmp_path, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert json.loads(console.read_text()) == [NASTY, "a'b $(touch pwned) \"c\""]
    assert json.loads(r.stdout) == [NASTY, "a'b $(touch pwned) \"c\""]  # and in the tmux pane
    assert not path.exists()  # the script removes itself
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "q").exists()
