"""Running the app with uvicorn: in the foreground (``hllm serve``) or in a thread (tests, load test).

Graceful shutdown: on SIGTERM/SIGINT the app stops admitting at once (``/readyz`` and every new request:
503 + ``Retry-After``, the JSON envelope) and uvicorn stops accepting connections and waits (up to
``graceful_timeout_s``) for in-flight requests; the app's lifespan then drains the batcher queue
(https://www.uvicorn.org/settings/#timeouts). Nothing accepted is cut (:class:`_DrainingServer`):

* the event loop stops accepting while a duplicate descriptor keeps the listening socket open; the
  connections the kernel completed meanwhile (the listen backlog: its close would reset them) are accepted
  right up to the close, with no await in between, and answered like any other request (503 while
  draining); after it, new connects are refused;
* no connection is closed while idle (uvicorn would close one accepted whose request is still on its way,
  or a keep-alive one whose client is sending its next request: a reset): a request that comes on it is
  answered, and every response started while draining says ``Connection: close``; idle connections close on
  their keep-alive / header timeout or when the graceful timeout ends;
* when ``graceful_timeout_s`` ends, what the batcher still holds (queued or in the running batch) is
  answered 503 (:meth:`hllm.serve.batching.MicroBatcher.abandon`) just before uvicorn cancels the tasks
  that are left; a request uvicorn cancels before its response started (e.g. while its body arrives) is
  answered 503 too (:class:`AnswerCancelled`) instead of uvicorn's plain-text 500 and traceback. Both are
  counted in the app state's ``shed``, which ``hllm serve`` reports on exit;
* a second SIGINT while draining (uvicorn's "force quit") cuts the graceful time short the same way: what the
  batcher holds is answered 503 at once, the tasks left are cancelled (503, :class:`AnswerCancelled`) and the
  app's lifespan still shuts down (uvicorn skips it: its tasks were cancelled with tracebacks in the log).

Slow clients: a connection costs a file descriptor and a little memory while it
is held, so none is held without progress. The limits come from the app's
:class:`hllm.serve.app.ServeOptions`:

* ``header_timeout_s`` — uvicorn has no request-header timeout (its ``timeout_keep_alive`` runs only
  between requests, and any byte received cancels it), so :class:`TimedH11Protocol` arms a timer when
  a connection opens and whenever it waits for the next request's headers; headers still incomplete
  when it fires (a client that connects and sends nothing, or dribbles a header byte at a time) get
  a JSON 408 and the connection is closed;
* ``body_timeout_s`` — the app reads the body under a deadline (408, :func:`hllm.serve.protocol.read_body`);
* ``keep_alive_s`` — uvicorn ``timeout_keep_alive``: idle keep-alive connections are closed;
* ``max_connections`` — uvicorn ``limit_concurrency``: past it new requests get 503 at once;
* ``max_connections_per_client`` — :class:`TimedH11Protocol` counts the open connections of each client
  address; one over the cap is answered a JSON 503 (``too_many_connections``, ``Retry-After``) and closed
  at once, so one address (idle sockets, headers without a body) can never hold every slot of
  ``max_connections`` and the others keep being served.

Every connection is served by the asyncio event loop, so a slow client never blocks the others'
requests; these limits bound what slow clients can hold. The server always runs uvicorn's h11
protocol implementation (subclassed), even where ``httptools`` is installed.
"""

from __future__ import annotations

import asyncio
import collections
import errno
import functools
import ipaddress
import json
import logging
import os
import signal
import socket
import threading
import time

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from hllm.errors import HllmError

log = logging.getLogger("hllm.serve")

