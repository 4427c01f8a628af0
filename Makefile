# The two commands of the README. Each installs what is missing into .venv first
# (scripts/bootstrap.sh; a second run installs nothing).
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: install demo compare test test-fast nightly lint clean

install:
	@./scripts/bootstrap.sh

# a newcomer's first look: the paper's three strategies (PipeDream, GPipe, data parallelism)
# and the one-process reference trained to target on tiny VGG-16, 2 workers x 1 thread, side
# by side (throughput, bytes, memory, bubble, time to target); the table also goes to
# results/demo/. `make compare` runs every system on two workloads (tens of minutes).
DEMO_SYSTEMS := single,pipedream,gpipe,ddp
demo: install
	@mkdir -p results/demo
	$(VENV)/bin/pipebench compare-run --workload vgg16 --workers 2 --threads 1 --systems $(DEMO_SYSTEMS) --experiment demo -o results/demo/compare-vgg16-tiny.md
	@echo
	@echo "Next: every system on two workloads: make compare (results/compare-*.md)."
	@echo "      the paper's tables, simulated: results/reproduce-*.md; schedules: results/schedules.md"
	@echo "      the runs in MLflow: $(VENV)/bin/mlflow ui --backend-store-uri sqlite:///$(CURDIR)/results/mlflow.db"
	@echo "      these runs again, from the store: $(VENV)/bin/pipebench compare --experiment demo"
	@echo "      a benchmark suite and its dashboard: pipebench bench --suite smoke, then pipebench dashboard -o report.html"
	@echo "      what each command does: docs/commands.md"

# every system side by side on tiny VGG-16 and GNMT-8, 2 workers x 1 thread: the tables in
# results/compare-*.md (each system trains to its target, one after another)
compare: install
	$(VENV)/bin/pipebench compare-run --workload vgg16 --workers 2 --threads 1 --quiet -o results/compare-vgg16-tiny.md
	$(VENV)/bin/pipebench compare-run --workload gnmt8 --workers 2 --threads 1 --quiet -o results/compare-gnmt8-tiny.md

# the test files spread over two processes (pytest-xdist; a file's tests stay together, so
# its module fixtures such as a suite run or an mlflow server are set up once)
test: install
	@./scripts/install_browser.sh
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -n 2 --dist loadfile

# the unit tier (no worker processes, no CLI subprocesses): about 2 minutes here
test-fast: install
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -m "not multiprocess and not cli and not browser"

# the nightly benchmark (suites/nightly.toml, under 60 minutes here): the suite result, its
# report, the dashboard of its history, then the regression check against the last
# NIGHTLY_WINDOW results of the suite on this machine (exit 1 on a regression).
# MLFLOW_TRACKING_URI picks the store (default results/mlflow.db); PIPEBENCH_MACHINE names
# the machine on CI.
# NIGHTLY_HISTORY=DIR keeps the nights as result files instead (a runner without a lasting
# store): tonight's is copied there, and the dashboard and the regression check read the
# directory (its suite results: the newest and those before it, by when each finished).
NIGHTLY := results/nightly
# the earlier nights a night is judged against: verdicts.NIGHTLY_WINDOW (a test keeps them equal)
NIGHTLY_WINDOW := 5
NIGHTLY_HISTORY ?=
nightly: install
	@mkdir -p $(NIGHTLY)
	$(VENV)/bin/pipebench bench --suite nightly --json $(NIGHTLY)/nightly.json -o $(NIGHTLY)/nightly.md
ifeq ($(NIGHTLY_HISTORY),)
	$(VENV)/bin/pipebench dashboard --suite nightly -o $(NIGHTLY)/dashboard.html
	$(VENV)/bin/pipebench regressions --current $(NIGHTLY)/nightly.json --history $(NIGHTLY_WINDOW) -o $(NIGHTLY)/regressions.md
else
	@mkdir -p $(NIGHTLY_HISTORY)
	cp $(NIGHTLY)/nightly.json "$(NIGHTLY_HISTORY)/nightly-$$(date -u +%Y%m%dT%H%M%S).json"
	$(VENV)/bin/pipebench dashboard --suite nightly --history-dir "$(NIGHTLY_HISTORY)" -o $(NIGHTLY)/dashboard.html
	$(VENV)/bin/pipebench regressions --current $(NIGHTLY)/nightly.json --history $(NIGHTLY_WINDOW) --history-dir "$(NIGHTLY_HISTORY)" -o $(NIGHTLY)/regressions.md
endif

lint: install
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) results/mlflow.db results/mlartifacts
