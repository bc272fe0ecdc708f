"""Before Qt loads, the app names every missing system library and the one apt command that
installs them (instead of Qt's abort, one library at a time); the lists match what the
installed PySide6 needs, and README's Troubleshooting gives the same command."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from app_helpers import ROOT

from app.core import syslibs

LIBC = ("libc.so", "libm.so", "libstdc++.so", "libgcc_s.so", "ld-linux", "libpthread.so", "libdl.so", "librt.so")


def needed(path: Path) -> list[str]:
    """The NEEDED entries of a shared library (readelf -d)."""
    out = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True, check=True).stdout
    return [line.split("[", 1)[1].split("]", 1)[0] for line in out.splitlines() if "(NEEDED)" in line]


@pytest.mark.skipif(not sys.platform.startswith("linux") or shutil.which("readelf") is None,
                    reason="reads the Linux wheel's ELF files with readelf")
def test_the_lists_hold_every_system_library_the_installed_qt_needs():
    import PySide6
    qt = Path(PySide6.__file__).parent / "Qt"
    bundled = {p.name for p in (qt / "lib").iterdir()}

    def system(libs: list[str]) -> set[str]:
        return {n for n in libs if n not in bundled and not n.startswith(LIBC)}

    gui = {so for so, _ in syslibs.GUI_LIBRARIES}
    xcb = {so for so, _ in syslibs.XCB_LIBRARIES}
    for name in ("libQt6Core.so.6", "libQt6Gui.so.6", "libQt6Widgets.so.6", "libQt6DBus.so.6"):
        assert system(needed(qt / "lib" / name)) <= gui, name
    plugin = system(needed(qt / "plugins" / "platforms" / "libqxcb.so")) | system(needed(qt / "lib" /
                                                                                         "libQt6XcbQpa.so.6"))
    assert "libxcb-icccm.so.4" in plugin and "libxcb-keysyms.so.1" in plugin  # the two README lacked
    assert plugin <= gui | xcb, plugin - gui - xcb


def test_x11_libraries_are_checked_only_when_qt_uses_x11():
    assert syslibs.uses_xcb({}) and syslibs.uses_xcb({"QT_QPA_PLATFORM": "xcb"})
    assert syslibs.uses_xcb({"QT_QPA_PLATFORM": "xcb:nograb"})
    for platform in ("offscreen", "wayland", "minimal", "wayland;xcb"):
        assert not syslibs.uses_xcb({"QT_QPA_PLATFORM": platform}), platform
    assert not syslibs.uses_xcb({"XDG_SESSION_TYPE": "wayland", "WAYLAND_DISPLAY": "wayland-0"})
    assert syslibs.missing({"QT_QPA_PLATFORM": "offscreen"}) == [
        (so, pkg) for so, pkg in syslibs.GUI_LIBRARIES if not syslibs.loadable(so)]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the check is for Linux desktops")
def test_missing_libraries_are_named_with_one_install_command_before_qt_loads(tmp_path):
    # Two libraries no machine has, on top of the real list: the app must name both (and any
    # really missing) in one line with one command, and exit before Qt is loaded.
    code = ("import sys\n"
            "from app.core import syslibs\n"
            "syslibs.XCB_LIBRARIES += (('libheadroom-test-a.so.9', 'libheadroom-test-a9'),\n"
            "                          ('libheadroom-test-b.so.1', 'libheadroom-test-b1'))\n"
            "from app.main import main\n"
            "rc = main(['--task', 'mlp'])\n"
            "print('qt loaded' if 'PySide6.QtGui' in sys.modules else 'qt not loaded')\n"
            "raise SystemExit(rc)\n")
    env = {**os.environ, "QT_QPA_PLATFORM": "xcb", "DISPLAY": ":99", "PYTHONPATH": str(ROOT),
           "HEADROOM_SETTINGS": str(tmp_path / "s.ini"), "HEADROOM_RUNS": str(tmp_path / "runs"),
           "HEADROOM_LOG": str(tmp_path / "log")}
    env.pop("WAYLAND_DISPLAY", None)
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                       cwd=str(ROOT))
    assert r.returncode == 1, (r.returncode, r.stderr[-2000:])
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert "libheadroom-test-a.so.9, libheadroom-test-b.so.1" in lines[0] or (
        "libheadroom-test-a.so.9" in lines[0] and "libheadroom-test-b.so.1" in lines[0])
    assert "sudo apt-get install " in lines[0] and "libheadroom-test-a9 libheadroom-test-b1" in lines[0]
    assert r.stdout.strip() == "qt not loaded"


def test_readme_troubleshooting_gives_the_command_for_every_library():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    every = syslibs.install_command([pkg for _, pkg in syslibs.XCB_LIBRARIES + syslibs.GUI_LIBRARIES])
    troubleshooting = readme.split("## Troubleshooting", 1)[1]
    assert every in troubleshooting
