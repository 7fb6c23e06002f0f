"""PyTorch reference model of hLLM (imports torch; not used by :mod:`hllm.runtime`)."""

from hllm.model.heads import build_head
from hllm.model.hllm import HllmModel, gather_readout, load_backbone, load_head, load_model

__all__ = ["HllmModel", "build_head", "gather_readout", "load_backbone", "load_head", "load_model"]
