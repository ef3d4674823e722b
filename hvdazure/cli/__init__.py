"""The `hvdazure` command: parses arguments and calls the package. No logic of its own lives here; each
subcommand's options are defined beside what runs it (launch/, sweep/, bench/, azure/, data/ options.py)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import traceback
from typing import TYPE_CHECKING, NoReturn

from hvdazure._version import __version__

if TYPE_CHECKING:
    from hvdazure.azure.sdk import Submitted
    from hvdazure.azure.submission import DryRunResult


def _run(args: argparse.Namespace) -> int:
    from hvdazure.launch.command import check_script_exists
    from hvdazure.launch.network import NetworkInterfaceError
    from hvdazure.launch.options import launch_spec
    from hvdazure.launch.supervisor import run_job
    from hvdazure.launch.timeline import prepare_timeline

    try:
        spec = launch_spec(args)
        check_script_exists(spec)
        if spec.timeline is not None:
            prepare_timeline(spec.timeline)
    except ValueError as exc:
        return _fail(str(exc))
    try:
        return run_job(spec, timeout_s=args.timeout, grace_s=args.grace, verbose=args.verbose).exit_code
    except (FileNotFoundError, NetworkInterfaceError) as exc:
        return _fail(str(exc))


def _sweep(args: argparse.Namespace) -> int:
    from hvdazure.core.config import ConfigError
    from hvdazure.launch.network import NetworkInterfaceError
    from hvdazure.sweep.launch import run_sweep
    from hvdazure.sweep.options import from_namespace

    try:
        return run_sweep(from_namespace(args), args.np, hosts=args.hosts, hostfile=args.hostfile,
                         network_interface=args.network_interface, timeout_s=args.timeout, grace_s=args.grace,
                         verbose=args.verbose).exit_code
    except (ConfigError, ValueError, FileNotFoundError, NetworkInterfaceError) as exc:
        return _fail(str(exc))


def _bench(args: argparse.Namespace) -> int:
    from hvdazure.bench.benchmark import BenchError
    from hvdazure.bench.runner import run

    try:
        return run(args, ["hvdazure", *sys.argv[1:]])
    except (BenchError, ValueError, FileNotFoundError) as exc:
        return _fail(str(exc))


def _doctor(args: argparse.Namespace) -> int:
    from hvdazure import doctor

    report = doctor.collect()
    if args.json:
        print(json.dumps(doctor.as_dict(report), indent=2))
    else:
        print(doctor.format_report(report))
    return 0 if report.ok else 1


def _submit(args: argparse.Namespace) -> int:
    from hvdazure.azure import errors, options, submission

    try:
        spec = options.job_spec(args)
        if args.dry_run:
            result: DryRunResult | Submitted = submission.dry_run(spec, args.output_yaml, sdk=args.sdk)
        elif args.output_yaml:
            return _fail("--output-yaml goes with --dry-run", args.json)
        else:
            result = submission.submit(spec, lambda: options.workspace(args), sdk=args.sdk,
                                       stream=args.stream, create_compute=options.compute_for_job(args))
    except errors.SubmitError as exc:
        if args.verbose and exc.__cause__ is not None:
            print(errors.redact("".join(traceback.format_exception(exc.__cause__))), file=sys.stderr, end="")
        return _fail(errors.redacted_line(exc), args.json)
    print(json.dumps(result.as_dict(), indent=2) if args.json else "\n".join(result.report()))
    return 0


def _jobs(args: argparse.Namespace) -> int:
    from hvdazure.azure import errors, jobs, options

    try:
        result = args.jobs_call(jobs.connect(args.sdk, lambda: options.workspace(args)), args)
    except errors.SubmitError as exc:
        if args.verbose and exc.__cause__ is not None:
            print(errors.redact("".join(traceback.format_exception(exc.__cause__))), file=sys.stderr, end="")
        return _fail(errors.redacted_line(exc), args.json)
    failure = result.failure()  # it ran, but found a failure: a damaged checkpoint, a job that failed
    answer = {**result.as_dict(), **({"error": failure, "exit_code": 2} if failure else {})}
    print(json.dumps(answer, indent=2) if args.json else "\n".join(result.report()))
    return _fail(failure) if failure else 0


def _azure_compute_create(args: argparse.Namespace) -> int:
    from hvdazure.azure import errors, options, submission

    try:
        cluster = options.compute_to_create(args)
        cluster.validate()
        info = submission.create_compute(cluster, options.workspace(args))
    except errors.SubmitError as exc:
        return _fail(errors.redacted_line(exc), args.json)
    print(json.dumps(dataclasses.asdict(info), indent=2) if args.json else info.describe())
    return 0


def _data_index(args: argparse.Namespace) -> int:
    from hvdazure.data import commands

    try:
        print(commands.index(args.source, args.output, progress=args.progress,
                             storage_options=args.storage_option, as_json=args.json))
    except (ValueError, OSError) as exc:  # OSError: a missing source, a StorageError
        return _fail(str(exc), args.json)
    return 0


def _data_pack(args: argparse.Namespace) -> int:
    from hvdazure.data import commands

    try:
        print(commands.pack(args.folder, args.output, args.format, args.shard_size,
                            samples_per_shard=args.samples_per_shard, shuffle=args.shuffle,
                            progress=args.progress, storage_options=args.storage_option, as_json=args.json))
    except (ValueError, TypeError, OSError) as exc:
        return _fail(str(exc), args.json)
    return 0


def _export(args: argparse.Namespace) -> int:
    from hvdazure.cli.export_options import config_args, export_request
    from hvdazure.core.errors import UserError
    from hvdazure.core.script.export import export_checkpoint
    from hvdazure.core.trainer_classes import trainer_class_in

    try:
        done = export_checkpoint(trainer_class_in(args.script, args.trainer), export_request(args),
                                 config_args(args))
    except UserError as exc:
        return _fail(str(exc), args.json)
    print(json.dumps(done.as_dict(), indent=2) if args.json else done.describe())
    return 0


def _fail(message: str, as_json: bool = False) -> int:
    """One line on stderr, exit status 2; with --json also the failure on stdout, where the result goes:
    `{"error": MESSAGE, "exit_code": 2}`."""
    print(f"hvdazure: error: {message}", file=sys.stderr)
    if as_json:
        print(json.dumps({"error": message, "exit_code": 2}, indent=2))
    return 2


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser that, when `trailing_dest` is set, stores everything after the first `--` there
    verbatim (a submitted script's own arguments), so that options may come before or after the script;
    and that hands the arguments to one of its `variants` when they start with its name (`hvdazure submit
    sweep ...`), parsing them itself otherwise (`hvdazure submit SCRIPT ...`); and whose errors are one
    line pointing to the help of the (sub)command that refused them, as JSON too when it was given --json.
    Every parser of the CLI is one (subparsers take their parent's class)."""

    trailing_dest: str | None = None
    variants: dict[str, argparse.ArgumentParser] | None = None
    _json_asked = False  # this parser's own arguments (not a script's, after --) hold its --json flag

    def parse_args(self, args=None, namespace=None):
        namespace, extras = self.parse_known_args(args, namespace)
        refusing = vars(namespace).pop(_LEFT_OVER_BY, self)  # the innermost (sub)command that left them
        if extras:
            refusing.error(f"unrecognized arguments: {' '.join(extras)}")
        return namespace

    def parse_known_args(self, args=None, namespace=None):
        if self.variants and args and args[0] in self.variants:
            return self.variants[args[0]].parse_known_args(args[1:], namespace)
        args = sys.argv[1:] if args is None else list(args)
        split = args.index("--") if self.trailing_dest is not None and "--" in args else len(args)
        self._json_asked = "--json" in args[:split] and any(
            isinstance(action, argparse._StoreTrueAction) and action.dest == "json"
            for action in self._actions)
        namespace, extras = super().parse_known_args(args[:split], namespace)
        if self.trailing_dest is not None:
            setattr(namespace, self.trailing_dest, args[split + 1:])
        if extras and not hasattr(namespace, _LEFT_OVER_BY):
            setattr(namespace, _LEFT_OVER_BY, self)
        return namespace, extras

    def error(self, message: str) -> NoReturn:
        """One line and exit status 2, as every other refusal of the CLI: argparse's own error prints the
        whole usage first, which buries the line that says what is wrong (the usage is a --help away)."""
        raise SystemExit(_fail(f"{' '.join(message.split())} (see {self.prog} --help)", self._json_asked))


