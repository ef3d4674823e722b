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

PreemptionWatcher polls from a daemon thread on local rank 0 of each node (one watcher per VM: GPU scale
sets may deliver a VM's events to that VM only) and calls `trainer.request_checkpoint_and_exit`: every rank
saves at the next step, through the per-step stop vote, and exits 143. It never stops training by itself
failing: an unreachable endpoint or a malformed document is logged once and tried again at the next poll.

Stdlib only (urllib): the Azure ML environment (azureml.py) imports it inside every Azure ML job.
"""

from __future__ import annotations

import email.utils
import json
import logging
import os
import threading
import urllib.parse
import urllib.request
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from hvdazure.core.callbacks import Callback
from hvdazure.core.rank_logging import logger

if TYPE_CHECKING:
    from hvdazure.core.trainer import Trainer

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


class PreemptionWatcher(Callback):
    """On local rank 0 of each node: polls Scheduled Events and, on a Preempt of this VM, asks every rank to
    checkpoint at the next step and exit 143 (Trainer.request_checkpoint_and_exit)."""

    poll_seconds = 2.0
    request_timeout = 10.0
    # Azure: the first request of a VM turns the service on and "may take up to two minutes" to answer
    first_request_timeout = 130.0

    def __init__(self, scheduled_events_url: str | None = None) -> None:
        self.client = MetadataClient(scheduled_events_url or SCHEDULED_EVENTS_URL)
        self.vm_name: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def on_train_start(self, trainer: Trainer) -> None:
        if trainer.local_rank != 0:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._watch, args=(trainer,), name="hvdazure-preemption-watch",
                                        daemon=True)
        self._thread.start()

    def on_train_end(self, trainer: Trainer) -> None:
        self._stop.set()  # not joined: a request may be in flight; the daemon thread ends after it

    def _watch(self, trainer: Trainer) -> None:
        answered = reported = False
        while not self._stop.is_set():
            try:
                timeout = self.request_timeout if answered else self.first_request_timeout
                if self.vm_name is None:
                    self.vm_name = self.client.vm_name(timeout)
                document = self.client.scheduled_events(timeout)
                if not answered:
                    logger.info(f"watching Azure Scheduled Events for a preemption of {self.vm_name}")
                answered = True
                event = document.preemption_of(self.vm_name)
                if event is not None and event.due(datetime.now(timezone.utc)):
                    self._request_checkpoint(trainer, self.vm_name, event)
                    return
            except Exception as exc:  # never let the watcher end training: say so once, try again
                if not reported:
                    _tell(trainer, f"Azure Scheduled Events unavailable at {self.client.url} ({exc}); trying "
                                   f"again every {self.poll_seconds:g} s")
                reported = True
            self._stop.wait(self.poll_seconds)

    def _request_checkpoint(self, trainer: Trainer, vm_name: str, event: ScheduledEvent) -> None:
        reason = f"Azure preemption notice for {vm_name}"
        when = event.not_before.isoformat() if event.not_before else "now"
        _tell(trainer, f"{reason} (event {event.event_id}, {event.status}, not before {when}): every rank "
                       "saves a checkpoint at the next step, then exits")
        trainer.request_checkpoint_and_exit(reason)


def _tell(trainer: Trainer, message: str) -> None:
    # Ranks other than 0 log errors only; a node's watcher must still be heard in that node's log.
    logger.log(logging.WARNING if trainer.rank == 0 else logging.ERROR, message)
