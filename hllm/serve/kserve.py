"""The Open Inference Protocol (KServe v2 REST) on ``hllm serve``, beside ``POST /v1/rank``.

The model is named like the Triton ensemble ``hllm triton-repo`` writes (``hllm_ranker``) and takes the
same tensors, so one client (``tritonclient.http``, the generated ``client/rank.py``,
:func:`hllm.serve.triton.client.rank_slates`, or a load tool that speaks v2 such as ``perf_analyzer``)
talks to ``hllm serve``, its Ray Serve deployment and Triton alike:

* input ``slates`` ``[B, 1]`` BYTES — one slate JSON object (UTF-8) per row, checked by the runtime's
  :func:`hllm.runtime.slates.validate_slate` (the rules of ``hllm rank`` and ``/v1/rank``);
* outputs ``ranking`` ``[B, K]`` INT64 (candidate index per rank position, -1 past the slate),
  ``scores`` ``[B, K, K]`` FP32 (the score matrix M, rows and columns past the slate are 0) and ``truncated``
  ``[B, K]`` BOOL (candidate text cut to the token budget).

Endpoints: ``GET /v2/health/live``, ``GET /v2/health/ready``, ``GET /v2`` (server metadata),
``GET /v2/models/{name}[/versions/{v}]`` (model metadata), ``GET /v2/models/{name}[/versions/{v}]/ready``,
``GET /v2/models/{name}/config`` (Triton's model-configuration extension, read by ``perf_analyzer``),
``POST /v2/models/{name}[/versions/{v}]/infer``. Request and response tensors are JSON (``data``, flat
or nested row-major) or use the binary tensor data extension (``Inference-Header-Content-Length``; BYTES
elements as a 4-byte little-endian length then the bytes), which ``tritonclient.http`` uses by default.
Errors have the protocol's body ``{"error": "message"}`` (400 bad request, 404 unknown model, 503 not
ready). The request's ``id`` is echoed in the response.

The request envelope is checked against the protocol's schema before anything else (:func:`check_envelope`):
``id`` a string; ``parameters`` (request, input, output) objects whose values are strings, numbers or
booleans; ``inputs`` a list of objects with a string ``name``, a list of integers ``shape`` and a string
``datatype``; ``outputs`` a list of objects with a string ``name``; ``data`` a list, nested at most as deep
as the shape has dimensions. Anything else is a 400 naming the field, never a server error.

Protocol: https://github.com/kserve/open-inference-protocol/blob/main/specification/protocol/inference_rest.md;
binary extension: https://github.com/triton-inference-server/server/blob/main/docs/protocol/extension_binary_data.md
"""

from __future__ import annotations

import json
import struct
import time
from typing import TYPE_CHECKING, Annotated, Any, Optional, Sequence

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import AfterValidator, BaseModel, ConfigDict, StrictInt, StrictStr, ValidationError

from hllm.errors import SlateError
from hllm.runtime.slates import loads_json, validate_slate
from hllm.serve.protocol import ApiError, read_body

if TYPE_CHECKING:
    from hllm.serve.app import RankService

#: The model name (that of the Triton ensemble written by ``hllm triton-repo``) and its one version.
MODEL_NAME = "hllm_ranker"
MODEL_VERSION = "1"
INPUT = "slates"
OUTPUTS = ("ranking", "scores", "truncated")
HEADER_LENGTH = "Inference-Header-Content-Length"
#: v2 datatypes ↔ numpy dtypes (the subset this model uses).
DATATYPES = {"BYTES": np.object_, "INT64": np.int64, "FP32": np.float32, "BOOL": np.bool_}


class KServeError(Exception):
    """An error answered as ``{"error": message}`` with an HTTP status (the protocol's error body) and
    ``headers`` (a 503 carries ``Retry-After``, as on the other routes)."""

    def __init__(self, status: int, message: str, kind: str = "bad_request", headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.headers = status, message, kind, dict(headers or {})

    @classmethod
    def of(cls, e: ApiError) -> KServeError:
        """The protocol's form of an :class:`~hllm.serve.protocol.ApiError`: its status (a 422 is a 400 here),
        message, kind and headers (``Retry-After`` of a 503 kept)."""
        return cls(400 if e.status == 422 else e.status, e.message, e.kind, e.headers)


def _unicode(v: str) -> str:
    """A string that is Unicode text: a JSON escape of a lone surrogate (``"\\ud800"``) parses, but is not."""
    try:
        v.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"holds a lone surrogate {v[e.start]!r} at character {e.start} (not Unicode text)") from None
    return v


