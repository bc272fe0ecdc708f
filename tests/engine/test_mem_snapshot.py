"""engine.memory.snapshot: the on-OOM memory snapshot, on CPU with an injected OOM and writer."""
from __future__ import annotations

import inspect
import os
import pickle

import engine_helpers  # noqa: F401 - for its set-up: testkit's sys.path before the engine imports
import pytest
import torch
import torch.nn as nn

from engine.accumulation.oom import is_oom
from engine.memory.snapshot import SnapshotRecorder

FAKE_SNAPSHOT = {"segments": [{"address": 0, "total_size": 2 << 20, "blocks": []}],
                 "device_traces": [[{"action": "oom", "size": 1 << 30, "frames": []}]]}


def writer(path: str) -> None:
    with open(path, "wb") as f:
        pickle.dump(FAKE_SNAPSHOT, f)


def train_until_oom(rec: SnapshotRecorder, run_dir: str, oom_above: int, micro_batches: list[int],
                    dump=writer) -> tuple[int, list]:
    """A small training loop whose forward raises a real torch.OutOfMemoryError when the
    micro-batch is larger than `oom_above`; the except block calls the recorder as the trainer will."""
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    step, paths = 0, []
    for b in micro_batches:
        try:
            if b > oom_above:
                raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate 2.00 GiB (micro-batch {b})")
            x = torch.randn(b, 4)
            model(x).pow(2).sum().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            step += 1
        except BaseException as e:
            if not is_oom(e):
                raise
            paths.append(rec.on_oom(run_dir, step, dump=dump))
            opt.zero_grad(set_to_none=True)
    return step, paths


def test_injected_oom_writes_a_snapshot_that_loads(tmp_path):
    run_dir = str(tmp_path / "run")
    rec = SnapshotRecorder()
    assert rec.start(torch.device("cpu")) is False and "CUDA" in rec.reason  # CPU: nothing recorded
    step, paths = train_until_oom(rec, run_dir, oom_above=8, micro_batches=[4, 4, 4, 16])
    assert step == 3
    expected = os.path.join(run_dir, "memory", "oom-step-3.pickle")  # where the GPU run writes it
    assert paths == [expected]
    with open(expected, "rb") as f:
        assert pickle.load(f) == FAKE_SNAPSHOT
    assert os.listdir(os.path.dirname(expected)) == ["oom-step-3.pickle"]  # no temporary left behind


def test_without_a_writer_on_cpu_nothing_is_written(tmp_path):
    rec = SnapshotRecorder()
    rec.start("cpu")
    _, paths = train_until_oom(rec, str(tmp_path), oom_above=2, micro_batches=[4], dump=None)
    assert paths == [None] and not (tmp_path / "memory").exists()


def test_repeated_ooms_in_one_step_and_ranks_get_their_own_files(tmp_path):
    rec = SnapshotRecorder(max_files=3)
    _, paths = train_until_oom(rec, str(tmp_path), oom_above=2, micro_batches=[16, 8, 4])
    names = [os.path.basename(p) if p else None for p in paths]
    assert names == ["oom-step-0.pickle", "oom-step-0-2.pickle", "oom-step-0-3.pickle"]
    assert rec.on_oom(str(tmp_path), 0, dump=writer) is None and "3 written" in rec.reason  # the cap
    other = SnapshotRecorder()
    assert os.path.basename(other.on_oom(str(tmp_path), 5, dump=writer, rank=1)) == "oom-step-5-rank-1.pickle"


def test_a_failing_writer_leaves_nothing_and_does_not_raise(tmp_path):
    def half_then_fail(path: str) -> None:
        with open(path, "wb") as f:
            f.write(b"half a pickle")
        raise MemoryError("host out of memory while pickling")
    rec = SnapshotRecorder()
    assert rec.on_oom(str(tmp_path), 7, dump=half_then_fail) is None
    assert "MemoryError" in rec.reason
    assert os.listdir(tmp_path / "memory") == []


def test_cuda_path_calls_the_torch_api_with_arguments_it_accepts(tmp_path, monkeypatch):
    """No GPU here: the two torch functions are replaced, but the arguments are bound against
    the real signatures of the installed torch, so a renamed keyword fails this test."""
    real_record = torch.cuda.memory._record_memory_history
    real_dump = torch.cuda.memory._dump_snapshot
    calls = []

    def fake_record(*args, **kwargs):
        inspect.signature(real_record).bind(*args, **kwargs)
        calls.append(("record", args, kwargs))

    def fake_dump(*args, **kwargs):
        inspect.signature(real_dump).bind(*args, **kwargs)
        calls.append(("dump", args, kwargs))
        writer(args[0] if args else kwargs["filename"])

    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history", fake_record)
    monkeypatch.setattr(torch.cuda.memory, "_dump_snapshot", fake_dump)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    rec = SnapshotRecorder()
    assert rec.start(torch.device("cuda", 0), max_entries=1234) is True and rec.active
    assert calls[0] == ("record", (), dict(enabled="all", context="all", stacks="python", max_entries=1234))
    path = rec.on_oom(str(tmp_path), 2)
    assert path == os.path.join(str(tmp_path), "memory", "oom-step-2.pickle")
    assert calls[1][0] == "dump" and calls[1][1][0].startswith(path + ".tmp-")  # written beside, then renamed
    with open(path, "rb") as f:
        assert pickle.load(f) == FAKE_SNAPSHOT
    rec.stop()
    assert calls[2] == ("record", (), dict(enabled=None)) and not rec.active


@pytest.mark.gpu  # the real recorder and a real OOM
def test_real_cuda_oom_snapshot(tmp_path):
    rec = SnapshotRecorder()
    assert rec.start(torch.device("cuda"), max_entries=10_000)
    try:
        x = torch.empty(1 << 20, device="cuda")
        try:
            torch.empty(1 << 50, dtype=torch.uint8, device="cuda")  # a petabyte: always out of memory
        except BaseException as e:
            assert is_oom(e)
            path = rec.on_oom(str(tmp_path), 1)
        with open(path, "rb") as f:
            snap = pickle.load(f)
        assert "segments" in snap and any(e.get("action") == "oom" for t in snap["device_traces"] for e in t)
        del x
    finally:
        rec.stop()
