"""The admin route of ``hllm serve``: ``POST /admin/reload`` (load, check and swap in the newest model
version of a versioned repository, :mod:`hllm.serve.repository`).

Admin keys are separate from the API keys (:mod:`hllm.serve.auth`): ``--admin-api-key KEY`` (repeatable),
``--admin-api-key-file PATH`` and :data:`ADMIN_ENV_VAR` (comma-separated), same format; a key may not be
both an API key and an admin key. The route accepts ``Authorization: Bearer <admin key>`` only (an API key
gets 401, an admin key gets 401 on the inference routes). Without an admin key the route answers 403
``admin_disabled``, unless the server was started with ``--allow-admin-without-key``, which ``hllm serve``
accepts only with a loopback ``--host`` and which the route honours only for a loopback client: then
anyone on the machine may reload, as anyone who may send the process SIGHUP.

``POST /admin/reload`` → 202 ``{"status": "reloading", "serving": version}`` and the reload runs in the
background (``GET /v1/models`` lists its outcome under ``versions``); with ``?wait=true`` the answer waits
for it: 200 with the outcome (:meth:`hllm.serve.repository.VersionManager.request_reload`: ``serving``,
``swapped``, ``previous``, ``refused``, ``error``). 409 ``not_versioned`` when the server serves a single
artefact, 503 while shutting down. Source: RFC 6750 (Bearer tokens); RFC 9110 §15.3.3 (202 Accepted).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from fastapi import Request
from fastapi.responses import JSONResponse

from hllm.errors import HllmError
from hllm.serve.auth import AuthOptions
from hllm.serve.protocol import ERROR_RESPONSES, ApiError
from hllm.serve.schemas import ErrorResponse

#: The environment variable holding comma-separated admin keys.
ADMIN_ENV_VAR = "HLLM_ADMIN_API_KEYS"
RELOAD_PATH = "/admin/reload"
#: Client hosts that count as loopback for ``--allow-admin-without-key`` (Starlette's ``request.client.host``).
LOOPBACK_CLIENTS = ("127.0.0.1", "::1", "localhost")


@dataclass(frozen=True)
class AdminOptions:
    """Who may call the admin routes.

    Attributes:
        keys: the admin keys (UTF-8 bytes; never shown by ``repr``); empty: no key.
        allow_without_key: with no key, loopback clients may call them (``--allow-admin-without-key``).

    Raises: HllmError for both keys and ``allow_without_key`` (choose one).
    """

    keys: tuple[bytes, ...] = field(default=(), repr=False)
    allow_without_key: bool = False

    def __post_init__(self):
        if self.keys and self.allow_without_key:
            raise HllmError("--allow-admin-without-key with admin keys (--admin-api-key, --admin-api-key-file or "
                            f"${ADMIN_ENV_VAR}): choose one")


def check_admin_keys(admin_keys: tuple[bytes, ...], api_keys: tuple[bytes, ...]) -> None:
    """Raises HllmError when a key is both an API key and an admin key (never naming the key)."""
    if set(admin_keys) & set(api_keys):
        raise HllmError("a key is both an API key and an admin key: admin keys must be separate "
                        "(whoever may rank must not be able to swap the model)")


def _authorize(request: Request, admin: AdminOptions | None) -> None:
    """Raises ApiError 401 (no or wrong admin key) or 403 (admin routes off, or a keyless non-loopback client)."""
    admin = admin or AdminOptions()
    if admin.keys:
        header = request.headers.get("authorization")
        if not AuthOptions(admin.keys).accepts(header):
            given = bool(header and header.strip())
            challenge = 'Bearer realm="hllm-admin"' + (', error="invalid_token"' if given else "")
            raise ApiError(401, "unauthorized", "invalid admin key" if given else
                           "this route needs an admin key: send the header 'Authorization: Bearer <admin key>'",
                           {"WWW-Authenticate": challenge})
        return
    if not admin.allow_without_key:
        raise ApiError(403, "admin_disabled", "admin routes are off: start the server with --admin-api-key-file / "
                       f"--admin-api-key / ${ADMIN_ENV_VAR} (or, on loopback, --allow-admin-without-key); "
                       "SIGHUP reloads too")
    host = request.client.host if request.client else ""
    if host not in LOOPBACK_CLIENTS:
        raise ApiError(403, "admin_disabled", "admin routes without a key answer loopback clients only")


def add_admin_routes(app, service, admin: AdminOptions | None) -> None:
    """Register ``POST /admin/reload`` on the app of :func:`hllm.serve.app.create_app` (``service``: its
    :class:`hllm.serve.app.RankService`; ``admin``: :class:`AdminOptions`, None: no admin access)."""

    async def reload(request: Request, wait: bool = False):
        _authorize(request, admin)
        state = service.state
        if state.versions is None:
            raise ApiError(409, "not_versioned", "this server serves one artefact, not a versioned model repository "
                           "(REPO/1, REPO/2, ...): restart it to change the model")
        if state.draining or service.batcher.closing:
            raise ApiError(503, "not_ready", "server is shutting down", {"Retry-After": "1"})
        task = state.versions.request_reload()
        if not wait:
            return JSONResponse({"status": "reloading", "serving": state.model.version}, status_code=202)
        outcome = await asyncio.shield(task)
        return JSONResponse({"status": "done", **outcome})

    errors = {401: {"model": ErrorResponse, "description": "No or wrong admin key."},
              403: {"model": ErrorResponse, "description": "Admin routes are off (no admin key configured)."},
              409: {"model": ErrorResponse, "description": "Not a versioned model repository."},
              503: ERROR_RESPONSES[503]}
    app.post(RELOAD_PATH, summary="Load, check and swap in the newest model version (admin key)", tags=["Admin"],
             status_code=202, responses=errors)(reload)
