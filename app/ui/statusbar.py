"""Status bar: device, CUDA or CPU, torch version, step/epoch, elapsed and ETA."""
from __future__ import annotations

from typing import Optional

from PySide6.QtWidgets import QLabel, QStatusBar, QWidget

from ..model.runmodel import RunModel
from ..model.state import RunState


def fmt_duration(s: Optional[float]) -> str:
    if s is None:
        return "--"
    s = int(round(s))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"


def state_text(view_state: str, state: RunState, model: RunModel) -> str:
    """One or two words for where the run stands, e.g. 'Paused after epoch 2', 'Viewing (finished)'."""
    st = view_state
    if st == "idle" and state.is_over:
        st = state.value
    return {"idle": "Ready", "starting": "Starting", "training": "Training", "pausing": "Pausing",
            "paused": f"Paused after epoch {model.epoch}", "stopping": "Stopping",
            "viewing": f"Viewing ({state.value})" if state is not RunState.IDLE else "Viewing",
            "finished": f"Finished ({model.finish_reason})", "failed": "Failed",
            "interrupted": "Interrupted"}.get(st, st)


def torch_version_quietly() -> str:
    """torch's version without importing torch (the window shows before torch loads)."""
    try:
        from importlib.metadata import version
        return version("torch")
    except Exception:
        return "not installed"


class StatusBar(QStatusBar):
    def __init__(self, parent: Optional[QWidget] = None) -> None:
        super().__init__(parent)
        self.device = QLabel("Device: chosen at start")
        self.backend = QLabel("")
        self.torch = QLabel(f"torch {torch_version_quietly()}")
        self.progress = QLabel("step -")
        self.elapsed = QLabel("elapsed --")
        self.eta = QLabel("ETA --")
        self.state = QLabel("Ready")
        for w in (self.state, self.progress, self.elapsed, self.eta):
            self.addWidget(w)
        for w in (self.device, self.backend, self.torch):
            self.addPermanentWidget(w)
        self.backend.setVisible(False)

    def update_from(self, model: Optional[RunModel], state: RunState, text: str) -> None:
        self.state.setText(text)
        if model is None:
            return
        info = model.info
        if info:
            dev = str(info.get("device") or "")
            name = str(info.get("device_name") or "")
            world = int(info.get("world_size") or 1)
            cuda = dev.startswith("cuda")
            self.backend.setText("CUDA" if cuda else "CPU")
            self.backend.setVisible(True)
            self.device.setText(f"{name} ({dev})" + (f" x {world}" if world > 1 else ""))
            if info.get("torch_version"):
                self.torch.setText(f"torch {info['torch_version']}")
        epochs = model.config.get("epochs")
        if model.step:
            total = f"/{epochs}" if epochs else ""
            self.progress.setText(f"epoch {model.epoch}{total}  step {model.step:,}")
        else:
            self.progress.setText("step -")
        self.elapsed.setText(f"elapsed {fmt_duration(model.elapsed())}")
        if state.is_live:
            eta = model.eta() if state is not RunState.PAUSED else None
            self.eta.setText(f"ETA {fmt_duration(eta)}" if eta is not None else "ETA after epoch 1")
        else:
            self.eta.setText("ETA --")
