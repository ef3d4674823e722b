"""Azure Scheduled Events: the notice Azure gives a VM before it takes it away, answered with a checkpoint.

Low-priority (Spot) nodes of an Azure ML cluster are preempted without a documented SIGTERM. What Azure does
document is the Scheduled Events document of the instance metadata service (api-version 2020-07-01),
readable from inside the VM with the header `Metadata: true`. A preemption is an event of EventType
"Preempt" whose Resources name the VMs it takes; it is "Scheduled" with a NotBefore time at least 30 s
ahead, then "Started". Azure may withdraw an event: it is simply missing from the next document (whose
DocumentIncarnation is higher). Events of other VMs of the same scale set can be listed too, so only events
naming this VM count.

A preemption notice is acted on once at most ACT_WITHIN_SECONDS remain before its NotBefore (at once for
Azure's usual 30-second Preempt notice, or when the time is blank or the event has started); a notice
further ahead is looked at again at every poll, so one withdrawn before then is ignored.

The document is read at SCHEDULED_EVENTS_URL, Azure's link-local address, unless the config's
scheduled_events_url names another (a test's stand-in). This VM's name comes from HVDAZURE_VM_NAME when set
(for a node whose metadata name differs from the names in Resources), else from the metadata service's
compute/name, asked at the same host.

`ScheduledEventsNotices` is what the environments report (environment.py's PreemptionNotices): it reads and
judges the document, and acts on nothing. The core's PreemptionWatcher (core/preemption_watcher.py) polls it
from local rank 0 of each node (GPU scale sets may deliver a VM's events to that VM only) and answers a due
notice with a checkpoint on every rank.

Stdlib only (urllib): imported inside every Azure ML job, when the environment is asked for its notices.
"""

from __future__ import annotations

import email.utils
import json
import os
import urllib.parse
import urllib.request
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from hvdazure.core.environments.environment import PreemptionNotice

SCHEDULED_EVENTS_URL = "http://169.254.169.254/metadata/scheduledevents?api-version=2020-07-01"
PREEMPT = "Preempt"
VM_NAME_ENV = "HVDAZURE_VM_NAME"
VM_NAME_PATH = "/metadata/instance/compute/name?api-version=2021-02-01&format=text"
ACT_WITHIN_SECONDS = 30.0
_MAX_RESPONSE_BYTES = 1 << 20


@dataclass(frozen=True)
class ScheduledEvent:
    """One event of the document, in the fields a preemption watcher reads."""

    event_id: str
    event_type: str  # "Freeze", "Reboot", "Redeploy", "Preempt" or "Terminate"
    status: str  # "Scheduled" or "Started"
    resources: tuple[str, ...]  # names of the VMs it affects
    not_before: datetime | None  # None when blank (as once started) or unreadable

    def affects(self, vm_name: str) -> bool:
        """True if `vm_name` is one of the event's resources (Azure resource names ignore case)."""
        return vm_name.casefold() in (resource.casefold() for resource in self.resources)

    def due(self, now: datetime, within: float = ACT_WITHIN_SECONDS) -> bool:
        """True once it is time to act: started, no known start time, or at most `within` s before it."""
        if self.status == "Started" or self.not_before is None:
            return True
        return (self.not_before - now).total_seconds() <= within


@dataclass(frozen=True)
class EventsDocument:
    incarnation: int
    events: tuple[ScheduledEvent, ...]

    def preemption_of(self, vm_name: str) -> ScheduledEvent | None:
        """The Preempt event that names `vm_name`, if this document holds one."""
        return next((e for e in self.events if e.event_type == PREEMPT and e.affects(vm_name)), None)


