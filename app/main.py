"""`python -m app` / `headroom`: the desktop app.

Takes the engine's run flags (engine.declarations.run_flags) plus --autostart, --screenshot
PATH and --quit-when-done, so scripts and tests can drive it:

    QT_QPA_PLATFORM=offscreen python -m app --task mlp --epochs 2 --autostart --quit-when-done --screenshot shot.png

A bad flag prints one `error: ...` line on stderr and exits 2, before any window (a
--screenshot path that cannot be written too: its folder is tried first). A task file
that fails to load is a dialog in the window (and, with --quit-when-done, also an `error:`
line and exit 2). With --quit-when-done: exit 1 if the run failed, if the PNG could not be
written at the end, or if the run folder given to --open could not be shown.

SIGTERM / Ctrl+C: the window closes the normal way (the engine stops at the next
micro-batch with a checkpoint, exit 0); at a second signal, or if the engine thread is
still in task code FORCE_AFTER_S after a SIGTERM, the app ends at once (run.db committed
first, exit 130), never staying alive invisible. torch is not imported on the way to the window.
"""
from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time
from typing import Any, Optional, Sequence

from engine.ctl.client import is_remote
from engine.declarations.config import ConfigError, TrainConfig
from engine.declarations.run_flags import FlagParser, add_run_flags
from engine.declarations.run_flags import given as given_flags
from engine.run_config import config_from_args

log = logging.getLogger("headroom.main")
EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130
FORCE_AFTER_S = 5.0  # after a SIGTERM: how long the engine thread may take to stop
_T0 = time.perf_counter()


def build_parser() -> argparse.ArgumentParser:
    p = FlagParser(prog="headroom", description="Headroom: a training monitor built around gradient accumulation. "
                                             "Takes the same run flags as headroom-train.")
    add_run_flags(p)
    g = p.add_argument_group("app")
    g.add_argument("--autostart", action="store_true", help="start the run at once")
    g.add_argument("--screenshot", metavar="PATH", help="save a PNG of the window when the run ends")
    g.add_argument("--quit-when-done", action="store_true", help="quit when the run ends (exit 0, 1 failed, 2 bad input)")
    g.add_argument("--open", metavar="RUN_DIR", help="show a run folder (finished, or training elsewhere), or "
                   "[user@]host:path on another machine (through ssh)")
    g.add_argument("--theme", choices=("light", "dark"), help="colour theme (default: the last one used)")
    from .ui.shell import scripted  # --x-axis, --apply-at, --change, --screenshot-step (no Qt)
    scripted.add_flags(g)
    return p


def check_task_spec(spec: str) -> None:
    """What can be checked without torch: a missing task file, an unknown built-in name."""
    from engine.declarations.paths import BUILTIN_TASKS
    if spec in BUILTIN_TASKS:
        return
    if spec.endswith(".py") or os.sep in spec or "/" in spec:
        if not os.path.isfile(spec):
            raise ConfigError(f"task file {spec}: no such file")
        return
    if ":" in spec:
        return  # module:attr, imported when the run starts
    raise ConfigError(f"unknown task {spec!r}: use one of {', '.join(BUILTIN_TASKS)}, a path/to/file.py or module:attr")


