"""Azure Scheduled Events: reading the document, and the watcher that answers a Preempt of this VM with a
checkpoint request. Every request goes to a local stand-in (fakes/metadata_service.py) on 127.0.0.1."""

import json
import logging
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import pytest
from fakes.metadata_service import FakeMetadataService, InSeconds, document, preempt

from hvdazure import TrainConfig
from hvdazure.core.config import ConfigError
from hvdazure.core.default_callbacks import default_callbacks
from hvdazure.core.environments import detect_environment
from hvdazure.core.environments.scheduled_events import (
    VM_NAME_ENV,
    MetadataClient,
    ScheduledEvent,
    ScheduledEventsNotices,
    parse_events,
)
from hvdazure.core.preemption_watcher import PreemptionWatcher
from hvdazure.core.rank_logging import logger

NOW = datetime(2026, 4, 11, 22, 26, 28, tzinfo=timezone.utc)

# "Example responses" of https://learn.microsoft.com/azure/virtual-machines/linux/scheduled-events
# (MicrosoftDocs/azure-compute-docs articles/virtual-machines/linux/scheduled-events.md), second document
DOCUMENTED_FREEZE = (
    '{"DocumentIncarnation":  2, "Events":  [{"EventId":  "C7061BAC-AFDC-4513-B24B-AA5F13A16123", '
    '"EventStatus":  "Scheduled", "EventType":  "Freeze", "ResourceType":  "VirtualMachine", '
    '"Resources":  ["WestNO_0", "WestNO_1"], "NotBefore":  "Mon, 11 Apr 2026 22:26:58 GMT", '
    '"Description":  "Virtual machine is being paused because of a memory-preserving Live Migration '
    'operation.", "EventSource":  "Platform", "DurationInSeconds":  5}]}'
)


def _preempt_document(*vms, status="Scheduled", not_before="Mon, 11 Apr 2026 22:26:58 GMT"):
    return json.dumps(document(7, preempt("E1", *vms, status=status, not_before=not_before)))


# --- the document ---------------------------------------------------------------------------------------
def test_the_documented_example_is_read_field_by_field():
    doc = parse_events(DOCUMENTED_FREEZE)
    assert doc.incarnation == 2
    assert doc.events == (ScheduledEvent("C7061BAC-AFDC-4513-B24B-AA5F13A16123", "Freeze", "Scheduled",
                                         ("WestNO_0", "WestNO_1"), datetime(2026, 4, 11, 22, 26, 58,
                                                                           tzinfo=timezone.utc)),)


def test_an_empty_events_list_means_nothing_is_scheduled():
    assert parse_events('{"DocumentIncarnation": 1, "Events": []}').preemption_of("vm-0") is None


def test_a_preempt_naming_this_vm_is_found_whatever_the_case_of_the_name():
    event = parse_events(_preempt_document("other-vm", "VM-0")).preemption_of("vm-0")
    assert event is not None and event.event_id == "E1"


def test_a_preempt_of_other_vms_only_is_not_this_vms():
    assert parse_events(_preempt_document("vm-1", "vm-2")).preemption_of("vm-0") is None


def test_other_event_types_for_this_vm_are_not_preemptions():
    assert parse_events(DOCUMENTED_FREEZE).preemption_of("WestNO_0") is None


@pytest.mark.parametrize(("payload", "message"), [
    ("<html>", "not JSON"),
    ('{"DocumentIncarnation": 1}', "no 'Events' list"),
    ('{"DocumentIncarnation": "x", "Events": []}', "DocumentIncarnation 'x'"),
    ('{"Events": ["E1"]}', "not an object"),
    ('{"Events": [{"EventId": "E1", "Resources": "vm-0"}]}', "Resources 'vm-0'"),
])
def test_a_malformed_document_is_a_value_error_saying_what_is_wrong(payload, message):
    with pytest.raises(ValueError, match=message):
        parse_events(payload)


# --- when to act ----------------------------------------------------------------------------------------
def _event(status="Scheduled", not_before=NOW + timedelta(seconds=30)):
    return ScheduledEvent("E1", "Preempt", status, ("vm-0",), not_before)


def test_azures_usual_30_second_preempt_notice_is_acted_on_at_once():
    assert _event().due(NOW)


def test_a_notice_further_ahead_waits_until_30_seconds_remain():
    event = _event(not_before=NOW + timedelta(seconds=90))
    assert not event.due(NOW)
    assert event.due(NOW + timedelta(seconds=60))


