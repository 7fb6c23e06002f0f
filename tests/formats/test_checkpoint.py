"""Checkpoint manifest validation: every problem named."""

import json
import shutil

import pytest

from hllm.formats.checkpoint import load_manifest
from hllm.errors import CheckpointError
from hllm.checkpoint.init import init_checkpoint
from tests.conftest import TINY_HEAD


def edit_manifest(ckpt, tmp_path, fn):
    dst = tmp_path / "ck"
    shutil.copytree(ckpt, dst)
    d = json.loads((dst / "hllm.json").read_text())
    # the backbone path is relative to the original checkpoint dir; the adapter was copied along
    d["backbone"]["path"] = str(load_manifest(ckpt).backbone_path)
    fn(d, dst)
    (dst / "hllm.json").write_text(json.dumps(d))
    return dst


def test_round_trip(lora_checkpoint):
    m = load_manifest(lora_checkpoint)
    assert m.head.kind == "self_attention" and m.num_positions == 8
    assert m.adapter_path is not None and m.dims.model_type == "qwen3"


def test_missing_dir_and_manifest(tmp_path):
    with pytest.raises(CheckpointError, match="not found"):
        load_manifest(tmp_path / "nope")
    with pytest.raises(CheckpointError, match="hllm.json is missing"):
        load_manifest(tmp_path)


def test_unknown_head_kind(lora_checkpoint, tmp_path):
    dst = edit_manifest(lora_checkpoint, tmp_path, lambda d, _: d["head"].update(kind="mlp"))
    with pytest.raises(CheckpointError, match="unknown head kind 'mlp'"):
        load_manifest(dst)


def test_missing_head_file(lora_checkpoint, tmp_path):
    dst = edit_manifest(lora_checkpoint, tmp_path, lambda d, p: (p / "head.safetensors").unlink())
    with pytest.raises(CheckpointError, match="head weights not found"):
        load_manifest(dst)


def test_head_width_mismatch(lora_checkpoint, tmp_path):
    dst = edit_manifest(lora_checkpoint, tmp_path, lambda d, _: d["head"].update(input_dim=99))
    with pytest.raises(CheckpointError, match="hidden_size=32"):
        load_manifest(dst)


def test_adapter_for_another_base(lora_checkpoint, backbones, tmp_path):
    """An adapter made for Qwen3 (head_dim 16 → q_proj out 64) does not fit the Qwen2 backbone (q_proj out 32)."""
    dst = edit_manifest(lora_checkpoint, tmp_path, lambda d, _: d["backbone"].update(path=str(backbones["qwen2"])))
    with pytest.raises(CheckpointError, match="adapter does not match the backbone"):
        load_manifest(dst)


def test_missing_adapter_files(lora_checkpoint, tmp_path):
    dst = edit_manifest(lora_checkpoint, tmp_path, lambda d, p: (p / "adapter" / "adapter_model.safetensors").unlink())
    with pytest.raises(CheckpointError, match="adapter file not found"):
        load_manifest(dst)


def test_unsupported_backbone(tmp_path, qwen3_backbone):
    bb = tmp_path / "bb"
    shutil.copytree(qwen3_backbone, bb)
    cfg = json.loads((bb / "config.json").read_text())
    cfg["model_type"] = "gpt2"
    (bb / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="unsupported backbone model_type 'gpt2'"):
        init_checkpoint(bb, tmp_path / "ck", head_kwargs=TINY_HEAD)


def test_init_refuses_existing_dir(qwen3_backbone, tmp_path):
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "keep.txt").write_text("x")
    with pytest.raises(FileExistsError):
        init_checkpoint(qwen3_backbone, tmp_path / "ck", head_kwargs=TINY_HEAD)
    assert (tmp_path / "ck" / "keep.txt").read_text() == "x"
