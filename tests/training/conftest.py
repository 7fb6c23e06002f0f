"""Shared by the training tests: a tiny labelled training file and an in-process ``hllm`` runner."""

from __future__ import annotations

import pytest

from hllm.runtime.slates import write_jsonl
from hllm.testing import tiny_slates


@pytest.fixture(scope="module")
def train_file(tmp_path_factory):
    """Six tiny labelled slates of 2-8 candidates (seed 5) as JSONL."""
    p = tmp_path_factory.mktemp("train") / "train.jsonl"
    write_jsonl(p, tiny_slates(6, (2, 8), seed=5))
    return p


def run(argv, capsys):
    """Run ``hllm argv`` in this process: (exit code, stdout, stderr)."""
    from hllm.cli import main

    with pytest.raises(SystemExit) as e:
        main(argv)
    cap = capsys.readouterr()
    return e.value.code, cap.out, cap.err
