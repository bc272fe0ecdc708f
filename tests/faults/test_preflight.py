"""Bad task files are bad input, always (issue 12): what step 0 needs is checked before the run
folder exists; task code that exits or raises KeyboardInterrupt mid-run ends with one line.
The engine's command line runs in this process (engine.cli.main; what is checked is its exit
code and stderr, not the process)."""
from __future__ import annotations

import textwrap

import pytest

from engine_in_process import engine

HEAD = """
import sys, torch
import torch.nn.functional as F
from engine import Task

class Data(torch.utils.data.Dataset):
    def __init__(self, n=64):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 4, generator=g)
        self.y = (self.x[:, 0] > 0).long()
    def __len__(self):
        return len(self.x)
    def __getitem__(self, i):
        return self.x[i], self.y[i]

def loss(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y, reduction="sum"), len(y)
"""

CASES = {
    "detached_loss": ("""
def build_task(seed):
    def bad(model, batch):
        s, n = loss(model, batch)
        return s.detach(), n
    return Task(model=torch.nn.Linear(4, 2), train_data=Data(), loss=bad)
""", "no gradient"),
    "optimizer_raises": ("""
def build_task(seed):
    def opt(params, lr):
        raise ValueError("no such optimizer")
    return Task(model=torch.nn.Linear(4, 2), train_data=Data(), loss=loss, optimizer=opt)
""", "optimizer(params, lr) failed"),
    "optimizer_not_an_optimizer": ("""
def build_task(seed):
    return Task(model=torch.nn.Linear(4, 2), train_data=Data(), loss=loss, optimizer=lambda p, lr: 42)
""", "must return a torch.optim.Optimizer"),
    "sample_length_raises": ("""
def build_task(seed):
    def length(sample):
        raise KeyError("tokens")
    return Task(model=torch.nn.Linear(4, 2), train_data=Data(), loss=loss, sample_length=length)
""", "sample_length(sample) failed"),
    "len_minus_one": ("""
class Neg(Data):
    def __len__(self):
        return -1
def build_task(seed):
    return Task(model=torch.nn.Linear(4, 2), train_data=Neg(), loss=loss)
""", "len(train_data) failed"),
    "len_float": ("""
class Half(Data):
    def __len__(self):
        return 2.5
def build_task(seed):
    return Task(model=torch.nn.Linear(4, 2), train_data=Half(), loss=loss)
""", "len(train_data) failed"),
    "len_raises": ("""
class Broken(Data):
    def __len__(self):
        raise OSError("index file missing")
def build_task(seed):
    return Task(model=torch.nn.Linear(4, 2), train_data=Broken(), loss=loss)
""", "index file missing"),
    "meta_model": ("""
def build_task(seed):
    with torch.device("meta"):
        model = torch.nn.Linear(4, 2)
    return Task(model=model, train_data=Data(), loss=loss)
""", "meta device"),
    "message_with_newlines": ("""
def build_task(seed):
    raise RuntimeError("first line\\nsecond line\\n\\tthird")
""", "first line second line third"),
}


def cli(tmp_path, body, *extra):
    f = tmp_path / "task.py"
    f.write_text(HEAD + textwrap.dedent(body))
    return engine("--task", f, "--device", "cpu", "--micro-batch", "4", "--accum", "2", "--epochs", "1",
                  "--run-dir", tmp_path / "run", *extra)


@pytest.mark.parametrize("case", list(CASES))
def test_bad_task_is_one_line_exit_2_and_nothing_written(tmp_path, case):
    body, words = CASES[case]
    extra = ("--token-budget", "8") if case == "sample_length_raises" else ()
    r = cli(tmp_path, body, *extra)
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("error: ") and "Traceback" not in r.stderr
    assert words in r.stderr, r.stderr
    assert not (tmp_path / "run").exists()


MID_RUN = """
calls = {"n": 0}
def build_task(seed):
    def flaky(model, batch):
        calls["n"] += 1
        if calls["n"] == 6:
            WHAT
        return loss(model, batch)
    return Task(model=torch.nn.Linear(4, 2), train_data=Data(), loss=flaky)
"""


@pytest.mark.slow  # trains (in this process)
@pytest.mark.parametrize("what,code,words", [
    ("sys.exit(3)", 1, "sys.exit(3)"),
    ("raise KeyboardInterrupt()", 130, "interrupted"),
])
def test_task_code_that_exits_mid_run_ends_with_one_line(tmp_path, what, code, words):
    r = cli(tmp_path, MID_RUN.replace("WHAT", what))
    assert r.returncode == code, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("error: ")]
    assert len(lines) == 1 and words in lines[0] and "Traceback" not in r.stderr, r.stderr
    from engine.store import RunReader
    reader = RunReader(str(tmp_path / "run"))
    assert len(reader.metrics()) >= 2 and reader.events(kinds={"run_failed"})
