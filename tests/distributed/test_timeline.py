"""`hvdazure run --timeline FILE` on 2 real ranks: rank 0 writes Horovod's timeline there under either
controller, and the job's last line says where it is and how to open it."""

import json

import pytest
from harness import CONTROLLERS, run_job


def trace_events(text: str) -> list[dict]:
    """Horovod's timeline: a JSON array of trace events, written as they come, whose closing bracket may be
    missing (a job that ended before Horovod closed it) and whose last event may be cut short: the events
    read one by one up to the first that does not parse."""
    decoder, events = json.JSONDecoder(), []
    assert text.lstrip().startswith("["), text[:200]
    at = text.index("[") + 1
    while True:
        while at < len(text) and text[at] in " \t\r\n,":
            at += 1
        if at >= len(text) or text[at] == "]":
            return events
        try:
            event, at = decoder.raw_decode(text, at)
        except json.JSONDecodeError:
            return events
        events.append(event)


@pytest.mark.parametrize("controller", CONTROLLERS)
def test_the_timeline_holds_the_jobs_allreduces(tmp_path, controller):
    timeline = tmp_path / "traces" / "timeline.json"  # its folder does not exist yet
    job = run_job("collectives.py", "torch", out_dir=tmp_path, controller=controller,
                  launcher_args=("--timeline", str(timeline)), timeout=60,
                  env={"HOROVOD_TIMELINE": str(tmp_path / "ignored.json")})

    assert job.returncode == 0, job.output
    events = trace_events(timeline.read_text())
    tensors = {event["args"]["name"] for event in events if event.get("name") == "process_name"
               and "name" in event.get("args", {})}
    assert {"allreduce.sum", "allreduce.avg"} <= tensors, events
    assert {"NEGOTIATE_ALLREDUCE", "ALLREDUCE"} <= {event.get("name") for event in events}, events
    assert not (tmp_path / "ignored.json").exists()  # --timeline wins over the environment's
    assert (f"hvdazure run: Horovod timeline written to {timeline}; open it in chrome://tracing or "
            "https://ui.perfetto.dev") in job.stderr
