"""Protocol input the server must refuse with a 4xx (the Open Inference Protocol's request schema) or accept
(JSON Lines whose strings hold line-separator characters) — never a 500 (docs/hardening.md, "Libraries and
protocol input")."""

from __future__ import annotations

import json

import pytest

for _mod in ("fastapi", "uvicorn", "httpx", "prometheus_client"):
    pytest.importorskip(_mod, reason="the serve extra is not installed (pip install -e .[serve])")

import httpx  # noqa: E402

from hllm.runtime import Ranker  # noqa: E402
from hllm.serve.app import ServeOptions, create_app  # noqa: E402
from hllm.serve.server import BackgroundServer, wait_ready  # noqa: E402
from hllm.testing import tiny_slates  # noqa: E402

INFER = "/v2/models/hllm_ranker/infer"


@pytest.fixture(scope="module")
def server(export_dir):
    app = create_app(Ranker.from_path(export_dir), ServeOptions(max_slates_per_request=8))
    with BackgroundServer(app) as srv:
        wait_ready(srv.url, timeout_s=120)
        yield srv


SLATE = json.dumps(tiny_slates(1, 3, seed=9)[0])


def _input(**kw) -> dict:
    return {"name": "slates", "datatype": "BYTES", "shape": [1, 1], "data": [SLATE], **kw}


def _nested(depth: int) -> list:
    data: list = [SLATE]
    for _ in range(depth - 1):
        data = [data]
    return data


# case → (request body: a JSON-able object or the raw JSON text, words the error message must hold)
BAD_ENVELOPES = {
    "input_parameters_number": ({"inputs": [_input(parameters=5)]}, ["inputs[0].parameters: must be an object, got a number"]),
    "input_parameters_list": ({"inputs": [_input(parameters=[1])]}, ["inputs[0].parameters: must be an object, got a list"]),
    "request_parameters_string": ({"inputs": [_input()], "parameters": "x"}, ["parameters: must be an object, got a string"]),
    "request_parameters_list": ({"inputs": [_input()], "parameters": []}, ["parameters: must be an object, got a list"]),
    "parameter_value_object": ({"inputs": [_input()], "parameters": {"p": {"a": 1}}},
                               ["parameters.p: a parameter must be a string, number or boolean, got an object"]),
    "binary_data_output_not_boolean": ({"inputs": [_input()], "parameters": {"binary_data_output": "yes"}},
                                       ["parameters.binary_data_output must be a boolean, got a string"]),
    "outputs_number": ({"inputs": [_input()], "outputs": 5}, ["outputs: must be a list, got a number"]),
    "output_not_an_object": ({"inputs": [_input()], "outputs": ["ranking"]}, ["outputs[0]: must be an object, got a string"]),
    "output_without_name": ({"inputs": [_input()], "outputs": [{}]}, ["outputs[0].name: is required"]),
    "output_parameters_number": ({"inputs": [_input()], "outputs": [{"name": "ranking", "parameters": 5}]},
                                 ["outputs[0].parameters: must be an object, got a number"]),
    "output_binary_data_number": ({"inputs": [_input()], "outputs": [{"name": "ranking", "parameters": {"binary_data": 1}}]},
                                  ["outputs[0].parameters.binary_data must be a boolean, got a number"]),
    "id_number": ({"id": 7, "inputs": [_input()]}, ["id: must be a string, got a number"]),
    "id_lone_surrogate": ('{"id": "\\ud800", "inputs": []}', ["id: holds a lone surrogate"]),
    "input_name_number": ({"inputs": [_input(name=1)]}, ["inputs[0].name: must be a string, got a number"]),
    "shape_holds_a_string": ({"inputs": [_input(shape=[1, "1"])]}, ["inputs[0].shape[1]: must be an integer, got a string"]),
    "data_nested_900_deep": ({"inputs": [_input(data=_nested(900))]}, ["data is nested deeper than the shape's 2 dimensions"]),
    "data_a_string": ({"inputs": [_input(data=SLATE)]}, ["data must be a list", "got a string"]),
    "data_missing": ({"inputs": [{"name": "slates", "datatype": "BYTES", "shape": [1, 1]}]}, ["data must be a list", "got null"]),
    "bytes_element_lone_surrogate": ('{"inputs": [{"name": "slates", "datatype": "BYTES", "shape": [1, 1], "data": ["\\ud800"]}]}',
                                     ["slates[0]: holds a lone surrogate", "not Unicode text"]),
}


@pytest.mark.parametrize("case", sorted(BAD_ENVELOPES))
def test_bad_inference_envelope_is_400_with_the_protocol_error_body(server, case):
    body, words = BAD_ENVELOPES[case]
    content = body if isinstance(body, str) else json.dumps(body)
    r = httpx.post(server.url + INFER, content=content, headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code == 400, r.text
    assert r.headers["content-type"].startswith("application/json")
    doc = r.json()
    assert set(doc) == {"error"} and isinstance(doc["error"], str), doc  # the protocol's $inference_error_response
    for w in words:
        assert w in doc["error"], (w, doc["error"])


def test_valid_envelopes_with_parameters_and_nested_data_rank(server):
    """What the schema allows still works: scalar parameters, nested row-major data, extra fields."""
    body = {"id": "ok-1", "parameters": {"binary_data_output": False, "priority": 2, "tag": "x"},
            "inputs": [_input(shape=[2, 1], data=[[SLATE], [SLATE]], parameters={"note": 1.5})],
            "outputs": [{"name": "ranking", "parameters": {"binary_data": False}}], "extension_field": None}
    r = httpx.post(server.url + INFER, json=body, timeout=60)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["id"] == "ok-1" and [o["name"] for o in out["outputs"]] == ["ranking"]
    assert out["outputs"][0]["shape"] == [2, 8]
    rows = out["outputs"][0]["data"]
    assert rows[:8] == rows[8:] and sorted(rows[:3]) == [0, 1, 2]


@pytest.mark.parametrize("separator", ["\u2028", "\u0085", "\u2029"])
def test_ndjson_titles_holding_line_separators_are_ranked(server, separator):
    """JSON Lines end at "\\n" only: a title holding U+2028, U+0085 (NEL) or U+2029 unescaped (JSON escapes
    only the controls below U+0020) is one line, though str.splitlines() splits there; "\\r\\n" ends are fine."""
    slates = tiny_slates(2, 3, seed=4)
    slates[0]["candidates"][1]["title"] = f"before{separator}after"
    body = "\r\n".join(json.dumps(s, ensure_ascii=False) for s in slates) + "\r\n"
    r = httpx.post(server.url + "/v1/rank", content=body.encode("utf-8"),
                   headers={"content-type": "application/x-ndjson"}, timeout=60)
    assert r.status_code == 200, r.text
    got = r.json()["rankings"]
    assert [g["slate_id"] for g in got] == [s["slate_id"] for s in slates]
    assert all(sorted(g["order"]) == [0, 1, 2] for g in got)
