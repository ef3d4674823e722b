"""Every test here runs real jobs on two nodes made of namespaces (two_nodes.py): marked `multinode` (and
`distributed`: multi-process, so `-m "not distributed"` leaves them out too; tests/conftest.py marks them),
and skipped, with the reason, where namespaces cannot be made (not root, tools missing)."""

from collections.abc import Iterator

import pytest
from node_jobs import two_nodes
from two_nodes import TwoNodes


@pytest.fixture
def nodes(tmp_path) -> Iterator[TwoNodes]:
    """Two fresh nodes for one test."""
    with two_nodes(tmp_path / "cluster") as cluster:
        yield cluster
