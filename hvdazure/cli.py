"""The `hvdazure` command: parses arguments and calls the package. No logic of its own lives here."""

from __future__ import annotations

import argparse
import json
import sys

from hvdazure._version import __version__


def _run(args: argparse.Namespace) -> int:
    from hvdazure.launch.command import LaunchSpec, check_script_exists
    from hvdazure.launch.supervisor import run_job

    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    try:
        spec = LaunchSpec(num_proc=args.np, command=command, hosts=args.hosts, hostfile=args.hostfile,
                          controller=args.controller)
        check_script_exists(spec)
    except ValueError as exc:
        return _fail(str(exc))
    try:
        return run_job(spec, timeout_s=args.timeout, grace_s=args.grace, verbose=args.verbose).exit_code
    except FileNotFoundError as exc:
        return _fail(str(exc))


def _doctor(args: argparse.Namespace) -> int:
    from hvdazure import doctor

    report = doctor.collect()
    if args.json:
        print(json.dumps(doctor.as_dict(report), indent=2))
    else:
        print(doctor.format_report(report))
    return 0 if report.ok else 1


def _fail(message: str) -> int:
    print(f"hvdazure: error: {message}", file=sys.stderr)
    return 2


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for every subcommand."""
    parser = argparse.ArgumentParser(
        prog="hvdazure",
        description="Horovod data-parallel training for PyTorch and TensorFlow, from a laptop to Azure ML.",
    )
    parser.add_argument("--version", action="version", version=f"hvdazure {__version__}")
    sub = parser.add_subparsers(dest="subcommand", metavar="COMMAND", required=True)

    run = sub.add_parser(
        "run", help="run a script or command on N ranks (Gloo via horovodrun, or MPI via mpirun)",
        description="Start COMMAND on N ranks with rank-tagged output. If any rank fails, every rank is "
                    "stopped and the exit code is the failing rank's. Ctrl-C, SIGTERM or SIGHUP give every "
                    "rank SIGTERM and --grace seconds, then exit 128 + the signal; no rank outlives this "
                    "command, even killed outright. A bare `train.py` runs with this Python interpreter.",
        epilog="examples:\n  hvdazure run -np 2 train.py --set epochs=3\n"
               "  hvdazure run -np 8 -H node1:4,node2:4 --mpi -- python train.py",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("-np", "--num-proc", dest="np", type=int, required=True, help="number of ranks")
    hosts = run.add_mutually_exclusive_group()
    hosts.add_argument("-H", "--hosts", help="host:slots,... (default: localhost:N)")
    hosts.add_argument("--hostfile", help="file with one `host slots=N` per line")
    controller = run.add_mutually_exclusive_group()
    controller.add_argument("--gloo", dest="controller", action="store_const", const="gloo",
                            help="Gloo controller via horovodrun (default)")
    controller.add_argument("--mpi", dest="controller", action="store_const", const="mpi",
                            help="MPI controller via mpirun")
    run.add_argument("--timeout", type=_positive_float, metavar="S",
                     help="stop every rank and exit 124 after S seconds")
    run.add_argument("--grace", type=_positive_float, default=30.0, metavar="S",
                     help="seconds ranks get after SIGTERM (timeout, Ctrl-C, preemption) to save a final "
                          "checkpoint before they are killed (default: 30)")
    run.add_argument("-v", "--verbose", action="store_true",
                     help="also show the launcher's own report when a rank fails (horovodrun's traceback, "
                          "mpirun's summary); hvdazure's one-line summary names the rank either way")
    run.add_argument("command", nargs=argparse.REMAINDER, help="script.py [args] or -- COMMAND [args]")
    run.set_defaults(func=_run, controller="gloo")

    doctor = sub.add_parser("doctor", help="report versions, Horovod's build, MPI, GPUs and what is missing",
                            description="Exit status is non-zero when Horovod cannot run here.")
    doctor.add_argument("--json", action="store_true", help="print the report as JSON")
    doctor.set_defaults(func=_doctor)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
