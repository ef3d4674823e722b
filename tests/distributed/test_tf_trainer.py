"""TensorFlowTrainer on real ranks: what every data-parallel user relies on, asserted across processes (the
TensorFlow side of test_torch_trainer.py).

TensorFlow takes seconds to start on every rank, so the jobs are few and shared: one job per (number of
ranks, controller) runs its variants below in turn (harness.run_trainings), once per module, on first use,
and each test asserts one behaviour on the runs it needs.
"""

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest
from harness import CONTROLLERS, run_job, run_trainings
from rank_output import lines_of

JOB = "tf_job.py"
# Global batches of 8 (2 ranks x 4, or 1 x 8); base_batch_size 4: the LR is scaled linearly to 2 x lr for
# that global batch, for 1 and for 2 ranks alike.
COMMON = ("epochs=3", "lr=0.025", "base_batch_size=4", "warmup_steps=3")
BATCH = {2: "batch_size=4", 1: "batch_size=8"}
# variant: (its settings, the controller of its 2-rank run); 1-rank runs use MPI (no horovodrun to start)
VARIANTS = {
    # 37 samples: every epoch ends with a step of 5 (3 + 2 over 2 ranks). 9 eval samples: 5 + 4 over 2
    # ranks, in batches of 4 + 1 and of 4
    "plain": (("extra.n_train=37", "extra.n_eval=9", "extra.autograph_log=1"), "gloo"),
    # global batch 16: the last step's 5 samples fill 2 of the 4 (rank, micro-batch) cells, so both ranks
    # have an empty micro-batch in it; 1 eval sample: rank 1 has none
    "accumulation": (("extra.n_train=37", "grad_accum_steps=2", "extra.n_eval=1"), "gloo"),
    # 33 samples: the last step holds 1, and rank 1 trains on nothing in it (it sends zero gradients)
    "clipping": (("extra.n_train=33", "grad_clip_norm=0.5"), "mpi"),
    # "plain" in a subclass that takes every name the loop used to keep on the trainer (workers/squatter.py)
    "squatting": (("extra.n_train=37", "extra.n_eval=9", "extra.squat=true"), "gloo"),
    # "plain" with its forward and backward pass compiled by XLA (no sample record: XLA has no py_function)
    "compiled": (("extra.n_train=37", "extra.n_eval=9", "compile=true"), "mpi"),
}


def _trainings(np, controller):
    """Every variant that runs with `np` ranks under `controller`, by name."""
    return {variant: (*COMMON, *settings, BATCH[np]) for variant, (settings, used) in VARIANTS.items()
            if np == 1 or used == controller}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """runs(variant, np): the job that ran that variant with np ranks (each job runs all of its variants in
    turn: 2 ranks under Gloo, 2 under MPI, 1 under MPI, as no horovodrun is needed to start one rank)."""
    jobs = {}

    def get(variant, np):
        controller = VARIANTS[variant][1] if np == 2 else "mpi"
        if (np, controller) not in jobs:
            out = tmp_path_factory.mktemp(f"tf-{np}-{controller}")
            trainings = _trainings(np, controller)
            if "plain" in trainings:  # test_a_tensorflow_run_writes_tensorboard_events_of_the_reduced_metrics
                trainings["plain"] += ("tensorboard=true", f"output_dir={out / 'plain-outputs'}",
                                       "profile_steps=3-4")  # test_rank_0_alone_records_a_tensorflow_profile
            jobs[np, controller] = run_trainings(trainings, out, np=np, controller=controller, script=JOB)
        trainings = jobs[np, controller]
        return SimpleNamespace(reports=trainings[variant], output=trainings.job.output)

    return get


@pytest.mark.parametrize("controller", CONTROLLERS)
def test_weights_are_bit_identical_across_ranks_after_training(runs, controller):
    variant = next(name for name, (_, used) in VARIANTS.items() if used == controller)
    reports = runs(variant, 2).reports

    assert reports[0]["params_sha256"] == reports[1]["params_sha256"]
    assert reports[0]["history"] == reports[1]["history"]
    layout = [line for line in runs(variant, 2).output.splitlines() if "ranks on 1 node" in line]
    assert layout and set(layout) == {"hvdazure: 2 ranks on 1 node, CPU"}  # rank 0's alone, untagged


