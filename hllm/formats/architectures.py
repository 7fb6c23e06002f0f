"""One small description per supported backbone architecture (Optimum-exporter style).

Torch-free: works from the backbone's ``config.json`` alone, so manifests and adapters can be
validated without loading weights. Supported families: Qwen3, Qwen2 and Llama (decoder-only,
RMSNorm, rotary, gated MLP). Dimensions always come from the config: Qwen3's ``head_dim`` is a
config field and is *not* ``hidden_size / num_attention_heads`` (Qwen3-0.6B: 1024 hidden, 16 heads,
head_dim 128).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hllm.errors import CheckpointError
from hllm.reading import read_json

#: model_type values of config.json that hllm supports.
SUPPORTED_MODEL_TYPES = ("qwen3", "qwen2", "llama")

#: The linear projections LoRA targets in every supported family (paper: "all linear projections").
LINEAR_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class BackboneDims:
    """Dimensions of a decoder-only backbone, read from its config.

    Attributes:
        model_type: ``config.json`` ``model_type`` (one of :data:`SUPPORTED_MODEL_TYPES`).
        hidden_size: D, width of the final hidden state the readout gathers.
        num_layers: number of decoder layers.
        num_heads / num_kv_heads / head_dim: attention geometry (head_dim from config if present).
        intermediate_size: MLP width.
        vocab_size: embedding rows.
        tie_word_embeddings: whether the LM head shares the embedding matrix.
    """

    model_type: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """``{projection: (in_features, out_features)}`` for every LoRA-targeted linear layer."""
        d, h, kv, hd, ff = self.hidden_size, self.num_heads, self.num_kv_heads, self.head_dim, self.intermediate_size
        return {
            "q_proj": (d, h * hd),
            "k_proj": (d, kv * hd),
            "v_proj": (d, kv * hd),
            "o_proj": (h * hd, d),
            "gate_proj": (d, ff),
            "up_proj": (d, ff),
            "down_proj": (ff, d),
        }

    def non_embedding_params(self) -> int:
        """Parameter count of the decoder layers (linear weights only; norms are negligible)."""
        return self.num_layers * sum(i * o for i, o in self.linear_shapes().values())


def read_config(backbone_dir: str | Path) -> dict:
    """Read ``config.json`` of a Hugging Face model directory.

    Raises:
        CheckpointError: the directory or its config.json is missing or not valid JSON.
    """
    path = Path(backbone_dir) / "config.json"
    if not path.is_file():
        raise CheckpointError(f"backbone config not found: {path}")
    return read_json(path, CheckpointError, "backbone config {path} is not valid JSON: {reason}")


def backbone_dims(config: dict) -> BackboneDims:
    """Dimensions of a supported backbone from its config dict.

    Raises:
        CheckpointError: unsupported ``model_type`` or a missing dimension field.
    """
    model_type = config.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise CheckpointError(
            f"unsupported backbone model_type {model_type!r}; supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    try:
        heads = int(config["num_attention_heads"])
        hidden = int(config["hidden_size"])
        head_dim = config.get("head_dim") or hidden // heads
        return BackboneDims(
            model_type=model_type,
            hidden_size=hidden,
            num_layers=int(config["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(head_dim),
            intermediate_size=int(config["intermediate_size"]),
            vocab_size=int(config["vocab_size"]),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        )
    except KeyError as e:
        raise CheckpointError(f"backbone config lacks field {e.args[0]!r}") from None
