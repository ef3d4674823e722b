"""The options of `hvdazure jobs list | show | stream | cancel | download`, and which function of
hvdazure.azure.jobs each calls with them.

argparse only, and the jobs' functions (jobs/__init__.py) on first use: the CLI builds its parser from here,
and `hvdazure --help` loads no Azure SDK.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from hvdazure.azure.options import add_workspace_arguments

if TYPE_CHECKING:
    from hvdazure.azure.jobs import JobsClient, Result

P = TypeVar("P", bound=argparse.ArgumentParser)

_DESCRIPTION = (
    "A submitted job's life: list an experiment's jobs, show one (its status, layout, inputs and outputs, "
    "the hvdazure version and command it ran, and a preemption the service reports, with the command that "
    "resumes it), stream its logs, cancel it, download its files and outputs (checkpoints verified). SDK "
    "v2 (azure-ai-ml) by default; --sdk v1 for jobs submitted with azureml-core.")


def add_jobs_parser(sub: argparse._SubParsersAction[P]) -> list[P]:
    """`hvdazure jobs ACTION ...`; returns the parsers of the actions, each with `jobs_call` set (what it
    calls with a connected JobsClient and its arguments) for the CLI to run."""
    jobs = sub.add_parser("jobs", help="list, show, stream, cancel and download Azure ML jobs",
                          description=_DESCRIPTION)
    actions = jobs.add_subparsers(dest="jobs_action", metavar="ACTION", required=True)

    listing = actions.add_parser("list", help="an experiment's recent jobs, with status and duration",
                                 description="An experiment's newest jobs, newest first: status, duration "
                                             "(start to end, or to now while running), creation time, "
                                             "compute.")
    listing.add_argument("--experiment", help="experiment name (default: this directory's name, as `hvdazure "
                                              "submit` names it)")
    listing.add_argument("--limit", type=_count, default=10, metavar="N", help="how many jobs (default: 10)")
    listing.set_defaults(jobs_call=_list)

    show = actions.add_parser("show", help="a job's status, compute, nodes, studio URL, inputs, outputs, "
                                           "hvdazure version and command; preemption and how to resume",
                              description="One job as Azure ML reports it. Where the service reports the "
                                          "job preempted, a line says at which step (its last checkpoint's) "
                                          "and the command that resumes it.")
    show.add_argument("name", help="the job's name (what `hvdazure submit` printed)")
    show.set_defaults(jobs_call=_show)

    stream = actions.add_parser("stream", help="follow a job's logs until it ends",
                                description="Print the job's logs until it ends, as `hvdazure submit "
                                            "--stream` does; the exit status is 2 unless it completed.")
    stream.add_argument("name", help="the job's name")
    stream.set_defaults(jobs_call=_stream)

    cancel = actions.add_parser("cancel", help="cancel a job", description="Ask Azure ML to cancel the job "
                                                                           "(one that has ended is refused).")
    cancel.add_argument("name", help="the job's name")
    cancel.set_defaults(jobs_call=_cancel)

    download = actions.add_parser(
        "download", help="download a job's files and outputs; checkpoints verified",
        description="Download the job's files (./outputs, logs) to DIR/artifacts and its named outputs to "
                    "DIR/named-outputs/NAME, or only --output NAME. Nothing is put in place before the "
                    "download is complete; every checkpoint among them is verified against its manifest, "
                    "and a damaged one is renamed NAME.damaged and reported (exit status 2).")
    download.add_argument("name", help="the job's name")
    download.add_argument("--output", metavar="NAME", help="only this named output (SDK v2)")
    download.add_argument("--to", metavar="DIR", help="where to (default: ./NAME, the job's name)")
    download.set_defaults(jobs_call=_download)

    parsers = [listing, show, stream, cancel, download]
    for parser in parsers:
        add_workspace_arguments(parser)
        common = parser.add_argument_group("SDK and output")
        common.add_argument("--sdk", default="v2", help="v2 (azure-ai-ml, default) or v1 (azureml-core, for "
                                                        "jobs submitted with --sdk v1)")
        common.add_argument("--json", action="store_true", help="print the result as JSON")
        common.add_argument("-v", "--verbose", action="store_true",
                            help="show the SDK's traceback on failure")
    return parsers


def _count(text: str) -> int:
    """--limit's value, checked as it is parsed (before any workspace is looked for)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def default_experiment() -> str:
    """`hvdazure submit`'s default experiment: the name of the code directory, here the current one."""
    from hvdazure.azure.spec.job import _experiment_name

    return _experiment_name(Path.cwd())


def _list(client: JobsClient, args: argparse.Namespace) -> Result:
    from hvdazure.azure import jobs

    return jobs.list_jobs(client, args.experiment or default_experiment(), args.limit)


def _show(client: JobsClient, args: argparse.Namespace) -> Result:
    from hvdazure.azure import jobs

    return jobs.show_job(client, args.name)


def _stream(client: JobsClient, args: argparse.Namespace) -> Result:
    from hvdazure.azure import jobs

    return jobs.stream_job(client, args.name, out=sys.stderr if args.json else None)  # stdout: the JSON


def _cancel(client: JobsClient, args: argparse.Namespace) -> Result:
    from hvdazure.azure import jobs

    return jobs.cancel_job(client, args.name)


def _download(client: JobsClient, args: argparse.Namespace) -> Result:
    from hvdazure.azure import jobs

    return jobs.download_job(client, args.name, output=args.output, to=args.to)
