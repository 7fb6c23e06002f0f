"""Fixtures of the format tests."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from hllm.formats.checkpoint import load_manifest


@pytest.fixture
def ckpt(lora_checkpoint, tmp_path) -> Path:
    """A private copy of the LoRA checkpoint whose manifest points at the original backbone."""
    dst = tmp_path / "ck"
    shutil.copytree(lora_checkpoint, dst)
    d = json.loads((dst / "hllm.json").read_text())
    d["backbone"]["path"] = str(load_manifest(lora_checkpoint).backbone_path)
    (dst / "hllm.json").write_text(json.dumps(d))
    return dst