@pytest.mark.parametrize("event", [_event(status="Started", not_before=None), _event(not_before=None)],
                         ids=["started", "no-time"])
def test_a_started_event_or_one_without_a_time_is_acted_on_at_once(event):
    assert event.due(NOW)


@pytest.mark.parametrize(("text", "expected"), [
    ("Mon, 11 Apr 2026 22:26:58 GMT", datetime(2026, 4, 11, 22, 26, 58, tzinfo=timezone.utc)),
    ("2026-04-11T22:26:58Z", datetime(2026, 4, 11, 22, 26, 58, tzinfo=timezone.utc)),
    ("", None),
    ("soon", None),
])
def test_not_before_is_read_as_documented_or_iso_and_blank_or_unreadable_means_unknown(text, expected):
    assert parse_events(_preempt_document("vm-0", not_before=text)).events[0].not_before == expected


# --- talking to the metadata service ---------------------------------------------------------------------
def test_the_client_sends_the_metadata_header_and_reads_the_vm_name_at_the_same_host(monkeypatch):
    monkeypatch.delenv(VM_NAME_ENV, raising=False)
    with FakeMetadataService([document(1)], vm_name="aml-node_3") as service:
        client = MetadataClient(service.url)
        assert client.vm_name(timeout=5) == "aml-node_3"
        assert client.scheduled_events(timeout=5).incarnation == 1
    assert [(r["path"], r["metadata"]) for r in service.requests] == [
        ("/metadata/instance/compute/name?api-version=2021-02-01&format=text", "true"),
        ("/metadata/scheduledevents?api-version=2020-07-01", "true"),
    ]


def test_the_vm_name_can_be_given_in_the_environment_instead(monkeypatch):
    monkeypatch.setenv(VM_NAME_ENV, "named-by-hand")
    with FakeMetadataService([document(1)]) as service:
        assert MetadataClient(service.url).vm_name(timeout=5) == "named-by-hand"
    assert service.requests == []