def _parameter(v: Any) -> Any:
    """``$parameter``'s value: ``$string | $number | $boolean`` (protocol, "Parameters")."""
    if v is None or isinstance(v, (dict, list)):
        raise ValueError(f"a parameter must be a string, number or boolean, got {_kind(v)}")
    return v


def _kind(v: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(v), "a number" if isinstance(v, (int, float)) else type(v).__name__)


_Text = Annotated[StrictStr, AfterValidator(_unicode)]
_Parameters = Optional[dict[_Text, Annotated[Any, AfterValidator(_parameter)]]]


class _Schema(BaseModel):
    model_config = ConfigDict(extra="allow")  # fields the schema does not name are ignored (extensions)


class RequestInput(_Schema):
    """``$request_input``: name, shape, datatype, optional parameters, data (absent with binary data)."""

    name: _Text
    shape: list[StrictInt]
    datatype: _Text
    parameters: _Parameters = None
    data: Any = None


class RequestOutput(_Schema):
    """``$request_output``: name and optional parameters."""

    name: _Text
    parameters: _Parameters = None


class InferenceRequest(_Schema):
    """``$inference_request``: optional id and parameters, inputs, optional outputs."""

    id: Optional[_Text] = None
    parameters: _Parameters = None
    inputs: list[RequestInput]
    outputs: Optional[list[RequestOutput]] = None


def check_envelope(doc: Any) -> None:
    """Check an inference request's JSON against the protocol's ``$inference_request`` schema (Open Inference
    Protocol, REST, "Inference Request JSON Object", "Parameters") and the binary extension's flags
    (``binary_data_output`` on the request and ``binary_data`` on an output are booleans).

    ``doc``: the parsed JSON header. Raises: KServeError 400 naming the first wrong field, e.g.
    ``inputs[0].parameters: must be an object, got a number``.
    """
    try:
        InferenceRequest.model_validate(doc)
    except ValidationError as e:
        err = e.errors(include_url=False)[0]
        path = "".join(f"[{x}]" if isinstance(x, int) else f".{x}" for x in err["loc"]).lstrip(".")
        what = {"dict_type": "must be an object", "list_type": "must be a list", "string_type": "must be a string",
                "int_type": "must be an integer", "missing": "is required", "model_type": "must be an object"}
        msg = what.get(err["type"], err["msg"].removeprefix("Value error, "))
        got = "" if err["type"] in ("missing", "value_error") else f", got {_kind(err.get('input'))}"
        raise KServeError(400, f"inference request: {path or 'body'}: {msg}{got}") from None
    flags = [("parameters.binary_data_output", (doc.get("parameters") or {}).get("binary_data_output"))]
    flags += [(f"outputs[{i}].parameters.binary_data", (o.get("parameters") or {}).get("binary_data"))
              for i, o in enumerate(doc.get("outputs") or [])]
    for where, flag in flags:
        if flag is not None and not isinstance(flag, bool):
            raise KServeError(400, f"inference request: {where} must be a boolean, got {_kind(flag)}")


def model_metadata(num_positions: int, engine: str, name: str = MODEL_NAME, version: str = MODEL_VERSION) -> dict:
    """``GET /v2/models/{name}``: name, versions (the model's version, :mod:`hllm.serve.models`), platform and
    the input / output tensors (``-1`` = any)."""
    k = int(num_positions)
    return {
        "name": name, "versions": [version], "platform": f"hllm_{engine}",
        "inputs": [{"name": INPUT, "datatype": "BYTES", "shape": [-1, 1]}],
        "outputs": [{"name": "ranking", "datatype": "INT64", "shape": [-1, k]},
                    {"name": "scores", "datatype": "FP32", "shape": [-1, k, k]},
                    {"name": "truncated", "datatype": "BOOL", "shape": [-1, k]}],
    }


def model_config(num_positions: int, max_batch_size: int, name: str = MODEL_NAME) -> dict:
    """``GET /v2/models/{name}/config`` (Triton's model-configuration extension, which ``perf_analyzer``
    reads): the JSON form of the ensemble's ``config.pbtxt`` — batch dimension implicit, dims without it."""
    k = int(num_positions)
    return {
        "name": name, "platform": "ensemble", "max_batch_size": int(max_batch_size),
        "input": [{"name": INPUT, "data_type": "TYPE_STRING", "dims": [1]}],
        "output": [{"name": "ranking", "data_type": "TYPE_INT64", "dims": [-1]},
                   {"name": "scores", "data_type": "TYPE_FP32", "dims": [-1, k]},
                   {"name": "truncated", "data_type": "TYPE_BOOL", "dims": [k]}],
    }


