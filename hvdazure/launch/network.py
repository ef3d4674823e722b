"""Which network interface a multi-node job's ranks talk to each other on.

Left to themselves, launchers get this wrong on ordinary machines. mpirun offers every interface it finds
to the other nodes and hangs, for minutes and without a word, on one that reaches nothing (a container
bridge, a storage network, a firewalled NIC); horovodrun probes every interface from every node and gives
up after its 30 s start timeout on such a one. `hvdazure run` therefore names the interface itself:

1. `--network-interface IFACE` or `--network-interface CIDR` (eth0, 10.0.0.0/24) is used as given, after
   checking that this machine has it (a CIDR: an address in it), and that it is not the loopback.
2. Otherwise, if the environment already chooses (HOROVOD_GLOO_IFACE, NCCL_SOCKET_IFNAME, or Open MPI's
   OMPI_MCA_{btl,oob}_tcp_if_{include,exclude}), nothing is added: the user's choice stands.
3. Otherwise, when some ranks run on other hosts, it is detected: the interface this machine's routing
   table sends traffic for those hosts through. Only when that is unambiguous: every other host resolves
   here, all are reached through one interface, and it is not the loopback. Else nothing is added and the
   launcher chooses, as it would without hvdazure.

With every rank on this machine there is no cross-node traffic, and nothing is added (Gloo then rendezvous
on the loopback, as horovodrun requires).

What the launchers get: mpirun `-mca btl_tcp_if_include X -mca oob_tcp_if_include X` (ranks' data and
mpirun's own control traffic), where X is the CIDR as given, or, when detected, the interface's subnet if
every other host has an address on it (nodes may name their NICs differently) and its name otherwise;
horovodrun `--network-interfaces NAME`, from which it sets HOROVOD_GLOO_IFACE and NCCL_SOCKET_IFNAME and
takes the rendezvous address (Gloo needs the same interface name on every node). NCCL_SOCKET_IFNAME is set
to the name under both controllers unless already set (core/nccl_environment.py decides NCCL's variables).
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

Address = ipaddress.IPv4Interface | ipaddress.IPv6Interface
# Where a user has already chosen the interfaces: detection would only get in the way.
CHOSEN_BY_ENVIRONMENT = (
    "HOROVOD_GLOO_IFACE", "NCCL_SOCKET_IFNAME", "OMPI_MCA_btl_tcp_if_include", "OMPI_MCA_btl_tcp_if_exclude",
    "OMPI_MCA_oob_tcp_if_include", "OMPI_MCA_oob_tcp_if_exclude",
)


class NetworkInterfaceError(ValueError):
    """--network-interface names nothing usable on this machine."""


@dataclass(frozen=True)
class CrossNodeInterface:
    """The interface chosen for traffic between nodes, as each launcher takes it."""

    name: str  # this machine's interface: horovodrun --network-interfaces, NCCL_SOCKET_IFNAME
    mpi_include: str  # btl_tcp_if_include / oob_tcp_if_include: an interface name or a CIDR
    why: str  # for the line `hvdazure run` prints


@dataclass(frozen=True)
class Network:
    """What this machine knows about the network: its interfaces, name resolution and routes."""

    interfaces: Mapping[str, Sequence[Address]]
    resolve: Callable[[str], str | None]  # host name -> address, None if it does not resolve
    route_via: Callable[[str], str | None]  # address -> this machine's source address for it


def host_names(hosts: str | None, hostfile: str | None) -> list[str]:
    """The host names of `-H host:slots,...` or of a hostfile (`host slots=N` lines, # comments)."""
    if hosts:
        return [entry.strip().partition(":")[0] for entry in hosts.split(",")]
    if hostfile:
        lines = (line.partition("#")[0].split() for line in Path(hostfile).read_text().splitlines())
        return [words[0] for words in lines if words]
    return []


def choose_interface(requested: str | None, hosts: Sequence[str], env: Mapping[str, str],
                     network: Network) -> CrossNodeInterface | None:
    """The interface for traffic between `hosts`' nodes, by the policy above; None leaves it to the
    launcher. NetworkInterfaceError if `requested` is not usable here."""
    chosen = _requested(requested, network.interfaces) if requested is not None else None
    remote = _remote_hosts(hosts, network)
    if not remote:
        return None
    if chosen is not None:
        if all(address.ip.is_loopback for address in network.interfaces[chosen.name]):
            raise NetworkInterfaceError(f"--network-interface {requested}: {chosen.name} is the loopback, "
                                        "which other nodes cannot reach")
        return chosen
    if any(name in env for name in CHOSEN_BY_ENVIRONMENT):
        return None
    return _detected(remote, network)


def _remote_hosts(hosts: Sequence[str], network: Network) -> dict[str, str | None]:
    """The hosts that are not this machine, with their address (None: does not resolve here)."""
    own = {address.ip for addresses in network.interfaces.values() for address in addresses}
    remote = {}
    for host in dict.fromkeys(hosts):
        address = network.resolve(host)
        if address is None or not (ipaddress.ip_address(address).is_loopback
                                   or ipaddress.ip_address(address) in own):
            remote[host] = address
    return remote


def _requested(requested: str, interfaces: Mapping[str, Sequence[Address]]) -> CrossNodeInterface:
    here = ", ".join(" ".join([name, *map(str, addresses)]) for name, addresses in interfaces.items())
    if "/" in requested:
        try:
            subnet = ipaddress.ip_network(requested, strict=False)
        except ValueError:
            raise NetworkInterfaceError(f"--network-interface {requested}: not an interface name or a CIDR "
                                        "such as 10.0.0.0/24") from None
        name = next((name for name, addresses in interfaces.items()
                     if any(address.ip in subnet for address in addresses)), None)
        if name is None:
            raise NetworkInterfaceError(f"--network-interface {requested}: no interface here has an address "
                                        f"in it (here: {here})")
    elif requested in interfaces:
        name = requested
    else:
        raise NetworkInterfaceError(f"--network-interface {requested}: no such interface here (here: {here})")
    return CrossNodeInterface(name, requested, "as --network-interface asks")


def _detected(remote: Mapping[str, str | None], network: Network) -> CrossNodeInterface | None:
    by_address = {a.ip: (name, a.network) for name, addrs in network.interfaces.items() for a in addrs}
    routes = {}  # host -> (interface name, its subnet)
    for host, address in remote.items():
        source = network.route_via(address) if address is not None else None
        found = by_address.get(ipaddress.ip_address(source)) if source is not None else None
        if found is None:
            return None  # does not resolve, no route, or a source address no interface has
        routes[host] = found
    if len({name for name, _ in routes.values()}) != 1:
        return None
    name, subnet = next(iter(routes.values()))
    if subnet.network_address.is_loopback:
        return None
    resolved = [address for address in remote.values() if address is not None]  # all of them, by now
    on_link = all(ipaddress.ip_address(address) in subnet for address in resolved)
    why = f"the route to {next(iter(remote))}; --network-interface to change"
    return CrossNodeInterface(name, str(subnet) if on_link else name, why)


def this_machine() -> Network:
    """The real network of this machine (no packet is sent)."""
    interfaces = {}
    for name, addrs in psutil.net_if_addrs().items():
        ip = (_address(a.address, a.netmask) for a in addrs if a.family in (socket.AF_INET, socket.AF_INET6))
        interfaces[name] = [address for address in ip if address is not None]
    return Network(interfaces, _resolve, _route_via)


def _address(address: str, netmask: str | None) -> Address | None:
    address = address.partition("%")[0]  # IPv6 link-local: fe80::1%eth0
    try:
        prefix = bin(int(ipaddress.ip_address(netmask))).count("1") if netmask else None
        return ipaddress.ip_interface(f"{address}/{prefix}" if prefix is not None else address)
    except ValueError:
        return None


def _resolve(host: str) -> str | None:
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return None
    infos.sort(key=lambda info: info[0] != socket.AF_INET)  # IPv4 first: Gloo rendezvous on IPv4
    return str(infos[0][4][0]) if infos else None


def _route_via(address: str) -> str | None:
    """The source address the kernel picks for `address`: connecting a UDP socket sends nothing."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect((address, 9))
            return probe.getsockname()[0]
    except OSError:
        return None
