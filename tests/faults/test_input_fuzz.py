"""Input from outside is checked once, the same way everywhere (issue 12): a value is accepted as a
flag exactly when it is accepted in TrainConfig and as a command from run.db (engine/declarations/limits.py);
no command row, however odd, makes the engine raise; no payload can recurse; refusals are one
short line quoting at most a prefix of what was given."""
from __future__ import annotations

import itertools
import json
import os
import sqlite3

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.cli import build_parser, config_from_args, main
from engine.declarations import limits
from engine.declarations.commands import COMMANDS, SetAccum, SetLr, command_from_json
from engine.declarations.config import ConfigError, TrainConfig
from engine.store import RunReader, RunStore

# (TrainConfig field, command kind, command field, flag): the live settings, one validation each.
SETTINGS = [("micro_batch", "set_micro_batch", "size", "--micro-batch"), ("accum", "set_accum", "steps", "--accum"),
            ("lr", "set_lr", "lr", "--lr"), ("clip", "set_clip", "norm", "--clip")]

NUMBERS = st.one_of(
    st.integers(-5, 2**21 + 5),
    st.integers(2**19, 2**21),
    st.sampled_from([0, 1, 2**20, 2**20 + 1, 10**4, 10**4 + 1, 10**6, 10**6 + 1, 10**400, -(10**400), 2**63]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(min_value=0, max_value=2e6),
    st.sampled_from([20.0, 1e4, 1e4 + 0.01, 1e6, 1e6 * (1 + 1e-9), 1e39, 1e308, 5e-324, -0.0]),
)


def accepted(fn) -> tuple[bool, str]:
    try:
        fn()
        return True, ""
    except ConfigError as e:
        return False, str(e)


def as_flag_text(v) -> str:
    return str(v) if isinstance(v, int) else repr(v)


@settings(max_examples=400, deadline=None)
@given(setting=st.sampled_from(SETTINGS), value=NUMBERS)
def test_a_value_is_accepted_as_a_flag_a_config_field_and_a_command_alike(setting, value):
    name, kind, field, flag = setting
    by_config = accepted(lambda: TrainConfig(**{name: value}).validate())
    by_command = accepted(lambda: command_from_json(kind, json.dumps({field: value})))
    by_flag = accepted(lambda: config_from_args(build_parser().parse_args([f"{flag}={as_flag_text(value)}"])))
    assert by_config[0] == by_command[0] == by_flag[0], (value, by_config, by_command, by_flag)
    for ok, message in (by_config, by_command, by_flag):
        assert ok or ("\n" not in message and len(message) <= 200), message


# -- command rows: any content -----------------------------------------------------------------
TEXT = st.text(max_size=80)
JSON_VALUE = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | TEXT,
                          lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
                          max_leaves=12)
INT64 = st.integers(-(2**63), 2**63 - 1)  # what another program can put in a column at all
KINDS = st.one_of(st.sampled_from(sorted(COMMANDS)), TEXT, st.none(), INT64, st.floats(),
                  st.binary(max_size=40), st.just("k" * 100_000))


def payloads():
    fields = st.sampled_from(["steps", "size", "lr", "norm", "rule", "", "x" * 5000, "kind", "__class__"])
    return st.one_of(
        st.dictionaries(fields, JSON_VALUE, max_size=3).map(lambda d: json.dumps(d, allow_nan=True)),
        st.builds(lambda v: json.dumps({"steps": v}), JSON_VALUE),
        JSON_VALUE.map(json.dumps),
        st.integers(1, 200_000).map(lambda n: "[" * n),  # nesting that would overflow a recursive parser
        st.integers(1, 3000).map(lambda n: '{"steps": ' * n + "1" + "}" * n),
        st.integers(1, 3_000_000).map(lambda n: '{"steps": "' + "y" * n + '"}'),  # megabytes of text
        st.integers(300, 6000).map(lambda n: '{"steps": ' + "9" * n + "}"),  # past int()'s digit limit
        TEXT, st.binary(max_size=60), st.none(), INT64, st.floats(),
    )


ROW = st.tuples(KINDS, payloads(),
                st.one_of(st.none(), st.floats(), TEXT),  # time: text in a REAL column, NULL
                st.sampled_from(["pending", "pending", "received", None, 7]),
                st.booleans())  # store text as invalid UTF-8 (CAST of bytes AS TEXT)

counter = itertools.count()


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                    HealthCheck.too_slow,
                                                                    HealthCheck.data_too_large])