def test_a_subclass_using_every_name_the_loop_once_kept_on_the_trainer_trains_exactly_as_its_base(runs):
    # the loop's state and machinery live in one name-mangled object: the user's `_build`, `_emit`,
    # `_checkpoints`, ... are neither called nor overwritten (was: fit() called the user's methods)
    squatting, plain = runs("squatting", 2).reports, runs("plain", 2).reports

    assert [squatting[rank]["squat_intact"] for rank in (0, 1)] == [True, True]
    assert [squatting[r]["params_sha256"] for r in (0, 1)] == [plain[r]["params_sha256"] for r in (0, 1)]
    assert [squatting[r]["history"] for r in (0, 1)] == [plain[r]["history"] for r in (0, 1)]
    assert [squatting[r]["seen"] for r in (0, 1)] == [plain[r]["seen"] for r in (0, 1)]


@pytest.mark.parametrize("np_", [1, 2])
def test_compile_true_trains_as_the_uncompiled_step_does(runs, np_):
    # compile: true: the forward and backward pass XLA-compiled (jit_compile), the allreduce and update not
    compiled, plain = runs("compiled", np_).reports, runs("plain", np_).reports

    for rank in compiled:
        for wc, wp in zip(compiled[rank]["params"], plain[rank]["params"], strict=True):
            assert wc == pytest.approx(wp, rel=0, abs=1e-10)
        for rc, rp in zip(compiled[rank]["history"], plain[rank]["history"], strict=True):
            assert rc["train_loss"] == pytest.approx(rp["train_loss"], rel=0, abs=1e-10)
            assert rc["eval_mse"] == pytest.approx(rp["eval_mse"], rel=0, abs=1e-10)
    if np_ == 2:
        assert compiled[0]["params_sha256"] == compiled[1]["params_sha256"]


def test_a_rank_without_samples_in_a_step_joins_the_steps_allreduce_instead_of_hanging(runs):
    # 33 samples: rank 0 trains on the last step's one sample in the fused train step, while rank 1 sends
    # zero gradients from the separate update step (was: a hang, both waiting in differently named
    # allreduces; run_job fails a job that hangs)
    reports = runs("clipping", 2).reports

    assert [len(reports[rank]["seen"]["0"]) for rank in (0, 1)] == [17, 16]
    assert reports[0]["params_sha256"] == reports[1]["params_sha256"]


@pytest.mark.parametrize("variant", VARIANTS)
def test_two_ranks_with_batch_b_match_one_rank_with_batch_2b_in_float64(runs, variant):
    two, one = runs(variant, 2).reports[0], runs(variant, 1).reports[0]

    assert two["dtypes"] == one["dtypes"] == ["float64"]
    assert two["steps_per_epoch"] == one["steps_per_epoch"]
    for w2, w1 in zip(two["params"], one["params"], strict=True):
        assert w2 == pytest.approx(w1, rel=0, abs=1e-10)
    for r2, r1 in zip(two["history"], one["history"], strict=True):
        assert r2["train_loss"] == pytest.approx(r1["train_loss"], rel=0, abs=1e-10)


@pytest.mark.parametrize("variant", ["plain", "accumulation"])
def test_every_sample_is_used_exactly_once_per_epoch_and_the_order_changes_between_epochs(runs, variant):
    reports = runs(variant, 2).reports

    for epoch in ("0", "1", "2"):
        used = reports[0]["seen"][epoch] + reports[1]["seen"][epoch]
        assert sorted(used) == list(range(37)), f"epoch {epoch}"
    assert reports[0]["seen"]["0"] != reports[0]["seen"]["1"]
    assert reports[0]["not_the_planned_batch"] == reports[1]["not_the_planned_batch"] == 0


def test_pytorch_and_tensorflow_runs_of_the_same_config_train_each_rank_on_the_same_samples(runs, tmp_path):
    settings, _ = VARIANTS["plain"]
    out = tmp_path / "torch"
    out.mkdir()
    torch = run_job("torch_job.py", *[a for s in (*COMMON, *settings, BATCH[2]) for a in ("--set", s)],
                    out_dir=out, timeout=240)
    assert torch.returncode == 0, torch.output
    tensorflow = runs("plain", 2).reports

    for rank in (0, 1):
        assert tensorflow[rank]["seen"] == torch.reports[rank]["seen"], f"rank {rank}"