def screenshot_problem(path: str) -> str:
    """Why a PNG could not be written at `path`, checked before any window (a file made and
    removed in its folder), or ''."""
    import tempfile
    full = os.path.abspath(path)
    if path.endswith(("/", os.sep)) or os.path.isdir(full):
        return "is a folder, not a file name"
    folder = os.path.dirname(full)
    if not os.path.isdir(folder):
        return f"folder {folder} does not exist"
    try:
        fd, probe = tempfile.mkstemp(prefix=".headroom-probe-", suffix=".png", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        return f"folder {folder} is not writable ({e.strerror or e})"
    if os.path.exists(full) and not os.access(full, os.W_OK):
        return "the file exists and is not writable"
    return ""


def parse_args(argv: Optional[Sequence[str]]) -> tuple[argparse.Namespace, dict[str, Any]]:
    """Returns the namespace and the run flags given (as TrainConfig fields). Raises ConfigError."""
    ns = build_parser().parse_args(argv)
    given = given_flags(ns)
    if "resume" in given or "fork" in given:
        # The run's (or the parent's) saved config under the flags given, as the engine's own
        # --resume and --fork read it: the form starts from it, so Start trains that fork.
        base = config_from_args(ns).to_dict()
    else:
        TrainConfig.from_dict(given).validate()
        base = given
    if "task" in given:
        check_task_spec(str(given["task"]))
    if ns.screenshot:
        problem = screenshot_problem(ns.screenshot)
        if problem:
            raise ConfigError(f"--screenshot {ns.screenshot}: {problem}")
    if ns.open and not is_remote(ns.open) and not os.path.isfile(os.path.join(ns.open, "run.db")):
        raise ConfigError(f"--open {ns.open}: not a run folder (no run.db)")
    if ns.quit_when_done and not (ns.autostart or ns.open):
        raise ConfigError("--quit-when-done needs --autostart or --open")
    if ns.autostart and ns.open:
        raise ConfigError("--autostart and --open: choose one")
    from .ui.shell import scripted
    ns.scripted_changes = scripted.check(ns)
    return ns, base


_NOISE = ("This plugin does not support propagateSizeHints()",)


def print_error(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)


def install_message_filter(install: Any) -> None:
    """Drop the offscreen platform's harmless noise; pass everything else through to stderr."""
    def handler(_mode: Any, _context: Any, message: str) -> None:
        if message in _NOISE:
            return
        sys.stderr.write(message + "\n")
    install(handler)


def main(argv: Optional[Sequence[str]] = None) -> int:
    try:
        ns, base = parse_args(argv)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT

    from .core import syslibs
    libs_missing = syslibs.problem(syslibs.missing())  # before Qt aborts on them, one after another
    if libs_missing:
        print_error(libs_missing)
        return EXIT_FAILED
    from .core import logs
    logs.setup()
    logs.install_excepthook()  # an exception in any slot: in headroom.log, and an alert in the window
    from PySide6.QtCore import QTimer, qInstallMessageHandler
    from PySide6.QtWidgets import QApplication

    install_message_filter(qInstallMessageHandler)

    from .core import assets, compat  # noqa: F401 - compat: see app/core/compat.py
    from .main_window import MainWindow
    from .model.title import APP_NAME

    existing = QApplication.instance()
    app = existing if isinstance(existing, QApplication) else QApplication(sys.argv[:1])
    app.setApplicationName("Headroom")
    app.setOrganizationName("Headroom")
    app.setApplicationDisplayName(APP_NAME)  # Qt appends it to a window title that does not end with it (title.py)
    from PySide6.QtGui import QGuiApplication
    QGuiApplication.setDesktopFileName("headroom")  # Wayland/X11: matches headroom.desktop (icon, grouping)
    app.setWindowIcon(assets.app_icon())
    win = MainWindow(base_config=base, theme=ns.theme)
    exit_code = {"code": EXIT_OK}

    def take_screenshot() -> bool:
        """The PNG at the end; False (with one error line) if it could not be written."""
        why = "could not write the PNG"
        try:
            if win.screenshot(ns.screenshot):
                return True
        except Exception as e:  # noqa: BLE001 - a folder gone or replaced since the start, a full disk
            log.warning("screenshot %s failed: %s", ns.screenshot, e)
            why = f"could not write the PNG ({getattr(e, 'strerror', None) or e})"
        print_error(f"--screenshot {ns.screenshot}: {why}")
        return False

    def finish(outcome: dict[str, Any]) -> None:
        try:
            code = outcome_code(outcome)
        except Exception as e:  # noqa: BLE001 - never a traceback, never a window left open
            log.exception("finishing failed")
            print_error(f"{type(e).__name__}: {e}")
            code = EXIT_FAILED
        if not ns.quit_when_done:
            return
        exit_code["code"] = code
        QTimer.singleShot(0, win.close_now)
        QTimer.singleShot(0, lambda: app.exit(code))

    def outcome_code(outcome: dict[str, Any]) -> int:
        status = outcome.get("status")
        shot_ok = True
        if ns.screenshot and ns.screenshot_step is None:  # else taken at that step
            shot_ok = take_screenshot()
        if not ns.quit_when_done:
            return EXIT_OK
        if status == "bad_input":
            print_error(str(outcome.get("message")))
            return EXIT_BAD_INPUT
        if status == "not_shown":
            print_error(str(outcome.get("message")))
            return EXIT_FAILED
        if status == "failed":
            print_error(f"run failed: {outcome.get('message')}")
            return EXIT_FAILED
        if outcome.get("reason") == "nonfinite":
            print_error("non-finite loss or gradient: the run stopped (--nonfinite stop)")
            return EXIT_FAILED
        return EXIT_OK if shot_ok else EXIT_FAILED

    from .ui.shell import scripted
    script = scripted.install(win, ns, ns.scripted_changes)  # noqa: F841 - lives with the window
    win.run_done_callbacks.append(finish)
    win.closed.connect(app.quit)  # a window hidden while its engine thread finished does not quit by itself
    if ns.screenshot:  # scripted screenshots: the same size and layout every time, whatever was saved
        win.resize(1440, 900)
        win.use_default_layout()
    win.show()

    if os.environ.get("HEADROOM_STARTUP_PROBE"):  # bench/ui_latency.py: time to the window, then the plots
        marks: dict[str, float] = {}

        def shown(_when: float) -> None:
            marks.setdefault("shown", time.time())
            marks.setdefault("shown_in_process", time.perf_counter() - _T0)
            marks.setdefault("torch", float("torch" in sys.modules))

        def plotted(_when: float) -> None:
            if "plots" in marks:
                return
            marks["plots"] = time.time()
            print(f"shown {marks.get('shown', marks['plots']):.6f} in-process "
                  f"{marks.get('shown_in_process', time.perf_counter() - _T0):.4f} "
                  f"torch_loaded {int(marks.get('torch', 0) or 'torch' in sys.modules)} plots {marks['plots']:.6f}",
                  flush=True)
            QTimer.singleShot(0, win.close_now)
            QTimer.singleShot(0, lambda: app.exit(0))

        win.central.placeholder.paint_listeners.insert(0, shown)
        win.plot_listeners.append(lambda panel: panel.canvas.paint_listeners.append(plotted))

    if ns.open:
        def show_run() -> None:
            try:
                ok = win.open_run(ns.open)
            except Exception as e:  # noqa: BLE001 - a bug on a damaged run: say it, never hang
                log.exception("opening %s failed", ns.open)
                if ns.screenshot or ns.quit_when_done:
                    finish({"status": "not_shown", "message": f"--open {ns.open}: the run could not be shown "
                                                              f"({type(e).__name__}: {e})"})
                else:
                    win.show_error("Cannot open the run folder", f"{type(e).__name__}: {e}")
                return
            if ns.screenshot or ns.quit_when_done:
                finish({"status": "finished" if ok else "bad_input",
                        "message": win.last_error[1] if win.last_error else ""})
        QTimer.singleShot(0, show_run)
    elif not (ns.autostart or ns.screenshot or ns.quit_when_done):
        QTimer.singleShot(0, lambda: win.tree.open_last_run(win.preferences))  # day two: not an empty window
    if ns.autostart and not ns.open:
        def autostart() -> None:
            if not win.start_run() and ns.quit_when_done:
                finish({"status": "bad_input", "message": win.last_error[1] if win.last_error else "cannot start"})
        QTimer.singleShot(0, autostart)

    # Ctrl+C / SIGTERM close the window the normal way (stop, checkpoint, join). At a second
    # signal, or FORCE_AFTER_S after a SIGTERM whose engine thread has not ended (task code
    # blocked in a read that never returns), the process ends anyway: what the run store holds
    # is committed first (its flusher commits rows at least once a second anyway), exit 130.
    # A first Ctrl+C waits for the engine as long as it takes (a task still loading, say): the
    # user at the terminal presses it again to end at once. Python runs signal handlers only
    # between bytecodes, so a light timer keeps the interpreter ticking.
    signals = {"count": 0}

    def end_now(why: str) -> None:
        if not win.runner.is_busy():
            return  # it has ended: the normal way out goes on
        saved = win.runner.abandon(timeout=3.0)
        step = win.runner.step()
        print_error(f"{why}: ended at once{f' at step {step}' if step is not None else ''}, without a checkpoint"
                    + ("" if saved is None else "; run.db holds every step so far" if saved
                       else "; run.db could not take the last rows"))
        log.warning("ended with the engine thread still running (%s)", why)
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(EXIT_INTERRUPTED)

    force = QTimer()
    force.setSingleShot(True)
    force.timeout.connect(lambda: end_now(f"SIGTERM: the engine did not stop within {FORCE_AFTER_S:g} s"))

    def on_signal(signum: int, _frame: Any) -> None:
        signals["count"] += 1
        if signals["count"] > 1:
            end_now("interrupted twice")
            return
        QTimer.singleShot(0, win.close_without_asking)  # a signal is no person to ask
        if signum == signal.SIGTERM:  # a process manager: it kills what does not go; Ctrl+C waits for a second one
            force.start(int(FORCE_AFTER_S * 1000))

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    heartbeat = QTimer()
    heartbeat.start(200)
    heartbeat.timeout.connect(lambda: None)

    rc = app.exec()
    heartbeat.stop()
    if not win.runner.is_busy():
        force.stop()  # the engine ended in time: nothing left to force (a thread still busy keeps it armed)
    if win.runner.is_busy():  # never leave with the engine thread alive (and never terminate it)
        win.runner.stop()
        while not win.runner.join(1.0):
            app.processEvents()
    win.deleteLater()
    app.processEvents()
    return rc if rc else exit_code["code"] if ns.quit_when_done else rc
