"""What every test folder shares: the repository root, the engine's and the app's command lines
run as a user runs them, and waiting for a condition instead of sleeping a fixed time.

Imported by name (`from testkit import ROOT, run_engine, wait_until`): tests/conftest.py puts
the repository and tests/ first on sys.path before any test module is imported.
"""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Optional

ROOT = Path(__file__).resolve().parents[1]

# Variables the fault-injection task files read (tests/faults/fault_task.py, blocking_task.py):
# a subprocess only gets them when a test passes them in `env`.
FAULT_PREFIX = "HEADROOM_FAULT_"


def isolated_env(folder: Path) -> dict[str, str]:
    """Settings, runs folder, log, data dir and the Hugging Face cache under `folder`, offline:
    what conftest's `isolated` sets for every test (under its tmp_path), and what a module
    fixture's run, made before any test's `isolated` applies, passes as its env."""
    return {"HEADROOM_SETTINGS": str(folder / "settings.ini"), "HEADROOM_RUNS": str(folder / "runs"),
            "HEADROOM_LOG": str(folder / "headroom.log"), "XDG_DATA_HOME": str(folder / "data"),
            "HF_HOME": str(folder / "hf"), "HF_HUB_OFFLINE": "1"}


def subprocess_env(env: Optional[Mapping[str, str]] = None) -> dict[str, str]:
    """os.environ without fault-injection switches, the repository first on PYTHONPATH, plus `env`."""
    e = {k: v for k, v in os.environ.items() if not k.startswith(FAULT_PREFIX)}
    e["PYTHONPATH"] = str(ROOT)
    e.setdefault("QT_QPA_PLATFORM", "offscreen")
    e.update(env or {})
    return e


def run_cli(module: str, *args: Any, cwd: Any = ROOT, env: Optional[Mapping[str, str]] = None,
            timeout: float = 180, **kw: Any) -> subprocess.CompletedProcess:
    """`python -m <module> args...` in a subprocess, text output captured (see subprocess_env)."""
    return subprocess.run([sys.executable, "-m", module, *map(str, args)], cwd=cwd, env=subprocess_env(env),
                          capture_output=True, text=True, timeout=timeout, **kw)


def run_engine(*args: Any, **kw: Any) -> subprocess.CompletedProcess:
    """The headless engine's command line: `python -m engine args...` (keywords: see run_cli)."""
    return run_cli("engine", *args, **kw)


def run_app(*args: Any, **kw: Any) -> subprocess.CompletedProcess:
    """The app's command line, offscreen: `python -m app args...` (keywords: see run_cli)."""
    return run_cli("app", *args, **kw)


def wait_until(cond: Callable[[], Any], timeout: float = 60.0, what: str = "", interval: float = 0.02,
               pause: Optional[Callable[[], None]] = None) -> Any:
    """Poll cond() until it is truthy and return its value; fail naming `what` after `timeout`
    seconds. `pause` waits between polls (default: sleep `interval`; the app tests pass one that
    processes Qt events). A loaded machine makes this slower, never wrong, where a fixed sleep
    would be either too short there or wasted time everywhere else."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or cond}")
        if pause is not None:
            pause()
        else:
            time.sleep(interval)


@contextlib.contextmanager
def json_server(path: str = "headroom") -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A real HTTP server on 127.0.0.1 that keeps every JSON body posted to it: (Apprise's
    json:// URL for it, the bodies received), for the notification tests."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    received: list[dict[str, Any]] = []

    class Keep(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name for the handler
            received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Keep)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"json://127.0.0.1:{httpd.server_address[1]}/{path}", received
    finally:
        httpd.shutdown()
        httpd.server_close()
