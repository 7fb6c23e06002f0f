"""The Cohere / Jina rerank API of `hllm serve` (/v1/rerank, /v2/rerank): the real client libraries rank the
packaged 100-slate sample through a uvicorn server on 127.0.0.1 in the order of `hllm rank`; the request
mapping (top_n, return_documents, max_tokens_per_doc, history, model), usage, relevance scores, and every
bad input answered 4xx with the error envelope."""

from __future__ import annotations

import json

import numpy as np
import pytest

for _mod in ("fastapi", "uvicorn", "httpx"):
    pytest.importorskip(_mod, reason="the serve extra is not installed (pip install -e .[serve])")

import httpx  # noqa: E402

from hllm.runtime import Ranker  # noqa: E402
from hllm.runtime.slates import read_slates, write_jsonl  # noqa: E402
from hllm.serve.app import ServeOptions, create_app  # noqa: E402
from hllm.serve.batching import BatchOptions  # noqa: E402
from hllm.serve.rerank import SERVED_MODEL, relevance_scores  # noqa: E402
from hllm.serve.server import BackgroundServer, wait_ready  # noqa: E402
from tests.conftest import SAMPLE_SLATES  # noqa: E402
from tests.serve.rerank_clients import CLIENT_MODULES, query_of, query_slates, rank_all  # noqa: E402

K = 50


@pytest.fixture(scope="module")
def sample():
    return read_slates(SAMPLE_SLATES)


@pytest.fixture(scope="module")
def ranker(export_k50):
    with Ranker.from_path(export_k50) as r:
        yield r


@pytest.fixture(scope="module")
def server(export_k50):
    """One batching server over the K=50 tiny export for the whole module."""
    app = create_app(Ranker.from_path(export_k50), ServeOptions(batch=BatchOptions(max_batch_slates=4, max_wait_ms=2.0),
                                                                 max_body_bytes=256 * 1024))
    with BackgroundServer(app) as srv:
        wait_ready(srv.url, timeout_s=120)
        yield srv.url


@pytest.fixture(scope="module")
def hllm_rank_orders(export_k50, sample, tmp_path_factory):
    """`hllm rank` on the sample's slates as the rerank mapping turns them into prompts (history = [query])."""
    from hllm.cli import main

    d = tmp_path_factory.mktemp("rerank")
    write_jsonl(d / "q.jsonl", query_slates(sample))
    with pytest.raises(SystemExit) as e:
        main(["rank", str(export_k50), "--slates", str(d / "q.jsonl"), "--out", str(d / "ranked.jsonl")])
    assert e.value.code == 0
    return [json.loads(line)["order"] for line in (d / "ranked.jsonl").read_text().splitlines()]


def _post(url, body, route="/v1/rerank", **kw):
    headers = {"content-type": "application/json", **kw.pop("headers", {})}
    return httpx.post(f"{url}{route}", content=json.dumps(body), headers=headers, timeout=60, **kw)  # ASCII: "\ud800" escaped


def _envelope(r, status: int, kind: str, *words: str) -> None:
    assert r.status_code == status, (r.status_code, r.text)
    err = r.json()["error"]
    assert set(err) == {"kind", "message", "id"} and err["kind"] == kind and err["id"] is None, err
    for w in words:
        assert w in err["message"], (w, err["message"])


def test_real_clients_rank_the_sample_in_the_order_of_hllm_rank(server, sample, hllm_rank_orders):
    """cohere ClientV2 (v2/rerank), cohere Client (v1/rerank), LangChain's CohereRerank and LlamaIndex's CohereRerank,
    each on all 100 slates (50 documents each): the order of `hllm rank`, scores in [0, 1], non-increasing."""
    for mod in CLIENT_MODULES:
        pytest.importorskip(mod, reason="the rerank-clients extra is not installed (pip install -e .[rerank-clients])")
    got = rank_all(server, sample)
    assert len(hllm_rank_orders) == 100 and {len(o) for o in hllm_rank_orders} == {K}
    for name, results in got.items():
        orders = [order for order, _ in results]
        same = sum(o == w for o, w in zip(orders, hllm_rank_orders))
        assert same == 100, f"{name}: {same}/100 slates in the order of hllm rank"
        for _, scores in results:
            s = np.asarray(scores)
            assert s.min() >= 0 and s.max() <= 1 and np.all(np.diff(s) <= 0), (name, scores)
            assert abs(s.mean() - 0.5) < 1e-5  # soft rank: the slate's mean is the middle, 0.5
    assert got["cohere.ClientV2"] == got["cohere.Client (v1)"]


