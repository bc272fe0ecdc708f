"""What run.db stores is input: an event's `data` and the run table's keys may hold any shape
(text that is not JSON, a list where a dict was written, settings changes that are not
triples, numbers past 64 bits, 1e300, infinities, strings, nested junk). The window opens
such a run, shows the steps it can read, lists it in Run history beside healthy runs, and
logs no traceback; `--open` on the command line does the same (engine/store/stored.py
is the one reader)."""
from __future__ import annotations

import json
import os
import shutil
import sqlite3
from pathlib import Path
from typing import Any, Callable

import pytest

import testkit
from engine_in_process import trained

pytestmark = pytest.mark.slow  # two real runs (a fork and its parent), then damaged


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """a: 6 steps of the seed MLP; b: a fork of a's last checkpoint (a parent record), 10 steps."""
    base = tmp_path_factory.mktemp("shapes")
    common = ("--task", "mlp", "--epochs", "1", "--device", "cpu")
    trained(base, *common, "--max-steps", "6", "--run-dir", base / "a")
    trained(base, *common, "--max-steps", "10", "--fork", f"{base / 'a'}@last", "--lr", "0.003",
            "--run-dir", base / "b")
    return base


@pytest.fixture
def runs(made: Path) -> Path:
    """a and b copied into this test's runs folder (conftest's `isolated`), b's parent record
    pointed at the copy of a."""
    root = Path(os.environ["HEADROOM_RUNS"])
    root.mkdir(parents=True, exist_ok=True)
    for name in ("a", "b"):
        shutil.copytree(made / name, root / name, ignore=shutil.ignore_patterns("*.writer.lock"))
    with sqlite3.connect(root / "b" / "run.db") as db:
        (raw,) = db.execute("SELECT value FROM run WHERE key = 'parent'").fetchone()
        db.execute("UPDATE run SET value = ? WHERE key = 'parent'", (raw.replace(str(made / "a"), str(root / "a")),))
        for event in more_kinds():
            d = event.to_dict()
            data = {k: v for k, v in d.items() if k not in ("step", "epoch", "kind")}
            db.execute("INSERT INTO events (time, step, epoch, kind, message, data) VALUES (?,?,?,?,?,?)",
                       (1.0e9, event.step, event.epoch, event.kind, event.message(), json.dumps(data)))
    return root


def more_kinds() -> list[Any]:
    """One event of each kind the app reads the data of that a short CPU run does not write,
    as the engine's own declarations make them (written into b before it is damaged)."""
    from engine.declarations import events as ev
    return [ev.MicroBatchFound(10, 1, micro_batch=16, accum=4, probes=3, peak_bytes=2**20),
            ev.OomRecovered(10, 1, old_micro_batch=32, old_accum=2, new_micro_batch=16, new_accum=4),
            ev.MemoryForecast(10, 1, micro_batch_max=64, accum_for_effective=1, effective_batch=64,
                              capacity=2**34, fixed_bytes=2**20, per_sample_bytes=2**10, precision="fp32"),
            ev.MemoryLevers(10, 1, capacity=2**34, usable=2**33,
                            rows=((16, "fp32", False, 2**20, True, 4, "measured", True, True),), notes=("a note",)),
            ev.RolledBack(10, 1, from_step=10, to_step=10, reason="spike", new_lr=0.001, windows_skipped=0),
            ev.NonFinite(10, 1, params=("w",), loss_finite=True, action="skipped"),
            ev.ClipSaturation(10, 1, fraction=0.9, window=10, clip=1.0),
            ev.VramLow(10, 1, used=2**33, total=2**34, headroom=0.1),
            ev.LrHint(10, 1, accum_old=4, accum_new=8, suggested_lr=0.006),
            ev.CommandRefused(10, 1, command="set_lr", reason="out of range"),
            ev.CommandReceived(10, 1, command="set_lr", payload={"lr": 0.002}, applies="step", target_epoch=None),
            ev.EpochEnd(10, 1, train_loss=1.0, val_loss=0.9, seconds=1.0)]


# -- the damage -------------------------------------------------------------------------------
def leaves(v: Any, fn: Callable[[Any], Any]) -> Any:
    """`v` with fn applied to every number inside it (dicts and lists kept)."""
    if isinstance(v, dict):
        return {k: leaves(x, fn) for k, x in v.items()}
    if isinstance(v, list):
        return [leaves(x, fn) for x in v]
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return fn(v)
    return v


