"""Sharded optimizer state and gradients (zero_stage 1 and 2) on real ranks, float64: the weights of one
process with the global batch and no sharding to 1e-10, under Gloo and MPI on 2 and 3 ranks, for SGD with
momentum and AdamW with accumulation and clipping (workers/zero_job.py: 151 parameters, a prime, in two
groups, one frozen); checkpoints resumed across world sizes and stages; the two defects such a feature
can have (a slice stepped twice, a slice's state lost on resume) seen; a coupled optimizer refused in one line
on every rank (the config's refusals are tests/unit/core/test_zero_config.py's).

Each job runs several trainings in one launch (`--runs`), as the jobs are the expensive unit.
"""

import json

import pytest
from harness import run_job

JOB = "zero_job.py"
COMMON = ("base_batch_size=12", "grad_clip_norm=0.3", "lr=0.02", "warmup_steps=3")  # 4 steps: warmup 3
# global batch 24, two micro-batches of 12 (41 samples: 2 steps an epoch, the last one short)
SHAPES = {1: "batch_size=12", 2: "batch_size=6", 3: "batch_size=4"}
OPTIMIZERS = ("momentum", "adamw")
# stage 2 in buckets of ~200 bytes (a bucket per tensor or two: each reduce-scattered during backward as its
# gradients complete); stage 1 in one bucket per group (the default size)
BUCKETS = {0: [], 1: [], 2: ["zero_bucket_mb=0.0002"]}


def runs_file(tmp_path, runs: dict[str, list[str]]) -> list[str]:
    path = tmp_path / "runs.json"
    path.write_text(json.dumps({name: [*COMMON, *settings] for name, settings in runs.items()}))
    return ["--runs", str(path)]


def launch(tmp_path_factory, name: str, np: int, controller: str, runs: dict[str, list[str]]) -> dict:
    """One launch of `runs` on `np` ranks: each run's reports, by run name then rank."""
    tmp = tmp_path_factory.mktemp(name)
    for run in runs:
        (tmp / run).mkdir()
    job = run_job(JOB, *runs_file(tmp, runs), out_dir=tmp, np=np, controller=controller, timeout=300)
    assert job.returncode == 0, job.output
    reports = {}
    for run in runs:
        reports[run] = {int(p.stem.split("-")[1]): json.loads(p.read_text())
                        for p in (tmp / run).glob("rank-*.json")}
        assert sorted(reports[run]) == list(range(np)), job.output
    return reports


def exactness_runs(np: int) -> dict[str, list[str]]:
    return {f"{optimizer}-{stage}": [SHAPES[np], "epochs=2", "grad_accum_steps=2", f"zero_stage={stage}",
                                     f"extra.optimizer={optimizer}", *BUCKETS[stage]]
            for optimizer in OPTIMIZERS for stage in ((0,) if np == 1 else (1, 2))}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """One process, the global batch, no sharding."""
    return launch(tmp_path_factory, "reference", 1, "gloo", exactness_runs(1))


def max_difference(a: list[list[float]], b: list[list[float]]) -> float:
    return max(abs(x - y) for pa, pb in zip(a, b, strict=True) for x, y in zip(pa, pb, strict=True))


@pytest.mark.parametrize(("np", "controller"), [(2, "gloo"), (3, "mpi")])
def test_stages_1_and_2_give_the_weights_of_one_process_without_sharding(tmp_path_factory, reference, np,
                                                                         controller):
    """...and one rank stepping its slice a second time each step (the defect) moves them: it is seen."""
    runs = exactness_runs(np)
    twice = [SHAPES[np], "epochs=2", "grad_accum_steps=2", "zero_stage=2", "extra.optimizer=adamw",
             "extra.step_twice_rank=1"]
    got = launch(tmp_path_factory, f"exact-{np}-{controller}", np, controller, {**runs, "twice": twice})
    for run in runs:
        optimizer, stage = run.rsplit("-", 1)
        expected = reference[f"{optimizer}-0"][0]
        for rank, report in got[run].items():
            assert max_difference(report["params"], expected["params"]) < 1e-10, (run, rank)
            assert report["optimizer_class"] == expected["optimizer_class"]  # the user's own optimizer
            # the LR schedule's last value, and the biases' group at its half (the factor kept)
            assert report["group_lrs"] == expected["group_lrs"] == pytest.approx([0.04, 0.02], rel=1e-12), run
            # its state: this rank's slices only (flat tensors, one a bucket), about 1/np of the whole (with
            # the default bucket size: tiny buckets are each padded to a multiple of the ranks)
            assert all(len(shape) == 1 for group in report["optimizer_params"] for shape in group), run
            assert stage == "2" or report["state_bytes"] <= expected["state_bytes"] / np * 1.25 + 64, run
        assert len({report["params_sha256"] for report in got[run].values()}) == 1, run  # every rank alike
    assert max_difference(got["twice"][0]["params"], reference["adamw-0"][0]["params"]) > 1e-6


