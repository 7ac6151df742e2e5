PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: install run test test-full bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch first and pinned: a looser requirement would pull a multi-GB CUDA build.
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

run: install
	$(PY) examples/demo.py

test: install
	$(PY) -m pytest -q tests --ignore=tests/slow

test-full: install
	$(PY) -m pytest -q tests

bench: install
	$(PY) bench/run_all.py

clean:
	rm -rf $(VENV) build *.egg-info
