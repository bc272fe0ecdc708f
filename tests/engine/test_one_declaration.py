"""Adding a live setting is one entry: a copy of the engine and the app with one TrainConfig
field added (and nothing else) has its flag with help, its validation, its command, the app's
field and label, and a metrics column that a real run fills. The unchanged tree, the negative
control, has none of them."""
from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys

import pytest

from testkit import ROOT, subprocess_env

pytestmark = pytest.mark.slow

ANCHOR = "    min_lr_ratio: float = setting("
TOY = ('    momentum: float = setting(0.9, OPTIMIZER, "SGD momentum (toy)", label="Momentum", live=True, '
       'per_step=True,\n                              metavar="M", low=0.0, high=1.0, high_open=True)\n')

# What a user and the app see of a setting, read the way they read it.
SURFACES = r"""
import json, sys
from engine.cli import build_parser
from engine.declarations.commands import command_for
from engine.declarations.config import ConfigError, TrainConfig
from engine.store import METRIC_COLUMNS
out = {"help": [l.strip() for l in build_parser().format_help().splitlines() if "--momentum M " in l]}
try:
    TrainConfig(momentum=1.5).validate()
except (ConfigError, TypeError) as e:
    out["refusal"] = str(e)
try:
    out["command"] = json.loads(command_for("momentum", 0.8, at="step").to_json())
except Exception as e:
    out["command"] = repr(e)
out["column"] = "momentum" in METRIC_COLUMNS
from PySide6.QtWidgets import QApplication, QLabel, QMainWindow
app = QApplication([])
from app.model.pending import PendingChanges
from app.ui.actions import RunActions
from app.ui.controls.panel import ControlsPanel
win = QMainWindow()  # the actions' parent, kept
panel = ControlsPanel(RunActions(win), PendingChanges())
out["field"] = getattr(panel.live, "momentum", None) is not None
out["label"] = [l.text() for l in panel.findChildren(QLabel) if l.text().startswith("Momentum")]
print(json.dumps(out))
"""


def tree(tmp_path, with_toy: bool):
    dst = tmp_path / ("toy" if with_toy else "plain")
    for part in ("engine", "app", "resources"):
        shutil.copytree(ROOT / part, dst / part, ignore=shutil.ignore_patterns("__pycache__"))
    if with_toy:
        cfg = dst / "engine" / "declarations" / "config.py"
        text = cfg.read_text()
        assert text.count(ANCHOR) == 1
        cfg.write_text(text.replace(ANCHOR, TOY + ANCHOR))
    return dst


def run_in(root, *args):
    return subprocess.run([sys.executable, *args], cwd=root, env=subprocess_env({"PYTHONPATH": str(root)}),
                          capture_output=True, text=True, timeout=300)


def test_a_setting_declared_in_one_place_has_every_surface(tmp_path):
    root = tree(tmp_path, with_toy=True)
    r = run_in(root, "-c", SURFACES)
    assert r.returncode == 0, r.stderr[-2000:]
    seen = json.loads(r.stdout.strip().splitlines()[-1])
    assert seen["help"] == ["--momentum M          SGD momentum (toy) (default 0.9)"]
    assert seen["refusal"] == "--momentum must be a number in [0, 1), got 1.5"
    assert seen["command"] == {"at": "step", "momentum": 0.8}
    assert seen["column"] and seen["field"] and seen["label"] == ["Momentum"]
    bad = run_in(root, "-m", "engine", "--momentum", "2")
    assert (bad.returncode, bad.stderr.strip()) == (2, "error: --momentum must be a number in [0, 1), got 2.0")
    run_dir = tmp_path / "run"
    ok = run_in(root, "-m", "engine", "--task", "mlp", "--max-steps", "2", "--momentum", "0.5", "--run-dir",
                str(run_dir))
    assert ok.returncode == 0, ok.stderr[-2000:]
    with sqlite3.connect(run_dir / "run.db") as db:
        assert db.execute("SELECT step, momentum FROM metrics ORDER BY step").fetchall() == [(1, 0.5), (2, 0.5)]


def test_negative_control_the_unchanged_tree_has_no_such_setting(tmp_path):
    root = tree(tmp_path, with_toy=False)
    r = run_in(root, "-c", SURFACES)
    assert r.returncode == 0, r.stderr[-2000:]
    seen = json.loads(r.stdout.strip().splitlines()[-1])
    assert seen["help"] == [] and "unexpected keyword" in seen["refusal"]
    assert not seen["column"] and not seen["field"] and seen["label"] == []
    assert run_in(root, "-m", "engine", "--momentum", "2").returncode == 2
