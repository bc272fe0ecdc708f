"""The window's QActions, in one place: the toolbar, the menus and the Controls panel show
the same Start, Pause, Resume, Stop and Apply actions, so one rule (app/session/rules.py)
sets what is enabled everywhere at once.
"""
from __future__ import annotations

from typing import Optional

from PySide6.QtCore import QEvent, QObject, Qt
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import QMainWindow, QMenu, QPushButton, QToolBar, QToolButton, QWidget

from app.core import assets
from app.core.shortcuts import SHORTCUTS
from app.session.rules import Allowed


def make_action(parent: QWidget, text: str, key: str = "", icon: str = "", tip: str = "") -> QAction:
    """An action with its shortcut (from SHORTCUTS) working anywhere in the app, and a tooltip
    that names the shortcut."""
    a = QAction(assets.icon(icon or "none"), text, parent)
    if key in SHORTCUTS:
        a.setShortcut(QKeySequence(SHORTCUTS[key]))
        a.setShortcutContext(Qt.ShortcutContext.ApplicationShortcut)
    a.setToolTip(f"{tip or text} ({SHORTCUTS[key]})" if key in SHORTCUTS else (tip or text))
    parent.addAction(a)
    return a


class ActionButton(QPushButton):
    """A push button that is a view of a QAction: clicking triggers the action, and the button
    shows the action's text, icon, tooltip and enabled state (what QToolButton.setDefaultAction
    does, for a QPushButton: the stylesheets style those as the panel's buttons)."""

    def __init__(self, action: QAction, parent: Optional[QWidget] = None) -> None:
        super().__init__(parent)
        self.action = action
        self.clicked.connect(action.trigger)
        action.changed.connect(self._sync)
        self._sync()

    def _sync(self) -> None:
        a = self.action
        self.setText(a.text())
        self.setIcon(a.icon())
        self.setToolTip(a.toolTip())
        self.setEnabled(a.isEnabled())


class RunActions(QObject):
    """Start, Pause, Unpause, Stop, Continue run and Apply changes. (`resume` is the unpause action:
    a paused run goes on. `cont` continues a stopped run from its folder, the engine's --resume.)"""

    def __init__(self, parent: QWidget) -> None:
        super().__init__(parent)
        self.start = make_action(parent, "Start", "start", "start", "Start a run with the form's settings")
        self.pause = make_action(parent, "Pause", "pause", "pause", "Pause after the current epoch")
        self.resume = make_action(parent, "Unpause", "resume", "resume", "Go on with a paused run")
        self.stop = make_action(parent, "Stop", "stop", "stop", "Stop at the next step and write a checkpoint")
        self.cont = make_action(parent, "Continue run", "continue", "resume",
                                "Continue the run shown from its last checkpoint, in its own folder (the engine's "
                                "--resume), with the form's settings")
        self.apply = make_action(parent, "Apply changes", "apply", "apply",
                                 "Send the edited settings to the run; the engine says when they apply")

    def sync(self, allowed: Allowed) -> None:
        self.start.setEnabled(allowed.start)
        self.pause.setEnabled(allowed.pause)
        self.resume.setEnabled(allowed.resume)
        self.stop.setEnabled(allowed.stop)
        self.cont.setEnabled(allowed.cont)
        self.apply.setEnabled(allowed.apply)


class AppActions(QObject):
    """Files, export, view and help; and Run on N GPUs with its launch log."""

    def __init__(self, parent: QWidget) -> None:
        super().__init__(parent)
        self.open_run = make_action(parent, "Open run folder...", "open_run", "open")
        self.open_remote = make_action(parent, "Open remote run...", icon="open",
                                       tip="Follow and steer a run on another machine, through ssh")
        self.open_task = make_action(parent, "Open task file...", "open_task", "open")
        self.csv = make_action(parent, "Export metrics (CSV)...", "export_csv", "export-csv")
        self.png = make_action(parent, "Export plots (PNG, SVG)...", "export_png", "export-png",
                               "The whole dashboard, every plot, as a PNG at 2x or an SVG")
        self.log_scale = make_action(parent, "Log scale (loss)", "log_scale")
        self.log_scale.setCheckable(True)
        self.theme = make_action(parent, "Dark theme", "theme", "theme", "Switch light/dark")
        self.theme.setCheckable(True)
        self.quit = make_action(parent, "Quit", "quit")
        self.ask_close = make_action(parent, "Ask before closing during a run",
                                     tip="Closing the window while a run trains asks first: stop it with a checkpoint, "
                                         "or cancel")
        self.fit = make_action(parent, "Fit all")
        self.torchrun = make_action(parent, "Run on N GPUs...", icon="start")
        self.torchrun.setEnabled(False)
        self.torchrun.setToolTip("Checking how many GPUs torch sees...")
        self.start_server = make_action(parent, "Start on server...", icon="start",
                                        tip="Start the form's settings on another machine through ssh, detached "
                                            "there (tmux), and follow it")
        self.open_log = make_action(parent, "Open launch log", icon="open",
                                    tip="Open the torchrun output of the last run started on N GPUs")
        self.open_log.setEnabled(False)
        self.shortcuts = make_action(parent, "Keyboard shortcuts", "shortcuts", icon="info",
                                     tip="Every keyboard shortcut of the window")
        self.about = make_action(parent, "About Headroom", icon="info",
                                 tip="Versions of Headroom, torch, CUDA, Qt and the NVIDIA driver")
        self.about.setMenuRole(QAction.MenuRole.AboutRole)

    def set_launch_gate(self, enabled: bool, tooltip: str, has_log: bool) -> None:
        self.torchrun.setEnabled(enabled)
        self.torchrun.setToolTip(tooltip)
        self.torchrun.setStatusTip(tooltip)
        self.open_log.setEnabled(has_log)


