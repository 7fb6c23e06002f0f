"""Hostile HTTP requests: every error is the JSON envelope with a 4xx (or a JSON
500 with an id), every response is counted in /metrics, one bad request never fails the others, and
slow clients (dribbled headers or body, idle connections) are cut off while normal requests are served."""

from __future__ import annotations

import concurrent.futures
import json
import re
import socket
import threading
import time

import pytest

for _mod in ("fastapi", "uvicorn", "httpx", "prometheus_client"):
    pytest.importorskip(_mod, reason="the serve extra is not installed (pip install -e .[serve])")

import httpx  # noqa: E402

from hllm.errors import HllmError  # noqa: E402
from hllm.runtime import Ranker  # noqa: E402
from hllm.serve.app import ServeOptions, create_app  # noqa: E402
from hllm.serve.batching import BatchOptions  # noqa: E402
from hllm.serve.server import BackgroundServer, wait_ready  # noqa: E402
from hllm.testing import tiny_slates  # noqa: E402

TIMEOUT_S = 2.0  # header and body timeouts of the test server (1 s was hit by a whole 50-byte body on loaded CI cores)


class BoomBuilder:
    """The real prompt builder, except that a slate with slate_id 'boom' raises a bug (RuntimeError)."""

    def __init__(self, inner):
        self.inner = inner

    def encode_one(self, slate):
        if slate.get("slate_id") == "boom":
            raise RuntimeError("an unexpected bug")
        return self.inner.encode_one(slate)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def _start(export_dir, **opts):
    base = Ranker.from_path(export_dir)
    options = ServeOptions(batch=BatchOptions(max_batch_slates=4, max_wait_ms=20.0), max_body_bytes=256 * 1024,
                           header_timeout_s=TIMEOUT_S, body_timeout_s=TIMEOUT_S, keep_alive_s=TIMEOUT_S, **opts)
    app = create_app(Ranker(base.engine, BoomBuilder(base.builder)), options)
    return BackgroundServer(app), app


@pytest.fixture(scope="module")
def server(export_dir):
    srv, app = _start(export_dir)
    with srv:
        wait_ready(srv.url, timeout_s=120)
        yield srv


@pytest.fixture(scope="module")
def reference(export_dir):
    with Ranker.from_path(export_dir) as r:
        yield r


def _slate(**kw):
    s = tiny_slates(1, 3, seed=9)[0]
    s.update(kw)
    return s


def _raw_post(url: str, body: bytes, ctype: str = "application/json") -> httpx.Response:
    return httpx.post(f"{url}/v1/rank", content=body, headers={"content-type": ctype}, timeout=30)


def _envelope(r: httpx.Response, status: int, kind: str, *words: str) -> dict:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json"), r.headers
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"kind", "message", "id"}, body
    err = body["error"]
    assert err["kind"] == kind, err
    for w in words:
        assert w in err["message"], (w, err)
    return err


