"""--task-arg KEY=VALUE: passed as build_task(seed, **task_args), values read as JSON literals
where they parse, stored in the run so --resume rebuilds the same task; bad names are bad input."""
from __future__ import annotations

import json
import textwrap

import pytest

from engine.declarations.config import ConfigError, TrainConfig, parse_task_arg
from engine.store import RunReader
from engine.tasks.loader import load_task
from engine_in_process import engine
from testkit import run_engine

TASK = textwrap.dedent("""
    import json, os, torch
    import torch.nn.functional as F
    from engine import Task

    def loss(model, batch):
        x, y = batch
        return F.cross_entropy(model(x), y, reduction="sum"), len(y)

    def build_task(seed, hidden=4, n=32, tag="none", layers=(1,), record=None):
        if record:
            with open(record, "a") as f:
                f.write(json.dumps(dict(hidden=hidden, n=n, tag=tag, layers=list(layers))) + "\\n")
        torch.manual_seed(seed)
        x = torch.randn(n, 3)
        model = torch.nn.Sequential(torch.nn.Linear(3, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 2))
        return Task(model=model, train_data=torch.utils.data.TensorDataset(x, (x[:, 0] > 0).long()), loss=loss)
""")


def cli(*args):
    """The command line through engine.cli.main in this process (the subject is what a run does
    with its task args, not the process: a new interpreter costs ~6 s of CPU a run)."""
    return engine(*args)


@pytest.mark.parametrize("text,key,value", [
    ("hidden=8", "hidden", 8), ("lr_mult=0.5", "lr_mult", 0.5), ("flag=true", "flag", True),
    ("layers=[2, 3]", "layers", [2, 3]), ("tag=hello", "tag", "hello"), ('tag="7"', "tag", "7"),
    ("path=/tmp/x=y", "path", "/tmp/x=y"), ("empty=", "empty", ""),
])
def test_values_are_json_literals_where_they_parse(text, key, value):
    assert parse_task_arg(text) == (key, value)


@pytest.mark.parametrize("text", ["novalue", "=3", "bad key=1", "seed=3", "1x=2"])
def test_bad_task_args_are_refused(text):
    with pytest.raises(ConfigError):
        parse_task_arg(text)


@pytest.mark.slow
def test_cli_resume_and_refusals(tmp_path):
    task = tmp_path / "t.py"
    task.write_text(TASK)
    record = tmp_path / "record.jsonl"
    run_dir = tmp_path / "run"
    r = cli("--task", str(task), "--task-arg", "hidden=16", "--task-arg", "tag=wide", "--task-arg", "layers=[2,2]",
            "--task-arg", f"record={record}", "--epochs", "1", "--micro-batch", "4", "--accum", "2",
            "--device", "cpu", "--run-dir", str(run_dir))
    assert r.returncode == 0, r.stderr
    built = [json.loads(line) for line in record.read_text().splitlines()]
    assert built[-1] == dict(hidden=16, n=32, tag="wide", layers=[2, 2])
    cfg = RunReader(str(run_dir)).info()["config"]
    assert cfg["task_args"]["hidden"] == 16 and cfg["task_args"]["tag"] == "wide"
    # --resume rebuilds the same task: the checkpoint's 16-wide weights load into it.
    r = cli("--resume", str(run_dir), "--epochs", "2")
    assert r.returncode == 0, r.stderr
    assert json.loads(record.read_text().splitlines()[-1])["hidden"] == 16
    # A name build_task does not take: one line, exit 2, nothing written.
    r = cli("--task", str(task), "--task-arg", "width=3", "--device", "cpu", "--run-dir", str(tmp_path / "no"))
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "'width'" in r.stderr and "hidden" in r.stderr
    assert not (tmp_path / "no").exists()
    # The parser's refusal, as a real process (it exits before torch loads: ~0.3 s).
    r = run_engine("--task", str(task), "--task-arg", "novalue", "--device", "cpu", timeout=120)
    assert r.returncode == 2 and r.stderr.startswith("error: ") and "KEY=VALUE" in r.stderr


def test_the_trainer_passes_them_to_build_task(tmp_path):
    task = tmp_path / "t2.py"
    task.write_text(TASK)
    t = load_task(str(task), 0, {"hidden": 6})
    assert t.model[0].out_features == 6
    cfg = TrainConfig(task=str(task), task_args={"hidden": 5}, device="cpu", max_steps=1, micro_batch=4, accum=1,
                      run_dir=str(tmp_path / "r"))
    from engine.trainer.trainer import Trainer
    tr = Trainer(cfg)
    tr.run()
    assert tr.model[0].out_features == 5
    with pytest.raises(ConfigError):
        TrainConfig(task_args={"a b": 1}).validate()
