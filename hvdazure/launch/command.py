"""Turning a launch request into the `mpirun` or `horovodrun` command line that starts it.

Pure functions of their inputs (no processes are started here), so every flag is unit-testable.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from hvdazure.core.nccl_environment import nccl_environment
from hvdazure.launch.network import CrossNodeInterface
from hvdazure.launch.timeline import TIMELINE_ENV

CONTROLLERS = ("gloo", "mpi")
RANK_WRAPPER_MODULE = "hvdazure.launch.rank_wrapper"
HOROVODRUN_MODULE = "hvdazure.launch.horovodrun"  # horovodrun, less a TensorFlow import per job

# Variables forwarded to every rank by mpirun (-x). Local ranks inherit mpirun's environment anyway; this
# list is what remote nodes need. horovodrun forwards the whole environment itself.
FORWARDED_VARS = ("PATH", "LD_LIBRARY_PATH", "PYTHONPATH", "PYTHONUNBUFFERED", "VIRTUAL_ENV", "HOME")
FORWARDED_PREFIXES = (
    "HOROVOD_", "HVDAZURE_", "NCCL_", "OMP_", "CUDA_", "TF_", "TORCH", "AZUREML_", "AZ_BATCH", "MLFLOW_",
    "UCX_",
)

# mpirun's own connections to the other nodes (its control channel, and the ranks' output) are probed after
# 30 s idle, then every 5 s, and given up after 6 unanswered probes: a node that stops answering, down or
# cut off, ends the job within about a minute instead of Open MPI's 8 (300 + 9 x 20 s). Settings in the
# environment (OMPI_MCA_oob_tcp_keepalive_time=...) take precedence.
MPI_NODE_KEEPALIVE = {"oob_tcp_keepalive_time": "30", "oob_tcp_keepalive_intvl": "5",
                      "oob_tcp_keepalive_probes": "6"}
# A rank waiting in MPI yields its core instead of spinning on it. Open MPI does so by itself only when it
# counts more ranks than slots, but training threads share the cores with the ranks' polling threads
# (Horovod's background thread, waiting ranks): measured with `hvdazure bench throughput -np 2 --mpi` on 2
# cores, weak-scaling efficiency 0.62 spinning against 0.89 yielding (ceiling 0.99). The environment's
# OMPI_MCA_mpi_yield_when_idle takes precedence.
MPI_YIELD_WHEN_IDLE = {"mpi_yield_when_idle": "1"}


@dataclass(frozen=True)
class LaunchSpec:
    """What the user asked `hvdazure run` for: N ranks of COMMAND on some hosts with one controller."""

    num_proc: int
    command: Sequence[str]
    hosts: str | None = None  # "host1:slots,host2:slots"
    hostfile: str | None = None
    controller: str | None = None  # "gloo", "mpi", or None: the default, chosen as the job starts
    extra_env: Mapping[str, str] = field(default_factory=dict)
    network_interface: str | None = None  # for traffic between nodes: a name or a CIDR (launch/network.py)
    timeline: str | None = None  # absolute: where rank 0 writes Horovod's timeline (launch/timeline.py)

    def __post_init__(self) -> None:
        if self.num_proc < 1:
            raise ValueError(f"-np must be at least 1, got {self.num_proc}")
        if not self.command:
            raise ValueError("no command given to run on each rank")
        if self.controller is not None and self.controller not in CONTROLLERS:
            raise ValueError(f"controller must be one of {', '.join(CONTROLLERS)}, got {self.controller!r}")
        if self.hosts and self.hostfile:
            raise ValueError("give either -H/--hosts or --hostfile, not both")
        if self.hostfile and not Path(self.hostfile).is_file():
            raise ValueError(f"hostfile not found: {self.hostfile}")
        if self.hosts:
            parse_hosts(self.hosts)  # validates


def parse_hosts(hosts: str) -> list[tuple[str, int]]:
    """Parse "host1:4,host2:4" (slots default to 1) into [(host, slots)], rejecting malformed entries."""
    parsed = []
    for entry in hosts.split(","):
        name, _, slots = entry.strip().partition(":")
        if not name or (slots and not slots.isdigit()) or slots == "0":
            raise ValueError(
                f"bad host entry {entry!r} in -H {hosts!r}; expected host:slots, e.g. localhost:2")
        parsed.append((name, int(slots) if slots else 1))
    return parsed


def resolve_user_command(command: Sequence[str], python: str = sys.executable) -> list[str]:
    """Run a bare `train.py` with this interpreter, so ranks use the same environment as the launcher."""
    command = list(command)
    if command[0].endswith(".py"):
        return [python, *command]
    return command


_PYTHON = re.compile(r"python[\d.]*")  # python, python3, python3.11


def script_of(command: Sequence[str]) -> str | None:
    """The script a command runs when it is a bare `train.py` or `python train.py`, else None."""
    if command and command[0].endswith(".py"):
        return command[0]
    if len(command) > 1 and _PYTHON.fullmatch(Path(command[0]).name) and command[1].endswith(".py"):
        return command[1]
    return None


def check_script_exists(spec: LaunchSpec) -> None:
    """Fail in a moment, not after starting every rank, when the job's script is missing here.

    Only checked when every rank runs on this machine: a script on other nodes need not exist here."""
    script = script_of(spec.command)
    if script is None or not _all_ranks_here(spec) or Path(script).is_file():
        return
    raise ValueError(f"script not found: {script} (no such file in {Path.cwd()})")


def _all_ranks_here(spec: LaunchSpec) -> bool:
    if spec.hostfile:
        return False
    if not spec.hosts:
        return True
    here = {"localhost", "127.0.0.1", "::1", socket.gethostname()}
    return all(name in here for name, _ in parse_hosts(spec.hosts))


def rank_wrapper_command(command: Sequence[str], python: str = sys.executable) -> list[str]:
    """Wrap a rank's command so that its failure is reported with its rank (see launch/rank_wrapper.py)."""
    return [python, "-m", RANK_WRAPPER_MODULE, "--", *command]