@pytest.mark.slow
@given(rows=st.lists(ROW, min_size=1, max_size=5))
def test_no_command_row_makes_polling_raise(tmp_path, rows):
    run_dir = tmp_path / f"run{next(counter)}"
    run_dir.mkdir()
    store = RunStore(str(run_dir))
    store.commit()
    db = sqlite3.connect(str(run_dir / "run.db"))
    for kind, payload, when, status, raw in rows:
        if raw and isinstance(payload, str):
            db.execute("INSERT INTO commands (time, kind, payload, status) VALUES (?, ?, CAST(? AS TEXT), ?)",
                       (when, kind, payload.encode("utf-8", "surrogatepass")[:-1] + b"\xff", status))
        else:
            db.execute("INSERT INTO commands (time, kind, payload, status) VALUES (?, ?, ?, ?)",
                       (when, kind, payload, status))
    db.commit()
    db.close()
    try:
        polled = store.pending_commands()
        assert len(polled) == sum(1 for r in rows if r[3] == "pending")
        for row_id, cmd, err in polled:
            assert (cmd is None) != (err == "")
            assert "\n" not in err and len(err) <= 400, err
            if cmd is None:
                payload = rows[row_id - 1][1]
                if isinstance(payload, str) and len(payload) > 80:
                    assert not any(payload[i:i + 80] in err for i in range(0, len(payload) - 80, 37)), err
            store.mark_command(row_id, "refused" if cmd is None else "received", 0, err)
        assert store.pending_commands() == []
        RunReader(str(run_dir)).commands()  # the app's reader takes the same rows
    finally:
        assert store.close()


def test_deeply_nested_values_never_recurse():
    nested: list = []
    for _ in range(200_000):
        nested = [nested]
    with pytest.raises(ConfigError) as e:
        SetAccum(nested)
    assert len(str(e.value)) < 200
    for payload in ("[" * 1_000_000, '{"steps": ' * 2000 + "1" + "}" * 2000, "[" * 4000 + "]" * 4000):
        with pytest.raises(ConfigError):
            command_from_json("set_accum", payload)
    assert limits.json_depth_exceeds('{"a": "[[[[[[[[[[[["}') is False  # brackets in strings do not count


@pytest.mark.parametrize("kind, payload, words", [
    ("set_accum", '{"steps": 1' + "0" * 400 + "}", "401-digit"),
    ("set_lr", '{"lr": 1e39}', "1e+39"),
    ("set_lr", '{"lr": 1e400}', "inf"),
    ("set_micro_batch", '{"size": 1048577}', "1048576"),
    ("set_clip", '{"norm": 1000001}', "1e+06"),
    ("set_accum", '{"steps": "' + "z" * 3000 + '"}', "zzzz"),
])
def test_out_of_range_commands_are_refused_with_a_short_quote(kind, payload, words):
    with pytest.raises(ConfigError) as e:
        command_from_json(kind, payload)
    msg = str(e.value)
    assert words in msg and "\n" not in msg and len(msg) < 160, msg


def test_the_edges_a_run_can_hold_are_accepted():
    assert SetLr(20).lr == 20 and SetLr(1e4).lr == 1e4 and SetAccum(2**20).steps == 2**20
    TrainConfig(lr=20.0, accum=2**20, micro_batch=2**20, epochs=10**6, max_steps=10**12, clip=1e6,
                vram_limit=2**50, token_budget=2**40, seed=2**63 - 1).validate()
    TrainConfig(vram_limit=2**20, seed=0, lr=0.0, clip=0.0).validate()


# -- the command line ---------------------------------------------------------------------------
@pytest.mark.parametrize("args", [
    ["--vram-limit", "9" * 400], ["--vram-limit", "9" * 400 + "TiB"], ["--vram-limit", "0.5MiB"],
    ["--vram-limit", "1025TiB"], ["--lr", "1e39"], ["--lr", "10000.5"], ["--epochs", "1e20"],
    ["--epochs", str(10**6 + 1)], ["--accum", "1" + "0" * 400], ["--accum", "9" * 5000], ["--micro-batch", str(2**20 + 1)],
    ["--max-steps", str(10**12 + 1)], ["--seed", str(2**63)], ["--token-budget", str(2**40 + 1)],
    ["--clip", "1e7"], ["--effective-batch", "9" * 30], ["--memory-margin", "0.99999999999999999999"], ["--lr", "1" * 500],
    ["--device", "cuda:" + "9" * 300], ["--optimizer", "x" * 10_000],
])
def test_values_no_run_can_hold_are_one_error_line_and_write_nothing(tmp_path, capsys, args):
    run_dir = tmp_path / "run"
    rc = main(["--run-dir", str(run_dir), *args])
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert rc == 2 and out == ""
    assert len(lines) == 1 and lines[0].startswith("error: ") and len(lines[0]) <= 420, err
    assert "Traceback" not in err
    assert not run_dir.exists() and os.listdir(tmp_path) == []
