"""Every import and command the README documents for users still resolves, whatever the
engine's internal packages are called (issue 29 renamed the Trainer's, the steering's, the
accumulation window's and the memory estimates' packages and the main window's module; none of
them is a user import).

Fast and Qt-free: the app's entry point is checked by its source, not imported."""
from __future__ import annotations

import ast
import importlib
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ImportError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[1]

# (module, names, optional extra the module needs): as README.md writes them.
DOCUMENTED = [
    ("engine", ["Task", "Trainer", "TrainConfig", "load_task"], None),
    ("engine.integrations.loop", ["headroom_run", "set_lr"], None),
    ("engine.integrations.transformers", ["HeadroomCallback", "exact_loss"], "transformers"),
    ("engine.integrations.lightning", ["HeadroomCallback"], "lightning"),
]


@pytest.mark.parametrize("module,names,extra", DOCUMENTED, ids=[m for m, _, _ in DOCUMENTED])
def test_documented_import(module: str, names: list[str], extra: str | None) -> None:
    if extra is not None:
        pytest.importorskip(extra)
    mod = importlib.import_module(module)
    for name in names:
        assert getattr(mod, name, None) is not None, f"from {module} import {name} (README.md) fails"


def test_readme_still_documents_these() -> None:
    """The list above is the README's: a user import the README drops or adds shows here."""
    text = (ROOT / "README.md").read_text()
    for module, _names, _ in DOCUMENTED:
        assert f"from {module} import" in text or module == "engine", module
    assert "from engine import Task" in text


def _scripts() -> dict[str, str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {**project["scripts"], **project["gui-scripts"]}


@pytest.mark.parametrize("name", ["headroom-train", "headroom-export", "headroom-ctl", "headroom"])
def test_entry_point_resolves(name: str) -> None:
    """pyproject's console scripts name a module and a function that exist (headroom-ctl,
    headroom-train...). The app's module imports Qt: its `main` is found in its source."""
    module, func = _scripts()[name].split(":")
    if module.startswith("app."):
        spec = importlib.util.find_spec(module)
        assert spec is not None and spec.origin, module
        tree = ast.parse(Path(spec.origin).read_text())
        assert any(isinstance(n, ast.FunctionDef) and n.name == func for n in tree.body), _scripts()[name]
    else:
        assert callable(getattr(importlib.import_module(module), func))


@pytest.mark.parametrize("package", ["engine", "app", "engine.ctl"])
def test_python_dash_m(package: str) -> None:
    """`python -m engine`, `python -m app` and `python -m engine.ctl` (what headroom-ctl start
    runs over ssh) have a __main__ module."""
    assert importlib.util.find_spec(f"{package}.__main__") is not None


def test_python_dash_m_engine_help() -> None:
    out = subprocess.run([sys.executable, "-m", "engine", "--help"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and "--task" in out.stdout, out.stderr
