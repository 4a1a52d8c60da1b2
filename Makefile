# Two entry points for a fresh machine: `make demo` and `make test`.
# Both create the virtualenv and install the package (torch==2.13.0, CPU wheel) on first use;
# `make test` also installs what its tests need from the system (test-deps).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp

FMNIST := /usr/share/datasets/fashion-mnist

.PHONY: demo test test-deps install data clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check torch==2.13.0
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[test]'
	touch $(STAMP)

test: $(STAMP) test-deps
	$(PY) -m ruff check .
	$(PY) -m pytest -q -n 2 --durations=15

# What the tests need from the system, on Debian: Chromium (the explorer's and the report's page tests,
# tests/fixtures_browser.py) and real Fashion-MNIST (tests/test_data_fashion.py). Installed with apt-get
# (through `sudo -n` when not root) where they are missing; what could not be installed is said in one line.
APT_GET ?= apt-get
SUDO    := $(shell [ "$$(id -u)" = 0 ] || ! command -v sudo >/dev/null 2>&1 || echo sudo -n)
HAVE_CHROMIUM := command -v chromium >/dev/null 2>&1 || test -x /usr/bin/chromium
HAVE_FMNIST   := test -d $(FMNIST)
test-deps:
	@missing=""; \
	$(HAVE_CHROMIUM) || missing="$$missing chromium"; \
	$(HAVE_FMNIST) || missing="$$missing dataset-fashion-mnist"; \
	if [ -n "$$missing" ] && command -v $(APT_GET) >/dev/null 2>&1; then \
	  ($(SUDO) $(APT_GET) update -qq && \
	   $(SUDO) env DEBIAN_FRONTEND=noninteractive $(APT_GET) install -y -qq $$missing) >/dev/null 2>&1 || true; \
	fi; \
	lost=""; affected=""; \
	$(HAVE_CHROMIUM) || { lost="chromium"; \
	  affected="the page tests in Chromium skip (fail under CI=true)"; }; \
	$(HAVE_FMNIST) || { lost="$${lost:+$$lost and }dataset-fashion-mnist"; \
	  affected="$${affected:+$$affected; }the real Fashion-MNIST tests skip"; }; \
	[ -z "$$lost" ] || echo "note: could not install $$lost (needs apt-get and root or sudo): $$affected"

# Real Fashion-MNIST from Debian's package when apt is there; otherwise attnconv finds it
# in --data-dir / $$ATTNCONV_DATA / the cache, or downloads it (checksum-verified).
data:
	@test -d $(FMNIST) || ! command -v apt-get >/dev/null || \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist) \
	  || echo "note: could not install dataset-fashion-mnist; attnconv will look elsewhere or download"

# The main job: Theorem 1 on a random conv, then a few minutes of training the
# quadratic attention model on the real Fashion-MNIST (one epoch of the CPU preset),
# its evaluation, and its HTML report.
demo: $(STAMP) data
	$(PY) -m attnconv express --dim 2 --kernel 3 --in-channels 8 --out-channels 16 --dtype float64 --plot runs/demo/express-heads.png
	rm -rf runs/demo/train
	$(PY) -m attnconv train --preset fmnist-sa-quadratic --epochs 1 --out runs/demo/train
	$(PY) -m attnconv eval runs/demo/train
	$(PY) -m attnconv report runs/demo/train
	@echo "demo run in runs/demo/train (config.json, metrics.csv, model.safetensors, report.html)"

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
