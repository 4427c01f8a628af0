# The two commands of the README. Each installs what is missing into .venv first
# (scripts/bootstrap.sh; a second run installs nothing).
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: install demo test lint clean

install:
	@./scripts/bootstrap.sh

demo: install
	$(VENV)/bin/pipebench run --system single --workload vgg16 --scale tiny

test: install
	$(VENV)/bin/ruff check .
	$(PY) -m pytest

lint: install
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) results/mlflow.db results/mlartifacts
