"""Running the app with uvicorn: in the foreground (``hllm serve``) or in a thread (tests, load test).

Graceful shutdown: on SIGTERM/SIGINT uvicorn stops accepting connections and waits (up to
``graceful_timeout_s``) for in-flight requests; the app's ``/readyz`` turns 503 at once and its
lifespan then drains the batcher queue (https://www.uvicorn.org/settings/#timeouts).
"""

from __future__ import annotations

import ipaddress
import socket
import threading
import time

import uvicorn

from hllm.errors import HllmError

LOOPBACK_NAMES = ("localhost",)


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and addresses in 127.0.0.0/8 or ::1."""
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class _DrainingServer(uvicorn.Server):
    """uvicorn's server that marks the app as draining on the first SIGTERM/SIGINT."""

    def __init__(self, config: uvicorn.Config, state=None):
        super().__init__(config)
        self._hllm_state = state

    def handle_exit(self, sig, frame) -> None:
        if self._hllm_state is not None:
            self._hllm_state.draining = True
        super().handle_exit(sig, frame)


def _config(app, host: str, port: int, log_level: str, graceful_timeout_s: float) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        timeout_graceful_shutdown=graceful_timeout_s,
        lifespan="on",
        access_log=False,
    )


def run_server(app, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info", graceful_timeout_s: float = 60.0) -> None:
    """Serve ``app`` in the foreground until SIGTERM/SIGINT (then drain and return)."""
    server = _DrainingServer(_config(app, host, port, log_level, graceful_timeout_s), getattr(app.state, "hllm", None))
    server.run()


class BackgroundServer:
    """uvicorn serving ``app`` in a daemon thread on ``127.0.0.1`` and a free port.

    Use as a context manager; ``url`` is the base URL. Exiting stops the server (draining in-flight
    requests) and waits for the thread.
    """

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning", start_timeout_s: float = 60.0):
        if not is_loopback(host):
            raise HllmError(f"background servers bind loopback only, not {host!r}")
        self.server = _DrainingServer(_config(app, host, port, log_level, 30.0), getattr(app.state, "hllm", None))
        self.host = host
        self.start_timeout_s = start_timeout_s
        self.thread = threading.Thread(target=self.server.run, name="hllm-uvicorn", daemon=True)
        self.port: int | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

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
