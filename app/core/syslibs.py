"""The system libraries Qt needs, checked before Qt loads: a missing one is named, with the
one apt command that installs every missing one, instead of Qt's abort ("xcb-cursor0 ... is
needed", and after installing that, the next one).

Two lists, the direct dependencies (readelf -d, NEEDED) of the PySide6 wheel's Qt libraries
outside the wheel: QtGui and QtWidgets (loaded on every platform, offscreen too), and the X11
(xcb) platform plugin (libqxcb.so and libQt6XcbQpa.so.6), loaded when Qt runs on X11. Each
soname with its Debian / Ubuntu package. tests/app/test_system_libraries.py reads the
installed wheel and fails when a new PySide6 needs a library these lists lack. Qt-free.
"""
from __future__ import annotations

import ctypes
import os
import sys
from typing import Mapping, Optional, Sequence

GUI_LIBRARIES: tuple[tuple[str, str], ...] = (
    ("libGL.so.1", "libgl1"), ("libEGL.so.1", "libegl1"), ("libfontconfig.so.1", "libfontconfig1"),
    ("libfreetype.so.6", "libfreetype6"), ("libxkbcommon.so.0", "libxkbcommon0"), ("libX11.so.6", "libx11-6"),
    ("libdbus-1.so.3", "libdbus-1-3"), ("libglib-2.0.so.0", "libglib2.0-0"),
    ("libgthread-2.0.so.0", "libglib2.0-0"), ("libz.so.1", "zlib1g"), ("libzstd.so.1", "libzstd1"),
)
XCB_LIBRARIES: tuple[tuple[str, str], ...] = (
    ("libxcb-cursor.so.0", "libxcb-cursor0"), ("libxcb-icccm.so.4", "libxcb-icccm4"),
    ("libxcb-keysyms.so.1", "libxcb-keysyms1"), ("libxcb-image.so.0", "libxcb-image0"),
    ("libxcb-render-util.so.0", "libxcb-render-util0"), ("libxcb-randr.so.0", "libxcb-randr0"),
    ("libxcb-shape.so.0", "libxcb-shape0"), ("libxcb-xkb.so.1", "libxcb-xkb1"),
    ("libxkbcommon-x11.so.0", "libxkbcommon-x11-0"), ("libxcb-util.so.1", "libxcb-util1"),
    ("libxcb-render.so.0", "libxcb-render0"), ("libxcb-shm.so.0", "libxcb-shm0"),
    ("libxcb-sync.so.1", "libxcb-sync1"), ("libxcb-xfixes.so.0", "libxcb-xfixes0"),
    ("libX11-xcb.so.1", "libx11-xcb1"), ("libxcb.so.1", "libxcb1"),
)
def uses_xcb(env: Mapping[str, str]) -> bool:
    """Whether Qt will load its X11 platform plugin: QT_QPA_PLATFORM names xcb, or names nothing
    outside a Wayland session (where Qt tries Wayland first)."""
    platform = env.get("QT_QPA_PLATFORM", "").split(":")[0].split(";")[0].strip().lower()
    if platform:
        return platform == "xcb"
    return not (env.get("XDG_SESSION_TYPE", "").lower() == "wayland" and env.get("WAYLAND_DISPLAY"))


def loadable(soname: str) -> bool:
    """The dynamic linker finds and loads it (the search Qt's loading goes through)."""
    try:
        ctypes.CDLL(soname)
        return True
    except OSError:
        return False


def missing(env: Optional[Mapping[str, str]] = None) -> list[tuple[str, str]]:
    """(soname, package) of each library Qt will need here that cannot be loaded. Linux only."""
    if not sys.platform.startswith("linux"):
        return []
    env = os.environ if env is None else env
    wanted = GUI_LIBRARIES + (XCB_LIBRARIES if uses_xcb(env) else ())
    return [(so, pkg) for so, pkg in wanted if not loadable(so)]


def install_command(packages: Sequence[str]) -> str:
    return "sudo apt-get install " + " ".join(dict.fromkeys(packages))


def problem(libs: Sequence[tuple[str, str]]) -> str:
    """One line for the `error:` output; '' if nothing is missing."""
    if not libs:
        return ""
    return (f"Qt needs system libraries that are missing: {', '.join(so for so, _ in libs)}. "
            f"Install them all with: {install_command([pkg for _, pkg in libs])} "
            f"(other distributions: the packages that provide these files)")
