"""RunReader hands out run-table values and event data through one reader of stored values
(engine/store/stored.py): JSON-shaped, no int past 64 bits, each event field of the shape its
kind declares or absent; the run summary (the window's run table, headroom-ctl runs) reads the
same. A real run, damaged with sqlite3."""
from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from engine.store import RunReader, stored, summary
from engine_in_process import copy_run, trained

pytestmark = pytest.mark.slow  # one real run


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("stored")
    trained(base, "--task", "mlp", "--epochs", "1", "--max-steps", "4", "--device", "cpu", "--run-dir", base / "run")
    return base / "run"


def sizes(v: object) -> bool:
    """Every int inside `v` within 64 bits."""
    if isinstance(v, dict):
        return all(sizes(x) for x in v.values())
    if isinstance(v, list):
        return all(sizes(x) for x in v)
    return not isinstance(v, int) or -stored.INT64 <= v < stored.INT64


def test_odd_values_read_as_plain_declared_shapes(made: Path, tmp_path: Path) -> None:
    run = copy_run(made, tmp_path / "run")
    with sqlite3.connect(run / "run.db") as db:
        db.execute("UPDATE run SET value = ? WHERE key = 'started'", (str(2**70),))
        db.execute("UPDATE run SET value = ? WHERE key = 'config'", (json.dumps({"lr": 10**30, "accum": [1]}),))
        db.execute("UPDATE run SET value = '1e300' WHERE key = 'step'")
        db.execute("UPDATE events SET data = ? WHERE kind = 'run_started'",
                   (json.dumps({"world_size": "two", "config": {"epochs": 2**80}, "extra": 2**70}),))
        db.execute("UPDATE events SET data = '[1, 2]' WHERE kind = 'lr_planned'")
        db.execute("INSERT INTO events (time, step, epoch, kind, message, data) VALUES (1, 4, 1, 'settings_applied', "
                   "'x', ?)", (json.dumps({"changes": "x", "from_step": 1e300}),))
        db.execute("INSERT INTO events (time, step, epoch, kind, message, data) VALUES (1, 4, 1, 'rolled_back', "
                   "'x', ?)", (json.dumps({"to_step": 1e300, "from_step": "4", "reason": 5, "new_lr": 1e-3}),))
    with RunReader(str(run)) as r:
        info, events = r.info(), r.events()
    assert sizes(info) and sizes([e["data"] for e in events])
    assert info["step"] == 1e300 and stored.whole(info["step"], -1) == -1 and stored.moment(info["started"]) is None
    by_kind = {e["kind"]: e["data"] for e in events}
    assert "world_size" not in by_kind["run_started"] and isinstance(by_kind["run_started"]["config"]["epochs"], float)
    assert by_kind["lr_planned"] == {} and by_kind["settings_applied"] == {}
    assert by_kind["rolled_back"] == {"new_lr": 1e-3}  # to_step 1e300, from_step text, reason a number: absent
    s = summary.summarize(str(run))
    assert s is not None and s.started is None and s.rollbacks == ()
    assert summary.from_record(json.loads(json.dumps(s.to_record())), s.path).started is None


def test_accessors_give_the_default_for_any_wrong_shape() -> None:
    odd = [None, "x", [1, 2], {"a": 1}, 1e300, -1e300, float("inf"), float("nan"), 2**70, True]
    for v in odd:
        assert stored.whole(v, -7) == -7
        assert stored.number(v, None) is None or v in (1e300, -1e300, 2**70)  # finite: numbers all the same
        assert stored.moment(v) is None
        assert stored.changes(v) == ()
    assert stored.changes([["lr", 1, 2], [1, 2], [["lr"], 1, 2], "x"]) == (("lr", 1, 2),)
    assert stored.whole(-5) == -5 and stored.whole(2**63 - 1) == 2**63 - 1 and stored.whole(2**63, 3) == 3
    assert stored.plain({"a": [2**70, {1: 2}], "b": -(10**400)}) == {"a": [float(2**70), {}], "b": float("-inf")}
    assert stored.decoded("[" * 100000, "deep") == "deep"
