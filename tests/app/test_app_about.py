"""Help > About shows the versions (torch, CUDA, Qt, PySide6, pyqtgraph, Python, NVIDIA driver);
the app imports no torch until About opens, and names its desktop file."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
from app_helpers import ROOT


@pytest.mark.slow
def test_about_dialog_shows_the_versions(qtbot, make_window):
    import PySide6
    from PySide6.QtCore import qVersion

    import engine
    w = make_window()
    menus = {a.text().replace("&", ""): a.menu() for a in w.menuBar().actions()}
    assert w.about_action in menus["Help"].actions()
    w.about_action.trigger()
    dlg = w.about_dialog
    assert dlg.isVisible() and dlg.windowTitle() == "About Headroom"
    got = {k: lab.text() for k, lab in dlg.labels.items()}
    import pyqtgraph
    import torch
    assert got["Headroom"] == engine.__version__
    assert got["torch"] == torch.__version__
    assert got["CUDA"] == (torch.version.cuda or "none (CPU build)")
    assert got["Qt"] == qVersion() and got["PySide6"] == PySide6.__version__
    assert got["pyqtgraph"] == pyqtgraph.__version__
    assert got["Python"].startswith(sys.version.split()[0])
    try:
        import pynvml
        pynvml.nvmlInit()
        driver = pynvml.nvmlSystemGetDriverVersion()
        pynvml.nvmlShutdown()
        assert got["NVIDIA driver"] == (driver.decode() if isinstance(driver, bytes) else driver)
    except Exception:
        assert got["NVIDIA driver"].startswith("no NVIDIA driver")
    assert "CUDA: " in dlg.text() and "NVIDIA driver: " in dlg.text()
    dlg.close()


def test_about_is_torch_free_until_opened_and_desktop_file_name_is_set():
    code = ("import sys\n"
            "from PySide6.QtGui import QGuiApplication\n"
            "import app.main_window as w, app.ui.shell.about\n"
            "def show(self):\n"
            "    print('DESKTOP', QGuiApplication.desktopFileName(), 'torch' in sys.modules, flush=True)\n"
            "    raise SystemExit(0)\n"
            "w.MainWindow.show = show\n"
            "from app.main import main\n"
            "main([])\n")
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "DESKTOP headroom False" in r.stdout, r.stdout + r.stderr
