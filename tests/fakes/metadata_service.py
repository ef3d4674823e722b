"""A stand-in for Azure's instance metadata service on 127.0.0.1 that plays Scheduled Events documents.

The n-th request for the Scheduled Events document is answered with the n-th document of the timeline (the
last one from then on), optionally after `failures` answers of HTTP 500; compute/name answers the VM name.
Every request is recorded. The documents have the shape of Azure's documentation of api-version 2020-07-01
(https://learn.microsoft.com/azure/virtual-machines/linux/scheduled-events, "Query for events" and "Example
responses"). Tests point `scheduled_events_url` here: none ever talks to 169.254.169.254.
"""

from __future__ import annotations

import email.utils
import json
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

EVENTS_PATH = "/metadata/scheduledevents"
NAME_PATH = "/metadata/instance/compute/name"


@dataclass(frozen=True)
class InSeconds:
    """A NotBefore time this many seconds after the document is served."""

    seconds: float

    def render(self) -> str:
        return email.utils.format_datetime(datetime.now(timezone.utc) + timedelta(seconds=self.seconds),
                                           usegmt=True)


def preempt(event_id: str, *vms: str, status: str = "Scheduled", not_before: Any = None) -> dict:
    """A Preempt event for `vms`; NotBefore 30 s after serving (Azure's notice) unless given."""
    return {"EventId": event_id, "EventType": "Preempt", "ResourceType": "VirtualMachine",
            "Resources": list(vms), "EventStatus": status,
            "NotBefore": InSeconds(30) if not_before is None else not_before,
            "Description": "", "EventSource": "Platform", "DurationInSeconds": -1}


def document(incarnation: int, *events: dict) -> dict:
    return {"DocumentIncarnation": incarnation, "Events": list(events)}


class FakeMetadataService:
    def __init__(self, timeline: list[dict], vm_name: str = "vm-0", failures: int = 0,
                 redirect_to: str | None = None) -> None:
        self.timeline, self.vm_name, self.failures = timeline, vm_name, failures
        self.redirect_to = redirect_to  # answer every request with a 307 to this URL
        self.requests: list[dict] = []  # path, Metadata header, time, and which document was served
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_port}{EVENTS_PATH}?api-version=2020-07-01"

    def play(self, timeline: list[dict]) -> None:
        """Start over with another timeline, at the same address (a restarted job's VM asks it again)."""
        with self._lock:
            self.timeline, self.requests = timeline, []

    def served(self) -> list[int]:
        """The timeline index served to each Scheduled Events request, in order (-1: an HTTP 500)."""
        with self._lock:
            return [r["served"] for r in self.requests if r["path"].startswith(EVENTS_PATH)]

    def __enter__(self) -> FakeMetadataService:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _answer(self, path: str, metadata_header: str | None) -> tuple[int, bytes]:
        with self._lock:
            record = {"path": path, "metadata": metadata_header, "time": time.time(), "served": None}
            self.requests.append(record)
            if metadata_header != "true":
                return 400, b'{"error": "Bad request. Required metadata header not specified"}'
            if path.startswith(NAME_PATH):
                return 200, self.vm_name.encode()
            if not path.startswith(EVENTS_PATH):
                return 404, b"{}"
            count = sum(r["path"].startswith(EVENTS_PATH) for r in self.requests) - 1
            if count < self.failures:
                record["served"] = -1
                return 500, b"{}"
            index = min(count - self.failures, len(self.timeline) - 1)
            record["served"] = index
            return 200, json.dumps(self.timeline[index], default=lambda t: t.render()).encode()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        service = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                status, body = service._answer(self.path, self.headers.get("Metadata"))
                if service.redirect_to:
                    status, body = 307, b""
                self.send_response(status)
                if service.redirect_to:
                    self.send_header("Location", service.redirect_to)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        return Handler
