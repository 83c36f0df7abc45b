# Two commands do everything on a fresh machine with Python 3.11: `make run` and `make test`.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
HOST ?= 127.0.0.1
PORT ?= 8000
PYTEST_ARGS ?=

.PHONY: setup run test bench lint browsers worker clean

$(PY):
	$(PYTHON) -m venv $(VENV)

# Reinstall only when the dependency list changes.
$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)
	@mkdir -p var
	$(PY) manage.py preflight
	$(PY) manage.py migrate --noinput
	$(PY) manage.py load_content

# Debian's Chromium for the browser tests (Playwright drives it; nothing is downloaded by a test tool).
browsers:
	@if ! command -v chromium >/dev/null 2>&1; then \
	  echo "installing Debian chromium for the browser tests"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; \
	fi

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

run: setup
	@$(VENV)/bin/celery -A config worker -Q labs.sim,default --concurrency=2 \
	  --hostname=sim@%h --loglevel=INFO & worker=$$!; \
	trap 'kill -TERM $$worker 2>/dev/null; wait $$worker 2>/dev/null' EXIT; \
	echo; echo "  Serving School: http://$(HOST):$(PORT)/"; \
	echo "  Lab worker: sim queue (simulated on CPU). Press Ctrl-C to stop both."; \
	echo "  First staff user: $(PY) manage.py createsuperuser"; echo; \
	$(PY) manage.py load_content --kept; \
	$(PY) manage.py runserver $(HOST):$(PORT)

worker: setup
	$(VENV)/bin/celery -A config worker -Q labs.sim,default --loglevel=INFO

test: setup browsers lint
	$(VENV)/bin/pytest $(PYTEST_ARGS)

# Speed and timing-accuracy checks (tests/benchmarks/bench_*.py): not in `make test`, whose
# suite must pass on a machine busy with other work. Run these on a quiet one.
bench: setup
	$(VENV)/bin/pytest tests/benchmarks -p no:cacheprovider -o python_files='bench_*.py' -s $(PYTEST_ARGS)

clean:
	rm -rf var .venv
