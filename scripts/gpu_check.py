"""The GPU check's runs and its table: short training jobs through hvdazure's public API, one per row.

    python scripts/gpu_check.py --out DIR [--build-json FILE] [--budget SECONDS]

Normally started by scripts/gpu_check.sh, which builds Horovod first where the machine needs it. Each row is
a separate `hvdazure run -np N --gloo scripts/gpu_check/job.py --set ...` job (scripts/gpu_check/), on
cuda:0 where torch sees a GPU, else on the CPU (the CPU fallbacks: what a machine without a GPU can check);
rows that need a GPU are then "not run: no GPU". Writes one table: markdown to stdout and DIR/gpu_check.md,
the same as JSON in DIR/gpu_check.json, and every job's output to DIR/gpu_check.log. Exit status 1 if a row
failed, else 0 (a row not run is no failure).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
JOBS = REPO / "scripts" / "gpu_check"
PASSED, FAILED, NOT_RUN = "passed", "FAILED", "not run"
NO_GPU = "not run: no GPU"
# Seconds a row's jobs may take, each; torch.compile's first compilation is the slow one
JOB_TIMEOUT_S = 180.0
# The rows' keys (--rows), in the table's order
ROWS = ("fp32", "bf16", "fp16", "syncbn", "resume", "predict", "nccl", "gloo", "compile")
COMPILE_TIMEOUT_S = 300.0
NCCL_PROBE_TIMEOUT_S = 60.0  # NCCL refuses at once; a hang in its set-up must not take the budget


@dataclass
class Row:
    """One line of the table: what was checked, where, how it went and how long it took."""

    check: str
    device: str = ""
    status: str = NOT_RUN  # PASSED, FAILED, or "not run: <why>"
    seconds: float | None = None
    detail: str = ""

    @property
    def failed(self) -> bool:
        """A failure (a row not run is none)."""
        return self.status == FAILED


@dataclass
class Job:
    """What one `hvdazure run` job did: its exit status, output, each rank's report and its wall time."""

    returncode: int
    output: str
    reports: dict[int, dict[str, Any]]
    seconds: float


@dataclass
class Machine:
    """What the check runs on: read once, printed above the table."""

    gpu: str | None  # torch.cuda.get_device_name(0), or None without a visible GPU
    torch: str
    cuda: str | None  # torch.version.cuda
    nccl: str | None  # torch's NCCL, e.g. "2.27.7"
    horovod: str | None
    horovod_ops: dict[str, bool] = field(default_factory=dict)  # nccl, gloo, mpi -> built
    has_compile_field: bool = False  # TrainConfig.compile exists in this hvdazure
    python: str = platform.python_version()

    @property
    def device(self) -> str:
        """Where the one-rank rows train: cuda:0 or cpu."""
        return "cuda:0" if self.gpu else "cpu"


def read_machine() -> Machine:
    """The GPU, torch, CUDA, NCCL and Horovod this check runs with (Horovod None when it will not import)."""
    import torch

    from hvdazure.core.config import TrainConfig

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    nccl = None
    try:
        version = torch.cuda.nccl.version()
        nccl = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
    except (AttributeError, RuntimeError):  # a CPU build of torch has no NCCL
        pass
    horovod, ops = None, {}
    try:
        import horovod as hvd_package
        import horovod.torch as hvd

        horovod = hvd_package.__version__
        ops = {"nccl": bool(hvd.nccl_built()), "gloo": bool(hvd.gloo_built()), "mpi": bool(hvd.mpi_built())}
    except Exception:  # not installed, or its extension does not load: the rows say what that breaks
        pass
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    return Machine(gpu, torch.__version__, torch.version.cuda, nccl, horovod, ops, "compile" in fields)