def nested(v: Any, fn: Callable[[Any], Any]) -> Any:
    """`v` with fn applied to every dict and list inside it, innermost first."""
    if isinstance(v, dict):
        return fn({k: nested(x, fn) for k, x in v.items()})
    if isinstance(v, list):
        return fn([nested(x, fn) for x in v])
    return v


def as_text(v: Any) -> str:
    """JSON of `v`, with the float infinity written 1e999 (what another program may write)."""
    return json.dumps(v).replace("-Infinity", "-1e999").replace("Infinity", "1e999")


def rewrite(db: sqlite3.Connection, table: str, key: str, col: str, fn: Callable[[Any], Any]) -> None:
    """Every row's `col` (JSON text) replaced by as_text(fn(its value))."""
    for k, raw in db.execute(f"SELECT {key}, {col} FROM {table}").fetchall():
        try:
            v = json.loads(raw)
        except (TypeError, ValueError):
            continue
        db.execute(f"UPDATE {table} SET {col} = ? WHERE {key} = ?", (as_text(fn(v)), k))


def settings_row(changes: Any) -> Callable[[sqlite3.Connection], None]:
    """A settings_applied event at step 7 whose `changes` is `changes`."""
    def damage(db: sqlite3.Connection) -> None:
        db.execute("INSERT INTO events (time, step, epoch, kind, message, data) VALUES (?,?,?,?,?,?)",
                   (1.0e9, 7, 1, "settings_applied", "settings changed",
                    json.dumps({"changes": changes, "from_step": 8, "at": "step"})))
    return damage


def event_data(raw: str) -> Callable[[sqlite3.Connection], None]:
    def damage(db: sqlite3.Connection) -> None:
        db.execute("UPDATE events SET data = ?", (raw,))
    return damage


def event_leaves(fn: Callable[[Any], Any]) -> Callable[[sqlite3.Connection], None]:
    return lambda db: rewrite(db, "events", "id", "data", lambda v: leaves(v, fn))


def event_shapes(fn: Callable[[Any], Any]) -> Callable[[sqlite3.Connection], None]:
    return lambda db: rewrite(db, "events", "id", "data", lambda v: nested(v, fn))


def run_key(key: str, raw: str) -> Callable[[sqlite3.Connection], None]:
    def damage(db: sqlite3.Connection) -> None:
        db.execute("UPDATE run SET value = ? WHERE key = ?", (raw, key))
    return damage


def run_keys(raw: str) -> Callable[[sqlite3.Connection], None]:
    """Every key of the run table (status, config, started, parent, step, world_size ...) at once."""
    return lambda db: db.execute("UPDATE run SET value = ?", (raw,))


def run_leaves(fn: Callable[[Any], Any]) -> Callable[[sqlite3.Connection], None]:
    return lambda db: rewrite(db, "run", "key", "value", lambda v: leaves(v, fn))


def parent_step(raw: str) -> Callable[[sqlite3.Connection], None]:
    def damage(db: sqlite3.Connection) -> None:
        (value,) = db.execute("SELECT value FROM run WHERE key = 'parent'").fetchone()
        record = json.loads(value)
        record["step"] = "@STEP@"
        db.execute("UPDATE run SET value = ? WHERE key = 'parent'", (json.dumps(record).replace('"@STEP@"', raw),))
    return damage


def dicts_as_lists(v: Any) -> Any:
    return list(v.values()) if isinstance(v, dict) else v


def lists_as_dicts(v: Any) -> Any:
    return {str(i): x for i, x in enumerate(v)} if isinstance(v, list) else v


