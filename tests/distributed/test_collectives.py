"""Horovod works with both frameworks over both controllers, through our launcher, on 2 real ranks."""

import pytest
from harness import CONTROLLERS, REPO, run_job
from rank_output import prefix


@pytest.fixture(scope="module")
def collectives_job(tmp_path_factory):
    """`collectives.py FRAMEWORK` under a controller, each launched once for every test that reads it."""
    jobs = {}

    def get(framework, controller):
        if (framework, controller) not in jobs:
            out = tmp_path_factory.mktemp(f"collectives-{framework}-{controller}")
            jobs[framework, controller] = run_job("collectives.py", framework, out_dir=out,
                                                  controller=controller)
        return jobs[framework, controller]

    return get


@pytest.mark.parametrize("controller", CONTROLLERS)
@pytest.mark.parametrize("framework", ["torch", "tensorflow"])
def test_collectives_give_exact_results_on_every_rank(collectives_job, controller, framework):
    job = collectives_job(framework, controller)

    assert job.returncode == 0, job.output
    assert sorted(job.reports) == [0, 1]
    for rank, report in job.reports.items():
        assert report["results"] == {
            "sum": [3.0],
            "average": [0.5],
            "broadcast": [10.0],
            "allgather": [0.0, 1.0, 1.0],
        }
        assert report["horovod"] == {"rank": rank, "size": 2, "local_rank": rank, "local_size": 2,
                                     "cross_rank": 0, "cross_size": 1}


@pytest.mark.parametrize("controller", CONTROLLERS)
def test_each_rank_seeing_one_gpu_of_its_own_is_placed_on_its_cuda_0(collectives_job, controller):
    """Under FakeCuda, a fake device layer at the torch boundary (no GPU ran): a launcher that sets
    CUDA_VISIBLE_DEVICES per rank leaves each rank one GPU, cuda:0, whatever its local rank (before, rank 1
    asked for cuda:1 and failed with 'invalid device ordinal')."""
    job = collectives_job("torch", controller)

    assert job.returncode == 0, job.output
    placed = {rank: report["fake_gpu_per_rank"] for rank, report in job.reports.items()}
    assert {rank: (p.get("device"), p.get("current")) for rank, p in placed.items()} == {
        0: ("cuda:0", 0), 1: ("cuda:0", 0)}, placed
    # what rank 0 logs
    assert placed[0]["layout"] == ("2 ranks on 1 node, 1 GPU each (each rank sees one: "
                                   "CUDA_VISIBLE_DEVICES=0 on rank 0)")


@pytest.mark.parametrize("controller", CONTROLLERS)
def test_cluster_detection_before_init_agrees_with_horovod(collectives_job, controller):
    job = collectives_job("torch", controller)

    assert job.returncode == 0, job.output
    expected_launcher = {"gloo": "horovodrun", "mpi": "openmpi"}[controller]
    for report in job.reports.values():
        hvd, detected = report["horovod"], report["detected"]
        assert detected["launcher"] == expected_launcher
        assert (detected["rank"], detected["size"]) == (hvd["rank"], hvd["size"])
        assert (detected["local_rank"], detected["local_size"]) == (hvd["local_rank"], hvd["local_size"])
        assert (detected["node_rank"], detected["num_nodes"]) == (hvd["cross_rank"], hvd["cross_size"])


@pytest.mark.parametrize("controller", CONTROLLERS)
def test_rank_0s_output_is_shown_as_one_process_prints_it_and_another_ranks_marked(tmp_path, controller):
    job = run_job(REPO / "samples" / "collectives_check.py", "--framework", "torch", out_dir=tmp_path,
                  controller=controller)

    assert job.returncode == 0, job.output
    for rank in (0, 1):  # on stdout, as printed
        assert (f"{prefix(rank)}torch rank {rank}/2 allreduce(sum)     -> [3.0, 10.0] ok"
                in job.stdout.splitlines()), job.stdout
        assert f"torch rank {rank}/2" not in job.stderr
    # neither launcher's tags (mpirun's `[jobid,rank]<stdout>:`, horovodrun's `[rank]<stdout>:`) are shown
    assert "<stdout>" not in job.output and "<stderr>" not in job.output, job.output


def test_explicit_hosts_and_hostfile_place_both_ranks_on_localhost(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("localhost slots=2\n")
    for i, launcher_args in enumerate([("-H", "localhost:2"), ("--hostfile", str(hostfile))]):
        out = tmp_path / f"run{i}"
        out.mkdir()
        job = run_job("collectives.py", "torch", out_dir=out, controller="mpi", launcher_args=launcher_args)
        assert job.returncode == 0, job.output
        assert sorted(job.reports) == [0, 1]