def run_job(script: str, settings: Sequence[str], np: int, out: Path, log: Callable[[str], None],
            env: dict[str, str] | None = None, timeout: float = JOB_TIMEOUT_S) -> Job:
    """`hvdazure run -np N --gloo scripts/gpu_check/SCRIPT --set S...` with its reports going to `out`."""
    out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "hvdazure.cli", "run", "-np", str(np), "--gloo", str(JOBS / script)]
    cmd += [arg for setting in settings for arg in ("--set", setting)]
    path = os.environ.get("PYTHONPATH")
    job_env = {**os.environ, "GPU_CHECK_OUT": str(out), "PYTHONUNBUFFERED": "1",
               "PYTHONPATH": f"{REPO}{os.pathsep}{path}" if path else str(REPO), **(env or {})}
    start = time.monotonic()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=job_env, cwd=out, timeout=timeout)
        returncode, output = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as exc:  # `hvdazure run` stops its ranks when it is killed
        returncode = 124
        output = f"{_text(exc.stdout)}{_text(exc.stderr)}\n(gpu_check: still running after {timeout:.0f}s)"
    seconds = time.monotonic() - start
    log(f"$ {' '.join(cmd)}\n(exit {returncode} after {seconds:.1f}s)\n{output}\n")
    reports = {}
    for report in out.glob("report-*.json"):
        data = json.loads(report.read_text())
        reports[int(data["rank"])] = data
    return Job(returncode, output, reports, seconds)


def _text(value: str | bytes | None) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value or ""


