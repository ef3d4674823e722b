"""Rank 0 alone writes TensorBoard and MLflow records of the all-rank metrics and a profiler trace of the
steps `hvdazure run --profile` names; other ranks stay quiet."""

import json

import pytest
from harness import run_job
from rank_output import lines_of


def test_tensorboard_mlflow_and_quiet_ranks(tmp_path):
    out = tmp_path / "outputs"
    reports_dir = tmp_path / "reports"
    reports_dir.mkdir()
    settings = ["epochs=2", "batch_size=4", "extra.n_eval=6", "tensorboard=true", "mlflow=true",
                f"output_dir={out}", "extra.warn=true", "compression=fp16", "precision=bf16"]
    job = run_job("torch_job.py", *[a for s in settings for a in ("--set", s)], out_dir=reports_dir,
                  env={"MLFLOW_TRACKING_URI": ""}, launcher_args=("--profile", "3-4"))

    assert job.returncode == 0, job.output
    reports = job.reports
    steps = 2 * reports[0]["steps_per_epoch"]

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util.tensor_util import make_ndarray

    event_files = list((out / "tensorboard").glob("events.out.tfevents.*"))
    assert len(event_files) == 1  # one writer: rank 0
    events = EventAccumulator(str(event_files[0]))
    events.Reload()
    assert [e.step for e in events.Tensors("train/loss")] == list(range(1, steps + 1))
    assert [e.step for e in events.Tensors("eval/mse")] == [steps // 2, steps]
    # where the time went, from the second step on (the first is start-up, kept out of the shares)
    for phase in ("data", "compute", "exchange", "optimizer", "other", "samples_per_s"):
        assert [e.step for e in events.Tensors(f"time/{phase}")] == list(range(2, steps + 1)), phase
    last_eval = make_ndarray(events.Tensors("eval/mse")[-1].tensor_proto).item()
    assert last_eval == pytest.approx(reports[0]["history"][-1]["eval_mse"], rel=1e-6)  # stored as float32
    # TensorBoard's own writers import TensorFlow where it is installed (seconds, banners); ours does not
    assert [reports[rank]["tensorflow_imported"] for rank in (0, 1)] == [False, False]

    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{out / 'mlflow.db'}")
    runs = mlflow.search_runs(search_all_experiments=True, output_format="list")
    assert len(runs) == 1
    run = runs[0]
    assert run.data.params["world_size"] == "2"
    assert run.data.params["global_batch_size"] == "8"
    assert run.data.metrics["eval_mse"] == reports[0]["history"][-1]["eval_mse"]
    assert {"train_loss", "lr", "time_data", "time_compute", "time_exchange", "samples_per_s"} <= set(
        run.data.metrics)
    times = [reports[rank]["step_times"] for rank in (0, 1)]
    assert times[0] == times[1] and times[0]["ranks"] == 2  # reduced over the ranks: the same on each
    assert run.data.metrics["time_exchange"] == times[0]["shares"]["exchange"]
    assert sum(times[0]["shares"].values()) == pytest.approx(1.0)

    # a warning raised on every rank is shown once, by rank 0; rank 1 prints no progress either
    assert job.stderr.count("UserWarning: a warning raised on every rank") == 1
    assert "[rank 1]" not in "".join(line for line in job.stderr.splitlines(True) if "warning" in line)
    assert "[rank 1] hvdazure:" not in job.stderr
    rank0 = lines_of(job.stderr, 0)
    assert any(line.startswith("hvdazure: epoch 2 done") for line in rank0), job.stderr
    # the step-time table: once, at the end of fit(), by rank 0 alone (no starved loader: not early too),
    # its advice true to the run: one machine, on Gloo
    assert [line for line in rank0 if "where the time went" in line] == [
        next(line for line in rank0 if line.startswith("hvdazure: where the time went in fit()"))], job.stderr
    assert any(line.startswith("  allreduce wait ") for line in rank0) and "| time data " in job.stderr
    assert "across machines" not in job.stderr
    # through a pipe: lines, not a redrawn display
    assert "\r" not in job.output and "\x1b" not in job.output

    # on CPUs no device numbers: nothing shown, nothing logged
    assert "| gpu peak" not in job.stderr and "gpu memory peak" not in job.stderr
    assert not [name for name in run.data.metrics if name.startswith("gpu")]
    assert not [tag for tag in events.Tags()["tensors"] if tag.startswith("gpu/")]

    # hvdazure run --profile 3-4 (HVDAZURE_PROFILE_STEPS on every rank): rank 0 alone traced steps 3 and 4
    trace = out / "profile" / "steps-3-4-rank0.pt.trace.json"
    assert sorted(p.name for p in (out / "profile").iterdir()) == [trace.name]  # nothing of rank 1's
    events = json.loads(trace.read_text())["traceEvents"]
    steps = sorted({e["name"] for e in events if e.get("name", "").startswith("ProfilerStep#")})
    assert steps == ["ProfilerStep#3", "ProfilerStep#4"]
    assert any(e.get("name", "").startswith("aten::") for e in events)  # the ops themselves, on the CPU
    assert rank0.count(f"hvdazure: profiler trace of steps 3-4 (rank 0) written to {trace}; "
                       "open it in https://ui.perfetto.dev or chrome://tracing") == 1
    assert "[rank 1] hvdazure: profiler" not in job.stderr
    assert "[rank 1] hvdazure: recording" not in job.stderr
