# Two commands on a fresh machine: `make run` (set up, open the app on the demo task)
# and `make test` (set up, run every test). Both create .venv as needed.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# torch first, exactly: pip then keeps it and the project's torch range installs nothing more.
# On a CUDA workstation: make TORCH_SPEC="torch --index-url https://download.pytorch.org/whl/cu126" run
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.installed

.PHONY: setup run demo-headless test package install-desktop uninstall-desktop clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install --quiet $(TORCH_SPEC)
	$(PY) -m pip install --quiet -e ".[dev,hf,lightning]"
	touch $(STAMP)

setup: $(STAMP)

# The demo lasts a few minutes on a laptop CPU (the README's tour is followed while it trains):
# micro-batch 4 x accumulation 16 (1,024 micro-batches an epoch), 150 epochs; Stop ends it any
# time with a checkpoint. Clip 4: the first steps' norms (about 5) are clipped, the rest are not,
# so the clip-saturation alert (90% of 50 steps clipped) is not raised by the defaults.
run: $(STAMP)
	$(PY) -m app --task mlp --epochs 150 --micro-batch 4 --accum 16 --clip 4 --autostart

demo-headless: $(STAMP)
	$(PY) -m engine --task mlp --epochs 2

test: $(STAMP)
	QT_QPA_PLATFORM=offscreen $(PY) -m pytest -q tests

# dist/headroom/: the app (headroom) and the headless trainer (headroom-train) in one folder.
package: $(STAMP)
	$(PY) -c "import PyInstaller" 2>/dev/null || $(PY) -m pip install --quiet -e ".[package]"
	$(PY) -m PyInstaller --noconfirm --clean --distpath dist --workpath build build_spec.spec

# Desktop launcher and icons for the current user (XDG). The launcher runs the packaged app if
# it is built, else the venv's `headroom` script; HEADROOM_EXEC=/path/to/headroom picks another.
XDG_DATA_HOME ?= $(HOME)/.local/share
HEADROOM_EXEC ?= $(if $(wildcard dist/headroom/headroom),$(CURDIR)/dist/headroom/headroom,$(CURDIR)/$(VENV)/bin/headroom)
APPS_DIR := $(XDG_DATA_HOME)/applications
ICONS_DIR := $(XDG_DATA_HOME)/icons/hicolor

install-desktop:
	@test -x "$(HEADROOM_EXEC)" || { echo "error: $(HEADROOM_EXEC) is not an executable: run 'make package' or 'make setup' first, or give HEADROOM_EXEC=/path/to/headroom" >&2; exit 2; }
	install -d "$(APPS_DIR)"
	sed -e 's|^Exec=.*|Exec="$(HEADROOM_EXEC)"|' -e 's|^TryExec=.*|TryExec=$(HEADROOM_EXEC)|' \
		resources/headroom.desktop > "$(APPS_DIR)/headroom.desktop"
	chmod 644 "$(APPS_DIR)/headroom.desktop"
	for s in 48 128 256; do install -D -m 644 resources/icons/headroom-$$s.png "$(ICONS_DIR)/$${s}x$${s}/apps/headroom.png"; done
	install -D -m 644 resources/headroom.svg "$(ICONS_DIR)/scalable/apps/headroom.svg"
	-@command -v update-desktop-database >/dev/null 2>&1 && update-desktop-database -q "$(APPS_DIR)" || true
	touch "$(ICONS_DIR)"  # icon caches notice the new files
	@echo "installed $(APPS_DIR)/headroom.desktop (Exec: $(HEADROOM_EXEC))"

uninstall-desktop:
	rm -f "$(APPS_DIR)/headroom.desktop" "$(ICONS_DIR)/scalable/apps/headroom.svg"
	for s in 48 128 256; do rm -f "$(ICONS_DIR)/$${s}x$${s}/apps/headroom.png"; done
	-@command -v update-desktop-database >/dev/null 2>&1 && update-desktop-database -q "$(APPS_DIR)" || true

clean:
	rm -rf build dist
