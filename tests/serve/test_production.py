"""`hllm serve` exposed to a team: API keys (the real cohere SDK with its key; 401 on every route without one),
TLS with a throw-away CA (trustme) verified by httpx and the cohere SDK, served names and the model version,
OpenTelemetry spans (the SDK's InMemorySpanExporter) and JSON access logs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

for _mod in ("fastapi", "uvicorn", "httpx"):
    pytest.importorskip(_mod, reason="the serve extra is not installed (pip install -e .[serve])")

import httpx  # noqa: E402

from hllm.errors import HllmError  # noqa: E402
from hllm.runtime import Ranker  # noqa: E402
from hllm.runtime.artefact import resolve  # noqa: E402
from hllm.serve.app import create_app  # noqa: E402
from hllm.serve.auth import ENV_VAR, AuthOptions, load_api_keys  # noqa: E402
from hllm.serve.models import ServedModel, model_version  # noqa: E402
from hllm.serve.server import BackgroundServer, wait_ready  # noqa: E402
from hllm.serve.tls import tls_options  # noqa: E402
from hllm.testing import tiny_slates  # noqa: E402

KEY = "hk-test-0123456789abcdef"
OTHER_KEY = "hk-other-0123456789abcdef"
NAMES = ("team-ranker", "hllm_ranker")

#: Every route that needs a key, with a body that would otherwise be served (GET when the body is None).
PROTECTED = [
    ("/v1/rank", {"slates": tiny_slates(1, 3, seed=1)}),
    ("/v1/rerank", {"query": "q", "documents": ["a", "b"]}),
    ("/v2/rerank", {"query": "q", "documents": ["a", "b"]}),
    ("/rerank", {"query": "q", "documents": ["a", "b"]}),
    ("/v2/models/team-ranker/infer", {"inputs": []}),
    ("/v2/models/team-ranker", None),
    ("/v2/models/team-ranker/ready", None),
    ("/v2", None),
    ("/v1/models", None),
    ("/metrics", None),
    ("/docs", None),
    ("/openapi.json", None),
    ("/no/such/route", None),
]


@pytest.fixture(scope="module")
def spans():
    """An OpenTelemetry tracer whose finished spans are kept in memory."""
    sdk = pytest.importorskip("opentelemetry.sdk.trace", reason="the otel extra is not installed")
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = sdk.TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider.get_tracer("test"), exporter


@pytest.fixture(scope="module")
def served(export_dir, spans):
    """Keys on, two served names, the export's version, traced."""
    model = ServedModel(NAMES, model_version(resolve(export_dir).meta))
    app = create_app(Ranker.from_path(export_dir), auth=AuthOptions((KEY.encode(), OTHER_KEY.encode())), model=model,
                     tracer=spans[0])
    with BackgroundServer(app) as srv:
        wait_ready(srv.url, timeout_s=120)
        yield srv.url, model


def _auth(key=KEY) -> dict:
    return {"Authorization": f"Bearer {key}"}


def test_cohere_sdk_reranks_with_the_key_and_a_wrong_key_is_unauthorized(served, export_dir):
    cohere = pytest.importorskip("cohere", reason="the rerank-clients extra is not installed")
    url, model = served
    docs = ["red lipstick", "blue nail polish", "green face mask", "shampoo"]
    client = cohere.ClientV2(api_key=KEY, base_url=url, timeout=60)
    res = client.rerank(model="team-ranker", query="lipstick", documents=docs)
    slate = {"slate_id": "0", "history": ["lipstick"], "candidates": [{"title": d} for d in docs]}
    with Ranker.from_path(export_dir) as r:
        assert [x.index for x in res.results] == r.rank([slate])[0].order
    assert cohere.ClientV2(api_key=OTHER_KEY, base_url=url).rerank(model="hllm_ranker", query="q", documents=docs).results
    with pytest.raises(cohere.errors.UnauthorizedError) as e:
        cohere.ClientV2(api_key="hk-wrong-0123456789abcdef", base_url=url, timeout=60).rerank(
            model="team-ranker", query="lipstick", documents=docs)
    assert e.value.body["error"]["kind"] == "unauthorized"


