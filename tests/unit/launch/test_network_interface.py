"""Which interface `hvdazure run` gives ranks on different nodes (launch/network.py), on described networks.

The real thing, on two nodes made of namespaces with an interface that reaches nothing: tests/multinode/.
"""

import ipaddress

import pytest

from hvdazure.launch.network import (
    CHOSEN_BY_ENVIRONMENT,
    CrossNodeInterface,
    Network,
    NetworkInterfaceError,
    choose_interface,
    host_names,
    this_machine,
)

# node0, where `hvdazure run` runs: the cluster network on eth0, a container bridge, the loopback.
INTERFACES = {"lo": ["127.0.0.1/8"], "eth0": ["10.0.0.4/24"], "docker0": ["172.17.0.1/16"],
              "ib0": ["192.168.5.4/24"]}
ADDRESSES = {"node0": "10.0.0.4", "localhost": "127.0.0.1", "node1": "10.0.0.5", "node2": "10.0.0.6",
             "far": "10.9.0.7", "ibnode": "192.168.5.9"}
ROUTES = {"10.0.0.5": "10.0.0.4", "10.0.0.6": "10.0.0.4", "10.9.0.7": "10.0.0.4",  # far: via a gateway
          "192.168.5.9": "192.168.5.4"}


def network(interfaces=INTERFACES, addresses=ADDRESSES, routes=ROUTES) -> Network:
    parsed = {name: [ipaddress.ip_interface(a) for a in addrs] for name, addrs in interfaces.items()}
    return Network(parsed, addresses.get, routes.get)


def choose(hosts, requested=None, env=None, net=None):
    return choose_interface(requested, hosts, env or {}, net or network())


def test_with_every_rank_on_this_machine_nothing_is_chosen():
    assert choose(["localhost"]) is None
    assert choose(["node0", "localhost"]) is None
    assert choose([]) is None
    assert choose(["localhost"], requested="eth0") is None  # no traffic between nodes to place


def test_the_interface_that_routes_to_the_other_nodes_is_detected_with_its_subnet_for_mpirun():
    chosen = choose(["node0", "node1", "node2"])

    assert (chosen.name, chosen.mpi_include) == ("eth0", "10.0.0.0/24")
    assert chosen.why == "the route to node1; --network-interface to change"


def test_other_nodes_behind_a_gateway_get_the_interface_by_name():
    # their addresses are not on eth0's subnet, so a CIDR would match no interface of theirs
    assert choose(["node0", "node1", "far"]).mpi_include == "eth0"


@pytest.mark.parametrize(("hosts", "why"), [
    (["node0", "node1", "ibnode"], "two nodes reached through two interfaces"),
    (["node0", "unknown"], "a host that does not resolve here"),
    (["node0", "norouteto"], "a host with no route from here"),
])
def test_nothing_is_detected_when_the_answer_is_not_unambiguous(hosts, why):
    net = network(addresses={**ADDRESSES, "norouteto": "10.7.7.7"})
    assert choose(hosts, net=net) is None, why


@pytest.mark.parametrize("variable", CHOSEN_BY_ENVIRONMENT)
def test_an_interface_chosen_in_the_environment_is_left_alone(variable):
    assert choose(["node0", "node1"], env={variable: "eth9"}) is None


def test_a_requested_interface_is_used_as_given_over_the_environment():
    chosen = choose(["node1"], requested="ib0", env={"HOROVOD_GLOO_IFACE": "eth0"})

    assert chosen == CrossNodeInterface("ib0", "ib0", "as --network-interface asks")


def test_a_requested_subnet_names_the_interface_here_for_gloo_and_stays_a_subnet_for_mpirun():
    chosen = choose(["node1"], requested="192.168.5.0/24")

    assert (chosen.name, chosen.mpi_include) == ("ib0", "192.168.5.0/24")


@pytest.mark.parametrize(("requested", "message"), [
    ("eth9", "--network-interface eth9: no such interface here (here: lo 127.0.0.1/8, eth0 10.0.0.4/24, "
             "docker0 172.17.0.1/16, ib0 192.168.5.4/24)"),
    ("10.5.0.0/16", "--network-interface 10.5.0.0/16: no interface here has an address in it (here: lo "),
    ("10.0.0.0/99", "--network-interface 10.0.0.0/99: not an interface name or a CIDR such as 10.0.0.0/24"),
    ("lo", "--network-interface lo: lo is the loopback, which other nodes cannot reach"),
    ("127.0.0.0/8", "--network-interface 127.0.0.0/8: lo is the loopback"),
])
def test_a_requested_interface_that_cannot_carry_the_job_is_one_error_naming_the_option(requested, message):
    with pytest.raises(NetworkInterfaceError) as error:
        choose(["node0", "node1"], requested=requested)
    assert str(error.value).startswith(message)


def test_an_unknown_interface_is_an_error_even_with_every_rank_here():
    with pytest.raises(NetworkInterfaceError, match="no such interface here"):
        choose(["localhost"], requested="eth9")


def test_host_names_come_from_the_host_list_or_the_hostfile(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# the cluster\nnode1 slots=4\n\nnode2 slots=4 max_slots=4  # second\n")

    assert host_names("node1:4, node2", None) == ["node1", "node2"]
    assert host_names(None, str(hostfile)) == ["node1", "node2"]
    assert host_names(None, None) == []


def test_this_machine_knows_its_loopback_and_that_localhost_is_here():
    net = this_machine()

    assert any(address.ip.is_loopback for addresses in net.interfaces.values() for address in addresses)
    assert choose_interface(None, ["localhost", "127.0.0.1"], {}, net) is None
