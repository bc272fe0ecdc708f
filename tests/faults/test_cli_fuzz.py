"""Fuzz the CLI's arguments: never a traceback, exit 0 or 2, and a bad input is one `error:` line."""
from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.cli import main

pytestmark = pytest.mark.slow  # hypothesis: hundreds of command lines through the engine's main

FLAGS = ["--task", "--micro-batch", "--accum", "--lr", "--clip", "--epochs", "--optimizer", "--precision",
         "--device", "--seed", "--lr-scaling", "--token-budget", "--effective-batch", "--memory-margin",
         "--oom-recovery", "--vram-limit", "--resume", "--find-micro-batch", "--json", "--bogus", "--max-steps"]
VALUES = st.one_of(
    st.sampled_from(["mlp", "charlm", "cnn-bn", "nope", "x.py", "os:path", "0", "1", "-1", "4", "1e-3", "nan",
                     "inf", "-inf", "adamw", "sgd", "fp32", "bf16", "fp16", "cpu", "cuda", "cuda:7", "auto", "on",
                     "off", "24GiB", "1.5", "", " ", "--", "none", "linear", "sqrt", "/nonexistent", "é", "1e400",
                     # the ranges a run can hold (engine/declarations/limits.py): edges and far past them (not the
                     # largest accum a run holds: a 2**20-micro-batch window takes a while to train)
                     "20", "1e4", "10000.5", "1e39", "1e20", "1048577", "1MiB", "1023KiB", "1024TiB",
                     "1025TiB", "9" * 400, "1" + "0" * 4400, "9223372036854775808", "0.99999999999999999"]),
    st.integers(-3, 70).map(str),
    st.integers(2**20 + 1, 2**64).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.text(max_size=6),
)
ARGS = st.lists(st.tuples(st.sampled_from(FLAGS), st.lists(VALUES, max_size=1)), max_size=4).map(
    lambda pairs: list(itertools.chain.from_iterable([f, *v] for f, v in pairs)))

counter = itertools.count()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(args=ARGS)
def test_cli_never_tracebacks(args, tmp_path, capsys):
    run_dir = tmp_path / f"run{next(counter)}"
    # The fuzzed flags come after the defaults (so they win); --max-steps 1 comes last to keep runs short.
    rc = main(["--epochs", "1", "--micro-batch", "4", "--run-dir", str(run_dir)] + args + ["--max-steps", "1"])
    out, err = capsys.readouterr()
    assert "Traceback" not in err and "Traceback" not in out
    assert rc in (0, 2), (args, err)
    if rc == 2:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), (args, err)
