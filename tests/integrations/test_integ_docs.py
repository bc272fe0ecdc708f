"""Documentation that runs: the shipped Hugging Face task file and the README's nanoGPT-style loop,
each run as written, in a subprocess."""
from __future__ import annotations

import importlib.util
import math
import os
import re
import subprocess
import sys

import pytest
from integ_helpers import ROOT

from engine.store import RunReader
from testkit import run_cli, subprocess_env

pytestmark = pytest.mark.slow  # a subprocess each, importing torch (and transformers)


def _the_run(runs) -> str:
    [name] = os.listdir(runs)
    return os.path.join(runs, name)


def test_hf_causal_lm_task_file_runs_as_written(tmp_path):
    pytest.importorskip("transformers", reason="the 'hf' extra is not installed")
    r = run_cli("engine", "--task", "resources/hf_causal_lm_task.py", "--epochs", "1", cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    reader = RunReader(_the_run(tmp_path / "runs"))  # HEADROOM_RUNS: tests/conftest.py
    rows = reader.metrics()
    assert rows and all(math.isfinite(x["loss"]) for x in rows)
    assert reader.info()["status"] == "finished" and reader.epochs()[0]["val_loss"] is not None
    # The loss counts the shifted labels: each sample's tokens but its first.
    spec = importlib.util.spec_from_file_location("hf_task", os.path.join(ROOT, "resources", "hf_causal_lm_task.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    data = mod.build_task(0).train_data
    assert sum(x["tokens"] for x in rows) == sum(len(data[i]["input_ids"]) - 1 for i in range(len(data)))


def test_readme_nanogpt_style_loop_runs_as_printed(tmp_path):
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    [example] = [b for b in re.findall(r"```python\n(.*?)```", readme, flags=re.S) if "run.lr_scale" in b]
    assert "with headroom_run" not in example and "run.close()" in example  # the form that does not re-indent
    (tmp_path / "nano.py").write_text(example)
    r = subprocess.run([sys.executable, "nano.py"], cwd=tmp_path, env=subprocess_env(None), capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    reader = RunReader(_the_run(tmp_path / "runs"))
    rows = reader.metrics()
    assert len(rows) == 60 and [e["step"] for e in reader.epochs()] == [20, 40, 60]
    assert rows[0]["lr"] == pytest.approx(6e-4 / 11) and max(x["lr"] for x in rows) == pytest.approx(6e-4)
    assert reader.info()["status"] == "finished"
