"""Every test here runs real jobs on two nodes made of namespaces (two_nodes.py): marked `multinode` (and
`distributed`: multi-process, so `-m "not distributed"` leaves them out too), and skipped, with the reason,
where namespaces cannot be made (not root, tools missing)."""

from collections.abc import Iterator

import pytest
from node_jobs import two_nodes
from two_nodes import TwoNodes


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/multinode/" in str(item.fspath):
            item.add_marker(pytest.mark.multinode)
            item.add_marker(pytest.mark.distributed)


@pytest.fixture
def nodes(tmp_path) -> Iterator[TwoNodes]:
    """Two fresh nodes for one test."""
    with two_nodes(tmp_path / "cluster") as cluster:
        yield cluster
