#!/usr/bin/env python3
"""LAB STAND-IN: a webhook receiver for Alertmanager (what an operator's pager or chat hook would be).

Records every POST body (Alertmanager's webhook JSON: status, alerts[].labels, alerts[].status, ...) as one line of
JSON in --out, and answers 200. Binds loopback only (the lab's router container reaches this machine's loopback as
10.0.2.2 through slirp4netns). tests/lab/test_monitor.py starts it for its drill; no production role uses it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def make_handler(out: Path) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(min(length, 1 << 20))
            try:
                record = {"received": time.time(), "path": self.path, "body": json.loads(body)}
            except ValueError:
                record = {"received": time.time(), "path": self.path, "body": None}
            with out.open("a") as handle:
                handle.write(json.dumps(record) + "\n")
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *_args: object) -> None:
            return

    return Handler


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description="LAB STAND-IN webhook receiver")
    parser.add_argument("--port", type=int, default=19099)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    ThreadingHTTPServer(("127.0.0.1", args.port), make_handler(args.out)).serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
