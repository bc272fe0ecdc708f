"""Status bar: where the run stands, the current epoch's progress bar ("epoch 2: 37% · ETA
1:24", app/model/epoch_progress.py), the run's ETA, step and elapsed time; who writes the run;
device, CUDA or CPU and torch version.

A field is shown whole or not at all: when the bar is too narrow for every field (a 1024 px
laptop window), the least important ones leave first (PRIORITY), never a cut "elap..." in each.
The fields left out are in the bar's tooltip. Where the run stands and news of the moment
("Wrote run.png") may be cut (the whole text in the label's tooltip) rather than not said."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QLabel, QProgressBar, QStatusBar, QWidget

from app.model.epoch_progress import EpochProgress, ProgressTracker, fmt_duration, fmt_eta
from app.model.runmodel import RunModel
from app.model.state import RunState
from app.model.stored import whole
from app.ui.elided import ElidedLabel

__all__ = ["ElidedLabel", "LiveLabel", "StatusBar", "fmt_duration", "state_text", "PRIORITY"]

# Most important first: where the run stands (connection lost included), the epoch's progress and
# the run's ETA; the device and the torch version last.
PRIORITY = ("state", "epoch", "eta", "note", "live", "progress", "elapsed", "backend", "device", "torch")
GAP_PX = 8  # the bar's spacing between fields (6) and a little room, so a field shown is never cut
EDGE_PX = 24  # the bar's own margins and its size grip
NOTE_MIN_PX = 140  # news cut to less than this is not shown (it is in the tooltip)


def state_text(view_state: str, state: RunState, model: RunModel) -> str:
    """One or two words for where the run stands, e.g. 'Paused after epoch 2', 'Stopped',
    'Viewing (gave up)': how a run ended is said as app/model/ending.py says it."""
    st = view_state
    if st == "idle" and state.is_over:
        st = state.value
    over = model.ending().word if state.is_over else ""
    return {"idle": "Ready", "starting": "Starting", "training": "Training", "pausing": "Pausing",
            "paused": f"Paused after epoch {model.epoch}", "stopping": "Stopping",
            "reconnecting": "Connection lost: reconnecting",
            "viewing": f"Viewing ({over.lower()})" if over else "Viewing",
            "finished": over, "failed": over, "interrupted": over}.get(st, st)


def torch_version_quietly() -> str:
    """torch's version without importing torch (the window shows before torch loads)."""
    try:
        from importlib.metadata import version
        return version("torch")
    except Exception:
        return "not installed"


class LiveLabel(ElidedLabel):
    """Who writes the run shown, while it is going: "live: pid N on HOST" (this process for
    its own run; the holder of the run folder's writer lock for a run trained elsewhere)."""

    def __init__(self) -> None:
        super().__init__("")
        self.setObjectName("live_writer")
        self.changed: Callable[[], None] = lambda: None  # the status bar fits its fields again

    def show_text(self, text: str) -> None:
        if text != self.text():
            self.setText(text)
            self.changed()


@dataclass
class Field:
    """One field of the bar: its widgets (shown or left out together) and whether it has
    anything to say now."""
    widgets: tuple[QWidget, ...]
    wanted: Callable[[], bool]
    may_cut: bool = False  # cut rather than left out (where the run stands; news the user asked for)

    def width(self) -> int:
        return sum(w.sizeHint().width() + GAP_PX for w in self.widgets)

    def text(self) -> str:
        return " ".join(w.text() for w in self.widgets if isinstance(w, QLabel) and w.text())