def check_model(name: str, version: str | None = None, names: Sequence[str] = (MODEL_NAME,),
                model_version: str = MODEL_VERSION) -> None:
    """Raises KServeError 404 for a model not in ``names`` or a version other than ``model_version`` and
    :data:`MODEL_VERSION` (1, the Triton repository's version number)."""
    if name not in names or version not in (None, MODEL_VERSION, model_version):
        what = f"{name!r}" + (f" version {version!r}" if version is not None else "")
        raise KServeError(404, f"unknown model {what}: this server has {', '.join(map(repr, names))} "
                          f"version {model_version}", "not_found")


def _bytes_elements(raw: bytes) -> list[bytes]:
    """Split the binary form of a BYTES tensor (4-byte LE length + bytes, per element)."""
    items, i = [], 0
    while i < len(raw):
        if i + 4 > len(raw):
            raise KServeError(400, "BYTES tensor data ends inside an element's length prefix")
        (n,) = struct.unpack_from("<I", raw, i)
        if i + 4 + n > len(raw):
            raise KServeError(400, f"BYTES element {len(items)} declares {n} bytes, past the end of the data")
        items.append(raw[i + 4 : i + 4 + n])
        i += 4 + n
    return items


def _flatten(data: Any, rank: int, where: str) -> list:
    """Row-major flattening of a JSON ``data`` value: a list, flat or nested at most ``rank`` deep (the
    shape's dimensions; protocol, "Tensor Data"). Iterative: no depth reaches the interpreter's stack.

    Raises: KServeError 400 for data that is not a list or is nested deeper than ``rank``.
    """
    if not isinstance(data, list):
        raise KServeError(400, f"{where}: data must be a list (flat or nested row-major), got {_kind(data)}")
    out: list = []
    stack = [iter(data)]
    while stack:
        x = next(stack[-1], stack)  # the stack itself marks an exhausted level
        if x is stack:
            stack.pop()
        elif isinstance(x, list):
            if len(stack) >= rank:
                raise KServeError(400, f"{where}: data is nested deeper than the shape's {rank} dimensions")
            stack.append(iter(x))
        else:
            out.append(x)
    return out


