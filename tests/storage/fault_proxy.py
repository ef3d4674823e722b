"""A fault-injecting HTTP/1.1 proxy on 127.0.0.1, for testing storage clients against a real server.

It sits in front of one upstream server (Azurite, in these tests) and forwards each request over a fresh
upstream connection, keeping the client's connection alive between requests as a real endpoint does.
What it can do to the traffic:

- `latency`: seconds added before each request is forwarded;
- `bandwidth`: a cap, in bytes per second, on request and response bodies;
- `inject(...)`: a fault for the n-th request matching a method and a path pattern (counted from the call),
  for `times` matching requests in a row: an HTTP status without forwarding (`"status"`: 503, 429, 500),
  the connection dropped before forwarding (`"drop"`) or after forwarding, so the server did the work but
  the client never hears of it (`"drop_after"`), a response body cut short with the connection closed
  (`"truncate"`), or a callback run before forwarding (`"call"`), which drops the request instead if it
  returns False (the crash-injection tests kill the writer there, between two of its requests);
- `requests`: every request seen, in order (method, path, status sent, fault applied), for assertions.

Written on the standard library (socketserver + http.client) rather than a package: the faults are a
few lines each on a request-at-a-time loop, and what the maintained HTTP fault tools offer (toxiproxy's
TCP-level toxics, mitmproxy's scripting) either cannot answer a request with a status of our choosing or
brings a large dependency and its own process. Only plain HTTP: Azurite serves HTTP on 127.0.0.1.
"""

from __future__ import annotations

import http.client
import re
import socket
import socketserver
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

FAULTS = ("status", "drop", "drop_after", "truncate", "call")
_ERROR_CODES = {503: "ServerBusy", 500: "InternalError", 429: "TooManyRequests"}  # x-ms-error-code
_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "te", "upgrade"}


@dataclass
class Fault:
    """One injected fault: applied to matching requests number nth .. nth + times - 1 (1-based)."""

    kind: str
    nth: int = 1
    times: int = 1
    method: str | None = None  # e.g. "PUT"; None: any
    path: str | None = None  # a regular expression searched for in the request target; None: any
    status: int = 503
    keep_bytes: int = 0  # "truncate": how many bytes of the body are sent before the connection closes
    callback: Callable[[Request], bool | None] | None = None  # "call"; False: drop the request
    seen: int = 0  # matching requests so far
    applied: int = 0  # how often it was applied

    def matches(self, method: str, target: str) -> bool:
        return ((self.method is None or self.method == method)
                and (self.path is None or re.search(self.path, target) is not None))


@dataclass
class Request:
    """A request the proxy saw, and what it did with it."""

    method: str
    target: str
    headers: dict[str, str]
    body_bytes: int
    status: int | None = None  # what the client was sent; None: no response (dropped, or killed)
    fault: str | None = None
    at: float = field(default_factory=time.monotonic)


