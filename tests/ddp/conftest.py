"""Every test in this folder starts several processes (torchrun, gloo) or tests their parts: `ddp`.

The runs that end cleanly are shared: a torchrun launch costs each rank seconds of imports (torch
and the engine), one run on it a fraction of that. A test file declares its runs on 2 ranks in
`two_rank_scenarios(base, request)` and those on 4 in `four_rank_scenarios(base, request)`
(name -> harness.Scenario, each run's folder under `base`); the first test that needs them
starts one launch per rank count that trains the runs of every file this session runs, one
after another, and each file's tests read their own through the `two_ranks` and `four_ranks`
fixtures. The ddp phase runs serially (one pytest process): that is where this saves launches.
"""
from __future__ import annotations

import pathlib
from types import ModuleType
from typing import TYPE_CHECKING

import pytest

from tests.ddp.harness import Launch, Scenario, group, single_process, torchrun_scenarios

if TYPE_CHECKING:
    from tests.ddp.harness import Weights

_HERE = pathlib.Path(__file__).parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _HERE in pathlib.Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.ddp)


def running_test_files(session: pytest.Session) -> list[ModuleType]:
    """The test files of this folder with a test this session runs, in the order they run."""
    modules: dict[str, ModuleType] = {}
    for item in session.items:
        module = getattr(item, "module", None)
        if module is not None and _HERE in pathlib.Path(module.__file__).parents:
            modules.setdefault(module.__name__, module)
    return list(modules.values())


def launch_declared(request: pytest.FixtureRequest, base: pathlib.Path, declared_by: str, nproc: int) -> Launch:
    """One launch on `nproc` ranks of the scenarios every running test file declares in its
    function `declared_by`, named `<file>/<name>`."""
    scenarios: dict[str, Scenario] = {}
    for module in running_test_files(request.session):
        declare = getattr(module, declared_by, None)
        if declare is not None:
            for name, s in declare(base / group(module.__name__), request).items():
                scenarios[f"{group(module.__name__)}/{name}"] = s
    return torchrun_scenarios(base, scenarios, nproc)


@pytest.fixture(scope="session")
def every_two_rank_run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Launch:
    return launch_declared(request, tmp_path_factory.mktemp("two_ranks"), "two_rank_scenarios", 2)


@pytest.fixture(scope="session")
def every_four_rank_run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Launch:
    return launch_declared(request, tmp_path_factory.mktemp("four_ranks"), "four_rank_scenarios", 4)


@pytest.fixture
def two_ranks(request: pytest.FixtureRequest, every_two_rank_run: Launch) -> Launch:
    """This test file's runs on 2 ranks (its `two_rank_scenarios`), by name."""
    return every_two_rank_run.within(group(request.module.__name__))


@pytest.fixture
def four_ranks(request: pytest.FixtureRequest, every_four_rank_run: Launch) -> Launch:
    """This test file's runs on 4 ranks (its `four_rank_scenarios`), by name."""
    return every_four_rank_run.within(group(request.module.__name__))


@pytest.fixture(scope="session")
def reference_64(tmp_path_factory: pytest.TempPathFactory) -> Weights:
    """One process, 8x1, tests/ddp/varlen_task.py's 64 samples: what a run on any number of
    ranks with the same global windows ends at."""
    return single_process(tmp_path_factory.mktemp("ref") / "run")
