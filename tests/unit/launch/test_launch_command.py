"""The mpirun/horovodrun command lines `hvdazure run` builds, and the validation of its input."""

import sys

import pytest

from hvdazure.launch.command import (
    MPI_NODE_KEEPALIVE,
    LaunchSpec,
    build_command,
    check_script_exists,
    is_rank_wrapper_command,
    parse_hosts,
    rank_wrapper_command,
    resolve_user_command,
    script_of,
)
from hvdazure.launch.network import CrossNodeInterface

ENV = {"PATH": "/usr/bin", "HOROVOD_FUSION_THRESHOLD": "0", "NCCL_DEBUG": "INFO", "SECRET_TOKEN": "x"}


def _after(argv, flag):
    return argv[argv.index(flag) + 1]


def test_a_bare_python_script_runs_with_this_interpreter():
    assert resolve_user_command(["train.py", "--lr", "0.1"]) == [sys.executable, "train.py", "--lr", "0.1"]
    assert resolve_user_command(["bash", "-c", "true"]) == ["bash", "-c", "true"]


def test_every_rank_runs_inside_the_rank_wrapper():
    argv, _ = build_command(LaunchSpec(num_proc=2, command=["train.py"], controller="gloo"), ENV)
    wrapper = argv.index("hvdazure.launch.rank_wrapper")
    assert argv[wrapper - 2 : wrapper] == [sys.executable, "-m"]
    assert argv[wrapper + 1 :] == ["--", sys.executable, "train.py"]


@pytest.mark.parametrize("controller", ["gloo", "mpi"])
def test_the_launcher_is_not_taken_for_a_rank_wrapper_though_its_arguments_hold_one(controller):
    # The supervisor gives rank wrappers --grace to save a checkpoint and leaves the launcher alone meanwhile;
    # taking mpirun for a wrapper sent it SIGTERM at once, and it killed every rank before it could save.
    argv, _ = build_command(LaunchSpec(num_proc=2, command=["train.py"], controller=controller), ENV)
    assert not is_rank_wrapper_command(argv)
    assert is_rank_wrapper_command(rank_wrapper_command(["train.py"]))
    module = "hvdazure.launch.rank_wrapper"
    assert is_rank_wrapper_command(rank_wrapper_command([sys.executable, "-m", module]))
    assert not is_rank_wrapper_command([sys.executable, "train.py", "-m", module, "--"])


def test_gloo_uses_horovodrun_on_localhost_by_default():
    argv, _ = build_command(LaunchSpec(num_proc=2, command=["train.py"], controller="gloo"), ENV)
    assert argv[:3] == [sys.executable, "-m", "hvdazure.launch.horovodrun"]  # launch/horovodrun.py
    assert argv[3:8] == ["--gloo", "-np", "2", "-H", "localhost:2"]


def test_mpi_uses_mpirun_without_core_binding_and_with_rank_tags():
    argv, _ = build_command(LaunchSpec(num_proc=3, command=["train.py"], controller="mpi"), ENV)
    assert argv[0].endswith("mpirun")
    assert _after(argv, "-np") == "3"
    assert _after(argv, "-bind-to") == "none"
    assert _after(argv, "-map-by") == "slot"
    assert "--tag-output" in argv
    assert _after(argv, "-H") == "localhost:3"


def test_mpi_forwards_framework_variables_but_not_unrelated_ones():
    argv, _ = build_command(LaunchSpec(num_proc=2, command=["train.py"], controller="mpi"), ENV)
    forwarded = {argv[i + 1] for i, arg in enumerate(argv) if arg == "-x"}
    assert {"PATH", "HOROVOD_FUSION_THRESHOLD", "NCCL_DEBUG", "PYTHONUNBUFFERED"} <= forwarded
    assert "SECRET_TOKEN" not in forwarded