class FaultProxy:
    """The proxy: `with FaultProxy(("127.0.0.1", azurite_port)) as proxy: ... proxy.port ...`."""

    def __init__(self, upstream: tuple[str, int], latency: float = 0.0,
                 bandwidth: float | None = None) -> None:
        self.upstream = upstream
        self.latency, self.bandwidth = latency, bandwidth
        self.requests: list[Request] = []
        self._faults: list[Fault] = []
        self._lock = threading.Lock()
        proxy = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                proxy._serve(self.connection, self.rfile)

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

        self._server = Server(("127.0.0.1", 0), Handler)
        self.port: int = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="fault-proxy", daemon=True)

    # --- control -------------------------------------------------------------------------------------------
    def start(self) -> FaultProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def inject(self, kind: str, nth: int = 1, times: int = 1, method: str | None = None,
               path: str | None = None, status: int = 503, keep_bytes: int = 0,
               callback: Callable[[Request], bool | None] | None = None) -> Fault:
        """Add a fault (see the module's docstring); matching requests are counted from now on."""
        if kind not in FAULTS:
            raise ValueError(f"fault must be one of {', '.join(FAULTS)}, got {kind!r}")
        fault = Fault(kind, nth, times, method, path, status, keep_bytes, callback)
        with self._lock:
            self._faults.append(fault)
        return fault

    def clear(self) -> None:
        """Remove every fault (the request log stays)."""
        with self._lock:
            self._faults.clear()

    # --- serving -------------------------------------------------------------------------------------------
    def _serve(self, client: socket.socket, rfile: Any) -> None:
        """Requests on one client connection, one at a time, until it closes or a fault closes it."""
        while True:
            parsed = _read_request(rfile)
            if parsed is None:
                return
            method, target, headers, body = parsed
            request = Request(method, target, {k.lower(): v for k, v in headers}, len(body))
            with self._lock:
                self.requests.append(request)
                fault = self._fault_for(method, target)
            if self.latency:
                time.sleep(self.latency)
            self._throttle(len(body))
            if not self._respond(client, request, headers, body, fault):
                return
            if request.headers.get("connection", "").lower() == "close":
                return

    def _fault_for(self, method: str, target: str) -> Fault | None:
        chosen = None
        for fault in self._faults:
            if fault.matches(method, target):
                fault.seen += 1
                if chosen is None and fault.nth <= fault.seen < fault.nth + fault.times:
                    chosen = fault
        if chosen is not None:
            chosen.applied += 1
        return chosen

    def _respond(self, client: socket.socket, request: Request, headers: list[tuple[str, str]],
                 body: bytes, fault: Fault | None) -> bool:
        """Answer one request, faults applied; False when the client connection is to be closed."""
        request.fault = fault.kind if fault else None
        if fault and fault.kind == "call":
            assert fault.callback is not None
            if fault.callback(request) is False:
                _abort(client)
                return False
        if fault and fault.kind == "drop":
            _abort(client)
            return False
        if fault and fault.kind == "status":
            error = (f'<?xml version="1.0" encoding="utf-8"?><Error><Code>Injected{fault.status}</Code>'
                     f"<Message>injected by the fault proxy</Message></Error>").encode()
            code = _ERROR_CODES.get(fault.status, "Injected")
            request.status = fault.status
            self._send(client, fault.status, [("Content-Type", "application/xml"), ("x-ms-error-code", code),
                                              ("Content-Length", str(len(error)))], error, request.method)
            return True
        status, reason, response_headers, response_body = self._forward(request.method, request.target,
                                                                        headers, body)
        if fault and fault.kind == "drop_after":
            _abort(client)
            return False
        if fault and fault.kind == "truncate":
            request.status = status
            head = _status_line(status, reason) + _header_lines(response_headers)
            client.sendall(head + response_body[:fault.keep_bytes])
            _abort(client)
            return False
        request.status = status
        self._send(client, status, response_headers, response_body, request.method, reason)
        return True

    def _forward(self, method: str, target: str, headers: list[tuple[str, str]],
                 body: bytes) -> tuple[int, str, list[tuple[str, str]], bytes]:
        upstream = http.client.HTTPConnection(*self.upstream, timeout=60)
        try:
            upstream.putrequest(method, target, skip_host=True, skip_accept_encoding=True)
            for name, value in headers:
                if name.lower() not in _HOP_BY_HOP:
                    upstream.putheader(name, value)
            if body and not any(name.lower() == "content-length" for name, _ in headers):
                upstream.putheader("Content-Length", str(len(body)))
            upstream.endheaders(body or None)
            response = upstream.getresponse()
            response_body = response.read()
            out = [(k, v) for k, v in response.getheaders() if k.lower() not in _HOP_BY_HOP]
            if method != "HEAD" and not any(k.lower() == "content-length" for k, _ in out):
                out.append(("Content-Length", str(len(response_body))))
            return response.status, response.reason, out, response_body
        finally:
            upstream.close()

    def _send(self, client: socket.socket, status: int, headers: list[tuple[str, str]], body: bytes,
              method: str, reason: str = "") -> None:
        client.sendall(_status_line(status, reason) + _header_lines(headers))
        if method == "HEAD" or not body:
            return
        if self.bandwidth is None:
            client.sendall(body)
            return
        step = max(1, int(self.bandwidth / 20))  # about 20 writes a second at the cap
        for start in range(0, len(body), step):
            client.sendall(body[start:start + step])
            time.sleep(min(step, len(body) - start) / self.bandwidth)

    def _throttle(self, size: int) -> None:
        """The request body's share of the bandwidth cap (it has been read in full already)."""
        if self.bandwidth is not None and size:
            time.sleep(size / self.bandwidth)


def _read_request(rfile: Any) -> tuple[str, str, list[tuple[str, str]], bytes] | None:
    """One request from the client: method, target, headers, body (Content-Length or chunked)."""
    try:
        line = rfile.readline(65537)
    except OSError:
        return None
    if not line.strip():
        return None
    method, target, _ = line.decode("latin-1").split(" ", 2)
    headers = []
    while (header := rfile.readline(65537)) not in (b"\r\n", b"\n", b""):
        name, _, value = header.decode("latin-1").partition(":")
        headers.append((name.strip(), value.strip()))
    lowered = {name.lower(): value for name, value in headers}
    if lowered.get("transfer-encoding", "").lower() == "chunked":
        chunks = []
        while (size := int(rfile.readline().split(b";")[0], 16)) > 0:
            chunks.append(rfile.read(size))
            rfile.readline()
        while rfile.readline() not in (b"\r\n", b"\n", b""):  # trailers
            pass
        body = b"".join(chunks)
    else:
        body = rfile.read(int(lowered.get("content-length", "0")))
    return method, target, headers, body


def _status_line(status: int, reason: str) -> bytes:
    return f"HTTP/1.1 {status} {reason or http.client.responses.get(status, '')}\r\n".encode("latin-1")


def _header_lines(headers: list[tuple[str, str]]) -> bytes:
    return "".join(f"{name}: {value}\r\n" for name, value in headers).encode("latin-1") + b"\r\n"


def _abort(client: socket.socket) -> None:
    """Close the connection with a reset (RST), as a crashed peer or middlebox would."""
    try:
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        client.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    client.close()