def test_the_client_ignores_http_proxies(monkeypatch):
    for name in ("HTTP_PROXY", "http_proxy"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")  # nothing listens there
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    with FakeMetadataService([document(4)]) as service:
        assert MetadataClient(service.url).scheduled_events(timeout=5).incarnation == 4


def test_the_client_refuses_a_redirect():
    with FakeMetadataService([document(1)]) as target, \
            FakeMetadataService([document(1)], redirect_to=target.url) as service, \
            pytest.raises(OSError, match="307"):
        MetadataClient(service.url).scheduled_events(timeout=5)
    assert target.requests == []


# --- the watcher ------------------------------------------------------------------------------------------
class FakeTrainer:
    def __init__(self, rank=0, local_rank=0):
        self.rank, self.local_rank = rank, local_rank
        self.requests: list[str] = []

    def request_checkpoint_and_exit(self, reason):
        self.requests.append(reason)


def _watch(service, trainer=None):
    watcher = PreemptionWatcher(ScheduledEventsNotices(service.url))
    watcher.notices.poll_seconds = 0.02
    trainer = trainer or FakeTrainer()
    watcher.on_train_start(trainer)
    return watcher, trainer


def _wait_for(predicate, what, timeout=20):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


@pytest.fixture
def logged(monkeypatch):
    monkeypatch.delenv(VM_NAME_ENV, raising=False)
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield records
    logger.removeHandler(handler)
    logger.setLevel(level)


def test_a_preempt_of_this_vm_asks_for_a_checkpoint_once_and_stops_polling(logged):
    timeline = [document(1), document(2, preempt("P-this", "vm-0"))]
    with FakeMetadataService(timeline) as service:
        watcher, trainer = _watch(service)
        _wait_for(lambda: trainer.requests, "the checkpoint request")
        watcher._thread.join(timeout=5)
        assert not watcher._thread.is_alive()
    assert trainer.requests == ["Azure preemption notice for vm-0"]
    assert service.served() == [0, 1]
    assert any("event P-this" in r.getMessage() for r in logged)


def test_a_withdrawn_notice_and_notices_of_other_vms_are_ignored(logged):
    timeline = [
        document(1),
        document(2, preempt("P-far", "vm-0", not_before=InSeconds(600))),  # this VM, well ahead ...
        document(3),  # ... and withdrawn
        document(4, preempt("P-other", "vm-1")),  # another VM of the scale set
        document(5, preempt("P-other", "vm-1", status="Started", not_before="")),
    ]
    with FakeMetadataService(timeline) as service:
        watcher, trainer = _watch(service)
        _wait_for(lambda: service.served().count(4) >= 3, "the whole timeline to be played")
        watcher.on_train_end(trainer)
        watcher._thread.join(timeout=5)
    assert set(service.served()) == {0, 1, 2, 3, 4}
    assert trainer.requests == []


def test_an_unreachable_endpoint_is_logged_once_and_tried_again(logged):
    timeline = [document(1, preempt("P-this", "vm-0"))]
    with FakeMetadataService(timeline, failures=5) as service:
        _, trainer = _watch(service)
        _wait_for(lambda: trainer.requests, "the checkpoint request after the failures")
    problems = [r.getMessage() for r in logged if "unavailable" in r.getMessage()]
    assert len(problems) == 1 and "HTTP Error 500" in problems[0]
    assert service.served() == [-1] * 5 + [0]


def test_a_watcher_runs_on_local_rank_0_only():
    with FakeMetadataService([document(1, preempt("P-this", "vm-0"))]) as service:
        watcher, trainer = _watch(service, FakeTrainer(rank=5, local_rank=1))
        time.sleep(0.2)
    assert watcher._thread is None and service.requests == [] and trainer.requests == []


# --- configuration and wiring -----------------------------------------------------------------------------
AZURE_ML_ENV = {"AZUREML_RUN_ID": "example_1700000000_0a1b2c3d"}


def _default_callbacks(monkeypatch, env, checkpoints=True, **config):
    for name in ("AZUREML_RUN_ID", "AZ_BATCHAI_MPI_MASTER_NODE", "AZ_BATCH_MASTER_NODE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    loop = SimpleNamespace(config=TrainConfig(**config), checkpoints=object() if checkpoints else None,
                           _context=None, environment=detect_environment())
    return [cb for cb in default_callbacks(loop.config, loop.environment, loop.checkpoints, loop._context)
            if isinstance(cb, PreemptionWatcher)]


def test_the_watcher_is_on_by_default_inside_azure_ml_at_the_configured_url(monkeypatch):
    [watcher] = _default_callbacks(monkeypatch, AZURE_ML_ENV, scheduled_events_url="http://127.0.0.1:1/se")
    assert watcher.notices.client.url == "http://127.0.0.1:1/se"


def test_the_watcher_is_off_by_default_elsewhere(monkeypatch):
    assert _default_callbacks(monkeypatch, {}) == []


def test_the_watcher_can_be_turned_off_inside_azure_ml(monkeypatch):
    assert _default_callbacks(monkeypatch, AZURE_ML_ENV, preemption_watch=False) == []


def test_the_watcher_can_be_turned_on_elsewhere_with_checkpoints(monkeypatch):
    assert len(_default_callbacks(monkeypatch, {}, preemption_watch=True)) == 1


def test_the_watcher_without_checkpoints_is_a_config_error_naming_the_field(monkeypatch):
    with pytest.raises(ConfigError, match="'preemption_watch': true needs checkpoint_dir"):
        _default_callbacks(monkeypatch, {}, checkpoints=False, preemption_watch=True)


@pytest.mark.parametrize(("field", "value", "message"), [
    ("scheduled_events_url", "169.254.169.254/metadata/scheduledevents", "must be an http:// or https://"),
    ("preemption_watch", "yes", "is not true or false or null"),
])
def test_bad_preemption_settings_are_config_errors(field, value, message):
    with pytest.raises(ConfigError, match=f"'{field}'.*{message}"):
        TrainConfig(**{field: value})


def test_the_default_url_is_azures_documented_endpoint(monkeypatch):
    assert TrainConfig().scheduled_events_url is None  # the environment's own address
    [watcher] = _default_callbacks(monkeypatch, AZURE_ML_ENV)
    assert watcher.notices.client.url == "http://169.254.169.254/metadata/scheduledevents?api-version=2020-07-01"


def test_importing_the_module_loads_no_azure_sdk_or_framework():
    probe = ("import sys, json, hvdazure.core.environments.scheduled_events\n"
             "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules} & "
             "{'torch', 'tensorflow', 'keras', 'horovod', 'azure', 'azureml', 'mlflow', 'requests'})))")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert json.loads(result.stdout) == []
