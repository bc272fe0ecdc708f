"""Status bar: where the run stands, the current epoch's progress bar ("epoch 2: 37% · ETA
1:24", app/model/epoch_progress.py), step, elapsed and the run's ETA; device, CUDA or CPU and
torch version."""
from __future__ import annotations

from typing import Optional

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QProgressBar, QStatusBar, QWidget

from app.model.runmodel import RunModel
from app.ui.elided import ElidedLabel
from app.model.state import RunState
from app.model.stored import whole
from app.model.epoch_progress import EpochProgress, ProgressTracker, fmt_duration, fmt_eta

__all__ = ["ElidedLabel", "LiveLabel", "StatusBar", "fmt_duration", "state_text"]


def state_text(view_state: str, state: RunState, model: RunModel) -> str:
    """One or two words for where the run stands, e.g. 'Paused after epoch 2', 'Stopped',
    'Viewing (gave up)': how a run ended is said as app/model/ending.py says it."""
    st = view_state
    if st == "idle" and state.is_over:
        st = state.value
    over = model.ending().word if state.is_over else ""
    return {"idle": "Ready", "starting": "Starting", "training": "Training", "pausing": "Pausing",
            "paused": f"Paused after epoch {model.epoch}", "stopping": "Stopping",
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

    def show_text(self, text: str) -> None:
        if text != self.text():
            self.setText(text)
            self.setVisible(bool(text))


class StatusBar(QStatusBar):
    def __init__(self, parent: Optional[QWidget] = None) -> None:
        super().__init__(parent)
        # Every label elides rather than widen the window (app/ui/shell/layout.py): the state and
        # the step come first and keep their text longest.
        self.device = ElidedLabel("Device: chosen at start")
        self.backend = ElidedLabel("")
        self.torch = ElidedLabel(f"torch {torch_version_quietly()}")
        self.progress = ElidedLabel("step -", keep=150)
        self.epoch_bar = QProgressBar()  # the bar, and its words beside it (easier to read than on it)
        self.epoch_bar.setObjectName("epoch_progress")
        self.epoch_bar.setTextVisible(False)
        self.epoch_bar.setFixedSize(120, 10)
        self.epoch_text = ElidedLabel("", keep=110)
        tip = ("The current epoch: optimizer steps done of those planned (the data set over the samples per step), "
               "and when it ends at the last steps' pace")
        for w in (self.epoch_bar, self.epoch_text):
            w.setToolTip(tip)
            w.setVisible(False)
        self.elapsed = ElidedLabel("elapsed --")
        self.eta = ElidedLabel("ETA --", keep=90)
        self.state = ElidedLabel("Ready", keep=150)
        self.tracker = ProgressTracker()
        self.note = ElidedLabel("")  # news of the moment ("Wrote run.png"), in its own place
        self.note.setObjectName("hint")
        self._note_timer = QTimer(self)
        self._note_timer.setSingleShot(True)
        self._note_timer.timeout.connect(lambda: self.note.setText(""))
        for w in (self.state, self.epoch_bar, self.epoch_text, self.progress, self.elapsed, self.eta):
            self.addWidget(w)
        self.addWidget(self.note, 1)
        for w in (self.device, self.backend, self.torch):
            self.addPermanentWidget(w)
        self.backend.setVisible(False)

    def say(self, text: str, ms: int = 6000) -> None:
        """Show news for a while beside the run's progress (showMessage would cover it)."""
        self.note.setText(text)
        self._note_timer.start(ms)

    def update_from(self, model: Optional[RunModel], state: RunState, text: str) -> None:
        self.state.setText(text)
        if model is None:
            return
        info = model.info
        if info:
            dev = str(info.get("device") or "")
            name = str(info.get("device_name") or "")
            world = whole(info.get("world_size") or 1, 1)
            cuda = dev.startswith("cuda")
            self.backend.setText("CUDA" if cuda else "CPU")
            self.backend.setVisible(True)
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
        self.elapsed.setText(f"elapsed {fmt_duration(model.elapsed())}")
        self._show_progress(prog, state, model)
        if state is RunState.PAUSED:
            self.eta.setText("ETA: paused")  # the clock stops while the run waits
        elif state.is_live:
            eta = prog.run_eta if prog is not None and prog.run_eta is not None else model.eta()
            self.eta.setText(f"ETA {fmt_eta(eta)}" if eta is not None else "ETA after the first steps")
        else:
            self.eta.setText("ETA --")

    def _show_progress(self, prog: Optional[EpochProgress], state: RunState, model: RunModel) -> None:
        bar = self.epoch_bar
        bar.setVisible(prog is not None)
        self.epoch_text.setVisible(prog is not None)
        if prog is None:
            return
        running = state.is_live and state is not RunState.PAUSED
        if prog.by_steps:
            bar.setRange(0, max(1, int(prog.max_steps or 1)))
            bar.setValue(min(prog.step, bar.maximum()))
        else:
            bar.setRange(0, max(1, prog.planned or prog.done))
            bar.setValue(min(prog.done, bar.maximum()))
        text = prog.text(eta_shown=running)
        if state is RunState.PAUSED:
            text += " \u00b7 paused"
        elif state.is_over and prog.fraction < 1.0:
            text += f" \u00b7 {model.ending().word.lower()}"  # the rest of the epoch was not trained
        self.epoch_text.setText(text)
        bar.setFormat(text)  # no %p, %v or %m in it: Qt shows it as it is (an accessible name, a tooltip)
