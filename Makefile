PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: install run lint test test-warm test-full test-opinfo test-modinfo test-zoo coverage config-docs bench clean

install: $(STAMP)

$(STAMP): pyproject.toml setup.py torchtpu_compile/csrc/native.cpp
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch first and pinned: a looser requirement would pull a multi-GB CUDA build.
	$(PY) -m pip install --quiet torch==2.13.0
	# The native extension (setup.py) compiles against that torch with the system C++
	# compiler: no build isolation, which would fetch a torch of its own. No network either.
	$(PY) -m pip install --quiet --no-build-isolation -e '.[test]'
	touch $(STAMP)

run: install
	$(PY) examples/demo.py

# ruff, configured in pyproject.toml ([tool.ruff]); `ruff check --fix` repairs what it can.
lint: install
	$(PY) -m ruff check .

# Slow tests live in tests/slow/ and carry @pytest.mark.slow (tests/conftest.py checks both).
# Two workers (pytest-xdist), each taking whole files: a file's tests share its fixtures and
# compiled programs, and most of a test's time is one core's compile. TEST_WORKERS=0: serial.
TEST_WORKERS ?= 2
test: install
	$(PY) -m pytest -q --durations=15 -n $(TEST_WORKERS) --dist loadfile tests --ignore=tests/slow

# Warm-cache differential run: WARM_TESTS (default the fast suite) run once over a fresh
# persistent cache (TORCHTPU_TEST_CACHE_DIR, honoured by tests/conftest.py) to fill it, then
# again in new processes over the filled cache; only the warm run is judged (the cold one is
# `make test`). Tests marked cold_cache assert cold-only counters and are left out of it.
WARM_TESTS ?= tests --ignore=tests/slow
WARM_CACHE ?= build/warm-cache
test-warm: install
	rm -rf $(WARM_CACHE)
	-TORCHTPU_TEST_CACHE_DIR=$(WARM_CACHE) $(PY) -m pytest -q \
		-n $(TEST_WORKERS) --dist loadfile $(WARM_TESTS)
	TORCHTPU_TEST_CACHE_DIR=$(WARM_CACHE) $(PY) -m pytest -q --durations=15 \
		-n $(TEST_WORKERS) --dist loadfile -m "not cold_cache" $(WARM_TESTS)

# The compile report's browser test (tests/slow/test_report_browser.py) opens the page in
# Debian's headless chromium: installed here if missing (as root, as CI runs). The fast suite's
# warm-cache run (test-warm) follows the whole suite.
test-full: install
	@command -v chromium >/dev/null || (apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) || \
		echo "make: could not install chromium; the compile report's browser test will fail"
	$(PY) -m pytest -q tests
	$(MAKE) test-warm

# The whole OpInfo sweep alone (both paths, fp32, bf16 and complex64; TORCHTPU_OPINFO_JOBS
# workers), and the model zoo alone; both write build/coverage/*.json, which `make coverage`
# renders.
test-opinfo: install
	$(PY) -m pytest -q tests/slow/test_opinfo_full.py

test-modinfo: install
	$(PY) -m pytest -q tests/slow/test_modinfo_full.py

test-zoo: install
	$(PY) -m pytest -q tests/slow/test_zoo_full.py

coverage: install
	$(PY) -m tests.support.opinfo.report --out docs/coverage.md

# docs/configuration.md is generated from the declarations in torchtpu_compile/config.py.
config-docs: install
	$(PY) -c "from torchtpu_compile import config; \
	          open('docs/configuration.md', 'w').write(config.reference())"

bench: install
	$(PY) bench/run_all.py

clean:
	rm -rf $(VENV) build *.egg-info torchtpu_compile/_native*.so
