"""Versioned model repositories swapped live: REPO/1, REPO/2 (two tiny exports of different seeds), a reload
under load with no failed request and each response ranked by the version it names, a broken version
refused while the served one keeps serving, the admin key, and SIGHUP on `hllm serve`."""

from __future__ import annotations

import concurrent.futures
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

for _mod in ("fastapi", "uvicorn", "httpx"):
    pytest.importorskip(_mod, reason="the serve extra is not installed (pip install -e .[serve])")

import httpx  # noqa: E402

from hllm.errors import HllmError  # noqa: E402
from hllm.runtime import Ranker  # noqa: E402
from hllm.serve.admin import AdminOptions  # noqa: E402
from hllm.serve.app import ServeOptions, create_app  # noqa: E402
from hllm.serve.auth import AuthOptions  # noqa: E402
from hllm.serve.batching import BatchOptions  # noqa: E402
from hllm.serve.repository import (VersionManager, VersionRefused, check_version, is_repository,  # noqa: E402
                                   version_folders)
from hllm.serve.server import BackgroundServer, wait_ready  # noqa: E402
from hllm.testing import tiny_export, tiny_slates  # noqa: E402

from tests.serve.conftest import free_port  # noqa: E402

KEY = "hk-infer-0123456789abcdef"
ADMIN = "hk-admin-0123456789abcdef"
SLATES = tiny_slates(6, (3, 8), seed=11)


@pytest.fixture(scope="module")
def second_export(tmp_path_factory) -> Path:
    """A tiny export with other weights (seed 1) than the session's ``export_dir``."""
    return tiny_export(tmp_path_factory.mktemp("v2"), seed=1)


@pytest.fixture(scope="module")
def expected(export_dir, second_export) -> dict:
    """``{version: {slate_id: scores}}`` that each export's own Ranker gives for :data:`SLATES`."""
    out = {}
    for version, path in (("1", export_dir), ("2", second_export)):
        with Ranker.from_path(path) as r:
            out[version] = {x.slate_id: x.scores for x in r.rank(SLATES)}
    assert not np.allclose(out["1"]["tiny-0"], out["2"]["tiny-0"], atol=1e-3)  # the versions are told apart
    return out


def add_version(repo: Path, number: int, export: Path) -> Path:
    """Copy ``export`` in under a temporary name, then rename it to its number (atomic, as the docs say)."""
    tmp = repo / f".incoming-{number}"
    shutil.copytree(export, tmp)
    return tmp.rename(repo / str(number))


@pytest.fixture
def repo(tmp_path, export_dir) -> Path:
    root = tmp_path / "repo"
    root.mkdir()
    add_version(root, 1, export_dir)
    return root


def versioned_server(repo: Path, admin=AdminOptions((ADMIN.encode(),)), **batch) -> BackgroundServer:
    versions, ranker, served = VersionManager.open(repo)
    opts = ServeOptions(batch=BatchOptions(**{"max_batch_slates": 4, "max_wait_ms": 2.0, **batch}))
    app = create_app(ranker, opts, auth=AuthOptions((KEY.encode(),)), model=served, versions=versions, admin=admin)
    return BackgroundServer(app)