@pytest.mark.parametrize("route,body", PROTECTED, ids=[p for p, _ in PROTECTED])
def test_every_route_but_health_needs_the_key(served, route, body):
    url, _ = served
    for headers in ({}, _auth("hk-wrong-0123456789abcdef"), {"Authorization": f"Basic {KEY}"}, {"Authorization": KEY}):
        r = httpx.request("GET" if body is None else "POST", f"{url}{route}", json=body, headers=headers, timeout=30)
        assert r.status_code == 401, (route, headers, r.status_code, r.text)
        assert r.headers["www-authenticate"].startswith('Bearer realm="hllm"')
        assert KEY not in r.text and "hk-wrong" not in r.text
        err = r.json()["error"]
        if route.startswith(("/v2/models", "/v2")) and route != "/v2/rerank":  # the Open Inference Protocol's error body
            assert isinstance(err, str) and "API key" in err
        else:
            assert err["kind"] == "unauthorized" and err["id"] is None and "API key" in err["message"]
    r = httpx.request("GET" if body is None else "POST", f"{url}{route}", json=body, headers=_auth(), timeout=30)
    assert r.status_code != 401, (route, r.text)


def test_health_is_open_and_rejections_are_counted(served):
    url, model = served
    for path in ("/healthz", "/readyz", "/v2/health/live", "/v2/health/ready"):
        assert httpx.get(f"{url}{path}", timeout=30).status_code == 200, path
    ready = httpx.get(f"{url}/readyz", timeout=30).json()
    assert ready["model_version"] == model.version and ready["served_model_names"] == list(NAMES)
    httpx.get(f"{url}/v1/models", timeout=30)
    metrics = httpx.get(f"{url}/metrics", headers=_auth(), timeout=30).text
    line = next(ln for ln in metrics.splitlines() if ln.startswith('hllm_errors_total{kind="unauthorized"}'))
    assert float(line.split()[1]) >= 1


def test_public_metrics_and_docs_open_only_what_they_name(export_dir):
    app = create_app(Ranker.from_path(export_dir), auth=AuthOptions((KEY.encode(),), public_metrics=True))
    with BackgroundServer(app) as srv:
        wait_ready(srv.url, timeout_s=120)
        assert httpx.get(f"{srv.url}/metrics", timeout=30).status_code == 200
        assert httpx.get(f"{srv.url}/docs", timeout=30).status_code == 401
        assert httpx.get(f"{srv.url}/openapi.json", timeout=30).status_code == 401
        assert httpx.post(f"{srv.url}/v1/rank", json={"slates": tiny_slates(1, 3)}, timeout=30).status_code == 401
    assert AuthOptions((KEY.encode(),), public_docs=True).is_open("/openapi.json")
    assert not AuthOptions((KEY.encode(),), public_docs=True).is_open("/metrics")


def test_keys_from_flags_file_and_environment(tmp_path, monkeypatch):
    f = tmp_path / "keys"
    f.write_text(f"# team keys\n\n{KEY}\n  {OTHER_KEY}  \n")
    keys = load_api_keys(["hk-flag-0123456789abcdef"], f, {ENV_VAR: f" hk-env-0123456789abcdef ,{KEY}"})
    assert keys == (b"hk-flag-0123456789abcdef", KEY.encode(), OTHER_KEY.encode(), b"hk-env-0123456789abcdef")
    assert load_api_keys(env={}) == ()
    secret = "short"
    with pytest.raises(HllmError, match="16..4096") as e:
        load_api_keys([secret], env={})
    assert secret not in str(e.value)
    with pytest.raises(HllmError, match=r"\$HLLM_API_KEYS"):
        load_api_keys(env={ENV_VAR: "has space 0123456789abcdef"})
    (tmp_path / "empty").write_text("# nothing\n")
    with pytest.raises(HllmError, match="holds no key"):
        load_api_keys(key_file=tmp_path / "empty", env={})
    with pytest.raises(HllmError, match="not a file"):
        load_api_keys(key_file=tmp_path / "missing", env={})
    assert "hk-" not in repr(AuthOptions(keys))


