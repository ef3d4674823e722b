"""Both trainers on a ShardedDataset, on real ranks (Gloo and MPI): exact at any world size and resumable.

37 samples in 5 uneven tar shards (tests/distributed/sharded_data.py), 4 lanes, global batch 8, 2 epochs.
The jobs are few and shared: each run below starts on first use and serves every test that reads it.
"""

import json

import pytest
from harness import run_job
from sharded_data import NUM_SAMPLES, write_regression_shards

JOB = "sharded_job.py"
COMMON = ("epochs=2", "lr=0.05", "base_batch_size=8")
# name: (framework, ranks, controller, its settings)
RUNS = {
    "torch-2": ("torch", 2, "gloo", ("batch_size=4", "num_workers=2")),
    "torch-1": ("torch", 1, "mpi", ("batch_size=8",)),
    "torch-first": ("torch", 2, "gloo", ("batch_size=4", "max_steps=7")),
    "tensorflow-2": ("tensorflow", 2, "mpi", ("batch_size=4",)),
    "tensorflow-1": ("tensorflow", 1, "mpi", ("batch_size=8", "extra.batch_decode=true")),
    "tensorflow-first": ("tensorflow", 2, "gloo", ("batch_size=4", "max_steps=7")),
}
# a resume of "<framework>-first" on 1 rank, to the end
RESUMED = {"torch": ("batch_size=8", "resume=auto"), "tensorflow": ("batch_size=8", "resume=auto")}


@pytest.fixture(scope="session")
def shards(tmp_path_factory):
    return write_regression_shards(tmp_path_factory.mktemp("sharded") / "train")


@pytest.fixture(scope="module")
def runs(tmp_path_factory, shards):
    """runs(name): that job, run on first use and shared by the module's tests."""
    done = {}

    def run(name, framework, np, controller, settings, checkpoints):
        out = tmp_path_factory.mktemp(name)
        args = [*COMMON, f"extra.framework={framework}", f"extra.data={shards}",
                f"checkpoint_dir={checkpoints}", *settings]
        job = run_job(JOB, *[a for s in args for a in ("--set", s)], out_dir=out, np=np, controller=controller,
                      timeout=240)
        assert job.returncode == 0, job.output
        assert sorted(job.reports) == list(range(np)), job.output
        return job

    def get(name):
        if name not in done:
            if name.endswith("-resumed"):
                framework = name.removesuffix("-resumed")
                first = get(f"{framework}-first")
                done[name] = run(name, framework, 1, "mpi", RESUMED[framework], first.checkpoints)
            else:
                framework, np, controller, settings = RUNS[name]
                checkpoints = tmp_path_factory.mktemp(f"{name}-ckpt")
                done[name] = run(name, framework, np, controller, settings, checkpoints)
                done[name].checkpoints = checkpoints
        return done[name]

    return get


def seen(*jobs, epoch):
    return sorted(i for job in jobs for report in job.reports.values() for i in report["seen"].get(str(epoch), []))


def assert_close(a, b):
    for wa, wb in zip(a["params"], b["params"], strict=True):
        assert wa == pytest.approx(wb, rel=0, abs=1e-10)


@pytest.mark.parametrize("framework", ["torch", "tensorflow"])
def test_two_ranks_with_batch_b_match_one_process_with_batch_2b_in_float64(runs, framework):
    two, one = runs(f"{framework}-2").reports, runs(f"{framework}-1").reports

    assert two[0]["params_sha256"] == two[1]["params_sha256"]
    assert two[0]["steps_per_epoch"] == one[0]["steps_per_epoch"] == 5
    assert_close(two[0], one[0])
    for r2, r1 in zip(two[0]["history"], one[0]["history"], strict=True):
        assert r2["train_loss"] == pytest.approx(r1["train_loss"], rel=0, abs=1e-10)


@pytest.mark.parametrize("name", ["torch-2", "tensorflow-2", "torch-1"])
def test_every_sample_is_trained_on_exactly_once_per_epoch(runs, name):
    job = runs(name)

    for epoch in (0, 1):
        assert seen(job, epoch=epoch) == list(range(NUM_SAMPLES)), epoch


@pytest.mark.parametrize("framework", ["torch", "tensorflow"])
def test_evaluation_on_sharded_data_counts_every_sample_once(runs, framework):
    # eval "index" is the mean of the sample indices 0..36: exactly 18.0 only if each counts once
    for name in (f"{framework}-2", f"{framework}-1"):
        assert [r["eval_index"] for r in runs(name).reports[0]["history"]] == [18.0, 18.0]


@pytest.mark.parametrize("framework", ["torch", "tensorflow"])
def test_a_run_stopped_mid_epoch_resumes_on_another_world_size_to_the_uninterrupted_result(runs, framework):
    first, resumed = runs(f"{framework}-first"), runs(f"{framework}-resumed")

    manifest = json.loads((first.checkpoints / "step-00000007" / "manifest.json").read_text())
    assert manifest["epoch"] == 1 and manifest["samples_in_epoch"] == 16  # 2 steps into epoch 2
    assert manifest["order"]["lanes"] == 4 and manifest["data_fingerprint"]
    for epoch in (0, 1):
        assert seen(first, resumed, epoch=epoch) == list(range(NUM_SAMPLES)), epoch
    assert_close(resumed.reports[0], runs(f"{framework}-1").reports[0])


def test_a_resume_on_changed_shards_is_refused_on_every_rank(runs, tmp_path):
    first = runs("torch-first")
    changed = write_regression_shards(tmp_path / "changed", shard_sizes=(8, 3, 10, 16))  # 37 samples
    out = tmp_path / "out"
    out.mkdir()
    args = [*COMMON, "extra.framework=torch", f"extra.data={changed}", f"checkpoint_dir={first.checkpoints}",
            "batch_size=4", "resume=auto"]
    job = run_job(JOB, *[a for s in args for a in ("--set", s)], out_dir=out, np=2, timeout=120)

    assert job.returncode != 0
    for rank in (0, 1):
        line = next(line for line in job.stderr.splitlines() if line.startswith(f"[{rank}]<stderr>:hvdazure: error:"))
        assert "the training data's index changed" in line and "sample order changed" in line, line
    assert "Traceback" not in job.stderr
