# `make demo` and `make test` set everything up from a fresh clone.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo test lint format bench bench-agn clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[test,examples]"
	touch $(STAMP)

setup: $(STAMP)

demo: setup
	$(BIN)/python examples/train_digits.py

test: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest

format: setup
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

bench: setup
	$(BIN)/python bench/clones.py

bench-agn: setup
	$(BIN)/python bench/agn.py

clean:
	rm -rf $(VENV) build *.egg-info