LOOPBACK_NAMES = ("localhost",)


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and addresses in 127.0.0.0/8 or ::1."""
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


#: After a second SIGINT, how long the requests answered 503 get to write their answers before the tasks left
#: are cancelled (s): a task cancelled while its response is being written cuts it.
CUT_SHORT_WRITE_S = 1.0


class _DrainingServer(uvicorn.Server):
    """uvicorn's server that marks the app as draining on the first SIGTERM/SIGINT, answers the listen
    backlog before closing the listening socket and sheds the batcher when the graceful timeout ends
    (module doc)."""

    def __init__(self, config: uvicorn.Config, state=None):
        super().__init__(config)
        self._hllm_state = state

    def handle_exit(self, sig, frame) -> None:
        if self._hllm_state is not None:
            self._hllm_state.draining = True
            self._hllm_state.stop_signals.append(signal.Signals(sig).name)
        super().handle_exit(sig, frame)

    async def shutdown(self, sockets=None) -> None:
        state, timeout = self._hllm_state, self.config.timeout_graceful_shutdown
        if state is not None:
            state.draining = True
            if timeout is not None:  # fires before uvicorn's own timer, which starts after this
                asyncio.get_running_loop().call_later(timeout, self._shed, timeout)
        await self._serve_accepted(self._close_listeners())
        await super().shutdown(sockets)  # its connection.shutdown() closes nothing (TimedH11Protocol.shutdown)
        if self.force_exit and state is not None:  # a second SIGINT: uvicorn stopped waiting and skips the lifespan
            await self._cut_short(state)
        for connection in list(self.server_state.connections):  # the graceful time is over: close what is left
            getattr(connection, "close_now", connection.shutdown)()

    def _shed(self, timeout: float | None) -> None:
        """Answer 503 what the batcher holds: the graceful ``timeout`` ended (None: a second SIGINT)."""
        if self._hllm_state.forced:
            return
        abandon = getattr(self._hllm_state.batcher, "abandon", None)
        why = "a second SIGINT cut the graceful shutdown short" if timeout is None else f"graceful timeout of {timeout:g} s expired"
        if abandon is not None:
            n = abandon(f"server is shutting down: {'its ' if timeout is not None else ''}{why}")
            self._hllm_state.shed += n
            if n:
                log.warning("%s: %d in-flight requests answered 503", why, n)

    async def _cut_short(self, state) -> None:
        """After a second SIGINT: answer 503 what the batcher holds (:meth:`_shed`; a request still being read or
        tokenized then meets the closed batcher: 503 too), give those answers up to
        :data:`CUT_SHORT_WRITE_S` to be written, cancel the request tasks left (:class:`AnswerCancelled`: 503),
        then run the app's lifespan shutdown that uvicorn skips on a forced exit (the batcher closes after the
        engine call under way; without it the lifespan task was cancelled with tracebacks)."""
        self._shed(None)
        state.forced = True
        tasks = list(self.server_state.tasks)
        if tasks:
            await asyncio.wait(tasks, timeout=CUT_SHORT_WRITE_S)
        left = [t for t in tasks if not t.done()]
        for t in left:
            t.cancel(msg="a second SIGINT cut the graceful shutdown short")
        if left:
            await asyncio.wait(left, timeout=1.0)
        await self.lifespan.shutdown()

    def _close_listeners(self) -> list[socket.socket]:
        """Stop accepting, then take every connection the kernel completed for the listening sockets and
        close them: the event loop stops watching them first while a duplicate descriptor keeps each one
        listening, so the accept loop (no await: nothing else runs meanwhile) empties the listen backlog
        right up to the close. A connection left there would be reset by the close. Returns the accepted
        sockets (non-blocking)."""
        listeners = [socket.socket(fileno=os.dup(sock.fileno())) for server in self.servers for sock in server.sockets]
        for server in self.servers:
            server.close()
        taken = []
        for lsock in listeners:
            with lsock:
                lsock.setblocking(False)
                while True:
                    try:
                        conn, _ = lsock.accept()
                    except OSError:  # BlockingIOError: the backlog is empty (or out of descriptors)
                        break
                    conn.setblocking(False)
                    taken.append(conn)
        return taken

    async def _serve_accepted(self, taken: list[socket.socket]) -> None:
        """Serve the connections :meth:`_close_listeners` took like any other (503 while draining); TLS
        handshakes get the request-header time."""
        if not taken:
            return
        loop = asyncio.get_running_loop()
        factory = functools.partial(self.config.http_protocol_class, config=self.config,
                                    server_state=self.server_state, app_state=self.lifespan.state)
        tls = {"ssl": self.config.ssl, "ssl_handshake_timeout": getattr(self.config, "hllm_header_timeout_s", None) or 10.0} \
            if self.config.ssl else {}
        results = await asyncio.gather(*(loop.connect_accepted_socket(factory, conn, **tls) for conn in taken),
                                       return_exceptions=True)
        for conn, result in zip(taken, results):
            if isinstance(result, BaseException):
                log.debug("a connection from the listen backlog failed: %s", result)
                conn.close()
        log.info("shutting down: %d connections taken from the listen backlog", len(taken))


class AnswerCancelled:
    """ASGI wrapper: an HTTP request that uvicorn cancels while shutting down (its graceful timeout ended)
    before the response started is answered 503 with the JSON envelope (KServe paths: the protocol's
    ``{"error": message}``) and counted in ``state.shed``, instead of uvicorn's plain-text 500 and a
    traceback in the log (uvicorn ``timeout_graceful_shutdown``: "the server will start terminating
    requests"). Every response started while draining says ``Connection: close`` (RFC 9112 section 9.6), so
    no client sends another request on a connection the server is about to close. Anything else passes
    through."""

    def __init__(self, app, state):
        self.app, self.state = app, state

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or self.state is None:
            return await self.app(scope, receive, send)
        started = False

        async def send_started(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                headers = list(message.get("headers", []))
                if self.state.draining and not any(k.lower() == b"connection" for k, _ in headers):
                    message = {**message, "headers": [*headers, (b"connection", b"close")]}  # next request: a new connection
            await send(message)

        try:
            await self.app(scope, receive, send_started)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if started or not self.state.draining or task is None:
                raise
            task.uncancel()
            self.state.shed += 1
            why = "a second SIGINT cut the graceful shutdown short" if self.state.forced else "its graceful timeout expired"
            message = f"server is shutting down: {why} before this request was answered"
            body = {"error": message} if scope["path"].startswith("/v2/models/") else {
                "error": {"kind": "not_ready", "message": message, "id": None}}
            data = json.dumps(body).encode()
            await send({"type": "http.response.start", "status": 503, "headers": [
                (b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()),
                (b"retry-after", b"1"), (b"connection", b"close")]})
            await send({"type": "http.response.body", "body": data})


def _close_with(transport, status: str, kind: str, message: str, extra: bytes = b"") -> None:
    """Write a JSON error response (the app's envelope) and close the connection (no request read)."""
    body = json.dumps({"error": {"kind": kind, "message": message, "id": None}}).encode()
    transport.write(b"HTTP/1.1 " + status.encode() + b"\r\ncontent-type: application/json\r\n" + extra +
                    b"connection: close\r\ncontent-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    transport.close()


class TimedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol plus a request-header deadline (module doc): 408 and close when a
    connection has not sent complete request headers within ``config.hllm_header_timeout_s``; and a
    cap of ``config.hllm_per_client_cap`` open connections per client address (503 and close past it)."""

    _header_timer = None
    _counted = None  # the client address this connection is counted under

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if not self._admit_client():
            return
        self._watch_headers()

    def _admit_client(self) -> bool:
        """Count this connection under its client address; False (503 sent, closing) past the cap."""
        cap, open_by_client = getattr(self.config, "hllm_per_client_cap", None), getattr(self.config, "hllm_open_by_client", None)
        host = self.client[0] if self.client else None
        if not cap or open_by_client is None or host is None:
            return True
        if open_by_client[host] >= cap:
            log.warning("refusing a connection from %s: it already holds %d (max_connections_per_client)", host, cap)
            _close_with(self.transport, "503 Service Unavailable", "too_many_connections",
                        f"this client address already holds {cap} connections (the server's per-client limit)",
                        b"retry-after: 1\r\n")
            return False
        open_by_client[host] += 1
        self._counted = host
        return True

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._watch_headers()

    def shutdown(self) -> None:
        """Graceful shutdown (uvicorn calls it on every connection when it stops accepting) closes nothing
        here: uvicorn would close an idle connection at once — one accepted whose request is still on its
        way, or a keep-alive one whose client is sending its next request — and that client would see a
        reset. Each connection rather closes after a response that says ``Connection: close`` (every
        response started while draining, :class:`AnswerCancelled`), on its keep-alive or request-header
        timeout, or when the graceful timeout ends (:meth:`close_now`)."""

    def close_now(self) -> None:
        """uvicorn's graceful shutdown of this connection: close it if idle, else after its response."""
        super().shutdown()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._watch_headers()

    def connection_lost(self, exc) -> None:
        self._stop_header_timer()
        if self._counted is not None:
            open_by_client = self.config.hllm_open_by_client
            open_by_client[self._counted] -= 1
            if open_by_client[self._counted] <= 0:
                del open_by_client[self._counted]
            self._counted = None
        super().connection_lost(exc)

    def _watch_headers(self) -> None:
        """Armed while waiting for a request's headers (h11: the client is IDLE), stopped once they came."""
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            self._stop_header_timer()
        elif self._header_timer is None:
            timeout = getattr(self.config, "hllm_header_timeout_s", None)
            if timeout:
                self._header_timer = self.loop.call_later(timeout, self._headers_timed_out, timeout)

    def _stop_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_timed_out(self, timeout: float) -> None:
        self._header_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        log.info("closing %s: request headers not received within %g s", self.client, timeout)
        _close_with(self.transport, "408 Request Timeout", "timeout", f"request headers not received within {timeout:g} s")


def _config(app, host: str, port: int, log_level: str, graceful_timeout_s: float, tls: dict | None = None) -> uvicorn.Config:
    """uvicorn's config with the app's connection limits (:class:`hllm.serve.app.ServeOptions`); ``tls``: uvicorn's
    ``ssl_certfile`` / ``ssl_keyfile`` (:func:`hllm.serve.tls.tls_options`), None for plain HTTP."""
    state = getattr(app.state, "hllm", None) if hasattr(app, "state") else None
    opts = getattr(state, "options", None)
    config = uvicorn.Config(
        AnswerCancelled(app, state),
        host=host,
        port=port,
        log_level=log_level,
        timeout_graceful_shutdown=graceful_timeout_s,
        lifespan="on",
        access_log=False,
        http=TimedH11Protocol,
        timeout_keep_alive=getattr(opts, "keep_alive_s", 5.0),
        limit_concurrency=getattr(opts, "max_connections", None),
        **(tls or {}),
    )
    config.hllm_header_timeout_s = getattr(opts, "header_timeout_s", 10.0)
    config.hllm_per_client_cap = getattr(opts, "per_client_cap", None)
    config.hllm_open_by_client = collections.Counter()
    return config


def bind_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (``SO_REUSEADDR``, as uvicorn binds), for uvicorn to listen on.

    Binding here, before uvicorn starts, turns a port in use or an address that is not this machine's
    into an error naming the address (uvicorn would log it and exit 3). Raises: HllmError.
    """
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
        sock = socket.socket(family, kind, proto)
    except OSError as e:
        raise HllmError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
    except OSError as e:
        sock.close()
        hint = " (another process listens there: choose another --port)" if e.errno == errno.EADDRINUSE else ""
        raise HllmError(f"cannot listen on {host}:{port}: {e.strerror or e}{hint}") from None
    sock.set_inheritable(True)
    return sock


def run_server(app, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info", graceful_timeout_s: float = 60.0,
               sock: socket.socket | None = None, tls: dict | None = None) -> None:
    """Serve ``app`` in the foreground until SIGTERM/SIGINT (then drain and return).

    ``sock``: an already bound socket (:func:`bind_socket`), else ``host:port`` is bound first.
    ``tls``: HTTPS with these uvicorn options (:func:`hllm.serve.tls.tls_options`).
    Raises: HllmError when the address cannot be bound.
    """
    sock = sock or bind_socket(host, port)
    server = _DrainingServer(_config(app, host, port, log_level, graceful_timeout_s, tls), getattr(app.state, "hllm", None))
    with sock:
        server.run(sockets=[sock])


class BackgroundServer:
    """uvicorn serving ``app`` in a daemon thread on ``127.0.0.1`` and a free port.

    Use as a context manager; ``url`` is the base URL. Exiting stops the server (draining in-flight
    requests) and waits for the thread.
    """

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning", start_timeout_s: float = 60.0,
                 tls: dict | None = None, graceful_timeout_s: float = 30.0):
        if not is_loopback(host):
            raise HllmError(f"background servers bind loopback only, not {host!r}")
        self.server = _DrainingServer(_config(app, host, port, log_level, graceful_timeout_s, tls),
                                      getattr(app.state, "hllm", None))
        self.scheme = "https" if tls else "http"
        self.host = host
        self.start_timeout_s = start_timeout_s
        self.thread = threading.Thread(target=self.server.run, name="hllm-uvicorn", daemon=True)
        self.port: int | None = None

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}"

    def __enter__(self) -> "BackgroundServer":
        self.thread.start()
        t_end = time.monotonic() + self.start_timeout_s
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > t_end:
                raise HllmError("uvicorn did not start")
            time.sleep(0.01)
        sock: socket.socket = self.server.servers[0].sockets[0]
        self.port = sock.getsockname()[1]
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=60)


def wait_ready(url: str, timeout_s: float = 600.0, client=None) -> dict:
    """Poll ``GET {url}/readyz`` until 200; returns its JSON. Raises HllmError on load failure or timeout."""
    import httpx

    own = client is None
    client = client or httpx.Client(timeout=10.0)
    try:
        t_end = time.monotonic() + timeout_s
        while True:
            try:
                r = client.get(f"{url}/readyz")
                if r.status_code == 200:
                    return r.json()
                err = r.json().get("error", {})
                if err.get("kind") == "load_failed":
                    raise HllmError(err.get("message", "engine failed to load"))
            except httpx.TransportError:
                pass
            if time.monotonic() > t_end:
                raise HllmError(f"{url} not ready after {timeout_s:.0f} s")
            time.sleep(0.05)
    finally:
        if own:
            client.close()
