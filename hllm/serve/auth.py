"""API keys on ``hllm serve`` and its Ray Serve app: ``Authorization: Bearer KEY`` on every route but health.

Keys come from any of (all together): ``--api-key KEY`` (repeatable), ``--api-key-file PATH`` (one key per
line; blank lines and ``#`` comments ignored: a mounted Kubernetes / Docker secret) and the environment
variable :data:`ENV_VAR` (comma-separated). :func:`load_api_keys` reads and checks them; a key is 16..4096
visible ASCII characters (no spaces or commas), so a typo such as an empty file is an error, never an open
server.

:class:`ApiKeyMiddleware` (a pure ASGI middleware) lets a request through when its ``Authorization`` header
is ``Bearer`` (scheme case-insensitive, RFC 6750 §2.1) and a key equal to one of the keys; the token is
compared with EVERY key by :func:`hmac.compare_digest` (constant time in the key's content, no early exit).
Open without a key: :data:`OPEN_PATHS` (``/healthz``, ``/readyz`` and the KServe health probes); ``/metrics``
with ``public_metrics``; ``/docs``, ``/redoc`` and ``/openapi.json`` with ``public_docs``. Paths under :data:`ADMIN_PREFIX` are left
to :mod:`hllm.serve.admin`, which checks the separate admin keys. Everything else
— ``/v1/rank``, the rerank routes, ``/v1/models``, ``/v2`` and ``/v2/models/...``, unknown paths — answers
401 without a valid key: the JSON envelope ``{"error": {"kind": "unauthorized", "message", "id": null}}``
(the KServe form ``{"error": message}`` on ``/v2`` and ``/v2/models/...``) and ``WWW-Authenticate: Bearer realm="hllm"``
(``error="invalid_token"`` when a token was sent). Keys never appear in a response, a log line or a
``repr``. Source: RFC 6750 (Bearer tokens), RFC 7235 §4.1 (``WWW-Authenticate``),
https://docs.python.org/3/library/hmac.html#hmac.compare_digest.
"""

from __future__ import annotations

import hmac
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping

from hllm.errors import HllmError

#: The environment variable holding comma-separated API keys.
ENV_VAR = "HLLM_API_KEYS"
#: Paths under this prefix check the admin keys themselves (:mod:`hllm.serve.admin`), never the API keys.
ADMIN_PREFIX = "/admin/"
#: Paths open without a key: the liveness and readiness probes (Kubernetes, KServe, load balancers).
OPEN_PATHS = frozenset({"/healthz", "/readyz", "/v2/health/live", "/v2/health/ready"})
METRICS_PATHS = frozenset({"/metrics"})
DOCS_PATHS = frozenset({"/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json"})
#: A key: 16..4096 visible ASCII characters, no comma (the separator of :data:`ENV_VAR`).
KEY_RE = re.compile(r"[!-+\--~]{16,4096}")
#: The largest key file read (bytes): a secret, never a data file.
MAX_KEY_FILE_BYTES = 1024 * 1024


@dataclass(frozen=True)
class AuthOptions:
    """Who may call the server.

    Attributes:
        keys: the accepted API keys (UTF-8 bytes); never shown by ``repr``.
        public_metrics: ``/metrics`` answers without a key (a Prometheus scraper inside the cluster).
        public_docs: ``/docs``, ``/redoc`` and ``/openapi.json`` answer without a key.
    """

    keys: tuple[bytes, ...] = field(repr=False)
    public_metrics: bool = False
    public_docs: bool = False

    def __post_init__(self):
        if not self.keys:
            raise HllmError("AuthOptions needs at least one API key")

    def is_open(self, path: str) -> bool:
        """True for a path that needs no key."""
        return (path in OPEN_PATHS or (self.public_metrics and path in METRICS_PATHS)
                or (self.public_docs and path in DOCS_PATHS))

    def accepts(self, authorization: str | None) -> bool:
        """True when ``authorization`` (the header's value) is ``Bearer <one of the keys>``.

        The token is compared with every key (:func:`hmac.compare_digest`), whatever matched before.
        """
        scheme, _, token = (authorization or "").strip().partition(" ")
        if scheme.lower() != "bearer":
            return False
        given = token.strip().encode("utf-8", "surrogateescape")
        ok = False
        for key in self.keys:
            ok |= hmac.compare_digest(given, key)
        return ok


