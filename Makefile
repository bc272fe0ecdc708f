# Two commands on a fresh machine: `make run` (set up, open the app on the demo task)
# and `make test` (set up, run every test). Both create .venv as needed.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# torch first, exactly: pip then keeps it and the project's torch range installs nothing more.
# On a CUDA workstation: make TORCH_SPEC="torch --index-url https://download.pytorch.org/whl/cu126" run
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.installed

.PHONY: setup run demo-headless test package clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install --quiet $(TORCH_SPEC)
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

setup: $(STAMP)

run: $(STAMP)
	$(PY) -m app --task mlp --epochs 5 --autostart

demo-headless: $(STAMP)
	$(PY) -m engine --task mlp --epochs 2

test: $(STAMP)
	QT_QPA_PLATFORM=offscreen $(PY) -m pytest -q tests

package: $(STAMP)
	$(PY) -m pip install --quiet -e ".[package]"
	$(PY) -m PyInstaller --noconfirm --clean build_spec.spec

clean:
	rm -rf build dist
