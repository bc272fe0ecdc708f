"""A loop of parent links among runs (fork, delete the parent, fork back into its folder) is a
damaged record, not a reason for the app to spin for ever before showing anything: the run
history is a forest whatever the records say."""
from __future__ import annotations

import os

import pytest

import testkit
from app.model import lineage
from engine.declarations.events import StepMetrics
from engine.store import RunStore


def _run(path, parent) -> str:
    os.makedirs(path)
    s = RunStore(str(path))
    s.set_info(status="finished", task="mlp", device="cpu", config={"epochs": 1},
               parent={"run_dir": str(parent), "checkpoint": "last", "step": 1, "changed": {"lr": [1e-3, 2e-3]}})
    s.record(StepMetrics(1, 1, loss=1.0, grad_norm=1.0, clipped=False, lr=1e-3, accum=1, clip=0.0, micro_batch=4,
                         samples=4, tokens=4, step_time=0.01, throughput=1.0, nonfinite=False, scaler_skipped=False))
    s.close()
    return str(path)


def _loop(root) -> list[str]:
    """a -> b -> c -> a, and d -> a (a fork of a run inside the loop)."""
    a, b, c, d = (root / n for n in "abcd")
    return [_run(a, c), _run(b, a), _run(c, b), _run(d, a)]


def test_the_tree_is_a_forest_whatever_the_parent_records_say(tmp_path):
    paths = _loop(tmp_path)
    nodes = lineage.build_tree(paths)
    roots = [p for p, n in nodes.items() if n.up is None]
    assert len(roots) == 1 and nodes[roots[0]].loops
    for p in nodes:  # every walk up ends at a root
        seen = set()
        while p is not None:
            assert p not in seen
            seen.add(p)
            p = nodes[p].up
    assert sum(len(n.children) for n in nodes.values()) == len(nodes) - 1
    assert lineage.ancestors(paths[1], nodes)  # the record itself is kept, as stored


@pytest.mark.slow
def test_the_app_starts_and_lists_every_run_of_a_parent_loop(tmp_path, qtbot, make_window, monkeypatch):
    root = tmp_path / "runs"
    paths = _loop(root)
    monkeypatch.setenv("HEADROOM_RUNS", str(root))
    w = make_window()
    w.history.refresh()
    rows = {item.toolTip(1) for item in w.history.items()}
    assert rows == set(paths)
    # and the app's command line opens one of them and quits (it spun at 100% CPU before)
    r = testkit.run_app("--open", paths[0], "--screenshot", str(tmp_path / "shot.png"), "--quit-when-done",
                        timeout=120)
    assert r.returncode == 0, r.stderr