def test_every_key_is_compared_in_constant_time(monkeypatch):
    """The token is compared with every key through hmac.compare_digest, even after a match."""
    import hllm.serve.auth as auth

    calls = []
    real = auth.hmac.compare_digest
    monkeypatch.setattr(auth.hmac, "compare_digest", lambda a, b: calls.append(b) or real(a, b))
    opts = AuthOptions((KEY.encode(), OTHER_KEY.encode()))
    assert opts.accepts(f"Bearer {KEY}") and opts.accepts(f"bearer   {OTHER_KEY}")
    assert calls == [KEY.encode(), OTHER_KEY.encode()] * 2
    assert not opts.accepts(None) and not opts.accepts(f"Basic {KEY}") and not opts.accepts(KEY)


def test_non_loopback_without_key_refuses_to_start(export_dir, capsys, monkeypatch):
    from hllm.cli import main

    monkeypatch.delenv(ENV_VAR, raising=False)
    with pytest.raises(SystemExit) as e:
        main(["serve", str(export_dir), "--host", "0.0.0.0", "--port", "1"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "no API key" in " ".join(err.split()) and "--no-auth" in err
    with pytest.raises(SystemExit) as e:
        main(["serve", str(export_dir), "--no-auth", "--api-key", KEY])
    assert e.value.code == 2
    with pytest.raises(SystemExit) as e:
        main(["serve", str(export_dir), "--api-key", "tiny"])
    assert e.value.code == 2 and "tiny" not in capsys.readouterr().err


# --- names and versions ------------------------------------------------------------------------------

def test_model_version_rule(export_dir):
    meta = resolve(export_dir).meta
    assert model_version(meta) == "sha256:" + meta["onnx_sha256"][:12]
    assert model_version({**meta, "model_version": "2026-05-rc1"}) == "2026-05-rc1"
    assert model_version({}) == "unversioned"
    with pytest.raises(HllmError, match="given twice"):
        ServedModel(("a", "a"))
    with pytest.raises(HllmError, match="served-model-name"):
        ServedModel(("bad name",))


def test_served_names_and_version_on_every_protocol(served):
    url, model = served
    h = _auth()
    listing = httpx.get(f"{url}/v1/models", headers=h, timeout=30).json()
    assert listing["object"] == "list" and [m["id"] for m in listing["data"]] == list(NAMES)
    assert {m["model_version"] for m in listing["data"]} == {model.version}
    r = httpx.post(f"{url}/v1/rank", json={"slates": tiny_slates(1, 4, seed=3)}, headers=h, timeout=60)
    assert r.json()["model_version"] == model.version and r.headers["x-model-version"] == model.version
    for name in NAMES:
        rr = httpx.post(f"{url}/v2/rerank", json={"model": name, "query": "q", "documents": ["a", "b"]}, headers=h, timeout=60)
        assert rr.status_code == 200 and rr.json()["model"] == name and rr.json()["model_version"] == model.version
    assert httpx.post(f"{url}/v2/rerank", json={"query": "q", "documents": ["a"]}, headers=h, timeout=60).json()["model"] == NAMES[0]
    bad = httpx.post(f"{url}/v2/rerank", json={"model": "other", "query": "q", "documents": ["a"]}, headers=h, timeout=60)
    assert bad.status_code == 404 and "'team-ranker'" in bad.json()["error"]["message"]
    slate = json.dumps(tiny_slates(1, 3, seed=4)[0])
    body = {"inputs": [{"name": "slates", "datatype": "BYTES", "shape": [1, 1], "data": [slate]}]}
    for path in ("/v2/models/team-ranker/infer", f"/v2/models/hllm_ranker/versions/{model.version}/infer",
                 "/v2/models/team-ranker/versions/1/infer"):
        k = httpx.post(f"{url}{path}", json=body, headers=h, timeout=60)
        assert k.status_code == 200, (path, k.text)
        assert k.json()["model_version"] == model.version and k.json()["model_name"] in NAMES
    meta = httpx.get(f"{url}/v2/models/team-ranker", headers=h, timeout=30).json()
    assert meta["name"] == "team-ranker" and meta["versions"] == [model.version]
    assert httpx.get(f"{url}/v2/models/hllm_ranker/versions/7", headers=h, timeout=30).status_code == 404
    assert httpx.get(f"{url}/v2/models/other", headers=h, timeout=30).status_code == 404


# --- traces --------------------------------------------------------------------------------------------

def test_one_span_per_request_with_stage_children(served, spans):
    url, model = served
    exporter = spans[1]
    exporter.clear()
    slates = tiny_slates(2, 5, seed=8)
    r = httpx.post(f"{url}/v1/rank", json={"slates": slates}, headers={**_auth(), "X-Request-ID": "trace-me-1"}, timeout=60)
    assert r.status_code == 200
    httpx.post(f"{url}/v1/rank", json={"slates": slates}, headers={"X-Request-ID": "no-key-1"}, timeout=60)
    deadline = time.monotonic() + 10  # a server span ends after its last byte is sent: it can trail the client
    while True:
        finished = exporter.get_finished_spans()
        roots = [s for s in finished if s.parent is None]
        if {"trace-me-1", "no-key-1"} <= {s.attributes.get("hllm.request_id") for s in roots} or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    root = next(s for s in roots if s.attributes["hllm.request_id"] == "trace-me-1")
    assert root.name == "POST /v1/rank" and root.kind.name == "SERVER"
    assert root.attributes["hllm.slates"] == 2 and root.attributes["hllm.documents"] == 10
    assert root.attributes["http.response.status_code"] == 200 and root.attributes["hllm.model_version"] == model.version
    children = sorted((s for s in finished if s.parent is not None and s.parent.span_id == root.context.span_id),
                      key=lambda s: s.start_time)
    assert [c.name for c in children] == ["tokenize", "queue wait", "engine", "decode"]
    for c in children:
        assert root.start_time <= c.start_time <= c.end_time <= root.end_time
    assert children[2].attributes["hllm.batch_slates"] >= 2
    rejected = next(s for s in roots if s.attributes["hllm.request_id"] == "no-key-1")
    assert rejected.attributes["http.response.status_code"] == 401 and rejected.attributes["hllm.slates"] == 0
    assert not [s for s in finished if s.parent is not None and s.parent.span_id == rejected.context.span_id]


def test_server_runs_without_opentelemetry(export_dir):
    """Tracing is imported on demand: without the otel extra (opentelemetry's SDK and exporter; the API comes with
    fastapi) the app serves, and --otlp-endpoint names the extra."""
    code = f"""
import sys, importlib.abc
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.startswith(('opentelemetry.sdk', 'opentelemetry.exporter')):
            raise ModuleNotFoundError(name, name=name)
sys.meta_path.insert(0, Block())
import httpx
from hllm.runtime import Ranker
from hllm.serve.app import create_app
from hllm.serve.server import BackgroundServer, wait_ready
with BackgroundServer(create_app(Ranker.from_path({str(export_dir)!r}))) as s:
    wait_ready(s.url, 120)
    r = httpx.post(s.url + '/v1/rank', json={{'slates': [{{'history': ['a'], 'candidates': [{{'title': 'x'}}, {{'title': 'y'}}]}}]}})
    print(r.status_code)
from hllm.cli import main
main(['serve', {str(export_dir)!r}, '--otlp-endpoint', 'http://127.0.0.1:1/v1/traces'])
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.stdout.strip() == "200", r.stderr[-2000:]
    assert r.returncode == 2 and "pip install 'hllm[otel]'" in r.stderr, r.stderr[-2000:]


# --- TLS --------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def ca(tmp_path_factory):
    trustme = pytest.importorskip("trustme", reason="trustme is not installed (pip install -e '.[dev]')")
    d = tmp_path_factory.mktemp("tls")
    authority = trustme.CA()
    cert = authority.issue_cert("127.0.0.1", "localhost")
    cert.cert_chain_pems[0].write_to_path(d / "cert.pem")
    for blob in cert.cert_chain_pems[1:]:
        blob.write_to_path(d / "cert.pem", append=True)
    cert.private_key_pem.write_to_path(d / "key.pem")
    authority.cert_pem.write_to_path(d / "ca.pem")
    return d


def test_tls_verified_by_httpx_and_the_cohere_sdk(export_dir, ca):
    import ssl

    cohere = pytest.importorskip("cohere", reason="the rerank-clients extra is not installed")
    tls = tls_options(ca / "cert.pem", ca / "key.pem")
    assert tls == {"ssl_certfile": str(ca / "cert.pem"), "ssl_keyfile": str(ca / "key.pem")}
    app = create_app(Ranker.from_path(export_dir), auth=AuthOptions((KEY.encode(),)))
    with BackgroundServer(app, tls=tls) as srv:
        assert srv.url.startswith("https://127.0.0.1:")
        ctx = ssl.create_default_context(cafile=str(ca / "ca.pem"))
        with httpx.Client(verify=ctx, timeout=60) as c:
            wait_ready(srv.url, timeout_s=120, client=c)
            r = c.post(f"{srv.url}/v1/rank", json={"slates": tiny_slates(1, 4, seed=5)}, headers=_auth())
            assert r.status_code == 200 and len(r.json()["rankings"][0]["order"]) == 4
            client = cohere.ClientV2(api_key=KEY, base_url=srv.url, httpx_client=c)
            assert len(client.rerank(model="hllm_ranker", query="q", documents=["a", "b", "c"]).results) == 3
        with pytest.raises(httpx.ConnectError):  # the system trust store does not know the test CA
            httpx.get(f"{srv.url}/healthz", timeout=30)
        with pytest.raises(httpx.TransportError):  # plain HTTP to the TLS port
            httpx.get(srv.url.replace("https", "http") + "/healthz", timeout=30)


def test_tls_files_checked_before_start(ca, tmp_path):
    trustme = pytest.importorskip("trustme")
    assert tls_options(None, None) is None
    with pytest.raises(HllmError, match="needs --ssl-certfile"):
        tls_options(None, ca / "key.pem")
    with pytest.raises(HllmError, match="not a file"):
        tls_options(tmp_path / "nope.pem", None)
    trustme.CA().issue_cert("127.0.0.1").private_key_pem.write_to_path(tmp_path / "other-key.pem")
    with pytest.raises(HllmError, match="matching private key"):
        tls_options(ca / "cert.pem", tmp_path / "other-key.pem")


def test_cli_https_with_key_file_and_json_access_log(export_dir, ca, tmp_path):
    """`hllm serve --ssl-* --api-key-file --log-format json`: HTTPS with the key; one JSON access record per
    request with its fields; the key is in no log line."""
    import socket
    import ssl

    (tmp_path / "keys").write_text(KEY + "\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(tmp_path / "serve.log", "w")
    env = {k: v for k, v in os.environ.items() if k != ENV_VAR}
    proc = subprocess.Popen([sys.executable, "-m", "hllm", "serve", str(export_dir), "--port", str(port),
                             "--api-key-file", str(tmp_path / "keys"), "--ssl-certfile", str(ca / "cert.pem"),
                             "--ssl-keyfile", str(ca / "key.pem"), "--log-format", "json", "--log-level", "debug",
                             "--served-model-name", "team-ranker"],
                            stdout=log, stderr=subprocess.STDOUT, env={**env, "PYTHONUNBUFFERED": "1"})
    url = f"https://127.0.0.1:{port}"
    try:
        with httpx.Client(verify=ssl.create_default_context(cafile=str(ca / "ca.pem")), timeout=60) as c:
            wait_ready(url, timeout_s=120, client=c)
            r = c.post(f"{url}/v2/rerank", json={"model": "team-ranker", "query": "q", "documents": ["a", "b", "c"]},
                       headers={**_auth(), "X-Request-ID": "acc-1"})
            assert r.status_code == 200, r.text
            assert c.post(f"{url}/v1/rank", json={"slates": tiny_slates(1, 3)}, headers={"X-Request-ID": "acc-2"}).status_code == 401
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        log.close()
    text = (tmp_path / "serve.log").read_text()
    assert KEY not in text
    records = [json.loads(ln) for ln in text.splitlines() if ln.startswith("{")]
    access = {r["request_id"]: r for r in records if r.get("logger") == "hllm.access"}
    ok, denied = access["acc-1"], access["acc-2"]
    assert ok["route"] == "/v2/rerank" and ok["status"] == 200 and ok["slates"] == 1 and ok["documents"] == 3
    assert ok["model_version"].startswith("sha256:") and ok["latency_ms"] > 0 and ok["method"] == "POST"
    assert denied["status"] == 401 and denied["slates"] == 0


def test_loadtest_measures_keys_and_tracing_beside_the_plain_server(export_dir):
    """`hllm loadtest --keys-and-tracing`: the keyed, traced mode answers every request (the clients send the
    key) and ranks as the plain modes do."""
    pytest.importorskip("opentelemetry.sdk.trace", reason="the otel extra is not installed")
    from hllm.bench.loadtest import compare_batching

    res = compare_batching(export_dir, tiny_slates(6, (2, 8), seed=61), clients=2, requests=8, max_seconds=120,
                           rounds=2, log=lambda m: None, keys_and_tracing=True)
    assert set(res) == {"batching_on", "batching_off", "batching_on_keys_traced", "rankings_identical_across_modes",
                        "keys_and_tracing"}
    cost = res["keys_and_tracing"]
    paired = cost["batching_on_keys_traced_vs_batching_on"]
    assert paired["rounds"] == 2 and len(paired["p50_ratio"]["per_round"]) == 2
    lo, hi = paired["throughput_ratio"]["ci95"]
    assert 0 < lo <= paired["throughput_ratio"]["median"] <= hi
    mw = cost["middleware_us_per_request"]
    assert 0 < mw["plain_us"] < mw["keys_and_tracing_us"]  # spans cost something; the plain stack is not free
    assert mw["added_us"] == pytest.approx(mw["keys_and_tracing_us"] - mw["plain_us"], abs=0.11)
    secured = res["batching_on_keys_traced"]
    assert secured["ok"] == secured["requests"] == 8 and secured["errors"] == 0
    assert secured["options"]["api_key"] and secured["options"]["tracing"] and not res["batching_on"]["options"]["api_key"]
    agree = res["rankings_identical_across_modes"]
    assert agree["compared"] == 16 and agree["identical"] == 16


def test_paired_ratios_compare_each_round_with_its_pair():
    """The per-round ratios are secured / plain of the round's p50 and throughput; a round where a mode answered
    nothing is left out."""
    from hllm.bench.keys_tracing import paired_ratios

    plain = [{"lat": [10.0, 10.0, 10.0], "wall": 1.0}, {"lat": [20.0, 20.0], "wall": 2.0}, {"lat": [], "wall": 1.0}]
    secured = [{"lat": [11.0, 11.0, 11.0], "wall": 1.5}, {"lat": [20.0, 20.0], "wall": 1.0}, {"lat": [5.0], "wall": 1.0}]
    r = paired_ratios(plain, secured)
    assert r["rounds"] == 2
    assert r["p50_ratio"]["per_round"] == [1.1, 1.0] and r["p50_ratio"]["median"] == pytest.approx(1.05)
    assert r["throughput_ratio"]["per_round"] == [pytest.approx(2 / 3, abs=1e-4), 2.0]
    assert r["p50_ratio"]["ci95"][0] >= 1.0 and r["p50_ratio"]["ci95"][1] <= 1.1
