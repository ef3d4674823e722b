"""Both trainers on a ShardedDataset, 2 ranks under Gloo and under MPI: exact at any world size, and after a
rank is SIGKILLed mid-epoch, resumable on another world size to the uninterrupted result.

37 samples in 5 tar shards of 8, 8, 8, 8 and 5 (tests/distributed/sharded_data.py), 4 lanes, global
batch 8, 2 epochs.
The jobs are few and shared: each run below starts on first use and serves every test that reads it.
"""

import json
import re
import signal

import psutil
import pytest
from harness import WORKERS, processes_running, run_job
from rank_output import lines_of
from sharded_data import NUM_SAMPLES, write_regression_shards

from hvdazure.core.checkpoint.store import CheckpointManager

JOB = "sharded_job.py"
COMMON = ("epochs=2", "lr=0.05", "base_batch_size=8")
# of 10 steps: saved at step 7, rank 1 killed at the end of step 9 (2 and 4 steps into epoch 2). Rank 0 may
# save step 9 alone when its next collective fails (an emergency save), or be torn down first, even mid-write:
# a resume takes step 9 or step 7, whichever is sound.
CHECKPOINT_STEP, KILL_STEP, STEPS_PER_EPOCH = 7, 9, 5
KILLED = (f"checkpoint_every_steps={CHECKPOINT_STEP}", "extra.kill_rank=1", f"extra.kill_step={KILL_STEP}")
CACHE = "extra.cache_dir=<cache>"  # the run's shard cache (a resumed run's: its first run's)
# name: (framework, ranks, controller, its settings). "<framework>-first" runs 2 ranks x batch 4, saves at
# step 7 and loses rank 1 to a SIGKILL at the end of step 9 (every rank reports what it had first);
# "<framework>-resumed" resumes it on 1 rank x batch 8, to the end; "<framework>-2" is 2 x 4 throughout,
# under the other controller; "<framework>-1" is 1 x 8 throughout. The TensorFlow jobs of 2 ranks x 4
# throughout and 1 x 8 then also run Keras `model.fit` on the shards. The torch run that is killed and its
# resume read through one shard cache (cache=True), so the resume reads what the killed job cached.
RUNS = {
    "torch-first": ("torch", 2, "gloo", ("batch_size=4", "num_workers=2", CACHE, *KILLED)),
    "torch-resumed": ("torch", 1, "mpi", ("batch_size=8", "num_workers=2", CACHE, "resume=auto")),
    "torch-2": ("torch", 2, "mpi", ("batch_size=4", "num_workers=2")),
    "torch-1": ("torch", 1, "mpi", ("batch_size=8",)),
    "tensorflow-first": ("tensorflow", 2, "mpi", ("batch_size=4", *KILLED)),
    "tensorflow-resumed": ("tensorflow", 1, "mpi", ("batch_size=8", "resume=auto")),
    "tensorflow-2": ("tensorflow", 2, "gloo", ("batch_size=4", "extra.keras=true")),
    "tensorflow-1": ("tensorflow", 1, "mpi", ("batch_size=8", "extra.batch_decode=true", "extra.keras=true")),
}
FRAMEWORKS = ("torch", "tensorflow")
TWO_RANK_RUNS = [f"{framework}-{name}" for framework in FRAMEWORKS for name in ("first", "2")]  # Gloo, MPI


@pytest.fixture(scope="session")
def shards(tmp_path_factory):
    return write_regression_shards(tmp_path_factory.mktemp("sharded") / "train")


