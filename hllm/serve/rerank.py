"""The Cohere / Jina reranking API on ``hllm serve``: ``POST /v1/rerank``, ``POST /v2/rerank`` and ``POST /rerank``.

The request and response shape every reranking client speaks (Cohere's v1 and v2 rerank,
https://docs.cohere.com/reference/rerank; Jina's, https://jina.ai/reranker/; vLLM's ``/rerank``, which
"conforms to the JinaAI rerank API")::

    {"model": "hllm_ranker", "query": str, "documents": [str | {"text": str}, ...],
     "top_n": int?, "return_documents": bool?, "max_tokens_per_doc": int?,
     "history": [str]?, "deadline_ms": float?}                              # the last two: hllm extensions
    → {"id", "model", "results": [{"index", "relevance_score", "document"?: {"text"}}, ...],
       "usage": {"prompt_tokens", "total_tokens"}, "meta": {...}, "timing": {...}}

One request is ONE slate: the whole list is scored in one prefill pass (a list longer than K: in blocks) and
decoded by LAPJV (paper §3.4),
riding the micro-batcher, deadlines, metrics (``path`` label ``/v1/rerank`` / ``/v2/rerank``) and error
envelope of ``/v1/rank``. The mapping (also in ``docs/serving.md``):

* ``query`` → the user context: a one-element ``history`` ``[query]`` rendered by the artefact's prompt spec
  (``user_template`` / ``history_item_template``). A query that does not fit the spec's
  ``history_token_budget`` (it would be dropped whole by the prompt builder) or is longer than
  ``history_token_budget ×`` :data:`hllm.runtime.prompt.CHARS_PER_TOKEN_CEILING` characters → 400.
* ``history`` (hllm extension): when present it IS the user context, as ``/v1/rank`` takes it (oldest
  first, the oldest items dropped to fit the budget); ``query`` is then still required and checked
  but not put in the prompt (precedence: ``history`` over ``query``).
* ``documents`` → the candidates in request order (``index`` in the results refers to it); strings or
  objects with a string ``text`` (other keys ignored). More than K (the head's rank positions), or a prompt
  over ``max_seq_len``: ranked in B blocks + a final pass (:mod:`hllm.runtime.blocks`), said in
  ``meta.warnings``; more than ``max_documents`` (default 1000) → 400 naming the limit.
* ``top_n`` → the first ``top_n`` of the FULL permutation (absent or null: all; over the count: all).
* ``return_documents``: default true on ``/v1/rerank`` and ``/rerank`` (Jina), false on ``/v2/rerank``
  (Cohere v2, whose clients send no such field).
* ``max_tokens_per_doc`` → the candidate token budget ``min(max_tokens_per_doc, candidate_token_budget)``
  (a document is cut to it, never dropped; the cut documents are listed in ``meta.warnings``).
* ``model``: absent or one of the served names (``--served-model-name``, default :data:`SERVED_MODEL`,
  :mod:`hllm.serve.models`) is accepted, another name → 404; the response's ``model`` is the name asked for
  (the first served name when absent) and ``model_version`` the model's version.
* Fields clients send that have no meaning here are accepted and ignored: ``priority`` (Cohere v2),
  ``max_chunks_per_doc`` (Cohere v1), ``rank_fields`` when it is ``["text"]``. Any other field → 400.

``relevance_score``: :func:`relevance_scores` — the Sinkhorn relaxation of the score matrix (paper §3.3)
read as a soft rank, made non-increasing along the returned LAPJV order by isotonic regression (a list ranked
in blocks: :attr:`hllm.runtime.blocks.BlockRanking.relevance`, the same quantity over the whole list).
``meta.billed_units.search_units`` = ⌈N / 100⌉ (Cohere bills a search unit per 100 documents).

Every bad request → 400 (413 body too large, 415 content type, 404 model) with the ``{"error": {"kind",
"message", "id"}}`` envelope of :mod:`hllm.serve.app`; the Cohere SDKs raise ``BadRequestError`` etc. on them.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Optional, Union

import numpy as np
from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool

from hllm.errors import SlateError
from hllm.runtime import blocks
from hllm.runtime.decode import SINKHORN_ITERS, SINKHORN_TAU, relevance_scores  # noqa: F401 (re-exported)
from hllm.runtime.prompt import CHARS_PER_TOKEN_CEILING, PromptBuilder
from hllm.runtime.slates import text_field, loads_json
from hllm.serve.protocol import ERROR_RESPONSES, JSON_TYPES, ApiError, read_body

#: The model name a request may give (that of the Open Inference Protocol model, :data:`hllm.serve.kserve.MODEL_NAME`).
SERVED_MODEL = "hllm_ranker"
#: The routes and whether each returns documents by default (Jina: yes; Cohere v2: no).
ROUTES = {"/v1/rerank": True, "/v2/rerank": False, "/rerank": True}
#: Fields a client may send that are accepted and ignored.
IGNORED_FIELDS = ("priority", "max_chunks_per_doc", "rank_fields")
#: The longest ``deadline_ms`` a request may ask for (one day, the bound of ``hllm serve --deadline-ms``).
MAX_DEADLINE_MS = 86_400_000
FIELDS = ("model", "query", "documents", "top_n", "return_documents", "max_tokens_per_doc", "history", "deadline_ms")


class RerankDocument(BaseModel):
    """A document as an object (``{"text": str}``); other keys are ignored."""

    text: str


class RerankRequest(BaseModel):
    """``POST /v1/rerank`` / ``/v2/rerank`` body (Cohere / Jina shape; the rules are in this module's docstring)."""

    model: Optional[str] = Field(None, description=f"Absent or a served name (default {SERVED_MODEL!r}); another name → 404.")
    query: str = Field(..., description="The user context: rendered as a one-element history by the artefact's prompt spec.")
    documents: list[Union[str, dict]] = Field(..., min_length=1, description="1..max_documents (1000) strings or {\"text\": str} objects; more than K are ranked in blocks.")
    top_n: Optional[int] = Field(None, ge=1, description="Return the first top_n of the full ranking (default: all).")
    return_documents: Optional[bool] = Field(None, description="Each result carries document.text (default: true on "
                                             "/v1/rerank and /rerank, false on /v2/rerank).")
    max_tokens_per_doc: Optional[int] = Field(None, ge=1, description="Candidate token budget, capped by the artefact's.")
    history: Optional[list[str]] = Field(None, description="hllm extension: the user context as /v1/rank takes it "
                                         "(oldest first); when given, query is not put in the prompt.")
    deadline_ms: Optional[float] = Field(None, gt=0, description="hllm extension: per-request deadline (ms).")


class RerankResult(BaseModel):
    """One result: the document's index in the request, its score, and (``return_documents``) its text."""

    index: int = Field(..., description="Index of the document in the request.")
    relevance_score: float = Field(..., description="In [0, 1], non-increasing along results (see relevance_scores).")
    document: Optional[RerankDocument] = None


class RerankUsage(BaseModel):
    """Token counts of the request (the engine generates nothing, so total = prompt)."""

    prompt_tokens: int = Field(..., description="Tokens of the prompt the engine ran (user context + every document).")
    total_tokens: int


class RerankResponse(BaseModel):
    """The response of the rerank routes (Cohere's and Jina's fields, plus hllm's ``timing``)."""

    id: str = Field(..., description="The request id (X-Request-ID).")
    model: str
    model_version: str = Field(..., description="hllm extension: the served model's version (hllm.serve.models).")
    results: list[RerankResult] = Field(..., description="Best first.")
    usage: RerankUsage
    meta: dict = Field(..., description="Cohere's meta: api_version, billed_units, tokens, warnings (cut texts).")
    timing: dict = Field(..., description="hllm extension: the timing of /v1/rank (ms).")


@dataclasses.dataclass(frozen=True)
class RerankQuery:
    """A checked rerank request: the slate to rank and how to answer.

    Attributes:
        slate: ``{"slate_id", "history", "candidates": [{"title"}]}`` (candidate i = document i).
        top_n: results to return (1..n). return_documents: include ``document.text``.
        token_budget: candidate token budget (≤ the artefact's). deadline_ms: None = the server's.
        from_query: the user context is the query (so a dropped context is an error, not a warning).
    """

    slate: dict
    top_n: int
    return_documents: bool
    token_budget: int
    deadline_ms: Optional[float]
    from_query: bool
    model: Optional[str] = None


def _fail(message: str, kind: str = "bad_request", status: int = 400):
    raise ApiError(status, kind, message)


def _int(v: Any, name: str) -> Optional[int]:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        _fail(f"'{name}' must be an integer, got {type(v).__name__} {v!r}"[:300])
    if v < 1:
        _fail(f"'{name}' must be ≥ 1, got {v}")
    return v


def _string(v: Any, where: str) -> str:
    """A string field, by the slate validator's rule for text (:mod:`hllm.runtime.slates`: a string, no lone
    surrogate); ApiError 400 naming the field otherwise."""
    try:
        return text_field(v, "request", where)
    except SlateError as e:
        _fail(str(e).removeprefix("request: "))


def _document(d: Any, i: int) -> str:
    if isinstance(d, dict):
        if "text" not in d:
            _fail(f"documents[{i}] is an object without 'text' (send a string or {{\"text\": str}})")
        return _string(d["text"], f"documents[{i}].text")
    return _string(d, f"documents[{i}]")


def parse_rerank_body(body: bytes, content_type: str, route: str, k: int, spec,
                      names: tuple[str, ...] = (SERVED_MODEL,), max_documents: int = blocks.MAX_DOCUMENTS) -> RerankQuery:
    """Parse and check a rerank body → :class:`RerankQuery` (the rules are this module's docstring).

    Args:
        body: the raw request body. content_type: its Content-Type header. route: a key of :data:`ROUTES`.
        k: the head's rank positions K. spec: the artefact's :class:`hllm.formats.prompt.PromptSpec`.
        names: the served model names a ``model`` field may give.
        max_documents: the most documents of one request.
    Raises: ApiError 415 (content type), 404 (another model), 400 (not UTF-8, malformed JSON, unknown or
        mistyped field, no documents, more documents than ``max_documents``, top_n or max_tokens_per_doc < 1, a query over
        the character limit) — every message names the field.
    """
    ctype = content_type.split(";")[0].strip().lower()
    if ctype not in JSON_TYPES:
        _fail(f"content type {ctype!r} not supported (use application/json)", "unsupported_media_type", 415)
    try:
        doc = loads_json(body.decode("utf-8"), "body")
    except UnicodeDecodeError as e:
        _fail(f"body is not UTF-8 ({e.reason} at byte {e.start})", "bad_json")
    except SlateError as e:
        _fail(str(e), "bad_json")
    if not isinstance(doc, dict):
        _fail(f"body must be a JSON object with 'query' and 'documents', got {type(doc).__name__}")
    unknown = set(doc) - set(FIELDS) - set(IGNORED_FIELDS)
    if unknown:
        _fail(f"unknown fields {sorted(unknown)} (allowed: {', '.join(FIELDS + IGNORED_FIELDS)})")
    model = doc.get("model")
    if model is not None and not isinstance(model, str):
        _fail(f"'model' must be a string, got {type(model).__name__}")
    if model is not None and model not in names:
        _fail(f"model {str(model)[:200]!r} is not served here; this server serves "
              f"{', '.join(map(repr, names))}", "not_found", 404)
    rank_fields = doc.get("rank_fields")
    if rank_fields not in (None, ["text"]):
        _fail(f"'rank_fields' must be absent or [\"text\"], got {str(rank_fields)[:200]}")
    if "query" not in doc:
        _fail("'query' is required (a string)")
    query = _string(doc["query"], "'query'")
    docs = doc.get("documents")
    if not isinstance(docs, list):
        _fail(f"'documents' must be a list of strings or {{\"text\": str}} objects, got "
              f"{'nothing' if docs is None else type(docs).__name__}")
    if not docs:
        _fail("'documents' is empty: give 1..max_documents documents")
    if len(docs) > max_documents:
        _fail(f"{len(docs)} documents, over the limit of {max_documents} documents per request (max_documents; "
              f"lists longer than K={k} are ranked in blocks)", "too_many_documents")
    texts = [_document(d, i) for i, d in enumerate(docs)]
    top_n = _int(doc.get("top_n"), "top_n")
    budget = _int(doc.get("max_tokens_per_doc"), "max_tokens_per_doc")
    ret = doc.get("return_documents")
    if ret is not None and not isinstance(ret, bool):
        _fail(f"'return_documents' must be true or false, got {type(ret).__name__}")
    deadline = doc.get("deadline_ms")
    if deadline is not None and (isinstance(deadline, bool) or not isinstance(deadline, (int, float))
                                 or not 0 < deadline <= MAX_DEADLINE_MS):  # no float() of a 400-digit int
        _fail(f"'deadline_ms' must be a number in (0, {MAX_DEADLINE_MS}], got {str(deadline)[:40]}")
    history = doc.get("history")
    if history is not None:
        if not isinstance(history, list):
            _fail(f"'history' must be a list of strings, got {type(history).__name__}")
        history = [_string(h, f"history[{i}]") for i, h in enumerate(history)]
    else:
        limit = spec.history_token_budget * CHARS_PER_TOKEN_CEILING
        if len(query) > limit:
            _fail(f"'query' is {len(query)} characters, over the limit of {limit} (the model's user-context budget "
                  f"of {spec.history_token_budget} tokens × {CHARS_PER_TOKEN_CEILING})")
        history = [query]
    slate = {"slate_id": "0", "history": history, "candidates": [{"title": t} for t in texts]}
    return RerankQuery(slate, min(top_n or len(texts), len(texts)), ROUTES[route] if ret is None else ret,
                       min(budget or spec.candidate_token_budget, spec.candidate_token_budget), deadline,
                       doc.get("history") is None, model)


class BuilderCache:
    """One :class:`PromptBuilder` per candidate token budget (at most the artefact's budget of them), over
    the server's tokenizer and prompt spec; the artefact's own budget uses the server's builder."""

    def __init__(self, builder: PromptBuilder):
        self.base = builder
        self._by_budget: dict[int, PromptBuilder] = {builder.spec.candidate_token_budget: builder}

    def get(self, budget: int) -> PromptBuilder:
        """The builder with ``candidate_token_budget = budget`` (1 ≤ budget ≤ the artefact's)."""
        b = self._by_budget.get(budget)
        if b is None:
            base = self.base
            spec = dataclasses.replace(base.spec, candidate_token_budget=budget)
            b = self._by_budget[budget] = PromptBuilder(base.tokenizer, spec, max_items=base.max_items)
        return b


def encode(builder: PromptBuilder, q: RerankQuery, options: blocks.BlockOptions | None = None):
    """Encode the request's slate once (the row goes to the batcher) → (row, warnings): an
    :class:`~hllm.runtime.prompt.EncodedSlate`, or a :class:`~hllm.runtime.blocks.BlockedSlate` for a list
    longer than K or ``max_seq_len`` (``options``: how, :class:`~hllm.runtime.blocks.BlockOptions`).

    Raises: ApiError 400 when the slate is refused (one document over ``max_seq_len``) or the
    query does not fit the user-context budget.
    """
    try:
        row = blocks.encode(builder, q.slate, options)
    except SlateError as e:
        _fail(str(e).replace("slate 0: ", "", 1))
    if q.from_query and row.history_dropped:
        _fail(f"'query' does not fit the model's user-context budget of {builder.spec.history_token_budget} tokens "
              "(history_token_budget): shorten it")
    warnings = []
    if row.history_dropped:
        warnings.append(f"the {row.history_dropped} oldest history items were dropped to fit "
                        f"{builder.spec.history_token_budget} tokens")
    if row.truncated:
        warnings.append(f"documents {row.truncated} were cut to {builder.spec.candidate_token_budget} tokens")
    if isinstance(row, blocks.BlockedSlate):
        warnings.append(f"the {row.n} documents are more than one pass of this model holds (K={row.k}, "
                        f"max_seq_len={row.max_seq_len}): ranked in {len(row.blocks)} blocks, then the best ones "
                        "in one final pass")
    return row, warnings


def response(q: RerankQuery, ranking, matrix: np.ndarray, row, warnings: list, request_id: str, route: str,
             timing: dict, model: str = SERVED_MODEL, model_version: str = "unversioned") -> dict:
    """The JSON response (module docstring): the first ``top_n`` of the LAPJV order with their scores."""
    rel = getattr(ranking, "relevance", None)
    scores = rel if rel is not None else relevance_scores(matrix, ranking.order)
    texts = [c["title"] for c in q.slate["candidates"]]
    results = []
    for p in range(q.top_n):
        i = int(ranking.order[p])
        r: dict = {"index": i, "relevance_score": round(float(scores[p]), 6)}
        if q.return_documents:
            r["document"] = {"text": texts[i]}
        results.append(r)
    n_tokens = row.n_tokens if isinstance(row, blocks.BlockedSlate) else len(row.ids)
    version = "2" if route.startswith("/v2") else "1"
    return {
        "id": request_id, "model": q.model or model, "model_version": model_version, "results": results,
        "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
        "meta": {"api_version": {"version": version}, "billed_units": {"search_units": math.ceil(len(texts) / 100)},
                 "tokens": {"input_tokens": n_tokens, "output_tokens": 0}, "warnings": warnings},
        "timing": timing,
    }


def add_rerank_routes(app, service) -> None:
    """Register ``POST /v1/rerank``, ``/v2/rerank`` and ``/rerank`` on the app of :func:`hllm.serve.app.create_app`
    (``service``: its :class:`hllm.serve.app.RankService`)."""
    cache: list[BuilderCache] = []

    def builder_cache(ranker) -> BuilderCache:
        """Made on the first request (the ranker is read then, as by /v1/rank), again when a live reload
        swapped in another version (:mod:`hllm.serve.repository`)."""
        if not cache or cache[0].base is not ranker.builder:
            cache[:] = [BuilderCache(ranker.builder)]
        return cache[0]

    def endpoint(route: str):
        async def rerank(request: Request):
            t0 = time.perf_counter()
            service._check_ready()
            body = await read_body(request, service.options.max_body_bytes, service.options.body_timeout_s)
            with service.pin() as pinned:  # this version encodes and ranks the request
                ranker, served = pinned
                builders = builder_cache(ranker)
                options = getattr(ranker, "blocks", None) or blocks.BlockOptions()
                q = parse_rerank_body(body, request.headers.get("content-type", ""), route,
                                      ranker.engine.num_positions, builders.base.spec, served.names, options.max_documents)
                row, warnings = await run_in_threadpool(encode, builders.get(q.token_budget), q, options)
                res, timing = await service.submit([q.slate], q.deadline_ms, t0, encoded=[row], pinned=pinned)
            return JSONResponse(response(q, res.rankings[0], res.scores[0], row, warnings, request.state.request_id,
                                         route, timing, served.name, served.version))
        return rerank

    errors = {**{c: v for c, v in ERROR_RESPONSES.items() if c != 422}, 400: {**ERROR_RESPONSES[400], "description": "Any bad request: not UTF-8, malformed JSON, a field "
                                                             "missing or of the wrong type, no documents, more than max_documents."},
              404: {**ERROR_RESPONSES[400], "description": "Another model than the one served."}}
    for route, default in ROUTES.items():
        app.post(route, summary=f"Rerank documents for a query (Cohere / Jina; return_documents defaults to "
                                f"{str(default).lower()})", tags=["Rerank (Cohere / Jina)"], response_model=RerankResponse,
                 responses=errors, openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
                     "schema": RerankRequest.model_json_schema()}}}})(endpoint(route))
