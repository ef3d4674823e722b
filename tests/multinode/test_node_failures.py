"""A node lost and a network cut mid-training end the job in bounded time, with a report that says which
rank, on which node, and why; nothing is left running on either node."""

import re
import time

import pytest
from node_jobs import NODE_OF_RANK, finish, settings, start, wait_for, wait_until_empty

CONTROLLERS = ("gloo", "mpi")
# Long enough never to end by itself in these tests; --grace 5: ranks cut off from their launcher stop
# within 5 s of being told (their wrapper then kills them).
LONG_TRAINING = settings("epochs=1000", "batch_size=2", "extra.n_train=37", "extra.step_sleep=0.2")
LAUNCHER_ARGS = ("--grace", "5")
# What bounds a job whose nodes cannot reach each other, shortened here from its default to keep the test
# short: Gloo gives up on a peer after HOROVOD_GLOO_TIMEOUT_SECONDS (default 30); mpirun probes its idle
# connections to other nodes after oob_tcp_keepalive_time seconds, every _intvl seconds, and gives up after
# _probes unanswered (hvdazure run's defaults: 30, 5, 6, i.e. about a minute).
PARTITION_BOUND = {
    "HOROVOD_GLOO_TIMEOUT_SECONDS": "10",
    "OMPI_MCA_oob_tcp_keepalive_time": "5", "OMPI_MCA_oob_tcp_keepalive_intvl": "2",
    "OMPI_MCA_oob_tcp_keepalive_probes": "3",
}
NODE1_LOST = ("hvdazure run: rank 2 on node1 failed first: node1 was lost (none of its ranks, 2, 3, said how "
              "it ended: the node, or the network to it, went down); stopped all ranks")
GLOO_TIMED_OUT = ("(timed out waiting for another rank: the network between nodes is down, or that rank is "
                  "frozen; HOROVOD_GLOO_TIMEOUT_SECONDS sets how long Gloo waits)")
# where the other ranks' timeouts were seen before the job stopped, the summary says they failed alike
SAME_ERROR_THEN_STOPPED = r"(; ranks? [\d, ]+ failed with the same error[^;]*)?; stopped all ranks"
NO_HANG = 120  # seconds from the failure to the end of the job: observed 1-15 s; a longer wait is a hang


def _start_training(nodes, controller, env=None):
    proc = start(nodes, "torch_job.py", *LONG_TRAINING, controller=controller, launcher_args=LAUNCHER_ARGS,
                 env=env)
    wait_for(lambda: all((nodes[NODE_OF_RANK[rank]].dir / "reports" / f"pid-{rank}").exists()
                         for rank in range(4)), "every rank to start training", proc)
    return proc


@pytest.mark.parametrize("controller", CONTROLLERS)
def test_losing_node1_ends_the_job_in_seconds_naming_a_rank_on_node1(nodes, controller):
    proc = _start_training(nodes, controller)
    nodes.kill_all("node1")  # every process on node1, at once: the node is gone
    lost_at = time.monotonic()
    job = finish(nodes, proc)

    assert time.monotonic() - lost_at < NO_HANG
    assert job.returncode != 0, job.output
    assert NODE1_LOST in job.stderr, job.output
    assert not wait_until_empty(nodes)


@pytest.mark.parametrize("controller", CONTROLLERS)
def test_a_network_partition_ends_the_job_in_bounded_time_saying_so(nodes, controller):
    proc = _start_training(nodes, controller, env=PARTITION_BOUND)
    nodes.set_link(up=False)
    cut_at = time.monotonic()
    job = finish(nodes, proc)

    assert time.monotonic() - cut_at < NO_HANG
    assert job.returncode != 0, job.output
    summary = job.stderr.splitlines()[-1]
    if controller == "gloo":  # every rank's collective timed out: named as such, not as a peer's failure
        assert re.match(r"hvdazure run: rank \d on node\d failed first, with exit code 1 \(", summary)
        assert re.search(re.escape(GLOO_TIMED_OUT) + SAME_ERROR_THEN_STOPPED, summary), summary
    else:  # mpirun lost node1; node1's ranks could not say how they ended
        assert NODE1_LOST in summary
    assert not wait_until_empty(nodes)
