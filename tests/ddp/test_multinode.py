"""Two nodes, as torchrun sees them: `torchrun --nnodes 2 --rdzv-backend c10d --rdzv-endpoint
127.0.0.1:PORT` started twice on this machine, one process each. The job trains as one; a node
killed mid-window ends the other within 30 s with an `error:` line."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from engine.store import RunReader
from tests.ddp.harness import ROOT, Launch, env, max_diff, scenario, worker_args

if TYPE_CHECKING:
    from tests.ddp.harness import Weights


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def node(port: int, args: list[str], extra_env: dict[str, str]) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
           "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"headroom-{port}"] + args
    return subprocess.Popen(cmd, cwd=ROOT, env=env(**extra_env), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (torchrun's workers), from /proc."""
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for c in children.get(p, []):
            out.append(c)
            todo.append(c)
    return out


def test_two_nodes_train_as_one(tmp_path: Path, reference_64: Weights) -> None:
    port = free_port()
    worker, outs = worker_args(tmp_path, {"run": scenario(strategy="fsdp")})
    nodes = [node(port, worker, {}) for _ in range(2)]
    try:
        errs = [p.communicate(timeout=240)[1] for p in nodes]
    finally:
        for p in nodes:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    assert [p.returncode for p in nodes] == [0, 0], errs[0][-2000:] + errs[1][-2000:]
    weights = Launch(outs, 2, 0, errs[0] + errs[1])["run"].weights
    assert max_diff(weights[0], weights[1]) == 0.0
    assert max_diff(weights[0], reference_64) < 1e-6
    info = RunReader(str(outs["run"] / "run")).info()
    assert info["world_size"] == 2 and info["strategy"] == "fsdp"


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_a_node_killed_mid_window_ends_the_other_within_30_s(tmp_path, strategy):
    port = free_port()
    run_dir = tmp_path / "run"
    args = ["-m", "engine", "--task", "tests/ddp/varlen_task.py", "--epochs", "1000", "--micro-batch", "2",
            "--accum", "2", "--device", "cpu", "--run-dir", str(run_dir), "--strategy", strategy]
    first = node(port, args, {"HEADROOM_TEST_SLOW": "0.05"})
    time.sleep(1.0)  # the first node hosts the rendezvous store
    second = node(port, args, {"HEADROOM_TEST_SLOW": "0.05"})
    try:
        deadline = time.time() + 150
        while time.time() < deadline:
            try:
                if len(RunReader(str(run_dir)).metrics()) >= 5:
                    break
            except Exception:
                pass
            time.sleep(0.2)
        else:
            pytest.fail("the job never got going")
        for pid in descendants(second.pid) + [second.pid]:  # the whole node: its agent and its worker
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        t0 = time.time()
        _, err = first.communicate(timeout=60)
        took = time.time() - t0
        assert took < 30, f"the surviving node took {took:.0f} s"
        print(f"the surviving node ended {took:.1f} s after the kill")
    finally:
        for p in (first, second):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    assert first.returncode != 0
    assert any(line.startswith("error: ") or "]:error: " in line for line in err.splitlines()), err[-3000:]
