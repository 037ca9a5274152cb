# The two commands of the README. Each does all of its own set-up on a fresh machine.
#   make demo   start a local NSQ, publish sample events, read them with the library
#   make test   the whole test suite (unit, real nsqd/nsqlookupd, redis/memcached, Spark
#               on every supported pyspark and through Spark Connect, every supported
#               Python, NSQ in Docker containers, the sdist and the wheel)
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
NSQ_BIN_DIR ?= $(HOME)/.cache/nsq-spark/nsq-v1.3.0/bin
export NSQ_BIN_DIR

.PHONY: setup test demo bench clean docs

# compat editable mode puts the repo root on sys.path (a .pth line), so pyspark's
# discovery of top-level `pyspark_*` modules (pkgutil.iter_modules) sees pyspark_nsq,
# in the driver and in Spark's Python workers alike; the default import-hook mode hides it.
$(VENV)/.installed: setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[all,test]' --config-settings editable_mode=compat
	touch $@

# install-pyspark-versions: one cached venv per other supported pyspark (the version
# tier, tests/versions); install-python-versions: one per other supported Python (the
# Python tier, tests/pythons; an interpreter not found is reported and its tier skips);
# seconds once cached, a minute or two per venv the first time
setup: $(VENV)/.installed
	scripts/install-nsq >/dev/null
	$(PYTHON) scripts/install-pyspark-versions >/dev/null
	$(PYTHON) scripts/install-python-versions >/dev/null
	scripts/install-services
	scripts/install-toxiproxy >/dev/null
	scripts/install-docker
	scripts/install-docs-browser

# mypy --strict checks the package's types first (py.typed is shipped, so users' checkers
# read them). The suite also builds the sdist and the wheel, twine-checks them and runs a
# smoke test from the wheel in a clean venv (tests/test_release.py), and runs the unit
# tier and a live smoke on Python 3.12 and 3.13 (tests/pythons). with-docker runs pytest
# with a private Docker engine for the docker tier (tests/docker), stopped and removed
# afterwards; without one the tier is skipped with the reason. Four pytest-xdist workers,
# a test file each at a time, the JVM tiers' files first (tests/conftest.py): the suite
# mostly waits on servers and JVMs (7.2 CPU-minutes of a 15-minute run with two workers
# on an idle 2-core machine; four took 12 minutes, the crash test's file last).
PYTEST_WORKERS ?= 4
test: setup
	$(PY) -m mypy --strict -p nsq_spark
	scripts/with-docker $(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadfile \
		--no-loadscope-reorder --durations=15 $(PYTEST_ARGS)

# The documentation site (docs/, mkdocs.yml) into site/: strict, so a broken link, a missing
# page or reference fails it. The option tables, CLI reference, charts and changelog are
# generated from the code at build time (docs/hooks/generate.py); PYTHONPATH makes it
# document this checkout. `make test` builds it too (tests/test_docs_site.py) and opens
# every page in headless Chromium.
docs: $(VENV)/.installed
	NO_MKDOCS_2_WARNING=1 PYTHONPATH=$(CURDIR) $(PY) -m mkdocs build --strict --site-dir site

# The demo needs the spark extra and nsqd + nsqlookupd, nothing of the test tiers' set-up
# (pyspark venvs, Toxiproxy, Docker, Chromium). The NSQ build (Go) runs while pip installs.
# A fresh clone with empty pip, Go and nsq caches, on this machine class under a load
# average of 7-10 (other jobs): 145 s in all (one after the other, as first written: the
# venv with pyspark 130 s, nsq built by Go 44 s, the demo 74 s; 247 s). A venv that
# `make setup` made already has the extra.
$(VENV)/.demo-installed: setup.cfg pyproject.toml
	if [ $(VENV)/.installed -nt setup.cfg ] && [ $(VENV)/.installed -nt pyproject.toml ]; then \
	  echo "demo: $(VENV) has the whole set-up already"; \
	else \
	  $(PYTHON) -m venv $(VENV) && $(PY) -m pip install -q --upgrade pip && \
	  $(PY) -m pip install -q -e '.[spark]' --config-settings editable_mode=compat; \
	fi
	touch $@

demo:
	PYTHON=$(PYTHON) scripts/install-nsq >/dev/null & nsq=$$!; \
	$(MAKE) --no-print-directory $(VENV)/.demo-installed || { kill $$nsq; exit 1; }; \
	wait $$nsq
	$(PY) examples/demo.py

# Every benchmark, one after the other; each prints its figures (bench/RESULTS.md has
# the recorded ones with their commands). Each also runs in its smallest form in the
# suite (tests/test_bench_runs.py, which checks that this list names every one).
BENCHES := backlog_poll consume copies decode dedup driver_batch fetch_stages fetch_task latency \
	nsqd_raw options publish publish_spool sink spark spark_latency trace_column
bench: setup
	set -e; for b in $(BENCHES); do echo "== bench_$$b"; $(PY) -m bench.bench_$$b; done
	echo "== cpu_publish_spool"; $(PY) bench/cpu_publish_spool.py .

clean:
	rm -rf $(VENV) build *.egg-info site test-artifacts