def last_line(output: str) -> str:
    """The line that says what went wrong: the last exception line (`ValueError: ...`), else the last line
    naming an error or a failure, else the last line."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    for pattern in (_EXCEPTION_LINE, _PROBLEM_LINE):
        for line in reversed(lines):
            if pattern.search(line):
                return line[:300]
    return lines[-1][:300] if lines else "(no output)"


_EXCEPTION_LINE = re.compile(r"\b\w*(Error|Exception|Interrupt)\b: ")
_PROBLEM_LINE = re.compile(r"error|refused|fail|duplicate", re.IGNORECASE)


def judge_training(job: Job, device: str, np: int = 1, precision: str = "fp32") -> tuple[str, str]:
    """PASSED when every rank trained all its steps on `device` at `precision`, with a finite loss, and the
    ranks ended with the same weights; else FAILED, with the reason."""
    if job.returncode != 0:
        return FAILED, f"exit {job.returncode}: {last_line(job.output)}"
    if sorted(job.reports) != list(range(np)):
        return FAILED, f"reports from ranks {sorted(job.reports)}, not 0..{np - 1}"
    first = job.reports[0]
    devices = {r["device"] for r in job.reports.values()}
    if devices != {device}:
        return FAILED, f"trained on {sorted(devices)}, not {device}"
    if first["precision"] != precision:
        return FAILED, f"precision {first['precision']}, not {precision}"
    losses = [epoch["train_loss"] for epoch in first["history"]]
    if not losses or not all(loss == loss and abs(loss) < float("inf") for loss in losses):
        return FAILED, f"train losses {losses}"
    if len({r["weights_sha256"] for r in job.reports.values()}) != 1:
        return FAILED, "the ranks ended with different weights"
    return PASSED, f"{first['steps']} steps, train loss {losses[0]:.4f} -> {losses[-1]:.4f}"


class Check:
    """Runs the rows in order within a time budget, collecting them and every job's output."""

    def __init__(self, machine: Machine, out: Path, budget_s: float, build: Row | None,
                 selected: Collection[str] = ROWS, parallel: int = 1) -> None:
        self.machine, self.out, self.budget_s, self.selected = machine, out, budget_s, set(selected)
        self.parallel = parallel
        self._log_lock = threading.Lock()
        self.start = time.monotonic()
        self.rows: list[Row] = [build] if build else []
        # the jobs' reports, checkpoints and models: outside `out`, which holds only what comes back
        self.work = Path(tempfile.mkdtemp(prefix="gpu-check-"))
        self.log_path = out / "gpu_check.log"
        self.log_path.write_text("")

    def log(self, text: str) -> None:
        """Append one job's command line and output to gpu_check.log."""
        with self._log_lock, self.log_path.open("a") as f:
            f.write(text)

    def job(self, name: str, settings: Sequence[str], np: int = 1, script: str = "job.py",
            env: dict[str, str] | None = None, timeout: float = JOB_TIMEOUT_S) -> Job:
        """One job of a row, reporting into its own folder; stopped where the budget ends."""
        left = self.budget_s - (time.monotonic() - self.start)
        return run_job(script, settings, np, self.work / name, self.log, env, min(timeout, max(left, 10.0)))

    def row(self, key: str, check: str, device: str, body: Callable[[], tuple[str, str]],
            needs_s: float = 20) -> Row:
        """Run `body` (returning status and detail) as row `check`, timed; not run if not selected (`key`
        not in --rows) or if less than `needs_s` of the budget is left."""
        row = Row(check, device)
        left = self.budget_s - (time.monotonic() - self.start)
        if key not in self.selected:
            row.status = f"{NOT_RUN}: not selected (--rows)"
        elif left < needs_s:
            row.status = f"{NOT_RUN}: out of time ({left:.0f}s of the budget left)"
        else:
            began = time.monotonic()
            try:
                row.status, row.detail = body()
            except Exception as exc:  # a broken report: the row fails, the check goes on
                row.status, row.detail = FAILED, f"{type(exc).__name__}: {exc}"[:300]
            row.seconds = round(time.monotonic() - began, 1)
        took = "" if row.seconds is None else f" ({row.seconds}s)"
        print(f"gpu_check: {check} on {device}: {row.status}{took} {row.detail}".rstrip(), file=sys.stderr,
              flush=True)
        return row

    # --- the rows ----------------------------------------------------------------------------------------
    def run_all(self) -> list[Row]:
        """Every row, in the table's order. The one-rank rows run `parallel` at a time (a GPU has room for
        several such small jobs), the longest first; one at a time, torch.compile's, the slowest to start,
        runs last, so that a spent budget costs it alone. Then the two-rank rows."""
        m, dev = self.machine, self.machine.device
        self.rows.append(self.horovod_row())
        one_rank: list[tuple[str, str, Callable[[], tuple[str, str]], float]] = [
            *[(p, f"train {p}", lambda p=p: judge_training(
                self.job(f"train-{p}", [f"precision={p}"]), dev, precision=p), 20.0)
              for p in ("fp32", "bf16", "fp16")],
            ("syncbn", "sync_batchnorm", self.sync_batchnorm, 20.0),
            ("resume", "checkpoint + bit-identical resume", self.resume, 40.0),
            ("predict", "predict + export", self.predict_export, 40.0),
            ("compile", "compile: true", self.compiled, 60.0),
        ]
        done: dict[str, Row] = {}
        if not m.has_compile_field:
            done["compile"] = Row("compile: true", dev, f"{NOT_RUN}: this hvdazure has no `compile` field")
        todo = [task for task in one_rank if task[0] not in done]
        if self.parallel > 1:
            longest_first = ("compile", "resume", "predict")
            todo.sort(key=lambda task: longest_first.index(task[0]) if task[0] in longest_first else 9)
            with ThreadPoolExecutor(self.parallel) as pool:
                futures = {key: pool.submit(self.row, key, check, dev, body, needs)
                           for key, check, body, needs in todo}
                done.update({key: future.result() for key, future in futures.items()})
        else:
            done.update({key: self.row(key, check, dev, body, needs) for key, check, body, needs in todo})

        nccl = "2 ranks on one GPU (NCCL)"
        done["nccl"] = (self.row("nccl", nccl, "cuda:0", self.nccl_pair, needs_s=40) if m.gpu else
                        Row(nccl, "cuda:0", NO_GPU))
        gloo = "2 ranks, Gloo CPU ops (fallback)"
        if done["nccl"].status == PASSED:
            done["gloo"] = Row(gloo, "cpu", f"{NOT_RUN}: NCCL ran 2 ranks")
        else:
            why = ("no GPU" if not m.gpu else "NCCL refused 2 ranks on one GPU" if
                   done["nccl"].status.startswith(NOT_RUN) else "NCCL's 2 ranks failed")
            done["gloo"] = self.row("gloo", gloo, "cpu", lambda: self.gloo_pair(why), needs_s=40)
        self.rows += [done[key] for key in ROWS]
        return self.rows

    def horovod_row(self) -> Row:
        """Horovod imports, with Gloo, and with NCCL where there is a GPU."""
        m = self.machine
        row = Row("Horovod with NCCL and Gloo", m.device)
        if m.horovod is None:
            row.status, row.detail = FAILED, "horovod.torch does not import (see the build row)"
        else:
            built = ", ".join(f"{op} {'yes' if on else 'no'}" for op, on in m.horovod_ops.items())
            row.detail = f"Horovod {m.horovod}: {built}"
            if not m.horovod_ops.get("gloo"):
                row.status = FAILED
            elif m.gpu:
                row.status = PASSED if m.horovod_ops.get("nccl") else FAILED
            else:
                row.status = PASSED
                if not m.horovod_ops.get("nccl"):
                    row.detail += " (no GPU: NCCL not needed)"
        return row

    def compiled(self) -> tuple[str, str]:
        job = self.job("compile", ["compile=true"], timeout=COMPILE_TIMEOUT_S)
        status, detail = judge_training(job, self.machine.device)
        stepped = job.reports[0]["step_model_class"] if status == PASSED else ""
        if status == PASSED and stepped != "OptimizedModule":
            return FAILED, f"the steps called a {stepped}, not torch.compile's OptimizedModule"
        return status, f"{detail}, steps through {stepped}" if stepped else detail

    def sync_batchnorm(self) -> tuple[str, str]:
        job = self.job("syncbn", ["sync_batchnorm=true"])
        status, detail = judge_training(job, self.machine.device)
        if status == PASSED and job.reports[0]["batchnorm_class"] != "SyncBatchNorm":
            return FAILED, f"the BatchNorm layer is {job.reports[0]['batchnorm_class']}, not SyncBatchNorm"
        return status, detail

    def resume(self) -> tuple[str, str]:
        """An uninterrupted run; the same run killed after step 6 (checkpoints every 4 steps), then resumed
        from its step-4 checkpoint: its final weights and history must be bit-identical."""
        common = ["checkpoint_every_steps=4", "checkpoint_every_epochs=null", "checkpoint_async=false"]
        whole = self.job("resume-whole", [*common, f"checkpoint_dir={self.work / 'ckpt-whole'}"])
        status, detail = judge_training(whole, self.machine.device)
        if status != PASSED:
            return status, f"the uninterrupted run: {detail}"
        ckpt = self.work / "ckpt-crash"
        crashed = self.job("resume-crash", [*common, f"checkpoint_dir={ckpt}", "extra.crash_at_step=6"])
        if crashed.returncode != 17:
            return FAILED, (f"the interrupted run exited {crashed.returncode}, not 17: "
                            f"{last_line(crashed.output)}")
        resumed = self.job("resume-resumed", [*common, f"checkpoint_dir={ckpt}", "resume=auto"])
        status, detail = judge_training(resumed, self.machine.device)
        if status != PASSED:
            return status, f"the resumed run: {detail}"
        if "resumed from step-00000004" not in resumed.output:
            return FAILED, f"not resumed from step 4: {last_line(resumed.output)}"
        if resumed.reports[0]["weights_sha256"] != whole.reports[0]["weights_sha256"]:
            return FAILED, "resumed from step 4, but the final weights differ from the uninterrupted run's"
        if resumed.reports[0]["history"] != whole.reports[0]["history"]:
            return FAILED, "resumed from step 4, but the history differs from the uninterrupted run's"
        return PASSED, "killed after step 6, resumed from step 4: weights and history bit-identical"

    def predict_export(self) -> tuple[str, str]:
        formats = ["onnx", "torchscript", "exported_program"]
        job = self.job("predict-export", ["extra.predict=true", f"extra.export={','.join(formats)}"])
        status, detail = judge_training(job, self.machine.device)
        if status != PASSED:
            return status, detail
        report = job.reports[0]
        if report.get("predict_shape") != [64, 4] or not report.get("predict_rows_sum_to_1"):
            return FAILED, f"predict returned shape {report.get('predict_shape')}"
        exported = report.get("exported", {})
        if sorted(exported) != sorted(formats):
            return FAILED, f"exported {sorted(exported)}, not {formats}"
        sizes = ", ".join(f"{fmt} {info['bytes']} B" for fmt, info in exported.items())
        return PASSED, f"predict 64x4; exported and checked: {sizes}"

    def nccl_pair(self) -> tuple[str, str]:
        """Two ranks on cuda:0 over NCCL: first whether NCCL accepts them, then a training job."""
        probe = self.job("nccl-pair", [], np=2, script="nccl_pair.py", timeout=NCCL_PROBE_TIMEOUT_S)
        if probe.returncode != 0:
            return f"{NOT_RUN}: NCCL refused 2 ranks on one GPU", last_line(probe.output)
        job = self.job("nccl-train", ["sync_batchnorm=true"], np=2)
        return judge_training(job, "cuda:0", np=2)

    def gloo_pair(self, why: str) -> tuple[str, str]:
        """Two ranks on the CPU (the GPU hidden), Horovod's Gloo CPU operations, SyncBatchNorm across them."""
        job = self.job("gloo-pair", ["sync_batchnorm=true"], np=2, env={"CUDA_VISIBLE_DEVICES": ""})
        status, detail = judge_training(job, "cpu", np=2)
        if status == PASSED:
            detail = f"{why}; {detail}, same weights on both ranks"
        return status, detail


