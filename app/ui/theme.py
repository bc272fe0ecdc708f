"""Light and dark: the Qt stylesheet from resources/ plus matching plot colours."""
from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtWidgets import QApplication

from app.core import assets

THEMES = ("light", "dark")


@dataclass(frozen=True)
class Palette:
    background: str
    foreground: str
    grid_alpha: float
    loss: str
    ema: str
    val: str
    norm: str
    clip: str
    clipped: str
    lr: str
    throughput: str
    throughput_raw: str
    mem_used: str
    mem_reserved: str
    mem_peak: str
    mem_total: str
    headroom: tuple  # RGBA fill
    marker: str
    nonfinite: str
    overlay: tuple[str, ...]
    note: str
    mem_kinds: tuple[str, str, str, str]  # params, grads, optimizer state, activations (stacked)
    rollback: str
    discarded: str  # steps a rollback threw away, greyed
    planned: str = "#94a3b8"  # the lr the schedule plans ahead (not the lr's own colour: it has not happened)


LIGHT = Palette(
    background="#ffffff", foreground="#334155", grid_alpha=0.18,
    loss="#93c5fd", ema="#1d4ed8", val="#ea580c", norm="#7c3aed", clip="#dc2626", clipped="#dc2626",
    lr="#0f766e", throughput="#0891b2", throughput_raw="#a5dbe8", mem_used="#2563eb", mem_reserved="#7c3aed", mem_peak="#db2777",
    mem_total="#dc2626", headroom=(34, 197, 94, 45), marker="#b45309", nonfinite="#dc2626",
    overlay=("#16a34a", "#9333ea", "#ca8a04", "#0d9488", "#e11d48", "#4f46e5"), note="#64748b",
    mem_kinds=("#3b82f6", "#8b5cf6", "#f59e0b", "#10b981"), rollback="#be123c", discarded="#a8a8a8",
)
DARK = Palette(
    background="#111318", foreground="#cbd5e1", grid_alpha=0.22,
    loss="#4a6fa8", ema="#93c5fd", val="#fb923c", norm="#a78bfa", clip="#f87171", clipped="#f87171",
    lr="#2dd4bf", throughput="#22d3ee", throughput_raw="#1f5663", mem_used="#60a5fa", mem_reserved="#c084fc", mem_peak="#f472b6",
    mem_total="#f87171", headroom=(74, 222, 128, 40), marker="#fbbf24", nonfinite="#f87171",
    overlay=("#4ade80", "#c084fc", "#facc15", "#2dd4bf", "#fb7185", "#818cf8"), note="#94a3b8",
    mem_kinds=("#60a5fa", "#a78bfa", "#fbbf24", "#34d399"), rollback="#fb7185", discarded="#5b6170",
    planned="#7b8494",
)


def palette(theme: str) -> Palette:
    return DARK if theme == "dark" else LIGHT


def apply_stylesheet(theme: str) -> None:
    app = QApplication.instance()
    if isinstance(app, QApplication):
        app.setStyleSheet(assets.stylesheet(theme if theme in THEMES else "light"))


def system_theme() -> str:
    """'dark' when the desktop asks for a dark colour scheme (Qt 6.5+), else 'light'."""
    try:
        from PySide6.QtCore import Qt
        from PySide6.QtGui import QGuiApplication
        hints = QGuiApplication.styleHints()
        if hints is not None and hints.colorScheme() == Qt.ColorScheme.Dark:
            return "dark"
    except Exception:
        pass
    return "light"