def parse_events(payload: str | bytes) -> EventsDocument:
    """The Scheduled Events document in `payload`; ValueError, saying what is wrong, if it is not one."""
    try:
        data = json.loads(payload)
    except ValueError as exc:
        raise ValueError(f"the Scheduled Events answer is not JSON ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("Events"), list):
        raise ValueError("the Scheduled Events answer has no 'Events' list")
    try:
        incarnation = int(data.get("DocumentIncarnation", 0))
    except (TypeError, ValueError):
        raise ValueError(f"DocumentIncarnation {data.get('DocumentIncarnation')!r} is not a number") from None
    return EventsDocument(incarnation, tuple(_event(item) for item in data["Events"]))


def _event(item: Any) -> ScheduledEvent:
    if not isinstance(item, dict):
        raise ValueError(f"a Scheduled Events entry is not an object: {item!r}")
    resources = item.get("Resources", [])
    if not isinstance(resources, list) or not all(isinstance(r, str) for r in resources):
        raise ValueError(f"event {item.get('EventId')!r}: Resources {resources!r} is not a list of names")
    return ScheduledEvent(str(item.get("EventId", "")), str(item.get("EventType", "")),
                          str(item.get("EventStatus", "")), tuple(resources),
                          _time(item.get("NotBefore")))


def _time(text: Any) -> datetime | None:
    """NotBefore as documented ("Mon, 19 Sep 2016 18:29:47 GMT"), or ISO 8601; None if blank or other."""
    if not isinstance(text, str) or not text.strip():
        return None
    try:
        parsed = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError):
        try:
            parsed = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
        except ValueError:
            return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)  # the service speaks UTC


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    # The metadata service answers itself; a redirect means something else answered (the Metadata header
    # exists to catch that), so it is an error rather than a request to another address.
    def redirect_request(self, *args: Any) -> None:
        return None


class MetadataClient:
    """Reads the instance metadata service at the host of `scheduled_events_url`."""

    def __init__(self, scheduled_events_url: str) -> None:
        self.url = scheduled_events_url
        parts = urllib.parse.urlsplit(scheduled_events_url)
        self.vm_name_url = f"{parts.scheme}://{parts.netloc}{VM_NAME_PATH}"
        # No proxy: the service is reachable only from the VM itself (and a test's server from loopback)
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirects())

    def _get(self, url: str, timeout: float) -> bytes:
        request = urllib.request.Request(url, headers={"Metadata": "true"})
        with self._opener.open(request, timeout=timeout) as response:
            body: bytes = response.read(_MAX_RESPONSE_BYTES)
        return body

    def scheduled_events(self, timeout: float) -> EventsDocument:
        return parse_events(self._get(self.url, timeout))

    def vm_name(self, timeout: float) -> str:
        """This VM's name: HVDAZURE_VM_NAME if set, else the metadata service's compute/name."""
        name = os.environ.get(VM_NAME_ENV) or self._get(self.vm_name_url, timeout).decode().strip()
        if not name:
            raise ValueError(f"{self.vm_name_url} gave an empty VM name")
        return name


class ScheduledEventsNotices:
    """Azure Scheduled Events as an environment's PreemptionNotices (environment.py): a Preempt of this VM
    that is due is a notice; the core's PreemptionWatcher (core/preemption_watcher.py) polls and acts."""

    poll_seconds = 2.0
    timeout = 10.0
    # Azure: the first request of a VM turns the service on and "may take up to two minutes" to answer
    first_timeout = 130.0

    def __init__(self, scheduled_events_url: str | None = None) -> None:
        self.client = MetadataClient(scheduled_events_url or SCHEDULED_EVENTS_URL)
        self.where = f"Azure Scheduled Events at {self.client.url}"
        self.vm_name: str | None = None

    def due_notice(self, timeout: float) -> PreemptionNotice | None:
        if self.vm_name is None:
            self.vm_name = self.client.vm_name(timeout)
        event = self.client.scheduled_events(timeout).preemption_of(self.vm_name)
        if event is None or not event.due(datetime.now(timezone.utc)):
            return None
        when = event.not_before.isoformat() if event.not_before else "now"
        return PreemptionNotice(f"Azure preemption notice for {self.vm_name}",
                                f"event {event.event_id}, {event.status}, not before {when}")

    def watching(self) -> str:
        return f"Azure Scheduled Events for a preemption of {self.vm_name}"
