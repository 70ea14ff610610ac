# Two entry points that work on a fresh machine with python3 and pip:
#   make demo   -> sets up .venv, trains the offline quickstart and renders attention maps
#   make test   -> sets up .venv and runs the whole test suite
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup demo test lint bench mutations

setup: $(VENV)/.installed

# editable_mode=compat: the clone's folder on sys.path, so `import vitkit` finds the package even run from the
# folder above a clone named vitkit (setuptools' default editable finder loses to that folder: README, Install).
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[dev]" --config-settings editable_mode=compat
	touch $@

demo: setup
	$(PY) tools/train.py recipes/quickstart.yaml
	$(PY) tools/attention_maps.py runs/quickstart/latest/model.safetensors \
		--test-images 6 --out runs/quickstart/latest/attention_maps

# one worker per core (pytest-xdist); a file's tests stay in one worker (a page's snippets share a namespace)
test: setup
	$(PY) -m pytest -q -n auto --dist loadfile

lint: setup
	$(PY) -m ruff check .

# The mutation list still fits the code (a fragment check; `$(PY) dev/mutation_check.py` runs the mutants).
mutations: setup
	$(PY) dev/mutation_check.py --check

bench: setup
	$(PY) tools/benchmark.py
