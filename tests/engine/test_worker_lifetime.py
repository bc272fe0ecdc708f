"""DataLoader workers end with the engine, however it ends (issue 31).

A real engine process (`python -m engine`, 2 workers) whose data set hangs in one worker's read,
ignoring SIGINT and SIGTERM, as a stuck network read in C code would: the engine blocks waiting for
that batch. Ctrl-C twice ends it at once (exit 130, os._exit: no clean-up runs), and SIGKILL ends
it with no say at all; either way every worker, the hung one included, is gone within seconds
(before, the hung one was still alive 15 s later)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from testkit import ROOT, subprocess_env, wait_until

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc for the workers' state")

DATA = textwrap.dedent("""
    import os, signal, time, torch
    from engine import Task

    class Data(torch.utils.data.Dataset):
        def __init__(self, pids):
            self.pids = pids
        def __len__(self):
            return 64
        def __getitem__(self, i):
            info = torch.utils.data.get_worker_info()
            if info is not None:
                with open(os.path.join(self.pids, str(os.getpid())), "w") as f:
                    f.write(str(i))
                if i == 13:  # stuck for good, deaf to Ctrl-C and SIGTERM
                    signal.signal(signal.SIGINT, signal.SIG_IGN)
                    signal.signal(signal.SIGTERM, signal.SIG_IGN)
                    open(os.path.join(self.pids, "hung"), "w").write(str(os.getpid()))
                    while True:
                        time.sleep(1)
            x = torch.randn(4, generator=torch.Generator().manual_seed(i))
            return x, (x[0] > 0).long()

    def loss(model, batch):
        x, y = batch
        return torch.nn.functional.cross_entropy(model(x), y, reduction="sum"), len(y)

    def build_task(seed, pids=""):
        torch.manual_seed(seed)
        return Task(model=torch.nn.Linear(4, 2), train_data=Data(pids), loss=loss)
""")


def _alive(pid: int) -> bool:
    """Running (a zombie no reaper has collected yet is not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


@pytest.mark.parametrize("how", ["ctrl-c twice", "sigkill"])
def test_the_workers_end_with_the_engine_even_one_hung_in_a_read(tmp_path, how):
    task, pids = tmp_path / "hang_task.py", tmp_path / "pids"
    task.write_text(DATA)
    pids.mkdir()
    engine = subprocess.Popen([sys.executable, "-m", "engine", "--task", str(task), "--task-arg", f"pids={pids}",
                               "--workers", "2", "--micro-batch", "4", "--device", "cpu",
                               "--run-dir", str(tmp_path / "run")],
                              cwd=ROOT, env=subprocess_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True)
    try:
        hung = int(wait_until(lambda: (pids / "hung").exists() and (pids / "hung").read_text(), timeout=120,
                              what="a worker hung in its read"))
        workers = wait_until(lambda: len(os.listdir(pids)) >= 3 and [int(p) for p in os.listdir(pids) if p.isdigit()],
                             timeout=30, what="both workers")
        assert hung in workers and all(_alive(p) for p in workers)
        if how == "sigkill":
            engine.kill()
            assert engine.wait(timeout=30) == -signal.SIGKILL
        else:
            engine.send_signal(signal.SIGINT)  # the first asks for a stop at the next step: that never comes
            time.sleep(1.0)
            engine.send_signal(signal.SIGINT)
            assert engine.wait(timeout=30) == 130, engine.stderr.read() if engine.stderr else ""
        wait_until(lambda: not any(_alive(p) for p in workers), timeout=10,
                   what=f"the workers {workers} gone after the engine ({how})")
    finally:
        if engine.poll() is None:
            engine.kill()
            engine.wait()
        for p in os.listdir(pids):  # what this test started, by pid: nothing left behind whatever failed
            if p.isdigit() and _alive(int(p)):
                os.kill(int(p), signal.SIGKILL)