def build_row(path: Path | None) -> Row | None:
    """The build step's row, from the JSON scripts/gpu_check.sh wrote (none when run without it)."""
    if path is None or not path.exists():
        return None
    data = json.loads(path.read_text())
    return Row("build Horovod (NCCL + Gloo)", data.get("device", ""), data["status"], data.get("seconds"),
               data.get("detail", ""))


def table(machine: Machine, rows: Sequence[Row], total_s: float, parallel: int = 1) -> str:
    """The markdown table, headed by the machine it ran on."""
    ops = ", ".join(f"{op} {'yes' if on else 'no'}" for op, on in machine.horovod_ops.items())
    lines = [
        "# hvdazure GPU check",
        "",
        f"- GPU: {machine.gpu or 'none visible (the CPU fallbacks ran)'}",
        f"- torch {machine.torch}, CUDA {machine.cuda or '-'}, NCCL {machine.nccl or '-'}, "
        f"Python {machine.python}",
        f"- Horovod {machine.horovod or 'not importable'}" + (f" ({ops})" if ops else ""),
        f"- {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {total_s:.0f} s in all"
        + (f"; the one-rank rows {parallel} at a time (their seconds overlap)" if parallel > 1 else ""),
        "",
        "| check | device | result | seconds | detail |",
        "| --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        seconds = "" if row.seconds is None else f"{row.seconds:.1f}"
        detail = row.detail.replace("|", "\\|").replace("\n", " ")
        lines.append(f"| {row.check} | {row.device} | {row.status} | {seconds} | {detail} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Run every row, write the table; exit 1 if a row failed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="where the table, JSON and log go")
    parser.add_argument("--build-json", type=Path, help="the build step's result (gpu_check.sh writes it)")
    parser.add_argument("--budget", type=float, default=300.0, help="seconds for the rows (default 300)")
    parser.add_argument("--parallel", type=int, default=1,
                        help="one-rank rows run at a time (default 1; gpu_check.sh: 4 on a GPU)")
    parser.add_argument("--rows", default=",".join(ROWS),
                        help=f"the rows to run, comma-separated (default: all: {','.join(ROWS)})")
    args = parser.parse_args(argv)
    selected = [key for key in args.rows.split(",") if key]
    unknown = sorted(set(selected) - set(ROWS))
    if unknown:
        parser.error(f"--rows {','.join(unknown)}: not a row; the rows are {','.join(ROWS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    machine = read_machine()
    check = Check(machine, args.out.resolve(), args.budget, build_row(args.build_json), selected,
                  max(1, args.parallel))
    rows = check.run_all()
    total = time.monotonic() - start
    text = table(machine, rows, total, check.parallel)
    (args.out / "gpu_check.md").write_text(text)
    (args.out / "gpu_check.json").write_text(json.dumps(
        {"machine": dataclasses.asdict(machine), "seconds": round(total, 1),
         "rows": [dataclasses.asdict(row) for row in rows]}, indent=1) + "\n")
    print(text, flush=True)
    return 1 if any(row.failed for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