def test_evaluation_on_an_odd_sized_set_equals_the_single_process_result(runs):
    # eval "index" is the mean of the sample indices 0..8: exactly 4.0 only if each counts once
    two, one = runs("plain", 2).reports, runs("plain", 1).reports

    assert [r["eval_index"] for r in two[0]["history"]] == [4.0, 4.0, 4.0]
    assert [r["eval_index"] for r in one[0]["history"]] == [4.0, 4.0, 4.0]
    assert two[0]["history"][-1]["eval_mse"] == pytest.approx(one[0]["history"][-1]["eval_mse"], abs=1e-10)


def test_a_tensorflow_run_writes_tensorboard_events_of_the_reduced_metrics(runs):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util.tensor_util import make_ndarray

    reports = runs("plain", 2).reports
    event_files = list((Path(reports[0]["output_dir"]) / "tensorboard").glob("events.out.tfevents.*"))
    assert len(event_files) == 1  # one writer: rank 0
    events = EventAccumulator(str(event_files[0]), size_guidance={"tensors": 0})  # 0: keep all, not 10
    events.Reload()
    steps = 3 * reports[0]["steps_per_epoch"]
    assert [e.step for e in events.Tensors("train/loss")] == list(range(1, steps + 1))
    evals = [make_ndarray(e.tensor_proto).item() for e in events.Tensors("eval/mse")]
    assert evals == pytest.approx([r["eval_mse"] for r in reports[0]["history"]], rel=1e-6)  # float32
    # where the time went, from the second step on (the first is start-up): TensorFlow's compiled step
    assert [e.step for e in events.Tensors("time/step")] == list(range(2, steps + 1))
    assert {"time/data", "time/other", "time/samples_per_s"} <= set(events.Tags()["tensors"])


@pytest.mark.parametrize("controller", CONTROLLERS)
def test_where_the_time_went_is_the_same_on_every_rank_and_rank_0_tables_it(runs, controller):
    variant = next(name for name, (_, used) in VARIANTS.items() if used == controller)
    job = runs(variant, 2)
    times = [job.reports[rank]["step_times"] for rank in (0, 1)]

    assert times[0] == times[1]  # reduced over the ranks in the interval's collective
    assert times[0]["ranks"] == 2 and times[0]["steps"] == 1  # log_every=1: the last interval's one step
    assert set(times[0]["shares"]) <= {"data", "step", "eval", "other"} and "step" in times[0]["shares"]
    assert all(0.0 <= share <= 1.0 for share in times[0]["shares"].values())
    assert sum(times[0]["shares"].values()) == pytest.approx(1.0)
    trainings = len(_trainings(2, controller))
    assert [line.startswith("hvdazure: where the time went in fit()") for line in lines_of(job.output, 0)
            ].count(True) == trainings
    assert not [line for line in lines_of(job.output, 1) if "where the time went" in line]
    assert "compiled step" in job.output and "| time data " in job.output


def test_evaluation_on_a_set_smaller_than_the_world_size_reports_it_on_every_rank(runs):
    reports = runs("accumulation", 2).reports

    assert reports[0]["history"][-1]["eval_index"] == reports[1]["history"][-1]["eval_index"] == 0.0
    assert reports[0]["history"][-1]["eval_mse"] == reports[1]["history"][-1]["eval_mse"]


