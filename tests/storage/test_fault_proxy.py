"""The fault proxy itself, against a small upstream HTTP server of the standard library: it forwards
faithfully, and each fault does what it says to the n-th matching request only."""

from __future__ import annotations

import http.client
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest

from storage.fault_proxy import FaultProxy, Request


class _Upstream(BaseHTTPRequestHandler):
    """GET /bytes/N: N bytes; PUT: stores the body, answers its length. Records what reached it."""

    protocol_version = "HTTP/1.1"
    received: ClassVar[list[tuple[str, str, bytes]]] = []

    def do_GET(self) -> None:
        self.received.append(("GET", self.path, b""))
        body = bytes(i % 251 for i in range(int(self.path.rsplit("/", 1)[1])))
        self._answer(200, body)

    def do_HEAD(self) -> None:
        self.received.append(("HEAD", self.path, b""))
        self.send_response(200)
        self.send_header("Content-Length", "12345")
        self.end_headers()

    def do_PUT(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.received.append(("PUT", self.path, body))
        self._answer(201, str(len(body)).encode())

    def _answer(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def proxy() -> Iterator[FaultProxy]:
    _Upstream.received = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Upstream)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    with FaultProxy(("127.0.0.1", server.server_address[1])) as fault_proxy:
        yield fault_proxy
    server.shutdown()
    server.server_close()


def _get(proxy: FaultProxy, path: str, connection: http.client.HTTPConnection | None = None
         ) -> tuple[int, bytes]:
    conn = connection or http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
    conn.request("GET", path)
    response = conn.getresponse()
    return response.status, response.read()


def test_requests_and_responses_pass_unchanged_over_one_kept_alive_connection(proxy: FaultProxy) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
    assert _get(proxy, "/bytes/1000", conn) == (200, bytes(i % 251 for i in range(1000)))
    conn.request("PUT", "/blob?comp=block", body=b"x" * 70000)
    response = conn.getresponse()
    assert (response.status, response.read()) == (201, b"70000")
    conn.request("HEAD", "/blob")
    response = conn.getresponse()
    assert (response.status, response.getheader("Content-Length"), response.read()) == (200, "12345", b"")

    assert [(m, p, len(b)) for m, p, b in _Upstream.received] == [
        ("GET", "/bytes/1000", 0), ("PUT", "/blob?comp=block", 70000), ("HEAD", "/blob", 0)]
    assert [(r.method, r.status, r.fault) for r in proxy.requests] == [
        ("GET", 200, None), ("PUT", 201, None), ("HEAD", 200, None)]


def test_a_chunked_request_body_is_forwarded_whole(proxy: FaultProxy) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
    conn.request("PUT", "/chunked", body=iter([b"abc", b"defg"]), encode_chunked=True)

    assert conn.getresponse().read() == b"7"
    assert _Upstream.received == [("PUT", "/chunked", b"abcdefg")]


def test_a_status_fault_answers_only_the_nth_matching_request_without_forwarding_it(
        proxy: FaultProxy) -> None:
    proxy.inject("status", nth=3, status=503)

    statuses = [_get(proxy, f"/bytes/{n}")[0] for n in range(1, 6)]

    assert statuses == [200, 200, 503, 200, 200]
    assert [p for _, p, _ in _Upstream.received] == ["/bytes/1", "/bytes/2", "/bytes/4", "/bytes/5"]
    assert proxy.requests[2].fault == "status" and proxy.requests[2].status == 503


def test_a_fault_counts_only_requests_of_its_method_and_path_and_lasts_times_requests(
        proxy: FaultProxy) -> None:
    proxy.inject("status", nth=2, times=2, method="GET", path=r"/bytes/\d*5$", status=429)

    statuses = {n: _get(proxy, f"/bytes/{n}")[0] for n in (5, 6, 15, 7, 25, 35, 45)}

    assert statuses == {5: 200, 6: 200, 15: 429, 7: 200, 25: 429, 35: 200, 45: 200}


def test_the_error_body_names_the_storage_error_code(proxy: FaultProxy) -> None:
    proxy.inject("status", status=503)
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
    conn.request("GET", "/bytes/1")
    response = conn.getresponse()

    assert response.status == 503 and response.getheader("x-ms-error-code") == "ServerBusy"
    assert b"<Error>" in response.read()


def test_drop_closes_the_connection_before_the_request_reaches_the_server(proxy: FaultProxy) -> None:
    proxy.inject("drop")

    with pytest.raises((ConnectionError, http.client.RemoteDisconnected)):
        _get(proxy, "/bytes/10")
    assert _Upstream.received == []
    assert _get(proxy, "/bytes/10")[0] == 200  # the next connection is served


def test_drop_after_lets_the_server_do_the_work_and_the_client_never_hears(proxy: FaultProxy) -> None:
    proxy.inject("drop_after", method="PUT")
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)

    with pytest.raises((ConnectionError, http.client.RemoteDisconnected)):
        conn.request("PUT", "/blob", body=b"data")
        conn.getresponse().read()
    assert _Upstream.received == [("PUT", "/blob", b"data")]


def test_truncate_sends_the_full_length_header_then_part_of_the_body_and_closes(proxy: FaultProxy) -> None:
    proxy.inject("truncate", keep_bytes=100)
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
    conn.request("GET", "/bytes/5000")
    response = conn.getresponse()

    assert response.getheader("Content-Length") == "5000"
    with pytest.raises(http.client.IncompleteRead) as error:
        response.read()
    assert len(error.value.partial) == 100


def test_call_runs_the_callback_before_the_request_is_forwarded(proxy: FaultProxy) -> None:
    seen: list[tuple[str, int]] = []

    def callback(request: Request) -> None:
        seen.append((request.target, len(_Upstream.received)))

    proxy.inject("call", nth=2, callback=callback)
    for n in (1, 2, 3):
        _get(proxy, f"/bytes/{n}")

    assert seen == [("/bytes/2", 1)]


def test_a_callback_returning_false_drops_the_request(proxy: FaultProxy) -> None:
    proxy.inject("call", callback=lambda request: False)

    with pytest.raises((ConnectionError, http.client.RemoteDisconnected)):
        _get(proxy, "/bytes/3")
    assert _Upstream.received == []


def test_latency_delays_every_request(proxy: FaultProxy) -> None:
    proxy.latency = 0.2
    start = time.monotonic()
    for _ in range(3):
        _get(proxy, "/bytes/1")

    assert time.monotonic() - start >= 0.6


def test_the_bandwidth_cap_bounds_the_rate_of_response_bodies(proxy: FaultProxy) -> None:
    proxy.bandwidth = 400_000  # bytes per second
    start = time.monotonic()
    status, body = _get(proxy, "/bytes/200000")

    assert status == 200 and len(body) == 200_000
    assert time.monotonic() - start >= 0.45


def test_an_unknown_fault_is_refused(proxy: FaultProxy) -> None:
    with pytest.raises(ValueError, match="fault must be one of"):
        proxy.inject("explode")
