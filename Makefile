# Two entry points for a fresh machine: `make demo` and `make test`.
# Both create the virtualenv and install the package (torch==2.13.0, CPU wheel) on first use.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp

.PHONY: demo test install clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[test]'
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q -n 2 --durations=15

demo: $(STAMP)
	$(PY) -m attnconv express --dim 2 --kernel 3 --in-channels 8 --out-channels 16 --padding 1 --dtype float64 --plot runs/demo/express-heads.png

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