def test_resume_across_world_sizes_and_stages_and_a_lost_slice_is_seen(tmp_path_factory, reference):
    """1 process at stage 0 -> 2 ranks at stage 2 -> 3 ranks at stage 1 -> 1 process at stage 0, an epoch
    each, through one checkpoint directory (stage 0's optimizer.pt read into slices, the slices' state file
    read whole): the weights of 4 epochs uninterrupted. Resuming the same run bit-identical; a resume that
    loses its slices' state is not."""
    directory = tmp_path_factory.mktemp("chain-checkpoints")
    saved = [f"checkpoint_dir={directory}", "checkpoint_every_epochs=1", "resume=auto", "grad_accum_steps=2",
             "extra.optimizer=adamw"]
    chain = [(1, 0), (2, 2), (3, 1), (1, 0)]
    for epochs, (np, stage) in enumerate(chain, 1):
        got = launch(tmp_path_factory, f"chain-{epochs}", np, "mpi" if np == 3 else "gloo",
                     {"run": [SHAPES[np], f"epochs={epochs}", f"zero_stage={stage}", *saved]})["run"]
        assert len(got[0]["history"]) == epochs
        assert not got[0]["warnings"], got[0]["warnings"]  # e.g. torch's about a read-only buffer
    whole = launch(tmp_path_factory, "whole", 1, "gloo",
                   {"run": [SHAPES[1], "epochs=4", "grad_accum_steps=2", "extra.optimizer=adamw"]})["run"]
    assert max_difference(got[0]["params"], whole[0]["params"]) < 1e-10

    # The same 2 ranks at stage 2, resumed after its first epoch (saved in the background, checkpoint_async's
    # default): bit-identical; and with its state lost, not. Last, every rank raises in step 3, a step after
    # the epoch's checkpoint: rank 0 alone cannot save the sharded state, and says so (no checkpoint of step 3
    # holding step 2's optimizer state beside step 3's weights).
    first, failed = tmp_path_factory.mktemp("first-epoch"), tmp_path_factory.mktemp("failed")
    same = [SHAPES[2], "zero_stage=2", "grad_accum_steps=2", "extra.optimizer=adamw"]
    tmp = tmp_path_factory.mktemp("same")
    runs = {"whole": [*same, "epochs=2", "step_times=true"],
            "first": [*same, "epochs=1", f"checkpoint_dir={first}", "checkpoint_every_epochs=1"],
            "resumed": [*same, "epochs=2", f"resume={first}/latest"],
            "lost": [*same, "epochs=2", f"resume={first}/latest", "extra.drop_state_after_resume=2"],
            # one model object for two trainers, the first failing in its last backward (its hooks armed):
            # the second trains what a new model trains (was: the first's hooks took its gradients)
            "shared_failed": [*same, "epochs=2", "extra.shared_model=true",
                              "extra.fail_in_backward_at_step=3"],
            "shared_after": [*same, "epochs=2", "extra.shared_model=true"],
            "failed": [*same, "epochs=2", f"checkpoint_dir={failed}", "checkpoint_every_epochs=1",
                       "extra.raise_at_step=3"]}
    for run in runs:
        (tmp / run).mkdir()
    job = run_job(JOB, *runs_file(tmp, runs), out_dir=tmp, np=2, controller="gloo", timeout=300)
    assert job.returncode == 0, job.output
    got = {run: {rank: json.loads((tmp / run / f"rank-{rank}.json").read_text()) for rank in (0, 1)}
           for run in runs}
    assert got["resumed"][0]["params_sha256"] == got["whole"][0]["params_sha256"]
    assert max_difference(got["lost"][0]["params"], got["whole"][0]["params"]) > 1e-6
    assert "a planned error in backward" in got["shared_failed"][0]["error"]
    assert got["shared_after"][0]["params_sha256"] == got["whole"][0]["params_sha256"]
    # the step-time breakdown names the allgather apart from the exchange (a reduce-scatter at stage 2)
    assert {"exchange", "gather"} <= set(got["whole"][0]["step_times"]["shares"])

    # the manifest records the partition the state was written from
    layout = json.loads((first / "step-00000002" / "manifest.json").read_text())["optimizer_layout"]
    assert (layout["zero_stage"], layout["ranks"]) == (2, 2)
    # the default bucket size: one bucket per group (the weights 0-2; the biases 4-5, the frozen 3 left out)
    assert [bucket["indices"] for bucket in layout["buckets"]] == [[0, 1, 2], [4, 5]]
    assert all(bucket["world"] == 2 and bucket["shard_size"] * 2 >= sum(bucket["numels"])
               for bucket in layout["buckets"])

    assert [report["error"] for report in got["failed"].values()] == ["a planned error at step 3"] * 2
    assert sorted(p.name for p in failed.glob("step-*")) == ["step-00000002"], job.output
    assert ("could not save a checkpoint after the error: the optimizer state is sharded over the ranks "
            "(zero_stage 2): only all ranks together can save it") in job.output


def test_an_optimizer_that_couples_elements_is_refused_in_one_line_on_every_rank(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("refused")
    (tmp / "run").mkdir()
    runs = {"run": [SHAPES[2], "epochs=1", "zero_stage=1", "extra.optimizer=lbfgs"]}
    job = run_job(JOB, *runs_file(tmp, runs), out_dir=tmp, np=2, controller="mpi", timeout=120)
    assert job.returncode == 2, job.output
    message = ("config field 'zero_stage': LBFGS cannot step a slice of the parameters (it runs a line "
               "search over all parameters as one vector); use zero_stage: 0 with it")
    assert job.output.count(message) >= 2, job.output  # every rank says it
    assert "Traceback" not in job.output