def reload(client: httpx.Client, url: str, key: str = ADMIN) -> dict:
    r = client.post(f"{url}/admin/reload", params={"wait": "true"}, headers={"Authorization": f"Bearer {key}"}, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


def check_ranked_by_its_version(r: httpx.Response, expected: dict, slate_id: str) -> str:
    """The response is a 200 whose scores are those of the version it names (body and header agree)."""
    assert r.status_code == 200, r.text
    body = r.json()
    version = body["model_version"]
    assert r.headers["x-model-version"] == version
    np.testing.assert_allclose(body["rankings"][0]["scores"], expected[version][slate_id], atol=1e-4)
    return version


def test_repository_layout(tmp_path, repo, export_dir):
    (repo / "01").mkdir()  # leading zero: not a version
    (repo / "notes").mkdir()
    (repo / "7").write_text("a file, not a folder")
    assert [n for n, _ in version_folders(repo)] == [1]
    assert is_repository(repo) and not is_repository(export_dir) and not is_repository(tmp_path / "nothing")
    (repo / "2").mkdir()  # an empty version folder: refused, the next lower one is served
    versions, _, served = VersionManager.open(repo)
    assert served.version == "1" and versions.current == 1
    refused = {v["version"]: v for v in versions.listing()}["2"]
    assert refused["state"] == "refused" and "not a model version" in refused["reason"]
    shutil.rmtree(repo / "1")
    with pytest.raises(HllmError, match="no version opens"):
        VersionManager.open(repo)


def test_swap_under_load_fails_no_request_and_each_response_names_the_version_that_ranked_it(repo, second_export, expected):
    swapped, lock, results = threading.Event(), threading.Lock(), []
    clients, after_swap, cap = 4, 6, 400  # each client keeps sending until it had `after_swap` answers after the swap

    def client(i: int) -> None:
        n_after = 0
        with httpx.Client(timeout=120, headers={"Authorization": f"Bearer {KEY}"}) as c:
            for j in range(cap // clients):
                slate = SLATES[(i + j) % len(SLATES)]
                r = c.post(f"{url}/v1/rank", json={"slates": [slate]})
                with lock:
                    results.append((slate["slate_id"], r))
                if swapped.is_set():
                    n_after += 1
                    if n_after >= after_swap:
                        return

    with versioned_server(repo) as srv, httpx.Client() as admin:
        url = srv.url
        wait_ready(url, timeout_s=120)
        with concurrent.futures.ThreadPoolExecutor(clients) as ex:
            futures = [ex.submit(client, i) for i in range(clients)]
            while len(results) < 8 and not any(f.done() for f in futures):  # the load runs on version 1
                time.sleep(0.01)
            add_version(repo, 2, second_export)
            outcome = reload(admin, url)
            swapped.set()
            for f in futures:
                f.result()
        assert outcome["swapped"] and outcome["serving"] == "2" and outcome["previous"] == "1", outcome
        seen = [check_ranked_by_its_version(r, expected, sid) for sid, r in results]
        assert len(results) < cap and "1" in seen and "2" in seen  # requests ran on both sides of the swap
        assert seen[-clients:] == ["2"] * clients  # answered after the swap: the new version
        listing = admin.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {KEY}"}).json()
        assert listing["data"][0]["model_version"] == "2"
        states = {v["version"]: v["state"] for v in listing["versions"]}
        assert states == {"2": "serving", "1": "retired"}
        assert admin.get(f"{url}/readyz").json()["model_version"] == "2"
        state = srv.server.config.app.state  # the served app (AnswerCancelled over FastAPI: its state is hllm's)
        manager = getattr(state, "hllm", state).versions
        t_end = time.monotonic() + 60
        while manager._retiring and time.monotonic() < t_end:  # v1's engine is freed once its requests are answered
            time.sleep(0.02)
        assert not manager._retiring


def test_broken_version_is_refused_and_the_served_one_keeps_serving(repo, second_export, expected):
    add_version(repo, 2, second_export)
    with versioned_server(repo) as srv, httpx.Client(headers={"Authorization": f"Bearer {KEY}"}, timeout=120) as c:
        wait_ready(srv.url, timeout_s=120)
        broken = add_version(repo, 3, second_export)
        (broken / "model.onnx").write_bytes(b"not an onnx graph")  # corrupt after copying
        outcome = reload(c, srv.url)
        assert not outcome["swapped"] and outcome["serving"] == "2", outcome
        assert [r["version"] for r in outcome["refused"]] == ["3"] and "model.onnx" in outcome["refused"][0]["reason"]
        listing = c.get(f"{srv.url}/v1/models").json()
        v3 = {v["version"]: v for v in listing["versions"]}["3"]
        assert v3["state"] == "refused" and "model.onnx" in v3["reason"]
        assert listing["data"][0]["model_version"] == "2"
        r = c.post(f"{srv.url}/v1/rank", json={"slates": [SLATES[0]]})
        assert check_ranked_by_its_version(r, expected, "tiny-0") == "2"
        # reload again: v3 is tried again (it may have been fixed) and refused again; nothing else changes
        assert reload(c, srv.url)["refused"][0]["version"] == "3"
        # the served folder removed: a reload rolls back to the highest valid version below
        shutil.rmtree(repo / "3")
        shutil.rmtree(repo / "2")
        outcome = reload(c, srv.url)
        assert outcome["swapped"] and outcome["serving"] == "1" and outcome["previous"] == "2", outcome
        r = c.post(f"{srv.url}/v1/rank", json={"slates": [SLATES[0]]})
        assert check_ranked_by_its_version(r, expected, "tiny-0") == "1"


def test_admin_route_needs_the_admin_key(repo, export_dir):
    with versioned_server(repo) as srv, httpx.Client(timeout=120) as c:
        wait_ready(srv.url, timeout_s=120)
        url = f"{srv.url}/admin/reload"
        for headers in ({}, {"Authorization": f"Bearer {KEY}"}, {"Authorization": "Bearer hk-wrong-0123456789abcdef"}):
            r = c.post(url, headers=headers)
            assert r.status_code == 401 and r.json()["error"]["kind"] == "unauthorized", (headers, r.text)
            assert r.headers["www-authenticate"].startswith('Bearer realm="hllm-admin"')
            assert KEY not in r.text and ADMIN not in r.text
        # the admin key is not an API key
        r = c.post(f"{srv.url}/v1/rank", json={"slates": [SLATES[0]]}, headers={"Authorization": f"Bearer {ADMIN}"})
        assert r.status_code == 401
        r = c.post(url, headers={"Authorization": f"Bearer {ADMIN}"})
        assert r.status_code == 202 and r.json() == {"status": "reloading", "serving": "1"}
    for admin, status, kind in ((None, 403, "admin_disabled"), (AdminOptions(allow_without_key=True), 200, None)):
        with versioned_server(repo, admin=admin) as srv:
            wait_ready(srv.url, timeout_s=120)
            r = httpx.post(f"{srv.url}/admin/reload?wait=true", timeout=120)
            assert r.status_code == status, r.text
            if kind:
                assert r.json()["error"]["kind"] == kind and "--admin-api-key" in r.json()["error"]["message"]
            else:
                assert r.json()["serving"] == "1" and not r.json()["swapped"]
    # one artefact, not a repository: nothing to reload
    app = create_app(Ranker.from_path(export_dir), admin=AdminOptions((ADMIN.encode(),)))
    with BackgroundServer(app) as srv:
        wait_ready(srv.url, timeout_s=120)
        r = httpx.post(f"{srv.url}/admin/reload", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=60)
        assert r.status_code == 409 and r.json()["error"]["kind"] == "not_versioned"
    with pytest.raises(HllmError, match="choose one"):
        AdminOptions((ADMIN.encode(),), allow_without_key=True)


def test_cli_refuses_unsafe_admin_settings(repo, capsys, monkeypatch):
    from hllm.cli import main

    monkeypatch.delenv("HLLM_API_KEYS", raising=False)
    monkeypatch.delenv("HLLM_ADMIN_API_KEYS", raising=False)
    for args, words in ((["--host", "0.0.0.0", "--no-auth", "--allow-admin-without-key"], "loopback --host only"),
                        (["--api-key", KEY, "--admin-api-key", KEY], "both an API key and an admin key"),
                        (["--admin-api-key", "short"], "--admin-api-key")):
        with pytest.raises(SystemExit) as e:
            main(["serve", str(repo), "--port", "1", *args])
        assert e.value.code == 2, args
        err = " ".join(capsys.readouterr().err.split())
        assert words in err and KEY not in err, (args, err)


class _FakeRanker:
    """A ranker whose probe-slate scores and order are given (the version check's failure cases)."""

    def __init__(self, scores: np.ndarray, order: list[int]):
        from types import SimpleNamespace

        self.engine = SimpleNamespace(num_positions=scores.shape[1])
        self.result = SimpleNamespace(scores=[scores], rankings=[SimpleNamespace(order=order)])

    def rank_batch(self, slates):
        return self.result


def test_version_check_rules():
    good = np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32)  # K = 8: the probe slate has 8
    order = list(range(8))[::-1]
    check_version(_FakeRanker(good, order), {"validation": {"atol": 1e-4, "max_abs_diff": 1e-6}})
    for ranker, meta, words in (
            (_FakeRanker(good, order), {"validation": {"atol": 1e-4, "max_abs_diff": 0.5}}, "recorded validation failed"),
            (_FakeRanker(np.where(good > 1, np.nan, good), order), None, "non-finite"),
            (_FakeRanker(good, [0] * 8), None, "not a permutation"),
            (_FakeRanker(good[:3], order), None, "shape")):
        with pytest.raises(VersionRefused, match=words):
            check_version(ranker, meta)


def test_sighup_reloads_hllm_serve(repo, second_export, expected, tmp_path):
    port = free_port()
    log = open(tmp_path / "serve.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "hllm", "serve", str(repo), "--port", str(port), "--log-level", "info"],
                            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    url = f"http://127.0.0.1:{port}"
    try:
        assert wait_ready(url, timeout_s=120)["model_version"] == "1"
        add_version(repo, 2, second_export)
        proc.send_signal(signal.SIGHUP)
        t_end = time.monotonic() + 120
        while httpx.get(f"{url}/v1/models", timeout=10).json()["data"][0]["model_version"] != "2":
            assert time.monotonic() < t_end and proc.poll() is None, (tmp_path / "serve.log").read_text()[-2000:]
            time.sleep(0.05)
        r = httpx.post(f"{url}/v1/rank", json={"slates": [SLATES[1]]}, timeout=60)
        assert check_ranked_by_its_version(r, expected, "tiny-1") == "2"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    text = (tmp_path / "serve.log").read_text()
    assert "SIGHUP: reloading" in text and "model version 2 serving (was 1)" in text
