"""`hllm serve`: a real uvicorn on 127.0.0.1 (random port) over the tiny ONNX export.

Covers: concurrency correctness of micro-batching against `Ranker` directly, bad input → 4xx naming
the problem, engine-failure isolation, queue-full 503 + Retry-After, deadlines, readiness, metrics,
OpenAPI, the load test, and SIGTERM drain of the `hllm serve` process.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

for _mod in ("fastapi", "uvicorn", "httpx", "prometheus_client"):
    pytest.importorskip(_mod, reason="the serve extra is not installed (pip install -e .[serve])")

import httpx  # noqa: E402

from hllm.engines.base import Engine  # noqa: E402
from hllm.errors import DecodeError, EngineError  # noqa: E402
from hllm.runtime import Ranker  # noqa: E402
from hllm.runtime.prompt import PromptBuilder  # noqa: E402
from hllm.serve.app import ServeOptions, create_app  # noqa: E402
from hllm.serve.batching import BatchOptions  # noqa: E402
from hllm.serve.server import BackgroundServer, wait_ready  # noqa: E402
from hllm.testing import tiny_slates  # noqa: E402

K = 8  # the tiny export's head


class ControlledEngine(Engine):
    """Delegates to a real engine; can block on a gate and fail when the batch has ``fail_n`` item slots."""

    name = "controlled"

    def __init__(self, inner: Engine):
        super().__init__(inner.num_positions)
        self.inner = inner
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Semaphore(0)
        self.fail_n: int | None = None
        self.calls = 0

    def _activate(self):
        self.inner.activate()

    def _deactivate(self):
        self.inner.deactivate()

    def _run(self, input_ids, readout_positions, item_mask, context_positions=None):
        self.calls += 1
        self.entered.release()
        assert self.gate.wait(timeout=30)
        if self.fail_n is not None and item_mask.shape[1] == self.fail_n:
            raise EngineError(f"injected failure on a batch with {self.fail_n} item slots")
        return self.inner.run(input_ids, readout_positions, item_mask, context_positions)


class PoisonEngine(Engine):
    """Delegates to a real engine, then writes ``value`` at ``M[b, 0, column]`` of every slate, where
    ``column`` is ``n_b`` (the first rank position past the slate) or, with ``inside``, ``0``."""

    name = "poison"

    def __init__(self, inner: Engine, value: float = float("inf")):
        super().__init__(inner.num_positions)
        self.inner, self.value, self.inside = inner, value, False

    def _activate(self):
        self.inner.activate()

    def _deactivate(self):
        self.inner.deactivate()

    def _run(self, input_ids, readout_positions, item_mask, context_positions=None):
        scores = np.array(self.inner.run(input_ids, readout_positions, item_mask, context_positions))
        for b, n in enumerate(item_mask.sum(axis=1)):
            if self.inside or n < scores.shape[2]:
                scores[b, 0, 0 if self.inside else int(n)] = self.value
        return scores


def _server(ranker, **batch) -> tuple[BackgroundServer, object]:
    opts = ServeOptions(batch=BatchOptions(**{"max_batch_slates": 4, "max_wait_ms": 20.0, **batch}), max_body_bytes=64 * 1024)
    app = create_app(ranker, opts)
    return BackgroundServer(app), app


@pytest.fixture(scope="module")
def reference(export_dir):
    with Ranker.from_path(export_dir) as r:
        yield r


@pytest.fixture(scope="module")
def served(export_dir):
    """A batching server (max 4 slates, 20 ms window) on a plain ONNX Ranker."""
    srv, app = _server(Ranker.from_path(export_dir))
    with srv:
        wait_ready(srv.url, timeout_s=120)
        yield srv, app


def _post(url, body, **kw):
    return httpx.post(f"{url}/v1/rank", json=body, timeout=60, **kw)


def test_serve_package_does_not_import_torch():
    code = (
        "import sys, hllm.serve, hllm.bench.loadtest, hllm.serve.server, scripts.serve_smoke, hllm.serve.triton, hllm.serve.triton.client, hllm.serve.triton.repo, hllm.serve.triton.decode_model;"
        "bad=[m for m in ('torch','transformers','peft') if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_health_ready_and_one_ranking(served, reference):
    srv, _ = served
    assert httpx.get(f"{srv.url}/healthz").json() == {"status": "ok"}
    ready = httpx.get(f"{srv.url}/readyz")
    assert ready.status_code == 200
    s = tiny_slates(1, 6, seed=11)[0]
    r = _post(srv.url, {"slates": [s]})
    assert r.status_code == 200, r.text
    got = r.json()
    want = reference.rank([s])[0]
    assert got["rankings"][0]["order"] == want.order
    assert got["rankings"][0]["ranking"] == want.item_ids
    np.testing.assert_allclose(got["rankings"][0]["scores"], want.scores, atol=1e-4)
    t = got["timing"]
    assert t["batch_slates"] >= 1 and t["engine_ms"] > 0 and t["total_ms"] >= t["engine_ms"]


def test_jsonl_body_and_single_slate_object(served, reference):
    srv, _ = served
    ss = tiny_slates(3, (2, 8), seed=12)
    body = "\n".join(json.dumps(s) for s in ss) + "\n"
    r = httpx.post(f"{srv.url}/v1/rank", content=body, headers={"content-type": "application/x-ndjson"}, timeout=60)
    assert r.status_code == 200, r.text
    assert [x["order"] for x in r.json()["rankings"]] == [x.order for x in reference.rank(ss)]
    bad = body + "{oops\n"
    r = httpx.post(f"{srv.url}/v1/rank", content=bad, headers={"content-type": "application/x-ndjson"}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("line 4: malformed JSON")
    r = httpx.post(f"{srv.url}/v1/rank", content=body + '{"candidates": []}\n', headers={"content-type": "application/x-ndjson"})
    assert r.status_code == 422 and "JSONL slate 4: empty slate" in r.json()["error"]["message"]
    r1 = _post(srv.url, ss[1])  # a bare slate object
    assert r1.status_code == 200 and r1.json()["rankings"][0]["slate_id"] == ss[1]["slate_id"]


def test_concurrent_requests_each_get_their_own_correct_ranking(served, reference):
    """Under concurrent load every request gets exactly its own slates' rankings (== Ranker), none lost."""
    srv, app = served
    pool = tiny_slates(60, (1, K), seed=21)
    reqs = []
    i = 0
    for n in [1, 2, 3, 1, 1, 2] * 5:  # 30 requests, 1-3 slates each (60 slates)
        reqs.append(pool[i : i + n])
        i += n
    want = {s["slate_id"]: r for s, r in zip(pool, reference.rank(pool))}
    batches_before = app.state.hllm.batcher.stats.batches

    def send(slates):
        return _post(srv.url, {"slates": slates})

    with concurrent.futures.ThreadPoolExecutor(8) as ex:
        responses = list(ex.map(send, reqs))
    assert [r.status_code for r in responses] == [200] * len(reqs)
    multi = 0
    for slates, r in zip(reqs, responses):
        body = r.json()
        assert [x["slate_id"] for x in body["rankings"]] == [s["slate_id"] for s in slates]
        for s, got in zip(slates, body["rankings"]):
            ref = want[s["slate_id"]]
            assert got["order"] == ref.order, s["slate_id"]
            assert got["ranking"] == ref.item_ids
            np.testing.assert_allclose(got["scores"], ref.scores, atol=1e-4)
        multi += body["timing"]["batch_requests"] > 1
    stats = app.state.hllm.batcher.stats
    assert multi > 0, "no request shared an engine batch: micro-batching was not exercised"
    assert stats.batches - batches_before < len(reqs)  # fewer engine calls than requests
    assert max(stats.sizes) <= 4  # never over max_batch_slates


