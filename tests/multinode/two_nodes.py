"""Two "nodes" on this machine, for real multi-node jobs without a cluster: network and mount namespaces.

A node is a network namespace with its own loopback and an `eth0`: one end of a veth pair whose other end
is the other node's `eth0`, on a private link made here (node0 10.213.0.1/24, node1 10.213.0.2/24) and
routed nowhere else, so nothing a job sends can leave the two namespaces. Every process started on a node
(bin/on-node) also gets a UTS namespace with the node's name as its hostname (Open MPI takes two nodes with
one hostname for one node) and a mount namespace in which /etc/hosts names both nodes and `cluster.local`
is the node's own directory: the same path shows different files on each node, and a node's HOME and
TMPDIR are in it. The test reads a node's files on the host at `node.dir`.

Remote ranks start without sshd: bin/ssh, first on PATH, is the `ssh` both mpirun (its default rsh agent)
and horovodrun call. Creating namespaces needs root; `unavailable()` says why a machine cannot.
`close()` kills every process left in either namespace and deletes them, the veths with them.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

BIN = Path(__file__).resolve().parent / "bin"
TOOLS = ("ip", "unshare", "setpriv", "mount", "hostname", "mpirun")
_PREFIX = "hmn"  # then the creating process's pid: hmn<pid>x<n>n0
_names = itertools.count()


@dataclass(frozen=True)
class Node:
    name: str  # also its hostname
    address: str  # on eth0
    netns: str
    dir: Path  # the node's private directory, as the host sees it


def unavailable() -> str | None:
    """Why two nodes cannot be made here, or None."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "needs root to create network namespaces (ip netns, unshare)"
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    return f"missing {', '.join(missing)}" if missing else None


def remove_stale() -> None:
    """Delete nodes left by a test process that no longer exists (killed outright, so it could not)."""
    for netns in _ip("netns", "list").split():
        match = re.fullmatch(rf"{_PREFIX}(\d+)x\d+n[01]", netns)
        if match and not Path("/proc", match[1]).exists():
            for pid in _ip("netns", "pids", netns).split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
            with contextlib.suppress(OSError):
                _ip("netns", "delete", netns)


def _ip(*args: str) -> str:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        raise OSError(f"ip {' '.join(args)}: {result.stderr.strip()}")
    return result.stdout


class TwoNodes:
    """node0 and node1, made by `start()` and removed, with every process in them, by `close()`."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.local = root / "local"  # each node sees its own directory here
        tag = f"{_PREFIX}{os.getpid()}x{next(_names)}"  # unique on this machine; veth names fit in 15 bytes
        self.nodes = [Node(f"node{i}", f"10.213.0.{i + 1}", f"{tag}n{i}", root / f"node{i}") for i in (0, 1)]
        self._host_veths = (f"{tag}a", f"{tag}b")  # names on the host until moved into the namespaces
        self._created: list[str] = []

    def __getitem__(self, name: str) -> Node:
        return next(node for node in self.nodes if node.name == name)

    def start(self) -> None:
        """Create both nodes and the link between them (OSError naming the failing command)."""
        for node in self.nodes:
            (node.dir / "home").mkdir(parents=True)
            (node.dir / "tmp").mkdir()
        self.local.mkdir()
        (self.root / "hosts").write_text(
            "127.0.0.1 localhost\n" + "".join(f"{n.address} {n.name}\n" for n in self.nodes))
        (self.root / "nodes").write_text("".join(f"{n.name} {n.address} {n.netns}\n" for n in self.nodes))
        for node in self.nodes:
            _ip("netns", "add", node.netns)
            self._created.append(node.netns)
        _ip("link", "add", self._host_veths[0], "type", "veth", "peer", "name", self._host_veths[1])
        for node, veth in zip(self.nodes, self._host_veths, strict=True):
            _ip("link", "set", veth, "netns", node.netns, "name", "eth0")
            _ip("-n", node.netns, "addr", "add", f"{node.address}/24", "dev", "eth0")
            _ip("-n", node.netns, "link", "set", "lo", "up")
            _ip("-n", node.netns, "link", "set", "eth0", "up")

    def add_unroutable_interface(self, name: str = "eth1") -> None:
        """Give each node a second interface on one subnet, 10.213.1.0/24, that reaches nothing: a veth
        whose peer (up, in the same node, no address) answers nothing, with the other node's address
        pinned to that peer, so what is sent there is dropped without an error, as on a firewalled network.
        A launcher that tries it waits for TCP's timeouts."""
        for i, node in enumerate(self.nodes):
            peer = f"{name}void"
            _ip("-n", node.netns, "link", "add", name, "type", "veth", "peer", "name", peer)
            _ip("-n", node.netns, "addr", "add", f"10.213.1.{i + 1}/24", "dev", name)
            for dev in (name, peer):
                _ip("-n", node.netns, "link", "set", dev, "up")
            mac = json.loads(_ip("-n", node.netns, "-json", "link", "show", peer))[0]["address"]
            other = f"10.213.1.{2 - i}"
            _ip("-n", node.netns, "neigh", "replace", other, "lladdr", mac, "dev", name, "nud", "permanent")

    def set_link(self, up: bool) -> None:
        """Take the link between the nodes down (a network partition) or up again."""
        _ip("-n", self.nodes[0].netns, "link", "set", "eth0", "up" if up else "down")

    def env(self, **extra: str) -> dict[str, str]:
        """The environment for commands on the nodes: bin/ first on PATH (its `ssh`), the cluster named."""
        return {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
                "HVDAZURE_TEST_CLUSTER": str(self.root), **extra}

    def popen(self, node: str, argv: list[str], env: dict[str, str] | None = None,
              **kwargs) -> subprocess.Popen:
        """Start `argv` on `node` with `env` (default: `self.env()`)."""
        return subprocess.Popen([str(BIN / "on-node"), node, *argv], env=env or self.env(), **kwargs)

    def pids(self, node: str) -> list[int]:
        """Every process running on `node`."""
        result = subprocess.run(["ip", "netns", "pids", self[node].netns], capture_output=True, text=True,
                                timeout=30)
        return [int(pid) for pid in result.stdout.split()]

    def kill_all(self, node: str) -> None:
        """SIGKILL every process on `node`, as if the node had gone."""
        for pid in self.pids(node):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def close(self, timeout: float = 20.0) -> list[str]:
        """Kill everything on both nodes and delete them; return what could not be removed (empty: all)."""
        problems = []
        existing = [node for node in self.nodes if node.netns in self._created]
        deadline = time.monotonic() + timeout
        for node in existing:
            while self.pids(node.name):
                self.kill_all(node.name)
                if time.monotonic() > deadline:
                    problems.append(f"processes still on {node.name}: {self.pids(node.name)}")
                    break
                time.sleep(0.05)
        for node in existing:
            try:
                _ip("netns", "delete", node.netns)
            except OSError as exc:
                problems.append(str(exc))
        for veth in self._host_veths:  # if start() failed before moving them
            if Path("/sys/class/net", veth).exists():
                try:
                    _ip("link", "delete", veth)
                except OSError as exc:
                    problems.append(str(exc))
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        problems += [f"namespace left: {n.netns}" for n in self.nodes if n.netns in listed.split()]
        return problems
