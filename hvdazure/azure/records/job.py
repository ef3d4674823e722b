"""What `hvdazure jobs` shows of a job, as values both SDKs fill in (v2/jobs.py, v1/jobs.py). No Azure SDK.

Both SDKs end up reading the same service for what a job did: Azure ML's Run History, whose run record
(camelCase JSON: `startTimeUtc`, `endTimeUtc`, `error.error.message`, `warnings[].message`) SDK v1 returns
from `Run.get_details()` and SDK v2 from its own Run History client; `run_facts` reads it once for both.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any

from hvdazure.azure.resolved_job import VERSION_TAG

# Azure ML's job statuses after which nothing changes (azure-ai-ml's RunHistoryConstants.TERMINAL_STATUSES)
TERMINAL_STATUSES = frozenset({"Completed", "Failed", "Canceled", "NotResponding", "Paused"})


@dataclass(frozen=True)
class RunFacts:
    """What Run History says a job did: when it ran, and the errors and warnings the service reported."""

    started: str | None = None  # ISO 8601, UTC
    ended: str | None = None
    error: str | None = None  # the service's error, one line
    warnings: tuple[str, ...] = ()

    def duration_s(self, now: datetime | None = None) -> float | None:
        """Seconds from start to end (to `now` while running); None before the job starts."""
        start = _parse_time(self.started)
        if start is None:
            return None
        end = _parse_time(self.ended) or now or datetime.now(timezone.utc)
        return max(0.0, (end - start).total_seconds())


@dataclass(frozen=True)
class JobSummary:
    """One job in `hvdazure jobs list`."""

    name: str
    status: str
    display_name: str | None
    created: str | None  # ISO 8601, UTC
    duration_s: float | None
    compute: str | None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def row(self) -> list[str]:
        return [self.name, self.status, format_duration(self.duration_s), self.created or "-",
                self.compute or "-", self.display_name or ""]


@dataclass(frozen=True)
class JobDetails:
    """One job as `hvdazure jobs show` reports it."""

    name: str
    sdk: str
    status: str
    experiment: str | None
    display_name: str | None
    compute: str | None
    nodes: int | None
    studio_url: str | None
    command: str | None  # what every rank ran (SDK v1: the script and its arguments)
    created: str | None
    facts: RunFacts = RunFacts()
    inputs: dict[str, str] = field(default_factory=dict)  # name -> URI
    outputs: dict[str, str] = field(default_factory=dict)  # name -> URI, or "" where the service chose it
    tags: dict[str, str] = field(default_factory=dict)
    job_type: str | None = None  # SDK v2's: command, sweep, pipeline, ...; None where the SDK does not say

    @property
    def hvdazure_version(self) -> str | None:
        """The hvdazure version that submitted the job (its tag), None for a job hvdazure did not submit."""
        return self.tags.get(VERSION_TAG)

    @property
    def ended(self) -> bool:
        return self.status in TERMINAL_STATUSES

    @property
    def argv(self) -> list[str]:
        """The command as words (empty when unknown or not shell-quoted)."""
        try:
            return shlex.split(self.command or "")
        except ValueError:
            return []

    def as_dict(self) -> dict[str, Any]:
        facts = self.facts
        return {"name": self.name, "sdk": self.sdk, "status": self.status, "experiment": self.experiment,
                "display_name": self.display_name, "compute": self.compute, "nodes": self.nodes,
                "studio_url": self.studio_url, "command": self.command,
                "hvdazure_version": self.hvdazure_version,
                "created": self.created, "started": facts.started, "ended": facts.ended,
                "duration_s": facts.duration_s(), "job_error": facts.error, "warnings": list(facts.warnings),
                "inputs": self.inputs, "outputs": self.outputs, "tags": self.tags}

    def report(self) -> list[str]:
        """The job for a person, one fact per line."""
        facts = self.facts
        lines = [f"job {self.name} (SDK {self.sdk}): {self.status}"
                 + (f", {format_duration(facts.duration_s())}" if facts.started else ""),
                 f"experiment: {self.experiment or '-'}; display name: {self.display_name or '-'}",
                 f"compute: {self.compute or '-'}, {self.nodes if self.nodes is not None else '?'} node(s)",
                 f"submitted by: hvdazure {self.hvdazure_version}" if self.hvdazure_version else
                 "submitted by: not hvdazure (no hvdazure tag)",
                 f"command: {self.command or '-'}",
                 f"created: {self.created or '-'}; started: {facts.started or '-'}; "
                 f"ended: {facts.ended or '-'}"]
        lines += [f"input {name}: {uri}" for name, uri in sorted(self.inputs.items())]
        lines += [f"output {name}: {uri or '(where Azure ML chose)'}"
                  for name, uri in sorted(self.outputs.items())]
        if facts.error:
            lines.append(f"error: {facts.error}")
        lines += [f"warning: {warning}" for warning in facts.warnings]
        lines.append(f"studio: {self.studio_url or 'unknown'}")
        return lines


def run_facts(record: Mapping[str, Any] | None) -> RunFacts:
    """A Run History run record (camelCase JSON, as both SDKs return it) as RunFacts."""
    if not record:
        return RunFacts()
    error = record.get("error") or {}
    root = error.get("error") if isinstance(error, Mapping) else None
    message = (root or {}).get("message") if isinstance(root, Mapping) else None
    code = (root or {}).get("code") if isinstance(root, Mapping) else None
    warnings = tuple(_one_line(w.get("message")) for w in record.get("warnings") or []
                     if isinstance(w, Mapping) and w.get("message"))
    line = _one_line(message) if message else None
    return RunFacts(started=iso_time(record.get("startTimeUtc")), ended=iso_time(record.get("endTimeUtc")),
                    error=f"{code}: {line}" if line and code else line, warnings=warnings)


def format_duration(seconds: float | None) -> str:
    """`1h 02m 03s`, `4m 05s`, `6s`; `-` when unknown."""
    if seconds is None:
        return "-"
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h {minutes:02d}m {secs:02d}s"
    return f"{minutes}m {secs:02d}s" if minutes else f"{secs}s"


def table(rows: list[list[str]], header: list[str]) -> list[str]:
    """Rows under a header, in columns as wide as their widest cell."""
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
            for row in [header, *rows]]


def _one_line(text: Any) -> str:
    from hvdazure.azure.errors import redact

    return " ".join(redact(str(text)).split())


def iso_time(value: Any) -> str | None:
    """A time as ISO 8601 in UTC (the SDKs give strings or datetimes)."""
    if value is None or value == "":
        return None
    if isinstance(value, datetime):
        moment = value if value.tzinfo else value.replace(tzinfo=timezone.utc)
        return moment.astimezone(timezone.utc).isoformat(timespec="seconds")
    parsed = _parse_time(str(value))
    return parsed.isoformat(timespec="seconds") if parsed else str(value)


def _parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return (moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)).astimezone(timezone.utc)
