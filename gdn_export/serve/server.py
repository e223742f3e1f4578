"""Running the app under uvicorn, with a drain on SIGTERM.

The first SIGTERM or SIGINT starts the drain: new requests get 503 (and /health says "draining"),
the queued and running ones go on; once the engine is idle, or after `drain_timeout` seconds
(the requests still running then get a 503 error), uvicorn closes its socket and connections
(GRACE_S at most) and the process exits 0. A second signal stops at once.
"""

from __future__ import annotations

import logging
import socket
import time

import uvicorn

from gdn_export.errors import InputError
from gdn_export.serve.engine import Engine

log = logging.getLogger("gdn_export.serve")
GRACE_S = 5  # uvicorn's wait for connections after the drain


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port (port 0: a free one), or InputError saying why not.
    Connections made before uvicorn starts wait in its backlog."""
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                          flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as exc:
        raise InputError(f"--host {host!r} does not resolve: {exc.strerror}") from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise InputError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    sock.set_inheritable(True)
    return sock


class DrainingServer(uvicorn.Server):
    """uvicorn.Server whose SIGTERM / SIGINT drains `engine` first (module docstring)."""

    def __init__(self, config: uvicorn.Config, engine: Engine, drain_timeout: float):
        super().__init__(config)
        self.engine = engine
        self.drain_timeout = drain_timeout
        self.drain_started: float | None = None

    def handle_exit(self, sig, frame) -> None:
        # Not uvicorn's: it re-raises the signal after shutdown, which would end the process with
        # the signal's status instead of 0.
        if self.drain_started is None:
            self.drain_started = time.monotonic()
            self.engine.begin_drain()
            log.warning("draining: no new requests; waiting up to %.0f s for the running ones", self.drain_timeout)
        else:
            self.should_exit = self.force_exit = True

    async def on_tick(self, counter: int) -> bool:
        if self.drain_started is not None and not self.should_exit:
            if self.engine.idle:
                self.should_exit = True
            elif time.monotonic() - self.drain_started > self.drain_timeout:
                self.engine.abort_all(f"the server shut down before this request finished "
                                      f"(--drain-timeout {self.drain_timeout:g} s)")
                self.should_exit = True
        return await super().on_tick(counter)


def run(app, engine: Engine, sock: socket.socket, drain_timeout: float, log_level: str = "info",
        access_log: bool = True) -> int:
    """Serve `app` on the bound `sock` until drained (module docstring). Returns the exit status:
    0, or 1 when the app failed to start."""
    config = uvicorn.Config(app, log_level=log_level, access_log=access_log, timeout_graceful_shutdown=GRACE_S,
                            lifespan="on")
    server = DrainingServer(config, engine, drain_timeout)
    server.run(sockets=[sock])
    return 0 if server.started else 1
