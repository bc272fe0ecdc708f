"""`python -m engine`: a bad input exits 2 with exactly one `error: ...` line on stderr, no
traceback and nothing written; a good run with --json prints one JSON event per line and
fills run.db with one metrics row per step."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from engine_helpers import ROOT

from engine.store import RunReader
from engine_in_process import engine

TASK_FILES = {
    "good.py": """
        import torch
        from engine import Task

        def build_task(seed):
            torch.manual_seed(seed)
            g = torch.Generator().manual_seed(seed)
            x = torch.randn(64, 8, generator=g)
            y = (x.sum(1) > 0).long()
            data = list(zip(x, y))

            def loss(model, batch):
                xb, yb = batch
                return torch.nn.functional.cross_entropy(model(xb), yb, reduction="sum"), len(yb)

            return Task(model=torch.nn.Linear(8, 2), train_data=data, val_data=data[:16], loss=loss)
    """,
    "syntax.py": "def build_task(seed):\n    return (\n",
    "nobuild.py": "x = 1\n",
    "raises.py": "raise RuntimeError('boom at import')\n",
    "exits.py": "import sys\nsys.exit(3)\n",
    "buildraises.py": "def build_task(seed):\n    raise ValueError('no data')\n",
    "wrongtype.py": "def build_task(seed):\n    return 42\n",
    "notcallable.py": "build_task = 3\n",
}

# name: (arguments, a word the one error line must contain). {tasks} is the task-file folder,
# {case} the case's own folder (the current directory of the run).
BAD = {
    "unknown_task": (["--task", "nosuchtask"], "unknown task"),
    "missing_task_file": (["--task", "{tasks}/missing.py"], "no such file"),
    "syntax_error_file": (["--task", "{tasks}/syntax.py"], "syntax error"),
    "no_build_task": (["--task", "{tasks}/nobuild.py"], "build_task"),
    "build_task_not_callable": (["--task", "{tasks}/notcallable.py"], "build_task"),
    "import_raises": (["--task", "{tasks}/raises.py"], "boom at import"),
    "import_exits": (["--task", "{tasks}/exits.py"], "SystemExit"),
    "build_task_raises": (["--task", "{tasks}/buildraises.py"], "no data"),
    "build_task_wrong_type": (["--task", "{tasks}/wrongtype.py"], "engine.Task"),
    "unknown_module": (["--task", "no_such_module_xyz:build_task"], "cannot import"),
    "unknown_attr": (["--task", "engine.tasks.builtin.mlp:no_such_attr"], "no_such_attr"),
    "accum_0": (["--accum", "0"], "--accum"),
    "accum_not_int": (["--accum", "two"], "--accum"),
    "micro_batch_0": (["--micro-batch", "0"], "--micro-batch"),
    "micro_batch_negative": (["--micro-batch", "-4"], "--micro-batch"),
    "micro_batch_larger_than_data": (["--task", "{tasks}/good.py", "--micro-batch", "65"], "larger than the data"),
    "lr_negative": (["--lr", "-1"], "--lr"),
    "lr_nan": (["--lr", "nan"], "--lr"),
    "lr_inf": (["--lr", "inf"], "--lr"),
    "lr_text": (["--lr", "fast"], "--lr"),
    "clip_negative": (["--clip", "-1"], "--clip"),
    "clip_inf": (["--clip", "inf"], "--clip"),
    "clip_nan": (["--clip", "nan"], "--clip"),
    "epochs_0": (["--epochs", "0"], "--epochs"),
    "max_steps_0": (["--max-steps", "0"], "--max-steps"),
    "unknown_device": (["--device", "tpu"], "--device"),
    "bad_cuda_index": (["--device", "cuda:x"], "--device"),
    "unknown_optimizer": (["--optimizer", "lion"], "--optimizer"),
    "unknown_precision": (["--precision", "fp8"], "--precision"),
    "unknown_nonfinite": (["--nonfinite", "ignore"], "--nonfinite"),
    "unknown_flag": (["--no-such-flag"], "--no-such-flag"),
    "positional_junk": (["extra"], "extra"),
    "token_budget_without_sample_length": (["--task", "{tasks}/good.py", "--token-budget", "10"], "sample_length"),
    "token_budget_0": (["--token-budget", "0"], "--token-budget"),
    "find_micro_batch_without_effective_batch": (["--find-micro-batch"], "--effective-batch"),
    "memory_margin_1": (["--memory-margin", "1"], "--memory-margin"),
    "vram_limit_unreadable": (["--vram-limit", "lots"], "vram-limit"),
    "oom_recovery_maybe": (["--oom-recovery", "maybe"], "oom-recovery"),
    "seed_negative": (["--seed", "-1"], "--seed"),
    "keep_epoch_checkpoints_0": (["--keep-epoch-checkpoints", "0"], "--keep-epoch-checkpoints"),
    "keep_epoch_checkpoints_text": (["--keep-epoch-checkpoints", "banana"], "whole number or all"),
    "run_dir_under_a_file": (["--task", "{tasks}/good.py", "--run-dir", "{case}/afile/run"], "not writable"),
    # The first folder can be made, the next cannot: what was made is removed again.
    "run_dir_name_too_long": (["--task", "{tasks}/good.py", "--run-dir", "{case}/new/" + "x" * 300], "not writable"),
    "run_dir_is_a_file": (["--task", "{tasks}/good.py", "--run-dir", "{case}/afile"], "not a folder"),
    "run_dir_holds_a_run": (["--task", "{tasks}/good.py", "--run-dir", "{case}/oldrun"], "already holds a run"),
    "resume_not_a_run": (["--resume", "{case}/nothing"], "not a run folder"),
    "resume_a_file": (["--resume", "{case}/afile"], "not a run folder"),
}
if not torch.cuda.is_available():
    BAD["cuda_without_gpu"] = (["--task", "{tasks}/good.py", "--device", "cuda"], "CUDA")
    BAD["vram_limit_on_cpu"] = (["--task", "{tasks}/good.py", "--vram-limit", "24GiB", "--device", "cpu"], "CUDA")


def tree(folder) -> dict[str, bytes]:
    out = {}
    for base, dirs, files in os.walk(folder):
        for d in dirs:
            out[os.path.relpath(os.path.join(base, d), folder) + "/"] = b""
        for f in files:
            path = os.path.join(base, f)
            with open(path, "rb") as fh:
                out[os.path.relpath(path, folder)] = fh.read()
    return out


def env_for(case_dir) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HEADROOM", "PYTEST"))}
    env.update(PYTHONPATH=str(ROOT), HEADROOM_RUNS=str(case_dir / "runs"), PYTHONDONTWRITEBYTECODE="1",
               CUDA_VISIBLE_DEVICES=env.get("CUDA_VISIBLE_DEVICES", ""))
    if torch.cuda.is_available():
        env.pop("CUDA_VISIBLE_DEVICES")
    return env


@pytest.fixture(scope="module")
def tasks_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("tasks")
    for name, text in TASK_FILES.items():
        (d / name).write_text(textwrap.dedent(text))
    return d


# A case refused by the flags' parser costs ~0.3 s of CPU as a process; one that gets as far as
# loading torch (every task and run-folder case) ~6 s. The parser's cases and one that loads
# torch (unknown_task: its import prints nothing either) run as real processes; the other torch
# cases through engine.cli.main in this process (the same code after argv).
IN_PROCESS = {"missing_task_file", "syntax_error_file", "no_build_task", "build_task_not_callable",
              "import_raises", "import_exits", "build_task_raises", "build_task_wrong_type", "unknown_module",
              "unknown_attr", "micro_batch_larger_than_data", "token_budget_without_sample_length",
              "run_dir_under_a_file", "run_dir_is_a_file", "run_dir_name_too_long", "run_dir_holds_a_run",
              "vram_limit_on_cpu", "cuda_without_gpu"}


def prepare_case(root, name, tasks_dir):
    case = root / name
    case.mkdir()
    (case / "afile").write_text("not a folder\n")
    (case / "oldrun").mkdir()
    (case / "oldrun" / "run.db").write_bytes(b"")
    args = [a.format(tasks=tasks_dir, case=case) for a in BAD[name][0]]
    if not any(a in ("--run-dir", "--resume") for a in args):
        args += ["--run-dir", str(case / "run")]
    return case, args


@pytest.fixture(scope="module")
def bad_runs(tmp_path_factory, tasks_dir):
    """The subprocess cases, three at a time."""
    from concurrent.futures import ThreadPoolExecutor
    root = tmp_path_factory.mktemp("bad")

    def one(name):
        case, args = prepare_case(root, name, tasks_dir)
        before = tree(case)
        p = subprocess.run([sys.executable, "-m", "engine", *args], cwd=case, env=env_for(case),
                           capture_output=True, text=True, timeout=240)
        return name, (p.returncode, p.stdout, p.stderr, before, tree(case))

    with ThreadPoolExecutor(max_workers=3) as pool:
        return dict(pool.map(one, [n for n in BAD if n not in IN_PROCESS]))


def check_bad(name, rc, stdout, stderr, before, after):
    lines = stderr.splitlines()
    assert rc == 2, stderr
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    assert BAD[name][1].lower() in lines[0].lower(), lines[0]
    assert "Traceback" not in stderr and "usage:" not in stderr
    assert stdout == ""
    assert after == before  # no run folder, no default-runs folder, nothing touched


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in BAD if n not in IN_PROCESS])
def test_bad_input_exits_2_with_one_error_line(bad_runs, name):
    check_bad(name, *bad_runs[name])


@pytest.mark.parametrize("name", sorted(IN_PROCESS & set(BAD)))
def test_bad_input_in_process(tmp_path, tasks_dir, monkeypatch, capsys, name):
    from engine.cli import main
    case, args = prepare_case(tmp_path, name, tasks_dir)
    monkeypatch.chdir(case)
    monkeypatch.setenv("HEADROOM_RUNS", str(case / "runs"))
    before = tree(case)
    rc = main(args)
    out, err = capsys.readouterr()
    check_bad(name, rc, out, err, before, tree(case))


def run_cli(args, cwd, timeout=240):
    return subprocess.run([sys.executable, "-m", "engine", *args], cwd=cwd, env=env_for(cwd), capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.slow
def test_json_run_happy_path(tmp_path, tasks_dir):
    run_dir = tmp_path / "run"
    p = run_cli(["--task", str(tasks_dir / "good.py"), "--micro-batch", "4", "--accum", "2", "--epochs", "2",
                 "--optimizer", "sgd", "--lr", "0.05", "--json", "--run-dir", str(run_dir), "--device", "cpu"],
                tmp_path)
    assert p.returncode == 0, p.stderr
    events = [json.loads(line) for line in p.stdout.splitlines()]  # every line is one JSON object
    assert events and all(isinstance(e, dict) and "kind" in e for e in events)
    kinds = [e["kind"] for e in events]
    assert kinds[0] == "run_started" and kinds[-1] == "run_finished"
    assert {"step", "epoch_end", "checkpoint"} <= set(kinds)
    steps = [e for e in events if e["kind"] == "step"]
    assert [e["step"] for e in steps] == list(range(1, 17))  # 64 samples / (4 x 2) x 2 epochs
    assert all(e["accum"] == 2 and e["micro_batch"] == 4 and e["samples"] == 8 for e in steps)
    assert [e["epoch"] for e in events if e["kind"] == "epoch_end"] == [1, 2]
    assert events[-1]["reason"] == "completed" and events[-1]["step"] == 16
    reader = RunReader(str(run_dir))
    rows = reader.metrics()
    assert len(rows) == 16 and [r["step"] for r in rows] == list(range(1, 17))
    assert [r["loss"] for r in rows] == [e["loss"] for e in steps]
    assert reader.info()["status"] == "finished"
    db_kinds = [e["kind"] for e in reader.events()]
    assert db_kinds[0] == "run_started" and db_kinds[-1] == "run_finished"
    assert sorted(os.listdir(run_dir / "checkpoints")) == ["epoch-1.pt", "epoch-2.pt", "last.pt"]
    assert not (tmp_path / "runs").exists()  # --run-dir was honoured


@pytest.mark.slow
def test_cli_resume_continues_the_run(tmp_path, tasks_dir):
    """A run stopped by --max-steps, resumed with only --resume DIR, trains on to the end of its
    saved epochs (the old --max-steps is not a limit for the continuation), one row per step,
    with the losses of an uninterrupted run of the same task."""
    from engine.declarations.config import TrainConfig
    from engine.tasks.loader import load_task
    from engine.trainer.trainer import Trainer
    # The first part as the CLI would configure it; the continuation through the CLI's main (both in
    # this process: test_json_run_happy_path runs the real command line).
    cfg = TrainConfig(task=str(tasks_dir / "good.py"), micro_batch=4, accum=2, epochs=2, device="cpu")
    first = Trainer(cfg.with_(run_dir=str(tmp_path / "part"), max_steps=5), task=load_task(cfg.task)).run()
    assert first.reason == "max_steps" and first.steps == 5
    rows_before = RunReader(str(tmp_path / "part")).metrics()
    second = engine("--resume", tmp_path / "part", "--json", cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    events = [json.loads(line) for line in second.stdout.splitlines()]
    assert events[0]["kind"] == "run_started" and events[0]["resumed"] is True
    assert events[-1]["kind"] == "run_finished" and events[-1]["reason"] == "completed"
    assert events[-1]["step"] == 16
    assert [e["step"] for e in events if e["kind"] == "step"] == list(range(6, 17))
    rows = RunReader(str(tmp_path / "part")).metrics()
    assert [r["step"] for r in rows] == list(range(1, 17))
    assert rows[:5] == rows_before
    # The same task trained without a break, in this process.
    full = Trainer(cfg.with_(run_dir=str(tmp_path / "full")), task=load_task(cfg.task)).run()
    assert [r["loss"] for r in rows] == pytest.approx(full.losses, rel=1e-6)
