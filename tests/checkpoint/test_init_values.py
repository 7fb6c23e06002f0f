"""`hllm init` values no checkpoint reader would accept are refused by the library, naming the option,
before any work."""

from __future__ import annotations

import math

import pytest

from hllm.checkpoint.init import init_checkpoint
from hllm.errors import CheckpointError, HllmError
from hllm.formats.prompt import PromptSpec
from tests.conftest import TINY_HEAD


@pytest.mark.parametrize(
    "field, value, words",
    [
        ("candidate_token_budget", 0, "candidate_token_budget must be a positive integer, got 0"),
        ("max_seq_len", -1, "max_seq_len must be a positive integer, got -1"),
        ("history_token_budget", 0, "history_token_budget must be a positive integer"),
        ("max_history", -1, "max_history must be a non-negative integer, got -1"),
        ("max_seq_len", 2048.0, "max_seq_len must be a positive integer, got 2048.0"),
        ("candidate_token_budget", True, "candidate_token_budget must be a positive integer, got True"),
    ],
)
def test_prompt_values_refused_where_they_are_made(field, value, words):
    with pytest.raises(CheckpointError, match="^prompt spec " + field) as e:
        PromptSpec(**{field: value})
    assert words in str(e.value)
    assert issubclass(CheckpointError, HllmError)


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"lora_rank": -1}, "lora_rank must be a positive integer (or none for no adapter), got -1"),
        ({"lora_rank": 0}, "lora_rank must be a positive integer"),
        ({"lora_rank": 2.5}, "lora_rank must be a positive integer"),
        ({"lora_init_std": math.nan}, "lora_init_std must be a finite number ≥ 0, got nan"),
        ({"lora_init_std": -0.1}, "lora_init_std must be a finite number ≥ 0"),
        ({"seed": -1}, "seed must be a non-negative integer, got -1"),
    ],
)
def test_init_options_refused_before_any_work(tmp_path, kwargs, words):
    """Checked before the backbone is even read: a missing backbone is not what gets reported."""
    with pytest.raises(CheckpointError) as e:
        init_checkpoint(tmp_path / "no-backbone", tmp_path / "ck", **kwargs)
    assert words in str(e.value)
    assert not (tmp_path / "ck").exists()


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"num_positions": 0}, "head num_positions must be a positive integer, got 0"),
        ({"num_positions": -5}, "head num_positions must be a positive integer, got -5"),
        ({"head_kind": "mlp"}, "unknown head kind 'mlp'"),
        ({"head_kwargs": {**TINY_HEAD, "num_heads": 5}}, "not divisible by num_heads=5"),
        ({"head_kwargs": {**TINY_HEAD, "depth": 3}}, "unknown head keys"),
        ({"head_kwargs": {**TINY_HEAD, "d_model": 0}}, "head d_model must be a positive integer"),
    ],
)
def test_head_values_refused(qwen3_backbone, tmp_path, kwargs, words):
    kwargs = {"head_kwargs": TINY_HEAD, **kwargs}
    with pytest.raises(CheckpointError) as e:
        init_checkpoint(qwen3_backbone, tmp_path / "ck", **kwargs)
    assert words in str(e.value)
    assert not (tmp_path / "ck").exists() and [p.name for p in tmp_path.iterdir()] == []
