"""`hvdazure doctor` on the environment `make setup` built: both frameworks and both controllers."""

import json
import subprocess
import sys


def test_doctor_reports_torch_tensorflow_mpi_and_gloo():
    proc = subprocess.run([sys.executable, "-m", "hvdazure.cli", "doctor", "--json"], capture_output=True,
                          text=True, timeout=180)

    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["ok"] is True
    assert report["horovod_build"]["frameworks"] == ["TensorFlow", "PyTorch"]
    assert set(report["horovod_build"]["controllers"]) == {"MPI", "Gloo"}
    assert report["mpi"].startswith("mpirun (Open MPI) 4.")
    assert report["packages"]["torch"].startswith("2.13.0")
    assert report["packages"]["tensorflow"] == "2.21.0"
    assert report["problems"] == []


def test_doctor_human_report_ends_with_a_verdict():
    proc = subprocess.run([sys.executable, "-m", "hvdazure.cli", "doctor"], capture_output=True, text=True,
                          timeout=180)

    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "controllers        MPI, Gloo" in proc.stdout
    assert proc.stdout.rstrip().endswith("verdict: horovod can run")