def _long_slate():
    return {"slate_id": "long", "history": ["word " * 30] * 5, "candidates": [{"item_id": f"c{i}", "title": "longer title text " * 4} for i in range(K)]}


def test_context_head_served_with_micro_batches(context_export_dir, context_checkpoint):
    """A head that reads the user context: concurrent requests merged into batches rank as the PyTorch checkpoint."""
    slates = tiny_slates(6, (2, 8), seed=17)
    with Ranker.from_path(context_checkpoint) as torch_ranker:
        want = [r.order for r in torch_ranker.rank(slates)]
    srv, _ = _server(Ranker.from_path(context_export_dir))
    with srv:
        wait_ready(srv.url, timeout_s=120)
        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            bodies = list(pool.map(lambda sl: _post(srv.url, {"slates": [sl]}), slates))
    assert all(r.status_code == 200 for r in bodies), [r.text for r in bodies]
    assert [r.json()["rankings"][0]["order"] for r in bodies] == want


@pytest.mark.parametrize(
    "body, status, kind, words",
    [
        ("{not json", 400, "bad_json", "malformed JSON"),
        ([1, 2], 422, "bad_slate", "slates[0]: a slate must be a JSON object, got int"),
        ({"slates": {"candidates": []}}, 422, "bad_request", "'slates' must be a list"),
        ({"slates": []}, 422, "bad_request", "no slates"),
        ({"slates": [{"candidates": []}]}, 422, "bad_slate", "empty slate"),
        ({"slates": [{"candidates": "abc"}]}, 422, "bad_slate", "'candidates' must be a list"),
        ({"slates": [{"candidates": [{"title": 5}]}]}, 422, "bad_slate", "candidates[0].title must be a string, got int"),
        ({"slates": [{"candidates": [{"title": "a"}], "history": "x"}]}, 422, "bad_slate", "'history' must be a list"),
        ({"slates": [{"slate_id": "big", "candidates": [{"title": f"t{i}"} for i in range(1001)]}]}, 400, "too_many_documents",
         "slates[0]: slate big: 1001 candidates, over the limit of 1000 documents"),
        ({"slates": [{"candidates": [{"title": "a"}]}], "deadline_ms": "soon"}, 422, "bad_request", "'deadline_ms' must be a finite positive number"),
        ({"slates": [{"candidates": [{"title": "a"}]}], "extra": 1}, 422, "bad_request", "unknown fields ['extra']"),
        ({"slates": [{"candidates": [{"title": "a"}]}] * 40}, 413, "too_large", "40 slates in one request"),
        ({"slates": [{"candidates": [{"title": "x" * 70_000}]}]}, 413, "too_large", "over the limit of 65536 bytes"),
    ],
)
def test_bad_input_is_4xx_naming_the_problem(served, body, status, kind, words):
    srv, _ = served
    if isinstance(body, str):
        r = httpx.post(f"{srv.url}/v1/rank", content=body, headers={"content-type": "application/json"})
    else:
        r = _post(srv.url, body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["kind"] == kind and words in err["message"], err
    assert httpx.get(f"{srv.url}/healthz").status_code == 200  # and the server keeps serving


def test_wrong_content_type_and_bad_utf8(served):
    srv, _ = served
    r = httpx.post(f"{srv.url}/v1/rank", content=b"x", headers={"content-type": "text/plain"})
    assert r.status_code == 415 and "text/plain" in r.json()["error"]["message"]
    r = httpx.post(f"{srv.url}/v1/rank", content=b'{"slates": "\xff"}', headers={"content-type": "application/json"})
    assert r.status_code == 400 and "not UTF-8" in r.json()["error"]["message"]


def test_over_long_prompt_ranks_in_blocks(export_dir):
    """A prompt one token over max_seq_len is ranked in blocks (``blocks`` in the ranking); one candidate that does
    not fit with the user context alone is still a 422."""
    base = Ranker.from_path(export_dir)
    n_tokens = len(base.builder.encode_one(_long_slate()).ids)
    spec = dataclasses.replace(base.builder.spec, max_seq_len=n_tokens - 1)
    ranker = Ranker(base.engine, PromptBuilder(base.builder.tokenizer, spec, max_items=K))
    srv, _ = _server(ranker)
    with srv:
        wait_ready(srv.url, timeout_s=120)
        r = _post(srv.url, {"slates": [_long_slate()]})
        assert r.status_code == 200 and r.json()["rankings"][0]["blocks"] == 2
        assert sorted(r.json()["rankings"][0]["order"]) == list(range(K))
        one = dict(_long_slate(), candidates=[{"title": "longer title text " * 400}])
        spec1 = dataclasses.replace(spec, max_seq_len=len(ranker.builder.encode_one(dict(one, candidates=[{"title": "x"}])).ids))
        srv1, _ = _server(Ranker(base.engine, PromptBuilder(base.builder.tokenizer, spec1, max_items=K)))
        with srv1:
            wait_ready(srv1.url, timeout_s=120)
            r = _post(srv1.url, {"slates": [one]})
            assert r.status_code == 422 and f"over max_seq_len={spec1.max_seq_len}" in r.json()["error"]["message"]
        ok = _post(srv.url, {"slates": tiny_slates(1, 3, seed=5)})
        assert ok.status_code == 200


def test_engine_failure_fails_only_its_batch(export_dir, reference):
    """With batching off, requests whose batch fails get 500 + error id; the others get correct rankings."""
    eng = ControlledEngine(Ranker.from_path(export_dir).engine)
    base = Ranker.from_path(export_dir)
    srv, app = _server(Ranker(eng, base.builder), max_batch_slates=1, max_wait_ms=0.0)
    with srv:
        wait_ready(srv.url, timeout_s=120)
        eng.fail_n = 7  # any batch whose slates have 7 candidates fails
        ss = [tiny_slates(1, n, seed=30 + i)[0] for i, n in enumerate([3, 7, 5, 7, 2, 4])]
        with concurrent.futures.ThreadPoolExecutor(6) as ex:
            rs = list(ex.map(lambda s: _post(srv.url, {"slates": [s]}), ss))
        ids = set()
        for s, r in zip(ss, rs):
            if len(s["candidates"]) == 7:
                assert r.status_code == 500, r.text
                err = r.json()["error"]
                assert err["kind"] == "engine" and "injected failure" in err["message"] and err["id"]
                ids.add(err["id"])
            else:
                assert r.status_code == 200, r.text
                assert r.json()["rankings"][0]["order"] == reference.rank([s])[0].order
        assert len(ids) == 2  # one error id per failed batch
        assert app.state.hllm.batcher.stats.failed_batches == 2
        after = _post(srv.url, {"slates": [ss[0]]})  # still serving
        assert after.status_code == 200
        m = httpx.get(f"{srv.url}/metrics").text
        assert 'hllm_errors_total{kind="engine"} 2.0' in m
        assert 'hllm_failed_batches_total{kind="engine"} 2.0' in m


def test_queue_full_is_503_with_retry_after_and_deadline_is_504(export_dir):
    eng = ControlledEngine(Ranker.from_path(export_dir).engine)
    base = Ranker.from_path(export_dir)
    srv, app = _server(Ranker(eng, base.builder), max_batch_slates=1, max_wait_ms=0.0, max_queue=2)
    batcher = app.state.hllm.batcher
    with srv:
        wait_ready(srv.url, timeout_s=120)
        while eng.entered.acquire(blocking=False):  # forget the warm-up call
            pass
        eng.gate.clear()
        s = tiny_slates(1, 4, seed=40)
        with concurrent.futures.ThreadPoolExecutor(4) as ex:
            first = ex.submit(_post, srv.url, {"slates": s})
            assert eng.entered.acquire(timeout=30)  # request 1 is inside the engine
            queued = [ex.submit(_post, srv.url, {"slates": s}) for _ in range(2)]
            t_end = time.monotonic() + 30
            while batcher.depth < 2 and time.monotonic() < t_end:
                time.sleep(0.01)
            assert batcher.depth == 2
            full = _post(srv.url, {"slates": s})
            assert full.status_code == 503, full.text
            assert full.headers["retry-after"] == "1" and full.json()["error"]["kind"] == "queue_full"
            late = _post(srv.url, {"slates": s, "deadline_ms": 1})  # queue is full too → 503 first
            assert late.status_code == 503
            eng.gate.set()
            assert [f.result().status_code for f in [first, *queued]] == [200, 200, 200]
        # deadline: the engine is held; a request with a 100 ms deadline gets 504
        eng.gate.clear()
        with concurrent.futures.ThreadPoolExecutor(2) as ex:
            blocker = ex.submit(_post, srv.url, {"slates": s})
            assert eng.entered.acquire(timeout=30)
            r = _post(srv.url, {"slates": s, "deadline_ms": 100})
            assert r.status_code == 504 and r.json()["error"]["kind"] == "deadline"
            eng.gate.set()
            assert blocker.result().status_code == 200
        assert _post(srv.url, {"slates": s}).status_code == 200


def test_kserve_503s_carry_retry_after_like_the_other_routes(export_dir):
    """KServe infer while the engine warms up (not ready, as while draining) and with the queue full: 503 with
    ``Retry-After: 1`` and the protocol's ``{"error": message}`` (the header was dropped on these routes)."""
    base = Ranker.from_path(export_dir)
    eng = ControlledEngine(base.engine)
    eng.gate.clear()  # hold the warm-up
    srv, app = _server(Ranker(eng, base.builder), max_batch_slates=1, max_wait_ms=0.0, max_queue=1)
    s = tiny_slates(1, 3, seed=41)[0]
    v2 = {"inputs": [{"name": "slates", "datatype": "BYTES", "shape": [1, 1], "data": [json.dumps(s)]}]}
    infer = lambda: httpx.post(f"{srv.url}/v2/models/hllm_ranker/infer", json=v2, timeout=60)  # noqa: E731
    with srv:
        t_end = time.monotonic() + 60
        while httpx.get(f"{srv.url}/v2/health/live").status_code != 200 and time.monotonic() < t_end:
            time.sleep(0.05)
        answers = [infer(), httpx.get(f"{srv.url}/v2/health/ready"), httpx.get(f"{srv.url}/v2/models/hllm_ranker/ready")]
        for r in answers:
            assert r.status_code == 503 and r.headers["retry-after"] == "1", r.text
        assert answers[0].json() == {"error": "model hllm_ranker is not ready"}
        eng.gate.set()
        wait_ready(srv.url, timeout_s=60)
        while eng.entered.acquire(blocking=False):  # forget the warm-up call
            pass
        eng.gate.clear()
        with concurrent.futures.ThreadPoolExecutor(2) as ex:
            first = ex.submit(infer)
            assert eng.entered.acquire(timeout=30)  # on the engine
            queued = ex.submit(infer)
            while app.state.hllm.batcher.depth < 1 and time.monotonic() < t_end:
                time.sleep(0.01)
            full = infer()
            eng.gate.set()
            assert first.result().status_code == 200 and queued.result().status_code == 200
    assert full.status_code == 503 and full.headers["retry-after"] == "1", full.text
    assert "queue full" in full.json()["error"]


def test_not_ready_until_warmed_up(export_dir):
    eng = ControlledEngine(Ranker.from_path(export_dir).engine)
    base = Ranker.from_path(export_dir)
    eng.gate.clear()  # hold the warm-up
    srv, _ = _server(Ranker(eng, base.builder))
    with srv:
        assert httpx.get(f"{srv.url}/healthz").status_code == 200
        r = httpx.get(f"{srv.url}/readyz")
        assert r.status_code == 503 and r.json()["error"]["kind"] == "not_ready"
        r = _post(srv.url, {"slates": tiny_slates(1, 3)})
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        eng.gate.set()
        wait_ready(srv.url, timeout_s=60)
        assert _post(srv.url, {"slates": tiny_slates(1, 3)}).status_code == 200


def test_metrics_and_openapi(served):
    srv, _ = served
    _post(srv.url, {"slates": tiny_slates(2, 3, seed=50)})
    httpx.post(f"{srv.url}/v1/rank", content="{", headers={"content-type": "application/json"})
    m = httpx.get(f"{srv.url}/metrics")
    assert m.status_code == 200 and m.headers["content-type"].startswith("text/plain")
    text = m.text
    for needle in (
        'hllm_requests_total{code="200",path="/v1/rank"}',
        'hllm_errors_total{kind="bad_json"}',
        'hllm_stage_seconds_bucket{le="0.0005",stage="engine"}',
        'hllm_stage_seconds_count{stage="queue"}',
        'hllm_stage_seconds_count{stage="request"}',
        "hllm_batch_slates_count",
        "hllm_queue_depth 0.0",
        "hllm_ready 1.0",
    ):
        assert needle in text, needle
    api = httpx.get(f"{srv.url}/openapi.json").json()
    post = api["paths"]["/v1/rank"]["post"]
    assert post["requestBody"]["content"]["application/json"]["schema"]["$ref"] == "#/components/schemas/RankRequest"
    schemas = api["components"]["schemas"]
    assert {"RankRequest", "SlateIn", "CandidateIn", "RankResponse", "ErrorResponse"} <= set(schemas)
    assert schemas["RankRequest"]["properties"]["slates"]["items"]["$ref"] == "#/components/schemas/SlateIn"
    assert {"200", "400", "413", "422", "500", "503", "504"} <= set(post["responses"])
    assert {"/healthz", "/readyz", "/metrics"} <= set(api["paths"])


def test_loadtest_compares_both_modes(export_dir):
    from hllm.bench.loadtest import compare_batching

    res = compare_batching(export_dir, tiny_slates(10, (2, K), seed=60), clients=4, requests=16, max_seconds=60, max_wait_ms=30, rounds=2, log=lambda m: None)
    for mode in ("batching_on", "batching_off"):
        m = res[mode]
        assert m["requests"] == 16 and m["ok"] == 16 and m["errors"] == 0
        assert m["latency_ms"]["median"] <= m["latency_ms"]["p99"] <= m["latency_ms"]["max"]
    assert set(res["batching_off"]["batch_slates_seen"]) == {"1"}
    assert res["batching_off"]["engine_batches"] == 16
    assert res["batching_on"]["engine_batches"] < 16  # 4 clients share batches of ≤ 4 slates
    assert res["rankings_identical_across_modes"] == {"compared": 16, "identical": 16}


def test_run_load_against_a_running_server(served, reference):
    from hllm.bench.loadtest import run_load

    srv, _ = served
    ss = tiny_slates(3, (2, K), seed=61)
    res = run_load(srv.url, ss, clients=2, requests=6, max_seconds=60)
    assert (res["requests"], res["ok"], res["errors"]) == (6, 6, 0)
    want = [r.order for r in reference.rank(ss)]
    assert all(res["orders"][i] == want[i % 3] for i in range(6))  # request i carried slate i % 3


def test_loadtest_refuses_non_loopback():
    from hllm.errors import HllmError
    from hllm.bench.loadtest import run_load

    with pytest.raises(HllmError, match="loopback only"):
        run_load("http://10.0.0.1:8000", [{"candidates": [{"title": "a"}]}], 1, 1, 1.0)
    with pytest.raises(HllmError, match="loopback only"):
        BackgroundServer(create_app(object()), host="0.0.0.0")


def _strict_json(text: str):
    """Parse as JSON proper: ``Infinity`` / ``NaN`` literals raise."""
    def refuse(name):
        raise ValueError(f"not JSON: {name}")
    return json.loads(text, parse_constant=refuse)


def test_a_non_finite_score_inside_a_slate_ranked_in_blocks_is_a_decode_error(export_dir):
    """A slate longer than K (13 candidates, K = 8: ranked in blocks) whose block matrix holds a NaN: DecodeError
    naming the slate, and 500 ``decode`` with an id on /v1/rank and /v2/rerank, like a slate within K (the
    blocked path raised NameError: 500 ``internal``, exit 70 in `hllm rank`)."""
    base = Ranker.from_path(export_dir)
    eng = PoisonEngine(base.engine, float("nan"))
    eng.inside = True
    long = tiny_slates(1, 13, seed=22)[0]
    with pytest.raises(DecodeError, match=r"slate tiny-0: .*non-finite"):
        Ranker(eng, base.builder).rank([long])
    eng.inside = False  # a clean warm-up
    srv, _ = _server(Ranker(eng, base.builder), max_batch_slates=1, max_wait_ms=0.0)
    rerank = {"query": "q", "documents": [c["title"] for c in long["candidates"]], "history": long["history"]}
    with srv, httpx.Client(timeout=60) as c:
        wait_ready(srv.url, timeout_s=120)
        eng.inside = True
        answers = [c.post(f"{srv.url}/v1/rank", json={"slates": [long]}), c.post(f"{srv.url}/v2/rerank", json=rerank)]
    for r in answers:
        assert r.status_code == 500 and r.json()["error"]["kind"] == "decode" and r.json()["error"]["id"], r.text
        assert "non-finite" in r.json()["error"]["message"], r.text


@pytest.mark.parametrize("value", [float("inf"), float("nan")])
def test_non_finite_scores_follow_one_rule_on_every_route(export_dir, reference, value):
    """Only a slate's own n×n assignment block matters, on /v1/rank, the rerank routes and KServe: a
    non-finite score past the slate is ignored (and never emitted), one inside it is one enveloped 500."""
    base = Ranker.from_path(export_dir)
    eng = PoisonEngine(base.engine, value)
    srv, _ = _server(Ranker(eng, base.builder), max_batch_slates=1, max_wait_ms=0.0)
    s = tiny_slates(1, 5, seed=21)[0]
    v2 = {"inputs": [{"name": "slates", "datatype": "BYTES", "shape": [1, 1], "data": [json.dumps(s)]}]}
    rerank = {"query": "q", "documents": [c["title"] for c in s["candidates"]], "history": s["history"]}
    with srv, httpx.Client(timeout=60) as c:
        wait_ready(srv.url, timeout_s=120)
        rank = c.post(f"{srv.url}/v1/rank", json={"slates": [s]})
        reranked = [c.post(f"{srv.url}{route}", json=rerank) for route in ("/v1/rerank", "/v2/rerank", "/rerank")]
        infer = c.post(f"{srv.url}/v2/models/hllm_ranker/infer", json=v2)
        eng.inside = True
        bad = [c.post(f"{srv.url}/v1/rank", json={"slates": [s]}), c.post(f"{srv.url}/v1/rerank", json=rerank)]
        bad_v2 = c.post(f"{srv.url}/v2/models/hllm_ranker/infer", json=v2)
    want = reference.rank([s])[0]
    assert rank.status_code == 200 and _strict_json(rank.text)["rankings"][0]["order"] == want.order, rank.text
    for r in reranked:
        assert r.status_code == 200, r.text
        assert [x["index"] for x in _strict_json(r.text)["results"]] == want.order
    assert infer.status_code == 200, infer.text
    outputs = {o["name"]: o for o in _strict_json(infer.text)["outputs"]}
    m = np.array(outputs["scores"]["data"], dtype=np.float32).reshape(1, K, K)[0]
    assert np.isfinite(m).all() and not m[:, 5:].any() and not m[5:].any()
    np.testing.assert_allclose([m[i, p] for p, i in enumerate(want.order)], want.scores, atol=1e-4)
    for r in bad:
        assert r.status_code == 500 and r.json()["error"]["kind"] == "decode" and r.json()["error"]["id"], r.text
        assert "non-finite" in r.json()["error"]["message"]
    assert bad_v2.status_code == 500 and "non-finite" in bad_v2.json()["error"], bad_v2.text


def test_readyz_names_the_model_and_version_only(export_dir, served):
    """/readyz is public: ready or not plus the served model's name and version, never its path or engine."""
    srv, _ = served
    first = httpx.get(f"{srv.url}/readyz").json()
    assert set(first) == {"status", "served_model_names", "model_version"} and first["served_model_names"] == ["hllm_ranker"]
    app = create_app(Ranker.from_path(export_dir), ServeOptions(), info={"model": str(export_dir)})
    with BackgroundServer(app) as bg:
        body = wait_ready(bg.url, timeout_s=120)
    assert body == first
    assert str(export_dir) not in json.dumps(body) and "engine" not in body


def _raw_request(url: str, body: bytes, declared: int | None = None) -> socket.socket:
    """A POST /v1/rank sent on a raw socket; ``declared``: the Content-Length (default: the body's)."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    sock.sendall(b"POST /v1/rank HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: "
                 + str(len(body) if declared is None else declared).encode() + b"\r\n\r\n" + body)
    return sock


def _answer(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes; raises ConnectionResetError on a reset."""
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def test_sigterm_past_the_graceful_timeout_cuts_nothing(export_dir):
    """SIGTERM with requests queued behind a held engine and connections in the listen backlog (made while the
    event loop is busy: uvloop's next iteration runs the shutdown tick before it accepts), graceful timeout 1 s: every accepted request is answered 503 with the envelope (not uvicorn's plain 500), the
    backlog is answered 503 (not reset), and the count is in the state ``hllm serve`` reports."""
    base = Ranker.from_path(export_dir)
    eng = ControlledEngine(base.engine)
    opts = ServeOptions(batch=BatchOptions(max_batch_slates=1, max_wait_ms=0.0, max_queue=100), max_body_bytes=64 * 1024)
    app = create_app(Ranker(eng, base.builder), opts)
    blocking = threading.Event()

    @app.get("/block-the-loop")
    async def block_the_loop():  # a busy event loop: connections made meanwhile wait in the listen backlog
        blocking.set()
        time.sleep(1.0)
        return {}

    srv = BackgroundServer(app, graceful_timeout_s=1.0)
    state = app.state.hllm
    body = json.dumps({"slates": tiny_slates(1, 3, seed=5)}).encode()
    with srv:
        wait_ready(srv.url, timeout_s=120)
        eng.gate.clear()  # the first batch holds the engine past the graceful timeout
        with concurrent.futures.ThreadPoolExecutor(25) as ex:  # 24 requests and the loop blocker
            futs = [ex.submit(_post, srv.url, {"slates": tiny_slates(1, 3, seed=i)}) for i in range(24)]
            deadline = time.monotonic() + 60
            while state.batcher.depth < 23 and time.monotonic() < deadline:  # 1 on the engine, 23 queued
                time.sleep(0.02)
            assert state.batcher.depth == 23
            half = _raw_request(srv.url, body, declared=len(body) + 100)  # the app waits for the rest of its body
            blocker = ex.submit(httpx.get, f"{srv.url}/block-the-loop", timeout=60)
            assert blocking.wait(timeout=30)
            backlog = [_raw_request(srv.url, body) for _ in range(5)]
            srv.server.handle_exit(signal.SIGTERM, None)  # seen by the server's next tick, before its next accept
            assert blocker.result(timeout=60).status_code == 200
            try:
                answers = [f.result(timeout=60) for f in futs]
                raw = [_answer(sock) for sock in backlog]
                cut = _answer(half)
            finally:
                eng.gate.set()
    for sock in [*backlog, half]:
        sock.close()
    for r in answers:
        assert r.status_code == 503 and r.headers["retry-after"] == "1", r.text
        assert r.json()["error"]["kind"] == "not_ready" and "graceful timeout of 1 s" in r.json()["error"]["message"]
    assert state.shed == 25
    head, _, payload = cut.partition(b"\r\n\r\n")  # cancelled by uvicorn while its body came: 503, not a plain 500
    assert head.startswith(b"HTTP/1.1 503") and b"retry-after: 1" in head.lower(), cut[:300]
    assert json.loads(payload)["error"]["kind"] == "not_ready" and b"graceful timeout expired" in payload
    for a in raw:
        head, _, payload = a.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503"), a[:200]
        assert json.loads(payload)["error"] == {"kind": "not_ready", "message": "server is shutting down", "id": None}


class _HoldClose:
    """A listening server whose ``close()`` first waits (the event loop blocked) until ``go`` is set, so the
    connections made meanwhile are still in the kernel's listen backlog when the listening socket closes."""

    def __init__(self, inner):
        self.inner, self.closing, self.go = inner, threading.Event(), threading.Event()

    def close(self):
        self.closing.set()
        assert self.go.wait(timeout=30)
        self.inner.close()

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_sigterm_resets_no_connection_left_in_the_backlog_at_the_close(export_dir):
    """Connections that reach the listen backlog while the event loop is busy, just before the listening socket
    closes (uvicorn's shutdown), are taken and answered 503 with the envelope, not reset by the close."""
    app = create_app(Ranker.from_path(export_dir), ServeOptions())
    srv = BackgroundServer(app, graceful_timeout_s=10.0)
    body = json.dumps({"slates": tiny_slates(1, 3, seed=5)}).encode()
    with srv:
        wait_ready(srv.url, timeout_s=120)
        held = srv.server.servers[0] = _HoldClose(srv.server.servers[0])
        srv.server.should_exit = True
        assert held.closing.wait(timeout=30)  # the event loop now waits in close(): nothing is accepted
        try:
            backlog = [_raw_request(srv.url, body) for _ in range(4)]
        finally:
            held.go.set()
        raw = [_answer(sock) for sock in backlog]
    for sock in backlog:
        sock.close()
    for a in raw:
        head, _, payload = a.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503") and b"connection: close" in head.lower(), a[:200]
        assert json.loads(payload)["error"] == {"kind": "not_ready", "message": "server is shutting down", "id": None}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve_sigterm_while_queued(export_dir, tmp_path, *args, signals=(signal.SIGTERM,),
                                wait_ms: str = "1500") -> tuple[int, httpx.Response, str]:
    """`hllm serve ARGS` in a subprocess: one request waiting in a ``wait_ms`` batch window, then SIGTERM (or
    ``signals``, 0.5 s apart) → (exit code, the request's response, the server's output)."""
    port = _free_port()
    log = open(tmp_path / "serve.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "hllm", "serve", str(export_dir), "--port", str(port), "--max-wait-ms", wait_ms,
         "--log-level", "warning", *args],
        stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        assert str(export_dir) not in json.dumps(wait_ready(url, timeout_s=120))
        with concurrent.futures.ThreadPoolExecutor(1) as ex:
            fut = ex.submit(_post, url, {"slates": tiny_slates(1, 5, seed=70)})
            # SIGTERM only once the request is queued (waiting for its batch window): on a loaded
            # machine a fixed sleep can fire before the request even reaches the server.
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                m = httpx.get(f"{url}/metrics", timeout=5).text
                if any(line.startswith("hllm_queue_depth ") and float(line.split()[1]) >= 1 for line in m.splitlines()):
                    break
                time.sleep(0.05)
            for i, sig in enumerate(signals):
                if i:
                    time.sleep(0.5)  # the next signal is a separate one (two pending at once are handled by number)
                proc.send_signal(sig)
            r = fut.result(timeout=60)
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{url}/healthz", timeout=2)
    return rc, r, (tmp_path / "serve.log").read_text()


def test_cli_serve_sigterm_answers_idle_connections_instead_of_closing_them(export_dir, tmp_path):
    """`hllm serve`, SIGTERM: a keep-alive connection that got its answer before, and a connection accepted before
    that had not sent its request yet, both send a request after the listening socket closed (new connects are
    refused): each is answered 503 with the envelope, Retry-After and ``Connection: close`` — uvicorn closed
    them at once, and their clients saw a reset or an empty answer. Then the server stops cleanly."""
    port = _free_port()
    log = open(tmp_path / "serve.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "hllm", "serve", str(export_dir), "--port", str(port), "--log-level", "warning",
         "--graceful-timeout", "30"], stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    body, headers = json.dumps({"slates": tiny_slates(1, 3, seed=71)}), {"content-type": "application/json"}
    try:
        wait_ready(f"http://127.0.0.1:{port}", timeout_s=120)
        kept = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        kept.request("POST", "/v1/rank", body, headers)
        first = kept.getresponse()
        assert first.status == 200 and first.getheader("connection") != "close", first.read()[:300]
        first.read()
        fresh = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        fresh.connect()
        proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # until the listening socket is closed
            try:
                socket.create_connection(("127.0.0.1", port), timeout=5).close()
            except ConnectionRefusedError:
                break
            time.sleep(0.05)
        else:
            pytest.fail("the listening socket stayed open 30 s after SIGTERM")
        answers = []
        for conn in (kept, fresh):
            conn.request("POST", "/v1/rank", body, headers)
            r = conn.getresponse()
            answers.append((r.status, r.getheader("retry-after"), r.getheader("connection"), json.loads(r.read())))
            conn.close()
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    for status, retry_after, connection, payload in answers:
        assert (status, retry_after, connection) == (503, "1", "close"), (status, retry_after, connection, payload)
        assert payload["error"] == {"kind": "not_ready", "message": "server is shutting down", "id": None}
    text = (tmp_path / "serve.log").read_text()
    assert rc == 0 and "stopped (SIGTERM): in-flight requests were drained" in text, (rc, text[-2000:])


def test_cli_serve_binds_loopback_and_drains_on_sigterm(export_dir, tmp_path):
    """`hllm serve` in a subprocess: a request waiting in a 1.5 s batch window still completes after SIGTERM."""
    rc, r, log = _serve_sigterm_while_queued(export_dir, tmp_path)
    assert r.status_code == 200, r.text
    assert len(r.json()["rankings"][0]["order"]) == 5
    # a drained stop is a clean one: exit 0 and the line that says so (docs/serving.md, README exit codes)
    assert rc == 0, (rc, log[-2000:])
    assert "stopped (SIGTERM): in-flight requests were drained" in log


def test_cli_serve_past_its_graceful_timeout_answers_503_and_says_so(export_dir, tmp_path):
    """`--graceful-timeout 0`: the queued request is answered 503 with the envelope (was uvicorn's plain-text
    500 and tracebacks), and the exit code (143) and last line say how many were not ranked."""
    rc, r, log = _serve_sigterm_while_queued(export_dir, tmp_path, "--graceful-timeout", "0")
    assert r.status_code == 503 and r.headers["retry-after"] == "1", r.text
    assert r.json()["error"]["kind"] == "not_ready", r.text
    assert rc == 143, (rc, log[-2000:])
    assert "the graceful timeout of 0 s expired; 1 in-flight requests were answered 503" in log
    assert "Traceback" not in log and "in-flight requests were drained" not in log, log[-3000:]



@pytest.mark.parametrize("first", [signal.SIGTERM, signal.SIGINT])
def test_cli_serve_a_second_sigint_while_draining_answers_503_and_says_so(export_dir, tmp_path, first):
    """SIGTERM (or SIGINT), then SIGINT while a request waits in a 30 s batch window (graceful timeout 60 s):
    uvicorn's force quit. The request is answered 503 with the envelope, the log holds no traceback (the app's
    lifespan was cancelled mid-drain), and exit 130 with one line saying the drain was cut short (was 143 /
    "the graceful timeout of 60 s expired", or a generic interrupt line)."""
    rc, r, log = _serve_sigterm_while_queued(export_dir, tmp_path, "--graceful-timeout", "60",
                                             signals=(first, signal.SIGINT), wait_ms="30000")
    assert r.status_code == 503 and r.headers["retry-after"] == "1", r.text
    assert r.json()["error"]["kind"] == "not_ready" and "second SIGINT" in r.json()["error"]["message"], r.text
    assert rc == 130, (rc, log[-2000:])
    assert "Traceback" not in log and "ERROR" not in log, log[-3000:]
    lines = [x for x in log.splitlines() if x.startswith("error: ")]
    assert lines == [f"error: interrupted (SIGINT) again while draining after {first.name}: the graceful shutdown "
                     "was cut short; 1 in-flight requests were answered 503 (Retry-After) instead of their rankings"], log


def test_cli_serve_sigint_says_what_happened_to_the_requests(export_dir, tmp_path):
    """SIGINT alone past `--graceful-timeout 0`: exit 130 with one line saying how many were answered 503 (was
    the generic "interrupted (SIGINT); nothing partial was left in place of an output")."""
    rc, r, log = _serve_sigterm_while_queued(export_dir, tmp_path, "--graceful-timeout", "0", signals=(signal.SIGINT,))
    assert r.status_code == 503 and r.headers["retry-after"] == "1", r.text
    assert rc == 130, (rc, log[-2000:])
    assert [x for x in log.splitlines() if x.startswith("error: ")] == [
        "error: interrupted (SIGINT): the graceful timeout of 0 s expired; 1 in-flight requests were answered 503 "
        "(Retry-After) instead of their rankings"], log
    assert "Traceback" not in log

def test_batcher_counts_a_blocked_slate_as_b_plus_1():
    """A slate ranked in 2 blocks (work 3) queued with three one-slate requests, max_batch_slates = 4: the first
    engine batch is the long slate + ONE short request (3 + 1 rows), the other two ride the next batch."""
    import asyncio
    import types

    from hllm.runtime.ranker import RankResult, StageTimes
    from hllm.serve.batching import MicroBatcher

    calls = []

    class Recorder:
        def rank(self, slates, encoded=None, batch_size=None):
            calls.append([s["slate_id"] for s in slates])
            return RankResult(rankings=[None] * len(slates), scores=[None] * len(slates), times=StageTimes())

    async def main():
        b = MicroBatcher(Recorder(), BatchOptions(max_batch_slates=4, max_wait_ms=500.0))
        await b.start()
        long_row, short_row = types.SimpleNamespace(work=3), types.SimpleNamespace()
        jobs = [b.submit([{"slate_id": "long"}], encoded=[long_row])]
        jobs += [b.submit([{"slate_id": f"s{i}"}], encoded=[short_row]) for i in range(3)]
        await asyncio.gather(*jobs)
        await b.close()

    asyncio.run(main())
    assert calls == [["long", "s0"], ["s1", "s2"]]
