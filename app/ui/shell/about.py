"""Help > About Headroom: the versions that matter when reporting a problem.

torch (and engine.memory.telemetry, which imports it) load only when the dialog opens, never at start-up.
"""
from __future__ import annotations

import platform
import sys
from typing import Optional

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QApplication,
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QLabel,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

NO_DRIVER = "no NVIDIA driver"
CPU_BUILD = "none (CPU build)"


def nvidia_driver() -> str:
    """The NVIDIA driver version from NVML, or 'no NVIDIA driver' (with why, when known)."""
    try:
        import pynvml
        pynvml.nvmlInit()
        try:
            v = pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
        return v.decode() if isinstance(v, bytes) else str(v)
    except Exception:
        try:
            from engine.memory.telemetry import nvml_status
            why = nvml_status()
        except Exception:
            why = ""
        return f"{NO_DRIVER} ({why})" if why else NO_DRIVER


def versions() -> list[tuple[str, str]]:
    """(name, version) rows. Imports torch."""
    import PySide6
    from PySide6.QtCore import qVersion

    import engine
    rows: list[tuple[str, str]] = [("Headroom", engine.__version__)]
    try:
        import torch
        rows.append(("torch", torch.__version__))
        rows.append(("CUDA", torch.version.cuda or CPU_BUILD))
    except Exception as e:  # a broken torch install: still say the rest
        rows.append(("torch", f"not available ({type(e).__name__}: {e})"))
        rows.append(("CUDA", "unknown"))
    rows.append(("Qt", qVersion()))
    rows.append(("PySide6", PySide6.__version__))
    try:
        import pyqtgraph
        rows.append(("pyqtgraph", pyqtgraph.__version__))
    except Exception as e:
        rows.append(("pyqtgraph", f"not available ({type(e).__name__})"))
    rows.append(("NVIDIA driver", nvidia_driver()))
    rows.append(("Python", f"{platform.python_version()} ({sys.executable})"))
    return rows


def as_text(rows: list[tuple[str, str]]) -> str:
    return "\n".join(f"{k}: {v}" for k, v in rows)


class AboutDialog(QDialog):
    def __init__(self, parent: Optional[QWidget] = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("About Headroom")
        self.setObjectName("about")
        self.rows = versions()
        lay = QVBoxLayout(self)
        title = QLabel("<b>Headroom</b>: a training monitor built around gradient accumulation.")
        title.setWordWrap(True)
        lay.addWidget(title)
        form = QFormLayout()
        self.labels: dict[str, QLabel] = {}
        for name, value in self.rows:
            lab = QLabel(value)
            lab.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
            lab.setWordWrap(True)
            self.labels[name] = lab
            form.addRow(name, lab)
        lay.addLayout(form)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        copy = QPushButton("Copy")
        copy.setToolTip("Copy the versions to the clipboard (for a bug report)")
        copy.clicked.connect(self.copy)
        buttons.addButton(copy, QDialogButtonBox.ButtonRole.ActionRole)
        buttons.rejected.connect(self.reject)
        buttons.accepted.connect(self.accept)
        lay.addWidget(buttons)

    def text(self) -> str:
        return as_text(self.rows)

    def copy(self) -> None:
        QApplication.clipboard().setText(self.text())