def test_cohere_client_errors_and_history_extension(server, sample, ranker):
    """The SDK raises its own errors on the 400 / 404; the `history` extension ranks as /v1/rank does."""
    cohere = pytest.importorskip("cohere", reason="the rerank-clients extra is not installed")
    client = cohere.ClientV2(api_key="unused", base_url=server, timeout=60)
    with pytest.raises(cohere.errors.BadRequestError) as e:
        client.rerank(model=SERVED_MODEL, query="q", documents=[f"d{i}" for i in range(1001)])
    assert "over the limit of 1000 documents" in e.value.body["error"]["message"]
    with pytest.raises(cohere.errors.NotFoundError):
        client.rerank(model="rerank-v3.5", query="q", documents=["a"])
    s = sample[3]
    res = client.rerank(model=SERVED_MODEL, query="not used", documents=[c["title"] for c in s["candidates"]],
                        request_options={"additional_body_parameters": {"history": s["history"]}})
    assert [r.index for r in res.results] == ranker.rank([s])[0].order


@pytest.mark.parametrize("n", [100, 500])
def test_cohere_client_v2_ranks_a_list_longer_than_k_in_blocks(server, sample, ranker, n):
    """cohere ClientV2.rerank with 100 and 500 documents (K = 50): every document once, relevance in [0, 1] and
    non-increasing, ⌈N/100⌉ search units, a warning naming the blocks, the order of Ranker.rank on the slate."""
    cohere = pytest.importorskip("cohere", reason="the rerank-clients extra is not installed")
    docs = [c["title"] for s in sample for c in s["candidates"]][:n]
    client = cohere.ClientV2(api_key="unused", base_url=server, timeout=120)
    res = client.rerank(model=SERVED_MODEL, query=query_of(sample[0]), documents=docs)
    order = [r.index for r in res.results]
    assert sorted(order) == list(range(n))
    s = np.array([r.relevance_score for r in res.results])
    assert s.min() >= 0 and s.max() <= 1 and np.all(np.diff(s) <= 0) and s[0] > s[-1]
    assert res.meta.billed_units.search_units == -(-n // 100)
    b = -(-(n - 5) // (K - 5))  # 5 anchors + ≤ 45 candidates per block
    assert any(f"ranked in {b} blocks" in w for w in res.meta.warnings), res.meta.warnings
    slate = {"slate_id": "0", "history": [query_of(sample[0])], "candidates": [{"title": t} for t in docs]}
    assert order == ranker.rank([slate])[0].order


def test_mapping_top_n_documents_usage_and_budget(server, sample, ranker):
    s = query_slates(sample[:1])[0]
    docs = [c["title"] for c in s["candidates"]][:12]
    slate = dict(s, candidates=s["candidates"][:12])
    full = ranker.rank([slate])[0].order
    v1 = _post(server, {"model": SERVED_MODEL, "query": query_of(sample[0]), "documents": docs, "top_n": 3},
               headers={"X-Request-ID": "rr-1"})
    assert v1.status_code == 200, v1.text
    b = v1.json()
    assert b["id"] == "rr-1" and b["model"] == SERVED_MODEL
    assert [r["index"] for r in b["results"]] == full[:3]  # top_n after the full permutation
    assert [r["document"]["text"] for r in b["results"]] == [docs[i] for i in full[:3]]  # v1 (Jina): documents by default
    enc = ranker.builder.encode_one(slate)
    n_tokens = len(enc.ids)
    assert b["usage"] == {"prompt_tokens": n_tokens, "total_tokens": n_tokens}
    assert b["meta"]["tokens"]["input_tokens"] == n_tokens
    assert b["meta"]["warnings"] == [f"documents {enc.truncated} were cut to 32 tokens"] and enc.truncated  # tiny tokenizer

    v2 = _post(server, {"query": query_of(sample[0]), "documents": [{"text": t} for t in docs], "top_n": 100}, "/v2/rerank")
    assert v2.status_code == 200 and [r["index"] for r in v2.json()["results"]] == full  # top_n over n: all
    assert all("document" not in r for r in v2.json()["results"])  # v2 (Cohere): no documents by default
    with_docs = _post(server, {"query": query_of(sample[0]), "documents": docs, "return_documents": True}, "/v2/rerank")
    assert [r["document"]["text"] for r in with_docs.json()["results"]] == [docs[i] for i in full]
    bare = _post(server, {"query": query_of(sample[0]), "documents": docs, "return_documents": False}, "/rerank")
    assert [r["index"] for r in bare.json()["results"]] == full and "document" not in bare.json()["results"][0]

    # max_tokens_per_doc: the candidate budget min(it, the artefact's); over the artefact's it changes nothing
    import dataclasses

    from hllm.runtime.prompt import PromptBuilder

    spec = ranker.builder.spec
    small = PromptBuilder(ranker.builder.tokenizer, dataclasses.replace(spec, candidate_token_budget=6), max_items=K)
    row = small.encode_one(slate)
    cut = _post(server, {"query": query_of(sample[0]), "documents": docs, "max_tokens_per_doc": 6}).json()
    assert cut["usage"]["prompt_tokens"] == len(row.ids) < n_tokens
    assert [r["index"] for r in cut["results"]] == Ranker(ranker.engine, small).rank([slate])[0].order
    assert f"documents {row.truncated} were cut to 6 tokens" in cut["meta"]["warnings"]
    big = _post(server, {"query": query_of(sample[0]), "documents": docs, "max_tokens_per_doc": 10_000}).json()
    assert big["usage"]["prompt_tokens"] == n_tokens and [r["index"] for r in big["results"]] == full


@pytest.mark.parametrize("body, status, kind, words", [
    ({"query": "q", "documents": [f"d{i}" for i in range(1001)]}, 400, "too_many_documents",
     ("1001 documents", "limit of 1000", "max_documents")),
    ({"query": "q", "documents": []}, 400, "bad_request", ("'documents' is empty",)),
    ({"query": "q"}, 400, "bad_request", ("'documents' must be a list",)),
    ({"query": "q", "documents": ["a", 7]}, 400, "bad_request", ("documents[1] must be a string, got int",)),
    ({"query": "q", "documents": ["a", None]}, 400, "bad_request", ("documents[1] must be a string, got null",)),
    ({"query": "q", "documents": [{"title": "a"}]}, 400, "bad_request", ("documents[0] is an object without 'text'",)),
    ({"query": "q", "documents": [{"text": 3}]}, 400, "bad_request", ("documents[0].text must be a string",)),
    ({"query": "q", "documents": ["a"], "top_n": 0}, 400, "bad_request", ("'top_n' must be ≥ 1, got 0",)),
    ({"query": "q", "documents": ["a"], "top_n": -2}, 400, "bad_request", ("'top_n' must be ≥ 1, got -2",)),
    ({"query": "q", "documents": ["a"], "top_n": 1.5}, 400, "bad_request", ("'top_n' must be an integer",)),
    ({"query": "q", "documents": ["a"], "top_n": True}, 400, "bad_request", ("'top_n' must be an integer",)),
    ({"query": "q", "documents": ["a"], "max_tokens_per_doc": 0}, 400, "bad_request", ("'max_tokens_per_doc' must be ≥ 1",)),
    ({"query": "q", "documents": ["argan oil hair serum"], "max_tokens_per_doc": 1}, 400, "bad_request",
     ("budget of 1 keeps no token of candidate 0's text",)),
    ({"query": "x" * 20_000, "documents": ["a"]}, 400, "bad_request", ("'query' is 20000 characters, over the limit of 10240",)),
    ({"query": "word " * 1500, "documents": ["a"]}, 400, "bad_request", ("does not fit the model's user-context budget of 320",)),
    ({"query": 5, "documents": ["a"]}, 400, "bad_request", ("'query' must be a string, got int",)),
    ({"documents": ["a"]}, 400, "bad_request", ("'query' is required",)),
    ({"query": "\ud800", "documents": ["a"]}, 400, "bad_request", ("lone surrogate",)),
    ({"query": "q", "documents": ["a"], "return_documents": "yes"}, 400, "bad_request", ("'return_documents' must be true or false",)),
    ({"query": "q", "documents": ["a"], "history": "h"}, 400, "bad_request", ("'history' must be a list of strings",)),
    ({"query": "q", "documents": ["a"], "deadline_ms": -1}, 400, "bad_request", ("'deadline_ms'",)),
    ({"query": "q", "documents": ["a"], "deadline_ms": 10**400}, 400, "bad_request", ("'deadline_ms' must be a number in (0, 86400000]",)),
    ({"query": "q", "documents": ["a"], "rank_fields": ["title"]}, 400, "bad_request", ("'rank_fields'",)),
    ({"query": "q", "documents": ["a"], "temperature": 1}, 400, "bad_request", ("unknown fields ['temperature']",)),
    ({"model": "rerank-v3.5", "query": "q", "documents": ["a"]}, 404, "not_found", ("'rerank-v3.5' is not served", SERVED_MODEL)),
    ({"model": 5, "query": "q", "documents": ["a"]}, 400, "bad_request", ("'model' must be a string, got int",)),
    (["q", "a"], 400, "bad_request", ("must be a JSON object",)),
])
def test_bad_requests_get_the_error_envelope(server, body, status, kind, words):
    for route in ("/v1/rerank", "/v2/rerank"):
        _envelope(_post(server, body, route), status, kind, *words)


def test_bad_bytes_and_content_type(server):
    url = f"{server}/v1/rerank"
    _envelope(httpx.post(url, content=b'{"query": "\xff", "documents": ["a"]}', headers={"content-type": "application/json"}),
              400, "bad_json", "not UTF-8")
    _envelope(httpx.post(url, content=b'{"query": "q", "documents": [NaN]}', headers={"content-type": "application/json"}),
              400, "bad_json", "NaN")
    _envelope(httpx.post(url, content=b'{"query": "q", "documents"', headers={"content-type": "application/json"}),
              400, "bad_json", "malformed JSON")
    _envelope(httpx.post(url, content=b"query=q", headers={"content-type": "application/x-www-form-urlencoded"}),
              415, "unsupported_media_type")
    _envelope(httpx.post(url, content=b"[" * 100_000, headers={"content-type": "application/json"}), 400, "bad_json")
    _envelope(httpx.post(url, content=b"x" * 300_000, headers={"content-type": "application/json"}), 413, "too_large")
    _envelope(httpx.get(url), 405, "method_not_allowed")


def test_no_input_returns_500(server):
    """Shapes of junk a client might send: every one is a 4xx with the envelope, never a 500."""
    junk = [None, 1, "s", {}, {"query": None, "documents": None}, {"query": "q", "documents": {"text": "a"}},
            {"query": "q", "documents": [[]]}, {"query": "q", "documents": [{}]}, {"query": "q", "documents": ["a"], "top_n": "2"},
            {"query": "q", "documents": ["a"], "top_n": 10**400}, {"query": "q", "documents": ["a"], "history": [1]},
            {"query": "q", "documents": ["a"], "model": None, "top_n": None, "max_tokens_per_doc": None}, {"query": "", "documents": [""]}]
    for body in junk:
        r = httpx.post(f"{server}/v2/rerank", content=json.dumps(body), headers={"content-type": "application/json"})
        assert r.status_code < 500, (body, r.text)
        if r.status_code != 200:
            assert set(r.json()["error"]) == {"kind", "message", "id"}, (body, r.text)


def test_metrics_openapi_and_routes(server):
    metrics = httpx.get(f"{server}/metrics").text
    assert 'hllm_requests_total{code="200",path="/v1/rerank"}' in metrics
    assert 'hllm_requests_total{code="200",path="/v2/rerank"}' in metrics
    assert 'hllm_request_duration_seconds_count{path="/v2/rerank"}' in metrics
    paths = httpx.get(f"{server}/openapi.json").json()["paths"]
    assert {"/v1/rerank", "/v2/rerank", "/rerank"} <= set(paths)
    assert "documents" in paths["/v2/rerank"]["post"]["requestBody"]["content"]["application/json"]["schema"]["properties"]


def test_relevance_scores_by_construction():
    rng = np.random.default_rng(0)
    from hllm.runtime.decode import decode

    for n, k in ((1, 4), (2, 2), (7, 8), (50, 50)):
        for scale in (0.01, 1.0, 30.0):
            m = (rng.normal(size=(n, k)) * scale).astype(np.float32)
            order = decode(m)
            s = relevance_scores(m, order)
            assert s.shape == (n,) and s.min() >= 0 and s.max() <= 1 and np.all(np.diff(s) <= 0)
            assert abs(s.mean() - (1.0 if n == 1 else 0.5)) < 1e-9
    # a clear score matrix (item i belongs at position i, big margin): the soft rank is the linear 1 … 0
    m = np.eye(5) * 40.0
    np.testing.assert_allclose(relevance_scores(m, np.arange(5)), [1, 0.75, 0.5, 0.25, 0], atol=1e-6)
    # no information (a constant matrix): every item has score 0.5
    np.testing.assert_allclose(relevance_scores(np.zeros((4, 6)), [2, 0, 3, 1]), 0.5)
    # pooling: where the order disagrees with the soft rank (item 2 before item 1), the two share their mean
    np.testing.assert_allclose(relevance_scores(np.eye(3) * 40.0, [0, 2, 1]), [1, 0.25, 0.25], atol=1e-6)
    with pytest.raises(ValueError, match="permutation"):
        relevance_scores(np.zeros((3, 3)), [0, 0, 1])
    with pytest.raises(ValueError, match="finite"):
        relevance_scores(np.full((2, 2), np.nan), [0, 1])


def test_loadtest_drives_rank_and_rerank_in_one_run(export_dir, tmp_path):
    """`hllm loadtest --route both`: /v1/rank and /v1/rerank on the same slates and batching; the same rankings."""
    from hllm.cli import main
    from hllm.testing import tiny_slates

    write_jsonl(tmp_path / "s.jsonl", tiny_slates(6, (2, 8), seed=62))
    with pytest.raises(SystemExit) as e:
        main(["loadtest", str(export_dir), "--slates", str(tmp_path / "s.jsonl"), "--route", "both", "--clients", "2",
              "--requests", "4", "--rounds", "2", "--out", str(tmp_path / "lt.json")])
    assert e.value.code == 0
    rep = json.loads((tmp_path / "lt.json").read_text())
    modes = rep["modes"]
    assert {"batching_on", "batching_off", "rerank_batching_on", "rerank_batching_off"} <= set(modes)
    for name in ("batching_on", "batching_off", "rerank_batching_on", "rerank_batching_off"):
        m = modes[name]
        assert (m["requests"], m["ok"], m["errors"]) == (4, 4, 0), (name, m)
        assert m["route"] == ("/v1/rerank" if name.startswith("rerank") else "/v1/rank")
    assert modes["rerank_batching_off"]["engine_batches"] == 4 and set(modes["rerank_batching_off"]["batch_slates_seen"]) == {"1"}
    assert modes["rankings_identical_across_modes"] == {"compared": 12, "identical": 12}
    assert rep["environment"]["cpu"] and isinstance(rep["environment"]["cpu_flags"], list)


def test_rerank_module_imports_no_torch():
    import subprocess
    import sys

    code = ("import sys, hllm.serve.rerank, hllm.bench.loadtest; "
            "bad = [m for m in ('torch', 'transformers', 'cohere', 'langchain_core', 'llama_index') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
