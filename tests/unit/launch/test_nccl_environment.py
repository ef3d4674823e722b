"""NCCL's environment (core/nccl_environment.py): what hvdazure sets, that the user's own values win, and
that both launchers and Azure ML jobs take it from that one place."""

import shlex

import pytest

from hvdazure.azure import vm_sizes
from hvdazure.core.nccl_environment import nccl_environment
from hvdazure.launch.command import LaunchSpec, build_command
from hvdazure.launch.network import CrossNodeInterface

ETH0 = CrossNodeInterface("eth0", "10.0.0.0/24", "the route to node2")


@pytest.mark.parametrize(("interface", "infiniband", "expected"), [
    (None, None, {"NCCL_DEBUG": "WARN"}),
    ("eth0", None, {"NCCL_DEBUG": "WARN", "NCCL_SOCKET_IFNAME": "eth0"}),
    ("eth0", True, {"NCCL_DEBUG": "WARN", "NCCL_SOCKET_IFNAME": "eth0"}),  # NCCL finds InfiniBand itself
    ("eth0", False, {"NCCL_DEBUG": "WARN", "NCCL_SOCKET_IFNAME": "eth0", "NCCL_IB_DISABLE": "1"}),
])
def test_nccl_gets_the_chosen_interface_warnings_and_no_infiniband_probe_only_where_there_is_none(
        interface, infiniband, expected):
    assert nccl_environment({}, interface, infiniband) == expected


def test_the_users_own_nccl_values_are_never_overwritten():
    users = {"NCCL_DEBUG": "INFO", "NCCL_SOCKET_IFNAME": "ib0", "NCCL_IB_DISABLE": "0"}
    assert nccl_environment(users, "eth0", False) == {}


@pytest.mark.parametrize("controller", ["mpi", "gloo"])
def test_hvdazure_run_sets_ncclS_variables_for_every_rank_under_both_controllers(controller):
    spec = LaunchSpec(num_proc=4, command=["t.py"], hosts="node1:2,node2:2", controller=controller)
    argv, env = build_command(spec, {"PATH": "/usr/bin"}, ETH0)

    assert (env["NCCL_SOCKET_IFNAME"], env["NCCL_DEBUG"]) == ("eth0", "WARN")
    assert "NCCL_IB_DISABLE" not in env  # the launcher cannot see the other nodes' hardware
    if controller == "mpi":  # remote ranks get them from mpirun; horovodrun passes its whole environment
        assert argv[argv.index("NCCL_DEBUG") - 1] == argv[argv.index("NCCL_SOCKET_IFNAME") - 1] == "-x"
    _, env = build_command(spec, {"PATH": "/usr/bin", "NCCL_DEBUG": "INFO", "NCCL_SOCKET_IFNAME": "ib0"},
                           ETH0)
    assert (env["NCCL_SOCKET_IFNAME"], env["NCCL_DEBUG"]) == ("ib0", "INFO")


def test_on_one_machine_hvdazure_run_sets_only_ncclS_warnings():
    _, env = build_command(LaunchSpec(num_proc=2, command=["t.py"], controller="mpi"), {"PATH": "/usr/bin"})
    assert {k: v for k, v in env.items() if k.startswith("NCCL_")} == {"NCCL_DEBUG": "WARN"}


def test_horovodrun_gloo_leaves_the_users_nccl_interface_to_the_ranks(monkeypatch):
    """horovodrun --gloo starts each rank as `env ...ENVIRONMENT... NCCL_SOCKET_IFNAME=ITS_INTERFACES cmd`,
    over the user's value; hvdazure's horovodrun leaves the environment's."""
    from horovod.runner import gloo_run

    from hvdazure.launch import horovodrun

    monkeypatch.setattr(gloo_run, "create_run_env_vars", gloo_run.create_run_env_vars)  # put back after
    horovodrun.keep_the_users_nccl_interface()
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "ib0")
    words = shlex.split(gloo_run.get_run_command(["python", "t.py"], "10.0.0.4", ["eth0", "docker0"], 1234))
    assert not any(word.startswith("NCCL_SOCKET_IFNAME=") for word in words)
    assert "HOROVOD_GLOO_IFACE=eth0" in words
    monkeypatch.delenv("NCCL_SOCKET_IFNAME")
    words = shlex.split(gloo_run.get_run_command(["python", "t.py"], "10.0.0.4", ["eth0"], 1234))
    assert "NCCL_SOCKET_IFNAME=eth0" in words  # none of the user's: horovodrun's, as before


@pytest.mark.parametrize(("vm_size", "ib_disabled"), [
    ("Standard_NC24ads_A100_v4", True), ("Standard_ND96asr_v4", False), (None, False)])
def test_azure_ml_jobs_take_ncclS_variables_from_the_same_place(vm_size, ib_disabled):
    env = vm_sizes.nccl_environment(vm_size)
    assert (env["NCCL_SOCKET_IFNAME"], env["NCCL_DEBUG"]) == ("eth0", "WARN")
    assert ("NCCL_IB_DISABLE" in env) is ib_disabled
