"""Every command in the README runs, here or in CI, so none rots.

`make test` is CI itself, `make package` / `make install-desktop` are run by
tests/packaging; this file runs the rest (GPU-only and multi-node lines are checked
against the CLI's parser, since this machine has neither). The headless demo runs as the
real command line; the other engine lines through engine.cli.main in this process (the same
code after argv, without a new interpreter's ~6 s of CPU each: see in_process).
"""
from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import subprocess
import sys
from typing import Any

import pytest

from engine.cli import build_parser
from engine.store import RunReader
from engine_in_process import engine, frozen_heap
from testkit import ROOT

README = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
VENV_PY = os.path.join(ROOT, ".venv", "bin", "python")
PY = VENV_PY if os.path.exists(VENV_PY) else sys.executable


def blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README, flags=re.S)


def shell_lines() -> list[str]:
    lines = []
    for block in blocks("sh"):
        joined = block.replace("\\\n", " ")
        lines += [l.split("#")[0].strip() for l in joined.splitlines() if l.strip() and not l.strip().startswith("#")]
    return [l for l in lines if l]


def engine_args(line: str) -> list[str]:
    words = shlex.split(line)
    i = words.index("engine")
    return words[i + 1:]


def run(args: list[str], timeout: int = 300, **kw) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(args, cwd=kw.pop("cwd", ROOT), env=env, capture_output=True, text=True, timeout=timeout, **kw)


def in_process(args: list[str], cwd: Any = ROOT) -> subprocess.CompletedProcess:
    """`python -m engine args...` in `cwd`, through engine.cli.main in this process."""
    with frozen_heap():  # one torch thread already: tests/conftest.py
        return engine(*args, cwd=cwd)


def test_two_commands_are_make_targets():
    assert "make run" in README and "make test" in README
    make = run(["make", "-n", "run"])
    assert make.returncode == 0 and "-m app --task mlp" in make.stdout and "--autostart" in make.stdout
    ci = open(os.path.join(ROOT, ".ci", "run")).read()
    assert "make test" in ci


def test_every_engine_command_line_parses():
    lines = [l for l in shell_lines() if " -m engine" in l]
    lines += re.findall(r"`((?:\.venv/bin/python|python|torchrun)[^`]*-m engine[^`]*)`", README)
    assert len(lines) >= 5
    parser = build_parser()
    for line in lines:
        args = [a for a in engine_args(line) if a != "[flags]"]
        parser.parse_args(args)  # raises (ConfigError) on an unknown or malformed flag


def test_every_headroom_ctl_line_parses():
    from engine.ctl.cli import parser, split_engine_flags
    lines = [l for l in shell_lines() if l.startswith("headroom-ctl ")]
    assert len(lines) >= 5
    for line in lines:
        args, engine_flags = split_engine_flags(shlex.split(line)[1:])  # start ... -- ENGINE_FLAGS
        parser().parse_args(args)  # raises CtlError on an unknown command or flag
        if engine_flags is not None:
            build_parser().parse_args(engine_flags)  # the engine's flags, by the engine's parser


def test_flag_table_matches_the_cli():
    """The table names every flag of the parser (but the old spellings, said below it) and no other."""
    table = re.search(r"```\n(python -m engine \[flags\].*?)```", README, flags=re.S).group(1)
    flags = set(re.findall(r"--[a-z][a-z-]+", table))
    parser = build_parser()
    known = {a for action in parser._actions for a in action.option_strings}
    old = {a for g in parser._action_groups if g.title.startswith("Old spellings") for x in g._group_actions
           for a in x.option_strings}
    assert flags <= known, flags - known
    assert known - old - {"-h", "--help"} <= flags, known - old - flags
    for flag in old:  # each old spelling is explained next to the table
        assert f"`{flag} " in README or f"`{flag}`" in README, flag


@pytest.mark.slow
def test_headless_demo(tmp_path):
    # `make demo-headless` runs exactly this (checked below), into the default runs folder.
    r = run([PY, "-m", "engine", "--task", "mlp", "--epochs", "2", "--run-dir", str(tmp_path / "demo")])
    assert r.returncode == 0, r.stderr
    assert "make demo-headless" in README
    assert "-m engine --task mlp --epochs 2" in open(os.path.join(ROOT, "Makefile")).read()
    assert len(RunReader(str(tmp_path / "demo")).metrics()) == 128


@pytest.mark.slow
def test_task_file_example_trains(tmp_path):
    example = next(b for b in blocks("python") if "def build_task" in b)
    path = tmp_path / "my_task.py"
    path.write_text(example)
    r = in_process(["--task", str(path), "--epochs", "1", "--run-dir", str(tmp_path / "run")])
    assert r.returncode == 0, r.stderr
    assert RunReader(str(tmp_path / "run")).metrics()


@pytest.mark.slow
def test_ssh_example_command_and_resume(tmp_path):
    line = next(l for l in shell_lines() if "path/to/my_task.py" in l and "--run-dir runs/exp1" in l)
    example = next(b for b in blocks("python") if "def build_task" in b)
    (tmp_path / "path" / "to").mkdir(parents=True)
    (tmp_path / "path" / "to" / "my_task.py").write_text(example)
    args = engine_args(line) + ["--epochs", "1"]
    r = in_process(args, cwd=tmp_path)  # its relative paths: from the folder it is typed in
    assert r.returncode == 0, r.stderr
    r = in_process(["--resume", "runs/exp1", "--epochs", "2"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert RunReader(str(tmp_path / "runs" / "exp1")).epochs()[-1]["epoch"] == 2


@pytest.mark.ddp
def test_cpu_torchrun_line_runs(tmp_path):
    line = re.search(r"`(torchrun --standalone --nproc-per-node 2 -m engine[^`]*--device cpu)`", README).group(1)
    words = shlex.split(line)
    cmd = [PY, "-m", "torch.distributed.run"] + words[1:] + ["--max-steps", "3", "--run-dir", str(tmp_path / "ddp")]
    r = run(cmd, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    info = RunReader(str(tmp_path / "ddp")).info()
    assert info["world_size"] == 2 and info["backend"] == "gloo"


@pytest.mark.slow
def test_nvml_status_line_runs():
    line = re.search(r'`\.venv/bin/python -c "(from engine.memory.telemetry import nvml_status[^"]*)"`', README).group(1)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(line, "<README>", "exec"), {})  # what `python -c` runs; raises if the line fails
    assert out.getvalue().strip()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_find_micro_batch_line_parses_and_runs(tmp_path):
    line = next(l for l in re.findall(r"`(\.venv/bin/python -m engine[^`]*--find-micro-batch[^`]*)`", README))
    args = engine_args(line)
    r = in_process([*args, "--max-steps", "2", "--run-dir", str(tmp_path / "f")])
    assert r.returncode == 0, r.stderr
    found = RunReader(str(tmp_path / "f")).events(kinds={"micro_batch_found"})
    assert len(found) == 1
