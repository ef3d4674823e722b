"""scripts/gpu_check.sh on a machine without a GPU, end to end: no Horovod build, the CPU fallbacks on real
ranks (a 1-rank fp32 training and the 2-rank Gloo job; the other rows' jobs are the same script with other
settings, which the distributed tests cover: `make gpu-check-cpu` runs them all), the GPU-only rows "not run:
no GPU", the table in markdown and JSON, and exit status 0."""

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_gpu_check_without_a_gpu_runs_the_cpu_fallbacks_and_writes_its_table(tmp_path):
    env = {**os.environ, "GPU_CHECK_PYTHON": sys.executable, "GPU_CHECK_ROWS": "fp32,gloo",
           "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run(["bash", str(REPO / "scripts" / "gpu_check.sh"), str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=240, cwd=tmp_path)

    assert proc.returncode == 0, proc.stdout + proc.stderr
    table = (tmp_path / "gpu_check.md").read_text()
    assert table in proc.stdout
    rows = {row["check"]: row for row in json.loads((tmp_path / "gpu_check.json").read_text())["rows"]}
    assert rows["build Horovod (NCCL + Gloo)"]["status"].startswith("not run: no GPU")
    assert rows["Horovod with NCCL and Gloo"]["status"] == "passed"
    assert rows["train fp32"]["status"] == "passed" and rows["train fp32"]["device"] == "cpu"
    assert rows["train fp32"]["seconds"] > 0
    assert rows["2 ranks on one GPU (NCCL)"]["status"] == "not run: no GPU"
    fallback = rows["2 ranks, Gloo CPU ops (fallback)"]
    assert fallback["status"] == "passed", fallback
    assert "same weights on both ranks" in fallback["detail"]
    assert rows["train bf16"]["status"] == "not run: not selected (--rows)"
    assert "hvdazure.cli run -np 2 --gloo" in (tmp_path / "gpu_check.log").read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["build.json", "gpu_check.json", "gpu_check.log",
                                                          "gpu_check.md"]  # what comes back from a device
