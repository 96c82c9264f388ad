#!/usr/bin/env python3
"""LAB STAND-IN (d3-fleet lab): serve a directory over https with the lab CA's server certificate, so lab hosts
fetch the stand-in NVIDIA key (and repository) over https like https://nvidia.github.io/libnvidia-container/.
    lab_https_server.py PORT BIND DIRECTORY CERT KEY
Stdlib only (http.server + ssl); the plain-http server of the same tree keeps running beside it."""

from __future__ import annotations

import functools
import http.server
import ssl
import sys


class Handler(http.server.SimpleHTTPRequestHandler):
    # HTTP/1.1 with Content-Length: apt's https client (GnuTLS) treats a response ended by a TLS close without
    # close_notify, as HTTP/1.0 does here, as truncated and ignores the file ("Ign: ... InRelease").
    protocol_version = "HTTP/1.1"


def main() -> None:
    port, bind, directory, cert, key = sys.argv[1:6]
    handler = functools.partial(Handler, directory=directory)
    server = http.server.ThreadingHTTPServer((bind, int(port)), handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
