"""torch_job.py as Azure ML would run it: from the job's folder (HVDAZURE_TEST_CWD: ./outputs lands there),
with the preemption watcher polling every HVDAZURE_TEST_POLL seconds. A guard ends the rank at once if the
watcher ever asks anything but 127.0.0.1: the tests never reach the real metadata service."""

import os
import runpy
import urllib.parse
from pathlib import Path

from hvdazure.core.environments import scheduled_events

os.chdir(os.environ["HVDAZURE_TEST_CWD"])
scheduled_events.ScheduledEventsNotices.poll_seconds = float(os.environ.get("HVDAZURE_TEST_POLL", "0.1"))
_get = scheduled_events.MetadataClient._get


def _loopback_only(client, url, timeout):
    if urllib.parse.urlsplit(url).hostname != "127.0.0.1":
        os.write(2, f"test guard: the watcher asked {url}, not 127.0.0.1\n".encode())
        os._exit(99)
    return _get(client, url, timeout)


scheduled_events.MetadataClient._get = _loopback_only
runpy.run_path(str(Path(__file__).with_name("torch_job.py")), run_name="__main__")