def test_hosts_and_hostfile_are_passed_through(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("node1 slots=4\n")
    spec = LaunchSpec(num_proc=8, command=["t.py"], hosts="node1:4,node2:4", controller="mpi")
    argv, _ = build_command(spec, ENV)
    assert _after(argv, "-H") == "node1:4,node2:4"
    spec = LaunchSpec(num_proc=4, command=["t.py"], hostfile=str(hostfile), controller="gloo")
    argv, _ = build_command(spec, ENV)
    assert _after(argv, "--hostfile") == str(hostfile)


def test_ranks_get_unbuffered_output_and_the_user_environment_wins():
    _, env = build_command(LaunchSpec(num_proc=2, command=["t.py"], controller="gloo"),
                           {**ENV, "TF_CPP_MIN_LOG_LEVEL": "0"})
    assert env["PYTHONUNBUFFERED"] == "1"
    assert env["TF_CPP_MIN_LOG_LEVEL"] == "0"


def test_host_list_parsing():
    assert parse_hosts("a:2,b") == [("a", 2), ("b", 1)]


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"num_proc": 0}, "-np must be at least 1, got 0"),
    ({"command": []}, "no command given"),
    ({"controller": "nccl"}, "controller must be one of gloo, mpi, got 'nccl'"),
    ({"hosts": "a:2", "hostfile": "f"}, "either -H/--hosts or --hostfile"),
    ({"hostfile": "/no/such/hostfile"}, "hostfile not found: /no/such/hostfile"),
    ({"hosts": "a:two"}, "bad host entry 'a:two'"),
    ({"hosts": "a:0"}, "bad host entry 'a:0'"),
    ({"hosts": "a:1,,b:1"}, "bad host entry ''"),
])
def test_bad_launch_requests_fail_with_a_message_naming_the_value(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        LaunchSpec(**{"num_proc": 2, "command": ["t.py"], **kwargs})


@pytest.mark.parametrize(("command", "script"), [
    (["train.py", "--lr", "1"], "train.py"),
    (["python", "train.py"], "train.py"),
    (["/usr/bin/python3.11", "sub/train.py", "-x"], "sub/train.py"),
    (["python", "-u", "train.py"], None),  # interpreter options: not second-guessed
    (["bash", "run.sh"], None),
    (["torchrun", "train.py"], None),
])
def test_the_script_of_a_command_is_found_only_in_the_plain_forms(command, script):
    assert script_of(command) == script


def test_a_missing_script_is_reported_only_when_every_rank_runs_here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"script not found: gone.py \(no such file in "):
        check_script_exists(LaunchSpec(num_proc=2, command=["gone.py"], hosts="localhost:2"))
    check_script_exists(LaunchSpec(num_proc=8, command=["gone.py"], hosts="node1:4,node2:4"))
    (tmp_path / "here.py").write_text("")
    check_script_exists(LaunchSpec(num_proc=2, command=["python", "here.py"]))


def _mca(argv):
    return {argv[i + 1]: argv[i + 2] for i, arg in enumerate(argv) if arg == "-mca"}


def test_mpi_traffic_between_nodes_and_mpiruns_own_go_over_the_chosen_interface():
    interface = CrossNodeInterface("eth0", "10.0.0.0/24", "the route to node2")
    spec = LaunchSpec(num_proc=4, command=["t.py"], hosts="node1:2,node2:2", controller="mpi")
    argv, env = build_command(spec, ENV, interface)

    assert _mca(argv)["btl_tcp_if_include"] == _mca(argv)["oob_tcp_if_include"] == "10.0.0.0/24"
    assert env["NCCL_SOCKET_IFNAME"] == "eth0"
    _, env = build_command(spec, {**ENV, "NCCL_SOCKET_IFNAME": "ib0"}, interface)
    assert env["NCCL_SOCKET_IFNAME"] == "ib0"  # the user's choice for NCCL stands


def test_gloo_gets_the_chosen_interface_by_name_through_horovodrun():
    interface = CrossNodeInterface("eth0", "10.0.0.0/24", "the route to node2")
    spec = LaunchSpec(num_proc=4, command=["t.py"], hosts="node1:2,node2:2", controller="gloo")
    argv, _ = build_command(spec, ENV, interface)

    assert _after(argv, "--network-interfaces") == "eth0"


def test_without_a_chosen_interface_the_launchers_choose_their_own():
    for controller in ("gloo", "mpi"):
        argv, _ = build_command(LaunchSpec(num_proc=2, command=["t.py"], controller=controller), ENV)
        assert "--network-interfaces" not in argv
        assert not {"btl_tcp_if_include", "oob_tcp_if_include"} & set(_mca(argv))


def test_waiting_mpi_ranks_yield_their_core_unless_the_environment_says_otherwise():
    spec = LaunchSpec(num_proc=2, command=["t.py"], controller="mpi")
    assert _mca(build_command(spec, ENV)[0])["mpi_yield_when_idle"] == "1"
    argv, env = build_command(spec, {**ENV, "OMPI_MCA_mpi_yield_when_idle": "0"})
    assert "mpi_yield_when_idle" not in _mca(argv) and env["OMPI_MCA_mpi_yield_when_idle"] == "0"


def test_mpirun_notices_a_lost_node_within_a_minute_unless_the_environment_says_otherwise():
    spec = LaunchSpec(num_proc=2, command=["t.py"], controller="mpi")
    argv, _ = build_command(spec, ENV)
    mca = _mca(argv)
    assert {name: mca[name] for name in MPI_NODE_KEEPALIVE} == MPI_NODE_KEEPALIVE
    seconds = int(mca["oob_tcp_keepalive_time"]) + int(mca["oob_tcp_keepalive_intvl"]) * int(
        mca["oob_tcp_keepalive_probes"])
    assert seconds <= 60

    argv, _ = build_command(spec, {**ENV, "OMPI_MCA_oob_tcp_keepalive_time": "5"})
    assert "oob_tcp_keepalive_time" not in _mca(argv)  # -mca would override the environment
    assert "oob_tcp_keepalive_probes" in _mca(argv)
