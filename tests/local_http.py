"""A local HTTP server for the module tests (decision, smoke): a handler base that answers quietly and a server on a
free loopback port, shut down after the test module."""

from __future__ import annotations

import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class QuietHandler(BaseHTTPRequestHandler):
    """Subclasses implement answer() -> (status, body bytes) for GET and POST (and PUT)."""

    def answer(self, body: bytes) -> tuple[int, bytes]:
        raise NotImplementedError

    def _handle(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        status, raw = self.answer(self.rfile.read(length) if length else b"")
        self.send_response(status)
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    do_GET = do_POST = do_PUT = _handle

    def log_message(self, *args: Any) -> None:
        pass


@contextmanager
def serve(handler: type[QuietHandler], tls: ssl.SSLContext | None = None) -> Iterator[str]:
    """Serve handler on 127.0.0.1 (a free port) in a thread, behind TLS with ``tls``; yields the base URL (http://,
    the caller says https)."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    if tls is not None:
        httpd.socket = tls.wrap_socket(httpd.socket, server_side=True)
    # a short poll: shutdown() waits for serve_forever's next poll (0.5 s by default) at every test's end
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
