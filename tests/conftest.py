"""Shared fixtures: tiny random backbones (Qwen3 with head_dim ≠ hidden/heads, Qwen2, Llama with tied
embeddings), checkpoints and exports (one with a context-reading head) built offline in a session temp dir."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

# A suite started in the background by a shell without job control (`cmd &`) inherits SIGINT ignored, and so
# would every `hllm` subprocess a test starts (exec keeps SIG_IGN): the tests that send SIGINT to one need the
# default disposition, which a Python handler here gives them (exec resets a handled signal to SIG_DFL).
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parents[1]
SAMPLE_SLATES = REPO / "examples" / "beauty-eval-sample.jsonl.gz"
TINY_HEAD = dict(d_model=32, num_heads=4, ff_dim=64)


def train_config(backbone, slates, out, **overrides):
    """The training tests' tiny :class:`hllm.training.trainer.TrainConfig`: K=8, the tiny head, LoRA r=4,
    4 steps of batch 2 at lr 1e-2, 5 Sinkhorn iterations, one thread; ``overrides`` replace any field."""
    from hllm.training.trainer import TrainConfig

    base = dict(backbone=str(backbone), slates=str(slates), out_dir=str(out), num_positions=8, head_kwargs=TINY_HEAD,
                lora_rank=4, steps=4, batch_size=2, accum=1, lr=1e-2, save_every=2, sinkhorn_iters=5, threads=1)
    return TrainConfig(**{**base, **overrides})


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("tiny")


@pytest.fixture(scope="session")
def backbones(tiny_dir) -> dict[str, Path]:
    """{family: HF model dir} for qwen3, qwen2, llama."""
    from hllm.testing import tiny_backbone

    return {f: tiny_backbone(tiny_dir / f"backbone-{f}", f, seed=i) for i, f in enumerate(("qwen3", "qwen2", "llama"))}


@pytest.fixture(scope="session")
def qwen3_backbone(backbones) -> Path:
    return backbones["qwen3"]


@pytest.fixture(scope="session")
def lora_checkpoint(tiny_dir, qwen3_backbone) -> Path:
    """Untrained self-attention checkpoint (K=8) with a non-zero LoRA adapter (r=4)."""
    from hllm.checkpoint.init import init_checkpoint

    return init_checkpoint(qwen3_backbone, tiny_dir / "ckpt-lora", "self_attention", 8, seed=0, lora_rank=4,
                           head_kwargs=TINY_HEAD)


@pytest.fixture(scope="session")
def merged_checkpoint(tiny_dir, lora_checkpoint) -> Path:
    from hllm.checkpoint.merge import merge_checkpoint
    from hllm.testing import tiny_slates

    merge_checkpoint(lora_checkpoint, tiny_dir / "ckpt-merged", tiny_slates(2, (2, 8)))
    return tiny_dir / "ckpt-merged"


@pytest.fixture(scope="session")
def export_dir(tiny_dir, merged_checkpoint) -> Path:
    """ONNX export (fp32, opset 20, default flavour ort-cpu: fused contrib ops) of the merged tiny checkpoint."""
    from hllm.exporter.onnx import export_onnx

    export_onnx(merged_checkpoint, tiny_dir / "export")
    return tiny_dir / "export"


@pytest.fixture(scope="session")
def standard_export_dir(tiny_dir, merged_checkpoint) -> Path:
    """ONNX export, flavour standard (only ai.onnx ops: the TensorRT / FP16 / quantization input)."""
    from hllm.exporter.onnx import export_onnx

    export_onnx(merged_checkpoint, tiny_dir / "export-standard", flavour="standard")
    return tiny_dir / "export-standard"


@pytest.fixture(scope="session")
def context_checkpoint(tiny_dir, qwen3_backbone) -> Path:
    """Untrained self-attention checkpoint (K=8) whose head reads the user context (``head.context``)."""
    from hllm.checkpoint.init import init_checkpoint

    return init_checkpoint(qwen3_backbone, tiny_dir / "ckpt-context", "self_attention", 8, seed=5,
                           head_kwargs={**TINY_HEAD, "context": True})


@pytest.fixture(scope="session")
def context_export_dir(tiny_dir, context_checkpoint) -> Path:
    """ONNX export (default flavour ort-cpu) of the context-head checkpoint: four graph inputs."""
    from hllm.exporter.onnx import export_onnx

    export_onnx(context_checkpoint, tiny_dir / "export-context")
    return tiny_dir / "export-context"


@pytest.fixture(scope="session")
def export_k50(tiny_dir, qwen3_backbone) -> Path:
    """A tiny export with K = 50, so the packaged 100-slate sample (50 candidates each) ranks as it is."""
    from hllm.checkpoint.init import init_checkpoint
    from hllm.exporter.onnx import export_onnx

    ck = init_checkpoint(qwen3_backbone, tiny_dir / "ckpt-k50", "self_attention", 50, seed=0, head_kwargs=TINY_HEAD)
    export_onnx(ck, tiny_dir / "export-k50")
    return tiny_dir / "export-k50"


@pytest.fixture
def slates():
    from hllm.testing import tiny_slates

    return tiny_slates(6, (1, 8), seed=3)
