"""The layers hold: import-linter's contracts in pyproject.toml pass on the real tree, and a
copy of the tree with one forbidden import added breaks them (the check can fail)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from testkit import ROOT

LINT = os.path.join(os.path.dirname(sys.executable), "lint-imports")

pytestmark = pytest.mark.skipif(not os.path.exists(LINT), reason="import-linter is not installed (pip install -e .[dev])")


def lint(root: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=root)
    return subprocess.run([LINT, "--no-cache"], cwd=root, env=env, capture_output=True, text=True, timeout=240)


def test_contracts_are_kept():
    r = lint(str(ROOT))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "0 broken" in r.stdout


def copy_tree(dst) -> str:
    for name in ("engine", "app"):
        shutil.copytree(os.path.join(ROOT, name), os.path.join(dst, name),
                        ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(os.path.join(ROOT, "pyproject.toml"), dst)
    return str(dst)


@pytest.mark.parametrize("module,line,contract", [
    ("engine/store/_run_store.py", "import torch", "torch-free"),
    ("engine/memory/what_fits/levers.py", "import numpy", "torch-free"),
    ("engine/declarations/rules.py", "import torch", "torch-free"),
    ("engine/ctl/follow.py", "import torch", "headroom-ctl is torch-free"),
    ("engine/ctl/remote.py", "import engine.trainer.trainer", "headroom-ctl is torch-free"),
    ("engine/ctl/start.py", "import engine.cli", "headroom-ctl is torch-free"),  # no exception for start
    ("app/session/sources.py", "import engine.ctl.remote", "only through its client API"),
    ("app/ui/shell/dialogs.py", "from engine.ctl.protocol import CtlError", "only through its client API"),
    ("app/main.py", "import engine.cli", "only through its client API"),
    ("engine/declarations/config.py", "import PySide6", "never imports the app"),
    ("engine/checkpoints/files.py", "import engine.trainer.trainer", "engine's packages"),
    ("engine/accumulation/step.py", "import engine.accumulation.accumulate", "no import cycles"),
    ("engine/trainer/report.py", "import engine.store._writer", "private module"),
    ("app/model/pending.py", "import app.ui.plots.panel", "app's layers"),
    ("app/model/x_axis.py", "import PySide6.QtCore", "Qt-free"),
    ("app/session/session.py", "import PySide6.QtCore", "Qt-free"),
    ("app/session/rundb.py", "import PySide6.QtCore", "Qt-free"),  # the whole package, not a hand-kept list
    ("app/session/sources.py", "import app.runner.worker", "app's layers"),
    ("app/ui/plots/build.py", "import app.ui.plots.panel", "plot panel's modules"),  # the cycle PlotPanel had
])
def test_a_forbidden_import_breaks_a_contract(tmp_path, module, line, contract):
    root = copy_tree(tmp_path)
    path = os.path.join(root, module)
    with open(path, "a") as f:
        f.write(f"\n{line}  # added by the test\n")
    r = lint(root)
    assert r.returncode != 0
    broken = [ln for ln in r.stdout.splitlines() if "BROKEN" in ln]  # "BROKEN (1 ignored import)" too; a long name runs into it
    assert any(contract in ln for ln in broken), r.stdout[-3000:]


def contract_sources() -> list[str]:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        contracts = tomllib.load(f)["tool"]["importlinter"]["contracts"]
    return [m for c in contracts for m in c.get("source_modules", [])]


def test_the_contracts_name_packages_not_modules():
    """A contract over a package covers the module added to it tomorrow; a hand-kept list of
    modules does not. (Negative control: a module's name is refused.)"""
    def is_package(name: str) -> bool:
        return os.path.isfile(os.path.join(ROOT, *name.split("."), "__init__.py"))

    sources = contract_sources()
    assert "engine.declarations" in sources and "engine.memory.what_fits" in sources
    assert [m for m in sources if not is_package(m)] == []
    assert not is_package("engine.memory.breakdown")