DAMAGE: dict[str, Callable[[sqlite3.Connection], None]] = {
    # settings_applied changes that are not (name, old, new) triples
    "changes-text": settings_row("x"),
    "changes-numbers": settings_row([1, 2]),
    "changes-pairs": settings_row([[1, 2]]),
    "changes-dict": settings_row({"a": 1}),
    "changes-1e300": settings_row([["lr", 1e300, 1e300], ["accum", 1e300, 1e300], ["micro_batch", -5, 2**70]]),
    "changes-names": settings_row([[["lr"], 1, 2], [{"a": 1}, 1, 2], [None, 1, 2]]),
    # every event's data
    "events-not-json": event_data("{not json"),
    "events-list": event_data("[1, 2]"),
    "events-text": event_data('"x"'),
    "events-number": event_data("1e300"),
    "events-numbers-1e300": event_leaves(lambda v: 1e300),
    "events-numbers-minus-1e300": event_leaves(lambda v: -1e300),
    "events-numbers-1e999": event_leaves(lambda v: float("inf")),
    "events-numbers-2**70": event_leaves(lambda v: 2**70),
    "events-numbers-minus-5": event_leaves(lambda v: -5),
    "events-numbers-text": event_leaves(lambda v: "yesterday"),
    "events-dicts-as-lists": event_shapes(dicts_as_lists),
    "events-time-1e300": lambda db: db.execute("UPDATE events SET time = 1e300"),
    "events-time-minus-1e300": lambda db: db.execute("UPDATE events SET time = -1e300"),
    "events-time-text": lambda db: db.execute("UPDATE events SET time = 'yesterday', step = 'x', epoch = 1e300"),
    "events-lists-as-dicts": event_shapes(lists_as_dicts),
    # the run table
    "started-1e300": run_key("started", "1e300"),
    "started-minus-1e300": run_key("started", "-1e300"),
    "started-1e999": run_key("started", "1e999"),
    "started-text": run_key("started", '"yesterday"'),
    "finished-1e300": run_key("finished", "1e300"),
    "step-1e300": run_key("step", "1e300"),
    "world-size-1e300": run_key("world_size", "1e300"),
    "config-list": run_key("config", "[1, 2]"),
    "parent-list": run_key("parent", "[1, 2]"),
    "run-keys-1e300": run_keys("1e300"),
    "run-keys-minus-1e300": run_keys("-1e300"),
    "run-keys-text": run_keys('"yesterday"'),
    "run-keys-list": run_keys("[1, 2]"),
    "run-keys-dict": run_keys('{"a": 1}'),
    "run-keys-not-json": run_keys("{not json"),
    "run-numbers-1e300": run_leaves(lambda v: 1e300),
    "run-numbers-minus-1e300": run_leaves(lambda v: -1e300),
    "run-numbers-1e999": run_leaves(lambda v: float("inf")),
    "run-numbers-2**70": run_leaves(lambda v: 2**70),
    "run-numbers-minus-5": run_leaves(lambda v: -5),
    "parent-step-1e300": parent_step("1e300"),
    "parent-step-1e999": parent_step("1e999"),
    "parent-step-minus-5": parent_step("-5"),
    "parent-step-2**70": parent_step(str(2**70)),
    "parent-step-text": parent_step('"six"'),
}


def damaged(runs: Path, case: str) -> Path:
    with sqlite3.connect(runs / "b" / "run.db") as db:
        DAMAGE[case](db)
    return runs / "b"


def window_errors(w: Any) -> list[str]:
    return [message for kind, _step, message in w.alerts.rows() if kind == "window_error"]


def log_text() -> str:
    path = os.environ["HEADROOM_LOG"]
    return open(path, encoding="utf-8").read() if os.path.exists(path) else ""


@pytest.mark.parametrize("case", list(DAMAGE))
def test_a_run_with_odd_stored_values_opens_and_is_listed(qtbot: Any, make_window: Any, runs: Path, case: str) -> None:
    run_dir = damaged(runs, case)
    w = make_window()
    assert w.open_run(str(run_dir)), w.last_error
    w.tick()
    assert w.model.step == 10 and len(w.model.metrics) == 4  # its own steps 7..10, all of them
    w.plots.refresh(force=True)
    w.history.refresh()
    assert w.history.item_for(str(run_dir)) is not None and w.history.item_for(str(runs / "a")) is not None
    assert w.open_run(str(runs / "a"))  # a healthy run beside it
    w.tick()
    w.history.refresh()
    assert w.model.step == 6
    assert w.last_error is None and window_errors(w) == []
    assert "Traceback" not in log_text()


@pytest.mark.parametrize("case", ["parent-step-1e300", "parent-step-1e999", "parent-step-minus-5",
                                  "parent-step-2**70", "started-1e300", "changes-text", "events-numbers-1e300"])
def test_open_on_the_command_line_shows_it(runs: Path, case: str) -> None:
    run_dir = damaged(runs, case)
    r = testkit.run_app("--open", run_dir, "--quit-when-done", env={"HEADROOM_LOG": os.environ["HEADROOM_LOG"]})
    assert r.returncode == 0 and "Traceback" not in r.stderr and "error" not in r.stderr, r.stderr
    assert "Traceback" not in log_text()
