"""A run's labels from the terminal (`headroom-ctl tag`, `note`, `archive`, `unarchive`) and
through the client API (`client.label_run`, what the window calls): tags added, removed, listed
and replaced; the note set, printed and cleared; --json; bad input one line and exit 2 with
nothing written; two editors at once losing no tag; a damaged labels.json replaced only by a
change; and HOST:RUN through a real sshd. Cheap: the run folders are written without training,
and the command line runs in this process but for the ssh test."""
from __future__ import annotations

import json
import os
import threading

import pytest
import sshkit
from ctlkit import ctl, one_error_line, records, written_run

from engine.ctl import client
from engine.ctl.cli import main
from engine.store import labels

sshd = sshkit.sshd  # the shared server fixture (tests/ctl/sshkit.py)


@pytest.fixture
def run(tmp_path) -> str:
    return written_run(str(tmp_path / "run"), 2)


def said(capsys, *argv: str) -> tuple[int, str, str]:
    """headroom-ctl's exit code, stdout and stderr for argv, run in this process."""
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_tags_are_added_removed_replaced_and_listed(capsys, run):
    assert said(capsys, "tag", run, "lr-sweep", "warm up", "lr-sweep") == (0, "lr-sweep\nwarm up\n", "")
    assert said(capsys, "tag", run, "baseline", "--remove", "warm up") == (0, "lr-sweep\nbaseline\n", "")
    assert said(capsys, "tag", run) == (0, "lr-sweep\nbaseline\n", "")  # no TAG: the tags
    assert labels.read(run) == labels.Labels(("lr-sweep", "baseline"))
    assert said(capsys, "tag", run, "--clear", "final") == (0, "final\n", "")
    assert said(capsys, "tag", run, "--clear") == (0, "", "")
    assert labels.read(run).tags == ()


def test_the_note_is_set_printed_and_cleared(capsys, run):
    assert said(capsys, "note", run, "first", "try:", "warmup 500") == (0, "first try: warmup 500\n", "")
    assert said(capsys, "note", run) == (0, "first try: warmup 500\n", "")
    assert said(capsys, "tag", run, "a") == (0, "a\n", "")  # tags leave the note alone, and the other way round
    assert labels.read(run) == labels.Labels(("a",), "first try: warmup 500")
    assert said(capsys, "note", run, "--clear") == (0, "", "")
    assert labels.read(run) == labels.Labels(("a",))


def test_archive_and_unarchive(capsys, run):
    assert said(capsys, "archive", run) == (0, f"archived: {run}\n", "")
    assert labels.read(run).archived
    assert said(capsys, "unarchive", run) == (0, f"not archived: {run}\n", "")
    assert not labels.read(run).archived


def test_json_is_the_labels_record_the_client_reads(capsys, run):
    code, out, _ = said(capsys, "tag", run, "a", "--json")
    hello, record = map(json.loads, out.splitlines())
    assert code == 0 and hello["kind"] == "hello"
    assert record == {"kind": "labels", "run_dir": run, "tags": ["a"], "note": "", "archived": False}
    typed = client.typed(record)
    assert isinstance(typed, client.Labelled) and (typed.tags, typed.note, typed.archived) == (("a",), "", False)
    done = client.label_run(run, tags=["x", "y"], remove=["y"], note="  kept  ", archived=True)
    assert (done.run_dir, done.tags, done.note, done.archived) == (run, ("x",), "kept", True)
    assert client.label_run(run).tags == ("x",)  # nothing to change: read


@pytest.mark.parametrize("argv,words", [
    (["tag", "{tmp}", "a"], "not a run folder"),
    (["tag", "{tmp}/nope", "a"], "no such run folder"),
    (["tag", "{run}", ""], "a tag cannot be empty"),
    (["tag", "{run}", "ok", "x" * 41], "at most 40 characters"),
    (["tag", "{run}", "a\x1bb"], "printable"),
    (["note", "{run}", "x" * 4001], "at most 4000 characters"),
    (["note", "{run}", "text", "--clear"], "not both"),
    (["tag", "{run}", "--note"], "--note"),
])
def test_bad_input_is_one_line_and_exit_2_and_nothing_is_written(capsys, tmp_path, run, argv, words):
    code, out, err = said(capsys, *(a.format(run=run, tmp=tmp_path) for a in argv))
    lines = err.strip().splitlines()
    assert code == 2 and out == "" and len(lines) == 1 and lines[0].startswith("error: ") and words in lines[0], err
    assert not os.path.exists(labels.labels_path(run))


def test_bad_input_from_the_command_line(run):
    r = ctl("tag", run, "")
    assert r.returncode == 2 and "cannot be empty" in one_error_line(r)
    r = ctl("tag", run, "", "--json")  # a client reads the error record
    assert r.returncode == 2 and records(r.stdout)[-1]["kind"] == "error"


def test_two_editors_at_once_lose_no_tag(run):
    def editor(n: int) -> None:
        for i in range(15):
            labels.change(run, add=[f"e{n}-{i}"], note=f"by {n}")
    threads = [threading.Thread(target=editor, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(labels.read(run).tags) == sorted(f"e{n}-{i}" for n in range(6) for i in range(15))
    assert [f for f in os.listdir(run) if f.startswith(".labels-")] == []  # no temporary file left


def test_a_damaged_labels_file_reads_as_none_and_a_change_replaces_it(capsys, run):
    path = labels.labels_path(run)
    with open(path, "w") as f:
        f.write('{"tags": ["a", ')
    assert labels.read(run) == labels.Labels()
    assert said(capsys, "tag", run) == (0, "", "")  # read only: the damaged file stays as it was
    assert open(path).read() == '{"tags": ["a", '
    assert said(capsys, "tag", run, "b") == (0, "b\n", "")
    assert json.load(open(path)) == {"tags": ["b"], "note": "", "archived": False}


def test_a_remote_target_without_a_folder_is_bad_input():
    with pytest.raises(client.CtlError, match="give the run folder's path"):
        client.label_run("gpu-box:", add=["a"])


@pytest.mark.slow
def test_tag_and_note_through_ssh(sshd, tmp_path, monkeypatch):
    run_dir = written_run(str(tmp_path / "run; $(touch canary)"), 2)
    where = f"{sshkit.HOST}:{run_dir}"
    r = ctl("tag", where, "lr-sweep", "warm up", *sshd.ctl_args(), env=sshd.env)
    assert (r.returncode, r.stdout) == (0, "lr-sweep\nwarm up\n"), r.stderr
    r = ctl("note", where, "lr 3e-4; $(touch canary)", "--json", *sshd.ctl_args(), env=sshd.env)
    assert r.returncode == 0 and records(r.stdout)[-1]["note"] == "lr 3e-4; $(touch canary)", r.stderr
    r = ctl("tag", where, "", *sshd.ctl_args(), env=sshd.env)  # refused on the server
    assert r.returncode == 2 and "cannot be empty" in one_error_line(r)
    for key, value in sshd.env.items():  # the window's call: one change, one command
        monkeypatch.setenv(key, value)
    done = client.label_run(where, add=["-x"], remove=["warm up"], note="-- dashes\nand a line", archived=True,
                            remote_python=sshd.remote_python)
    assert (done.run_dir, done.tags, done.archived) == (run_dir, ("lr-sweep", "-x"), True)
    assert labels.read(run_dir) == labels.Labels(("lr-sweep", "-x"), "-- dashes\nand a line", True)
    assert not os.path.exists(os.path.join(os.path.expanduser("~"), "canary"))
