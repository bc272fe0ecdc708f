"""Run a command against a private X server: Xvfb (one 1920 x 1080 x 24 screen, on a display
number it finds free) with the openbox window manager, both stopped when the command ends.

    python tests/x11/x_server.py -- COMMAND [ARGS...]

The command gets DISPLAY (and HEADROOM_X11_DISPLAY) for that server; the exit status is the
command's. `make test` runs the x11-marked window tests this way, under QT_QPA_PLATFORM=xcb: the
offscreen platform has no window manager, no real screen and no focus, and it hid every layout,
theme and size fault of issue 28.

Where Xvfb or openbox is missing, one line says so and the command is skipped (exit 0), unless
HEADROOM_X11=required (CI sets it: .ci/run): then that line is an error and the exit status 1,
as it is whenever the server or the window manager does not come up. Standard library only.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Optional, Sequence

SCREEN = "1920x1080x24"
START_TIMEOUT_S = 15.0  # Xvfb and openbox are up in well under a second on an idle machine
STOP_TIMEOUT_S = 5.0
PACKAGES = "xvfb openbox"  # Debian / Ubuntu; .ci/run installs them


def say(line: str) -> None:
    print(f"x_server: {line}", file=sys.stderr, flush=True)


def required() -> bool:
    return os.environ.get("HEADROOM_X11", "").strip().lower() == "required"


class Xlib:
    """The two Xlib calls needed to see the server answer and a window manager own the screen
    (libX11 is there wherever Qt's X11 platform can run)."""

    def __init__(self) -> None:
        name = ctypes.util.find_library("X11") or "libX11.so.6"
        self.lib = ctypes.CDLL(name)
        self.lib.XOpenDisplay.restype = ctypes.c_void_p
        self.lib.XOpenDisplay.argtypes = [ctypes.c_char_p]
        self.lib.XCloseDisplay.argtypes = [ctypes.c_void_p]
        self.lib.XInternAtom.restype = ctypes.c_ulong
        self.lib.XInternAtom.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int]
        self.lib.XGetSelectionOwner.restype = ctypes.c_ulong
        self.lib.XGetSelectionOwner.argtypes = [ctypes.c_void_p, ctypes.c_ulong]

    def wm_running(self, display: str) -> bool:
        """A window manager holds the screen's WM_S0 selection (ICCCM 2.8: every compliant one does)."""
        dpy = self.lib.XOpenDisplay(display.encode())
        if not dpy:
            return False
        try:
            return self.lib.XGetSelectionOwner(dpy, self.lib.XInternAtom(dpy, b"WM_S0", 0)) != 0
        finally:
            self.lib.XCloseDisplay(dpy)


def start_xvfb() -> tuple[subprocess.Popen, str]:
    """Xvfb on the first free display number (-displayfd: the server picks it and writes it back)."""
    read_fd, write_fd = os.pipe()
    log = tempfile.TemporaryFile()  # a file, not a pipe: a chatty server never blocks on a full pipe
    proc = subprocess.Popen(["Xvfb", "-displayfd", str(write_fd), "-screen", "0", SCREEN, "-nolisten", "tcp",
                             "-noreset"], pass_fds=(write_fd,), stdout=subprocess.DEVNULL, stderr=log)
    os.close(write_fd)
    with os.fdopen(read_fd) as f:
        number = f.readline().strip()  # written once the server accepts connections; '' if it died
    if not number.isdigit():
        stop(proc)
        log.seek(0)
        err = log.read().decode(errors="replace").strip().splitlines()
        raise RuntimeError(f"Xvfb did not start (exit {proc.returncode}): {err[-1] if err else 'no output'}")
    log.close()
    return proc, f":{number}"


def start_wm(display: str, xlib: Xlib) -> subprocess.Popen:
    env = {**os.environ, "DISPLAY": display}
    proc = subprocess.Popen(["openbox", "--sm-disable"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + START_TIMEOUT_S
    while not xlib.wm_running(display):
        if proc.poll() is not None:
            raise RuntimeError(f"openbox exited ({proc.returncode}) before managing {display}")
        if time.monotonic() > deadline:
            stop(proc)
            raise RuntimeError(f"openbox did not manage {display} within {START_TIMEOUT_S:.0f} s")
        time.sleep(0.02)
    return proc


def stop(proc: Optional[subprocess.Popen]) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def missing_programs() -> list[str]:
    return [p for p in ("Xvfb", "openbox") if shutil.which(p) is None]


def main(argv: Sequence[str]) -> int:
    args = list(argv)
    if args[:1] == ["--"]:
        args = args[1:]
    if not args:
        say("usage: python tests/x11/x_server.py -- COMMAND [ARGS...]")
        return 2
    missing = missing_programs()
    if missing:
        what = f"{' and '.join(missing)} not found (sudo apt-get install {PACKAGES})"
        if required():
            say(f"error: HEADROOM_X11=required but {what}")
            return 1
        say(f"x11 tests skipped: {what}")
        return 0
    server = wm = cmd = None

    def on_signal(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    try:
        t0 = time.monotonic()
        server, display = start_xvfb()
        wm = start_wm(display, Xlib())
        say(f"Xvfb {SCREEN} and openbox on {display} ({time.monotonic() - t0:.1f} s)")
        env = {**os.environ, "DISPLAY": display, "HEADROOM_X11_DISPLAY": display}
        env.pop("WAYLAND_DISPLAY", None)  # Qt's xcb platform is asked for; nothing else is reachable
        cmd = subprocess.Popen(args, env=env)
        return cmd.wait()
    except (RuntimeError, OSError) as e:
        say(f"error: {e}")
        return 1
    except KeyboardInterrupt:  # Ctrl-C reached the command too; the server and the WM go with it
        return 130
    finally:
        stop(cmd)
        stop(wm)
        stop(server)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
