"""Desktop integration: resources/headroom.desktop and the icons, installed by `make install-desktop`.

Installs into a temporary XDG_DATA_HOME and checks the launcher with desktop-file-validate
when it is installed (apt-get install desktop-file-utils), else by parsing it against the
Desktop Entry rules that matter here. Fast: not behind HEADROOM_SKIP_PACKAGE.
"""
from __future__ import annotations

import configparser
import os
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from testkit import ROOT

DESKTOP = ROOT / "resources" / "headroom.desktop"
SIZES = (48, 128, 256)

pytestmark = [pytest.mark.package, pytest.mark.skipif(shutil.which("make") is None, reason="needs make")]


def _entry(path: Path) -> dict[str, str]:
    parser = configparser.RawConfigParser(delimiters=("=",), interpolation=None, strict=True)
    parser.optionxform = str  # keys are case-sensitive
    parser.read_string(path.read_text(encoding="utf-8"))
    assert parser.sections()[0] == "Desktop Entry"
    return dict(parser["Desktop Entry"])


def _validate(path: Path) -> None:
    validator = shutil.which("desktop-file-validate")
    if validator:
        out = subprocess.run([validator, str(path)], capture_output=True, text=True)
        assert out.returncode == 0 and not out.stdout.strip() and not out.stderr.strip(), out.stdout + out.stderr
    entry = _entry(path)  # and the rules this launcher relies on, validator or not
    for key in ("Type", "Name", "Exec", "Icon", "Categories"):
        assert entry.get(key), f"{path.name}: no {key}"
    assert entry["Type"] == "Application"
    assert entry["Terminal"] == "false"
    assert entry["Categories"].endswith(";") and entry["Keywords"].endswith(";")
    assert entry["StartupWMClass"] == "Headroom"  # QApplication.applicationName: X11 WM_CLASS
    assert "/" not in entry["Icon"]  # a theme name, found in hicolor


def _make(*args: str, data_home: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "XDG_DATA_HOME": str(data_home)}
    return subprocess.run(["make", "--no-print-directory", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_repo_desktop_file_is_valid() -> None:
    _validate(DESKTOP)
    assert _entry(DESKTOP)["Exec"] == "headroom"  # the pip-installed gui script, on PATH


def test_icons_match_their_sizes() -> None:
    for s in SIZES:
        assert _png_size(ROOT / "resources" / "icons" / f"headroom-{s}.png") == (s, s)
    assert (ROOT / "resources" / "headroom.svg").read_text().lstrip().startswith("<svg")


def test_install_desktop_into_xdg_data_home_then_uninstall(tmp_path: Path) -> None:
    exe = tmp_path / "opt" / "Head room" / "headroom"  # a path with a space: Exec must quote it
    exe.parent.mkdir(parents=True)
    exe.write_text("#!/bin/sh\nexit 0\n")
    exe.chmod(0o755)
    data = tmp_path / "data"
    out = _make("install-desktop", f"HEADROOM_EXEC={exe}", data_home=data)
    assert out.returncode == 0, out.stdout + out.stderr

    installed = data / "applications" / "headroom.desktop"
    _validate(installed)
    entry = _entry(installed)
    assert entry["Exec"] == f'"{exe}"'
    assert entry["TryExec"] == str(exe)
    hicolor = data / "icons" / "hicolor"
    for s in SIZES:
        assert _png_size(hicolor / f"{s}x{s}" / "apps" / "headroom.png") == (s, s)
    assert (hicolor / "scalable" / "apps" / "headroom.svg").read_bytes() == (ROOT / "resources" / "headroom.svg").read_bytes()

    out = _make("uninstall-desktop", data_home=data)
    assert out.returncode == 0, out.stdout + out.stderr
    assert not installed.exists()
    assert not list(hicolor.rglob("headroom.*"))


def test_install_desktop_defaults_to_the_packaged_app_or_the_venv_script(tmp_path: Path) -> None:
    data = tmp_path / "data"
    frozen, script = ROOT / "dist" / "headroom" / "headroom", ROOT / ".venv" / "bin" / "headroom"
    expected = frozen if frozen.is_file() else script
    out = _make("install-desktop", data_home=data)
    if not os.access(expected, os.X_OK):  # neither built nor set up: a clear refusal, nothing installed
        assert out.returncode != 0 and "error:" in out.stderr
        assert not (data / "applications" / "headroom.desktop").exists()
        return
    assert out.returncode == 0, out.stdout + out.stderr
    assert _entry(data / "applications" / "headroom.desktop")["Exec"] == f'"{expected}"'


def test_install_desktop_refuses_a_missing_executable(tmp_path: Path) -> None:
    data = tmp_path / "data"
    out = _make("install-desktop", f"HEADROOM_EXEC={tmp_path / 'nope'}", data_home=data)
    assert out.returncode != 0
    assert "error:" in out.stderr and "not an executable" in out.stderr
    assert not (data / "applications").exists()
