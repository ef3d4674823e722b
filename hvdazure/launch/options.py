"""The options of `hvdazure run`, and those of where ranks run and how a job stops, which `hvdazure sweep`
takes as well (both jobs run under supervisor.py); with what they ask for as a LaunchSpec.

argparse only: the CLI builds its parser from here, and `hvdazure --help` stays fast.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, TypeVar

from hvdazure.core.durations import DurationAction

if TYPE_CHECKING:
    from hvdazure.launch.command import LaunchSpec

P = TypeVar("P", bound=argparse.ArgumentParser)  # the CLI's parser class: its subcommands' parsers are one


def step_range(text: str) -> str:
    """An argparse type: optimizer steps `FIRST-LAST` or `N` (TrainConfig's profile_steps), refused in one
    line otherwise; kept as given."""
    from hvdazure.core.config import parse_step_range

    try:
        parse_step_range(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text.strip()


def add_job_arguments(parser: argparse.ArgumentParser) -> None:
    """Where the ranks run and how the job is stopped: the options `hvdazure run` and `hvdazure sweep` share
    (the job's supervisor is the same, launch/supervisor.py)."""
    hosts = parser.add_mutually_exclusive_group()
    hosts.add_argument("-H", "--hosts", help="host:slots,... (default: localhost:N)")
    hosts.add_argument("--hostfile", help="file with one `host slots=N` per line")
    parser.add_argument("--network-interface", metavar="IFACE|CIDR",
                        help="the interface ranks on different nodes talk over, by name (eth0) or subnet "
                             "(10.0.0.0/24); default: the route to the other hosts, when unambiguous")
    parser.add_argument("--timeout", action=DurationAction, positive=True, metavar="DURATION",
                        help="stop every rank and exit 124 after this long: seconds (90) or units (90s, "
                             "15m, 2h, 1d, 1h30m); a sweep's running trials save a checkpoint first and "
                             "resume when it is started again; the stacks of every process of the job go "
                             "into the run's log, to show where it hung")
    parser.add_argument("--grace", action=DurationAction, positive=True, default=30.0, metavar="DURATION",
                        help="how long ranks get after SIGTERM (timeout, Ctrl-C, preemption) to save a "
                             "final checkpoint before they are killed: seconds or units, as --timeout "
                             "(default: 30)")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="also show the launcher's own report when a rank fails (horovodrun's traceback, "
                             "mpirun's summary), and every rank's traceback in full (by default an error on "
                             "several ranks is shown once); hvdazure's one-line summary names the rank "
                             "either way")


def add_controller_arguments(parser: argparse.ArgumentParser, mpi_help: str) -> None:
    """--gloo or --mpi (args.controller; None: launch/controller.py's default), for every command that
    starts a job."""
    controller = parser.add_mutually_exclusive_group()
    controller.add_argument("--gloo", dest="controller", action="store_const", const="gloo",
                            help="Gloo controller via horovodrun (default where MPI cannot run)")
    controller.add_argument("--mpi", dest="controller", action="store_const", const="mpi", help=mpi_help)


def add_parser(sub: argparse._SubParsersAction[P]) -> P:
    """`hvdazure run -np N COMMAND`. Returns the parser, for the CLI to give it what runs it."""
    run = sub.add_parser(
        "run", help="run a script or command on N ranks (MPI via mpirun, or Gloo via horovodrun)",
        description="Start COMMAND on N ranks with rank-tagged output. If any rank fails, every rank is "
                    "stopped and the exit code is the failing rank's. Ctrl-C, SIGTERM or SIGHUP give every "
                    "rank SIGTERM and --grace seconds, then exit 128 + the signal; no rank outlives this "
                    "command, even killed outright. A bare `train.py` runs with this Python interpreter.",
        epilog="examples:\n  hvdazure run -np 2 train.py --set epochs=3\n"
               "  hvdazure run -np 8 -H node1:4,node2:4 --mpi -- python train.py",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("-np", "--num-proc", dest="np", type=int, required=True, help="number of ranks")
    add_controller_arguments(run, "MPI controller via mpirun (default where mpirun is on PATH and Horovod is "
                                  "built with its MPI: `hvdazure doctor` says which)")
    add_job_arguments(run)
    run.add_argument("--timeline", metavar="FILE",
                     help="record Horovod's timeline of the job's collectives (when each tensor was "
                          "negotiated and allreduced, as rank 0 saw it) into FILE, a Chrome trace to open in "
                          "chrome://tracing or https://ui.perfetto.dev. Sets HOROVOD_TIMELINE for every "
                          "rank, over one already in the environment (set HOROVOD_TIMELINE_MARK_CYCLES=1 "
                          "there to mark Horovod's cycles too). A relative FILE is from the current "
                          "directory; its folder is created")
    run.add_argument("--profile", metavar="STEPS", type=step_range,
                     help="record a profiler trace of these optimizer steps on rank 0 (FIRST-LAST, e.g. 3-5, "
                          "past the first step's start-up; or one step) into the training's "
                          "output_dir/profile: torch.profiler's Chrome trace (Perfetto, chrome://tracing), "
                          "or TensorFlow's for TensorBoard's Profile tab. Sets HVDAZURE_PROFILE_STEPS for "
                          "every rank, which wins over the config's profile_steps")
    run.add_argument("command", nargs=argparse.REMAINDER, help="script.py [args] or -- COMMAND [args]")
    run.set_defaults(controller=None)
    return run


def launch_spec(args: argparse.Namespace) -> LaunchSpec:
    """`hvdazure run`'s options as a LaunchSpec (a leading `--` before COMMAND dropped, --timeline made
    absolute, --profile as the ranks' HVDAZURE_PROFILE_STEPS); ValueError on a layout that cannot run."""
    from hvdazure.core.profiling import PROFILE_ENV
    from hvdazure.launch.command import LaunchSpec
    from hvdazure.launch.timeline import absolute_timeline

    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    timeline = absolute_timeline(args.timeline) if args.timeline is not None else None
    profile = {PROFILE_ENV: args.profile} if args.profile is not None else {}
    return LaunchSpec(num_proc=args.np, command=command, hosts=args.hosts, hostfile=args.hostfile,
                      controller=args.controller, network_interface=args.network_interface, timeline=timeline,
                      extra_env=profile)
