"""Issue 28, "The dark theme blanks the plots": Ctrl+T (the Dark theme action) with the memory and
throughput plots folded (1024 x 640) and unfolded (1440 x 900), on the plots of a run training in
another process, to dark and back. No exception escapes (sys.excepthook sees none, headroom.log
has no traceback), and after each switch the canvas is painted in the new theme's background,
the loss curve is drawn in the theme's colour (the fault left the area white, with no curves, in
both themes) and every plot shown before is shown again with its title."""
from __future__ import annotations

import html
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PySide6.QtCore import Qt
from x11_window import near, pixels, settle, wait_quietly, wait_until

from app.ui.theme import palette

pytestmark = [pytest.mark.x11, pytest.mark.slow]

CURVE_PIXELS = 150  # the loss EMA (2 px wide) across a plot 300+ px wide paints several hundred


def curve_pixels(w: Any, theme: str) -> int:
    """Pixels of the canvas in the theme's loss EMA colour."""
    return int(near(pixels(w.plots.canvas), palette(theme).ema, tolerance=16).sum())


def background_share(w: Any, theme: str) -> float:
    """The share of the canvas in the theme's background colour."""
    return float(np.mean(near(pixels(w.plots.canvas), palette(theme).background, tolerance=8)))


def titles(w: Any) -> dict[str, bool]:
    """Each plot shown, by its title's first words (the legend after them is coloured by the
    theme): whether the title is drawn (its row has a height)."""
    def name(html_text: str) -> str:
        return html.unescape(re.sub(r"<[^>]*>", "", html_text)).split("\xa0\xa0")[0].strip()
    return {name(p.titleLabel.text): p.titleLabel.boundingRect().height() > 0
            for p in w.plots.parts.plot_set.all if p.isVisible()}


def switch_and_check(qtbot: Any, w: Any, theme: str, shown: dict[str, bool], log: Path, where: str) -> None:
    with qtbot.captureExceptions() as raised:  # sys.excepthook, for the switch
        qtbot.keyClick(w, Qt.Key.Key_T, Qt.KeyboardModifier.ControlModifier)
        wait_quietly(lambda: bool(raised) or (w.theme == theme and curve_pixels(w, theme) >= CURVE_PIXELS
                                              and titles(w) == shown), 10.0)
    assert not raised, f"{where}, Ctrl+T to {theme} raised: {[f'{t.__name__}: {v}' for t, v, _ in raised]}"
    text = log.read_text() if log.exists() else ""
    assert "Traceback" not in text, f"{where}, Ctrl+T to {theme} logged: {text[-1500:]}"
    assert w.theme == theme and w.theme_action.isChecked() == (theme == "dark"), f"{where}, Ctrl+T left {w.theme}"
    share = background_share(w, theme)
    assert share > 0.5, f"{where}, after Ctrl+T to {theme} only {share:.0%} of the canvas has its background"
    n = curve_pixels(w, theme)
    assert n >= CURVE_PIXELS, f"{where}, after Ctrl+T to {theme} the loss curve is not drawn ({n} px of its colour)"
    now = titles(w)
    lost = sorted(set(shown) - set(now)) + sorted(t for t, drawn in now.items() if not drawn)
    assert now == shown, f"{where}, after Ctrl+T to {theme} these plots or their titles are not drawn: {lost}"


def fold_as(w: Any, folded: bool) -> None:
    """Plots folded away (or none) as the case wants, by the Alerts dock's height if the window's
    size alone does not do it: the issue's other way to fold them is a taller bottom dock."""
    if w.plots.parts.fold.folded != folded:
        w.resizeDocks([w.alerts_dock], [w.height() // 2 if folded else 80], Qt.Orientation.Vertical)
        settle(w)


@pytest.mark.parametrize("size, folded", [((1024, 640), True), ((1440, 900), False)],
                         ids=["1024x640-folded", "1440x900-unfolded"])
def test_a_theme_switch_redraws_the_plots_folded_or_not(qtbot, window, live_run, isolated, size, folded):
    w = window(size=size)
    assert w.size().toTuple() == size, f"asked {size}, the window manager gave {w.size().toTuple()}"
    assert w.open_run(live_run), w.last_error
    settle(w)
    wait_until(lambda: curve_pixels(w, w.theme) >= CURVE_PIXELS, 10, "the loss curve drawn")
    where = f"at {size} with the plots {'folded' if folded else 'unfolded'}"
    fold_as(w, folded)
    assert w.plots.parts.fold.folded == folded, f"{where}: the plots are not as the test needs them"
    shown = titles(w)
    assert shown and all(shown.values()), f"{where}: plots without their titles before any switch: {shown}"
    start = w.theme
    log = Path(isolated) / "headroom.log"
    switch_and_check(qtbot, w, "dark" if start == "light" else "light", shown, log, where)
    switch_and_check(qtbot, w, start, shown, log, where)
