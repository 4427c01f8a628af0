# The two commands of the README. Each installs what is missing into .venv first
# (scripts/bootstrap.sh; a second run installs nothing).
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: install demo test test-fast nightly lint clean

install:
	@./scripts/bootstrap.sh

# every system side by side, 2 workers x 1 thread, tables also written to results/demo/
demo: install
	@mkdir -p results/demo
	$(VENV)/bin/pipebench compare-run --workload vgg16 --workers 2 --threads 1 -o results/demo/compare-vgg16-tiny.md
	$(VENV)/bin/pipebench compare-run --workload gnmt8 --workers 2 --threads 1 -o results/demo/compare-gnmt8-tiny.md

test: install
	@./scripts/install_browser.sh
	$(VENV)/bin/ruff check .
	$(PY) -m pytest

# the unit tier (no worker processes, no CLI subprocesses): about 2 minutes here
test-fast: install
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -m "not multiprocess and not cli and not browser"

# the nightly benchmark (suites/nightly.toml, under 60 minutes here): the suite result, its
# report, the dashboard of its history, then the regression check against the last 5
# results of the suite on this machine (exit 1 on a regression). MLFLOW_TRACKING_URI picks
# the store (default results/mlflow.db); PIPEBENCH_MACHINE names the machine on CI.
NIGHTLY := results/nightly
nightly: install
	@mkdir -p $(NIGHTLY)
	$(VENV)/bin/pipebench bench --suite nightly --json $(NIGHTLY)/nightly.json -o $(NIGHTLY)/nightly.md
	$(VENV)/bin/pipebench dashboard --suite nightly -o $(NIGHTLY)/dashboard.html
	$(VENV)/bin/pipebench regressions --current $(NIGHTLY)/nightly.json --history 5 -o $(NIGHTLY)/regressions.md

lint: install
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) results/mlflow.db results/mlartifacts
