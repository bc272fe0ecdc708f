"""`python -m app` / `headroom`: the desktop app.

Takes the engine's run flags (engine.cli.add_run_flags) plus --autostart, --screenshot
PATH and --quit-when-done, so scripts and tests can drive it:

    QT_QPA_PLATFORM=offscreen python -m app --task mlp --epochs 2 --autostart --quit-when-done --screenshot shot.png

A bad flag prints one `error: ...` line on stderr and exits 2, before any window.
A task file that fails to load is a dialog in the window (and, with --quit-when-done,
also an `error:` line and exit 2). torch is not imported on the way to the window.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from typing import Any, Optional, Sequence

from engine.cli import add_run_flags, config_from_args
from engine.config import ConfigError, TrainConfig

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2
_T0 = time.perf_counter()


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2, no usage dump
        raise ConfigError(message)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="headroom", description="Headroom: a training monitor built around gradient accumulation. "
                                             "Takes the same run flags as headroom-train.")
    add_run_flags(p)
    g = p.add_argument_group("app")
    g.add_argument("--autostart", action="store_true", help="start the run at once")
    g.add_argument("--screenshot", metavar="PATH", help="save a PNG of the window when the run ends")
    g.add_argument("--quit-when-done", action="store_true", help="quit when the run ends (exit 0, 1 failed, 2 bad input)")
    g.add_argument("--open", metavar="RUN_DIR", help="show a run folder (finished, or training elsewhere)")
    g.add_argument("--theme", choices=("light", "dark"), help="colour theme (default: the last one used)")
    from .ui import scripted  # --x-axis, --apply-at, --change, --screenshot-step (no Qt)
    scripted.add_flags(g)
    return p


def check_task_spec(spec: str) -> None:
    """What can be checked without torch: a missing task file, an unknown built-in name."""
    from engine.paths import BUILTIN_TASKS
    if spec in BUILTIN_TASKS:
        return
    if spec.endswith(".py") or os.sep in spec or "/" in spec:
        if not os.path.isfile(spec):
            raise ConfigError(f"task file {spec}: no such file")
        return
    if ":" in spec:
        return  # module:attr, imported when the run starts
    raise ConfigError(f"unknown task {spec!r}: use one of {', '.join(BUILTIN_TASKS)}, a path/to/file.py or module:attr")


def parse_args(argv: Optional[Sequence[str]]) -> tuple[argparse.Namespace, dict[str, Any]]:
    """Returns the namespace and the run flags given (as TrainConfig fields). Raises ConfigError."""
    ns = build_parser().parse_args(argv)
    given = {k: v for k, v in vars(ns).items() if k in TrainConfig.__dataclass_fields__}
    if "resume" in given:
        base = config_from_args(ns).to_dict()  # the run's saved config under the flags given
    else:
        TrainConfig.from_dict(given).validate()
        base = given
    if "task" in given:
        check_task_spec(str(given["task"]))
    if ns.screenshot:
        folder = os.path.dirname(os.path.abspath(ns.screenshot))
        if not os.path.isdir(folder):
            raise ConfigError(f"--screenshot {ns.screenshot}: folder {folder} does not exist")
    if ns.open and not os.path.isfile(os.path.join(ns.open, "run.db")):
        raise ConfigError(f"--open {ns.open}: not a run folder (no run.db)")
    if ns.quit_when_done and not (ns.autostart or ns.open):
        raise ConfigError("--quit-when-done needs --autostart or --open")
    if ns.autostart and ns.open:
        raise ConfigError("--autostart and --open: choose one")
    from .ui import scripted
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

    from .core import logs
    logs.setup()
    from PySide6.QtCore import QTimer, qInstallMessageHandler
    from PySide6.QtWidgets import QApplication

    install_message_filter(qInstallMessageHandler)

    from .core import assets, compat  # noqa: F401 - compat: see app/core/compat.py
    from .window import MainWindow

    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setApplicationName("Headroom")
    app.setOrganizationName("Headroom")
    app.setApplicationDisplayName("Headroom")
    from PySide6.QtGui import QGuiApplication
    QGuiApplication.setDesktopFileName("headroom")  # Wayland/X11: matches headroom.desktop (icon, grouping)
    app.setWindowIcon(assets.app_icon())
    win = MainWindow(base_config=base, theme=ns.theme)
    exit_code = {"code": EXIT_OK}

    def finish(outcome: dict[str, Any]) -> None:
        status = outcome.get("status")
        if ns.screenshot and ns.screenshot_step is None:  # else taken at that step
            if not win.screenshot(ns.screenshot):
                print_error(f"--screenshot {ns.screenshot}: could not write the PNG")
        if not ns.quit_when_done:
            return
        if status == "bad_input":
            print_error(str(outcome.get("message")))
            code = EXIT_BAD_INPUT
        elif status == "failed":
            print_error(f"run failed: {outcome.get('message')}")
            code = EXIT_FAILED
        elif outcome.get("reason") == "nonfinite":
            print_error("non-finite loss or gradient: the run stopped (--nonfinite stop)")
            code = EXIT_FAILED
        else:
            code = EXIT_OK
        exit_code["code"] = code
        QTimer.singleShot(0, win.close_now)
        QTimer.singleShot(0, lambda: app.exit(code))

    from .ui import scripted
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

        win.placeholder.paint_listeners.insert(0, shown)
        win.plot_listeners.append(lambda panel: panel.canvas.paint_listeners.append(plotted))

    if ns.open:
        def show_run() -> None:
            ok = win.open_run(ns.open)
            if ns.screenshot or ns.quit_when_done:
                finish({"status": "finished" if ok else "bad_input",
                        "message": win.last_error[1] if win.last_error else ""})
        QTimer.singleShot(0, show_run)
    elif ns.autostart:
        def autostart() -> None:
            if not win.start_run() and ns.quit_when_done:
                finish({"status": "bad_input", "message": win.last_error[1] if win.last_error else "cannot start"})
        QTimer.singleShot(0, autostart)

    # Ctrl+C / SIGTERM close the window the normal way (stop, checkpoint, join). Python runs
    # signal handlers only between bytecodes, so a light timer keeps the interpreter ticking.
    def on_signal(_signum: int, _frame: Any) -> None:
        QTimer.singleShot(0, win.close)

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    heartbeat = QTimer()
    heartbeat.start(200)
    heartbeat.timeout.connect(lambda: None)

    rc = app.exec()
    heartbeat.stop()
    if win.runner.is_busy():  # never leave with the engine thread alive (and never terminate it)
        win.runner.stop()
        while not win.runner.join(1.0):
            app.processEvents()
    win.deleteLater()
    app.processEvents()
    return rc if rc else exit_code["code"] if ns.quit_when_done else rc