def split_request(body: bytes, header_length: str | None) -> tuple[dict, bytes]:
    """The JSON inference header and the binary tail of a request body.

    Raises: KServeError 400 (bad header length, JSON that is not an object, NaN, nesting too deep, an
    envelope against the protocol's schema: :func:`check_envelope`).
    """
    if header_length is not None:
        try:
            n = int(header_length)
        except ValueError:
            raise KServeError(400, f"bad {HEADER_LENGTH} header {header_length!r}") from None
        if not 0 <= n <= len(body):
            raise KServeError(400, f"{HEADER_LENGTH} {n} is outside the body of {len(body)} bytes")
        head, blob = body[:n], body[n:]
    else:
        head, blob = body, b""
    try:
        doc = loads_json(head.decode("utf-8"), "inference request")
    except (SlateError, UnicodeDecodeError) as e:
        raise KServeError(400, f"inference request header: {e}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("inputs"), list):
        raise KServeError(400, "inference request must be a JSON object with an 'inputs' list")
    check_envelope(doc)
    return doc, blob


def request_slates(doc: dict, blob: bytes, max_slates: int) -> list[dict]:
    """The slates of a v2 inference request: the ``slates`` BYTES input ``[B, 1]``, each element one slate.

    A slate without ``slate_id`` is named by its row index. Raises: KServeError 400 (no ``slates``
    input, another input, wrong datatype or shape, binary data out of range, B over ``max_slates``,
    malformed JSON or slate — the message names the row and field).
    """
    inputs = {t.get("name") if isinstance(t, dict) else None: t for t in doc["inputs"]}
    if set(inputs) != {INPUT}:
        raise KServeError(400, f"inputs must be exactly [{INPUT!r}], got {sorted(map(str, inputs))}")
    t = inputs[INPUT]
    shape = t.get("shape")
    if t.get("datatype") != "BYTES" or not isinstance(shape, list) or len(shape) != 2 or shape[1] != 1 \
            or not all(isinstance(d, int) and not isinstance(d, bool) for d in shape):
        raise KServeError(400, f"input {INPUT!r} must be BYTES of shape [B, 1], got {t.get('datatype')} {shape}")
    if not 1 <= shape[0] <= max_slates:
        raise KServeError(400, f"input {INPUT!r}: batch of {shape[0]} slates, allowed 1..{max_slates}")
    size = (t.get("parameters") or {}).get("binary_data_size")
    if size is not None:
        if not isinstance(size, int) or size < 0 or size > len(blob):
            raise KServeError(400, f"input {INPUT!r}: binary_data_size {size!r} is outside the {len(blob)} bytes sent")
        elements = _bytes_elements(blob[:size])
    else:
        elements = []
        for i, x in enumerate(_flatten(t.get("data"), len(shape), f"input {INPUT!r}")):
            try:
                elements.append(x.encode("utf-8") if isinstance(x, str) else x)
            except UnicodeEncodeError as e:
                raise KServeError(400, f"slates[{i}]: holds a lone surrogate {x[e.start]!r} at character {e.start} "
                                  "(valid JSON escape, but not Unicode text)") from None
    if len(elements) != shape[0]:
        raise KServeError(400, f"input {INPUT!r}: {len(elements)} elements for shape {shape}")
    slates = []
    for i, raw in enumerate(elements):
        where = f"slates[{i}]"
        try:
            if not isinstance(raw, bytes):
                raise SlateError(f"{where}: must be a JSON string, got {type(raw).__name__}")
            slate = validate_slate(loads_json(raw.decode("utf-8", errors="strict"), where), where)
        except (SlateError, UnicodeDecodeError) as e:
            raise KServeError(400, str(e)) from None
        slate.setdefault("slate_id", str(i))
        slates.append(slate)
    return slates


def output_arrays(rankings: Sequence, scores: Sequence[np.ndarray], k: int) -> dict[str, np.ndarray]:
    """The model's outputs for ranked slates: ``ranking [B, K]`` int64 (-1 padded), ``scores [B, K, K]``
    float32 (real rows of each score matrix, zeros below; the server passes the matrices of
    :func:`hllm.serve.protocol.assignment_blocks`, zero past the slate's columns too), ``truncated [B, K]`` bool; K
    becomes the longest slate's N when a slate was ranked in blocks (:mod:`hllm.runtime.blocks`).

    ``rankings``: :class:`hllm.runtime.ranker.Ranking` per slate; ``scores``: ``[n_b, K]`` per slate.
    """
    b = len(rankings)
    width = max([k] + [len(r.order) for r in rankings])  # a slate ranked in blocks is longer than K
    ranking = np.full((b, width), -1, dtype=np.int64)
    matrix = np.zeros((b, width, k), dtype=np.float32)
    truncated = np.zeros((b, width), dtype=np.bool_)
    for i, (r, m) in enumerate(zip(rankings, scores)):
        ranking[i, : len(r.order)] = r.order
        matrix[i, : m.shape[0]] = m
        truncated[i, list(r.truncated)] = True
    return {"ranking": ranking, "scores": matrix, "truncated": truncated}


def _tensor_bytes(a: np.ndarray) -> bytes:
    if a.dtype == np.object_:
        return b"".join(struct.pack("<I", len(x)) + x for x in a.reshape(-1))
    return np.ascontiguousarray(a).tobytes()


def response_body(doc: dict, outputs: dict[str, np.ndarray], request_id: str, model_name: str = MODEL_NAME,
                  model_version: str = MODEL_VERSION) -> tuple[bytes, dict]:
    """Encode an inference response → (body, headers): the requested outputs (all by default), each
    binary when asked (per output ``parameters.binary_data`` or request ``binary_data_output``).

    Raises: KServeError 400 for an unknown requested output.
    """
    wanted = doc.get("outputs") or [{"name": n} for n in OUTPUTS]
    default_binary = (doc.get("parameters") or {}).get("binary_data_output", False)  # a bool: check_envelope
    meta, blobs = [], []
    for w in wanted:
        name = w.get("name") if isinstance(w, dict) else None
        if name not in outputs:
            raise KServeError(400, f"unknown output {name!r} (outputs: {', '.join(OUTPUTS)})")
        a = outputs[name]
        dtype = next(k for k, v in DATATYPES.items() if np.dtype(v) == a.dtype)
        o = {"name": name, "datatype": dtype, "shape": list(a.shape)}
        if (w.get("parameters") or {}).get("binary_data", default_binary):
            raw = _tensor_bytes(a)
            o["parameters"] = {"binary_data_size": len(raw)}
            blobs.append(raw)
        else:
            o["data"] = a.reshape(-1).tolist()
        meta.append(o)
    head = json.dumps({"model_name": model_name, "model_version": model_version, "id": request_id,
                       "outputs": meta}, separators=(",", ":"), allow_nan=False).encode()  # strict JSON
    if not blobs:
        return head, {"content-type": "application/json"}
    return head + b"".join(blobs), {"content-type": "application/octet-stream", HEADER_LENGTH: str(len(head))}


# -- the endpoints on `hllm serve` ----------------------------------------------------------------------

def add_kserve_routes(app: FastAPI, service: RankService) -> None:
    """Register the Open Inference Protocol (KServe v2) endpoints of :mod:`hllm.serve.kserve` on ``app``."""
    app.add_exception_handler(KServeError, service.kserve_error)
    tags = ["Open Inference Protocol (KServe v2)"]
    app.get("/v2/health/live", tags=tags, summary="The server is alive")(service.v2_live)
    app.get("/v2/health/ready", tags=tags, summary="The model is ready")(service.v2_ready)
    app.get("/v2", tags=tags, summary="Server metadata")(service.v2_server)
    for base in ("/v2/models/{model_name}", "/v2/models/{model_name}/versions/{model_version}"):
        app.get(base, tags=tags, summary="Model metadata")(service.v2_model)
        app.get(base + "/ready", tags=tags, summary="The model is ready")(service.v2_model_ready)
        app.get(base + "/config", tags=tags, summary="Model configuration (Triton extension)")(service.v2_model_config)
        app.post(base + "/infer", tags=tags, summary="Rank slates (BYTES input 'slates' [B, 1])")(service.v2_infer)


class KServeEndpoints:
    """The Open Inference Protocol endpoints (mixed into :class:`hllm.serve.app.RankService`, whose ``state``,
    ``batcher``, ``metrics``, ``ranker``, ``options`` and ``submit`` they use)."""

    async def kserve_error(self, request: Request, e: KServeError):
        self.metrics.error(e.kind)
        return JSONResponse({"error": e.message}, status_code=e.status, headers=e.headers)

    def _v2_check_ready(self) -> None:
        if not self.state.ready or self.state.draining or self.batcher.closing:
            raise KServeError(503, f"model {self.state.model.name} is not ready", "not_ready", {"Retry-After": "1"})

    async def v2_live(self):
        return Response(status_code=200)

    async def v2_ready(self):
        self._v2_check_ready()
        return Response(status_code=200)

    async def v2_server(self):
        import hllm

        return {"name": "hllm", "version": hllm.__version__, "extensions": ["binary_tensor_data"]}

    def _check_model(self, name: str, version: str | None) -> None:
        served = self.state.model
        check_model(name, version, served.names, served.version)
        if self.state.versions is not None and version not in (None, served.version):  # a versioned repository
            raise KServeError(404, f"model {name!r} version {version!r} is not served: version {served.version} is",
                              "not_found")

    async def v2_model(self, model_name: str, model_version: str | None = None):
        self._check_model(model_name, model_version)
        return model_metadata(self.ranker.engine.num_positions, self.ranker.engine.name, model_name, self.state.model.version)

    async def v2_model_config(self, model_name: str, model_version: str | None = None):
        self._check_model(model_name, model_version)
        return model_config(self.ranker.engine.num_positions, self.options.max_slates_per_request, model_name)

    async def v2_model_ready(self, model_name: str, model_version: str | None = None):
        self._check_model(model_name, model_version)
        self._v2_check_ready()
        return Response(status_code=200)

    async def v2_infer(self, request: Request, model_name: str, model_version: str | None = None):
        """``POST /v2/models/{name}/infer``: the slates of the BYTES input → ranking, scores, truncated."""
        t0 = time.perf_counter()
        self._check_model(model_name, model_version)
        self._v2_check_ready()
        try:
            body = await read_body(request, self.options.max_body_bytes, self.options.body_timeout_s)
        except ApiError as e:
            raise KServeError.of(e) from None
        doc, blob = split_request(body, request.headers.get(HEADER_LENGTH.lower()))
        slates = request_slates(doc, blob, self.options.max_slates_per_request)
        try:
            res, _ = await self.submit(slates, None, t0)
        except ApiError as e:
            raise KServeError.of(e) from None
        outputs = output_arrays(res.rankings, res.scores, res.ranker.engine.num_positions)
        rid = doc.get("id") if isinstance(doc.get("id"), str) else request.state.request_id
        body, headers = response_body(doc, outputs, rid, model_name, res.model.version)
        return Response(body, headers=headers)