@pytest.fixture(scope="module")
def runs(tmp_path_factory, shards):
    """runs(name): that job, run on first use and shared by the module's tests (a resumed run shares its
    first run's checkpoint directory, `checkpoints`, and shard cache, `cache`). A killed run's job ends
    128 + SIGKILL, its ranks' reports made at the step it was killed at."""
    done = {}

    def get(name):
        if name in done:
            return done[name]
        framework, np, controller, settings = RUNS[name]
        if name.endswith("-resumed"):
            first = get(f"{framework}-first")
            checkpoints, cache = first.checkpoints, first.cache
        else:
            checkpoints, cache = (tmp_path_factory.mktemp(f"{name}-{what}") for what in ("ckpt", "cache"))
        out = tmp_path_factory.mktemp(name)
        args = [*COMMON, f"extra.framework={framework}", f"extra.data={shards}",
                f"checkpoint_dir={checkpoints}", *(s.replace("<cache>", str(cache)) for s in settings)]
        job = run_job(JOB, *[a for s in args for a in ("--set", s)], out_dir=out, np=np,
                      controller=controller, timeout=240)
        if name.endswith("-first"):
            assert job.returncode == 128 + signal.SIGKILL, job.output
            assert "rank 1 failed first, with exit code 137 (killed by SIGKILL)" in job.stderr, job.output
            children = {pid for report in job.reports.values() for pid in report["children"]}
            job.left_running = {p.pid for p in processes_running(str(WORKERS / JOB))} | {  # as the job ended
                pid for pid in children if psutil.pid_exists(pid)}
            job.latest = latest_sound_checkpoint(checkpoints)  # as the kill left it
        else:
            assert job.returncode == 0, job.output
        assert sorted(job.reports) == list(range(np)), job.output
        job.checkpoints, job.cache = checkpoints, cache
        done[name] = job
        return job

    return get


def latest_sound_checkpoint(directory):
    """The checkpoint `latest` names in `directory`, verified whole (it raises if a torn save is named)."""
    manager = CheckpointManager(str(directory))
    named = (directory / "latest").read_text().strip()
    manager.verify(next(c for c in manager.checkpoints() if c.name == named))
    return named


def resumed_at(job, first):
    """The step the resumed `job` started from: what `latest` named after `first` was killed, its step 7 or
    rank 0's emergency save of step 9."""
    step = int(re.search(r"resumed from step-(\d{8})", job.stderr)[1])
    assert f"step-{step:08d}" == first.latest and step in (CHECKPOINT_STEP, KILL_STEP), job.stderr
    return step


def seen(*jobs, epoch):
    return sorted(i for job in jobs for report in job.reports.values()
                  for i in report["seen"].get(str(epoch), []))


def assert_close(steps, reference):
    assert len(steps) == len(reference)
    for step, (got, expected) in enumerate(zip(steps, reference, strict=True)):
        assert got == pytest.approx(expected, rel=0, abs=1e-10), step


