"""The HTTP side of the serving endpoints that is not one endpoint's: errors answered with the JSON envelope
``{"error": {"kind", "message", "id"}}`` (:class:`ApiError`), request bodies read under a size limit and a
deadline (:func:`read_body`), the ``POST /v1/rank`` body parsed and checked (:func:`parse_rank_body`), slates
encoded once at admission, request ids and the ``path`` label of the metrics. Used by :mod:`hllm.serve.app`,
:mod:`hllm.serve.rerank` and :mod:`hllm.serve.kserve`.
"""

from __future__ import annotations

import asyncio
import math
import re
import uuid
from typing import Any

import numpy as np
from fastapi import Request
from fastapi.responses import JSONResponse

from hllm.errors import SlateError
from hllm.runtime.blocks import TooManyDocuments
from hllm.runtime.slates import loads_json, validate_slate
from hllm.serve.schemas import ErrorResponse

JSONL_TYPES = ("application/x-ndjson", "application/jsonl", "application/x-jsonlines", "application/jsonlines")
JSON_TYPES = ("application/json", "")


class ApiError(Exception):
    """An error answered as ``{"error": {"kind", "message", "id"}}`` with an HTTP status."""

    def __init__(self, status: int, kind: str, message: str, headers: dict | None = None, error_id: str | None = None):
        super().__init__(message)
        self.status, self.kind, self.message, self.headers, self.error_id = status, kind, message, headers, error_id


def parse_rank_body(body: bytes, content_type: str, max_slates: int) -> tuple[list[dict], float | None]:
    """Parse and check a ``POST /v1/rank`` body → (slates, deadline_ms or None).

    JSON goes through :func:`hllm.runtime.slates.loads_json` and every slate through
    :func:`hllm.runtime.slates.validate_slate` (the one parser and validator of ``hllm rank``).
    A slate without ``slate_id`` is given its 0-based index in the request as id (so its ranking is
    named the same whichever micro-batch it rides in).
    Raises: ApiError 400 (malformed JSON, NaN/Infinity literals, nesting too deep, not UTF-8), 415
    (content type), 413 (too many slates), 422 (wrong types, no slates, a malformed slate, a
    ``deadline_ms`` that is not a finite positive number — the message names the slate and field).
    """
    ctype = content_type.split(";")[0].strip().lower()
    if ctype not in JSONL_TYPES and ctype not in JSON_TYPES:
        raise ApiError(415, "unsupported_media_type", f"content type {ctype!r} not supported (use application/json or application/x-ndjson)")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ApiError(400, "bad_json", f"body is not UTF-8 ({e.reason} at byte {e.start})") from None
    deadline = None
    try:
        if ctype in JSONL_TYPES:
            # Lines end at "\n" only (JSON Lines; `hllm rank` reads the same way): str.splitlines() would also
            # split at U+2028, U+0085 and other characters that a JSON string may hold unescaped.
            lines = (line.removesuffix("\r") for line in text.split("\n"))
            items = [loads_json(line, f"line {n}") for n, line in enumerate(lines, 1) if line.strip()]
            where = "JSONL slate {}"
        else:
            items, deadline = _json_items(loads_json(text, "body"))
            where = "slates[{}]"
    except SlateError as e:
        raise ApiError(400, "bad_json", str(e)) from None
    if not items:
        raise ApiError(422, "bad_request", "no slates in the request")
    if len(items) > max_slates:
        raise ApiError(413, "too_large", f"{len(items)} slates in one request, over the limit of {max_slates}")
    slates = []
    for i, obj in enumerate(items):
        try:
            slate = validate_slate(obj, where.format(i + 1 if ctype in JSONL_TYPES else i))
        except SlateError as e:
            raise ApiError(422, "bad_slate", str(e)) from None
        slate.setdefault("slate_id", str(i))  # no id: its index in this request (not in the engine batch)
        slates.append(slate)
    return slates, deadline


def _json_items(doc: Any) -> tuple[list, float | None]:
    """The slates and deadline of a JSON body: ``{"slates": [...], "deadline_ms"}``, one slate object or a list."""
    if isinstance(doc, dict) and "slates" in doc:
        items = doc["slates"]
        if not isinstance(items, list):
            raise ApiError(422, "bad_request", f"'slates' must be a list of slate objects, got {type(items).__name__}")
        unknown = set(doc) - {"slates", "deadline_ms"}
        if unknown:
            raise ApiError(422, "bad_request", f"unknown fields {sorted(unknown)} (allowed: slates, deadline_ms)")
        deadline = doc.get("deadline_ms")
        if deadline is not None and (isinstance(deadline, bool) or not isinstance(deadline, (int, float))
                                     or not math.isfinite(deadline) or deadline <= 0):
            raise ApiError(422, "bad_request", f"'deadline_ms' must be a finite positive number, got {deadline!r}")
        return items, deadline
    if isinstance(doc, dict):
        return [doc], None
    if isinstance(doc, list):
        return doc, None
    raise ApiError(422, "bad_request",
                   f"body must be {{\"slates\": [...]}}, one slate object or a list of slates, got {type(doc).__name__}")


