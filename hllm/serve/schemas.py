"""Pydantic models of the HTTP API, used for the OpenAPI schema (``GET /openapi.json``).

Request bodies are parsed and checked by :func:`hllm.serve.protocol.parse_rank_body` with the runtime's
slate validator (one set of slate rules); these models document the same format.
"""

from __future__ import annotations

from typing import Optional, Union

from pydantic import BaseModel, Field


class CandidateIn(BaseModel):
    item_id: Union[str, int] = Field(None, description="Returned in the ranking (an integer is returned as its string); "
                                     "unique within the slate; either every candidate has one or none has "
                                     "(then the ranking lists candidate indices). Not null.")
    title: str = Field(..., description="The candidate's text.")


class SlateIn(BaseModel):
    """One slate in the JSONL slate format; the rules are :func:`hllm.runtime.slates.validate_slate`'s."""

    slate_id: Union[str, int] = Field(None, description="Non-empty string or integer (returned as its string); "
                                      "absent: the slate's index. Not null.")
    history: list[str] = Field(default_factory=list, description="The user's past items, oldest first.")
    candidates: list[CandidateIn] = Field(..., min_length=1, description="1..K candidates to rank.")
    labels: Optional[list[int]] = Field(None, description="0/1 per candidate; checked, otherwise ignored by the server.")


class RankRequest(BaseModel):
    """``POST /v1/rank`` JSON body. A single slate object or a JSON list of slates is accepted too, and
    ``application/x-ndjson`` bodies hold one slate per line."""

    slates: list[SlateIn] = Field(..., min_length=1)
    deadline_ms: Optional[float] = Field(None, gt=0, description="Per-request deadline (ms, finite); server default if absent.")


class RankingOut(BaseModel):
    slate_id: str
    ranking: list[Union[str, int]] = Field(..., description="Item ids, best first.")
    order: list[int] = Field(..., description="Candidate indices, best first.")
    scores: list[float] = Field(..., description="M[order[p], p] for each rank position p.")
    truncated: list[int] = Field(..., description="Candidates whose text was cut to the token budget.")


class Timing(BaseModel):
    """Milliseconds. prompt/engine/decode are the stage times of the whole engine batch this request rode in."""

    validate_ms: float
    queue_ms: float
    prompt_ms: float
    engine_ms: float
    decode_ms: float
    total_ms: float
    batch_id: int
    batch_slates: int
    batch_requests: int


class RankResponse(BaseModel):
    request_id: str
    rankings: list[RankingOut]
    timing: Timing


class ErrorBody(BaseModel):
    kind: str = Field(..., description="Machine-readable cause: bad_json, bad_request, bad_slate, too_large, "
                      "unsupported_media_type, not_found, method_not_allowed, timeout, not_ready, draining, "
                      "load_failed, queue_full, deadline, engine, decode, shape, slate, internal.")
    message: str = Field(..., description="What is wrong, naming the field or limit.")
    id: Optional[str] = Field(None, description="Error id of a server-side failure (500; also in the server log), else null.")


class ErrorResponse(BaseModel):
    error: ErrorBody
