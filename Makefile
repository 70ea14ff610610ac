# Two entry points that work on a fresh machine with python3 and pip:
#   make demo   -> sets up .venv, trains the offline quickstart and renders attention maps
#   make test   -> sets up .venv and runs the whole test suite
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
export NO_ALBUMENTATIONS_UPDATE := 1

.PHONY: setup demo test bench

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $@

demo: setup
	$(PY) tools/benchmark.py --sections models --models vit_cifar_small:128 --repeats 3

test: setup
	$(PY) -m pytest -q

bench: setup
	$(PY) tools/benchmark.py
