"""--fork and --resume together are refused for what they are (issue 31), whatever the folders
hold: a real run's folder, a folder that is no run, two different runs. The refusal used to
blame the run's saved config ("give the flag to override it"), or the folder it read first.
A saved value the flags do override is still named as the saved config's (the positive control)."""
from __future__ import annotations

import json
import sqlite3

import pytest

from engine_in_process import copy_run, engine, trained
from testkit import isolated_env

PAIR = "error: --fork and --resume: give one (a fork starts a new run folder, a resume continues one)"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("origin")
    trained(folder, "--run-dir", folder / "run", "--epochs", "1", "--max-steps", "2", "--device", "cpu",
            "--workers", "0")
    return folder / "run"


@pytest.mark.parametrize("case", ["same run", "two runs", "no run"])
def test_fork_and_resume_together_are_refused_as_the_pair(tmp_path, run, case):
    other = copy_run(run, tmp_path / "other")
    fork, resume = {"same run": (run, run), "two runs": (f"{run}@last", other),
                    "no run": (tmp_path / "nothing", tmp_path / "nothing")}[case]
    r = engine("--fork", fork, "--resume", resume, env=isolated_env(tmp_path))
    assert r.returncode == 2
    assert r.stderr.strip() == PAIR, r.stderr
    assert not (tmp_path / "nothing").exists()


def test_a_saved_value_out_of_range_is_still_named_as_the_saved_configs(tmp_path, run):
    resumed = copy_run(run, tmp_path / "resumed")
    db = sqlite3.connect(resumed / "run.db")
    (config,) = db.execute("SELECT value FROM run WHERE key = 'config'").fetchone()
    db.execute("UPDATE run SET value = ? WHERE key = 'config'", (json.dumps({**json.loads(config), "accum": 0}),))
    db.commit()
    db.close()
    r = engine("--resume", resumed, env=isolated_env(tmp_path))
    assert r.returncode == 2 and "the run's saved config" in r.stderr and "give the flag to override it" in r.stderr