_LEFT_OVER_BY = "_hvdazure_left_over_by"  # set on the namespace: which parser left arguments unrecognised


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for every subcommand, each defined in its package's options.py."""
    from hvdazure.azure import options as azure_options
    from hvdazure.azure.jobs import options as jobs_options
    from hvdazure.bench import options as bench_options
    from hvdazure.cli import export_options
    from hvdazure.data import options as data_options
    from hvdazure.launch import options as launch_options
    from hvdazure.sweep import options as sweep_options

    parser = _Parser(
        prog="hvdazure",
        description="Horovod data-parallel training for PyTorch and TensorFlow, from a laptop to Azure ML.",
    )
    parser.add_argument("--version", action="version", version=f"hvdazure {__version__}")
    sub = parser.add_subparsers(dest="subcommand", metavar="COMMAND", required=True, parser_class=_Parser)

    launch_options.add_parser(sub).set_defaults(func=_run)
    sweep = sweep_options.add_parser(sub)
    sweep.trailing_dest = "script_args"
    sweep.set_defaults(func=_sweep)
    bench_options.add_parser(sub).set_defaults(func=_bench)
    doctor = sub.add_parser("doctor", help="report versions, Horovod's build, MPI, GPUs and what is missing",
                            description="Exit status is non-zero when Horovod cannot run here.")
    doctor.add_argument("--json", action="store_true", help="print the report as JSON")
    doctor.set_defaults(func=_doctor)
    command_job, sweep_job, in_job_sweep = azure_options.add_submit_parsers(sub, _Parser)
    for submit in (command_job, sweep_job, in_job_sweep):
        submit.trailing_dest = "script_args"
        submit.set_defaults(func=_submit)
    command_job.variants = {"sweep": sweep_job, "in-job-sweep": in_job_sweep}
    azure_options.add_azure_parser(sub).set_defaults(func=_azure_compute_create)
    for jobs_action in jobs_options.add_jobs_parser(sub):
        jobs_action.set_defaults(func=_jobs)
    index, pack = data_options.add_parser(sub)
    index.set_defaults(func=_data_index)
    pack.set_defaults(func=_data_pack)
    export_options.add_parser(sub).set_defaults(func=_export)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)

