"""PyTorch reference backend: runs :class:`hllm.model.HllmModel` from a checkpoint directory."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from hllm.engines.base import Engine
from hllm.formats.checkpoint import load_manifest


class TorchEngine(Engine):
    """The reference engine (float32, CPU, ``torch.inference_mode``).

    Args:
        checkpoint: checkpoint directory (``hllm.json``).
        merge: merge a LoRA adapter into the backbone on load instead of running it unmerged.
        threads: torch intra-op threads (None = torch default).
    """

    name = "torch"

    def __init__(self, checkpoint: str | os.PathLike, merge: bool = False, threads: int | None = None):
        self.manifest = load_manifest(checkpoint)
        super().__init__(self.manifest.num_positions, context=self.manifest.head.context)
        self.checkpoint = Path(checkpoint)
        self.merge = merge
        self.threads = threads
        self.model = None

    def _activate(self) -> None:
        from hllm.model import load_model

        self.model = load_model(self.manifest, merge=self.merge)

    def _deactivate(self) -> None:
        self.model = None

    def _run(self, input_ids, readout_positions, item_mask, context_positions=None) -> np.ndarray:
        import torch

        from hllm.model.threads import torch_threads

        with torch_threads(self.threads), torch.inference_mode():
            ctx = None if context_positions is None else torch.from_numpy(context_positions)
            out = self.model(torch.from_numpy(input_ids), torch.from_numpy(readout_positions),
                             torch.from_numpy(item_mask), ctx)
        return out.float().numpy()