class StatusBar(QStatusBar):
    def __init__(self, parent: Optional[QWidget] = None) -> None:
        super().__init__(parent)
        self.device = ElidedLabel("Device: chosen at start")
        self.backend = ElidedLabel("")
        self.torch = ElidedLabel(f"torch {torch_version_quietly()}")
        self.progress = ElidedLabel("step -")
        self.epoch_bar = QProgressBar()  # the bar, and its words beside it (easier to read than on it)
        self.epoch_bar.setObjectName("epoch_progress")
        self.epoch_bar.setTextVisible(False)
        self.epoch_bar.setFixedSize(120, 10)
        self.epoch_text = ElidedLabel("")
        tip = ("The current epoch: optimizer steps done of those planned (the data set over the samples per step), "
               "and when it ends at the last steps' pace")
        for w in (self.epoch_bar, self.epoch_text):
            w.setToolTip(tip)
        self._epoch_shown = False  # the run has an epoch in progress to show
        self.elapsed = ElidedLabel("elapsed --")
        self.eta = ElidedLabel("ETA --")
        self.state = ElidedLabel("Ready")
        self.live = LiveLabel()  # "live: pid N on HOST" while the run shown is going
        self.live.changed = self.fit
        self.tracker = ProgressTracker()
        self.note = ElidedLabel("")  # news of the moment ("Wrote run.png"), in its own place
        self.note.setObjectName("hint")
        self._note_timer = QTimer(self)
        self._note_timer.setSingleShot(True)
        self._note_timer.timeout.connect(lambda: self._set_note(""))
        for w in (self.state, self.epoch_bar, self.epoch_text, self.progress, self.elapsed, self.eta):
            self.addWidget(w)
        self.addWidget(self.note, 1)
        for w in (self.live, self.backend, self.device, self.torch):
            self.addPermanentWidget(w)

        def has_text(label: QLabel) -> Callable[[], bool]:
            return lambda: bool(label.text())

        self.fields: dict[str, Field] = {
            "state": Field((self.state,), has_text(self.state), may_cut=True),
            "epoch": Field((self.epoch_bar, self.epoch_text), lambda: self._epoch_shown),
            "eta": Field((self.eta,), has_text(self.eta)),
            "note": Field((self.note,), has_text(self.note), may_cut=True),
            "live": Field((self.live,), has_text(self.live)),
            "progress": Field((self.progress,), has_text(self.progress)),
            "elapsed": Field((self.elapsed,), has_text(self.elapsed)),
            "backend": Field((self.backend,), has_text(self.backend)),
            "device": Field((self.device,), has_text(self.device)),
            "torch": Field((self.torch,), has_text(self.torch)),
        }
        assert tuple(self.fields) == PRIORITY
        self.left_out: list[str] = []  # the fields with something to say that had no room
        self.fit()

    # -- fitting -------------------------------------------------------------------------
    def fit(self) -> None:
        """Show the fields in PRIORITY order while they fit whole; leave out the rest."""
        room = self.width() - EDGE_PX
        left_out: list[str] = []
        tips: list[str] = []
        for name, f in self.fields.items():
            if not f.wanted():
                self._show(f, False)
                continue
            need = f.width()
            if need <= room:
                self._show(f, True)
                room -= need
            elif f.may_cut and room >= NOTE_MIN_PX:
                self._show(f, True, room - GAP_PX)
                room = 0
            else:
                self._show(f, False)
                left_out.append(name)
                tips.append(f.text())
        self.left_out = left_out
        self.setToolTip("\n".join(t for t in tips if t))

    @staticmethod
    def _show(f: Field, on: bool, width: int = 0) -> None:
        for w in f.widgets:
            if f.may_cut:
                w.setMaximumWidth(width or 16777215)  # the layout gives it this much, never more
            if w.isHidden() == on:
                w.setVisible(on)

    def shown(self) -> list[str]:
        """The fields shown now, in PRIORITY order."""
        return [name for name, f in self.fields.items() if f.wanted() and name not in self.left_out]

    def resizeEvent(self, ev) -> None:  # noqa: N802 - Qt name
        super().resizeEvent(ev)
        self.fit()

    # -- news ----------------------------------------------------------------------------
    def say(self, text: str, ms: int = 6000) -> None:
        """Show news for a while beside the run's progress (showMessage would cover it)."""
        self._set_note(text)
        self._note_timer.start(ms)

    def _set_note(self, text: str) -> None:
        self.note.setText(text)
        self.fit()

    def update_from(self, model: Optional[RunModel], state: RunState, text: str) -> None:
        self.state.setText(text)
        if model is None:
            self.fit()
            return
        info = model.info
        if info:
            dev = str(info.get("device") or "")
            name = str(info.get("device_name") or "")
            world = whole(info.get("world_size") or 1, 1)
            cuda = dev.startswith("cuda")
            self.backend.setText("CUDA" if cuda else "CPU")
            self.device.setText(f"{name} ({dev})" + (f" x {world}" if world > 1 else ""))
            if info.get("torch_version"):
                self.torch.setText(f"torch {info['torch_version']}")
        epochs = model.config.get("epochs")
        prog = self.tracker.progress(model)
        if model.step:
            total = f" of {epochs}" if epochs else ""
            self.progress.setText(f"step {model.step:,}, epoch {model.epoch}{total}")
        else:
            self.progress.setText("step -")
        self.elapsed.setText(f"elapsed {fmt_duration(self.tracker.elapsed(model, state.is_live))}")  # all segments
        self._show_progress(prog, state, model)
        if state is RunState.PAUSED:
            self.eta.setText("ETA: paused")  # the clock stops while the run waits
        elif state.is_live:
            eta = prog.run_eta if prog is not None else None  # none until the pace is known (epoch_progress)
            self.eta.setText(f"ETA {fmt_eta(eta)}" if eta is not None else "ETA after the first steps")
        else:
            self.eta.setText("ETA --")
        self.fit()

    def _show_progress(self, prog: Optional[EpochProgress], state: RunState, model: RunModel) -> None:
        bar = self.epoch_bar
        self._epoch_shown = prog is not None
        if prog is None:
            return
        running = state.is_live and state is not RunState.PAUSED
        if prog.by_steps:
            bar.setRange(0, max(1, int(prog.max_steps or 1)))
            bar.setValue(min(prog.step, bar.maximum()))
        else:
            bar.setRange(0, max(1, prog.total or prog.done))
            bar.setValue(min(prog.done, bar.maximum()))
        text = prog.text(eta_shown=running)
        if state is RunState.PAUSED:
            text += " \u00b7 paused"
        elif state.is_over and prog.fraction < 1.0:
            text += f" \u00b7 {model.ending().word.lower()}"  # the rest of the epoch was not trained
        self.epoch_text.setText(text)
        bar.setFormat(text)  # no %p, %v or %m in it: Qt shows it as it is (an accessible name, a tooltip)
