"""`hvdazure doctor` on the environment `make setup` built: both frameworks and both controllers, at the
versions pinned in versions.env."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

# versions.env is parsed in one place, beside the test that checks every other copy of the pins against it
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
from version_pins import read_versions_env

PINS = read_versions_env()


@pytest.fixture(scope="module")
def doctor_runs() -> dict[str, subprocess.CompletedProcess]:
    """`hvdazure doctor --json` and `hvdazure doctor`, run at the same time (each asks Horovod's two
    framework extensions in a process of its own, a few seconds)."""
    started = {name: subprocess.Popen([sys.executable, "-m", "hvdazure.cli", "doctor", *args],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for name, args in {"json": ["--json"], "human": []}.items()}
    done = {}
    for name, proc in started.items():
        stdout, stderr = proc.communicate(timeout=180)
        done[name] = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    return done


def test_doctor_reports_torch_tensorflow_mpi_and_gloo(doctor_runs):
    proc = doctor_runs["json"]

    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["ok"] is True
    assert report["horovod_build"]["frameworks"] == ["TensorFlow", "PyTorch"]
    assert set(report["horovod_build"]["controllers"]) == {"MPI", "Gloo"}
    # the local setup installs the distribution's Open MPI, not the images' exact pin: the same major version
    assert report["mpi"].startswith(f"mpirun (Open MPI) {PINS['OPENMPI_VERSION'].split('.')[0]}.")
    assert report["packages"]["torch"].split("+")[0] == PINS["TORCH_VERSION"]  # e.g. 2.13.0+cpu
    assert report["packages"]["tensorflow"] == PINS["TENSORFLOW_VERSION"]
    assert report["packages"]["horovod"] == PINS["HOROVOD_VERSION"]
    assert report["problems"] == []


def test_doctor_human_report_ends_with_a_verdict(doctor_runs):
    proc = doctor_runs["human"]

    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "controllers        MPI, Gloo" in proc.stdout
    assert proc.stdout.rstrip().endswith("verdict: horovod can run")
