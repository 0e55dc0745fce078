# `make demo` and `make test` set everything up from a fresh machine (Python venv in .venv,
# Debian packages for headless Qt) and then run.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
XVFB := xvfb-run -a -s "-screen 0 1600x1000x24"
APT_PACKAGES := xvfb xauth libxcb-icccm4 libxcb-image0 libxcb-keysyms1 libxcb-randr0 libxcb-render-util0 \
	libxcb-xinerama0 libxcb-xfixes0 libxcb-shape0 libxkbcommon-x11-0 libxcb-cursor0 libdbus-1-3 \
	libgl1 libegl1 libfontconfig1 libglib2.0-0 libopenjp2-tools

.PHONY: demo test test-gpu lint typecheck system-deps clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt -e ".[napari,dev,openslide]"
	touch $(STAMP)

system-deps:
	@if ! command -v xvfb-run >/dev/null 2>&1 || ! dpkg -s $(APT_PACKAGES) >/dev/null 2>&1; then \
		echo "installing Debian packages for headless Qt (and OpenJPEG's encoder, for the JPEG 2000 tests)"; \
		$(if $(filter 0,$(shell id -u)),,sudo) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(if $(filter 0,$(shell id -u)),,sudo) \
			apt-get install -y -qq --no-install-recommends $(APT_PACKAGES) >/dev/null; \
	fi

demo: $(STAMP)
	$(BIN)/bigslide demo

lint: $(STAMP)
	$(BIN)/ruff check src tests
	$(BIN)/ruff format --check src tests

typecheck: $(STAMP)
	$(BIN)/mypy

test: $(STAMP) system-deps lint typecheck
	$(BIN)/npe2 validate --imports bigslide
	@# the GUI tests one at a time (they time napari's event loop); the others on two processes
	$(XVFB) $(BIN)/pytest -p no:cacheprovider tests/gui
	$(XVFB) $(BIN)/pytest -p no:cacheprovider -n 2 --ignore=tests/gui

# the exactness tests and two training steps of every method on CUDA (CI has no GPU: there they are skipped)
test-gpu: $(STAMP)
	$(BIN)/pytest -p no:cacheprovider -m cuda tests/test_cuda.py

clean:
	rm -rf $(VENV) runs .pytest_cache .mypy_cache .ruff_cache
