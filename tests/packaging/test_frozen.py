"""The packaged build (PyInstaller, build_spec.spec) really works.

Builds dist/headroom/ with `make package` (about 4 minutes on 2 cores), or reuses it when it
is newer than every input (the spec, pyproject.toml, app/, engine/, resources/). Then runs
the frozen executables the way a user would, with nothing from the source tree on the path:

- the app trains the demo offscreen and saves a screenshot (exit 0, a valid PNG);
- the headless trainer runs a task file written outside the bundle (exit 0, run.db);
- bad flags and a task file importing a package the bundle lacks: exit 2, one `error:` line;
- the folder holds neither torch's headers and tests nor unused Qt modules, and is under
  800 MB with CPU torch; the window shows before torch is imported.

HEADROOM_SKIP_PACKAGE=1 skips all of this (local runs); HEADROOM_REBUILD_PACKAGE=1 forces
a rebuild. CI runs it.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import sqlite3
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest

from testkit import ROOT

DIST = ROOT / "dist" / "headroom"
APP = DIST / "headroom"
TRAIN = DIST / "headroom-train"
CTL = DIST / "headroom-ctl"
BUILD_LOG = ROOT / "build" / "package-build.log"
BUILD_LOCK = ROOT / "build" / "package-build.lock"
INPUTS = ["build_spec.spec", "pyproject.toml", "app", "engine", "resources"]
SIZE_LIMIT = 800 * 10**6  # bytes unpacked, CPU torch

pytestmark = [
    pytest.mark.package,
    pytest.mark.skipif(os.environ.get("HEADROOM_SKIP_PACKAGE") == "1", reason="HEADROOM_SKIP_PACKAGE=1"),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the packaged build is tested on Linux"),
    pytest.mark.timeout(1800),  # the first test also builds
]


def _newest_input() -> float:
    newest = 0.0
    for name in INPUTS:
        p = ROOT / name
        paths = [p] if p.is_file() else [q for q in p.rglob("*") if q.is_file() and "__pycache__" not in q.parts]
        for q in paths:
            newest = max(newest, q.stat().st_mtime)
    return newest


def _up_to_date() -> bool:
    if os.environ.get("HEADROOM_REBUILD_PACKAGE") == "1":
        return False
    if not (APP.is_file() and TRAIN.is_file() and CTL.is_file()):
        return False
    return min(APP.stat().st_mtime, TRAIN.stat().st_mtime, CTL.stat().st_mtime) > _newest_input()


def _build_command() -> list[str]:
    venv = (ROOT / ".venv").resolve()
    if Path(sys.prefix).resolve() == venv and shutil.which("make"):
        return ["make", "package"]  # the documented command, exactly
    try:  # another interpreter (a CI matrix, a conda env): the same build with it
        import PyInstaller  # noqa: F401 - only whether it imports
    except ImportError:
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "-c", str(ROOT / "constraints.txt"),
                        "pyinstaller>=6.10"], check=True)  # the tested version
    return [sys.executable, "-m", "PyInstaller", "--noconfirm", "--clean", "--distpath", "dist",
            "--workpath", "build", "build_spec.spec"]


@contextlib.contextmanager
def _one_builder():
    """One build at a time: pytest-xdist may hand this file's tests to several workers, and two
    PyInstaller builds into dist/ at once corrupt the archive ("zlib.error: Error -3 while
    decompressing data" in every frozen executable). A worker that waited finds the build done."""
    BUILD_LOCK.parent.mkdir(exist_ok=True)
    with open(BUILD_LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or the process dies
        yield


@pytest.fixture(scope="module")
def dist() -> Path:
    with _one_builder():
        _build_unless_up_to_date()
    assert APP.is_file() and os.access(APP, os.X_OK)
    assert TRAIN.is_file() and os.access(TRAIN, os.X_OK)
    assert CTL.is_file() and os.access(CTL, os.X_OK)
    return DIST


def _build_unless_up_to_date() -> None:
    if not _up_to_date():
        cmd = _build_command()
        BUILD_LOG.parent.mkdir(exist_ok=True)
        t0 = time.monotonic()
        with open(BUILD_LOG, "w") as log:
            rc = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT).returncode
        took = time.monotonic() - t0
        with open(BUILD_LOG, "a") as log:
            log.write(f"\n{' '.join(cmd)}: exit {rc} after {took:.0f} s\n")
        if rc != 0:
            tail = BUILD_LOG.read_text(errors="replace")[-4000:]
            pytest.fail(f"{' '.join(cmd)} failed (exit {rc}), log {BUILD_LOG}:\n{tail}")
        print(f"\npackaged build: {took:.0f} s")


def _env(tmp: Path) -> dict[str, str]:
    """Nothing of the source tree or the venv leaks in; settings, runs and log under tmp."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTHON", "VIRTUAL_ENV", "HEADROOM_", "QT_"))}
    env.update(QT_QPA_PLATFORM="offscreen", HOME=str(tmp / "home"), XDG_DATA_HOME=str(tmp / "data"),
               XDG_CONFIG_HOME=str(tmp / "config"), HEADROOM_SETTINGS=str(tmp / "settings.ini"),
               HEADROOM_RUNS=str(tmp / "runs"), HEADROOM_LOG=str(tmp / "headroom.log"))
    (tmp / "home").mkdir(exist_ok=True)
    return env


def _run(cmd: list, tmp: Path, timeout: float = 600, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], cwd=tmp, env={**_env(tmp), **env}, capture_output=True,
                          text=True, timeout=timeout)


def _check_png(path: Path) -> tuple[int, int]:
    """A complete PNG: signature, IHDR first, every chunk's CRC right, image data inflates, IEND last."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, kinds, idat = 8, [], b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind = data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])
        assert zlib.crc32(kind + body) == crc, f"bad CRC in {kind!r}"
        kinds.append(kind)
        if kind == b"IDAT":
            idat += body
        pos += 12 + length
    assert kinds[0] == b"IHDR" and kinds[-1] == b"IEND" and b"IDAT" in kinds
    width, height = struct.unpack(">II", data[16:24])
    assert len(zlib.decompress(idat)) > 0
    return width, height


def test_frozen_app_trains_the_demo_and_saves_a_screenshot(dist: Path, tmp_path: Path) -> None:
    out = _run([APP, "--task", "mlp", "--epochs", "1", "--autostart", "--quit-when-done", "--screenshot", "shot.png"],
               tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    width, height = _check_png(tmp_path / "shot.png")
    assert width >= 800 and height >= 500
    runs = list((tmp_path / "runs").glob("*/run.db"))
    assert len(runs) == 1, f"expected one run folder under HEADROOM_RUNS, found {runs}"
    with sqlite3.connect(runs[0]) as db:
        assert db.execute("select count(*) from metrics").fetchone()[0] > 0
        kinds = {k for (k,) in db.execute("select kind from events")}
    assert "run_finished" in kinds


TASK_FILE = '''
"""A task written outside the bundle: imports engine, torch and standard modules Headroom itself does not use."""
import csv
import fractions
import statistics

import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

from engine import Task

assert statistics.mean([1, 2, 3]) == 2 and fractions.Fraction(1, 2) * 2 == 1 and csv.QUOTE_ALL


def loss(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y, reduction="sum"), len(y)


def build_task(seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(512, 20, generator=g)
    y = (x[:, 0] > 0).long()
    model = torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
    return Task(model=model, train_data=TensorDataset(x, y), loss=loss)
'''


def test_frozen_trainer_runs_a_task_file_from_outside_the_bundle(dist: Path, tmp_path: Path) -> None:
    task = tmp_path / "outside" / "my_task.py"
    task.parent.mkdir()
    task.write_text(TASK_FILE)
    run_dir = tmp_path / "run"
    out = _run([TRAIN, "--task", task, "--epochs", "1", "--micro-batch", "16", "--accum", "4", "--device", "cpu",
                "--run-dir", run_dir, "--json"], tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert (run_dir / "run.db").is_file()
    assert (run_dir / "checkpoints" / "last.pt").is_file()
    with sqlite3.connect(run_dir / "run.db") as db:
        assert db.execute("select count(*) from metrics").fetchone()[0] == 512 // 64
    assert '"kind": "run_finished"' in out.stdout


def test_frozen_trainer_runs_the_readme_example(dist: Path, tmp_path: Path) -> None:
    """README, "Packaged build": dist/headroom/headroom-train --task resources/example_task.py --epochs 1"""
    out = _run([TRAIN, "--task", ROOT / "resources" / "example_task.py", "--epochs", "1"], tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert len(list((tmp_path / "runs").glob("*/run.db"))) == 1
    assert "run completed" in out.stderr


def test_frozen_ctl_starts_a_run_detached_and_follows_it_to_its_end(dist: Path, tmp_path: Path) -> None:
    """headroom-ctl in the packaged folder: start runs headroom-train beside it, detached."""
    run_dir = tmp_path / "runs" / "started"
    out = _run([CTL, "start", run_dir, "--detach", "setsid", "--", "--task", "mlp", "--max-steps", "5",
                "--device", "cpu"], tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.startswith(f"started: {run_dir} (pid ")
    out = _run([CTL, "follow", run_dir, "--json"], tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    end = json.loads(out.stdout.splitlines()[-1])
    assert end["kind"] == "end" and end["status"] == "finished" and end["step"] == 5


@pytest.mark.parametrize("exe", ["headroom-train", "headroom", "headroom-ctl"])
def test_frozen_bad_flag_is_one_error_line_and_exit_2(dist: Path, tmp_path: Path, exe: str) -> None:
    args = ["status", tmp_path, "--no-such-flag"] if exe == "headroom-ctl" else ["--epochs", "1", "--no-such-flag"]
    out = _run([DIST / exe, *args], tmp_path, timeout=120)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), out.stderr
    assert "Traceback" not in out.stderr and out.stdout == ""


def test_frozen_task_needing_a_package_the_bundle_lacks_is_a_clean_error(dist: Path, tmp_path: Path) -> None:
    task = tmp_path / "needs_pandas.py"
    task.write_text("import pandas\n\ndef build_task(seed):\n    pass\n")
    out = _run([TRAIN, "--task", task, "--epochs", "1", "--run-dir", tmp_path / "run"], tmp_path, timeout=300)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and "pandas" in lines[0], out.stderr
    assert not (tmp_path / "run").exists()


def probe_marks(stdout: str) -> dict[str, float]:
    """The HEADROOM_STARTUP_PROBE line, `shown T in-process S torch_loaded 0 ...`, as {name: number}."""
    for line in stdout.splitlines():
        if line.startswith("shown "):
            words = line.split()
            return {k.replace("-", "_"): float(v) for k, v in zip(words[::2], words[1::2])}
    return {}


def _files(root: Path) -> list[str]:
    return [str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() or p.is_symlink()]


def test_frozen_folder_contents_and_size(dist: Path) -> None:
    internal = dist / "_internal"
    files = _files(internal)
    for needed in ("resources/headroom.svg", "resources/dark.qss", "resources/example_task.py",
                   "resources/headroom.desktop", "engine/tasks/builtin/data/charlm.txt", "torch/lib/libtorch_cpu.so"):
        assert (internal / needed).is_file(), needed
    unwanted = [f for f in files if f.startswith(("torch/include/", "torch/test/", "torch/share/cmake/",
                                                  "PySide6/Qt/translations/", "PySide6/Qt/qml/", "tkinter/",
                                                  "matplotlib/", "IPython/"))
                or f.endswith((".h", ".hpp", ".cuh"))
                or any(m in os.path.basename(f) for m in ("Qt6WebEngine", "Qt6Quick", "Qt6Qml", "Qt6Pdf",
                                                            "Qt63D", "Qt6Multimedia", "Qt6Charts", "_tkinter"))]
    assert not unwanted, unwanted[:20]
    size = sum(os.lstat(internal.parent / f).st_blocks * 512 for f in _files(dist))
    cpu_torch = not list((internal / "torch" / "lib").glob("libtorch_cuda*"))
    print(f"\ndist/headroom: {size / 1e6:.0f} MB ({'CPU' if cpu_torch else 'CUDA'} torch)")
    if cpu_torch:
        assert size < SIZE_LIMIT, f"{size / 1e6:.0f} MB unpacked, target under {SIZE_LIMIT / 1e6:.0f} MB"


def test_frozen_window_shows_before_torch_loads(dist: Path, tmp_path: Path) -> None:
    """The probe prints when the window is shown and painted. The 3 s cold-start target is measured
    by tests/packaging/measure.py on a quiet machine; here only a generous bound, CI being shared."""
    t0 = time.time()
    out = _run([APP], tmp_path, timeout=120, HEADROOM_STARTUP_PROBE="1")
    assert out.returncode == 0, out.stderr[-3000:]
    marks = probe_marks(out.stdout)
    assert "shown" in marks, out.stdout + out.stderr
    assert marks.get("torch_loaded") == 0, "torch was imported before the window showed"
    assert marks["shown"] - t0 < 15