S = json.dumps(_slate())
HOSTILE = {
    "missing_item_id_on_one": (json.dumps({"slates": [_slate(candidates=[{"item_id": "a", "title": "A"}, {"title": "B"}])]}),
                               422, "bad_slate", ["slates[0]", "candidates[1] has no item_id"]),
    "null_item_id": (json.dumps({"slates": [_slate(candidates=[{"item_id": None, "title": "A"}])]}),
                     422, "bad_slate", ["candidates[0].item_id must be a string or an integer, got null"]),
    "duplicate_item_ids": (json.dumps({"slates": [_slate(candidates=[{"item_id": "a", "title": "A"}, {"item_id": "a", "title": "B"}])]}),
                           422, "bad_slate", ["duplicate item_id 'a'"]),
    "slate_id_null": (json.dumps({"slates": [_slate(slate_id=None)]}), 422, "bad_slate", ["slate_id", "got null"]),
    "label_two": (json.dumps({"slates": [_slate(labels=[0, 2, 0])]}), 422, "bad_slate", ["labels[1] must be 0 or 1"]),
    "lone_surrogate_escape": ('{"slates": [{"candidates": [{"item_id": "a", "title": "x\\ud800"}]}]}',
                              422, "bad_slate", ["candidates[0].title holds a lone surrogate"]),
    "raw_surrogate_bytes": (b'{"slates": [{"candidates": [{"title": "x\xed\xa0\x80"}]}]}', 400, "bad_json", ["not UTF-8"]),
    "deep_json": ("[" * 100_000 + "]" * 100_000, 400, "bad_json", ["nested too deeply"]),
    "deep_json_in_a_slate": ('{"slates": [{"candidates": ' + "[" * 50_000 + "]" * 50_000 + "}]}", 400, "bad_json",
                             ["nested too deeply"]),
    "deadline_nan": ('{"slates": [' + S + '], "deadline_ms": NaN}', 400, "bad_json", ["NaN is not valid JSON"]),
    "deadline_infinity_literal": ('{"slates": [' + S + '], "deadline_ms": Infinity}', 400, "bad_json", ["Infinity"]),
    "deadline_overflowing_float": ('{"slates": [' + S + '], "deadline_ms": 1e999}', 422, "bad_request",
                                   ["'deadline_ms' must be a finite positive number, got inf"]),
    "deadline_negative": ('{"slates": [' + S + '], "deadline_ms": -5}', 422, "bad_request", ["deadline_ms"]),
    "deadline_bool": ('{"slates": [' + S + '], "deadline_ms": true}', 422, "bad_request", ["deadline_ms"]),
    "huge_integer": ('{"slates": [' + S + '], "deadline_ms": ' + "9" * 5000 + "}", 400, "bad_json", ["malformed JSON"]),
    "body_is_a_string": ('"hello"', 422, "bad_request", ["got str"]),
    "body_is_null": ("null", 422, "bad_request", ["got NoneType"]),
    "empty_body": ("", 400, "bad_json", ["malformed JSON"]),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_bodies_get_the_envelope(server, case):
    body, status, kind, words = HOSTILE[case]
    r = _raw_post(server.url, body if isinstance(body, bytes) else body.encode())
    err = _envelope(r, status, kind, *words)
    assert err["id"] is None  # a client error has no server-side id


def test_jsonl_lines_use_the_same_rules(server):
    lines = [S, json.dumps(_slate(candidates=[{"item_id": "a", "title": "A"}, {"item_id": "a", "title": "B"}]))]
    r = _raw_post(server.url, ("\n".join(lines) + "\n").encode(), "application/x-ndjson")
    _envelope(r, 422, "bad_slate", "JSONL slate 2", "duplicate item_id 'a'")
    r = _raw_post(server.url, (S + "\n" + "[" * 100_000 + "]" * 100_000 + "\n").encode(), "application/x-ndjson")
    _envelope(r, 400, "bad_json", "line 2: JSON nested too deeply")


def test_integer_ids_are_returned_as_strings(server, reference):
    s = {"slate_id": 7, "history": [], "candidates": [{"item_id": 10 + i, "title": f"title {i}"} for i in range(4)]}
    r = httpx.post(f"{server.url}/v1/rank", json={"slates": [s]}, timeout=30)
    assert r.status_code == 200, r.text
    got = r.json()["rankings"][0]
    want = reference.rank([s])[0]
    assert got["slate_id"] == "7" and got["order"] == want.order
    assert got["ranking"] == [str(10 + i) for i in want.order]


def test_slates_without_id_are_named_by_their_index_in_the_request(server):
    ss = [{"history": [], "candidates": [{"title": f"t{i}"} for i in range(3)]} for _ in range(3)]
    with concurrent.futures.ThreadPoolExecutor(3) as ex:  # concurrent: they share micro-batches
        rs = list(ex.map(lambda _: httpx.post(f"{server.url}/v1/rank", json={"slates": ss}, timeout=30), range(3)))
    for r in rs:
        assert r.status_code == 200, r.text
        assert [x["slate_id"] for x in r.json()["rankings"]] == ["0", "1", "2"]


def test_404_405_and_415_are_enveloped(server):
    _envelope(httpx.get(f"{server.url}/nope"), 404, "not_found", "/nope")
    _envelope(httpx.get(f"{server.url}/v1/rank"), 405, "method_not_allowed")
    _envelope(_raw_post(server.url, b"x", "text/plain"), 415, "unsupported_media_type", "text/plain")


def test_unexpected_error_is_a_json_500_with_an_id_and_the_server_keeps_serving(server, caplog):
    r = httpx.post(f"{server.url}/v1/rank", json={"slates": [_slate(slate_id="boom")]}, timeout=30)
    err = _envelope(r, 500, "internal", "internal error (RuntimeError)")
    assert re.fullmatch(r"[0-9a-f]{12}", err["id"])
    assert httpx.post(f"{server.url}/v1/rank", json={"slates": [_slate()]}, timeout=30).status_code == 200


def _requests_total(url: str) -> dict[tuple[str, str], float]:
    text = httpx.get(f"{url}/metrics").text
    out = {}
    for m in re.finditer(r'^hllm_requests_total\{code="(\d+)",path="([^"]+)"\} ([0-9.e+]+)$', text, re.M):
        out[(m.group(2), m.group(1))] = float(m.group(3))
    return out


def test_every_response_is_counted(server):
    before = _requests_total(server.url)
    calls = [
        lambda: httpx.post(f"{server.url}/v1/rank", json={"slates": [_slate()]}, timeout=30),  # 200
        lambda: _raw_post(server.url, b"{"),  # 400
        lambda: httpx.get(f"{server.url}/missing"),  # 404
        lambda: httpx.get(f"{server.url}/v1/rank"),  # 405
        lambda: _raw_post(server.url, b"x", "text/csv"),  # 415
        lambda: _raw_post(server.url, HOSTILE["duplicate_item_ids"][0].encode()),  # 422
        lambda: httpx.post(f"{server.url}/v1/rank", json={"slates": [_slate(slate_id="boom")]}, timeout=30),  # 500
        lambda: httpx.get(f"{server.url}/healthz"),  # 200
    ]
    codes = [c().status_code for c in calls]
    assert codes == [200, 400, 404, 405, 415, 422, 500, 200]
    after = _requests_total(server.url)
    diff = {k: after.get(k, 0) - before.get(k, 0) for k in after if after.get(k, 0) != before.get(k, 0)}
    assert diff == {("/v1/rank", "200"): 1, ("/v1/rank", "400"): 1, ("other", "404"): 1, ("/v1/rank", "405"): 1,
                    ("/v1/rank", "415"): 1, ("/v1/rank", "422"): 1, ("/v1/rank", "500"): 1, ("/healthz", "200"): 1,
                    ("/metrics", "200"): 1}  # the first scrape is counted after it rendered
    text = httpx.get(f"{server.url}/metrics").text
    for kind in ("not_found", "method_not_allowed", "internal", "bad_slate", "bad_json", "unsupported_media_type"):
        assert f'hllm_errors_total{{kind="{kind}"}}' in text, kind


def test_bad_requests_never_fail_good_ones_sent_alongside(server, reference):
    good = tiny_slates(8, (2, 8), seed=77)
    bad = [HOSTILE[k][0] for k in ("duplicate_item_ids", "deep_json", "deadline_nan", "lone_surrogate_escape")]

    def send(i):
        if i % 2:
            return "bad", _raw_post(server.url, bad[(i // 2) % len(bad)].encode())
        return "good", httpx.post(f"{server.url}/v1/rank", json={"slates": [good[i // 2]]}, timeout=60)

    with concurrent.futures.ThreadPoolExecutor(8) as ex:
        results = list(ex.map(send, range(16)))
    for i, (what, r) in enumerate(results):
        if what == "bad":
            assert 400 <= r.status_code < 500, r.text
        else:
            assert r.status_code == 200, r.text
            assert r.json()["rankings"][0]["order"] == reference.rank([good[i // 2]])[0].order


# -- slow clients ------------------------------------------------------------------------------------
def _connect(url: str, source: str | None = None) -> socket.socket:
    """A raw TCP connection to the server; ``source``: the local loopback address to connect from
    (127.0.0.0/8 is all this machine's, so 127.0.0.2 is another client address)."""
    host, port = url.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)), timeout=10, source_address=(source, 0) if source else None)
    return s


def _read_all(sock: socket.socket, limit_s: float) -> bytes:
    sock.settimeout(limit_s)
    chunks = []
    try:
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    except (socket.timeout, ConnectionResetError):
        pass
    return b"".join(chunks)


def _normal_requests_while(url: str, stop: threading.Event, latencies: list, statuses: list) -> None:
    with httpx.Client(timeout=30) as c:
        while not stop.is_set():
            t0 = time.perf_counter()
            r = c.post(f"{url}/v1/rank", json={"slates": [_slate()]})
            latencies.append(time.perf_counter() - t0)
            statuses.append(r.status_code)
            time.sleep(0.05)


def _dribble(sock: socket.socket, parts: list[bytes], every_s: float, stop_after_s: float) -> float:
    """Send ``parts`` one at a time; returns the seconds until the server closed the connection."""
    t0 = time.perf_counter()
    for p in parts:
        if time.perf_counter() - t0 > stop_after_s:
            break
        try:
            sock.sendall(p)
        except (BrokenPipeError, ConnectionResetError):
            break
        time.sleep(every_s)
    return time.perf_counter() - t0


@pytest.mark.parametrize("what", ["headers", "body"])
def test_dribbling_client_is_cut_off_and_does_not_block_others(server, what):
    stop, latencies, statuses = threading.Event(), [], []
    normal = threading.Thread(target=_normal_requests_while, args=(server.url, stop, latencies, statuses))
    normal.start()
    sock = _connect(server.url)
    try:
        if what == "headers":
            start = b"POST /v1/rank HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            parts = [start] + [f"x-pad-{i}: y\r\n".encode() for i in range(200)]
        else:
            body = json.dumps({"slates": [_slate()]}).encode()
            start = (b"POST /v1/rank HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                     b"content-length: " + str(len(body)).encode() + b"\r\n\r\n")
            parts = [start] + [body[i:i + 1] for i in range(len(body))]
        _dribble(sock, parts, every_s=0.05, stop_after_s=6 * TIMEOUT_S)
        answer = _read_all(sock, 5.0)
    finally:
        sock.close()
        stop.set()
        normal.join(timeout=60)
    head, _, payload = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), answer[:300]
    assert json.loads(payload)["error"]["kind"] == "timeout"
    assert f"not received within {TIMEOUT_S:g} s".encode() in payload
    assert statuses and set(statuses) == {200}
    assert len(statuses) >= 3 and max(latencies) < 2.0, (len(statuses), max(latencies))


def test_idle_connection_is_closed(server):
    sock = _connect(server.url)
    t0 = time.perf_counter()
    try:
        answer = _read_all(sock, 10 * TIMEOUT_S)
    finally:
        sock.close()
    waited = time.perf_counter() - t0
    assert TIMEOUT_S * 0.8 <= waited < 5 * TIMEOUT_S, waited
    assert answer == b"" or answer.startswith(b"HTTP/1.1 408"), answer[:200]


def test_keep_alive_connection_serves_then_times_out(server):
    with httpx.Client(timeout=30) as c:
        for _ in range(3):  # several requests on one connection: the header timer re-arms each time
            assert c.post(f"{server.url}/v1/rank", json={"slates": [_slate()]}).status_code == 200
            time.sleep(TIMEOUT_S / 3)


def test_connection_limit(export_dir):
    srv, _ = _start(export_dir, max_connections=3, max_connections_per_client=3)
    with srv:
        wait_ready(srv.url, timeout_s=120)
        held = [_connect(srv.url) for _ in range(3)]
        try:
            time.sleep(0.2)
            r = httpx.get(f"{srv.url}/healthz", timeout=10)
            assert r.status_code == 503  # uvicorn's limit_concurrency answer
        finally:
            for s in held:
                s.close()
        time.sleep(0.3)
        assert httpx.get(f"{srv.url}/healthz", timeout=10).status_code == 200


def test_one_client_address_cannot_hold_every_connection(export_dir):
    """More connections than ``max_connections`` from one address, each sending headers and no body: past
    its per-client share each new one is a JSON 503 closed at once, the held ones end with 408 after the
    body timeout, and a client from another address is served meanwhile."""
    srv, _ = _start(export_dir, max_connections=24)  # default share of one address: 12
    head = (b"POST /v1/rank HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n")
    with srv:
        wait_ready(srv.url, timeout_s=120)
        held = []
        try:
            for _ in range(30):
                sock = _connect(srv.url, source="127.0.0.2")
                sock.sendall(head)
                held.append(sock)
            time.sleep(0.3)
            t0 = time.perf_counter()
            r = httpx.post(f"{srv.url}/v1/rank", json={"slates": [_slate()]}, timeout=30)
            served_s = time.perf_counter() - t0
            answers = [_read_all(sock, 4 * TIMEOUT_S) for sock in held]
        finally:
            for sock in held:
                sock.close()
    assert r.status_code == 200 and served_s < TIMEOUT_S, (r.status_code, r.text[:300], served_s)
    refused = [a for a in answers if a.startswith(b"HTTP/1.1 503")]
    timed_out = [a for a in answers if a.startswith(b"HTTP/1.1 408")]
    assert len(refused) == 18 and len(timed_out) == 12, [a[:40] for a in answers]
    body = json.loads(refused[0].partition(b"\r\n\r\n")[2])
    assert body["error"]["kind"] == "too_many_connections" and b"retry-after: 1" in refused[0].lower()
    assert json.loads(timed_out[0].partition(b"\r\n\r\n")[2])["error"]["kind"] == "timeout"


def test_options_are_validated():
    for bad in ({"header_timeout_s": 0}, {"body_timeout_s": float("nan")}, {"max_connections": 0},
                {"keep_alive_s": -1}, {"max_body_bytes": 1.5}, {"max_connections_per_client": 0}):
        with pytest.raises(HllmError, match=next(iter(bad))):
            ServeOptions(**bad)
