"""The README names only menu entries, buttons and fields the app has: every name in bold in
the app's tour ("Five minutes with the demo"), and every bold name anywhere that ends in
"..." (a menu entry or button that opens a dialog), is a text of the real window's actions,
buttons, labels, lists or tabs. (It said "Open run..." where the menu says "Open run folder...".)"""
from __future__ import annotations

import re

import pytest
from app_helpers import ROOT
from PySide6.QtGui import QAction
from PySide6.QtWidgets import QAbstractButton, QComboBox, QDockWidget, QGroupBox, QLabel, QTabBar
from test_window_layout import synthetic_run

BOLD = re.compile(r"\*\*([^*]+?)\*\*")


def readme_names() -> set[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    tour = text.split("## Five minutes with the demo", 1)[1].split("\n## ", 1)[0]
    names = set(BOLD.findall(tour))
    names |= {n for n in BOLD.findall(text) if n.endswith("...")}
    out: set[str] = set()
    for n in names:
        for part in re.split(r": | > ", n):  # "lr scaling: linear", "Help > Keyboard shortcuts"
            m = re.match(r"^(.*\b)(\w+)/(\w+)$", part)  # "Apply at next step/epoch"
            out |= {m.group(1) + m.group(2), m.group(1) + m.group(3)} if m else {part}
    return out


def norm(text: str) -> str:
    return " ".join(text.replace("&", "").split()).rstrip(":")


def window_names(w) -> set[str]:
    names: set[str] = set()
    for a in w.findChildren(QAction) + list(w.plots.point_menu.actions):
        names.add(a.text())
    for b in w.findChildren(QAbstractButton):
        names.add(b.text())
    for lab in w.findChildren(QLabel):
        if len(lab.text()) <= 40:
            names.add(lab.text())
    for c in w.findChildren(QComboBox):
        names |= {c.itemText(i) for i in range(c.count())}
    for d in w.findChildren(QDockWidget):
        names.add(d.windowTitle())
    for g in w.findChildren(QGroupBox):
        names.add(g.title())
    for t in w.findChildren(QTabBar):
        names |= {t.tabText(i) for i in range(t.count())}
    return {norm(n) for n in names if n}


@pytest.mark.slow
def test_the_readme_names_only_what_the_app_has(qtbot, make_window, tmp_path):
    w = make_window()
    run = synthetic_run(tmp_path / "run")
    (tmp_path / "run" / "checkpoints").mkdir(exist_ok=True)
    (tmp_path / "run" / "checkpoints" / "last.pt").write_bytes(b"")  # listed by name: its right-click menu
    assert w.open_run(run)
    w.plots.point_menu.remember(10.0)  # a plot's right-click menu names the step: "Fork from step 10..."
    w.history.refresh()  # the run table's right-click menus, a run's and a checkpoint's, as a click makes them
    w.history.select(run)
    w.history.run_menu(w.history.summary_of(run))
    w.history.checkpoints.menu()
    have = window_names(w)
    missing = []
    for name in sorted(readme_names()):
        pattern = re.escape(norm(name)).replace(r"\ N", r" (?:[\d,]+|N)")  # "Fork from step N...", "Run on N GPUs..."
        if not any(re.fullmatch(pattern, h) for h in have):
            missing.append(name)
    assert not missing, f"README names what the app does not have: {missing}"


@pytest.mark.slow
def test_the_check_catches_a_name_the_app_lacks(qtbot, make_window, tmp_path):
    w = make_window()
    have = window_names(w)
    assert "Open run folder..." in have and "Open run..." not in have  # the example