def is_rank_wrapper_command(argv: Sequence[str]) -> bool:
    """Whether `argv` is a rank wrapper's own command line (rank_wrapper_command), not merely one that
    contains it: the launcher's (mpirun, horovodrun) carries the wrapper's command as its arguments."""
    return list(argv[1:4]) == ["-m", RANK_WRAPPER_MODULE, "--"]


def find_executable(name: str) -> str | None:
    """The tool next to this interpreter (the venv's horovodrun) if there is one, else the one on PATH."""
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.exists() else shutil.which(name)


def _executable(name: str) -> str:
    found = find_executable(name)
    if found is None:
        raise FileNotFoundError(f"{name} not found on PATH; run `hvdazure doctor` for how to install it")
    return found


def _host_args(spec: LaunchSpec) -> list[str]:
    """Where the ranks go: the given hosts or hostfile, else all on this machine."""
    if spec.hosts:
        return ["-H", spec.hosts]
    if spec.hostfile:
        return ["--hostfile", spec.hostfile]
    return ["-H", f"localhost:{spec.num_proc}"]


def mpirun_command(spec: LaunchSpec, env: Mapping[str, str], is_root: bool,
                   interface: CrossNodeInterface | None = None) -> list[str]:
    """The mpirun command line: no core binding (frameworks manage threads), slots filled in order, the
    ranks' TCP traffic and mpirun's own on `interface` when one is given, a lost node noticed in a minute,
    waiting ranks yielding their core."""
    cmd = [_executable("mpirun")]
    if is_root:
        cmd.append("--allow-run-as-root")  # containers (Docker, Azure ML) commonly run as root
    # --tag-output: the supervisor reads each line's rank and stream, and shows no tag (launch/console.py)
    cmd += ["-np", str(spec.num_proc), "-bind-to", "none", "-map-by", "slot", "--tag-output"]
    cmd += _host_args(spec)
    if interface is not None:
        cmd += ["-mca", "btl_tcp_if_include", interface.mpi_include,
                "-mca", "oob_tcp_if_include", interface.mpi_include]
    for name, value in {**MPI_NODE_KEEPALIVE, **MPI_YIELD_WHEN_IDLE}.items():
        if f"OMPI_MCA_{name}" not in env:  # -mca would override the environment's setting
            cmd += ["-mca", name, value]
    for name in sorted(env):
        if name in FORWARDED_VARS or name.startswith(FORWARDED_PREFIXES):
            cmd += ["-x", name]
    return cmd


def horovodrun_command(spec: LaunchSpec, interface: CrossNodeInterface | None = None) -> list[str]:
    """The horovodrun command line for the Gloo controller; Gloo and NCCL's sockets on `interface`.
    horovodrun runs as HOROVODRUN_MODULE, which asks whether Horovod has Gloo once per installation."""
    cmd = [sys.executable, "-m", HOROVODRUN_MODULE, "--gloo", "-np", str(spec.num_proc), *_host_args(spec)]
    if interface is not None:
        cmd += ["--network-interfaces", interface.name]
    return cmd


def build_command(spec: LaunchSpec, env: Mapping[str, str] | None = None,
                  interface: CrossNodeInterface | None = None) -> tuple[list[str], dict[str, str]]:
    """The full launcher argv and the environment to start it with; `interface` carries the traffic
    between nodes (see launch/network.py for how `hvdazure run` chooses it)."""
    env = dict(os.environ if env is None else env)
    env.update(spec.extra_env)
    if spec.timeline is not None:
        env[TIMELINE_ENV] = spec.timeline  # over the environment's; mpirun forwards HOROVOD_* (-x)
    env.setdefault("PYTHONUNBUFFERED", "1")  # ranks' output reaches the terminal line by line
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # TensorFlow's INFO lines, times N ranks, drown the output
    is_root = hasattr(os, "geteuid") and os.geteuid() == 0
    if is_root:
        # horovodrun --mpi and any nested mpirun read these instead of the command-line flag.
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    if spec.controller is None:
        raise ValueError("no controller chosen: run_job chooses the default one (launch/controller.py)")
    # NCCL's variables (core/nccl_environment.py; those the environment sets stay): forwarded to every rank,
    # by mpirun as NCCL_* (-x), by horovodrun with the whole environment
    env.update(nccl_environment(env, interface.name if interface is not None else None))
    if spec.controller == "mpi":
        launcher = mpirun_command(spec, env, is_root, interface)
    else:
        launcher = horovodrun_command(spec, interface)
    return launcher + rank_wrapper_command(resolve_user_command(spec.command)), env
