"""Config field `compile` (torch.compile) on real ranks, under Gloo and MPI, with the gradients exchanged
during backward (`overlap`) and after it: compiled training computes what eager training does, its
checkpoints hold the uncompiled model's keys, and compiled and eager runs resume from each other's
checkpoints. One job per controller runs every training of it in turn (compiling is the slow part: each rank
compiles once per job; the compiler's cache is the tests' own, shared by both jobs)."""

import json

import numpy as np
import pytest
import torch
from harness import CONTROLLERS, read_reports, run_job

JOB = "compile_job.py"
TIMEOUT = 600  # generous: compiling takes ~20 s per rank on an idle 2-core machine, and this one is shared
TRAINING = ("extra.n_train=32", "batch_size=4", "log_every=2")  # 4 full steps an epoch: one compile per rank
EXCHANGES = {"overlap": "grad_allreduce=overlap", "after_backward": "grad_allreduce=after_backward"}
EPOCH_1 = "step-00000004"
TOLERANCE = 1e-9  # float64: the compiled kernels may add in another order, nothing more


@pytest.fixture(scope="module")
def inductor_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("inductor")


@pytest.fixture(scope="module", params=CONTROLLERS)
def trainings(request, tmp_path_factory, inductor_cache):
    """Eager and compiled trainings in both exchange modes (1 epoch, checkpointed), an eager 2-epoch run, the
    second epoch of a compiled run resumed from an eager checkpoint and the reverse; under Gloo also a model
    build_model compiled itself, with `compile: true`."""
    out = tmp_path_factory.mktemp(f"compile-{request.param}")
    runs = {}
    for mode, exchange in EXCHANGES.items():
        for name, compile in ((f"eager_{mode}", "compile=false"), (f"compiled_{mode}", "compile=true")):
            runs[name] = (*TRAINING, exchange, compile, f"checkpoint_dir={out / name}")
    runs["eager_two_epochs"] = (*TRAINING, "epochs=2")
    runs["compiled_from_eager"] = (*TRAINING, "epochs=2", "compile=true", EXCHANGES["overlap"],
                                   f"resume={out / 'eager_overlap' / EPOCH_1}")
    runs["eager_from_compiled"] = (*TRAINING, "epochs=2", EXCHANGES["after_backward"],
                                   f"resume={out / 'compiled_after_backward' / EPOCH_1}")
    if request.param == "gloo":
        runs["user_compiled"] = (*TRAINING, "extra.user_compile=true", "compile=true",
                                 f"checkpoint_dir={out / 'user_compiled'}")
        # sharded: stage 2's gradients reduce-scattered from the compiled backward (a bucket a tensor)
        runs["compiled_zero_stage_2"] = (*TRAINING, "compile=true", "zero_stage=2", "zero_bucket_mb=0.000001")
    for name in runs:
        (out / "reports" / name).mkdir(parents=True)
    spec = out / "runs.json"
    spec.write_text(json.dumps({name: list(settings) for name, settings in runs.items()}))
    job = run_job(JOB, "--runs", str(spec), out_dir=out / "reports", controller=request.param,
                  timeout=TIMEOUT, env={"TORCHINDUCTOR_CACHE_DIR": str(inductor_cache)})
    assert job.returncode == 0, job.output
    reports = {name: read_reports(out / "reports" / name) for name in runs}
    for name, by_rank in reports.items():
        assert sorted(by_rank) == [0, 1], f"{name}: {job.output}"
    return job, reports, out


def params(report):
    return np.concatenate([np.asarray(p, dtype=np.float64) for p in report["params"]])


def assert_close(a, b):
    np.testing.assert_allclose(params(a), params(b), rtol=TOLERANCE, atol=0)
    for x, y in zip(a["history"], b["history"], strict=True):
        assert x["train_loss"] == pytest.approx(y["train_loss"], rel=TOLERANCE, abs=0)


@pytest.mark.parametrize("mode", EXCHANGES)
def test_a_compiled_model_trains_what_the_eager_model_trains(trainings, mode):
    _, reports, _ = trainings
    eager, compiled = reports[f"eager_{mode}"], reports[f"compiled_{mode}"]
    assert [compiled[rank]["compiled"] for rank in (0, 1)] == [True, True]
    assert not eager[0]["compiled"]
    assert compiled[0]["params"] == compiled[1]["params"]
    assert_close(compiled[0], eager[0])


@pytest.mark.parametrize("mode", EXCHANGES)
def test_a_compiled_models_checkpoint_holds_the_uncompiled_models_keys(trainings, mode):
    _, _, out = trainings
    for run in (f"compiled_{mode}", f"eager_{mode}"):
        state = torch.load(out / run / EPOCH_1 / "model.pt", weights_only=True)
        assert list(state) == ["weight", "bias"], run  # was: `_orig_mod.weight`, `_orig_mod.bias`


def test_compiled_and_eager_runs_resume_from_each_others_checkpoints(trainings):
    # was: the eager model refused the compiled run's keys (`Missing key(s) in state_dict: "weight"`)
    _, reports, _ = trainings
    whole = reports["eager_two_epochs"][0]
    for resumed in (reports["compiled_from_eager"], reports["eager_from_compiled"]):
        assert resumed[0]["params"] == resumed[1]["params"]
        assert [record["step"] for record in resumed[0]["history"]] == [4, 8]  # epoch 1's from the checkpoint
        np.testing.assert_allclose(params(resumed[0]), params(whole), rtol=TOLERANCE, atol=0)
    assert reports["compiled_from_eager"][0]["compiled"] and not reports["eager_from_compiled"][0]["compiled"]


def test_a_compiled_model_with_sharded_optimizer_and_gradients_trains_what_the_eager_model_trains(trainings):
    _, reports, _ = trainings
    if "compiled_zero_stage_2" not in reports:
        pytest.skip("one controller is enough: the Gloo job runs it")
    sharded = reports["compiled_zero_stage_2"]
    assert [sharded[rank]["compiled"] for rank in (0, 1)] == [True, True]
    assert sharded[0]["params"] == sharded[1]["params"]
    assert_close(sharded[0], reports["eager_after_backward"][0])


def test_a_model_build_model_compiled_is_not_compiled_again(trainings):
    job, reports, out = trainings
    if "user_compiled" not in reports:
        pytest.skip("one controller is enough: the Gloo job runs it")
    assert [reports["user_compiled"][rank]["inner"] for rank in (0, 1)] == ["Linear", "Linear"]
    line = "compile: build_model() returned a compiled model (torch.compile); it is used as it is"
    assert job.output.count(line) == 1, job.output  # rank 0's
    state = torch.load(out / "user_compiled" / EPOCH_1 / "model.pt", weights_only=True)
    assert list(state) == ["weight", "bias"]  # was: `_orig_mod.weight`, `_orig_mod.bias`
    assert_close(reports["user_compiled"][0], reports["eager_after_backward"][0])
