"""scripts/gpu_check.py's decisions and table, without starting a job: which rows run on which machine (the
NCCL pair only with a GPU, the Gloo fallback when NCCL did not run two ranks, compile only where the field
exists), how a job's reports are judged, and the table. Each `Check.job` returns a canned job here; the
real jobs run in tests/integration/test_gpu_check.py and `make gpu-check-cpu`."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "gpu_check.py"
_spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
gpu_check = sys.modules["gpu_check"] = importlib.util.module_from_spec(_spec)  # dataclasses look it up
_spec.loader.exec_module(gpu_check)
Job, Machine, Row = gpu_check.Job, gpu_check.Machine, gpu_check.Row


@pytest.fixture(autouse=True)
def _work_in_tmp_path(tmp_path, monkeypatch):
    """Check's work folder (tempfile.mkdtemp) under the test's tmp_path."""
    monkeypatch.setattr(gpu_check.tempfile, "tempdir", str(tmp_path))


def report(rank=0, device="cpu", precision="fp32", sha="abc", **more):
    return {"rank": rank, "size": 1, "device": device, "precision": precision, "weights_sha256": sha,
            "steps": 16, "history": [{"train_loss": 1.25}, {"train_loss": 0.75}],
            "batchnorm_class": "SyncBatchNorm", "step_model_class": "OptimizedModule", **more}


def trained(device="cpu", np=1, output="hvdazure: resumed from step-00000004", **more):
    return Job(0, output, {r: report(r, device, **more) for r in range(np)}, 1.0)


class CannedCheck(gpu_check.Check):
    """A Check whose jobs are answered from `answers` (job name -> Job), recording what was asked."""

    def __init__(self, machine, tmp_path, answers, **kwargs):
        super().__init__(machine, tmp_path, kwargs.pop("budget", 300.0), None, **kwargs)
        self.answers, self.asked = answers, []

    def job(self, name, settings, np=1, script="job.py", env=None, timeout=0):
        self.asked.append((name, tuple(settings), np, env))
        answer = self.answers.get(name)
        if answer is None:
            device = "cpu" if (env or {}).get("CUDA_VISIBLE_DEVICES") == "" else self.machine.device
            precision = next((s.split("=")[1] for s in settings if s.startswith("precision=")), "fp32")
            exported = {f: {"bytes": 1} for f in ("onnx", "torchscript", "exported_program")}
            answer = trained(device, np, precision=precision, predict_shape=[64, 4],
                             predict_rows_sum_to_1=True, exported=exported)
        return answer


def machine(gpu=None, compile_field=True, nccl=False):
    return Machine(gpu, "2.11.0+cu130" if gpu else "2.13.0+cpu", "13.0" if gpu else None,
                   "2.27.7" if gpu else None, "0.28.1", {"nccl": nccl, "gloo": True, "mpi": not gpu},
                   compile_field)


def by_check(rows):
    return {row.check: row for row in rows}


def test_without_a_gpu_every_row_runs_on_the_cpu_but_the_nccl_pair(tmp_path):
    check = CannedCheck(machine(), tmp_path, {"resume-crash": Job(17, "", {}, 1.0)})
    rows = by_check(check.run_all())

    assert rows["2 ranks on one GPU (NCCL)"].status == "not run: no GPU"
    fallback = rows["2 ranks, Gloo CPU ops (fallback)"]
    assert fallback.status == "passed" and fallback.detail.startswith("no GPU;")
    assert all(row.status == "passed" for name, row in rows.items() if "NCCL" not in name), rows
    assert {row.device for row in rows.values() if "NCCL" not in row.check} == {"cpu"}
    assert ("gloo-pair", ("sync_batchnorm=true",), 2, {"CUDA_VISIBLE_DEVICES": ""}) in check.asked
    assert list(rows)[-1] == "compile: true"  # the slowest to start, last


def test_on_a_gpu_nccl_refusing_two_ranks_runs_the_gloo_fallback_and_says_why(tmp_path):
    refused = Job(1, "[1]: NCCL WARN Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 0\n"
                     "RuntimeError: ncclInvalidUsage: This usually reflects invalid usage of NCCL library.\n"
                     "hvdazure run: rank 1 failed first, with exit code 1", {}, 2.0)
    check = CannedCheck(machine("NVIDIA H100 80GB HBM3", nccl=True), tmp_path,
                        {"nccl-pair": refused, "resume-crash": Job(17, "", {}, 1.0)})
    rows = by_check(check.run_all())

    pair = rows["2 ranks on one GPU (NCCL)"]
    assert pair.status == "not run: NCCL refused 2 ranks on one GPU"
    assert pair.detail.startswith("RuntimeError: ncclInvalidUsage")  # the exception's line, not the last one
    fallback = rows["2 ranks, Gloo CPU ops (fallback)"]
    assert fallback.status == "passed" and fallback.device == "cpu"
    assert fallback.detail.startswith("NCCL refused 2 ranks on one GPU;")
    assert rows["train bf16"].device == "cuda:0" and rows["train bf16"].status == "passed"
    assert "nccl-train" not in [name for name, *_ in check.asked]


def test_on_a_gpu_where_nccl_runs_two_ranks_the_fallback_is_not_run(tmp_path):
    check = CannedCheck(machine("NVIDIA H200", nccl=True), tmp_path,
                        {"nccl-pair": Job(0, "nccl pair: ok", {}, 1.0),
                         "nccl-train": trained("cuda:0", np=2), "resume-crash": Job(17, "", {}, 1.0)})
    rows = by_check(check.run_all())

    assert rows["2 ranks on one GPU (NCCL)"].status == "passed"
    assert rows["2 ranks, Gloo CPU ops (fallback)"].status == "not run: NCCL ran 2 ranks"


def test_on_a_gpu_the_one_rank_rows_run_several_at_a_time_and_keep_the_tables_order(tmp_path):
    check = CannedCheck(machine("NVIDIA H100", nccl=True), tmp_path,
                        {"nccl-pair": Job(1, "RuntimeError: ncclInvalidUsage", {}, 1.0),
                         "resume-crash": Job(17, "", {}, 1.0)}, parallel=3)
    rows = check.run_all()

    assert [row.check for row in rows] == [
        "Horovod with NCCL and Gloo", "train fp32", "train bf16", "train fp16", "sync_batchnorm",
        "checkpoint + bit-identical resume", "predict + export", "2 ranks on one GPU (NCCL)",
        "2 ranks, Gloo CPU ops (fallback)", "compile: true"]
    assert [row.status for row in rows if "NCCL)" not in row.check] == ["passed"] * 9
    assert "the one-rank rows 3 at a time" in gpu_check.table(check.machine, rows, 60.0, 3)


def test_a_gpu_without_horovods_nccl_fails_the_horovod_row(tmp_path):
    check = CannedCheck(machine("NVIDIA H100", nccl=False), tmp_path, {"resume-crash": Job(17, "", {}, 1.0)},
                        selected=())
    rows = by_check(check.run_all())
    assert rows["Horovod with NCCL and Gloo"].status == "FAILED"
    assert rows["train fp32"].status == "not run: not selected (--rows)"


def test_an_hvdazure_without_the_compile_field_says_so(tmp_path):
    rows = by_check(CannedCheck(machine(compile_field=False), tmp_path, {}, selected=("compile",)).run_all())
    assert rows["compile: true"].status == "not run: this hvdazure has no `compile` field"


def test_a_spent_budget_leaves_the_rows_not_run(tmp_path):
    rows = CannedCheck(machine(), tmp_path, {}, budget=5.0).run_all()
    assert rows[1].status.startswith("not run: out of time")


@pytest.mark.parametrize(("job", "why"), [
    (Job(1, "Traceback ...\nValueError: precision 'fp8'\nhvdazure run: rank 0 failed first", {}, 1),
     "exit 1: ValueError"),
    (trained("cpu"), "trained on ['cpu'], not cuda:0"),
    (Job(0, "", {0: report(device="cuda:0"), 1: report(1, "cuda:0", sha="other")}, 1), "different weights"),
    (Job(0, "", {0: report(device="cuda:0")}, 1), "reports from ranks [0], not 0..1"),
])
def test_a_training_job_fails_for_each_reason_with_its_line(job, why):
    np = 2 if "ranks [0]" in why or "weights" in why else 1
    status, detail = gpu_check.judge_training(job, "cuda:0", np=np)
    assert status == "FAILED"
    assert why in detail


def test_the_resume_row_fails_when_the_resumed_weights_differ(tmp_path):
    answers = {"resume-crash": Job(17, "", {}, 1.0), "resume-resumed": trained(sha="different")}
    check = CannedCheck(machine(), tmp_path, answers, selected=("resume",))
    row = by_check(check.run_all())["checkpoint + bit-identical resume"]
    assert row.status == "FAILED" and "final weights differ" in row.detail


def test_the_table_and_its_json(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(gpu_check, "read_machine", lambda: machine())
    monkeypatch.setattr(gpu_check.Check, "job", CannedCheck.job)
    monkeypatch.setattr(gpu_check.Check, "answers", {"resume-crash": Job(1, "", {}, 1.0)}, raising=False)
    monkeypatch.setattr(gpu_check.Check, "asked", [], raising=False)
    (tmp_path / "build.json").write_text(json.dumps({"status": "not run: no GPU", "seconds": None,
                                                     "detail": "", "device": "cpu"}))

    status = gpu_check.main(["--out", str(tmp_path), "--build-json", str(tmp_path / "build.json")])

    assert status == 1  # the resume row failed: its interrupted run exited 1, not 17
    table = (tmp_path / "gpu_check.md").read_text()
    assert table in capsys.readouterr().out
    assert "- GPU: none visible (the CPU fallbacks ran)" in table
    assert "| build Horovod (NCCL + Gloo) | cpu | not run: no GPU |  |  |" in table
    assert "| checkpoint + bit-identical resume | cpu | FAILED |" in table
    data = json.loads((tmp_path / "gpu_check.json").read_text())
    assert data["machine"]["horovod_ops"] == {"nccl": False, "gloo": True, "mpi": True}
    assert [row["check"] for row in data["rows"]][:3] == ["build Horovod (NCCL + Gloo)",
                                                          "Horovod with NCCL and Gloo", "train fp32"]


def test_an_unknown_row_is_refused(capsys):
    with pytest.raises(SystemExit):
        gpu_check.main(["--out", "/nonexistent", "--rows", "fp32,fp8"])
    assert "--rows fp8: not a row" in capsys.readouterr().err
