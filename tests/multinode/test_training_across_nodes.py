"""TorchTrainer on two nodes (tests/distributed/workers/torch_job.py): data-parallel equivalence, and
checkpoints with no shared filesystem: `checkpoint_dir` is a node-local path, so node0's ranks and node1's
see different directories there, and only rank 0 (on node0) may write or read it."""

import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest
from node_jobs import NO_HANG_TIMEOUT, WORKERS, finish, run, settings, start, two_nodes, wait_for

# 37 samples in global batches of 8: 5 optimizer steps per epoch, the last one uneven across ranks.
TRAINING = ("epochs=3", "extra.n_train=37", "lr=0.05", "base_batch_size=8")
CHECKPOINTS = ("checkpoint_every_steps=3", "checkpoint_every_epochs=null")


def _two_node_settings(nodes, *more):
    return settings(*TRAINING, "batch_size=2", *CHECKPOINTS, f"checkpoint_dir={nodes.local / 'ckpt'}", *more)


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """The reference: one process on this machine with the whole global batch, 8."""
    out = tmp_path_factory.mktemp("one-process")
    cmd = [sys.executable, str(WORKERS / "torch_job.py"), *settings(*TRAINING, "batch_size=8")]
    env = {**os.environ, "HVDAZURE_TEST_OUT": str(out)}
    proc = subprocess.run(cmd, env=env, cwd=out, capture_output=True, text=True, timeout=NO_HANG_TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    return json.loads((out / "rank-0.json").read_text())


@pytest.fixture(scope="module", params=("gloo", "mpi"))
def two_nodes_run(request, tmp_path_factory):
    """4 ranks with batch 2 on two nodes, checkpointing; returns (controller, the run, each node's files)."""
    with two_nodes(tmp_path_factory.mktemp(f"train-{request.param}")) as nodes:
        job = run(nodes, "torch_job.py", *_two_node_settings(nodes), controller=request.param)
        files = {node.name: {path.name for path in node.dir.iterdir()} for node in nodes.nodes}
        checkpoints = sorted(path.name for path in (nodes["node0"].dir / "ckpt").glob("step-*"))
    assert job.returncode == 0, job.output
    assert sorted(job.reports) == [0, 1, 2, 3], job.output
    return request.param, job, files, checkpoints


def test_four_ranks_with_batch_b_on_two_nodes_train_as_one_process_with_batch_4b(two_nodes_run, one_process):
    _, job, _, _ = two_nodes_run

    assert len({report["params_sha256"] for report in job.reports.values()}) == 1  # identical on every rank
    assert job.reports[0]["steps_per_epoch"] == one_process["steps_per_epoch"] == 5
    for four, one in zip(job.reports[0]["params"], one_process["params"], strict=True):
        np.testing.assert_allclose(four, one, rtol=0, atol=1e-10)
    assert job.reports[0]["history"][-1]["train_loss"] == pytest.approx(
        one_process["history"][-1]["train_loss"], abs=1e-10)


def test_checkpoints_are_written_on_node0_only(two_nodes_run):
    _, _, files, checkpoints = two_nodes_run

    assert checkpoints[-1] == "step-00000015", checkpoints  # the last of 15 steps, in node0's directory
    assert "ckpt" not in files["node1"]


@pytest.mark.parametrize("two_nodes_run", ["mpi"], indirect=True)
def test_a_job_killed_on_node1_resumes_bit_identically_from_checkpoints_only_node0_has(nodes, two_nodes_run):
    controller, uninterrupted, _, _ = two_nodes_run
    node0_ckpt, node1_ckpt = nodes["node0"].dir / "ckpt", nodes["node1"].dir / "ckpt"
    node1_ckpt.mkdir()  # the path exists on node1 too, empty, as a node-local directory on every node would
    proc = start(nodes, "torch_job.py", *_two_node_settings(nodes, "extra.step_sleep=0.5"),
                 controller=controller, launcher_args=("--grace", "5"))
    wait_for(lambda: (node0_ckpt / "step-00000006").exists(), "the checkpoint of step 6 (epoch 2)", proc)
    os.kill(int((nodes["node1"].dir / "reports" / "pid-3").read_text()), signal.SIGKILL)
    killed = finish(nodes, proc)
    assert killed.returncode == 128 + signal.SIGKILL, killed.output
    assert "rank 3 on node1 failed first, with exit code 137 (killed by SIGKILL)" in killed.stderr

    resumed = run(nodes, "torch_job.py", *_two_node_settings(nodes, "resume=auto"), controller=controller)

    assert resumed.returncode == 0, resumed.output
    assert "hvdazure: resumed from step-0000000" in resumed.stderr
    assert resumed.reports[0]["params_sha256"] == uninterrupted.reports[0]["params_sha256"]
    assert resumed.reports[0]["history"] == uninterrupted.reports[0]["history"]
    assert list(node1_ckpt.iterdir()) == []  # node1's ranks wrote nothing there (and had nothing to read)