@pytest.mark.parametrize("name", TWO_RANK_RUNS)
def test_two_ranks_with_batch_b_match_one_process_with_batch_2b_in_float64_step_by_step(runs, name):
    two, one = runs(name).reports, runs(f"{name.split('-')[0]}-1").reports[0]
    steps = KILL_STEP if name.endswith("-first") else 2 * STEPS_PER_EPOCH

    assert two[0]["trajectory"] == two[1]["trajectory"]
    assert two[0]["steps_per_epoch"] == one["steps_per_epoch"] == STEPS_PER_EPOCH
    assert_close(two[0]["trajectory"], one["trajectory"][:steps])
    assert two[0]["history"][0]["train_loss"] == pytest.approx(one["history"][0]["train_loss"], rel=0,
                                                               abs=1e-10)


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_every_sample_is_trained_on_exactly_once_per_epoch_on_2_ranks_and_1(runs, framework):
    for name in ("2", "1"):
        job = runs(f"{framework}-{name}")
        assert seen(job, epoch=0) == seen(job, epoch=1) == list(range(NUM_SAMPLES)), name


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_every_sample_is_trained_on_exactly_once_per_epoch_across_the_kill_and_resume(runs, framework):
    first, resumed = runs(f"{framework}-first"), runs(f"{framework}-resumed")
    per_rank = (resumed_at(resumed, first) - STEPS_PER_EPOCH) * 4  # each rank's epoch-2 samples saved

    assert seen(first, epoch=0) == list(range(NUM_SAMPLES))
    assert len(seen(first, epoch=1)) == (KILL_STEP - STEPS_PER_EPOCH) * 8  # before the kill, partly lost
    checkpointed = [i for report in first.reports.values() for i in report["seen"]["1"][:per_rank]]
    assert seen(resumed, epoch=0) == []
    assert sorted(checkpointed + seen(resumed, epoch=1)) == list(range(NUM_SAMPLES))


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_evaluation_on_sharded_data_counts_every_sample_once_on_2_ranks_and_1(runs, framework):
    # eval "index" is the mean of the sample indices 0..36: exactly 18.0 only if each counts once
    assert runs(f"{framework}-first").reports[0]["history"][0]["eval_index"] == 18.0
    for name in ("2", "1"):
        assert [r["eval_index"] for r in runs(f"{framework}-{name}").reports[0]["history"]] == [18.0, 18.0]


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_run_killed_mid_epoch_resumes_on_another_world_size_to_the_uninterrupted_result(runs, framework):
    first, resumed = runs(f"{framework}-first"), runs(f"{framework}-resumed")

    manifest = json.loads((first.checkpoints / f"step-{CHECKPOINT_STEP:08d}" / "manifest.json").read_text())
    assert manifest["epoch"] == 1 and manifest["samples_in_epoch"] == 16  # 2 steps into epoch 2
    assert manifest["order"]["lanes"] == 4 and manifest["data_fingerprint"]
    start = resumed_at(resumed, first)
    for uninterrupted in (runs(f"{framework}-1"), runs(f"{framework}-2")):  # 1 x 8 and 2 x 4, to the end
        expected = uninterrupted.reports[0]["trajectory"][start:]
        assert_close(resumed.reports[0]["trajectory"], expected)


def test_a_killed_rank_leaves_no_data_loader_worker_and_its_resume_reads_a_sound_cache(runs, shards):
    first = runs("torch-first")
    workers = [pid for report in first.reports.values() for pid in report["children"]]

    assert len(workers) == 4, first.reports  # num_workers=2 on each of the 2 ranks, alive at the kill
    assert first.left_running == set()  # no rank, no worker
    runs("torch-resumed")  # resumed through the killed job's cache (exact: the test above)
    cached = {p.name.split(".")[0]: p.read_bytes() for p in first.cache.rglob("*.tar")}  # <stem>.<version>
    assert cached == {p.stem: p.read_bytes() for p in shards.glob("*.tar")}
    assert not [p for p in first.cache.rglob("*") if ".tmp-" in p.name]


def test_keras_fit_on_sharded_data_with_2_ranks_x_b_matches_1_process_x_2b(runs):
    two, one = runs("tensorflow-2").reports, runs("tensorflow-1").reports[0]["keras"]

    assert two[0]["keras"] == two[1]["keras"]
    assert two[0]["keras"]["steps_per_epoch"] == one["steps_per_epoch"] == 5
    assert_close([two[0]["keras"]["weights"]], [one["weights"]])
    assert_close(two[0]["keras"]["history"]["val_loss"], one["history"]["val_loss"])


def test_a_resume_on_changed_shards_is_refused_on_every_rank(runs, tmp_path):
    first = runs("torch-resumed")  # its checkpoints: the first run's and the resumed run's
    changed = write_regression_shards(tmp_path / "changed", samples_per_shard=10)  # 37 samples, 4 shards
    out = tmp_path / "out"
    out.mkdir()
    args = [*COMMON, "extra.framework=torch", f"extra.data={changed}", f"checkpoint_dir={first.checkpoints}",
            "batch_size=4", "resume=auto"]
    job = run_job(JOB, *[a for s in args for a in ("--set", s)], out_dir=out, np=2, timeout=120)

    assert job.returncode != 0
    for rank in (0, 1):
        line = next(line for line in lines_of(job.stderr, rank) if line.startswith("hvdazure: error:"))
        assert "the training data's index changed" in line and "sample order changed" in line, line
    assert "Traceback" not in job.stderr