async def read_body(request: Request, limit: int, timeout_s: float | None = None) -> bytes:
    """The request body, refusing (413) one over ``limit`` bytes by Content-Length or while streaming,
    and (408) one not fully received within ``timeout_s`` (a client dribbling its body)."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            n = int(declared)
        except ValueError:
            raise ApiError(400, "bad_request", f"bad Content-Length header {declared!r}") from None
        if n > limit:
            raise ApiError(413, "too_large", f"body of {n} bytes is over the limit of {limit} bytes")

    async def _read() -> bytes:
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise ApiError(413, "too_large", f"body is over the limit of {limit} bytes")
            chunks.append(chunk)
        return b"".join(chunks)

    try:
        return await asyncio.wait_for(_read(), timeout_s)
    except asyncio.TimeoutError:
        raise ApiError(408, "timeout", f"request body not received within {timeout_s:g} s",
                       {"Connection": "close"}) from None


def encode_slates(ranker, slates: list[dict]) -> list:
    """Encode each slate once with :meth:`hllm.runtime.Ranker.encode` (a slate longer than K or ``max_seq_len``
    is planned in blocks, :mod:`hllm.runtime.blocks`); the rows go to the batcher, so no slate is tokenized
    twice. Raises: ApiError 400 (over ``max_documents``, naming the limit), 422 (empty, a candidate that
    tokenizes to nothing, one candidate over ``max_seq_len``)."""
    rows = []
    for i, s in enumerate(slates):
        try:
            rows.append(ranker.encode(s))
        except TooManyDocuments as e:
            raise ApiError(400, "too_many_documents", f"slates[{i}]: {e}") from None
        except SlateError as e:
            raise ApiError(422, "bad_slate", f"slates[{i}]: {e}") from None
    return rows


def assignment_blocks(matrices: list, rankings: list) -> list[np.ndarray]:
    """The one rule for scores on every route: only a slate's own assignment block matters.

    A slate of n candidates is decoded on ``M[:n, :n]`` (:func:`hllm.runtime.decode.decode`); the columns
    past n (rank positions the slate does not have) are used by nothing, so they are returned as 0 — a
    non-finite value there never reaches a response (JSON has no ``Infinity`` / ``NaN``). A non-finite
    value inside the block is refused by the decoder (the batch fails: 500 ``decode``); it is checked
    again here so that no route can emit one.

    Args: matrices: per slate its score matrix ``[n, K]`` (``JobResult.scores``); rankings: the slates'
        :class:`hllm.runtime.ranker.Ranking` (for the slate id in the error).
    Returns: per slate a float32 ``[n, K]`` copy with columns ``n..K-1`` zero.
    Raises: ApiError 500 ``decode`` naming the slate when its block holds a non-finite value.
    """
    out = []
    for m, r in zip(matrices, rankings):
        m = np.asarray(m, dtype=np.float32)
        n = m.shape[0]
        bad = int(np.count_nonzero(~np.isfinite(m[:, :n])))
        if bad:
            raise ApiError(500, "decode", f"slate {r.slate_id}: score matrix has {bad} non-finite value(s) in its "
                           f"{n}x{n} assignment block; refusing to rank", error_id=uuid.uuid4().hex[:12])
        block = np.zeros_like(m)
        block[:, :n] = m[:, :n]
        out.append(block)
    return out


#: ``error.kind`` of the HTTP errors raised by routing.
HTTP_KINDS = {404: "not_found", 405: "method_not_allowed"}


def error_response(e: ApiError) -> JSONResponse:
    """The JSON response of ``e``: the error envelope with its status and headers."""
    return JSONResponse({"error": {"kind": e.kind, "message": e.message, "id": e.error_id}}, status_code=e.status, headers=e.headers)


#: The error responses of a ranking endpoint, for its OpenAPI ``responses``.
ERROR_RESPONSES = {
    400: {"model": ErrorResponse, "description": "Malformed JSON (NaN, nesting too deep) or body not UTF-8."},
    408: {"model": ErrorResponse, "description": "The body was not received within the server's body timeout."},
    413: {"model": ErrorResponse, "description": "Body or slate count over the server's limits."},
    415: {"model": ErrorResponse, "description": "Content type is neither JSON nor JSONL."},
    422: {"model": ErrorResponse, "description": "Wrong types, empty slate, more candidates than K, prompt over max_seq_len."},
    500: {"model": ErrorResponse, "description": "The engine batch failed or an unexpected error; `error.id` is in the server log."},
    503: {"model": ErrorResponse, "description": "Not ready, draining, or queue full (with Retry-After)."},
    504: {"model": ErrorResponse, "description": "The request's deadline passed."},
}


_REQUEST_ID = re.compile(r"[!-~]{1,128}")  # printable ASCII, no spaces


def request_id(header: str | None) -> str:
    """The request's id: the client's ``X-Request-ID`` when it is 1..128 printable ASCII characters
    without spaces, else a new 12-hex-digit id."""
    return header if header is not None and _REQUEST_ID.fullmatch(header) else uuid.uuid4().hex[:12]


#: Paths counted and timed under their own label (others: ``/v2/...`` routes by kind, the rest ``other``).
METRIC_PATHS = ("/v1/rank", "/v1/rerank", "/v2/rerank", "/rerank", "/healthz", "/readyz", "/metrics")


def metric_path(path: str) -> str:
    """The ``path`` label of a request path: a known path, ``/v2/infer``, ``/v2/health``, ``/v2/models`` or ``other``."""
    if path in METRIC_PATHS:
        return path
    if path.startswith("/v2/"):
        return "/v2/infer" if path.endswith("/infer") else "/v2/health" if path.startswith("/v2/health") else "/v2/models"
    return "other"
