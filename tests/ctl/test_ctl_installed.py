"""`headroom-ctl` from a source install: pip installs this tree (a copy of it, so nothing is
built in the checkout), and the console script pyproject.toml declares runs, with nothing of the
source tree on the path."""
from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys

import pytest
from ctlkit import records, written_run

from testkit import ROOT

pytestmark = pytest.mark.slow


def test_the_installed_console_script_runs(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for name in ("engine", "app", "resources"):
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    prefix = tmp_path / "installed"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                        "--no-index", "--prefix", str(prefix), str(src)], cwd=tmp_path, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    script = prefix / "bin" / "headroom-ctl"
    assert script.is_file() and os.access(script, os.X_OK)
    (site,) = glob.glob(str(prefix / "lib" / "python*" / "site-packages"))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run_dir = written_run(str(tmp_path / "runs" / "exp1"), 5)
    r = subprocess.run([str(script), "runs", str(tmp_path / "runs"), "--json"], cwd=tmp_path,
                       env=dict(env, PYTHONPATH=site), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    hello, run = records(r.stdout)
    assert hello["kind"] == "hello" and (run["path"], run["step"], run["status"]) == (run_dir, 5, "finished")
    r = subprocess.run([str(script), "status", run_dir, "--no-such-flag"], cwd=tmp_path,
                       env=dict(env, PYTHONPATH=site), capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.startswith("error: ") and "Traceback" not in r.stderr
    probe = subprocess.run([sys.executable, "-c", "import engine.ctl, sys; print(engine.ctl.__file__)"], cwd=tmp_path,
                           env=dict(env, PYTHONPATH=site), capture_output=True, text=True, timeout=60)
    assert probe.stdout.startswith(site)  # the installed copy ran, not this checkout