@pytest.mark.parametrize("variant", ["plain", "accumulation"])
@pytest.mark.parametrize("np_", [1, 2])
def test_lr_follows_warmup_to_the_linearly_scaled_lr_at_every_optimizer_step(runs, variant, np_):
    lr, base, warmup = 0.025, 4, 3
    accum = 2 if variant == "accumulation" else 1
    reports = runs(variant, np_).reports

    peak = lr * 8 * accum / base  # global batch 8 x accum on 1 and on 2 ranks
    lrs = reports[0]["lrs"]
    assert len(lrs) == 3 * -(-37 // (8 * accum))  # one LR per optimizer step, three epochs
    for step, used in enumerate(lrs):
        expected = lr + (peak - lr) * step / warmup if step < warmup else peak
        assert used == pytest.approx(expected, rel=1e-12), step
    assert reports[0]["history"][-1]["lr"] == pytest.approx(peak, rel=1e-12)


@pytest.mark.parametrize(("variant", "np_"),
                         [("plain", 2), ("plain", 1), ("accumulation", 2), ("clipping", 2), ("compiled", 2)])
def test_the_steps_are_traced_once_not_per_epoch_or_batch_size(runs, variant, np_):
    # for 3 epochs, the plain 2-rank run trains on batches of 4, 3 and 2 and evaluates on batches of 4 and 1;
    # the others also update from accumulated gradients, or from zeros on a rank without samples
    job = runs(variant, np_)

    for rank, report in job.reports.items():
        assert report["traces"]["training_step"] == 1, rank
        assert report["traces"]["validation_step"] <= 1, rank
    assert "retracing" not in job.output


def test_autograph_converts_the_users_step_but_not_horovods_functions(runs):
    # was: AutoGraph converted Horovod's grouped_allreduce and its helpers (and Keras's optimizer) on the
    # first trace, about 2 of the 2.4 s the first step of an MLP took to trace; nothing there needs it
    output = runs("plain", 2).output
    assert "Converted call: <bound method RegressionTrainer.training_step" in output
    assert "Converted call: <function grouped_allreduce" not in output
    assert "Converted call: <function allreduce" not in output


def test_rank_0_alone_records_a_tensorflow_profile_of_the_steps_asked_for_and_only_when_asked(runs):
    job = runs("plain", 2)
    profile = Path(job.reports[0]["output_dir"]) / "profile"

    written = list(profile.rglob("*.xplane.pb"))  # TensorBoard's Profile tab reads plugins/profile/RUN/HOST.*
    assert len(written) == 1 and written[0].parent.parent == profile / "plugins" / "profile", written
    assert [p for p in profile.rglob("*") if p.is_file()] == written  # nothing from rank 1, no leftovers
    assert _marked_steps(written[0]) == [3, 4]
    line = f"hvdazure: profiler trace of steps 3-4 (rank 0) written to {written[0]}; open it "
    assert [text.startswith(line) for text in lines_of(job.output, 0)].count(True) == 1
    assert f"`tensorboard --logdir {profile}`, Profile tab" in job.output
    # the job's other trainings (accumulation, squatting) asked for none and recorded none
    assert job.output.count("hvdazure: recording a profiler trace") == 1
    assert "[rank 1] hvdazure: recording a profiler trace" not in job.output


def _marked_steps(xplane: Path) -> list[int]:
    """The step numbers of the `train` step markers in a TensorFlow profile (an XSpace protobuf), read with
    TensorFlow's own message class, loaded from its file: importing tensorflow here would cost seconds."""
    messages = Path(importlib.util.find_spec("tensorflow").origin).parent / "tsl/profiler/protobuf"
    spec = importlib.util.spec_from_file_location("xplane_pb2", messages / "xplane_pb2.py")
    xplane_pb2 = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(xplane_pb2)
    space = xplane_pb2.XSpace.FromString(xplane.read_bytes())
    steps = []
    for plane in space.planes:
        stat_names = {key: stat.name for key, stat in plane.stat_metadata.items()}
        for line in plane.lines:
            steps += [stat.int64_value for event in line.events
                      if plane.event_metadata[event.metadata_id].name == "train"
                      for stat in event.stats if stat_names.get(stat.metadata_id) == "step_num"]
    return sorted(steps)


def test_zero_stage_is_refused_in_one_line_on_every_rank_before_training(tmp_path):
    # sharded optimizer state is PyTorch-only: was silently ignored, the whole state kept on every rank
    job = run_job(JOB, "--set", "zero_stage=1", out_dir=tmp_path, controller="gloo", timeout=180)

    assert job.returncode == 2, job.output  # the bad-input status: every rank is let to say it
    for rank in (0, 1):
        errors = [line for line in lines_of(job.stderr, rank) if line.startswith("hvdazure: error:")]
        assert len(errors) == 1, job.stderr
        assert errors[0].endswith("config field 'zero_stage': 1: sharded optimizer state is PyTorch-only for "
                                  "now; use zero_stage: 0 with TensorFlowTrainer"), errors[0]
    assert "Traceback" not in job.output
    assert not list(tmp_path.glob("pid-*")) and not job.reports  # training never started