def _check_key(key: str, where: str) -> bytes:
    if not KEY_RE.fullmatch(key):
        # never echo the key itself: only its length says what is wrong
        raise HllmError(f"{where}: an API key must be 16..4096 visible ASCII characters without spaces or commas "
                        f"(got one of {len(key)} characters that is not)")
    return key.encode("ascii")


def read_key_file(path: str | os.PathLike, option: str = "--api-key-file") -> list[str]:
    """The keys of a key file: one per line, blank lines and ``#`` comments ignored (UTF-8); errors name
    ``option``.

    Raises: HllmError (missing, not a file, over :data:`MAX_KEY_FILE_BYTES`, not UTF-8, no key in it).
    """
    p = Path(path)
    try:
        if not p.is_file():
            raise HllmError(f"{option} {p}: not a file")
        if p.stat().st_size > MAX_KEY_FILE_BYTES:
            raise HllmError(f"{option} {p}: over {MAX_KEY_FILE_BYTES} bytes; it should hold API keys, one a line")
        text = p.read_bytes().decode("utf-8")
    except OSError as e:
        raise HllmError(f"{option} {p}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise HllmError(f"{option} {p}: not UTF-8 text") from None
    keys = [s for s in (line.strip() for line in text.splitlines()) if s and not s.startswith("#")]
    if not keys:
        raise HllmError(f"{option} {p}: holds no key (one key a line; '#' starts a comment)")
    return keys


def load_api_keys(keys: Iterable[str] = (), key_file: str | os.PathLike | None = None,
                  env: Mapping[str, str] | None = None, env_var: str = ENV_VAR, option: str = "--api-key") -> tuple[bytes, ...]:
    """Every API key from ``keys``, the ``key_file`` and ``env[env_var]`` (comma-separated; ``env`` defaults
    to ``os.environ``), without duplicates, in that order → UTF-8 bytes (empty: no key anywhere).
    ``option``: the command-line option named in errors (``--admin-api-key`` for the admin keys).

    Raises: HllmError naming the source of a malformed key (never the key) or an unreadable key file.
    """
    env = os.environ if env is None else env
    found: list[bytes] = []
    sources = [(k, option) for k in keys]
    if key_file is not None:
        sources += [(k, f"{option}-file {key_file}") for k in read_key_file(key_file, f"{option}-file")]
    sources += [(k.strip(), f"${env_var}") for k in env.get(env_var, "").split(",") if k.strip()]
    for key, where in sources:
        b = _check_key(key, where)
        if b not in found:
            found.append(b)
    return tuple(found)


class ApiKeyMiddleware:
    """Pure ASGI middleware: 401 for a request without a valid key on a path that is not open (module doc).

    Args:
        app: the ASGI app it wraps. auth: :class:`AuthOptions`.
        on_reject: called with no argument on every 401 (e.g. to count it in ``hllm_errors_total``).
    """

    def __init__(self, app, auth: AuthOptions, on_reject=None):
        self.app, self.auth, self.on_reject = app, auth, on_reject

    async def __call__(self, scope, receive, send):
        path = scope.get("path", "")
        if scope["type"] != "http" or self.auth.is_open(path) or path.startswith(ADMIN_PREFIX):
            return await self.app(scope, receive, send)  # admin routes check the admin keys themselves
        header = next((v.decode("latin-1") for k, v in scope.get("headers", ()) if k == b"authorization"), None)
        if self.auth.accepts(header):
            return await self.app(scope, receive, send)
        if self.on_reject is not None:
            self.on_reject()
        await send_unauthorized(scope, send, token_given=bool(header and header.strip()))


async def send_unauthorized(scope, send, token_given: bool) -> None:
    """Answer 401 with the error body of the path's protocol and ``WWW-Authenticate: Bearer``."""
    message = ("invalid API key" if token_given else
               "this route needs an API key: send the header 'Authorization: Bearer <key>'")
    path = scope.get("path", "")
    if path == "/v2" or path.startswith(("/v2/models", "/v2/health")):  # the Open Inference Protocol's (hllm.serve.kserve)
        body = {"error": message}
    else:
        body = {"error": {"kind": "unauthorized", "message": message, "id": None}}
    challenge = 'Bearer realm="hllm"' + (', error="invalid_token"' if token_given else "")
    raw = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": 401, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode()),
        (b"www-authenticate", challenge.encode())]})
    await send({"type": "http.response.body", "body": raw})
