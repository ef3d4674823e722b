"""Collectives and placement on two nodes, with Gloo and with MPI, started as users start them:
`hvdazure run -np 4 -H node0:2,node1:2` on node0.

Every node here also has an interface that reaches nothing, eth1 on 10.213.1.0/24 (a container bridge, a
storage or firewalled network): left to choose, mpirun hung on it (no output after 100 s) and horovodrun
gave up after its 30 s start timeout. hvdazure names the interface that routes to the other node
(launch/network.py).
"""

import pytest
from node_jobs import NODE_OF_RANK, run, two_nodes

CONTROLLERS = ("gloo", "mpi")


@pytest.fixture(scope="module", params=CONTROLLERS)
def job(request, tmp_path_factory):
    """One collectives job per controller (tests/distributed/workers/collectives.py, PyTorch tensors)."""
    root = tmp_path_factory.mktemp(f"collectives-{request.param}")
    with two_nodes(root, unroutable_interface=True) as nodes:
        run_ = run(nodes, "collectives.py", "torch", controller=request.param)
    assert run_.returncode == 0, run_.output
    return request.param, run_


def test_a_job_starts_and_ends_with_an_unroutable_second_interface_on_every_node(job):
    controller, run_ = job
    setting = ("mpirun -mca btl_tcp_if_include/oob_tcp_if_include 10.213.0.0/24" if controller == "mpi"
               else "horovodrun --network-interfaces eth0")
    assert f"ranks on different nodes talk over eth0 (the route to node1; --network-interface to change): " \
           f"{setting}" in run_.stderr
    assert sorted(run_.reports) == [0, 1, 2, 3], run_.output


def test_allreduce_broadcast_and_allgather_are_exact_across_the_nodes(job):
    _, run_ = job
    for rank, report in run_.reports.items():
        assert report["results"] == {
            "sum": [1.0 + 2 + 3 + 4],
            "average": [(0 + 1 + 2 + 3) / 4],
            "broadcast": [10.0],
            "allgather": [0.0, 1.0, 1.0, 2.0, 2.0, 2.0, 3.0, 3.0, 3.0, 3.0],
        }, rank


def test_ranks_run_two_per_node_and_remote_ranks_get_the_jobs_environment(job):
    _, run_ = job
    # Each rank wrote its report into HVDAZURE_TEST_OUT, a directory every node has privately: a report in
    # node1's copy comes from a rank on node1, which had the variable only because the launcher forwarded it
    # (the ssh stand-in gives remote commands a fresh login environment, as sshd does).
    assert run_.reported_from == NODE_OF_RANK
    for rank, report in run_.reports.items():
        assert report["horovod"] == {"rank": rank, "size": 4, "local_rank": rank % 2, "local_size": 2,
                                     "cross_rank": rank // 2, "cross_size": 2}


def test_detect_cluster_gives_each_rank_its_node_and_the_master_address_before_init(job):
    controller, run_ = job
    for rank, report in run_.reports.items():
        assert report["detected"] == {
            "rank": rank, "size": 4, "local_rank": rank % 2, "local_size": 2, "node_rank": rank // 2,
            "num_nodes": 2,
            # horovodrun's rendezvous address, on node0's link (not the loopback); Open MPI exports none
            "master_addr": "10.213.0.1" if controller == "gloo" else None,
            "launcher": "horovodrun" if controller == "gloo" else "openmpi",
        }, rank