class ToolbarFit(QObject):
    """Every toolbar action stays on the toolbar as the window narrows: one button after another
    drops its words (its tooltip keeps them, with the shortcut), the last on the toolbar first
    and the run's own (Start, Pause...) last; below that, the toolbar's extension button (a
    "more" arrow, made visible) holds what is left over."""

    def __init__(self, toolbar: QToolBar, words_kept_longest: list[QAction]) -> None:
        super().__init__(toolbar)
        self.tb = toolbar
        buttons = [a for a in toolbar.actions() if not a.isSeparator()]
        others = [a for a in buttons if a not in words_kept_longest]
        self.order = [*reversed(others), *reversed(words_kept_longest)]  # the order they drop their words
        self._widths: dict[QAction, tuple[int, int]] = {}  # (with words, icon only), measured once per style
        self.compact: set[QAction] = set()  # the actions shown as an icon only now
        ext = toolbar.findChild(QToolButton, "qt_toolbar_ext_button")
        if ext is not None:  # the style sheets draw no arrow of their own on it
            ext.setIcon(assets.icon("more"))
            ext.setStyleSheet("QToolButton { padding: 0px; }")  # the themes' padding leaves its 12 px no room
            ext.setToolTip("More actions")
        toolbar.installEventFilter(self)

    def _measure(self) -> None:
        for a in self.order:
            b = self.tb.widgetForAction(a)
            if not isinstance(b, QToolButton):
                continue
            style = b.toolButtonStyle()
            b.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
            words = b.sizeHint().width()
            b.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonIconOnly)
            self._widths[a] = (words, b.sizeHint().width())
            b.setToolButtonStyle(style)

    def fit(self) -> None:
        if not self._widths:
            self._measure()
        lay = self.tb.layout()
        if lay is not None:
            lay.invalidate()
        w = self._widths
        rest = self.tb.sizeHint().width() - sum(w[a][a in self.compact] for a in w)  # separators, spacing, margins
        n = 0
        while n < len(self.order) and rest + sum(w[a][a in self.order[:n]] for a in w) > self.tb.width():
            n += 1
        compact = set(self.order[:n])
        if compact != self.compact:
            self.compact = compact
            icon, words = Qt.ToolButtonStyle.ToolButtonIconOnly, Qt.ToolButtonStyle.ToolButtonTextBesideIcon
            for a in w:
                button = self.tb.widgetForAction(a)
                if isinstance(button, QToolButton):
                    button.setToolButtonStyle(icon if a in compact else words)

    def eventFilter(self, obj: QObject, ev: QEvent) -> bool:  # noqa: N802 - Qt name
        if ev.type() in (QEvent.Type.StyleChange, QEvent.Type.FontChange):
            self._widths = {}  # a theme's padding or a font changes every width
        if ev.type() in (QEvent.Type.Resize, QEvent.Type.StyleChange, QEvent.Type.FontChange):
            self.fit()
        return False


def install(window: QMainWindow, run: RunActions, app: AppActions, docks: list[QAction]) -> tuple[QToolBar, QMenu]:
    """The toolbar and the menu bar. Returns the toolbar and the Run menu (it checks the GPUs
    when it opens)."""
    tb = window.addToolBar("Run")
    tb.setObjectName("toolbar_run")
    tb.setMovable(False)
    tb.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
    for a in (run.start, run.pause, run.resume, run.stop, run.cont, None, app.open_run, app.open_task, None, app.csv,
              app.png, None, app.theme):
        tb.addSeparator() if a is None else tb.addAction(a)
    ToolbarFit(tb, [run.start, run.pause, run.resume, run.stop, run.cont])
    mb = window.menuBar()
    _menu(mb.addMenu("&File"), (app.open_run, app.open_remote, app.open_task, None, app.csv, app.png, None, app.ask_close, app.quit))
    run_menu = _menu(mb.addMenu("&Run"), (run.start, run.pause, run.resume, run.stop, run.cont, None, run.apply, None,
                                          app.torchrun, app.open_log, app.start_server))
    run_menu.setToolTipsVisible(True)  # the disabled "Run on N GPUs..." says why
    _menu(mb.addMenu("&View"), (app.log_scale, app.fit, app.theme, None, *docks))
    _menu(mb.addMenu("&Help"), (app.shortcuts, None, app.about))
    return tb, run_menu


def toolbar_button(toolbar: QToolBar, action: QAction) -> QToolButton:
    """The button the toolbar shows for an action (what a person clicks)."""
    button = toolbar.widgetForAction(action)
    assert isinstance(button, QToolButton), action.text()
    return button


def _menu(menu: QMenu, actions: tuple[Optional[QAction], ...]) -> QMenu:
    for a in actions:
        menu.addSeparator() if a is None else menu.addAction(a)
    return menu
