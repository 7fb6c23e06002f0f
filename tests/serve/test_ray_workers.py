"""`hllm rank --ray --workers N` puts N actors to work: the slate file is read as one range of chunks per read
task, so the actor pool gets more than one input (one read task gave one merged block, ranked by ONE actor)."""

from __future__ import annotations

import json
import os
import time
from collections import Counter

import numpy as np
import pytest

pytest.importorskip("ray", reason="ray is not installed (pip install 'hllm[ray]')")
pytest.importorskip("ray.data")

from hllm.runtime import ray_data  # noqa: E402
from hllm.runtime.slates import write_jsonl  # noqa: E402
from hllm.testing import tiny_slates  # noqa: E402


def test_read_tasks_split_the_chunks_into_contiguous_ranges_in_file_order(tmp_path):
    write_jsonl(tmp_path / "s.jsonl", tiny_slates(11, (1, 5), seed=2))
    want = list(ray_data.iter_chunks(tmp_path / "s.jsonl", 2))  # 6 chunks of 2 slates (the last holds 1)
    source = ray_data._make_datasource()(str(tmp_path / "s.jsonl"), 2, None, len(want), 4)
    for parallelism, n_tasks in ((1, 1), (4, 4), (100, 6)):
        tasks = source.get_read_tasks(parallelism)
        assert len(tasks) == n_tasks
        got = [(int(f), c) for t in tasks for block in t() for f, c in zip(block["first"].to_pylist(), block["chunk"].to_pylist())]
        assert got == [(f, c) for f, c in want]
        assert sum(t.metadata.num_rows for t in tasks) == len(want)


def test_two_workers_both_rank_and_the_output_is_the_single_process_one(tmp_path, export_dir, monkeypatch):
    from hllm.runtime import Ranker

    seen = tmp_path / "actors"
    seen.mkdir()

    class PidActor(ray_data.RankActor):  # defined here, so Ray ships it by value
        def __call__(self, batch):
            # A barrier: an actor's first call waits (≤ 60 s) until another actor has a call too. A pool that
            # queues every block on the first actor never gets there and fails below; one that spreads the
            # blocks passes whatever the machine's load (a fast first actor could otherwise take them all).
            (seen / str(os.getpid())).touch()
            deadline = time.monotonic() + 60
            while len(list(seen.iterdir())) < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            out = super().__call__(batch)
            tagged = [json.dumps([dict(r, pid=os.getpid()) for r in json.loads(t)]) for t in out["rankings"]]
            return {"rankings": np.array(tagged, dtype=object)}

    monkeypatch.setattr(ray_data, "RankActor", PidActor)
    slates = tiny_slates(48, (2, 6), seed=5)
    write_jsonl(tmp_path / "s.jsonl", slates)
    n = ray_data.rank_file(export_dir, tmp_path / "s.jsonl", tmp_path / "ray.jsonl", workers=2, batch_size=1)
    rows = [json.loads(line) for line in (tmp_path / "ray.jsonl").read_text().splitlines()]
    assert n == 48 and len(rows) == 48
    per_actor = Counter(r.pop("pid") for r in rows)
    assert len(per_actor) == 2, per_actor  # both actors ranked slates
    with Ranker.from_path(export_dir) as r:
        want = [x.to_dict() for x in r.rank(slates)]
    assert [g["order"] for g in rows] == [w["order"] for w in want]
    assert [g["slate_id"] for g in rows] == [w["slate_id"] for w in want]
