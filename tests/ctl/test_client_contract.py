"""The app reaches engine.ctl only through its client API: the import-linter contract that says
so names every module of engine.ctl but the client (a module added tomorrow is named too, or
this fails), and the engine's CLI. That the contract can break: tests/test_layers.py."""
from __future__ import annotations

import os
import pkgutil

import pytest

from testkit import ROOT

NAME = "The app reaches engine.ctl only through its client API, not engine.cli"


def contract() -> dict:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        contracts = tomllib.load(f)["tool"]["importlinter"]["contracts"]
    (found,) = [c for c in contracts if c["name"] == NAME]
    return found


def test_the_contract_names_every_module_of_engine_ctl_but_the_client():
    c = contract()
    assert c["type"] == "forbidden" and c["source_modules"] == ["app"] and "ignore_imports" not in c
    modules = {f"engine.ctl.{m.name}" for m in pkgutil.iter_modules([os.path.join(ROOT, "engine", "ctl")])}
    assert "engine.ctl.client" in modules and "engine.ctl.remote" in modules
    assert set(c["forbidden_modules"]) == (modules - {"engine.ctl.client", "engine.ctl.__main__"}) | {"engine.cli"}


def test_no_contract_makes_an_exception_for_headroom_ctl():
    """engine.ctl.start checks flags without engine.cli (engine.declarations.run_flags, engine.run_config)."""
    with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as f:
        assert "engine.ctl.start -> engine.cli" not in f.read()
